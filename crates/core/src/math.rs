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
//! * [`exp_f64`] — the fdlibm `__ieee754_exp` algorithm (error < 1 ulp); [`pow_f64`] on top of it
//!   and [`ln_f64`] (for length penalties).
//! * [`log_sum_exp`] and [`logprob`] — the log-softmax of the records' layers, `(z − m) − ln S`,
//!   for code outside the sampler that scores tokens the same way (beam search).
//! * [`sum_f64_lanes`] — a sum with a fixed association order (8 lanes by index mod 8, then the
//!   lanes added in order), so a sum never depends on thread count or vector width.
//!
//!
//! The slice functions ([`sum_f64_lanes`], [`max_f32`], [`exp_weights`], [`exp_sum`]) run on
//! the vector kernels of the crate's `kernels` module, compiled for several instruction sets
//! and chosen at run time by [`crate::cpu`]; every version returns the same bits (see that
//! module). [`crate::cpu::set_max_level`] caps the choice process-wide (for benchmarks).

// The polynomial and ln-2 constants are the published Cephes/fdlibm decimals; they parse to the
// intended doubles, and the tests check the results against the standard library.
#![allow(clippy::excessive_precision)]

use crate::cpu::Level;
use crate::kernels::{self, Isa};

pub use crate::kernels::common::{exp_f32, EXP_F32_FLUSH};

/// The level whose code the slice kernels (these functions' and the sampler's) run when asked
/// for `level`: the best one this CPU supports up to `level`, and at most [`Level::Avx512`]
/// (they have no VNNI code; a build without AVX-512 kernels stops at [`Level::Avx2`]). The
/// sampler's benchmark and tests name and pick their levels by it.
#[doc(hidden)]
pub fn kernel_level(level: Level) -> Level {
    Isa::of(level).get()
}

/// The name the sampler's benchmark and tests give the slice kernels' code at `level` (see
/// [`kernel_level`]): `baseline`, `avx2` or `avx512`.
#[doc(hidden)]
pub fn kernel_name(level: Level) -> &'static str {
    Isa::of(level).name()
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

/// `e^x` in `f64` (fdlibm's `__ieee754_exp`, error < 1 ulp), deterministic on every platform.
/// `exp_f64(-inf) = 0`, `exp_f64(+inf) = +inf`; NaN gives NaN; results overflow to `+inf` above
/// about `709.78` and underflow to `0` below about `-745.13`.
pub fn exp_f64(x: f64) -> f64 {
    const HALF: [f64; 2] = [0.5, -0.5];
    const HUGE: f64 = 1.0e300;
    const TWOM1000: f64 = 9.332_636_185_032_188_789_90e-302; // 2^-1000
    const O_THRESHOLD: f64 = 7.097_827_128_933_839_730_96e2;
    const U_THRESHOLD: f64 = -7.451_332_191_019_411_084_20e2;
    const LN2_HI: [f64; 2] = [
        6.931_471_803_691_238_164_90e-1,
        -6.931_471_803_691_238_164_90e-1,
    ];
    const LN2_LO: [f64; 2] = [
        1.908_214_929_270_587_700_02e-10,
        -1.908_214_929_270_587_700_02e-10,
    ];
    const INV_LN2: f64 = std::f64::consts::LOG2_E; // fdlibm's invln2, 0x3ff71547_652b82fe
    const P1: f64 = 1.666_666_666_666_660_190_37e-1;
    const P2: f64 = -2.777_777_777_701_559_338_42e-3;
    const P3: f64 = 6.613_756_321_437_934_361_17e-5;
    const P4: f64 = -1.653_390_220_546_525_153_90e-6;
    const P5: f64 = 4.138_136_797_057_238_460_39e-8;

    let bits = x.to_bits();
    let xsb = (bits >> 63) as usize; // sign bit of x
    let hx = ((bits >> 32) as u32) & 0x7fff_ffff; // high word of |x|

    // non-finite and out-of-range arguments
    if hx >= 0x4086_2E42 {
        // |x| >= 709.78...
        if hx >= 0x7ff0_0000 {
            if ((hx & 0xf_ffff) | bits as u32) != 0 {
                return x + x; // NaN
            }
            return if xsb == 0 { x } else { 0.0 }; // exp(+-inf) = {inf, 0}
        }
        if x > O_THRESHOLD {
            return HUGE * HUGE; // overflow
        }
        if x < U_THRESHOLD {
            return TWOM1000 * TWOM1000; // underflow
        }
    }

    // argument reduction: x = k ln 2 + r, |r| <= 0.5 ln 2
    let mut x = x;
    let (k, hi, lo): (i32, f64, f64);
    if hx > 0x3fd6_2e42 {
        // |x| > 0.5 ln 2
        if hx < 0x3FF0_A2B2 {
            // and |x| < 1.5 ln 2
            hi = x - LN2_HI[xsb];
            lo = LN2_LO[xsb];
            k = 1 - 2 * xsb as i32;
        } else {
            k = (INV_LN2 * x + HALF[xsb]) as i32;
            let t = k as f64;
            hi = x - t * LN2_HI[0]; // t * LN2_HI is exact here
            lo = t * LN2_LO[0];
        }
        x = hi - lo;
    } else if hx < 0x3e30_0000 {
        // |x| < 2^-28
        return 1.0 + x;
    } else {
        k = 0;
        hi = 0.0;
        lo = 0.0;
    }

    // x is now in the primary range
    let t = x * x;
    let c = x - t * (P1 + t * (P2 + t * (P3 + t * (P4 + t * P5))));
    if k == 0 {
        return 1.0 - ((x * c) / (c - 2.0) - x);
    }
    let y = 1.0 - ((lo - (x * c) / (2.0 - c)) - hi);
    // add k to y's exponent
    if k >= -1021 {
        f64::from_bits(y.to_bits().wrapping_add((k as i64 as u64) << 52))
    } else {
        f64::from_bits(y.to_bits().wrapping_add(((k + 1000) as i64 as u64) << 52)) * TWOM1000
    }
}

