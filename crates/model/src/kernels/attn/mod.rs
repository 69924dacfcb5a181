//! Attention's inner loops over one block of cached positions: the scores `q · k` of every
//! query head against the block's keys, and the weighted sum of the block's values.
//!
//! # Exact semantics
//!
//! Both are defined by the scalar code ([`Level::Scalar`]); the AVX2 code (`avx2.rs`) computes
//! the same operations eight lanes at a time, the AVX-512 code (`avx512.rs`) sixteen (two keys'
//! lane sums to a register), and both give the same bits. The AVX-512 levels run the AVX-512
//! code on 512-bit registers and the AVX2 code on 256-bit ones ([`super::RegisterWidth`]).
//!
//! * **Score** of head `h` and position `p`: `dot(q_h, k_p) · scale`, where `dot` keeps eight
//!   lane sums `acc_l = fma(q[i], k[i], acc_l)` over the elements `i ≡ l (mod 8)` in order,
//!   then adds them as `((acc_0 + acc_4) + (acc_2 + acc_6)) + ((acc_1 + acc_5) + (acc_3 + acc_7))`
//!   (the tree of the matrix kernels' `hsum8`).
//! * **Output** of head `h`: every element `o_i` is the chain `o_i = fma(w_hp, v_p[i], o_i)` over
//!   positions `p` in order, starting from the caller's `o_i` (zero before the first block).
//!
//! Keys and values are given as `f32` (the cache's values converted exactly, one block at a
//! time, shared by the query heads of a key/value head), or, for `scores_kv` and
//! `accumulate_kv`, as the cache holds them (`KvRun`: `f16` values, or `q8_0` quants and
//! scales), converted in registers (the same bits: both conversions are exact).

use super::Level;
use crate::kv::{KvRun, Q8_COLUMNS};

