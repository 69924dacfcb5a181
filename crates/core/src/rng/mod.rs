//! Per-request counter-based random streams.
//!
//! A request's randomness is a pure function of `(seed, step, purpose, draw index)`:
//! the Philox4x32-10 key is the 64-bit seed (low word first) and the 128-bit counter is
//! `[step_lo, step_hi, purpose, draw]`. Nothing is shared between requests, so a request's draws
//! never depend on other requests, on batch order or on thread count, and the whole generator
//! state is the small value [`RngState`] (algorithm, seed, next step) that can be saved and
//! restored.
//!
//! Draws per step are fixed:
//! * categorical selection: exactly one `u` per step, purpose [`Purpose::Select`], draw 0;
//! * Gumbel-max selection: one draw per candidate, purpose [`Purpose::Gumbel`], draw = token id,
//!   so a token's noise does not depend on the order or size of the candidate list;
//! * greedy selection: none.
//!
//! `u ∈ [0, 1)` is made from the first two output words as
//! `((w0 << 32 | w1) >> 11) * 2^-53` — 53 random bits, exactly representable, never `1.0`.

pub mod philox;

use serde::{Deserialize, Serialize};

/// What a draw is for; part of the Philox counter so different uses never share numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Purpose {
    /// The single `u` of inverse-CDF categorical selection.
    Select = 0,
    /// Per-token exponential/Gumbel noise of Gumbel-max selection.
    Gumbel = 1,
    /// Reserved for speculative-decoding acceptance tests.
    Accept = 2,
}

/// The generator algorithm name recorded in traces.
pub const RNG_ALGORITHM: &str = "philox4x32-10";

/// The complete, saveable state of one request's random stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RngState {
    /// Algorithm name; always [`RNG_ALGORITHM`].
    pub algorithm: RngAlgorithm,
    /// The request seed (the Philox key).
    pub seed: u64,
    /// The step whose draws come next (the counter's step field).
    pub counter: u64,
}

/// Supported counter-based generators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RngAlgorithm {
    /// Philox4x32 with 10 rounds (Random123).
    #[serde(rename = "philox4x32-10")]
    Philox4x32_10,
}

impl RngState {
    /// A fresh stream for `seed`, positioned at step 0.
    pub fn new(seed: u64) -> Self {
        RngState {
            algorithm: RngAlgorithm::Philox4x32_10,
            seed,
            counter: 0,
        }
    }

    /// The Philox key for this stream.
    #[inline]
    pub fn key(&self) -> [u32; 2] {
        [self.seed as u32, (self.seed >> 32) as u32]
    }

    /// The raw 128-bit block for `(step, purpose, draw)`.
    #[inline]
    pub fn block(&self, step: u64, purpose: Purpose, draw: u32) -> [u32; 4] {
        philox::philox4x32_10(
            [step as u32, (step >> 32) as u32, purpose as u32, draw],
            self.key(),
        )
    }

    /// `u ∈ [0, 1)` for `(step, purpose, draw)`.
    #[inline]
    pub fn uniform(&self, step: u64, purpose: Purpose, draw: u32) -> f64 {
        let b = self.block(step, purpose, draw);
        philox::u64_to_unit_f64(((b[0] as u64) << 32) | b[1] as u64)
    }

    /// `u ∈ (0, 1)`: like [`uniform`](Self::uniform) but shifted by half a step so it is never 0.
    #[inline]
    pub fn uniform_open(&self, step: u64, purpose: Purpose, draw: u32) -> f64 {
        let b = self.block(step, purpose, draw);
        let bits = ((b[0] as u64) << 32) | b[1] as u64;
        ((bits >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_pure_functions_of_their_coordinates() {
        let a = RngState::new(7);
        let b = RngState::new(7);
        assert_eq!(
            a.uniform(3, Purpose::Select, 0),
            b.uniform(3, Purpose::Select, 0)
        );
        assert_ne!(
            a.uniform(3, Purpose::Select, 0),
            a.uniform(4, Purpose::Select, 0)
        );
        assert_ne!(
            a.uniform(3, Purpose::Select, 0),
            a.uniform(3, Purpose::Gumbel, 0)
        );
        assert_ne!(
            a.uniform(3, Purpose::Select, 0),
            RngState::new(8).uniform(3, Purpose::Select, 0)
        );
        let u = a.uniform_open(0, Purpose::Gumbel, 5);
        assert!(u > 0.0 && u < 1.0);
    }

    #[test]
    fn uniform_is_roughly_uniform() {
        let s = RngState::new(12345);
        let n = 20000;
        let mean: f64 = (0..n)
            .map(|i| s.uniform(i, Purpose::Select, 0))
            .sum::<f64>()
            / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
    }

    #[test]
    fn state_roundtrips_through_json() {
        let s = RngState {
            counter: 42,
            ..RngState::new(u64::MAX)
        };
        let j = serde_json::to_string(&s).unwrap();
        assert_eq!(
            j,
            r#"{"algorithm":"philox4x32-10","seed":18446744073709551615,"counter":42}"#
        );
        let back: RngState = serde_json::from_str(&j).unwrap();
        assert_eq!(back, s);
    }
}
