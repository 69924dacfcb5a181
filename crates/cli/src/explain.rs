//! `nextok explain`: one step from a JSON request, printed as 002's decoding ledger.

use std::io::{Read, Write};

use nextok_core::request::ExplainOutput;

use crate::error::CliError;

/// Arguments of `nextok explain`.
#[derive(clap::Args)]
pub struct ExplainArgs {
    /// Request file (JSON); `-` reads standard input.
    pub file: String,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `nextok explain`.
pub fn run(args: ExplainArgs) -> Result<(), CliError> {
    let text = if args.file == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| CliError::context("cannot read standard input", e))?;
        s
    } else {
        std::fs::read_to_string(&args.file)
            .map_err(|e| format!("cannot read `{}`: {e}", args.file))?
    };
    let out = nextok_engine::explain::explain_json(&text)?;
    // streamed: the output of a huge request is never held as one string
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    let written = if args.json {
        serde_json::to_writer_pretty(&mut w, &out)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(w))
    } else {
        let n = out.tokens.len();
        write_ledger(&mut w, &out, n)
    };
    match written.and_then(|()| w.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => Err(format!("cannot write to standard output: {e}").into()),
    }
}

/// The longest token name the text ledger prints (in characters); longer names are cut and end
/// in `…`, so a hostile name can neither break the table nor exhaust the formatter.
pub const MAX_NAME_CHARS: usize = 48;

/// A token name as the terminal shows it: control characters (newlines, ANSI escapes, …)
/// escaped as Rust writes them (`\n`, `\u{1b}`), and at most [`MAX_NAME_CHARS`] characters.
pub fn display_name(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    if out.chars().count() > MAX_NAME_CHARS {
        out = out.chars().take(MAX_NAME_CHARS - 1).collect();
        out.push('…');
    }
    out
}

fn fmt_f(x: f64, w: usize, p: usize) -> String {
    if x == f64::NEG_INFINITY {
        format!("{:>w$}", "-inf")
    } else {
        format!("{x:>w$.p$}")
    }
}

/// The text ledger: pipeline, stages, then one row per token of `o.tokens` (which may be a
/// selection of the vocabulary's `vocab_size` tokens: the summary line says so).
pub fn ledger(o: &ExplainOutput, vocab_size: usize) -> String {
    let mut v = Vec::new();
    write_ledger(&mut v, o, vocab_size).expect("writing to memory does not fail");
    String::from_utf8(v).expect("the ledger is UTF-8")
}

/// Writes the text ledger of [`ledger`] row by row.
pub fn write_ledger(
    s: &mut impl std::io::Write,
    o: &ExplainOutput,
    vocab_size: usize,
) -> std::io::Result<()> {
    let rec = &o.record;
    writeln!(s, "pipeline {}", o.pipeline_hash)?;
    let mut stages = rec.stages.iter();
    if let Some(raw) = stages.next() {
        writeln!(s, "   0  {:<32} support {}", "raw logits", raw.support_size)?;
    }
    for (i, (p, st)) in rec.processors.iter().zip(stages).enumerate() {
        writeln!(
            s,
            "  {:>2}  {:<32} support {}",
            i + 1,
            format!("{} v{}", p.kind, p.version),
            st.support_size
        )?;
    }
    let sel = match (rec.rng.u, rec.rng.fixed_u) {
        (Some(u), true) => format!("u = {u} (fixed)"),
        (Some(u), false) => format!(
            "u = {u:.6} from {} seed {} counter {}",
            rec.rng.algorithm, rec.rng.seed, rec.rng.counter
        ),
        (None, _) => String::new(),
    };
    write!(
        s,
        "selector {}  {sel}\n\n",
        serde_json::to_value(rec.selector)
            .ok()
            .and_then(|v| v["type"].as_str().map(String::from))
            .unwrap_or_default()
    )?;
    let names: Vec<String> = o.tokens.iter().map(|t| display_name(&t.token)).collect();
    let w = names
        .iter()
        .map(|t| t.chars().count())
        .max()
        .unwrap_or(5)
        .max(5);
    writeln!(
        s,
        "{:<w$}  {:>9}  {:>7}  {:>12}  {:>4}  {:>15}  {:>10}  selected",
        "token", "raw logit", "allowed", "initial prob", "kept", "processed logit", "final prob",
    )?;
    for (t, name) in o.tokens.iter().zip(&names) {
        let r = &t.row;
        writeln!(
            s,
            "{:<w$}  {:>9.4}  {:>7}  {:>12.4}  {:>4}  {}  {:>10.4}  {}",
            name,
            r.raw_logit,
            if r.allowed { "yes" } else { "no" },
            r.initial_prob,
            if r.kept { "yes" } else { "no" },
            fmt_f(r.processed_logit, 15, 4),
            r.selection_prob,
            if r.selected { "<-" } else { "" }
        )?;
    }
    let support = if o.support.len() <= 16 {
        format!("{:?}", o.support)
    } else {
        format!("{:?} … ({} ids)", &o.support[..16], o.support.len())
    };
    writeln!(
        s,
        "\nselected {} (id {}); support {support} of {vocab_size}",
        o.selected_token
            .as_deref()
            .map(display_name)
            .unwrap_or_else(|| o.selected.to_string()),
        o.selected,
    )?;
    if o.tokens.len() < vocab_size {
        writeln!(s,
            "(rows: {} of the {vocab_size} tokens — the support's most probable, then the highest raw logits outside it)",
            o.tokens.len()
        )?;
    }
    Ok(())
}
