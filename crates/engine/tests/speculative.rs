//! Speculative decoding in `exact` mode on the real model (SmolLM2-135M-Instruct, from the test
//! data): with prompt lookup drafting, every sequence's tokens, step records (apart from their
//! draft marks) and finish reason equal plain decoding's, over seeds, temperatures, pipelines,
//! penalties, a JSON-schema constraint, stop strings and output limits, and drafts are accepted
//! where the output copies the prompt; the marks say which tokens were drafted and accepted.
//! In `rejection` mode the run is reproducible, its records carry the rule's draws, and a
//! greedy pipeline still gives plain decoding's tokens.

use std::sync::Arc;

use nextok_core::SamplingParams;
use nextok_engine::solo::{SoloOptions, SoloOutput};
use nextok_engine::speculative::{Acceptance, SpecOptions};
use nextok_engine::{
    ConstraintSpec, Engine, EngineConfig, GenerateRequest, PipelineChoice, Prompt,
};
use nextok_model::{LogitsSource, Model, Requant};

mod marks;
use marks::unmarked;

fn model() -> Option<Arc<Model>> {
    let path = nextok_testdata::optional(nextok_testdata::SMOLLM2)?;
    static M: std::sync::OnceLock<Arc<Model>> = std::sync::OnceLock::new();
    Some(
        M.get_or_init(|| Arc::new(Model::load(&path, Requant::Keep).expect("model loads")))
            .clone(),
    )
}

/// A prompt whose answer copies from it.
const COPY: &str = "<|im_start|>user\nRepeat this list exactly, one item per line:\napple pie\nbanana bread\ncherry tart\ndate cake\nelderberry jam\nfig roll<|im_end|>\n<|im_start|>assistant\n";

fn run(
    engine: &Engine,
    model: &Model,
    req: &GenerateRequest,
    spec: Option<SpecOptions>,
) -> SoloOutput {
    run_on(engine, model, req, spec, model.source())
}

/// [`run`] with `src` as the model (`model` gives the context length).
fn run_on<S: LogitsSource + Send>(
    engine: &Engine,
    model: &Model,
    req: &GenerateRequest,
    spec: Option<SpecOptions>,
    mut src: S,
) -> SoloOutput {
    let p = engine.prepare(req).expect("request prepares");
    let row = src.prefill(&p.info.prompt_ids).expect("prefill");
    p.run_prefilled(model, src, row, &p.solo_options(Some(4), false, spec))
        .expect("decodes")
}

fn same(engine: &Engine, model: &Model, req: &GenerateRequest, what: &str) -> SoloOutput {
    let plain = run(engine, model, req, None);
    for max_draft in [1, 5] {
        let spec = SpecOptions {
            max_draft,
            ..Default::default()
        };
        let fast = run(engine, model, req, Some(spec));
        assert_eq!(
            fast.tokens, plain.tokens,
            "{what}: tokens (draft {max_draft})"
        );
        assert_eq!(
            fast.finish, plain.finish,
            "{what}: finish (draft {max_draft})"
        );
        let (records, drafted, accepted) = unmarked(&fast.records);
        assert_eq!(
            records,
            unmarked(&plain.records).0,
            "{what}: step records (draft {max_draft})"
        );
        // every verified draft token is marked (a draft after the last token is not verified)
        assert!(drafted <= fast.spec.drafted, "{what}: {drafted} marks");
        assert_eq!(accepted, fast.spec.accepted, "{what}: accepted marks");
        assert!(
            fast.records
                .iter()
                .filter_map(|r| r.draft.as_ref())
                .all(|d| d.rule == nextok_core::DraftRule::Exact),
            "{what}: exact marks"
        );
        if max_draft == 5 {
            return fast;
        }
    }
    unreachable!()
}

fn request(prompt: &str, params: SamplingParams) -> GenerateRequest {
    let mut r = GenerateRequest::new(Prompt::Text(prompt.to_string()));
    r.params = params;
    r
}

