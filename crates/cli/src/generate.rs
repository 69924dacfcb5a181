//! `nextok generate` and `nextok replay`: decoding a real model end to end.
//!
//! `generate` loads a GGUF model of a supported family (`--model PATH` or a model name, or the default model
//! fetched once into the cache), tokenises the prompt (or renders the file's chat template with
//! `--chat`), and streams the continuation to stdout through the sampler's text stream. The
//! sampling flags carry vLLM / OpenAI names and build a preset pipeline (`--pipeline`, default
//! `reference`); `--pipeline FILE` takes a pipeline JSON instead. The finish reason goes to
//! stderr.
//!
//! With `--json-schema`, stderr first says which keywords the mask enforces and which are
//! checked after generation (`--schema-mode relaxed` compiles schemas with keywords the mask
//! cannot enforce), and each finish line ends with the check of the output against the full
//! schema (`; schema check: valid`, `invalid: …` or `not checked: …`).
//!
//! `-n N` runs N sequences from one prefilled prompt, sequence `i` with seed `seed + i`
//! (wrapping). Each sequence forks the prompt's KV branch and owns its random stream, so its
//! tokens are the same whether it runs with others or alone with that seed.
//!
//! `--trace FILE` writes JSON Lines: a header (`{"nextok_trace": 1, ...}`: model SHA-256,
//! re-quantisation, prompt ids, parameters, pipeline and its hash, stop config, seeds, how many
//! candidates each record keeps, and for a JSON schema its keyword report), then one
//! [`StepRecord`](nextok_core::StepRecord) per step, sequence after sequence.
//! `nextok replay FILE` re-runs that request on the same model and compares every record
//! field by field; the first difference is named (step, sequence, field) and the exit status is
//! non-zero. Logits are bit-identical across runs and thread counts of one build, not across
//! builds with different SIMD features (candle picks its kernels at compile time; the header
//! records the features, and a replay on another build says so).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nextok_engine::speculative::{Acceptance, SpecOptions};

use nextok_constraint::ConstraintSpec;
use nextok_core::pipeline::resolve::{resolve, Request as ResolveRequest};
use nextok_core::{FinishReason, Layer, PipelineConfig, Preset, SamplingParams, StopConfig};
use nextok_engine::solo::BeamEnd;
use nextok_engine::trace::{self, TraceHeader};
use nextok_engine::{
    Engine, EngineConfig, Event, GenerateRequest, LogprobOptions, PipelineChoice, Prompt,
};
use nextok_model::chat::Message;
use nextok_model::{load_model, model_path, KvCacheType, Model, Requant};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::CliError;

/// Which layer `--logprobs` reports.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum LayerArg {
    /// Log-softmax of the raw logits.
    Raw,
    /// Log-softmax of the processed logits.
    Processed,
    /// The selection distribution.
    Selection,
}

impl From<LayerArg> for Layer {
    fn from(l: LayerArg) -> Layer {
        match l {
            LayerArg::Raw => Layer::Raw,
            LayerArg::Processed => Layer::Processed,
            LayerArg::Selection => Layer::Selection,
        }
    }
}

/// Re-quantisation at load.
#[derive(Clone, Copy, Debug, clap::ValueEnum, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RequantArg {
    /// Keep the file's quantisation.
    Keep,
    /// Re-quantise 4/5-bit matrices to Q8_0 (faster on x86).
    #[value(name = "q8_0")]
    Q8_0,
}

impl From<RequantArg> for Requant {
    fn from(r: RequantArg) -> Requant {
        match r {
            RequantArg::Keep => Requant::Keep,
            RequantArg::Q8_0 => Requant::Q8_0,
        }
    }
}

/// What the KV cache stores keys and values as.
#[derive(Clone, Copy, Debug, Default, clap::ValueEnum, PartialEq, Eq)]
pub enum KvCacheArg {
    /// Half precision (llama.cpp's default cache type).
    #[default]
    F16,
    /// GGML's Q8_0 blocks: 56 % of the memory, about half the bytes a long-context step
    /// reads (llama.cpp's `--cache-type-k q8_0 --cache-type-v q8_0`).
    #[value(name = "q8_0")]
    Q8_0,
}

impl From<KvCacheArg> for KvCacheType {
    fn from(k: KvCacheArg) -> KvCacheType {
        match k {
            KvCacheArg::F16 => KvCacheType::F16,
            KvCacheArg::Q8_0 => KvCacheType::Q8_0,
        }
    }
}

