//! The band kernels of Q6_K × Q8_K on x86-64: AVX-512 with VNNI, and AVX2 (which the AVX-512
//! level without VNNI runs too).
//!
//! Each computes the [module docs'](super) arithmetic for the sixteen rows of one band and up
//! to four activation rows; only the exact integer sums are computed differently. The three
//! units of a half and quad give four vectors of unsigned 6-bit quants `q` (a nibble of `ql`
//! and a bit pair of `qh` each). A sub-block's sum starts from `−32 · bs_s` (the activations'
//! exact sum of its sixteen quants) and adds `q · a` over four quads:
//!
//! * **VNNI**: `vpdpbusd` of the quants against four activation bytes broadcast to every lane;
//! * **AVX2**: eight rows a register, `vpmaddubsw(q, a)` (pairs at most `2 · 63 · 127 < 2^15`)
//!   and `vpmaddwd` by ones; the band's halves one after the other.
//!
//! Then `vpmulld` by the rows' scales of that sub-block adds `sc_s · Σ (q − 32) · a` to `isum`
//! (exact), and one fused multiply-add per super-block updates sixteen (eight) outputs.
// Register tiles are indexed by activation (`acc[bi]`); index loops read best.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::{BAND, BAND_CHUNKS};
use crate::kernels::band::{in_fours, join_halves, quad, rows4, TILE};
use crate::kernels::{array, Acts, QMatrix};

/// Bytes of one band's quants per super-block.
const BAND_QS: usize = BAND_CHUNKS * 32;

/// The pointers one band kernel reads, checked once.
struct Band<const N: usize> {
    nb: usize,
    qs: *const u8,
    sc: *const u8,
    d: *const u16,
    kq: [*const u8; N],
    kd: [*const f32; N],
    kbs: [*const [i16; 16]; N],
}

impl<const N: usize> Band<N> {
    /// Checks that band `band` of `w` and activation rows `b0..b0 + N` of `a` are in bounds.
    #[inline(always)]
    fn new(w: &QMatrix, band: usize, a: &Acts<'_>, b0: usize) -> Self {
        let nb = w.nb;
        let (q0, s0, d0) = (
            band * BAND * w.qchunks,
            band * BAND * nb,
            band * BAND * w.nbp,
        );
        assert!(BAND * w.qchunks == BAND_CHUNKS * nb && w.qs.len() >= q0 + BAND_CHUNKS * nb);
        assert!(w.sc.len() >= s0 + BAND * nb);
        assert!(w.nbp >= nb && w.d.len() >= d0 + BAND * nb);
        assert!(a.knb == nb && b0 + N <= a.n);
        assert!(a.kq.len() >= a.n * nb * 8 && a.kd.len() >= a.n * nb && a.kbs.len() >= a.n * nb);
        Band {
            nb,
            qs: w.qs[q0..].as_ptr().cast(),
            sc: w.sc[s0..].as_ptr().cast(),
            d: w.d[d0..].as_ptr(),
            kq: array(|bi| a.kq[(b0 + bi) * nb * 8..].as_ptr().cast()),
            kd: array(|bi| a.kd[(b0 + bi) * nb..].as_ptr()),
            kbs: array(|bi| a.kbs[(b0 + bi) * nb..].as_ptr()),
        }
    }
}