#[test]
fn speculation_changes_nothing_but_the_time() {
    let Some(model) = model() else {
        eprintln!("skipped: the default model is not in the test data");
        return;
    };
    let engine = Engine::new(model.clone(), EngineConfig::default()).unwrap();

    // greedy copying: drafts are accepted
    let greedy = SamplingParams {
        temperature: Some(0.0),
        max_tokens: Some(40),
        seed: Some(1),
        ..Default::default()
    };
    let out = same(
        &engine,
        &model,
        &request(COPY, greedy.clone()),
        "greedy copy",
    );
    assert!(
        out.spec.accepted > 0,
        "copying accepts drafts: {:?}",
        out.spec
    );

    // sampled, several seeds and pipelines, penalties (which see only accepted tokens)
    for seed in 0..4 {
        let p = SamplingParams {
            temperature: Some(0.8),
            top_p: Some(0.95),
            presence_penalty: Some(0.3),
            max_tokens: Some(24),
            seed: Some(seed),
            ..Default::default()
        };
        let mut r = request(COPY, p);
        if seed % 2 == 1 {
            r.pipeline = PipelineChoice::Preset(nextok_core::Preset::LlamaCpp);
        }
        same(&engine, &model, &r, &format!("sampled seed {seed}"));
    }

    // a stop string that the copy reaches, and a short output limit
    let mut p = greedy.clone();
    p.stop = vec!["cherry".into()];
    same(&engine, &model, &request(COPY, p), "stop string");
    let mut p = greedy.clone();
    p.max_tokens = Some(3);
    same(&engine, &model, &request(COPY, p), "max_tokens 3");

    // a JSON-schema constraint (the mask applies at every drafted position)
    let mut r = request(
        "<|im_start|>user\nGive me a person as JSON: name Ada, age 36.<|im_end|>\n<|im_start|>assistant\n",
        SamplingParams {
            temperature: Some(0.7),
            max_tokens: Some(30),
            seed: Some(5),
            ..Default::default()
        },
    );
    r.params.constraint = Some(ConstraintSpec::JsonSchema {
        schema: serde_json::json!({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]}),
        options: Default::default(),
    });
    same(&engine, &model, &r, "json schema");
}

/// Tokens, text, finish reasons and records (as JSON) of every sequence of a completion.
fn outcome(c: &nextok_engine::Completion) -> Vec<(Vec<u32>, String, String, String)> {
    c.sequences
        .iter()
        .map(|s| {
            (
                s.tokens.clone(),
                s.text.clone(),
                format!("{:?}", s.finish),
                unmarked(&s.records).0,
            )
        })
        .collect()
}

