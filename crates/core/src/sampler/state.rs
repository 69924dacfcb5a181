//! A sequence's decoder state: creation, history and the sequence-constraint slots.

use super::Sampler;
use crate::error::Result;
use crate::rng::RngState;
use crate::state::{DecoderState, FinishStatus, SequenceSlot, StopState};
use crate::vocab::check_ids;

impl Sampler {
    /// A fresh decoder state for `prompt_ids` with the random stream keyed by `seed`, the
    /// sequence's seed. For a request, that is
    /// [`SamplingParams::sequence_seed`](crate::SamplingParams::sequence_seed): the seed is given
    /// once, in the request's parameters, and the compiled sampler stays seed-free so that one
    /// sampler serves every sequence of the request.
    pub fn new_state(&self, prompt_ids: &[u32], seed: u64) -> Result<DecoderState> {
        check_ids("prompt_ids", prompt_ids, self.vocab.vocab_size)?;
        let mut st = DecoderState {
            prompt_ids: prompt_ids.to_vec(),
            selected_ids: Vec::new(),
            counts_output: Default::default(),
            counts_all: Default::default(),
            sequence: self
                .processors
                .iter()
                .filter_map(|p| p.new_slot())
                .collect(),
            grammar: None,
            stop: StopState {
                scan: self.stop_strings.as_ref().map(|s| s.start()),
                ..StopState::default()
            },
            rng: RngState::new(seed),
            step: 0,
            finish: FinishStatus::Running,
        };
        for &t in prompt_ids {
            *st.counts_all.entry(t).or_insert(0) += 1;
        }
        let mut slots = std::mem::take(&mut st.sequence);
        for (pos, &t) in prompt_ids.iter().enumerate() {
            self.consume_slots(&mut slots, &st, pos, t);
        }
        st.sequence = slots;
        Ok(st)
    }

    /// Reserves room for `additional` more selected tokens in `state` (history and counts), so
    /// that the next `additional` steps allocate nothing; without it the history grows amortised.
    pub fn reserve(&self, state: &mut DecoderState, additional: usize) {
        state.selected_ids.reserve(additional);
        let distinct = additional.min(self.vocab.vocab_size);
        state.counts_output.reserve(distinct);
        state.counts_all.reserve(distinct);
    }

    /// A state that has already selected `selected_ids` (validated and committed one by one
    /// without stop checks, e.g. to reproduce a hand computation's history).
    pub fn state_with_history(
        &self,
        prompt_ids: &[u32],
        selected_ids: &[u32],
        seed: u64,
    ) -> Result<DecoderState> {
        let mut st = self.new_state(prompt_ids, seed)?;
        check_ids("selected_ids", selected_ids, self.vocab.vocab_size)?;
        for &t in selected_ids {
            self.advance(&mut st, t);
        }
        Ok(st)
    }

    pub(super) fn consume_slots(
        &self,
        slots: &mut [SequenceSlot],
        st: &DecoderState,
        pos: usize,
        token: u32,
    ) {
        // each processor that keeps a slot advances its own (slots are in processor order)
        for p in &self.processors {
            p.consume(slots, st, pos, token);
        }
    }
}
