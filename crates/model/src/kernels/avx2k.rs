//! AVX2 + FMA + F16C kernels of the formats not kept in bands (Q5_K, F32, F16, BF16), x86-64
//! only.
//!
//! Each kernel computes exactly the operations of [`super::scalar::dot`] for its format (the
//! order is spelled out in the [module docs](super)), for a register tile of weight rows ×
//! activation rows. Callers must have checked that the CPU has AVX2, FMA and F16C, and prepared
//! the activations for the weight format.
#![cfg(target_arch = "x86_64")]
// Register tiles are indexed by row and activation (`acc[ri][bi]`); index loops read best.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::{scalar, Acts, Chunk, MatFormat, QMatrix};

/// `fdot` variants.
const F32: u8 = 0;
const F16: u8 = 1;
const BF16: u8 = 2;

/// The dots of weight rows `r0..r0 + nr` with activation rows `b0..b0 + n` (`1 ≤ nr, n ≤ 4`):
/// `res[ri][bi]`. Tiles of 1×n, 2×n and 4×1 (1×1, 1×2, 2×1 for the float formats) run as one
/// register tile; others element by element.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_tile(
    w: &QMatrix,
    r0: usize,
    nr: usize,
    a: &Acts<'_>,
    b0: usize,
    n: usize,
) -> [[f32; 4]; 4] {
    macro_rules! go {
        ($f:ident, $c:expr; $(($r:literal, $n:literal)),*) => {
            match (nr, n) {
                $(($r, $n) => return $f::<{ $c }, $r, $n>(w, r0, a, b0),)*
                _ => {}
            }
        };
        ($f:ident; $(($r:literal, $n:literal)),*) => {
            match (nr, n) {
                $(($r, $n) => return $f::<$r, $n>(w, r0, a, b0),)*
                _ => {}
            }
        };
    }
    match w.format {
        MatFormat::Q5_K => {
            go!(kq5; (1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (2, 2), (2, 3), (2, 4), (4, 1))
        }
        MatFormat::F32 => go!(fdot, F32; (1, 1), (1, 2), (2, 1)),
        MatFormat::F16 => go!(fdot, F16; (1, 1), (1, 2), (2, 1)),
        MatFormat::BF16 => go!(fdot, BF16; (1, 1), (1, 2), (2, 1)),
        // The banded formats (`band`) never reach the tiles; the scalar code gives their bits.
        MatFormat::Q4_0
        | MatFormat::Q4_1
        | MatFormat::Q5_0
        | MatFormat::Q5_1
        | MatFormat::Q8_0
        | MatFormat::Q4_K
        | MatFormat::Q6_K => return scalar::dot_tile(w, r0, nr, a, b0, n),
    }
    let mut res = [[0f32; 4]; 4];
    for ri in 0..nr.min(4) {
        for bi in 0..n.min(4) {
            res[ri][bi] = dot_tile(w, r0 + ri, 1, a, b0 + bi, 1)[0][0];
        }
    }
    res
}

/// `f32` of the `f16` with these bits (exact).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn h2f(bits: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// llama.cpp's `hsum_float_8` (see [`super::scalar::hsum8`]).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn hsum8(x: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    let r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// The last step of `GGML_F32_VEC_REDUCE` (see [`super::scalar::reduce8`]).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn reduce8(x: __m256) -> f32 {
    let t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
    let t1 = _mm_hadd_ps(t0, t0);
    _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
}

/// Loads one chunk.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn ld(c: &Chunk) -> __m256i {
    // SAFETY: a `Chunk` is 32 readable bytes aligned to 32.
    unsafe { _mm256_load_si256(c.0.as_ptr().cast()) }
}

