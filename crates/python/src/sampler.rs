//! `nextok.Sampler`, `nextok.State`, `nextok.Step`, `nextok.Logprobs`: a logits row in, a token
//! out, exactly as the Rust core does it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use nextok_constraint::{CompiledConstraint, ConstraintEngine, ConstraintSpec, ConstraintVocab};
use nextok_core::pipeline::resolve::{resolve, PipelineChoice, Request as ResolveRequest};
use nextok_core::pipeline::GrammarPolicy;
use nextok_core::processors::ProcessorConfig;
use nextok_core::{
    DecoderState, Draw, FinishReason, Layer, Sampler, SamplingParams, StepRecord, StepResult,
    Workspace, WorkspacePool,
};

use crate::convert::{
    count, from_json, logits_row, logits_rows, opt_bool, opt_count, text, to_json, to_python,
    token_id, token_ids, type_name, NonFinite,
};
use crate::errors::{internal, Failure};
use crate::pipeline::PyPipeline;
use crate::vocab::PyVocab;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// The fixed inverse-CDF position `u ∈ [0, 1)`, when given.
fn opt_u(obj: Option<&Bound<'_, PyAny>>) -> Result<Draw, Failure> {
    match obj {
        None => Ok(Draw::Stream),
        Some(o) if o.is_none() => Ok(Draw::Stream),
        Some(o) => {
            let u: f64 = o.extract().map_err(|_| {
                Failure::argument("u", format!("must be a float, got {}", type_name(o)))
            })?;
            if !(0.0..1.0).contains(&u) {
                return Err(Failure::parameter("u", format!("{u} is outside [0, 1)")));
            }
            Ok(Draw::FixedU(u))
        }
    }
}

/// The core sampler for one vocabulary size, with its workspaces.
struct Compiled {
    sampler: Sampler,
    ws: Mutex<Workspace>,
    pool: Mutex<WorkspacePool>,
}

impl Compiled {
    fn new(sampler: Sampler) -> Compiled {
        let v = sampler.vocab().vocab_size;
        let ws = sampler.new_workspace();
        Compiled {
            sampler,
            ws: Mutex::new(ws),
            pool: Mutex::new(WorkspacePool::new(v, rayon::current_num_threads())),
        }
    }
}

/// A compiled pipeline for one vocabulary, stop conditions and (optionally) a constraint.
/// Immutable and shareable between threads; each sequence's state is a `State` from
/// `new_state`. Made with `vocab=None`, it is compiled for the length of the first logits row
/// it meets, and every later row must have that length.
#[pyclass(module = "nextok", name = "Sampler", frozen)]
pub struct PySampler {
    id: u64,
    constraint: Option<Arc<CompiledConstraint>>,
    default_seed: u64,
    pipeline: Py<PyPipeline>,
    vocab: Option<Py<PyVocab>>,
    /// With `vocab=None`, until the first logits row: the pipeline compiled for the largest
    /// vocabulary (every check but the token ranges done), which makes and commits states.
    sizeless: Option<Sampler>,
    compiled: OnceLock<Compiled>,
}

/// One sequence's decoder state: prompt and output ids, counts, the constraint's and stop
/// strings' positions, the random stream and the finish status. Belongs to the `Sampler` that
/// made it.
#[pyclass(module = "nextok", name = "State")]
pub struct PyState {
    sampler_id: u64,
    inner: Option<DecoderState>,
    /// Made (or committed to) before the sampler knew the vocabulary size: its ids are checked
    /// against it at its first step.
    unchecked: bool,
}

impl PyState {
    fn get(&self) -> PyResult<&DecoderState> {
        self.inner
            .as_ref()
            .ok_or_else(|| internal("the state is in use by a batch step"))
    }
}

/// The outcome of one step: the token, why the sequence finished (if it did), and — when the
/// step was recorded (`logprobs=N`) — its support size, logprobs by layer and step record.
#[pyclass(module = "nextok", name = "Step", frozen)]
pub struct PyStep {
    result: StepResult,
    record: Option<StepRecord>,
    /// The selected token's logprob in the raw, processed and selection layers.
    selected: Option<[f64; 3]>,
}

/// Logprobs of one layer: the selected token's and the best final candidates'.
#[pyclass(module = "nextok", name = "Logprobs", frozen)]
pub struct PyLogprobs {
    layer: &'static str,
    token: u32,
    logprob: f64,
    top: Vec<(u32, f64)>,
}

fn finish_name(f: &FinishReason) -> &'static str {
    match f {
        FinishReason::Eos { .. } => "eos",
        FinishReason::StopToken { .. } => "stop_token",
        FinishReason::StopString { .. } => "stop_string",
        FinishReason::GrammarAccepted => "grammar_accepted",
        FinishReason::MaxTokens => "max_tokens",
    }
}

