//! `nextok bench decode`: decode speed on a real model, every mode in one process.
//!
//! One chat prompt is prefilled once per quantisation; each run forks its KV branch and decodes
//! `--max-tokens` tokens (EOS ignored) with temperature 0.8 and top-p 0.95 in one of four modes:
//!
//! * `unconstrained` — the plain sampler step;
//! * `json_schema` — a JSON-schema constraint (an array of at least eight
//!   `{name, age, city}` objects, so the grammar never completes inside the run), its next mask
//!   computed on a second thread while the model runs ([`nextok_core::Sampler::prepare`]);
//! * `json_schema_inline` — the same constraint with the mask computed inside the step;
//! * `trace` — unconstrained, every step recorded (8 candidates) and serialised as a trace line.
//!
//! The modes run round-robin, `--reps` times, for the shipped quantisation and the Q8_0
//! re-quantisation; each mode's figure is the median over its runs, and its ratio to the
//! unconstrained run is taken per repetition (paired) before the median. Because the model's
//! time dominates and a shared machine's speed drifts, the table also gives the ratio that the
//! mode's added critical-path time alone implies. The share columns split
//! the loop's wall clock: the sampler step (processing, selection, commit, and the mask when it
//! is computed inline), and the mask prepared on the other thread — which is off the critical
//! path, except for the wait after the model call, reported separately.

use std::time::Duration;

use nextok_constraint::ConstraintSpec;
use nextok_core::SamplingParams;
use nextok_model::{LogitsSource, Requant};
use serde::Serialize;

use crate::ModelArgs;
use nextok_engine::solo::{run_sequence, SeqTime, SoloOptions};
use nextok_engine::{Engine, EngineConfig, GenerateRequest, Prompt};

/// Arguments of `nextok bench decode`.
#[derive(clap::Args, Debug, Clone)]
pub struct DecodeArgs {
    /// `--model`, `--kernels`.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Tokens per run (at least 2).
    #[arg(long, default_value_t = 96)]
    pub max_tokens: u64,
    /// Runs per mode (the modes alternate).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
}

const PROMPT: &str = "List eight people as JSON objects with name, age and city.";

/// The benchmarks' schema: an array of at least eight `{name, age, city}` objects, so a
/// constrained run never completes inside the benchmark.
pub(crate) fn schema() -> serde_json::Value {
    serde_json::json!({
        "type": "array",
        "minItems": 8,
        "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer"},
                "city": {"type": "string"}
            },
            "required": ["name", "age", "city"],
            "additionalProperties": false
        }
    })
}

const MODES: [&str; 4] = [
    "unconstrained",
    "json_schema",
    "json_schema_inline",
    "trace",
];

#[derive(Serialize)]
struct Row {
    quant: &'static str,
    mode: &'static str,
    tokens: usize,
    runs: usize,
    tokens_per_s: f64,
    /// Median over repetitions of this run's tokens/s over the unconstrained run's.
    over_unconstrained: f64,
    /// Time per token this mode adds to the decode loop's critical path (sampler step and
    /// the wait for a prepared mask) beyond the unconstrained sampler step.
    critical_path_added_us: f64,
    /// The tokens/s ratio that added time alone implies (model time held equal).
    critical_path_ratio: f64,
    sample_share: f64,
    prepare_share: f64,
    wait_share: f64,
    sample_us_per_token: f64,
    prepare_us_per_token: f64,
}

#[derive(Serialize)]
struct Report {
    model: String,
    simd: String,
    threads_available: usize,
    max_tokens: u64,
    reps: usize,
    rows: Vec<Row>,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_unstable_by(|a, b| a.total_cmp(b));
    match xs.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => xs[n / 2],
        n => 0.5 * (xs[n / 2 - 1] + xs[n / 2]),
    }
}

