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
        ledger_step: None,
        // the same drafts again (prompt lookup is a function of the tokens so far), so the
        // records' draft marks and, in `rejection` mode, the tokens replay too
        speculative: h.speculative,
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

/// Compares a re-run with the recorded lines; returns the number of steps that matched, or
/// a message naming the first difference (sequence, step, line, field).
pub fn compare(
    h: &TraceHeader,
    recorded: &[Value],
    run: &Completion,
) -> std::result::Result<usize, String> {
    let mut k = 0usize;
    for (si, s) in run.sequences.iter().enumerate() {
        for r in &s.records {
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
                let hint = if field == "raw_logits_digest" && !h.simd.is_empty() && h.simd != simd {
                    format!(
                        " (recorded by a build with SIMD features `{}`, this one has `{simd}`: the model's kernels, and so its logits, differ)",
                        h.simd
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
    Ok(k)
}

/// Names the first difference between two JSON values (`None` when equal).
pub fn first_diff(path: &str, a: &Value, b: &Value) -> Option<String> {
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
