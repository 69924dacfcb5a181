//! The AVX2 kernels, written with intrinsics: the band collection (the compiler does not find
//! the packing permutations on its own) and the `exp` passes (the compiler's vectorisation of
//! the portable code keeps the lane sums in memory and reloads every constant). Every function
//! here requires AVX2, BMI1, POPCNT and FMA: the dispatch in [`super`] calls them only at an
//! [`Isa`](super::Isa) of [`Level::Avx2`](crate::cpu::Level::Avx2) or above. The `exp` is the
//! portable [`exp_f32`] operation for operation (fused multiply-adds exactly where it has
//! `mul_add`), so it gives the same bits.

use std::arch::x86_64::*;

use super::common::{
    exp_f32, Cand, EXP_BIAS, EXP_C1, EXP_C2, EXP_CLAMP, EXP_F32_FLUSH, EXP_LOG2E, EXP_MAGIC, EXP_P,
};
use super::{Band, BLOCK};

/// The first half of [`exp_f32`] on 8 lanes: from `x` the reduced argument `r` and the scale
/// `2^n`, the same operations in the same order as the scalar code. The selection differs
/// only in form: the clamp is `min(88, x)` (which keeps a NaN, as the scalar code's comparison
/// does), and a flushed lane (`x < -87`) computes from `0.0`, as the scalar code does, with its
/// scale replaced by `+0.0`, so that [`exp_back`] ends it at `1.0 · +0.0 = +0.0`, the scalar
/// code's result. Without `CLAMP` only for inputs `<= 0` (then `min(88, x)` is `x`).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp_front<const CLAMP: bool>(x: __m256) -> (__m256, __m256) {
    // `x < -87` (false for a NaN lane, which computes NaN as the scalar code does)
    let flush = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(EXP_F32_FLUSH));
    let xc = if CLAMP {
        _mm256_min_ps(_mm256_set1_ps(EXP_CLAMP), x)
    } else {
        x
    };
    let xc = _mm256_andnot_ps(flush, xc);
    let t = _mm256_add_ps(
        _mm256_mul_ps(xc, _mm256_set1_ps(EXP_LOG2E)),
        _mm256_set1_ps(EXP_MAGIC),
    );
    let bits = _mm256_add_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(EXP_BIAS as i32));
    let pow2 = _mm256_andnot_ps(flush, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(bits)));
    let n = _mm256_sub_ps(t, _mm256_set1_ps(EXP_MAGIC));
    // (-n)·C2 + ((-n)·C1 + x), each a single rounding
    let r = _mm256_fnmadd_ps(
        n,
        _mm256_set1_ps(EXP_C2),
        _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_C1), xc),
    );
    (r, pow2)
}

/// The second half of [`exp_f32`] on 8 lanes: the polynomial in `r`, scaled by `pow2` (both
/// from [`exp_front`]).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp_back(r: __m256, pow2: __m256) -> __m256 {
    let mut y = _mm256_set1_ps(EXP_P[0]);
    for &c in &EXP_P[1..] {
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
    }
    let z = _mm256_mul_ps(r, r);
    let y = _mm256_add_ps(_mm256_fmadd_ps(y, z, r), _mm256_set1_ps(1.0));
    _mm256_mul_ps(y, pow2)
}

/// [`exp_f32`] on four vectors of 8 lanes ([`exp_front`] then [`exp_back`]): the same bits for
/// every input (the unit test `exp8x4_matches_scalar` checks every 61st bit pattern and the
/// edges; `exp8x4_matches_scalar_everywhere` every input). Without `CLAMP` only for inputs
/// `<= 0`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn exp8x4<const CLAMP: bool>(x: [__m256; 4]) -> [__m256; 4] {
    let f = x.map(|x| exp_front::<CLAMP>(x));
    f.map(|(r, pow2)| exp_back(r, pow2))
}

/// Adds the 8 lanes of `e` to the 8 `f64` lanes `(lo, hi)`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn add_lanes8(acc: (__m256d, __m256d), e: __m256) -> (__m256d, __m256d) {
    let lo = _mm256_cvtps_pd(_mm256_castps256_ps128(e));
    let hi = _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(e));
    (_mm256_add_pd(acc.0, lo), _mm256_add_pd(acc.1, hi))
}

