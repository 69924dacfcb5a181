//! Beam search on 002's two-step tree, with a scripted logits source.
//!
//! Ids: 0 = A, 1 = B, 2 = x, 3 = y, 4 = EOS, 5 = the prompt. First step A 0.6 / B 0.4; after
//! A: x 0.51 / y 0.49; after B: x 0.99 / y 0.01; then EOS. Greedy reaches A·x (0.306), width 2
//! keeps B·x (0.396).

use std::collections::HashMap;

use nextok_model::beam::{beam_search, BeamConfig, BeamFinish};
use nextok_model::scripted::ScriptedSource;
use nextok_model::LogitsSource;

fn tree() -> ScriptedSource {
    let l = ScriptedSource::logits_of;
    let mut t = HashMap::new();
    t.insert(vec![5], l(&[0.6, 0.4, 0.0, 0.0, 0.0, 0.0]));
    t.insert(vec![5, 0], l(&[0.0, 0.0, 0.51, 0.49, 0.0, 0.0]));
    t.insert(vec![5, 1], l(&[0.0, 0.0, 0.99, 0.01, 0.0, 0.0]));
    ScriptedSource::new(t, l(&[0.0, 0.0, 0.0, 0.0, 1.0, 0.0]))
}

fn cfg(width: usize) -> BeamConfig {
    BeamConfig {
        width,
        length_penalty: 1.0,
        max_tokens: 8,
        eos_token_ids: vec![4],
    }
}

#[test]
fn width_one_is_greedy_a_x() {
    let h = beam_search(tree(), &[5], &cfg(1)).unwrap();
    assert_eq!(h[0].tokens, vec![0, 2, 4]);
    assert!((h[0].logprob.exp() - 0.306).abs() < 1e-6);
    assert_eq!(h[0].finish, BeamFinish::Eos);
}

#[test]
fn width_two_keeps_b_x() {
    let h = beam_search(tree(), &[5], &cfg(2)).unwrap();
    assert_eq!(h[0].tokens, vec![1, 2, 4]);
    assert!((h[0].logprob.exp() - 0.396).abs() < 1e-6);
    assert_eq!(h[1].tokens, vec![0, 2, 4]);
    assert_eq!(h.len(), 2);
}

#[test]
fn length_limit_finishes_live_beams() {
    let mut c = cfg(2);
    c.max_tokens = 2;
    let h = beam_search(tree(), &[5], &c).unwrap();
    assert_eq!(h[0].tokens, vec![1, 2]);
    assert_eq!(h[0].finish, BeamFinish::Length);
}

#[test]
fn scripted_fork_and_truncate() {
    let mut a = tree();
    a.prefill(&[5]).unwrap();
    let mut b = a.fork().unwrap();
    assert_eq!(a.decode_one(0).unwrap()[2], (0.51f64).ln() as f32);
    assert_eq!(b.decode_one(1).unwrap()[2], (0.99f64).ln() as f32);
    b.truncate(1).unwrap();
    assert_eq!(b.decode_one(0).unwrap()[2], (0.51f64).ln() as f32);
}

mod pipeline {
    use super::*;
    use nextok_core::{FinishReason, Preset, Sampler, SamplingParams, VocabInfo};
    use nextok_model::beam::{beam_search_with, PipelineScorer};

    fn sampler(params: SamplingParams) -> Sampler {
        let vocab = VocabInfo {
            vocab_size: 6,
            eos_token_ids: vec![4],
            special_token_ids: vec![4],
        };
        Sampler::from_params(Preset::Reference, &params, vocab).unwrap()
    }

    fn run(params: SamplingParams, width: usize) -> Vec<nextok_model::beam::Hypothesis> {
        let s = sampler(SamplingParams {
            max_tokens: Some(8),
            ..params
        });
        let start = s.new_state(&[5], 0).unwrap();
        let scorer = PipelineScorer::new(&s, start);
        beam_search_with(tree(), &[5], &cfg(width), &scorer).unwrap()
    }