fn parse_bias(s: &str) -> Result<(u32, f32), String> {
    let (id, b) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected ID=BIAS"))?;
    Ok((
        id.trim()
            .parse()
            .map_err(|e| format!("`{s}`: token id: {e}"))?,
        b.trim().parse().map_err(|e| format!("`{s}`: bias: {e}"))?,
    ))
}

/// Arguments of `nextok generate`.
#[derive(clap::Args, Debug)]
#[command(allow_negative_numbers = true)]
pub struct GenerateArgs {
    /// The prompt (with `--chat`, the user's message).
    #[arg(allow_hyphen_values = true)]
    pub prompt: String,
    /// Render the model's chat template around the prompt (a user message).
    #[arg(long)]
    pub chat: bool,
    /// A system message for `--chat` (else the template's default, if any).
    #[arg(long)]
    pub system: Option<String>,
    /// A GGUF file (llama, qwen2, qwen3, gemma3 or phi3), or a model name fetched once
    /// (`smollm2-135m-instruct`, the default; `gemma-3-270m`).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Re-quantise the weights at load.
    #[arg(long, value_enum, default_value = "keep")]
    pub requant: RequantArg,
    /// What the KV cache stores keys and values as (recorded in the trace).
    #[arg(long, value_enum, default_value = "f16")]
    pub kv_cache_type: KvCacheArg,
    /// A preset (`reference`, `hf`, `vllm`, `llama.cpp`) or a pipeline JSON file.
    #[arg(long, default_value = "reference")]
    pub pipeline: String,
    /// Temperature (`0` = greedy).
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Top-k (`<= 0` disables).
    #[arg(long)]
    pub top_k: Option<i64>,
    /// Top-p (nucleus).
    #[arg(long)]
    pub top_p: Option<f64>,
    /// Min-p.
    #[arg(long)]
    pub min_p: Option<f64>,
    /// Typical-p.
    #[arg(long)]
    pub typical_p: Option<f64>,
    /// Presence penalty.
    #[arg(long)]
    pub presence_penalty: Option<f32>,
    /// Frequency penalty.
    #[arg(long)]
    pub frequency_penalty: Option<f32>,
    /// Repetition penalty (CTRL).
    #[arg(long)]
    pub repetition_penalty: Option<f32>,
    /// `ID=BIAS` (repeatable).
    #[arg(long = "logit-bias", value_parser = parse_bias)]
    pub logit_bias: Vec<(u32, f32)>,
    /// EOS and stop tokens are masked until this many tokens exist.
    #[arg(long)]
    pub min_tokens: Option<u64>,
    /// Most tokens per sequence (default 256).
    #[arg(long, default_value_t = 256)]
    pub max_tokens: u64,
    /// A stop string (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// A stop token id (repeatable).
    #[arg(long = "stop-token-id")]
    pub stop_token_ids: Vec<u32>,
    /// Do not stop at EOS.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Request seed (sequence `i` uses `seed + i`); without it a fresh seed is drawn, printed
    /// and recorded in the trace.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Number of sequences.
    #[arg(short = 'n', long = "n", default_value_t = 1)]
    pub n: usize,
    /// Constrain the output to JSON valid against this JSON-schema file.
    #[arg(long = "json-schema")]
    pub json_schema: Option<PathBuf>,
    /// With --json-schema: `strict` refuses keywords the mask cannot enforce exactly; `relaxed`
    /// masks a superset and validates the finished output against the full schema.
    #[arg(long = "schema-mode", value_name = "MODE", default_value = "strict")]
    pub schema_mode: nextok_constraint::SchemaMode,
    /// With --json-schema: `schema` takes object properties in schema order (fastest; key
    /// tokens are forced), `any` in any order (each key once, required keys present). Default:
    /// `any` with `--schema-mode relaxed`, else `schema`.
    #[arg(long = "property-order", value_name = "ORDER")]
    pub property_order: Option<nextok_constraint::PropertyOrder>,
    /// Constrain the output to any JSON value.
    #[arg(long)]
    pub json: bool,
    /// Constrain the output to a full match of this regular expression.
    #[arg(long)]
    pub regex: Option<String>,
    /// Constrain the output to one of these strings (repeatable).
    #[arg(long)]
    pub choice: Vec<String>,
    /// Constrain the output to this Lark-style grammar file (start rule `start`).
    #[arg(long)]
    pub grammar: Option<PathBuf>,
    /// Constrain the output to this llama.cpp GBNF grammar file (start rule `root`).
    #[arg(long)]
    pub gbnf: Option<PathBuf>,
    /// After the constraint accepts: `only_end` (default: only what it still allows, or EOS),
    /// `stop_on_accept`, or `continue` (stop masking).
    #[arg(long = "grammar-policy")]
    pub grammar_policy: Option<String>,
    /// Print the N best candidates of each step with their logprobs (stderr).
    #[arg(long)]
    pub logprobs: Option<usize>,
    /// The layer of `--logprobs`.
    #[arg(long, value_enum, default_value = "selection")]
    pub logprob_layer: LayerArg,
    /// After the text, print the whole decoding ledger of this step (0-based; stderr): every
    /// processor's support size, then per token the raw logit, whether it is allowed, its
    /// processed probability, whether it is kept, and its final probability.
    #[arg(long)]
    pub ledger: Option<u64>,
    /// Write a JSON Lines trace (header, then one step record per line).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Candidates kept in each trace record.
    #[arg(long, default_value_t = 8)]
    pub trace_candidates: usize,
    /// With --trace: store every step's raw logits in its record, compressed (about 3 bytes a
    /// vocabulary entry a step: ~150 KB a step for a 49,152-token vocabulary, against a few
    /// KB without), so `nextok replay --sampler-only` checks the sampler, the constraint and
    /// the stop conditions without the model, on any build whose sampler numerics match.
    #[arg(long, requires = "trace")]
    pub trace_logits: bool,
    /// Beam search with this many hypotheses. Each hypothesis runs the pipeline with its own
    /// state (masks, penalties, constraint, stop conditions); scores are processed-layer
    /// logprobs, and only tokens in the final support (after top-k/top-p/min-p) are proposed.
    #[arg(long)]
    pub beam_width: Option<usize>,
    /// Beam search length penalty `α` in `logprob / len^α`.
    #[arg(long, default_value_t = 1.0)]
    pub length_penalty: f64,
    /// Speculative decoding, `ngram` or `ngram:K` (prompt-lookup drafts of at most K tokens,
    /// default 7) or `model` / `model:K` (the greedy drafts of `--draft-model`), verified in
    /// one forward pass and judged by `--spec-acceptance`.
    #[arg(long)]
    pub speculative: Option<String>,
    /// How drafted tokens are accepted: `exact` (only where the sampler selects the drafted
    /// token itself, so the output and the trace's tokens are exactly plain decoding's) or
    /// `rejection` (Leviathan's rule on the stream's acceptance draws: distributed as plain
    /// decoding, not token for token).
    #[arg(long, default_value = "exact", requires = "speculative")]
    pub spec_acceptance: String,
    /// A draft model for `--speculative model[:K]` (a GGUF file with the model's vocabulary;
    /// loaded with the same `--requant`).
    #[arg(long, requires = "speculative")]
    pub draft_model: Option<PathBuf>,
}

