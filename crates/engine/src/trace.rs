//! Traces: a JSON Lines file whose first line is a [`TraceHeader`] (model SHA-256,
//! re-quantisation, prompt ids, parameters, pipeline and its hash, stop config, seeds, how many
//! candidates each record keeps, the build's SIMD features, speculative decoding's options) and whose other lines are
//! [`StepRecord`](nextok_core::StepRecord)s, sequence after sequence.
//!
//! [`replay_request`] turns a header back into the request that produced it, and [`compare`]
//! checks a re-run against the recorded lines field by field, naming the first difference.

use nextok_core::{PipelineConfig, SamplingParams, StopConfig};
use nextok_model::Model;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::engine::Completion;
use crate::error::{EngineError, Result};
use crate::request::{GenerateRequest, PipelineChoice, Prompt, RequestInfo};

fn default_kv_cache() -> String {
    nextok_model::KvCacheType::F16.name().to_string()
}

/// The first line of a trace.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TraceHeader {
    /// Trace format version (1).
    pub nextok_trace: u32,
    /// The nextok build that recorded it ([`crate::VERSION`]); absent in traces from before
    /// versioned numerics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nextok_version: Option<String>,
    /// The numerics identifier of the recording ([`numerics`]): what decided the raw logits'
    /// and the sampler's bits. Absent in traces from before versioned numerics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numerics: Option<String>,
    /// Whether every step line carries its raw logits (`generate --trace-logits`), so the
    /// sampler replays without the model.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub raw_logits: bool,
    /// Model file name as given.
    pub model_file: String,
    /// SHA-256 of the model file.
    pub model_sha256: String,
    /// Re-quantisation at load (`keep` or `q8_0`).
    pub requant: String,
    /// The KV cache's type (`f16` or `q8_0`; traces from before it was recorded: `f16`).
    #[serde(default = "default_kv_cache")]
    pub kv_cache: String,
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
    /// Speculative decoding as run (drafter, draft length, acceptance mode); absent without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculative: Option<crate::speculative::SpecOptions>,
    /// The draft model's file name, when a `model` drafter ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_model: Option<String>,
    /// Its SHA-256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_model_sha256: Option<String>,
    /// For a JSON-schema constraint: the schema mode, the keywords the mask enforces and those
    /// checked after generation (the mode itself is also in `params.constraint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<nextok_constraint::SchemaReport>,
}

impl TraceHeader {
    /// The header of a request the engine accepted as `info`, on `model`.
    pub fn new(
        info: &RequestInfo,
        model: &Model,
        pipeline_source: &str,
        candidates: usize,
    ) -> TraceHeader {
        TraceHeader {
            nextok_trace: 1,
            nextok_version: Some(crate::VERSION.to_string()),
            numerics: Some(numerics(model, info.kv_cache)),
            raw_logits: false,
            model_file: model
                .path
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default(),
            model_sha256: model.sha256.clone(),
            requant: model.weights.requant.name().to_string(),
            kv_cache: info.kv_cache.name().to_string(),
            prompt_ids: info.prompt_ids.clone(),
            params: info.params.clone(),
            pipeline_source: pipeline_source.to_string(),
            pipeline: info.pipeline.clone(),
            pipeline_hash: info.pipeline_hash.clone(),
            stop: info.stop.clone(),
            seeds: info.seeds.clone(),
            candidates,
            simd: nextok_model::simd_features(),
            speculative: info.speculative,
            draft_model: None,
            draft_model_sha256: None,
            schema: info.schema_report().cloned(),
        }
    }

    /// Marks the trace as carrying each step's raw logits (the request had `trace_logits`).
    pub fn with_raw_logits(mut self, on: bool) -> TraceHeader {
        self.raw_logits = on;
        self
    }

