//! Failure conditions (000 §3.12) and bad input: every failure is a typed error with a code and
//! the offending field, it happens before the selector runs, and it leaves the caller's state
//! untouched. Also the declared behaviours where the documents leave a choice open (§3.6–§3.7).

use nextok_core::pipeline::presets;
use nextok_core::processors::{
    allowed_ids::AllowedTokenIds, banned_sequences::BannedSequences, logit_bias::LogitBias,
    min_p::MinP, no_repeat_ngram::NoRepeatNgram, presence_frequency::PresenceFrequencyPenalty,
    repetition::RepetitionPenalty, temperature::Temperature, top_k, top_k::TopK, top_p,
    top_p::TopP, typical_p::TypicalP, PenaltyScope, ProcessorConfig as P,
};
use nextok_core::rng::Purpose;
use nextok_core::{
    DecoderState, Draw, Error, ErrorKind, FinishReason, Layer, PipelineConfig, Preset, Sampler,
    SamplingParams, Selector, StepResult, StopConfig, VocabInfo, WorkspacePool,
};

const NEG_INF: f32 = f32::NEG_INFINITY;

// ------------------------------------------------------------------------------------------
// helpers
// ------------------------------------------------------------------------------------------

fn vocab(v: usize, eos: &[u32], special: &[u32]) -> VocabInfo {
    VocabInfo {
        vocab_size: v,
        eos_token_ids: eos.to_vec(),
        special_token_ids: special.to_vec(),
    }
}

fn from_params(preset: Preset, params: &SamplingParams, v: VocabInfo) -> Sampler {
    Sampler::from_params(preset, params, v)
        .unwrap_or_else(|e| panic!("{} rejected {params:?}: {e}", preset.name()))
}

fn custom(procs: Vec<P>, selector: Selector, v: VocabInfo) -> Sampler {
    Sampler::new(
        PipelineConfig::new(procs, selector),
        v,
        StopConfig::default(),
    )
    .unwrap()
}

#[track_caller]
fn assert_error(e: &Error, code: &str, field: Option<&str>) {
    assert_eq!(e.code(), code, "{e:?}");
    assert_eq!(e.field(), field, "{e:?}");
    // every error explains itself, naming the field when there is one
    let msg = e.to_string();
    if let Some(f) = field {
        if code != "empty_support" {
            assert!(msg.contains(f), "`{msg}` does not name `{f}`");
        }
    }
}

/// Runs every step entry point (select, select_recorded, explain, step, step_recorded,
/// step_batch next to a neighbour) on `logits`: they must all fail with the same error, and none
/// may touch `st` (nor the neighbour's result). Returns the error.
#[track_caller]
fn step_error(s: &Sampler, st: &DecoderState, logits: &[f32]) -> Error {
    let before = st.clone();
    let mut ws = s.new_workspace();
    let e = s
        .select(logits, st, &mut ws, Draw::Stream)
        .expect_err("select should fail");
    assert_eq!(
        s.select_recorded(logits, st, &mut ws, Draw::FixedU(0.5), usize::MAX)
            .unwrap_err(),
        e
    );
    assert_eq!(s.explain(logits, st, Draw::Stream).unwrap_err(), e);
    let mut st2 = st.clone();
    assert_eq!(s.step(logits, &mut st2, &mut ws).unwrap_err(), e);
    assert_eq!(st2, before);
    assert_eq!(
        s.step_recorded(logits, &mut st2, &mut ws, Draw::Stream, 4)
            .unwrap_err(),
        e
    );
    assert_eq!(st2, before);
    let v = s.vocab().vocab_size;
    if logits.len() == v {
        // a batch: this row fails alone; its neighbour is unaffected
        let neighbour = s.new_state(&[], 99).unwrap();
        let row: Vec<f32> = (0..v).map(|i| (i % 7) as f32 * 0.25).collect();
        let alone = {
            let mut n = neighbour.clone();
            s.step(&row, &mut n, &mut s.new_workspace())
        };
        let mut flat = logits.to_vec();
        flat.extend_from_slice(&row);
        let mut states = vec![st.clone(), neighbour];
        let mut out = vec![
            Ok(StepResult {
                token: u32::MAX,
                finish: None,
                u: None,
            });
            2
        ];
        s.step_batch(&flat, &mut states, &mut WorkspacePool::new(v, 2), &mut out)
            .unwrap();
        assert_eq!(out[0].as_ref().unwrap_err(), &e);
        assert_eq!(states[0], before);
        assert_eq!(out[1], alone);
    }
    assert_eq!(st, &before);
    e
}

#[track_caller]
fn empty_support(s: &Sampler, st: &DecoderState, logits: &[f32], stage: &str) {
    let e = step_error(s, st, logits);
    assert_error(&e, "empty_support", Some("support"));
    // the constraint error names the stage that emptied the support: never "selection", i.e.
    // the selector was not called on an empty support
    assert_eq!(
        e.kind(),
        &ErrorKind::EmptySupport {
            stage: stage.into()
        }
    );
    assert!(e.to_string().contains(stage) && e.to_string().contains("sampler not called"));
}

fn params_error(preset: Preset, params: &SamplingParams, v: VocabInfo) -> Error {
    match Sampler::from_params(preset, params, v) {
        Ok(_) => panic!("{} accepted {params:?}", preset.name()),
        Err(e) => e,
    }
}

/// The index of the first processor of `type_name` in the preset's pipeline for `params`.
fn position(preset: Preset, params: &SamplingParams, type_name: &str) -> usize {
    let (cfg, _) = presets::build(preset, params).unwrap();
    cfg.processors
        .iter()
        .position(|p| p.type_name() == type_name)
        .unwrap_or_else(|| panic!("{} has no {type_name}", preset.name()))
}

// ------------------------------------------------------------------------------------------
// §3.12 row 1: no finite token after a processor → constraint error, sampler not called
// ------------------------------------------------------------------------------------------

#[test]
fn all_raw_logits_neg_inf_is_an_empty_support_at_raw() {
    for preset in Preset::ALL {
        for temperature in [None, Some(0.0), Some(0.7)] {
            let params = SamplingParams {
                temperature,
                ..Default::default()
            };
            let s = from_params(preset, &params, vocab(3, &[], &[]));
            let st = s.new_state(&[0, 1], 5).unwrap();
            empty_support(&s, &st, &[NEG_INF; 3], "raw");
        }
    }
}

