//! One sequence at a time, outside the scheduler.
//!
//! * [`run_sequence`] — the plain decode loop (one model call per token, the constraint's next
//!   mask computed while the model runs): `nextok bench decode` measures it part by part, and
//!   `nextok bench engine` runs requests through it one after another as the baseline of
//!   continuous batching.
//! * [`Engine::beam`](crate::Engine::beam) — beam search over the request's pipeline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nextok_constraint::CompiledConstraint;
use nextok_core::{Draw, FinishReason, Sampler, StepRecord};
use nextok_model::beam::{beam_search_with, BeamConfig, BeamFinish, PipelineScorer};
use nextok_model::{LogitsSource, Model};

use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::request::GenerateRequest;
use crate::speculative::{Adaptive, Drafter, SpecOptions, SpecStats};

/// Options of [`run_sequence`].
#[derive(Debug, Clone, Default)]
pub struct SoloOptions {
    /// Record every step with this many candidates.
    pub record: Option<usize>,
    /// The compiled constraint (its start state is attached).
    pub constraint: Option<Arc<CompiledConstraint>>,
    /// Compute the constraint's next mask on another thread while the model runs.
    pub overlap: bool,
    /// Speculate with prompt lookup (`exact` acceptance: the same tokens and records as
    /// without; see [`crate::speculative`]).
    pub speculative: Option<SpecOptions>,
}

/// Where a sequence's time went (wall clock of the decode loop, per part).
#[derive(Debug, Default, Clone, Copy)]
pub struct SeqTime {
    /// The whole loop, first step to last.
    pub total: Duration,
    /// Model calls (`decode_one`), including the wait for an overlapped mask.
    pub model: Duration,
    /// Sampler steps (processing, the mask when it was not prepared, selection, commit; with a
    /// trace, building the record).
    pub sample: Duration,
    /// Masks prepared ahead on the other thread (off the critical path unless longer than
    /// the model call).
    pub prepare: Duration,
    /// How long the loop waited for a prepared mask after the model call had finished.
    pub wait: Duration,
}

/// What [`run_sequence`] produced.
#[derive(Debug, Clone, Default)]
pub struct SoloOutput {
    /// Selected tokens.
    pub tokens: Vec<u32>,
    /// Step records, when asked for.
    pub records: Vec<StepRecord>,
    /// Why it ended (`None`: the context is full).
    pub finish: Option<FinishReason>,
    /// Where the time went.
    pub time: SeqTime,
    /// What speculation did (all zero without it).
    pub spec: SpecStats,
}

impl crate::Prepared {
    /// The loop's options for this request: its constraint, and `record`, `overlap` and
    /// `speculative` as given.
    pub fn solo_options(
        &self,
        record: Option<usize>,
        overlap: bool,
        speculative: Option<SpecOptions>,
    ) -> SoloOptions {
        SoloOptions {
            record,
            constraint: self.constraint.clone(),
            overlap,
            speculative,
        }
    }

    /// Runs this request through the one-sequence loop ([`run_sequence`]) with its compiled
    /// pipeline, prompt and first seed: `src` has been fed the prompt, and `first_row` is the
    /// logits row that gave (as [`LogitsSource::prefill`] returns it).
    pub fn run_prefilled<S: LogitsSource + Send>(
        &self,
        model: &Model,
        src: S,
        first_row: Vec<f32>,
        o: &SoloOptions,
    ) -> Result<SoloOutput> {
        let seed = self.info.seeds[0];
        run_sequence(
            model,
            &self.sampler,
            src,
            &self.info.prompt_ids,
            first_row,
            seed,
            o,
        )
    }
}

