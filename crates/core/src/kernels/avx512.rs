//! The AVX-512 kernels, written with intrinsics: the same IEEE-754 operations as the portable
//! code, lane by lane, in the same order (fused multiply-adds exactly where the portable code has
//! `mul_add`); where a single exact instruction replaces a sequence of the portable code
//! (rounding to an integer, scaling by a power of two), it is shown to give the same bits (see
//! [`exp16x4`]).
//!
//! Every function here requires AVX-512 F/BW/DQ/VL (with AVX2, BMI1, POPCNT and FMA): the
//! dispatch in [`super`] calls them only at an [`Isa`](super::Isa) of
//! [`Level::Avx512`](crate::cpu::Level::Avx512). Their only other unsafe operations are unaligned
//! loads and stores through raw pointers, each within the slice the pointer was taken from.

use std::arch::x86_64::*;

use super::common::{exp_f32, Cand, EXP_C1, EXP_C2, EXP_CLAMP, EXP_F32_FLUSH, EXP_LOG2E, EXP_P};
use super::{Band, TopKScan, BLOCK};

/// [`exp_f32`] on four vectors of 16 lanes, with the same bits for every input (checked
/// exhaustively over all non-NaN `f32` inputs when this was written; the unit test
/// `exp16x4_matches_scalar` checks every 61st bit pattern and the edges).
///
/// Two steps are done by single exact instructions instead of the scalar code's integer
/// tricks: `n = (x · log2 e + 1.5·2^23) − 1.5·2^23` is round-to-nearest-even of `x · log2 e`
/// (for `|x · log2 e| < 2^22`; larger values only reach flushed lanes), which `vrndscaleps`
/// computes directly, and `y · 2^n` (`2^n` built from the exponent bits) is `vscalefps(y,
/// n)`: both are one correctly rounded multiplication by an exact power of two, subnormal
/// results included. A `-0.0` from the rounding (for `−0.5 ≤ x · log2 e < 0`) only changes the
/// sign of a zero `r`, which the final `… + r + 1` absorbs.
///
/// Each step is done for all four vectors before the next (the four dependency chains
/// interleave, which keeps more of the vector units busy).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
pub(crate) fn exp16x4(x: [__m512; 4]) -> [__m512; 4] {
    exp16x4_clamp::<true>(x)
}

/// [`exp16x4`]; without `CLAMP` only for inputs `<= 0` (then `min(88, x)` is `x`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
fn exp16x4_clamp<const CLAMP: bool>(x: [__m512; 4]) -> [__m512; 4] {
    let mut keep = [0u16; 4];
    let mut xc = [_mm512_setzero_ps(); 4];
    let mut n = [_mm512_setzero_ps(); 4];
    let mut r = [_mm512_setzero_ps(); 4];
    let mut z = [_mm512_setzero_ps(); 4];
    let mut y = [_mm512_set1_ps(EXP_P[0]); 4];
    for k in 0..4 {
        // not flushed: `!(x < -87)` (a NaN lane computes NaN, as the scalar code does)
        keep[k] = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x[k], _mm512_set1_ps(EXP_F32_FLUSH));
        xc[k] = if CLAMP {
            _mm512_min_ps(_mm512_set1_ps(EXP_CLAMP), x[k])
        } else {
            x[k]
        };
    }
    for k in 0..4 {
        n[k] = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(xc[k], _mm512_set1_ps(EXP_LOG2E)),
        );
    }
    for k in 0..4 {
        r[k] = _mm512_fnmadd_ps(
            n[k],
            _mm512_set1_ps(EXP_C2),
            _mm512_fnmadd_ps(n[k], _mm512_set1_ps(EXP_C1), xc[k]),
        );
    }
    for k in 0..4 {
        z[k] = _mm512_mul_ps(r[k], r[k]);
    }
    for &c in &EXP_P[1..] {
        for k in 0..4 {
            y[k] = _mm512_fmadd_ps(y[k], r[k], _mm512_set1_ps(c));
        }
    }
    for k in 0..4 {
        y[k] = _mm512_add_ps(_mm512_fmadd_ps(y[k], z[k], r[k]), _mm512_set1_ps(1.0));
    }
    for k in 0..4 {
        y[k] = _mm512_maskz_scalef_ps(keep[k], y[k], n[k]);
    }
    y
}