/// Runs `nextok bench decode`.
pub fn run(args: &DecodeArgs) -> Result<(), String> {
    let reps = args.reps.max(1);
    let max_tokens = args.max_tokens;
    if max_tokens < 2 {
        return Err("--max-tokens must be at least 2".into());
    }
    let path = args.model.path()?;
    let mut rows = Vec::new();
    for (quant, requant) in [("as shipped", Requant::Keep), ("q8_0", Requant::Q8_0)] {
        let model = crate::load_model(&path, requant)?;
        let prompt = crate::user_prompt(&model, PROMPT)?;
        let base_params = SamplingParams {
            temperature: Some(0.8),
            top_p: Some(0.95),
            max_tokens: Some(max_tokens),
            ignore_eos: true,
            ..Default::default()
        };
        let constrained_params = SamplingParams {
            constraint: Some(ConstraintSpec::JsonSchema {
                schema: schema(),
                options: Default::default(),
            }),
            ..base_params.clone()
        };
        let model = std::sync::Arc::new(model);
        let engine =
            Engine::new(model.clone(), EngineConfig::default()).map_err(|e| e.to_string())?;
        let prepare = |p: &SamplingParams| {
            let mut r = GenerateRequest::new(Prompt::Ids(prompt.clone()));
            r.params = p.clone();
            engine.prepare(&r).map_err(|e| e.to_string())
        };
        let plain = prepare(&base_params)?;
        let constrained = prepare(&constrained_params)?;
        let constraint = constrained.constraint.clone();
        let mut base = model.source();
        let row0 = base.prefill(&prompt).map_err(|e| e.to_string())?;
        let mut results: Vec<Vec<(usize, SeqTime)>> = vec![Vec::new(); MODES.len()];
        for rep in 0..reps {
            for (mi, mode) in MODES.iter().enumerate() {
                let constrained_mode = mode.starts_with("json_schema");
                let opts = SoloOptions {
                    record: (*mode == "trace").then_some(8),
                    constraint: if constrained_mode {
                        constraint.clone()
                    } else {
                        None
                    },
                    overlap: *mode != "json_schema_inline",
                    speculative: None,
                };
                let sampler = if constrained_mode {
                    &constrained.sampler
                } else {
                    &plain.sampler
                };
                let src = base.fork().map_err(|e| e.to_string())?;
                let t = std::time::Instant::now();
                let out = run_sequence(
                    &model,
                    sampler,
                    src,
                    &prompt,
                    row0.clone(),
                    rep as u64,
                    &opts,
                )
                .map_err(|e| e.to_string())?;
                let mut time = out.time;
                if *mode == "trace" {
                    // what `--trace` adds: each record as a JSON line
                    let mut bytes = 0usize;
                    for r in &out.records {
                        bytes += serde_json::to_string(r).map_err(|e| e.to_string())?.len();
                    }
                    std::hint::black_box(bytes);
                    time.total = t.elapsed();
                    time.sample += time.total.saturating_sub(out.time.total);
                }
                if !args.json {
                    eprintln!(
                        "  {quant} {mode} rep {rep}: {} tokens, {:.1} tokens/s",
                        out.tokens.len(),
                        out.tokens.len() as f64 / time.total.as_secs_f64()
                    );
                }
                results[mi].push((out.tokens.len(), time));
            }
        }
        let rate = |r: &[(usize, SeqTime)]| {
            median(
                r.iter()
                    .map(|(n, t)| *n as f64 / t.total.as_secs_f64())
                    .collect(),
            )
        };
        // each mode against the unconstrained run of the same repetition (paired: a slow
        // phase of a shared machine hits both), median over repetitions
        let paired = |r: &[(usize, SeqTime)]| {
            median(
                r.iter()
                    .zip(&results[0])
                    .map(|((n, t), (n0, t0))| {
                        (*n as f64 / t.total.as_secs_f64()) / (*n0 as f64 / t0.total.as_secs_f64())
                    })
                    .collect(),
            )
        };
        let base_sample = median(
            results[0]
                .iter()
                .map(|(n, t)| t.sample.as_secs_f64() * 1e6 / *n as f64)
                .collect(),
        );
        for (mi, mode) in MODES.iter().enumerate() {
            let r = &results[mi];
            let share = |f: fn(&SeqTime) -> Duration| {
                median(
                    r.iter()
                        .map(|(_, t)| f(t).as_secs_f64() / t.total.as_secs_f64())
                        .collect(),
                )
            };
            let per_token = |f: fn(&SeqTime) -> Duration| {
                median(
                    r.iter()
                        .map(|(n, t)| f(t).as_secs_f64() * 1e6 / *n as f64)
                        .collect(),
                )
            };
            let tps = rate(r);
            let us_per_token = 1e6 / tps;
            let added = per_token(|t| t.sample) + per_token(|t| t.wait) - base_sample;
            rows.push(Row {
                quant,
                mode,
                tokens: r.first().map(|x| x.0).unwrap_or(0),
                runs: r.len(),
                tokens_per_s: tps,
                over_unconstrained: paired(r),
                critical_path_added_us: added,
                critical_path_ratio: us_per_token / (us_per_token + added.max(0.0)),
                sample_share: share(|t| t.sample),
                prepare_share: share(|t| t.prepare),
                wait_share: share(|t| t.wait),
                sample_us_per_token: per_token(|t| t.sample),
                prepare_us_per_token: per_token(|t| t.prepare),
            });
        }
    }
    let report = Report {
        model: path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
        simd: nextok_model::simd_features(),
        threads_available: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        max_tokens,
        reps,
        rows,
    };
    if args.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?
        );
    } else {
        outln!(
            "decode: {} ({} threads available, SIMD {}), {} tokens per run, {} runs per mode, medians",
            report.model, report.threads_available, report.simd, max_tokens, reps
        );
        outln!(
            "| weights | mode | tokens/s | × unconstrained (paired) | × implied by added time | sampler step | µs/token | mask ahead (other thread) | µs/token | waited for mask |"
        );
        outln!("|---|---|---|---|---|---|---|---|---|---|");
        for r in &report.rows {
            outln!(
                "| {} | {} | {:.1} | {:.3} | {:.4} | {:.2} % | {:.0} | {:.2} % | {:.0} | {:.2} % |",
                r.quant,
                r.mode,
                r.tokens_per_s,
                r.over_unconstrained,
                r.critical_path_ratio,
                100.0 * r.sample_share,
                r.sample_us_per_token,
                100.0 * r.prepare_share,
                r.prepare_us_per_token,
                100.0 * r.wait_share
            );
        }
    }
    Ok(())
}
