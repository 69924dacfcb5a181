//! `nextok bench sampler [--json]`: the floor (one summing pass), a naive full-sort sampler and
//! nextok, interleaved in one process — round-robin per iteration, so machine noise hits all
//! three alike — plus batch stepping on one thread against two.
//!
//! Beside the fixture rows it runs flat rows (`crate::fixtures::flat_fixture`, unless
//! `--no-flat`), and on every row also nextok with the dense top-p's large-nucleus path off (the
//! band search alone, "bands"), in the same rotation, so the two paths are compared on the same
//! rows under the same load.
//!
//! Each timed call is preceded by an untimed call of the same method (warm caches, what a
//! back-to-back benchmark measures), or with `--cold` by a sweep over a buffer larger than the
//! last-level cache (logits and scratch come from memory, as after a model's forward pass).

use std::time::{Duration, Instant};

use crate::fixtures::{
    BatchBench, Case, StepBench, BATCH_ROWS, FLAT_VOCAB_SIZES, SPECIAL_TOKENS, TARGET_VOCAB,
    VOCAB_SIZES,
};
use nextok_core::cpu::{self, Level};
use serde::Serialize;

use crate::llama_peer::{ChainConfig, LlamaChain, LlamaLib};

/// Arguments of `nextok bench sampler`.
#[derive(clap::Args, Debug, Clone)]
pub struct SamplerArgs {
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Vocabulary sizes, comma-separated (default: 49152,128256,151936,262144).
    #[arg(long, value_delimiter = ',')]
    pub vocab: Vec<usize>,
    /// Interleaved per-step iterations (each runs floor, naive and nextok once per case).
    #[arg(long, default_value_t = 100)]
    pub iters: usize,
    /// Batch repetitions per thread count (alternating one and two threads).
    #[arg(long, default_value_t = 30)]
    pub batch_iters: usize,
    /// Evict the caches before every timed call instead of warming them.
    #[arg(long)]
    pub cold: bool,
    /// Use at most these kernels: `baseline`, `avx2` or `avx512` (results do not change): the
    /// sampler's names for the levels of the one process-wide kernel cap.
    #[arg(long)]
    pub simd: Option<String>,
    /// Also run both cases on a real logits row — the default model's (or `--model`'s) row
    /// after a chat prompt, with its vocabulary and the prompt as history.
    #[arg(long)]
    pub real: bool,
    /// `--real`: a GGUF file of a supported family, or a model name (default: the default
    /// model, fetched once).
    #[arg(long)]
    pub model: Option<std::path::PathBuf>,
    /// Leave out the flat rows (a Normal(0, 2) bulk and 20 strong tokens at 128,256 and
    /// 262,144 tokens, where top-p 0.95 keeps nuclei of 14 and 53 thousand).
    #[arg(long)]
    pub no_flat: bool,
    /// Also run llama.cpp's sampler chain, through its C API from this `libllama` shared
    /// library, on every row in the same rotation, with a third case (the default chain
    /// without penalties). `bench/peers/llama_sampler.sh` builds one and passes it.
    #[arg(long)]
    pub llama_lib: Option<std::path::PathBuf>,
}

#[derive(Serialize)]
struct StepRow {
    vocab: usize,
    /// `synthetic` (the fixture rows), `flat` (the flat rows) or the model whose logits row this
    /// is.
    logits: String,
    case: &'static str,
    name: &'static str,
    support: usize,
    floor_ns: f64,
    naive_ns: f64,
    nextok_ns: f64,
    normaliser_ns: f64,
    /// nextok with the dense top-p's large-nucleus path off (the band search alone).
    bands_ns: f64,
    nextok_over_floor: f64,
    naive_over_nextok: f64,
    normaliser_over_floor: f64,
    /// How much faster the large-nucleus path makes the step (1 where it does not run).
    bands_over_nextok: f64,
    /// llama.cpp's chain on the same row (with `--llama-lib`).
    #[serde(skip_serializing_if = "Option::is_none")]
    llama_ns: Option<f64>,
    /// How much faster nextok is than llama.cpp's chain.
    #[serde(skip_serializing_if = "Option::is_none")]
    llama_over_nextok: Option<f64>,
}

#[derive(Serialize)]
struct BatchRow {
    vocab: usize,
    case: &'static str,
    rows: usize,
    one_thread_rows_per_s: f64,
    two_threads_rows_per_s: f64,
    speedup: f64,
    /// From the fastest repetition of each (what the code does when the other core is free).
    best_one_thread_rows_per_s: f64,
    best_two_threads_rows_per_s: f64,
    best_speedup: f64,
}

