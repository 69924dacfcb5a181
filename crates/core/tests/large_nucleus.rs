//! The dense top-p's large-nucleus path against the band search it replaces on flat rows
//! (`Workspace::set_large_nucleus_top_p(false)`): the same support and the same selected token
//! for every row, `p` and `u`.
//!
//! Rows are large enough for the path to run (at least 16,384 tokens) and flat: Normal bulks of
//! several widths with or without strong tokens, exact ties, `-inf` entries, equal weights whose
//! tail mass is exactly `1 − p`, two-level rows and signed zeros; `p` near 0, near 1 and in between; `u` at
//! 0, just below 1 and at random. The top-p runs alone or before a processor that reads the
//! support it leaves (min-p, typical-p, top-k, a second top-p of either rule), with categorical
//! or Gumbel selection.

use nextok_core::cpu::{self, Level};
use nextok_core::math;
use nextok_core::processors::{
    min_p::MinP, temperature::Temperature, top_k, top_k::TopK, top_p, top_p::TopP,
    typical_p::TypicalP, ProcessorConfig as P,
};
use nextok_core::{Draw, PipelineConfig, Sampler, Selector, StopConfig, VocabInfo, Workspace};
use nextok_testdata::rows;
use proptest::prelude::*;
use proptest::test_runner::Config;

const NEG_INF: f32 = f32::NEG_INFINITY;

/// The largest `u` below 1.
const U_MAX: f64 = 1.0 - f64::EPSILON / 2.0;

