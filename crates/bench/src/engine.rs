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
//!   decode tokens/s (the best of `--reps`), and the same stream through the one-sequence loop
//!   back to back with it in each repetition (the loop first in odd ones): engine/loop is the
//!   median of the repetitions' ratios, with their spread;
//! * **decode of 16 streams** — 16 requests of 20-token prompts and 128 tokens submitted
//!   together: aggregate decode tokens/s while all 16 decode (from the last stream's first
//!   token to the first stream's last, as `llama-batched-bench`'s S_TG counts its lockstep
//!   decode);
//! * the prefix cache (a repeated 500-token prompt's time to first token) and single-stream
//!   decode at positions 50 and 1800, back to back in each repetition (1800 first in odd ones):
//!   their ratio is the median of the repetitions' ratios, with their spread. Only attention's
//!   work grows between the two, so the report also gives the extra bytes of KV cache a step
//!   reads at 1,800, the rate they came in at (those bytes over the extra time of a step), the
//!   rate 0.8× the speed at 50 would need, and what a plain read of memory reaches on this
//!   machine, measured before the run (`memory.rs`).
//!
//! `--llama-cpp` pairs llama.cpp with nextok on the same GGUF file (for Q8_0, on the copy
//! `llama-quantize` makes: the tools and that copy come from `bench/peers/llama_cpp.sh`, which
//! builds them on first use). Three rows, each run `--pairs` times (default 5) — a pair is
//! llama.cpp's measurement and nextok's back to back, llama.cpp first in even pairs and nextok
//! first in odd ones, so drift on a shared machine hits both alike:
//! * **prompt** — a 512-token prefill (`llama-bench -p 512 -n 0 -r 1`);
//! * **decode** — single-stream decode of 128 tokens (`llama-bench -p 0 -n 128 -r 1`);
//! * **16 streams** — 16 sequences of 20 prompt tokens decoding 128 tokens together
//!   (`llama-batched-bench -npp 20 -ntg 128 -npl 16`, its S_TG).
//!
//! llama.cpp runs with as many threads (`-t`) as nextok's pool, repacking on unless
//! `--llama-no-repack`. Per row the report gives the median tokens/s of each engine, the median
//! of the per-pair ratios nextok / llama.cpp and their spread (min–max), as `bench speculative`
//! reports its speed-ups; the header names the CPU and its AVX-512 / VNNI flags.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use nextok_constraint::ConstraintSpec;
use nextok_core::SamplingParams;
use nextok_engine::{Engine, EngineConfig, Event, GenerateRequest, Prompt};
use nextok_model::{KvCacheType, KvGeometry, KvPool, LogitsSource, Model, ModelSource, Requant};
use serde::Serialize;

use crate::llama_tools::LlamaCpp;
use crate::sampler::median;
use crate::ModelArgs;

/// Arguments of `nextok bench engine`.
#[derive(clap::Args, Debug, Clone)]
pub struct EngineArgs {
    /// `--model`, `--kernels`.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Repetitions of the prompt, single-stream and 16-stream measurements (the best counts).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Concurrency levels, comma-separated (default: 1,4,16,64).
    #[arg(long, value_delimiter = ',')]
    pub concurrency: Vec<usize>,
    /// Scale every request's `max_tokens` (quick runs: 0.25).
    #[arg(long, default_value_t = 1.0)]
    pub tokens_scale: f64,
    /// Requests of the one-at-a-time baseline.
    #[arg(long, default_value_t = 8)]
    pub baseline_requests: usize,
    /// Requests per concurrency level at least (a level runs `max(C, this)`).
    #[arg(long, default_value_t = 8)]
    pub min_requests: usize,
    /// Tokens one forward pass takes at most (default: the engine's default).
    #[arg(long)]
    pub max_batch_tokens: Option<usize>,
    /// Prompt tokens one forward pass takes while sequences decode: the least, or the chunk
    /// with `--itl-target-ms 0` (default: the engine's default).
    #[arg(long)]
    pub prefill_chunk_tokens: Option<usize>,
    /// The inter-token latency the prompt chunk is sized to (default: the engine's default).
    #[arg(long)]
    pub itl_target_ms: Option<u64>,
    /// Also run llama.cpp on the same file (the tools `bench/peers/llama_cpp.sh` builds; run
    /// from the repository root) paired with nextok: prompt (512-token prefill), single-stream
    /// decode and 16 streams, each `--pairs` times, the two engines back to back and
    /// alternating which goes first; the report gives the median of the paired ratios and
    /// their spread.
    #[arg(long)]
    pub llama_cpp: bool,
    /// `--llama-cpp`: pairs per row (at least 1).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub pairs: u32,
    /// `--llama-cpp`: turn llama.cpp's weight repacking (extra buffer types) off, for CPUs
    /// that advertise an instruction set that then traps.
    #[arg(long)]
    pub llama_no_repack: bool,
    /// `--llama-cpp`: measure only the rows paired with llama.cpp (and the roofline), not the
    /// engine's own levels, baseline and cache rows: for the larger models, where those take
    /// long.
    #[arg(long, requires = "llama_cpp")]
    pub paired_only: bool,
    /// What nextok's KV cache stores (`f16` or `q8_0`; the one-sequence baseline uses the
    /// same), and with `--llama-cpp` llama.cpp's too (`-ctk/-ctv q8_0 -fa on`).
    #[arg(long, default_value = "f16", value_parser = parse_kv_cache)]
    pub kv_cache_type: KvCacheType,
}