/// `--speculative`'s value with `--spec-acceptance`.
fn speculative(v: Option<&str>, acceptance: &str) -> Result<Option<SpecOptions>, CliError> {
    let acceptance = acceptance
        .parse::<Acceptance>()
        .map_err(|e| format!("--spec-acceptance: {e}"))?;
    let Some(v) = v else {
        return Ok(None);
    };
    SpecOptions::parse(v, acceptance)
        .map(Some)
        .map_err(|e| format!("--speculative: {e}").into())
}

/// Arguments of `nextok replay`.
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// A trace written by `nextok generate --trace`.
    pub file: PathBuf,
    /// The model file (default: the recorded file name, looked for in the trace's directory,
    /// else the default model); its SHA-256 must be the recorded one.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The draft model of a trace recorded with `--speculative model` (its SHA-256 must be
    /// the recorded one).
    #[arg(long)]
    pub draft_model: Option<PathBuf>,
    /// Replay the sampler alone: feed every step's stored raw logits (a trace recorded with
    /// `--trace-logits`) through the pipeline, the constraint and the stop conditions, without
    /// running the model; needs only the sampler's numerics to be the trace's.
    #[arg(long)]
    pub sampler_only: bool,
    /// Print the outcome as one JSON object on standard output: `{"ok": true, "steps", …}`,
    /// the first divergence (`sequence`, `step`, `line`, `field`, `recorded`, `now`), or the
    /// numerics refusal (`recorded` and `now` version and numerics). The exit status is 1 when
    /// `ok` is false.
    #[arg(long)]
    pub json: bool,
}

