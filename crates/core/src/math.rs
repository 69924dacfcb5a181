//! Deterministic numeric kernels.
//!
//! Every number nextok reports must be reproducible bit for bit on any platform, so the
//! transcendental functions used on the selection path are nextok's own: IEEE-754 additions,
//! multiplications, divisions and — in `exp_f32` only, written out as `mul_add` — fused
//! multiply-adds, in a fixed order, never a platform `libm`. Each of these operations is
//! correctly rounded by definition (a fused multiply-add rounds once, in hardware or in
//! Rust's software fallback), so its bits do not depend on the platform; Rust never contracts
//! a plain `a * b + c` into one on its own.
//!
//! * [`exp_f32`] — Cephes-style `expf` (max error about 1 ulp on `[-87, 88]`); inputs below
//!   `-87` (including `-inf`) give exactly `0.0`. Written so that the compiler can vectorise it.
//! * [`ln_f64`] — the fdlibm `__ieee754_log` algorithm (error < 1 ulp).
//! * [`sum_f64_lanes`] — a sum with a fixed association order (8 lanes by index mod 8, then the
//!   lanes added in order), so a sum never depends on thread count or vector width.
//!
//! The slice kernels are compiled several times on x86-64 — for the baseline target, with AVX2
//! and (with a compiler that supports it) with AVX-512 — and the widest version the CPU supports
//! is chosen at run time (the AVX2 and AVX-512 versions also require FMA, so `mul_add` is one
//! instruction there). All versions perform the same IEEE-754 operations in the same order (the
//! fused multiply-adds are written out, and the lane structure of every reduction is too), so
//! they return the same bits; only the vector width the compiler may use differs.
//! [`simd::set_max_level`] caps the choice, so tests can compare the versions.

// The polynomial and ln-2 constants are the published Cephes/fdlibm decimals; they parse to the
// intended doubles, and the tests check the results against the standard library.
#![allow(clippy::excessive_precision)]

#[doc(hidden)]
pub mod simd {
    //! Run-time choice of the kernel versions (see the module docs of [`crate::math`]).

    use std::sync::atomic::{AtomicU8, Ordering};

    /// Plain code for the compilation target.
    pub const BASELINE: u8 = 1;
    /// AVX2 (x86-64).
    pub const AVX2: u8 = 2;
    /// AVX-512 F/BW/DQ/VL (x86-64).
    pub const AVX512: u8 = 3;

    static LEVEL: AtomicU8 = AtomicU8::new(0);
    static CAP: AtomicU8 = AtomicU8::new(u8::MAX);

    /// The widest version this CPU (and build) supports.
    pub fn detected() -> u8 {
        #[cfg(target_arch = "x86_64")]
        {
            #[cfg(nextok_avx512)]
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512dq")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("bmi1")
                && std::arch::is_x86_feature_detected!("popcnt")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return AVX512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return AVX2;
            }
        }
        BASELINE
    }

    /// The version the kernels use now.
    #[inline]
    pub fn level() -> u8 {
        let l = LEVEL.load(Ordering::Relaxed);
        if l != 0 {
            return l;
        }
        let l = detected().min(CAP.load(Ordering::Relaxed));
        LEVEL.store(l, Ordering::Relaxed);
        l
    }

    /// Uses at most `level` from now on (for tests and benchmarks; results do not change).
    pub fn set_max_level(level: u8) {
        CAP.store(level.max(BASELINE), Ordering::Relaxed);
        LEVEL.store(detected().min(level.max(BASELINE)), Ordering::Relaxed);
    }
}

