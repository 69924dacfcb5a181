//! The AVX2 + FMA + F16C attention kernels (see the parent module for their exact semantics).

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
    let s: [__m256; 4] = crate::kernels::array(|i| {
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
            (false, KvRun::F16(v)) => _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(i).cast())),
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
    // the run's memory, and its bytes per key (`q8_0`: the quants; their scales are an eighth
    // as many bytes, left to the hardware prefetcher)
    let (run, kb) = (k.bytes(), if Q8 { hd } else { 2 * hd });
    let mut p = 0;
    while p + 4 <= here {
        super::prefetch_ahead(run, p * kb, 4 * kb, super::KEYS_AHEAD);
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
            crate::kernels::array(|j| unsafe { _mm256_loadu_ps(op.add(c + 8 * j)) });
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
        let mut acc: [[__m256; J]; G] = crate::kernels::array(|h| {
            crate::kernels::array(|j| unsafe { _mm256_loadu_ps(op.add(h * hd + c + 8 * j)) })
        });
        for p in 0..here {
            // SAFETY: `p · vs + c + 8J ≤ (here − 1) · vs + hd ≤ v.len()`, and the caller
            // promised the type.
            let x: [__m256; J] =
                crate::kernels::array(|j| unsafe { load8::<Q8>(&v, p * vs + c + 8 * j) });
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
