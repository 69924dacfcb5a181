//! Records and explanations of a step: the three probability layers, candidates, ledgers.

use super::step::check_draw;
use super::{Sampler, StepResult};
use crate::error::{Error, Result};
use crate::math::{self, exp_f32, ln_f64};
use crate::record::{
    logits_digest, CandidateRecord, Layer, Logprob, ProcessorRef, RngRecord, StageSize, StepRecord,
};
use crate::rng::RNG_ALGORITHM;
use crate::select::{Draw, Selected};
use crate::state::DecoderState;
use crate::support::{canonical, Cand, Workspace};

/// One row of an explanation ledger (002's table), for every token of the vocabulary.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TokenRow {
    /// Token id.
    pub id: u32,
    /// Raw logit.
    pub raw_logit: f32,
    /// Raw-layer logprob.
    #[serde(with = "crate::record::f64_or_string")]
    pub raw_logprob: f64,
    /// Not hard-masked by any mask (processed logit finite).
    pub allowed: bool,
    /// Processed-layer probability (after masks, penalties, temperature; before truncation).
    pub initial_prob: f64,
    /// In the final support.
    pub kept: bool,
    /// Processed logit (`-inf` when masked).
    #[serde(with = "crate::record::f64_or_string")]
    pub processed_logit: f64,
    /// Processed-layer logprob.
    #[serde(with = "crate::record::f64_or_string")]
    pub processed_logprob: f64,
    /// Selection probability (0 outside the support).
    pub selection_prob: f64,
    /// Selection-layer logprob.
    #[serde(with = "crate::record::f64_or_string")]
    pub selection_logprob: f64,
    /// Whether this token was selected.
    pub selected: bool,
}

/// A full explanation of one step: the record plus a ledger row per token.
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    /// The step record.
    pub record: StepRecord,
    /// One row per vocabulary token, by id.
    pub tokens: Vec<TokenRow>,
}

impl Sampler {
    /// One full step that also returns its [`StepRecord`] with up to `max_candidates` final
    /// candidates.
    pub fn step_recorded(
        &self,
        raw: &[f32],
        state: &mut DecoderState,
        ws: &mut Workspace,
        draw: Draw,
        max_candidates: usize,
    ) -> Result<(StepResult, StepRecord)> {
        let (sel, mut rec) = self.select_recorded(raw, state, ws, draw, max_candidates)?;
        let finish = self.commit(state, sel.token)?;
        rec.state_after = state.summary();
        Ok((
            StepResult {
                token: sel.token,
                finish,
                u: sel.u,
            },
            rec,
        ))
    }

    /// Selects and records without committing (`state_after` equals `state_before`).
    pub fn select_recorded(
        &self,
        raw: &[f32],
        state: &DecoderState,
        ws: &mut Workspace,
        draw: Draw,
        max_candidates: usize,
    ) -> Result<(Selected, StepRecord)> {
        check_draw(draw)?;
        self.process(raw, state, ws, true)?;
        let sel = self.select_processed(state, ws, draw)?;
        let layers = Layers::compute(raw, ws);
        let support = support_canonical(ws);
        let candidates = support
            .iter()
            .take(max_candidates)
            .map(|c| layers.candidate(raw, c.id, c.z))
            .collect();
        let before = state.summary();
        let rec = StepRecord {
            step: state.step,
            raw_logits_digest: logits_digest(raw),
            pipeline_hash: self.hash.clone(),
            processors: self
                .config
                .processors
                .iter()
                .map(|p| ProcessorRef {
                    kind: p.type_name().to_string(),
                    version: p.version(),
                })
                .collect(),
            selector: self.selector,
            stages: ws
                .stages
                .iter()
                .map(|(s, n)| StageSize {
                    stage: s.to_string(),
                    support_size: *n,
                })
                .collect(),
            support_size: support.len(),
            candidates,
            rng: RngRecord {
                algorithm: RNG_ALGORITHM.to_string(),
                seed: state.rng.seed,
                counter: state.step,
                u: sel.u,
                fixed_u: matches!(draw, Draw::FixedU(_)),
            },
            selected: sel.token,
            state_before: before.clone(),
            state_after: before,
            draft: sel.draft.map(|d| crate::record::DraftRecord {
                token: d.token,
                accepted: d.accepted,
                rule: crate::record::DraftRule::Rejection,
                accept_u: d.accept_u,
                residual_u: d.residual_u,
            }),
            raw_logits: None,
        };
        Ok((sel, rec))
    }

