//! Beam search over a [`LogitsSource`], one KV branch per hypothesis (000 §3.11).
//!
//! A hypothesis is `(tokens, score, KV branch, state)`. What scores a step and what the state
//! holds is a [`BeamScorer`]:
//!
//! * [`RawScorer`] — scores are **raw-layer** logprobs (log-softmax of the model's logits, in
//!   `f64`, exactly as the sampler's records compute the raw layer); a hypothesis ends at an EOS
//!   id. No state.
//! * [`PipelineScorer`] — each hypothesis carries its own [`DecoderState`] (token counts,
//!   sequence automata, constraint state, stop state), and each step runs the request's
//!   pipeline on its logits: masks, penalties, the grammar mask and temperature shape the
//!   scores, which are **processed-layer** logprobs (log-softmax of the processed logits), and
//!   only tokens in the final support (after top-k / top-p / min-p / typical-p) are proposed.
//!   A hypothesis ends where the sampler's commit says a sequence ends: EOS, a stop token, a
//!   stop string, the constraint's acceptance (per the grammar policy), or `max_tokens`.
//!
//! The rules, all explicit:
//!
//! * Each step every live hypothesis proposes its `2·B` best next tokens (ties → lower id).
//!   All proposals are ranked by cumulative logprob, descending; ties → the parent that ranked
//!   first, then the lower token id.
//! * Walking down the ranking, a proposal that ends its sequence (for example an EOS id)
//!   becomes a **finished** hypothesis (the token counts in its length) if it ranks within the
//!   first `B` proposals; any other proposal becomes a live hypothesis until `B` are live. A
//!   live hypothesis forks its parent's branch (the last child takes the parent's branch
//!   itself) and feeds its token.
//! * The search stops when `B` hypotheses have finished (early stopping, as Hugging Face's
//!   `early_stopping=True`), when none is live, or after `max_tokens` steps (the smaller of the
//!   beam's and the scorer's, e.g. the request's `max_tokens`) — the live hypotheses then
//!   finish by length.
//! * Final ranking: `score = logprob / len^α` (`α` = `length_penalty`; `α = 0` compares raw
//!   sums), descending; ties → the shorter hypothesis, then the lexicographically smaller ids.
//!
//! All the numerics are nextok-core's own (`nextok_core::math`: the log-softmax normaliser, `ln`
//! and `exp` for `len^α`), never the platform's `libm`, so scores are the same bits everywhere.
//!
//! Greedy decoding is width 1.

use std::cell::RefCell;

use nextok_core::math;
use nextok_core::{DecoderState, Draw, FinishReason, Sampler, Workspace};

use crate::error::{ModelError, ModelErrorKind, Result};
use crate::LogitsSource;

/// Beam search parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct BeamConfig {
    /// Number of hypotheses kept (`B ≥ 1`).
    pub width: usize,
    /// `α` in `logprob / len^α`.
    pub length_penalty: f64,
    /// Most generated tokens per hypothesis.
    pub max_tokens: usize,
    /// Tokens that finish a hypothesis ([`RawScorer`]; a [`PipelineScorer`] uses the
    /// sampler's stop conditions instead).
    pub eos_token_ids: Vec<u32>,
}

/// Why a hypothesis ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BeamFinish {
    /// It selected an EOS id (included in `tokens`).
    Eos,
    /// It reached `max_tokens` (or the search ended while it was live).
    Length,
    /// Another stop condition of the request: a stop token, a stop string, the constraint's
    /// acceptance.
    Stop(FinishReason),
}

/// A finished hypothesis.
#[derive(Debug, Clone, PartialEq)]
pub struct Hypothesis {
    /// Generated ids (the finishing token last, when one finished it).
    pub tokens: Vec<u32>,
    /// Sum of the scorer's logprobs (raw or processed layer).
    pub logprob: f64,
    /// `logprob / len^α`.
    pub score: f64,
    /// Why it ended.
    pub finish: BeamFinish,
}