/// Adds the 16 lanes of `e` to the 8 `f64` lanes: elements 0..8, then 8..16.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
fn add_lanes16(acc: __m512d, e: __m512) -> __m512d {
    let lo = _mm512_cvtps_pd(_mm512_castps512_ps256(e));
    let hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
        _mm512_castps_pd(e),
    )));
    _mm512_add_pd(_mm512_add_pd(acc, lo), hi)
}

/// 16 `f64` lane sums (lane `j`: the `j`-th value of each vector added, in order) and each
/// lane's smallest non-zero bits, of `f32` values added 16 at a time.
#[derive(Clone, Copy)]
struct Lanes16 {
    a0: __m512d,
    a1: __m512d,
    low: __m512i,
}

impl Lanes16 {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
    fn new() -> Lanes16 {
        Lanes16 {
            a0: _mm512_setzero_pd(),
            a1: _mm512_setzero_pd(),
            low: _mm512_set1_epi32(-1),
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
    fn add(&mut self, x: __m512) {
        self.a0 = _mm512_add_pd(self.a0, _mm512_cvtps_pd(_mm512_castps512_ps256(x)));
        let hi = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x));
        self.a1 = _mm512_add_pd(self.a1, _mm512_cvtps_pd(_mm256_castpd_ps(hi)));
        let b = _mm512_castps_si512(x);
        self.low = _mm512_mask_min_epu32(self.low, _mm512_test_epi32_mask(b, b), self.low, b);
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
    fn get(&self) -> ([f64; 16], [u32; 16]) {
        let mut sums = [0.0f64; 16];
        let mut lows = [u32::MAX; 16];
        // SAFETY: `sums` is 16 `f64`s (two vectors of 8), `lows` 16 `u32`s.
        unsafe {
            _mm512_storeu_pd(sums.as_mut_ptr(), self.a0);
            _mm512_storeu_pd(sums.as_mut_ptr().add(8), self.a1);
            _mm512_storeu_si512(lows.as_mut_ptr().cast(), self.low);
        }
        (sums, lows)
    }
}

/// The 16 `f64` lane sums of the whole chunks of 16 values of `xs` (lane `j`: values
/// `16 i + j`, in order) and each lane's smallest non-zero bits: what the portable loop of
/// `exact_sum_any_order` computes, lane for lane.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
pub(super) fn lane_sums16(xs: &[f32]) -> ([f64; 16], [u32; 16]) {
    let mut lanes = Lanes16::new();
    for c in xs.chunks_exact(16) {
        // SAFETY: `c` is 16 `f32`s.
        lanes.add(unsafe { _mm512_loadu_ps(c.as_ptr()) });
    }
    lanes.get()
}

/// The 64 values of `z` from `i` (`i + 64 <= z.len()`, checked), as four vectors.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
fn load64(z: &[f32], i: usize) -> [__m512; 4] {
    let p = z[i..i + 64].as_ptr();
    // SAFETY: `p` points to 64 readable `f32`s (the slice above); each load reads 16 of them.
    unsafe {
        [
            _mm512_loadu_ps(p),
            _mm512_loadu_ps(p.add(16)),
            _mm512_loadu_ps(p.add(32)),
            _mm512_loadu_ps(p.add(48)),
        ]
    }
}

/// `w[i] = exp_f32(z[i] - m)` over the whole blocks of 64 values (nothing is stored when `w`
/// is `None`); the lane sums of [`super::sum_f64_lanes`] continue in `acc`. Returns the
/// number of values covered.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
pub(super) fn exp_blocks<const CLAMP: bool>(
    z: &[f32],
    m: f32,
    mut w: Option<&mut [f32]>,
    acc: &mut [f64; 8],
) -> usize {
    let n = match &w {
        Some(w) => z.len().min(w.len()),
        None => z.len(),
    } / 64
        * 64;
    let vm = _mm512_set1_ps(m);
    // SAFETY: `acc` holds 8 `f64`s, one vector.
    let mut a = unsafe { _mm512_loadu_pd(acc.as_ptr()) };
    // software pipelined: the weights of a block are summed one block later, so that the
    // sequential lane sums never wait for the long `exp` chain of the block being computed
    let mut block = |i: usize| {
        let p = z.as_ptr();
        debug_assert!(i + 64 <= n);
        // SAFETY: `i + 64 <= n <= z.len()` (`i` is a multiple of 64 below `n`), so the four
        // loads read `z[i..i + 64]`.
        let x = unsafe {
            [
                _mm512_loadu_ps(p.add(i)),
                _mm512_loadu_ps(p.add(i + 16)),
                _mm512_loadu_ps(p.add(i + 32)),
                _mm512_loadu_ps(p.add(i + 48)),
            ]
        };
        let e = exp16x4_clamp::<CLAMP>([
            _mm512_sub_ps(x[0], vm),
            _mm512_sub_ps(x[1], vm),
            _mm512_sub_ps(x[2], vm),
            _mm512_sub_ps(x[3], vm),
        ]);
        if let Some(w) = w.as_deref_mut() {
            let q = w.as_mut_ptr();
            // SAFETY: `i + 64 <= n <= w.len()`, so the four stores write `w[i..i + 64]`.
            unsafe {
                _mm512_storeu_ps(q.add(i), e[0]);
                _mm512_storeu_ps(q.add(i + 16), e[1]);
                _mm512_storeu_ps(q.add(i + 32), e[2]);
                _mm512_storeu_ps(q.add(i + 48), e[3]);
            }
        }
        e
    };
    let mut consume = |e: [__m512; 4]| {
        a = add_lanes16(a, e[0]);
        a = add_lanes16(a, e[1]);
        a = add_lanes16(a, e[2]);
        a = add_lanes16(a, e[3]);
    };
    if n > 0 {
        let mut prev = block(0);
        let mut i = 64;
        while i < n {
            let e = block(i);
            consume(prev);
            prev = e;
            i += 64;
        }
        consume(prev);
    }
    // SAFETY: `acc` holds 8 `f64`s, one vector.
    unsafe { _mm512_storeu_pd(acc.as_mut_ptr(), a) };
    n
}

/// [`super::cand_weights`] on 16 lanes, 64 candidates at a time (`w` at least as long as `c`,
/// checked).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
pub(super) fn cand_weights(c: &[Cand], m: f32, w: &mut [f32]) -> [f64; 8] {
    assert!(w.len() >= c.len());
    let vm = _mm512_set1_ps(m);
    // the `z` of 16 candidates (the odd `f32` slots of 128 bytes)
    let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    let n = c.len() / 64 * 64;
    let mut acc = _mm512_setzero_pd();
    let block = |i: usize| {
        debug_assert!(i + 64 <= n);
        let f = c.as_ptr().cast::<f32>();
        // SAFETY: `i + 64 <= n <= c.len()`: `c[i..i + 64]` is 128 `f32`s (`Cand` is `repr(C)`
        // `(u32, f32)`, 8 bytes without padding) from `f.add(2 * i)`; the eight loads read them.
        let v = unsafe {
            let f = f.add(2 * i);
            [
                _mm512_loadu_ps(f),
                _mm512_loadu_ps(f.add(16)),
                _mm512_loadu_ps(f.add(32)),
                _mm512_loadu_ps(f.add(48)),
                _mm512_loadu_ps(f.add(64)),
                _mm512_loadu_ps(f.add(80)),
                _mm512_loadu_ps(f.add(96)),
                _mm512_loadu_ps(f.add(112)),
            ]
        };
        let z16 = |a: __m512, b: __m512| _mm512_sub_ps(_mm512_permutex2var_ps(a, odd, b), vm);
        exp16x4([
            z16(v[0], v[1]),
            z16(v[2], v[3]),
            z16(v[4], v[5]),
            z16(v[6], v[7]),
        ])
    };
    // software pipelined as [`exp_blocks`]: a block's weights are stored and summed after the
    // next block's are computed, so that the sequential lane sums never wait for the long `exp`
    // chain of the block being computed
    let mut consume = |i: usize, e: [__m512; 4]| {
        let q = w.as_mut_ptr();
        for (k, e) in e.iter().enumerate() {
            // SAFETY: `i + 64 <= c.len() <= w.len()`: the store writes `w[i + 16 k..][..16]`.
            unsafe { _mm512_storeu_ps(q.add(i + 16 * k), *e) };
            acc = add_lanes16(acc, *e);
        }
    };
    if n > 0 {
        let mut prev = block(0);
        let mut i = 64;
        while i < n {
            let e = block(i);
            consume(i - 64, prev);
            prev = e;
            i += 64;
        }
        consume(n - 64, prev);
    }
    let mut lanes = [0.0f64; 8];
    // SAFETY: `lanes` is 8 `f64`s.
    unsafe { _mm512_storeu_pd(lanes.as_mut_ptr(), acc) };
    for (j, (x, o)) in c[n..].iter().zip(w[n..].iter_mut()).enumerate() {
        *o = exp_f32(x.z - m);
        lanes[j % 8] += *o as f64;
    }
    lanes
}

/// [`super::load`] on 16 lanes: one pass, copying, validating, counting, and taking the maximum
/// (its *value* does not depend on the order; the caller settles the sign of a zero maximum).
/// The maxima of 16 blocks are reduced together ([`block_maxima16`]), and a zero bound is
/// settled by the portable pass's order ([`super::scalar::block_max`]), so the bounds have the
/// portable pass's bits; the counts come from the comparison masks. The lengths are checked:
/// `buf` as long as `raw`, `bmax` one per block.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
pub(super) fn load(raw: &[f32], buf: &mut [f32], bmax: &mut [f32]) -> (bool, usize, f32) {
    assert!(raw.len() == buf.len() && bmax.len() == raw.len().div_ceil(BLOCK));
    const GROUP: usize = 16 * BLOCK;
    let n = raw.len() / GROUP * GROUP;
    let inf = _mm512_set1_ps(f32::INFINITY);
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut mx = ninf;
    let mut ok_all: u64 = u64::MAX;
    let mut count = 0usize;
    let mut i = 0;
    while i < n {
        let mut bm = [ninf; 16];
        for (blk, m) in bm.iter_mut().enumerate() {
            let at = i + BLOCK * blk;
            let x = load64(raw, at);
            let q = buf.as_mut_ptr();
            let mut ok = [0u16; 4];
            let mut fin = [0u16; 4];
            for k in 0..4 {
                ok[k] = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x[k], inf);
                // a NaN or +inf is not copied: the load fails anyway (and a plain store would
                // be turned into a separate copy pass by the compiler)
                // SAFETY: `at + 64 <= n <= raw.len() == buf.len()`: the store writes (some
                // of) `buf[at + 16 k..][..16]`.
                unsafe { _mm512_mask_storeu_ps(q.add(at + 16 * k), ok[k], x[k]) };
                fin[k] = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x[k], ninf);
            }
            let ok64 =
                ok[0] as u64 | (ok[1] as u64) << 16 | (ok[2] as u64) << 32 | (ok[3] as u64) << 48;
            let fin64 = fin[0] as u64
                | (fin[1] as u64) << 16
                | (fin[2] as u64) << 32
                | (fin[3] as u64) << 48;
            ok_all &= ok64;
            count += fin64.count_ones() as usize;
            *m = _mm512_max_ps(_mm512_max_ps(x[0], x[1]), _mm512_max_ps(x[2], x[3]));
            mx = _mm512_max_ps(mx, *m);
        }
        let bounds = block_maxima16(&bm);
        // SAFETY: `i + GROUP <= n <= raw.len()`, so the 16 blocks `i / BLOCK ..` are whole
        // blocks of `raw` and `bmax` (one per block) holds them: the store writes
        // `bmax[i / BLOCK..][..16]`.
        unsafe { _mm512_storeu_ps(bmax.as_mut_ptr().add(i / BLOCK), bounds) };
        // the sign of a zero bound depends on the order of the reduction: take the portable
        // pass's (rare: only blocks whose largest value is a zero)
        let mut zero = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(bounds, _mm512_setzero_ps());
        while zero != 0 {
            let b = i / BLOCK + zero.trailing_zeros() as usize;
            zero &= zero - 1;
            bmax[b] = super::scalar::block_max(&raw[b * BLOCK..(b + 1) * BLOCK]);
        }
        i += GROUP;
    }
    let mut a = [0.0f32; 16];
    // SAFETY: `a` holds 16 `f32`s, one vector.
    unsafe { _mm512_storeu_ps(a.as_mut_ptr(), mx) };
    let mut m = f32::NEG_INFINITY;
    for x in a {
        if x > m {
            m = x;
        }
    }
    let mut any_bad = ok_all != u64::MAX;
    // the rest block by block
    let mut blk = f32::NEG_INFINITY;
    for (j, (&x, b)) in raw[n..].iter().zip(buf[n..].iter_mut()).enumerate() {
        *b = x;
        any_bad |= super::nan_or_pos_inf(x);
        count += (x > f32::NEG_INFINITY) as usize;
        if x > m {
            m = x;
        }
        if x > blk {
            blk = x;
        }
        if (j + 1) % BLOCK == 0 || n + j + 1 == raw.len() {
            let b = (n + j) / BLOCK;
            // in order, a whole block may meet a zero of the other sign before the one the
            // portable pass's lanes keep
            bmax[b] = if blk == 0.0 {
                super::scalar::block_max(&raw[b * BLOCK..n + j + 1])
            } else {
                blk
            };
            blk = f32::NEG_INFINITY;
        }
    }
    (any_bad, count, m)
}