#[test]
fn the_engine_speculates_in_its_batches_with_the_same_output() {
    let Some(model) = model() else {
        eprintln!("skipped: the default model is not in the test data");
        return;
    };
    let engine = Engine::new(model.clone(), EngineConfig::default()).unwrap();
    let mut reqs = Vec::new();
    for (i, temp) in [0.0f32, 0.8, 0.0, 0.7].into_iter().enumerate() {
        let mut r = request(
            COPY,
            SamplingParams {
                temperature: Some(temp),
                top_p: Some(0.95),
                max_tokens: Some(20 + 6 * i as u64),
                seed: Some(i as u64),
                ..Default::default()
            },
        );
        r.records = Some(3);
        if i == 2 {
            r.n = 2;
        }
        if i == 3 {
            r.params.stop = vec!["date".into()];
        }
        reqs.push(r);
    }
    let plain: Vec<_> = reqs
        .iter()
        .map(|r| outcome(&engine.generate(r.clone()).expect("plain run")))
        .collect();
    // all together, speculating
    let before = engine.stats();
    let handles: Vec<_> = reqs
        .iter()
        .map(|r| {
            let mut r = r.clone();
            r.speculative = Some(SpecOptions::default());
            engine.submit(r).expect("submits")
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let mut h = h;
        let got = outcome(&h.collect_all().expect("speculative run"));
        assert_eq!(got, plain[i], "request {i}");
    }
    let after = engine.stats();
    assert!(
        after.accepted_draft_tokens > before.accepted_draft_tokens,
        "the copy prompt accepts drafts: {after:?}"
    );
    assert!(after.draft_tokens >= after.accepted_draft_tokens);
}

#[test]
fn a_draft_model_changes_nothing_but_the_time() {
    let Some(model) = model() else {
        eprintln!("skipped: the default model is not in the test data");
        return;
    };
    let engine = Engine::new(model.clone(), EngineConfig::default()).unwrap();
    for (temp, seed) in [(0.0f32, 1u64), (0.8, 2)] {
        let req = request(
            COPY,
            SamplingParams {
                temperature: Some(temp),
                top_p: Some(0.95),
                max_tokens: Some(24),
                seed: Some(seed),
                ..Default::default()
            },
        );
        let plain = run(&engine, &model, &req, None);
        let p = engine.prepare(&req).unwrap();
        let mut src = model.source();
        let row = src.prefill(&p.info.prompt_ids).unwrap();
        // the model drafting for itself: greedy drafts
        let mut drafter = nextok_engine::speculative::ModelDrafter::new(&model, &model).unwrap();
        let fast = nextok_engine::solo::run_sequence_drafted(
            &model,
            &p.sampler,
            src,
            &p.info.prompt_ids,
            row,
            p.info.seeds[0],
            &SoloOptions {
                record: Some(4),
                constraint: None,
                overlap: false,
                speculative: None,
            },
            SpecOptions::default(),
            &mut drafter,
        )
        .unwrap();
        assert_eq!(fast.tokens, plain.tokens, "temperature {temp}");
        let (records, verified, accepted) = unmarked(&fast.records);
        assert_eq!(records, unmarked(&plain.records).0);
        if temp == 0.0 {
            // greedy drafts of the very model are all accepted (every verified one: the end of
            // the last draft may lie past `max_tokens`, where nothing is verified)
            assert_eq!(accepted, verified, "{:?}", fast.spec);
            assert!(accepted > 0);
        }
    }
}

#[test]
fn rejection_mode_is_reproducible_and_marks_its_draws() {
    let Some(model) = model() else {
        eprintln!("skipped: the default model is not in the test data");
        return;
    };
    let engine = Engine::new(model.clone(), EngineConfig::default()).unwrap();
    let spec = SpecOptions {
        acceptance: Acceptance::Rejection,
        ..Default::default()
    };
    // greedy: the rule selects the argmax, so the tokens are plain decoding's
    let greedy = request(
        COPY,
        SamplingParams {
            temperature: Some(0.0),
            max_tokens: Some(30),
            seed: Some(3),
            ..Default::default()
        },
    );
    let plain = run(&engine, &model, &greedy, None);
    let fast = run(&engine, &model, &greedy, Some(spec));
    assert_eq!(fast.tokens, plain.tokens);
    assert!(fast.spec.accepted > 0, "{:?}", fast.spec);

    // sampled: the same request twice gives the same tokens and records
    let sampled = request(
        COPY,
        SamplingParams {
            temperature: Some(0.9),
            max_tokens: Some(30),
            seed: Some(11),
            ..Default::default()
        },
    );
    let a = run(&engine, &model, &sampled, Some(spec));
    let b = run(&engine, &model, &sampled, Some(spec));
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(
        serde_json::to_string(&a.records).unwrap(),
        serde_json::to_string(&b.records).unwrap()
    );
    let marks: Vec<_> = a.records.iter().filter_map(|r| r.draft.clone()).collect();
    assert!(!marks.is_empty(), "the copy prompt drafts");
    for d in &marks {
        assert_eq!(d.rule, nextok_core::DraftRule::Rejection);
        assert!(d.accept_u.is_some());
        assert_eq!(d.residual_u.is_some(), !d.accepted);
    }
    assert_eq!(marks.iter().filter(|d| d.accepted).count(), a.spec.accepted);
    // the batched engine runs the same rule: same tokens and records
    let mut r = sampled.clone();
    r.records = Some(4);
    r.speculative = Some(spec);
    let c = engine.generate(r).expect("engine run");
    assert_eq!(c.sequences[0].tokens, a.tokens);
    assert_eq!(
        serde_json::to_string(&c.sequences[0].records).unwrap(),
        serde_json::to_string(&a.records).unwrap()
    );
}

#[test]
fn speculative_options_are_checked() {
    let Some(model) = model() else {
        eprintln!("skipped: the default model is not in the test data");
        return;
    };
    let engine = Engine::new(model.clone(), EngineConfig::default()).unwrap();
    for (spec, field) in [
        (
            SpecOptions {
                max_draft: 0,
                ..Default::default()
            },
            "speculative.max_draft",
        ),
        (
            SpecOptions {
                max_draft: 1 << 40,
                ..Default::default()
            },
            "speculative.max_draft",
        ),
        (
            SpecOptions {
                ngram: nextok_engine::speculative::NgramDrafter {
                    max_ngram: 2,
                    min_ngram: 3,
                },
                ..Default::default()
            },
            "speculative.ngram.min_ngram",
        ),
    ] {
        let mut r = request(COPY, SamplingParams::default());
        r.speculative = Some(spec);
        let e = engine.submit(r).expect_err("refused");
        assert_eq!(e.field(), Some(field), "{e}");
    }
}

#[test]
fn the_batched_engine_drafts_with_a_draft_model() {
    let Some(model) = model() else {
        eprintln!("skipped: the default model is not in the test data");
        return;
    };
    // the model drafting for itself
    let engine =
        Engine::with_draft_model(model.clone(), model.clone(), EngineConfig::default()).unwrap();
    let plain_engine = Engine::new(model.clone(), EngineConfig::default()).unwrap();
    for (temp, seed) in [(0.0f32, 1u64), (0.8, 2)] {
        let mut r = request(
            COPY,
            SamplingParams {
                temperature: Some(temp),
                max_tokens: Some(20),
                seed: Some(seed),
                ..Default::default()
            },
        );
        r.records = Some(3);
        let plain = outcome(&plain_engine.generate(r.clone()).expect("plain"));
        r.speculative = Some(SpecOptions {
            drafter: nextok_engine::speculative::DrafterKind::Model,
            max_draft: 4,
            ..Default::default()
        });
        let before = engine.stats();
        let fast = outcome(&engine.generate(r.clone()).expect("drafted"));
        assert_eq!(fast, plain, "temperature {temp}");
        let after = engine.stats();
        assert!(after.draft_tokens > before.draft_tokens, "{after:?}");
        if temp == 0.0 {
            // greedy drafts of the very model are all accepted
            assert_eq!(
                after.accepted_draft_tokens - before.accepted_draft_tokens,
                after.draft_tokens - before.draft_tokens
            );
        }
        // an engine without a draft model refuses the `model` drafter, naming the field
        let e = plain_engine.submit(r).expect_err("no draft model");
        assert_eq!(e.field(), Some("speculative.drafter"));
    }
}

/// A toy language model over the real vocabulary: the logits after a context depend only on
/// its last two tokens, a hash of which ranks a few dozen word tokens (every other token sits
/// far below). Outputs repeat themselves, so prompt lookup's drafts are often right, and sampled
/// runs still leave them, which is what the property below needs; and it costs microseconds
/// per row, so it can run many cases.
#[derive(Clone)]
struct Toy {
    words: Arc<Vec<u32>>,
    vocab: usize,
    ctx: Vec<u32>,
}

impl Toy {
    fn row(&self) -> Vec<f32> {
        let n = self.ctx.len();
        let (a, b) = (
            self.ctx.get(n.wrapping_sub(2)).copied().unwrap_or(0) as u64,
            self.ctx.last().copied().unwrap_or(0) as u64,
        );
        let mut row = vec![-30.0f32; self.vocab];
        for (i, &w) in self.words.iter().enumerate() {
            let mut h = a
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(b.wrapping_mul(0xC2B2_AE3D_27D4_EB4F))
                .wrapping_add(i as u64 + 1);
            h ^= h >> 29;
            h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            h ^= h >> 32;
            row[w as usize] = (h % 1024) as f32 / 128.0;
        }
        row
    }
}

impl LogitsSource for Toy {
    fn vocab_size(&self) -> usize {
        self.vocab
    }
    fn prefill(&mut self, ids: &[u32]) -> nextok_model::Result<Vec<f32>> {
        self.ctx.extend_from_slice(ids);
        Ok(self.row())
    }
    fn decode_one(&mut self, token: u32) -> nextok_model::Result<Vec<f32>> {
        self.ctx.push(token);
        Ok(self.row())
    }
    fn fork(&self) -> nextok_model::Result<Self> {
        Ok(self.clone())
    }
    fn truncate(&mut self, len: usize) -> nextok_model::Result<()> {
        assert!(len <= self.ctx.len(), "truncate past the end");
        self.ctx.truncate(len);
        Ok(())
    }
    fn len(&self) -> usize {
        self.ctx.len()
    }
}

/// [`run`] on the toy model.
fn run_toy(
    engine: &Engine,
    model: &Model,
    words: &Arc<Vec<u32>>,
    req: &GenerateRequest,
    spec: Option<SpecOptions>,
) -> SoloOutput {
    let toy = Toy {
        words: words.clone(),
        vocab: model.vocab.bytes.len(),
        ctx: Vec::new(),
    };
    run_on(engine, model, req, spec, toy)
}

/// The toy model's word tokens: the distinct tokens of [`TOY_TEXT`].
fn toy_words(model: &Model) -> Arc<Vec<u32>> {
    let mut w = model.encoder.encode(TOY_TEXT, false).expect("encodes");
    w.sort_unstable();
    w.dedup();
    Arc::new(w)
}

const TOY_TEXT: &str =
    " the cat sat on a mat and the dog ran to the red box, then it said yes no maybe 1 2 3.";

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 48, failure_persistence: None, ..Default::default() })]

    /// Speculative decoding in `exact` mode equals plain decoding token for token, record for
    /// record (draft marks aside) and in its finish reason, over random seeds, prompts,
    /// temperatures, pipelines, penalties, constraints, stop strings, output limits and draft
    /// lengths.
    #[test]
    fn exact_speculation_equals_plain_decoding(
        seed in 0u64..1_000_000,
        prompt in proptest::collection::vec(0usize..64, 1..40),
        t in 0usize..4,
        preset in 0usize..4,
        penalties in 0usize..3,
        constraint in 0usize..4,
        stop in 0usize..3,
        max_tokens in 1u64..48,
        max_draft in 1usize..9,
    ) {
        let Some(model) = model() else { return Ok(()) };
        static WORDS: std::sync::OnceLock<Arc<Vec<u32>>> = std::sync::OnceLock::new();
        let words = WORDS.get_or_init(|| toy_words(&model)).clone();
        static ENGINE: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
        let engine = ENGINE.get_or_init(|| Engine::new(model.clone(), EngineConfig::default()).unwrap());
        let ids: Vec<u32> = prompt.iter().map(|&i| words[i % words.len()]).collect();
        let mut params = SamplingParams {
            temperature: Some([0.0, 0.5, 1.0, 1.6][t]),
            top_p: Some(0.95),
            max_tokens: Some(max_tokens),
            seed: Some(seed),
            ..Default::default()
        };
        match penalties {
            1 => {
                params.presence_penalty = Some(0.4);
                params.frequency_penalty = Some(-0.2);
            }
            2 => params.repetition_penalty = Some(1.3),
            _ => {}
        }
        params.stop = match stop {
            1 => vec![" dog".into()],
            2 => vec!["box, then".into(), " maybe 1".into()],
            _ => vec![],
        };
        let mut req = GenerateRequest::new(Prompt::Ids(ids));
        req.params = params;
        req.pipeline = PipelineChoice::Preset(
            [
                nextok_core::Preset::Reference,
                nextok_core::Preset::Hf,
                nextok_core::Preset::Vllm,
                nextok_core::Preset::LlamaCpp,
            ][preset],
        );
        req.params.constraint = match constraint {
            1 => Some(ConstraintSpec::Regex {
                pattern: "( the| cat| sat| on| a| mat| dog| ran)+( yes| no)?".into(),
            }),
            2 => Some(ConstraintSpec::Choice {
                choices: vec![
                    " the cat sat on a mat".into(),
                    " the cat sat on the red box".into(),
                    " the dog ran".into(),
                ],
            }),
            3 => Some(ConstraintSpec::JsonSchema {
                schema: serde_json::json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
                options: Default::default(),
            }),
            _ => None,
        };
        let plain = run_toy(engine, &model, &words, &req, None);
        let spec = SpecOptions { max_draft, ..Default::default() };
        let fast = run_toy(engine, &model, &words, &req, Some(spec));
        proptest::prop_assert_eq!(&fast.tokens, &plain.tokens);
        proptest::prop_assert_eq!(fast.finish, plain.finish);
        let (records, _, accepted) = unmarked(&fast.records);
        proptest::prop_assert_eq!(records, unmarked(&plain.records).0);
        proptest::prop_assert_eq!(accepted, fast.spec.accepted);
    }
}

