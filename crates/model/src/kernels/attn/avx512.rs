//! The AVX-512 (F/BW/DQ/VL, with FMA and F16C) attention kernels: the AVX2 kernels' operations
//! sixteen lanes to a register, so the same bits (see the parent module for the semantics).
//!
//! * **Scores** hold two keys in a register (lanes `0..8` and `8..16`, each key's eight lane
//!   sums in the order of the scalar `dot`), eight keys of up to four query heads at a time, and
//!   evaluate sixteen lane trees at once ([`tree16`]). The last keys of a run (fewer than eight)
//!   go to the AVX2 kernel.
//! * **Outputs** keep sixteen columns to a register: every output element is still its own
//!   chain of fused multiply-adds over the positions in order.

use super::avx2;
use crate::kv::{KvRun, Q8_COLUMNS};
use std::arch::x86_64::*;

/// Keys or values as a kernel reads them, each converted to `f32` exactly.
#[derive(Clone, Copy)]
pub(super) enum Src<'a> {
    /// `f32` values (a block already converted).
    F32(&'a [f32]),
    /// The cache's values in place.
    Kv(KvRun<'a>),
}

/// [`Src::F32`] as the kernels' `K` parameter.
pub(super) const F32: u8 = 0;
/// [`KvRun::F16`] as the kernels' `K` parameter.
pub(super) const F16: u8 = 1;
/// [`KvRun::Q8`] as the kernels' `K` parameter.
pub(super) const Q8: u8 = 2;

impl Src<'_> {
    /// Values held.
    fn len(&self) -> usize {
        match self {
            Src::F32(v) => v.len(),
            Src::Kv(k) => k.len(),
        }
    }

    /// The `K` code of this source.
    pub(super) fn kind(&self) -> u8 {
        match self {
            Src::F32(_) => F32,
            Src::Kv(KvRun::F16(_)) => F16,
            Src::Kv(KvRun::Q8 { .. }) => Q8,
        }
    }
}

/// Sixteen values from value `i` on, as `f32` (exactly); for `q8_0` values `i` is a multiple of
/// 16, so the sixteen share a scale.
///
/// # Safety
/// The CPU has AVX-512 F; values `i..i + 16` are inside `s`, whose kind is `K`.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn load16<const K: u8>(s: &Src<'_>, i: usize) -> __m512 {
    // SAFETY: by the caller's promise; `f16` is a transparent `u16`.
    unsafe {
        match (K, s) {
            (F32, Src::F32(v)) => _mm512_loadu_ps(v.as_ptr().add(i)),
            (F16, Src::Kv(KvRun::F16(v))) => {
                _mm512_cvtph_ps(_mm256_loadu_si256(v.as_ptr().add(i).cast()))
            }
            (Q8, Src::Kv(KvRun::Q8 { q, d })) => {
                let x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                    q.as_ptr().add(i).cast(),
                )));
                _mm512_mul_ps(x, _mm512_set1_ps(*d.as_ptr().add(i / Q8_COLUMNS)))
            }
            _ => std::hint::unreachable_unchecked(),
        }
    }
}

/// Eight values from `i0` on in lanes `0..8` and eight from `i1` on in lanes `8..16`, as `f32`
/// (exactly); for `q8_0` values `i0` and `i1` are multiples of 8, so each eight share a scale.
///
/// # Safety
/// The CPU has AVX-512 F/DQ; values `i0..i0 + 8` and `i1..i1 + 8` are inside `s`, whose kind
/// is `K`.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn pair<const K: u8>(s: &Src<'_>, i0: usize, i1: usize) -> __m512 {
    // SAFETY: by the caller's promise; `f16` is a transparent `u16`.
    unsafe {
        match (K, s) {
            (F32, Src::F32(v)) => _mm512_insertf32x8::<1>(
                _mm512_castps256_ps512(_mm256_loadu_ps(v.as_ptr().add(i0))),
                _mm256_loadu_ps(v.as_ptr().add(i1)),
            ),
            (F16, Src::Kv(KvRun::F16(v))) => _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(
                _mm256_castsi128_si256(_mm_loadu_si128(v.as_ptr().add(i0).cast())),
                _mm_loadu_si128(v.as_ptr().add(i1).cast()),
            )),
            (Q8, Src::Kv(KvRun::Q8 { q, d })) => {
                let x = _mm_unpacklo_epi64(
                    _mm_loadl_epi64(q.as_ptr().add(i0).cast()),
                    _mm_loadl_epi64(q.as_ptr().add(i1).cast()),
                );
                let x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(x));
                let d = _mm512_mask_mov_ps(
                    _mm512_set1_ps(*d.as_ptr().add(i0 / Q8_COLUMNS)),
                    0xFF00,
                    _mm512_set1_ps(*d.as_ptr().add(i1 / Q8_COLUMNS)),
                );
                _mm512_mul_ps(x, d)
            }
            _ => std::hint::unreachable_unchecked(),
        }
    }
}