/// The horizontal maxima of 16 vectors, lane `b` from vector `b`: shuffles and maxima in a
/// tree (halving the data at every level) instead of one reduction per vector.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
fn block_maxima16(v: &[__m512; 16]) -> __m512 {
    // pairs of vectors: 128-bit halves folded, [A0|A2, A1|A3, B0|B2, B1|B3]
    let mut t = [_mm512_setzero_ps(); 8];
    for (i, t) in t.iter_mut().enumerate() {
        let (a, b) = (v[2 * i], v[2 * i + 1]);
        *t = _mm512_max_ps(
            _mm512_shuffle_f32x4::<0x44>(a, b),
            _mm512_shuffle_f32x4::<0xEE>(a, b),
        );
    }
    // 128-bit chunk k of u[j]: 4 lanes of vector 4j + k
    let mut u = [_mm512_setzero_ps(); 4];
    for (j, u) in u.iter_mut().enumerate() {
        let (c, d) = (t[2 * j], t[2 * j + 1]);
        *u = _mm512_max_ps(
            _mm512_shuffle_f32x4::<0x88>(c, d),
            _mm512_shuffle_f32x4::<0xDD>(c, d),
        );
    }
    // within the chunks: [e0|e2, e1|e3, f0|f2, f1|f3]
    let mut g = [_mm512_setzero_ps(); 2];
    for (l, g) in g.iter_mut().enumerate() {
        let (e, f) = (u[2 * l], u[2 * l + 1]);
        *g = _mm512_max_ps(
            _mm512_shuffle_ps::<0b01_00_01_00>(e, f),
            _mm512_shuffle_ps::<0b11_10_11_10>(e, f),
        );
    }
    // lane 4k + i: the maximum of vector 4i + k
    let h = _mm512_max_ps(
        _mm512_shuffle_ps::<0b10_00_10_00>(g[0], g[1]),
        _mm512_shuffle_ps::<0b11_01_11_01>(g[0], g[1]),
    );
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_ps(order, h)
}

