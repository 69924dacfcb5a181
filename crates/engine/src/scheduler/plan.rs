//! Planning a pass: [`Scheduler::plan`] makes room in the KV budget (evicting prefix-cache
//! entries, holding prompt chunks back, preempting) and decides the rows of the next forward
//! pass — one for every decoding sequence and its draft, then prompt chunks — as a [`Plan`].

use super::seq::Phase;
use super::Scheduler;
use crate::speculative::draft_next;

/// The next forward pass, decided before the model runs: which sequences take part and how
/// many rows each feeds. Admission, the room in the KV budget and preemption are already
/// applied to the running sequences, and a speculating sequence's draft is in its `feed`.
///
/// One plan's vectors are reused by the next (see [`Scheduler::spare_plan`]).
#[derive(Default)]
pub(super) struct Plan {
    /// The rows each running sequence feeds, indexed like [`Scheduler::running`] (0: it sits
    /// this pass out): its pending token and draft when it decodes, a chunk of its prompt (or
    /// of what it recomputes) otherwise.
    pub(super) rows: Vec<usize>,
    /// The sequences in the pass (those with rows), in batch order, as indices into
    /// [`Scheduler::running`].
    pub(super) seqs: Vec<usize>,
    /// The rows of decoding sequences (their pending tokens and drafts), which produce logits.
    pub(super) logits_rows: usize,
}

impl Scheduler {
    /// Makes room for the next pass ([`Scheduler::make_room`]) and plans it: decode rows
    /// first, then drafts of speculating sequences in the budget decode rows leave, then prompt
    /// chunks — a bounded share while sequences decode, the whole `max_batch_tokens` otherwise.
    /// `None` when nothing runs.
    pub(super) fn plan(&mut self) -> Option<Plan> {
        let prefill_rows = self.make_room();
        if self.running.is_empty() {
            return None;
        }
        let budget = self.inner.config.max_batch_tokens;
        let mut plan = std::mem::take(&mut self.spare_plan);
        let rows = &mut plan.rows;
        rows.clear();
        rows.resize(self.running.len(), 0);
        // decode rows first
        let mut used = 0;
        for (i, s) in self.running.iter().enumerate() {
            if matches!(s.phase, Phase::Decode) {
                rows[i] = 1;
                used += 1;
            }
        }
        // drafts of speculating sequences, in the budget decode rows leave
        let model = &*self.inner.shared.model;
        let ctx = model.weights.config.context_length;
        for (i, s) in self.running.iter_mut().enumerate() {
            if !matches!(s.phase, Phase::Decode) {
                continue;
            }
            s.feed.truncate(1);
            let Some(sp) = &mut s.spec else {
                continue;
            };
            let room = ctx.saturating_sub(s.kv.len() + 2);
            // rows past the output limit would never be verified
            let left = (s.req.prepared.info.max_tokens as usize).saturating_sub(s.generated + 1);
            let k = sp
                .adapt
                .next_len()
                .min(room)
                .min(left)
                .min(budget.saturating_sub(used));
            draft_next(
                &mut *sp.drafter,
                &mut sp.history,
                sp.options.constraint_source(s.state.grammar(), model),
                k,
                &mut sp.scratch,
                &mut sp.draft,
            );
            s.feed.extend_from_slice(&sp.draft);
            rows[i] += sp.draft.len();
            used += sp.draft.len();
        }
        // prompt chunks: a bounded share while sequences decode, the whole budget otherwise
        plan.logits_rows = used;
        let mut prefill = self.prefill_share(used).min(prefill_rows);
        for (i, s) in self.running.iter().enumerate() {
            let Some(left) = s.rows_to_cache() else {
                continue;
            };
            let take = left.min(prefill);
            prefill -= take;
            rows[i] = take;
        }
        // the batch: every sequence with rows (a sequence waiting to fork has none), in order
        plan.seqs.clear();
        plan.seqs.extend(
            plan.rows
                .iter()
                .enumerate()
                .filter(|&(_, &r)| r > 0)
                .map(|(i, _)| i),
        );
        Some(plan)
    }
}