/// A one-sequence source over `model` with its cache of type `kv` (the engine's).
fn source(model: &Model, kv: KvCacheType) -> Result<ModelSource, String> {
    let geometry = KvGeometry {
        dtype: kv,
        ..model.weights.kv_geometry()
    };
    geometry.check()?;
    ModelSource::with_pool(model.weights.clone(), &KvPool::new(geometry, None))
        .map_err(|e| e.to_string())
}

/// `req` through the one-sequence loop (its prompt prefilled, then one model call per token,
/// a constraint's mask computed beside the model when `overlap`): the tokens it generated and
/// the seconds after the prefill.
fn through_loop(
    model: &Model,
    engine: &Engine,
    kv: KvCacheType,
    req: &GenerateRequest,
    overlap: bool,
) -> Result<(usize, f64), String> {
    let p = engine.prepare(req).map_err(|e| e.to_string())?;
    let mut src = source(model, kv)?;
    let row = src.prefill(&p.info.prompt_ids).map_err(|e| e.to_string())?;
    let t = Instant::now();
    let out = p
        .run_prefilled(model, src, row, &p.solo_options(None, overlap, None))
        .map_err(|e| e.to_string())?;
    Ok((out.tokens.len(), t.elapsed().as_secs_f64()))
}

/// The median of paired ratios and their smallest and largest.
fn median_spread(ratios: &[f64]) -> (f64, [f64; 2]) {
    let spread = ratios
        .iter()
        .fold([f64::INFINITY, f64::NEG_INFINITY], |[lo, hi], &r| {
            [lo.min(r), hi.max(r)]
        });
    (median(&mut ratios.to_vec()), spread)
}