    /// Records the draft model, when the request drafted with it.
    pub fn with_draft_model(mut self, draft: Option<&Model>) -> TraceHeader {
        let uses = self
            .speculative
            .is_some_and(|s| s.drafter == crate::speculative::DrafterKind::Model);
        if let (true, Some(d)) = (uses, draft) {
            self.draft_model = d.path.file_name().map(|f| f.to_string_lossy().into_owned());
            self.draft_model_sha256 = Some(d.sha256.clone());
        }
        self
    }

    /// The KV cache type the trace was recorded with.
    pub fn kv_cache(&self) -> Result<nextok_model::KvCacheType> {
        nextok_model::KvCacheType::from_name(&self.kv_cache).ok_or_else(|| {
            EngineError::invalid(
                "kv_cache",
                format!("`{}` (expected f16 or q8_0)", self.kv_cache),
            )
        })
    }

    /// The re-quantisation the trace was recorded with.
    pub fn requant(&self) -> Result<nextok_model::Requant> {
        match self.requant.as_str() {
            "keep" => Ok(nextok_model::Requant::Keep),
            "q8_0" => Ok(nextok_model::Requant::Q8_0),
            other => Err(EngineError::invalid(
                "requant",
                format!("`{other}` (expected keep or q8_0)"),
            )),
        }
    }
}

/// A trace as text: the header line, then every record of every sequence, sequence after
/// sequence (what `nextok generate --trace` writes and [`parse`] reads).
pub fn text<'a>(
    header: &TraceHeader,
    sequences: impl IntoIterator<Item = &'a [nextok_core::StepRecord]>,
) -> String {
    // these types serialise to JSON without fail (no maps with non-string keys)
    let mut out = serde_json::to_string(header).unwrap_or_default();
    out.push('\n');
    for records in sequences {
        for r in records {
            out.push_str(&serde_json::to_string(r).unwrap_or_default());
            out.push('\n');
        }
    }
    out
}

/// Splits a trace into its header and its recorded step lines.
pub fn parse(text: &str) -> Result<(TraceHeader, Vec<Value>)> {
    let mut lines = text.lines();
    let first = lines
        .next()
        .ok_or_else(|| EngineError::invalid("trace", "the trace is empty"))?;
    let header: TraceHeader = serde_json::from_str(first)
        .map_err(|e| EngineError::invalid("trace", format!("trace header: {e}")))?;
    let recorded = lines
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| EngineError::invalid("trace", format!("trace line {}: {e}", i + 2)))
        })
        .collect::<Result<Vec<Value>>>()?;
    Ok((header, recorded))
}

/// The request a trace was recorded from.
pub fn replay_request(h: &TraceHeader) -> Result<GenerateRequest> {
    let Some(&seed) = h.seeds.first() else {
        return Err(EngineError::invalid("seeds", "the trace names no sequence"));
    };
    let mut params = h.params.clone();
    params.seed = Some(seed);
    for (i, &s) in h.seeds.iter().enumerate() {
        let want = params.sequence_seed(i as u64);
        if s != want {
            return Err(EngineError::invalid(
                "seeds",
                format!("seed {i} is {s}, not {want} (seed + i)"),
            ));
        }
    }
    check_params(h, &params)?;
    Ok(GenerateRequest {
        prompt: Prompt::Ids(h.prompt_ids.clone()),
        params,
        pipeline: PipelineChoice::Exact {
            pipeline: h.pipeline.clone(),
            stop: h.stop.clone(),
        },
        n: h.seeds.len(),
        logprobs: None,
        records: Some(h.candidates),
        trace_logits: false,
        ledger_step: None,
        // the same drafts again (prompt lookup is a function of the tokens so far), so the
        // records' draft marks and, in `rejection` mode, the tokens replay too
        speculative: h.speculative,
        resume: None,
    })
}

