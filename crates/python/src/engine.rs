//! `nextok._Engine`: the engine behind `nextok.LLM` — a model and the continuous-batching
//! engine of `nextok generate` and `nextok serve`; requests run with the GIL released.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use nextok_constraint::ConstraintSpec;
use nextok_core::{FinishReason, Layer, Preset, SamplingParams};
use nextok_engine::{
    Completion, Engine, EngineConfig, GenerateRequest, LogprobOptions, PipelineChoice, Prompt,
};
use nextok_model::{fetch, Model, Requant};

use crate::convert::{from_json, to_json, token_ids, type_name, NonFinite};
use crate::errors::Failure;

/// The engine: one model, its scheduler thread, and the requests it runs together.
#[pyclass(module = "nextok", name = "_Engine", frozen)]
pub struct PyEngine {
    engine: Engine,
    model_path: String,
}

fn model_failure(e: nextok_model::ModelError) -> Failure {
    Failure::new("EngineError", e.to_string())
        .code("model")
        .field("model")
}

/// Reads one `EngineConfig` field from a keyword argument.
fn set_config(
    config: &mut EngineConfig,
    key: &str,
    value: &Bound<'_, PyAny>,
) -> Result<(), Failure> {
    let count = || -> Result<usize, Failure> {
        let v: i64 = value.extract().map_err(|_| {
            Failure::argument(key, format!("must be an integer, got {}", type_name(value)))
        })?;
        usize::try_from(v).map_err(|_| Failure::argument(key, format!("{v} is negative")))
    };
    let optional = || -> Result<Option<u64>, Failure> {
        if value.is_none() {
            Ok(None)
        } else {
            Ok(Some(count()? as u64))
        }
    };
    match key {
        "max_num_seqs" => config.max_num_seqs = count()?,
        "max_batch_tokens" => config.max_batch_tokens = count()?,
        "prefill_chunk_tokens" => config.prefill_chunk_tokens = count()?,
        "kv_budget_bytes" => config.kv_budget_bytes = count()?,
        "max_waiting" => config.max_waiting = count()?,
        "prefix_cache_entries" => config.prefix_cache_entries = count()?,
        "constraint_cache_bytes" => config.constraint_cache_bytes = count()?,
        "default_max_tokens" => config.default_max_tokens = optional()?,
        "max_tokens_limit" => config.max_tokens_limit = optional()?,
        "parse_special_in_messages" => {
            config.parse_special_in_messages = value.extract().map_err(|_| {
                Failure::argument(key, format!("must be a bool, got {}", type_name(value)))
            })?
        }
        other => {
            return Err(Failure::argument(
                other,
                "is not an engine setting (max_num_seqs, max_batch_tokens, prefill_chunk_tokens, kv_budget_bytes, max_waiting, prefix_cache_entries, constraint_cache_bytes, default_max_tokens, max_tokens_limit, parse_special_in_messages)",
            ))
        }
    }
    Ok(())
}

/// One request as `LLM.generate` hands it over: the prompt (text or ids) and the parameters.
fn request(
    prompt: &Bound<'_, PyAny>,
    spec: &Bound<'_, PyDict>,
    index: usize,
) -> Result<GenerateRequest, Failure> {
    let prompt = if let Ok(s) = prompt.cast::<PyString>() {
        Prompt::Text(
            s.to_str()
                .map_err(|e| Failure::argument(format!("prompts[{index}]"), e.to_string()))?
                .to_string(),
        )
    } else {
        Prompt::Ids(token_ids(&format!("prompts[{index}]"), prompt)?)
    };
    let get = |k: &str| spec.get_item(k).ok().flatten().filter(|v| !v.is_none());
    let params: SamplingParams = match get("params") {
        None => SamplingParams::default(),
        Some(p) => from_json(to_json(&p, "", NonFinite::Refuse)?, "")?,
    };
    let n = match get("n") {
        None => 1,
        Some(v) => v
            .extract::<usize>()
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| Failure::parameter("n", "must be an integer >= 1"))?,
    };
    let layer = match get("logprob_layer") {
        None => Layer::Raw,
        Some(v) => from_json(
            to_json(&v, "logprob_layer", NonFinite::Refuse)?,
            "logprob_layer",
        )?,
    };
    let logprobs = match get("logprobs") {
        None => None,
        Some(v) => Some(LogprobOptions {
            top: v
                .extract::<usize>()
                .map_err(|_| Failure::argument("logprobs", "must be a non-negative integer"))?,
            layer,
        }),
    };
    let pipeline = match get("pipeline") {
        None => PipelineChoice::default(),
        Some(p) => {
            if let Ok(s) = p.cast::<PyString>() {
                let name = s
                    .to_str()
                    .map_err(|e| Failure::argument("pipeline", e.to_string()))?;
                let preset: Preset = name.parse().map_err(|e: nextok_core::Error| {
                    Failure::parameter("pipeline", e.to_string())
                })?;
                PipelineChoice::Preset(preset)
            } else {
                let cfg = nextok_core::PipelineConfig::from_json(
                    &to_json(&p, "pipeline", NonFinite::Refuse)?.to_string(),
                )?;
                PipelineChoice::Config(cfg)
            }
        }
    };
    let constraint: Option<ConstraintSpec> = match get("constraint") {
        None => None,
        Some(c) => Some(from_json(
            to_json(&c, "constraint", NonFinite::Refuse)?,
            "constraint",
        )?),
    };
    Ok(GenerateRequest {
        prompt,
        params,
        constraint,
        pipeline,
        n,
        logprobs,
        ..Default::default()
    })
}