    #[test]
    fn without_processors_the_pipeline_scores_equal_the_raw_ones() {
        for width in [1, 2] {
            let raw = beam_search(tree(), &[5], &cfg(width)).unwrap();
            let piped = run(SamplingParams::default(), width);
            assert_eq!(raw.len(), piped.len());
            for (r, p) in raw.iter().zip(&piped) {
                assert_eq!(r.tokens, p.tokens);
                // both are nextok's log-softmax of the same logits: the same bits
                assert_eq!(r.logprob.to_bits(), p.logprob.to_bits(), "{r:?} {p:?}");
                assert_eq!(r.score.to_bits(), p.score.to_bits(), "{r:?} {p:?}");
                assert_eq!(r.finish, p.finish);
            }
        }
        let h = run(SamplingParams::default(), 2);
        assert_eq!(h[0].tokens, vec![1, 2, 4]);
        assert!((h[0].logprob.exp() - 0.396).abs() < 1e-6);
    }

    #[test]
    fn a_logit_bias_against_b_makes_width_two_keep_a() {
        let h = run(
            SamplingParams {
                logit_bias: [(1, -100.0)].into_iter().collect(),
                ..Default::default()
            },
            2,
        );
        assert_eq!(h[0].tokens, vec![0, 2, 4]);
        // processed layer: B's mass went to A, so A·x scores ln(1.0·0.51) up to B's e^-100
        assert!((h[0].logprob - 0.51f64.ln()).abs() < 1e-6, "{:?}", h[0]);
    }

    #[test]
    fn temperature_reshapes_the_scores_and_top_k_limits_the_proposals() {
        // T = 2 flattens 0.6/0.4 and 0.99/0.01: B·x still wins at width 2, with the
        // processed-layer logprobs of the tempered distributions
        let h = run(
            SamplingParams {
                temperature: Some(2.0),
                ..Default::default()
            },
            2,
        );
        assert_eq!(h[0].tokens, vec![1, 2, 4]);
        let tempered = |p: &[f64], i: usize| {
            let w: Vec<f64> = p.iter().map(|x| x.sqrt()).collect();
            (w[i] / w.iter().sum::<f64>()).ln()
        };
        let want = tempered(&[0.6, 0.4], 1) + tempered(&[0.99, 0.01], 0);
        assert!(
            (h[0].logprob - want).abs() < 1e-5,
            "{} {want}",
            h[0].logprob
        );
        // top-k 1 leaves one proposal per hypothesis: width 2 degenerates to greedy
        let h = run(
            SamplingParams {
                top_k: Some(1),
                ..Default::default()
            },
            2,
        );
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].tokens, vec![0, 2, 4]);
    }

    #[test]
    fn a_stop_token_finishes_a_hypothesis_with_its_reason() {
        let h = run(
            SamplingParams {
                stop_token_ids: vec![2],
                ..Default::default()
            },
            2,
        );
        assert_eq!(h[0].tokens, vec![1, 2]);
        assert_eq!(
            h[0].finish,
            BeamFinish::Stop(FinishReason::StopToken { token: 2 })
        );
    }

    #[test]
    fn the_requests_max_tokens_ends_the_search_by_length() {
        let s = sampler(SamplingParams {
            max_tokens: Some(1),
            ..Default::default()
        });
        let start = s.new_state(&[5], 0).unwrap();
        let scorer = PipelineScorer::new(&s, start);
        // the beam allows 8 tokens, the request 1: one step, both hypotheses by length
        let h = beam_search_with(tree(), &[5], &cfg(2), &scorer).unwrap();
        assert_eq!(h.len(), 2);
        assert_eq!(h[0].tokens, vec![0]);
        assert_eq!(h[1].tokens, vec![1]);
        assert!(h.iter().all(|x| x.finish == BeamFinish::Length));
    }
}