/// The header's `params` must describe the pipeline and stop conditions it records (the replay
/// runs the recorded pipeline, so an edited parameter would otherwise be silently ignored): a
/// preset is rebuilt from the parameters and compared (its constraint mask aside, which the
/// constraint adds); for a pipeline file the stop conditions are compared.
fn check_params(h: &TraceHeader, params: &SamplingParams) -> Result<()> {
    let strip = |p: &PipelineConfig| {
        let mut p = p.clone();
        p.processors
            .retain(|x| !matches!(x, nextok_core::processors::ProcessorConfig::GrammarMask(_)));
        p
    };
    // the grammar policy is compared as recorded
    let stop_of = |p: &SamplingParams| StopConfig {
        grammar_policy: h.stop.grammar_policy,
        ..StopConfig::from_params(p)
    };
    let mismatch = |what: &str| {
        EngineError::invalid(
            "params",
            format!("the trace header's params do not give its {what} (was the header edited?)"),
        )
    };
    match h.pipeline_source.parse::<nextok_core::Preset>() {
        Ok(preset) => {
            let (cfg, stop) = nextok_core::pipeline::presets::build(preset, params)
                .map_err(|e| EngineError::invalid("params", e.to_string()))?;
            if strip(&cfg) != strip(&h.pipeline) {
                return Err(mismatch("pipeline"));
            }
            if stop != h.stop {
                return Err(mismatch("stop conditions"));
            }
        }
        Err(_) => {
            if stop_of(params) != h.stop {
                return Err(mismatch("stop conditions"));
            }
        }
    }
    Ok(())
}

/// The numerics identifier of `model` run on a `kv` cache with this build's sampler: the
/// model's parts ([`nextok_model::numerics::identifier`]) and `sampler=N`
/// ([`nextok_core::numerics::SAMPLER`]).
pub fn numerics(model: &Model, kv: nextok_model::KvCacheType) -> String {
    format!(
        "{} sampler={}",
        nextok_model::numerics::identifier(&model.weights, kv),
        nextok_core::numerics::SAMPLER
    )
}

/// [`numerics`] of the model file at `path` loaded with `requant`, from its metadata alone (no
/// weight is read): what a replay checks before it loads the model.
pub fn numerics_of_file(
    path: &std::path::Path,
    requant: nextok_model::Requant,
    kv: nextok_model::KvCacheType,
) -> Result<String> {
    let f = nextok_model::file::GgufFile::open(path).map_err(EngineError::model)?;
    let model =
        nextok_model::numerics::identifier_of_file(&f, requant, kv).map_err(EngineError::model)?;
    Ok(format!(
        "{model} sampler={}",
        nextok_core::numerics::SAMPLER
    ))
}

/// The sampler's part of an identifier (`sampler=N`), if it has one.
fn sampler_part(id: &str) -> Option<&str> {
    id.split_whitespace().find(|w| w.starts_with("sampler="))
}

/// A trace this build will not replay because it computes other numerics: what recorded it,
/// what this build computes, and which build replays it. Found before any model call.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// The recording build's version (`unknown` for a trace without one).
    pub recorded_version: String,
    /// The recording's numerics identifier.
    pub recorded_numerics: String,
    /// This build's version.
    pub version: String,
    /// What this build computes for the trace's model and cache.
    pub numerics: String,
    /// The parts that differ (`graph.llama: 1 → 2`).
    pub differences: Vec<String>,
    /// Whether only the sampler was to be replayed.
    pub sampler_only: bool,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cannot replay: the trace was recorded by nextok {} with numerics `{}`; this build (nextok {}) computes `{}` ({}); replay it with nextok {} or another build of numerics `{}`",
            self.recorded_version,
            self.recorded_numerics,
            self.version,
            self.numerics,
            self.differences.join(", "),
            self.recorded_version,
            self.recorded_numerics,
        )?;
        if !self.sampler_only {
            f.write_str(
                ", or replay its sampler alone (`--sampler-only`, for a trace recorded with `--trace-logits`)",
            )?;
        }
        Ok(())
    }
}

