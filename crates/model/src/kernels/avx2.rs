//! AVX2 + FMA + F16C kernels (x86-64), selected at run time.
//!
//! Every function here computes exactly the operations of its twin in [`super::scalar`], many
//! lanes at once; callers must hold an effective level
//! ([`Level::effective`](super::Level::effective)) of [`Level::Avx2`](super::Level::Avx2) or
//! above (the CPU has AVX2, FMA and F16C) before calling any of them. On other architectures no
//! level above [`Level::Scalar`](super::Level::Scalar) is effective, and the functions forward
//! to the scalar code.

#[cfg(target_arch = "x86_64")]
pub(super) use imp::*;

#[cfg(not(target_arch = "x86_64"))]
pub(super) use fallback::*;

#[cfg(not(target_arch = "x86_64"))]
mod fallback {
    use super::super::{scalar, Acts, Chunk, QMatrix, BLOCK, QK_K};

    /// Forwards to the scalar code.
    ///
    /// # Safety
    /// None needed; `unsafe` only mirrors the x86-64 signature.
    pub(in super::super) unsafe fn amax(x: &[f32; BLOCK]) -> f32 {
        scalar::amax(x)
    }

    /// Forwards to the scalar code.
    ///
    /// # Safety
    /// None needed; `unsafe` only mirrors the x86-64 signature.
    pub(in super::super) unsafe fn quantize_block(
        x: &[f32; BLOCK],
        id: f32,
        q: &mut [u8; BLOCK],
    ) -> i32 {
        scalar::quantize_block(x, id, q)
    }

    /// Forwards to the scalar code.
    ///
    /// # Safety
    /// None needed; `unsafe` only mirrors the x86-64 signature.
    pub(in super::super) unsafe fn q8_k_block(
        xs: &[f32; QK_K],
        q: &mut [Chunk],
        bs: &mut [i16; 16],
    ) -> Option<f32> {
        scalar::q8_k_block(xs, q, bs)
    }

    /// Forwards to the scalar code.
    ///
    /// # Safety
    /// None needed; `unsafe` only mirrors the x86-64 signature.
    pub(in super::super) unsafe fn dot_tile(
        w: &QMatrix,
        r0: usize,
        nr: usize,
        a: &Acts<'_>,
        b0: usize,
        n: usize,
    ) -> [[f32; 4]; 4] {
        scalar::dot_tile(w, r0, nr, a, b0, n)
    }
}