/// [`super::top_k_scan`] over whole blocks (`buf` ends at a block boundary, `start` is one),
/// testing 64 values at a time.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
pub(super) fn top_k_blocks(buf: &[f32], bmax: &[f32], start: usize, scan: &mut TopKScan<'_>) {
    let mut i = start;
    while i + BLOCK <= buf.len() {
        if bmax.get(i / BLOCK).is_some_and(|&b| b <= scan.thr) {
            i += BLOCK;
            continue;
        }
        let t = _mm512_set1_ps(scan.thr);
        let x = load64(buf, i);
        let m0 = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x[0], t);
        let m1 = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x[1], t);
        let m2 = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x[2], t);
        let m3 = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x[3], t);
        let mut bits = m0 as u64 | (m1 as u64) << 16 | (m2 as u64) << 32 | (m3 as u64) << 48;
        // only the values above the threshold at the start of the block can enter; visiting
        // them in id order is the plain scan with the others skipped
        while bits != 0 {
            let j = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            scan.offer(i + j, buf[i + j]);
        }
        i += BLOCK;
    }
}

/// [`super::collect_band`] on 16 lanes: the block bounds are tested 16 at a time, a block's
/// values 64 at a time, and the kept values are compressed and interleaved with their ids into
/// whole `Cand` stores. `TIE`: whether `band` excludes anything by `tie_z`.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
pub(super) fn collect_band<const TIE: bool>(
    buf: &[f32],
    bmax: &[f32],
    band: Band,
    out: &mut Vec<Cand>,
) {
    let nblocks = buf.len() / BLOCK;
    let lo = _mm512_set1_ps(band.lo);
    let hi = _mm512_set1_ps(band.hi);
    let tz = _mm512_set1_ps(band.tie_z);
    let tid = _mm512_set1_epi32(band.tie_id as i32);
    let iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    // `Cand { id, z }` pairs from the compressed ids (first source) and values (second)
    let first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    let second = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    let visit = |b: usize, out: &mut Vec<Cand>| {
        let base = b * BLOCK;
        let x = load64(buf, base);
        let mut keep = [0u16; 4];
        for k in 0..4 {
            keep[k] = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x[k], lo)
                & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x[k], hi);
            if TIE {
                let ids = _mm512_add_epi32(iota, _mm512_set1_epi32((base + 16 * k) as i32));
                keep[k] &= !(_mm512_cmp_ps_mask::<_CMP_EQ_OQ>(x[k], tz)
                    & _mm512_cmp_epu32_mask::<_MM_CMPINT_NLE>(ids, tid));
            }
        }
        let keep64 = keep[0] as u64
            | (keep[1] as u64) << 16
            | (keep[2] as u64) << 32
            | (keep[3] as u64) << 48;
        if keep64 == 0 {
            return;
        }
        if out.capacity() - out.len() < 64 {
            // no room for whole stores (only near a full buffer): one at a time
            let mut bits = keep64;
            while bits != 0 {
                let j = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                out.push(Cand {
                    id: (base + j) as u32,
                    z: buf[base + j],
                });
            }
            return;
        }
        // without branches on the data: a vector with nothing to keep stores nothing that
        // counts
        let old = out.len();
        let mut len = old;
        let q = out.as_mut_ptr().cast::<i32>();
        let b0 = _mm512_add_epi32(iota, _mm512_set1_epi32(base as i32));
        for k in 0..4 {
            let ids = _mm512_add_epi32(b0, _mm512_set1_epi32((16 * k) as i32));
            let kk = keep[k];
            let n = kk.count_ones() as usize;
            let ci = _mm512_maskz_compress_epi32(kk, ids);
            let cz = _mm512_maskz_compress_epi32(kk, _mm512_castps_si512(x[k]));
            debug_assert!(len + 16 <= old + 64);
            // SAFETY: `len <= old + 16 k`, and `old + 64 <= out.capacity()` (checked above): the
            // stores write at most 16 `Cand`s (32 `i32`s) from `len` within the allocation.
            unsafe {
                let at = q.add(2 * len);
                _mm512_storeu_si512(at.cast(), _mm512_permutex2var_epi32(ci, first, cz));
                // the second half only holds kept pairs when more than 8 are kept (rare in the
                // sparse bands of a flat row, common in dense ones: either way predictable)
                if n > 8 {
                    let hi = _mm512_permutex2var_epi32(ci, second, cz);
                    _mm512_storeu_si512(at.add(16).cast(), hi);
                }
            }
            len += n;
        }
        // SAFETY: `len <= old + 64 <= out.capacity()`; the first `len` were written as whole
        // `Cand { id, z }` values (`repr(C)`: `id`, `z`; any bits are valid for both).
        unsafe { out.set_len(len) };
    };
    let mut b = 0;
    if bmax.len() >= nblocks {
        while b + 16 <= nblocks {
            // SAFETY: `b + 16 <= nblocks <= bmax.len()`: the load reads `bmax[b..b + 16]`.
            let v = unsafe { _mm512_loadu_ps(bmax.as_ptr().add(b)) };
            let mut bits = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(v, lo);
            while bits != 0 {
                let j = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                visit(b + j, out);
            }
            b += 16;
        }
    }
    while b < nblocks {
        if bmax.get(b).is_none_or(|&x| x >= band.lo) {
            visit(b, out);
        }
        b += 1;
    }
    for (i, &z) in buf.iter().enumerate().skip(nblocks * BLOCK) {
        if band.keeps(i, z) {
            out.push(Cand { id: i as u32, z });
        }
    }
}