/// `vLLM`'s finish reason (`"stop"` or `"length"`) and stop reason (the stop token id or the
/// stop string; `None` for EOS and length).
fn finish_reasons(
    py: Python<'_>,
    reason: Option<&FinishReason>,
    stops: &[String],
) -> PyResult<(&'static str, Py<PyAny>)> {
    Ok(match reason {
        Some(FinishReason::Eos { .. }) => ("stop", py.None()),
        Some(FinishReason::StopToken { token }) => {
            ("stop", token.into_pyobject(py)?.into_any().unbind())
        }
        Some(FinishReason::StopString { pattern, .. }) => (
            "stop",
            match stops.get(*pattern) {
                Some(s) => PyString::new(py, s).into_any().unbind(),
                None => py.None(),
            },
        ),
        Some(FinishReason::GrammarAccepted) => ("stop", py.None()),
        Some(FinishReason::MaxTokens) | None => ("length", py.None()),
    })
}

fn layer_name(l: Layer) -> &'static str {
    match l {
        Layer::Raw => "raw",
        Layer::Processed => "processed",
        Layer::Selection => "selection",
    }
}

/// A finished request as a dict (the fields of vLLM's `RequestOutput`, plus nextok's).
fn completion_dict<'py>(py: Python<'py>, c: &Completion) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("request_id", c.info.id.to_string())?;
    d.set_item("prompt_token_ids", c.info.prompt_ids.clone())?;
    d.set_item("pipeline_hash", c.info.pipeline_hash.as_str())?;
    d.set_item("seeds", c.info.seeds.clone())?;
    let usage = PyDict::new(py);
    usage.set_item("prompt_tokens", c.usage.prompt_tokens)?;
    usage.set_item("cached_tokens", c.usage.cached_tokens)?;
    usage.set_item("completion_tokens", c.usage.completion_tokens)?;
    d.set_item("usage", usage)?;
    let metrics = PyDict::new(py);
    metrics.set_item("queued", c.timing.queued.as_secs_f64())?;
    metrics.set_item(
        "time_to_first_token",
        c.timing.time_to_first_token.as_secs_f64(),
    )?;
    metrics.set_item("total", c.timing.total.as_secs_f64())?;
    d.set_item("metrics", metrics)?;
    let outputs = PyList::empty(py);
    for (i, s) in c.sequences.iter().enumerate() {
        let o = PyDict::new(py);
        o.set_item("index", i)?;
        o.set_item("text", s.text.as_str())?;
        o.set_item("token_ids", s.tokens.clone())?;
        let (finish, stop) = finish_reasons(py, s.finish.as_ref(), &c.info.stop.stop)?;
        o.set_item("finish_reason", finish)?;
        o.set_item("stop_reason", stop)?;
        if s.logprobs.is_empty() {
            o.set_item("logprobs", py.None())?;
            o.set_item("cumulative_logprob", py.None())?;
            o.set_item("logprob_layer", py.None())?;
        } else {
            let list = PyList::empty(py);
            let mut total = 0.0;
            for (t, lp) in s.tokens.iter().zip(&s.logprobs) {
                let m = PyDict::new(py);
                for (id, v) in &lp.top {
                    m.set_item(id, v)?;
                }
                m.set_item(t, lp.selected)?;
                total += lp.selected;
                list.append(m)?;
            }
            o.set_item("logprobs", list)?;
            o.set_item("cumulative_logprob", total)?;
            o.set_item("logprob_layer", layer_name(s.logprobs[0].layer))?;
        }
        outputs.append(o)?;
    }
    d.set_item("outputs", outputs)?;
    Ok(d)
}

