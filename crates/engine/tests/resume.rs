//! Resuming a request from the tokens it already produced (`GenerateRequest::resume`), on the
//! real model (SmolLM2-135M-Instruct, from the test data): whatever the cut, the resumed run
//! produces exactly the uninterrupted run's remaining tokens, records and text, with sampling,
//! penalties, stop strings, a JSON-schema constraint, `n` sequences and speculative decoding;
//! tokens the sequence could not have produced are the request's typed error.

use std::sync::Arc;

use nextok_core::SamplingParams;
use nextok_engine::{ConstraintSpec, Engine, EngineConfig, ErrorKind, GenerateRequest, Prompt};
use nextok_model::{Model, Requant};

fn engine() -> Option<Engine> {
    let Some(path) = nextok_testdata::optional(nextok_testdata::SMOLLM2) else {
        eprintln!("SKIPPED: the test model is not in the test data (scripts/fetch-testdata.sh)");
        return None;
    };
    static M: std::sync::OnceLock<Arc<Model>> = std::sync::OnceLock::new();
    let m = M
        .get_or_init(|| Arc::new(Model::load(&path, Requant::Keep).expect("model loads")))
        .clone();
    Some(Engine::new(m, EngineConfig::default()).expect("engine starts"))
}

fn base(prompt: &str, seed: u64, max_tokens: u64) -> GenerateRequest {
    let mut r = GenerateRequest::new(Prompt::Text(prompt.to_string()));
    r.params = SamplingParams {
        temperature: Some(0.9),
        top_p: Some(0.95),
        seed: Some(seed),
        max_tokens: Some(max_tokens),
        ..Default::default()
    };
    r.records = Some(4);
    r
}

/// The cases: plain sampling, penalties and a stop string, a JSON schema, two sequences.
fn cases() -> Vec<(&'static str, GenerateRequest)> {
    let plain = base("Once upon a time, in a small village by the sea,", 7, 40);
    let mut penalties = base("List three colours:", 11, 40);
    penalties.params.repetition_penalty = Some(1.3);
    penalties.params.presence_penalty = Some(0.5);
    penalties.params.stop = vec!["\n\n".into()];
    let mut schema = base(
        "<|im_start|>user\nGive me a person as JSON.<|im_end|>\n<|im_start|>assistant\n",
        3,
        48,
    );
    schema.params.constraint = Some(ConstraintSpec::JsonSchema {
        schema: serde_json::json!({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]}),
        options: Default::default(),
    });
    let mut two = base("The capital of France is", 99, 24);
    two.n = 2;
    let mut spec = base(
        "def fibonacci(n):\n    if n < 2:\n        return n\n",
        5,
        32,
    );
    spec.params.temperature = Some(0.0);
    spec.speculative = Some(Default::default());
    vec![
        ("plain", plain),
        ("penalties and a stop string", penalties),
        ("json schema", schema),
        ("n = 2", two),
        ("speculative", spec),
    ]
}

