//! `nextok explain`: one step from a JSON request, printed as 002's decoding ledger.

use std::io::Read;

use nextok_core::request::ExplainOutput;

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
pub fn run(args: ExplainArgs) -> Result<(), String> {
    let text = if args.file == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| format!("cannot read standard input: {e}"))?;
        s
    } else {
        std::fs::read_to_string(&args.file)
            .map_err(|e| format!("cannot read `{}`: {e}", args.file))?
    };
    let out = nextok_engine::explain::explain_json(&text).map_err(|e| e.to_string())?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&out).map_err(|e| e.to_string())?
        );
    } else {
        let n = out.tokens.len();
        print!("{}", ledger(&out, n));
    }
    Ok(())
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
    let mut s = String::new();
    let rec = &o.record;
    s.push_str(&format!("pipeline {}\n", o.pipeline_hash));
    let mut stages = rec.stages.iter();
    if let Some(raw) = stages.next() {
        s.push_str(&format!(
            "   0  {:<32} support {}\n",
            "raw logits", raw.support_size
        ));
    }
    for (i, (p, st)) in rec.processors.iter().zip(stages).enumerate() {
        s.push_str(&format!(
            "  {:>2}  {:<32} support {}\n",
            i + 1,
            format!("{} v{}", p.kind, p.version),
            st.support_size
        ));
    }
    let sel = match (rec.rng.u, rec.rng.fixed_u) {
        (Some(u), true) => format!("u = {u} (fixed)"),
        (Some(u), false) => format!(
            "u = {u:.6} from {} seed {} counter {}",
            rec.rng.algorithm, rec.rng.seed, rec.rng.counter
        ),
        (None, _) => String::new(),
    };
    s.push_str(&format!(
        "selector {}  {sel}\n\n",
        serde_json::to_value(rec.selector)
            .ok()
            .and_then(|v| v["type"].as_str().map(String::from))
            .unwrap_or_default()
    ));
    let w = o
        .tokens
        .iter()
        .map(|t| t.token.chars().count())
        .max()
        .unwrap_or(5)
        .max(5);
    s.push_str(&format!(
        "{:<w$}  {:>9}  {:>7}  {:>12}  {:>4}  {:>15}  {:>10}  {}\n",
        "token",
        "raw logit",
        "allowed",
        "initial prob",
        "kept",
        "processed logit",
        "final prob",
        "selected"
    ));
    for t in &o.tokens {
        let r = &t.row;
        s.push_str(&format!(
            "{:<w$}  {:>9.4}  {:>7}  {:>12.4}  {:>4}  {}  {:>10.4}  {}\n",
            t.token,
            r.raw_logit,
            if r.allowed { "yes" } else { "no" },
            r.initial_prob,
            if r.kept { "yes" } else { "no" },
            fmt_f(r.processed_logit, 15, 4),
            r.selection_prob,
            if r.selected { "<-" } else { "" }
        ));
    }
    let support = if o.support.len() <= 16 {
        format!("{:?}", o.support)
    } else {
        format!("{:?} … ({} ids)", &o.support[..16], o.support.len())
    };
    s.push_str(&format!(
        "\nselected {} (id {}); support {support} of {vocab_size}\n",
        o.selected_token
            .clone()
            .unwrap_or_else(|| o.selected.to_string()),
        o.selected,
    ));
    if o.tokens.len() < vocab_size {
        s.push_str(&format!(
            "(rows: {} of the {vocab_size} tokens — the support's most probable, then the highest raw logits outside it)\n",
            o.tokens.len()
        ));
    }
    s
}
