//! Runs the shared test vectors through the `nextok explain --json` binary.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use nextok_testdata::vectors::{self, Case, Minimum, Outcome};
use serde_json::Value;

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

/// One case through `nextok explain --json`.
fn check_case(case: &Case) -> Outcome {
    let ctx = case.ctx();
    let req = case.request();
    let exp = case.expect();
    let (ok, stdout, stderr) = run_explain(req);
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
        return Outcome::Pass;
    }
    assert!(ok, "{ctx}: failed: {stderr}");
    let out: Value = serde_json::from_str(&stdout).unwrap();
    for key in ["selected", "support", "pipeline_hash", "tokens"] {
        assert!(out.get(key).is_some(), "{ctx}: --json lacks `{key}`");
    }
    vectors::check_explain_json(case, &out);
    for row in out["tokens"].as_array().unwrap() {
        for key in ["raw_logprob", "processed_logprob", "selection_prob"] {
            assert!(row.get(key).is_some(), "{ctx}: token row lacks `{key}`");
        }
    }
    Outcome::Pass
}

#[test]
fn cli_runs_every_vector() {
    vectors::run(
        Minimum {
            files: 5,
            cases_run: 40,
        },
        check_case,
    );
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
