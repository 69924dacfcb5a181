//! Golden tests of the exact pipeline JSON of every preset (and of its hash), and of the
//! step-record JSON line. Regenerate with `NEXTOK_UPDATE_GOLDEN=1 cargo test --test golden`
//! only when a format change is intended — and then bump the format or processor versions.

use std::collections::BTreeMap;
use std::path::PathBuf;

use nextok_core::{Draw, PipelineConfig, Preset, Sampler, SamplingParams, StepRecord, VocabInfo};

fn golden(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/golden")
        .join(name)
}

fn check(name: &str, actual: &str) {
    let path = golden(name);
    if std::env::var_os("NEXTOK_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(actual, want, "golden file {name} differs");
}

fn rich_params() -> SamplingParams {
    SamplingParams {
        temperature: Some(0.7),
        top_k: Some(50),
        top_p: Some(0.9),
        min_p: Some(0.05),
        typical_p: Some(0.95),
        presence_penalty: Some(0.5),
        frequency_penalty: Some(0.25),
        repetition_penalty: Some(1.1),
        logit_bias: BTreeMap::from([(2, -1.5), (7, 3.0)]),
        min_tokens: Some(3),
        max_tokens: Some(16),
        stop_token_ids: vec![5],
        seed: Some(42),
        allowed_token_ids: None,
        bad_words_ids: vec![vec![1, 2]],
        no_repeat_ngram_size: Some(3),
        penalty_last_n: None,
        ignore_eos: false,
        stop: vec!["\n\n".into()],
        include_stop_str_in_output: false,
        skip_special_tokens: None,
        constraint: Some(nextok_core::constraint::spec::ConstraintSpec::Json {
            options: Default::default(),
        }),
        grammar_policy: None,
    }
}

#[test]
fn preset_pipelines_match_golden_json_and_hash() {
    for preset in Preset::ALL {
        let (cfg, _stop) = nextok_core::pipeline::presets::build(preset, &rich_params()).unwrap();
        let pretty = serde_json::to_string_pretty(&cfg).unwrap() + "\n";
        let file = format!("pipeline_{}.json", preset.name().replace('.', ""));
        check(&file, &pretty);
        // the file parses back to the same pipeline, and the hash covers the canonical form
        let back = PipelineConfig::from_json(&pretty).unwrap();
        assert_eq!(back, cfg);
        assert_eq!(back.hash(), cfg.hash());
        check(&format!("{file}.hash"), &(cfg.hash() + "\n"));
    }
}

#[test]
fn presets_differ_and_hash_names_order() {
    let p = rich_params();
    let hashes: Vec<String> = Preset::ALL
        .iter()
        .map(|&pr| {
            nextok_core::pipeline::presets::build(pr, &p)
                .unwrap()
                .0
                .hash()
        })
        .collect();
    for i in 0..hashes.len() {
        for j in i + 1..hashes.len() {
            assert_ne!(hashes[i], hashes[j]);
        }
    }
    // swapping two processors changes the hash
    let (mut cfg, _) = nextok_core::pipeline::presets::build(Preset::Reference, &p).unwrap();
    let h = cfg.hash();
    let n = cfg.processors.len();
    cfg.processors.swap(n - 1, n - 2);
    assert_ne!(cfg.hash(), h);
}

#[test]
fn step_record_is_one_json_line_and_round_trips() {
    let params = SamplingParams {
        temperature: Some(0.8),
        top_p: Some(0.8),
        presence_penalty: Some(0.1),
        frequency_penalty: Some(0.2),
        ..Default::default()
    };
    let s = Sampler::from_params(Preset::Reference, &params, VocabInfo::plain(3)).unwrap();
    let mut st = s.state_with_history(&[], &[0, 0, 1], 7).unwrap();
    let mut ws = s.new_workspace();
    let (r, rec) = s
        .step_recorded(&[2.0, 1.5, 0.5], &mut st, &mut ws, Draw::FixedU(0.63), 16)
        .unwrap();
    assert_eq!(r.token, 1);
    let line = serde_json::to_string(&rec).unwrap();
    assert!(!line.contains('\n'));
    let back: StepRecord = serde_json::from_str(&line).unwrap();
    assert_eq!(back, rec);
    assert_eq!(rec.step, 3);
    assert_eq!(rec.support_size, 2);
    assert_eq!(rec.state_before.output_len, 3);
    assert_eq!(rec.state_after.output_len, 4);
    assert_eq!(rec.state_after.rng_counter, 4);
    assert_eq!(
        rec.candidates.iter().map(|c| c.id).collect::<Vec<_>>(),
        vec![0, 1]
    );
    assert!((rec.candidates[0].selection_prob - 0.593).abs() < 5e-4);
    // logprobs per layer differ for the same token (000 §3.9's point)
    let b = &rec.candidates[1];
    assert!(b.raw_logprob < b.processed_logprob && b.processed_logprob < b.selection_logprob);
    check("step_record_000_s3_9.jsonl", &(line + "\n"));
}
