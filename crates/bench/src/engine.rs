//! `nextok bench engine`: continuous batching on the real model, against the one-at-a-time
//! loop and (optionally) llama.cpp, in one run.
//!
//! The workload: requests whose prompts are windows of 20–600 tokens of one English text (at
//! different offsets, so no two share a prefix), `max_tokens` 64–256, temperature 0.8 and
//! top-p 0.95, EOS ignored; every fourth request is JSON-schema constrained (an array of at
//! least eight `{name, age, city}` objects, so it runs to its `max_tokens`). A request's
//! parameters and seed come from its index, so every run generates the same tokens.
//!
//! For each weight format (Q4_1 as shipped, Q8_0 re-quantised):
//! * **baseline** — the requests one after another through the one-sequence loop (prefill,
//!   then one model call per token; the constraint mask overlapped), as `generate` ran before
//!   the engine;
//! * **engine at C concurrent clients** (C = 1, 4, 16, 64): C clients, each submitting its
//!   next request when the last finished, until `max(C, 8)` requests have run; aggregate output
//!   tokens/s, requests/s, p50/p99 time to first token and inter-token latency (measured where
//!   the client receives the events);
//! * **prefill vs decode** — one 512-token prompt alone: prompt tokens/s against single-stream
//!   decode tokens/s.
//!
//! `--llama-cpp` first runs `bench/peers/llama_cpp.sh` on the same GGUF file and prints its
//! prompt and generation tokens/s beside ours.

use std::sync::Arc;
use std::time::Instant;

use nextok_constraint::ConstraintSpec;
use nextok_core::SamplingParams;
use nextok_engine::solo::{run_sequence, SoloOptions};
use nextok_engine::{Engine, EngineConfig, Event, GenerateRequest, Prompt};
use nextok_model::{LogitsSource, Requant};
use serde::Serialize;

use crate::frontend;
use crate::BenchArgs;

const TEXT: &str = "The history of the lighthouse is a history of the coast itself. Long before \
electric lamps and Fresnel lenses, people who lived by the sea lit fires on hills and towers to \
guide boats home at night. The Pharos of Alexandria, built in the third century before our era, \
stood more than a hundred metres tall and was counted among the wonders of the ancient world. \
Its light, a fire reflected by polished bronze, could be seen far out at sea. In the centuries \
that followed, lighthouses spread along the trade routes of the Mediterranean and later along \
the Atlantic coasts of Europe. Keepers tended the lamps through storms and long winters, \
trimming wicks, polishing glass and writing the weather in their logbooks. Many lived with their \
families in small cottages at the foot of the tower, far from the nearest town, and their \
children learned to read the sea before they learned to read books. The invention of the \
Fresnel lens in 1822 changed everything: a set of concentric glass prisms gathered the light of \
a single lamp into a beam that could reach twenty miles or more. Each lighthouse was given its \
own pattern of flashes, so that a sailor could tell one from another in the dark. Today most \
lighthouses are automatic, their keepers gone, and satellites guide ships across the oceans. \
Yet the towers remain, white and red against the sky, and people still travel to visit them, \
climb their narrow stairs, and look out over the water as the keepers once did. Some have \
become museums, some hotels, and some simply stand empty, waiting for the next storm. ";

/// A small deterministic hash for the workload's sizes: the first output of SplitMix64 seeded
/// with `x`.
fn mix(x: u64) -> u64 {
    crate::fixtures::SplitMix64::new(x).next_u64()
}

/// Request `i` of the workload over the text's ids.
fn workload(text_ids: &[u32], i: usize, tokens_scale: f64) -> GenerateRequest {
    let r = mix(i as u64 + 1);
    let len = 20 + (r % 581) as usize;
    let off = (mix(r) as usize) % (text_ids.len() - len);
    let max_tokens = ((64 + (mix(r ^ 7) % 193)) as f64 * tokens_scale).max(2.0) as u64;
    let mut req = GenerateRequest::new(Prompt::Ids(text_ids[off..off + len].to_vec()));
    req.params = SamplingParams {
        temperature: Some(0.8),
        top_p: Some(0.95),
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        seed: Some(i as u64),
        ..Default::default()
    };
    if i % 4 == 3 {
        req.constraint = Some(ConstraintSpec::JsonSchema {
            schema: crate::decode::schema(),
            options: Default::default(),
        });
    }
    req
}

