//! Hostile input to the pure core: random pipelines (any processor, parameters inside and far
//! outside their domains, in any order) over random logits (NaN, ±inf, ±f32::MAX, subnormals)
//! and random histories never panic: each step returns a token of its final support with a
//! positive selection probability, or a typed error.

use proptest::collection::vec;
use proptest::prelude::*;
use serde_json::{json, Value};

use nextok_core::{Draw, PipelineConfig, Sampler, StopConfig, VocabInfo};

fn number() -> impl Strategy<Value = f64> {
    prop_oneof![
        30 => 0.05f64..1.0,
        3 => -3.0f64..3.0,
        1 => Just(0.0),
        1 => Just(1.0),
        1 => Just(-1.0),
        1 => Just(1e-40),
        1 => Just(1e-300),
        1 => Just(1e30),
        1 => Just(-1e30),
        1 => Just(1e300),
        1 => Just(f32::MAX as f64),
        1 => Just(-(f32::MAX as f64)),
        1 => -200.0f64..200.0,
    ]
}

fn ids() -> impl Strategy<Value = Vec<u64>> {
    vec(
        prop_oneof![0u64..12, Just(u32::MAX as u64), Just(1 << 40)],
        0..4,
    )
}

fn processor() -> impl Strategy<Value = Value> {
    prop_oneof![
        ids().prop_map(|t| json!({"type": "special_token_mask", "token_ids": t})),
        (0u64..5).prop_map(|m| json!({"type": "min_tokens", "min_tokens": m})),
        ids().prop_map(|t| json!({"type": "allowed_token_ids", "token_ids": t})),
        (ids(), number()).prop_map(|(t, b)| {
            let m: serde_json::Map<String, Value> =
                t.iter().map(|i| (i.to_string(), json!(b))).collect();
            json!({"type": "logit_bias", "logit_bias": m})
        }),
        (vec(ids(), 0..3), any::<bool>()).prop_map(|(s, p)| {
            json!({"type": "banned_sequences", "sequences": s, "include_prompt": p})
        }),
        prop_oneof![20 => 0u64..5, 1 => Just(2000u64), 1 => Just(u64::MAX)]
            .prop_map(|n| json!({"type": "no_repeat_ngram", "ngram_size": n})),
        (number(), number()).prop_map(|(p, f)| json!({
            "type": "presence_frequency_penalty", "presence_penalty": p, "frequency_penalty": f})),
        number().prop_map(|r| json!({"type": "repetition_penalty", "repetition_penalty": r})),
        number().prop_map(|t| json!({"type": "temperature", "temperature": t})),
        (
            prop_oneof![-3i64..20, Just(i64::MAX), Just(i64::MIN)],
            any::<bool>()
        )
            .prop_map(|(k, ties)| json!({"type": "top_k", "top_k": k,
                               "ties": if ties { "keep_all" } else { "by_id" }})),
        (
            number(),
            prop_oneof![9 => 1usize..4, 1 => Just(0usize)],
            any::<bool>()
        )
            .prop_map(|(p, k, r)| json!({
            "type": "top_p", "top_p": p, "min_keep": k,
            "rule": if r { "ascending_tail" } else { "descending_prefix" }})),
        (number(), 0usize..4)
            .prop_map(|(p, k)| json!({"type": "min_p", "min_p": p, "min_keep": k})),
        (number(), 0usize..4, any::<bool>()).prop_map(|(p, k, t)| json!({
            "type": "typical_p", "typical_p": p, "min_keep": k, "keep_ties": t})),
    ]
}

fn logit() -> impl Strategy<Value = f32> {
    prop_oneof![
        40 => -20.0f32..20.0,
        1 => Just(f32::NEG_INFINITY),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NAN),
        1 => Just(f32::MAX),
        1 => Just(-f32::MAX),
        1 => Just(1e-45f32),
        1 => Just(0.0f32),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn random_pipelines_on_random_logits_never_panic(
        procs in vec(processor(), 0..5),
        selector in prop_oneof![Just("greedy"), Just("categorical"), Just("gumbel")],
        logits in vec(logit(), 1..12),
        prompt in vec(0u32..14, 0..6),
        history in vec(0u32..14, 0..6),
        eos in vec(0u32..14, 0..2),
        u in 0.0f64..1.0,
        seed in any::<u64>(),
    ) {
        let v = logits.len();
        let cfg = json!({"format_version": 1, "processors": procs, "selector": {"type": selector}});
        let Ok(cfg) = PipelineConfig::from_json(&cfg.to_string()) else { return Ok(()) };
        let mut eos = eos;
        eos.sort_unstable();
        eos.dedup();
        let vocab = VocabInfo { vocab_size: v, eos_token_ids: eos, special_token_ids: vec![] };
        let Ok(s) = Sampler::new(cfg, vocab, StopConfig::default()) else { return Ok(()) };
        let Ok(st) = s.state_with_history(&prompt, &[], seed) else { return Ok(()) };
        let mut st = st;
        for &t in &history {
            if s.commit(&mut st, t).is_err() {
                break;
            }
        }
        let mut ws = s.new_workspace();
        for draw in [Draw::FixedU(u), Draw::Stream] {
            let r = s.select_recorded(&logits, &st, &mut ws, draw, usize::MAX);
            if let Ok((sel, rec)) = r {
                let c = rec.candidates.iter().find(|c| c.id == sel.token);
                prop_assert!(c.is_some(), "selected {} outside the support", sel.token);
                let c = c.unwrap();
                prop_assert!(c.selection_prob > 0.0 && c.selection_prob <= 1.0 + 1e-9);
                prop_assert!(logits[sel.token as usize].is_finite());
                let total: f64 = rec.candidates.iter().map(|c| c.selection_prob).sum();
                prop_assert!((total - 1.0).abs() < 1e-6, "sum {total}");
            }
        }
    }
}

#[test]
fn no_repeat_ngram_over_a_long_repetitive_history_is_fast() {
    // 200,000 tokens of one id and the largest n: each n-gram is indexed once, so the step
    // verifies one candidate, not one per occurrence (its work is counted, not timed, by
    // `processors::no_repeat_ngram::tests::a_repeated_ngram_is_indexed_once`)
    let n = nextok_core::processors::no_repeat_ngram::MAX_NGRAM_SIZE;
    let cfg = json!({"format_version": 1,
        "processors": [{"type": "no_repeat_ngram", "ngram_size": n}],
        "selector": {"type": "greedy"}});
    let cfg = PipelineConfig::from_json(&cfg.to_string()).unwrap();
    let s = Sampler::new(cfg, VocabInfo::plain(4), StopConfig::default()).unwrap();
    let prompt = vec![1u32; 200_000];
    let st = s.state_with_history(&prompt, &[], 0).unwrap();
    let mut ws = s.new_workspace();
    let (sel, _) = s
        .select_recorded(&[0.0, 5.0, 1.0, 0.5], &st, &mut ws, Draw::FixedU(0.5), 8)
        .unwrap();
    // token 1 would repeat the n-gram of ones
    assert_eq!(sel.token, 2);
    let e = nextok_core::StepRequest::from_json(
        &json!({"logits": [1.0, 0.0], "params": {"no_repeat_ngram_size": n + 1}}).to_string(),
    )
    .unwrap()
    .explain()
    .unwrap_err();
    assert_eq!(e.field(), Some("no_repeat_ngram_size"));
}
