//! `nextok.Pipeline`: an ordered, versioned, hashed processor pipeline — a preset built from
//! sampling parameters under their OpenAI / vLLM names, or a pipeline given as JSON.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use nextok_core::pipeline::resolve::{resolve, PipelineChoice, Request, Resolved};
use nextok_core::{PipelineConfig, Preset, SamplingParams, StopConfig};

use crate::convert::{from_json, to_json, to_python, type_name, NonFinite};
use crate::errors::Failure;

/// A decoding pipeline: processors in order, a selector, and (for a preset) the request-level
/// settings its parameters carried (`max_tokens`, `stop`, `stop_token_ids`, `ignore_eos`,
/// `seed`, …), which a `Sampler` uses unless it is given its own.
#[pyclass(module = "nextok", name = "Pipeline", frozen)]
pub struct PyPipeline {
    pub(crate) config: PipelineConfig,
    pub(crate) stop: StopConfig,
    pub(crate) preset: Option<Preset>,
    pub(crate) params: SamplingParams,
}

impl PyPipeline {
    /// A preset pipeline for `params`.
    pub(crate) fn from_preset(name: &str, params: SamplingParams) -> Result<PyPipeline, Failure> {
        let preset: Preset = name
            .parse()
            .map_err(|e: nextok_core::Error| Failure::parameter("preset", e.to_string()))?;
        // the one resolver (ranges, max_tokens, stop strings, the constraint's grammar mask)
        let Resolved {
            pipeline: config,
            stop,
        } = resolve(&Request::new(&params, &PipelineChoice::Preset(preset)))?;
        Ok(PyPipeline {
            config,
            stop,
            preset: Some(preset),
            params,
        })
    }

    /// A pipeline from JSON text or a dict.
    pub(crate) fn from_any(obj: &Bound<'_, PyAny>) -> Result<PyPipeline, Failure> {
        let text = if let Ok(s) = obj.cast::<PyString>() {
            let text = s
                .to_str()
                .map_err(|e| Failure::argument("pipeline", e.to_string()))?;
            // a syntax error names the document (the core names paths inside it)
            serde_json::from_str::<serde_json::Value>(text)
                .map_err(|e| crate::convert::parse_error("pipeline", &e.to_string()))?;
            text.to_string()
        } else if obj.cast::<PyDict>().is_ok() {
            to_json(obj, "", NonFinite::Refuse)?.to_string()
        } else {
            return Err(Failure::argument(
                "pipeline",
                format!(
                    "must be pipeline JSON (str or dict), got {}",
                    type_name(obj)
                ),
            ));
        };
        let config = PipelineConfig::from_json(&text)?;
        Ok(PyPipeline {
            config,
            stop: StopConfig::default(),
            preset: None,
            params: SamplingParams::default(),
        })
    }
}

#[pymethods]
impl PyPipeline {
    /// A preset pipeline (`"reference"`, `"hf"`, `"vllm"`, `"llama.cpp"`) built from sampling
    /// parameters under their OpenAI / vLLM names: `temperature`, `top_k`, `top_p`, `min_p`,
    /// `typical_p`, `presence_penalty`, `frequency_penalty`, `repetition_penalty`,
    /// `logit_bias`, `min_tokens`, `allowed_token_ids`, `bad_words_ids`,
    /// `no_repeat_ngram_size`, `penalty_last_n`, and the request-level `max_tokens`, `stop`,
    /// `stop_token_ids`, `ignore_eos`, `include_stop_str_in_output`, `skip_special_tokens`,
    /// `grammar_policy`, `seed`. An unknown or out-of-domain parameter raises an exception
    /// whose `field` names it.
    #[new]
    #[pyo3(signature = (preset = None, **params))]
    fn new(
        preset: Option<&Bound<'_, PyAny>>,
        params: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyPipeline> {
        let preset = match preset.filter(|p| !p.is_none()) {
            None => "reference".to_string(),
            Some(p) => crate::convert::text("preset", p)?,
        };
        let params: SamplingParams = match params {
            None => SamplingParams::default(),
            Some(d) => {
                if d.contains("constraint")? {
                    return Err(Failure::argument(
                        "constraint",
                        "a constraint belongs to the sampler: nextok.Sampler(pipeline, vocab, constraint=...)",
                    )
                    .into());
                }
                from_json(to_json(d.as_any(), "", NonFinite::Refuse)?, "")?
            }
        };
        Ok(PyPipeline::from_preset(&preset, params)?)
    }

    /// A pipeline from its JSON form (text or dict): `{"format_version": 1, "processors":
    /// [...], "selector": {...}}`. Errors name the failing path (`processors[2].top_p`).
    #[staticmethod]
    fn from_json(pipeline: &Bound<'_, PyAny>) -> PyResult<PyPipeline> {
        Ok(PyPipeline::from_any(pipeline)?)
    }

    /// `sha256:` and the SHA-256 of the canonical JSON: the pipeline's identity in step records.
    #[getter]
    fn hash(&self) -> String {
        self.config.hash()
    }

    /// The preset's name, or `None` for a pipeline given as JSON.
    #[getter]
    fn preset(&self) -> Option<&'static str> {
        self.preset.map(|p| p.name())
    }

    /// The processors in order, as dicts (`{"type": "top_p", "top_p": 0.9, ...}`).
    #[getter]
    fn processors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, &self.config.processors)
    }

    /// The selector as a dict (`{"type": "categorical"}`, `{"type": "greedy"}`, …).
    #[getter]
    fn selector<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, &self.config.selector)
    }

    /// The sampling parameters a preset pipeline was built from (every field, unset ones
    /// `None` or empty).
    #[getter]
    fn params<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, &self.params)
    }

    /// The canonical JSON text (what the hash covers); `Pipeline.from_json` reads it back.
    fn to_json(&self) -> String {
        self.config.canonical_json()
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        match other.cast::<PyPipeline>() {
            Ok(o) => {
                let o = o.get();
                o.config == self.config && o.stop == self.stop
            }
            Err(_) => false,
        }
    }

    fn __hash__(&self) -> u64 {
        let h = self.config.hash();
        u64::from_str_radix(&h[7..23], 16).unwrap_or(0)
    }

    fn __repr__(&self) -> String {
        let names: Vec<&str> = self
            .config
            .processors
            .iter()
            .map(|p| p.type_name())
            .collect();
        match self.preset {
            Some(p) => format!(
                "Pipeline(preset={:?}, processors={names:?}, hash={:?})",
                p.name(),
                self.config.hash()
            ),
            None => format!(
                "Pipeline(processors={names:?}, hash={:?})",
                self.config.hash()
            ),
        }
    }
}