fn parse_layer(layer: &str) -> Result<(Layer, usize, &'static str), Failure> {
    match layer {
        "raw" => Ok((Layer::Raw, 0, "raw")),
        "processed" => Ok((Layer::Processed, 1, "processed")),
        "selection" => Ok((Layer::Selection, 2, "selection")),
        other => Err(Failure::argument(
            "layer",
            format!("{other:?} is not a layer (raw, processed or selection)"),
        )),
    }
}

impl PySampler {
    /// Borrows `state` mutably after checking that it is a `State` of this sampler.
    fn own_state<'py>(
        &self,
        arg: &str,
        state: &Bound<'py, PyAny>,
    ) -> Result<PyRefMut<'py, PyState>, Failure> {
        let s = state.cast::<PyState>().map_err(|_| {
            Failure::argument(
                arg,
                format!("must be a nextok.State, got {}", type_name(state)),
            )
        })?;
        let st = s
            .try_borrow_mut()
            .map_err(|_| Failure::argument(arg, "is in use by another call"))?;
        if st.sampler_id != self.id {
            return Err(Failure::argument(
                arg,
                "belongs to another Sampler: a state is made by, and steps with, one sampler (sampler.new_state)",
            ));
        }
        if st.inner.is_none() {
            return Err(Failure::argument(arg, "is in use by a batch step"));
        }
        Ok(st)
    }

    /// The compiled sampler, once the vocabulary size is known.
    fn ready(&self) -> Result<&Compiled, Failure> {
        self.compiled.get().ok_or_else(|| {
            Failure::argument(
                "vocab",
                "the vocabulary size is not known yet: this Sampler was made with vocab=None and takes it from the first logits row (step, step_batch or explain)",
            )
        })
    }

    /// The compiled sampler, compiling it for rows of `v` logits when the vocabulary size came
    /// from no `Vocab` and this is the first row. A row of another length is then refused by
    /// the step itself (`VocabSizeMismatch`).
    fn ready_for(&self, py: Python<'_>, v: usize) -> Result<&Compiled, Failure> {
        if let Some(c) = self.compiled.get() {
            return Ok(c);
        }
        let probe = self.sizeless.as_ref().ok_or_else(|| {
            Failure::new(
                "NextokError",
                "nextok internal error: a sampler without a compiled core or an unsized one",
            )
        })?;
        let info = PyVocab::plain_info(v).map_err(|f| f.field("logits"))?;
        let sampler = py
            .detach(|| {
                Sampler::new_with_tokens(probe.config().clone(), info, probe.stop().clone(), None)
            })
            .map_err(Failure::from)?;
        // two threads may compile at once: the first to finish wins, the other's row is then
        // checked against it
        let _ = self.compiled.set(Compiled::new(sampler));
        self.ready()
    }

    /// The sampler that makes and commits states: the compiled one, or before the first row
    /// of a `vocab=None` sampler, the unsized one.
    fn core(&self) -> Result<&Sampler, Failure> {
        match (self.compiled.get(), &self.sizeless) {
            (Some(c), _) => Ok(&c.sampler),
            (None, Some(s)) => Ok(s),
            (None, None) => Err(Failure::new(
                "NextokError",
                "nextok internal error: a sampler without a compiled core or an unsized one",
            )),
        }
    }

    /// Checks the ids of a state made before the vocabulary size was known against it, once.
    /// An id out of range is a `TokenOutOfRange` naming `prompt_ids[i]` or `output_ids[i]`,
    /// and the state stays as it was.
    fn check_state(c: &Compiled, st: &mut PyState) -> Result<(), Failure> {
        if !st.unchecked {
            return Ok(());
        }
        let v = c.sampler.vocab().vocab_size;
        let inner = st.inner.as_ref().ok_or_else(|| {
            Failure::new("NextokError", "nextok internal error: state without inner")
        })?;
        for (name, ids) in [
            ("prompt_ids", inner.prompt_ids()),
            ("output_ids", inner.selected_ids()),
        ] {
            if let Some(i) = ids.iter().position(|&t| t as usize >= v) {
                return Err(Failure::from(nextok_core::Error::from(
                    nextok_core::ErrorKind::TokenOutOfRange {
                        field: format!("{name}[{i}]"),
                        token: ids[i] as u64,
                        vocab_size: v,
                    },
                )));
            }
        }
        st.unchecked = false;
        Ok(())
    }

    /// One step on `raw` for `state`, recorded with `top` candidates when asked.
    fn step_row(
        &self,
        c: &Compiled,
        raw: &[f32],
        state: &mut DecoderState,
        draw: Draw,
        top: Option<usize>,
    ) -> Result<PyStep, Failure> {
        let mut ws = lock(&c.ws);
        let Some(top) = top else {
            let result = c.sampler.step_draw(raw, state, &mut ws, draw)?;
            return Ok(PyStep {
                result,
                record: None,
                selected: None,
            });
        };
        let (result, record) = c.sampler.step_recorded(raw, state, &mut ws, draw, top)?;
        let selected = match record.candidates.iter().find(|c| c.id == result.token) {
            Some(c) => [c.raw_logprob, c.processed_logprob, c.selection_logprob],
            None => {
                // the workspace still holds this step: ask it for the selected token's values
                let mut v = [0.0; 3];
                for (slot, layer) in
                    v.iter_mut()
                        .zip([Layer::Raw, Layer::Processed, Layer::Selection])
                {
                    *slot = c.sampler.logprob(raw, &mut ws, result.token, layer)?.value;
                }
                v
            }
        };
        Ok(PyStep {
            result,
            record: Some(record),
            selected: Some(selected),
        })
    }
}