fn percentile(xs: &mut [f64], p: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_unstable_by(|a, b| a.total_cmp(b));
    let k = ((xs.len() - 1) as f64 * p).round() as usize;
    xs[k]
}

#[derive(Serialize, Clone)]
struct Level {
    quant: String,
    concurrency: usize,
    requests: usize,
    output_tokens: usize,
    seconds: f64,
    tokens_per_s: f64,
    requests_per_s: f64,
    over_baseline: f64,
    ttft_p50_ms: f64,
    ttft_p99_ms: f64,
    itl_p50_ms: f64,
    itl_p99_ms: f64,
}

#[derive(Serialize, Clone)]
struct Quant {
    quant: String,
    baseline_requests: usize,
    baseline_tokens: usize,
    baseline_tokens_per_s: f64,
    prefill_512_tokens_per_s: f64,
    decode_tokens_per_s: f64,
    prefill_over_decode: f64,
    solo_loop_decode_tokens_per_s: f64,
    engine_over_solo_single_stream: f64,
    decode_16_streams_tokens_per_s: f64,
    prefix_repeat_ttft_first_ms: f64,
    prefix_repeat_ttft_second_ms: f64,
    decode_at_50_tokens_per_s: f64,
    decode_at_1800_tokens_per_s: f64,
    levels: Vec<Level>,
}

#[derive(Serialize)]
struct Report {
    model: String,
    simd: String,
    threads: usize,
    max_batch_tokens: usize,
    prefill_chunk_tokens: usize,
    quants: Vec<Quant>,
    llama_cpp: Option<serde_json::Value>,
}

/// One client's output tokens, times to first token and inter-token latencies (seconds).
type ClientStats = (usize, Vec<f64>, Vec<f64>);

/// Runs `C` closed-loop clients over requests `0..total`; returns (tokens, seconds, ttfts,
/// itls).
fn run_level(
    engine: &Engine,
    ids: &[u32],
    c: usize,
    total: usize,
    scale: f64,
) -> Result<(usize, f64, Vec<f64>, Vec<f64>), String> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let t0 = Instant::now();
    let results: Vec<Result<ClientStats, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..c)
            .map(|_| {
                s.spawn(|| {
                    let mut tokens = 0;
                    let mut ttft = Vec::new();
                    let mut itl = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= total {
                            return Ok((tokens, ttft, itl));
                        }
                        let sub = Instant::now();
                        let mut h = engine
                            .submit(workload(ids, i, scale))
                            .map_err(|e| e.to_string())?;
                        let mut last: Option<Instant> = None;
                        while let Some(ev) = h.recv() {
                            match ev {
                                Event::Token { .. } => {
                                    let now = Instant::now();
                                    match last {
                                        None => ttft.push(now.duration_since(sub).as_secs_f64()),
                                        Some(l) => itl.push(now.duration_since(l).as_secs_f64()),
                                    }
                                    last = Some(now);
                                    tokens += 1;
                                }
                                Event::Done { .. } => break,
                                Event::Error(e) => return Err(e.to_string()),
                                _ => {}
                            }
                        }
                    }
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("client thread panicked".into()))
            })
            .collect()
    });
    let secs = t0.elapsed().as_secs_f64();
    let (mut tokens, mut ttft, mut itl) = (0, Vec::new(), Vec::new());
    for r in results {
        let (t, a, b) = r?;
        tokens += t;
        ttft.extend(a);
        itl.extend(b);
    }
    Ok((tokens, secs, ttft, itl))
}

