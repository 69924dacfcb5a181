//! JSON-schema correctness: for every schema that compiles, each valid instance, tokenized with
//! the real Llama-3 tokenizer, must have every token allowed at its step and be accepted at the
//! end; each invalid instance must be rejected somewhere (a token outside the mask, or no EOS at
//! the end). Instances are checked in two spellings: compact (`{"a":1}`) and Python
//! `json.dumps` style (`{"a": 1}`).
//!
//! Data: the hand-written set in `testdata/constraint/json_schema/` (always), and the
//! maskbench subset in `../shared/maskbench-dev` beside the repository (when present; skipped
//! with a notice otherwise). Both use the maskbench format: `{"schema": ..., "tests":
//! [{"valid": bool, "data": ...}]}`.

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use nextok_constraint::{ConstraintSpec, JsonOptions};
use serde_json::Value;

#[derive(Default, Debug)]
struct Report {
    files: usize,
    compiled: usize,
    valid: usize,
    valid_accepted: usize,
    invalid: usize,
    invalid_rejected: usize,
    errors: BTreeMap<String, usize>,
    failures: Vec<String>,
}

/// `json.dumps` separators: `", "` and `": "` outside strings.
fn spaced(compact: &str) -> String {
    let mut out = String::with_capacity(compact.len() * 2);
    let mut in_str = false;
    let mut esc = false;
    for c in compact.chars() {
        out.push(c);
        if in_str {
            if esc {
                esc = false;
            } else if c == '\\' {
                esc = true;
            } else if c == '"' {
                in_str = false;
            }
        } else if c == '"' {
            in_str = true;
        } else if c == ',' || c == ':' {
            out.push(' ');
        }
    }
    out
}

fn run_dir(dir: &Path) -> Report {
    let (engine, enc) = support::llama3().expect("checked by caller");
    let mut r = Report::default();
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    for p in paths {
        let v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        r.files += 1;
        let spec = ConstraintSpec::JsonSchema {
            schema: v["schema"].clone(),
            options: JsonOptions::default(),
        };
        let c = match engine.compile(&spec) {
            Ok(c) => c,
            Err(e) => {
                let key = match e.keyword() {
                    Some(k) => format!("unsupported: {k}"),
                    None => e.code().to_string(),
                };
                *r.errors.entry(key).or_default() += 1;
                if e.keyword().is_none() {
                    r.failures.push(format!(
                        "{}: compile error: {e}",
                        p.file_name().unwrap().to_string_lossy()
                    ));
                }
                continue;
            }
        };
        r.compiled += 1;
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        for (i, t) in v["tests"].as_array().into_iter().flatten().enumerate() {
            let valid = t["valid"].as_bool().unwrap_or(true);
            let compact = serde_json::to_string(&t["data"]).unwrap();
            for text in [compact.clone(), spaced(&compact)] {
                let ids = enc.encode(&text, false).unwrap();
                let res = support::run(&mut c.start(), &ids);
                if valid {
                    r.valid += 1;
                    if res.is_ok() {
                        r.valid_accepted += 1;
                    } else {
                        r.failures.push(format!(
                            "{name} test {i}: valid rejected at {res:?}: {text}"
                        ));
                    }
                } else {
                    r.invalid += 1;
                    if res.is_err() {
                        r.invalid_rejected += 1;
                    } else {
                        r.failures
                            .push(format!("{name} test {i}: invalid accepted: {text}"));
                    }
                }
            }
        }
    }
    r
}

fn print(label: &str, r: &Report) {
    eprintln!(
        "{label}: {} schemas, {} compiled; valid instances accepted {}/{}; invalid rejected {}/{}",
        r.files, r.compiled, r.valid_accepted, r.valid, r.invalid_rejected, r.invalid
    );
    for (k, n) in &r.errors {
        eprintln!("{label}: compile errors {k}: {n}");
    }
    for f in r.failures.iter().take(20) {
        let short: String = f.chars().take(160).collect();
        eprintln!("{label}: {short}");
    }
}

#[test]
fn hand_written_schemas() {
    if support::llama3().is_none() {
        return;
    }
    let r = run_dir(&support::repo_root().join("testdata/constraint/json_schema"));
    print("hand-written", &r);
    assert_eq!(r.compiled, r.files);
    assert!(r.failures.is_empty(), "{:#?}", r.failures);
}

#[test]
fn maskbench_dev_subset() {
    let dir = support::repo_root().join("../shared/maskbench-dev");
    if !dir.exists() {
        eprintln!(
            "notice: {} absent; skipping the maskbench subset",
            dir.display()
        );
        return;
    }
    if support::llama3().is_none() {
        return;
    }
    let r = run_dir(&dir);
    print("maskbench-dev", &r);
    // Every invalid instance must be rejected. A few valid instances are known to be rejected:
    // llguidance requires object properties in the order the schema lists them, and those
    // instances list them in another order.
    assert_eq!(r.invalid_rejected, r.invalid, "invalid instances accepted");
    assert!(
        r.valid_accepted * 100 >= r.valid * 99,
        "fewer than 99% of valid instances accepted"
    );
}
