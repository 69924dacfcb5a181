//! The engine on every supported family (the tiny seeded models of `crates/model/tests`, each
//! with a small SentencePiece vocabulary): a request's tokens and step records are the same
//! alone and batched with others arriving at different iterations, `n` sequences fork the
//! prompt and equal single runs, the prefix cache changes no token, and a KV budget too small
//! for everyone preempts and recomputes without changing a token; speculative decoding (prompt
//! lookup and a draft model) changes no token or record, and a trace replays bit for bit on an
//! engine of its own.

#[path = "../../model/tests/common/mod.rs"]
mod common;
mod marks;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::tiny::{Tiny, SEED};
use nextok_core::SamplingParams;
use nextok_engine::speculative::{DrafterKind, SpecOptions};
use nextok_engine::trace::{compare, parse, replay_request, TraceHeader};
use nextok_engine::{Engine, EngineConfig, GenerateRequest, Prompt};
use nextok_model::{KvCacheType, KvGeometry, Model, Requant};

fn model(tiny: &Tiny) -> Arc<Model> {
    let dir = std::env::temp_dir().join(format!("nextok-engine-families-{}", std::process::id()));
    let path = tiny.write_to(&dir, &tiny.tensors(SEED));
    Arc::new(Model::load(&path, Requant::Keep).expect("tiny model loads"))
}

fn request(salt: u32, seed: u64, n: usize) -> GenerateRequest {
    let ids: Vec<u32> = (0..9).map(|i| 3 + (i * 29 + salt * 13) % 300).collect();
    let mut r = GenerateRequest::new(Prompt::Ids(ids));
    r.params = SamplingParams {
        temperature: Some(0.9),
        top_p: Some(0.95),
        seed: Some(seed),
        max_tokens: Some(20),
        ignore_eos: true,
        ..Default::default()
    };
    r.n = n;
    r.records = Some(3);
    r
}

type Outcome = Vec<(Vec<u32>, String)>;

fn outcome(c: &nextok_engine::Completion) -> Outcome {
    c.sequences
        .iter()
        .map(|s| (s.tokens.clone(), serde_json::to_string(&s.records).unwrap()))
        .collect()
}

/// Submits `reqs[i]` once the engine has run `arrive[i]` iterations; every request's outcome.
fn together(engine: &Engine, reqs: &[GenerateRequest], arrive: &[u64]) -> Vec<Outcome> {
    let start = engine.stats().iterations;
    // a stall guard only: the loop waits for the engine's iterations, whatever their speed
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut handles = Vec::new();
    for (r, &at) in reqs.iter().zip(arrive) {
        while engine.stats().iterations < start + at && engine.stats().running_seqs > 0 {
            assert!(Instant::now() < deadline, "engine stalled");
            std::thread::sleep(Duration::from_millis(1));
        }
        handles.push(engine.submit(r.clone()).expect("submit"));
    }
    handles
        .into_iter()
        .map(|mut h| outcome(&h.collect_all().expect("batched run")))
        .collect()
}

