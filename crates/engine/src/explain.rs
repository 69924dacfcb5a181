//! One decoding step explained, shared by `nextok explain` and the server's `/v1/explain`:
//! a [`StepRequest`] (logits given as data) run through its pipeline, optionally under a
//! constraint over the token names' bytes, and the model's next step of a running request
//! turned into the same [`ExplainOutput`].

use std::sync::Arc;

use nextok_constraint::{ConstraintEngine, ConstraintVocab};
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
    let mut constraint_error = None;
    let out = req.explain_output_with(|sampler, state| {
        let bytes = TokenBytes::new(names.iter().map(|n| n.as_bytes()))?;
        let attach = || -> Result<_> {
            let vocab =
                ConstraintVocab::new(&bytes, sampler.vocab()).map_err(EngineError::constraint)?;
            let engine = ConstraintEngine::new(Arc::new(vocab)).map_err(EngineError::constraint)?;
            let compiled = engine
                .compile(&spec)
                .map_err(|e| EngineError::constraint(e).with_field("params.constraint"))?;
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

/// Most output tokens [`model_step_after`] takes as already accepted.
pub const MAX_ACCEPTED: usize = 512;

/// The model's step after `accepted` output tokens (a prepared request whose output so far is
/// `accepted`, say the tokens a reader accepted one by one on the ledger page): the model reads
/// the prompt then `accepted` (a KV cache of its own, filled for exactly that prefix), and the
/// sampler's state has committed them as output — the constraint has consumed them, the
/// penalties count them, the random stream stands at step `accepted.len()`. So, with the same
/// seed and parameters, the step equals step `accepted.len()` of the request that generated
/// `accepted`. `prepared`'s `max_tokens` must leave room for one more token. Errors name
/// `accepted[i]` when the sampler or the constraint refuses a token or it ends the sequence.
/// Also returns why the selected token would end the sequence, if it would (EOS, a stop token or
/// string, the constraint's acceptance; `max_tokens` is not counted).
pub fn model_step_after(
    model: &Model,
    prepared: &crate::Prepared,
    accepted: &[u32],
) -> Result<(Explanation, Option<nextok_core::FinishReason>)> {
    use nextok_model::LogitsSource;
    if accepted.len() > MAX_ACCEPTED {
        return Err(EngineError::invalid(
            "accepted",
            format!("at most {MAX_ACCEPTED} accepted tokens"),
        ));
    }
    let info = &prepared.info;
    let sampler = &prepared.sampler;
    let seed = info.seeds.first().copied().unwrap_or(0);
    let mut state = sampler
        .new_state(&info.prompt_ids, seed)
        .map_err(EngineError::core)?;
    if let Some(c) = &prepared.constraint {
        state.set_grammar(Box::new(c.start()));
    }
    for (i, &t) in accepted.iter().enumerate() {
        let field = format!("accepted[{i}]");
        match sampler.commit(&mut state, t) {
            Ok(None) => {}
            Ok(Some(finish)) => {
                let why = serde_json::to_value(finish)
                    .ok()
                    .and_then(|v| v["reason"].as_str().map(str::to_string))
                    .unwrap_or_default();
                return Err(EngineError::invalid(
                    field,
                    format!("it ends the sequence ({why}): there is no next step"),
                ));
            }
            Err(e) => return Err(EngineError::invalid(field, e.to_string())),
        }
    }
    let mut ids = Vec::with_capacity(info.prompt_ids.len() + accepted.len());
    ids.extend_from_slice(&info.prompt_ids);
    ids.extend_from_slice(accepted);
    let ctx = model.weights.config.context_length;
    if ids.len() >= ctx {
        return Err(EngineError::new(
            ErrorKind::TooLarge,
            format!("prompt and accepted tokens fill the context of {ctx}"),
        )
        .with_field("accepted"));
    }
    let mut source = model.source();
    let logits = source.prefill(&ids).map_err(EngineError::model)?;
    let ex = sampler
        .explain(&logits, &state, nextok_core::Draw::Stream)
        .map_err(EngineError::core)?;
    // what accepting the selected token would do
    let mut next = state.clone();
    let finish = sampler
        .commit(&mut next, ex.record.selected)
        .map_err(EngineError::core)?
        .filter(|f| *f != nextok_core::FinishReason::MaxTokens);
    Ok((ex, finish))
}