/// Q5_K × Q8_K for weight rows `r0..r0 + R` and activation rows `b0..b0 + N` (Q4_K is kept in
/// bands: [`super::q4k`]).
///
/// Quants are in `0..32` and activation quants in `−127..=127`, so `maddubs` pairs stay below
/// `2 · 31 · 127`; scaled by a 6-bit scale and summed over a super-block, every lane stays below
/// `8 · 63 · 4 · 31 · 127 < 2^24`.
#[target_feature(enable = "avx2,fma,f16c")]
fn kq5<const R: usize, const N: usize>(
    w: &QMatrix,
    r0: usize,
    a: &Acts<'_>,
    b0: usize,
) -> [[f32; 4]; 4] {
    let nb = w.nb;
    assert!(a.knb == nb && b0 + N <= a.n && r0 + R <= w.rows);
    let mask = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    let mut acc = [[_mm256_setzero_ps(); N]; R];
    let mut summs = [[0f32; N]; R];
    for k in 0..nb {
        let mut sumi = [[_mm256_setzero_si256(); N]; R];
        let mut sc = [[0u8; 16]; R];
        let mut hb = [_mm256_setzero_si256(); R];
        for ri in 0..R {
            let r = r0 + ri;
            sc[ri] = w.sc[r * nb + k];
            hb[ri] = ld(&w.qs[r * w.qchunks + 5 * k + 4]);
        }
        for j in 0..4 {
            let mut lo = [_mm256_setzero_si256(); R];
            let mut hi = [_mm256_setzero_si256(); R];
            let mut sl = [_mm256_setzero_si256(); R];
            let mut sh = [_mm256_setzero_si256(); R];
            for ri in 0..R {
                let c = ld(&w.qs[(r0 + ri) * w.qchunks + 5 * k + j]);
                lo[ri] = _mm256_and_si256(c, mask);
                hi[ri] = _mm256_and_si256(_mm256_srli_epi16::<4>(c), mask);
                let s0 = _mm_cvtsi32_si128(2 * j as i32);
                let s1 = _mm_cvtsi32_si128(2 * j as i32 + 1);
                let h0 = _mm256_and_si256(_mm256_srl_epi16(hb[ri], s0), one);
                let h1 = _mm256_and_si256(_mm256_srl_epi16(hb[ri], s1), one);
                lo[ri] = _mm256_or_si256(lo[ri], _mm256_slli_epi16::<4>(h0));
                hi[ri] = _mm256_or_si256(hi[ri], _mm256_slli_epi16::<4>(h1));
                sl[ri] = _mm256_set1_epi16(sc[ri][2 * j] as i16);
                sh[ri] = _mm256_set1_epi16(sc[ri][2 * j + 1] as i16);
            }
            for bi in 0..N {
                let blk = (b0 + bi) * nb + k;
                let yl = ld(&a.kq[blk * 8 + 2 * j]);
                let yh = ld(&a.kq[blk * 8 + 2 * j + 1]);
                for ri in 0..R {
                    let pl = _mm256_madd_epi16(sl[ri], _mm256_maddubs_epi16(lo[ri], yl));
                    let ph = _mm256_madd_epi16(sh[ri], _mm256_maddubs_epi16(hi[ri], yh));
                    sumi[ri][bi] = _mm256_add_epi32(sumi[ri][bi], _mm256_add_epi32(pl, ph));
                }
            }
        }
        for ri in 0..R {
            for bi in 0..N {
                let blk = (b0 + bi) * nb + k;
                let (acc, summs) = (&mut acc[ri][bi], &mut summs[ri][bi]);
                kq5_add(w, r0 + ri, k, a, blk, sumi[ri][bi], acc, summs);
            }
        }
    }
    let mut res = [[0f32; 4]; 4];
    for ri in 0..R {
        for bi in 0..N {
            res[ri][bi] = kq5_result(acc[ri][bi], summs[ri][bi]);
        }
    }
    res
}

/// Q5_K: adds super-block `k` of weight row `r` against activation super-block `blk` to that
/// pair's accumulators, given the eight exact lane sums `isum` (the float part of the
/// [module docs](super)).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
// The accumulators of one weight row × activation row, as the kernels keep them.
#[allow(clippy::too_many_arguments)]
fn kq5_add(
    w: &QMatrix,
    r: usize,
    k: usize,
    a: &Acts<'_>,
    blk: usize,
    isum: __m256i,
    acc: &mut __m256,
    summs: &mut f32,
) {
    let dw = h2f(w.d[r * w.nbp + k]);
    let dmw = h2f(w.m[r * w.nbp + k]);
    let sc = &w.sc[r * w.nb + k];
    // SAFETY: `sc` is 16 readable bytes; the load reads its last eight (the mins).
    let mins = _mm_cvtepu8_epi16(unsafe { _mm_loadl_epi64(sc[8..].as_ptr().cast()) });
    let da = a.kd[blk];
    *acc = _mm256_fmadd_ps(_mm256_set1_ps(da * dw), _mm256_cvtepi32_ps(isum), *acc);
    let bs = &a.kbs[blk];
    // SAFETY: `bs` is sixteen `i16`s: the loads read `bs[0..8]` and `bs[8..16]`.
    let (b_lo, b_hi) = unsafe {
        (
            _mm_loadu_si128(bs.as_ptr().cast()),
            _mm_loadu_si128(bs.as_ptr().add(8).cast()),
        )
    };
    let prod = _mm_madd_epi16(mins, _mm_hadd_epi16(b_lo, b_hi));
    let dmin = -(da * dmw);
    let s = _mm_add_epi32(prod, _mm_unpackhi_epi64(prod, prod));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
    let s = _mm_cvtsi128_si32(s);
    *summs = dmin.mul_add(s as f32, *summs);
}

