//! Deterministic synthetic logits rows: what the sampler benchmarks (`nextok-bench`) and the
//! core's allocation and large-nucleus tests run on. Raw data only (logits, a token history, the
//! special ids), so that this crate depends on no nextok crate; the callers build the core's
//! types from it.
//!
//! * [`row`] — a realistic heavy-tailed row: a Normal(0, 2.5) bulk, a few dozen strong tokens
//!   8–15 above the bulk mean, 256 reserved special tokens far below it (one of them the EOS),
//!   and a 96-token history (BOS, repeats of strong tokens and bulk tokens) so that history
//!   penalties act.
//! * [`flat_row`] — a flat row, as high temperatures and creative sampling produce: a
//!   Normal(0, 2) bulk and 20 strong tokens at 10–13.
//!
//! Everything comes from a self-contained splitmix64 generator ([`SplitMix64`]) and the polar
//! Box–Muller method with a logarithm the caller passes — nextok's own
//! (`nextok_core::math::ln_f64`, no platform libm) — so a row is the same on every platform.

use std::ops::Range;

/// The natural logarithm the normal draws use (pass `nextok_core::math::ln_f64`).
pub type Ln = fn(f64) -> f64;

/// The vocabulary sizes benchmarked (SmolLM, Llama 3, Qwen 2, Gemma 3).
pub const VOCAB_SIZES: [usize; 4] = [49_152, 128_256, 151_936, 262_144];
/// The vocabulary size the performance targets are stated for.
pub const TARGET_VOCAB: usize = 128_256;
/// Number of strong tokens in a row.
pub const STRONG_TOKENS: usize = 40;
/// Number of reserved special tokens (the top ids of the vocabulary).
pub const SPECIAL_TOKENS: usize = 256;
/// History length (prompt tokens) of a row.
pub const HISTORY_LEN: usize = 96;

/// Number of strong tokens in a flat row ([`flat_row`]).
pub const FLAT_STRONG_TOKENS: usize = 20;
/// Standard deviation of a flat row's bulk ([`flat_row`]).
pub const FLAT_SIGMA: f64 = 2.0;
/// The vocabulary sizes of the flat rows (Llama 3, Gemma 3).
pub const FLAT_VOCAB_SIZES: [usize; 2] = [128_256, 262_144];