impl Refusal {
    /// As data (`nextok replay --json`).
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "ok": false,
            "reason": "numerics",
            "recorded": {"version": self.recorded_version, "numerics": self.recorded_numerics},
            "now": {"version": self.version, "numerics": self.numerics},
            "differences": self.differences,
            "message": self.to_string(),
        })
    }
}

/// Whether this build may replay `h` when it computes the numerics `now`: a trace that names
/// other numerics is refused before any model call. A replay of the sampler alone
/// (`sampler_only`) needs only the sampler's part to agree. A trace without an identifier
/// (recorded before numerics were versioned) is replayed as it is.
pub fn check_numerics(
    h: &TraceHeader,
    now: &str,
    sampler_only: bool,
) -> std::result::Result<(), Box<Refusal>> {
    let Some(rec) = &h.numerics else {
        return Ok(());
    };
    let agree = if sampler_only {
        sampler_part(rec) == sampler_part(now)
    } else {
        rec == now
    };
    if agree {
        return Ok(());
    }
    let mut differences = nextok_model::numerics::differences(rec, now);
    if sampler_only {
        differences.retain(|d| d.starts_with("sampler:"));
    }
    Err(Box::new(Refusal {
        recorded_version: h.nextok_version.clone().unwrap_or_else(|| "unknown".into()),
        recorded_numerics: rec.clone(),
        version: crate::VERSION.to_string(),
        numerics: now.to_string(),
        differences,
        sampler_only,
    }))
}

/// Where a replay first differs from its trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Divergence {
    /// The sequence (0-based).
    pub sequence: usize,
    /// The step within it (`None`: the difference is in the number of records).
    pub step: Option<u64>,
    /// The trace line (1-based; the header is line 1).
    pub line: usize,
    /// The first field that differs (`raw_logits_digest`, `candidates[0].raw_logit`, …).
    pub field: String,
    /// Its recorded value.
    pub recorded: Value,
    /// Its value now.
    pub now: Value,
    /// The whole story in one line.
    pub message: String,
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl Divergence {
    /// As data (`nextok replay --json`).
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "ok": false,
            "reason": "divergence",
            "sequence": self.sequence,
            "step": self.step,
            "line": self.line,
            "field": self.field,
            "recorded": self.recorded,
            "now": self.now,
            "message": self.message,
        })
    }

    fn count(sequence: usize, step: Option<u64>, line: usize, message: String) -> Box<Divergence> {
        Box::new(Divergence {
            sequence,
            step,
            line,
            field: "steps".into(),
            recorded: Value::Null,
            now: Value::Null,
            message,
        })
    }
}

/// The keys of a trace line that are not part of the step's decision (the stored raw logits).
const NOT_COMPARED: [&str; 1] = ["raw_logits"];

/// Compares the step `got` of sequence `si` with the recorded line `want` (trace line
/// `line`); `now` is this build's numerics identifier, which the message of a raw-logits
/// difference explains itself with.
fn compare_step(
    h: &TraceHeader,
    now: &str,
    si: usize,
    line: usize,
    want: &Value,
    got: &nextok_core::StepRecord,
) -> std::result::Result<(), Box<Divergence>> {
    // through the text form, as the trace holds it (f32 values print as f32)
    let text = serde_json::to_string(got).unwrap_or_default();
    let got: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let mut want = want.clone();
    if let Value::Object(m) = &mut want {
        for k in NOT_COMPARED {
            m.remove(k);
        }
    }
    let Some((field, a, b)) = first_diff("", &want, &got) else {
        return Ok(());
    };
    let step = got.get("step").and_then(Value::as_u64);
    let why = if field == "raw_logits_digest" {
        match &h.numerics {
            None => format!(
                ": the trace predates versioned numerics (its header names no `numerics`) and this build's arithmetic (nextok {}, numerics `{now}`) differs from the one that recorded it: its raw logits are not these ({}; docs/semantics.md §13.1)",
                crate::VERSION,
                nextok_model::numerics::BEFORE_VERSIONING
            ),
            Some(rec) if rec == now => format!(
                ": the raw logits differ although the recording and this build both compute numerics `{now}` — a change of bits that was not declared, or a fault in this machine's kernels; please report it"
            ),
            Some(rec) => format!(
                ": the trace was recorded with numerics `{rec}`, this build computes `{now}`"
            ),
        }
    } else {
        String::new()
    };
    let step_text = step.map_or("?".to_string(), |s| s.to_string());
    Err(Box::new(Divergence {
        sequence: si,
        step,
        line,
        message: format!(
            "replay mismatch: sequence {si} step {step_text} (trace line {line}): field `{field}` differs (recorded {}, now {}){why}",
            excerpt(&a),
            excerpt(&b)
        ),
        field,
        recorded: a,
        now: b,
    }))
}