#[test]
fn allowed_ids_whose_tokens_are_all_neg_inf_empty_the_support() {
    for preset in Preset::ALL {
        let params = SamplingParams {
            allowed_token_ids: Some(vec![1, 2]),
            ..Default::default()
        };
        let s = from_params(preset, &params, vocab(4, &[], &[]));
        let st = s.new_state(&[], 1).unwrap();
        empty_support(&s, &st, &[1.0, NEG_INF, NEG_INF, 3.0], "allowed_token_ids");
        // one finite allowed token is enough
        let mut ws = s.new_workspace();
        let r = s
            .select(&[1.0, NEG_INF, -50.0, 3.0], &st, &mut ws, Draw::Stream)
            .unwrap();
        assert_eq!(r.token, 2, "{}", preset.name());
    }
}

#[test]
fn banned_sequences_that_ban_every_token_empty_the_support() {
    for preset in Preset::ALL {
        // one-token sequences are always banned
        let params = SamplingParams {
            bad_words_ids: vec![vec![0], vec![1], vec![2]],
            ..Default::default()
        };
        let s = from_params(preset, &params, vocab(3, &[], &[]));
        let st = s.new_state(&[], 1).unwrap();
        empty_support(&s, &st, &[0.0, 1.0, 2.0], "banned_sequences");

        // two-token sequences ban only after their prefix (here: after output token 2)
        let params = SamplingParams {
            bad_words_ids: vec![vec![2, 0], vec![2, 1], vec![2, 2]],
            ..Default::default()
        };
        let s = from_params(preset, &params, vocab(3, &[], &[]));
        let fresh = s.new_state(&[], 1).unwrap();
        let mut ws = s.new_workspace();
        assert!(s
            .select(&[0.0, 1.0, 2.0], &fresh, &mut ws, Draw::Stream)
            .is_ok());
        let st = s.state_with_history(&[], &[2], 1).unwrap();
        empty_support(&s, &st, &[0.0, 1.0, 2.0], "banned_sequences");
    }
}

#[test]
fn every_mask_names_itself_when_it_empties_the_support() {
    // special-token mask: the only finite tokens are special (EOS stays selectable, but is -inf)
    let s = from_params(
        Preset::Reference,
        &SamplingParams::default(),
        vocab(3, &[2], &[0, 1, 2]),
    );
    let st = s.new_state(&[], 0).unwrap();
    empty_support(&s, &st, &[1.0, 1.0, NEG_INF], "special_token_mask");

    // min-length mask: the only finite token is EOS
    let params = SamplingParams {
        min_tokens: Some(2),
        ..Default::default()
    };
    let s = from_params(Preset::Reference, &params, vocab(2, &[1], &[]));
    let st = s.state_with_history(&[], &[0], 0).unwrap();
    empty_support(&s, &st, &[NEG_INF, 4.0], "min_tokens");
    // ... and once min_tokens outputs exist, EOS is selectable again
    let st = s.state_with_history(&[], &[0, 0], 0).unwrap();
    let mut ws = s.new_workspace();
    assert_eq!(
        s.select(&[NEG_INF, 4.0], &st, &mut ws, Draw::Stream)
            .unwrap()
            .token,
        1
    );

    // no-repeat 1-gram: every token of the context is banned
    let params = SamplingParams {
        no_repeat_ngram_size: Some(1),
        ..Default::default()
    };
    let s = from_params(Preset::Reference, &params, vocab(3, &[], &[]));
    let st = s.new_state(&[2, 0, 1], 0).unwrap();
    empty_support(&s, &st, &[0.0, 0.0, 0.0], "no_repeat_ngram");

    // a mask after a truncation: top-k keeps token 0, the allowed set is {1}
    let s = custom(
        vec![
            P::TopK(TopK {
                version: 1,
                top_k: 1,
                ties: top_k::Ties::ById,
            }),
            P::AllowedTokenIds(AllowedTokenIds {
                version: 1,
                token_ids: vec![1],
            }),
        ],
        Selector::Gumbel,
        vocab(2, &[], &[]),
    );
    let st = s.new_state(&[], 0).unwrap();
    empty_support(&s, &st, &[2.0, 1.0], "allowed_token_ids");
}

// ------------------------------------------------------------------------------------------
// §3.12 row 2: unversioned processor order → record the ordered list and versions
// ------------------------------------------------------------------------------------------

#[test]
fn a_pipeline_without_format_version_is_rejected() {
    let e = PipelineConfig::from_json(r#"{"processors": [], "selector": {"type": "greedy"}}"#)
        .unwrap_err();
    assert_error(&e, "parse", Some("pipeline"));
    assert!(e.to_string().contains("format_version"), "{e}");
}

#[test]
fn an_unsupported_format_version_is_rejected() {
    for version in [0, 2, 9] {
        let json = format!(r#"{{"format_version": {version}, "processors": []}}"#);
        let e = PipelineConfig::from_json(&json).unwrap_err();
        assert_error(&e, "invalid_parameter", Some("format_version"));
        // also when the config is built in code
        let cfg = PipelineConfig {
            format_version: version,
            processors: vec![],
            selector: Selector::Greedy,
        };
        let e = Sampler::new(cfg, vocab(2, &[], &[]), StopConfig::default()).unwrap_err();
        assert_error(&e, "invalid_parameter", Some("format_version"));
    }
}

#[test]
fn an_unsupported_processor_version_is_rejected() {
    let json = r#"{"format_version": 1, "processors": [
        {"type": "temperature", "temperature": 0.5},
        {"type": "top_k", "top_k": 3, "version": 2}
    ]}"#;
    let cfg = PipelineConfig::from_json(json).unwrap();
    let e = Sampler::new(cfg, vocab(5, &[], &[]), StopConfig::default()).unwrap_err();
    assert_error(&e, "invalid_parameter", Some("processors[1].version"));

    let cfg = PipelineConfig::new(
        vec![P::TopP(TopP {
            version: 0,
            top_p: 0.5,
            min_keep: 1,
            rule: top_p::Rule::DescendingPrefix,
        })],
        Selector::Categorical,
    );
    let e = Sampler::new(cfg, vocab(5, &[], &[]), StopConfig::default()).unwrap_err();
    assert_error(&e, "invalid_parameter", Some("processors[0].version"));
}