/// The scores of `rep` query heads (`q`, `rep · hd` values) against the `here` keys in `k`
/// (`here · hd` values): `scores[h · stride + off + p] = dot(q_h, k_p) · scale`.
#[allow(clippy::too_many_arguments)]
pub fn scores(
    level: Level,
    q: &[f32],
    k: &[f32],
    hd: usize,
    scale: f32,
    scores: &mut [f32],
    stride: usize,
    off: usize,
) {
    let here = k.len() / hd;
    let rep = q.len() / hd;
    assert!(q.len() == rep * hd && k.len() == here * hd);
    assert!(rep == 0 || (rep - 1) * stride + off + here <= scores.len());
    #[cfg(target_arch = "x86_64")]
    if wide(level) && hd.is_multiple_of(8) {
        scores_avx512(q, avx512::Src::F32(k), hd, scale, scores, stride, off);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if level.effective() >= Level::Avx2 && hd.is_multiple_of(8) {
        for h in 0..rep {
            let qh = &q[h * hd..(h + 1) * hd];
            let out = &mut scores[h * stride + off..h * stride + off + here];
            let mut p = 0;
            while p + 8 <= here {
                let ks = &k[p * hd..(p + 8) * hd];
                let o: &mut [f32; 8] = (&mut out[p..p + 8]).try_into().expect("eight scores");
                // SAFETY: `effective` checked that the CPU has AVX2, FMA and F16C.
                unsafe { avx2::scores8(qh, ks, scale, o) };
                p += 8;
            }
            for (o, kp) in out[p..].iter_mut().zip(k[p * hd..].chunks_exact(hd)) {
                *o = dot(qh, kp) * scale;
            }
        }
        return;
    }
    let _ = level;
    for (p, kp) in k.chunks_exact(hd).enumerate() {
        for (h, qh) in q.chunks_exact(hd).enumerate() {
            scores[h * stride + off + p] = dot(qh, kp) * scale;
        }
    }
}

/// [`scores`] over the cache's keys as it holds them, converted in registers as they are read,
/// each key once for up to three query heads (four in AVX-512) (the same bits: the conversion
/// is exact). For a
/// decode step, which reads every key once: converting a block into a buffer first and then
/// reading it puts all of a block's memory reads in one burst, which the CPU's prefetchers do
/// not spread over the arithmetic.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scores_kv(
    level: Level,
    q: &[f32],
    k: KvRun<'_>,
    hd: usize,
    scale: f32,
    scores: &mut [f32],
    stride: usize,
    off: usize,
) {
    let here = k.len() / hd;
    let rep = q.len() / hd;
    assert!(q.len() == rep * hd && k.len() == here * hd);
    assert!(rep == 0 || (rep - 1) * stride + off + here <= scores.len());
    let q8 = matches!(k, KvRun::Q8 { .. });
    assert!(!q8 || hd.is_multiple_of(Q8_COLUMNS));
    #[cfg(target_arch = "x86_64")]
    if wide(level) && hd.is_multiple_of(8) {
        scores_avx512(q, avx512::Src::Kv(k), hd, scale, scores, stride, off);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if level.effective() >= Level::Avx2 && hd.is_multiple_of(8) {
        type Heads = unsafe fn(&[f32], KvRun<'_>, usize, f32, &mut [f32], usize, usize);
        let mut h0 = 0;
        while h0 < rep {
            let n = (rep - h0).min(3);
            let heads: Heads = match (n, q8) {
                (1, false) => avx2::scores_kv::<1, false>,
                (2, false) => avx2::scores_kv::<2, false>,
                (_, false) => avx2::scores_kv::<3, false>,
                (1, true) => avx2::scores_kv::<1, true>,
                (2, true) => avx2::scores_kv::<2, true>,
                (_, true) => avx2::scores_kv::<3, true>,
            };
            // SAFETY: `effective` checked that the CPU has AVX2, FMA and F16C.
            unsafe {
                heads(
                    &q[h0 * hd..(h0 + n) * hd],
                    k,
                    hd,
                    scale,
                    &mut scores[h0 * stride..],
                    stride,
                    off,
                )
            };
            h0 += n;
        }
        return;
    }
    let _ = level;
    for p in 0..here {
        for (h, qh) in q.chunks_exact(hd).enumerate() {
            scores[h * stride + off + p] = dot_kv(qh, &k, p * hd) * scale;
        }
    }
}

/// Adds the block's values to the `rep` head outputs `out` (`rep · hd`): for each head `h` and
/// position `p` in order, `out_h = fma(weights[h · stride + off + p], v_p, out_h)`.
#[allow(clippy::too_many_arguments)]
pub fn accumulate(
    level: Level,
    weights: &[f32],
    stride: usize,
    off: usize,
    v: &[f32],
    hd: usize,
    out: &mut [f32],
) {
    let here = v.len() / hd;
    let rep = out.len() / hd;
    assert!(out.len() == rep * hd && v.len() == here * hd);
    assert!(rep == 0 || (rep - 1) * stride + off + here <= weights.len());
    #[cfg(target_arch = "x86_64")]
    if wide(level) && hd.is_multiple_of(16) {
        let v = avx512::Src::F32(v);
        accumulate_avx512(weights, stride, off, v, hd, here, hd, out);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if level.effective() >= Level::Avx2 && hd.is_multiple_of(32) {
        for (h, oh) in out.chunks_exact_mut(hd).enumerate() {
            let w = &weights[h * stride + off..h * stride + off + here];
            // SAFETY: `effective` checked that the CPU has AVX2, FMA and F16C.
            unsafe { avx2::accumulate(w, v, oh) };
        }
        return;
    }
    let _ = level;
    for (p, vp) in v.chunks_exact(hd).enumerate() {
        for (h, oh) in out.chunks_exact_mut(hd).enumerate() {
            let w = weights[h * stride + off + p];
            for (o, &x) in oh.iter_mut().zip(vp) {
                *o = w.mul_add(x, *o);
            }
        }
    }
}

/// [`accumulate`] over `hd` columns of the cache's values as it holds them, converted as they
/// are read: `v_p` is values `p · v_stride..p · v_stride + hd` of `v` (so a caller may take some
/// of each position's columns), for the `here` positions of the block. The same bits as
/// converting those values to `f32` and calling [`accumulate`] (the conversion is exact). For
/// `q8_0` values, `v_stride` and the first column are multiples of [`Q8_COLUMNS`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn accumulate_kv(
    level: Level,
    weights: &[f32],
    stride: usize,
    off: usize,
    v: KvRun<'_>,
    v_stride: usize,
    here: usize,
    hd: usize,
    out: &mut [f32],
) {
    let rep = out.len() / hd;
    assert!(hd > 0 && v_stride >= hd && out.len() == rep * hd);
    assert!(here == 0 || (here - 1) * v_stride + hd <= v.len());
    assert!(rep == 0 || (rep - 1) * stride + off + here <= weights.len());
    let q8 = matches!(v, KvRun::Q8 { .. });
    assert!(!q8 || v_stride.is_multiple_of(Q8_COLUMNS));
    #[cfg(target_arch = "x86_64")]
    if wide(level) && hd.is_multiple_of(16) && (!q8 || hd.is_multiple_of(32)) {
        accumulate_avx512(
            weights,
            stride,
            off,
            avx512::Src::Kv(v),
            v_stride,
            here,
            hd,
            out,
        );
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if level.effective() >= Level::Avx2 && hd.is_multiple_of(16) && (!q8 || hd.is_multiple_of(32)) {
        type Heads = unsafe fn(&[f32], usize, usize, usize, KvRun<'_>, usize, usize, &mut [f32]);
        // up to four heads at a time; up to three, 32 columns at a time (twelve independent
        // chains of fused multiply-adds: with eight, their latency bounds the loop)
        let cols32 = hd.is_multiple_of(32);
        let mut h0 = 0;
        while h0 < rep {
            let n = (rep - h0).min(4);
            let heads: Heads = match (n, cols32, q8) {
                (1, false, false) => avx2::accumulate_kv::<1, 2, false>,
                (2, false, false) => avx2::accumulate_kv::<2, 2, false>,
                (3, false, false) => avx2::accumulate_kv::<3, 2, false>,
                (1, true, false) => avx2::accumulate_kv::<1, 4, false>,
                (2, true, false) => avx2::accumulate_kv::<2, 4, false>,
                (3, true, false) => avx2::accumulate_kv::<3, 4, false>,
                (_, _, false) => avx2::accumulate_kv::<4, 2, false>,
                (1, true, true) => avx2::accumulate_kv::<1, 4, true>,
                (2, true, true) => avx2::accumulate_kv::<2, 4, true>,
                (3, true, true) => avx2::accumulate_kv::<3, 4, true>,
                (_, true, true) => avx2::accumulate_kv::<4, 4, true>,
                (_, false, true) => unreachable!("q8_0 values are read 32 columns at a time"),
            };
            let o = &mut out[h0 * hd..(h0 + n) * hd];
            // SAFETY: `effective` checked that the CPU has AVX2, FMA and F16C.
            unsafe { heads(weights, stride, off + h0 * stride, here, v, v_stride, hd, o) };
            h0 += n;
        }
        return;
    }
    let _ = level;
    for p in 0..here {
        for (h, oh) in out.chunks_exact_mut(hd).enumerate() {
            let w = weights[h * stride + off + p];
            for (i, o) in oh.iter_mut().enumerate() {
                *o = w.mul_add(v.value(p * v_stride + i), *o);
            }
        }
    }
}

/// Whether attention runs its AVX-512 kernels at `level`: the level has them and the AVX-512
/// kernels run on 512-bit registers ([`super::RegisterWidth`]; where the CPU splits 512-bit
/// operations, AMD Zen 4, the AVX2 kernels are 10–25 % faster, docs/performance.md).
#[inline]
fn wide(level: Level) -> bool {
    #[cfg(test)]
    if tests::FORCE_512.with(|f| f.get()) {
        return level.effective() >= Level::Avx512;
    }
    level.effective() >= Level::Avx512 && !super::bits_256()
}

/// [`scores`] and [`scores_kv`] at the AVX-512 level: the query heads four at a time.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn scores_avx512(
    q: &[f32],
    k: avx512::Src<'_>,
    hd: usize,
    scale: f32,
    sc: &mut [f32],
    stride: usize,
    off: usize,
) {
    type Heads = unsafe fn(&[f32], avx512::Src<'_>, usize, f32, &mut [f32], usize, usize);
    let rep = q.len() / hd;
    let mut h0 = 0;
    while h0 < rep {
        let n = (rep - h0).min(4);
        let heads: Heads = match (n, k.kind()) {
            (1, avx512::F32) => avx512::scores::<1, { avx512::F32 }>,
            (1, avx512::F16) => avx512::scores::<1, { avx512::F16 }>,
            (1, avx512::Q8) => avx512::scores::<1, { avx512::Q8 }>,
            (2, avx512::F32) => avx512::scores::<2, { avx512::F32 }>,
            (2, avx512::F16) => avx512::scores::<2, { avx512::F16 }>,
            (2, avx512::Q8) => avx512::scores::<2, { avx512::Q8 }>,
            (3, avx512::F32) => avx512::scores::<3, { avx512::F32 }>,
            (3, avx512::F16) => avx512::scores::<3, { avx512::F16 }>,
            (3, avx512::Q8) => avx512::scores::<3, { avx512::Q8 }>,
            (4, avx512::F32) => avx512::scores::<4, { avx512::F32 }>,
            (4, avx512::F16) => avx512::scores::<4, { avx512::F16 }>,
            (4, avx512::Q8) => avx512::scores::<4, { avx512::Q8 }>,
            _ => unreachable!("one to four heads of a known kind"),
        };
        let q = &q[h0 * hd..(h0 + n) * hd];
        // SAFETY: the caller checked that the CPU has AVX-512 F/BW/DQ/VL (and AVX2, FMA,
        // F16C); the kind is `k`'s own.
        unsafe { heads(q, k, hd, scale, &mut sc[h0 * stride..], stride, off) };
        h0 += n;
    }
}

/// [`accumulate`] and [`accumulate_kv`] at the AVX-512 level: the heads four at a time, 32
/// columns a pass when `hd` allows (else 16).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn accumulate_avx512(
    weights: &[f32],
    stride: usize,
    off: usize,
    v: avx512::Src<'_>,
    v_stride: usize,
    here: usize,
    hd: usize,
    out: &mut [f32],
) {
    type Heads = unsafe fn(&[f32], usize, usize, usize, avx512::Src<'_>, usize, usize, &mut [f32]);
    let rep = out.len() / hd;
    let j = if hd.is_multiple_of(32) { 2 } else { 1 };
    let mut h0 = 0;
    while h0 < rep {
        let n = (rep - h0).min(4);
        let heads: Heads = match (n, j, v.kind()) {
            (1, 1, avx512::F32) => avx512::accumulate::<1, 1, { avx512::F32 }>,
            (1, 1, avx512::F16) => avx512::accumulate::<1, 1, { avx512::F16 }>,
            (1, 2, avx512::F32) => avx512::accumulate::<1, 2, { avx512::F32 }>,
            (1, 2, avx512::F16) => avx512::accumulate::<1, 2, { avx512::F16 }>,
            (1, 2, avx512::Q8) => avx512::accumulate::<1, 2, { avx512::Q8 }>,
            (2, 1, avx512::F32) => avx512::accumulate::<2, 1, { avx512::F32 }>,
            (2, 1, avx512::F16) => avx512::accumulate::<2, 1, { avx512::F16 }>,
            (2, 2, avx512::F32) => avx512::accumulate::<2, 2, { avx512::F32 }>,
            (2, 2, avx512::F16) => avx512::accumulate::<2, 2, { avx512::F16 }>,
            (2, 2, avx512::Q8) => avx512::accumulate::<2, 2, { avx512::Q8 }>,
            (3, 1, avx512::F32) => avx512::accumulate::<3, 1, { avx512::F32 }>,
            (3, 1, avx512::F16) => avx512::accumulate::<3, 1, { avx512::F16 }>,
            (3, 2, avx512::F32) => avx512::accumulate::<3, 2, { avx512::F32 }>,
            (3, 2, avx512::F16) => avx512::accumulate::<3, 2, { avx512::F16 }>,
            (3, 2, avx512::Q8) => avx512::accumulate::<3, 2, { avx512::Q8 }>,
            (4, 1, avx512::F32) => avx512::accumulate::<4, 1, { avx512::F32 }>,
            (4, 1, avx512::F16) => avx512::accumulate::<4, 1, { avx512::F16 }>,
            (4, 2, avx512::F32) => avx512::accumulate::<4, 2, { avx512::F32 }>,
            (4, 2, avx512::F16) => avx512::accumulate::<4, 2, { avx512::F16 }>,
            (4, 2, avx512::Q8) => avx512::accumulate::<4, 2, { avx512::Q8 }>,
            _ => unreachable!("q8_0 values are read 32 columns at a time"),
        };
        let o = &mut out[h0 * hd..(h0 + n) * hd];
        // SAFETY: the caller checked that the CPU has AVX-512 F/BW/DQ/VL (and AVX2, FMA,
        // F16C); the kind is `v`'s own.
        unsafe { heads(weights, stride, off + h0 * stride, here, v, v_stride, hd, o) };
        h0 += n;
    }
}

/// `Σ a[i]·b[i]` with element `i` in lane `i % 8` (fused multiply-adds), lanes summed in a
/// fixed tree (see the module docs).
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..8 {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    for (l, (x, y)) in ca.remainder().iter().zip(cb.remainder()).enumerate() {
        acc[l] = x.mul_add(*y, acc[l]);
    }
    hsum8(acc)
}

/// [`dot`] of `a` with the cache's values `at..at + a.len()` of `k` (each converted exactly).
#[inline]
fn dot_kv(a: &[f32], k: &KvRun<'_>, at: usize) -> f32 {
    let mut acc = [0f32; 8];
    for (i, x) in a.iter().enumerate() {
        acc[i % 8] = x.mul_add(k.value(at + i), acc[i % 8]);
    }
    hsum8(acc)
}

#[inline(always)]
fn hsum8(a: [f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

/// How far ahead (in bytes of a run of the cache) the AVX2 keys kernel of a decode step asks
/// for the memory it will read, into the core's L2 cache. On a long context the cache comes
/// from memory, and with the hardware prefetcher alone the kernels read it at about half the
/// rate a thread can (docs/performance.md, "Attention's keys kernel prefetches its run of the
/// cache", and "The cache's runs asked for into L2").
pub(crate) const KEYS_AHEAD: usize = 8192;

/// How far ahead the values of a decode step are asked for ([`prefetch_ahead`], from the
/// values' loop of the forward pass): a run of values is read a 64-byte line per position, so
/// this is as many positions ahead as [`KEYS_AHEAD`] is for the keys' 128.
pub(crate) const VALUES_AHEAD: usize = 4096;

/// Asks the CPU to bring the lines of `run[at + ahead..][..n]` that lie inside `run` into the
/// core's L2 cache (a hint: no effect on results).
#[inline(always)]
pub(crate) fn prefetch_ahead(run: &[u8], at: usize, n: usize, ahead: usize) {
    let a = at + ahead;
    if a < run.len() {
        prefetch_l2(&run[a..(a + n).min(run.len())]);
    }
}

/// Asks the CPU to bring `x` into the core's L2 cache ahead of its use (a hint; no effect on
/// results). A decode step's runs of the cache: asked for into L1 (as [`prefetch`] does) at the
/// same distances, the values were slower than with no hint at all, into L2 faster.
#[inline]
pub(crate) fn prefetch_l2<T>(x: &[T]) {
    prefetch_lines::<true, T>(x);
}

/// Asks the CPU to bring `x` into the cache ahead of its use (a hint; no effect on results).
/// For a cache block whose values do not follow the previous block's in memory (a sequence's
/// blocks in different places of the pool): a run of one block is too short for the hardware
/// prefetcher to follow.
#[inline]
pub fn prefetch<T>(x: &[T]) {
    prefetch_lines::<false, T>(x);
}

/// A prefetch of every 64-byte line of `x`, into L2 (`L2`) or into every level.
#[inline(always)]
fn prefetch_lines<const L2: bool, T>(x: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
        let p = x.as_ptr().cast::<i8>();
        let bytes = std::mem::size_of_val(x);
        let mut o = 0;
        while o < bytes {
            // SAFETY: `o < bytes`, so the address is inside `x`; a prefetch reads nothing
            // architecturally and cannot fault.
            unsafe {
                if L2 {
                    _mm_prefetch::<_MM_HINT_T1>(p.add(o));
                } else {
                    _mm_prefetch::<_MM_HINT_T0>(p.add(o));
                }
            }
            o += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

#[cfg(test)]
mod tests;
