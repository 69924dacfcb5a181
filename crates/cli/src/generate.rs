//! `nextok generate` and `nextok replay`: decoding a real model end to end.
//!
//! `generate` loads a llama-architecture GGUF model (`--model PATH`, or the default model
//! fetched once into the cache), tokenises the prompt (or renders the file's chat template with
//! `--chat`), and streams the continuation to stdout through the sampler's text stream. The
//! sampling flags carry vLLM / OpenAI names and build a preset pipeline (`--pipeline`, default
//! `reference`); `--pipeline FILE` takes a pipeline JSON instead. The finish reason goes to
//! stderr.
//!
//! `-n N` runs N sequences from one prefilled prompt, sequence `i` with seed `seed + i`
//! (wrapping). Each sequence forks the prompt's KV branch and owns its random stream, so its
//! tokens are the same whether it runs with others or alone with that seed.
//!
//! `--trace FILE` writes JSON Lines: a header (`{"nextok_trace": 1, ...}`: model SHA-256,
//! re-quantisation, prompt ids, parameters, pipeline and its hash, stop config, seeds, how many
//! candidates each record keeps), then one [`StepRecord`] per step, sequence after sequence.
//! `nextok replay FILE` re-runs that request on the same model and compares every record
//! field by field; the first difference is named (step, sequence, field) and the exit status is
//! non-zero. Logits are bit-identical across runs and thread counts of one build, not across
//! builds with different SIMD features (candle picks its kernels at compile time; the header
//! records the features, and a replay on another build says so).

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nextok_constraint::{CompiledConstraint, ConstraintEngine, ConstraintSpec, ConstraintVocab};
use nextok_core::pipeline::presets;
use nextok_core::{
    Draw, FinishReason, Layer, PipelineConfig, Preset, Sampler, SamplingParams, StepRecord,
    StopConfig,
};
use nextok_model::beam::{beam_search_with, BeamConfig, BeamFinish, PipelineScorer};
use nextok_model::chat::Message;
use nextok_model::{fetch, LogitsSource, Model, Requant};
use serde::{Deserialize, Serialize};
use serde_json::Value;

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
pub struct GenerateArgs {
    /// The prompt (with `--chat`, the user's message).
    pub prompt: String,
    /// Render the model's chat template around the prompt (a user message).
    #[arg(long)]
    pub chat: bool,
    /// A system message for `--chat` (else the template's default, if any).
    #[arg(long)]
    pub system: Option<String>,
    /// A llama-architecture GGUF file (default: SmolLM2-135M-Instruct Q4_1, fetched once).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Re-quantise the weights at load.
    #[arg(long, value_enum, default_value = "keep")]
    pub requant: RequantArg,
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
    /// Request seed (sequence `i` uses `seed + i`).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Number of sequences.
    #[arg(short = 'n', long = "n", default_value_t = 1)]
    pub n: usize,
    /// Constrain the output to JSON valid against this JSON-schema file.
    #[arg(long = "json-schema")]
    pub json_schema: Option<PathBuf>,
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
    /// Beam search with this many hypotheses. Each hypothesis runs the pipeline with its own
    /// state (masks, penalties, constraint, stop conditions); scores are processed-layer
    /// logprobs, and only tokens in the final support (after top-k/top-p/min-p) are proposed.
    #[arg(long)]
    pub beam_width: Option<usize>,
    /// Beam search length penalty `α` in `logprob / len^α`.
    #[arg(long, default_value_t = 1.0)]
    pub length_penalty: f64,
}

/// Arguments of `nextok replay`.
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// A trace written by `nextok generate --trace`.
    pub file: PathBuf,
    /// The model file (default: the recorded one if it exists, else the default model).
    #[arg(long)]
    pub model: Option<PathBuf>,
}

