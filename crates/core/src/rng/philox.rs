//! Philox4x32-10 counter-based random number generator.
//!
//! Philox is described in J. K. Salmon, M. A. Moraes, R. O. Dror and
//! D. E. Shaw, "Parallel Random Numbers: As Easy as 1, 2, 3", SC'11. It is
//! a *counter-based* generator: there is no mutable state, and each output
//! block is a keyed bijection of a 128-bit counter,
//! `output = bijection(counter, key)`. Any position in the stream can
//! therefore be computed directly, which makes sampling reproducible and
//! trivially parallel.
//!
//! This module implements the 4x32 variant with 10 rounds, bit-for-bit
//! identical to `philox4x32_R(10, ctr, key)` in the Random123 library. Each
//! round multiplies two of the four 32-bit words by fixed constants, keeps
//! both halves of each 64-bit product, and mixes in the key:
//!
//! - multipliers: `M0 = 0xD2511F53`, `M1 = 0xCD9E8D57`;
//! - Weyl key increments: `W0 = 0x9E3779B9`, `W1 = 0xBB67AE85`.
//!
//! The key is bumped by `(W0, W1)` *between* rounds (before rounds 2..=10),
//! never after the last round.
//!
//! [`u64_to_unit_f64`] converts 64 random bits into an exactly representable
//! uniform double in `[0, 1)`.

/// Multiplier applied to counter word 0 in every round.
const PHILOX_M4X32_0: u32 = 0xD251_1F53;
/// Multiplier applied to counter word 2 in every round.
const PHILOX_M4X32_1: u32 = 0xCD9E_8D57;
/// Weyl increment for key word 0 (golden ratio).
const PHILOX_W32_0: u32 = 0x9E37_79B9;
/// Weyl increment for key word 1 (sqrt(3) - 1).
const PHILOX_W32_1: u32 = 0xBB67_AE85;

/// Number of rounds in Philox4x32-10.
const ROUNDS: usize = 10;

/// Full 32x32 -> 64-bit product, returned as `(hi, lo)`.
#[inline(always)]
fn mulhilo32(a: u32, b: u32) -> (u32, u32) {
    let product = u64::from(a) * u64::from(b);
    ((product >> 32) as u32, product as u32)
}

/// One Philox4x32 round.
#[inline(always)]
fn round(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (hi0, lo0) = mulhilo32(PHILOX_M4X32_0, ctr[0]);
    let (hi1, lo1) = mulhilo32(PHILOX_M4X32_1, ctr[2]);
    [hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0]
}

/// Advance the round key by the Weyl increments.
#[inline(always)]
fn bump_key(key: [u32; 2]) -> [u32; 2] {
    [
        key[0].wrapping_add(PHILOX_W32_0),
        key[1].wrapping_add(PHILOX_W32_1),
    ]
}

/// Philox4x32-10: map a 128-bit `counter` to 128 pseudo-random bits under a
/// 64-bit `key`.
///
/// This is a pure function (no state, no allocation) and matches Random123's
/// `philox4x32_R(10, counter, key)` exactly, word for word: `counter[0]` and
/// `key[0]` are Random123's `v[0]`, and so on.
#[inline]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut ctr = round(counter, key);
    let mut key = key;
    for _ in 1..ROUNDS {
        key = bump_key(key);
        ctr = round(ctr, key);
    }
    ctr
}

/// Convert 64 random bits to a uniform `f64` in `[0, 1)`.
///
/// Uses the top 53 bits: `(bits >> 11) * 2^-53`. The conversion is exact:
/// the 53-bit integer fits in an `f64` mantissa without rounding, and
/// scaling by a power of two is exact, so every output is a multiple of
/// `2^-53` in `[0, 1 - 2^-53]`. The result is never `1.0`; `0` maps to
/// `0.0` and `u64::MAX` maps to `1 - 2^-53`.
#[inline]
pub fn u64_to_unit_f64(bits: u64) -> f64 {
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Known-answer vectors from Random123's `kat_vectors` file, the three
    // "philox4x32 10" lines. Columns: counter (4 words), key (2 words),
    // expected output (4 words).
    //
    // philox4x32 10 00000000 00000000 00000000 00000000 00000000 00000000   6627e8d5 e169c58d bc57ac4c 9b00dbd8
    // philox4x32 10 ffffffff ffffffff ffffffff ffffffff ffffffff ffffffff   408f276d 41c83b0e a20bc7c6 6d5451fd
    // philox4x32 10 243f6a88 85a308d3 13198a2e 03707344 a4093822 299f31d0   d16cfe09 94fdcceb 5001e420 24126ea1

    #[test]
    fn kat_zeros() {
        assert_eq!(
            philox4x32_10([0, 0, 0, 0], [0, 0]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
    }

    #[test]
    fn kat_ones() {
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
    }

    #[test]
    fn kat_pi_digits() {
        assert_eq!(
            philox4x32_10(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn unit_f64_zero() {
        assert_eq!(u64_to_unit_f64(0), 0.0);
    }

    #[test]
    fn unit_f64_max_is_below_one() {
        let u = u64_to_unit_f64(u64::MAX);
        assert!(u < 1.0);
        assert_eq!(u, 1.0 - 2f64.powi(-53));
    }

    #[test]
    fn unit_f64_ignores_low_bits() {
        assert_eq!(u64_to_unit_f64(0x7ff), 0.0);
        assert_eq!(u64_to_unit_f64(1 << 11), 2f64.powi(-53));
        assert_eq!(u64_to_unit_f64(1 << 63), 0.5);
    }
}
