//! The band kernels of Q4_K × Q8_K on x86-64: AVX-512 with VNNI, AVX-512 BW, AVX2.
//!
//! Each computes the [module docs'](super) arithmetic for the sixteen rows of one band and up
//! to four activation rows; only the exact integer sums are computed differently:
//!
//! * **VNNI**: `vpdpbusd` of a 64-byte unit's low (high) nibbles against four activation bytes
//!   of group `2j` (`2j + 1`) broadcast to every lane adds four products to each row's lane;
//!   after sixteen positions (each lane at most `16 · 15 · 127 < 2^15`, so its low 16 bits are
//!   its value) one `vpdpwssd` with the group's scales in the low halves of the lanes adds
//!   `sc_g ·` that sum to `isum`;
//! * **AVX-512 BW and AVX2**: `vpmaddubsw` pairs (at most `2 · 15 · 127`) summed in `i16` over
//!   a whole group (at most `8 · 3810 < 2^15`), then one `vpmaddwd` with the scale in both
//!   halves of each lane. AVX2 holds eight rows per register and takes the band's halves one
//!   after the other.
//!
//! The mins' part is one `vpmaddwd` per group pair: `(m_{2j}, m_{2j+1})` in each row's lane
//! against the activation's two group sums; then the two fused multiply-adds of the module
//! docs on sixteen (eight) rows' outputs at once.
// Register tiles are indexed by activation (`acc[bi]`); index loops read best.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::{BAND, BAND_QS};
use crate::kernels::band::{in_fours, join_halves, quad, rows, rows4, TILE};
use crate::kernels::{array, Acts, QMatrix};

/// The activations' two group sums of group pair `j` of super-block `bs`, as the `i16` pair
/// of one lane: `(bs_{4j} + bs_{4j+1}, bs_{4j+2} + bs_{4j+3})` (each at most `32 · 127`).
#[inline(always)]
fn group_pair(bs: &[i16; 16], j: usize) -> i32 {
    let g0 = bs[4 * j] as i32 + bs[4 * j + 1] as i32;
    let g1 = bs[4 * j + 2] as i32 + bs[4 * j + 3] as i32;
    (g0 as u16 as u32 | (g1 as u16 as u32) << 16) as i32
}

/// The pointers and bounds one band kernel reads, checked once.
struct Band<const N: usize> {
    nb: usize,
    qs: *const u8,
    sc: *const u8,
    d: *const u16,
    m: *const u16,
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
        assert!(w.qchunks == 4 * nb && w.qs.len() >= q0 + 64 * nb);
        assert!(w.sc.len() >= s0 + BAND * nb);
        assert!(w.nbp >= nb && w.d.len() >= d0 + BAND * nb && w.m.len() >= d0 + BAND * nb);
        assert!(a.knb == nb && b0 + N <= a.n);
        assert!(a.kq.len() >= a.n * nb * 8 && a.kd.len() >= a.n * nb && a.kbs.len() >= a.n * nb);
        Band {
            nb,
            qs: w.qs[q0..].as_ptr().cast(),
            sc: w.sc[s0..].as_ptr().cast(),
            d: w.d[d0..].as_ptr(),
            m: w.m[d0..].as_ptr(),
            kq: array(|bi| a.kq[(b0 + bi) * nb * 8..].as_ptr().cast()),
            kd: array(|bi| a.kd[(b0 + bi) * nb..].as_ptr()),
            kbs: array(|bi| a.kbs[(b0 + bi) * nb..].as_ptr()),
        }
    }
}

/// The band's dots with activation rows `b0..b0 + n` (`1 ≤ n ≤ TILE`), with VNNI: past four
/// rows the sums no longer fit the registers and spill, but the weights are read once.
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