#[derive(Serialize)]
struct Target {
    name: &'static str,
    limit: f64,
    measured: f64,
    met: bool,
}

#[derive(Serialize)]
struct Report {
    threads_available: usize,
    kernels: &'static str,
    caches: &'static str,
    iters: usize,
    batch_iters: usize,
    steps: Vec<StepRow>,
    batch: Vec<BatchRow>,
    targets: Vec<Target>,
}

/// The median (the mean of the middle two for an even count; NaN when empty).
pub(crate) fn median(xs: &mut [f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_unstable_by(|a, b| a.total_cmp(b));
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        0.5 * (xs[n / 2 - 1] + xs[n / 2])
    }
}

fn ns(d: Duration) -> f64 {
    d.as_secs_f64() * 1e9
}

/// Runs `nextok bench sampler`.
pub fn run(args: &SamplerArgs) -> Result<(), String> {
    let vocabs: Vec<usize> = if args.vocab.is_empty() {
        VOCAB_SIZES.to_vec()
    } else {
        args.vocab.clone()
    };
    if let Some(&v) = vocabs.iter().find(|&&v| v < 4 * SPECIAL_TOKENS) {
        return Err(format!(
            "--vocab {v} is too small (at least {})",
            4 * SPECIAL_TOKENS
        ));
    }
    if args.iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    if let Some(level) = &args.simd {
        cpu::set_max_level(match level.as_str() {
            "baseline" => Level::Scalar,
            "avx2" => Level::Avx2,
            "avx512" => Level::Avx512,
            other => {
                return Err(format!(
                    "unknown --simd `{other}` (expected baseline, avx2 or avx512)"
                ))
            }
        });
    }
    let kernels = nextok_core::math::kernel_name(Level::current());
    let threads_available = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let real = if args.real {
        real_benches(args)?
    } else {
        Vec::new()
    };
    let flat: &[usize] = if args.no_flat { &[] } else { &FLAT_VOCAB_SIZES };
    let llama = match &args.llama_lib {
        Some(p) => Some(crate::llama_peer::LlamaLib::load(p)?),
        None => None,
    };
    let steps = step_medians(
        &vocabs,
        flat,
        real,
        llama.as_ref(),
        args.iters,
        args.cold,
        !args.json,
    )?;
    let batch = batch_rates(&vocabs, args.batch_iters.max(1), !args.json);
    let targets = targets(&steps, &batch);
    let report = Report {
        threads_available,
        kernels,
        caches: if args.cold { "cold" } else { "warm" },
        iters: args.iters,
        batch_iters: args.batch_iters.max(1),
        steps,
        batch,
        targets,
    };
    if args.json {
        let s = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        outln!("{s}");
    } else {
        print_tables(&report);
    }
    Ok(())
}

/// Touches every cache line of a buffer larger than the last-level cache.
struct Evictor(Vec<u8>);

impl Evictor {
    fn new() -> Self {
        Evictor(vec![1u8; 128 << 20])
    }
    fn run(&mut self) {
        for line in self.0.chunks_mut(64) {
            line[0] = line[0].wrapping_add(1);
        }
        std::hint::black_box(&mut self.0);
    }
}

fn call(b: &mut StepBench, peer: Option<&mut LlamaChain<'_>>, which: usize) {
    match which {
        0 => {
            std::hint::black_box(b.floor());
        }
        1 => {
            std::hint::black_box(b.naive());
        }
        2 => {
            std::hint::black_box(b.nextok());
        }
        3 => {
            std::hint::black_box(b.normaliser());
        }
        4 => {
            std::hint::black_box(b.nextok_bands());
        }
        _ => {
            if let Some(c) = peer {
                std::hint::black_box(c.step(&b.fixture.logits));
            }
        }
    }
}

/// The methods [`call`] times: floor, naive, nextok, normaliser, nextok with the band search
/// alone, llama.cpp's chain (with `--llama-lib`).
const METHODS: usize = 6;

/// The cases run: both, and with llama.cpp beside nextok also the default chain without
/// penalties.
fn cases(peer: bool) -> &'static [Case] {
    if peer {
        &Case::WITH_PEER
    } else {
        &Case::ALL
    }
}