/// Values per step of [`exp_blocks`]: 8 vectors.
const EXP_STEP: usize = 64;

/// `w[i] = exp_f32(z[i] - m)` over the whole blocks of [`EXP_STEP`] values (nothing is stored
/// when `w` is `None`); the lane sums of [`super::sum_f64_lanes`] continue in `acc`. Returns the
/// number of values covered.
///
/// Software pipelined: each step computes the first half of the `exp` ([`exp_front`]) of the
/// next block and the second half ([`exp_back`]), the store and the sums of the current one, so
/// that the two halves of the long dependency chain overlap (measured 10–20 % faster than four
/// vectors through the whole chain at a time, alternating in one process; 4, 6, 12 or 16
/// vectors per step were slower). The sums still run block after block, vector after vector:
/// the same order, the same bits.
#[target_feature(enable = "avx2,fma")]
pub(super) fn exp_blocks<const CLAMP: bool>(
    z: &[f32],
    m: f32,
    w: Option<&mut [f32]>,
    acc: &mut [f64; 8],
) -> usize {
    // one loop with the stores, one without (a test inside the loop would split it into
    // basic blocks that the compiler schedules one after the other)
    match w {
        Some(w) => exp_steps::<CLAMP, true>(z, m, w, acc),
        None => exp_steps::<CLAMP, false>(z, m, &mut [], acc),
    }
}

/// [`exp_blocks`], storing the weights into `w` when `STORE`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp_steps<const CLAMP: bool, const STORE: bool>(
    z: &[f32],
    m: f32,
    w: &mut [f32],
    acc: &mut [f64; 8],
) -> usize {
    const V: usize = EXP_STEP / 8;
    let n = if STORE { z.len().min(w.len()) } else { z.len() } / EXP_STEP * EXP_STEP;
    if n == 0 {
        return 0;
    }
    let vm = _mm256_set1_ps(m);
    // SAFETY: `acc` holds 8 `f64`s, two vectors of 4.
    let mut a = unsafe {
        (
            _mm256_loadu_pd(acc.as_ptr()),
            _mm256_loadu_pd(acc.as_ptr().add(4)),
        )
    };
    let front = |i: usize| {
        debug_assert!(i + EXP_STEP <= n);
        let p = z.as_ptr();
        let mut f = [(_mm256_setzero_ps(), _mm256_setzero_ps()); V];
        for (k, f) in f.iter_mut().enumerate() {
            // SAFETY: `i + EXP_STEP <= n <= z.len()` (`i` is a multiple of `EXP_STEP` below
            // `n`), so the load reads `z[i + 8 k..][..8]` inside `z`.
            let x = unsafe { _mm256_loadu_ps(p.add(i + 8 * k)) };
            *f = exp_front::<CLAMP>(_mm256_sub_ps(x, vm));
        }
        f
    };
    let mut back = |i: usize, f: [(__m256, __m256); V]| {
        for (k, (r, pow2)) in f.into_iter().enumerate() {
            let e = exp_back(r, pow2);
            if STORE {
                // SAFETY: `i + EXP_STEP <= n <= w.len()` (with `STORE`): the store writes
                // `w[i + 8 k..][..8]`.
                unsafe { _mm256_storeu_ps(w.as_mut_ptr().add(i + 8 * k), e) };
            }
            a = add_lanes8(a, e);
        }
    };
    let mut cur = front(0);
    let mut i = 0;
    while i + EXP_STEP < n {
        let next = front(i + EXP_STEP);
        back(i, cur);
        cur = next;
        i += EXP_STEP;
    }
    back(i, cur);
    // SAFETY: `acc` holds 8 `f64`s, two vectors of 4.
    unsafe {
        _mm256_storeu_pd(acc.as_mut_ptr(), a.0);
        _mm256_storeu_pd(acc.as_mut_ptr().add(4), a.1);
    }
    n
}