/// Sixteen dot products' lane trees at once. Accumulator `m` holds the eight lane sums of dot
/// product `2m` in lanes `0..8` and of `2m + 1` in lanes `8..16`; lane `i` of the result is dot
/// product `i`, summed `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))` (each add one of the
/// scalar tree's).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
fn tree16(a: &[__m512; 8]) -> __m512 {
    // Level 1, (l, l + 4): the 128-bit quarters [d, d', e, e'] of accumulators 2i (dot products
    // d, e) and 2i + 1 become [d + d', e + e', ...]: dot products 4i..4i + 4, four sums each.
    let l: [__m512; 4] = crate::kernels::array(|i| {
        let (x, y) = (a[2 * i], a[2 * i + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
        )
    });
    // Level 2, (u0 + u2) and (u1 + u3), within each quarter k: dot products 8j + k and
    // 8j + 4 + k, two sums each.
    let m = |u: __m512, v: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_ps::<0b01_00_01_00>(u, v),
            _mm512_shuffle_ps::<0b11_10_11_10>(u, v),
        )
    };
    let (m0, m1) = (m(l[0], l[1]), m(l[2], l[3]));
    // Level 3, v0 + v1: quarter k holds dot products k, 4 + k, 8 + k, 12 + k.
    let r = _mm512_add_ps(
        _mm512_shuffle_ps::<0b10_00_10_00>(m0, m1),
        _mm512_shuffle_ps::<0b11_01_11_01>(m0, m1),
    );
    // lane i ← lane 4 · (i % 4) + i / 4
    let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_ps(idx, r)
}

/// [`scores`](super::scores) of the `G` heads in `q` (`G ≤ 4`) against the keys `k` (kind
/// `K`): eight keys at a time, two to a register and each converted once for the `G` heads,
/// their `8 · G` sums reduced sixteen at a time by [`tree16`] (two heads of eight keys each);
/// the last keys by the AVX2 kernel.
///
/// # Safety
/// The CPU has AVX-512 F/BW/DQ/VL, FMA and F16C; `k`'s kind is `K`.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn scores<const G: usize, const K: u8>(
    q: &[f32],
    k: Src<'_>,
    hd: usize,
    scale: f32,
    sc: &mut [f32],
    stride: usize,
    off: usize,
) {
    let here = k.len() / hd;
    assert!((1..=4).contains(&G) && hd.is_multiple_of(8));
    assert!(q.len() == G * hd && k.len() == here * hd);
    assert!(K != Q8 || hd.is_multiple_of(Q8_COLUMNS));
    assert!((G - 1) * stride + off + here <= sc.len());
    let qp = q.as_ptr();
    let scale = _mm512_set1_ps(scale);
    let mut p = 0;
    while p + 8 <= here {
        let mut acc = [_mm512_setzero_ps(); 16];
        let mut c = 0;
        while c < hd {
            // SAFETY: `(p + 8) · hd ≤ here · hd = k.len()` and `c + 8 ≤ hd`; the caller
            // promised the kind.
            let kv: [__m512; 4] = crate::kernels::array(|j| unsafe {
                pair::<K>(&k, (p + 2 * j) * hd + c, (p + 2 * j + 1) * hd + c)
            });
            for h in 0..G {
                // SAFETY: `h · hd + c + 8 ≤ G · hd = q.len()`.
                let qv = _mm512_broadcast_f32x8(unsafe { _mm256_loadu_ps(qp.add(h * hd + c)) });
                for (j, kv) in kv.iter().enumerate() {
                    acc[4 * h + j] = _mm512_fmadd_ps(qv, *kv, acc[4 * h + j]);
                }
            }
            c += 8;
        }
        // heads two by two: lanes 0..8 hold head h's eight keys, 8..16 head h + 1's
        let mut h = 0;
        while h < G {
            let t: &[__m512; 8] = acc[4 * h..4 * h + 8].try_into().expect("eight");
            let r = _mm512_mul_ps(tree16(t), scale);
            // SAFETY: `h · stride + off + p + 8 ≤ (G − 1) · stride + off + here ≤ sc.len()`,
            // and the same for head `h + 1 < G`.
            unsafe {
                _mm256_storeu_ps(
                    sc.as_mut_ptr().add(h * stride + off + p),
                    _mm512_castps512_ps256(r),
                );
                if h + 1 < G {
                    _mm256_storeu_ps(
                        sc.as_mut_ptr().add((h + 1) * stride + off + p),
                        _mm512_extractf32x8_ps::<1>(r),
                    );
                }
            }
            h += 2;
        }
        p += 8;
    }
    if p < here {
        let scale = _mm512_cvtss_f32(scale);
        match k {
            Src::F32(v) => {
                for p in p..here {
                    for (h, qh) in q.chunks_exact(hd).enumerate() {
                        sc[h * stride + off + p] = super::dot(qh, &v[p * hd..(p + 1) * hd]) * scale;
                    }
                }
            }
            Src::Kv(kv) => {
                let rest = kv.positions(p, here, hd);
                // SAFETY: the CPU has AVX2, FMA and F16C (it has AVX-512); the kind is `K`.
                unsafe {
                    if K == Q8 {
                        avx2::scores_kv::<G, true>(q, rest, hd, scale, sc, stride, off + p)
                    } else {
                        avx2::scores_kv::<G, false>(q, rest, hd, scale, sc, stride, off + p)
                    }
                }
            }
        }
    }
}