/// The kernels' code, once for each set of target features it is compiled with (the modules
/// `imp` and `vl` below).
#[cfg(target_arch = "x86_64")]
macro_rules! avx2_kernels {
    ($feat:literal) => {
        use std::arch::x86_64::*;

        use super::super::{Acts, Chunk, QMatrix, BLOCK, QK_K};

        /// `max |x_i|` over one block (see [`super::super::scalar::amax`]).
        #[target_feature(enable = $feat)]
        pub(in super::super) fn amax(x: &[f32; BLOCK]) -> f32 {
            let p = x.as_ptr();
            let sign = _mm256_set1_ps(-0.0);
            // SAFETY: `x` has 32 values: the loads read `x[0..8]`, …, `x[24..32]`.
            let v = unsafe {
                [
                    _mm256_loadu_ps(p),
                    _mm256_loadu_ps(p.add(8)),
                    _mm256_loadu_ps(p.add(16)),
                    _mm256_loadu_ps(p.add(24)),
                ]
            };
            // NaN lanes count as zero, as in the scalar fold (a NaN never compares greater).
            let a = v.map(|v| {
                let a = _mm256_andnot_ps(sign, v);
                _mm256_and_ps(a, _mm256_cmp_ps::<_CMP_ORD_Q>(a, a))
            });
            let m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
            let h = _mm_max_ps(_mm256_extractf128_ps::<1>(m), _mm256_castps256_ps128(m));
            let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            let h = _mm_max_ss(h, _mm_movehdup_ps(h));
            _mm_cvtss_f32(h)
        }

        /// Quantises one block (see [`super::super::scalar::quantize_block`]).
        #[target_feature(enable = $feat)]
        pub(in super::super) fn quantize_block(
            x: &[f32; BLOCK],
            id: f32,
            q: &mut [u8; BLOCK],
        ) -> i32 {
            let p = x.as_ptr();
            let vid = _mm256_set1_ps(id);
            let lo = _mm256_set1_ps(-127.0);
            let hi = _mm256_set1_ps(127.0);
            // SAFETY: `x` has 32 values: the loads read `x[0..8]`, …, `x[24..32]`.
            let v = unsafe {
                [
                    _mm256_loadu_ps(p),
                    _mm256_loadu_ps(p.add(8)),
                    _mm256_loadu_ps(p.add(16)),
                    _mm256_loadu_ps(p.add(24)),
                ]
            };
            let i = v.map(|v| {
                let v = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v, vid), lo), hi);
                let v = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
                _mm256_cvtps_epi32(v)
            });
            // Exact integer sum of the 32 quants (|q| ≤ 127, no overflow).
            let s = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
            let s = _mm_add_epi32(_mm256_extracti128_si256::<1>(s), _mm256_castsi256_si128(s));
            let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
            let sum = _mm_cvtsi128_si32(s);
            // Values are in −127..=127, so the saturating packs are exact; the permutation undoes
            // the per-128-bit-lane interleaving of the packs.
            let a = _mm256_packs_epi32(i[0], i[1]);
            let b = _mm256_packs_epi32(i[2], i[3]);
            let c = _mm256_packs_epi16(a, b);
            let c = _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            // SAFETY: `q` is 32 writable bytes.
            unsafe { _mm256_storeu_si256(q.as_mut_ptr().cast(), c) };
            sum
        }

        /// Quantises one Q8_K super-block (see [`super::super::scalar::q8_k_block`]).
        #[target_feature(enable = $feat)]
        pub(in super::super) fn q8_k_block(
            xs: &[f32; QK_K],
            q: &mut [Chunk],
            bs: &mut [i16; 16],
        ) -> Option<f32> {
            assert!(q.len() == QK_K / 32);
            let p = xs.as_ptr();
            let sign = _mm256_set1_ps(-0.0);
            // SAFETY (every load): `xs` has 256 values and `j < 32`.
            let ld = |j: usize| unsafe { _mm256_loadu_ps(p.add(8 * j)) };
            // the largest magnitude, NaN lanes counting as zero (a NaN never compares greater)
            let mut m = _mm256_setzero_ps();
            for j in 0..QK_K / 8 {
                let a = _mm256_andnot_ps(sign, ld(j));
                m = _mm256_max_ps(m, _mm256_and_ps(a, _mm256_cmp_ps::<_CMP_ORD_Q>(a, a)));
            }
            let h = _mm_max_ps(_mm256_extractf128_ps::<1>(m), _mm256_castps256_ps128(m));
            let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            let amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
            if amax == 0.0 {
                return None;
            }
            // the first value of that magnitude
            let va = _mm256_set1_ps(amax);
            let mut max = amax;
            for j in 0..QK_K / 8 {
                let a = _mm256_andnot_ps(sign, ld(j));
                let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(a, va));
                if hit != 0 {
                    max = xs[8 * j + hit.trailing_zeros() as usize];
                    break;
                }
            }
            let iscale = -127.0 / max;
            let vs = _mm256_set1_ps(iscale);
            let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
            for (c, chunk) in q.iter_mut().enumerate() {
                let i: [__m256i; 4] = crate::kernels::array(|k| {
                    let v = _mm256_mul_ps(vs, ld(4 * c + k));
                    // a NaN product becomes 0 (as `as i32` makes it), then the clamp and the
                    // rounding: clamping first gives the same integers (both are monotonic)
                    let v = _mm256_and_ps(v, _mm256_cmp_ps::<_CMP_ORD_Q>(v, v));
                    let v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
                    let v = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
                    _mm256_cvtps_epi32(v)
                });
                for g in 0..2 {
                    let s = _mm256_add_epi32(i[2 * g], i[2 * g + 1]);
                    let s =
                        _mm_add_epi32(_mm256_extracti128_si256::<1>(s), _mm256_castsi256_si128(s));
                    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
                    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
                    bs[2 * c + g] = _mm_cvtsi128_si32(s) as i16;
                }
                // values in −127..=127: the saturating packs are exact (see `quantize_block`)
                let a = _mm256_packs_epi32(i[0], i[1]);
                let b = _mm256_packs_epi32(i[2], i[3]);
                let v = _mm256_packs_epi16(a, b);
                let v = _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
                // SAFETY: a chunk is 32 writable bytes.
                unsafe { _mm256_storeu_si256(chunk.0.as_mut_ptr().cast(), v) };
            }
            Some(1.0 / iscale)
        }

        /// The dots of weight rows `r0..r0 + nr` with activation rows `b0..b0 + n` (`1 ≤ nr ≤ 4`,
        /// `1 ≤ n ≤ 4`, `b0 % 4 == 0`): `res[ri][bi]` (see [`super::super::scalar::dot_tile`]),
        /// by the tiles of `avx2k` (the banded formats never come here: see `band`).
        #[target_feature(enable = $feat)]
        pub(in super::super) fn dot_tile(
            w: &QMatrix,
            r0: usize,
            nr: usize,
            a: &Acts<'_>,
            b0: usize,
            n: usize,
        ) -> [[f32; 4]; 4] {
            super::super::avx2k::dot_tile(w, r0, nr, a, b0, n)
        }
    };
}

/// The kernels compiled for AVX2, FMA and F16C: the [`Level::Avx2`](super::Level::Avx2) code.
// Register tiles are indexed by row and activation (`acc[ri][bi]`); index loops read best.
#[allow(clippy::needless_range_loop)]
#[cfg(target_arch = "x86_64")]
mod imp {
    avx2_kernels!("avx2,fma,f16c");
}