#[test]
fn every_family_batches_forks_caches_and_preempts_without_changing_a_token() {
    for tiny in Tiny::all() {
        let name = tiny.arch.name();
        let m = model(&tiny);
        let reqs: Vec<GenerateRequest> = (0..4)
            .map(|i| request(i, 40 + i as u64, if i == 1 { 2 } else { 1 }))
            .collect();
        let engine = Engine::new(
            m.clone(),
            EngineConfig {
                max_batch_tokens: 16,
                max_num_seqs: 8,
                prefill_chunk_tokens: 4,
                ..Default::default()
            },
        )
        .unwrap();
        let alone: Vec<Outcome> = reqs
            .iter()
            .map(|r| outcome(&engine.generate(r.clone()).unwrap()))
            .collect();
        // n = 2: the second sequence is the single run with the next seed
        let mut second = reqs[1].clone();
        second.n = 1;
        second.params.seed = Some(42);
        assert_eq!(
            outcome(&engine.generate(second).unwrap())[0],
            alone[1][1],
            "{name}: n = 2"
        );
        // the prompts are cached now: the same tokens from cached prefixes
        let again = engine.generate(reqs[0].clone()).unwrap();
        assert!(again.usage.cached_tokens > 0, "{name}: nothing cached");
        assert_eq!(outcome(&again), alone[0], "{name}: prefix cache");
        let batched = together(&engine, &reqs, &[0, 0, 2, 5]);
        assert_eq!(alone, batched, "{name}: batched");
        // a budget of a few blocks: sequences are preempted and recomputed
        let c = &m.weights.config;
        let block = KvGeometry {
            n_layer: c.n_layer,
            n_kv_head: c.n_kv_head,
            head_dim: c.head_dim,
            dtype: KvCacheType::F16,
        }
        .block_bytes();
        let tight = Engine::new(
            m.clone(),
            EngineConfig {
                kv_budget_bytes: 6 * block,
                max_batch_tokens: 16,
                max_num_seqs: 8,
                prefill_chunk_tokens: 4,
                prefix_cache_entries: 0,
                ..Default::default()
            },
        )
        .unwrap();
        // a tiny model runs a request's 20 tokens in a few milliseconds: on a loaded machine
        // this thread may be descheduled while the first requests finish, and nothing then
        // needs preempting. Every run must equal the solo runs; until one has preempted, the
        // requests are submitted again (at most five times).
        for attempt in 1..=5 {
            let preempted = together(&tight, &reqs, &[0, 0, 1, 1]);
            assert_eq!(alone, preempted, "{name}: preempted (attempt {attempt})");
            if tight.stats().preemptions > 0 {
                break;
            }
        }
        assert!(tight.stats().preemptions > 0, "{name}: {:?}", tight.stats());
        eprintln!("{name}: batched, forked, cached and preempted runs equal the solo runs");
    }
}

/// Each sequence's tokens and records without their draft marks ([`marks::unmarked`]), and how
/// many tokens were drafted and how many of those accepted.
fn unmarked(c: &nextok_engine::Completion) -> (Vec<(Vec<u32>, String)>, usize, usize) {
    let (mut drafted, mut accepted) = (0, 0);
    let seqs = c
        .sequences
        .iter()
        .map(|s| {
            let (records, d, a) = marks::unmarked(&s.records);
            drafted += d;
            accepted += a;
            (s.tokens.clone(), records)
        })
        .collect();
    (seqs, drafted, accepted)
}

#[test]
fn every_family_speculates_without_changing_a_token_and_replays_its_traces() {
    for tiny in Tiny::all() {
        let name = tiny.arch.name();
        let m = model(&tiny);
        let config = EngineConfig {
            max_batch_tokens: 16,
            max_num_seqs: 8,
            prefill_chunk_tokens: 4,
            ..Default::default()
        };
        // the model drafting for itself: its greedy drafts are all accepted at temperature 0
        let engine = Engine::with_draft_model(m.clone(), m.clone(), config.clone()).unwrap();
        for (temp, seed) in [(0.0f32, 3u64), (0.9, 4)] {
            let mut r = request(2, seed, if temp == 0.0 { 1 } else { 2 });
            r.params.temperature = Some(temp);
            r.records = Some(4);
            let plain = engine.generate(r.clone()).expect("plain run");
            for drafter in [DrafterKind::Ngram, DrafterKind::Model] {
                let mut fast = r.clone();
                fast.speculative = Some(SpecOptions {
                    drafter,
                    max_draft: 4,
                    ..Default::default()
                });
                let got = engine.generate(fast.clone()).expect("speculative run");
                let (seqs, drafted, accepted) = unmarked(&got);
                assert_eq!(
                    seqs,
                    unmarked(&plain).0,
                    "{name}: {drafter:?} at temperature {temp}"
                );
                if drafter == DrafterKind::Model {
                    assert!(drafted > 0, "{name}: nothing drafted");
                    if temp == 0.0 {
                        assert_eq!(accepted, drafted, "{name}: greedy drafts of itself");
                    }
                }
                // the trace of the speculative run replays bit for bit (draft marks included)
                // on an engine of its own
                let p = engine.prepare(&fast).unwrap();
                let header =
                    TraceHeader::new(&p.info, &m, "reference", 4).with_draft_model(Some(&m));
                let mut text = serde_json::to_string(&header).unwrap();
                for s in &got.sequences {
                    for rec in &s.records {
                        text.push('\n');
                        text.push_str(&serde_json::to_string(rec).unwrap());
                    }
                }
                let (back, recorded) = parse(&text).unwrap();
                assert_eq!(back.model_sha256, m.sha256);
                let again = replay_request(&back).unwrap();
                let fresh = Engine::with_draft_model(m.clone(), m.clone(), config.clone()).unwrap();
                let run = fresh.generate(again).expect("replay");
                let steps: usize = got.sequences.iter().map(|s| s.records.len()).sum();
                assert_eq!(
                    compare(&back, &fresh.numerics(), &recorded, &run),
                    Ok(steps),
                    "{name}: replay"
                );
            }
        }
        eprintln!("{name}: speculative runs equal plain runs; their traces replay");
    }
}