/// Defines a function whose body is compiled for the baseline target and, on x86-64, with AVX2
/// and AVX-512 enabled; the widest copy the CPU supports runs. The body must be plain arithmetic
/// (see the module docs): every copy returns identical results.
macro_rules! multiversion {
    ($(#[$attr:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$attr])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn generic($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                let level = $crate::math::simd::level();
                #[cfg(nextok_avx512)]
                {
                    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
                    unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                        generic($($arg),*)
                    }
                    if level >= $crate::math::simd::AVX512 {
                        // SAFETY: the CPU supports these features (`simd::detected`).
                        return unsafe { avx512($($arg),*) };
                    }
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    generic($($arg),*)
                }
                if level >= $crate::math::simd::AVX2 {
                    // SAFETY: the CPU supports AVX2 (`simd::detected`).
                    return unsafe { avx2($($arg),*) };
                }
            }
            generic($($arg),*)
        }
    };
}
pub(crate) use multiversion;

/// Inputs below this give `exp_f32(x) == 0.0` (the result would be subnormal).
pub const EXP_F32_FLUSH: f32 = -87.0;

// The constants of `exp_f32` (shared with the vector versions).
const EXP_LOG2E: f32 = std::f32::consts::LOG2_E;
const EXP_C1: f32 = 0.693_359_4; // ln 2, high part (0.693359375)
const EXP_C2: f32 = -2.121_944_4e-4; // ln 2, low part
const EXP_MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to nearest integer
const EXP_CLAMP: f32 = 88.0;
const EXP_P: [f32; 6] = [
    1.987_569_2e-4,
    1.398_2e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    5.000_000_1e-1,
];
// 2^n from the bits of t: the low mantissa bits of t hold n + 0x400000.
const EXP_BIAS: u32 = 127u32.wrapping_sub(0x4B40_0000);

/// `e^x` in `f32`, deterministic on every platform. `x < -87` (and `-inf`) gives `0.0`;
/// `x > 88` is clamped to `88` (callers only pass `x <= 0`).
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    let flush = x < EXP_F32_FLUSH;
    let xc = if flush {
        0.0
    } else if x > EXP_CLAMP {
        EXP_CLAMP
    } else {
        x
    };
    let t = xc * EXP_LOG2E + EXP_MAGIC;
    let n = t - EXP_MAGIC;
    // fused multiply-adds: one rounding each (IEEE-754 fusedMultiplyAdd), in hardware or in
    // software, so every platform and vector width computes the same bits
    let r = (-n).mul_add(EXP_C2, (-n).mul_add(EXP_C1, xc));
    let z = r * r;
    let mut y = EXP_P[0];
    y = y.mul_add(r, EXP_P[1]);
    y = y.mul_add(r, EXP_P[2]);
    y = y.mul_add(r, EXP_P[3]);
    y = y.mul_add(r, EXP_P[4]);
    y = y.mul_add(r, EXP_P[5]);
    y = y.mul_add(z, r) + 1.0;
    let pow2 = f32::from_bits(t.to_bits().wrapping_add(EXP_BIAS) << 23);
    if flush {
        0.0
    } else {
        y * pow2
    }
}