/// An engine over `model`, with the draft model at `draft` when one is given.
fn engine_with(
    model: Arc<Model>,
    draft: Option<&Path>,
    requant: Requant,
    kv_cache_type: KvCacheType,
) -> Result<Engine, CliError> {
    let config = EngineConfig {
        kv_cache_type,
        ..EngineConfig::default()
    };
    match draft {
        None => Engine::new(model, config).map_err(|e| CliError::context("--kv-cache-type", e)),
        Some(p) => {
            let d = Arc::new(
                load_model(p, requant).map_err(|e| CliError::context("--draft-model", e))?,
            );
            Engine::with_draft_model(model, d, config)
                .map_err(|e| CliError::context("--draft-model", e))
        }
    }
}

fn finish_text(model: &Model, stop: &StopConfig, r: Option<FinishReason>) -> String {
    let name = |t: u32| model.vocab.name(t).unwrap_or("?").to_string();
    match r {
        Some(FinishReason::Eos { token }) => format!("eos (token {token} {})", name(token)),
        Some(FinishReason::StopToken { token }) => {
            format!("stop token (token {token} {})", name(token))
        }
        Some(FinishReason::StopString { pattern, .. }) => format!(
            "stop string {:?}",
            stop.stop.get(pattern).cloned().unwrap_or_default()
        ),
        Some(FinishReason::MaxTokens) => "length".to_string(),
        Some(FinishReason::GrammarAccepted) => "grammar accepted".to_string(),
        None => "length (context full)".to_string(),
    }
}

fn layer_name(l: Layer) -> &'static str {
    match l {
        Layer::Raw => "raw",
        Layer::Processed => "processed",
        Layer::Selection => "selection",
    }
}

/// The flag of each resolver field: the CLI's names for what the resolver checks (a field
/// with no flag keeps its name).
const FLAGS: [(&str, &str); 18] = [
    ("temperature", "--temperature"),
    ("top_k", "--top-k"),
    ("top_p", "--top-p"),
    ("min_p", "--min-p"),
    ("typical_p", "--typical-p"),
    ("presence_penalty", "--presence-penalty"),
    ("frequency_penalty", "--frequency-penalty"),
    ("repetition_penalty", "--repetition-penalty"),
    ("logit_bias", "--logit-bias"),
    ("min_tokens", "--min-tokens"),
    ("max_tokens", "--max-tokens"),
    ("stop", "--stop"),
    ("stop_token_ids", "--stop-token-id"),
    ("seed", "--seed"),
    ("n", "-n"),
    ("top_logprobs", "--logprobs"),
    ("grammar_policy", "--grammar-policy"),
    ("pipeline", "--pipeline"),
];

/// The flag that gave resolver field `field` (`logit_bias[5]` is `--logit-bias[5]`; the
/// constraint is the flag that gave it).
fn flag(field: &str, constraint: Option<&str>) -> String {
    let head = field.split(['[', '.']).next().unwrap_or(field);
    let rest = &field[head.len()..];
    match (head, constraint) {
        ("constraint", Some(c)) => format!("{c}{rest}"),
        _ => match FLAGS.iter().find(|f| f.0 == head) {
            Some((_, flag)) => format!("{flag}{rest}"),
            None => field.to_string(),
        },
    }
}