/// The cases on a real model's logits row (see `--real`), labelled with the model's name.
fn real_benches(args: &SamplerArgs) -> Result<Vec<(String, StepBench)>, String> {
    let path = crate::model_path(args.model.as_deref())?;
    let model =
        nextok_model::Model::load(&path, nextok_model::Requant::Keep).map_err(|e| e.to_string())?;
    let prompt = crate::user_prompt(&model, "Write one sentence about a cat.")?;
    let mut src = model.source();
    let row = nextok_model::LogitsSource::prefill(&mut src, &prompt).map_err(|e| e.to_string())?;
    let name = path
        .file_stem()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    Ok(cases(args.llama_lib.is_some())
        .iter()
        .map(|&case| {
            let fixture = crate::fixtures::Fixture {
                vocab: model.vocab.info.clone(),
                logits: row.clone(),
                history: prompt.clone(),
                strong: Vec::new(),
            };
            (name.clone(), StepBench::with_fixture(case, fixture))
        })
        .collect())
}

fn step_medians(
    vocabs: &[usize],
    flat: &[usize],
    real: Vec<(String, StepBench)>,
    llama: Option<&LlamaLib>,
    iters: usize,
    cold: bool,
    progress: bool,
) -> Result<Vec<StepRow>, String> {
    let mut benches: Vec<StepBench> = Vec::new();
    let mut labels: Vec<String> = Vec::new();
    let cases = cases(llama.is_some());
    for &v in vocabs {
        for &case in cases {
            benches.push(StepBench::new(case, v));
            labels.push("synthetic".into());
        }
    }
    for &v in flat {
        for &case in cases {
            benches.push(StepBench::flat(case, v));
            labels.push("flat".into());
        }
    }
    for (label, b) in real {
        benches.push(b);
        labels.push(label);
    }
    let supports: Vec<usize> = benches.iter_mut().map(|b| b.nextok_support()).collect();
    let mut peers: Vec<Option<LlamaChain<'_>>> = match llama {
        None => benches.iter().map(|_| None).collect(),
        Some(lib) => benches
            .iter()
            .map(|b| {
                LlamaChain::new(
                    lib,
                    &peer_config(b),
                    b.fixture.logits.len(),
                    &b.fixture.history,
                )
                .map(Some)
            })
            .collect::<Result<_, String>>()?,
    };
    let mut evict = cold.then(Evictor::new);
    let mut times: Vec<[Vec<f64>; METHODS]> = (0..benches.len())
        .map(|_| std::array::from_fn(|_| Vec::with_capacity(iters)))
        .collect();
    for it in 0..iters {
        if progress && it % 10 == 0 {
            eprint!("\rper-step iterations: {it}/{iters}");
        }
        for ((b, t), peer) in benches.iter_mut().zip(times.iter_mut()).zip(&mut peers) {
            // rotate the order so no method always follows the same one
            for k in 0..METHODS {
                let which = (it + k) % METHODS;
                if which == METHODS - 1 && peer.is_none() {
                    continue;
                }
                match evict.as_mut() {
                    Some(e) => e.run(),
                    None => call(b, peer.as_mut(), which),
                }
                let t0 = Instant::now();
                call(b, peer.as_mut(), which);
                t[which].push(ns(t0.elapsed()));
            }
        }
    }
    if progress {
        eprintln!("\rper-step iterations: {iters}/{iters}");
    }
    Ok(benches
        .iter()
        .zip(times.iter_mut())
        .zip(supports)
        .zip(labels)
        .map(|(((b, t), support), logits)| {
            let floor = median(&mut t[0]);
            let naive = median(&mut t[1]);
            let nextok = median(&mut t[2]);
            let normaliser = median(&mut t[3]);
            let bands = median(&mut t[4]);
            let llama = (!t[5].is_empty()).then(|| median(&mut t[5]));
            StepRow {
                vocab: b.fixture.logits.len(),
                logits,
                case: b.case.key(),
                name: b.case.name(),
                support,
                floor_ns: floor,
                naive_ns: naive,
                nextok_ns: nextok,
                normaliser_ns: normaliser,
                bands_ns: bands,
                nextok_over_floor: nextok / floor,
                naive_over_nextok: naive / nextok,
                normaliser_over_floor: normaliser / floor,
                bands_over_nextok: bands / nextok,
                llama_ns: llama,
                llama_over_nextok: llama.map(|l| l / nextok),
            }
        })
        .collect())
}

/// llama.cpp's chain for a workload: the same settings as the case's nextok pipeline.
fn peer_config(b: &StepBench) -> ChainConfig {
    let vocab = &b.fixture.vocab;
    // the special mask with `ignore_eos`: every special id, EOS too
    let banned = vocab.special_token_ids.to_vec();
    let p = b.case.params();
    ChainConfig {
        banned,
        penalties: match (p.repetition_penalty, p.penalty_last_n) {
            (Some(rep), Some(n)) => Some((
                n as i32,
                rep,
                p.frequency_penalty.unwrap_or(0.0),
                p.presence_penalty.unwrap_or(0.0),
            )),
            _ => None,
        },
        top_k: p.top_k.map_or(0, |k| k as i32),
        top_p: p.top_p.unwrap_or(1.0) as f32,
        min_p: p.min_p.unwrap_or(0.0) as f32,
        temperature: p.temperature.unwrap_or(1.0),
        seed: 7,
    }
}