/// The toy model gives prompt lookup something to accept: over a few seeds, greedy and
/// sampled, drafts are both accepted and rejected (so the property above exercises rollback
/// as well as acceptance).
#[test]
fn the_toy_model_accepts_and_rejects_drafts() {
    let Some(model) = model() else { return };
    let engine = Engine::new(model.clone(), EngineConfig::default()).unwrap();
    let words = toy_words(&model);
    let (mut accepted, mut rejected) = (0, 0);
    for seed in 0..4 {
        let mut req = GenerateRequest::new(Prompt::Ids(words[..8].to_vec()));
        req.params = SamplingParams {
            temperature: Some(if seed % 2 == 0 { 0.0 } else { 1.0 }),
            max_tokens: Some(40),
            seed: Some(seed),
            ..Default::default()
        };
        let out = run_toy(&engine, &model, &words, &req, Some(SpecOptions::default()));
        accepted += out.spec.accepted;
        rejected += out.spec.drafted - out.spec.accepted;
    }
    assert!(
        accepted > 10 && rejected > 0,
        "accepted {accepted}, rejected {rejected}"
    );
}

#[test]
fn drafts_start_with_the_bytes_the_constraint_forces() {
    let Some(model) = model() else {
        eprintln!("skipped: the default model is not in the test data");
        return;
    };
    let engine = Engine::new(model.clone(), EngineConfig::default()).unwrap();
    // keys the prompt never spells, in the schema's order: prompt lookup alone cannot guess
    // them, the constraint forces them
    let mut r = request(
        "<|im_start|>user\nDescribe an order as JSON.<|im_end|>\n<|im_start|>assistant\n",
        SamplingParams {
            temperature: Some(0.0),
            max_tokens: Some(48),
            seed: Some(3),
            ..Default::default()
        },
    );
    let text = serde_json::json!({"type": "string"});
    r.params.constraint = Some(ConstraintSpec::JsonSchema {
        schema: serde_json::json!({
            "type": "object",
            "properties": {
                "customer_identification_number": {"type": "integer"},
                "preferred_delivery_weekday": text,
                "gift_wrapping_requested": {"type": "boolean"}
            },
            "required": ["customer_identification_number", "preferred_delivery_weekday", "gift_wrapping_requested"],
            "additionalProperties": false
        }),
        options: Default::default(),
    });
    // exact mode: the tokens are plain decoding's either way
    let on = same(&engine, &model, &r, "constraint drafts");
    let off = run(
        &engine,
        &model,
        &r,
        Some(SpecOptions {
            constraint_drafts: false,
            ..Default::default()
        }),
    );
    assert_eq!(off.tokens, on.tokens);
    eprintln!(
        "with constraint drafts {:?}, without {:?}",
        on.spec, off.spec
    );
    assert!(
        on.spec.accepted > off.spec.accepted + 3,
        "the forced keys are drafted and accepted: {:?} against {:?} without",
        on.spec,
        off.spec
    );
    // the batched engine drafts them too, with the same output
    let plain = outcome(&engine.generate(r.clone()).expect("plain run"));
    let before = engine.stats();
    let mut fast = r.clone();
    fast.speculative = Some(SpecOptions::default());
    assert_eq!(
        outcome(&engine.generate(fast).expect("speculative run")),
        plain
    );
    let after = engine.stats();
    assert!(
        after.accepted_draft_tokens - before.accepted_draft_tokens > off.spec.accepted as u64 + 3,
        "{after:?}"
    );
    // a trace header or request that leaves the option out keeps the drafts of before
    let old: SpecOptions = serde_json::from_value(serde_json::json!({
        "max_draft": 5, "ngram": {"max_ngram": 4, "min_ngram": 2}, "acceptance": "exact"
    }))
    .unwrap();
    assert!(!old.constraint_drafts);
    assert_eq!(old.draft_rules, 0);
    assert!(SpecOptions::default().constraint_drafts);
    assert_eq!(SpecOptions::default().draft_rules, SpecOptions::DRAFT_RULES);
    // the drafting rules of 2026-12-07 (forced bytes, then the guess uncut) give the same
    // tokens, in their own number of passes
    let rules0 = run(
        &engine,
        &model,
        &r,
        Some(SpecOptions {
            draft_rules: 0,
            ..Default::default()
        }),
    );
    assert_eq!(rules0.tokens, on.tokens);
    eprintln!("drafting rules 0: {:?}", rules0.spec);
    // rules this build does not know are refused, naming the field
    let future = SpecOptions {
        draft_rules: SpecOptions::DRAFT_RULES + 1,
        ..Default::default()
    };
    let e = future.check().unwrap_err().to_string();
    assert!(e.contains("speculative.draft_rules"), "{e}");
}