/// Decodes one sequence from `first_row` (the logits after `prompt`, already fed to `src`)
/// until it finishes.
pub fn run_sequence<S: LogitsSource + Send>(
    model: &Model,
    sampler: &Sampler,
    mut src: S,
    prompt: &[u32],
    first_row: Vec<f32>,
    seed: u64,
    o: &SoloOptions,
) -> Result<SoloOutput> {
    let mut state = sampler.new_state(prompt, seed).map_err(EngineError::core)?;
    if let Some(c) = &o.constraint {
        state.set_grammar(Box::new(c.start()));
    }
    let mut ws = sampler.new_workspace();
    if let Some(spec) = o.speculative {
        if spec.drafter != crate::speculative::DrafterKind::Ngram {
            return Err(EngineError::invalid(
                "speculative.drafter",
                "this loop drafts by prompt lookup; a draft model goes through run_sequence_drafted",
            ));
        }
        let mut drafter = spec.ngram;
        return run_speculative(
            model,
            sampler,
            src,
            prompt,
            first_row,
            state,
            ws,
            o,
            spec,
            &mut drafter,
        );
    }
    let mut row = first_row;
    let mut out = SoloOutput::default();
    let ctx = model.weights.config.context_length;
    let start = Instant::now();
    loop {
        let t = Instant::now();
        let res = if let Some(n) = o.record {
            let (res, rec) = sampler
                .step_recorded(&row, &mut state, &mut ws, Draw::Stream, n)
                .map_err(EngineError::core)?;
            out.records.push(rec);
            res
        } else {
            sampler
                .step(&row, &mut state, &mut ws)
                .map_err(EngineError::core)?
        };
        out.time.sample += t.elapsed();
        out.tokens.push(res.token);
        if res.finish.is_some() {
            out.finish = res.finish;
            break;
        }
        if src.len() + 1 >= ctx {
            break;
        }
        let t = Instant::now();
        let masking = o.overlap && state.grammar().is_some_and(|g| g.is_active());
        row = if masking {
            // the next mask depends only on the state: compute it while the model runs, as a
            // job another thread of the pool steals (no thread is created per token)
            let (row, prep) = rayon::join(
                || {
                    let row = src.decode_one(res.token);
                    (row, Instant::now())
                },
                || {
                    let t = Instant::now();
                    sampler.prepare(&state).map(|()| t.elapsed())
                },
            );
            let (row, done) = row;
            out.time.wait += done.elapsed();
            out.time.prepare += prep.map_err(EngineError::core)?;
            row.map_err(EngineError::model)?
        } else {
            src.decode_one(res.token).map_err(EngineError::model)?
        };
        out.time.model += t.elapsed();
    }
    out.time.total = start.elapsed();
    Ok(out)
}

/// [`run_sequence`] speculating with `drafter` (for example a [`crate::speculative::ModelDrafter`])
/// and at most `spec.max_draft` tokens per draft (`o.speculative` is ignored), accepted by
/// `spec.acceptance` (`exact`: the output equals plain decoding's).
#[allow(clippy::too_many_arguments)]
pub fn run_sequence_drafted<S: LogitsSource + Send>(
    model: &Model,
    sampler: &Sampler,
    src: S,
    prompt: &[u32],
    first_row: Vec<f32>,
    seed: u64,
    o: &SoloOptions,
    spec: SpecOptions,
    drafter: &mut dyn Drafter,
) -> Result<SoloOutput> {
    let mut state = sampler.new_state(prompt, seed).map_err(EngineError::core)?;
    if let Some(c) = &o.constraint {
        state.set_grammar(Box::new(c.start()));
    }
    let ws = sampler.new_workspace();
    run_speculative(
        model, sampler, src, prompt, first_row, state, ws, o, spec, drafter,
    )
}

/// One sampler step on `row` (recorded when asked); `draft` is the drafted token the step
/// verifies, judged by `spec`'s acceptance mode.
#[allow(clippy::too_many_arguments)]
fn step_once(
    sampler: &Sampler,
    row: &[f32],
    state: &mut nextok_core::DecoderState,
    ws: &mut nextok_core::support::Workspace,
    record: Option<usize>,
    records: &mut Vec<StepRecord>,
    spec: &SpecOptions,
    draft: Option<u32>,
) -> Result<nextok_core::StepResult> {
    let draw = spec.draw(draft);
    match record {
        Some(n) => {
            let (res, mut rec) = sampler
                .step_recorded(row, state, ws, draw, n)
                .map_err(EngineError::core)?;
            spec.mark(&mut rec, draft);
            records.push(rec);
            Ok(res)
        }
        None => sampler
            .step_draw(row, state, ws, draw)
            .map_err(EngineError::core),
    }
}