/// A value as a message quotes it: its JSON, at most 80 characters.
fn excerpt(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() <= 80 {
        s
    } else {
        let head: String = s.chars().take(77).collect();
        format!("{head}…")
    }
}

/// Compares a re-run with the recorded lines; returns the number of steps that matched, or
/// the first difference (sequence, step, line, field, both values). `now` is this build's
/// numerics identifier ([`numerics`]).
pub fn compare(
    h: &TraceHeader,
    now: &str,
    recorded: &[Value],
    run: &Completion,
) -> std::result::Result<usize, Box<Divergence>> {
    let mut k = 0usize;
    for (si, s) in run.sequences.iter().enumerate() {
        for r in &s.records {
            let Some(want) = recorded.get(k) else {
                return Err(Divergence::count(
                    si,
                    Some(r.step),
                    k + 2,
                    format!(
                        "replay mismatch: sequence {si} step {}: the replay goes on, the trace ends (line {})",
                        r.step,
                        k + 2
                    ),
                ));
            };
            compare_step(h, now, si, k + 2, want, r)?;
            k += 1;
        }
    }
    if k != recorded.len() {
        return Err(Divergence::count(
            run.sequences.len().saturating_sub(1),
            None,
            k + 2,
            format!(
                "replay mismatch: the trace has {} step records, the replay produced {k}",
                recorded.len()
            ),
        ));
    }
    Ok(k)
}

