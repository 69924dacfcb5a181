//! Runs the shared test vectors in `testdata/vectors/` through the library.

use nextok_core::StepRequest;
use nextok_testdata::vectors::{self, id_of, round, Case, Minimum, Outcome, NUMERIC_KEYS};
use serde_json::Value;

fn check_case(case: &Case) -> Outcome {
    let ctx = case.ctx();
    let req_text = serde_json::to_string(case.request()).unwrap();
    let expect = case.expect();
    if case.is_constrained() {
        return Outcome::Skip(
            "needs a constraint engine (the CLI's and the server's vector tests run it)".into(),
        );
    }
    let result = StepRequest::from_json(&req_text).and_then(|r| r.explain_output());
    if let Some(err) = expect.get("error") {
        let e = match result {
            Ok(_) => panic!("{ctx}: expected error {err}, got success"),
            Err(e) => e,
        };
        assert_eq!(e.code(), err["code"].as_str().unwrap(), "{ctx}: {e}");
        assert_eq!(e.field(), err["field"].as_str(), "{ctx}: {e}");
        return Outcome::Pass;
    }
    let out = result.unwrap_or_else(|e| panic!("{ctx}: {e}"));
    if let Some(sel) = expect.get("selected") {
        assert_eq!(
            out.selected,
            id_of(case.request(), sel) as u32,
            "{ctx}: selected"
        );
    }
    if let Some(sup) = expect.get("support") {
        let mut want: Vec<u32> = sup
            .as_array()
            .unwrap()
            .iter()
            .map(|v| id_of(case.request(), v) as u32)
            .collect();
        want.sort_unstable();
        assert_eq!(out.support, want, "{ctx}: support");
    }
    let d = expect.get("decimals").and_then(Value::as_u64).unwrap_or(3) as u32;
    for key in NUMERIC_KEYS {
        if let Some(map) = expect.get(key).and_then(Value::as_object) {
            for (tok, want) in map {
                let id = id_of(case.request(), &Value::String(tok.clone()));
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
    Outcome::Pass
}

#[test]
fn all_vector_files_pass() {
    vectors::run(
        Minimum {
            files: 5,
            cases_run: 40,
        },
        check_case,
    );
}
