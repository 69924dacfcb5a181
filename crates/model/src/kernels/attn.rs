//! Attention's inner loops over one block of cached positions: the scores `q · k` of every
//! query head against the block's keys, and the weighted sum of the block's values.
//!
//! # Exact semantics
//!
//! Both are defined by the scalar code ([`Level::Scalar`]); the AVX2 code computes the same
//! operations eight lanes at a time and gives the same bits.
//!
//! * **Score** of head `h` and position `p`: `dot(q_h, k_p) · scale`, where `dot` keeps eight
//!   lane sums `acc_l = fma(q[i], k[i], acc_l)` over the elements `i ≡ l (mod 8)` in order,
//!   then adds them as `((acc_0 + acc_4) + (acc_2 + acc_6)) + ((acc_1 + acc_5) + (acc_3 + acc_7))`
//!   (the tree of the matrix kernels' `hsum8`).
//! * **Output** of head `h`: every element `o_i` is the chain `o_i = fma(w_hp, v_p[i], o_i)` over
//!   positions `p` in order, starting from the caller's `o_i` (zero before the first block).
//!
//! Keys and values are given as `f32` (the cache's values converted exactly, one block at a
//! time, shared by the query heads of a key/value head), or, for [`scores_kv`] and
//! [`accumulate_kv`], as the cache holds them ([`KvRun`]: `f16` values, or `q8_0` quants and
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
/// each key once for up to three query heads (the same bits: the conversion is exact). For a
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
    if level.effective() >= Level::Avx2 && hd.is_multiple_of(16) && (!q8 || hd.is_multiple_of(32)) {
        type Heads = unsafe fn(&[f32], usize, usize, usize, KvRun<'_>, usize, usize, &mut [f32]);
        // up to four heads at a time; up to three, 32 columns at a time (twelve independent
        // chains of fused multiply-adds: with eight, their latency bounds the loop)
        let wide = hd.is_multiple_of(32);
        let mut h0 = 0;
        while h0 < rep {
            let n = (rep - h0).min(4);
            let heads: Heads = match (n, wide, q8) {
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

/// `Σ a[i]·b[i]` with element `i` in lane `i % 8` (fused multiply-adds), lanes summed in a
/// fixed tree (see the module docs).
#[inline]
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

#[inline]
fn hsum8(a: [f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use crate::kv::{KvRun, Q8_COLUMNS};
    use std::arch::x86_64::*;

    /// Eight scores: `o[p] = dot(q, k_p) · scale` for the eight keys in `k` (`8 · q.len()`
    /// values, `q.len() % 8 == 0`), each key in its own accumulator, then the eight lane trees
    /// evaluated together by transposing adds (each add is one of the scalar tree's).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn scores8(q: &[f32], k: &[f32], scale: f32, o: &mut [f32; 8]) {
        let hd = q.len();
        assert!(hd.is_multiple_of(8) && k.len() == 8 * hd);
        let mut acc = [_mm256_setzero_ps(); 8];
        let qp = q.as_ptr();
        let kp = k.as_ptr();
        let mut c = 0;
        while c < hd {
            // SAFETY: `c + 8 ≤ hd = q.len()`.
            let qv = unsafe { _mm256_loadu_ps(qp.add(c)) };
            for (p, acc) in acc.iter_mut().enumerate() {
                // SAFETY: `p · hd + c + 8 ≤ 8 · hd = k.len()`.
                let kv = unsafe { _mm256_loadu_ps(kp.add(p * hd + c)) };
                *acc = _mm256_fmadd_ps(qv, kv, *acc);
            }
            c += 8;
        }
        let r = tree8(acc);
        let r = _mm256_mul_ps(r, _mm256_set1_ps(scale));
        // SAFETY: `o` is eight writable `f32`s.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), r) };
    }

    /// The lane trees of eight accumulators at once, by transposing adds (each add is one of
    /// the scalar tree's): lane `i` of the result is accumulator `i`'s sum.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn tree8(acc: [__m256; 8]) -> __m256 {
        // Level 1, (l, l + 4): pair positions (0,4), (1,5), (2,6), (3,7) in one register each:
        // lanes 0..4 hold position i's four sums, lanes 4..8 position i + 4's.
        let s: [__m256; 4] = std::array::from_fn(|i| {
            let (a, b) = (acc[i], acc[i + 4]);
            _mm256_add_ps(
                _mm256_permute2f128_ps::<0x20>(a, b),
                _mm256_permute2f128_ps::<0x31>(a, b),
            )
        });
        // Level 2, (x0 + x2) and (x1 + x3).
        let t = |u: __m256, v: __m256| {
            _mm256_add_ps(
                _mm256_shuffle_ps::<0b01_00_01_00>(u, v),
                _mm256_shuffle_ps::<0b11_10_11_10>(u, v),
            )
        };
        let t01 = t(s[0], s[1]);
        let t23 = t(s[2], s[3]);
        // Level 3, y0 + y1: lanes come out as positions 0, 1, 2, 3 | 4, 5, 6, 7.
        _mm256_add_ps(
            _mm256_shuffle_ps::<0b10_00_10_00>(t01, t23),
            _mm256_shuffle_ps::<0b11_01_11_01>(t01, t23),
        )
    }

    /// Eight of the cache's values from value `i` on as `f32` (exactly): `f16` values, or
    /// `q8_0` quants times their scale (`Q8`; `i` a multiple of 8, so the eight share a scale).
    ///
    /// # Safety
    /// Values `i..i + 8` are inside `k`, which is `q8_0` exactly when `Q8`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn load8<const Q8: bool>(k: &KvRun<'_>, i: usize) -> __m256 {
        // SAFETY: by the caller's promise; `f16` is a transparent `u16`.
        unsafe {
            match (Q8, k) {
                (true, KvRun::Q8 { q, d }) => {
                    let x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                        q.as_ptr().add(i).cast(),
                    )));
                    _mm256_mul_ps(x, _mm256_broadcast_ss(&*d.as_ptr().add(i / Q8_COLUMNS)))
                }
                (false, KvRun::F16(v)) => {
                    _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(i).cast()))
                }
                _ => std::hint::unreachable_unchecked(),
            }
        }
    }

    /// [`scores`](super::scores) of the `G` heads in `q` against the cache's keys `k` (`q8_0`
    /// when `Q8`, else `f16`): four keys at a time, each converted once for the `G` heads, its
    /// `4 · G` sums reduced eight at a time by [`tree8`] (heads in order, four keys each); the
    /// last keys one by one.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `k` is `q8_0` exactly when `Q8`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn scores_kv<const G: usize, const Q8: bool>(
        q: &[f32],
        k: KvRun<'_>,
        hd: usize,
        scale: f32,
        sc: &mut [f32],
        stride: usize,
        off: usize,
    ) {
        let here = k.len() / hd;
        assert!(hd.is_multiple_of(8) && q.len() == G * hd && k.len() == here * hd);
        assert!(!Q8 || hd.is_multiple_of(Q8_COLUMNS));
        assert!((G - 1) * stride + off + here <= sc.len());
        let qp = q.as_ptr();
        let scale = _mm256_set1_ps(scale);
        let mut p = 0;
        while p + 4 <= here {
            let mut acc = [[_mm256_setzero_ps(); 4]; G];
            let mut c = 0;
            while c < hd {
                for j in 0..4 {
                    // SAFETY: `(p + j) · hd + c + 8 ≤ here · hd = k.len()`, and the caller
                    // promised the type.
                    let kv = unsafe { load8::<Q8>(&k, (p + j) * hd + c) };
                    for (h, acc) in acc.iter_mut().enumerate() {
                        // SAFETY: `h · hd + c + 8 ≤ G · hd = q.len()`.
                        let qv = unsafe { _mm256_loadu_ps(qp.add(h * hd + c)) };
                        acc[j] = _mm256_fmadd_ps(qv, kv, acc[j]);
                    }
                }
                c += 8;
            }
            // heads two by two: lanes 0..4 hold the first head's four keys, 4..8 the second's
            let mut h = 0;
            while h < G {
                let second = if h + 1 < G {
                    acc[h + 1]
                } else {
                    [_mm256_setzero_ps(); 4]
                };
                let (a, b) = (acc[h], second);
                let r = _mm256_mul_ps(
                    tree8([a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]),
                    scale,
                );
                // SAFETY: `h · stride + off + p + 4 ≤ (G − 1) · stride + off + here ≤ sc.len()`,
                // and the same for `h + 1 < G`.
                unsafe {
                    _mm_storeu_ps(
                        sc.as_mut_ptr().add(h * stride + off + p),
                        _mm256_castps256_ps128(r),
                    );
                    if h + 1 < G {
                        _mm_storeu_ps(
                            sc.as_mut_ptr().add((h + 1) * stride + off + p),
                            _mm256_extractf128_ps::<1>(r),
                        );
                    }
                }
                h += 2;
            }
            p += 4;
        }
        for p in p..here {
            for (h, qh) in q.chunks_exact(hd).enumerate() {
                sc[h * stride + off + p] = super::dot_kv(qh, &k, p * hd) * _mm256_cvtss_f32(scale);
            }
        }
    }

    /// `o = fma(w[p], v_p, o)` for the positions `p` in order (`v` holds `w.len()` rows of
    /// `o.len()` values, `o.len() % 32 == 0`), 32 outputs at a time in registers.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn accumulate(w: &[f32], v: &[f32], o: &mut [f32]) {
        let hd = o.len();
        assert!(hd.is_multiple_of(32) && v.len() == w.len() * hd);
        let vp = v.as_ptr();
        let op = o.as_mut_ptr();
        let mut c = 0;
        while c < hd {
            // SAFETY: `c + 32 ≤ hd = o.len()`.
            let mut acc: [__m256; 4] =
                std::array::from_fn(|j| unsafe { _mm256_loadu_ps(op.add(c + 8 * j)) });
            for (p, &wp) in w.iter().enumerate() {
                let wb = _mm256_set1_ps(wp);
                for (j, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: `p · hd + c + 8j + 8 ≤ w.len() · hd = v.len()`.
                    let x = unsafe { _mm256_loadu_ps(vp.add(p * hd + c + 8 * j)) };
                    *acc = _mm256_fmadd_ps(wb, x, *acc);
                }
            }
            for (j, acc) in acc.iter().enumerate() {
                // SAFETY: as for the loads.
                unsafe { _mm256_storeu_ps(op.add(c + 8 * j), *acc) };
            }
            c += 32;
        }
    }

    /// [`accumulate`] reading the cache's values (`q8_0` when `Q8`, else `f16`), for the `G`
    /// heads `o` (head `h`'s weights at `w[h · stride + off..][..here]`; `v_p`: the `hd` values
    /// from value `p · vs` on), `8 · J` columns at a time, each value converted in registers
    /// once for the `G` heads.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `v` is `q8_0` exactly when `Q8`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn accumulate_kv<const G: usize, const J: usize, const Q8: bool>(
        w: &[f32],
        stride: usize,
        off: usize,
        here: usize,
        v: KvRun<'_>,
        vs: usize,
        hd: usize,
        o: &mut [f32],
    ) {
        assert!(hd.is_multiple_of(8 * J) && vs >= hd);
        assert!(!Q8 || (vs.is_multiple_of(Q8_COLUMNS) && hd.is_multiple_of(Q8_COLUMNS)));
        assert!(G * hd <= o.len() && (G - 1) * stride + off + here <= w.len());
        assert!(here == 0 || (here - 1) * vs + hd <= v.len());
        let op = o.as_mut_ptr();
        let wp = w.as_ptr();
        let mut c = 0;
        while c < hd {
            // SAFETY (the loads): `h · hd + c + 8J ≤ G · hd ≤ o.len()`.
            let mut acc: [[__m256; J]; G] = std::array::from_fn(|h| {
                std::array::from_fn(|j| unsafe { _mm256_loadu_ps(op.add(h * hd + c + 8 * j)) })
            });
            for p in 0..here {
                // SAFETY: `p · vs + c + 8J ≤ (here − 1) · vs + hd ≤ v.len()`, and the caller
                // promised the type.
                let x: [__m256; J] =
                    std::array::from_fn(|j| unsafe { load8::<Q8>(&v, p * vs + c + 8 * j) });
                for (h, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: `h · stride + off + p < (G − 1) · stride + off + here ≤ w.len()`.
                    let wb = unsafe { _mm256_broadcast_ss(&*wp.add(h * stride + off + p)) };
                    for j in 0..J {
                        acc[j] = _mm256_fmadd_ps(wb, x[j], acc[j]);
                    }
                }
            }
            for (h, acc) in acc.iter().enumerate() {
                for (j, a) in acc.iter().enumerate() {
                    // SAFETY: as for the loads.
                    unsafe { _mm256_storeu_ps(op.add(h * hd + c + 8 * j), *a) };
                }
            }
            c += 8 * J;
        }
    }
}