/// Replays the sampler alone: every recorded step's stored raw logits go through the request's
/// pipeline, constraint and stop conditions (`prepared`, from [`replay_request`]) with the
/// recorded seeds and drafted tokens, and each new record is compared with the recorded one.
/// No model runs, so this checks the decoding on any build and machine whose sampler numerics
/// are the trace's, whatever the model's. The trace must carry its logits
/// ([`TraceHeader::raw_logits`]).
pub fn replay_sampler(
    h: &TraceHeader,
    now: &str,
    recorded: &[Value],
    prepared: &crate::Prepared,
    vocab_size: usize,
) -> std::result::Result<usize, Box<Divergence>> {
    let bad = |si: usize, line: usize, field: &str, message: String| {
        Box::new(Divergence {
            sequence: si,
            step: None,
            line,
            field: field.to_string(),
            recorded: Value::Null,
            now: Value::Null,
            message,
        })
    };
    if !h.raw_logits {
        return Err(bad(
            0,
            1,
            "raw_logits",
            "cannot replay the sampler alone: the trace carries no raw logits (record it with `--trace-logits`)".into(),
        ));
    }
    let sampler = &prepared.sampler;
    let spec = h.speculative.unwrap_or_default();
    let mut ws = sampler.new_workspace();
    let mut si = 0usize;
    let mut state: Option<nextok_core::DecoderState> = None;
    let mut finished = false;
    for (k, want) in recorded.iter().enumerate() {
        let line = k + 2;
        let rec: nextok_core::StepRecord = serde_json::from_value(want.clone())
            .map_err(|e| bad(si, line, "trace", format!("trace line {line}: {e}")))?;
        // a record of step 0 starts the next sequence
        if rec.step == 0 && state.is_some() {
            si += 1;
            state = None;
        }
        if state.is_none() {
            let Some(&seed) = h.seeds.get(si) else {
                return Err(bad(
                    si,
                    line,
                    "seeds",
                    format!(
                        "trace line {line} starts sequence {si}, the header has {} seeds",
                        h.seeds.len()
                    ),
                ));
            };
            let mut st = sampler
                .new_state(&h.prompt_ids, seed)
                .map_err(|e| bad(si, line, "prompt_ids", e.to_string()))?;
            if let Some(c) = &prepared.constraint {
                st.set_grammar(Box::new(c.start()));
            }
            state = Some(st);
            finished = false;
        }
        let st = state.as_mut().expect("set above");
        if finished {
            return Err(bad(
                si,
                line,
                "steps",
                format!("replay mismatch: sequence {si} finished before trace line {line}: the trace goes on"),
            ));
        }
        let packed = rec.raw_logits.as_ref().ok_or_else(|| {
            bad(
                si,
                line,
                "raw_logits",
                format!("trace line {line} carries no raw logits"),
            )
        })?;
        let row = packed
            .unpack(vocab_size)
            .map_err(|e| bad(si, line, "raw_logits", format!("trace line {line}: {e}")))?;
        if row.len() != vocab_size {
            return Err(bad(
                si,
                line,
                "raw_logits.len",
                format!(
                    "trace line {line}: {} raw logits, the vocabulary has {vocab_size}",
                    row.len()
                ),
            ));
        }
        let draft = rec.draft.as_ref().map(|d| d.token);
        let (res, mut got) = sampler
            .step_recorded(&row, st, &mut ws, spec.draw(draft), h.candidates)
            .map_err(|e| bad(si, line, "step", format!("trace line {line}: {e}")))?;
        spec.mark(&mut got, draft);
        compare_step(h, now, si, line, want, &got)?;
        finished = res.finish.is_some();
    }
    if si + 1 != h.seeds.len() {
        return Err(Divergence::count(
            si,
            None,
            recorded.len() + 1,
            format!(
                "replay mismatch: the trace has the records of {} sequences, its header {}",
                if recorded.is_empty() { 0 } else { si + 1 },
                h.seeds.len()
            ),
        ));
    }
    Ok(recorded.len())
}

/// Why [`replay_on`] did not confirm a trace.
#[derive(Debug)]
pub enum ReplayError {
    /// The trace names other numerics ([`check_numerics`]).
    Refused(Box<Refusal>),
    /// The replay differs from the trace.
    Diverged(Box<Divergence>),
    /// The trace does not fit this engine (another model file, re-quantisation or cache
    /// type, another pipeline) or the run failed; the error names the field.
    Failed(EngineError),
}

impl std::fmt::Display for ReplayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplayError::Refused(r) => r.fmt(f),
            ReplayError::Diverged(d) => d.fmt(f),
            ReplayError::Failed(e) => e.fmt(f),
        }
    }
}

impl From<EngineError> for ReplayError {
    fn from(e: EngineError) -> ReplayError {
        ReplayError::Failed(e)
    }
}

/// Replays a parsed trace on `engine`: the engine's model must be the recorded file (SHA-256)
/// with the recorded re-quantisation and cache type, the numerics must agree (all of them, or
/// the sampler's alone with `sampler_only`), the pipeline must hash as recorded; then the
/// request runs again — or, with `sampler_only`, the stored raw logits go through the sampler
/// ([`replay_sampler`]) — and every step is compared. Returns the steps that matched.
pub fn replay_on(
    engine: &crate::Engine,
    h: &TraceHeader,
    recorded: &[Value],
    sampler_only: bool,
) -> std::result::Result<usize, ReplayError> {
    let run = |r: GenerateRequest| engine.generate(r).map_err(ReplayError::Failed);
    replay_on_with(engine, h, recorded, sampler_only, run).and_then(|r| r)
}