#[pymethods]
impl PySampler {
    /// Compiles `pipeline` (a `Pipeline`, a preset name, or pipeline JSON) for `vocab` (a
    /// `Vocab`, an int for a vocabulary of that many plain tokens, or `None` for plain tokens
    /// as many as the first logits row has: every check but the token ids' ranges is made now,
    /// those at the first row), with the request-level
    /// stop settings (each defaults to the pipeline's) and an optional structured-output
    /// `constraint` (`{"type": "choice", "choices": [...]}`, `{"type": "regex", "pattern":
    /// ...}`, `{"type": "json_schema", "schema": {...}}`, `{"type": "json"}`, `{"type":
    /// "grammar", "lark": ...}`, `{"type": "gbnf", "gbnf": ...}`), which needs token bytes.
    #[new]
    #[pyo3(signature = (pipeline, vocab = None, constraint = None, *, stop = None, stop_token_ids = None,
        max_tokens = None, ignore_eos = None, include_stop_str_in_output = None,
        skip_special_tokens = None, grammar_policy = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        pipeline: &Bound<'_, PyAny>,
        vocab: Option<&Bound<'_, PyAny>>,
        constraint: Option<&Bound<'_, PyAny>>,
        stop: Option<&Bound<'_, PyAny>>,
        stop_token_ids: Option<&Bound<'_, PyAny>>,
        max_tokens: Option<&Bound<'_, PyAny>>,
        ignore_eos: Option<&Bound<'_, PyAny>>,
        include_stop_str_in_output: Option<&Bound<'_, PyAny>>,
        skip_special_tokens: Option<&Bound<'_, PyAny>>,
        grammar_policy: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PySampler> {
        // the pipeline
        let pipeline: Py<PyPipeline> = if let Ok(p) = pipeline.cast::<PyPipeline>() {
            p.clone().unbind()
        } else if let Ok(s) = pipeline.cast::<PyString>() {
            let text = s.to_str()?;
            let p = if text.trim_start().starts_with('{') {
                PyPipeline::from_any(pipeline)?
            } else {
                PyPipeline::from_preset(text, Default::default())?
            };
            Py::new(py, p)?
        } else if pipeline.cast::<PyDict>().is_ok() {
            Py::new(py, PyPipeline::from_any(pipeline)?)?
        } else {
            return Err(Failure::argument(
                "pipeline",
                format!(
                    "must be a nextok.Pipeline, a preset name or pipeline JSON, got {}",
                    type_name(pipeline)
                ),
            )
            .into());
        };
        let p = pipeline.get();
        // the vocabulary
        let vocab = vocab.filter(|v| !v.is_none());
        let sized = vocab.is_some();
        let (info, bytes, vocab_obj) = match vocab {
            // checked against the real size at the first row
            None => (
                PyVocab::plain_info(nextok_vocab::MAX_VOCAB_SIZE)?,
                None,
                None,
            ),
            Some(vocab) => {
                if let Ok(v) = vocab.cast::<PyVocab>() {
                    let vv = v.get();
                    (vv.info.clone(), vv.bytes.clone(), Some(v.clone().unbind()))
                } else if vocab.cast::<pyo3::types::PyInt>().is_ok() {
                    (PyVocab::plain_info(count("vocab", vocab)?)?, None, None)
                } else {
                    return Err(Failure::argument(
                        "vocab",
                        format!(
                            "must be a nextok.Vocab, a vocabulary size or None, got {}",
                            type_name(vocab)
                        ),
                    )
                    .into());
                }
            }
        };
        // the stop settings: the pipeline's, overridden by the arguments given
        let mut stop_cfg = p.stop.clone();
        if let Some(s) = stop.filter(|s| !s.is_none()) {
            stop_cfg.stop = if let Ok(one) = s.cast::<PyString>() {
                vec![one.to_str()?.to_string()]
            } else {
                from_json(to_json(s, "stop", NonFinite::Refuse)?, "stop")?
            };
        }
        if let Some(ids) = stop_token_ids.filter(|s| !s.is_none()) {
            stop_cfg.stop_token_ids = token_ids("stop_token_ids", ids)?;
        }
        if let Some(m) = max_tokens.filter(|s| !s.is_none()) {
            let v: i64 = m.extract().map_err(|_| {
                Failure::argument(
                    "max_tokens",
                    format!("must be an integer, got {}", type_name(m)),
                )
            })?;
            let v = u64::try_from(v)
                .ok()
                .filter(|&v| v >= 1)
                .ok_or_else(|| Failure::parameter("max_tokens", "must be at least 1"))?;
            stop_cfg.max_tokens = Some(v);
        }
        if let Some(b) = opt_bool("ignore_eos", ignore_eos)? {
            stop_cfg.ignore_eos = b;
        }
        if let Some(b) = opt_bool("include_stop_str_in_output", include_stop_str_in_output)? {
            stop_cfg.include_stop_str_in_output = b;
        }
        if let Some(b) = opt_bool("skip_special_tokens", skip_special_tokens)? {
            stop_cfg.skip_special_tokens = b;
        }
        if let Some(g) = grammar_policy.filter(|s| !s.is_none()) {
            let g: GrammarPolicy = from_json(
                to_json(g, "grammar_policy", NonFinite::Refuse)?,
                "grammar_policy",
            )?;
            stop_cfg.grammar_policy = g;
        }
        // the constraint, declared once: a preset gets its grammar mask, a pipeline given as
        // JSON must already have one
        let spec: Option<ConstraintSpec> = match constraint.filter(|c| !c.is_none()) {
            None => None,
            Some(c) => {
                let value = if let Ok(s) = c.cast::<PyString>() {
                    serde_json::from_str(s.to_str()?)
                        .map_err(|e| crate::convert::parse_error("constraint", &e.to_string()))?
                } else {
                    to_json(c, "constraint", NonFinite::Refuse)?
                };
                Some(from_json(value, "constraint")?)
            }
        };
        // the one resolver: a preset without its mask is rebuilt with the constraint (which
        // adds it); otherwise the pipeline must have a grammar mask exactly when there is a
        // constraint
        let has_mask = p
            .config
            .processors
            .iter()
            .any(|q| matches!(q, ProcessorConfig::GrammarMask(_)));
        let (params, choice) = match (&spec, p.preset) {
            (Some(spec), Some(preset)) if !has_mask => (
                SamplingParams {
                    constraint: Some(spec.clone()),
                    ..p.params.clone()
                },
                PipelineChoice::Preset(preset),
            ),
            _ => (
                SamplingParams {
                    constraint: spec.clone(),
                    ..Default::default()
                },
                PipelineChoice::Config(p.config.clone()),
            ),
        };
        let config = resolve(&ResolveRequest::new(&params, &choice))
            .map_err(Failure::from)?
            .pipeline;
        let sampler = Sampler::new_with_tokens(config, info, stop_cfg, bytes.clone())
            .map_err(Failure::from)?;
        let compiled = match spec {
            None => None,
            Some(spec) => {
                let bytes = bytes.ok_or_else(|| {
                    Failure::argument(
                        "constraint",
                        "a constraint works on token bytes: give a Vocab with bytes (Vocab.from_file, Vocab.from_token_bytes), not a size or None",
                    )
                })?;
                let cvocab =
                    ConstraintVocab::new(&bytes, sampler.vocab()).map_err(Failure::from)?;
                let engine = ConstraintEngine::new(Arc::new(cvocab)).map_err(Failure::from)?;
                let compiled = py.detach(|| engine.compile(&spec)).map_err(|e| {
                    let f = Failure::from(e);
                    if f.has_field() {
                        f
                    } else {
                        f.field("constraint")
                    }
                })?;
                Some(compiled)
            }
        };
        let (sizeless, ready) = if sized {
            (None, OnceLock::from(Compiled::new(sampler)))
        } else {
            (Some(sampler), OnceLock::new())
        };
        Ok(PySampler {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            default_seed: p.params.sequence_seed(0),
            constraint: compiled,
            pipeline,
            vocab: vocab_obj,
            sizeless,
            compiled: ready,
        })
    }

