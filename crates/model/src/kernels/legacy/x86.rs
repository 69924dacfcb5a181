//! The band kernels of Q4_0, Q4_1, Q5_0 and Q5_1 × Q8_0 / Q8_1 on x86-64: AVX-512 with VNNI,
//! and AVX2 (which the AVX-512 level without VNNI runs too).
//!
//! Each computes the [module docs'](super) arithmetic for the sixteen rows of one band and up
//! to four activation rows; only the exact integer sums are computed differently. The quants
//! are unsigned (`q`, the nibble with its fifth bit), so `Σ w·a = Σ q·a − offset · Σ a`: a
//! block's sum starts from `−offset · Σ a` (the activations' exact block sum) and adds `q · a`:
//!
//! * **VNNI**: `vpdpbusd` of a unit's low (high) nibbles against activation bytes
//!   `4p..4p + 4` (`16 + 4p..`) broadcast to every lane; Q5's fifth bit by a masked byte add;
//! * **AVX2**: eight rows a register, `vpmaddubsw(q, a)` for the low and the high nibbles
//!   (each pair at most `2 · 31 · 127`, both together below 2^15) and `vpmaddwd` by ones; the
//!   band's halves one after the other.
// Register tiles are indexed by activation (`acc[bi]`); index loops read best.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::{has_high, has_min, offset, BAND, BAND_CHUNKS};
use crate::kernels::band::{in_fours, join_halves, quad, rows, rows4, TILE};
use crate::kernels::{array, Acts, QMatrix};

/// Bytes of one band's nibbles per block.
const BAND_QS: usize = BAND_CHUNKS * 32;

/// The pointers one band kernel reads, checked once.
struct Band<const N: usize> {
    nb: usize,
    qs: *const u8,
    d: *const u16,
    m: *const u16,
    qh: *const u32,
    q: [*const u8; N],
    ad: [*const f32; N],
    qsum: [*const i32; N],
    /// `s` of block `k` for activation row `b0 + bi`: `s[k · np4 + bi]`.
    s: *const f32,
    np4: usize,
}

impl<const N: usize> Band<N> {
    /// Checks that band `band` of `w` and activation rows `b0..b0 + N` of `a` are in bounds.
    #[inline(always)]
    fn new(w: &QMatrix, band: usize, a: &Acts<'_>, b0: usize) -> Self {
        let nb = w.nb;
        let (q0, d0, h0) = (
            band * BAND * w.qchunks,
            band * BAND * w.nbp,
            band * BAND * nb,
        );
        assert!(BAND * w.qchunks >= BAND_CHUNKS * nb && w.qs.len() >= q0 + BAND_CHUNKS * nb);
        assert!(w.nbp >= nb && w.d.len() >= d0 + BAND * nb);
        if has_min(w.format) {
            assert!(w.m.len() >= d0 + BAND * nb);
            assert!(b0 + N <= a.np4 && a.s.len() >= nb * a.np4);
        }
        if has_high(w.format) {
            assert!(w.qh.len() >= h0 + BAND * nb);
        }
        assert!(a.nb == nb && b0 + N <= a.n && a.nbp >= nb);
        assert!(a.q.len() >= a.n * nb && a.d.len() >= a.n * a.nbp && a.qsum.len() >= a.n * nb);
        Band {
            nb,
            qs: w.qs[q0..].as_ptr().cast(),
            d: w.d[d0..].as_ptr(),
            m: if has_min(w.format) {
                w.m[d0..].as_ptr()
            } else {
                std::ptr::null()
            },
            qh: if has_high(w.format) {
                w.qh[h0..].as_ptr()
            } else {
                std::ptr::null()
            },
            q: array(|bi| a.q[(b0 + bi) * nb..].as_ptr().cast()),
            ad: array(|bi| a.d[(b0 + bi) * a.nbp..].as_ptr()),
            qsum: array(|bi| a.qsum[(b0 + bi) * nb..].as_ptr()),
            s: if has_min(w.format) {
                a.s[b0..].as_ptr()
            } else {
                std::ptr::null()
            },
            np4: a.np4,
        }
    }
}

/// Runs `$kernel::<N, MIN, HIGH>` for `w`'s format and `n` activation rows, `N` bound by
/// `$rows` ([`rows!`] or [`rows4!`]).
macro_rules! by_format {
    ($rows:ident, $kernel:ident, $w:expr, $n:expr, ($($arg:expr),*)) => {{
        $rows!($n, N => match (has_min($w.format), has_high($w.format)) {
            (false, false) => $kernel::<N, false, false>($($arg),*),
            (true, false) => $kernel::<N, true, false>($($arg),*),
            (false, true) => $kernel::<N, false, true>($($arg),*),
            (true, true) => $kernel::<N, true, true>($($arg),*),
        })
    }};
}

/// The band's dots with activation rows `b0..b0 + n` (`1 ≤ n ≤ TILE`), with VNNI: eight
/// rows' sums and eight accumulators fit the 32 registers beside the unpacked nibbles.
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
    by_format!(rows, vnni, w, n, (w, band, a, b0))
}