/// The band's dots with activation rows `b0..b0 + n` (`1 ≤ n ≤ TILE`, four at a time), AVX-512 BW.
///
/// # Safety
/// [`Level::Avx512`](crate::kernels::Level::Avx512) must be effective.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn band_bw(
    w: &QMatrix,
    band: usize,
    a: &Acts<'_>,
    b0: usize,
    n: usize,
) -> [[f32; BAND]; TILE] {
    in_fours(n, |o, m| rows4!(m, N => bw::<N>(w, band, a, b0 + o)))
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

/// `acc + vpmaddwd(x, s)` as one `vpdpwssd`. Written as assembly: the compiler otherwise
/// splits it into `vpmaddwd` + `vpaddd` for a generic x86-64 target.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn dpwssd(mut acc: __m512i, x: __m512i, s: __m512i) -> __m512i {
    // SAFETY: `vpdpwssd` on registers only; the caller's features include AVX-512 VNNI.
    unsafe {
        std::arch::asm!(
            "vpdpwssd {acc}, {x}, {s}",
            acc = inout(zmm_reg) acc,
            x = in(zmm_reg) x,
            s = in(zmm_reg) s,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// `−x`, exactly (the sign bit flipped).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
#[inline]
fn neg512(x: __m512) -> __m512 {
    _mm512_castsi512_ps(_mm512_xor_si512(
        _mm512_castps_si512(x),
        _mm512_set1_epi32(i32::MIN),
    ))
}

/// The float step of the module docs for sixteen rows, then the result.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
#[inline]
fn step512(acc: __m512, da: f32, dw: __m512, dm: __m512, isum: __m512i, imin: __m512i) -> __m512 {
    let da = _mm512_set1_ps(da);
    let acc = _mm512_fmadd_ps(_mm512_mul_ps(da, dw), _mm512_cvtepi32_ps(isum), acc);
    _mm512_fmadd_ps(neg512(_mm512_mul_ps(da, dm)), _mm512_cvtepi32_ps(imin), acc)
}

/// Sixteen rows' outputs out of `acc`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
#[inline]
fn store512<const N: usize>(acc: &[__m512; N]) -> [[f32; BAND]; TILE] {
    let mut res = [[0f32; BAND]; TILE];
    for bi in 0..N {
        // SAFETY: 16 `f32` of `res[bi]` are writable.
        unsafe { _mm512_storeu_ps(res[bi].as_mut_ptr(), acc[bi]) };
    }
    res
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline(never)]
fn vnni<const N: usize>(w: &QMatrix, band: usize, a: &Acts<'_>, b0: usize) -> [[f32; BAND]; TILE] {
    let p = Band::<N>::new(w, band, a, b0);
    let mask = _mm512_set1_epi8(0x0F);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); N];
    // SAFETY (every access below): `k < nb`, `j < 4`, `pos < 8`, `bi < N`: each pointer stays
    // within the band's super-block `k` or the activation row's super-block `k` (checked in
    // `Band::new`).
    for k in 0..p.nb {
        let q = unsafe { p.qs.add(k * BAND_QS) };
        let s = unsafe { p.sc.add(k * 16 * BAND) };
        let y: [*const u8; N] = array(|bi| unsafe { p.kq[bi].add(k * 256) });
        let mut isum = [zero; N];
        for j in 0..4 {
            let s_lo = _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(s.add(32 * j).cast()) });
            let s_hi = _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(s.add(32 * j + 16).cast()) });
            for half in 0..2 {
                let mut dlo = [zero; N];
                let mut dhi = [zero; N];
                for pos in 4 * half..4 * half + 4 {
                    let c = unsafe { _mm512_loadu_si512(q.add((8 * j + pos) * 64).cast()) };
                    let lo = _mm512_and_si512(c, mask);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(c), mask);
                    for bi in 0..N {
                        let at = unsafe { y[bi].add(64 * j + 4 * pos) };
                        let alo = _mm512_set1_epi32(unsafe { quad(at) });
                        let ahi = _mm512_set1_epi32(unsafe { quad(at.add(32)) });
                        dlo[bi] = _mm512_dpbusd_epi32(dlo[bi], lo, alo);
                        dhi[bi] = _mm512_dpbusd_epi32(dhi[bi], hi, ahi);
                    }
                }
                for bi in 0..N {
                    isum[bi] = dpwssd(isum[bi], dlo[bi], s_lo);
                    isum[bi] = dpwssd(isum[bi], dhi[bi], s_hi);
                }
            }
        }
        let mv: [__m512i; 4] = array(|j| {
            _mm512_cvtepu8_epi16(unsafe { _mm256_loadu_si256(s.add(128 + 32 * j).cast()) })
        });
        let dw = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.d.add(k * BAND).cast()) });
        let dm = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.m.add(k * BAND).cast()) });
        for bi in 0..N {
            let bs = unsafe { &*p.kbs[bi].add(k) };
            let mut imin = zero;
            for j in 0..4 {
                imin = dpwssd(imin, mv[j], _mm512_set1_epi32(group_pair(bs, j)));
            }
            let da = unsafe { *p.kd[bi].add(k) };
            acc[bi] = step512(acc[bi], da, dw, dm, isum[bi], imin);
        }
    }
    store512(&acc)
}