/// What scores a beam step and what each hypothesis carries besides its tokens.
pub trait BeamScorer {
    /// Per-hypothesis state (forked by cloning).
    type State: Clone;
    /// The state before the first generated token.
    fn start(&self) -> Result<Self::State>;
    /// Up to `n` proposals `(token, logprob)` for the step on `logits`, best first (ties →
    /// lower id).
    fn propose(&self, logits: &[f32], state: &Self::State, n: usize) -> Result<Vec<(u32, f64)>>;
    /// Appends `token` to `state`; returns why the sequence ends there, if it does.
    fn commit(&self, state: &mut Self::State, token: u32) -> Result<Option<BeamFinish>>;
    /// The scorer's own limit on generated tokens, if it has one (the search stops at the
    /// smaller of this and [`BeamConfig::max_tokens`]).
    fn max_tokens(&self) -> Option<usize> {
        None
    }
}

/// Raw-layer scores, EOS ids end a hypothesis (the scorer of [`beam_search`]).
#[derive(Debug, Clone)]
pub struct RawScorer {
    /// Tokens that finish a hypothesis.
    pub eos_token_ids: Vec<u32>,
}

impl BeamScorer for RawScorer {
    type State = ();
    fn start(&self) -> Result<()> {
        Ok(())
    }
    fn propose(&self, logits: &[f32], _: &(), n: usize) -> Result<Vec<(u32, f64)>> {
        if let Some(i) = logits
            .iter()
            .position(|z| z.is_nan() || *z == f32::INFINITY)
        {
            return Err(ModelError::new(format!(
                "invalid logits[{i}]: {} (NaN and +inf are not scored)",
                logits[i]
            ))
            .with_kind(ModelErrorKind::Invalid));
        }
        let lp = log_softmax(logits);
        let mut ids: Vec<u32> = (0..lp.len() as u32)
            .filter(|&i| lp[i as usize] > f64::NEG_INFINITY)
            .collect();
        ids.sort_by(|&x, &y| lp[y as usize].total_cmp(&lp[x as usize]).then(x.cmp(&y)));
        ids.truncate(n);
        Ok(ids.iter().map(|&t| (t, lp[t as usize])).collect())
    }
    fn commit(&self, _: &mut (), token: u32) -> Result<Option<BeamFinish>> {
        Ok(self
            .eos_token_ids
            .contains(&token)
            .then_some(BeamFinish::Eos))
    }
}

/// Scores with the request's pipeline: processed-layer logprobs over the final support, a
/// [`DecoderState`] per hypothesis (see the module docs).
pub struct PipelineScorer<'a> {
    sampler: &'a Sampler,
    start: DecoderState,
    ws: RefCell<Workspace>,
}

impl<'a> PipelineScorer<'a> {
    /// Hypotheses start from `start` (the prompt's state, with any constraint attached).
    pub fn new(sampler: &'a Sampler, start: DecoderState) -> Self {
        PipelineScorer {
            sampler,
            start,
            ws: RefCell::new(sampler.new_workspace()),
        }
    }
}

impl BeamScorer for PipelineScorer<'_> {
    type State = DecoderState;
    fn start(&self) -> Result<DecoderState> {
        Ok(self.start.clone())
    }
    fn propose(&self, logits: &[f32], state: &DecoderState, n: usize) -> Result<Vec<(u32, f64)>> {
        let mut ws = self.ws.borrow_mut();
        // the record lists the final support best first (ties → lower id) with each
        // candidate's logprob per layer; the selection itself is not used
        let (_, rec) = self
            .sampler
            .select_recorded(logits, state, &mut ws, Draw::FixedU(0.0), n)
            .map_err(|e| {
                ModelError::new(format!("beam step {}: {e}", state.step())).with_source(e)
            })?;
        Ok(rec
            .candidates
            .iter()
            .map(|c| (c.id, c.processed_logprob))
            .collect())
    }
    fn commit(&self, state: &mut DecoderState, token: u32) -> Result<Option<BeamFinish>> {
        let r = self.sampler.commit(state, token).map_err(|e| {
            ModelError::new(format!("beam step {}: {e}", state.step())).with_source(e)
        })?;
        Ok(r.map(|r| match r {
            FinishReason::Eos { .. } => BeamFinish::Eos,
            FinishReason::MaxTokens => BeamFinish::Length,
            other => BeamFinish::Stop(other),
        }))
    }
    fn max_tokens(&self) -> Option<usize> {
        self.sampler
            .stop()
            .max_tokens
            .map(|m| usize::try_from(m).unwrap_or(usize::MAX))
    }
}