/// The first line of a trace.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TraceHeader {
    /// Trace format version (1).
    pub nextok_trace: u32,
    /// Model file name as given.
    pub model_file: String,
    /// SHA-256 of the model file.
    pub model_sha256: String,
    /// Re-quantisation at load.
    pub requant: RequantArg,
    /// Prompt ids.
    pub prompt_ids: Vec<u32>,
    /// The request's sampling parameters.
    pub params: SamplingParams,
    /// The pipeline (preset name or `file`).
    pub pipeline_source: String,
    /// The pipeline as run.
    pub pipeline: PipelineConfig,
    /// Its hash.
    pub pipeline_hash: String,
    /// Stop conditions.
    pub stop: StopConfig,
    /// One seed per sequence.
    pub seeds: Vec<u64>,
    /// Candidates kept per record.
    pub candidates: usize,
    /// SIMD features of the recording build (its logits depend on them).
    #[serde(default)]
    pub simd: String,
}

pub(crate) fn model_path(arg: Option<&Path>) -> Result<PathBuf, String> {
    match arg {
        Some(p) => Ok(p.to_path_buf()),
        None => fetch::default_model().map_err(|e| e.to_string()),
    }
}

pub(crate) fn load_model(path: &Path, requant: Requant) -> Result<Model, String> {
    let t = std::time::Instant::now();
    let m = Model::load(path, requant).map_err(|e| e.to_string())?;
    eprintln!(
        "nextok: {} ({} layers, vocabulary {}, requant {}) loaded in {:.1} s",
        path.file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
        m.weights.config.n_layer,
        m.weights.config.vocab_size,
        requant.name(),
        t.elapsed().as_secs_f64()
    );
    Ok(m)
}

fn build_sampler(
    model: &Model,
    pipeline: &str,
    params: &SamplingParams,
) -> Result<(Sampler, PipelineConfig, StopConfig), String> {
    let (cfg, stop) = match pipeline.parse::<Preset>() {
        Ok(preset) => presets::build(preset, params).map_err(|e| e.to_string())?,
        Err(_) => {
            let text = std::fs::read_to_string(pipeline).map_err(|e| {
                format!("--pipeline `{pipeline}`: not a preset and cannot read: {e}")
            })?;
            let cfg = PipelineConfig::from_json(&text).map_err(|e| e.to_string())?;
            let stop = StopConfig {
                stop_token_ids: params.stop_token_ids.clone(),
                max_tokens: params.max_tokens,
                ignore_eos: params.ignore_eos,
                stop: params.stop.clone(),
                ..StopConfig::default()
            };
            (cfg, stop)
        }
    };
    let sampler = make_sampler(model, cfg.clone(), stop.clone())?;
    Ok((sampler, cfg, stop))
}

