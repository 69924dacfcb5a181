//! `nextok constrain`: check a text against a constraint, token by token.
//!
//! ```text
//! nextok constrain --tokenizer tokenizer.json (--json-schema S | --regex R | --choice A --choice B
//!                  | --grammar G | --gbnf G | --json) [--compact] [--schema-mode strict|relaxed]
//!                  --text T
//! ```
//!
//! The text is tokenized with the tokenizer, then fed to the compiled constraint one token at a
//! time: each token must be in the allowed-token mask at its step, and the constraint must
//! accept at the end. `--json-schema`, `--grammar` and `--gbnf` take a file name, or the text
//! itself when it is not a file (a schema starting with `{`, a grammar with a newline).
//!
//! Exit status: 0 when the whole text is accepted; 1 when it is rejected (the first rejected
//! token, its index and the bytes the constraint forces next are printed); 2 on bad input (an
//! unreadable file, a malformed schema, an unsupported keyword).
//!
//! With `--json-schema`, the text is also validated against the full schema (every keyword,
//! formats asserted) and the result printed with the schema report (which keywords the mask
//! enforces, which are checked after generation). `--schema-mode relaxed` compiles schemas with
//! keywords the mask cannot enforce, checking those only in that validation: a text the mask
//! accepts but the validation refuses is rejected (exit 1). JSON string escapes the mask does
//! not take (`\u00b0`, surrogate pairs, `\/`, as `json.dumps` writes them) are checked as the
//! characters themselves.

use std::sync::Arc;

use nextok_constraint::{
    json_text_for_mask, ConstraintEngine, ConstraintSpec, ConstraintVocab, JsonOptions,
    PropertyOrder, SchemaMode,
};
use nextok_core::constraint::{bitset_words, ConstraintState, ConstraintStatus};
use nextok_vocab::display::escape;
use nextok_vocab::encode::Encoder;
use nextok_vocab::{LoadOptions, Vocabulary};

use crate::error::CliError;

/// Arguments of `nextok constrain`.
#[derive(clap::Args)]
pub struct ConstrainArgs {
    /// A Hugging Face tokenizer.json.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: String,
    /// A JSON schema (a file, or the schema text).
    #[arg(long, value_name = "S")]
    pub json_schema: Option<String>,
    /// A regular expression the whole text must match.
    #[arg(long, value_name = "R")]
    pub regex: Option<String>,
    /// One allowed string (repeat the flag).
    #[arg(long, value_name = "A")]
    pub choice: Vec<String>,
    /// A Lark-style grammar (a file, or the grammar text).
    #[arg(long, value_name = "G")]
    pub grammar: Option<String>,
    /// A llama.cpp GBNF grammar (a file, or the grammar text).
    #[arg(long, value_name = "G")]
    pub gbnf: Option<String>,
    /// Any JSON value.
    #[arg(long)]
    pub json: bool,
    /// JSON without whitespace between tokens (for --json-schema and --json).
    #[arg(long)]
    pub compact: bool,
    /// With --json-schema: `strict` refuses keywords the mask cannot enforce exactly; `relaxed`
    /// masks a superset and validates the text against the full schema.
    #[arg(long = "schema-mode", value_name = "MODE", default_value = "strict")]
    pub schema_mode: SchemaMode,
    /// With --json-schema: `schema` takes object properties in schema order (fastest; key
    /// tokens are forced), `any` in any order (each key once, required keys present). Default:
    /// `any` with `--schema-mode relaxed`, else `schema`.
    #[arg(long = "property-order", value_name = "ORDER")]
    pub property_order: Option<PropertyOrder>,
    /// The text to check.
    #[arg(long, value_name = "T")]
    pub text: String,
}

/// A file's contents, or the argument itself when no such file exists and `inline` says the
/// argument looks like the text.
fn file_or_text(flag: &str, arg: &str, inline: bool) -> Result<String, CliError> {
    match std::fs::read_to_string(arg) {
        Ok(s) => Ok(s),
        Err(_) if inline => Ok(arg.to_string()),
        Err(e) => Err(format!("{flag}: cannot read {arg}: {e}").into()),
    }
}

fn spec(a: &ConstrainArgs) -> Result<ConstraintSpec, CliError> {
    let options = JsonOptions {
        compact: a.compact,
        schema_mode: a.schema_mode,
        property_order: a.property_order,
        ..Default::default()
    };
    let mut specs = Vec::new();
    if let Some(s) = &a.json_schema {
        let text = file_or_text("--json-schema", s, s.trim_start().starts_with('{'))?;
        let schema = serde_json::from_str(&text)
            .map_err(|e| CliError::context("--json-schema: not JSON", e))?;
        specs.push(ConstraintSpec::JsonSchema {
            schema,
            options: options.clone(),
        });
    }
    if let Some(r) = &a.regex {
        specs.push(ConstraintSpec::Regex { pattern: r.clone() });
    }
    if !a.choice.is_empty() {
        specs.push(ConstraintSpec::Choice {
            choices: a.choice.clone(),
        });
    }
    if let Some(g) = &a.grammar {
        let lark = file_or_text("--grammar", g, g.contains('\n') || g.contains(':'))?;
        specs.push(ConstraintSpec::Grammar { lark });
    }
    if let Some(g) = &a.gbnf {
        let gbnf = file_or_text("--gbnf", g, g.contains("::="))?;
        specs.push(ConstraintSpec::Gbnf { gbnf });
    }
    if a.json {
        specs.push(ConstraintSpec::Json { options });
    }
    match specs.len() {
        1 => Ok(specs.pop().expect("one spec")),
        0 => Err("give one of --json-schema, --regex, --choice, --grammar, --gbnf, --json".into()),
        _ => Err("give only one kind of constraint".into()),
    }
}