/// [`super::cand_weights`] on 8 lanes, 32 candidates at a time (`w` at least as long as `c`,
/// checked).
#[target_feature(enable = "avx2,fma")]
pub(super) fn cand_weights(c: &[Cand], m: f32, w: &mut [f32]) -> [f64; 8] {
    assert!(w.len() >= c.len());
    let vm = _mm256_set1_ps(m);
    let n = c.len() / 32 * 32;
    let (mut lo, mut hi) = (_mm256_setzero_pd(), _mm256_setzero_pd());
    let mut i = 0;
    while i < n {
        let f = c.as_ptr().cast::<f32>();
        // SAFETY: `i + 32 <= n <= c.len()`: `c[i..i + 32]` is 64 `f32`s (`Cand` is `repr(C)`
        // `(u32, f32)`, 8 bytes without padding) from `f.add(2 * i)`; the eight loads read them.
        let v = unsafe {
            let f = f.add(2 * i);
            [
                _mm256_loadu_ps(f),
                _mm256_loadu_ps(f.add(8)),
                _mm256_loadu_ps(f.add(16)),
                _mm256_loadu_ps(f.add(24)),
                _mm256_loadu_ps(f.add(32)),
                _mm256_loadu_ps(f.add(40)),
                _mm256_loadu_ps(f.add(48)),
                _mm256_loadu_ps(f.add(56)),
            ]
        };
        // the odd slots of two vectors (`z0 z1 z4 z5 | z2 z3 z6 z7`), then back in order
        let z8 = |a: __m256, b: __m256| {
            let odd = _mm256_shuffle_ps::<0b11_01_11_01>(a, b);
            let ordered = _mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(odd));
            _mm256_sub_ps(_mm256_castpd_ps(ordered), vm)
        };
        let e = exp8x4::<true>([
            z8(v[0], v[1]),
            z8(v[2], v[3]),
            z8(v[4], v[5]),
            z8(v[6], v[7]),
        ]);
        let q = w.as_mut_ptr();
        for (k, e) in e.iter().enumerate() {
            // SAFETY: `i + 32 <= c.len() <= w.len()`: the store writes `w[i + 8 k..][..8]`.
            unsafe { _mm256_storeu_ps(q.add(i + 8 * k), *e) };
            lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(*e)));
            hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(*e)));
        }
        i += 32;
    }
    let mut lanes = [0.0f64; 8];
    // SAFETY: `lanes` is 8 `f64`s (two vectors of 4).
    unsafe {
        _mm256_storeu_pd(lanes.as_mut_ptr(), lo);
        _mm256_storeu_pd(lanes.as_mut_ptr().add(4), hi);
    }
    for (j, (x, o)) in c[n..].iter().zip(w[n..].iter_mut()).enumerate() {
        *o = exp_f32(x.z - m);
        lanes[j % 8] += *o as f64;
    }
    lanes
}