/// The band's dots with activation rows `b0..b0 + n` (`1 ≤ n ≤ TILE`, four at a time), with VNNI.
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
    in_fours(n, |o, m| rows4!(m, N => vnni::<N>(w, band, a, b0 + o)))
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
fn vnni<const N: usize>(w: &QMatrix, band: usize, a: &Acts<'_>, b0: usize) -> [[f32; BAND]; 4] {
    let p = Band::<N>::new(w, band, a, b0);
    let low = _mm512_set1_epi8(0x0F);
    let pair = _mm512_set1_epi8(0x30);
    let mut acc = [_mm512_setzero_ps(); N];
    // SAFETY (every access below): `k < nb`, `n < 2`, `q < 8`, `c < 4`, `bi < N`: each pointer
    // stays within the band's super-block `k` (its 3,072 quant bytes, 256 scale bytes and 16
    // scales) or the activation row's super-block `k` (checked in `Band::new`).
    for k in 0..p.nb {
        let qk = unsafe { p.qs.add(k * BAND_QS) };
        let sck = unsafe { p.sc.add(k * BAND * 16) };
        let y: [*const u8; N] = array(|bi| unsafe { p.kq[bi].add(256 * k) });
        let bs: [&[i16; 16]; N] = array(|bi| unsafe { &*p.kbs[bi].add(k) });
        let mut isum = [_mm512_setzero_si512(); N];
        for n in 0..2 {
            for half in 0..2 {
                // sub-blocks `8n + 2c + half`, values `128n + 32c + 16 · half..+16`
                let mut t: [[__m512i; 4]; N] = array(|bi| {
                    array(|c| _mm512_set1_epi32(-32 * bs[bi][8 * n + 2 * c + half] as i32))
                });
                for q in 4 * half..4 * half + 4 {
                    let u = unsafe { qk.add(192 * (8 * n + q)) };
                    let l0 = unsafe { _mm512_loadu_si512(u.cast()) };
                    let l1 = unsafe { _mm512_loadu_si512(u.add(64).cast()) };
                    let h = unsafe { _mm512_loadu_si512(u.add(128).cast()) };
                    let v = [
                        _mm512_or_si512(
                            _mm512_and_si512(l0, low),
                            _mm512_and_si512(_mm512_slli_epi16(h, 4), pair),
                        ),
                        _mm512_or_si512(
                            _mm512_and_si512(l1, low),
                            _mm512_and_si512(_mm512_slli_epi16(h, 2), pair),
                        ),
                        _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16(l0, 4), low),
                            _mm512_and_si512(h, pair),
                        ),
                        _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16(l1, 4), low),
                            _mm512_and_si512(_mm512_srli_epi16(h, 2), pair),
                        ),
                    ];
                    for bi in 0..N {
                        for c in 0..4 {
                            let av = _mm512_set1_epi32(unsafe {
                                quad(y[bi].add(128 * n + 32 * c + 4 * q))
                            });
                            t[bi][c] = _mm512_dpbusd_epi32(t[bi][c], v[c], av);
                        }
                    }
                }
                for c in 0..4 {
                    let s = 8 * n + 2 * c + half;
                    let sc =
                        _mm512_cvtepi8_epi32(unsafe { _mm_loadu_si128(sck.add(16 * s).cast()) });
                    for bi in 0..N {
                        isum[bi] = _mm512_add_epi32(isum[bi], _mm512_mullo_epi32(t[bi][c], sc));
                    }
                }
            }
        }
        let dw = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.d.add(k * BAND).cast()) });
        for bi in 0..N {
            let da = _mm512_set1_ps(unsafe { *p.kd[bi].add(k) });
            acc[bi] = _mm512_fmadd_ps(_mm512_mul_ps(da, dw), _mm512_cvtepi32_ps(isum[bi]), acc[bi]);
        }
    }
    let mut res = [[0f32; BAND]; 4];
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
    rows: usize,
    a: &Acts<'_>,
    b0: usize,
) -> [[f32; 8]; 4] {
    let p = Band::<N>::new(w, band, a, b0);
    let low = _mm256_set1_epi8(0x0F);
    let pair = _mm256_set1_epi8(0x30);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); N];
    // SAFETY (every access below): as in `vnni`; `rows < 2` selects 32 of each unit's 64 bytes,
    // 8 of each sixteen scales and 8 of the 16 `d`.
    for k in 0..p.nb {
        let qk = unsafe { p.qs.add(k * BAND_QS + 32 * rows) };
        let sck = unsafe { p.sc.add(k * BAND * 16 + 8 * rows) };
        let y: [*const u8; N] = array(|bi| unsafe { p.kq[bi].add(256 * k) });
        let bs: [&[i16; 16]; N] = array(|bi| unsafe { &*p.kbs[bi].add(k) });
        let mut isum = [_mm256_setzero_si256(); N];
        for n in 0..2 {
            for half in 0..2 {
                let mut t: [[__m256i; 4]; N] = array(|bi| {
                    array(|c| _mm256_set1_epi32(-32 * bs[bi][8 * n + 2 * c + half] as i32))
                });
                for q in 4 * half..4 * half + 4 {
                    let u = unsafe { qk.add(192 * (8 * n + q)) };
                    let l0 = unsafe { _mm256_loadu_si256(u.cast()) };
                    let l1 = unsafe { _mm256_loadu_si256(u.add(64).cast()) };
                    let h = unsafe { _mm256_loadu_si256(u.add(128).cast()) };
                    let v = [
                        _mm256_or_si256(
                            _mm256_and_si256(l0, low),
                            _mm256_and_si256(_mm256_slli_epi16(h, 4), pair),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(l1, low),
                            _mm256_and_si256(_mm256_slli_epi16(h, 2), pair),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16(l0, 4), low),
                            _mm256_and_si256(h, pair),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16(l1, 4), low),
                            _mm256_and_si256(_mm256_srli_epi16(h, 2), pair),
                        ),
                    ];
                    for bi in 0..N {
                        for c in 0..4 {
                            let av = _mm256_set1_epi32(unsafe {
                                quad(y[bi].add(128 * n + 32 * c + 4 * q))
                            });
                            let pr = _mm256_maddubs_epi16(v[c], av);
                            t[bi][c] = _mm256_add_epi32(t[bi][c], _mm256_madd_epi16(pr, ones));
                        }
                    }
                }
                for c in 0..4 {
                    let s = 8 * n + 2 * c + half;
                    let sc =
                        _mm256_cvtepi8_epi32(unsafe { _mm_loadl_epi64(sck.add(16 * s).cast()) });
                    for bi in 0..N {
                        isum[bi] = _mm256_add_epi32(isum[bi], _mm256_mullo_epi32(t[bi][c], sc));
                    }
                }
            }
        }
        let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p.d.add(k * BAND + 8 * rows).cast()) });
        for bi in 0..N {
            let da = _mm256_set1_ps(unsafe { *p.kd[bi].add(k) });
            acc[bi] = _mm256_fmadd_ps(_mm256_mul_ps(da, dw), _mm256_cvtepi32_ps(isum[bi]), acc[bi]);
        }
    }
    let mut res = [[0f32; 8]; 4];
    for bi in 0..N {
        // SAFETY: 8 `f32` of `res[bi]` are writable.
        unsafe { _mm256_storeu_ps(res[bi].as_mut_ptr(), acc[bi]) };
    }
    res
}