/// Asks the CPU to bring `x` into the cache ahead of its use (a hint; no effect on results).
/// For a cache block whose values do not follow the previous block's in memory (a sequence's
/// blocks in different places of the pool): a run of one block is too short for the hardware
/// prefetcher to follow.
#[inline]
pub fn prefetch<T>(x: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = x.as_ptr().cast::<i8>();
        let bytes = std::mem::size_of_val(x);
        let mut o = 0;
        while o < bytes {
            // SAFETY: `o < bytes`, so the address is inside `x`; a prefetch reads nothing
            // architecturally and cannot fault.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(o)) };
            o += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values with a wide spread of magnitudes and both signs.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let m = ((x >> 40) as f32 / (1u64 << 24) as f32) - 0.5;
                let e = ((x >> 8) % 9) as i32 - 4;
                m * 2f32.powi(e)
            })
            .collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn avx2_gives_the_scalar_bits() {
        for hd in [8, 24, 32, 40, 64, 128] {
            for rep in [1, 3, 6] {
                for here in 1..=16 {
                    let q = values(rep * hd, (hd * 100 + rep * 10 + here) as u64);
                    let k = values(here * hd, (hd * 7 + here) as u64);
                    let (stride, off) = (here + 5, 3);
                    let mut a = vec![0f32; rep * stride];
                    let mut b = a.clone();
                    scores(Level::Scalar, &q, &k, hd, 0.125, &mut a, stride, off);
                    scores(Level::Avx2, &q, &k, hd, 0.125, &mut b, stride, off);
                    assert_eq!(
                        a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "scores hd {hd} rep {rep} here {here}"
                    );
                    let w = values(rep * stride, here as u64 + 99);
                    let mut oa = values(rep * hd, 5);
                    let mut ob = oa.clone();
                    accumulate(Level::Scalar, &w, stride, off, &k, hd, &mut oa);
                    accumulate(Level::Avx2, &w, stride, off, &k, hd, &mut ob);
                    assert_eq!(
                        oa.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        ob.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "accumulate hd {hd} rep {rep} here {here}"
                    );
                    // from `f16` values (here `k` rounded), all columns or the last 16 of
                    // each position: the same bits as from their `f32` conversions
                    let kh: Vec<half::f16> = k.iter().map(|&x| half::f16::from_f32(x)).collect();
                    let kf: Vec<f32> = kh.iter().map(|x| x.to_f32()).collect();
                    let mut want = values(rep * hd, 5);
                    accumulate(Level::Scalar, &w, stride, off, &kf, hd, &mut want);
                    let width = if hd % 16 == 0 { 16 } else { hd };
                    let cols = |o: &[f32]| -> Vec<u32> {
                        o.chunks_exact(hd)
                            .flat_map(|o| o[hd - width..].iter().map(|v| v.to_bits()))
                            .collect()
                    };
                    for level in [Level::Scalar, Level::Avx2] {
                        let mut all = values(rep * hd, 5);
                        accumulate_kv(
                            level,
                            &w,
                            stride,
                            off,
                            KvRun::F16(&kh),
                            hd,
                            here,
                            hd,
                            &mut all,
                        );
                        assert_eq!(bits(&want), bits(&all), "f16 hd {hd} rep {rep} here {here}");
                        let mut part: Vec<f32> = values(rep * hd, 5)
                            .chunks_exact(hd)
                            .flat_map(|o| o[hd - width..].to_vec())
                            .collect();
                        let v = &kh[hd - width..];
                        accumulate_kv(
                            level,
                            &w,
                            stride,
                            off,
                            KvRun::F16(v),
                            hd,
                            here,
                            width,
                            &mut part,
                        );
                        assert_eq!(cols(&want), bits(&part), "f16 columns hd {hd} here {here}");
                    }
                }
            }
        }
    }

    #[test]
    fn scores_from_f16_keys_give_the_bits_of_converted_keys() {
        for hd in [8, 24, 64, 72, 256] {
            for rep in 1..=7 {
                for here in [1, 3, 4, 5, 8, 15, 16, 17, 40] {
                    let q = values(rep * hd, (hd * 31 + rep * 7 + here) as u64);
                    let kh: Vec<half::f16> = values(here * hd, (hd + here * 3) as u64)
                        .iter()
                        .map(|&x| half::f16::from_f32(x))
                        .collect();
                    let kf: Vec<f32> = kh.iter().map(|x| x.to_f32()).collect();
                    let (stride, off) = (here + 3, 2);
                    let mut want = vec![0f32; rep * stride];
                    scores(Level::Scalar, &q, &kf, hd, 0.125, &mut want, stride, off);
                    for level in [Level::Scalar, Level::Avx2] {
                        let mut got = vec![0f32; rep * stride];
                        scores_kv(level, &q, KvRun::F16(&kh), hd, 0.125, &mut got, stride, off);
                        assert_eq!(
                            bits(&want),
                            bits(&got),
                            "{level:?} hd {hd} rep {rep} here {here}"
                        );
                    }
                }
            }
        }
    }

    /// `x` quantised as a `q8_0` cache holds it: its quants, scales and exact values.
    fn q8(x: &[f32]) -> (Vec<i8>, Vec<f32>, Vec<f32>) {
        let mut q = vec![0i8; x.len()];
        let d: Vec<f32> = x
            .chunks_exact(Q8_COLUMNS)
            .zip(q.chunks_exact_mut(Q8_COLUMNS))
            .map(|(x, q)| crate::kv::quantize_q8_0(x, q))
            .collect();
        let f = q
            .iter()
            .enumerate()
            .map(|(i, &q)| f32::from(q) * d[i / Q8_COLUMNS])
            .collect();
        (q, d, f)
    }

    #[test]
    fn q8_0_keys_and_values_give_the_bits_of_their_values() {
        for hd in [32, 64, 96, 128, 256] {
            for rep in 1..=7 {
                for here in [1, 3, 4, 5, 8, 15, 16, 17, 33] {
                    let q = values(rep * hd, (hd * 13 + rep * 5 + here) as u64);
                    let (kq, kd, kf) = q8(&values(here * hd, (hd + here * 11) as u64));
                    let k = KvRun::Q8 { q: &kq, d: &kd };
                    let (stride, off) = (here + 3, 2);
                    let mut want = vec![0f32; rep * stride];
                    scores(Level::Scalar, &q, &kf, hd, 0.125, &mut want, stride, off);
                    let w = values(rep * stride, here as u64 + 7);
                    let mut want_out = values(rep * hd, 3);
                    accumulate(Level::Scalar, &w, stride, off, &kf, hd, &mut want_out);
                    for level in Level::ALL.into_iter().filter(|l| l.supported()) {
                        let mut got = vec![0f32; rep * stride];
                        scores_kv(level, &q, k, hd, 0.125, &mut got, stride, off);
                        assert_eq!(
                            bits(&want),
                            bits(&got),
                            "{level:?} scores hd {hd} rep {rep} here {here}"
                        );
                        let mut out = values(rep * hd, 3);
                        accumulate_kv(level, &w, stride, off, k, hd, here, hd, &mut out);
                        assert_eq!(
                            bits(&want_out),
                            bits(&out),
                            "{level:?} values hd {hd} rep {rep} here {here}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn q8_0_quantisation_follows_ggml() {
        // m = 2.54: d = f16(0.02), q = round_ties_even(x · 127 / m)
        let mut x = [0f32; Q8_COLUMNS];
        x[0] = 2.54;
        x[1] = -1.27;
        x[2] = 0.01; // 0.5 quants: ties to even, 0
        x[3] = 0.03; // 1.5: 2
        x[4] = -0.05; // -2.5: -2
        let mut q = [0i8; Q8_COLUMNS];
        let d = crate::kv::quantize_q8_0(&x, &mut q);
        assert_eq!(d, half::f16::from_f32(2.54 / 127.0).to_f32());
        assert_eq!(&q[..5], &[127, -64, 0, 2, -2]);
        let zero = crate::kv::quantize_q8_0(&[0.0; Q8_COLUMNS], &mut q);
        assert_eq!((zero, q), (0.0, [0i8; Q8_COLUMNS]));
    }

    #[test]
    fn scores_follow_the_lane_tree() {
        // Written out for one key: lanes l = i % 8, fused multiply-adds, the fixed tree.
        let q = values(16, 1);
        let k = values(16, 2);
        let mut acc = [0f32; 8];
        for i in 0..16 {
            acc[i % 8] = q[i].mul_add(k[i], acc[i % 8]);
        }
        let want = (((acc[0] + acc[4]) + (acc[2] + acc[6]))
            + ((acc[1] + acc[5]) + (acc[3] + acc[7])))
            * 0.5;
        for level in [Level::Scalar, Level::Avx2] {
            let mut s = [0f32; 1];
            scores(level, &q, &k, 16, 0.5, &mut s, 1, 0);
            assert_eq!(s[0].to_bits(), want.to_bits());
        }
    }
}