/// [`run_sequence`] with speculation: each model call feeds the pending token and a draft, and
/// the sampler steps through the rows until its selection differs from the draft.
#[allow(clippy::too_many_arguments)]
fn run_speculative<S: LogitsSource + Send>(
    model: &Model,
    sampler: &Sampler,
    mut src: S,
    prompt: &[u32],
    first_row: Vec<f32>,
    mut state: nextok_core::DecoderState,
    mut ws: nextok_core::support::Workspace,
    o: &SoloOptions,
    spec: SpecOptions,
    drafter: &mut dyn Drafter,
) -> Result<SoloOutput> {
    spec.check()?;
    let mut out = SoloOutput::default();
    let ctx = model.weights.config.context_length;
    let vocab = src.vocab_size();
    let start = Instant::now();
    let mut adapt = Adaptive::new(spec.max_draft);
    let mut history: Vec<u32> = prompt.to_vec();
    let mut draft: Vec<u32> = Vec::with_capacity(spec.max_draft);
    let mut scratch = crate::speculative::DraftScratch::with_capacity(spec.max_draft);
    let mut feed: Vec<u32> = Vec::with_capacity(spec.max_draft + 1);
    let t = Instant::now();
    let res = step_once(
        sampler,
        &first_row,
        &mut state,
        &mut ws,
        o.record,
        &mut out.records,
        &spec,
        None,
    )?;
    out.time.sample += t.elapsed();
    out.tokens.push(res.token);
    history.push(res.token);
    if res.finish.is_some() {
        out.finish = res.finish;
        out.time.total = start.elapsed();
        return Ok(out);
    }
    // the last selected token, not yet fed to the model
    let mut pending = res.token;
    'outer: loop {
        let base = src.len();
        if base + 1 >= ctx {
            break;
        }
        // room for the pending token and the draft inside the context, and no row past the
        // output limit (the batched engine's rule: docs/semantics.md, "Draft length and the
        // output limit"; `out.tokens` counts the pending token)
        let left = sampler.stop().max_tokens.map_or(usize::MAX, |m| {
            usize::try_from(m)
                .unwrap_or(usize::MAX)
                .saturating_sub(out.tokens.len() + 1)
        });
        let k = adapt.next_len().min(ctx - base - 2).min(left);
        crate::speculative::draft_next(
            drafter,
            &mut history,
            spec.constraint_source(state.grammar(), model),
            k,
            &mut scratch,
            &mut draft,
        );
        feed.clear();
        feed.push(pending);
        feed.extend_from_slice(&draft);
        let t = Instant::now();
        let rows = src.extend_all(&feed).map_err(EngineError::model)?;
        out.time.model += t.elapsed();
        let mut accepted = 0;
        for j in 0..feed.len() {
            let t = Instant::now();
            let res = step_once(
                sampler,
                &rows[j * vocab..(j + 1) * vocab],
                &mut state,
                &mut ws,
                o.record,
                &mut out.records,
                &spec,
                draft.get(j).copied(),
            )?;
            out.time.sample += t.elapsed();
            out.tokens.push(res.token);
            history.push(res.token);
            let agrees = j < draft.len() && res.token == draft[j];
            if res.finish.is_some() {
                out.finish = res.finish;
                if agrees {
                    accepted += 1;
                }
                record_draft(&mut out.spec, &mut adapt, draft.len(), accepted);
                break 'outer;
            }
            if agrees {
                accepted += 1;
                continue;
            }
            pending = res.token;
            break;
        }
        record_draft(&mut out.spec, &mut adapt, draft.len(), accepted);
        // keep the pending token's and the accepted draft's positions
        src.truncate(base + 1 + accepted)
            .map_err(EngineError::model)?;
    }
    out.time.total = start.elapsed();
    Ok(out)
}