/// A `q8_0` KV cache: refused by name for heads that are not a multiple of 32 wide (its blocks
/// run along a head); otherwise a request's tokens are the same alone and batched, its trace
/// records the cache type and replays bit for bit on an engine with the same cache, and an
/// `f16` engine's replay of it differs.
#[test]
fn every_family_runs_a_q8_0_cache_where_its_heads_allow() {
    let wide = Tiny::wide(nextok_model::Arch::Llama);
    let families: Vec<Tiny> = Tiny::all().into_iter().chain([wide]).collect();
    let mut ran = 0;
    for tiny in families {
        let name = format!("{} (head {})", tiny.arch.name(), tiny.head_dim());
        let m = model(&tiny);
        let config = EngineConfig {
            max_batch_tokens: 16,
            max_num_seqs: 8,
            prefill_chunk_tokens: 4,
            kv_cache_type: KvCacheType::Q8_0,
            ..Default::default()
        };
        if !m.weights.config.head_dim.is_multiple_of(32) {
            let Err(e) = Engine::new(m.clone(), config) else {
                panic!("{name}: a q8_0 cache was accepted")
            };
            assert_eq!(e.field(), Some("kv_cache_type"), "{name}: {e}");
            assert!(e.to_string().contains("multiple of 32"), "{name}: {e}");
            continue;
        }
        let engine = Engine::new(m.clone(), config.clone()).unwrap();
        let mut reqs: Vec<GenerateRequest> =
            (0..4).map(|i| request(i, 40 + u64::from(i), 1)).collect();
        for r in &mut reqs {
            r.params.temperature = Some(0.9);
            r.records = Some(4);
        }
        let alone: Vec<Outcome> = reqs
            .iter()
            .map(|r| outcome(&engine.generate(r.clone()).unwrap()))
            .collect();
        assert_eq!(
            together(&engine, &reqs, &[0, 1, 3, 3]),
            alone,
            "{name}: batched"
        );
        let got = engine.generate(reqs[0].clone()).unwrap();
        let p = engine.prepare(&reqs[0]).unwrap();
        let header = TraceHeader::new(&p.info, &m, "reference", 4);
        assert_eq!(header.kv_cache, "q8_0");
        let mut text = serde_json::to_string(&header).unwrap();
        for rec in &got.sequences[0].records {
            text.push('\n');
            text.push_str(&serde_json::to_string(rec).unwrap());
        }
        let (back, recorded) = parse(&text).unwrap();
        assert_eq!(back.kv_cache().unwrap(), KvCacheType::Q8_0);
        let steps = got.sequences[0].records.len();
        let fresh = Engine::new(m.clone(), config.clone()).unwrap();
        let run = fresh.generate(replay_request(&back).unwrap()).unwrap();
        assert_eq!(
            compare(&back, &fresh.numerics(), &recorded, &run),
            Ok(steps),
            "{name}: replay"
        );
        // the same request on an f16 cache: other logits, caught at the first step
        let f16 = Engine::new(
            m.clone(),
            EngineConfig {
                kv_cache_type: KvCacheType::F16,
                ..config
            },
        )
        .unwrap();
        let other = f16.generate(replay_request(&back).unwrap()).unwrap();
        assert!(
            compare(&back, &f16.numerics(), &recorded, &other).is_err(),
            "{name}: f16 replays q8_0"
        );
        ran += 1;
        eprintln!("{name}: q8_0 cache batched, traced and replayed");
    }
    assert!(
        ran >= 2,
        "only {ran} families had heads a multiple of 32 wide"
    );
}