/// The request the flags describe.
fn request(a: &GenerateArgs) -> Result<(GenerateRequest, String), CliError> {
    let prompt = if a.chat {
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(Message::new("system", s.clone()));
        }
        msgs.push(Message::new("user", a.prompt.clone()));
        Prompt::Chat(msgs)
    } else {
        Prompt::Text(a.prompt.clone())
    };
    let params = SamplingParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        typical_p: a.typical_p,
        presence_penalty: a.presence_penalty,
        frequency_penalty: a.frequency_penalty,
        repetition_penalty: a.repetition_penalty,
        logit_bias: a.logit_bias.iter().copied().collect(),
        min_tokens: a.min_tokens,
        max_tokens: Some(a.max_tokens),
        stop_token_ids: a.stop_token_ids.clone(),
        seed: a.seed,
        ignore_eos: a.ignore_eos,
        stop: a.stop.clone(),
        grammar_policy: match a.grammar_policy.as_deref() {
            None => None,
            Some(p) => Some(
                serde_json::from_value(Value::String(p.to_string()))
                    .map_err(|_| format!("invalid `--grammar-policy`: `{p}` (expected only_end, stop_on_accept or continue)"))?,
            ),
        },
        ..Default::default()
    };
    let (pipeline, source) = match a.pipeline.parse::<Preset>() {
        Ok(p) => (PipelineChoice::Preset(p), a.pipeline.clone()),
        Err(_) => {
            // a pipeline file carries its own processors (the resolver refuses a sampling flag)
            let text = std::fs::read_to_string(&a.pipeline).map_err(|e| {
                format!(
                    "--pipeline `{}`: not a preset and cannot read: {e}",
                    a.pipeline
                )
            })?;
            let cfg = PipelineConfig::from_json(&text)?;
            (PipelineChoice::Config(cfg), "file".to_string())
        }
    };
    let record = a
        .trace
        .as_ref()
        .map(|_| a.trace_candidates.max(a.logprobs.unwrap_or(0)));
    let constraint = constraint_spec(a)?;
    let constraint_flag = constraint.as_ref().map(crate::constrain::flag);
    let params = SamplingParams {
        constraint,
        ..params
    };
    // every rule about the decoding side, once: the resolver's errors under the flags' names
    resolve(&ResolveRequest {
        params: &params,
        pipeline: &pipeline,
        n: a.n,
        top_logprobs: a.logprobs,
    })
    .map_err(|e| e.renamed(|f| flag(f, constraint_flag)))?;
    Ok((
        GenerateRequest {
            prompt,
            params,
            pipeline,
            n: a.n,
            logprobs: a.logprobs.map(|top| LogprobOptions {
                top,
                layer: a.logprob_layer.into(),
            }),
            records: record,
            trace_logits: a.trace_logits,
            ledger_step: a.ledger,
            speculative: speculative(a.speculative.as_deref(), &a.spec_acceptance)?,
            resume: None,
        },
        source,
    ))
}

/// What one sequence has produced but not yet printed (sequences print one after another).
#[derive(Default)]
struct Pending {
    out: String,
    /// The whole output (for the check against a JSON schema).
    full: String,
    err: Vec<String>,
    ledger: Option<String>,
    finish: Option<(Option<FinishReason>, usize)>,
    records: Vec<nextok_core::StepRecord>,
    steps: u64,
}

