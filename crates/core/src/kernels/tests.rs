//! Every kernel version (baseline, AVX2, AVX-512 as the CPU allows) against plain scalar code
//! written the obvious way: same bits. The levels are passed explicitly, so these tests never
//! touch the process-wide cap and may run in parallel with anything.
//!
//! Each test prints the levels it ran (`cargo test -- --nocapture`). A machine without AVX-512
//! tests the other levels only, unless `NEXTOK_EXPECT_AVX512=1` says it must have AVX-512 (set
//! it on CI runners that do): then the missing level fails the test.

use super::*;
use common::exp_f32;

pub(crate) struct Rng(pub(crate) u64);
impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub(crate) fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Logit rows that stress the kernels: odd lengths, ties, signed zeros, `-inf`, huge and
/// tiny ranges, values far below the maximum (weights flushed to 0).
pub(crate) fn rows() -> Vec<Vec<f32>> {
    let mut r = Rng(11);
    let mut out = Vec::new();
    for &n in &[
        1usize, 7, 8, 15, 16, 17, 63, 64, 65, 127, 200, 1000, 4099, 70_001,
    ] {
        for kind in 0..10 {
            let row: Vec<f32> = (0..n)
                .map(|i| match kind {
                    0 => (r.unit() - 0.5) * 20.0,
                    1 => (r.below(5) as f32) - 2.0,
                    2 => [0.0, -0.0, -1.0][r.below(3)],
                    3 => (r.unit() - 0.5) * 400.0,
                    4 => (r.unit() - 0.9) * 1e-3,
                    5 => {
                        if r.below(4) == 0 {
                            f32::NEG_INFINITY
                        } else {
                            (r.unit() - 0.5) * 30.0
                        }
                    }
                    6 => {
                        if r.below(50) == 0 {
                            12.0 + r.unit() * 3.0
                        } else {
                            (r.unit() - 0.5) * 8.0
                        }
                    }
                    // strong tokens packed at the low ids (few blocks hold a large nucleus)
                    7 => {
                        if i < n / 8 {
                            6.0 + r.unit()
                        } else {
                            (r.unit() - 0.5) * 8.0
                        }
                    }
                    // a sparse nucleus spread over many blocks, found in several bands
                    8 => {
                        if i % 700 == 0 {
                            4.0 + 8.0 * r.unit()
                        } else {
                            -5.0 - r.unit()
                        }
                    }
                    // a flat bulk with a few strong tokens (nuclei of thousands)
                    _ => {
                        if r.below(3000) == 0 {
                            9.0 + r.unit() * 4.0
                        } else {
                            (r.unit() + r.unit() + r.unit() - 1.5) * 5.0
                        }
                    }
                })
                .collect();
            out.push(row);
        }
    }
    out
}

/// Whether the environment says this machine must run the AVX-512 kernels.
fn avx512_expected() -> bool {
    std::env::var_os("NEXTOK_EXPECT_AVX512").is_some_and(|v| v != "0" && !v.is_empty())
}

/// The name of a level, for the reports.
fn name(level: Isa) -> &'static str {
    level.name()
}

/// Every kernel level this CPU (and build) supports, lowest first.
pub(crate) fn supported_levels() -> Vec<Isa> {
    let mut levels: Vec<Isa> = Level::ALL.into_iter().map(Isa::of).collect();
    levels.dedup();
    levels
}

/// Every kernel level this CPU (and build) supports, reported on stderr for `test`. Fails when
/// `NEXTOK_EXPECT_AVX512` is set and AVX-512 is not among them.
pub(crate) fn levels(test: &str) -> Vec<Isa> {
    let levels = supported_levels();
    let names: Vec<&str> = levels.iter().map(|&l| name(l)).collect();
    eprintln!("{test}: kernel levels tested: {}", names.join(", "));
    if levels.last().is_none_or(|l| l.get() < Level::Avx512) {
        let why = if cfg!(all(target_arch = "x86_64", nextok_avx512)) {
            "this CPU lacks AVX-512"
        } else {
            "this build has no AVX-512 kernels"
        };
        assert!(
            !avx512_expected(),
            "{test}: NEXTOK_EXPECT_AVX512 is set, but {why}: the AVX-512 kernels were not tested"
        );
        eprintln!("{test}: avx512 not tested ({why})");
    }
    levels
}