/// AVX-512 versions of the hot kernels, written with intrinsics: the same IEEE-754 operations as
/// the scalar code, lane by lane, in the same order (fused multiply-adds exactly where the
/// scalar code has `mul_add`); where a single exact
/// instruction replaces a sequence of the scalar code (rounding to an integer, scaling by a power
/// of two), it is shown to give the same bits (see [`x86::exp16x4`]).
#[cfg(all(target_arch = "x86_64", nextok_avx512))]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    use super::*;

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
    pub(crate) unsafe fn exp16x4(x: [__m512; 4]) -> [__m512; 4] {
        exp16x4_clamp::<true>(x)
    }

    /// [`exp16x4`]; without `CLAMP` only for inputs `<= 0` (then `min(88, x)` is `x`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
    pub(crate) unsafe fn exp16x4_clamp<const CLAMP: bool>(x: [__m512; 4]) -> [__m512; 4] {
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
    pub(crate) unsafe fn add_lanes16(acc: __m512d, e: __m512) -> __m512d {
        let lo = _mm512_cvtps_pd(_mm512_castps512_ps256(e));
        let hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
            _mm512_castps_pd(e),
        )));
        _mm512_add_pd(_mm512_add_pd(acc, lo), hi)
    }

    /// `w[i] = exp_f32(z[i] - m)` over the whole blocks of 64 values (nothing is stored when `w`
    /// is `None`); the lane sums of [`super::sum_f64_lanes`] continue in `acc`. Returns the
    /// number of values covered.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
    pub(crate) unsafe fn exp_blocks<const CLAMP: bool>(
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
        let mut a = _mm512_loadu_pd(acc.as_ptr());
        // software pipelined: the weights of a block are summed one block later, so that the
        // sequential lane sums never wait for the long `exp` chain of the block being computed
        macro_rules! block {
            ($i:expr) => {{
                let p = z.as_ptr().add($i);
                let e = exp16x4_clamp::<CLAMP>([
                    _mm512_sub_ps(_mm512_loadu_ps(p), vm),
                    _mm512_sub_ps(_mm512_loadu_ps(p.add(16)), vm),
                    _mm512_sub_ps(_mm512_loadu_ps(p.add(32)), vm),
                    _mm512_sub_ps(_mm512_loadu_ps(p.add(48)), vm),
                ]);
                if let Some(w) = w.as_deref_mut() {
                    let q = w.as_mut_ptr().add($i);
                    _mm512_storeu_ps(q, e[0]);
                    _mm512_storeu_ps(q.add(16), e[1]);
                    _mm512_storeu_ps(q.add(32), e[2]);
                    _mm512_storeu_ps(q.add(48), e[3]);
                }
                e
            }};
        }
        macro_rules! consume {
            ($e:expr) => {{
                let e = $e;
                a = add_lanes16(a, e[0]);
                a = add_lanes16(a, e[1]);
                a = add_lanes16(a, e[2]);
                a = add_lanes16(a, e[3]);
            }};
        }
        if n > 0 {
            let mut prev = block!(0);
            let mut i = 64;
            while i < n {
                let e = block!(i);
                consume!(prev);
                prev = e;
                i += 64;
            }
            consume!(prev);
        }
        _mm512_storeu_pd(acc.as_mut_ptr(), a);
        n
    }
}

/// Natural logarithm in `f64` (fdlibm's algorithm). `ln(0) = -inf`, negative or NaN gives NaN.
pub fn ln_f64(x: f64) -> f64 {
    const LN2_HI: f64 = 6.931_471_803_691_238_164_90e-01;
    const LN2_LO: f64 = 1.908_214_929_270_587_700_02e-10;
    const TWO54: f64 = 1.801_439_850_948_198_400_00e16;
    const LG1: f64 = 6.666_666_666_666_735_130e-01;
    const LG2: f64 = 3.999_999_999_940_941_908e-01;
    const LG3: f64 = 2.857_142_874_366_239_149e-01;
    const LG4: f64 = 2.222_219_843_214_978_396e-01;
    const LG5: f64 = 1.818_357_216_161_805_012e-01;
    const LG6: f64 = 1.531_383_769_920_937_332e-01;
    const LG7: f64 = 1.479_819_860_511_658_591e-01;

    let mut x = x;
    let bits = x.to_bits();
    let mut hx = (bits >> 32) as i32;
    let lx = bits as u32;
    let mut k: i32 = 0;
    if hx < 0x0010_0000 {
        if ((hx & 0x7fff_ffff) | lx as i32) == 0 {
            return f64::NEG_INFINITY;
        }
        if hx < 0 {
            return f64::NAN;
        }
        k -= 54;
        x *= TWO54;
        hx = (x.to_bits() >> 32) as i32;
    }
    if hx >= 0x7ff0_0000 {
        return x + x;
    }
    k += (hx >> 20) - 1023;
    hx &= 0x000f_ffff;
    let i = (hx + 0x95f64) & 0x0010_0000;
    let new_hi = (hx | (i ^ 0x3ff0_0000)) as u32;
    x = f64::from_bits(((new_hi as u64) << 32) | (x.to_bits() & 0xffff_ffff));
    k += i >> 20;
    let f = x - 1.0;
    let dk = k as f64;
    if (0x000f_ffff & (2 + hx)) < 3 {
        if f == 0.0 {
            return if k == 0 {
                0.0
            } else {
                dk * LN2_HI + dk * LN2_LO
            };
        }
        let r = f * f * (0.5 - 0.333_333_333_333_333_33 * f);
        return if k == 0 {
            f - r
        } else {
            dk * LN2_HI - ((r - dk * LN2_LO) - f)
        };
    }
    let s = f / (2.0 + f);
    let z = s * s;
    let mut i = hx - 0x6147a;
    let w = z * z;
    let j = 0x6b851 - hx;
    let t1 = w * (LG2 + w * (LG4 + w * LG6));
    let t2 = z * (LG1 + w * (LG3 + w * (LG5 + w * LG7)));
    i |= j;
    let r = t2 + t1;
    if i > 0 {
        let hfsq = 0.5 * f * f;
        if k == 0 {
            f - (hfsq - s * (hfsq + r))
        } else {
            dk * LN2_HI - ((hfsq - (s * (hfsq + r) + dk * LN2_LO)) - f)
        }
    } else if k == 0 {
        f - s * (f - r)
    } else {
        dk * LN2_HI - ((s * (f - r) - dk * LN2_LO) - f)
    }
}