fn cfg(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

/// splitmix64, and a standard normal by Box–Muller (the test's own rows; any generator does).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn normal(&mut self) -> f64 {
        let u1 = self.unit().max(1e-300);
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// A row of `v` logits of the given kind, and, for the rows built around an exact boundary, the
/// `p` that puts it there.
fn row(kind: u8, v: usize, seed: u64) -> (Vec<f32>, Option<f64>) {
    let mut r = Rng(seed);
    let sigma = 0.3 + 3.0 * r.unit();
    let mut z: Vec<f32> = (0..v).map(|_| (sigma * r.normal()) as f32).collect();
    let strong = |z: &mut Vec<f32>, r: &mut Rng, n: usize, lo: f64, hi: f64| {
        for _ in 0..n {
            let i = r.below(z.len());
            z[i] = (lo + (hi - lo) * r.unit()) as f32;
        }
    };
    match kind {
        // a flat bulk and a few strong tokens (the benchmark's shape)
        0 => {
            let n = r.below(40);
            strong(&mut z, &mut r, n, 3.0 * sigma, 6.0 * sigma + 2.0);
            (z, None)
        }
        // exact ties everywhere: a handful of values
        1 => {
            let vals = [0.0f32, -0.5, -1.0, -2.0, 1.0, 0.25];
            for x in z.iter_mut() {
                *x = vals[r.below(vals.len())];
            }
            let n = r.below(10);
            strong(&mut z, &mut r, n, 3.0, 6.0);
            (z, None)
        }
        // masked entries (`-inf`), from a tenth to nine tenths of the row
        2 => {
            let frac = 0.1 + 0.8 * r.unit();
            for x in z.iter_mut() {
                if r.unit() < frac {
                    *x = NEG_INF;
                }
            }
            let n = r.below(20);
            strong(&mut z, &mut r, n, 2.0 * sigma, 5.0 * sigma);
            (z, None)
        }
        // 2^k equal weights, the rest masked, p = j / 2^k: every partial sum is exact and the
        // tail holds exactly 1 − p
        3 => {
            let k = 14 + r.below(2) as u32; // 16,384 or 32,768 tokens
            let n = (1usize << k).min(v);
            for (i, x) in z.iter_mut().enumerate() {
                *x = if i < n { 0.0 } else { NEG_INF };
            }
            // shuffle the live tokens over the row
            for i in (1..v).rev() {
                z.swap(i, r.below(i + 1));
            }
            let j = 1 + r.below(n - 1);
            (z, Some(j as f64 / n as f64))
        }
        // two levels, weights 1 and 2^-3 (logits 0 and −3 ln 2 rounded); p at the first level's
        // share of the mass, which the tail complements exactly when the shares are exact
        4 => {
            let low = -(3.0f32 * std::f32::consts::LN_2);
            let n_hi = 1 + r.below(v / 4);
            for (i, x) in z.iter_mut().enumerate() {
                *x = if i < n_hi { 0.0 } else { low };
            }
            for i in (1..v).rev() {
                z.swap(i, r.below(i + 1));
            }
            let w_lo = nextok_core::math::exp_f32(low) as f64;
            let s = n_hi as f64 + (v - n_hi) as f64 * w_lo;
            (z, Some(n_hi as f64 / s))
        }
        // signed zeros and ones: the maximum is a zero of either sign
        5 => {
            let vals = [0.0f32, -0.0, -1.0, -1.5];
            for x in z.iter_mut() {
                *x = vals[r.below(vals.len())];
            }
            (z, None)
        }
        // the same logits as a tiny range: weights that differ in their last bits
        _ => {
            for x in z.iter_mut() {
                *x = (r.unit() * 1e-3) as f32;
            }
            (z, None)
        }
    }
}

/// A processor after the top-p, which reads the support it leaves (its order, its normaliser).
fn after(k: u8) -> Option<P> {
    match k {
        1 => Some(P::MinP(MinP {
            version: 1,
            min_p: 0.05,
            min_keep: 1,
        })),
        2 => Some(P::TypicalP(TypicalP {
            version: 1,
            typical_p: 0.9,
            min_keep: 1,
            keep_ties: true,
        })),
        3 => Some(P::TopK(TopK {
            version: 1,
            top_k: 300,
            ties: top_k::Ties::ById,
        })),
        4 => Some(P::TopP(TopP {
            version: 1,
            top_p: 0.8,
            min_keep: 1,
            rule: top_p::Rule::DescendingPrefix,
        })),
        5 => Some(P::TopP(TopP {
            version: 1,
            top_p: 0.7,
            min_keep: 1,
            rule: top_p::Rule::AscendingTail,
        })),
        _ => None,
    }
}

fn sampler(
    v: usize,
    p: f64,
    min_keep: usize,
    t: Option<f32>,
    next: Option<P>,
    selector: Selector,
) -> Sampler {
    let mut procs = Vec::new();
    if let Some(t) = t {
        procs.push(P::Temperature(Temperature {
            version: 1,
            temperature: t,
        }));
    }
    procs.push(P::TopP(TopP {
        version: 1,
        top_p: p,
        min_keep,
        rule: top_p::Rule::DescendingPrefix,
    }));
    procs.extend(next);
    Sampler::new(
        PipelineConfig::new(procs, selector),
        VocabInfo::plain(v),
        StopConfig::default(),
    )
    .unwrap()
}

/// Checks that both paths give the same support and the same token for every `u`, with the
/// top-p alone or followed by `next`, and categorical (or Gumbel) selection.
fn check(raw: &[f32], p: f64, min_keep: usize, t: Option<f32>, us: &[f64]) {
    check_with(raw, p, min_keep, t, us, None, Selector::Categorical);
}

fn check_with(
    raw: &[f32],
    p: f64,
    min_keep: usize,
    t: Option<f32>,
    us: &[f64],
    next: Option<P>,
    selector: Selector,
) {
    let v = raw.len();
    let s = sampler(v, p, min_keep, t, next, selector);
    let st = s.new_state(&[], 7).unwrap();
    let mut fast = s.new_workspace();
    let mut reference: Workspace = s.new_workspace();
    reference.set_large_nucleus_top_p(false);
    assert!(fast.large_nucleus_top_p());
    let (_, a) = s
        .select_recorded(raw, &st, &mut fast, Draw::FixedU(0.5), usize::MAX)
        .unwrap();
    let (_, b) = s
        .select_recorded(raw, &st, &mut reference, Draw::FixedU(0.5), usize::MAX)
        .unwrap();
    assert_eq!(a.support_size, b.support_size, "support size, p = {p}");
    let ids = |r: &nextok_core::StepRecord| r.candidates.iter().map(|c| c.id).collect::<Vec<_>>();
    assert_eq!(ids(&a), ids(&b), "support, p = {p}");
    // the whole step record: every candidate's logits and logprobs in the three layers
    assert_eq!(
        serde_json::to_string(&a).unwrap(),
        serde_json::to_string(&b).unwrap(),
        "record, p = {p}"
    );
    for &u in us {
        let x = s.select(raw, &st, &mut fast, Draw::FixedU(u)).unwrap();
        let y = s.select(raw, &st, &mut reference, Draw::FixedU(u)).unwrap();
        assert_eq!(x.token, y.token, "p = {p}, u = {u}");
    }
    // the random stream too (categorical `u` of step 0)
    let x = s.select(raw, &st, &mut fast, Draw::Stream).unwrap();
    let y = s.select(raw, &st, &mut reference, Draw::Stream).unwrap();
    assert_eq!(x.token, y.token);
}

fn p_value() -> impl Strategy<Value = f64> {
    prop_oneof![
        3 => 1e-9f64..1.0,
        1 => prop::sample::select(vec![
            1e-12, 1e-6, 0.01, 0.5, 0.9, 0.95, 0.99, 0.999, 0.999_999,
            1.0 - 1e-9, 1.0 - f64::EPSILON,
        ]),
    ]
}

proptest! {
    #![proptest_config(cfg(48))]

    /// Both paths agree on random flat rows, tie-heavy rows, masked rows, exact boundaries and
    /// tiny ranges, for `p` anywhere in `(0, 1)` and `u` at the ends and inside.
    #[test]
    fn large_nucleus_path_equals_the_band_search(
        kind in 0u8..7,
        seed in any::<u64>(),
        v in 16_384usize..40_000,
        p in p_value(),
        exact_p in any::<bool>(),
        min_keep in prop_oneof![4 => Just(1usize), 1 => 1usize..5000],
        t in prop::option::of(prop_oneof![Just(0.7f32), Just(1.5f32), 0.2f32..4.0]),
        us in prop::collection::vec(0.0f64..1.0, 4),
        next in 0u8..8,
        gumbel in prop::bool::weighted(0.15),
    ) {
        let (raw, boundary) = row(kind, v, seed);
        // the exact-boundary `p` when the row has one (no temperature: it would move it)
        let (p, t) = match boundary {
            Some(b) if exact_p && b > 0.0 && b < 1.0 => (b, None),
            _ => (p, t),
        };
        let mut us = us;
        us.extend([0.0, U_MAX, p.min(U_MAX), 0.5]);
        let selector = if gumbel { Selector::Gumbel } else { Selector::Categorical };
        check_with(&raw, p, min_keep, t, &us, after(next), selector);
    }
}

/// The benchmark's flat rows (a Normal(0, 2) bulk and 20 strong tokens) at 128,256 and 262,144
/// tokens, with top-p 0.95 and others, at every kernel level this CPU supports. The level is
/// process-wide here: `with_max_level` serialises the tests that set it (the levels give the
/// same bits, so other tests running meanwhile are unaffected).
#[test]
fn benchmark_flat_rows() {
    let levels: Vec<Level> = Level::ALL
        .into_iter()
        .filter(|&l| math::kernel_level(l) == l)
        .collect();
    let names: Vec<&str> = levels.iter().map(|&l| math::kernel_name(l)).collect();
    eprintln!("benchmark_flat_rows: kernel levels tested: {names:?}");
    for level in levels {
        cpu::with_max_level(level, || {
            assert_eq!(math::kernel_level(Level::current()), level);
            for v in rows::FLAT_VOCAB_SIZES {
                let f = rows::flat_row(v, v as u64, math::ln_f64);
                for p in [0.5, 0.9, 0.95, 0.99] {
                    check(&f.logits, p, 1, None, &[0.0, 0.1, 0.37, 0.5, 0.9, U_MAX]);
                }
            }
        });
    }
}