/// [`replay_on`] with the full replay's request run by `run` (a front end that waits in its
/// own way, interruptible): the outer error is `run`'s, the inner result the replay's.
pub fn replay_on_with<E>(
    engine: &crate::Engine,
    h: &TraceHeader,
    recorded: &[Value],
    sampler_only: bool,
    run: impl FnOnce(GenerateRequest) -> std::result::Result<Completion, E>,
) -> std::result::Result<std::result::Result<usize, ReplayError>, E> {
    Ok(match replay_checked(engine, h, sampler_only) {
        Err(e) => Err(e),
        Ok((_, p, now)) if sampler_only => {
            let vocab = engine.model().weights.config.vocab_size;
            replay_sampler(h, &now, recorded, &p, vocab).map_err(ReplayError::Diverged)
        }
        Ok((req, _, now)) => {
            let c = run(req)?;
            compare(h, &now, recorded, &c).map_err(ReplayError::Diverged)
        }
    })
}

/// The checks of [`replay_on`] before anything runs: the request, its preparation and this
/// engine's numerics.
fn replay_checked(
    engine: &crate::Engine,
    h: &TraceHeader,
    sampler_only: bool,
) -> std::result::Result<(GenerateRequest, crate::Prepared, String), ReplayError> {
    let req = replay_request(h)?;
    let model = engine.model();
    let mismatch = |field: &str, msg: String| ReplayError::Failed(EngineError::invalid(field, msg));
    if model.sha256 != h.model_sha256 {
        return Err(mismatch(
            "model_sha256",
            format!(
                "this engine's model has SHA-256 {}; the trace was recorded with `{}`, SHA-256 {}",
                model.sha256, h.model_file, h.model_sha256
            ),
        ));
    }
    if h.requant()? != model.weights.requant {
        return Err(mismatch(
            "requant",
            format!(
                "the trace was recorded with requant `{}`, this engine's model has `{}`",
                h.requant,
                model.weights.requant.name()
            ),
        ));
    }
    if h.kv_cache()? != engine.config().kv_cache_type {
        return Err(mismatch(
            "kv_cache",
            format!(
                "the trace was recorded with a `{}` KV cache, this engine's is `{}`",
                h.kv_cache,
                engine.config().kv_cache_type
            ),
        ));
    }
    let now = engine.numerics();
    check_numerics(h, &now, sampler_only).map_err(ReplayError::Refused)?;
    let mut prep = req.clone();
    if sampler_only {
        // the recorded drafts are fed as recorded: nothing is drafted
        prep.speculative = None;
    }
    let p = engine.prepare(&prep)?;
    if p.info.pipeline_hash != h.pipeline_hash {
        return Err(mismatch(
            "pipeline_hash",
            format!(
                "the pipeline hashes to {}, the trace says {}",
                p.info.pipeline_hash, h.pipeline_hash
            ),
        ));
    }
    Ok((req, p, now))
}

/// The first difference between two JSON values: its path and both values (`None` when
/// equal).
pub fn first_diff(path: &str, a: &Value, b: &Value) -> Option<(String, Value, Value)> {
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
                    None => return Some((p, v.clone(), Value::Null)),
                }
            }
            y.iter().find(|(k, _)| !x.contains_key(*k)).map(|(k, w)| {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                (p, Value::Null, w.clone())
            })
        }
        (Value::Array(x), Value::Array(y)) => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                if let Some(d) = first_diff(&format!("{path}[{i}]"), v, w) {
                    return Some(d);
                }
            }
            (x.len() != y.len()).then(|| {
                (
                    format!("{path} (length {} vs {})", x.len(), y.len()),
                    Value::from(x.len()),
                    Value::from(y.len()),
                )
            })
        }
        _ => (a != b).then(|| (path.to_string(), a.clone(), b.clone())),
    }
}
