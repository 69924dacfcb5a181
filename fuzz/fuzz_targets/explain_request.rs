#![no_main]
//! `nextok explain`'s request: parse, build, run one step (and compile its constraint, if any,
//! over the request's token names as the CLI does).

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use nextok_constraint::{ConstraintEngine, ConstraintSpec, ConstraintVocab};
use nextok_core::{StepRequest, TokenBytes};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(req) = StepRequest::from_json(text) else {
        return;
    };
    if req.logits.len() > 4096 {
        return;
    }
    let Ok(out) = req.explain_output() else {
        return;
    };
    assert!(out.support.contains(&out.selected));
    let (Some(spec), Some(names)) = (req.params.constraint.clone(), req.tokens.clone()) else {
        return;
    };
    let Ok(spec) = serde_json::from_value::<ConstraintSpec>(spec) else {
        return;
    };
    let _ = req.explain_output_with(|sampler, state| {
        let bytes = TokenBytes::new(names.iter().map(|n| n.as_bytes()))?;
        let Ok(vocab) = ConstraintVocab::new(&bytes, sampler.vocab()) else {
            return Ok(());
        };
        let Ok(engine) = ConstraintEngine::new(Arc::new(vocab)) else {
            return Ok(());
        };
        if let Ok(c) = engine.compile(&spec) {
            state.set_grammar(Box::new(c.start()));
        }
        Ok(())
    });
});