/// The flag that gives a constraint of `spec`'s kind.
pub(crate) fn flag(spec: &ConstraintSpec) -> &'static str {
    match spec {
        ConstraintSpec::JsonSchema { .. } => "--json-schema",
        ConstraintSpec::Regex { .. } => "--regex",
        ConstraintSpec::Choice { .. } => "--choice",
        ConstraintSpec::Grammar { .. } => "--grammar",
        ConstraintSpec::Gbnf { .. } => "--gbnf",
        ConstraintSpec::Json { .. } => "--json",
    }
}

/// Runs `nextok constrain`; rejection exits with status 1 directly.
pub fn run(a: ConstrainArgs) -> Result<(), CliError> {
    let spec = spec(&a)?;
    let v = Vocabulary::from_tokenizer_json_file(&a.tokenizer, &LoadOptions::default())?;
    let enc = Encoder::from_tokenizer_json_file(&a.tokenizer)?;
    let cv = ConstraintVocab::new(&v.bytes, &v.info)?;
    let engine = ConstraintEngine::new(Arc::new(cv))?;
    // the error names the flag that gave the constraint (and quotes only an excerpt of it)
    let compiled = engine
        .compile(&spec)
        .map_err(|e| CliError::context(flag(&spec), e))?;
    // JSON: `\uXXXX` escapes of ordinary characters (as `json.dumps` writes them) are checked
    // as the characters themselves, the spelling the mask generates
    let text = match spec {
        ConstraintSpec::JsonSchema { .. } | ConstraintSpec::Json { .. } => {
            json_text_for_mask(&a.text).into_owned()
        }
        _ => a.text.clone(),
    };
    let report = compiled.schema_report().map(|r| r.summary());
    let check = compiled.validate_output(a.text.as_bytes());
    let ids = enc.encode(&text, false)?;
    let mut state = compiled.start();
    let n = v.len();
    let mut mask = vec![0u64; bitset_words(n)];
    let name = |t: u32| v.name(t).unwrap_or("?").to_string();
    for (i, &t) in ids.iter().enumerate() {
        mask.fill(0);
        state.fill_mask(&mut mask)?;
        let allowed = mask[(t / 64) as usize] >> (t % 64) & 1 == 1;
        if !allowed || state.commit(t).is_err() {
            let forced = state.forced_bytes();
            let count: u32 = mask.iter().map(|w| w.count_ones()).sum();
            outln!(
                "rejected: token {i} (id {t}, {:?}, bytes \"{}\") after \"{}\"",
                name(t),
                escape(v.token(t).unwrap_or(&[])),
                escape(state.committed_bytes())
            );
            outln!(
                "expected: {count} allowed tokens; forced next bytes: \"{}\"",
                escape(&forced)
            );
            explain_rejection(report.as_deref(), check.as_ref());
            std::process::exit(1);
        }
    }
    match state.status() {
        ConstraintStatus::Accepted | ConstraintStatus::OnlyEnd => {
            outln!(
                "accepted: {} tokens ({} engine, {})",
                ids.len(),
                compiled.engine(),
                compiled.kind()
            );
            if let Some(r) = &report {
                outln!("{r}");
            }
            match &check {
                Some(v) if v.valid == Some(false) => {
                    outln!("schema check: {}", v.summary());
                    outln!("rejected: the mask accepts the text but the full schema does not");
                    std::process::exit(1);
                }
                Some(v) => outln!("schema check: {}", v.summary()),
                None => {}
            }
            Ok(())
        }
        st => {
            let forced = state.forced_bytes();
            outln!(
                "rejected: end of text after {} tokens (status {st:?}); forced next bytes: \"{}\"",
                ids.len(),
                escape(&forced)
            );
            explain_rejection(report.as_deref(), check.as_ref());
            std::process::exit(1);
        }
    }
}

/// After a mask rejection of a JSON-schema text: what the full schema says of it, and the
/// mask's rule on property order when the text is valid nonetheless.
fn explain_rejection(report: Option<&str>, check: Option<&nextok_constraint::Validation>) {
    if let Some(r) = report {
        outln!("{r}");
    }
    let Some(v) = check else { return };
    outln!("schema check: {}", v.summary());
    if v.valid == Some(true) {
        if report.is_some_and(|r| r.contains("properties in any order")) {
            outln!(
                "note: the text is valid against the full schema but the mask rejects it; the \
                 mask takes object properties in any order, so the cause is an object that keeps \
                 schema order (see `schema order kept at` above) or a limit of the mask"
            );
        } else {
            outln!(
                "note: the text is valid against the full schema but the mask rejects it; the \
                 usual cause is property order: the mask requires an object's properties in the \
                 order the schema lists them (properties not listed come after those listed); \
                 --property-order any takes them in any order"
            );
        }
    }
}