    /// A ledger row for every token plus the step record (for small teaching vocabularies and
    /// `nextok explain`). Does not change `state`.
    pub fn explain(&self, raw: &[f32], state: &DecoderState, draw: Draw) -> Result<Explanation> {
        let mut ws = self.new_workspace();
        let (sel, record) = self.select_recorded(raw, state, &mut ws, draw, usize::MAX)?;
        let layers = Layers::compute(raw, &mut ws);
        let support = support_canonical(&ws);
        let mut in_support = vec![None; self.vocab.vocab_size];
        for c in &support {
            in_support[c.id as usize] = Some(c.z);
        }
        let tokens = (0..self.vocab.vocab_size)
            .map(|i| {
                let id = i as u32;
                let pz = ws.buf[i];
                let processed_logprob = layers.processed(pz);
                let (selection_prob, selection_logprob) = match in_support[i] {
                    Some(z) => layers.selection(z),
                    None => (0.0, f64::NEG_INFINITY),
                };
                TokenRow {
                    id,
                    raw_logit: raw[i],
                    raw_logprob: layers.raw(raw[i]),
                    allowed: pz > f32::NEG_INFINITY,
                    initial_prob: if pz > f32::NEG_INFINITY {
                        processed_logprob.exp()
                    } else {
                        0.0
                    },
                    kept: in_support[i].is_some(),
                    processed_logit: pz as f64,
                    processed_logprob,
                    selection_prob,
                    selection_logprob,
                    selected: id == sel.token,
                }
            })
            .collect();
        Ok(Explanation { record, tokens })
    }

    /// The logprob of `token` in `layer` for the step currently held in `ws` (after
    /// [`select_recorded`](Self::select_recorded) or [`process`](Self::process) with `exact`).
    pub fn logprob(
        &self,
        raw: &[f32],
        ws: &mut Workspace,
        token: u32,
        layer: Layer,
    ) -> Result<Logprob> {
        if token as usize >= self.vocab.vocab_size {
            return Err(Error::out_of_range(
                "token",
                token as u64,
                self.vocab.vocab_size,
            ));
        }
        let layers = Layers::compute(raw, ws);
        let value = match layer {
            Layer::Raw => layers.raw(raw[token as usize]),
            Layer::Processed => layers.processed(ws.buf[token as usize]),
            Layer::Selection => {
                let z = if ws.dense {
                    Some(ws.buf[token as usize]).filter(|z| *z > f32::NEG_INFINITY)
                } else {
                    ws.cands.iter().find(|c| c.id == token).map(|c| c.z)
                };
                z.map(|z| layers.selection(z).1)
                    .unwrap_or(f64::NEG_INFINITY)
            }
        };
        Ok(Logprob { layer, value })
    }
}

/// The support in canonical order (allocates; record path only).
fn support_canonical(ws: &Workspace) -> Vec<Cand> {
    let mut v: Vec<Cand> = if ws.dense {
        ws.buf
            .iter()
            .enumerate()
            .filter(|(_, z)| **z > f32::NEG_INFINITY)
            .map(|(i, &z)| Cand { id: i as u32, z })
            .collect()
    } else {
        ws.cands.clone()
    };
    v.sort_unstable_by(canonical);
    v
}

/// Normalisers of the three layers for the step in a workspace.
struct Layers {
    raw_max: f32,
    raw_ln: f64,
    proc_max: f32,
    proc_ln: f64,
    sel_max: f32,
    sel_sum: f64,
    sel_ln: f64,
}

impl Layers {
    fn compute(raw: &[f32], ws: &mut Workspace) -> Layers {
        let raw_max = math::max_f32(raw);
        let raw_ln = ln_f64(math::exp_sum(raw, raw_max));
        let proc_max = math::max_f32(&ws.buf);
        let proc_ln = ln_f64(math::exp_sum(&ws.buf, proc_max));
        let (sel_max, sel_sum) = ws.normalize();
        Layers {
            raw_max,
            raw_ln,
            proc_max,
            proc_ln,
            sel_max,
            sel_sum,
            sel_ln: ln_f64(sel_sum),
        }
    }
    fn raw(&self, x: f32) -> f64 {
        if x == f32::NEG_INFINITY {
            f64::NEG_INFINITY
        } else {
            (x - self.raw_max) as f64 - self.raw_ln
        }
    }
    fn processed(&self, z: f32) -> f64 {
        if z == f32::NEG_INFINITY {
            f64::NEG_INFINITY
        } else {
            (z - self.proc_max) as f64 - self.proc_ln
        }
    }
    fn selection(&self, z: f32) -> (f64, f64) {
        let p = exp_f32(z - self.sel_max) as f64 / self.sel_sum;
        (p, (z - self.sel_max) as f64 - self.sel_ln)
    }
    fn candidate(&self, raw: &[f32], id: u32, z: f32) -> CandidateRecord {
        let (p, lp) = self.selection(z);
        CandidateRecord {
            id,
            raw_logit: raw[id as usize],
            processed_logit: z,
            raw_logprob: self.raw(raw[id as usize]),
            processed_logprob: self.processed(z),
            selection_logprob: lp,
            selection_prob: p,
        }
    }
}