pub(crate) fn make_sampler(
    model: &Model,
    cfg: PipelineConfig,
    stop: StopConfig,
) -> Result<Sampler, String> {
    Sampler::new_with_tokens(
        cfg,
        model.vocab.info.clone(),
        stop,
        Some(Arc::new(model.vocab.bytes.clone())),
    )
    .map_err(|e| e.to_string())
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

/// Runs `nextok generate`.
pub fn run(a: GenerateArgs) -> Result<(), String> {
    if a.n == 0 {
        return Err("-n must be at least 1".into());
    }
    let path = model_path(a.model.as_deref())?;
    let requant: Requant = a.requant.into();
    let model = load_model(&path, requant)?;
    let text = if a.chat {
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(Message::new("system", s.clone()));
        }
        msgs.push(Message::new("user", a.prompt.clone()));
        model.render_chat(&msgs, true).map_err(|e| e.to_string())?
    } else {
        a.prompt.clone()
    };
    let prompt = model.encode_prompt(&text).map_err(|e| e.to_string())?;
    if prompt.is_empty() {
        return Err("the prompt encodes to no tokens".into());
    }
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
        seed: Some(a.seed),
        ignore_eos: a.ignore_eos,
        stop: a.stop.clone(),
        constraint: constraint_spec(&a)?,
        grammar_policy: match a.grammar_policy.as_deref() {
            None => None,
            Some(p) => Some(
                serde_json::from_value(Value::String(p.to_string()))
                    .map_err(|_| format!("invalid `--grammar-policy`: `{p}` (expected only_end, stop_on_accept or continue)"))?,
            ),
        },
        ..Default::default()
    };
    let (sampler, cfg, stop) = build_sampler(&model, &a.pipeline, &params)?;
    let constraint = compile_constraint(&model, &params)?;
    if let Some(b) = a.beam_width {
        return run_beam(
            &model,
            &sampler,
            constraint,
            &prompt,
            a.seed,
            b,
            a.length_penalty,
            a.max_tokens as usize,
        );
    }
    let seeds: Vec<u64> = (0..a.n as u64).map(|i| a.seed.wrapping_add(i)).collect();
    let header = TraceHeader {
        nextok_trace: 1,
        model_file: path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
        model_sha256: model.sha256.clone(),
        requant: a.requant,
        prompt_ids: prompt.clone(),
        params,
        pipeline_source: if a.pipeline.parse::<Preset>().is_ok() {
            a.pipeline.clone()
        } else {
            "file".into()
        },
        pipeline_hash: sampler.pipeline_hash().to_string(),
        pipeline: cfg,
        stop,
        seeds: seeds.clone(),
        candidates: a.trace_candidates.max(a.logprobs.unwrap_or(0)),
        simd: nextok_model::simd_features(),
    };
    let mut trace = match &a.trace {
        Some(p) => {
            let f =
                std::fs::File::create(p).map_err(|e| format!("--trace `{}`: {e}", p.display()))?;
            let mut w = std::io::BufWriter::new(f);
            writeln!(
                w,
                "{}",
                serde_json::to_string(&header).map_err(|e| e.to_string())?
            )
            .map_err(|e| e.to_string())?;
            Some(w)
        }
        None => None,
    };
    let opts = RunOpts {
        logprobs: a.logprobs,
        layer: a.logprob_layer.into(),
        record: trace.is_some() || a.logprobs.is_some(),
        candidates: header.candidates,
        stream: true,
        constraint,
        overlap: true,
        ledger: a.ledger,
    };
    let mut base = model.source();
    let row0 = base.prefill(&prompt).map_err(|e| e.to_string())?;
    let t0 = std::time::Instant::now();
    let mut total = 0usize;
    for (i, &seed) in seeds.iter().enumerate() {
        if a.n > 1 {
            eprintln!("nextok: sequence {i} (seed {seed})");
        }
        let src = base.fork().map_err(|e| e.to_string())?;
        let out = run_sequence(&model, &sampler, src, &prompt, row0.clone(), seed, &opts)?;
        total += out.tokens.len();
        if let Some(w) = trace.as_mut() {
            for r in &out.records {
                writeln!(
                    w,
                    "{}",
                    serde_json::to_string(r).map_err(|e| e.to_string())?
                )
                .map_err(|e| e.to_string())?;
            }
        }
        println!();
        if let Some(l) = &out.ledger {
            eprintln!("nextok: the ledger of step {}:\n{l}", a.ledger.unwrap_or(0));
        } else if let Some(k) = a.ledger {
            eprintln!("nextok: no ledger: the sequence ended before step {k}");
        }
        eprintln!(
            "nextok: finish: {} after {} tokens",
            finish_text(&model, sampler.stop(), out.finish),
            out.tokens.len()
        );
    }
    if let Some(mut w) = trace {
        w.flush().map_err(|e| e.to_string())?;
    }
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "nextok: {total} tokens in {secs:.2} s ({:.1} tokens/s)",
        total as f64 / secs.max(1e-9)
    );
    Ok(())
}