    /// A fresh state for a sequence with `prompt_ids`, drawing from the random stream keyed by
    /// `seed` (default: the pipeline's `seed` parameter, or 0). `output_ids` are tokens the
    /// sequence has already produced (to resume it): each is committed with the step update
    /// (penalties count it, the random stream advances, EOS / stop tokens / stop strings /
    /// `max_tokens` end the sequence) and the constraint consumes it; a token after the end
    /// is a `Contradiction` naming `output_ids[i]`.
    #[pyo3(signature = (seed = None, prompt_ids = None, output_ids = None))]
    fn new_state(
        &self,
        seed: Option<&Bound<'_, PyAny>>,
        prompt_ids: Option<&Bound<'_, PyAny>>,
        output_ids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyState> {
        let seed = match seed.filter(|s| !s.is_none()) {
            None => self.default_seed,
            Some(s) => {
                let v: i128 = s.extract().map_err(|_| {
                    Failure::argument("seed", format!("must be an integer, got {}", type_name(s)))
                })?;
                u64::try_from(v)
                    .map_err(|_| Failure::argument("seed", format!("{v} is outside 0..2^64")))?
            }
        };
        let prompt = match prompt_ids.filter(|s| !s.is_none()) {
            None => Vec::new(),
            Some(p) => token_ids("prompt_ids", p)?,
        };
        let output = match output_ids.filter(|s| !s.is_none()) {
            None => Vec::new(),
            Some(p) => token_ids("output_ids", p)?,
        };
        let core = self.core()?;
        let unchecked = self.compiled.get().is_none();
        let mut state = core.new_state(&prompt, seed).map_err(Failure::from)?;
        // the history, as `nextok explain` builds it: committed with the terminal checks, the
        // constraint consuming the same tokens
        for (i, &t) in output.iter().enumerate() {
            let field = format!("output_ids[{i}]");
            if state.is_finished() {
                return Err(Failure::from(nextok_core::Error::from(
                    nextok_core::ErrorKind::Contradiction {
                        field,
                        reason: "the sequence had already finished before this token".into(),
                    },
                ))
                .into());
            }
            core.commit(&mut state, t).map_err(|e| match e.kind() {
                nextok_core::ErrorKind::TokenOutOfRange {
                    token, vocab_size, ..
                } => Failure::from(nextok_core::Error::from(
                    nextok_core::ErrorKind::TokenOutOfRange {
                        field: field.clone(),
                        token: *token,
                        vocab_size: *vocab_size,
                    },
                )),
                _ => Failure::from(e),
            })?;
        }
        if let Some(c) = &self.constraint {
            let mut seq = c.start();
            for (i, &t) in output.iter().enumerate() {
                seq.consume(t).map_err(|e| {
                    Failure::parameter(
                        format!("output_ids[{i}]"),
                        format!("the constraint rejects it: {e}"),
                    )
                })?;
            }
            state.set_grammar(Box::new(seq));
        }
        Ok(PyState {
            sampler_id: self.id,
            inner: Some(state),
            unchecked,
        })
    }

    /// One step: processes `logits` (a 1-D float32 numpy array of the vocabulary's size, read
    /// without copying), selects a token from `state`'s random stream (or at the fixed
    /// position `u`), and commits it to `state`. With `logprobs=N` the step is recorded: the
    /// returned `Step` then has its support size, its step record and the logprobs of the
    /// selected token and of the `N` best final candidates in every layer.
    #[pyo3(signature = (logits, state, *, logprobs = None, u = None))]
    fn step(
        &self,
        logits: &Bound<'_, PyAny>,
        state: &Bound<'_, PyAny>,
        logprobs: Option<&Bound<'_, PyAny>>,
        u: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyStep> {
        let top = opt_count("logprobs", logprobs)?;
        let draw = opt_u(u)?;
        let row = logits_row("logits", logits)?;
        let raw = row
            .as_slice()
            .map_err(|_| Failure::argument("logits", "must be contiguous"))?;
        let mut st = self.own_state("state", state)?;
        let c = self.ready_for(logits.py(), raw.len())?;
        Self::check_state(c, &mut st)?;
        let inner = st
            .inner
            .as_mut()
            .ok_or_else(|| internal("state without inner"))?;
        Ok(self.step_row(c, raw, inner, draw, top)?)
    }

    /// Steps every row of `logits` (a 2-D, C-contiguous float32 array, one row per state) with
    /// the GIL released, rows in parallel. Row `i`'s result equals `step(logits[i], states[i])`:
    /// it does not depend on the batch. When a row fails, the exception (of that row's error)
    /// has `row` and `steps` (the other rows' `Step`s, `None` for failed rows); the other rows'
    /// states have advanced.
    fn step_batch<'py>(
        &self,
        py: Python<'py>,
        logits: &Bound<'py, PyAny>,
        states: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<PyStep>> {
        let rows = logits_rows("logits", logits)?;
        let shape = rows.as_array().shape().to_vec();
        let list: Vec<Bound<'py, PyAny>> = states
            .try_iter()
            .map_err(|_| {
                Failure::argument(
                    "states",
                    format!(
                        "must be a sequence of nextok.State, got {}",
                        type_name(states)
                    ),
                )
            })?
            .collect::<PyResult<_>>()?;
        if list.len() != shape[0] {
            return Err(Failure::argument(
                "states",
                format!("has {} states for {} rows of logits", list.len(), shape[0]),
            )
            .into());
        }
        let c = self.ready_for(py, shape[1])?;
        if shape[1] != c.sampler.vocab().vocab_size {
            return Err(Failure::from(nextok_core::Error::from(
                nextok_core::ErrorKind::VocabSizeMismatch {
                    expected: c.sampler.vocab().vocab_size,
                    got: shape[1],
                },
            ))
            .into());
        }
        let mut borrowed: Vec<PyRefMut<'py, PyState>> = Vec::with_capacity(list.len());
        for (i, s) in list.iter().enumerate() {
            if list[..i].iter().any(|o| o.is(s)) {
                return Err(Failure::argument(
                    format!("states[{i}]"),
                    "appears twice in the batch",
                )
                .into());
            }
            let mut st = self.own_state(&format!("states[{i}]"), s)?;
            Self::check_state(c, &mut st).map_err(|f| f.prefixed(&format!("states[{i}]: ")))?;
            borrowed.push(st);
        }
        let raw = rows
            .as_slice()
            .map_err(|_| Failure::argument("logits", "must be C-contiguous"))?;
        let mut taken: Vec<DecoderState> = Vec::with_capacity(borrowed.len());
        for b in borrowed.iter_mut() {
            taken.push(
                b.inner
                    .take()
                    .ok_or_else(|| internal("state without inner"))?,
            );
        }
        let n = taken.len();
        let mut out: Vec<nextok_core::Result<StepResult>> = (0..n)
            .map(|_| Err(nextok_core::ErrorKind::AlreadyFinished.into()))
            .collect();
        let batch = {
            let mut guard = lock(&c.pool);
            let pool: &mut WorkspacePool = &mut guard;
            let sampler = &c.sampler;
            py.detach(|| sampler.step_batch(raw, &mut taken, pool, &mut out))
        };
        for (b, s) in borrowed.iter_mut().zip(taken) {
            b.inner = Some(s);
        }
        batch.map_err(Failure::from)?;
        let mut steps: Vec<Option<PyStep>> = Vec::with_capacity(n);
        let mut first_err: Option<(usize, nextok_core::Error)> = None;
        for (i, r) in out.into_iter().enumerate() {
            match r {
                Ok(result) => steps.push(Some(PyStep {
                    result,
                    record: None,
                    selected: None,
                })),
                Err(e) => {
                    if first_err.is_none() {
                        first_err = Some((i, e));
                    }
                    steps.push(None);
                }
            }
        }
        if let Some((i, e)) = first_err {
            let exc = Failure::from(e)
                .prefixed(&format!("row {i}: "))
                .instance(py)?;
            exc.setattr("row", i)?;
            let objs = PyList::empty(py);
            for s in steps {
                match s {
                    Some(s) => objs.append(Py::new(py, s)?)?,
                    None => objs.append(py.None())?,
                }
            }
            exc.setattr("steps", objs)?;
            return Err(PyErr::from_value(exc));
        }
        Ok(steps.into_iter().flatten().collect())
    }

    /// Commits `token` to `state` without a logits row (teacher forcing, a history to replay):
    /// the same update a step makes after selecting it. Returns the finish reason if the token
    /// ends the sequence, else `None`.
    fn commit(
        &self,
        state: &Bound<'_, PyAny>,
        token: &Bound<'_, PyAny>,
    ) -> PyResult<Option<&'static str>> {
        let token = token_id("token", token)?;
        let mut st = self.own_state("state", state)?;
        let inner = st
            .inner
            .as_mut()
            .ok_or_else(|| internal("state without inner"))?;
        let finish = self.core()?.commit(inner, token).map_err(Failure::from)?;
        Ok(finish.as_ref().map(finish_name))
    }

    /// Explains the step `state` would take on `logits` without changing `state`: a dict with
    /// `selected`, `support` (ids ascending), `pipeline_hash`, `u`, `tokens` (one ledger row
    /// per vocabulary token: raw logit, raw / processed / selection logprobs, whether it is
    /// allowed, kept and selected) and `record` (the step record). For small vocabularies.
    #[pyo3(signature = (logits, state, *, u = None))]
    fn explain<'py>(
        &self,
        py: Python<'py>,
        logits: &Bound<'py, PyAny>,
        state: &Bound<'py, PyAny>,
        u: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let draw = opt_u(u)?;
        let row = logits_row("logits", logits)?;
        let raw = row
            .as_slice()
            .map_err(|_| Failure::argument("logits", "must be contiguous"))?;
        let mut st = self.own_state("state", state)?;
        let c = self.ready_for(py, raw.len())?;
        Self::check_state(c, &mut st)?;
        let inner = st.get()?;
        let ex = c.sampler.explain(raw, inner, draw).map_err(Failure::from)?;
        let mut support: Vec<u32> = ex.tokens.iter().filter(|r| r.kept).map(|r| r.id).collect();
        support.sort_unstable();
        /// What `Sampler.explain` returns (serialised directly, so that `f32` values print as
        /// the CLI prints them).
        #[derive(serde::Serialize)]
        struct Out<'a> {
            selected: u32,
            support: Vec<u32>,
            pipeline_hash: &'a str,
            u: Option<f64>,
            tokens: &'a [nextok_core::TokenRow],
            record: &'a StepRecord,
        }
        let out = Out {
            selected: ex.record.selected,
            support,
            pipeline_hash: c.sampler.pipeline_hash(),
            u: ex.record.rng.u,
            tokens: &ex.tokens,
            record: &ex.record,
        };
        to_python(py, &out)
    }

    /// The pipeline this sampler runs (with the grammar mask a constraint added).
    #[getter]
    fn pipeline(&self, py: Python<'_>) -> PyResult<Py<PyPipeline>> {
        let p = self.pipeline.get();
        let core = self.core()?;
        if p.config == *core.config() {
            return Ok(self.pipeline.clone_ref(py));
        }
        Py::new(
            py,
            PyPipeline {
                config: core.config().clone(),
                stop: p.stop.clone(),
                preset: p.preset,
                params: p.params.clone(),
            },
        )
    }

    /// The pipeline hash recorded in every step record.
    #[getter]
    fn pipeline_hash(&self) -> PyResult<&str> {
        Ok(self.core()?.pipeline_hash())
    }

    /// The vocabulary size (the logits row length); `None` for a sampler made with
    /// `vocab=None` until its first logits row.
    #[getter]
    fn vocab_size(&self) -> Option<usize> {
        self.compiled.get().map(|c| c.sampler.vocab().vocab_size)
    }

    /// The `Vocab` given, or `None` when a size was given.
    #[getter]
    fn vocab(&self, py: Python<'_>) -> Option<Py<PyVocab>> {
        self.vocab.as_ref().map(|v| v.clone_ref(py))
    }

    /// The stop settings in force, as a dict.
    #[getter]
    fn stop<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, self.core()?.stop())
    }

    /// Seconds the Rust core takes for `iterations` steps of `logits` on a copy of `state`,
    /// timed inside Rust (the baseline of `bench/python_step.py`).
    fn _time_rust_steps(
        &self,
        py: Python<'_>,
        logits: &Bound<'_, PyAny>,
        state: &Bound<'_, PyAny>,
        iterations: &Bound<'_, PyAny>,
    ) -> PyResult<f64> {
        let iterations = count("iterations", iterations)?;
        let row = logits_row("logits", logits)?;
        let raw = row
            .as_slice()
            .map_err(|_| Failure::argument("logits", "must be contiguous"))?;
        let mut st = self.own_state("state", state)?;
        let c = self.ready_for(py, raw.len())?;
        Self::check_state(c, &mut st)?;
        let mut copy = st.get()?.clone();
        drop(st);
        let mut ws = c.sampler.new_workspace();
        let sampler = &c.sampler;
        let elapsed = py.detach(|| {
            let t0 = std::time::Instant::now();
            for _ in 0..iterations {
                sampler.step(raw, &mut copy, &mut ws)?;
            }
            Ok::<_, nextok_core::Error>(t0.elapsed().as_secs_f64())
        });
        Ok(elapsed.map_err(Failure::from)?)
    }

    fn __repr__(&self) -> String {
        format!(
            "Sampler(pipeline_hash={:?}, vocab_size={}, constraint={})",
            self.core().map(|c| c.pipeline_hash()).unwrap_or(""),
            self.vocab_size()
                .map_or_else(|| "None".to_string(), |v| v.to_string()),
            self.constraint.as_ref().map(|c| c.kind()).unwrap_or("None")
        )
    }
}