/// The packing loop of [`filter_upto`] and [`split_heavy`] on 16 lanes: for every 16
/// candidates (loaded as two vectors of eight whole `Cand`s) and their weights, `keep` gives
/// the mask of the lanes to keep; those candidates (two 64-bit compresses) and weights (one
/// 32-bit compress) are packed to the front and stored, the length advancing by the number
/// kept. `tail` decides the candidates after the last whole 16 one at a time (with their
/// index). `out` is set to the kept candidates and `out_w` starts with their weights; `out` must
/// have room for `c.len()` candidates and `out_w` at least `c.len()` values (checked). Returns
/// how many were kept.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
fn compact16(
    c: &[Cand],
    w: &[f32],
    out: &mut Vec<Cand>,
    out_w: &mut [f32],
    mut keep: impl FnMut(__m512i, __m512i, __m512) -> u16,
    mut tail: impl FnMut(usize, &Cand, f32) -> bool,
) -> usize {
    let n = c.len().min(w.len());
    assert!(out_w.len() >= n && out.capacity() >= n);
    out.clear();
    let n16 = n / 16 * 16;
    let src = c.as_ptr().cast::<i64>();
    let dst = out.as_mut_ptr().cast::<i64>();
    let mut k = 0usize;
    let mut i = 0usize;
    while i < n16 {
        // SAFETY: `i + 16 <= n <= c.len()`: `c[i..i + 16]` is 16 `i64`s (`Cand` is `repr(C)`
        // `(u32, f32)`, 8 bytes without padding) from `src.add(i)`, and `w[i..i + 16]`.
        let (v0, v1, wv) = unsafe {
            (
                _mm512_loadu_si512(src.add(i).cast()),
                _mm512_loadu_si512(src.add(i + 8).cast()),
                _mm512_loadu_ps(w.as_ptr().add(i)),
            )
        };
        let mk = keep(v0, v1, wv);
        let (lo, hi) = (mk as u8, (mk >> 8) as u8);
        // SAFETY: `k <= i`, so the stores write `out_w[k..k + 16]`, `out[k..k + 8]` and
        // `out[k + lo..][..8]` (all within `out[..i + 16]`), within `n` values of capacity.
        unsafe {
            _mm512_storeu_ps(out_w.as_mut_ptr().add(k), _mm512_maskz_compress_ps(mk, wv));
            _mm512_storeu_si512(dst.add(k).cast(), _mm512_maskz_compress_epi64(lo, v0));
            let k1 = k + lo.count_ones() as usize;
            _mm512_storeu_si512(dst.add(k1).cast(), _mm512_maskz_compress_epi64(hi, v1));
            k = k1 + hi.count_ones() as usize;
        }
        i += 16;
    }
    for (j, (x, &wx)) in c[n16..n].iter().zip(&w[n16..n]).enumerate() {
        if tail(n16 + j, x, wx) {
            // SAFETY: `k <=` the candidates seen so far `< n <=` the capacity.
            unsafe { dst.add(k).cast::<Cand>().write(*x) };
            out_w[k] = wx;
            k += 1;
        }
    }
    // SAFETY: `k <= n <= out.capacity()`; the first `k` were written as whole `Cand` values.
    unsafe { out.set_len(k) };
    k
}