/// The scales of sixteen rows (bytes at `s`) in both `i16` halves of each row's lane.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
#[inline]
fn scales16(s: __m128i) -> __m512i {
    let x = _mm512_cvtepu8_epi32(s);
    _mm512_or_si512(x, _mm512_slli_epi32::<16>(x))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
#[inline(never)]
fn bw<const N: usize>(w: &QMatrix, band: usize, a: &Acts<'_>, b0: usize) -> [[f32; BAND]; TILE] {
    let p = Band::<N>::new(w, band, a, b0);
    let mask = _mm512_set1_epi8(0x0F);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); N];
    // SAFETY (every access below): as in `vnni`.
    for k in 0..p.nb {
        let q = unsafe { p.qs.add(k * BAND_QS) };
        let s = unsafe { p.sc.add(k * 16 * BAND) };
        let y: [*const u8; N] = array(|bi| unsafe { p.kq[bi].add(k * 256) });
        let mut isum = [zero; N];
        for j in 0..4 {
            let s_lo = scales16(unsafe { _mm_loadu_si128(s.add(32 * j).cast()) });
            let s_hi = scales16(unsafe { _mm_loadu_si128(s.add(32 * j + 16).cast()) });
            let mut dlo = [zero; N];
            let mut dhi = [zero; N];
            for pos in 0..8 {
                let c = unsafe { _mm512_loadu_si512(q.add((8 * j + pos) * 64).cast()) };
                let lo = _mm512_and_si512(c, mask);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(c), mask);
                for bi in 0..N {
                    let at = unsafe { y[bi].add(64 * j + 4 * pos) };
                    let alo = _mm512_set1_epi32(unsafe { quad(at) });
                    let ahi = _mm512_set1_epi32(unsafe { quad(at.add(32)) });
                    dlo[bi] = _mm512_add_epi16(dlo[bi], _mm512_maddubs_epi16(lo, alo));
                    dhi[bi] = _mm512_add_epi16(dhi[bi], _mm512_maddubs_epi16(hi, ahi));
                }
            }
            for bi in 0..N {
                isum[bi] = _mm512_add_epi32(isum[bi], _mm512_madd_epi16(dlo[bi], s_lo));
                isum[bi] = _mm512_add_epi32(isum[bi], _mm512_madd_epi16(dhi[bi], s_hi));
            }
        }
        let mv: [__m512i; 4] = array(|j| {
            _mm512_cvtepu8_epi16(unsafe { _mm256_loadu_si256(s.add(128 + 32 * j).cast()) })
        });
        let dw = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.d.add(k * BAND).cast()) });
        let dm = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.m.add(k * BAND).cast()) });
        for bi in 0..N {
            let bs = unsafe { &*p.kbs[bi].add(k) };
            let mut imin = zero;
            for j in 0..4 {
                let g = _mm512_set1_epi32(group_pair(bs, j));
                imin = _mm512_add_epi32(imin, _mm512_madd_epi16(mv[j], g));
            }
            let da = unsafe { *p.kd[bi].add(k) };
            acc[bi] = step512(acc[bi], da, dw, dm, isum[bi], imin);
        }
    }
    store512(&acc)
}

