//! Speculative sampling's rejection rule through the sampler (`Draw::Draft`): whatever token
//! a deterministic drafter proposes, the selected token is distributed as the step's selection
//! distribution `p` (chi-square over 10^5 draws), on dense and sparse supports, for categorical
//! and Gumbel selection; greedy selection keeps its argmax; the record says what happened.

use nextok_core::pipeline::presets;
use nextok_core::{
    DraftRule, Draw, Preset, Sampler, SamplingParams, Selector, VocabInfo, Workspace,
};

fn vocab(v: usize) -> VocabInfo {
    VocabInfo {
        vocab_size: v,
        eos_token_ids: vec![],
        special_token_ids: vec![],
    }
}

/// The reference preset for `params`, with `selector` in place of its own.
fn sampler(params: SamplingParams, selector: Selector, v: usize) -> Sampler {
    let (mut cfg, stop) = presets::build(Preset::Reference, &params).expect("preset");
    cfg.selector = selector;
    Sampler::new(cfg, vocab(v), stop).expect("pipeline")
}

fn params(temperature: f32, top_k: Option<i64>, top_p: Option<f64>) -> SamplingParams {
    SamplingParams {
        temperature: Some(temperature),
        top_k,
        top_p,
        ..SamplingParams::default()
    }
}

/// The step's selection probabilities, from the sampler's own explanation.
fn selection_probs(s: &Sampler, raw: &[f32]) -> Vec<f64> {
    let st = s.new_state(&[], 0).expect("state");
    let ex = s.explain(raw, &st, Draw::FixedU(0.5)).expect("explain");
    ex.tokens.iter().map(|t| t.selection_prob).collect()
}

/// Histogram of the tokens `Draw::Draft(x)` selects over `n` sequences (seeds 0..n).
fn histogram(s: &Sampler, raw: &[f32], x: u32, n: u64) -> (Vec<u64>, u64) {
    let mut ws: Workspace = s.new_workspace();
    let mut counts = vec![0u64; raw.len()];
    let mut accepted = 0;
    for seed in 0..n {
        let st = s.new_state(&[], seed).expect("state");
        let sel = s
            .select(raw, &st, &mut ws, Draw::Draft(x))
            .expect("selection");
        let d = sel.draft.expect("a draft decision");
        assert_eq!(d.token, x);
        assert_eq!(d.accepted, sel.token == x);
        if d.accepted {
            accepted += 1;
        }
        counts[sel.token as usize] += 1;
    }
    (counts, accepted)
}

fn chi_square(counts: &[u64], p: &[f64], n: u64) -> (f64, usize) {
    let mut chi = 0.0;
    let mut df = 0usize;
    for (&c, &pi) in counts.iter().zip(p) {
        if pi == 0.0 {
            assert_eq!(c, 0, "a token outside the support was selected");
            continue;
        }
        let e = pi * n as f64;
        chi += (c as f64 - e).powi(2) / e;
        df += 1;
    }
    (chi, df.saturating_sub(1))
}

/// 0.1 % critical values of chi-square for 1..=7 degrees of freedom.
const CRIT: [f64; 8] = [0.0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32];

const RAW: [f32; 8] = [1.2, 0.3, 2.0, -0.5, 1.9, 0.0, -3.0, 0.8];

fn check(s: &Sampler, x: u32) {
    let n = 100_000;
    let p = selection_probs(s, &RAW);
    let (counts, accepted) = histogram(s, &RAW, x, n);
    let (chi, df) = chi_square(&counts, &p, n);
    assert!(
        df >= 1 && chi < CRIT[df],
        "x = {x}: chi-square {chi} ({df} df): {counts:?} vs {p:?}"
    );
    // acceptance happens with probability p(x)
    let rate = accepted as f64 / n as f64;
    let px = p[x as usize];
    assert!(
        (rate - px).abs() < 5.0 * (px * (1.0 - px) / n as f64).sqrt() + 1e-9,
        "x = {x}: accepted {rate}, p(x) = {px}"
    );
}

#[test]
fn dense_categorical_output_is_p_for_any_draft() {
    let s = sampler(params(0.9, None, None), Selector::Categorical, RAW.len());
    for x in [2, 6] {
        check(&s, x);
    }
}

#[test]
fn sparse_support_and_a_draft_outside_it() {
    // top-k 4 keeps 2, 4, 0, 7: token 3 is outside the support and is never accepted
    let s = sampler(params(1.3, Some(4), None), Selector::Categorical, RAW.len());
    for x in [0, 3] {
        check(&s, x);
    }
}

#[test]
fn gumbel_selection_uses_the_same_rule() {
    let s = sampler(params(1.0, None, Some(0.9)), Selector::Gumbel, RAW.len());
    check(&s, 4);
}

#[test]
fn greedy_keeps_its_argmax_and_records_the_draft() {
    let s = sampler(params(1.0, None, None), Selector::Greedy, RAW.len());
    let mut ws = s.new_workspace();
    let mut st = s.new_state(&[], 1).expect("state");
    for (x, accepted) in [(2u32, true), (4, false)] {
        let (sel, rec) = s
            .select_recorded(&RAW, &st, &mut ws, Draw::Draft(x), 4)
            .expect("select");
        assert_eq!(sel.token, 2);
        let d = rec.draft.expect("draft record");
        assert_eq!(
            (d.token, d.accepted, d.rule),
            (x, accepted, DraftRule::Rejection)
        );
        assert_eq!(d.accept_u, None);
    }
    // a plain step records no draft
    let (_, rec) = s
        .step_recorded(&RAW, &mut st, &mut ws, Draw::Stream, 4)
        .expect("step");
    assert!(rec.draft.is_none());
    let line = serde_json::to_string(&rec).expect("json");
    assert!(!line.contains("draft"), "{line}");
}

#[test]
fn the_decision_is_a_function_of_seed_and_step() {
    let s = sampler(params(1.0, None, None), Selector::Categorical, RAW.len());
    let mut ws = s.new_workspace();
    let st = s.new_state(&[], 99).expect("state");
    let (a, ra) = s
        .select_recorded(&RAW, &st, &mut ws, Draw::Draft(0), 8)
        .expect("a");
    let mut ws2 = s.new_workspace();
    let (b, rb) = s
        .select_recorded(&RAW, &st, &mut ws2, Draw::Draft(0), 8)
        .expect("b");
    assert_eq!(a, b);
    assert_eq!(ra, rb);
    let d = ra.draft.expect("draft");
    assert!(d.accept_u.is_some());
    assert_eq!(d.residual_u.is_some(), !d.accepted);
}