pub(crate) struct RunOpts {
    pub(crate) logprobs: Option<usize>,
    pub(crate) layer: Layer,
    pub(crate) record: bool,
    pub(crate) candidates: usize,
    pub(crate) stream: bool,
    pub(crate) constraint: Option<Arc<CompiledConstraint>>,
    /// Compute the constraint's next mask on another thread while the model runs.
    pub(crate) overlap: bool,
    /// The step whose ledger to keep.
    pub(crate) ledger: Option<u64>,
}

/// The constraint the flags ask for, as the JSON spec stored in the request parameters.
fn constraint_spec(a: &GenerateArgs) -> Result<Option<Value>, String> {
    let read = |p: &Path, flag: &str| {
        std::fs::read_to_string(p).map_err(|e| format!("--{flag} `{}`: {e}", p.display()))
    };
    let mut specs = Vec::new();
    if let Some(p) = &a.json_schema {
        let schema: Value = serde_json::from_str(&read(p, "json-schema")?)
            .map_err(|e| format!("--json-schema `{}`: not JSON: {e}", p.display()))?;
        specs.push(ConstraintSpec::JsonSchema {
            schema,
            options: Default::default(),
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
        1 => serde_json::to_value(&specs[0])
            .map(Some)
            .map_err(|e| e.to_string()),
        _ => Err(
            "give at most one of --json-schema, --json, --regex, --choice, --grammar, --gbnf"
                .into(),
        ),
    }
}

/// Compiles the request's constraint over the model's vocabulary.
pub(crate) fn compile_constraint(
    model: &Model,
    params: &SamplingParams,
) -> Result<Option<Arc<CompiledConstraint>>, String> {
    let Some(spec) = &params.constraint else {
        return Ok(None);
    };
    let spec: ConstraintSpec =
        serde_json::from_value(spec.clone()).map_err(|e| format!("invalid constraint: {e}"))?;
    let vocab =
        ConstraintVocab::new(&model.vocab.bytes, &model.vocab.info).map_err(|e| e.to_string())?;
    let engine = ConstraintEngine::new(Arc::new(vocab)).map_err(|e| e.to_string())?;
    engine.compile(&spec).map(Some).map_err(|e| e.to_string())
}

pub(crate) struct SeqOut {
    pub(crate) tokens: Vec<u32>,
    pub(crate) records: Vec<StepRecord>,
    pub(crate) finish: Option<FinishReason>,
    pub(crate) time: SeqTime,
    /// The ledger of the step `RunOpts::ledger` asked for, as text.
    pub(crate) ledger: Option<String>,
}

/// Where a sequence's time went (wall clock of the decode loop, per part).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SeqTime {
    /// The whole loop, first step to last.
    pub(crate) total: std::time::Duration,
    /// Model calls (`decode_one`), including the wait for an overlapped mask.
    pub(crate) model: std::time::Duration,
    /// Sampler steps (processing, the mask when it was not prepared, selection, commit; with a
    /// trace, building the record).
    pub(crate) sample: std::time::Duration,
    /// Masks prepared ahead on the other thread (off the critical path unless longer than
    /// the model call).
    pub(crate) prepare: std::time::Duration,
    /// How long the loop waited for a prepared mask after the model call had finished.
    pub(crate) wait: std::time::Duration,
}

pub(crate) fn run_sequence<S: LogitsSource + Send>(
    model: &Model,
    sampler: &Sampler,
    mut src: S,
    prompt: &[u32],
    first_row: Vec<f32>,
    seed: u64,
    o: &RunOpts,
) -> Result<SeqOut, String> {
    let mut state = sampler.new_state(prompt, seed).map_err(|e| e.to_string())?;
    if let Some(c) = &o.constraint {
        state.set_grammar(Box::new(c.start()));
    }
    let mut ws = sampler.new_workspace();
    let mut stream = sampler.text_stream();
    let mut row = first_row;
    let mut out = SeqOut {
        tokens: Vec::new(),
        records: Vec::new(),
        finish: None,
        time: SeqTime::default(),
        ledger: None,
    };
    let stdout = std::io::stdout();
    let ctx = model.weights.config.context_length;
    let start = std::time::Instant::now();
    loop {
        if o.ledger == Some(state.step()) {
            out.ledger = Some(step_ledger(model, sampler, &row, &state)?);
        }
        let t = std::time::Instant::now();
        let res = if o.record {
            let (res, rec) = sampler
                .step_recorded(&row, &mut state, &mut ws, Draw::Stream, o.candidates)
                .map_err(|e| e.to_string())?;
            if let Some(n) = o.logprobs {
                print_logprobs(model, sampler, &row, &mut ws, &rec, n, o.layer)?;
            }
            out.records.push(rec);
            res
        } else {
            sampler
                .step(&row, &mut state, &mut ws)
                .map_err(|e| e.to_string())?
        };
        out.time.sample += t.elapsed();
        out.tokens.push(res.token);
        if o.stream {
            let s = stream.push(
                sampler.visible_bytes(res.token),
                state.stop_state().hit.as_ref(),
            );
            let mut lock = stdout.lock();
            let _ = lock.write_all(s.as_bytes());
            let _ = lock.flush();
        }
        if res.finish.is_some() {
            out.finish = res.finish;
            break;
        }
        if src.len() + 1 >= ctx {
            break;
        }
        let t = std::time::Instant::now();
        let masking = o.overlap && state.grammar().is_some_and(|g| g.is_active());
        row = if masking {
            // the next mask depends only on the state: compute it while the model runs, as a
            // job another thread of the pool steals (no thread is created per token)
            let (row, prep) = rayon::join(
                || {
                    let row = src.decode_one(res.token);
                    (row, std::time::Instant::now())
                },
                || {
                    let t = std::time::Instant::now();
                    sampler.prepare(&state).map(|()| t.elapsed())
                },
            );
            let (row, done) = row;
            out.time.wait += done.elapsed();
            out.time.prepare += prep.map_err(|e| e.to_string())?;
            row.map_err(|e| e.to_string())?
        } else {
            src.decode_one(res.token).map_err(|e| e.to_string())?
        };
        out.time.model += t.elapsed();
    }
    out.time.total = start.elapsed();
    if o.stream {
        let s = stream.finish();
        let mut lock = stdout.lock();
        let _ = lock.write_all(s.as_bytes());
        let _ = lock.flush();
    }
    Ok(out)
}

/// The ledger of the step about to run on `row` (the state is not changed; the step that
/// follows selects the same token). Rows: the support by final probability (at most 12), then
/// the 6 highest raw logits outside it.
fn step_ledger(
    model: &Model,
    sampler: &Sampler,
    row: &[f32],
    state: &nextok_core::DecoderState,
) -> Result<String, String> {
    let ex = sampler
        .explain(row, state, Draw::Stream)
        .map_err(|e| e.to_string())?;
    let name = |t: u32| {
        let b = model.vocab.token(t).unwrap_or(&[]);
        format!("{:?}", String::from_utf8_lossy(b))
    };
    let mut kept: Vec<&nextok_core::TokenRow> = ex.tokens.iter().filter(|r| r.kept).collect();
    kept.sort_by(|a, b| {
        b.selection_prob
            .total_cmp(&a.selection_prob)
            .then(a.id.cmp(&b.id))
    });
    let mut support: Vec<u32> = kept.iter().map(|r| r.id).collect();
    support.sort_unstable();
    let mut out: Vec<&nextok_core::TokenRow> = ex.tokens.iter().filter(|r| !r.kept).collect();
    out.sort_by(|a, b| b.raw_logit.total_cmp(&a.raw_logit).then(a.id.cmp(&b.id)));
    let rows: Vec<nextok_core::request::NamedRow> = kept
        .iter()
        .take(12)
        .chain(out.iter().take(6))
        .map(|r| nextok_core::request::NamedRow {
            token: name(r.id),
            row: (*r).clone(),
        })
        .collect();
    let o = nextok_core::request::ExplainOutput {
        selected: ex.record.selected,
        selected_token: Some(name(ex.record.selected)),
        support,
        pipeline_hash: sampler.pipeline_hash().to_string(),
        pipeline: sampler.config().clone(),
        u: ex.record.rng.u,
        tokens: rows,
        record: ex.record,
    };
    Ok(crate::explain::ledger(&o, model.vocab.info.vocab_size))
}

fn print_logprobs(
    model: &Model,
    sampler: &Sampler,
    row: &[f32],
    ws: &mut nextok_core::Workspace,
    rec: &StepRecord,
    n: usize,
    layer: Layer,
) -> Result<(), String> {
    let name = |t: u32| {
        let b = model.vocab.token(t).unwrap_or(&[]);
        format!("{:?}", String::from_utf8_lossy(b))
    };
    let val = |c: &nextok_core::record::CandidateRecord| match layer {
        Layer::Raw => c.raw_logprob,
        Layer::Processed => c.processed_logprob,
        Layer::Selection => c.selection_logprob,
    };
    let sel = sampler
        .logprob(row, ws, rec.selected, layer)
        .map_err(|e| e.to_string())?;
    let layer_name = match layer {
        Layer::Raw => "raw",
        Layer::Processed => "processed",
        Layer::Selection => "selection",
    };
    let mut line = format!(
        "logprobs step {} [{layer_name}] selected {} {} {:.4} |",
        rec.step,
        rec.selected,
        name(rec.selected),
        sel.value
    );
    for c in rec.candidates.iter().take(n) {
        line.push_str(&format!(" {} {} {:.4}", c.id, name(c.id), val(c)));
    }
    eprintln!("{line}");
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn run_beam(
    model: &Model,
    sampler: &Sampler,
    constraint: Option<Arc<CompiledConstraint>>,
    prompt: &[u32],
    seed: u64,
    width: usize,
    alpha: f64,
    max_tokens: usize,
) -> Result<(), String> {
    let cfg = BeamConfig {
        width,
        length_penalty: alpha,
        max_tokens,
        eos_token_ids: model.vocab.info.eos_token_ids.clone(),
    };
    let mut start = sampler.new_state(prompt, seed).map_err(|e| e.to_string())?;
    if let Some(c) = &constraint {
        start.set_grammar(Box::new(c.start()));
    }
    let scorer = PipelineScorer::new(sampler, start.clone());
    let hyps =
        beam_search_with(model.source(), prompt, &cfg, &scorer).map_err(|e| e.to_string())?;
    for (i, h) in hyps.iter().enumerate() {
        // the visible text, as a sampled sequence would stream it (stop strings cut it)
        let mut st = start.clone();
        let mut stream = sampler.text_stream();
        let mut text = String::new();
        for &t in &h.tokens {
            sampler.commit(&mut st, t).map_err(|e| e.to_string())?;
            text.push_str(&stream.push(sampler.visible_bytes(t), st.stop_state().hit.as_ref()));
        }
        text.push_str(&stream.finish());
        if i == 0 {
            println!("{text}");
        }
        let finish = match &h.finish {
            BeamFinish::Eos => "eos".to_string(),
            BeamFinish::Length => "length".to_string(),
            BeamFinish::Stop(r) => finish_text(model, sampler.stop(), Some(*r)),
        };
        eprintln!(
            "nextok: beam {i}: score {:.4} logprob {:.4} [processed] len {} finish {finish} {:?}",
            h.score,
            h.logprob,
            h.tokens.len(),
            text
        );
    }
    Ok(())
}

/// Names the first difference between two JSON values (`""` when equal).
fn first_diff(path: &str, a: &Value, b: &Value) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match y.get(k) {
                    Some(w) => {
                        if let Some(d) = first_diff(&p, v, w) {
                            return Some(d);
                        }
                    }
                    None => return Some(p),
                }
            }
            y.keys()
                .find(|k| !x.contains_key(*k))
                .map(|k| format!("{path}.{k}"))
        }
        (Value::Array(x), Value::Array(y)) => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                if let Some(d) = first_diff(&format!("{path}[{i}]"), v, w) {
                    return Some(d);
                }
            }
            (x.len() != y.len()).then(|| format!("{path} (length {} vs {})", x.len(), y.len()))
        }
        _ => (a != b).then(|| path.to_string()),
    }
}

