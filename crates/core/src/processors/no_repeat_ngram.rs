//! No-repeat n-gram (HF `no_repeat_ngram_size`): forbids the token that would complete an
//! n-gram already present in prompt + output. The sequence-constraint slot indexes every
//! (n−1)-gram by a hash of its tokens → the positions where it starts; a step looks up the
//! current (n−1)-token suffix, verifies each hit token by token, and masks the token that
//! followed it. Only completing tokens are masked. Each distinct n-gram is indexed once, so a
//! step's cost is `O(n)` per distinct continuation of the suffix, not per occurrence; `n` is at
//! most [`MAX_NGRAM_SIZE`].

use serde::{Deserialize, Serialize};

use super::{check_version, v1, CompileCtx};
use crate::error::{Error, Result};
use crate::fxhash::FxHashMap;
use crate::state::{DecoderState, SequenceSlot};
use crate::support::Workspace;

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

impl NoRepeatNgram {
    pub(crate) fn compile(&self, field: &str, ctx: &mut CompileCtx<'_>) -> Result<Compiled> {
        check_version(field, self.version, VERSION)?;
        if self.ngram_size == 0 || self.ngram_size > MAX_NGRAM_SIZE {
            return Err(Error::invalid(
                format!("{field}.ngram_size"),
                format!("{} must be in 1..={MAX_NGRAM_SIZE}", self.ngram_size),
            ));
        }
        let slot = ctx.next_slot;
        ctx.next_slot += 1;
        Ok(Compiled {
            n: self.ngram_size,
            slot,
        })
    }
}

impl Compiled {
    /// Indexes the n-gram that ends at context position `pos` (just appended).
    pub(crate) fn consume(
        &self,
        index: &mut FxHashMap<u64, Vec<u32>>,
        st: &DecoderState,
        pos: usize,
    ) {
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

    pub(crate) fn apply(&self, st: &DecoderState, ws: &mut Workspace) {
        let n = self.n;
        let len = st.context_len();
        if len < n - 1 {
            return;
        }
        let index = match st.sequence.get(self.slot) {
            Some(SequenceSlot::NGram { index }) => index,
            _ => return,
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
    }
}
