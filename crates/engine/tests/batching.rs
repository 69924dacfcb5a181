//! Continuous batching on the real model (SmolLM2-135M-Instruct, from the test data): a
//! request's tokens and step records are the same alone and in any batch, whenever it arrives;
//! `n` sequences equal single runs; the prefix cache changes nothing but the time; a preempted
//! request recomputes its cache and changes no token; long streams take the cache as they
//! grow; bad input fails alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nextok_core::SamplingParams;
use nextok_engine::{
    ConstraintSpec, Engine, EngineConfig, ErrorKind, Event, GenerateRequest, Prompt,
};
use nextok_model::{Model, Requant};
use proptest::prelude::*;

fn model() -> Option<Arc<Model>> {
    let path = nextok_testdata::optional(nextok_testdata::SMOLLM2)?;
    static M: std::sync::OnceLock<Arc<Model>> = std::sync::OnceLock::new();
    Some(
        M.get_or_init(|| Arc::new(Model::load(&path, Requant::Keep).expect("model loads")))
            .clone(),
    )
}

const PROMPTS: [&str; 6] = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "List three colours:",
    "def fibonacci(n):",
    "Q: What is 2 + 2?\nA:",
    "<|im_start|>user\nGive me a person as JSON.<|im_end|>\n<|im_start|>assistant\n",
];

fn request(
    prompt: usize,
    seed: u64,
    max_tokens: u64,
    temp: f32,
    constrained: bool,
) -> GenerateRequest {
    let mut r = GenerateRequest::new(Prompt::Text(PROMPTS[prompt % PROMPTS.len()].to_string()));
    r.params = SamplingParams {
        temperature: Some(temp),
        top_p: Some(0.95),
        seed: Some(seed),
        max_tokens: Some(max_tokens),
        ..Default::default()
    };
    if constrained {
        r.params.constraint = Some(ConstraintSpec::JsonSchema {
            schema: serde_json::json!({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]}),
            options: Default::default(),
        });
    }
    r.records = Some(4);
    r
}

/// Tokens and records (as JSON) of every sequence.
fn outcome(c: &nextok_engine::Completion) -> Vec<(Vec<u32>, String, String)> {
    c.sequences
        .iter()
        .map(|s| {
            (
                s.tokens.clone(),
                s.text.clone(),
                serde_json::to_string(&s.records).unwrap(),
            )
        })
        .collect()
}

fn solo(engine: &Engine, r: &GenerateRequest) -> Vec<(Vec<u32>, String, String)> {
    outcome(&engine.generate(r.clone()).expect("solo run"))
}

/// Submits `reqs[i]` once the engine has run `arrive[i]` iterations since the first
/// submission; returns every request's outcome.
fn together(
    engine: &Engine,
    reqs: &[GenerateRequest],
    arrive: &[u64],
) -> Vec<Vec<(Vec<u32>, String, String)>> {
    let start = engine.stats().iterations;
    let mut order: Vec<usize> = (0..reqs.len()).collect();
    order.sort_by_key(|&i| arrive[i]);
    let mut handles: Vec<Option<nextok_engine::RequestHandle>> =
        (0..reqs.len()).map(|_| None).collect();
    // a stall guard only: the loop waits for the engine's iterations, whatever their speed
    let deadline = Instant::now() + Duration::from_secs(300);
    for i in order {
        while engine.stats().iterations < start + arrive[i] && engine.stats().running_seqs > 0 {
            assert!(Instant::now() < deadline, "engine stalled");
            std::thread::sleep(Duration::from_millis(1));
        }
        handles[i] = Some(engine.submit(reqs[i].clone()).expect("submit"));
    }
    handles
        .into_iter()
        .map(|h| outcome(&h.unwrap().collect_all().expect("batched run")))
        .collect()
}

#[test]
fn requests_batched_with_others_equal_their_solo_runs() {
    let Some(m) = model() else { return };
    let engine = Engine::new(
        m,
        EngineConfig {
            max_batch_tokens: 96,
            ..Default::default()
        },
    )
    .unwrap();
    let reqs: Vec<GenerateRequest> = (0..5)
        .map(|i| {
            request(
                i,
                100 + i as u64,
                12,
                if i == 2 { 0.0 } else { 0.9 },
                i == 4,
            )
        })
        .collect();
    let alone: Vec<_> = reqs.iter().map(|r| solo(&engine, r)).collect();
    let batched = together(&engine, &reqs, &[0, 0, 2, 3, 5]);
    for (i, (a, b)) in alone.iter().zip(&batched).enumerate() {
        assert_eq!(a, b, "request {i} differs in a batch");
    }
    // the constrained answer is JSON that starts as the schema says
    assert!(
        alone[4][0].1.trim_start().starts_with('{'),
        "{:?}",
        alone[4][0].1
    );
}