fn record_draft(stats: &mut SpecStats, adapt: &mut Adaptive, drafted: usize, accepted: usize) {
    if drafted > 0 {
        stats.verifications += 1;
        stats.drafted += drafted;
        stats.accepted += accepted;
    }
    adapt.observe(drafted, accepted);
}

/// How a beam hypothesis ended.
#[derive(Debug, Clone, PartialEq)]
pub enum BeamEnd {
    /// An EOS token.
    Eos,
    /// The length limit.
    Length,
    /// A stop condition of the request (stop token, stop string, grammar acceptance).
    Stop(FinishReason),
}

/// One finished beam hypothesis.
#[derive(Debug, Clone)]
pub struct BeamOutput {
    /// Its tokens.
    pub tokens: Vec<u32>,
    /// Its visible text (stop strings cut it as a sampled sequence's stream would).
    pub text: String,
    /// Length-penalised score.
    pub score: f64,
    /// Sum of processed-layer logprobs.
    pub logprob: f64,
    /// How it ended.
    pub end: BeamEnd,
}

impl Engine {
    /// Beam search with `width` hypotheses and length penalty `alpha` over `req`'s pipeline,
    /// on the calling thread (not batched). Each hypothesis has its own decoder state (masks,
    /// penalties, constraint, stop conditions); best first.
    pub fn beam(&self, req: GenerateRequest, width: usize, alpha: f64) -> Result<Vec<BeamOutput>> {
        if width == 0 {
            return Err(EngineError::invalid("beam_width", "must be at least 1"));
        }
        if width > 64 {
            return Err(EngineError::invalid("beam_width", "at most 64"));
        }
        if req.n != 1 {
            return Err(EngineError::invalid(
                "n",
                "beam search returns its own hypotheses; n must be 1",
            ));
        }
        let p = self.prepare(&req)?;
        // every hypothesis may hold a whole branch of prompt and output: the same budget as
        // `width` sequences of the batch engine
        let (budget, block) = self.kv_budget();
        let prompt = p.info.prompt_ids.len();
        let out = p.info.max_tokens as usize;
        let need = width.saturating_mul(nextok_model::KvGeometry::blocks_for(prompt + out));
        if need > budget {
            return Err(EngineError::new(
                crate::error::ErrorKind::TooLarge,
                format!(
                    "{width} beams of a {prompt}-token prompt and {out} tokens need {} bytes of KV cache; the budget is {}",
                    need.saturating_mul(block),
                    budget * block
                ),
            )
            .with_field("beam_width"));
        }
        let model = self.model();
        let sampler = &p.sampler;
        let seed = p.info.seeds[0];
        let cfg = BeamConfig {
            width,
            length_penalty: alpha,
            max_tokens: p.info.max_tokens as usize,
            eos_token_ids: model.vocab.info.eos_token_ids.clone(),
        };
        let prompt = &p.info.prompt_ids;
        let mut start = sampler.new_state(prompt, seed).map_err(EngineError::core)?;
        if let Some(c) = &p.constraint {
            start.set_grammar(Box::new(c.start()));
        }
        let scorer = PipelineScorer::new(sampler, start.clone());
        let hyps =
            beam_search_with(model.source(), prompt, &cfg, &scorer).map_err(EngineError::model)?;
        let mut out = Vec::with_capacity(hyps.len());
        for h in hyps {
            let mut st = start.clone();
            let mut stream = sampler.text_stream();
            let mut text = String::new();
            for &t in &h.tokens {
                sampler.commit(&mut st, t).map_err(EngineError::core)?;
                text.push_str(&stream.push(sampler.visible_bytes(t), st.stop_state().hit.as_ref()));
            }
            text.push_str(&stream.finish());
            out.push(BeamOutput {
                tokens: h.tokens,
                text,
                score: h.score,
                logprob: h.logprob,
                end: match h.finish {
                    BeamFinish::Eos => BeamEnd::Eos,
                    BeamFinish::Length => BeamEnd::Length,
                    BeamFinish::Stop(r) => BeamEnd::Stop(r),
                },
            });
        }
        Ok(out)
    }
}
