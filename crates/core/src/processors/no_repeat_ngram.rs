//! No-repeat n-gram (HF `no_repeat_ngram_size`): forbids the token that would complete an
//! n-gram already present in prompt + output. The sequence-constraint slot indexes every
//! (n−1)-gram by a hash of its tokens → the positions where it starts; a step looks up the
//! current (n−1)-token suffix, verifies each hit token by token, and masks the token that
//! followed it. Only completing tokens are masked. Each distinct n-gram is indexed once, so a
//! step's cost is `O(n)` per distinct continuation of the suffix, not per occurrence; `n` is at
//! most [`MAX_NGRAM_SIZE`].

use serde::{Deserialize, Serialize};

use super::{v1, Apply, Compile, CompileCtx, StateField};
use crate::error::{Error, Result};
use crate::state::{DecoderState, SequenceSlot};
use crate::support::Workspace;
use crate::vocab::VocabInfo;

/// Implementation version.
pub const VERSION: u32 = 1;

/// The largest `ngram_size`: indexing a token and each step's look-up cost `O(n)` token
/// comparisons per distinct n-gram continuing the current suffix.
pub const MAX_NGRAM_SIZE: usize = 1024;

/// Config of the no-repeat n-gram mask.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoRepeatNgram {
    /// Processor version.
    #[serde(default = "v1")]
    pub version: u32,
    /// n (≥ 1).
    pub ngram_size: usize,
}

/// Compiled form.
#[derive(Debug, Clone)]
pub struct Compiled {
    n: usize,
    slot: usize,
}

fn hash_window(st: &DecoderState, start: usize, len: usize) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for i in start..start + len {
        h = (h.rotate_left(5) ^ st.context_at(i) as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    h
}

/// The range rule of an n-gram size (`1..=MAX_NGRAM_SIZE`); the reason when `n` breaks it.
pub(crate) fn check(n: usize) -> std::result::Result<(), String> {
    if n == 0 || n > MAX_NGRAM_SIZE {
        return Err(format!("{n} must be in 1..={MAX_NGRAM_SIZE}"));
    }
    Ok(())
}

impl Compile for NoRepeatNgram {
    const NAME: &'static str = "no_repeat_ngram";
    const VERSION: u32 = VERSION;
    type Compiled = Compiled;

    fn version(&self) -> u32 {
        self.version
    }

    fn compile(&self, field: &str, ctx: &mut CompileCtx<'_>) -> Result<Compiled> {
        check(self.ngram_size).map_err(|r| Error::invalid(format!("{field}.ngram_size"), r))?;
        let slot = ctx.take_slot();
        Ok(Compiled {
            n: self.ngram_size,
            slot,
        })
    }
}

impl Apply for Compiled {
    fn reads(&self) -> &'static [StateField] {
        &[
            StateField::PromptIds,
            StateField::SelectedIds,
            StateField::SequenceState,
        ]
    }

    fn new_slot(&self) -> Option<SequenceSlot> {
        Some(SequenceSlot::NGram {
            index: Default::default(),
        })
    }

    /// Indexes the n-gram that ends at context position `pos` (just appended).
    fn consume(&self, slots: &mut [SequenceSlot], st: &DecoderState, pos: usize, _token: u32) {
        let Some(SequenceSlot::NGram { index }) = slots.get_mut(self.slot) else {
            return;
        };
        let n = self.n;
        if pos + 1 < n {
            return;
        }
        let start = pos + 1 - n;
        let h = hash_window(st, start, n - 1);
        let bucket = index.entry(h).or_default();
        // one entry per distinct n-gram: a repeated n-gram adds nothing, so a look-up verifies
        // each distinct continuation once however often it occurred
        let same = |&s: &u32| {
            let s = s as usize;
            (0..n).all(|j| st.context_at(s + j) == st.context_at(start + j))
        };
        if !bucket.iter().any(same) {
            bucket.push(start as u32);
        }
    }

    fn apply(&self, st: &DecoderState, ws: &mut Workspace, _vocab: &VocabInfo) -> Result<()> {
        let n = self.n;
        let len = st.context_len();
        if len < n - 1 {
            return Ok(());
        }
        let index = match st.sequence.get(self.slot) {
            Some(SequenceSlot::NGram { index }) => index,
            _ => return Ok(()),
        };
        let suffix = len - (n - 1);
        let h = hash_window(st, suffix, n - 1);
        if let Some(starts) = index.get(&h) {
            for &s in starts {
                let s = s as usize;
                if (0..n - 1).all(|j| st.context_at(s + j) == st.context_at(suffix + j)) {
                    ws.mask(st.context_at(s + n - 1));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::state::SequenceSlot;
    use crate::{PipelineConfig, Sampler, StopConfig, VocabInfo};

    /// Entries in the n-gram index of a state with `history` as its prompt: what a step may
    /// have to verify (each `n - 1` comparisons) for the suffix it looks up.
    fn indexed(n: usize, history: &[u32]) -> usize {
        let cfg = serde_json::json!({"format_version": 1,
            "processors": [{"type": "no_repeat_ngram", "ngram_size": n}],
            "selector": {"type": "greedy"}});
        let cfg = PipelineConfig::from_json(&cfg.to_string()).unwrap();
        let s = Sampler::new(cfg, VocabInfo::plain(4), StopConfig::default()).unwrap();
        let st = s.state_with_history(history, &[], 0).unwrap();
        match st.sequence.first() {
            Some(SequenceSlot::NGram { index }) => index.values().map(Vec::len).sum(),
            other => panic!("{other:?}"),
        }
    }

    /// The work of a long repetitive history is bounded by counting it, not by the clock: each
    /// distinct n-gram is indexed once, however often it occurs, so a step verifies one
    /// candidate per distinct continuation (one entry per occurrence would be ~20,000 here).
    #[test]
    fn a_repeated_ngram_is_indexed_once() {
        let n = super::MAX_NGRAM_SIZE;
        assert_eq!(indexed(n, &[1; 20_000]), 1);
        let period: Vec<u32> = (0..20_000).map(|i| 1 + i % 3).collect();
        assert_eq!(indexed(n, &period), 3);
        assert_eq!(indexed(3, &period), 3);
        // distinct n-grams are all kept
        let distinct: Vec<u32> = (0..50).map(|i| i % 4).chain([0, 0, 1, 1, 2, 2]).collect();
        let mut grams: Vec<&[u32]> = distinct.windows(2).collect();
        grams.sort();
        grams.dedup();
        assert_eq!(indexed(2, &distinct), grams.len());
    }
}