/// `x^y` for `x > 0` as `exp_f64(y · ln_f64(x))`, deterministic on every platform (exactly `1`
/// for `y = 0` and exactly `x` for `y = 1`). Not correctly rounded: the rounding of `y · ln x`
/// adds a relative error of about `|y ln x| · 2^-53`, so keep `|y ln x|` moderate (a length
/// penalty `len^α` is). `x = 0` gives `0` for `y > 0` and `+inf` for `y < 0`; a negative `x` or
/// a NaN gives NaN.
pub fn pow_f64(x: f64, y: f64) -> f64 {
    if y == 0.0 {
        return 1.0;
    }
    if y == 1.0 {
        return x;
    }
    exp_f64(y * ln_f64(x))
}

/// The normaliser of a log-softmax: `(m, ln S)` with `m` = [`max_f32`] of `z` and `S` =
/// [`exp_sum`]`(z, m)` (the weights `exp_f32(z_i − m)` summed in `f64` lanes), so that the
/// logprob of `z_i` is `(z_i − m) − ln S` (see [`logprob`]); exactly how nextok's records compute
/// the raw and processed layers. An empty `z` or one of only `-inf` gives `(-inf, NaN)`.
pub fn log_sum_exp(z: &[f32]) -> (f32, f64) {
    let m = max_f32(z);
    (m, ln_f64(exp_sum(z, m)))
}

/// The logprob `(z − m) − ln S` of a value `z`, given the normaliser `(m, ln S)` of
/// [`log_sum_exp`]; `-inf` for `z = -inf`.
#[inline]
pub fn logprob(z: f32, (m, ln_s): (f32, f64)) -> f64 {
    if z == f32::NEG_INFINITY {
        f64::NEG_INFINITY
    } else {
        (z - m) as f64 - ln_s
    }
}

/// Sum with a fixed association: lane `j` sums elements `j, j+8, j+16, ...` in `f64`, then the
/// eight lanes are added in order 0..8.
pub fn sum_f64_lanes(xs: &[f32]) -> f64 {
    kernels::sum_f64_lanes(Isa::current(), xs)
}

/// Maximum of a slice that holds no NaN (`-inf` allowed). Empty gives `-inf`.
pub fn max_f32(xs: &[f32]) -> f32 {
    kernels::max_f32(Isa::current(), xs)
}

