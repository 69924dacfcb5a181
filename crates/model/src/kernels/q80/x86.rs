//! The band kernels of Q8_0 × Q8_0 on x86-64: AVX-512 with VNNI, and AVX2 (which the
//! AVX-512 level without VNNI runs too).
//!
//! Each computes the [module docs'](super) arithmetic for the sixteen rows of one band and up
//! to four activation rows; only the exact integer sums are computed differently:
//!
//! * **VNNI**: the weights taken unsigned, `u = w + 128`; `vpdpbusd` of a unit against four
//!   activation bytes broadcast to every lane adds `Σ u·a` over four positions to each row's
//!   lane, starting from `−128 · Σ a` (the block's activation sum, kept with the activations):
//!   `isum = Σ u·a − 128 · Σ a`, exact in `i32`;
//! * **AVX2**: eight rows a register, `vpmaddubsw(|w|, sign(a, w))` (pairs at most
//!   `2 · 128 · 127 < 2^15`) and `vpmaddwd` by ones; the band's halves one after the other.
// Register tiles are indexed by activation (`acc[bi]`); index loops read best.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::BAND;
use crate::kernels::band::{in_fours, join_halves, quad, rows, rows4, TILE};
use crate::kernels::{array, Acts, QMatrix};

/// Bytes of one band's quants per block.
const BAND_QS: usize = BAND * 32;

/// The pointers one band kernel reads, checked once.
struct Band<const N: usize> {
    nb: usize,
    qs: *const u8,
    d: *const u16,
    q: [*const u8; N],
    ad: [*const f32; N],
    qsum: [*const i32; N],
}

impl<const N: usize> Band<N> {
    /// Checks that band `band` of `w` and activation rows `b0..b0 + N` of `a` are in bounds.
    #[inline(always)]
    fn new(w: &QMatrix, band: usize, a: &Acts<'_>, b0: usize) -> Self {
        let nb = w.nb;
        let (q0, d0) = (band * BAND * w.qchunks, band * BAND * w.nbp);
        assert!(w.qchunks == nb && w.qs.len() >= q0 + 16 * nb);
        assert!(w.nbp >= nb && w.d.len() >= d0 + BAND * nb);
        assert!(a.nb == nb && b0 + N <= a.n && a.nbp >= nb);
        assert!(a.q.len() >= a.n * nb && a.d.len() >= a.n * a.nbp && a.qsum.len() >= a.n * nb);
        Band {
            nb,
            qs: w.qs[q0..].as_ptr().cast(),
            d: w.d[d0..].as_ptr(),
            q: array(|bi| a.q[(b0 + bi) * nb..].as_ptr().cast()),
            ad: array(|bi| a.d[(b0 + bi) * a.nbp..].as_ptr()),
            qsum: array(|bi| a.qsum[(b0 + bi) * nb..].as_ptr()),
        }
    }
}

/// The band's dots with activation rows `b0..b0 + n` (`1 ≤ n ≤ TILE`), with VNNI: eight rows'
/// sums and eight accumulators fit the 32 registers beside the flipped quants.
///
/// # Safety
/// [`Level::Avx512Vnni`](crate::kernels::Level::Avx512Vnni) must be effective.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn band_vnni(
    w: &QMatrix,
    band: usize,
    a: &Acts<'_>,
    b0: usize,
    n: usize,
) -> [[f32; BAND]; TILE] {
    rows!(n, N => vnni::<N>(w, band, a, b0))
}

/// The band's dots with activation rows `b0..b0 + n` (`1 ≤ n ≤ TILE`, four at a time), AVX2.
///
/// # Safety
/// [`Level::Avx2`](crate::kernels::Level::Avx2) must be effective.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn band_avx2(
    w: &QMatrix,
    band: usize,
    a: &Acts<'_>,
    b0: usize,
    n: usize,
) -> [[f32; BAND]; TILE] {
    in_fours(n, |o, m| {
        join_halves(|half| rows4!(m, N => avx2::<N>(w, band, half, a, b0 + o)))
    })
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline(never)]
fn vnni<const N: usize>(w: &QMatrix, band: usize, a: &Acts<'_>, b0: usize) -> [[f32; BAND]; TILE] {
    let p = Band::<N>::new(w, band, a, b0);
    let flip = _mm512_set1_epi8(i8::MIN);
    let mut acc = [_mm512_setzero_ps(); N];
    // SAFETY (every access below): `k < nb`, `pos < 8`, `bi < N`: each pointer stays within the
    // band's block `k` or the activation row's block `k` (checked in `Band::new`).
    for k in 0..p.nb {
        let q = unsafe { p.qs.add(k * BAND_QS) };
        let y: [*const u8; N] = array(|bi| unsafe { p.q[bi].add(32 * k) });
        let mut isum: [__m512i; N] =
            array(|bi| _mm512_set1_epi32(-128 * unsafe { *p.qsum[bi].add(k) }));
        for pos in 0..8 {
            let c = unsafe { _mm512_loadu_si512(q.add(64 * pos).cast()) };
            let u = _mm512_xor_si512(c, flip);
            for bi in 0..N {
                let av = _mm512_set1_epi32(unsafe { quad(y[bi].add(4 * pos)) });
                isum[bi] = _mm512_dpbusd_epi32(isum[bi], u, av);
            }
        }
        let dw = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.d.add(k * BAND).cast()) });
        for bi in 0..N {
            let da = _mm512_set1_ps(unsafe { *p.ad[bi].add(k) });
            acc[bi] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(isum[bi]), acc[bi]);
        }
    }
    let mut res = [[0f32; BAND]; TILE];
    for bi in 0..N {
        // SAFETY: 16 `f32` of `res[bi]` are writable.
        unsafe { _mm512_storeu_ps(res[bi].as_mut_ptr(), acc[bi]) };
    }
    res
}

/// Half `half` (rows `8 · half..8 · half + 8`) of the band on AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline(never)]
fn avx2<const N: usize>(
    w: &QMatrix,
    band: usize,
    half: usize,
    a: &Acts<'_>,
    b0: usize,
) -> [[f32; 8]; 4] {
    let p = Band::<N>::new(w, band, a, b0);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); N];
    // SAFETY (every access below): as in `vnni`; `half < 2` selects 32 of each unit's 64 bytes
    // and 8 of the 16 scales.
    for k in 0..p.nb {
        let q = unsafe { p.qs.add(k * BAND_QS + 32 * half) };
        let y: [*const u8; N] = array(|bi| unsafe { p.q[bi].add(32 * k) });
        let mut isum = [_mm256_setzero_si256(); N];
        for pos in 0..8 {
            let c = unsafe { _mm256_loadu_si256(q.add(64 * pos).cast()) };
            let mag = _mm256_abs_epi8(c);
            for bi in 0..N {
                let av = _mm256_set1_epi32(unsafe { quad(y[bi].add(4 * pos)) });
                let pr = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(av, c));
                isum[bi] = _mm256_add_epi32(isum[bi], _mm256_madd_epi16(pr, ones));
            }
        }
        let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p.d.add(k * BAND + 8 * half).cast()) });
        for bi in 0..N {
            let da = _mm256_set1_ps(unsafe { *p.ad[bi].add(k) });
            acc[bi] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(isum[bi]), acc[bi]);
        }
    }
    let mut res = [[0f32; 8]; 4];
    for bi in 0..N {
        // SAFETY: 8 `f32` of `res[bi]` are writable.
        unsafe { _mm256_storeu_ps(res[bi].as_mut_ptr(), acc[bi]) };
    }
    res
}