/// A drafter that proposes `first` once, then nothing.
struct Once {
    first: Vec<u32>,
    calls: usize,
}

impl nextok_engine::speculative::Drafter for Once {
    fn draft(&mut self, _context: &[u32], k: usize, out: &mut Vec<u32>) {
        out.clear();
        if self.calls == 0 {
            out.extend(self.first.iter().take(k));
        }
        self.calls += 1;
    }
}

#[test]
fn a_guess_that_leaves_the_constraint_is_cut_and_the_forced_key_follows() {
    use nextok_engine::speculative::{draft_next, DraftScratch};
    let Some(model) = model() else {
        eprintln!("skipped: the default model is not in the test data");
        return;
    };
    let engine = Engine::new(model.clone(), EngineConfig::default()).unwrap();
    let mut r = request(
        "<|im_start|>user\nAn order.<|im_end|>\n",
        SamplingParams::default(),
    );
    r.params.constraint = Some(ConstraintSpec::JsonSchema {
        schema: serde_json::json!({
            "type": "object",
            "properties": {
                "customer_identification_number": {"type": "integer"},
                "preferred_delivery_weekday": {"type": "string"},
                "gift_wrapping_requested": {"type": "boolean"}
            },
            "required": ["customer_identification_number", "preferred_delivery_weekday", "gift_wrapping_requested"],
            "additionalProperties": false
        }),
        options: Default::default(),
    });
    let p = engine.prepare(&r).expect("prepares");
    let mut state = p.sampler.new_state(&p.info.prompt_ids, 1).unwrap();
    let compiled = p.constraint.as_ref().expect("a compiled constraint");
    state.set_grammar(Box::new(compiled.start()));
    let slot = state.grammar().expect("a constraint");
    let ids = |t: &str| model.encoder.encode(t, false).unwrap();
    let text = |ids: &[u32]| -> String {
        ids.iter()
            .map(|&i| String::from_utf8_lossy(model.vocab.bytes.get(i).unwrap()).into_owned())
            .collect()
    };
    let mut history = p.info.prompt_ids.clone();
    for t in ids("{\"customer_identification_number\": 42,") {
        slot.with(|e| e.commit(t))
            .expect("the output so far is valid");
        history.push(t);
    }
    // the guess skips a key: the constraint takes its space and quote and refuses the rest
    let guess = ids(" \"gift_wrapping_requested\": true}");
    let mut forced = Vec::new();
    let took = slot.probe(&guess, &mut forced);
    assert_eq!(text(&guess[..took]), " \"");
    assert!(
        forced.starts_with(b"preferred_delivery_weekday\""),
        "{forced:?}"
    );
    let before = history.clone();
    let (mut scratch, mut out) = (DraftScratch::default(), Vec::new());
    let spec = SpecOptions::default();
    let mut once = Once {
        first: guess.clone(),
        calls: 0,
    };
    draft_next(
        &mut once,
        &mut history,
        spec.constraint_source(Some(slot), &model),
        16,
        &mut scratch,
        &mut out,
    );
    assert_eq!(history, before, "the history is left as it was");
    // rules 1: the guess up to the refused token, then the forced key's tokens but the last
    let key = ids("preferred_delivery_weekday\"");
    assert_eq!(text(&out), format!(" \"{}", text(&key[..key.len() - 1])));
    assert_eq!(
        slot.probe(&out, &mut forced),
        out.len(),
        "the constraint takes it all"
    );
    assert_eq!(
        once.calls, 2,
        "the drafter guesses again after the forced key"
    );
    // the draft's length holds
    once.calls = 0;
    draft_next(
        &mut once,
        &mut history,
        spec.constraint_source(Some(slot), &model),
        3,
        &mut scratch,
        &mut out,
    );
    assert_eq!(out.len(), 3);
    assert_eq!(text(&out[..took]), " \"");
    // rules 0: the guess as it comes
    let old = SpecOptions {
        draft_rules: 0,
        ..Default::default()
    };
    once.calls = 0;
    draft_next(
        &mut once,
        &mut history,
        old.constraint_source(Some(slot), &model),
        16,
        &mut scratch,
        &mut out,
    );
    assert_eq!(out, guess);
    // the constraint's state is as it was: it still forces nothing here and takes the space
    assert_eq!(slot.probe(&guess, &mut forced), took);
}
