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

/// Returns `$f::<R, N> $args` for the tile shape `(R, N)` that `$shape` matches among those
/// listed; falls through when none does.
#[cfg(target_arch = "x86_64")]
macro_rules! tile_shapes {
    ($f:ident, $shape:expr, $args:tt; $(($r:literal, $n:literal)),*) => {
        match $shape {
            $(($r, $n) => return $f::<$r, $n> $args,)*
            _ => {}
        }
    };
}

/// The kernels' code, once for each set of target features it is compiled with (the modules
/// `imp` and `vl` below).
#[cfg(target_arch = "x86_64")]
macro_rules! avx2_kernels {
    ($feat:literal) => {
        use std::arch::x86_64::*;

        use super::super::{Acts, Chunk, MatFormat, QMatrix, BLOCK, QK_K};

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
        pub(in super::super) fn quantize_block(x: &[f32; BLOCK], id: f32, q: &mut [u8; BLOCK]) -> i32 {
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
                    let s = _mm_add_epi32(_mm256_extracti128_si256::<1>(s), _mm256_castsi256_si128(s));
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

        /// llama.cpp's `hsum_float_8` (see [`super::super::scalar::hsum8`]).
        #[target_feature(enable = $feat)]
        fn hsum8(x: __m256) -> f32 {
            let r = _mm_add_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
            let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
            let r = _mm_add_ss(r, _mm_movehdup_ps(r));
            _mm_cvtss_f32(r)
        }

        /// The dots of weight rows `r0..r0 + nr` with activation rows `b0..b0 + n` (`1 ≤ nr ≤ 4`,
        /// `1 ≤ n ≤ 4`, `b0 % 4 == 0`): `res[ri][bi]` (see [`super::super::scalar::dot_tile`]).
        /// Tiles of 4×1, 4×2, 2×n and 1×n run as one register tile; others row by row.
        #[target_feature(enable = $feat)]
        pub(in super::super) fn dot_tile(
            w: &QMatrix,
            r0: usize,
            nr: usize,
            a: &Acts<'_>,
            b0: usize,
            n: usize,
        ) -> [[f32; 4]; 4] {
            match w.format {
                MatFormat::Q4_1 => {
                    tile_shapes!(q4_1, (nr, n), (w, r0, a, b0); (1, 1), (1, 2), (1, 3), (1, 4), (4, 1), (4, 2), (2, 1), (2, 2), (2, 3), (2, 4))
                }
                _ => return super::super::avx2k::dot_tile(w, r0, nr, a, b0, n),
            }
            let mut res = [[0f32; 4]; 4];
            for (ri, res) in res.iter_mut().enumerate().take(nr.min(4)) {
                *res = dot_tile(w, r0 + ri, 1, a, b0, n)[0];
            }
            res
        }

        /// The operand rows of one tile: weight rows `r0..r0 + R`, activation rows `b0..b0 + N`,
        /// as slices whose lengths the kernels rely on (`nbp` scales, `qchunks` / `nb` chunks).
        struct Tile<'a, const R: usize, const N: usize> {
            wq: [&'a [Chunk]; R],
            wd: [&'a [u16]; R],
            aq: [&'a [Chunk]; N],
            ad: [&'a [f32]; N],
        }

        #[inline(always)]
        fn tile<'a, const R: usize, const N: usize>(
            w: &'a QMatrix,
            r0: usize,
            a: &'a Acts<'_>,
            b0: usize,
        ) -> Tile<'a, R, N> {
            Tile {
                wq: crate::kernels::array(|i| &w.qs[(r0 + i) * w.qchunks..(r0 + i + 1) * w.qchunks]),
                wd: crate::kernels::array(|i| &w.d[(r0 + i) * w.nbp..(r0 + i + 1) * w.nbp]),
                aq: crate::kernels::array(|i| &a.q[(b0 + i) * a.nb..(b0 + i + 1) * a.nb]),
                ad: crate::kernels::array(|i| &a.d[(b0 + i) * a.nbp..(b0 + i + 1) * a.nbp]),
            }
        }

        /// `sc[ri][bi][kk] = f32(d_w[ri][base + kk]) · d_a[bi][base + kk]` for the eight blocks from
        /// `base`.
        ///
        /// # Safety
        /// `base + 8 ≤ nbp`, the length of every `t.wd[ri]` and `t.ad[bi]`.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn scales<const R: usize, const N: usize>(
            t: &Tile<'_, R, N>,
            base: usize,
            sc: &mut [[[f32; 8]; N]; R],
        ) {
            // SAFETY: eight `f32`s from `base` are in `t.ad[bi]` (caller).
            let da: [__m256; N] =
                crate::kernels::array(|bi| unsafe { _mm256_loadu_ps(t.ad[bi].as_ptr().add(base)) });
            for ri in 0..R {
                // SAFETY: eight `u16`s from `base` are in `t.wd[ri]` (caller).
                let dw =
                    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(t.wd[ri].as_ptr().add(base).cast()) });
                for bi in 0..N {
                    // SAFETY: `sc[ri][bi]` has eight `f32`s.
                    unsafe { _mm256_storeu_ps(sc[ri][bi].as_mut_ptr(), _mm256_mul_ps(dw, da[bi])) };
                }
            }
        }

        /// Sums the register tile into `res[ri][bi]` (`hsum8`, plus `summ` lane `bi` for Q4_1).
        #[target_feature(enable = $feat)]
        #[inline]
        fn finish<const R: usize, const N: usize>(
            acc: &[[__m256; N]; R],
            summ: Option<&[__m128; R]>,
        ) -> [[f32; 4]; 4] {
            let mut res = [[0f32; 4]; 4];
            for ri in 0..R {
                let mut sm = [0f32; 4];
                if let Some(summ) = summ {
                    // SAFETY: `sm` has four `f32`s.
                    unsafe { _mm_storeu_ps(sm.as_mut_ptr(), summ[ri]) };
                }
                for bi in 0..N {
                    let h = hsum8(acc[ri][bi]);
                    res[ri][bi] = if summ.is_some() { h + sm[bi] } else { h };
                }
            }
            res
        }

        /// Q4_1 × Q8_1 for weight rows `r0..r0 + R` and activation rows `b0..b0 + N`.
        ///
        /// `maddubs` cannot saturate: the weight quants are in `0..=15` and the activation quants in
        /// `−127..=127`, so a pair sums to at most `2 · 15 · 127 = 3810` in magnitude.
        #[target_feature(enable = $feat)]
        fn q4_1<const R: usize, const N: usize>(
            w: &QMatrix,
            r0: usize,
            a: &Acts<'_>,
            b0: usize,
        ) -> [[f32; 4]; 4] {
            let nb = w.nb;
            let t = tile::<R, N>(w, r0, a, b0);
            let wm: [&[u16]; R] = crate::kernels::array(|i| &w.m[(r0 + i) * w.nbp..(r0 + i + 1) * w.nbp]);
            // `s[k · np4 + b0 + i]` for `i < 4`: `b0 % 4 == 0` and `np4 % 4 == 0`, so the four
            // lanes of block `k` lie in `s[k · np4 + b0..][..4]`, inside `s` (len `nb · np4`).
            assert!(
                b0.is_multiple_of(4)
                    && a.np4.is_multiple_of(4)
                    && b0 < a.np4
                    && a.s.len() == nb * a.np4
            );
            let s = &a.s[b0..];
            let mask = _mm256_set1_epi8(0x0F);
            let ones = _mm256_set1_epi16(1);
            let mut acc = [[_mm256_setzero_ps(); N]; R];
            let mut summ = [_mm_setzero_ps(); R];
            let mut sc = [[[0f32; 8]; N]; R];
            let mut mm = [[0f32; 8]; R];
            let mut base = 0;
            while base < nb {
                // SAFETY: `base < nb ≤ nbp` and `nbp % 8 == 0`, so `base + 8 ≤ nbp`.
                unsafe { scales(&t, base, &mut sc) };
                for ri in 0..R {
                    // SAFETY: as above, eight `u16`s from `base` are in `wm[ri]` (len `nbp`), and
                    // `mm[ri]` has eight `f32`s.
                    unsafe {
                        let m8 = _mm256_cvtph_ps(_mm_loadu_si128(wm[ri].as_ptr().add(base).cast()));
                        _mm256_storeu_ps(mm[ri].as_mut_ptr(), m8);
                    }
                }
                let kend = (nb - base).min(8);
                let mut kk = 0;
                while kk < kend {
                    let k = base + kk;
                    let pair = kk + 1 < kend;
                    // SAFETY: `k · np4 + 4 ≤ nb · np4 − b0 = s.len()` for block `k < nb`, and the
                    // same for block `k + 1` when `pair`.
                    let sv0 = unsafe { _mm_loadu_ps(s.as_ptr().add(k * a.np4)) };
                    // SAFETY: `k / 2 < ceil(nb / 2) = qchunks`, the length of each `t.wq[ri]`;
                    // chunks are 32-byte aligned.
                    let x: [__m256i; R] = crate::kernels::array(|ri| unsafe {
                        _mm256_load_si256(t.wq[ri].as_ptr().add(k / 2).cast())
                    });
                    for bi in 0..N {
                        // SAFETY: `k < nb`, the length of `t.aq[bi]`; chunks are aligned.
                        let av = unsafe { _mm256_load_si256(t.aq[bi].as_ptr().add(k).cast()) };
                        for ri in 0..R {
                            let wv = _mm256_and_si256(x[ri], mask);
                            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, av), ones);
                            acc[ri][bi] = _mm256_fmadd_ps(
                                _mm256_set1_ps(sc[ri][bi][kk]),
                                _mm256_cvtepi32_ps(p),
                                acc[ri][bi],
                            );
                        }
                    }
                    for ri in 0..R {
                        summ[ri] = _mm_fmadd_ps(_mm_set1_ps(mm[ri][kk]), sv0, summ[ri]);
                    }
                    if pair {
                        // SAFETY: as above, for block `k + 1 < nb`.
                        let sv1 = unsafe { _mm_loadu_ps(s.as_ptr().add((k + 1) * a.np4)) };
                        for bi in 0..N {
                            // SAFETY: `k + 1 < nb`, the length of `t.aq[bi]`; aligned.
                            let av = unsafe { _mm256_load_si256(t.aq[bi].as_ptr().add(k + 1).cast()) };
                            for ri in 0..R {
                                let wv = _mm256_and_si256(_mm256_srli_epi16::<4>(x[ri]), mask);
                                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, av), ones);
                                acc[ri][bi] = _mm256_fmadd_ps(
                                    _mm256_set1_ps(sc[ri][bi][kk + 1]),
                                    _mm256_cvtepi32_ps(p),
                                    acc[ri][bi],
                                );
                            }
                        }
                        for ri in 0..R {
                            summ[ri] = _mm_fmadd_ps(_mm_set1_ps(mm[ri][kk + 1]), sv1, summ[ri]);
                        }
                    }
                    kk += 2;
                }
                base += 8;
            }
            finish(&acc, Some(&summ))
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

/// The same kernels compiled with AVX-512 F/BW/VL too, for the formats and tile shapes the
/// AVX-512 levels run on AVX2 code (Q4_1, F16, BF16, F32): the same instructions and bits, but
/// the compiler has 32 vector registers for the register tiles instead of 16 (a build for the
/// x86-64 baseline would otherwise give these kernels fewer registers than a
/// `-C target-cpu=native` build does; docs/performance.md). Callers hold an effective level of
/// [`Level::Avx512`](super::Level::Avx512) or above.
#[allow(clippy::needless_range_loop, dead_code)]
#[cfg(target_arch = "x86_64")]
pub(super) mod vl {
    avx2_kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl");
}