/// [`super::filter_upto`] on 16 lanes ([`compact16`]): the values and ids of 16 candidates
/// gathered by two permutes, the keep mask from two compares of the values and one of the ids.
/// Returns how many were kept, and the kept weights' 16 `f64` lane sums and smallest non-zero
/// bits (lane `i % 16` of the input index); `out` must have room for `c.len()` candidates and
/// `out_w` at least `c.len()` values (checked).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
pub(super) fn filter_upto(
    c: &[Cand],
    w: &[f32],
    at: Cand,
    out: &mut Vec<Cand>,
    out_w: &mut [f32],
) -> (usize, [f64; 16], [u32; 16]) {
    let zb = _mm512_set1_ps(at.z);
    // ids stay below 2^31 (`u32` ids of a vocabulary held in memory), so signed compares do
    let idb = _mm512_set1_epi32(at.id.min(i32::MAX as u32) as i32);
    let ids_of = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let zs_of = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    let mut lanes = Lanes16::new();
    let keep = |v0: __m512i, v1: __m512i, wv: __m512| {
        let z = _mm512_castsi512_ps(_mm512_permutex2var_epi32(v0, zs_of, v1));
        let ids = _mm512_permutex2var_epi32(v0, ids_of, v1);
        // z > z_b, or z = z_b and id <= id_b
        let mk = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(z, zb)
            | (_mm512_cmp_ps_mask::<_CMP_EQ_OQ>(z, zb) & _mm512_cmple_epi32_mask(ids, idb));
        lanes.add(_mm512_maskz_mov_ps(mk, wv));
        mk
    };
    let mut rest = super::UptoTail::new(at);
    let tail = |i: usize, x: &Cand, wx: f32| rest.offer(i, x, wx);
    let n = compact16(c, w, out, out_w, keep, tail);
    let (mut sums, mut lows) = lanes.get();
    rest.finish(&mut sums, &mut lows);
    (n, sums, lows)
}