/// The maximum by the plain scalar code (the kernel's body, not dispatched).
pub(crate) fn max_ref(xs: &[f32]) -> f32 {
    scalar::max_f32_inline(xs)
}

/// The lane sum of `exp_f32(z - m)` and the weights, written the obvious way.
pub(crate) fn exp_sum_ref(z: &[f32], m: f32) -> (f64, Vec<f32>) {
    let mut acc = [0.0f64; 8];
    let mut w = vec![0.0f32; z.len()];
    for (i, &x) in z.iter().enumerate() {
        w[i] = exp_f32(x - m);
        acc[i % 8] += w[i] as f64;
    }
    (acc.iter().sum(), w)
}

/// The bits of every value.
pub(crate) fn bits(xs: &[f32]) -> Vec<u32> {
    xs.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn load_matches_scalar_at_every_level() {
    for level in levels("load_matches_scalar_at_every_level") {
        for row in rows() {
            let mut buf = vec![1.0f32; row.len()];
            let mut bmax = vec![0.0f32; row.len().div_ceil(BLOCK)];
            let (bad, count, max) = load(level, &row, &mut buf, &mut bmax);
            assert!(!bad);
            assert_eq!(bits(&buf), bits(&row));
            for (b, block) in bmax.iter().zip(row.chunks(BLOCK)) {
                assert_eq!(*b, max_ref(block), "level {level:?}");
            }
            let want = row.iter().filter(|x| **x > f32::NEG_INFINITY).count();
            assert_eq!(count, want, "level {level:?}");
            assert_eq!(max.to_bits(), max_ref(&row).to_bits(), "level {level:?}");
            assert_eq!(max_f32(level, &row).to_bits(), max_ref(&row).to_bits());
            for bad_value in [f32::NAN, f32::INFINITY] {
                let mut r2 = row.clone();
                let at = row.len() / 2;
                r2[at] = bad_value;
                assert!(load(level, &r2, &mut buf, &mut bmax).0, "level {level:?}");
            }
        }
    }
}

#[test]
fn exp_kernels_match_scalar_at_every_level() {
    for level in levels("exp_kernels_match_scalar_at_every_level") {
        for row in rows() {
            let m = max_ref(&row);
            if m == f32::NEG_INFINITY {
                continue;
            }
            let (s, w_ref) = exp_sum_ref(&row, m);
            let mut w = vec![0.0f32; row.len()];
            assert_eq!(exp_weights(level, &row, m, &mut w).to_bits(), s.to_bits());
            assert_eq!(bits(&w), bits(&w_ref), "level {level:?}");
            assert_eq!(exp_sum(level, &row, m).to_bits(), s.to_bits());
            assert_eq!(exp_sum_at_max(level, &row, m).to_bits(), s.to_bits());
            // the same weights from (id, value) pairs, at every offset modulo the vector widths
            let c: Vec<Cand> = row
                .iter()
                .enumerate()
                .map(|(i, &z)| Cand { id: i as u32, z })
                .collect();
            for skip in [0, 1, 7, 33] {
                let skip = skip.min(c.len());
                let mut wc = vec![0.0f32; c.len() - skip];
                cand_weights(level, &c[skip..], m, &mut wc);
                assert_eq!(
                    bits(&wc),
                    bits(&w_ref[skip..]),
                    "level {level:?}, skip {skip}"
                );
            }
            let mut acc = [0.0f64; 8];
            for (i, &x) in row.iter().enumerate() {
                acc[i % 8] += x as f64;
            }
            let lanes: f64 = acc.iter().sum();
            assert_eq!(sum_f64_lanes(level, &row).to_bits(), lanes.to_bits());
        }
    }
}

/// The inputs of the `exp` checks: every 61st `f32` bit pattern, and the values around 0, the
/// flush threshold and the clamp (no NaN).
fn exp_inputs() -> Vec<f32> {
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
    xs
}

/// Checks [`avx2::exp8x4`] (with and, for inputs `<= 0`, without the clamp) against
/// [`exp_f32`] on 32 inputs (AVX2 and FMA must be available).
#[cfg(target_arch = "x86_64")]
fn check_exp8x4(v: &[f32; 32]) {
    use std::arch::x86_64::*;
    #[target_feature(enable = "avx2,fma")]
    fn run<const CLAMP: bool>(v: &[f32; 32]) -> [f32; 32] {
        let mut out = [0.0f32; 32];
        let p = v.as_ptr();
        // SAFETY: `v` holds 32 `f32`s: the four loads read 8 each.
        let x = unsafe {
            [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ]
        };
        for (k, e) in avx2::exp8x4::<CLAMP>(x).iter().enumerate() {
            // SAFETY: `out` holds 32 `f32`s: the store writes `out[8 k..8 k + 8]`.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * k), *e) };
        }
        out
    }
    assert!(Level::Avx2.supported());
    // SAFETY: the CPU supports AVX2 and FMA (checked above).
    let out = unsafe { run::<true>(v) };
    for (x, y) in v.iter().zip(out) {
        assert_eq!(exp_f32(*x).to_bits(), y.to_bits(), "exp of {x:e}");
    }
    let nonpos = v.map(|x| x.min(0.0));
    // SAFETY: as above.
    let out = unsafe { run::<false>(&nonpos) };
    for (x, y) in nonpos.iter().zip(out) {
        assert_eq!(
            exp_f32(*x).to_bits(),
            y.to_bits(),
            "exp of {x:e} (no clamp)"
        );
    }
}

/// The AVX2 `exp` against the scalar one on [`exp_inputs`]. Reports when it cannot run (no
/// AVX2 here).
#[test]
fn exp8x4_matches_scalar() {
    let tested = levels("exp8x4_matches_scalar");
    if tested.last().is_none_or(|l| l.get() < Level::Avx2) {
        eprintln!("exp8x4_matches_scalar: skipped (no AVX2 here)");
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let xs = exp_inputs();
        for c in xs.chunks(32) {
            let mut v = [0.0f32; 32];
            v[..c.len()].copy_from_slice(c);
            check_exp8x4(&v);
        }
        eprintln!(
            "exp8x4_matches_scalar: avx2 against scalar on {} inputs",
            xs.len()
        );
    }
}

/// Every non-NaN `f32` input through the AVX2 `exp` (about 4·10⁹; a minute in release):
/// `cargo test --release -p nextok-core --lib exp8x4_matches_scalar_everywhere -- --ignored`.
#[test]
#[ignore]
fn exp8x4_matches_scalar_everywhere() {
    if !Level::Avx2.supported() {
        eprintln!("exp8x4_matches_scalar_everywhere: skipped (no AVX2 here)");
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let mut v = [0.0f32; 32];
        for base in (0..=u32::MAX).step_by(32) {
            for (j, x) in v.iter_mut().enumerate() {
                let x0 = f32::from_bits(base + j as u32);
                *x = if x0.is_nan() { 0.0 } else { x0 };
            }
            check_exp8x4(&v);
        }
    }
}

/// Checks [`avx512::exp16x4`] against [`exp_f32`] on 64 inputs (AVX-512 must be available).
#[cfg(all(target_arch = "x86_64", nextok_avx512))]
fn check_exp16x4(v: &[f32; 64]) {
    use std::arch::x86_64::*;
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
    fn run(v: &[f32; 64]) -> [f32; 64] {
        let mut out = [0.0f32; 64];
        let p = v.as_ptr();
        // SAFETY: `v` holds 64 `f32`s: the four loads read 16 each.
        let x = unsafe {
            [
                _mm512_loadu_ps(p),
                _mm512_loadu_ps(p.add(16)),
                _mm512_loadu_ps(p.add(32)),
                _mm512_loadu_ps(p.add(48)),
            ]
        };
        for (k, e) in avx512::exp16x4(x).iter().enumerate() {
            // SAFETY: `out` holds 64 `f32`s: the store writes `out[16 k..16 k + 16]`.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(16 * k), *e) };
        }
        out
    }
    assert!(Level::Avx512.supported());
    // SAFETY: the CPU supports AVX-512 (checked above).
    let out = unsafe { run(v) };
    for (x, y) in v.iter().zip(out) {
        assert_eq!(exp_f32(*x).to_bits(), y.to_bits(), "exp of {x:e}");
    }
}

/// The AVX-512 `exp` against the scalar one on every 61st `f32` bit pattern, and on the values
/// around 0, the flush threshold and the clamp. Reports when it cannot run (no AVX-512), and then
/// fails only if `NEXTOK_EXPECT_AVX512` says this machine must have it.
#[test]
fn exp16x4_matches_scalar() {
    let tested = levels("exp16x4_matches_scalar");
    if tested.last().is_none_or(|l| l.get() < Level::Avx512) {
        eprintln!("exp16x4_matches_scalar: skipped (no AVX-512 here)");
        return;
    }
    #[cfg(all(target_arch = "x86_64", nextok_avx512))]
    {
        let xs = exp_inputs();
        for c in xs.chunks(64) {
            let mut v = [0.0f32; 64];
            v[..c.len()].copy_from_slice(c);
            check_exp16x4(&v);
        }
        eprintln!(
            "exp16x4_matches_scalar: avx512 against scalar on {} inputs",
            xs.len()
        );
    }
}

/// Every non-NaN `f32` input (about 4·10⁹; a minute in release):
/// `cargo test --release -p nextok-core --lib exp16x4_matches_scalar_everywhere -- --ignored`.
#[test]
#[ignore]
fn exp16x4_matches_scalar_everywhere() {
    let tested = levels("exp16x4_matches_scalar_everywhere");
    if tested.last().is_none_or(|l| l.get() < Level::Avx512) {
        eprintln!("exp16x4_matches_scalar_everywhere: skipped (no AVX-512 here)");
        return;
    }
    #[cfg(all(target_arch = "x86_64", nextok_avx512))]
    {
        let mut v = [0.0f32; 64];
        for base in (0..=u32::MAX).step_by(64) {
            for (j, x) in v.iter_mut().enumerate() {
                let x0 = f32::from_bits(base + j as u32);
                *x = if x0.is_nan() { 0.0 } else { x0 };
            }
            check_exp16x4(&v);
        }
    }
}

#[test]
fn levels_never_exceed_the_cpu() {
    for max in Level::ALL {
        let l = Isa::of(max);
        assert!(l.get().supported() && l.get() <= max && l.get() <= Level::Avx512);
    }
    assert!(Isa::current().get().supported());
}

#[test]
fn gather_weight_key_matches_scalar_at_every_level() {
    for level in levels("gather_weight_key_matches_scalar_at_every_level") {
        for row in rows() {
            let m = max_ref(&row);
            if m == f32::NEG_INFINITY {
                continue;
            }
            let (_, w) = exp_sum_ref(&row, m);
            // weights above 1 (saturating keys) and zeros (masked tokens) too
            let w: Vec<f32> = w
                .iter()
                .enumerate()
                .map(|(i, &x)| if i % 97 == 5 { x * 3.0 } else { x })
                .collect();
            let c: Vec<Cand> = row
                .iter()
                .enumerate()
                .map(|(i, &z)| Cand { id: i as u32, z })
                .collect();
            for (shift, max) in [(19u32, 511u32), (11, 255), (23, 7)] {
                let probe = WeightKey {
                    shift,
                    max,
                    value: 0,
                };
                let mut values: Vec<u32> = w.iter().map(|&x| probe.of(x)).collect();
                values.sort_unstable();
                values.dedup();
                values.push(max + 1);
                for value in values.into_iter().step_by(3) {
                    let key = WeightKey { value, ..probe };
                    let (mut out, mut out_w) = (vec![Cand { id: 9, z: 9.0 }], vec![9.0f32]);
                    gather_weight_key(level, &c, &w, key, &mut out, &mut out_w);
                    let want: Vec<usize> =
                        (0..c.len()).filter(|&i| key.of(w[i]) == value).collect();
                    let got: Vec<usize> = out.iter().map(|x| x.id as usize).collect();
                    assert_eq!(got, want, "level {level:?}, key {key:?}");
                    let want_w: Vec<f32> = want.iter().map(|&i| w[i]).collect();
                    assert_eq!(bits(&out_w), bits(&want_w), "level {level:?}");
                }
            }
        }
    }
}

#[test]
fn filter_upto_matches_scalar_at_every_level() {
    for level in levels("filter_upto_matches_scalar_at_every_level") {
        for row in rows() {
            let c: Vec<Cand> = row
                .iter()
                .enumerate()
                .map(|(i, &z)| Cand { id: i as u32, z })
                .collect();
            // weights whose sums are exact, and weights of many magnitudes (sums that are not)
            let exact_w: Vec<f32> = (0..c.len()).map(|i| i as f32 * 0.5).collect();
            let wide_w: Vec<f32> = (0..c.len())
                .map(|i| (i as f32 * 0.37).sin().abs() * 2f32.powi(-((i % 40) as i32)))
                .collect();
            // boundaries at values of the row (ties at several ids), signed zeros, the ends
            let mut ats: Vec<Cand> = c.iter().step_by(c.len() / 5 + 1).copied().collect();
            ats.extend(c.iter().rev().step_by(c.len() / 3 + 1).copied());
            for z in [0.0f32, -0.0, f32::NEG_INFINITY, f32::MAX, -f32::MAX] {
                for id in [0u32, 7, c.len() as u32 / 2, u32::MAX] {
                    ats.push(Cand { id, z });
                }
            }
            for (at, w) in ats.iter().flat_map(|&at| [(at, &exact_w), (at, &wide_w)]) {
                let keep = |x: &Cand| x.z > at.z || (x.z == at.z && x.id <= at.id);
                let want: Vec<usize> = (0..c.len()).filter(|&i| keep(&c[i])).collect();
                let mut out = vec![Cand { id: 9, z: 9.0 }];
                let mut out_w = vec![-1.0f32; c.len()];
                let (n, sum) = filter_upto(level, &c, w, at, &mut out, &mut out_w);
                // the kept weights' sum: lanes by input index modulo 16, then the any-order
                // exactness bound
                let mut acc = [0.0f64; 16];
                let mut low = [u32::MAX; 16];
                for &i in &want {
                    acc[i % 16] += w[i] as f64;
                    let b = w[i].to_bits();
                    if b != 0 {
                        low[i % 16] = low[i % 16].min(b);
                    }
                }
                let want_sum = scalar::exact_sum_finish(acc, low, &[]);
                assert_eq!(
                    sum.map(f64::to_bits),
                    want_sum.map(f64::to_bits),
                    "level {level:?}, at {at:?}"
                );
                let kept: Vec<f32> = want.iter().map(|&i| w[i]).collect();
                if let (Some(a), Some(b)) = (sum, exact_sum_any_order(level, &kept)) {
                    assert_eq!(a.to_bits(), b.to_bits(), "exact sums differ, at {at:?}");
                }
                let got: Vec<usize> = out.iter().map(|x| x.id as usize).collect();
                assert_eq!(n, want.len(), "level {level:?}, at {at:?}");
                assert_eq!(got, want, "level {level:?}, at {at:?}");
                let want_z: Vec<f32> = want.iter().map(|&i| c[i].z).collect();
                let got_z: Vec<f32> = out.iter().map(|x| x.z).collect();
                assert_eq!(bits(&got_z), bits(&want_z), "level {level:?}");
                let want_w: Vec<f32> = want.iter().map(|&i| w[i]).collect();
                assert_eq!(bits(&out_w[..n]), bits(&want_w), "level {level:?}");
            }
        }
    }
}

#[test]
fn split_heavy_matches_scalar_at_every_level() {
    for level in levels("split_heavy_matches_scalar_at_every_level") {
        for row in rows() {
            let m = max_ref(&row);
            if m == f32::NEG_INFINITY {
                continue;
            }
            let (_, w) = exp_sum_ref(&row, m);
            let c: Vec<Cand> = row
                .iter()
                .enumerate()
                .map(|(i, &z)| Cand { id: i as u32, z })
                .collect();
            let mut thresholds: Vec<i32> = w
                .iter()
                .step_by(w.len() / 7 + 1)
                .map(|x| x.to_bits() as i32)
                .collect();
            thresholds.extend([-1, 0, 0x3F80_0000, 0x3F00_0000]);
            for above in thresholds {
                let heavy = |x: f32| x.to_bits() as i32 > above;
                let want: Vec<usize> = (0..c.len()).filter(|&i| !heavy(w[i])).collect();
                let mut lanes = [0.0f64; 8];
                for (i, &x) in w.iter().enumerate() {
                    if heavy(x) {
                        lanes[i % 8] += x as f64;
                    }
                }
                let want_sum: f64 = lanes.iter().sum();
                let mut out = vec![Cand { id: 9, z: 9.0 }];
                let mut out_w = vec![-1.0f32; c.len()];
                let (hk, hm) = split_heavy(level, &c, &w, above, &mut out, &mut out_w);
                assert_eq!(
                    hk,
                    c.len() - want.len(),
                    "level {level:?}, above {above:#x}"
                );
                assert_eq!(
                    hm.to_bits(),
                    want_sum.to_bits(),
                    "level {level:?}, above {above:#x}"
                );
                let got: Vec<usize> = out.iter().map(|x| x.id as usize).collect();
                assert_eq!(got, want, "level {level:?}, above {above:#x}");
                let want_w: Vec<f32> = want.iter().map(|&i| w[i]).collect();
                assert_eq!(bits(&out_w[..want.len()]), bits(&want_w), "level {level:?}");
            }
        }
    }
}

/// One value of an adversarial row: the values where orders of operations can show (signed
/// zeros, ties, `-inf`, the ends of the range, subnormals) beside ordinary ones.
fn adversarial_value() -> impl proptest::strategy::Strategy<Value = f32> {
    use proptest::prelude::*;
    prop_oneof![
        3 => Just(0.0f32),
        3 => Just(-0.0f32),
        2 => Just(f32::NEG_INFINITY),
        2 => (-3i32..=3).prop_map(|i| i as f32),
        1 => Just(f32::MAX),
        1 => Just(-f32::MAX),
        1 => Just(f32::from_bits(1)),
        1 => Just(-f32::from_bits(1)),
        1 => Just(f32::MIN_POSITIVE),
        3 => -40.0f32..40.0,
        2 => -200.0f32..-1.0,
    ]
}

/// A row for [`every_level_gives_the_baseline_bits`]: a length that reaches every tail (of a
/// vector, a block, a group of 16 blocks), values from [`adversarial_value`], and often a row
/// whose maximum is a zero (no positive value), where only the order decides the sign.
fn adversarial_row() -> impl proptest::strategy::Strategy<Value = Vec<f32>> {
    use proptest::prelude::*;
    (
        proptest::collection::vec(adversarial_value(), 0..2300),
        any::<bool>(),
    )
        .prop_map(|(mut row, non_positive)| {
            if non_positive {
                for x in &mut row {
                    if *x > 0.0 {
                        *x = -*x;
                    }
                }
            }
            row
        })
}

/// Everything a kernel returns for one row at one level, as bits: the load and the scan (copy,
/// bounds, count, maximum), the maximum, the `exp` passes, the weights of candidates at every
/// vector offset, the lane sums, the prefix and min-p searches, the top-k scan and the band
/// collections.
#[derive(Debug, PartialEq)]
struct KernelBits {
    load: (bool, usize, u32, Vec<u32>, Vec<u32>),
    scan: (bool, usize, u32, Vec<u32>),
    max: u32,
    lanes: u64,
    exp: Option<(u64, Vec<u32>, u64, u64)>,
    cands: Vec<Vec<u32>>,
    cand_sums: Vec<u64>,
    prefixes: Vec<Option<usize>>,
    exact: Option<(Option<u64>, Option<u64>)>,
    min_p: Vec<Vec<(u32, u32)>>,
    top_k: Vec<Vec<(u32, u32)>>,
    bands: Vec<Vec<(u32, u32)>>,
}

fn cand_bits(c: &[Cand]) -> Vec<(u32, u32)> {
    c.iter().map(|c| (c.id, c.z.to_bits())).collect()
}

/// [`KernelBits`] of `row` at `level`.
fn kernel_bits(level: Isa, row: &[f32]) -> KernelBits {
    let n = row.len();
    let nb = n.div_ceil(BLOCK);
    let mut buf = vec![7.0f32; n];
    let mut bmax = vec![7.0f32; nb];
    let (bad, count, max) = load(level, row, &mut buf, &mut bmax);
    let mut sbmax = vec![7.0f32; nb];
    let (sbad, scount, smax) = scan(level, row, &mut sbmax);
    let c: Vec<Cand> = row
        .iter()
        .enumerate()
        .map(|(i, &z)| Cand { id: i as u32, z })
        .collect();
    let m = max_f32(level, row);
    let mut out = KernelBits {
        load: (bad, count, max.to_bits(), bits(&buf), bits(&bmax)),
        scan: (sbad, scount, smax.to_bits(), bits(&sbmax)),
        max: m.to_bits(),
        lanes: sum_f64_lanes(level, row).to_bits(),
        exp: None,
        cands: Vec::new(),
        cand_sums: Vec::new(),
        prefixes: Vec::new(),
        exact: None,
        min_p: Vec::new(),
        top_k: Vec::new(),
        bands: Vec::new(),
    };
    if m > f32::NEG_INFINITY {
        let mut w = vec![7.0f32; n];
        let s = exp_weights(level, row, m, &mut w);
        out.exp = Some((
            s.to_bits(),
            bits(&w),
            exp_sum(level, row, m).to_bits(),
            exp_sum_at_max(level, row, m).to_bits(),
        ));
        for skip in [0usize, 1, 7, 15, 33, 63] {
            let skip = skip.min(n);
            let mut wc = vec![7.0f32; n - skip];
            let sum = cand_weights(level, &c[skip..], m, &mut wc);
            out.cands.push(bits(&wc));
            out.cand_sums.push(sum.to_bits());
            out.cand_sums
                .push(cand_exp_sum(level, &c[skip..], m).to_bits());
        }
        for p in [0.0, 0.3, 0.9, 1.0] {
            out.prefixes.push(prefix_len(level, &c, m, s, p, 1));
        }
        // the weights, and the same rounded to multiples of 1/64 (exact in any order)
        let coarse: Vec<f32> = w.iter().map(|x| (x * 64.0).floor() / 64.0).collect();
        out.exact = Some((
            exact_sum_any_order(level, &w).map(f64::to_bits),
            exact_sum_any_order(level, &coarse).map(f64::to_bits),
        ));
        for alpha in [1.0f64, 0.5, 1e-3] {
            let lz = alpha.ln() as f32 - 1e-3;
            let mut mp = Vec::with_capacity(n);
            collect_min_p(level, row, m, lz, alpha, &mut mp);
            out.min_p.push(cand_bits(&mp));
        }
    }
    // the top-k scan from a heap of the first k, over the bounds of the load
    for k in [1usize, 3, 17, 100] {
        if k > n {
            break;
        }
        let mut heap = Vec::with_capacity(k);
        for x in &c[..k] {
            common::push_heap(&mut heap, *x);
        }
        top_k_scan(level, &buf, &bmax, k, &mut heap);
        out.top_k.push(cand_bits(&heap));
    }
    // bands at values of the row (ties at several ids, signed zeros), with and without a tie
    let mut edges: Vec<f32> = row.iter().step_by(n / 6 + 1).copied().collect();
    edges.extend([0.0, -0.0, f32::NEG_INFINITY, -f32::MAX]);
    for &lo in &edges {
        for hi in [f32::INFINITY, 0.0, lo.abs() + 1.0] {
            for tie in [None, Some((lo, n as u32 / 3)), Some((0.0, 5))] {
                let band = match tie {
                    None => Band::new(lo, hi),
                    Some((tie_z, tie_id)) => Band {
                        lo,
                        hi,
                        tie_z,
                        tie_id,
                    },
                };
                let mut got = Vec::new();
                collect_band(level, &buf, &bmax, band, &mut got);
                out.bands.push(cand_bits(&got));
            }
        }
    }
    out
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Every kernel level gives the baseline's bits on rows built to hit where orders of
    /// operations could show: signed zeros (a zero maximum, zero block bounds), ties, `-inf`,
    /// the ends of the range, subnormals, and every tail length of a vector, a block and a group
    /// of blocks. A row with a NaN or `+inf` is rejected at every level.
    #[test]
    fn every_level_gives_the_baseline_bits(row in adversarial_row(), at in 0usize..4096, bad_nan in proptest::prelude::any::<bool>()) {
        let all = levels("every_level_gives_the_baseline_bits");
        let base = kernel_bits(all[0], &row);
        // the scan gives the load's bounds
        proptest::prop_assert_eq!(&base.scan.3, &base.load.4);
        for &level in &all[1..] {
            let got = kernel_bits(level, &row);
            proptest::prop_assert_eq!(&got, &base, "level {}", name(level));
        }
        if !row.is_empty() {
            let mut r2 = row.clone();
            r2[at % row.len()] = if bad_nan { f32::NAN } else { f32::INFINITY };
            for &level in &all {
                let mut buf = vec![0.0f32; r2.len()];
                let mut bmax = vec![0.0f32; r2.len().div_ceil(BLOCK)];
                proptest::prop_assert!(load(level, &r2, &mut buf, &mut bmax).0);
                proptest::prop_assert!(scan(level, &r2, &mut bmax).0);
            }
        }
    }
}