/// splitmix64: a tiny, fast, deterministic 64-bit generator.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
    spare: Option<f64>,
}

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 {
            state: seed,
            spare: None,
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in `0..n` (`n >= 1`; the tiny modulo bias is irrelevant here).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Standard normal by the polar Box–Muller method: only `ln` and `sqrt` (`sqrt` is exact
    /// in IEEE arithmetic; `ln` is the caller's, see [`Ln`]).
    pub fn normal(&mut self, ln: Ln) -> f64 {
        if let Some(s) = self.spare.take() {
            return s;
        }
        loop {
            let x = 2.0 * self.unit() - 1.0;
            let y = 2.0 * self.unit() - 1.0;
            let s = x * x + y * y;
            if s > 0.0 && s < 1.0 {
                let f = (-2.0 * ln(s) / s).sqrt();
                self.spare = Some(y * f);
                return x * f;
            }
        }
    }
}

/// One synthetic row: raw logits, a token history and the vocabulary's special ids.
#[derive(Debug, Clone)]
pub struct Row {
    /// The raw logits (one per token of the vocabulary).
    pub logits: Vec<f32>,
    /// The history (used as the prompt): BOS, then a mix of strong and bulk tokens.
    pub history: Vec<u32>,
    /// The strong token ids.
    pub strong: Vec<u32>,
    /// The reserved special ids: the top [`SPECIAL_TOKENS`] ids of the vocabulary, the first
    /// one BOS and the second one EOS.
    pub special: Range<u32>,
}

impl Row {
    /// The vocabulary size (the length of the row).
    pub fn vocab_size(&self) -> usize {
        self.logits.len()
    }

    /// The EOS id (the second special id).
    pub fn eos(&self) -> u32 {
        self.special.start + 1
    }
}

/// A deterministic row for a vocabulary of `v` tokens (`v >= 1024`), with `ln` for the normal
/// draws (see [`Ln`]).
///
/// # Panics
///
/// When `v < 1024`.
pub fn row(v: usize, seed: u64, ln: Ln) -> Row {
    assert!(v >= 1024, "fixtures need at least 1024 tokens");
    let mut rng = SplitMix64::new(seed ^ 0x6E65_7874_6F6B_0001);
    let special_start = v - SPECIAL_TOKENS;
    let mut logits: Vec<f32> = (0..v).map(|_| (2.5 * rng.normal(ln)) as f32).collect();
    for z in &mut logits[special_start..] {
        *z = (-12.0 + rng.normal(ln)) as f32;
    }
    let mut strong: Vec<u32> = Vec::with_capacity(STRONG_TOKENS);
    while strong.len() < STRONG_TOKENS {
        let id = rng.below(special_start) as u32;
        if !strong.contains(&id) {
            strong.push(id);
            logits[id as usize] = (8.0 + 7.0 * rng.unit()) as f32;
        }
    }
    let bos = special_start as u32;
    let mut history = Vec::with_capacity(HISTORY_LEN);
    history.push(bos);
    while history.len() < HISTORY_LEN {
        let id = if rng.unit() < 0.5 {
            // text repeats: mostly the strongest few tokens
            strong[rng.below(STRONG_TOKENS / 4)]
        } else {
            rng.below(special_start) as u32
        };
        history.push(id);
    }
    Row {
        logits,
        history,
        strong,
        special: special_start as u32..v as u32,
    }
}

/// A deterministic flat row for a vocabulary of `v` tokens (`v >= 1024`), with `ln` for the
/// normal draws: a Normal(0, [`FLAT_SIGMA`]) bulk and [`FLAT_STRONG_TOKENS`] strong tokens at
/// 10–13; the special tokens and the history are made as in [`row`]. Top-p 0.95 keeps a large
/// nucleus: about 14 thousand tokens at V = 128,256 and 49 thousand at 262,144.
///
/// # Panics
///
/// When `v < 1024`.
pub fn flat_row(v: usize, seed: u64, ln: Ln) -> Row {
    let mut r = row(v, seed, ln);
    let mut rng = SplitMix64::new(seed ^ 0x6E65_7874_6F6B_0002);
    let special_start = v - SPECIAL_TOKENS;
    for z in &mut r.logits[..special_start] {
        *z = (FLAT_SIGMA * rng.normal(ln)) as f32;
    }
    r.strong.truncate(FLAT_STRONG_TOKENS);
    for &id in &r.strong {
        r.logits[id as usize] = (10.0 + 3.0 * rng.unit()) as f32;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_deterministic() {
        let a = row(4096, 3, f64::ln);
        let b = row(4096, 3, f64::ln);
        assert_eq!(a.logits, b.logits);
        assert_eq!(a.history, b.history);
        assert_eq!(a.history.len(), HISTORY_LEN);
        assert_eq!(a.history[0], a.special.start);
        assert_eq!(a.special, 4096 - SPECIAL_TOKENS as u32..4096);
        assert_eq!(a.eos(), 4096 - SPECIAL_TOKENS as u32 + 1);
        let m = a.logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        assert!((8.0..=15.0).contains(&m));
    }

    #[test]
    fn flat_rows_keep_the_special_tokens_and_history() {
        let r = row(4096, 7, f64::ln);
        let f = flat_row(4096, 7, f64::ln);
        assert_eq!(f.history, r.history);
        assert_eq!(f.special, r.special);
        assert_eq!(
            f.logits[r.special.start as usize..],
            r.logits[r.special.start as usize..]
        );
        assert_eq!(f.strong[..], r.strong[..FLAT_STRONG_TOKENS]);
        for &id in &f.strong {
            assert!((10.0..=13.0).contains(&f.logits[id as usize]));
        }
    }
}
