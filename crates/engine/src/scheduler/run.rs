//! Running a pass: [`Scheduler::run`] builds the batch a [`Plan`] describes, runs the forward
//! pass (the constraint masks of decoding sequences computed alongside), and takes its result
//! back: prompts advance, completed prompts fork their request's other sequences and enter the
//! prefix cache, and the [`ModelOutput`] says which logits rows are whose.

use std::sync::Arc;

use nextok_core::{DecoderState, Sampler};
use nextok_model::{BatchSeq, LogitRows, ModelError, Scratch};
use rayon::prelude::*;

use super::plan::Plan;
use super::seq::{Phase, Seq};
use super::Scheduler;

/// The forward pass's buffers, kept between iterations so that running a pass allocates
/// nothing once they have grown (the batch's borrowed rows reuse their allocation through
/// [`recycle`]).
#[derive(Default)]
pub(super) struct Runner {
    /// The model's scratch.
    scratch: Scratch,
    /// The batch's allocation (empty between passes).
    batch: Vec<BatchSeq<'static>>,
    /// The allocation of the masks to prepare alongside the pass (empty between passes).
    preps: Vec<(&'static Sampler, &'static DecoderState)>,
}

/// What a forward pass produced: its logits, and which rows are each running sequence's.
///
/// One output's vectors are reused by the next pass (see [`Scheduler::spare_out`]).
#[derive(Default)]
pub(super) struct ModelOutput {
    /// The logits rows, sequence after sequence in batch order, `vocab_size` values each.
    pub(super) logits: Vec<f32>,
    /// The logits rows of each batch entry, in batch order.
    counts: Vec<usize>,
    /// For every running sequence (indexed like [`Scheduler::running`]), its logits as (first
    /// row, rows), `None` when it has none: a sequence forked in this pass shares its first
    /// sequence's row.
    pub(super) rows: Vec<Option<(usize, usize)>>,
    /// The sequences whose prompt this pass completed.
    completed: Vec<usize>,
}

/// `v`'s allocation as an empty vector of another element type with the same size and
/// alignment (the standard library collects such a map in place; otherwise this allocates,
/// which changes nothing else).
fn recycle<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
}

impl Scheduler {
    /// Runs the pass `plan` describes and takes its result back ([`Scheduler::advance`]). On
    /// an error nothing was computed (no sequence's cache changed).
    pub(super) fn run(&mut self, plan: &Plan) -> Result<ModelOutput, ModelError> {
        let mut out = std::mem::take(&mut self.spare_out);
        if let Err(e) = self.forward(plan, &mut out) {
            self.spare_out = out;
            return Err(e);
        }
        self.advance(plan, &mut out);
        Ok(out)
    }

