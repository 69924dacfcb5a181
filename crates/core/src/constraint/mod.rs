//! The interface between the decoding core and a constraint engine (000 §3.4).
//!
//! A constraint engine is compiled once per request shape (immutable, shareable across
//! requests and threads) and gives each sequence a [`ConstraintState`]. At each step the state
//! fills the allowed-token bitset `A(q_t)`: the tokens whose bytes keep the output a prefix of
//! some legal output; after selection it consumes the token (`q_{t+1} = δ(q_t, bytes(y_t))`).
//! The core never looks inside: it only asks for the mask, commits tokens, reads the status,
//! forks for beams, rolls back for speculative decoding, and records the state's digest.
//!
//! What a request asks the output to match is plain data, [`spec::ConstraintSpec`]: the one
//! slot a request has for it is [`SamplingParams::constraint`](crate::SamplingParams), and the
//! constraint engine compiles it.

pub mod spec;

use std::fmt::Debug;

use serde::{Deserialize, Serialize};

use crate::error::Result;

/// Where a constraint state stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConstraintStatus {
    /// More bytes are needed before the output is legal.
    Running,
    /// The output so far is a complete legal output, and it may also continue.
    Accepted,
    /// The output is complete and nothing may follow (only EOS).
    OnlyEnd,
    /// No continuation is legal (should not happen when masks are respected).
    Dead,
}

/// A bitset over token ids: bit `i % 64` of word `i / 64` is set when token `i` is allowed.
pub type TokenBitset = [u64];

/// The number of `u64` words a bitset over `vocab_size` tokens needs.
pub fn bitset_words(vocab_size: usize) -> usize {
    vocab_size.div_ceil(64)
}

/// Per-sequence constraint state.
pub trait ConstraintState: Send + Debug {
    /// Fills `allowed` (cleared by the caller) with the tokens allowed next, EOS included only
    /// where the constraint accepts.
    fn fill_mask(&mut self, allowed: &mut TokenBitset) -> Result<()>;
    /// Consumes the selected token (its bytes).
    fn commit(&mut self, token: u32) -> Result<()>;
    /// Accepted / only-end / dead / running.
    fn status(&self) -> ConstraintStatus;
    /// An independent copy (beams, `n > 1`).
    fn fork(&self) -> Box<dyn ConstraintState>;
    /// Undoes the last `k` committed tokens (speculative decoding).
    fn rollback(&mut self, k: usize) -> Result<()>;
    /// Bytes that are forced next, whatever the model says (fast-forward).
    fn forced_bytes(&mut self) -> Vec<u8>;
    /// A short digest of the state for step records.
    fn digest(&self) -> String;
    /// How many of `tokens`, in order, the constraint takes from this state, with the bytes
    /// it forces after those in `forced` (cleared first). The state is left as it was
    /// (speculative drafting: where a guess leaves the constraint, and what it demands
    /// there). The default runs a fork.
    fn probe(&mut self, tokens: &[u32], forced: &mut Vec<u8>) -> Result<usize> {
        let mut f = self.fork();
        let mut n = 0;
        for &t in tokens {
            if f.commit(t).is_err() {
                break;
            }
            n += 1;
        }
        forced.clear();
        forced.extend_from_slice(&f.forced_bytes());
        Ok(n)
    }
}