#[test]
fn n_sequences_fork_the_prompt_and_equal_single_runs() {
    let Some(m) = model() else { return };
    let engine = Engine::new(m, EngineConfig::default()).unwrap();
    let mut r = request(1, 7, 10, 1.0, false);
    r.n = 3;
    let all = outcome(&engine.generate(r.clone()).unwrap());
    assert_eq!(all.len(), 3);
    for (i, seq) in all.iter().enumerate() {
        let mut one = r.clone();
        one.n = 1;
        one.params.seed = Some(7 + i as u64);
        assert_eq!(&solo(&engine, &one)[0], seq, "sequence {i}");
    }
    assert_ne!(
        all[0].0, all[1].0,
        "different seeds should give different tokens here"
    );
}

#[test]
fn the_prefix_cache_reuses_a_prompt_and_changes_no_token() {
    let Some(m) = model() else { return };
    let engine = Engine::new(m, EngineConfig::default()).unwrap();
    let r = request(5, 3, 6, 0.7, false);
    let first = engine.generate(r.clone()).unwrap();
    assert_eq!(first.usage.cached_tokens, 0);
    let second = engine.generate(r.clone()).unwrap();
    assert_eq!(second.usage.cached_tokens, second.usage.prompt_tokens - 1);
    assert_eq!(outcome(&first), outcome(&second));
    let off = Engine::new(
        model().unwrap(),
        EngineConfig {
            prefix_cache_entries: 0,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(outcome(&off.generate(r).unwrap()), outcome(&first));
}

#[test]
fn bad_requests_fail_alone_and_the_batch_goes_on() {
    let Some(m) = model() else { return };
    let ctx = m.weights.config.context_length;
    let engine = Engine::new(m, EngineConfig::default()).unwrap();
    let good = request(0, 1, 24, 0.8, false);
    let alone = solo(&engine, &good);
    let h = engine.submit(good.clone()).unwrap();
    // a prompt past the context
    let mut long = GenerateRequest::new(Prompt::Ids(vec![1; ctx + 1]));
    long.params.max_tokens = Some(1);
    let e = engine.submit(long).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::TooLarge);
    assert_eq!(e.field(), Some("prompt"));
    // max_tokens past the context
    let mut big = request(0, 1, ctx as u64, 0.8, false);
    big.params.max_tokens = Some(ctx as u64);
    let e = engine.submit(big).unwrap_err();
    assert_eq!(e.field(), Some("max_tokens"), "{e}");
    // a constraint that does not compile
    let mut bad = request(0, 1, 4, 0.8, false);
    bad.params.constraint = Some(ConstraintSpec::Regex {
        pattern: "(unclosed".into(),
    });
    let e = engine.submit(bad).unwrap_err();
    assert_eq!(e.field(), Some("constraint"), "{e}");
    // more than 20 logprobs per token
    let mut many = request(0, 1, 4, 0.8, false);
    many.logprobs = Some(nextok_engine::LogprobOptions {
        top: 21,
        layer: nextok_core::Layer::Selection,
    });
    let e = engine.submit(many).unwrap_err();
    assert_eq!(e.field(), Some("top_logprobs"), "{e}");
    // an out-of-range id
    let e = engine
        .submit(GenerateRequest::new(Prompt::Ids(vec![1, 999_999])))
        .unwrap_err();
    assert_eq!(e.field(), Some("prompt[1]"), "{e}");
    // a request cancelled mid-prefill: a long prompt, dropped right after submission
    let mut slow = GenerateRequest::new(Prompt::Ids((0..600).map(|i| 100 + i % 500).collect()));
    slow.params.max_tokens = Some(4);
    drop(engine.submit(slow).unwrap());
    let mut h = h;
    let got = outcome(&h.collect_all().unwrap());
    assert_eq!(got, alone);
    // the cancelled request's cache is freed (the wall clock is only a stall guard: the
    // cancelled request stops at the engine's next iteration, however slow that is)
    let deadline = Instant::now() + Duration::from_secs(300);
    while engine.stats().running_seqs > 0 {
        assert!(
            Instant::now() < deadline,
            "engine stalled: {:?}",
            engine.stats()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(engine.stats().kv_bytes_reserved, 0);
}

#[test]
fn a_full_queue_is_its_own_error() {
    let Some(m) = model() else { return };
    let engine = Engine::new(
        m,
        EngineConfig {
            max_num_seqs: 1,
            max_batch_tokens: 16,
            max_waiting: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let mut hs = Vec::new();
    let mut full = None;
    for i in 0..6 {
        match engine.submit(request(i, 1, 32, 0.8, false)) {
            Ok(h) => hs.push(h),
            Err(e) => {
                full = Some(e);
                break;
            }
        }
    }
    let e = full.expect("the queue fills");
    assert_eq!(e.kind(), &ErrorKind::QueueFull);
    for h in &mut hs {
        let mut n = 0;
        for ev in h.by_ref() {
            if matches!(ev, Event::Done { .. }) {
                n += 1;
            }
        }
        assert_eq!(n, 1);
    }
}

/// With a fixed chunk (`itl_target_ms` 0), while another sequence decodes, a prompt advances
/// by at most `prefill_chunk_tokens` rows per forward pass (so that sequence's tokens keep
/// coming); alone it goes in one pass.
#[test]
fn a_prompt_takes_bounded_chunks_while_another_stream_decodes() {
    let Some(m) = model() else { return };
    let config = EngineConfig {
        max_num_seqs: 4,
        prefill_chunk_tokens: 2,
        itl_target_ms: 0,
        prefix_cache_entries: 0,
        ..Default::default()
    };
    let engine = Engine::new(m, config).unwrap();
    let b = request(5, 9, 1, 0.0, false);
    let pb = engine.prepare(&b).unwrap().info.prompt_ids.len() as u64;
    assert!(
        pb >= 16,
        "the prompt is long enough to tell chunks apart: {pb}"
    );
    // the forward passes that ran the request's rows, as the engine counts them
    let passes = |engine: &Engine| engine.generate(b.clone()).unwrap().timing.forward_passes;
    assert_eq!(passes(&engine), 1, "alone, the prompt goes in one pass");
    let mut a = request(0, 1, 200, 0.0, false);
    a.params.ignore_eos = true;
    let mut ha = engine.submit(a).unwrap();
    for ev in ha.by_ref() {
        if matches!(ev, Event::Token { .. }) {
            break;
        }
    }
    let n = passes(&engine);
    assert_eq!(
        n as u64,
        pb.div_ceil(2),
        "{n} passes for a {pb}-token prompt in chunks of 2 beside a decoding stream"
    );
    drop(ha);
}

/// With a target inter-token latency, the chunk is sized from how long passes take: on a model
/// whose passes take far less than the target, a prompt beside a decoding stream goes in one
/// or two passes instead of chunks of `prefill_chunk_tokens` (which is then only the least
/// chunk), and its tokens are those of its solo run.
#[test]
fn a_paced_chunk_fills_the_target_latency() {
    let Some(m) = model() else { return };
    let config = EngineConfig {
        max_num_seqs: 4,
        prefill_chunk_tokens: 2,
        itl_target_ms: 10_000,
        prefix_cache_entries: 0,
        ..Default::default()
    };
    let engine = Engine::new(m, config).unwrap();
    let b = request(5, 9, 4, 0.0, false);
    let pb = engine.prepare(&b).unwrap().info.prompt_ids.len() as u64;
    assert!(
        pb >= 16,
        "the prompt is long enough to tell chunks apart: {pb}"
    );
    let alone = engine.generate(b.clone()).unwrap();
    let mut a = request(0, 1, 400, 0.0, false);
    a.params.ignore_eos = true;
    let mut ha = engine.submit(a).unwrap();
    // enough passes measured for the pace to be used
    let mut seen = 0;
    for ev in ha.by_ref() {
        if matches!(ev, Event::Token { .. }) {
            seen += 1;
            if seen == 8 {
                break;
            }
        }
    }
    let beside = engine.generate(b.clone()).unwrap();
    let n = beside.timing.forward_passes;
    // alone: one pass for the prompt and one per further token; beside a decoding stream the
    // prompt may take one more (chunks of 2 would take 8 or more)
    let solo = alone.timing.forward_passes;
    assert!(
        n <= solo + 1,
        "{n} passes for a {pb}-token prompt and its tokens beside a decoding stream, {solo} alone"
    );
    assert_eq!(alone.sequences[0].tokens, beside.sequences[0].tokens);
    drop(ha);
}

/// Each scheduling limit that cannot work is refused by name.
#[test]
fn an_engine_config_that_cannot_schedule_is_refused_by_field() {
    let Some(m) = model() else { return };
    let bad = [
        (
            EngineConfig {
                max_num_seqs: 0,
                ..Default::default()
            },
            "max_num_seqs",
        ),
        (
            EngineConfig {
                max_num_seqs: 64,
                max_batch_tokens: 63,
                ..Default::default()
            },
            "max_batch_tokens",
        ),
        (
            EngineConfig {
                prefill_chunk_tokens: 0,
                ..Default::default()
            },
            "prefill_chunk_tokens",
        ),
        (
            EngineConfig {
                itl_target_ms: 600_001,
                ..Default::default()
            },
            "itl_target_ms",
        ),
        (
            EngineConfig {
                kv_budget_bytes: 1,
                ..Default::default()
            },
            "kv_budget_bytes",
        ),
        (
            EngineConfig {
                default_max_tokens: Some(0),
                ..Default::default()
            },
            "default_max_tokens",
        ),
        (
            EngineConfig {
                default_max_tokens: Some(100),
                max_tokens_limit: Some(10),
                ..Default::default()
            },
            "default_max_tokens",
        ),
    ];
    for (config, field) in bad {
        let Err(e) = Engine::new(m.clone(), config) else {
            panic!("a config with a bad {field} was accepted")
        };
        assert_eq!(e.kind(), &ErrorKind::InvalidRequest, "{field}");
        assert_eq!(e.field(), Some(field), "{e}");
    }
    // the smallest limits that can work run a request to its end
    let engine = Engine::new(
        m,
        EngineConfig {
            max_num_seqs: 1,
            max_batch_tokens: 1,
            prefill_chunk_tokens: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let c = engine.generate(request(1, 3, 3, 0.8, false)).unwrap();
    assert_eq!(c.sequences[0].tokens.len(), 3);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random sets of 1–8 requests with random prompts, arrival steps, parameters and
    /// constraints: every request's tokens and step records equal its solo run.
    #[test]
    fn any_mix_of_requests_equals_solo_runs(
        specs in prop::collection::vec((0usize..6, 0u64..1000, 1u64..10, 0usize..3, prop::bool::weighted(0.25), 0u64..8), 1..=8),
        chunk in prop::sample::select(vec![8usize, 32, 512]),
        prefill_chunk in prop::sample::select(vec![1usize, 7, 64]),
    ) {
        let Some(m) = model() else { return Ok(()) };
        let config = EngineConfig {
            max_num_seqs: 8,
            max_batch_tokens: chunk,
            prefill_chunk_tokens: prefill_chunk,
            ..Default::default()
        };
        let engine = Engine::new(m, config).unwrap();
        let reqs: Vec<GenerateRequest> = specs
            .iter()
            .map(|&(p, seed, max, t, c, _)| request(p, seed, max, [0.0, 0.7, 1.3][t], c))
            .collect();
        let arrive: Vec<u64> = specs.iter().map(|s| s.5).collect();
        let alone: Vec<_> = reqs.iter().map(|r| solo(&engine, r)).collect();
        let batched = together(&engine, &reqs, &arrive);
        for (i, (a, b)) in alone.iter().zip(&batched).enumerate() {
            prop_assert_eq!(a, b, "request {} differs in a batch", i);
        }
    }
}

/// A relaxed JSON-schema constraint: the trace header records the mode (in
/// `params.constraint`) and the keyword report, replay gets the same constraint back, and the
/// request info checks an output against the full schema.
#[test]
fn the_trace_header_records_the_schema_mode_and_report() {
    let Some(m) = model() else { return };
    let engine = Engine::new(m.clone(), EngineConfig::default()).unwrap();
    let mut req = request(5, 3, 4, 0.0, false);
    req.params.constraint = Some(ConstraintSpec::JsonSchema {
        schema: serde_json::json!({"type": "array", "items": {"type": "integer"},
                                   "uniqueItems": true}),
        options: nextok_constraint::JsonOptions {
            schema_mode: nextok_constraint::SchemaMode::Relaxed,
            ..Default::default()
        },
    });
    let p = engine.prepare(&req).unwrap();
    let h = nextok_engine::trace::TraceHeader::new(&p.info, &m, "reference", 0);
    let v = serde_json::to_value(&h).unwrap();
    assert_eq!(
        v["params"]["constraint"]["options"]["schema_mode"],
        "relaxed"
    );
    assert_eq!(v["schema"]["mode"], "relaxed");
    // relaxed mode takes object properties in any order (nothing to reorder here)
    assert_eq!(v["schema"]["property_order"], "any");
    assert_eq!(v["schema"]["post_validation"][0]["keyword"], "uniqueItems");
    let text = serde_json::to_string(&h).unwrap();
    let (back, _) = nextok_engine::trace::parse(&text).unwrap();
    let again = nextok_engine::trace::replay_request(&back).unwrap();
    let spec: ConstraintSpec = again
        .params
        .constraint
        .clone()
        .expect("replay lost the constraint");
    assert_eq!(Some(spec), req.params.constraint);
    assert_eq!(p.info.validate_output("[1, 2]").unwrap().valid, Some(true));
    assert_eq!(p.info.validate_output("[1, 1]").unwrap().valid, Some(false));
}

/// The bytes of one KV cache block of the test model.
fn block_bytes(m: &Model) -> usize {
    let c = &m.weights.config;
    nextok_model::KvGeometry {
        n_layer: c.n_layer,
        n_kv_head: c.n_kv_head,
        head_dim: c.head_dim,
        dtype: nextok_model::KvCacheType::F16,
    }
    .block_bytes()
}

/// With a KV budget that cannot hold every running sequence at its full length, the engine
/// preempts (frees a request's cache and recomputes it when the request resumes) instead of
/// stopping: every request, `n = 2` and a constrained one among them, still gives exactly its
/// solo run's tokens and records.
#[test]
fn preempted_requests_recompute_and_change_no_token() {
    let Some(m) = model() else { return };
    let blocks = 14;
    let engine = Engine::new(
        m.clone(),
        EngineConfig {
            kv_budget_bytes: blocks * block_bytes(&m),
            max_batch_tokens: 96,
            ..Default::default()
        },
    )
    .unwrap();
    let reqs: Vec<GenerateRequest> = (0..4)
        .map(|i| {
            let mut r = request(i, 300 + i as u64, 64, 0.9, i == 3);
            r.params.ignore_eos = true;
            if i == 1 {
                r.n = 2;
            }
            r
        })
        .collect();
    let alone: Vec<_> = reqs.iter().map(|r| solo(&engine, r)).collect();
    assert_eq!(engine.stats().preemptions, 0, "a request alone always fits");
    let batched = together(&engine, &reqs, &[0, 0, 1, 2]);
    for (i, (a, b)) in alone.iter().zip(&batched).enumerate() {
        assert_eq!(a, b, "request {i} differs after preemption");
    }
    let st = engine.stats();
    assert!(st.preemptions > 0, "the budget never ran out: {st:?}");
    assert_eq!(st.running_seqs, 0);
    assert_eq!(st.kv_bytes_reserved, 0);
    assert!(st.kv_bytes_in_use <= blocks * block_bytes(&m), "{st:?}");
}

/// Requests without `max_tokens` (to the end of the context) take cache blocks as they grow
/// instead of reserving the whole context at admission, so they do not hold back a short
/// request that arrives after them.
#[test]
fn long_streams_do_not_hold_back_a_short_request() {
    let Some(m) = model() else { return };
    let ctx = m.weights.config.context_length;
    // room for two whole contexts and a little: the third stream (and the short request
    // behind it) used to wait for one of the first two to end
    let per_ctx = ctx.div_ceil(16);
    let engine = Engine::new(
        m.clone(),
        EngineConfig {
            kv_budget_bytes: (2 * per_ctx + per_ctx / 4) * block_bytes(&m),
            ..Default::default()
        },
    )
    .unwrap();
    let mut hogs = Vec::new();
    for i in 0..3 {
        let mut r = request(i, 400 + i as u64, 1, 0.9, false);
        r.params.max_tokens = None;
        r.params.ignore_eos = true;
        r.records = None;
        hogs.push(engine.submit(r).expect("a long stream is accepted"));
    }
    let mut short = request(2, 7, 4, 0.0, false);
    short.records = None;
    // The short request needs a few engine iterations (its prefill and 4 tokens); held back,
    // it would wait for a stream to reach the end of the context (thousands of iterations).
    // The wait is bounded in iterations, not seconds; the wall clock is only a stall guard,
    // for an engine that stops iterating.
    const MOST_ITERATIONS: u64 = 64;
    let before = engine.stats().iterations;
    let stall = Instant::now() + Duration::from_secs(600);
    let mut h = engine.submit(short).expect("submit");
    // asked every 100 ms: a few iterations may run past the bound before it is seen
    let c = h.collect_until(|| {
        engine.stats().iterations > before + MOST_ITERATIONS || Instant::now() > stall
    });
    let waited = engine.stats().iterations - before;
    let c = match c {
        Ok(c) => c,
        Err(e) => {
            drop(hogs);
            panic!(
                "the short request got no answer in {MOST_ITERATIONS} engine iterations \
                 beside 3 long streams ({waited} ran): {e}"
            );
        }
    };
    assert_eq!(c.sequences[0].tokens.len(), 4);
    // ... while the three streams are still running (the short one may not be counted out yet)
    let st = engine.stats();
    assert!(st.running_seqs >= 3, "{st:?}");
    assert_eq!(st.waiting_requests, 0, "{st:?}");
    eprintln!("the short request finished within {waited} engine iterations beside 3 streams");
    drop(hogs);
}

/// A server's `max_tokens` default applies to requests that set none, and its limit refuses
/// larger ones by field.
#[test]
fn the_max_tokens_default_and_limit_are_the_engines() {
    let Some(m) = model() else { return };
    let engine = Engine::new(
        m,
        EngineConfig {
            default_max_tokens: Some(3),
            max_tokens_limit: Some(5),
            ..Default::default()
        },
    )
    .unwrap();
    let mut r = request(0, 1, 1, 0.0, false);
    r.params.max_tokens = None;
    r.params.ignore_eos = true;
    assert_eq!(engine.prepare(&r).unwrap().info.max_tokens, 3);
    r.params.max_tokens = Some(5);
    assert_eq!(engine.prepare(&r).unwrap().info.max_tokens, 5);
    r.params.max_tokens = Some(6);
    let e = engine.prepare(&r).unwrap_err();
    assert_eq!(e.field(), Some("max_tokens"), "{e}");
}

/// The cache of compiled constraints is bounded by count and by bytes: least recently used go
/// first, and a constraint larger than the byte bound alone is used but not kept.
#[test]
fn the_constraint_cache_is_bounded_by_count_and_bytes() {
    let Some(m) = model() else { return };
    let schema = |i: usize| ConstraintSpec::JsonSchema {
        schema: serde_json::json!({"type": "object", "properties": {format!("k{i}"): {"type": "integer"}}, "required": [format!("k{i}")]}),
        options: Default::default(),
    };
    let req = |i: usize| {
        let mut r = request(0, 1, 4, 0.0, false);
        r.params.constraint = Some(schema(i));
        r
    };
    let engine = Engine::new(m.clone(), EngineConfig::default()).unwrap();
    for i in 0..70 {
        engine.prepare(&req(i)).unwrap();
    }
    let st = engine.stats();
    assert_eq!(st.constraint_cache_entries, 64, "{st:?}");
    assert!(st.constraint_cache_bytes > 0);
    let one = st.constraint_cache_bytes / 64;
    // room for about three: never more bytes than the bound
    let bound = 3 * one + one / 2;
    let engine = Engine::new(
        m.clone(),
        EngineConfig {
            constraint_cache_bytes: bound,
            ..Default::default()
        },
    )
    .unwrap();
    for i in 0..10 {
        engine.prepare(&req(i)).unwrap();
        let st = engine.stats();
        assert!(st.constraint_cache_bytes <= bound, "{st:?}");
        assert!(st.constraint_cache_entries <= 4, "{st:?}");
    }
    // too large to keep: compiled for its request, not kept
    let engine = Engine::new(
        m,
        EngineConfig {
            constraint_cache_bytes: 1,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(engine.prepare(&req(0)).unwrap().constraint.is_some());
    assert_eq!(engine.stats().constraint_cache_entries, 0);
}
