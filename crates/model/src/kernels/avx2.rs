//! AVX2 + FMA + F16C kernels (x86-64), selected at run time.
//!
//! Every function here computes exactly the operations of its twin in [`super::scalar`], many
//! lanes at once; callers must have checked [`available`] before calling any of them. On other
//! architectures [`available`] is `false` and the functions forward to the scalar code.

#[cfg(target_arch = "x86_64")]
pub(super) use imp::*;

#[cfg(not(target_arch = "x86_64"))]
pub(super) use fallback::*;

#[cfg(not(target_arch = "x86_64"))]
mod fallback {
    use super::super::{scalar, Activations, QMatrix, BLOCK};

    /// Never on this architecture.
    pub(in super::super) fn available() -> bool {
        false
    }

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
    pub(in super::super) unsafe fn dot_rows(
        w: &QMatrix,
        r: usize,
        a: &Activations,
        b0: usize,
        n: usize,
    ) -> [f32; 4] {
        scalar::dot_rows(w, r, a, b0, n)
    }
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::arch::x86_64::*;

    use super::super::{Activations, Chunk, MatFormat, QMatrix, BLOCK};

    /// Whether this CPU has AVX2, FMA and F16C.
    pub(in super::super) fn available() -> bool {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }

    /// `max |x_i|` over one block (see [`super::super::scalar::amax`]).
    #[target_feature(enable = "avx2,fma,f16c")]
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
        let a = v.map(|v| _mm256_andnot_ps(sign, v));
        let m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
        let h = _mm_max_ps(_mm256_extractf128_ps::<1>(m), _mm256_castps256_ps128(m));
        let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        let h = _mm_max_ss(h, _mm_movehdup_ps(h));
        _mm_cvtss_f32(h)
    }

    /// Quantises one block (see [`super::super::scalar::quantize_block`]).
    #[target_feature(enable = "avx2,fma,f16c")]
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

    /// llama.cpp's `hsum_float_8` (see [`super::super::scalar::hsum8`]).
    #[target_feature(enable = "avx2,fma,f16c")]
    fn hsum8(x: __m256) -> f32 {
        let r = _mm_add_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
        let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
        let r = _mm_add_ss(r, _mm_movehdup_ps(r));
        _mm_cvtss_f32(r)
    }

    /// The dots of weight row `r` with activation rows `b0..b0 + n` (`1 ≤ n ≤ 4`, `b0 % 4 == 0`)
    /// in `[..n]` (see [`super::super::scalar::dot_rows`]).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) fn dot_rows(
        w: &QMatrix,
        r: usize,
        a: &Activations,
        b0: usize,
        n: usize,
    ) -> [f32; 4] {
        match (w.format, n) {
            (MatFormat::Q4_1, 1) => q4_1::<1>(w, r, a, b0),
            (MatFormat::Q4_1, 2) => q4_1::<2>(w, r, a, b0),
            (MatFormat::Q4_1, 3) => q4_1::<3>(w, r, a, b0),
            (MatFormat::Q4_1, _) => q4_1::<4>(w, r, a, b0),
            (MatFormat::Q8_0, 1) => q8_0::<1>(w, r, a, b0),
            (MatFormat::Q8_0, 2) => q8_0::<2>(w, r, a, b0),
            (MatFormat::Q8_0, 3) => q8_0::<3>(w, r, a, b0),
            (MatFormat::Q8_0, _) => q8_0::<4>(w, r, a, b0),
        }
    }

    /// The operand rows of one call: weight row `r`, activation rows `b0..b0 + N`, as slices
    /// whose lengths the kernels rely on.
    struct Rows<'a, const N: usize> {
        wq: &'a [Chunk],
        wd: &'a [u16],
        aq: [&'a [Chunk]; N],
        ad: [&'a [f32]; N],
    }

    fn rows<'a, const N: usize>(
        w: &'a QMatrix,
        r: usize,
        a: &'a Activations,
        b0: usize,
    ) -> Rows<'a, N> {
        Rows {
            wq: &w.qs[r * w.qchunks..(r + 1) * w.qchunks],
            wd: &w.d[r * w.nbp..(r + 1) * w.nbp],
            aq: std::array::from_fn(|i| &a.q[(b0 + i) * a.nb..(b0 + i + 1) * a.nb]),
            ad: std::array::from_fn(|i| &a.d[(b0 + i) * a.nbp..(b0 + i + 1) * a.nbp]),
        }
    }

    /// `sc[i][kk] = f32(d_w[base + kk]) · d_a[i][base + kk]` for the eight blocks from `base`.
    ///
    /// # Safety
    /// `base + 8 ≤ nbp`, the length of `rw.wd` and of every `rw.ad[i]`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales<const N: usize>(rw: &Rows<'_, N>, base: usize, sc: &mut [[f32; 8]; N]) {
        // SAFETY: eight `u16`s from `base` are in `rw.wd` (caller).
        let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(rw.wd.as_ptr().add(base).cast()) });
        for i in 0..N {
            // SAFETY: eight `f32`s from `base` are in `rw.ad[i]` (caller); `sc[i]` has eight.
            unsafe {
                let da = _mm256_loadu_ps(rw.ad[i].as_ptr().add(base));
                _mm256_storeu_ps(sc[i].as_mut_ptr(), _mm256_mul_ps(dw, da));
            }
        }
    }

    /// One Q4_1 block `k` (quants `wv`, in element order, 0..16) against `N` activation rows.
    macro_rules! q4_step {
        ($rw:ident, $acc:ident, $sc:ident, $ones:ident, $wv:expr, $k:expr, $kk:expr) => {
            for i in 0..N {
                // SAFETY: `k < nb`, the length of `rw.aq[i]`; chunks are 32-byte aligned.
                let av = unsafe { _mm256_load_si256($rw.aq[i].as_ptr().add($k).cast()) };
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16($wv, av), $ones);
                $acc[i] =
                    _mm256_fmadd_ps(_mm256_set1_ps($sc[i][$kk]), _mm256_cvtepi32_ps(p), $acc[i]);
            }
        };
    }

    /// Q4_1 × Q8_1 for weight row `r` and activation rows `b0..b0 + N`.
    ///
    /// `maddubs` cannot saturate: the weight quants are in `0..=15` and the activation quants in
    /// `−127..=127`, so a pair sums to at most `2 · 15 · 127 = 3810` in magnitude.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn q4_1<const N: usize>(w: &QMatrix, r: usize, a: &Activations, b0: usize) -> [f32; 4] {
        let nb = w.nb;
        let rw = rows::<N>(w, r, a, b0);
        let wm = &w.m[r * w.nbp..(r + 1) * w.nbp];
        // `s[k · np4 + b0 + i]` for `i < 4`: `b0 % 4 == 0` and `np4 % 4 == 0`, so the four
        // lanes of block `k` lie in `s[k · np4 + b0..][..4]`, inside `s` (len `nb · np4`).
        let s = &a.s[b0.min(a.s.len())..];
        debug_assert!(b0 % 4 == 0 && a.np4 % 4 == 0 && b0 < a.np4);
        let mask = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); N];
        let mut summ = _mm_setzero_ps();
        let mut sc = [[0f32; 8]; N];
        let mut mm = [0f32; 8];
        let mut base = 0;
        while base < nb {
            // SAFETY: `base < nb ≤ nbp` and `nbp % 8 == 0`, so `base + 8 ≤ nbp`.
            unsafe { scales(&rw, base, &mut sc) };
            // SAFETY: as above, eight `u16`s from `base` are in `wm` (len `nbp`).
            let m8 = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(wm.as_ptr().add(base).cast()) });
            // SAFETY: `mm` has eight `f32`s.
            unsafe { _mm256_storeu_ps(mm.as_mut_ptr(), m8) };
            let kend = (nb - base).min(8);
            let mut kk = 0;
            while kk < kend {
                let k = base + kk;
                // SAFETY: `k / 2 < ceil(nb / 2) = qchunks`, the length of `rw.wq`; aligned.
                let x = unsafe { _mm256_load_si256(rw.wq.as_ptr().add(k / 2).cast()) };
                let lo = _mm256_and_si256(x, mask);
                q4_step!(rw, acc, sc, ones, lo, k, kk);
                // SAFETY: `k · np4 + b0 + 4 ≤ (k + 1) · np4 ≤ s.len() + b0`.
                let sv = unsafe { _mm_loadu_ps(s.as_ptr().add(k * a.np4)) };
                summ = _mm_fmadd_ps(_mm_set1_ps(mm[kk]), sv, summ);
                if kk + 1 < kend {
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(x), mask);
                    q4_step!(rw, acc, sc, ones, hi, k + 1, kk + 1);
                    // SAFETY: as above for block `k + 1 < nb`.
                    let sv = unsafe { _mm_loadu_ps(s.as_ptr().add((k + 1) * a.np4)) };
                    summ = _mm_fmadd_ps(_mm_set1_ps(mm[kk + 1]), sv, summ);
                }
                kk += 2;
            }
            base += 8;
        }
        let mut sm = [0f32; 4];
        // SAFETY: `sm` has four `f32`s.
        unsafe { _mm_storeu_ps(sm.as_mut_ptr(), summ) };
        let mut res = [0f32; 4];
        for i in 0..N {
            res[i] = hsum8(acc[i]) + sm[i];
        }
        res
    }

    /// Q8_0 × Q8_0 for weight row `r` and activation rows `b0..b0 + N`.
    ///
    /// Sign trick: `maddubs(|w| as u8, sign(a, w))`. `|w| ≤ 128` (a weight of −128 becomes the
    /// unsigned byte 128) and `|sign(a, w)| ≤ 127`, so a pair sums to at most
    /// `2 · 128 · 127 = 32512 ≤ 32767`: `maddubs` never saturates, even for −128 weights.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn q8_0<const N: usize>(w: &QMatrix, r: usize, a: &Activations, b0: usize) -> [f32; 4] {
        let nb = w.nb;
        let rw = rows::<N>(w, r, a, b0);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); N];
        let mut sc = [[0f32; 8]; N];
        let mut base = 0;
        while base < nb {
            // SAFETY: `base < nb ≤ nbp` and `nbp % 8 == 0`, so `base + 8 ≤ nbp`.
            unsafe { scales(&rw, base, &mut sc) };
            let kend = (nb - base).min(8);
            for kk in 0..kend {
                let k = base + kk;
                // SAFETY: `k < nb = qchunks`, the length of `rw.wq`; chunks are aligned.
                let x = unsafe { _mm256_load_si256(rw.wq.as_ptr().add(k).cast()) };
                let ax = _mm256_sign_epi8(x, x);
                for i in 0..N {
                    // SAFETY: `k < nb`, the length of `rw.aq[i]`; chunks are aligned.
                    let av = unsafe { _mm256_load_si256(rw.aq[i].as_ptr().add(k).cast()) };
                    let sy = _mm256_sign_epi8(av, x);
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), ones);
                    acc[i] =
                        _mm256_fmadd_ps(_mm256_set1_ps(sc[i][kk]), _mm256_cvtepi32_ps(p), acc[i]);
                }
            }
            base += 8;
        }
        let mut res = [0f32; 4];
        for i in 0..N {
            res[i] = hsum8(acc[i]);
        }
        res
    }
}
