//! `nextok._Engine`: the engine behind `nextok.LLM` — a model and the continuous-batching
//! engine of `nextok generate` and `nextok serve`; requests run with the GIL released.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use nextok_constraint::ConstraintSpec;
use nextok_core::{FinishReason, Layer, Preset, SamplingParams};
use nextok_engine::trace::{self, TraceHeader};
use nextok_engine::{
    Completion, Engine, EngineConfig, Event, GenerateRequest, LogprobOptions, PipelineChoice,
    Prompt, Recv, RequestHandle, RequestInfo,
};
use nextok_model::chat::Message;
use nextok_model::{fetch, Model, Requant};

use crate::convert::{from_json, to_json, token_ids, type_name, NonFinite};
use crate::errors::{Detail, Failure};

/// The engine: one model, its scheduler thread, and the requests it runs together.
#[pyclass(module = "nextok", name = "_Engine", frozen)]
pub struct PyEngine {
    pub(crate) engine: Arc<Engine>,
    pub(crate) model_path: String,
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
        "itl_target_ms" => config.itl_target_ms = count()? as u64,
        "kv_budget_bytes" => config.kv_budget_bytes = count()?,
        "max_waiting" => config.max_waiting = count()?,
        "prefix_cache_entries" => config.prefix_cache_entries = count()?,
        "constraint_cache_bytes" => config.constraint_cache_bytes = count()?,
        "default_max_tokens" => config.default_max_tokens = optional()?,
        "max_tokens_limit" => config.max_tokens_limit = optional()?,
        "kv_cache_type" => {
            let name: String = value.extract().map_err(|_| {
                Failure::argument(key, format!("must be a str, got {}", type_name(value)))
            })?;
            config.kv_cache_type = nextok_model::KvCacheType::from_name(&name).ok_or_else(|| {
                Failure::argument(key, format!("`{name}` is not a cache type (f16, q8_0)"))
            })?;
        }
        "parse_special_in_messages" => {
            config.parse_special_in_messages = value.extract().map_err(|_| {
                Failure::argument(key, format!("must be a bool, got {}", type_name(value)))
            })?
        }
        other => {
            return Err(Failure::argument(
                other,
                "is not an engine setting (max_num_seqs, max_batch_tokens, prefill_chunk_tokens, itl_target_ms, kv_budget_bytes, kv_cache_type, max_waiting, prefix_cache_entries, constraint_cache_bytes, default_max_tokens, max_tokens_limit, parse_special_in_messages)",
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
    let get = |k: &str| spec.get_item(k).ok().flatten().filter(|v| !v.is_none());
    let chat = match get("chat") {
        None => false,
        Some(v) => v.is_truthy().unwrap_or(false),
    };
    let prompt = if chat {
        Prompt::Chat(messages(prompt, index)?)
    } else if let Ok(s) = prompt.cast::<PyString>() {
        Prompt::Text(
            s.to_str()
                .map_err(|e| Failure::argument(format!("prompts[{index}]"), e.to_string()))?
                .to_string(),
        )
    } else {
        Prompt::Ids(token_ids(&format!("prompts[{index}]"), prompt)?)
    };
    let mut params: SamplingParams = match get("params") {
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
    // the constraint has one slot, `params.constraint`; `SamplingParams(constraint=...)` fills it
    if let Some(c) = get("constraint") {
        if params.constraint.is_some() {
            return Err(Failure::argument(
                "constraint",
                "given twice (constraint= and params' constraint); give it once",
            ));
        }
        let spec: ConstraintSpec =
            from_json(to_json(&c, "constraint", NonFinite::Refuse)?, "constraint")?;
        params.constraint = Some(spec);
    }
    let records = match get("trace") {
        None => None,
        Some(v) => Some(
            v.extract::<usize>()
                .ok()
                .filter(|&k| k <= MAX_TRACE_CANDIDATES)
                .ok_or_else(|| {
                    Failure::argument(
                        "trace",
                        format!("must be an integer in 0..={MAX_TRACE_CANDIDATES} (candidates per step record)"),
                    )
                })?,
        ),
    };
    let trace_logits = match get("trace_logits") {
        None => false,
        Some(v) => v
            .extract::<bool>()
            .map_err(|_| Failure::argument("trace_logits", "must be a bool"))?,
    };
    Ok(GenerateRequest {
        prompt,
        params,
        pipeline,
        n,
        logprobs,
        records,
        trace_logits,
        ..Default::default()
    })
}

/// The most candidates a step record of a Python trace carries.
const MAX_TRACE_CANDIDATES: usize = 1024;

/// The most messages a chat prompt may have (the engine bounds their text).
const MAX_MESSAGES: usize = 4096;

/// Chat messages: a sequence of `{"role": str, "content": str}`.
fn messages(v: &Bound<'_, PyAny>, index: usize) -> Result<Vec<Message>, Failure> {
    let field = format!("messages[{index}]");
    let bad = |what: String| Failure::argument(field.clone(), what);
    let items = v
        .try_iter()
        .map_err(|_| bad(format!("must be a list of messages, got {}", type_name(v))))?;
    let mut out = Vec::new();
    for (i, m) in items.enumerate() {
        if i >= MAX_MESSAGES {
            return Err(bad(format!("has more than {MAX_MESSAGES} messages")));
        }
        let m = m.map_err(|e| bad(e.to_string()))?;
        let d = m.cast::<PyDict>().map_err(|_| {
            bad(format!(
                "[{i}] must be a dict with `role` and `content`, got {}",
                type_name(&m)
            ))
        })?;
        let text = |k: &str| -> Result<String, Failure> {
            let v = d
                .get_item(k)
                .ok()
                .flatten()
                .ok_or_else(|| bad(format!("[{i}] has no `{k}`")))?;
            v.extract::<String>()
                .map_err(|_| bad(format!("[{i}].{k} must be a string, got {}", type_name(&v))))
        };
        out.push(Message {
            role: text("role")?,
            content: text("content")?,
        });
    }
    Ok(out)
}

/// How the request's pipeline was given, as a trace header names it.
fn pipeline_source(spec: &Bound<'_, PyDict>) -> String {
    match spec.get_item("pipeline").ok().flatten() {
        Some(p) => match p.cast::<PyString>() {
            Ok(s) => s.to_str().unwrap_or("reference").to_string(),
            Err(_) => "json".to_string(),
        },
        None => "reference".to_string(),
    }
}

/// Waits for `handle`'s completion with the GIL released, checking for Python signals (Ctrl-C)
/// every 100 ms: on one, the request is cancelled and the signal's exception raised.
fn wait(py: Python<'_>, handle: &mut RequestHandle) -> PyResult<Completion> {
    let interrupt: Mutex<Option<PyErr>> = Mutex::new(None);
    let done = py.detach(|| {
        handle.collect_until(|| {
            Python::attach(|py| match py.check_signals() {
                Ok(()) => false,
                Err(e) => {
                    if let Ok(mut slot) = interrupt.lock() {
                        *slot = Some(e);
                    }
                    true
                }
            })
        })
    });
    if let Some(e) = interrupt.lock().ok().and_then(|mut s| s.take()) {
        return Err(e);
    }
    Ok(done.map_err(Failure::from)?)
}

/// The trace of a completion as `nextok generate --trace` writes it: the header line, then
/// every step record, sequence by sequence.
fn trace_text(
    model: &Model,
    c: &Completion,
    source: &str,
    candidates: usize,
    logits: bool,
) -> String {
    let header = TraceHeader::new(&c.info, model, source, candidates).with_raw_logits(logits);
    trace::text(&header, c.sequences.iter().map(|s| s.records.as_slice()))
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

/// One token's logprobs as vLLM gives them: `{id: (logprob, rank, decoded_token)}` for the
/// best candidates (ranks 1, 2, … in the layer, best first) and the selected token (its rank
/// among them, or `None` when it is not one of them).
fn logprob_map<'py>(
    py: Python<'py>,
    model: &Model,
    selected: u32,
    lp: &nextok_engine::TokenLogprobs,
) -> PyResult<Bound<'py, PyDict>> {
    let text = |id: u32| String::from_utf8_lossy(model.vocab.token(id).unwrap_or(&[])).into_owned();
    let m = PyDict::new(py);
    let mut selected_rank = None;
    for (rank, (id, v)) in lp.top.iter().enumerate() {
        if *id == selected {
            selected_rank = Some(rank + 1);
        }
        m.set_item(id, (*v, rank + 1, text(*id)))?;
    }
    m.set_item(selected, (lp.selected, selected_rank, text(selected)))?;
    Ok(m)
}

/// A finished request as a dict (the fields of vLLM's `RequestOutput`, plus nextok's).
fn completion_dict<'py>(
    py: Python<'py>,
    model: &Model,
    c: &Completion,
) -> PyResult<Bound<'py, PyDict>> {
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
    metrics.set_item("forward_passes", c.timing.forward_passes)?;
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
                list.append(logprob_map(py, model, *t, lp)?)?;
                total += lp.selected;
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
        // what loading built and dropped (the file's metadata, the tokenizer's temporary
        // tables) goes back to the system now, not at mimalloc's delayed purge, which runs
        // only when the freeing thread allocates again
        // SAFETY: `mi_collect` takes no pointers and may be called from any thread at any time.
        unsafe { libmimalloc_sys::mi_collect(true) };
        Ok(PyEngine {
            engine: Arc::new(engine),
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
        let mut traces = Vec::new();
        for (i, item) in requests.try_iter()?.enumerate() {
            let item = item?;
            let (prompt, spec): (Bound<'py, PyAny>, Bound<'py, PyDict>) = item.extract()?;
            let r = request(&prompt, &spec, i)?;
            traces.push(
                r.records
                    .map(|k| (pipeline_source(&spec), k, r.trace_logits)),
            );
            reqs.push(r);
        }
        // every request is submitted before any is waited for: they run as one batch
        let mut handles = Vec::with_capacity(reqs.len());
        for r in reqs {
            handles.push(self.engine.submit(r).map_err(Failure::from)?);
        }
        let mut out = Vec::with_capacity(handles.len());
        // on an error or an interrupt the handles not yet waited for are dropped: cancelled
        for (h, t) in handles.iter_mut().zip(&traces) {
            let c = wait(py, h)?;
            let d = completion_dict(py, self.engine.model(), &c)?;
            if let Some((source, k, logits)) = t {
                d.set_item(
                    "trace",
                    trace_text(self.engine.model(), &c, source, *k, *logits),
                )?;
            }
            out.push(d);
        }
        Ok(out)
    }

    /// Starts one request (`(prompt, spec)` as in `generate`) and returns its event stream.
    fn stream(&self, prompt: &Bound<'_, PyAny>, spec: &Bound<'_, PyDict>) -> PyResult<PyStream> {
        let r = request(prompt, spec, 0)?;
        let handle = self.engine.submit(r).map_err(Failure::from)?;
        Ok(PyStream {
            model: self.engine.model().clone(),
            info: handle.info.clone(),
            handle: Mutex::new(Some(handle)),
        })
    }

    /// Runs a trace's request again on this engine's model and compares every step record
    /// bit for bit; returns the number of steps that matched, or raises `ReplayMismatch`
    /// naming the first difference (`sequence`, `step`, `line`, `field`, and the `recorded` and
    /// `now` values as JSON text) or the numerics that differ (`code` `numerics_differ`, with
    /// `recorded_version`, `recorded_numerics`, `version`, `numerics`). With `sampler_only`
    /// the stored raw logits of a trace recorded with `trace_logits` go through the sampler
    /// alone: no model call, only the sampler's numerics must agree.
    #[pyo3(signature = (text, sampler_only = false))]
    fn replay(&self, py: Python<'_>, text: &str, sampler_only: bool) -> PyResult<usize> {
        let (header, recorded) = trace::parse(text).map_err(Failure::from)?;
        let outcome =
            trace::replay_on_with(&self.engine, &header, &recorded, sampler_only, |req| {
                let mut h = self.engine.submit(req).map_err(Failure::from)?;
                wait(py, &mut h)
            })?;
        outcome.map_err(|e| {
            let f = match e {
                trace::ReplayError::Failed(e) => {
                    let f = Failure::from(e);
                    // a trace that does not fit this engine is a mismatch too
                    if f.has_field() {
                        return f.reclass("ReplayMismatch").code("replay_mismatch").into();
                    }
                    f
                }
                trace::ReplayError::Refused(r) => Failure::new("ReplayMismatch", r.to_string())
                    .code("numerics_differ")
                    .field("numerics")
                    .detail("recorded_version", Detail::Str(r.recorded_version.clone()))
                    .detail(
                        "recorded_numerics",
                        Detail::Str(r.recorded_numerics.clone()),
                    )
                    .detail("version", Detail::Str(r.version.clone()))
                    .detail("numerics", Detail::Str(r.numerics.clone())),
                trace::ReplayError::Diverged(d) => {
                    let mut f = Failure::new("ReplayMismatch", d.message.clone())
                        .code("replay_mismatch")
                        .field(d.field.clone())
                        .detail("sequence", Detail::Int(d.sequence as u64))
                        .detail("line", Detail::Int(d.line as u64))
                        .detail("recorded", Detail::Str(d.recorded.to_string()))
                        .detail("now", Detail::Str(d.now.to_string()));
                    if let Some(step) = d.step {
                        f = f.detail("step", Detail::Int(step));
                    }
                    f
                }
            };
            f.into()
        })
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

/// One request's events, as `LLM.stream` reads them. Dropping it (or `close()`) cancels the
/// request.
#[pyclass(module = "nextok", name = "_Stream")]
pub struct PyStream {
    model: Arc<Model>,
    info: RequestInfo,
    handle: Mutex<Option<RequestHandle>>,
}

/// One stream event as a dict (`None` for events a stream does not show).
fn event_dict<'py>(
    py: Python<'py>,
    model: &Model,
    info: &RequestInfo,
    e: Event,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    let d = PyDict::new(py);
    match e {
        Event::Token {
            seq,
            id,
            text,
            logprobs,
        } => {
            d.set_item("type", "token")?;
            d.set_item("index", seq)?;
            d.set_item("token_id", id)?;
            d.set_item("text", text)?;
            match logprobs {
                None => d.set_item("logprobs", py.None())?,
                Some(lp) => {
                    d.set_item("logprobs", logprob_map(py, model, id, &lp)?)?;
                    d.set_item("logprob", lp.selected)?;
                    d.set_item("logprob_layer", layer_name(lp.layer))?;
                }
            }
        }
        Event::Finish {
            seq, reason, text, ..
        } => {
            let (finish, stop) = finish_reasons(py, reason.as_ref(), &info.stop.stop)?;
            d.set_item("type", "finish")?;
            d.set_item("index", seq)?;
            d.set_item("text", text)?;
            d.set_item("finish_reason", finish)?;
            d.set_item("stop_reason", stop)?;
        }
        Event::Done { usage, .. } => {
            d.set_item("type", "done")?;
            d.set_item("prompt_tokens", usage.prompt_tokens)?;
            d.set_item("cached_tokens", usage.cached_tokens)?;
            d.set_item("completion_tokens", usage.completion_tokens)?;
        }
        Event::Error(e) => return Err(Failure::from(e).into()),
        Event::Record { .. } | Event::Ledger { .. } => return Ok(None),
    }
    Ok(Some(d))
}

#[pymethods]
impl PyStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next event as a dict (`type`: `token`, `finish` or `done`), waiting with the GIL
    /// released; Ctrl-C cancels the request and raises.
    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        loop {
            let mut guard = self
                .handle
                .lock()
                .map_err(|_| crate::errors::internal("stream lock poisoned"))?;
            let Some(h) = guard.as_mut() else {
                return Ok(None);
            };
            let got = py.detach(|| h.recv_timeout(Duration::from_millis(100)));
            match got {
                Recv::Event(e) => {
                    let done = matches!(e, Event::Done { .. } | Event::Error(_));
                    let out = event_dict(py, &self.model, &self.info, e);
                    if done {
                        *guard = None;
                    }
                    match out? {
                        Some(d) => return Ok(Some(d)),
                        None => continue,
                    }
                }
                Recv::Closed => {
                    *guard = None;
                    return Ok(None);
                }
                Recv::Timeout => {
                    if let Err(e) = py.check_signals() {
                        *guard = None; // dropped: cancelled
                        return Err(e);
                    }
                }
            }
        }
    }

    /// Cancels the request (its sequences stop at the next iteration and free their cache).
    fn close(&self) {
        if let Ok(mut g) = self.handle.lock() {
            *g = None;
        }
    }

    /// The request's seeds (one per sequence).
    #[getter]
    fn seeds(&self) -> Vec<u64> {
        self.info.seeds.clone()
    }

    /// The request's prompt ids.
    #[getter]
    fn prompt_token_ids(&self) -> Vec<u32> {
        self.info.prompt_ids.clone()
    }

    /// The pipeline hash.
    #[getter]
    fn pipeline_hash(&self) -> &str {
        &self.info.pipeline_hash
    }
}