/// The result of a Q5_K dot from its accumulators (see [`kq5_add`]): the eight lanes' sum,
/// then the minimum term. Shared by the AVX2 and AVX-512 kernels.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn kq5_result(acc: __m256, summs: f32) -> f32 {
    hsum8(acc) + summs
}

/// Eight values from `p + e` of a row stored as `F` (`f32`, `f16` or `bf16` bits), as `f32`.
///
/// # Safety
/// `p` must be valid for reads of the row's elements `e..e + 8`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load8<const F: u8>(p: *const u8, e: usize) -> __m256 {
    // SAFETY: the caller guarantees that elements `e..e + 8` are readable.
    unsafe {
        match F {
            F32 => _mm256_loadu_ps(p.cast::<f32>().add(e)),
            F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.cast::<u16>().add(e).cast())),
            _ => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                _mm_loadu_si128(p.cast::<u16>().add(e).cast()),
            ))),
        }
    }
}

/// F32 × F32, F16 × F16 and BF16 × BF16 for weight rows `r0..r0 + R` and activation rows
/// `b0..b0 + N`.
#[target_feature(enable = "avx2,fma,f16c")]
fn fdot<const F: u8, const R: usize, const N: usize>(
    w: &QMatrix,
    r0: usize,
    a: &Acts<'_>,
    b0: usize,
) -> [[f32; 4]; 4] {
    let cols = w.cols;
    let bytes = if F == F32 { 4 } else { 2 };
    assert!(r0 + R <= w.rows && w.qchunks * 32 == cols * bytes && b0 + N <= a.n);
    let mut wp = [std::ptr::null::<u8>(); R];
    for ri in 0..R {
        wp[ri] = w.qs[(r0 + ri) * w.qchunks..(r0 + ri + 1) * w.qchunks]
            .as_ptr()
            .cast();
    }
    let mut ap = [std::ptr::null::<u8>(); N];
    for bi in 0..N {
        let range = (b0 + bi) * cols..(b0 + bi + 1) * cols;
        ap[bi] = match F {
            F32 => a.x[range].as_ptr().cast(),
            F16 => a.h[range].as_ptr().cast(),
            _ => a.bh[range].as_ptr().cast(),
        };
    }
    let mut acc = [[[_mm256_setzero_ps(); 4]; N]; R];
    for s in 0..cols / 32 {
        for j in 0..4 {
            let e = 32 * s + 8 * j;
            let mut wv = [_mm256_setzero_ps(); R];
            for ri in 0..R {
                // SAFETY: `e + 8 ≤ cols`, and `wp[ri]` points to a row of `cols` values.
                wv[ri] = unsafe { load8::<F>(wp[ri], e) };
            }
            for bi in 0..N {
                // SAFETY: as above, `ap[bi]` points to a row of `cols` values.
                let av = unsafe { load8::<F>(ap[bi], e) };
                for ri in 0..R {
                    acc[ri][bi][j] = if F == BF16 {
                        _mm256_add_ps(_mm256_mul_ps(wv[ri], av), acc[ri][bi][j])
                    } else {
                        _mm256_fmadd_ps(wv[ri], av, acc[ri][bi][j])
                    };
                }
            }
        }
    }
    let mut res = [[0f32; 4]; 4];
    for ri in 0..R {
        for bi in 0..N {
            let c = &acc[ri][bi];
            let c = _mm256_add_ps(_mm256_add_ps(c[0], c[2]), _mm256_add_ps(c[1], c[3]));
            res[ri][bi] = if F == BF16 { hsum8(c) } else { reduce8(c) };
        }
    }
    res
}