/// Runs `nextok generate`.
pub fn run(a: GenerateArgs) -> Result<(), CliError> {
    if a.beam_width.is_some() {
        let conflicts: Vec<&str> = [
            (a.trace.is_some(), "--trace"),
            (a.logprobs.is_some(), "--logprobs"),
            (a.ledger.is_some(), "--ledger"),
            (a.n > 1, "-n"),
            (a.speculative.is_some(), "--speculative"),
        ]
        .iter()
        .filter(|c| c.0)
        .map(|c| c.1)
        .collect();
        if !conflicts.is_empty() {
            return Err(format!(
                "--beam-width cannot be combined with {} (beam search returns its hypotheses)",
                conflicts.join(", ")
            )
            .into());
        }
    }
    // the flags are checked before the model is loaded
    let (req, source) = request(&a)?;
    let path = model_path(a.model.as_deref())?;
    let requant: Requant = a.requant.into();
    let model = Arc::new(load_model(&path, requant)?);
    let engine = engine_with(
        model.clone(),
        a.draft_model.as_deref(),
        requant,
        a.kv_cache_type.into(),
    )?;
    crate::return_freed_memory();
    if let Some(b) = a.beam_width {
        let hyps = engine.beam(req, b, a.length_penalty)?;
        let stop = engine.prepare(&request(&a)?.0)?.info.stop;
        for (i, h) in hyps.iter().enumerate() {
            if i == 0 {
                outln!("{}", h.text);
            }
            let finish = match &h.end {
                BeamEnd::Eos => "eos".to_string(),
                BeamEnd::Length => "length".to_string(),
                BeamEnd::Stop(r) => finish_text(&model, &stop, Some(*r)),
            };
            eprintln!(
                "nextok: beam {i}: score {:.4} logprob {:.4} [processed] len {} finish {finish} {:?}",
                h.score,
                h.logprob,
                h.tokens.len(),
                h.text
            );
        }
        return Ok(());
    }
    let mut h = engine.submit(req)?;
    let t0 = std::time::Instant::now();
    let info = h.info.clone();
    if a.seed.is_none() {
        eprintln!(
            "nextok: seed {} (pass --seed {} to repeat this run)",
            info.seeds[0], info.seeds[0]
        );
    }
    if let Some(r) = info.schema_report() {
        eprintln!("nextok: {}", r.summary());
    }
    let header = TraceHeader::new(
        &info,
        &model,
        &source,
        a.trace_candidates.max(a.logprobs.unwrap_or(0)),
    )
    .with_draft_model(engine.draft_model().map(|d| &**d))
    .with_raw_logits(a.trace_logits);
    let mut trace = match &a.trace {
        Some(p) => {
            let f =
                std::fs::File::create(p).map_err(|e| format!("--trace `{}`: {e}", p.display()))?;
            let mut w = std::io::BufWriter::new(f);
            writeln!(w, "{}", serde_json::to_string(&header)?)
                .map_err(|e| format!("--trace `{}`: {e}", p.display()))?;
            Some(w)
        }
        None => None,
    };
    let n = info.seeds.len();
    let mut pending: Vec<Pending> = (0..n).map(|_| Pending::default()).collect();
    let mut current = 0usize;
    let mut first_token: Option<std::time::Instant> = None;
    let mut total = 0usize;
    let mut usage = None;
    let name = |t: u32| {
        let b = model.vocab.token(t).unwrap_or(&[]);
        format!("{:?}", String::from_utf8_lossy(b))
    };
    let print_out = |s: &str| out!("{s}");
    if n > 1 {
        eprintln!("nextok: sequence 0 (seed {})", info.seeds[0]);
    }
    while let Some(ev) = h.recv() {
        match ev {
            Event::Token {
                seq,
                id,
                text,
                logprobs,
            } => {
                first_token.get_or_insert_with(std::time::Instant::now);
                total += 1;
                let p = &mut pending[seq];
                if let Some(l) = logprobs {
                    let mut line = format!(
                        "logprobs step {} [{}] selected {} {} {:.4} |",
                        p.steps,
                        layer_name(l.layer),
                        id,
                        name(id),
                        l.selected
                    );
                    for (c, v) in &l.top {
                        line.push_str(&format!(" {} {} {:.4}", c, name(*c), v));
                    }
                    if seq == current {
                        eprintln!("{line}");
                    } else {
                        p.err.push(line);
                    }
                }
                p.steps += 1;
                p.full.push_str(&text);
                if seq == current {
                    print_out(&text);
                } else {
                    p.out.push_str(&text);
                }
            }
            Event::Record { seq, record } => pending[seq].records.push(*record),
            Event::Ledger { seq, explanation } => {
                pending[seq].ledger = Some(ledger_text(&model, &info, &explanation)?);
            }
            Event::Finish {
                seq,
                reason,
                text,
                tokens,
            } => {
                let p = &mut pending[seq];
                p.full.push_str(&text);
                if seq == current {
                    print_out(&text);
                } else {
                    p.out.push_str(&text);
                }
                p.finish = Some((reason, tokens));
                // print every finished sequence in order, then stream the next one
                while current < n {
                    let Some((reason, tokens)) = pending[current].finish else {
                        break;
                    };
                    outln!();
                    match (&pending[current].ledger, a.ledger) {
                        (Some(l), Some(k)) => eprintln!("nextok: the ledger of step {k}:\n{l}"),
                        (None, Some(k)) => {
                            eprintln!("nextok: no ledger: the sequence ended before step {k}")
                        }
                        _ => {}
                    }
                    let check = match info.validate_output(&pending[current].full) {
                        Some(v) => format!("; schema check: {}", v.summary()),
                        None => String::new(),
                    };
                    eprintln!(
                        "nextok: finish: {} after {tokens} tokens{check}",
                        finish_text(&model, &info.stop, reason)
                    );
                    current += 1;
                    if current < n {
                        eprintln!("nextok: sequence {current} (seed {})", info.seeds[current]);
                        let p = &mut pending[current];
                        for l in p.err.drain(..) {
                            eprintln!("{l}");
                        }
                        let out = std::mem::take(&mut p.out);
                        print_out(&out);
                    }
                }
            }
            Event::Done { usage: u, .. } => {
                usage = Some(u);
                break;
            }
            Event::Error(e) => return Err(e.into()),
        }
    }
    if let Some(w) = trace.as_mut() {
        let mut logits_bytes = 0usize;
        for p in &pending {
            for r in &p.records {
                logits_bytes += r.raw_logits.as_ref().map_or(0, |l| l.data.len());
                writeln!(w, "{}", serde_json::to_string(r)?)?;
            }
        }
        w.flush()?;
        if a.trace_logits {
            let steps: usize = pending.iter().map(|p| p.records.len()).sum();
            eprintln!(
                "nextok: --trace-logits: {steps} rows of raw logits stored in {logits_bytes} bytes ({} a step)",
                logits_bytes / steps.max(1)
            );
        }
    }
    let usage = usage.ok_or("the engine stopped before the request finished")?;
    let end = std::time::Instant::now();
    let ttft = first_token.unwrap_or(end).duration_since(t0).as_secs_f64();
    let decode = end.duration_since(first_token.unwrap_or(end)).as_secs_f64();
    let fresh = usage.prompt_tokens - usage.cached_tokens;
    eprintln!(
        "nextok: prompt {} tokens in {ttft:.2} s to the first token ({:.1} prompt tokens/s); {total} tokens generated, the {} after the first in {decode:.2} s ({:.1} tokens/s)",
        usage.prompt_tokens,
        fresh as f64 / ttft.max(1e-9),
        total.saturating_sub(n),
        total.saturating_sub(n) as f64 / decode.max(1e-9)
    );
    let st = engine.stats();
    if a.speculative.is_some() {
        eprintln!(
            "nextok: speculative: {} drafted tokens, {} accepted ({:.0} %)",
            st.draft_tokens,
            st.accepted_draft_tokens,
            100.0 * st.accepted_draft_tokens as f64 / (st.draft_tokens.max(1)) as f64
        );
    }
    Ok(())
}