#[test]
fn a_resumed_request_continues_exactly_as_the_uninterrupted_run() {
    let Some(e) = engine() else { return };
    for (name, req) in cases() {
        let full = e.generate(req.clone()).expect("full run");
        let longest = full.sequences.iter().map(|s| s.tokens.len()).max().unwrap();
        assert!(longest >= 4, "{name}: too short a run to cut ({longest})");
        // cuts: none, the first token, the middle, one before the end, the whole output
        for cut in [0, 1, longest / 2, longest - 1, longest] {
            let mut r = req.clone();
            let resume: Vec<Vec<u32>> = full
                .sequences
                .iter()
                .map(|s| s.tokens[..cut.min(s.tokens.len())].to_vec())
                .collect();
            r.resume = Some(resume.clone());
            let got = e
                .generate(r)
                .unwrap_or_else(|err| panic!("{name} cut {cut}: {err}"));
            assert_eq!(got.sequences.len(), full.sequences.len());
            for (i, (a, b)) in full.sequences.iter().zip(&got.sequences).enumerate() {
                let k = resume[i].len();
                assert_eq!(b.tokens, a.tokens[k..], "{name} cut {cut} seq {i}: tokens");
                // (a speculating sequence's draft marks follow its drafter's history, which
                // starts again at the resume: everything else is the same)
                let marks = |r: &[nextok_core::StepRecord]| -> Vec<String> {
                    r.iter()
                        .map(|x| {
                            let mut v = serde_json::to_value(x).unwrap();
                            v.as_object_mut().unwrap().remove("draft");
                            v.to_string()
                        })
                        .collect()
                };
                let (want, have) = (marks(&a.records[k..]), marks(&b.records));
                assert_eq!(want.len(), have.len(), "{name} cut {cut} seq {i}: records");
                for (j, (x, y)) in want.iter().zip(&have).enumerate() {
                    assert!(x == y, "{name} cut {cut} seq {i}: record {j} differs");
                }
                assert_eq!(b.finish, a.finish, "{name} cut {cut} seq {i}: finish");
                // the text after what the resumed tokens already showed
                assert!(
                    a.text.ends_with(&b.text),
                    "{name} cut {cut} seq {i}: {:?} does not end the full text {:?}",
                    b.text,
                    a.text
                );
            }
            // usage counts the resumed tokens too: the client's totals are the full run's
            assert_eq!(
                got.usage.completion_tokens, full.usage.completion_tokens,
                "{name} cut {cut}: usage"
            );
        }
    }
}

#[test]
fn resumed_tokens_the_sequence_could_not_have_produced_are_typed_errors() {
    let Some(e) = engine() else { return };
    let req = base("List three colours:", 11, 12);
    let full = e.generate(req.clone()).unwrap();
    let toks = full.sequences[0].tokens.clone();
    let field = |r: GenerateRequest| {
        let err = e.generate(r).expect_err("refused");
        (err.kind().clone(), err.field().map(str::to_string))
    };
    // no seed: the first run's seed is needed
    let mut r = req.clone();
    r.params.seed = None;
    r.resume = Some(vec![toks[..2].to_vec()]);
    assert_eq!(
        field(r),
        (ErrorKind::InvalidRequest, Some("seed".to_string()))
    );
    // one list per sequence
    let mut r = req.clone();
    r.resume = Some(vec![toks[..2].to_vec(), vec![]]);
    assert_eq!(
        field(r),
        (ErrorKind::InvalidRequest, Some("resume".to_string()))
    );
    // past max_tokens
    let mut r = req.clone();
    r.resume = Some(vec![vec![toks[0]; 13]]);
    assert_eq!(
        field(r),
        (ErrorKind::InvalidRequest, Some("resume[0]".to_string()))
    );
    // outside the vocabulary
    let mut r = req.clone();
    r.resume = Some(vec![vec![toks[0], u32::MAX]]);
    assert_eq!(
        field(r),
        (ErrorKind::InvalidRequest, Some("resume[0][1]".to_string()))
    );
    // a token after the end (max_tokens reached)
    let mut r = req.clone();
    r.params.max_tokens = Some(3);
    r.resume = Some(vec![toks[..3].to_vec()]);
    // (three tokens end it: accepted, and the request ends at once)
    let c = e
        .generate(r.clone())
        .expect("a finished resume ends at once");
    assert!(c.sequences[0].tokens.is_empty());
    assert_eq!(c.usage.completion_tokens, 3);
    // a token the constraint rejects
    let mut r = base("Give me JSON:", 1, 8);
    r.params.constraint = Some(ConstraintSpec::JsonSchema {
        schema: serde_json::json!({"type": "object"}),
        options: Default::default(),
    });
    let not_json = e.model().encode_prompt("hello").unwrap();
    r.resume = Some(vec![vec![*not_json.last().unwrap()]]);
    let (kind, f) = field(r);
    assert_eq!(f.as_deref(), Some("resume[0][0]"), "{kind:?}");
    // the engine goes on serving
    assert_eq!(e.generate(req).unwrap().sequences[0].tokens, toks);
}
