#![no_main]
//! A pipeline file: parse, compile for a 16-token vocabulary, run steps on a fixed row.

use libfuzzer_sys::fuzz_target;
use nextok_core::{Draw, PipelineConfig, Sampler, StopConfig, VocabInfo};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cfg) = PipelineConfig::from_json(text) else {
        return;
    };
    let _ = cfg.hash();
    let vocab = VocabInfo {
        vocab_size: 16,
        eos_token_ids: vec![0],
        special_token_ids: vec![0, 15],
    };
    let Ok(s) = Sampler::new(cfg, vocab, StopConfig::default()) else {
        return;
    };
    let Ok(mut st) = s.state_with_history(&[1, 2, 3, 2], &[], 7) else {
        return;
    };
    let logits: Vec<f32> = (0..16).map(|i| ((i * 7) % 11) as f32 - 4.0).collect();
    let mut ws = s.new_workspace();
    for step in 0..4 {
        let draw = if step % 2 == 0 {
            Draw::Stream
        } else {
            Draw::FixedU(0.37)
        };
        match s.select_recorded(&logits, &st, &mut ws, draw, 16) {
            Ok((sel, rec)) => {
                assert!(rec.candidates.iter().any(|c| c.id == sel.token));
                if s.commit(&mut st, sel.token).is_err() {
                    return;
                }
            }
            Err(_) => return,
        }
    }
});