struct Live<S, T> {
    tokens: Vec<u32>,
    logprob: f64,
    source: S,
    logits: Vec<f32>,
    state: T,
}

/// Log-softmax of `logits` in `f64`: `(z − m) − ln S` with nextok's normaliser
/// ([`math::log_sum_exp`]), the same bits as the raw-layer logprobs of the sampler's records.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let norm = math::log_sum_exp(logits);
    logits.iter().map(|&z| math::logprob(z, norm)).collect()
}

fn score(logprob: f64, len: usize, alpha: f64) -> f64 {
    if alpha == 0.0 {
        logprob
    } else {
        logprob / math::pow_f64(len.max(1) as f64, alpha)
    }
}

/// Runs beam search from `prompt` (non-empty) on `source` (an empty branch) with raw-layer
/// scores ([`RawScorer`] on `cfg.eos_token_ids`). Returns the finished hypotheses, best first.
pub fn beam_search<S: LogitsSource>(
    source: S,
    prompt: &[u32],
    cfg: &BeamConfig,
) -> Result<Vec<Hypothesis>> {
    let scorer = RawScorer {
        eos_token_ids: cfg.eos_token_ids.clone(),
    };
    beam_search_with(source, prompt, cfg, &scorer)
}

/// One proposal of a beam step, as [`beam_search_traced`] reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct BeamProposal {
    /// The step (1 = the first generated token).
    pub depth: usize,
    /// The hypothesis's tokens after this proposal (its parent's, then the proposed token).
    pub tokens: Vec<u32>,
    /// Cumulative logprob of `tokens`.
    pub logprob: f64,
    /// Whether the search kept it (as a live hypothesis, or as a finished one).
    pub kept: bool,
}

/// Runs beam search from `prompt` (non-empty) on `source` (an empty branch) with `scorer`.
/// Returns the finished hypotheses, best first.
pub fn beam_search_with<S: LogitsSource, B: BeamScorer>(
    source: S,
    prompt: &[u32],
    cfg: &BeamConfig,
    scorer: &B,
) -> Result<Vec<Hypothesis>> {
    search(source, prompt, cfg, scorer, None)
}

/// [`beam_search_with`] that also reports every step's proposals, in the order the search
/// ranked them (best first), each marked kept or dropped.
pub fn beam_search_traced<S: LogitsSource, B: BeamScorer>(
    source: S,
    prompt: &[u32],
    cfg: &BeamConfig,
    scorer: &B,
    trace: &mut Vec<BeamProposal>,
) -> Result<Vec<Hypothesis>> {
    search(source, prompt, cfg, scorer, Some(trace))
}