#[test]
fn records_name_the_ordered_processors_and_their_versions() {
    // the same logits give different candidates under two orders (temperature and top-p do not
    // commute); the records tell the two apart by processor list and pipeline hash
    let t = P::Temperature(Temperature {
        version: 1,
        temperature: 2.0,
    });
    let p = P::TopP(TopP {
        version: 1,
        top_p: 0.8,
        min_keep: 1,
        rule: top_p::Rule::DescendingPrefix,
    });
    let logits = [2.0, 1.5, 0.5];
    let run = |procs: Vec<P>| {
        let s = custom(procs, Selector::Categorical, vocab(3, &[], &[]));
        let st = s.new_state(&[], 0).unwrap();
        let mut ws = s.new_workspace();
        s.select_recorded(&logits, &st, &mut ws, Draw::FixedU(0.1), usize::MAX)
            .unwrap()
            .1
    };
    let a = run(vec![p.clone(), t.clone()]);
    let b = run(vec![t, p]);
    let ids = |r: &nextok_core::StepRecord| r.candidates.iter().map(|c| c.id).collect::<Vec<_>>();
    assert_eq!(ids(&a), vec![0, 1]);
    assert_eq!(ids(&b), vec![0, 1, 2]);
    assert_ne!(a.pipeline_hash, b.pipeline_hash);
    let list = |r: &nextok_core::StepRecord| {
        r.processors
            .iter()
            .map(|x| (x.kind.clone(), x.version))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        list(&a),
        vec![("top_p".to_string(), 1), ("temperature".to_string(), 1)]
    );
    assert_eq!(
        list(&b),
        vec![("temperature".to_string(), 1), ("top_p".to_string(), 1)]
    );
    // a processor without an explicit version is version 1 and recorded as such
    let cfg = PipelineConfig::from_json(
        r#"{"format_version": 1, "processors": [{"type": "top_k", "top_k": 2}]}"#,
    )
    .unwrap();
    assert_eq!(cfg.processors[0].version(), 1);
    assert!(cfg.canonical_json().contains(r#""version":1"#));
}

// ------------------------------------------------------------------------------------------
// §3.12 row 3: constraint state consumes whole tokens (the grammar engine is not part of the
// core; its slot stays empty, and sequence constraints advance per committed token id)
// ------------------------------------------------------------------------------------------

#[test]
fn sequence_constraints_consume_committed_token_ids() {
    let params = SamplingParams {
        bad_words_ids: vec![vec![1, 2]],
        temperature: Some(0.0),
        ..Default::default()
    };
    let logits = [0.0, 0.0, 5.0, 0.0];
    // reference: the prompt counts as context, so a prompt ending in 1 bans 2
    let s = from_params(Preset::Reference, &params, vocab(4, &[], &[]));
    let mut st = s.new_state(&[1], 0).unwrap();
    assert!(st.grammar().is_none());
    let mut ws = s.new_workspace();
    let (r, rec) = s
        .step_recorded(&logits, &mut st, &mut ws, Draw::Stream, usize::MAX)
        .unwrap();
    assert_eq!(r.token, 0);
    assert!(rec.candidates.iter().all(|c| c.id != 2));
    // the automaton node moved when the token was committed (and only then)
    assert_ne!(
        rec.state_before.sequence_nodes,
        rec.state_after.sequence_nodes
    );
    // after 0 the prefix is gone: 2 is allowed again
    assert_eq!(s.step(&logits, &mut st, &mut ws).unwrap().token, 2);
    // vLLM matches output tokens only: the same prompt bans nothing
    let s = from_params(Preset::Vllm, &params, vocab(4, &[], &[]));
    let mut st = s.new_state(&[1], 0).unwrap();
    assert_eq!(s.step(&logits, &mut st, &mut ws).unwrap().token, 2);
}

// ------------------------------------------------------------------------------------------
// §3.12 row 4: same seed but a shared stream → per-request counter-based streams
// ------------------------------------------------------------------------------------------

#[test]
fn a_requests_stream_does_not_depend_on_its_batch() {
    let v = 16;
    let params = SamplingParams {
        temperature: Some(1.3),
        ..Default::default()
    };
    for preset in [Preset::Reference, Preset::Vllm] {
        let s = from_params(preset, &params, vocab(v, &[], &[]));
        // requests 0 and 1 are identical (same logits, same seed)
        let row = |k: usize| -> Vec<f32> {
            let k = k.max(1);
            (0..v)
                .map(|i| ((i * 7 + k * 3) % 11) as f32 * 0.3)
                .collect()
        };
        let seeds = [7u64, 7, 8, 1 << 40];
        // alone, for 6 steps
        let alone: Vec<Vec<u32>> = seeds
            .iter()
            .enumerate()
            .map(|(k, &seed)| {
                let mut st = s.new_state(&[], seed).unwrap();
                let mut ws = s.new_workspace();
                (0..6)
                    .map(|_| s.step(&row(k), &mut st, &mut ws).unwrap().token)
                    .collect()
            })
            .collect();
        // identical requests with the same seed get identical tokens, never a shared stream
        assert_eq!(alone[0], alone[1]);
        // in a batch of 4 and in a batch of 2 (other neighbours), with 1..3 workspaces
        for (rows, threads) in [(vec![0, 1, 2, 3], 1), (vec![3, 0], 2), (vec![2, 1, 0], 3)] {
            let mut states: Vec<DecoderState> = rows
                .iter()
                .map(|&k| s.new_state(&[], seeds[k]).unwrap())
                .collect();
            let flat: Vec<f32> = rows.iter().flat_map(|&k| row(k)).collect();
            let mut pool = WorkspacePool::new(v, threads);
            let mut got = vec![Vec::new(); rows.len()];
            for _ in 0..6 {
                let mut out = vec![
                    Ok(StepResult {
                        token: 0,
                        finish: None,
                        u: None,
                    });
                    rows.len()
                ];
                s.step_batch(&flat, &mut states, &mut pool, &mut out)
                    .unwrap();
                for (g, o) in got.iter_mut().zip(out) {
                    g.push(o.unwrap().token);
                }
            }
            for (j, &k) in rows.iter().enumerate() {
                assert_eq!(got[j], alone[k], "{} row {k}", preset.name());
            }
        }
    }
    // the categorical u is a pure function of (seed, step)
    let s = from_params(Preset::Reference, &params, vocab(v, &[], &[]));
    let st = s.state_with_history(&[], &[1, 2, 3], 42).unwrap();
    let mut ws = s.new_workspace();
    let sel = s.select(&[0.0; 16], &st, &mut ws, Draw::Stream).unwrap();
    assert_eq!(
        sel.u,
        Some(nextok_core::RngState::new(42).uniform(3, Purpose::Select, 0))
    );
}

// ------------------------------------------------------------------------------------------
// §3.12 row 5: stop token hidden by the min-length mask → reject at validation
// ------------------------------------------------------------------------------------------

#[test]
fn min_tokens_above_max_tokens_with_a_stop_token_is_a_contradiction() {
    let params = SamplingParams {
        min_tokens: Some(10),
        max_tokens: Some(5),
        ..Default::default()
    };
    for preset in Preset::ALL {
        // EOS hidden until 10 outputs, but at most 5: EOS could never be selected
        let e = params_error(preset, &params, vocab(4, &[1], &[]));
        assert_error(&e, "contradiction", Some("min_tokens"));
        // the same with a request stop token instead of an EOS id
        let with_stop = SamplingParams {
            stop_token_ids: vec![3],
            ..params.clone()
        };
        let e = params_error(preset, &with_stop, vocab(4, &[], &[]));
        assert_error(&e, "contradiction", Some("min_tokens"));
        // nothing is hidden when there is no EOS and no stop token; min == max is fine
        from_params(preset, &params, vocab(4, &[], &[]));
        let equal = SamplingParams {
            min_tokens: Some(5),
            ..params.clone()
        };
        from_params(preset, &equal, vocab(4, &[1], &[]));
    }
}

// ------------------------------------------------------------------------------------------
// §3.12 row 6: a raw logprob labelled as a sampled one → every logprob names its layer
// ------------------------------------------------------------------------------------------

fn log_softmax(z: &[f64], i: usize) -> f64 {
    let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let s: f64 = z.iter().map(|x| (x - m).exp()).sum();
    z[i] - m - s.ln()
}

#[test]
fn logprobs_are_labelled_by_layer() {
    // 000 §3.9: logits (2.0, 1.5, 0.5), counts (2, 1, 0), presence 0.1, frequency 0.2, T = 0.8,
    // top-p 0.8 → support {A, B}, selection (0.593, 0.407, 0), u = 0.63 selects B
    let params = SamplingParams {
        temperature: Some(0.8),
        top_p: Some(0.8),
        presence_penalty: Some(0.1),
        frequency_penalty: Some(0.2),
        ..Default::default()
    };
    let s = from_params(Preset::Reference, &params, vocab(3, &[], &[]));
    let st = s.state_with_history(&[], &[0, 0, 1], 0).unwrap();
    let raw = [2.0f32, 1.5, 0.5];
    let mut ws = s.new_workspace();
    let (sel, rec) = s
        .select_recorded(&raw, &st, &mut ws, Draw::FixedU(0.63), usize::MAX)
        .unwrap();
    assert_eq!(sel.token, 1);
    let b = 1u32;
    let mut lp = |layer: Layer| {
        let x = s.logprob(&raw, &mut ws, b, layer).unwrap();
        assert_eq!(x.layer, layer);
        x.value
    };
    let raw64: Vec<f64> = raw.iter().map(|&x| x as f64).collect();
    let processed = [1.5 / 0.8, 1.2 / 0.8, 0.5 / 0.8];
    let (r, p, q) = (lp(Layer::Raw), lp(Layer::Processed), lp(Layer::Selection));
    assert!((r - log_softmax(&raw64, 1)).abs() < 1e-5, "raw {r}");
    assert!(
        (p - log_softmax(&processed, 1)).abs() < 1e-5,
        "processed {p}"
    );
    assert!((q - (0.407f64).ln()).abs() < 2e-3, "selection {q}");
    // three different numbers for the same token: none may stand in for another
    assert!((r - p).abs() > 1e-2 && (p - q).abs() > 1e-2 && (r - q).abs() > 1e-2);
    let c = rec.candidates.iter().find(|c| c.id == b).unwrap();
    assert_eq!(
        (c.raw_logprob, c.processed_logprob, c.selection_logprob),
        (r, p, q)
    );
    // C is outside the support: impossible in the selection layer, not in the other two
    let c_sel = s.logprob(&raw, &mut ws, 2, Layer::Selection).unwrap();
    assert_eq!(c_sel.value, f64::NEG_INFINITY);
    assert!(s
        .logprob(&raw, &mut ws, 2, Layer::Raw)
        .unwrap()
        .value
        .is_finite());
    // serialised names carry the layer; there is no bare "logprob" field
    let json = serde_json::to_string(&rec).unwrap();
    for name in ["raw_logprob", "processed_logprob", "selection_logprob"] {
        assert!(json.contains(&format!("\"{name}\"")));
    }
    assert!(!json.contains("\"logprob\""));
    let e = s.logprob(&raw, &mut ws, 3, Layer::Raw).unwrap_err();
    assert_error(&e, "token_out_of_range", Some("token"));
}

// ------------------------------------------------------------------------------------------
// §3.12 row 7: NaN in sorting → detect and fail, naming the first bad index
// ------------------------------------------------------------------------------------------

#[test]
fn non_finite_logits_name_the_first_bad_index() {
    for preset in Preset::ALL {
        let s = from_params(preset, &SamplingParams::default(), vocab(8, &[], &[]));
        let st = s.state_with_history(&[1], &[2], 3).unwrap();
        let mut logits = [0.5f32; 8];
        logits[5] = f32::NAN;
        logits[2] = f32::INFINITY;
        let e = step_error(&s, &st, &logits);
        assert_error(&e, "non_finite_logit", Some("logits"));
        assert_eq!(
            e.kind(),
            &ErrorKind::NonFiniteLogit {
                index: 2,
                value: "+inf"
            }
        );
        assert!(e.to_string().contains("logits[2]"));
        logits[2] = NEG_INF; // -inf is allowed: now the NaN at 5 is the first bad value
        let e = step_error(&s, &st, &logits);
        assert_eq!(
            e.kind(),
            &ErrorKind::NonFiniteLogit {
                index: 5,
                value: "NaN"
            }
        );
        // a NaN far into a long row (past the first 64-wide block) is found too
        let s = from_params(preset, &SamplingParams::default(), vocab(300, &[], &[]));
        let st = s.new_state(&[], 0).unwrap();
        let mut long = vec![0.0f32; 300];
        long[257] = -f32::NAN;
        long[299] = f32::INFINITY;
        let e = step_error(&s, &st, &long);
        assert_eq!(
            e.kind(),
            &ErrorKind::NonFiniteLogit {
                index: 257,
                value: "NaN"
            }
        );
    }
}

// ------------------------------------------------------------------------------------------
// bad input: lengths and ids
// ------------------------------------------------------------------------------------------

#[test]
fn wrong_logits_length_is_rejected() {
    let s = from_params(
        Preset::Reference,
        &SamplingParams::default(),
        vocab(4, &[], &[]),
    );
    let st = s.new_state(&[], 0).unwrap();
    for len in [0, 3, 5] {
        let e = step_error(&s, &st, &vec![0.0; len]);
        assert_error(&e, "vocab_size_mismatch", Some("logits"));
        assert_eq!(
            e.kind(),
            &ErrorKind::VocabSizeMismatch {
                expected: 4,
                got: len
            }
        );
    }
    // a workspace made for another vocabulary
    let mut ws = nextok_core::Workspace::new(5);
    let e = s.select(&[0.0; 4], &st, &mut ws, Draw::Stream).unwrap_err();
    assert_error(&e, "vocab_size_mismatch", Some("logits"));
    // a batch whose flat length is not rows × vocab: nothing runs, no state changes
    let mut states = vec![st.clone(), st.clone()];
    let mut out = vec![
        Ok(StepResult {
            token: 9,
            finish: None,
            u: None,
        });
        2
    ];
    let e = s
        .step_batch(
            &[0.0; 7],
            &mut states,
            &mut WorkspacePool::new(4, 2),
            &mut out,
        )
        .unwrap_err();
    assert_error(&e, "vocab_size_mismatch", Some("logits"));
    assert_eq!(states, vec![st.clone(), st.clone()]);
    assert!(out.iter().all(|o| o.as_ref().unwrap().token == 9));
    // an output slice of the wrong size
    let mut out1 = vec![out[0].clone()];
    let e = s
        .step_batch(
            &[0.0; 8],
            &mut states,
            &mut WorkspacePool::new(4, 1),
            &mut out1,
        )
        .unwrap_err();
    assert_error(&e, "invalid_parameter", Some("out"));
    assert_eq!(states, vec![st.clone(), st]);
}

#[test]
fn out_of_range_ids_in_state_and_commit_are_rejected() {
    let s = from_params(
        Preset::Reference,
        &SamplingParams::default(),
        vocab(4, &[], &[]),
    );
    let e = s.new_state(&[0, 4], 0).unwrap_err();
    assert_error(&e, "token_out_of_range", Some("prompt_ids[1]"));
    assert_eq!(
        e.kind(),
        &ErrorKind::TokenOutOfRange {
            field: "prompt_ids[1]".into(),
            token: 4,
            vocab_size: 4
        }
    );
    let e = s.state_with_history(&[9], &[0], 0).unwrap_err();
    assert_error(&e, "token_out_of_range", Some("prompt_ids[0]"));
    let e = s
        .state_with_history(&[0], &[1, 2, u32::MAX], 0)
        .unwrap_err();
    assert_error(&e, "token_out_of_range", Some("selected_ids[2]"));

    let mut st = s.state_with_history(&[1], &[2], 0).unwrap();
    let before = st.clone();
    let e = s.commit(&mut st, 4).unwrap_err();
    assert_error(&e, "token_out_of_range", Some("token"));
    assert_eq!(st, before);
}

#[test]
fn out_of_range_ids_in_request_parameters_are_rejected() {
    let v = || vocab(4, &[], &[]);
    for preset in Preset::ALL {
        let params = SamplingParams {
            logit_bias: [(9, 1.0)].into(),
            ..Default::default()
        };
        let i = position(preset, &params, "logit_bias");
        let e = params_error(preset, &params, v());
        assert_error(
            &e,
            "token_out_of_range",
            Some(&format!("processors[{i}].logit_bias[9]")),
        );

        let params = SamplingParams {
            allowed_token_ids: Some(vec![0, 1, 4]),
            ..Default::default()
        };
        let i = position(preset, &params, "allowed_token_ids");
        let e = params_error(preset, &params, v());
        assert_error(
            &e,
            "token_out_of_range",
            Some(&format!("processors[{i}].token_ids[2]")),
        );

        let params = SamplingParams {
            stop_token_ids: vec![3, 7],
            ..Default::default()
        };
        let e = params_error(preset, &params, v());
        assert_error(&e, "token_out_of_range", Some("stop_token_ids[1]"));

        let params = SamplingParams {
            bad_words_ids: vec![vec![1], vec![2, 5]],
            ..Default::default()
        };
        let i = position(preset, &params, "banned_sequences");
        let e = params_error(preset, &params, v());
        assert_error(
            &e,
            "token_out_of_range",
            Some(&format!("processors[{i}].sequences[1][1]")),
        );
    }
    // vocabulary facts
    let e = params_error(
        Preset::Reference,
        &SamplingParams::default(),
        vocab(4, &[4], &[]),
    );
    assert_error(&e, "token_out_of_range", Some("eos_token_ids[0]"));
    let e = params_error(
        Preset::Reference,
        &SamplingParams::default(),
        vocab(4, &[], &[0, 10]),
    );
    assert_error(&e, "token_out_of_range", Some("special_token_ids[1]"));
    let e = params_error(
        Preset::Reference,
        &SamplingParams::default(),
        vocab(0, &[], &[]),
    );
    assert_error(&e, "invalid_parameter", Some("vocab_size"));
}

// ------------------------------------------------------------------------------------------
// bad input: parameter domains
// ------------------------------------------------------------------------------------------

#[test]
fn invalid_request_parameters_name_the_field() {
    let d = SamplingParams::default;
    let cases: Vec<(SamplingParams, &str)> = vec![
        (
            SamplingParams {
                top_p: Some(0.0),
                ..d()
            },
            "top_p",
        ),
        (
            SamplingParams {
                top_p: Some(1.5),
                ..d()
            },
            "top_p",
        ),
        (
            SamplingParams {
                top_p: Some(-0.1),
                ..d()
            },
            "top_p",
        ),
        (
            SamplingParams {
                top_p: Some(f64::NAN),
                ..d()
            },
            "top_p",
        ),
        (
            SamplingParams {
                min_p: Some(2.0),
                ..d()
            },
            "min_p",
        ),
        (
            SamplingParams {
                min_p: Some(-0.5),
                ..d()
            },
            "min_p",
        ),
        (
            SamplingParams {
                min_p: Some(f64::NAN),
                ..d()
            },
            "min_p",
        ),
        (
            SamplingParams {
                typical_p: Some(0.0),
                ..d()
            },
            "typical_p",
        ),
        (
            SamplingParams {
                typical_p: Some(1.01),
                ..d()
            },
            "typical_p",
        ),
        (
            SamplingParams {
                typical_p: Some(f64::NAN),
                ..d()
            },
            "typical_p",
        ),
        (
            SamplingParams {
                temperature: Some(-1.0),
                ..d()
            },
            "temperature",
        ),
        (
            SamplingParams {
                temperature: Some(f32::NAN),
                ..d()
            },
            "temperature",
        ),
        (
            SamplingParams {
                temperature: Some(f32::INFINITY),
                ..d()
            },
            "temperature",
        ),
        (
            SamplingParams {
                presence_penalty: Some(3.0),
                ..d()
            },
            "presence_penalty",
        ),
        (
            SamplingParams {
                presence_penalty: Some(f32::NAN),
                ..d()
            },
            "presence_penalty",
        ),
        (
            SamplingParams {
                frequency_penalty: Some(-2.5),
                ..d()
            },
            "frequency_penalty",
        ),
        (
            SamplingParams {
                repetition_penalty: Some(0.0),
                ..d()
            },
            "repetition_penalty",
        ),
        (
            SamplingParams {
                repetition_penalty: Some(-1.0),
                ..d()
            },
            "repetition_penalty",
        ),
        (
            SamplingParams {
                repetition_penalty: Some(f32::NAN),
                ..d()
            },
            "repetition_penalty",
        ),
        (
            SamplingParams {
                repetition_penalty: Some(f32::INFINITY),
                ..d()
            },
            "repetition_penalty",
        ),
        (
            SamplingParams {
                logit_bias: [(1, 200.0)].into(),
                ..d()
            },
            "logit_bias[1]",
        ),
        (
            SamplingParams {
                logit_bias: [(2, -100.5)].into(),
                ..d()
            },
            "logit_bias[2]",
        ),
        (
            SamplingParams {
                logit_bias: [(0, f32::NAN)].into(),
                ..d()
            },
            "logit_bias[0]",
        ),
        (
            SamplingParams {
                max_tokens: Some(0),
                ..d()
            },
            "max_tokens",
        ),
    ];
    for preset in Preset::ALL {
        for (params, field) in &cases {
            let e = params_error(preset, params, vocab(4, &[], &[]));
            assert_error(&e, "invalid_parameter", Some(field));
        }
    }
}

#[test]
fn invalid_pipeline_parameters_name_the_processor_field() {
    let scope = PenaltyScope::PromptAndOutput;
    let cases: Vec<(P, &str)> = vec![
        (
            P::TopK(TopK {
                version: 1,
                top_k: 0,
                ties: top_k::Ties::ById,
            }),
            "top_k",
        ),
        (
            P::TopK(TopK {
                version: 1,
                top_k: -1,
                ties: top_k::Ties::KeepAll,
            }),
            "top_k",
        ),
        (
            P::TopP(TopP {
                version: 1,
                top_p: 0.0,
                min_keep: 1,
                rule: top_p::Rule::DescendingPrefix,
            }),
            "top_p",
        ),
        (
            P::TopP(TopP {
                version: 1,
                top_p: 0.5,
                min_keep: 0,
                rule: top_p::Rule::AscendingTail,
            }),
            "min_keep",
        ),
        (
            P::MinP(MinP {
                version: 1,
                min_p: 0.0,
                min_keep: 1,
            }),
            "min_p",
        ),
        (
            P::TypicalP(TypicalP {
                version: 1,
                typical_p: 0.0,
                min_keep: 1,
                keep_ties: false,
            }),
            "typical_p",
        ),
        (
            P::Temperature(Temperature {
                version: 1,
                temperature: -1.0,
            }),
            "temperature",
        ),
        (
            P::Temperature(Temperature {
                version: 1,
                temperature: f32::NAN,
            }),
            "temperature",
        ),
        (
            P::RepetitionPenalty(RepetitionPenalty {
                version: 1,
                repetition_penalty: 0.0,
                scope,
                exclude_special: true,
            }),
            "repetition_penalty",
        ),
        (
            P::RepetitionPenalty(RepetitionPenalty {
                version: 1,
                repetition_penalty: 1.2,
                scope: PenaltyScope::LastN { n: 0 },
                exclude_special: true,
            }),
            "scope.n",
        ),
        (
            P::PresenceFrequencyPenalty(PresenceFrequencyPenalty {
                version: 1,
                presence_penalty: 3.0,
                frequency_penalty: 0.0,
                scope,
                exclude_special: true,
            }),
            "presence_penalty",
        ),
        (
            P::LogitBias(LogitBias {
                version: 1,
                logit_bias: [(1, 200.0)].into(),
            }),
            "logit_bias[1]",
        ),
        (
            P::NoRepeatNgram(NoRepeatNgram {
                version: 1,
                ngram_size: 0,
            }),
            "ngram_size",
        ),
        (
            P::BannedSequences(BannedSequences {
                version: 1,
                sequences: vec![vec![1], vec![]],
                include_prompt: true,
            }),
            "sequences[1]",
        ),
    ];
    for (p, field) in cases {
        // put it second, so the index in the field name is checked as well
        let procs = vec![
            P::TopK(TopK {
                version: 1,
                top_k: 3,
                ties: top_k::Ties::ById,
            }),
            p,
        ];
        let cfg = PipelineConfig::new(procs, Selector::Categorical);
        let e = Sampler::new(cfg, vocab(4, &[], &[]), StopConfig::default()).unwrap_err();
        assert_error(
            &e,
            "invalid_parameter",
            Some(&format!("processors[1].{field}")),
        );
    }
    // max_tokens 0 in a stop config
    let stop = StopConfig {
        max_tokens: Some(0),
        ..Default::default()
    };
    let e = Sampler::new(
        PipelineConfig::new(vec![], Selector::Greedy),
        vocab(4, &[], &[]),
        stop,
    )
    .unwrap_err();
    assert_error(&e, "invalid_parameter", Some("max_tokens"));
}

#[test]
fn a_fixed_u_outside_the_unit_interval_is_rejected() {
    let s = from_params(
        Preset::Reference,
        &SamplingParams::default(),
        vocab(3, &[], &[]),
    );
    let st = s.new_state(&[], 0).unwrap();
    let before = st.clone();
    let mut ws = s.new_workspace();
    for u in [1.0, 1.5, -0.01, f64::NAN, f64::INFINITY] {
        let e = s
            .select(&[0.0; 3], &st, &mut ws, Draw::FixedU(u))
            .unwrap_err();
        assert_error(&e, "invalid_parameter", Some("selector.u"));
        let e2 = s
            .select_recorded(&[0.0; 3], &st, &mut ws, Draw::FixedU(u), 1)
            .unwrap_err();
        assert_eq!(e2, e);
        assert_eq!(s.explain(&[0.0; 3], &st, Draw::FixedU(u)).unwrap_err(), e);
    }
    assert_eq!(st, before);
}

// ------------------------------------------------------------------------------------------
// contradictions
// ------------------------------------------------------------------------------------------

#[test]
fn contradictory_settings_are_rejected_at_validation() {
    // an empty allowed set: nothing could ever be selected
    let params = SamplingParams {
        allowed_token_ids: Some(vec![]),
        ..Default::default()
    };
    for preset in Preset::ALL {
        let i = position(preset, &params, "allowed_token_ids");
        let e = params_error(preset, &params, vocab(4, &[], &[]));
        assert_error(
            &e,
            "contradiction",
            Some(&format!("processors[{i}].token_ids")),
        );
    }
    // two temperature processors
    let t = |x: f32| {
        P::Temperature(Temperature {
            version: 1,
            temperature: x,
        })
    };
    let cfg = PipelineConfig::new(
        vec![
            t(0.7),
            P::TopK(TopK {
                version: 1,
                top_k: 2,
                ties: top_k::Ties::ById,
            }),
            t(0.7),
        ],
        Selector::Categorical,
    );
    let e = Sampler::new(cfg, vocab(4, &[], &[]), StopConfig::default()).unwrap_err();
    assert_error(&e, "contradiction", Some("processors[2]"));
}

// ------------------------------------------------------------------------------------------
// finished sequences
// ------------------------------------------------------------------------------------------

#[test]
fn a_finished_sequence_accepts_no_commit_and_no_step() {
    let params = SamplingParams {
        max_tokens: Some(3),
        stop_token_ids: vec![2],
        temperature: Some(0.0),
        ..Default::default()
    };
    let s = from_params(Preset::Reference, &params, vocab(4, &[3], &[]));
    let logits = [0.0f32; 4];
    let cases: [(&[u32], u32, FinishReason); 3] = [
        (&[], 3, FinishReason::Eos { token: 3 }),
        (&[0], 2, FinishReason::StopToken { token: 2 }),
        (&[0, 1], 1, FinishReason::MaxTokens),
    ];
    for (history, last, reason) in cases {
        let mut st = s.state_with_history(&[], history, 0).unwrap();
        assert_eq!(s.commit(&mut st, last).unwrap(), Some(reason));
        assert!(st.is_finished());
        let before = st.clone();
        for t in [0, 1, 3] {
            let e = s.commit(&mut st, t).unwrap_err();
            assert_error(&e, "already_finished", None);
            assert_eq!(e.kind(), &ErrorKind::AlreadyFinished);
            assert_eq!(st, before);
        }
        // even an out-of-range id reports the finished sequence first, and changes nothing
        assert_eq!(
            s.commit(&mut st, 99).unwrap_err().code(),
            "already_finished"
        );
        let e = step_error(&s, &st, &logits);
        assert_error(&e, "already_finished", None);
        assert_eq!(st, before);
    }
    // stepping to the end through `step`: the last step reports the reason, the next one fails
    let mut st = s.new_state(&[], 0).unwrap();
    let mut ws = s.new_workspace();
    let mut reasons = Vec::new();
    for _ in 0..3 {
        reasons.push(
            s.step(&[5.0, 0.0, 0.0, 0.0], &mut st, &mut ws)
                .unwrap()
                .finish,
        );
    }
    assert_eq!(reasons, vec![None, None, Some(FinishReason::MaxTokens)]);
    let e = step_error(&s, &st, &logits);
    assert_eq!(e.kind(), &ErrorKind::AlreadyFinished);
}

// ------------------------------------------------------------------------------------------
// unknown fields
// ------------------------------------------------------------------------------------------

#[test]
fn unknown_fields_are_rejected_by_name() {
    // request parameters
    let e =
        serde_json::from_str::<SamplingParams>(r#"{"temperature": 0.5, "topp": 0.9}"#).unwrap_err();
    assert!(e.to_string().contains("unknown field `topp`"), "{e}");
    let ok =
        serde_json::from_str::<SamplingParams>(r#"{"temperature": 0.5, "top_p": 0.9}"#).unwrap();
    assert_eq!(ok.top_p, Some(0.9));
    let e = serde_json::from_str::<StopConfig>(r#"{"max_token": 3}"#).unwrap_err();
    assert!(e.to_string().contains("unknown field `max_token`"), "{e}");

    // pipelines: at the top level, inside a processor, and an unknown processor type
    for (json, name, path) in [
        (
            r#"{"format_version": 1, "processors": [], "selecter": {"type": "greedy"}}"#,
            "selecter",
            "selecter",
        ),
        (
            r#"{"format_version": 1, "processors": [{"type": "top_k", "top_k": 2, "tie": "by_id"}]}"#,
            "tie",
            "processors[0]",
        ),
        (
            r#"{"format_version": 1, "processors": [{"type": "top_z", "top_z": 2}]}"#,
            "top_z",
            "processors[0].type",
        ),
        (
            r#"{"format_version": 1, "processors": [{"type": "top_k", "top_k": 2, "ties": "by_name"}]}"#,
            "by_name",
            "processors[0]",
        ),
    ] {
        let e = PipelineConfig::from_json(json).unwrap_err();
        // the error names the path of the failing field
        assert_error(&e, "parse", Some(path));
        assert!(e.to_string().contains(&format!("`{name}`")), "{e}");
    }
}

// ------------------------------------------------------------------------------------------
// declared behaviours
// ------------------------------------------------------------------------------------------

#[test]
fn temperature_zero_is_the_greedy_branch() {
    let logits = [1.0f32, 3.0, 3.0, 2.0, NEG_INF];
    let params = SamplingParams {
        temperature: Some(0.0),
        top_k: Some(3),
        top_p: Some(0.5),
        ..Default::default()
    };
    for preset in Preset::ALL {
        let s = from_params(preset, &params, vocab(5, &[], &[]));
        assert_eq!(s.selector(), Selector::Greedy, "{}", preset.name());
        for seed in [0u64, 1, u64::MAX] {
            let st = s.new_state(&[], seed).unwrap();
            for draw in [Draw::Stream, Draw::FixedU(0.0), Draw::FixedU(0.999)] {
                let mut ws = s.new_workspace();
                let (sel, rec) = s
                    .select_recorded(&logits, &st, &mut ws, draw, usize::MAX)
                    .unwrap();
                // argmax, ties → lowest id; no random number is used
                assert_eq!(sel.token, 1, "{}", preset.name());
                assert_eq!(sel.u, None);
                assert_eq!(rec.rng.u, None);
                // where the preset has a temperature stage, it leaves exactly the argmax
                if let Some(stage) = rec.stages.iter().find(|x| x.stage == "temperature") {
                    assert_eq!(stage.support_size, 1);
                    assert_eq!(rec.support_size, 1);
                }
            }
        }
    }
    // the reference and llama.cpp orders keep the argmax at the temperature's position
    for preset in [Preset::Reference, Preset::LlamaCpp] {
        let s = from_params(preset, &params, vocab(5, &[], &[]));
        let (cfg, _) = presets::build(preset, &params).unwrap();
        assert!(cfg
            .processors
            .iter()
            .any(|p| matches!(p, P::Temperature(t) if t.temperature == 0.0)));
        let st = s.new_state(&[], 0).unwrap();
        let ex = s.explain(&logits, &st, Draw::Stream).unwrap();
        let kept: Vec<u32> = ex.tokens.iter().filter(|t| t.kept).map(|t| t.id).collect();
        assert_eq!(kept, vec![1]);
        assert_eq!(ex.tokens[1].selection_prob, 1.0);
    }
}

fn support(s: &Sampler, logits: &[f32]) -> Vec<u32> {
    let st = s.new_state(&[], 0).unwrap();
    let mut ws = s.new_workspace();
    let (_, rec) = s
        .select_recorded(logits, &st, &mut ws, Draw::FixedU(0.1), usize::MAX)
        .unwrap();
    let mut ids: Vec<u32> = rec.candidates.iter().map(|c| c.id).collect();
    ids.sort_unstable();
    ids
}

#[test]
fn top_k_at_most_zero_disables_top_k() {
    let logits = [1.0f32, 3.0, 2.0, -30.0];
    for preset in Preset::ALL {
        for k in [0, -1, i64::MIN] {
            let params = SamplingParams {
                top_k: Some(k),
                top_p: Some(1.0),
                min_p: Some(0.0),
                ..Default::default()
            };
            let s = from_params(preset, &params, vocab(4, &[], &[]));
            assert!(
                s.config()
                    .processors
                    .iter()
                    .all(|p| p.type_name() != "top_k"),
                "{} {k}",
                preset.name()
            );
            assert_eq!(support(&s, &logits), vec![0, 1, 2, 3], "{}", preset.name());
        }
    }
}

#[test]
fn top_p_one_disables_top_p() {
    let logits = [1.0f32, 3.0, 2.0, -30.0];
    for preset in Preset::ALL {
        let params = SamplingParams {
            top_p: Some(1.0),
            top_k: Some(0),
            min_p: Some(0.0),
            ..Default::default()
        };
        let s = from_params(preset, &params, vocab(4, &[], &[]));
        assert!(s
            .config()
            .processors
            .iter()
            .all(|p| p.type_name() != "top_p"));
        assert_eq!(support(&s, &logits), vec![0, 1, 2, 3], "{}", preset.name());
    }
    // an explicit top_p = 1 processor keeps the whole support, including a -30 token whose
    // probability is tiny but positive
    for rule in [top_p::Rule::DescendingPrefix, top_p::Rule::AscendingTail] {
        let s = custom(
            vec![P::TopP(TopP {
                version: 1,
                top_p: 1.0,
                min_keep: 1,
                rule,
            })],
            Selector::Categorical,
            vocab(4, &[], &[]),
        );
        assert_eq!(support(&s, &logits), vec![0, 1, 2, 3]);
    }
}

#[test]
fn k_above_the_vocabulary_keeps_everything() {
    let logits = [1.0f32, 3.0, 2.0, NEG_INF];
    for preset in Preset::ALL {
        let params = SamplingParams {
            top_k: Some(10),
            top_p: Some(1.0),
            min_p: Some(0.0),
            ..Default::default()
        };
        let s = from_params(preset, &params, vocab(4, &[], &[]));
        assert_eq!(support(&s, &logits), vec![0, 1, 2], "{}", preset.name());
    }
    for k in [3, 4, u32::MAX as i64, i64::MAX] {
        for ties in [top_k::Ties::ById, top_k::Ties::KeepAll] {
            let s = custom(
                vec![P::TopK(TopK {
                    version: 1,
                    top_k: k,
                    ties,
                })],
                Selector::Greedy,
                vocab(4, &[], &[]),
            );
            assert_eq!(support(&s, &logits), vec![0, 1, 2]);
        }
    }
}

#[test]
fn neg_inf_raw_logits_are_allowed_and_never_selected() {
    let logits = [NEG_INF, 0.0, NEG_INF, -1.0, NEG_INF];
    for preset in Preset::ALL {
        let s = from_params(preset, &SamplingParams::default(), vocab(5, &[], &[]));
        assert_eq!(support(&s, &logits), vec![1, 3], "{}", preset.name());
        let mut ws = s.new_workspace();
        let mut seen = [0u32; 5];
        for seed in 0..400 {
            let st = s.new_state(&[], seed).unwrap();
            seen[s.select(&logits, &st, &mut ws, Draw::Stream).unwrap().token as usize] += 1;
        }
        assert_eq!((seen[0], seen[2], seen[4]), (0, 0, 0), "{}", preset.name());
        assert!(
            seen[1] > seen[3] && seen[3] > 0,
            "{} {seen:?}",
            preset.name()
        );
        // u right below 1 still lands on a finite token
        let st = s.new_state(&[], 0).unwrap();
        let sel = s
            .select(
                &logits,
                &st,
                &mut ws,
                Draw::FixedU(1.0 - f64::EPSILON / 2.0),
            )
            .unwrap();
        assert!(sel.token == 1 || sel.token == 3);
    }
}