/// The packing loop of [`filter_upto`] and [`split_heavy`]: for every 8 candidates (loaded as
/// two vectors of four whole `Cand`s) and their weights, `keep` gives the mask of the lanes to
/// keep; those candidates (permuted by [`COMPRESS_PAIRS`]) and weights (by [`COMPRESS8`]) are
/// packed to the front and stored, the length advancing by the number kept. `tail` decides the
/// candidates after the last whole 8 one at a time (with their index). `out` is set to the kept
/// candidates and `out_w` starts with their weights; `out` must have room for `c.len()`
/// candidates and `out_w` at least `c.len()` values (checked). Returns how many were kept.
#[inline]
#[target_feature(enable = "avx2,bmi1,popcnt")]
fn compact8(
    c: &[Cand],
    w: &[f32],
    out: &mut Vec<Cand>,
    out_w: &mut [f32],
    mut keep: impl FnMut(__m256, __m256, __m256) -> usize,
    mut tail: impl FnMut(usize, &Cand, f32) -> bool,
) -> usize {
    let n = c.len().min(w.len());
    assert!(out_w.len() >= n && out.capacity() >= n);
    out.clear();
    let n8 = n / 8 * 8;
    let src = c.as_ptr().cast::<f32>();
    let dst = out.as_mut_ptr().cast::<f32>();
    let mut k = 0usize;
    let mut i = 0usize;
    while i < n8 {
        // SAFETY: `i + 8 <= n <= c.len()`: `c[i..i + 8]` is 16 `f32`s (`Cand` is `repr(C)`
        // `(u32, f32)`, 8 bytes without padding) from `src.add(2 i)`, and `w[i..i + 8]`.
        let (v0, v1, wv) = unsafe {
            (
                _mm256_loadu_ps(src.add(2 * i)),
                _mm256_loadu_ps(src.add(2 * i + 8)),
                _mm256_loadu_ps(w.as_ptr().add(i)),
            )
        };
        let mk = keep(v0, v1, wv) & 0xFF;
        let (lo, hi) = (mk & 15, mk >> 4);
        // SAFETY: every entry of the tables is 8 `u32`s: the loads read one entry each. `k <= i`,
        // so the stores write `out[k..k + 4]` (8 `f32`s from `dst.add(2 k)`), `out[k + lo..][..4]`
        // (within `out[..i + 8]`) and `out_w[k..k + 8]`, all within `n` values of capacity.
        unsafe {
            let pw = _mm256_loadu_si256(COMPRESS8[mk].as_ptr().cast());
            _mm256_storeu_ps(out_w.as_mut_ptr().add(k), _mm256_permutevar8x32_ps(wv, pw));
            let p0 = _mm256_loadu_si256(COMPRESS_PAIRS[lo].as_ptr().cast());
            _mm256_storeu_ps(dst.add(2 * k), _mm256_permutevar8x32_ps(v0, p0));
            let k1 = k + lo.count_ones() as usize;
            let p1 = _mm256_loadu_si256(COMPRESS_PAIRS[hi].as_ptr().cast());
            _mm256_storeu_ps(dst.add(2 * k1), _mm256_permutevar8x32_ps(v1, p1));
            k = k1 + hi.count_ones() as usize;
        }
        i += 8;
    }
    for (j, (x, &wx)) in c[n8..n].iter().zip(&w[n8..n]).enumerate() {
        if tail(n8 + j, x, wx) {
            // SAFETY: `k <=` the candidates seen so far `<= n <=` the capacity.
            unsafe { dst.add(2 * k).cast::<Cand>().write(*x) };
            out_w[k] = wx;
            k += 1;
        }
    }
    // SAFETY: `k <= n <= out.capacity()`; the first `k` were written as whole `Cand` values.
    unsafe { out.set_len(k) };
    k
}

/// [`super::filter_upto`] on 8 lanes ([`compact8`]): the keep mask of 8 candidates from two
/// compares of their values and one of their ids. Returns how many were kept, and the kept
/// weights' 16 `f64` lane sums and smallest non-zero bits (lane `i % 16` of the input index:
/// a group of 8 feeds lanes 0..8 or 8..16 by its parity); `out` must have room for `c.len()`
/// candidates and `out_w` at least `c.len()` values (checked).
#[target_feature(enable = "avx2,bmi1,popcnt")]
pub(super) fn filter_upto(
    c: &[Cand],
    w: &[f32],
    at: Cand,
    out: &mut Vec<Cand>,
    out_w: &mut [f32],
) -> (usize, [f64; 16], [u32; 16]) {
    let zb = _mm256_set1_ps(at.z);
    // ids stay below 2^31 (`u32` ids of a vocabulary held in memory), so signed compares do
    let idb = _mm256_set1_epi32(at.id.min(i32::MAX as u32) as i32);
    // the values and the ids of the 8 candidates, in order
    let order =
        |x: __m256| _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(x)));
    // lanes 0..4, 4..8, 8..12, 12..16 of the sums; 0..8 and 8..16 of the minima
    let mut acc = [_mm256_setzero_pd(); 4];
    let mut low = [_mm256_set1_epi32(-1); 2];
    let mut odd = false;
    let keep = |v0: __m256, v1: __m256, wv: __m256| {
        let z = order(_mm256_shuffle_ps::<0b11_01_11_01>(v0, v1));
        let ids = _mm256_castps_si256(order(_mm256_shuffle_ps::<0b10_00_10_00>(v0, v1)));
        // z > z_b, or z = z_b and id <= id_b
        let keep = _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_GT_OQ>(z, zb),
            _mm256_andnot_ps(
                _mm256_castsi256_ps(_mm256_cmpgt_epi32(ids, idb)),
                _mm256_cmp_ps::<_CMP_EQ_OQ>(z, zb),
            ),
        );
        let kw = _mm256_and_ps(wv, keep);
        let g = odd as usize;
        acc[2 * g] = _mm256_add_pd(acc[2 * g], _mm256_cvtps_pd(_mm256_castps256_ps128(kw)));
        acc[2 * g + 1] = _mm256_add_pd(
            acc[2 * g + 1],
            _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(kw)),
        );
        // kept and non-zero bits, else `u32::MAX`
        let b = _mm256_castps_si256(kw);
        let zero = _mm256_cmpeq_epi32(b, _mm256_setzero_si256());
        low[g] = _mm256_min_epu32(low[g], _mm256_or_si256(b, zero));
        odd = !odd;
        _mm256_movemask_ps(keep) as usize
    };
    let mut rest = super::UptoTail::new(at);
    let tail = |i: usize, x: &Cand, wx: f32| rest.offer(i, x, wx);
    let n = compact8(c, w, out, out_w, keep, tail);
    let mut sums = [0.0f64; 16];
    let mut lows = [u32::MAX; 16];
    // SAFETY: `sums` is 16 `f64`s (four vectors of 4), `lows` 16 `u32`s (two vectors of 8).
    unsafe {
        for (k, a) in acc.iter().enumerate() {
            _mm256_storeu_pd(sums.as_mut_ptr().add(4 * k), *a);
        }
        for (k, l) in low.iter().enumerate() {
            _mm256_storeu_si256(lows.as_mut_ptr().add(8 * k).cast(), *l);
        }
    }
    rest.finish(&mut sums, &mut lows);
    (n, sums, lows)
}