    /// One forward pass over the planned rows, into `out.logits` (and `out.counts`), the
    /// masks of decoding rows computed alongside.
    fn forward(&mut self, plan: &Plan, out: &mut ModelOutput) -> Result<(), ModelError> {
        let runner = &mut self.runner;
        let mut batch: Vec<BatchSeq<'_>> = recycle(std::mem::take(&mut runner.batch));
        let mut preps: Vec<(&Sampler, &DecoderState)> = recycle(std::mem::take(&mut runner.preps));
        for (i, s) in self.running.iter_mut().enumerate() {
            let n = plan.rows[i];
            if n == 0 {
                continue;
            }
            let Seq {
                req,
                kv,
                phase,
                feed,
                state,
                replay,
                ..
            } = s;
            let (tokens, logits): (&[u32], LogitRows) = match phase {
                Phase::Decode => {
                    if state.grammar().is_some_and(|g| g.is_active()) {
                        preps.push((&req.prepared.sampler, &*state));
                    }
                    let rows = if feed.len() > 1 {
                        LogitRows::All
                    } else {
                        LogitRows::Last
                    };
                    (&feed[..], rows)
                }
                Phase::Prefill { done } => {
                    let ids = &req.prepared.info.prompt_ids;
                    let end = *done + n;
                    let rows = if end == ids.len() {
                        LogitRows::Last
                    } else {
                        LogitRows::None
                    };
                    (&ids[*done..end], rows)
                }
                // the pending token was selected before the preemption: no logits
                Phase::Recompute { done } => (&replay[*done..*done + n], LogitRows::None),
                // (never planned: it has no rows)
                Phase::AwaitFork => continue,
            };
            batch.push(BatchSeq { kv, tokens, logits });
        }
        debug_assert_eq!(batch.len(), plan.seqs.len());
        let weights = self.inner.shared.model.weights.clone();
        let (scratch, logits) = (&mut runner.scratch, &mut out.logits);
        let (fwd, prep) = rayon::join(
            || weights.forward_batch(&mut batch, scratch, logits),
            || {
                preps
                    .par_iter()
                    .map(|(sampler, state)| sampler.prepare(state))
                    .find_any(|r| r.is_err())
            },
        );
        let counts = &mut out.counts;
        counts.clear();
        counts.extend(batch.iter().map(|b| match b.logits {
            LogitRows::None => 0,
            LogitRows::Last => 1,
            LogitRows::All => b.tokens.len(),
        }));
        runner.batch = recycle(batch);
        runner.preps = recycle(preps);
        // a failed mask shows again in its step, where it ends that request alone
        let _ = prep;
        fwd
    }

    /// Takes the pass's result back: prompts (and recomputations) advance by their rows, a
    /// completed prompt forks its request's waiting sequences (they share its cache and its
    /// logits row) and enters the prefix cache; `out.rows` maps each sequence to its logits.
    fn advance(&mut self, plan: &Plan, out: &mut ModelOutput) {
        // (first row, rows) of each sequence's logits
        let row_of = &mut out.rows;
        row_of.clear();
        row_of.resize(self.running.len(), None);
        let mut r = 0;
        let completed = &mut out.completed;
        completed.clear();
        for (k, &i) in plan.seqs.iter().enumerate() {
            let s = &mut self.running[i];
            match &mut s.phase {
                Phase::Prefill { done } => {
                    *done += plan.rows[i];
                    if *done == s.req.prepared.info.prompt_ids.len() {
                        s.phase = Phase::Decode;
                        completed.push(i);
                    }
                }
                Phase::Recompute { done } => {
                    *done += plan.rows[i];
                    if *done == s.replay.len() {
                        s.phase = Phase::Decode;
                        s.replay = Vec::new();
                    }
                }
                _ => {}
            }
            let n = out.counts[k];
            if n > 0 {
                row_of[i] = Some((r, n));
                r += n;
            }
        }
        let max = self.inner.config.prefix_cache_entries;
        for &i in completed.iter() {
            let kv = self.running[i].kv.clone();
            let req = self.running[i].req.clone();
            let row = row_of[i];
            for (j, s) in self.running.iter_mut().enumerate() {
                if Arc::ptr_eq(&s.req, &req) && matches!(s.phase, Phase::AwaitFork) {
                    s.kv = kv.clone();
                    s.phase = Phase::Decode;
                    row_of[j] = row;
                }
            }
            let ids = Arc::new(req.prepared.info.prompt_ids.clone());
            self.prefix.remember(ids, kv, max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pass's borrowed rows keep one allocation from iteration to iteration.
    #[test]
    fn recycle_keeps_the_allocation() {
        let a = 7u32;
        let mut v: Vec<(&u32, &u32)> = Vec::with_capacity(16);
        v.push((&a, &a));
        let (ptr, cap) = (v.as_ptr() as usize, v.capacity());
        let w: Vec<(&'static Sampler, &'static DecoderState)> = recycle(v);
        assert!(w.is_empty());
        assert_eq!((w.as_ptr() as usize, w.capacity()), (ptr, cap));
    }
}