/// Runs `nextok replay`.
pub fn run_replay(a: ReplayArgs) -> Result<(), String> {
    let f = std::fs::File::open(&a.file).map_err(|e| format!("`{}`: {e}", a.file.display()))?;
    let mut lines = std::io::BufReader::new(f).lines();
    let first = lines
        .next()
        .ok_or("the trace is empty")?
        .map_err(|e| e.to_string())?;
    let header: TraceHeader =
        serde_json::from_str(&first).map_err(|e| format!("trace header: {e}"))?;
    let recorded: Vec<Value> = lines
        .enumerate()
        .map(|(i, l)| {
            let l = l.map_err(|e| e.to_string())?;
            serde_json::from_str(&l).map_err(|e| format!("trace line {}: {e}", i + 2))
        })
        .collect::<Result<_, String>>()?;
    let path = model_path(a.model.as_deref())?;
    let model = load_model(&path, header.requant.into())?;
    if model.sha256 != header.model_sha256 {
        return Err(format!(
            "the model's SHA-256 is {}, the trace was recorded with {}",
            model.sha256, header.model_sha256
        ));
    }
    let sampler = make_sampler(&model, header.pipeline.clone(), header.stop.clone())?;
    if sampler.pipeline_hash() != header.pipeline_hash {
        return Err(format!(
            "the pipeline hashes to {}, the trace says {}",
            sampler.pipeline_hash(),
            header.pipeline_hash
        ));
    }
    let opts = RunOpts {
        logprobs: None,
        layer: Layer::Selection,
        record: true,
        candidates: header.candidates,
        stream: false,
        constraint: compile_constraint(&model, &header.params)?,
        overlap: true,
        ledger: None,
    };
    let mut base = model.source();
    let row0 = base
        .prefill(&header.prompt_ids)
        .map_err(|e| e.to_string())?;
    let mut k = 0usize;
    for (si, &seed) in header.seeds.iter().enumerate() {
        let src = base.fork().map_err(|e| e.to_string())?;
        let out = run_sequence(
            &model,
            &sampler,
            src,
            &header.prompt_ids,
            row0.clone(),
            seed,
            &opts,
        )?;
        for r in &out.records {
            // through the text form, as the trace holds it (f32 values print as f32)
            let text = serde_json::to_string(r).map_err(|e| e.to_string())?;
            let got: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            let Some(want) = recorded.get(k) else {
                return Err(format!(
                    "replay mismatch: sequence {si} step {}: the replay goes on, the trace ends (line {})",
                    r.step,
                    k + 2
                ));
            };
            if let Some(field) = first_diff("", want, &got) {
                let simd = nextok_model::simd_features();
                let hint = if field == "raw_logits_digest"
                    && !header.simd.is_empty()
                    && header.simd != simd
                {
                    format!(
                        " (recorded by a build with SIMD features `{}`, this one has `{simd}`: the model's kernels, and so its logits, differ)",
                        header.simd
                    )
                } else {
                    String::new()
                };
                return Err(format!(
                    "replay mismatch: sequence {si} step {} (trace line {}): field `{field}` differs{hint}",
                    r.step,
                    k + 2
                ));
            }
            k += 1;
        }
    }
    if k != recorded.len() {
        return Err(format!(
            "replay mismatch: the trace has {} step records, the replay produced {k}",
            recorded.len()
        ));
    }
    eprintln!(
        "nextok: replay ok: {k} steps in {} sequence(s) match bit for bit",
        header.seeds.len()
    );
    Ok(())
}