/// Half `half` (rows `8 · half..8 · half + 8`) of the band on AVX2; each group's nibbles are
/// read in their own pass (low, then high), which keeps the tile in sixteen registers.
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
    let mask = _mm256_set1_epi8(0x0F);
    let zero = _mm256_setzero_si256();
    let sign = _mm256_set1_epi32(i32::MIN);
    let mut acc = [_mm256_setzero_ps(); N];
    // SAFETY (every access below): as in `vnni`; `half < 2` selects 32 of each unit's 64
    // bytes, 8 of each 16-byte scale row, one of each pair of min rows, 8 of 16 scales.
    for k in 0..p.nb {
        let q = unsafe { p.qs.add(k * BAND_QS + 32 * half) };
        let s = unsafe { p.sc.add(k * 16 * BAND) };
        let y: [*const u8; N] = array(|bi| unsafe { p.kq[bi].add(k * 256) });
        let mut isum = [zero; N];
        for g in 0..8 {
            let (j, high) = (g / 2, g % 2);
            let sg =
                _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(s.add(16 * g + 8 * half).cast()) });
            let sg = _mm256_or_si256(sg, _mm256_slli_epi32::<16>(sg));
            let mut dg = [zero; N];
            for pos in 0..8 {
                let c = unsafe { _mm256_loadu_si256(q.add((8 * j + pos) * 64).cast()) };
                let u = if high == 1 {
                    _mm256_and_si256(_mm256_srli_epi16::<4>(c), mask)
                } else {
                    _mm256_and_si256(c, mask)
                };
                for bi in 0..N {
                    let at = unsafe { y[bi].add(32 * g + 4 * pos) };
                    let av = _mm256_set1_epi32(unsafe { quad(at) });
                    dg[bi] = _mm256_add_epi16(dg[bi], _mm256_maddubs_epi16(u, av));
                }
            }
            for bi in 0..N {
                isum[bi] = _mm256_add_epi32(isum[bi], _mm256_madd_epi16(dg[bi], sg));
            }
        }
        let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p.d.add(k * BAND + 8 * half).cast()) });
        let dm = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p.m.add(k * BAND + 8 * half).cast()) });
        for bi in 0..N {
            let bs = unsafe { &*p.kbs[bi].add(k) };
            let mut imin = zero;
            for j in 0..4 {
                let mv = _mm256_cvtepu8_epi16(unsafe {
                    _mm_loadu_si128(s.add(128 + 32 * j + 16 * half).cast())
                });
                let g = _mm256_set1_epi32(group_pair(bs, j));
                imin = _mm256_add_epi32(imin, _mm256_madd_epi16(mv, g));
            }
            let da = _mm256_set1_ps(unsafe { *p.kd[bi].add(k) });
            let a1 = _mm256_fmadd_ps(_mm256_mul_ps(da, dw), _mm256_cvtepi32_ps(isum[bi]), acc[bi]);
            let nm = _mm256_castsi256_ps(_mm256_xor_si256(
                _mm256_castps_si256(_mm256_mul_ps(da, dm)),
                sign,
            ));
            acc[bi] = _mm256_fmadd_ps(nm, _mm256_cvtepi32_ps(imin), a1);
        }
    }
    let mut res = [[0f32; 8]; 4];
    for bi in 0..N {
        // SAFETY: 8 `f32` of `res[bi]` are writable.
        unsafe { _mm256_storeu_ps(res[bi].as_mut_ptr(), acc[bi]) };
    }
    res
}