#[pymethods]
impl PyEngine {
    /// Loads `model` (`None`: the default model, fetched once; a GGUF path; or a model name
    /// nextok knows) and starts the engine with `config` (`EngineConfig` fields by name).
    #[new]
    #[pyo3(signature = (model = None, requant = None, config = None))]
    fn new(
        py: Python<'_>,
        model: Option<&Bound<'_, PyAny>>,
        requant: Option<&str>,
        config: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyEngine> {
        let requant = match requant {
            None | Some("keep") => Requant::Keep,
            Some("q8_0") => Requant::Q8_0,
            Some(other) => {
                return Err(Failure::argument(
                    "requant",
                    format!("{other:?} is not `keep` or `q8_0`"),
                )
                .into())
            }
        };
        let mut cfg = EngineConfig::default();
        if let Some(c) = config {
            for (k, v) in c.iter() {
                let key: String = k.extract()?;
                set_config(&mut cfg, &key, &v)?;
            }
        }
        let path: std::path::PathBuf = match model.filter(|m| !m.is_none()) {
            None => py.detach(fetch::default_model).map_err(model_failure)?,
            Some(m) => {
                let p: std::path::PathBuf = m.extract().map_err(|_| {
                    Failure::argument(
                        "model",
                        format!("must be a path or a model name, got {}", type_name(m)),
                    )
                })?;
                if p.is_file() {
                    p
                } else {
                    let name = p.to_string_lossy().into_owned();
                    match py.detach(|| fetch::named_model(&name)) {
                        Some(r) => r.map_err(model_failure)?,
                        None => {
                            return Err(Failure::argument(
                                "model",
                                format!("{name:?} is neither a file nor a model name nextok knows"),
                            )
                            .into())
                        }
                    }
                }
            }
        };
        let loaded = py
            .detach(|| Model::load(&path, requant))
            .map_err(model_failure)?;
        let engine = Engine::new(Arc::new(loaded), cfg).map_err(Failure::from)?;
        Ok(PyEngine {
            engine,
            model_path: path.display().to_string(),
        })
    }

    /// Runs `requests` (a list of `(prompt, spec)`: a prompt string or token ids, and a dict
    /// with `params`, `n`, `logprobs`, `logprob_layer`, `pipeline`, `constraint`) together, the
    /// GIL released while the engine works; returns one dict per request, in order.
    fn generate<'py>(
        &self,
        py: Python<'py>,
        requests: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let mut reqs = Vec::new();
        for (i, item) in requests.try_iter()?.enumerate() {
            let item = item?;
            let (prompt, spec): (Bound<'py, PyAny>, Bound<'py, PyDict>) = item.extract()?;
            reqs.push(request(&prompt, &spec, i)?);
        }
        // every request is submitted before any is waited for: they run as one batch
        let mut handles = Vec::with_capacity(reqs.len());
        for r in reqs {
            handles.push(self.engine.submit(r).map_err(Failure::from)?);
        }
        let done: Vec<nextok_engine::Result<Completion>> =
            py.detach(|| handles.iter_mut().map(|h| h.collect_all()).collect());
        let mut out = Vec::with_capacity(done.len());
        for c in done {
            out.push(completion_dict(py, &c.map_err(Failure::from)?)?);
        }
        Ok(out)
    }

    /// Text → token ids as a text prompt is tokenised (BOS when the model asks for it, special
    /// tokens written in the text recognised).
    fn encode(&self, text: &str) -> PyResult<Vec<u32>> {
        Ok(self
            .engine
            .model()
            .encode_prompt(text)
            .map_err(model_failure)?)
    }

    /// The model file's path.
    #[getter]
    fn model_path(&self) -> &str {
        &self.model_path
    }

    /// The model's vocabulary size (its logits row length).
    #[getter]
    fn vocab_size(&self) -> usize {
        self.engine.model().vocab.info.vocab_size
    }
}