#[pymethods]
impl PyState {
    /// Steps taken so far (the random stream's step counter).
    #[getter]
    fn step(&self) -> PyResult<u64> {
        Ok(self.get()?.step())
    }

    /// The prompt ids.
    #[getter]
    fn prompt_ids(&self) -> PyResult<Vec<u32>> {
        Ok(self.get()?.prompt_ids().to_vec())
    }

    /// The tokens selected (or committed) so far.
    #[getter]
    fn output_ids(&self) -> PyResult<Vec<u32>> {
        Ok(self.get()?.selected_ids().to_vec())
    }

    /// The random stream's key.
    #[getter]
    fn seed(&self) -> PyResult<u64> {
        Ok(self.get()?.rng().seed)
    }

    /// Whether the sequence has finished (no further step is allowed).
    #[getter]
    fn finished(&self) -> PyResult<bool> {
        Ok(self.get()?.is_finished())
    }

    /// Why the sequence finished (`"eos"`, `"stop_token"`, `"stop_string"`,
    /// `"grammar_accepted"`, `"max_tokens"`), or `None` while it runs.
    #[getter]
    fn finish_reason(&self) -> PyResult<Option<&'static str>> {
        Ok(match self.get()?.finish() {
            nextok_core::FinishStatus::Finished { reason } => Some(finish_name(&reason)),
            _ => None,
        })
    }

    /// The state summary a step record carries (`state_before` / `state_after`).
    fn summary<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, &self.get()?.summary())
    }

    /// An independent copy (a fork: same history, same stream position, the constraint's
    /// state copied), for the same sampler.
    fn copy(&self) -> PyResult<PyState> {
        Ok(PyState {
            sampler_id: self.sampler_id,
            inner: Some(self.get()?.clone()),
            unchecked: self.unchecked,
        })
    }

    fn __copy__(&self) -> PyResult<PyState> {
        self.copy()
    }

    fn __deepcopy__(&self, _memo: &Bound<'_, PyAny>) -> PyResult<PyState> {
        self.copy()
    }

    fn __repr__(&self) -> String {
        match &self.inner {
            Some(s) => format!(
                "State(step={}, prompt_len={}, output_len={}, finished={})",
                s.step(),
                s.prompt_ids().len(),
                s.selected_ids().len(),
                s.is_finished()
            ),
            None => "State(<in a batch step>)".into(),
        }
    }
}