/// Writes `w[i] = exp_f32(z[i] - m)` for every `i` and returns the lane sum of `w` in `f64`.
pub fn exp_weights(z: &[f32], m: f32, w: &mut [f32]) -> f64 {
    debug_assert_eq!(z.len(), w.len());
    kernels::exp_weights(Isa::current(), z, m, w)
}

/// `sum_i exp_f32(z[i] - m)` in the lane order of [`sum_f64_lanes`], without storing weights.
pub fn exp_sum(z: &[f32], m: f32) -> f64 {
    kernels::exp_sum(Isa::current(), z, m)
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

    #[test]
    fn exp_f64_matches_std() {
        let mut worst = 0i64;
        let mut x = -745.5f64;
        while x < 710.0 {
            for x in [x, x * 1e-3, x * 1e-9, x * 1e-20] {
                let (got, want) = (exp_f64(x), x.exp());
                worst = worst.max((got.to_bits() as i64 - want.to_bits() as i64).abs());
            }
            x += 0.013_7;
        }
        assert!(worst <= 1, "worst ulp error {worst}");
        // the reduction's 1/ln 2 is fdlibm's `invln2`
        assert_eq!(std::f64::consts::LOG2_E.to_bits(), 0x3ff7_1547_652b_82fe);
        assert_eq!(exp_f64(0.0), 1.0);
        let e = exp_f64(1.0).to_bits() as i64 - std::f64::consts::E.to_bits() as i64;
        assert!(e.abs() <= 1);
        assert_eq!(exp_f64(f64::NEG_INFINITY), 0.0);
        assert_eq!(exp_f64(f64::INFINITY), f64::INFINITY);
        assert_eq!(exp_f64(1000.0), f64::INFINITY);
        assert_eq!(exp_f64(-1000.0), 0.0);
        assert!(exp_f64(f64::NAN).is_nan());
        // subnormal results
        for x in [-708.5, -720.0, -740.0, -744.0] {
            let d = (exp_f64(x).to_bits() as i64 - x.exp().to_bits() as i64).abs();
            assert!(d <= 1, "exp({x}): {d} ulp");
        }
    }

    #[test]
    fn pow_and_log_sum_exp() {
        assert_eq!(pow_f64(3.0, 1.0), 3.0);
        assert_eq!(pow_f64(3.0, 0.0), 1.0);
        for len in 1..200 {
            for a in [0.5, 0.6, 1.2, 2.0, -1.0] {
                let (got, want) = (pow_f64(len as f64, a), (len as f64).powf(a));
                assert!(
                    ((got - want) / want).abs() < 1e-14,
                    "{len}^{a}: {got} {want}"
                );
            }
        }
        let z = [2.0f32, 1.5, 0.5, f32::NEG_INFINITY];
        let n = log_sum_exp(&z);
        assert_eq!(n.0, 2.0);
        let total: f64 = z.iter().map(|&x| logprob(x, n).exp()).sum();
        // the weights are `exp_f32`'s (about 1e-7 relative); the logprobs are not rounded to `f32`
        assert!((total - 1.0).abs() < 1e-6);
        assert_eq!(logprob(f32::NEG_INFINITY, n), f64::NEG_INFINITY);
        let want = ((2.0f64 - 2.0).exp() + (-0.5f64).exp() + (-1.5f64).exp()).ln();
        assert!((n.1 - want).abs() < 1e-7);
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

    /// The slice functions at the process-wide level give the bits of the obvious scalar code.
    #[test]
    fn slice_functions_at_the_process_wide_level() {
        let row = &crate::kernels::tests::rows()[40];
        let m = max_f32(row);
        assert_eq!(
            exp_sum(row, m).to_bits(),
            crate::kernels::tests::exp_sum_ref(row, m).0.to_bits()
        );
    }

    /// The kernels' levels: at most what the CPU has and what they have code for.
    #[test]
    fn kernel_levels_and_names() {
        for l in Level::ALL {
            let k = kernel_level(l);
            assert!(k <= l && k.supported() && k <= Level::Avx512);
        }
        assert_eq!(kernel_name(Level::Scalar), "baseline");
        let best = kernel_level(Level::Avx512Vnni);
        let want = ["baseline", "avx2", "avx512"][best as usize];
        assert_eq!(kernel_name(Level::Avx512Vnni), want);
    }
}