/// [`super::split_heavy`] on 8 lanes ([`compact8`]): the heavy lanes (weight bits above
/// `above`, compared as `i32`) are counted and their weights added to 8 `f64` lanes (lane
/// `i % 8`); the others are kept. `out` must have room for `c.len()` candidates and `out_w` at
/// least `c.len()` values (checked). Returns the heavy count and the heavy lane sums.
#[target_feature(enable = "avx2,bmi1,popcnt")]
pub(super) fn split_heavy(
    c: &[Cand],
    w: &[f32],
    above: i32,
    out: &mut Vec<Cand>,
    out_w: &mut [f32],
) -> (usize, [f64; 8]) {
    let t = _mm256_set1_epi32(above);
    let (mut lo_sum, mut hi_sum) = (_mm256_setzero_pd(), _mm256_setzero_pd());
    let mut heavy_count = _mm256_setzero_si256();
    let keep = |_: __m256, _: __m256, wv: __m256| {
        let heavy = _mm256_cmpgt_epi32(_mm256_castps_si256(wv), t);
        heavy_count = _mm256_sub_epi32(heavy_count, heavy);
        let hw = _mm256_and_ps(wv, _mm256_castsi256_ps(heavy));
        lo_sum = _mm256_add_pd(lo_sum, _mm256_cvtps_pd(_mm256_castps256_ps128(hw)));
        hi_sum = _mm256_add_pd(hi_sum, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(hw)));
        !(_mm256_movemask_ps(_mm256_castsi256_ps(heavy)) as usize)
    };
    let mut tail_heavy = 0usize;
    let mut tail_sums = [0.0f64; 8];
    let tail = |i: usize, _: &Cand, wx: f32| {
        let heavy = wx.to_bits() as i32 > above;
        if heavy {
            tail_heavy += 1;
            tail_sums[i % 8] += wx as f64;
        }
        !heavy
    };
    compact8(c, w, out, out_w, keep, tail);
    let mut sums = [0.0f64; 8];
    let mut counts = [0u32; 8];
    // SAFETY: `sums` is 8 `f64`s (two vectors of 4), `counts` 8 `u32`s (one vector).
    unsafe {
        _mm256_storeu_pd(sums.as_mut_ptr(), lo_sum);
        _mm256_storeu_pd(sums.as_mut_ptr().add(4), hi_sum);
        _mm256_storeu_si256(counts.as_mut_ptr().cast(), heavy_count);
    }
    // the tail's lanes continue the vector lanes (the whole 8s end at a multiple of 8)
    for (s, t) in sums.iter_mut().zip(tail_sums) {
        *s += t;
    }
    let heavy = counts.iter().map(|&x| x as usize).sum::<usize>() + tail_heavy;
    (heavy, sums)
}

