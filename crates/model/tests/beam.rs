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
