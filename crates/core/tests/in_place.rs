//! A step reads the raw logits in place exactly when no processor edits the dense row (the
//! llama.cpp chain without penalties, a top-p alone, truncations with a temperature after
//! them), and copies them otherwise; the tokens are the same either way.

use nextok_core::{Draw, Preset, Sampler, SamplingParams, VocabInfo};

fn row(v: usize, salt: u32) -> Vec<f32> {
    (0..v as u32)
        .map(|i| {
            let h = (i ^ salt).wrapping_mul(2_654_435_761).rotate_left(13);
            (h % 10_000) as f32 / 700.0 - 7.0
        })
        .collect()
}

fn params(penalties: bool) -> SamplingParams {
    SamplingParams {
        temperature: Some(0.8),
        top_k: Some(40),
        top_p: Some(0.95),
        min_p: Some(0.05),
        repetition_penalty: penalties.then_some(1.1),
        presence_penalty: penalties.then_some(0.5),
        ignore_eos: true,
        ..Default::default()
    }
}

#[test]
fn steps_read_in_place_only_when_nothing_edits_the_row() {
    let v = 5_000;
    let cases = [
        (Preset::LlamaCpp, params(false), true),
        (Preset::LlamaCpp, params(true), false),
        // temperature first: the dense row is divided
        (Preset::Reference, params(false), false),
        (
            Preset::Reference,
            SamplingParams {
                top_p: Some(0.9),
                ..Default::default()
            },
            true,
        ),
    ];
    for (preset, p, in_place) in cases {
        let s = Sampler::from_params(preset, &p, VocabInfo::plain(v)).unwrap();
        let mut st = s.new_state(&[3, 4, 5], 7).unwrap();
        let mut ws = s.new_workspace();
        for k in 0..6u32 {
            let raw = row(v, k);
            // the copying path (a processed-logits report) selects the same token
            let mut other = s.new_workspace();
            s.process(&raw, &st, &mut other, false).unwrap();
            assert!(other.processed_logits().is_some());
            let want = s
                .select_recorded(&raw, &st, &mut other, Draw::Stream, 1)
                .unwrap()
                .0;
            let got = s.select(&raw, &st, &mut ws, Draw::Stream).unwrap();
            assert_eq!(got, want, "{preset:?} step {k}");
            assert_eq!(
                ws.processed_logits().is_none(),
                in_place,
                "{preset:?}, penalties {:?}: read in place",
                p.repetition_penalty
            );
            s.step(&raw, &mut st, &mut ws).unwrap();
        }
    }
}