#[pymethods]
impl PyStep {
    /// The selected token id.
    #[getter]
    fn token(&self) -> u32 {
        self.result.token
    }

    /// Why this token ended the sequence (`"eos"`, `"stop_token"`, `"stop_string"`,
    /// `"grammar_accepted"`, `"max_tokens"`), or `None`.
    #[getter]
    fn finish(&self) -> Option<&'static str> {
        self.result.finish.as_ref().map(finish_name)
    }

    /// The finish reason with its details (`{"reason": "stop_string", "pattern": 0, "end":
    /// 12}`), or `None`.
    #[getter]
    fn finish_details<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.result
            .finish
            .as_ref()
            .map(|f| to_python(py, f))
            .transpose()
    }

    /// The categorical selector's `u`, when one was drawn or given.
    #[getter]
    fn u(&self) -> Option<f64> {
        self.result.u
    }

    /// Whether the step was recorded (`logprobs=N` given to `step`).
    #[getter]
    fn recorded(&self) -> bool {
        self.record.is_some()
    }

    /// The size of the final support (the candidates the selector chose from); recorded steps
    /// only.
    #[getter]
    fn support_size(&self) -> PyResult<usize> {
        Ok(self.rec()?.support_size)
    }

    /// The logprobs of `layer` (`"raw"`: softmax of the raw logits over the vocabulary,
    /// `"processed"`: after masks, penalties and temperature, `"selection"`: renormalised over
    /// the final support): the selected token's, and those of the best `top` final candidates
    /// (all recorded ones by default) in canonical order (processed logit descending, id
    /// ascending). Recorded steps only.
    #[pyo3(signature = (layer = None, top = None))]
    fn logprobs(
        &self,
        layer: Option<&Bound<'_, PyAny>>,
        top: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyLogprobs> {
        let layer = match layer.filter(|l| !l.is_none()) {
            None => "raw".to_string(),
            Some(l) => text("layer", l)?,
        };
        let (_, idx, name) = parse_layer(&layer)?;
        let top = opt_count("top", top)?;
        let rec = self.rec()?;
        let sel = self
            .selected
            .ok_or_else(|| internal("recorded step without selected logprobs"))?;
        let n = top.unwrap_or(usize::MAX).min(rec.candidates.len());
        let list = rec.candidates[..n]
            .iter()
            .map(|c| {
                let v = match idx {
                    0 => c.raw_logprob,
                    1 => c.processed_logprob,
                    _ => c.selection_logprob,
                };
                (c.id, v)
            })
            .collect();
        Ok(PyLogprobs {
            layer: name,
            token: self.result.token,
            logprob: sel[idx],
            top: list,
        })
    }

    /// The step record — the same JSON object a trace line holds (`nextok generate --trace`) —
    /// as a dict. Recorded steps only.
    fn record<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, self.rec()?)
    }

    fn __repr__(&self) -> String {
        match &self.record {
            Some(r) => format!(
                "Step(token={}, finish={:?}, support_size={})",
                self.result.token,
                self.result.finish.as_ref().map(finish_name),
                r.support_size
            ),
            None => format!(
                "Step(token={}, finish={:?})",
                self.result.token,
                self.result.finish.as_ref().map(finish_name)
            ),
        }
    }
}

impl PyStep {
    fn rec(&self) -> Result<&StepRecord, Failure> {
        self.record.as_ref().ok_or_else(|| {
            Failure::new(
                "NotRecorded",
                "this step was not recorded: pass logprobs=N (N >= 0) to Sampler.step",
            )
            .code("not_recorded")
        })
    }
}

#[pymethods]
impl PyLogprobs {
    /// The layer: `"raw"`, `"processed"` or `"selection"`.
    #[getter]
    fn layer(&self) -> &'static str {
        self.layer
    }

    /// The selected token.
    #[getter]
    fn token(&self) -> u32 {
        self.token
    }

    /// The selected token's logprob in this layer.
    #[getter]
    fn logprob(&self) -> f64 {
        self.logprob
    }

    /// `(token id, logprob)` of the best final candidates, in canonical order.
    #[getter]
    fn top(&self) -> Vec<(u32, f64)> {
        self.top.clone()
    }

    fn __len__(&self) -> usize {
        self.top.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "Logprobs(layer={:?}, token={}, logprob={:.6}, top={:?})",
            self.layer, self.token, self.logprob, self.top
        )
    }
}