/// The ledger of one step (the support by final probability, at most 12 rows, then the 6
/// highest raw logits outside it), as text.
fn ledger_text(
    model: &Model,
    info: &nextok_engine::RequestInfo,
    ex: &nextok_core::Explanation,
) -> Result<String, CliError> {
    let o = nextok_engine::explain::model_step_output(model, info, ex, 12, 6);
    Ok(crate::explain::ledger(&o, model.vocab.info.vocab_size))
}

/// The constraint the flags ask for.
fn constraint_spec(a: &GenerateArgs) -> Result<Option<ConstraintSpec>, CliError> {
    let read = |p: &Path, flag: &str| {
        std::fs::read_to_string(p).map_err(|e| format!("--{flag} `{}`: {e}", p.display()))
    };
    let mut specs = Vec::new();
    if let Some(p) = &a.json_schema {
        let schema: Value = serde_json::from_str(&read(p, "json-schema")?)
            .map_err(|e| format!("--json-schema `{}`: not JSON: {e}", p.display()))?;
        specs.push(ConstraintSpec::JsonSchema {
            schema,
            options: nextok_constraint::JsonOptions {
                schema_mode: a.schema_mode,
                property_order: a.property_order,
                ..Default::default()
            },
        });
    }
    if a.json {
        specs.push(ConstraintSpec::Json {
            options: Default::default(),
        });
    }
    if let Some(r) = &a.regex {
        specs.push(ConstraintSpec::Regex { pattern: r.clone() });
    }
    if !a.choice.is_empty() {
        specs.push(ConstraintSpec::Choice {
            choices: a.choice.clone(),
        });
    }
    if let Some(p) = &a.grammar {
        specs.push(ConstraintSpec::Grammar {
            lark: read(p, "grammar")?,
        });
    }
    if let Some(p) = &a.gbnf {
        specs.push(ConstraintSpec::Gbnf {
            gbnf: read(p, "gbnf")?,
        });
    }
    match specs.len() {
        0 => Ok(None),
        1 => Ok(specs.pop()),
        _ => Err(
            "give at most one of --json-schema, --json, --regex, --choice, --grammar, --gbnf"
                .into(),
        ),
    }
}