fn parse_kv_cache(s: &str) -> Result<KvCacheType, String> {
    KvCacheType::from_name(s).ok_or_else(|| format!("`{s}`: expected f16 or q8_0"))
}

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
        req.params.constraint = Some(ConstraintSpec::JsonSchema {
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
    /// The median over the repetitions of engine / loop, each pair measured back to back.
    engine_over_solo_single_stream: f64,
    /// The smallest and largest of those ratios.
    engine_over_solo_spread: [f64; 2],
    /// How many pairs (the repetitions).
    engine_over_solo_pairs: usize,
    decode_16_streams_tokens_per_s: f64,
    prefix_repeat_ttft_first_ms: f64,
    prefix_repeat_ttft_second_ms: f64,
    decode_at_50_tokens_per_s: f64,
    decode_at_1800_tokens_per_s: f64,
    /// The median over the repetitions of the decode speed at position 1,800 over that at 50,
    /// each pair measured back to back.
    decode_1800_over_50: f64,
    /// The smallest and largest of those ratios.
    decode_1800_over_50_spread: [f64; 2],
    /// What the step at 1,800 reads beyond the step at 50, and how fast.
    decode_1800_cache: DeepCache,
    /// What a single-stream decode step reads of the weights ([`Roofline`]).
    roofline: Roofline,
    levels: Vec<Level>,
}

impl Quant {
    /// A quantisation measured only paired with llama.cpp (`--paired-only`): its own rows are
    /// not measured (NaN, `null` in JSON).
    fn paired_only(quant: &str, roofline: Roofline) -> Quant {
        let nan = f64::NAN;
        Quant {
            quant: quant.to_string(),
            baseline_requests: 0,
            baseline_tokens: 0,
            baseline_tokens_per_s: nan,
            prefill_512_tokens_per_s: nan,
            decode_tokens_per_s: nan,
            prefill_over_decode: nan,
            solo_loop_decode_tokens_per_s: nan,
            engine_over_solo_single_stream: nan,
            engine_over_solo_spread: [nan; 2],
            engine_over_solo_pairs: 0,
            decode_16_streams_tokens_per_s: nan,
            prefix_repeat_ttft_first_ms: nan,
            prefix_repeat_ttft_second_ms: nan,
            decode_at_50_tokens_per_s: nan,
            decode_at_1800_tokens_per_s: nan,
            decode_1800_over_50: nan,
            decode_1800_over_50_spread: [nan; 2],
            decode_1800_cache: DeepCache::default(),
            roofline,
            levels: Vec::new(),
        }
    }
}

/// What a single-stream decode step reads of the weights: every matrix it multiplies (each
/// layer's and the output; an untied embedding gives one row, not counted).
#[derive(Serialize, Clone, Copy)]
struct Roofline {
    /// Bytes in nextok's layout (its repacked scale planes included).
    nextok_bytes: u64,
    /// Bytes of the same tensors in the file llama.cpp runs (its repacked copies are as large).
    file_bytes: u64,
    /// Multiply-adds (one per weight).
    macs: u64,
}

/// The KV cache a decode step at position 1,800 reads beyond one at position 50 (only
/// attention's work grows between the two), and the rate at which those bytes come in: the
/// extra bytes over the extra time of a step, set beside [`Report::memory_read_gbs`].
#[derive(Serialize, Clone, Copy, Default)]
struct DeepCache {
    /// Millions of bytes more a step reads (the mean over the 64 steps of each).
    extra_mb_per_step: f64,
    /// The median over the pairs of those bytes over the extra time, in GB/s (`None` when no
    /// pair was slower at 1,800).
    read_gbs: Option<f64>,
    /// The median over the pairs of the rate at which 1,800 would run at 0.8× the speed at 50.
    read_gbs_for_0_8: f64,
}

/// One row of the llama.cpp comparison: `pairs` pairs of one measurement by each engine.
#[derive(Serialize, Clone)]
struct PairedRow {
    quant: String,
    /// `prompt`, `decode` or `16 streams`.
    row: &'static str,
    pairs: usize,
    /// Medians over the pairs.
    nextok_tokens_per_s: f64,
    llama_cpp_tokens_per_s: f64,
    /// The median of the per-pair ratios nextok / llama.cpp, and their least and greatest.
    nextok_over_llama_cpp: f64,
    ratio_min: f64,
    ratio_max: f64,
    /// Per pair, in order (llama.cpp went first in even pairs, nextok in odd ones).
    nextok_samples: Vec<f64>,
    llama_cpp_samples: Vec<f64>,
    ratios: Vec<f64>,
}

#[derive(Serialize)]
struct LlamaCppReport {
    build_commit: Option<String>,
    threads: usize,
    repack: bool,
    pairs: usize,
    /// The 1-minute load average before the run and after it (`/proc/loadavg`): llama.cpp's
    /// spinning threads lose far more than nextok's when another process takes a core, so
    /// ratios from a busy machine mean little.
    loadavg_before: Option<f64>,
    loadavg_after: Option<f64>,
    /// The files llama.cpp ran (names only): as shipped, and re-quantised to Q8_0 by
    /// `llama-quantize`.
    model_files: Vec<String>,
    rows: Vec<PairedRow>,
}

/// The CPU, from `/proc/cpuinfo` (`unknown` and false where there is none).
#[derive(Serialize)]
struct Cpu {
    model_name: String,
    avx512f: bool,
    avx512_vnni: bool,
    avx_vnni: bool,
}

/// The 1-minute load average, where `/proc/loadavg` exists.
fn loadavg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn cpu() -> Cpu {
    let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.split(':').next().map(str::trim) == Some(name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let flags = field("flags").unwrap_or_default();
    let has = |f: &str| flags.split_whitespace().any(|x| x == f);
    Cpu {
        model_name: field("model name").unwrap_or_else(|| "unknown".into()),
        avx512f: has("avx512f"),
        avx512_vnni: has("avx512_vnni"),
        avx_vnni: has("avx_vnni"),
    }
}

#[derive(Serialize)]
struct Report {
    model: String,
    simd: String,
    /// The model kernels' level (`--kernels` caps it).
    kernels: String,
    cpu: Cpu,
    threads: usize,
    /// The KV cache's type (nextok's, and llama.cpp's with `--llama-cpp`).
    kv_cache_type: String,
    max_batch_tokens: usize,
    prefill_chunk_tokens: usize,
    itl_target_ms: u64,
    /// GB/s a plain read of a 256 MiB buffer reached before the run: on one thread, and on
    /// `threads` (the fastest of eight passes).
    memory_read_gbs: [f64; 2],
    /// The int8 multiply-add peak measured before the run on `threads` threads: the
    /// instruction and G multiply-adds a second (`None` without AVX2).
    int8_peak: Option<(String, f64)>,
    /// `--paired-only`: the quantisations' own rows were not measured.
    paired_only: bool,
    quants: Vec<Quant>,
    llama_cpp: Option<LlamaCppReport>,
}

/// One 512-token prompt (the text's first 512 ids) alone, one token out: prompt tokens/s.
fn prefill_512(engine: &Engine, ids: &[u32]) -> Result<f64, String> {
    let mut r = GenerateRequest::new(Prompt::Ids(ids[..512].to_vec()));
    r.params = SamplingParams {
        temperature: Some(0.8),
        max_tokens: Some(1),
        seed: Some(1),
        ..Default::default()
    };
    let c = engine.generate(r).map_err(|e| e.to_string())?;
    Ok(512.0 / c.timing.time_to_first_token.as_secs_f64())
}

/// One stream alone: a 20-token prompt, 128 tokens ([`single_params`]); decode tokens/s after
/// the first token.
fn decode_single(engine: &Engine, ids: &[u32]) -> Result<f64, String> {
    let mut r = GenerateRequest::new(Prompt::Ids(ids[600..620].to_vec()));
    r.params = single_params();
    let c = engine.generate(r).map_err(|e| e.to_string())?;
    let dec = (c.timing.total - c.timing.time_to_first_token).as_secs_f64();
    Ok(127.0 / dec)
}

/// The single stream's parameters (the engine's and the one-sequence loop's run).
fn single_params() -> SamplingParams {
    SamplingParams {
        temperature: Some(0.8),
        max_tokens: Some(128),
        ignore_eos: true,
        seed: Some(2),
        ..Default::default()
    }
}

/// 16 streams decoding together: 16 requests of 20-token prompts and 128 tokens, submitted at
/// once. The rate is the steady 16-row decode, as `llama-batched-bench`'s S_TG is: the tokens
/// received while every stream is decoding — from the moment the last stream has its first
/// token (every prompt is in) to the moment the first stream has its last — over that time.
/// (Counting from the first token of any stream to the end would also count the prompts the
/// engine is still taking in beside the first streams' decode steps, and the last streams' tail
/// of fewer rows.) Each stream's events are received on a thread of its own, so a token's time
/// is when the engine sent it.
fn decode_16(engine: &Engine, ids: &[u32]) -> Result<f64, String> {
    let mut hs = Vec::with_capacity(16);
    for i in 0..16 {
        let mut r = GenerateRequest::new(Prompt::Ids(ids[40 * i..40 * i + 20].to_vec()));
        r.params = SamplingParams {
            temperature: Some(0.8),
            top_p: Some(0.95),
            max_tokens: Some(129),
            ignore_eos: true,
            seed: Some(i as u64),
            ..Default::default()
        };
        hs.push(engine.submit(r).map_err(|e| e.to_string())?);
    }
    // each stream's token times
    let times: Vec<Result<Vec<Instant>, String>> = std::thread::scope(|sc| {
        let threads: Vec<_> = hs
            .into_iter()
            .map(|mut h| {
                sc.spawn(move || {
                    let mut t = Vec::with_capacity(129);
                    while let Some(ev) = h.recv() {
                        match ev {
                            Event::Token { .. } => t.push(Instant::now()),
                            Event::Done { .. } => break,
                            Event::Error(e) => return Err(e.to_string()),
                            _ => {}
                        }
                    }
                    Ok(t)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err("a receiver panicked".into()))
            })
            .collect()
    });
    let times = times.into_iter().collect::<Result<Vec<_>, _>>()?;
    let (Some(start), Some(end)) = (
        times.iter().filter_map(|t| t.first()).max(),
        times.iter().filter_map(|t| t.last()).min(),
    ) else {
        return Err("a stream gave no token".into());
    };
    let tokens = times
        .iter()
        .flatten()
        .filter(|&&t| t > *start && t <= *end)
        .count();
    let secs = end.saturating_duration_since(*start).as_secs_f64();
    if secs <= 0.0 || tokens == 0 {
        return Err("the 16 streams never decoded together".into());
    }
    Ok(tokens as f64 / secs)
}

/// The rows of the llama.cpp comparison.
const PAIRED_ROWS: [&str; 3] = ["prompt", "decode", "16 streams"];

/// One measurement of `row` by nextok (tokens/s).
fn nextok_row(row: &str, engine: &Engine, ids: &[u32]) -> Result<f64, String> {
    match row {
        "prompt" => prefill_512(engine, ids),
        "decode" => decode_single(engine, ids),
        _ => decode_16(engine, ids),
    }
}

/// One measurement of `row` by llama.cpp on `file` (tokens/s, and the build commit when the
/// tool reports one).
fn llama_row(row: &str, peer: &LlamaCpp, file: &Path) -> Result<(f64, Option<String>), String> {
    match row {
        "prompt" => peer.bench(file, 512, 0),
        "decode" => peer.bench(file, 0, 128),
        _ => peer.batched(file, 20, 128, 16).map(|tps| (tps, None)),
    }
}

/// Runs the paired rows for one weight format: `pairs` pairs per row, the rows in turn within
/// a pair index, llama.cpp first in even pairs and nextok first in odd ones.
fn paired_rows(
    quant: &str,
    engine: &Engine,
    ids: &[u32],
    peer: &LlamaCpp,
    file: &Path,
    pairs: usize,
    build_commit: &mut Option<String>,
) -> Result<Vec<PairedRow>, String> {
    let mut samples = vec![(Vec::new(), Vec::new()); PAIRED_ROWS.len()];
    for i in 0..pairs {
        for (k, row) in PAIRED_ROWS.into_iter().enumerate() {
            let (llama, ours) = if i % 2 == 0 {
                let l = llama_row(row, peer, file)?;
                (l, nextok_row(row, engine, ids)?)
            } else {
                let n = nextok_row(row, engine, ids)?;
                (llama_row(row, peer, file)?, n)
            };
            let ((l, commit), n) = (llama, ours);
            if build_commit.is_none() {
                *build_commit = commit;
            }
            eprintln!(
                "  {quant} pair {}/{pairs} {row} ({} first): nextok {n:.1}, llama.cpp {l:.1} tokens/s (x{:.2})",
                i + 1,
                if i % 2 == 0 { "llama.cpp" } else { "nextok" },
                n / l
            );
            samples[k].0.push(n);
            samples[k].1.push(l);
        }
    }
    Ok(PAIRED_ROWS
        .into_iter()
        .zip(samples)
        .map(|(row, (ours, theirs))| {
            let ratios: Vec<f64> = ours.iter().zip(&theirs).map(|(n, l)| n / l).collect();
            let (ratio, [lo, hi]) = median_spread(&ratios);
            PairedRow {
                quant: quant.to_string(),
                row,
                pairs,
                nextok_tokens_per_s: median(&mut ours.clone()),
                llama_cpp_tokens_per_s: median(&mut theirs.clone()),
                nextok_over_llama_cpp: ratio,
                ratio_min: lo,
                ratio_max: hi,
                nextok_samples: ours,
                llama_cpp_samples: theirs,
                ratios,
            }
        })
        .collect())
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
pub fn run(args: &EngineArgs) -> Result<(), String> {
    let path = args.model.path()?;
    let threads = rayon::current_num_threads();
    let pairs = args.pairs.max(1) as usize;
    // llama.cpp's tools and its Q8_0 copy of the file, before any measurement
    let peer = if args.llama_cpp {
        eprintln!("bench engine: finding llama.cpp's tools with bench/peers/llama_cpp.sh (builds them on first use)");
        let peer = LlamaCpp::locate(threads, !args.llama_no_repack)?
            .with_q8_0_cache(args.kv_cache_type == KvCacheType::Q8_0);
        let q8 = peer.q8_0_copy(&path)?;
        Some((peer, q8))
    } else {
        None
    };
    let mut build_commit = None;
    let load_before = loadavg();
    if let (true, Some(load)) = (peer.is_some(), load_before) {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        if load > cpus as f64 / 2.0 {
            eprintln!("bench engine: warning: load average {load:.2} on {cpus} CPUs: llama.cpp's numbers (its threads spin) will be low and noisy, and the ratios with them");
        }
    }
    // the machine's memory, read plainly, before the models take it
    let memory_read_gbs = crate::memory::read_gbs(threads);
    eprintln!(
        "bench engine: a plain read of memory: {:.1} GB/s on one thread, {:.1} on {threads}",
        memory_read_gbs[0], memory_read_gbs[1]
    );
    let int8_peak = crate::peak::int8_madd_gmacs(threads).map(|(i, g)| (i.to_string(), g));
    if let Some((i, g)) = &int8_peak {
        eprintln!("bench engine: int8 multiply-add peak: {g:.0} G/s on {threads} threads ({i})");
    }
    let mut paired = Vec::new();
    let levels: Vec<usize> = if args.concurrency.is_empty() {
        vec![1, 4, 16, 64]
    } else {
        args.concurrency.clone()
    };
    let scale = args.tokens_scale;
    // the engine's limits: the command's, else the engine's defaults
    let defaults = EngineConfig::default();
    let config = EngineConfig {
        max_num_seqs: 64,
        max_batch_tokens: args.max_batch_tokens.unwrap_or(defaults.max_batch_tokens),
        prefill_chunk_tokens: args
            .prefill_chunk_tokens
            .unwrap_or(defaults.prefill_chunk_tokens),
        itl_target_ms: args.itl_target_ms.unwrap_or(defaults.itl_target_ms),
        prefix_cache_entries: 0,
        kv_cache_type: args.kv_cache_type,
        ..defaults
    };
    let mut quants = Vec::new();
    for (quant, requant, q8) in [
        ("as shipped", Requant::Keep, false),
        ("q8_0", Requant::Q8_0, true),
    ] {
        let model = Arc::new(crate::load_model(&path, requant)?);
        let (nextok_bytes, macs) = model.weights.decode_step_reads();
        let peer_file = match &peer {
            Some((_, q8_file)) if q8 => q8_file.as_path(),
            _ => path.as_path(),
        };
        let roofline = Roofline {
            nextok_bytes: nextok_bytes as u64,
            file_bytes: file_decode_step_bytes(peer_file)?,
            macs: macs as u64,
        };
        let mut ids = Vec::new();
        while ids.len() < 2000 {
            ids.extend(model.encode_prompt(TEXT).map_err(|e| e.to_string())?);
        }
        let engine = Engine::new(model.clone(), config.clone()).map_err(|e| e.to_string())?;
        if args.paired_only {
            if let Some((peer, _)) = &peer {
                paired.extend(paired_rows(
                    quant,
                    &engine,
                    &ids,
                    peer,
                    peer_file,
                    pairs,
                    &mut build_commit,
                )?);
            }
            quants.push(Quant::paired_only(quant, roofline));
            continue;
        }
        // baseline: one after another through the one-sequence loop
        let nb = args.baseline_requests.max(1);
        let t0 = Instant::now();
        let mut base_tokens = 0;
        for i in 0..nb {
            let req = workload(&ids, i, scale);
            base_tokens += through_loop(&model, &engine, args.kv_cache_type, &req, true)?.0;
        }
        let base_secs = t0.elapsed().as_secs_f64();
        let base_tps = base_tokens as f64 / base_secs;
        eprintln!("  {quant} baseline: {nb} requests, {base_tokens} tokens in {base_secs:.1} s ({base_tps:.1} tokens/s)");
        // prefill of 512 tokens vs single-stream decode, and the same stream through the
        // one-sequence loop back to back with it (the loop first in odd repetitions), so that
        // drift on a shared machine hits both alike; the ratio reported is the median of the
        // pairs' ratios
        let mut best_pp = 0f64;
        let mut best_dec = 0f64;
        let mut best_solo = 0f64;
        let mut pair_ratios = Vec::with_capacity(args.reps.max(1));
        for rep in 0..args.reps.max(1) {
            best_pp = best_pp.max(prefill_512(&engine, &ids)?);
            let solo = || -> Result<f64, String> {
                let mut r = GenerateRequest::new(Prompt::Ids(ids[600..620].to_vec()));
                r.params = single_params();
                let (tokens, secs) = through_loop(&model, &engine, args.kv_cache_type, &r, false)?;
                Ok((tokens - 1) as f64 / secs)
            };
            let (dec, loop_tps) = if rep % 2 == 0 {
                let dec = decode_single(&engine, &ids)?;
                (dec, solo()?)
            } else {
                let loop_tps = solo()?;
                (decode_single(&engine, &ids)?, loop_tps)
            };
            best_dec = best_dec.max(dec);
            best_solo = best_solo.max(loop_tps);
            pair_ratios.push(dec / loop_tps);
        }
        let (engine_over_loop, loop_spread) = median_spread(&pair_ratios);
        // single-stream decode far into the context against near its start: the two back to
        // back in every repetition (position 1,800 first in odd ones); the ratio reported is
        // the median of the pairs' ratios
        let at = |pos: usize| -> Result<f64, String> {
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
            Ok(64.0 / dec)
        };
        let (mut at50, mut at1800) = (0f64, 0f64);
        let mut deep_ratios = Vec::with_capacity(args.reps.max(1));
        // the cache a step reads at each of the two (64 steps from the prompt's end), and per
        // pair the rate the extra bytes at 1,800 came in at, and the rate 0.8× would need
        let windows: Vec<Option<usize>> = model
            .weights
            .config
            .layers
            .iter()
            .map(|l| l.window)
            .collect();
        let per_position = KvGeometry {
            dtype: args.kv_cache_type,
            ..model.weights.kv_geometry()
        }
        .bytes_per_position();
        let extra_bytes = crate::memory::cache_bytes_per_step(&windows, per_position, 1800, 64)
            - crate::memory::cache_bytes_per_step(&windows, per_position, 50, 64);
        let (mut cache_gbs, mut gbs_for_0_8) = (Vec::new(), Vec::new());
        for rep in 0..args.reps.max(1) {
            let (near, far) = if rep % 2 == 0 {
                let near = at(50)?;
                (near, at(1800)?)
            } else {
                let far = at(1800)?;
                (at(50)?, far)
            };
            at50 = at50.max(near);
            at1800 = at1800.max(far);
            deep_ratios.push(far / near);
            let extra_s = 1.0 / far - 1.0 / near;
            if extra_s > 0.0 {
                cache_gbs.push(extra_bytes / extra_s / 1e9);
            }
            gbs_for_0_8.push(extra_bytes / (0.25 / near) / 1e9);
        }
        let (deep_ratio, deep_spread) = median_spread(&deep_ratios);
        let deep_cache = DeepCache {
            extra_mb_per_step: extra_bytes / 1e6,
            read_gbs: (!cache_gbs.is_empty()).then(|| median(&mut cache_gbs)),
            read_gbs_for_0_8: median(&mut gbs_for_0_8),
        };
        // decode alone, batched: 16 streams together, against one such stream alone
        let mut decode16 = 0f64;
        for _ in 0..args.reps.max(1) {
            decode16 = decode16.max(decode_16(&engine, &ids)?);
        }
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
        eprintln!("  {quant} single-stream decode: {at50:.1} tokens/s at position 50, {at1800:.1} at 1800");
        if let Some((peer, _)) = &peer {
            paired.extend(paired_rows(
                quant,
                &engine,
                &ids,
                peer,
                peer_file,
                pairs,
                &mut build_commit,
            )?);
        }
        let mut q = Quant {
            decode_16_streams_tokens_per_s: decode16,
            prefix_repeat_ttft_first_ms: prefix_ttft.0 * 1e3,
            prefix_repeat_ttft_second_ms: prefix_ttft.1 * 1e3,
            decode_at_50_tokens_per_s: at50,
            decode_at_1800_tokens_per_s: at1800,
            decode_1800_over_50: deep_ratio,
            decode_1800_over_50_spread: deep_spread,
            decode_1800_cache: deep_cache,
            roofline,
            quant: quant.to_string(),
            baseline_requests: nb,
            baseline_tokens: base_tokens,
            baseline_tokens_per_s: base_tps,
            prefill_512_tokens_per_s: best_pp,
            decode_tokens_per_s: best_dec,
            prefill_over_decode: best_pp / best_dec,
            solo_loop_decode_tokens_per_s: best_solo,
            engine_over_solo_single_stream: engine_over_loop,
            engine_over_solo_spread: loop_spread,
            engine_over_solo_pairs: args.reps.max(1),
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
        kernels: {
            use nextok_model::kernels::{register_width, Level, RegisterWidth};
            let level = Level::current();
            match (level, register_width()) {
                (Level::Avx512 | Level::Avx512Vnni, RegisterWidth::Bits256) => {
                    format!("{} (256-bit registers)", level.name())
                }
                _ => level.name().to_string(),
            }
        },
        cpu: cpu(),
        threads,
        kv_cache_type: config.kv_cache_type.name().to_string(),
        max_batch_tokens: config.max_batch_tokens,
        prefill_chunk_tokens: config.prefill_chunk_tokens,
        itl_target_ms: config.itl_target_ms,
        memory_read_gbs,
        int8_peak,
        paired_only: args.paired_only,
        quants,
        llama_cpp: peer.as_ref().map(|(_, q8_file)| LlamaCppReport {
            build_commit,
            threads,
            repack: !args.llama_no_repack,
            loadavg_before: load_before,
            loadavg_after: loadavg(),
            pairs,
            model_files: [path.as_path(), q8_file.as_path()]
                .iter()
                .map(|p| {
                    p.file_name()
                        .map(|f| f.to_string_lossy().into_owned())
                        .unwrap_or_default()
                })
                .collect(),
            rows: paired,
        }),
    };
    if args.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    outln!(
        "engine: {} ({} threads, SIMD {}, model kernels {}, KV cache {}); workload: prompts 20-600 tokens, max_tokens 64-256 x {scale}, temperature 0.8, 1 in 4 JSON-schema constrained",
        report.model, report.threads, report.simd, report.kernels, report.kv_cache_type
    );
    let yes = |b: bool| if b { "yes" } else { "no" };
    outln!(
        "cpu: {} (avx512f {}, avx512_vnni {}, avx_vnni {})",
        report.cpu.model_name,
        yes(report.cpu.avx512f),
        yes(report.cpu.avx512_vnni),
        yes(report.cpu.avx_vnni)
    );
    for q in report.quants.iter().filter(|_| !report.paired_only) {
        outln!(
            "\n{}: baseline (one at a time, one-sequence loop) {:.1} tokens/s over {} requests; prefill of 512 tokens {:.0} tokens/s = {:.1}x single-stream decode ({:.1} tokens/s; one-sequence loop {:.1}, engine/loop {:.3}, {:.3}–{:.3} over {} back-to-back pairs)",
            q.quant,
            q.baseline_tokens_per_s,
            q.baseline_requests,
            q.prefill_512_tokens_per_s,
            q.prefill_over_decode,
            q.decode_tokens_per_s,
            q.solo_loop_decode_tokens_per_s,
            q.engine_over_solo_single_stream,
            q.engine_over_solo_spread[0],
            q.engine_over_solo_spread[1],
            q.engine_over_solo_pairs
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
            "single-stream decode at position 50: {:.1} tokens/s, at 1800: {:.1} ({:.2}x, {:.2}–{:.2} over {} back-to-back pairs)",
            q.decode_at_50_tokens_per_s,
            q.decode_at_1800_tokens_per_s,
            q.decode_1800_over_50,
            q.decode_1800_over_50_spread[0],
            q.decode_1800_over_50_spread[1],
            q.engine_over_solo_pairs
        );
        let c = q.decode_1800_cache;
        outln!(
            "decode at 1800 reads {:.1} MB more of the cache a step than at 50: at {} (0.8x the speed at 50 needs {:.1} GB/s; a plain read of memory here: {:.1} GB/s on one thread, {:.1} on {})",
            c.extra_mb_per_step,
            c.read_gbs.map_or("no extra time".to_string(), |g| format!("{g:.1} GB/s")),
            c.read_gbs_for_0_8,
            report.memory_read_gbs[0],
            report.memory_read_gbs[1],
            report.threads
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
        outln!(
            "\nllama.cpp (build {}, {} threads, repacking {}; {}; load average {} before, {} after) paired with nextok: {} pairs per row, back to back, llama.cpp first in even pairs and nextok in odd ones; tokens/s are medians over the pairs, the ratio is the median of the per-pair ratios nextok / llama.cpp, the spread their min–max",
            l.build_commit.as_deref().unwrap_or("unknown"),
            l.threads,
            if l.repack { "on" } else { "off" },
            l.model_files.join(", "),
            l.loadavg_before
                .map_or("unknown".into(), |x| format!("{x:.2}")),
            l.loadavg_after
                .map_or("unknown".into(), |x| format!("{x:.2}")),
            l.pairs
        );
        outln!("| weights | row | nextok tokens/s | llama.cpp tokens/s | nextok / llama.cpp | spread |");
        outln!("|---|---|---:|---:|---:|---:|");
        for r in &l.rows {
            outln!(
                "| {} | {} | {:.1} | {:.1} | {:.2} | {:.2}–{:.2} |",
                r.quant,
                match r.row {
                    "prompt" => "prompt (512-token prefill)",
                    "decode" => "decode (1 stream, 128 tokens)",
                    _ => "16 streams (20-token prompts, 128 tokens)",
                },
                r.nextok_tokens_per_s,
                r.llama_cpp_tokens_per_s,
                r.nextok_over_llama_cpp,
                r.ratio_min,
                r.ratio_max
            );
        }
    }
    print_roofline(&report);
    Ok(())
}

/// Bytes of the tensors a single-stream decode step multiplies, in the file at `path`: every
/// matrix but an untied embedding (see [`Roofline`]).
fn file_decode_step_bytes(path: &std::path::Path) -> Result<u64, String> {
    let f = nextok_model::file::GgufFile::open(path).map_err(|e| e.to_string())?;
    let untied = f.info("output.weight").is_some();
    let mut total = 0u64;
    for t in f.tensors() {
        if t.dims.len() != 2 || (untied && t.name == "token_embd.weight") {
            continue;
        }
        // the mapped range: its length, no page read
        total += f.bytes(t).map_err(|e| e.to_string())?.len() as u64;
    }
    Ok(total)
}

/// The roofline of single-stream decode (the weights read once a token, against the plain read
/// of memory measured in the same run), and the batched pass against the int8 peak.
fn print_roofline(report: &Report) {
    let bw = report.memory_read_gbs[1];
    let paired = |quant: &str, row: &str| {
        report.llama_cpp.as_ref().and_then(|l| {
            l.rows
                .iter()
                .find(|r| r.quant == quant && r.row == row)
                .map(|r| (r.nextok_tokens_per_s, r.llama_cpp_tokens_per_s))
        })
    };
    outln!(
        "\nroofline of single-stream decode: a step reads the weights once; at the plain read of memory measured here ({bw:.1} GB/s on {} threads) that allows bandwidth / bytes tokens/s{}",
        report.threads,
        if report.llama_cpp.is_some() {
            "; tokens/s are the paired medians above"
        } else {
            ""
        }
    );
    outln!("| weights | bytes a step reads: nextok / llama.cpp | tokens/s allowed: nextok / llama.cpp | decode tokens/s: nextok / llama.cpp | fraction of the roofline: nextok / llama.cpp |");
    outln!("|---|---|---|---|---|");
    let dash = "—".to_string();
    for q in &report.quants {
        let r = q.roofline;
        let allow = |b: u64| bw * 1e9 / b as f64;
        let (n_tps, l_tps) = match paired(&q.quant, "decode") {
            Some((n, l)) => (n, Some(l)),
            None => (q.decode_tokens_per_s, None),
        };
        outln!(
            "| {} | {:.3} / {} GB | {:.1} / {} | {:.1} / {} | {:.2} / {} |",
            q.quant,
            r.nextok_bytes as f64 / 1e9,
            format!("{:.3}", r.file_bytes as f64 / 1e9),
            allow(r.nextok_bytes),
            format!("{:.1}", allow(r.file_bytes)),
            n_tps,
            l_tps.map_or(dash.clone(), |l| format!("{l:.1}")),
            n_tps / allow(r.nextok_bytes),
            l_tps.map_or(dash.clone(), |l| format!("{:.2}", l / allow(r.file_bytes))),
        );
    }
    let Some((instr, peak)) = &report.int8_peak else {
        outln!("\nbatched decode: no int8 multiply-add peak on this CPU (no AVX2)");
        return;
    };
    outln!(
        "\nbatched decode: 16 streams read the weights once a pass, so the pass is bound by multiply-adds; the int8 multiply-add peak measured here: {peak:.0} G/s on {} threads ({instr})",
        report.threads
    );
    outln!("| weights | 16 streams / 1 stream: nextok / llama.cpp | nextok's 16-stream decode: G multiply-adds/s | of the int8 peak |");
    outln!("|---|---|---:|---:|");
    for q in &report.quants {
        let (n16, n1, l) = match (paired(&q.quant, "16 streams"), paired(&q.quant, "decode")) {
            (Some((n16, l16)), Some((n1, l1))) => (n16, n1, Some(l16 / l1)),
            _ => (
                q.decode_16_streams_tokens_per_s,
                q.decode_tokens_per_s,
                None,
            ),
        };
        let gmacs = n16 * q.roofline.macs as f64 / 1e9;
        outln!(
            "| {} | {:.2} / {} | {:.0} | {:.2} |",
            q.quant,
            n16 / n1,
            l.map_or(dash.clone(), |l| format!("{l:.2}")),
            gmacs,
            gmacs / peak
        );
    }
}