fn batch_rates(vocabs: &[usize], iters: usize, progress: bool) -> Vec<BatchRow> {
    let mut rows = Vec::new();
    for &v in vocabs {
        for case in Case::ALL {
            if progress {
                eprint!("\rbatch: {} at V = {v}            ", case.key());
            }
            let mut b = BatchBench::new(case, v, BATCH_ROWS, &[1, 2]);
            b.run(1);
            b.run(2);
            let mut one = Vec::with_capacity(iters);
            let mut two = Vec::with_capacity(iters);
            for it in 0..iters {
                if it % 2 == 0 {
                    one.push(b.run(1).as_secs_f64());
                    two.push(b.run(2).as_secs_f64());
                } else {
                    two.push(b.run(2).as_secs_f64());
                    one.push(b.run(1).as_secs_f64());
                }
            }
            let r1 = b.rows() as f64 / median(&mut one);
            let r2 = b.rows() as f64 / median(&mut two);
            // `median` sorted the times: the first is the fastest
            let b1 = b.rows() as f64 / one[0];
            let b2 = b.rows() as f64 / two[0];
            rows.push(BatchRow {
                vocab: v,
                case: case.key(),
                rows: b.rows(),
                one_thread_rows_per_s: r1,
                two_threads_rows_per_s: r2,
                speedup: r2 / r1,
                best_one_thread_rows_per_s: b1,
                best_two_threads_rows_per_s: b2,
                best_speedup: b2 / b1,
            });
        }
    }
    if progress {
        eprintln!("\rbatch: done                                   ");
    }
    rows
}

fn targets(steps: &[StepRow], batch: &[BatchRow]) -> Vec<Target> {
    let mut out = Vec::new();
    let step = |case: &str| {
        steps
            .iter()
            .find(|s| s.vocab == TARGET_VOCAB && s.case == case && s.logits == "synthetic")
    };
    if let Some(s) = step(Case::DefaultChain.key()) {
        out.push(Target {
            name: "default chain: nextok / floor <= 3",
            limit: 3.0,
            measured: s.nextok_over_floor,
            met: s.nextok_over_floor <= 3.0,
        });
    }
    if let Some(s) = step(Case::TopPOnly.key()) {
        out.push(Target {
            name: "top-p alone: nextok / floor <= 5",
            limit: 5.0,
            measured: s.nextok_over_floor,
            met: s.nextok_over_floor <= 5.0,
        });
        out.push(Target {
            name: "top-p alone: naive / nextok >= 30",
            limit: 30.0,
            measured: s.naive_over_nextok,
            met: s.naive_over_nextok >= 30.0,
        });
    }
    for s in steps
        .iter()
        .filter(|s| s.logits == "flat" && s.case == Case::TopPOnly.key())
    {
        out.push(Target {
            name: if s.vocab == TARGET_VOCAB {
                "flat row, V = 128,256, top-p alone: nextok / floor <= 8"
            } else {
                "flat row, V = 262,144, top-p alone: nextok / floor <= 8"
            },
            limit: 8.0,
            measured: s.nextok_over_floor,
            met: s.nextok_over_floor <= 8.0,
        });
    }
    for (case, limit, name) in [
        (
            Case::NoPenalties,
            3.0,
            "default chain, no penalties: llama.cpp / nextok >= 3",
        ),
        (
            Case::TopPOnly,
            30.0,
            "top-p alone: llama.cpp / nextok >= 30",
        ),
    ] {
        if let Some(r) = step(case.key()).and_then(|s| s.llama_over_nextok) {
            out.push(Target {
                name,
                limit,
                measured: r,
                met: r >= limit,
            });
        }
    }
    for b in batch.iter().filter(|b| b.vocab == TARGET_VOCAB) {
        let dc = b.case == Case::DefaultChain.key();
        out.push(Target {
            name: if dc {
                "batch 64, default chain: 2 threads / 1 thread >= 1.8 (medians)"
            } else {
                "batch 64, top-p alone: 2 threads / 1 thread >= 1.8 (medians)"
            },
            limit: 1.8,
            measured: b.speedup,
            met: b.speedup >= 1.8,
        });
        out.push(Target {
            name: if dc {
                "batch 64, default chain: 2 threads / 1 thread >= 1.8 (fastest)"
            } else {
                "batch 64, top-p alone: 2 threads / 1 thread >= 1.8 (fastest)"
            },
            limit: 1.8,
            measured: b.best_speedup,
            met: b.best_speedup >= 1.8,
        });
    }
    out
}

