//! Runs the shared test vectors through the `nextok explain --json` binary.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;

fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/vectors")
}

fn run_explain(request: &Value) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_nextok"))
        .args(["explain", "--json", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn nextok");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn id_of(request: &Value, v: &Value) -> u64 {
    match v {
        Value::Number(n) => n.as_u64().unwrap(),
        Value::String(s) => match request["tokens"].as_array() {
            Some(t) => t.iter().position(|x| x == s).unwrap() as u64,
            None => s.parse().unwrap(),
        },
        _ => panic!("bad token ref"),
    }
}

fn round(x: f64, d: u32) -> f64 {
    let s = 10f64.powi(d as i32);
    (x * s).round() / s
}

fn num(v: &Value) -> f64 {
    match v {
        Value::Number(n) => n.as_f64().unwrap(),
        Value::String(s) if s == "-inf" => f64::NEG_INFINITY,
        other => panic!("not a number: {other}"),
    }
}

#[test]
fn cli_runs_every_vector() {
    let mut files: Vec<_> = std::fs::read_dir(vectors_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut n = 0;
    for f in files {
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
        for case in doc["cases"].as_array().unwrap() {
            let ctx = format!("{} / {}", f.display(), case["name"]);
            let req = &case["request"];
            let exp = &case["expect"];
            let (ok, stdout, stderr) = run_explain(req);
            n += 1;
            if let Some(err) = exp.get("error") {
                assert!(!ok, "{ctx}: expected failure");
                let lines: Vec<&str> = stderr.lines().collect();
                assert_eq!(
                    lines.len(),
                    1,
                    "{ctx}: one error line expected, got {stderr:?}"
                );
                // the field is named (top-level name, before any index); an error without a
                // field (`already_finished`) says what happened
                let head = match err["field"].as_str() {
                    Some(field) => field.split(['[', '.']).next().unwrap(),
                    None => "finished",
                };
                assert!(
                    lines[0].contains(head),
                    "{ctx}: error line {:?} does not name {head}",
                    lines[0]
                );
                continue;
            }
            assert!(ok, "{ctx}: failed: {stderr}");
            let out: Value = serde_json::from_str(&stdout).unwrap();
            for key in ["selected", "support", "pipeline_hash", "tokens"] {
                assert!(out.get(key).is_some(), "{ctx}: --json lacks `{key}`");
            }
            if let Some(sel) = exp.get("selected") {
                assert_eq!(out["selected"].as_u64().unwrap(), id_of(req, sel), "{ctx}");
            }
            if let Some(sup) = exp.get("support") {
                let mut want: Vec<u64> = sup
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| id_of(req, v))
                    .collect();
                want.sort_unstable();
                let got: Vec<u64> = out["support"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap())
                    .collect();
                assert_eq!(got, want, "{ctx}: support");
            }
            let d = exp.get("decimals").and_then(Value::as_u64).unwrap_or(3) as u32;
            for key in [
                "selection_prob",
                "initial_prob",
                "processed_logit",
                "raw_logprob",
                "processed_logprob",
            ] {
                if let Some(map) = exp.get(key).and_then(Value::as_object) {
                    for (tok, want) in map {
                        let id = id_of(req, &Value::String(tok.clone())) as usize;
                        let got = num(&out["tokens"][id][key]);
                        assert_eq!(
                            round(got, d),
                            round(want.as_f64().unwrap(), d),
                            "{ctx}: {key}[{tok}]"
                        );
                    }
                }
            }
            for row in out["tokens"].as_array().unwrap() {
                for key in ["raw_logprob", "processed_logprob", "selection_prob"] {
                    assert!(row.get(key).is_some(), "{ctx}: token row lacks `{key}`");
                }
            }
        }
    }
    assert!(n >= 40);
}

#[test]
fn text_ledger_shows_the_columns_and_the_selection() {
    let req: Value = serde_json::from_str(
        &std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/hand_computation.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_nextok"))
        .args(["explain", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(req.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for col in [
        "raw logit",
        "allowed",
        "initial prob",
        "kept",
        "processed logit",
        "final prob",
        "selected",
    ] {
        assert!(text.contains(col), "missing column {col}:\n{text}");
    }
    let b = text.lines().find(|l| l.starts_with("B ")).unwrap();
    assert!(b.contains("0.4073") && b.ends_with("<-"), "{b}");
    assert!(text.contains("selected B (id 1)"));
}

#[test]
fn unreadable_file_is_one_line_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_nextok"))
        .args(["explain", "/nonexistent/x.json"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
}