/// Runs `nextok replay`.
pub fn run_replay(a: ReplayArgs) -> Result<(), CliError> {
    match replay(&a) {
        Ok(ok) => {
            if a.json {
                out!("{ok}\n");
            } else {
                eprintln!(
                    "nextok: replay ok: {} steps in {} sequence(s) match bit for bit{}",
                    ok["steps"],
                    ok["sequences"],
                    if a.sampler_only {
                        " (the sampler on the recorded raw logits; the model did not run)"
                    } else {
                        ""
                    }
                );
            }
            Ok(())
        }
        Err(Failed::Json(v)) if a.json => {
            out!("{v}\n");
            Err(CliError::silent())
        }
        Err(Failed::Json(v)) => Err(v["message"].as_str().unwrap_or("replay failed").into()),
        Err(Failed::Other(e)) if a.json => {
            let msg = e.to_string();
            out!(
                "{}\n",
                serde_json::json!({"ok": false, "reason": "error", "message": msg})
            );
            Err(CliError::silent())
        }
        Err(Failed::Other(e)) => Err(e),
    }
}

/// Why a replay did not succeed: a divergence or refusal that `--json` prints as data, or any
/// other error.
enum Failed {
    Json(Value),
    Other(CliError),
}

macro_rules! failed_from {
    ($($t:ty),*) => {$(
        impl From<$t> for Failed {
            fn from(e: $t) -> Failed {
                Failed::Other(e.into())
            }
        }
    )*};
}
failed_from!(
    CliError,
    String,
    nextok_engine::EngineError,
    nextok_model::ModelError
);

fn replay(a: &ReplayArgs) -> Result<Value, Failed> {
    let text =
        std::fs::read_to_string(&a.file).map_err(|e| format!("`{}`: {e}", a.file.display()))?;
    let (header, recorded) = trace::parse(&text)?;
    // the header is checked before any model is loaded
    trace::replay_request(&header)?;
    if a.sampler_only && !header.raw_logits {
        return Err(CliError::from(
            "--sampler-only: the trace carries no raw logits (record it with `generate --trace-logits`)",
        )
        .into());
    }
    let requant = header.requant()?;
    let kv_cache = header.kv_cache()?;
    // the recorded model file (a name, looked for beside the trace), else the default model
    let recorded_file = Path::new(&header.model_file)
        .file_name()
        .map(|f| a.file.parent().unwrap_or(Path::new(".")).join(f))
        .filter(|p| p.is_file());
    let path = match (&a.model, recorded_file) {
        (Some(p), _) => p.clone(),
        (None, Some(p)) => p,
        (None, None) => model_path(None)?,
    };
    let wrong_file = |sha: &str| {
        Failed::Other(CliError::from(format!(
            "the model `{}` has SHA-256 {sha}; the trace was recorded with `{}`, SHA-256 {}",
            path.display(),
            header.model_file,
            header.model_sha256
        )))
    };
    // the numerics, from the file's metadata before anything is loaded: a trace of other
    // numerics is refused in one line (unless the file is not the recorded one at all)
    if header.numerics.is_some() {
        let now = trace::numerics_of_file(&path, requant, kv_cache)?;
        if let Err(r) = trace::check_numerics(&header, &now, a.sampler_only) {
            let sha = nextok_model::sha256_file(&path)?;
            if sha != header.model_sha256 {
                return Err(wrong_file(&sha));
            }
            return Err(Failed::Json(r.to_json()));
        }
    }
    let model = Arc::new(load_model(&path, requant)?);
    if model.sha256 != header.model_sha256 {
        return Err(wrong_file(&model.sha256));
    }
    let draft = if a.sampler_only {
        None
    } else {
        a.draft_model.as_deref()
    };
    let engine = engine_with(model.clone(), draft, requant, kv_cache)?;
    if let (Some(d), Some(want)) = (engine.draft_model(), &header.draft_model_sha256) {
        if &d.sha256 != want {
            return Err(CliError::from(format!(
                "the draft model has SHA-256 {}; the trace was recorded with SHA-256 {want}",
                d.sha256
            ))
            .into());
        }
    }
    let k = trace::replay_on(&engine, &header, &recorded, a.sampler_only).map_err(|e| match e {
        trace::ReplayError::Refused(r) => Failed::Json(r.to_json()),
        trace::ReplayError::Diverged(d) => Failed::Json(d.to_json()),
        trace::ReplayError::Failed(e) => Failed::Other(e.into()),
    })?;
    Ok(serde_json::json!({
        "ok": true,
        "mode": if a.sampler_only { "sampler" } else { "full" },
        "steps": k,
        "sequences": header.seeds.len(),
        "numerics": engine.numerics(),
        "version": nextok_engine::VERSION,
    }))
}
