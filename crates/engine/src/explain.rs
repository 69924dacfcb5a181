//! One decoding step explained, shared by `nextok explain` and the server's `/v1/explain`:
//! a [`StepRequest`] (logits given as data) run through its pipeline, optionally under a
//! constraint over the token names' bytes, and the model's next step of a running request
//! turned into the same [`ExplainOutput`].

use std::sync::Arc;

use nextok_constraint::{ConstraintEngine, ConstraintSpec, ConstraintVocab};
use nextok_core::request::{ExplainOutput, NamedRow};
use nextok_core::{Explanation, StepRequest, TokenBytes};
use nextok_model::Model;

use crate::error::{EngineError, ErrorKind, Result};
use crate::request::RequestInfo;

/// Parses a step request (JSON text) and explains its step. Errors name the field at fault.
pub fn explain_json(text: &str) -> Result<ExplainOutput> {
    let req = StepRequest::from_json(text).map_err(EngineError::core)?;
    explain_step(&req)
}

/// Explains the step `req` describes; a `params.constraint` is compiled over the bytes of the
/// token names (`tokens` is then required) and advanced over `selected_ids`.
pub fn explain_step(req: &StepRequest) -> Result<ExplainOutput> {
    let Some(spec) = req.params.constraint.clone() else {
        return req.explain_output().map_err(EngineError::core);
    };
    // the constraint works on token bytes: here, the bytes of the token names
    let names = req.tokens.clone().ok_or_else(|| {
        EngineError::invalid(
            "tokens",
            "a constraint needs token names (their bytes are the tokens' bytes)",
        )
    })?;
    let spec: ConstraintSpec = serde_json::from_value(spec)
        .map_err(|e| EngineError::invalid("params.constraint", e.to_string()))?;
    let mut constraint_error = None;
    let out = req.explain_output_with(|sampler, state| {
        let bytes = TokenBytes::new(names.iter().map(|n| n.as_bytes()))?;
        let attach = || -> Result<_> {
            let vocab = ConstraintVocab::new(&bytes, sampler.vocab())
                .map_err(|e| EngineError::new(ErrorKind::Constraint, e.to_string()))?;
            let engine = ConstraintEngine::new(Arc::new(vocab))
                .map_err(|e| EngineError::new(ErrorKind::Constraint, e.to_string()))?;
            let compiled = engine.compile(&spec).map_err(|e| {
                EngineError::new(ErrorKind::Constraint, e.to_string())
                    .with_field("params.constraint")
            })?;
            let mut seq = compiled.start();
            for (i, &t) in req.selected_ids.iter().enumerate() {
                seq.consume(t).map_err(|e| {
                    EngineError::invalid(
                        format!("selected_ids[{i}]"),
                        format!("the constraint rejects it: {e}"),
                    )
                })?;
            }
            Ok(seq)
        };
        match attach() {
            Ok(seq) => {
                state.set_grammar(Box::new(seq));
                Ok(())
            }
            Err(e) => {
                constraint_error = Some(e);
                Err(nextok_core::ErrorKind::AlreadyFinished.into())
            }
        }
    });
    match (out, constraint_error) {
        (_, Some(e)) => Err(e),
        (r, None) => r.map_err(EngineError::core),
    }
}

/// The ledger of one of the model's steps (an [`Event::Ledger`](crate::Event::Ledger)) as an
/// [`ExplainOutput`]: the support by final probability (at most `support_rows` rows), then the
/// `outside_rows` highest raw logits outside it; tokens are named by their bytes (Rust debug
/// form of the lossy UTF-8).
pub fn model_step_output(
    model: &Model,
    info: &RequestInfo,
    ex: &Explanation,
    support_rows: usize,
    outside_rows: usize,
) -> ExplainOutput {
    let name = |t: u32| {
        let b = model.vocab.token(t).unwrap_or(&[]);
        format!("{:?}", String::from_utf8_lossy(b))
    };
    let mut kept: Vec<&nextok_core::TokenRow> = ex.tokens.iter().filter(|r| r.kept).collect();
    kept.sort_by(|a, b| {
        b.selection_prob
            .total_cmp(&a.selection_prob)
            .then(a.id.cmp(&b.id))
    });
    let mut support: Vec<u32> = kept.iter().map(|r| r.id).collect();
    support.sort_unstable();
    let mut out: Vec<&nextok_core::TokenRow> = ex.tokens.iter().filter(|r| !r.kept).collect();
    out.sort_by(|a, b| b.raw_logit.total_cmp(&a.raw_logit).then(a.id.cmp(&b.id)));
    let rows: Vec<NamedRow> = kept
        .iter()
        .take(support_rows)
        .chain(out.iter().take(outside_rows))
        .map(|r| NamedRow {
            token: name(r.id),
            row: (*r).clone(),
        })
        .collect();
    ExplainOutput {
        selected: ex.record.selected,
        selected_token: Some(name(ex.record.selected)),
        support,
        pipeline_hash: info.pipeline_hash.clone(),
        pipeline: info.pipeline.clone(),
        u: ex.record.rng.u,
        tokens: rows,
        record: ex.record.clone(),
    }
}