/// For every 4-bit mask, the permutation that packs the kept 64-bit lanes (two `u32` each) of
/// a vector of four `Cand`s to its front.
static COMPRESS_PAIRS: [[u32; 8]; 16] = compress_pairs();

const fn compress_pairs() -> [[u32; 8]; 16] {
    let mut t = [[0u32; 8]; 16];
    let mut mask = 0;
    while mask < 16 {
        let (mut j, mut k) = (0, 0);
        while j < 4 {
            if (mask >> j) & 1 == 1 {
                t[mask][2 * k] = 2 * j as u32;
                t[mask][2 * k + 1] = 2 * j as u32 + 1;
                k += 1;
            }
            j += 1;
        }
        mask += 1;
    }
    t
}

/// For every 8-bit mask, the positions of its set bits in order (then zeros): the permutation
/// that packs the kept lanes of an 8-lane vector to its front.
static COMPRESS8: [[u32; 8]; 256] = compress8();

const fn compress8() -> [[u32; 8]; 256] {
    let mut t = [[0u32; 8]; 256];
    let mut mask = 0;
    while mask < 256 {
        let (mut j, mut k) = (0, 0);
        while j < 8 {
            if (mask >> j) & 1 == 1 {
                t[mask][k] = j as u32;
                k += 1;
            }
            j += 1;
        }
        mask += 1;
    }
    t
}

/// [`super::collect_band`] on 8 lanes: the kept values of each vector are packed to its front
/// with a permutation from [`COMPRESS8`] and stored with their ids as whole `Cand` vectors, the
/// length advancing by the number kept (no branch on the values but one per block). `TIE`:
/// whether `band` excludes anything by `tie_z`.
#[target_feature(enable = "avx2,bmi1,popcnt")]
pub(super) fn collect_band<const TIE: bool>(
    buf: &[f32],
    bmax: &[f32],
    band: Band,
    out: &mut Vec<Cand>,
) {
    let nblocks = buf.len() / BLOCK;
    let lo = _mm256_set1_ps(band.lo);
    let hi = _mm256_set1_ps(band.hi);
    let tz = _mm256_set1_ps(band.tie_z);
    // ids stay below 2^31 (`u32` ids of a vocabulary held in memory), so signed compares do
    let tid = _mm256_set1_epi32(band.tie_id.min(i32::MAX as u32) as i32);
    let iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (b, block) in buf.chunks_exact(BLOCK).enumerate() {
        if bmax.get(b).is_some_and(|&x| x < band.lo) {
            continue;
        }
        let base = b * BLOCK;
        let p = block.as_ptr();
        let mut x = [_mm256_setzero_ps(); 8];
        for (k, xk) in x.iter_mut().enumerate() {
            // SAFETY: `block` holds `BLOCK` = 64 values: the load reads `block[8 k..8 k + 8]`.
            *xk = unsafe { _mm256_loadu_ps(p.add(8 * k)) };
        }
        let mut masks = [0u32; 8];
        let mut any = 0u32;
        for (k, mk) in masks.iter_mut().enumerate() {
            let mut keep = _mm256_and_ps(
                _mm256_cmp_ps::<_CMP_GE_OQ>(x[k], lo),
                _mm256_cmp_ps::<_CMP_LT_OQ>(x[k], hi),
            );
            if TIE {
                let ids = _mm256_add_epi32(iota, _mm256_set1_epi32((base + 8 * k) as i32));
                let tie = _mm256_and_ps(
                    _mm256_cmp_ps::<_CMP_EQ_OQ>(x[k], tz),
                    _mm256_castsi256_ps(_mm256_cmpgt_epi32(ids, tid)),
                );
                keep = _mm256_andnot_ps(tie, keep);
            }
            *mk = _mm256_movemask_ps(keep) as u32;
            any |= *mk;
        }
        if any == 0 {
            continue;
        }
        if out.capacity() - out.len() < BLOCK + 8 {
            // no room for whole stores (only near a full buffer): one at a time
            for (k, &mk) in masks.iter().enumerate() {
                let mut bits = mk;
                while bits != 0 {
                    let j = 8 * k + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    out.push(Cand {
                        id: (base + j) as u32,
                        z: block[j],
                    });
                }
            }
            continue;
        }
        let old = out.len();
        let mut len = old;
        let q = out.as_mut_ptr().cast::<i32>();
        for (k, &mk) in masks.iter().enumerate() {
            let xi = _mm256_castps_si256(x[k]);
            let ids = _mm256_add_epi32(iota, _mm256_set1_epi32((base + 8 * k) as i32));
            // SAFETY: every entry of `COMPRESS8` is 8 `u32`s: the load reads one entry.
            let perm = unsafe { _mm256_loadu_si256(COMPRESS8[mk as usize].as_ptr().cast()) };
            let ci = _mm256_permutevar8x32_epi32(ids, perm);
            let cz = _mm256_permutevar8x32_epi32(xi, perm);
            // l: i0 z0 i1 z1 | i4 z4 i5 z5; h: i2 z2 i3 z3 | i6 z6 i7 z7
            let l = _mm256_unpacklo_epi32(ci, cz);
            let h = _mm256_unpackhi_epi32(ci, cz);
            // SAFETY: `len <= old + 8 k`, and `old + 64 + 8 <= out.capacity()` (checked above):
            // the two stores write the 8 `Cand`s (16 `i32`s) from `len` within the allocation.
            unsafe {
                let at = q.add(2 * len);
                _mm256_storeu_si256(at.cast(), _mm256_permute2x128_si256::<0x20>(l, h));
                _mm256_storeu_si256(at.add(8).cast(), _mm256_permute2x128_si256::<0x31>(l, h));
            }
            len += mk.count_ones() as usize;
        }
        // SAFETY: `len <= old + 64 <= out.capacity()`; the first `len` were written as whole
        // `Cand { id, z }` values (`repr(C)`: `id`, `z`; any bits are valid for both).
        unsafe { out.set_len(len) };
    }
    for (i, &z) in buf.iter().enumerate().skip(nblocks * BLOCK) {
        if band.keeps(i, z) {
            out.push(Cand { id: i as u32, z });
        }
    }
}