/// The band's dots with activation rows `b0..b0 + n` (`1 ≤ n ≤ TILE`), AVX2, four at a time.
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
        join_halves(|half| by_format!(rows4, avx2, w, m, (w, band, half, a, b0 + o)))
    })
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline(never)]
fn vnni<const N: usize, const MIN: bool, const HIGH: bool>(
    w: &QMatrix,
    band: usize,
    a: &Acts<'_>,
    b0: usize,
) -> [[f32; BAND]; TILE] {
    let p = Band::<N>::new(w, band, a, b0);
    let off = offset(w.format);
    let low = _mm512_set1_epi8(0x0F);
    let fifth = _mm512_set1_epi8(16);
    let mut acc = [_mm512_setzero_ps(); N];
    // SAFETY (every access below): `k < nb`, `u < 4`, `bi < N`: each pointer stays within the
    // band's block `k` (its 256 nibble bytes, its 16 scales, its eight masks) or the activation
    // row's block `k` (checked in `Band::new`; `m`, `qh` and `s` are read only when the format
    // has them, which is when they were checked).
    for k in 0..p.nb {
        let q = unsafe { p.qs.add(k * BAND_QS) };
        let y: [*const u8; N] = array(|bi| unsafe { p.q[bi].add(32 * k) });
        let mut isum: [__m512i; N] =
            array(|bi| _mm512_set1_epi32(-off * unsafe { *p.qsum[bi].add(k) }));
        for u in 0..4 {
            let c = unsafe { _mm512_loadu_si512(q.add(64 * u).cast()) };
            let mut lo = _mm512_and_si512(c, low);
            let mut hi = _mm512_and_si512(_mm512_srli_epi16(c, 4), low);
            if HIGH {
                let mk = unsafe { p.qh.add(BAND * k + 4 * u).cast::<u64>() };
                let (mlo, mhi) = unsafe { (mk.read_unaligned(), mk.add(1).read_unaligned()) };
                lo = _mm512_mask_add_epi8(lo, mlo, lo, fifth);
                hi = _mm512_mask_add_epi8(hi, mhi, hi, fifth);
            }
            for bi in 0..N {
                let al = _mm512_set1_epi32(unsafe { quad(y[bi].add(4 * u)) });
                let ah = _mm512_set1_epi32(unsafe { quad(y[bi].add(16 + 4 * u)) });
                isum[bi] = _mm512_dpbusd_epi32(isum[bi], lo, al);
                isum[bi] = _mm512_dpbusd_epi32(isum[bi], hi, ah);
            }
        }
        let dw = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.d.add(k * BAND).cast()) });
        for bi in 0..N {
            let da = _mm512_set1_ps(unsafe { *p.ad[bi].add(k) });
            acc[bi] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(isum[bi]), acc[bi]);
        }
        if MIN {
            let mw = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.m.add(k * BAND).cast()) });
            for bi in 0..N {
                let sa = _mm512_set1_ps(unsafe { *p.s.add(k * p.np4 + bi) });
                acc[bi] = _mm512_fmadd_ps(mw, sa, acc[bi]);
            }
        }
    }
    let mut res = [[0f32; BAND]; TILE];
    for bi in 0..N {
        // SAFETY: 16 `f32` of `res[bi]` are writable.
        unsafe { _mm512_storeu_ps(res[bi].as_mut_ptr(), acc[bi]) };
    }
    res
}

/// `16` in byte `i` where bit `i` of `x` is set, else zero.
#[target_feature(enable = "avx2")]
#[inline]
fn fifth_bits(x: u32) -> __m256i {
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi8(16))
}

/// Half `half` (rows `8 · half..8 · half + 8`) of the band on AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline(never)]
fn avx2<const N: usize, const MIN: bool, const HIGH: bool>(
    w: &QMatrix,
    band: usize,
    half: usize,
    a: &Acts<'_>,
    b0: usize,
) -> [[f32; 8]; 4] {
    let p = Band::<N>::new(w, band, a, b0);
    let off = offset(w.format);
    let low = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); N];
    // SAFETY (every access below): as in `vnni`; `half < 2` selects 32 of each unit's 64 bytes,
    // 8 of the 16 scales and one 32-bit half of each mask.
    for k in 0..p.nb {
        let q = unsafe { p.qs.add(k * BAND_QS + 32 * half) };
        let y: [*const u8; N] = array(|bi| unsafe { p.q[bi].add(32 * k) });
        let mut isum: [__m256i; N] =
            array(|bi| _mm256_set1_epi32(-off * unsafe { *p.qsum[bi].add(k) }));
        for u in 0..4 {
            let c = unsafe { _mm256_loadu_si256(q.add(64 * u).cast()) };
            let mut lo = _mm256_and_si256(c, low);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), low);
            if HIGH {
                let mk = unsafe { p.qh.add(BAND * k + 4 * u + half) };
                let (mlo, mhi) = unsafe { (*mk, *mk.add(2)) };
                lo = _mm256_or_si256(lo, fifth_bits(mlo));
                hi = _mm256_or_si256(hi, fifth_bits(mhi));
            }
            for bi in 0..N {
                let al = _mm256_set1_epi32(unsafe { quad(y[bi].add(4 * u)) });
                let ah = _mm256_set1_epi32(unsafe { quad(y[bi].add(16 + 4 * u)) });
                let pr =
                    _mm256_add_epi16(_mm256_maddubs_epi16(lo, al), _mm256_maddubs_epi16(hi, ah));
                isum[bi] = _mm256_add_epi32(isum[bi], _mm256_madd_epi16(pr, ones));
            }
        }
        let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p.d.add(k * BAND + 8 * half).cast()) });
        for bi in 0..N {
            let da = _mm256_set1_ps(unsafe { *p.ad[bi].add(k) });
            acc[bi] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(isum[bi]), acc[bi]);
        }
        if MIN {
            let mw =
                _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p.m.add(k * BAND + 8 * half).cast()) });
            for bi in 0..N {
                let sa = _mm256_set1_ps(unsafe { *p.s.add(k * p.np4 + bi) });
                acc[bi] = _mm256_fmadd_ps(mw, sa, acc[bi]);
            }
        }
    }
    let mut res = [[0f32; 8]; 4];
    for bi in 0..N {
        // SAFETY: 8 `f32` of `res[bi]` are writable.
        unsafe { _mm256_storeu_ps(res[bi].as_mut_ptr(), acc[bi]) };
    }
    res
}
