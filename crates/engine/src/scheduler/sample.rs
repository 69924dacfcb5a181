//! Sampling a pass's logits: [`Scheduler::sample`] steps every sequence that has logits rows,
//! groups of sequences in parallel, each sequence with its own sampler, state and random
//! stream, each group on one of the scheduler's workspaces; a
//! speculating sequence steps through its rows while its selections agree with its draft.
//! The steps wait in each sequence's `outs` (or `err`) for [`Scheduler::emit`].

use nextok_core::{Draw, Layer, Workspace};
use rayon::prelude::*;

use super::run::ModelOutput;
use super::seq::{Seq, StepOut};
use super::Scheduler;
use crate::error::EngineError;
use crate::request::TokenLogprobs;
use crate::speculative::SpecOptions;

impl Scheduler {
    /// Samples every sequence on its rows of `out` (see [`ModelOutput::rows`]), in parallel;
    /// a speculating sequence steps through its rows while its selections agree with the
    /// draft. Clears every sequence's steps of the previous iteration first.
    pub(super) fn sample(&mut self, out: &ModelOutput) {
        let vocab = self.inner.shared.model.weights.config.vocab_size;
        let ctx = self.inner.shared.model.weights.config.context_length;
        let logits = &out.logits;
        // the sequences in as many groups as threads sample at once, each group stepping its
        // sequences one after another on one workspace (a workspace carries nothing from one
        // step to the next: the same bits whichever sequence used it before)
        let n = self.running.len();
        let groups = rayon::current_num_threads().clamp(1, n.max(1));
        let per = n.div_ceil(groups).max(1);
        self.running
            .par_chunks_mut(per)
            .zip(out.rows.par_chunks(per))
            .zip(self.workspaces.lend(groups).par_iter_mut())
            .for_each(|((seqs, rows), ws)| {
                for (s, row) in seqs.iter_mut().zip(rows) {
                    s.outs.clear();
                    s.err = None;
                    s.drafted = 0;
                    s.accepted = 0;
                    if let Some((r0, count)) = *row {
                        s.step_rows(ws, &logits[r0 * vocab..(r0 + count) * vocab], count, ctx);
                    }
                }
            });
    }
}

impl Seq {
    /// Steps through `count` rows of logits (`count > 1`: the pending token and a draft were
    /// fed): each row's selection is an output; the next row is used only while the selection
    /// equals the drafted token that row was computed after. Then the cache keeps the
    /// positions of the accepted tokens and the last selection becomes the pending token.
    fn step_rows(&mut self, ws: &mut Workspace, rows: &[f32], count: usize, ctx: usize) {
        let vocab = rows.len() / count.max(1);
        let mut accepted = 0;
        let mut last = None;
        for j in 0..count {
            // the position the token selected now would be fed at
            let fed_at = self.kv.len() - (count - 1 - j);
            // the drafted token this row verifies
            let draft = if j + 1 < count {
                self.feed.get(j + 1).copied()
            } else {
                None
            };
            match self.sample(ws, &rows[j * vocab..(j + 1) * vocab], fed_at, ctx, draft) {
                Err(e) => {
                    self.err = Some(e);
                    return;
                }
                Ok(o) => {
                    let (token, finished) = (o.token, o.finish.is_some());
                    self.outs.push(o);
                    if let Some(sp) = &mut self.spec {
                        sp.history.push(token);
                    }
                    last = Some(token);
                    if finished {
                        break;
                    }
                    if j + 1 < count && self.feed.get(j + 1) == Some(&token) {
                        accepted += 1;
                        continue;
                    }
                    break;
                }
            }
        }
        if count > 1 {
            self.drafted = count - 1;
            self.accepted = accepted;
            if let Some(sp) = &mut self.spec {
                sp.adapt.observe(count - 1, accepted);
            }
            let keep = self.kv.len() - (count - 1 - accepted);
            if let Err(e) = self.kv.truncate(keep) {
                self.err = Some(EngineError::model(e));
                return;
            }
        }
        if let Some(t) = last {
            self.feed.clear();
            self.feed.push(t);
        }
    }

    /// One step of this sequence on its logits row; the selected token would be fed at
    /// position `fed_at`; `draft` is the drafted token the row verifies.
    fn sample(
        &mut self,
        ws: &mut Workspace,
        row: &[f32],
        fed_at: usize,
        ctx: usize,
        draft: Option<u32>,
    ) -> std::result::Result<StepOut, EngineError> {
        let p = &self.req.prepared;
        let sampler = &p.sampler;
        let spec = self
            .spec
            .as_ref()
            .map_or_else(SpecOptions::default, |s| s.options);
        let draw = spec.draw(draft);
        let ledger = match p.ledger_step {
            Some(k) if k == self.state.step() => Some(Box::new(
                sampler
                    .explain(row, &self.state, Draw::Stream)
                    .map_err(EngineError::core)?,
            )),
            _ => None,
        };
        let want_record = p.records.is_some() || p.logprobs.is_some();
        let (res, record) = if want_record {
            let cands = p.records.unwrap_or(0).max(p.logprobs.map_or(0, |l| l.top));
            let (res, mut rec) = sampler
                .step_recorded(row, &mut self.state, ws, draw, cands)
                .map_err(EngineError::core)?;
            spec.mark(&mut rec, draft);
            if p.trace_logits {
                rec.raw_logits = Some(nextok_core::PackedLogits::pack(row));
            }
            (res, Some(rec))
        } else {
            (
                sampler
                    .step_draw(row, &mut self.state, ws, draw)
                    .map_err(EngineError::core)?,
                None,
            )
        };
        let logprobs = match (&p.logprobs, &record) {
            (Some(l), Some(rec)) => {
                let sel = sampler
                    .logprob(row, ws, rec.selected, l.layer)
                    .map_err(EngineError::core)?;
                let val = |c: &nextok_core::record::CandidateRecord| match l.layer {
                    Layer::Raw => c.raw_logprob,
                    Layer::Processed => c.processed_logprob,
                    Layer::Selection => c.selection_logprob,
                };
                Some(TokenLogprobs {
                    layer: l.layer,
                    selected: sel.value,
                    top: rec
                        .candidates
                        .iter()
                        .take(l.top)
                        .map(|c| (c.id, val(c)))
                        .collect(),
                })
            }
            _ => None,
        };
        let text = self.stream.push(
            sampler.visible_bytes(res.token),
            self.state.stop_state().hit.as_ref(),
        );
        let ctx_full = fed_at >= ctx;
        let finish = match res.finish {
            Some(r) => Some(Some(r)),
            None if ctx_full => Some(None),
            None => None,
        };
        Ok(StepOut {
            token: res.token,
            text,
            finish,
            logprobs,
            record: if p.records.is_some() {
                record.map(Box::new)
            } else {
                None
            },
            ledger,
        })
    }
}