/// Runs `nextok bench engine`.
pub fn run(args: &BenchArgs) -> Result<(), String> {
    let path = frontend::model_path(args.model.as_deref())?;
    let llama_cpp = if args.llama_cpp {
        let out =
            std::env::temp_dir().join(format!("nextok-llama-cpp-{}.json", std::process::id()));
        eprintln!("bench engine: running bench/peers/llama_cpp.sh (builds llama.cpp on first use)");
        let st = std::process::Command::new("bash")
            .arg("bench/peers/llama_cpp.sh")
            .arg("--model")
            .arg(&path)
            .arg("--out")
            .arg(&out)
            .status()
            .map_err(|e| format!("bench/peers/llama_cpp.sh: {e} (run from the repository root)"))?;
        if !st.success() {
            return Err(format!("bench/peers/llama_cpp.sh failed ({st})"));
        }
        let text = std::fs::read_to_string(&out).map_err(|e| e.to_string())?;
        Some(serde_json::from_str::<serde_json::Value>(&text).map_err(|e| e.to_string())?)
    } else {
        None
    };
    let levels: Vec<usize> = if args.concurrency.is_empty() {
        vec![1, 4, 16, 64]
    } else {
        args.concurrency.clone()
    };
    let scale = args.tokens_scale;
    let mut quants = Vec::new();
    for (quant, requant) in [("as shipped", Requant::Keep), ("q8_0", Requant::Q8_0)] {
        let model = Arc::new(frontend::load_model(&path, requant)?);
        let mut ids = Vec::new();
        while ids.len() < 2000 {
            ids.extend(model.encode_prompt(TEXT).map_err(|e| e.to_string())?);
        }
        let engine = Engine::new(
            model.clone(),
            EngineConfig {
                max_num_seqs: 64,
                max_batch_tokens: args
                    .max_batch_tokens
                    .unwrap_or(EngineConfig::default().max_batch_tokens),
                prefill_chunk_tokens: args
                    .prefill_chunk_tokens
                    .unwrap_or(EngineConfig::default().prefill_chunk_tokens),
                prefix_cache_entries: 0,
                ..Default::default()
            },
        )
        .map_err(|e| e.to_string())?;
        // baseline: one after another through the one-sequence loop
        let nb = args.baseline_requests.max(1);
        let t0 = Instant::now();
        let mut base_tokens = 0;
        for i in 0..nb {
            let req = workload(&ids, i, scale);
            let p = engine.prepare(&req).map_err(|e| e.to_string())?;
            let mut src = model.source();
            let row = src.prefill(&p.info.prompt_ids).map_err(|e| e.to_string())?;
            let out = run_sequence(
                &model,
                &p.sampler,
                src,
                &p.info.prompt_ids,
                row,
                p.info.seeds[0],
                &SoloOptions {
                    record: None,
                    constraint: p.constraint.clone(),
                    overlap: true,
                    speculative: None,
                },
            )
            .map_err(|e| e.to_string())?;
            base_tokens += out.tokens.len();
        }
        let base_secs = t0.elapsed().as_secs_f64();
        let base_tps = base_tokens as f64 / base_secs;
        eprintln!("  {quant} baseline: {nb} requests, {base_tokens} tokens in {base_secs:.1} s ({base_tps:.1} tokens/s)");
        // prefill of 512 tokens vs single-stream decode
        let long = ids[..512].to_vec();
        let mut best_pp = 0f64;
        let mut best_dec = 0f64;
        let mut best_solo = 0f64;
        for _ in 0..args.reps.max(1) {
            let mut r = GenerateRequest::new(Prompt::Ids(long.clone()));
            r.params = SamplingParams {
                temperature: Some(0.8),
                max_tokens: Some(1),
                seed: Some(1),
                ..Default::default()
            };
            let c = engine.generate(r).map_err(|e| e.to_string())?;
            best_pp = best_pp.max(512.0 / c.timing.time_to_first_token.as_secs_f64());
            let mut r = GenerateRequest::new(Prompt::Ids(ids[600..620].to_vec()));
            r.params = SamplingParams {
                temperature: Some(0.8),
                max_tokens: Some(128),
                ignore_eos: true,
                seed: Some(2),
                ..Default::default()
            };
            let c = engine.generate(r).map_err(|e| e.to_string())?;
            let dec = (c.timing.total - c.timing.time_to_first_token).as_secs_f64();
            best_dec = best_dec.max(127.0 / dec);
            // the same stream through the one-sequence loop
            let mut src = model.source();
            let p = engine
                .prepare(&{
                    let mut r = GenerateRequest::new(Prompt::Ids(ids[600..620].to_vec()));
                    r.params = c.info.params.clone();
                    r
                })
                .map_err(|e| e.to_string())?;
            let row = src.prefill(&p.info.prompt_ids).map_err(|e| e.to_string())?;
            let t = Instant::now();
            let out = run_sequence(
                &model,
                &p.sampler,
                src,
                &p.info.prompt_ids,
                row,
                2,
                &SoloOptions::default(),
            )
            .map_err(|e| e.to_string())?;
            best_solo = best_solo.max((out.tokens.len() - 1) as f64 / t.elapsed().as_secs_f64());
        }
        // single-stream decode far into the context against near its start
        let at = |pos: usize| -> Result<f64, String> {
            let mut best = 0f64;
            for _ in 0..args.reps.max(1) {
                let mut r = GenerateRequest::new(Prompt::Ids(ids[..pos].to_vec()));
                r.params = SamplingParams {
                    temperature: Some(0.8),
                    max_tokens: Some(65),
                    ignore_eos: true,
                    seed: Some(3),
                    ..Default::default()
                };
                let c = engine.generate(r).map_err(|e| e.to_string())?;
                let dec = (c.timing.total - c.timing.time_to_first_token).as_secs_f64();
                best = best.max(64.0 / dec);
            }
            Ok(best)
        };
        // decode alone, batched: 16 requests of 20-token prompts and 128 tokens, submitted
        // together (the prefills take one iteration), against one such stream alone
        let decode16 = {
            let reqs: Vec<GenerateRequest> = (0..16)
                .map(|i| {
                    let mut r =
                        GenerateRequest::new(Prompt::Ids(ids[40 * i..40 * i + 20].to_vec()));
                    r.params = SamplingParams {
                        temperature: Some(0.8),
                        top_p: Some(0.95),
                        max_tokens: Some(129),
                        ignore_eos: true,
                        seed: Some(i as u64),
                        ..Default::default()
                    };
                    r
                })
                .collect();
            let mut best = 0f64;
            for _ in 0..args.reps.max(1) {
                let hs: Vec<_> = reqs
                    .iter()
                    .map(|r| engine.submit(r.clone()).map_err(|e| e.to_string()))
                    .collect::<Result<_, _>>()?;
                let mut first: Option<Instant> = None;
                let mut tokens = 0usize;
                let mut hs = hs;
                // the clock starts at the first token of any stream (after the prefills)
                for h in hs.iter_mut() {
                    while let Some(ev) = h.recv() {
                        match ev {
                            Event::Token { .. } => {
                                first.get_or_insert_with(Instant::now);
                                tokens += 1;
                            }
                            Event::Done { .. } => break,
                            Event::Error(e) => return Err(e.to_string()),
                            _ => {}
                        }
                    }
                }
                let secs = first.map_or(0.0, |f| f.elapsed().as_secs_f64());
                best = best.max((tokens - 16) as f64 / secs.max(1e-9));
            }
            best
        };
        eprintln!("  {quant} decode of 16 streams together: {decode16:.1} tokens/s");
        // the prefix cache: a repeated 500-token prompt's time to first token, first and second
        let prefix_ttft = {
            let cached =
                Engine::new(model.clone(), EngineConfig::default()).map_err(|e| e.to_string())?;
            let mut r = GenerateRequest::new(Prompt::Ids(ids[1000..1500].to_vec()));
            r.params = SamplingParams {
                temperature: Some(0.8),
                max_tokens: Some(1),
                seed: Some(4),
                ..Default::default()
            };
            let first = cached.generate(r.clone()).map_err(|e| e.to_string())?;
            let second = cached.generate(r).map_err(|e| e.to_string())?;
            (
                first.timing.time_to_first_token.as_secs_f64(),
                second.timing.time_to_first_token.as_secs_f64(),
                second.usage.cached_tokens,
            )
        };
        eprintln!(
            "  {quant} repeated 500-token prompt: first token after {:.0} ms, then {:.1} ms ({} tokens cached)",
            prefix_ttft.0 * 1e3,
            prefix_ttft.1 * 1e3,
            prefix_ttft.2
        );
        let at50 = at(50)?;
        let at1800 = at(1800)?;
        eprintln!("  {quant} single-stream decode: {at50:.1} tokens/s at position 50, {at1800:.1} at 1800");
        let mut q = Quant {
            decode_16_streams_tokens_per_s: decode16,
            prefix_repeat_ttft_first_ms: prefix_ttft.0 * 1e3,
            prefix_repeat_ttft_second_ms: prefix_ttft.1 * 1e3,
            decode_at_50_tokens_per_s: at50,
            decode_at_1800_tokens_per_s: at1800,
            quant: quant.to_string(),
            baseline_requests: nb,
            baseline_tokens: base_tokens,
            baseline_tokens_per_s: base_tps,
            prefill_512_tokens_per_s: best_pp,
            decode_tokens_per_s: best_dec,
            prefill_over_decode: best_pp / best_dec,
            solo_loop_decode_tokens_per_s: best_solo,
            engine_over_solo_single_stream: best_dec / best_solo,
            levels: Vec::new(),
        };
        for &c in &levels {
            let total = c.max(args.min_requests);
            let (tokens, secs, mut ttft, mut itl) = run_level(&engine, &ids, c, total, scale)?;
            let tps = tokens as f64 / secs;
            eprintln!("  {quant} C={c}: {total} requests, {tokens} tokens in {secs:.1} s ({tps:.1} tokens/s)");
            q.levels.push(Level {
                quant: quant.to_string(),
                concurrency: c,
                requests: total,
                output_tokens: tokens,
                seconds: secs,
                tokens_per_s: tps,
                requests_per_s: total as f64 / secs,
                over_baseline: tps / base_tps,
                ttft_p50_ms: 1e3 * percentile(&mut ttft, 0.5),
                ttft_p99_ms: 1e3 * percentile(&mut ttft, 0.99),
                itl_p50_ms: 1e3 * percentile(&mut itl, 0.5),
                itl_p99_ms: 1e3 * percentile(&mut itl, 0.99),
            });
        }
        quants.push(q);
        drop(engine);
    }
    let report = Report {
        model: path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
        simd: nextok_model::simd_features(),
        threads: rayon::current_num_threads(),
        max_batch_tokens: args
            .max_batch_tokens
            .unwrap_or(EngineConfig::default().max_batch_tokens),
        prefill_chunk_tokens: args
            .prefill_chunk_tokens
            .unwrap_or(EngineConfig::default().prefill_chunk_tokens),
        quants,
        llama_cpp,
    };
    if args.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    outln!(
        "engine: {} ({} threads, SIMD {}); workload: prompts 20-600 tokens, max_tokens 64-256 x {scale}, temperature 0.8, 1 in 4 JSON-schema constrained",
        report.model, report.threads, report.simd
    );
    for q in &report.quants {
        outln!(
            "\n{}: baseline (one at a time, one-sequence loop) {:.1} tokens/s over {} requests; prefill of 512 tokens {:.0} tokens/s = {:.1}x single-stream decode ({:.1} tokens/s; one-sequence loop {:.1}, engine/loop {:.3})",
            q.quant,
            q.baseline_tokens_per_s,
            q.baseline_requests,
            q.prefill_512_tokens_per_s,
            q.prefill_over_decode,
            q.decode_tokens_per_s,
            q.solo_loop_decode_tokens_per_s,
            q.engine_over_solo_single_stream
        );
        outln!(
            "decode of 16 streams together: {:.1} tokens/s = {:.2}x single-stream decode",
            q.decode_16_streams_tokens_per_s,
            q.decode_16_streams_tokens_per_s / q.decode_tokens_per_s
        );
        outln!(
            "repeated 500-token prompt (prefix cache): first token after {:.0} ms, then {:.1} ms ({:.0}x shorter)",
            q.prefix_repeat_ttft_first_ms,
            q.prefix_repeat_ttft_second_ms,
            q.prefix_repeat_ttft_first_ms / q.prefix_repeat_ttft_second_ms
        );
        outln!(
            "single-stream decode at position 50: {:.1} tokens/s, at 1800: {:.1} ({:.2}x)",
            q.decode_at_50_tokens_per_s,
            q.decode_at_1800_tokens_per_s,
            q.decode_at_1800_tokens_per_s / q.decode_at_50_tokens_per_s
        );
        outln!("| concurrency | requests | output tokens | tokens/s | × baseline | requests/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |");
        outln!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for l in &q.levels {
            outln!(
                "| {} | {} | {} | {:.1} | {:.2} | {:.2} | {:.0} | {:.0} | {:.1} | {:.1} |",
                l.concurrency,
                l.requests,
                l.output_tokens,
                l.tokens_per_s,
                l.over_baseline,
                l.requests_per_s,
                l.ttft_p50_ms,
                l.ttft_p99_ms,
                l.itl_p50_ms,
                l.itl_p99_ms
            );
        }
    }
    if let Some(l) = &report.llama_cpp {
        outln!("\nllama.cpp on the same file (bench/peers/llama_cpp.sh):");
        outln!(
            "{}",
            serde_json::to_string_pretty(l).map_err(|e| e.to_string())?
        );
    }
    Ok(())
}