/// [`super::split_heavy`] on 16 lanes ([`compact16`]): the heavy lanes (weight bits above
/// `above`, compared as `i32`) are counted and their weights added to 8 `f64` lanes (lane
/// `i % 8`, in order: the first eight of each 16, then the second eight); the others are kept.
/// `out` must have room for `c.len()` candidates and `out_w` at least `c.len()` values
/// (checked). Returns the heavy count and the heavy lane sums.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
pub(super) fn split_heavy(
    c: &[Cand],
    w: &[f32],
    above: i32,
    out: &mut Vec<Cand>,
    out_w: &mut [f32],
) -> (usize, [f64; 8]) {
    let t = _mm512_set1_epi32(above);
    let mut acc = _mm512_setzero_pd();
    let mut heavy = 0usize;
    let keep = |_: __m512i, _: __m512i, wv: __m512| {
        let h = _mm512_cmpgt_epi32_mask(_mm512_castps_si512(wv), t);
        heavy += h.count_ones() as usize;
        let hw = _mm512_maskz_mov_ps(h, wv);
        acc = add_lanes16(acc, hw);
        !h
    };
    let mut sums = [0.0f64; 8];
    let mut tail_heavy = 0usize;
    let mut tail_w = [(0usize, 0.0f32); 16];
    let tail = |i: usize, _: &Cand, wx: f32| {
        let h = wx.to_bits() as i32 > above;
        if h {
            tail_w[tail_heavy] = (i, wx);
            tail_heavy += 1;
        }
        !h
    };
    compact16(c, w, out, out_w, keep, tail);
    // SAFETY: `sums` is 8 `f64`s.
    unsafe { _mm512_storeu_pd(sums.as_mut_ptr(), acc) };
    // the tail's weights continue their lanes, one at a time in order
    for &(i, wx) in &tail_w[..tail_heavy] {
        sums[i % 8] += wx as f64;
    }
    (heavy + tail_heavy, sums)
}
