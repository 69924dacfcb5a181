//! Runs the shared test vectors in `testdata/vectors/` through the library.

use std::path::PathBuf;

use nextok_core::StepRequest;
use serde_json::Value;

fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/vectors")
}

fn round(x: f64, d: u32) -> f64 {
    let s = 10f64.powi(d as i32);
    (x * s).round() / s
}

fn name_to_id(req: &StepRequest, name: &Value) -> u32 {
    match name {
        Value::Number(n) => n.as_u64().expect("id") as u32,
        Value::String(s) => match &req.tokens {
            Some(t) => t
                .iter()
                .position(|x| x == s)
                .unwrap_or_else(|| panic!("no token named {s}")) as u32,
            None => s.parse().expect("numeric id"),
        },
        other => panic!("bad token ref {other}"),
    }
}

fn check_case(file: &str, case: &Value) {
    let cname = case["name"].as_str().unwrap_or("?");
    let ctx = format!("{file} / {cname}");
    let req_text = serde_json::to_string(&case["request"]).unwrap();
    let expect = &case["expect"];
    if !case["request"]["params"]["constraint"].is_null() {
        // needs a constraint engine (the CLI runs these cases)
        return;
    }
    let result = StepRequest::from_json(&req_text).and_then(|r| r.explain_output().map(|o| (r, o)));
    if let Some(err) = expect.get("error") {
        let e = match result {
            Ok(_) => panic!("{ctx}: expected error {err}, got success"),
            Err(e) => e,
        };
        assert_eq!(e.code(), err["code"].as_str().unwrap(), "{ctx}: {e}");
        assert_eq!(e.field(), err["field"].as_str(), "{ctx}: {e}");
        return;
    }
    let (req, out) = result.unwrap_or_else(|e| panic!("{ctx}: {e}"));
    if let Some(sel) = expect.get("selected") {
        assert_eq!(out.selected, name_to_id(&req, sel), "{ctx}: selected");
    }
    if let Some(sup) = expect.get("support") {
        let mut want: Vec<u32> = sup
            .as_array()
            .unwrap()
            .iter()
            .map(|v| name_to_id(&req, v))
            .collect();
        want.sort_unstable();
        assert_eq!(out.support, want, "{ctx}: support");
    }
    let d = expect.get("decimals").and_then(Value::as_u64).unwrap_or(3) as u32;
    for key in [
        "selection_prob",
        "initial_prob",
        "processed_logit",
        "raw_logprob",
        "processed_logprob",
    ] {
        if let Some(map) = expect.get(key).and_then(Value::as_object) {
            for (tok, want) in map {
                let id = name_to_id(&req, &Value::String(tok.clone()));
                let row = &out.tokens[id as usize].row;
                let got = match key {
                    "selection_prob" => row.selection_prob,
                    "initial_prob" => row.initial_prob,
                    "processed_logit" => row.processed_logit,
                    "raw_logprob" => row.raw_logprob,
                    _ => row.processed_logprob,
                };
                let want = want.as_f64().unwrap();
                assert_eq!(
                    round(got, d),
                    round(want, d),
                    "{ctx}: {key}[{tok}] = {got}, want {want} to {d} places"
                );
            }
        }
    }
    if let Some(stages) = expect.get("stage_sizes").and_then(Value::as_array) {
        let recorded: Vec<(String, usize)> = out
            .record
            .stages
            .iter()
            .map(|s| (s.stage.clone(), s.support_size))
            .collect();
        let mut from = 0;
        for st in stages {
            let name = st[0].as_str().unwrap();
            let size = st[1].as_u64().unwrap() as usize;
            let pos = recorded[from..]
                .iter()
                .position(|(n, s)| n == name && *s == size)
                .unwrap_or_else(|| {
                    panic!("{ctx}: stage {name}={size} not found in order in {recorded:?}")
                });
            from += pos + 1;
        }
    }
}

#[test]
fn all_vector_files_pass() {
    let mut files: Vec<_> = std::fs::read_dir(vectors_dir())
        .expect("testdata/vectors")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "vector files missing");
    let mut n = 0;
    for f in &files {
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
        let fname = f.file_name().unwrap().to_string_lossy().to_string();
        for case in doc["cases"].as_array().unwrap() {
            check_case(&fname, case);
            n += 1;
        }
    }
    assert!(n >= 40, "only {n} cases ran");
}
