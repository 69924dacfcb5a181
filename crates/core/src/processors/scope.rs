//! Which tokens a history penalty counts: prompt + output, output only, or the last N tokens.

use serde::{Deserialize, Serialize};

use super::StateField;
use crate::state::DecoderState;
use crate::support::Workspace;

/// The counting range of a penalty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PenaltyScope {
    /// Prompt and output tokens (HF and vLLM `repetition_penalty`).
    PromptAndOutput,
    /// Output tokens only (OpenAI and vLLM `presence_penalty` / `frequency_penalty`).
    Output,
    /// The last `n` tokens of prompt + output (llama.cpp `penalty_last_n`).
    LastN {
        /// Window length (≥ 1).
        n: usize,
    },
}

impl PenaltyScope {
    pub(crate) fn reads(&self) -> &'static [StateField] {
        match self {
            PenaltyScope::PromptAndOutput | PenaltyScope::Output => &[StateField::TokenCounts],
            PenaltyScope::LastN { .. } => &[StateField::PromptIds, StateField::SelectedIds],
        }
    }

    pub(crate) fn validate(&self, field: &str) -> crate::Result<()> {
        if let PenaltyScope::LastN { n } = self {
            if *n == 0 {
                return Err(crate::Error::invalid(
                    format!("{field}.scope.n"),
                    "must be at least 1 (omit the penalty to disable it)",
                ));
            }
        }
        Ok(())
    }

    /// Calls `f(id, count)` once per distinct token in scope (count ≥ 1), skipping special
    /// tokens when `exclude` says so. For `LastN` the window is gathered into workspace scratch.
    pub(crate) fn for_each_count(
        &self,
        st: &DecoderState,
        ws: &mut Workspace,
        mut f: impl FnMut(&mut Workspace, u32, u32),
    ) {
        match self {
            PenaltyScope::PromptAndOutput => {
                for (&id, &c) in st.counts_all.iter() {
                    f(ws, id, c);
                }
            }
            PenaltyScope::Output => {
                for (&id, &c) in st.counts_output.iter() {
                    f(ws, id, c);
                }
            }
            PenaltyScope::LastN { n } => {
                let len = st.context_len();
                let start = len.saturating_sub(*n);
                let mut ids = std::mem::take(&mut ws.ids_scratch);
                ids.clear();
                for i in start..len {
                    ids.push(st.context_at(i));
                }
                ids.sort_unstable();
                let mut i = 0;
                while i < ids.len() {
                    let id = ids[i];
                    let mut j = i;
                    while j < ids.len() && ids[j] == id {
                        j += 1;
                    }
                    f(ws, id, (j - i) as u32);
                    i = j;
                }
                ws.ids_scratch = ids;
            }
        }
    }

    /// Gathers the `LastN` window, sorted, into `out` (so candidates can be counted by binary
    /// search instead of rescanning the window once per candidate).
    pub(crate) fn sorted_window(&self, st: &DecoderState, out: &mut Vec<u32>) {
        out.clear();
        if let PenaltyScope::LastN { n } = self {
            let len = st.context_len();
            for i in len.saturating_sub(*n)..len {
                out.push(st.context_at(i));
            }
            out.sort_unstable();
        }
    }

    /// The count of `id` in scope; for `LastN`, `window` must come from
    /// [`sorted_window`](Self::sorted_window).
    pub(crate) fn count_in(&self, st: &DecoderState, window: &[u32], id: u32) -> u32 {
        match self {
            PenaltyScope::LastN { .. } => {
                let lo = window.partition_point(|&x| x < id);
                let hi = window.partition_point(|&x| x <= id);
                (hi - lo) as u32
            }
            _ => self.count(st, id),
        }
    }

    /// The count of `id` in scope (used for candidates when the support is sparse).
    pub(crate) fn count(&self, st: &DecoderState, id: u32) -> u32 {
        match self {
            PenaltyScope::PromptAndOutput => st.total_count(id),
            PenaltyScope::Output => st.output_count(id),
            PenaltyScope::LastN { n } => {
                let len = st.context_len();
                let start = len.saturating_sub(*n);
                (start..len).filter(|&i| st.context_at(i) == id).count() as u32
            }
        }
    }
}