/// [`super::gather_weight_key`] on 8 lanes. The key of every weight is computed and compared
/// a vector at a time; matches are rare (one bucket among hundreds), so only the vectors with a
/// match copy anything, lane by lane in order.
#[target_feature(enable = "avx2")]
pub(super) fn gather_weight_key(
    c: &[Cand],
    w: &[f32],
    key: super::WeightKey,
    out: &mut Vec<Cand>,
    out_w: &mut Vec<f32>,
) {
    let n = c.len().min(w.len());
    let one = _mm256_set1_epi32(0x3F80_0000);
    let zero = _mm256_setzero_si256();
    let shift = _mm_cvtsi32_si128(key.shift as i32);
    let max = _mm256_set1_epi32(key.max as i32);
    let want = _mm256_set1_epi32(key.value as i32);
    let whole = n / 8 * 8;
    let mut i = 0;
    while i < whole {
        // SAFETY: `i + 8 <= whole <= n <= w.len()`: the load reads `w[i..i + 8]`.
        let x = unsafe { _mm256_loadu_si256(w.as_ptr().add(i).cast()) };
        // the distance below 1.0 in bits, 0 above it (weights are not negative), shifted and
        // capped: `super::WeightKey::of` on every lane
        let d = _mm256_max_epi32(_mm256_sub_epi32(one, x), zero);
        let k = _mm256_min_epu32(_mm256_srl_epi32(d, shift), max);
        let mut hits = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(k, want))) as u32;
        while hits != 0 {
            let j = i + hits.trailing_zeros() as usize;
            hits &= hits - 1;
            out.push(c[j]);
            out_w.push(w[j]);
        }
        i += 8;
    }
    for j in whole..n {
        if key.of(w[j]) == key.value {
            out.push(c[j]);
            out_w.push(w[j]);
        }
    }
}