/// A step row's label: the case, and the logits row when it is not the fixture's.
fn row_name(s: &StepRow) -> String {
    if s.logits == "synthetic" {
        s.name.to_string()
    } else {
        format!("{} [{}]", s.name, s.logits)
    }
}

fn print_tables(r: &Report) {
    outln!(
        "nextok bench sampler: {} interleaved iterations, {} caches, {} kernels, medians per step; {} threads available",
        r.iters, r.caches, r.kernels, r.threads_available
    );
    outln!();
    outln!(
        "{:>7}  {:<36} {:>7} {:>9} {:>10} {:>10} {:>12} {:>12} {:>10} {:>10} {:>12}",
        "vocab",
        "case",
        "support",
        "floor µs",
        "naive µs",
        "nextok µs",
        "nextok/floor",
        "naive/nextok",
        "norm/floor",
        "bands µs",
        "bands/nextok"
    );
    for s in &r.steps {
        let name = row_name(s);
        outln!(
            "{:>7}  {:<36} {:>7} {:>9.2} {:>10.1} {:>10.2} {:>12.2} {:>12.1} {:>10.2} {:>10.2} {:>12.2}",
            s.vocab,
            name,
            s.support,
            s.floor_ns / 1e3,
            s.naive_ns / 1e3,
            s.nextok_ns / 1e3,
            s.nextok_over_floor,
            s.naive_over_nextok,
            s.normaliser_over_floor,
            s.bands_ns / 1e3,
            s.bands_over_nextok
        );
    }
    outln!(
        "support: the final support (for top-p alone, the nucleus); norm/floor: the exact \
         softmax normaliser alone (one exp_f32 and an f64 lane sum per token), which a dense \
         top-p must compute; bands: nextok with the dense top-p's large-nucleus path off (the \
         band search alone; the same tokens); [flat]: a Normal(0, 2) bulk and 20 strong tokens"
    );
    if r.steps.iter().any(|s| s.llama_ns.is_some()) {
        outln!();
        outln!(
            "llama.cpp's sampler chain on the same rows, in the same rotation (medians per step)"
        );
        outln!(
            "{:>7}  {:<50} {:>10} {:>11} {:>13}",
            "vocab",
            "case",
            "nextok µs",
            "llama.cpp µs",
            "llama/nextok"
        );
        for s in &r.steps {
            if let (Some(l), Some(ratio)) = (s.llama_ns, s.llama_over_nextok) {
                let name = row_name(s);
                outln!(
                    "{:>7}  {:<50} {:>10.2} {:>11.2} {:>13.2}",
                    s.vocab,
                    name,
                    s.nextok_ns / 1e3,
                    l / 1e3,
                    ratio
                );
            }
        }
        outln!(
            "llama.cpp: llama_sampler_apply and llama_sampler_accept on a chain of logit bias \
             (the special ids), penalties, top-k, top-p, min-p, temperature and dist, as \
             llama.cpp's common sampler builds it (the samplers that are off left out), after \
             filling the candidate array from the row, as llama_sampler_sample does"
        );
    }
    outln!();
    outln!(
        "batch of {BATCH_ROWS} rows, {} repetitions each alternating 1 and 2 threads: medians, then the fastest repetitions",
        r.batch_iters
    );
    outln!(
        "{:>7}  {:<28} {:>15} {:>16} {:>6} {:>15} {:>16} {:>6}",
        "vocab",
        "case",
        "1 thread rows/s",
        "2 threads rows/s",
        "ratio",
        "best 1 thread",
        "best 2 threads",
        "ratio"
    );
    for b in &r.batch {
        let name = if b.case == Case::DefaultChain.key() {
            Case::DefaultChain.name()
        } else {
            Case::TopPOnly.name()
        };
        outln!(
            "{:>7}  {:<28} {:>15.0} {:>16.0} {:>6.2} {:>15.0} {:>16.0} {:>6.2}",
            b.vocab,
            name,
            b.one_thread_rows_per_s,
            b.two_threads_rows_per_s,
            b.speedup,
            b.best_one_thread_rows_per_s,
            b.best_two_threads_rows_per_s,
            b.best_speedup
        );
    }
    if !r.targets.is_empty() {
        outln!();
        outln!("targets (at V = {TARGET_VOCAB} unless stated)");
        for t in &r.targets {
            outln!(
                "  {:<66} measured {:>7.2}  {}",
                t.name,
                t.measured,
                if t.met { "met" } else { "MISSED" }
            );
        }
    }
}
