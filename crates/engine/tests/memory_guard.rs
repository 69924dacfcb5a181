//! The memory guard on the KV cache budget (one test in its own process: it sets
//! `NEXTOK_MEMORY_LIMIT`, which caps the memory nextok assumes is available): a budget the
//! caller sets beyond what is available is refused when the engine starts, naming
//! `kv_budget_bytes` and both sizes; the default budget is lowered to 90 % of it instead, and
//! the engine answers.

use std::sync::Arc;

use nextok_core::SamplingParams;
use nextok_engine::{Engine, EngineConfig, GenerateRequest, Prompt, DEFAULT_KV_BUDGET_BYTES};
use nextok_model::{Model, Requant};

#[test]
fn a_kv_budget_that_does_not_fit_is_refused_and_the_default_shrinks() {
    let Some(path) = nextok_testdata::optional(nextok_testdata::SMOLLM2) else {
        eprintln!("SKIPPED: the test model is not in the test data (scripts/fetch-testdata.sh)");
        return;
    };
    let model = Arc::new(Model::load(&path, Requant::Keep).expect("model loads"));
    // the only test of this binary: nothing else reads the variable meanwhile
    std::env::set_var("NEXTOK_MEMORY_LIMIT", "256M");
    let asked = EngineConfig {
        kv_budget_bytes: 1 << 30,
        ..Default::default()
    };
    let Err(e) = Engine::new(model.clone(), asked) else {
        panic!("a budget beyond the memory available was accepted")
    };
    assert_eq!(e.field(), Some("kv_budget_bytes"), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("1024.0 MiB of KV cache would not fit")
            || msg.contains("1.00 GiB of KV cache would not fit"),
        "{msg}"
    );
    assert!(msg.contains("256.0 MiB is available"), "{msg}");
    assert!(msg.contains("NEXTOK_MEMORY_LIMIT"), "{msg}");

    // the default budget (4 GiB) shrinks to 90 % of the 256 MiB and the engine runs
    let config = EngineConfig::default();
    assert_eq!(config.kv_budget_bytes, DEFAULT_KV_BUDGET_BYTES);
    let engine = Engine::new(model, config).expect("the default budget shrinks");
    let budget = engine.kv_budget_bytes();
    assert!(budget > 0 && budget <= (256 << 20) / 10 * 9, "{budget}");
    let mut r = GenerateRequest::new(Prompt::Text("Hello".into()));
    r.params = SamplingParams {
        temperature: Some(0.0),
        max_tokens: Some(4),
        ..Default::default()
    };
    let out = engine.generate(r).expect("answers");
    assert_eq!(out.usage.completion_tokens, 4);
    std::env::remove_var("NEXTOK_MEMORY_LIMIT");
}