/// [`accumulate_kv`](super::accumulate_kv) (and [`accumulate`](super::accumulate)) over values
/// of kind `K` for the `G` heads `o` (head `h`'s weights at `w[h · stride + off..][..here]`;
/// `v_p`: the `hd` values from value `p · vs` on), `16 · J` columns at a time, each value
/// converted once for the `G` heads.
///
/// # Safety
/// The CPU has AVX-512 F/BW/DQ/VL, FMA and F16C; `v`'s kind is `K`.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn accumulate<const G: usize, const J: usize, const K: u8>(
    w: &[f32],
    stride: usize,
    off: usize,
    here: usize,
    v: Src<'_>,
    vs: usize,
    hd: usize,
    o: &mut [f32],
) {
    assert!(hd.is_multiple_of(16 * J) && vs >= hd);
    assert!(K != Q8 || (vs.is_multiple_of(Q8_COLUMNS) && hd.is_multiple_of(Q8_COLUMNS)));
    assert!(G * hd <= o.len() && (G - 1) * stride + off + here <= w.len());
    assert!(here == 0 || (here - 1) * vs + hd <= v.len());
    let op = o.as_mut_ptr();
    let wp = w.as_ptr();
    let mut c = 0;
    while c < hd {
        // SAFETY (the loads): `h · hd + c + 16J ≤ G · hd ≤ o.len()`.
        let mut acc: [[__m512; J]; G] = crate::kernels::array(|h| {
            crate::kernels::array(|j| unsafe { _mm512_loadu_ps(op.add(h * hd + c + 16 * j)) })
        });
        for p in 0..here {
            // SAFETY: `p · vs + c + 16J ≤ (here − 1) · vs + hd ≤ v.len()`, and the caller
            // promised the kind.
            let x: [__m512; J] =
                crate::kernels::array(|j| unsafe { load16::<K>(&v, p * vs + c + 16 * j) });
            for (h, acc) in acc.iter_mut().enumerate() {
                // SAFETY: `h · stride + off + p < (G − 1) · stride + off + here ≤ w.len()`.
                let wb = _mm512_set1_ps(unsafe { *wp.add(h * stride + off + p) });
                for j in 0..J {
                    acc[j] = _mm512_fmadd_ps(wb, x[j], acc[j]);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            for (j, a) in acc.iter().enumerate() {
                // SAFETY: as for the loads.
                unsafe { _mm512_storeu_ps(op.add(h * hd + c + 16 * j), *a) };
            }
        }
        c += 16 * J;
    }
}
