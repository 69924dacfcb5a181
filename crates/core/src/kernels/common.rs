//! What the kernels share with the rest of the crate: the candidate type [`Cand`], the top-k
//! heap whose root is the worst kept candidate ([`push_heap`], [`sift_down`]), and `exp_f32`
//! with the constants its vector versions use.
//!
//! A leaf: it uses nothing else from the crate, so the kernels depend only on it and on
//! [`crate::cpu`], and `support` and `math` build on the kernels without a loop (they re-export
//! what is public from here).

// The polynomial constants are the published Cephes decimals; they parse to the intended
// floats, and the tests of `math` check `exp_f32` against the standard library.
#![allow(clippy::excessive_precision)]

/// One candidate: token id and processed logit (`repr(C)`: the AVX-512 kernels store whole
/// candidates as `(u32, f32)` pairs).
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub struct Cand {
    /// Token id.
    pub id: u32,
    /// Processed logit.
    pub z: f32,
}

/// "Worse" in a top-k heap: lower z, or equal z and higher id (the root holds the worst).
#[inline(always)]
pub(crate) fn worse(a: &Cand, b: &Cand) -> bool {
    a.z < b.z || (a.z == b.z && a.id > b.id)
}

/// Adds `c` to a heap whose root is its worst candidate (sift up).
pub(crate) fn push_heap(heap: &mut Vec<Cand>, c: Cand) {
    heap.push(c);
    let mut j = heap.len() - 1;
    while j > 0 {
        let p = (j - 1) / 2;
        if worse(&heap[j], &heap[p]) {
            heap.swap(j, p);
            j = p;
        } else {
            break;
        }
    }
}

/// Restores the heap order below `i` after `h[i]` was replaced (sift down).
#[inline(always)]
pub(crate) fn sift_down(h: &mut [Cand], mut i: usize) {
    let n = h.len();
    loop {
        let l = 2 * i + 1;
        if l >= n {
            break;
        }
        let r = l + 1;
        let mut w = l;
        if r < n && worse(&h[r], &h[l]) {
            w = r;
        }
        if worse(&h[w], &h[i]) {
            h.swap(w, i);
            i = w;
        } else {
            break;
        }
    }
}

/// Inputs below this give `exp_f32(x) == 0.0` (the result would be subnormal).
pub const EXP_F32_FLUSH: f32 = -87.0;

// The constants of `exp_f32` (shared with the vector versions).
pub(crate) const EXP_LOG2E: f32 = std::f32::consts::LOG2_E;
pub(crate) const EXP_C1: f32 = 0.693_359_4; // ln 2, high part (0.693359375)
pub(crate) const EXP_C2: f32 = -2.121_944_4e-4; // ln 2, low part
pub(crate) const EXP_MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to nearest integer
pub(crate) const EXP_CLAMP: f32 = 88.0;
pub(crate) const EXP_P: [f32; 6] = [
    1.987_569_2e-4,
    1.398_2e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    5.000_000_1e-1,
];
// 2^n from the bits of t: the low mantissa bits of t hold n + 0x400000.
pub(crate) const EXP_BIAS: u32 = 127u32.wrapping_sub(0x4B40_0000);

/// `e^x` in `f32`, deterministic on every platform. `x < -87` (and `-inf`) gives `0.0`;
/// `x > 88` is clamped to `88` (callers only pass `x <= 0`).
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    let flush = x < EXP_F32_FLUSH;
    let xc = if flush {
        0.0
    } else if x > EXP_CLAMP {
        EXP_CLAMP
    } else {
        x
    };
    let t = xc * EXP_LOG2E + EXP_MAGIC;
    let n = t - EXP_MAGIC;
    // fused multiply-adds: one rounding each (IEEE-754 fusedMultiplyAdd), in hardware or in
    // software, so every platform and vector width computes the same bits
    let r = (-n).mul_add(EXP_C2, (-n).mul_add(EXP_C1, xc));
    let z = r * r;
    let mut y = EXP_P[0];
    y = y.mul_add(r, EXP_P[1]);
    y = y.mul_add(r, EXP_P[2]);
    y = y.mul_add(r, EXP_P[3]);
    y = y.mul_add(r, EXP_P[4]);
    y = y.mul_add(r, EXP_P[5]);
    y = y.mul_add(z, r) + 1.0;
    let pow2 = f32::from_bits(t.to_bits().wrapping_add(EXP_BIAS) << 23);
    if flush {
        0.0
    } else {
        y * pow2
    }
}