/// Sum with a fixed association: lane `j` sums elements `j, j+8, j+16, ...` in `f64`, then the
/// eight lanes are added in order 0..8.
pub fn sum_f64_lanes(xs: &[f32]) -> f64 {
    sum_f64_lanes_kernel(xs)
}

multiversion! {
    fn sum_f64_lanes_kernel(xs: &[f32]) -> f64 {
        sum_f64_lanes_inline(xs)
    }
}

#[inline(always)]
pub(crate) fn sum_f64_lanes_inline(xs: &[f32]) -> f64 {
    let mut acc = [0.0f64; 8];
    let chunks = xs.chunks_exact(8);
    let rem = chunks.remainder();
    for c in chunks {
        for j in 0..8 {
            acc[j] += c[j] as f64;
        }
    }
    for (j, &x) in rem.iter().enumerate() {
        acc[j] += x as f64;
    }
    acc.iter().sum()
}

/// Maximum of a slice that holds no NaN (`-inf` allowed). Empty gives `-inf`.
pub fn max_f32(xs: &[f32]) -> f32 {
    max_f32_kernel(xs)
}

multiversion! {
    fn max_f32_kernel(xs: &[f32]) -> f32 {
        max_f32_inline(xs)
    }
}

/// [`max_f32`] for inlining into other kernels.
#[inline(always)]
pub(crate) fn max_f32_inline(xs: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 8];
    let chunks = xs.chunks_exact(8);
    let rem = chunks.remainder();
    for c in chunks {
        for j in 0..8 {
            acc[j] = if c[j] > acc[j] { c[j] } else { acc[j] };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &x in rem.iter().chain(acc.iter()) {
        if x > m {
            m = x;
        }
    }
    m
}

/// Writes `w[i] = exp_f32(z[i] - m)` for every `i` and returns the lane sum of `w` in `f64`.
pub fn exp_weights(z: &[f32], m: f32, w: &mut [f32]) -> f64 {
    debug_assert_eq!(z.len(), w.len());
    exp_weights_kernel(z, m, w)
}

fn exp_weights_kernel(z: &[f32], m: f32, w: &mut [f32]) -> f64 {
    #[cfg(all(target_arch = "x86_64", nextok_avx512))]
    if simd::level() >= simd::AVX512 {
        // SAFETY: the CPU supports AVX-512 (`simd::detected`).
        return unsafe { exp_weights_avx512(z, m, w) };
    }
    exp_weights_multi(z, m, w)
}

#[cfg(all(target_arch = "x86_64", nextok_avx512))]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
unsafe fn exp_weights_avx512(z: &[f32], m: f32, w: &mut [f32]) -> f64 {
    let mut acc = [0.0f64; 8];
    let n = x86::exp_blocks::<true>(z, m, Some(&mut *w), &mut acc);
    for (i, (zv, wv)) in z.iter().zip(w.iter_mut()).enumerate().skip(n) {
        let e = exp_f32(*zv - m);
        *wv = e;
        acc[i % 8] += e as f64;
    }
    acc.iter().sum()
}

multiversion! {
    fn exp_weights_multi(z: &[f32], m: f32, w: &mut [f32]) -> f64 {
        exp_weights_inline(z, m, w)
    }
}

#[inline(always)]
fn exp_weights_inline(z: &[f32], m: f32, w: &mut [f32]) -> f64 {
    let mut acc = LaneSum([0.0f64; 8]);
    let n = exp_pass(z, m, w, &mut acc);
    let mut acc = acc.0;
    for (i, (zv, wv)) in z[n..].iter().zip(w[n..].iter_mut()).enumerate() {
        let e = exp_f32(*zv - m);
        *wv = e;
        acc[(n + i) % 8] += e as f64;
    }
    acc.iter().sum()
}

/// `sum_i exp_f32(z[i] - m)` in the lane order of [`sum_f64_lanes`], without storing weights.
pub fn exp_sum(z: &[f32], m: f32) -> f64 {
    exp_sum_kernel(z, m)
}

/// [`exp_sum`] when `m` is at least every `z[i]` (the maximum): the same result, a little faster
/// (the clamp of large inputs cannot apply).
pub(crate) fn exp_sum_at_max(z: &[f32], m: f32) -> f64 {
    #[cfg(all(target_arch = "x86_64", nextok_avx512))]
    if simd::level() >= simd::AVX512 && !m.is_nan() {
        // SAFETY: the CPU supports AVX-512 (`simd::detected`); `z[i] - m <= 0` for every `i`
        // (the caller's contract), so skipping `min(88, x)` changes nothing.
        return unsafe { exp_sum_avx512::<false>(z, m) };
    }
    exp_sum_multi(z, m)
}

fn exp_sum_kernel(z: &[f32], m: f32) -> f64 {
    #[cfg(all(target_arch = "x86_64", nextok_avx512))]
    if simd::level() >= simd::AVX512 {
        // SAFETY: the CPU supports AVX-512 (`simd::detected`).
        return unsafe { exp_sum_avx512::<true>(z, m) };
    }
    exp_sum_multi(z, m)
}

#[cfg(all(target_arch = "x86_64", nextok_avx512))]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
unsafe fn exp_sum_avx512<const CLAMP: bool>(z: &[f32], m: f32) -> f64 {
    let mut acc = [0.0f64; 8];
    let n = x86::exp_blocks::<CLAMP>(z, m, None, &mut acc);
    for (i, &x) in z.iter().enumerate().skip(n) {
        acc[i % 8] += exp_f32(x - m) as f64;
    }
    acc.iter().sum()
}

multiversion! {
    fn exp_sum_multi(z: &[f32], m: f32) -> f64 {
        exp_sum_inline(z, m)
    }
}

#[inline(always)]
fn exp_sum_inline(z: &[f32], m: f32) -> f64 {
    let mut acc = LaneSum([0.0f64; 8]);
    let n = exp_pass_ring(z, m, &mut acc);
    let mut acc = acc.0;
    for (i, &x) in z[n..].iter().enumerate() {
        acc[(n + i) % 8] += exp_f32(x - m) as f64;
    }
    acc.iter().sum()
}

/// Chunk length of [`exp_pass`].
pub(crate) const EXP_CHUNK: usize = 16;
/// How many chunks ahead [`exp_pass`] computes weights before they are consumed.
const EXP_LEAD: usize = 8;

/// A consumer of the weight chunks of [`exp_pass`], called once per chunk in order.
pub(crate) trait ChunkVisitor {
    /// Chunk `k` (values `16 k .. 16 k + 16`).
    fn visit(&mut self, k: usize, c: &[f32; EXP_CHUNK]);
}

/// The `f64` lane sum of [`sum_f64_lanes`] as a chunk consumer.
pub(crate) struct LaneSum(pub(crate) [f64; 8]);

impl ChunkVisitor for LaneSum {
    #[inline(always)]
    fn visit(&mut self, _k: usize, c: &[f32; EXP_CHUNK]) {
        add_lanes16(&mut self.0, c);
    }
}

/// `exp_f32(z[j] - m)` for one chunk.
#[inline(always)]
fn exp_chunk(z: &[f32], m: f32) -> [f32; EXP_CHUNK] {
    let mut e = [0.0f32; EXP_CHUNK];
    for (ej, &zj) in e.iter_mut().zip(z) {
        *ej = exp_f32(zj - m);
    }
    e
}

/// Adds a chunk to the eight `f64` lanes: element `j` to lane `j % 8`, in index order.
#[inline(always)]
pub(crate) fn add_lanes16(acc: &mut [f64; 8], c: &[f32; EXP_CHUNK]) {
    for j in 0..8 {
        acc[j] += c[j] as f64;
    }
    for j in 0..8 {
        acc[j] += c[8 + j] as f64;
    }
}

/// Writes `w[i] = exp_f32(z[i] - m)` for the whole chunks of `z` (16 values each) and gives every
/// chunk, in order, to `v`. The weights are computed a few chunks ahead of their consumption so
/// that the long latency of `exp_f32` overlaps the (sequential) consumer; the order of the
/// consumer's operations is unchanged. Returns the number of values covered (the caller handles
/// the rest).
#[inline(always)]
pub(crate) fn exp_pass<V: ChunkVisitor>(z: &[f32], m: f32, w: &mut [f32], v: &mut V) -> usize {
    const C: usize = EXP_CHUNK;
    let nc = z.len().min(w.len()) / C;
    let lead = nc.min(EXP_LEAD);
    for k in 0..nc {
        let e = exp_chunk(&z[C * k..C * k + C], m);
        w[C * k..C * k + C].copy_from_slice(&e);
        if k >= lead {
            let j = k - lead;
            v.visit(j, w[C * j..C * j + C].try_into().expect("chunk"));
        }
    }
    for j in nc - lead..nc {
        v.visit(j, w[C * j..C * j + C].try_into().expect("chunk"));
    }
    nc * C
}

/// [`exp_pass`] without storing the weights (a small ring buffer holds the chunks in flight).
#[inline(always)]
pub(crate) fn exp_pass_ring<V: ChunkVisitor>(z: &[f32], m: f32, v: &mut V) -> usize {
    const C: usize = EXP_CHUNK;
    let mut ring = [[0.0f32; C]; EXP_LEAD];
    let nc = z.len() / C;
    let lead = nc.min(EXP_LEAD);
    for k in 0..nc {
        let e = exp_chunk(&z[C * k..C * k + C], m);
        if k >= lead {
            let j = k - lead;
            v.visit(j, &ring[j % EXP_LEAD]);
        }
        ring[k % EXP_LEAD] = e;
    }
    for j in nc - lead..nc {
        v.visit(j, &ring[j % EXP_LEAD]);
    }
    nc * C
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps32(a: f32, b: f32) -> i64 {
        (a.to_bits() as i64 - b.to_bits() as i64).abs()
    }

    #[test]
    fn exp_matches_std_within_2_ulp() {
        let mut worst = 0;
        let mut x = -86.9f32;
        while x < 0.0 {
            let got = exp_f32(x);
            let want = (x as f64).exp() as f32;
            worst = worst.max(ulps32(got, want));
            x += 0.000_731;
        }
        assert!(worst <= 2, "worst ulp error {worst}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-87.5), 0.0);
    }

    #[test]
    fn ln_matches_std() {
        let mut worst = 0i64;
        for i in 1..20000u64 {
            let x = (i as f64) * 0.000_37 + 1e-300 * (i as f64);
            let got = ln_f64(x);
            let want = x.ln();
            worst = worst.max((got.to_bits() as i64 - want.to_bits() as i64).abs());
        }
        for &x in &[1.0, 2.0, 0.5, 1e-310, 1e300, 3.0, std::f64::consts::E] {
            let d = (ln_f64(x).to_bits() as i64 - x.ln().to_bits() as i64).abs();
            worst = worst.max(d);
        }
        assert!(worst <= 1, "worst ulp error {worst}");
        assert_eq!(ln_f64(0.0), f64::NEG_INFINITY);
        assert!(ln_f64(-1.0).is_nan());
        assert_eq!(ln_f64(1.0), 0.0);
    }

    /// Checks [`x86::exp16x4`] against [`exp_f32`] on 64 inputs (AVX-512 must be available).
    #[cfg(all(target_arch = "x86_64", nextok_avx512))]
    fn check_exp16x4(v: &[f32; 64]) {
        use std::arch::x86_64::*;
        let mut out = [0.0f32; 64];
        // SAFETY: the callers check that the CPU supports AVX-512.
        unsafe {
            let p = v.as_ptr();
            let e = x86::exp16x4([
                _mm512_loadu_ps(p),
                _mm512_loadu_ps(p.add(16)),
                _mm512_loadu_ps(p.add(32)),
                _mm512_loadu_ps(p.add(48)),
            ]);
            for (k, e) in e.iter().enumerate() {
                _mm512_storeu_ps(out.as_mut_ptr().add(16 * k), *e);
            }
        }
        for (x, y) in v.iter().zip(out) {
            assert_eq!(exp_f32(*x).to_bits(), y.to_bits(), "exp of {x:e}");
        }
    }

    /// The AVX-512 `exp` against the scalar one on every 61st `f32` bit pattern, and on the
    /// values around 0, the flush threshold and the clamp.
    #[cfg(all(target_arch = "x86_64", nextok_avx512))]
    #[test]
    fn exp16x4_matches_scalar() {
        if simd::detected() < simd::AVX512 {
            return;
        }
        let mut xs: Vec<f32> = (0..u32::MAX / 61).map(|i| f32::from_bits(i * 61)).collect();
        for c in [0.0f32, -87.0, 88.0, -87.5, 87.5] {
            let b = c.to_bits();
            for d in 0..20_000u32 {
                xs.push(f32::from_bits(b.wrapping_add(d)));
                xs.push(f32::from_bits(b.wrapping_sub(d)));
            }
        }
        xs.extend([f32::NEG_INFINITY, f32::INFINITY, -0.0, f32::MAX, -f32::MAX]);
        xs.retain(|x| !x.is_nan());
        for c in xs.chunks(64) {
            let mut v = [0.0f32; 64];
            v[..c.len()].copy_from_slice(c);
            check_exp16x4(&v);
        }
    }

    /// Every non-NaN `f32` input (about 4·10⁹; a minute in release):
    /// `cargo test --release -p nextok-core --lib exp16x4_matches_scalar_everywhere -- --ignored`.
    #[test]
    #[ignore]
    #[cfg(all(target_arch = "x86_64", nextok_avx512))]
    fn exp16x4_matches_scalar_everywhere() {
        if simd::detected() < simd::AVX512 {
            return;
        }
        let mut v = [0.0f32; 64];
        for base in (0..=u32::MAX).step_by(64) {
            for (j, x) in v.iter_mut().enumerate() {
                let x0 = f32::from_bits(base + j as u32);
                *x = if x0.is_nan() { 0.0 } else { x0 };
            }
            check_exp16x4(&v);
        }
    }

    #[test]
    fn lane_sum_is_order_fixed() {
        let xs: Vec<f32> = (0..1001).map(|i| (i as f32).sin()).collect();
        let a = sum_f64_lanes(&xs);
        let naive: f64 = xs.iter().map(|&x| x as f64).sum();
        assert!((a - naive).abs() < 1e-9);
        assert_eq!(
            max_f32(&xs),
            xs.iter().cloned().fold(f32::NEG_INFINITY, f32::max)
        );
    }
}