fn search<S: LogitsSource, B: BeamScorer>(
    mut source: S,
    prompt: &[u32],
    cfg: &BeamConfig,
    scorer: &B,
    mut trace: Option<&mut Vec<BeamProposal>>,
) -> Result<Vec<Hypothesis>> {
    if cfg.width == 0 {
        return Err(ModelError::new("invalid `beam_width`: must be at least 1")
            .with_kind(ModelErrorKind::Invalid));
    }
    if cfg.max_tokens == 0 {
        return Err(ModelError::new("invalid `max_tokens`: must be at least 1")
            .with_kind(ModelErrorKind::Invalid));
    }
    if !cfg.length_penalty.is_finite() {
        return Err(ModelError::new(format!(
            "invalid `length_penalty`: {} (must be finite)",
            cfg.length_penalty
        ))
        .with_kind(ModelErrorKind::Invalid));
    }
    let b = cfg.width;
    let max_tokens = scorer
        .max_tokens()
        .map_or(cfg.max_tokens, |m| m.min(cfg.max_tokens));
    if max_tokens == 0 {
        return Err(ModelError::new("invalid `max_tokens`: must be at least 1")
            .with_kind(ModelErrorKind::Invalid));
    }
    let logits = source.prefill(prompt)?;
    let mut live = vec![Live {
        tokens: Vec::new(),
        logprob: 0.0,
        source,
        logits,
        state: scorer.start()?,
    }];
    let mut finished: Vec<Hypothesis> = Vec::new();
    for step in 0..max_tokens {
        // proposals: (cum logprob, parent index, token)
        let mut props: Vec<(f64, usize, u32)> = Vec::new();
        for (pi, h) in live.iter().enumerate() {
            let ids = scorer.propose(&h.logits, &h.state, 2 * b)?;
            props.extend(ids.iter().map(|&(t, lp)| (h.logprob + lp, pi, t)));
        }
        props.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
        let mut chosen: Vec<(f64, usize, u32, B::State)> = Vec::new();
        let mut kept = vec![false; props.len()];
        for (rank, &(lp, pi, t)) in props.iter().enumerate() {
            if chosen.len() == b && rank >= b {
                break;
            }
            let mut st = live[pi].state.clone();
            match scorer.commit(&mut st, t)? {
                Some(finish) if finish != BeamFinish::Length => {
                    if rank < b {
                        kept[rank] = true;
                        let mut tokens = live[pi].tokens.clone();
                        tokens.push(t);
                        finished.push(Hypothesis {
                            score: score(lp, tokens.len(), cfg.length_penalty),
                            tokens,
                            logprob: lp,
                            finish,
                        });
                    }
                }
                // a length finish from the state (its max_tokens) ends the search below
                _ => {
                    if chosen.len() < b {
                        kept[rank] = true;
                        chosen.push((lp, pi, t, st));
                    }
                }
            }
        }
        if let Some(trace) = trace.as_deref_mut() {
            for (&(lp, pi, t), &k) in props.iter().zip(&kept) {
                let mut tokens = live[pi].tokens.clone();
                tokens.push(t);
                trace.push(BeamProposal {
                    depth: step + 1,
                    tokens,
                    logprob: lp,
                    kept: k,
                });
            }
        }
        if finished.len() >= b || chosen.is_empty() {
            live.clear();
            break;
        }
        // Children: fork the parent's branch, the last child of a parent takes it.
        let mut parents: Vec<Option<Live<S, B::State>>> = live.drain(..).map(Some).collect();
        let mut remaining = vec![0usize; parents.len()];
        for c in &chosen {
            remaining[c.1] += 1;
        }
        let mut next = Vec::with_capacity(chosen.len());
        for (lp, pi, t, state) in chosen {
            remaining[pi] -= 1;
            let (mut src, mut tokens) = if remaining[pi] == 0 {
                let p = parents[pi]
                    .take()
                    .ok_or_else(|| ModelError::new("beam: a parent was used twice"))?;
                (p.source, p.tokens)
            } else {
                let p = parents[pi]
                    .as_ref()
                    .ok_or_else(|| ModelError::new("beam: a parent was used twice"))?;
                (p.source.fork()?, p.tokens.clone())
            };
            tokens.push(t);
            let logits = if tokens.len() < max_tokens {
                src.decode_one(t)?
            } else {
                Vec::new() // finished by length; no logits needed
            };
            next.push(Live {
                tokens,
                logprob: lp,
                source: src,
                logits,
                state,
            });
        }
        live = next;
        if live.iter().all(|h| h.tokens.len() >= max_tokens) {
            break;
        }
    }
    for h in live {
        finished.push(Hypothesis {
            score: score(h.logprob, h.tokens.len(), cfg.length_penalty),
            tokens: h.tokens,
            logprob: h.logprob,
            finish: BeamFinish::Length,
        });
    }
    finished.sort_by(|x, y| {
        y.score
            .total_cmp(&x.score)
            .then(x.tokens.len().cmp(&y.tokens.len()))
            .then(x.tokens.cmp(&y.tokens))
    });
    Ok(finished)
}
