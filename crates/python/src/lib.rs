//! # nextok from Python
//!
//! The `nextok._nextok` extension module behind the `nextok` Python package: a thin layer over
//! the Rust crates. [`pipeline`] builds pipelines (presets from OpenAI / vLLM parameter names,
//! or pipeline JSON), [`vocab`] loads vocabularies, [`sampler`] steps logits rows (numpy
//! `float32`, read without copying; batches with the GIL released), [`errors`] turns every
//! typed Rust error into a Python exception naming its field, `explain` is
//! `nextok explain`, and [`engine`] runs the engine behind `nextok.LLM`.

#![warn(missing_docs)]

pub mod convert;
pub mod engine;
pub mod errors;
pub mod pipeline;
pub mod sampler;
pub mod service;
pub mod vocab;

use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::convert::{to_json, to_python, type_name, NonFinite};
use crate::errors::Failure;

/// `nextok explain --json`: one step from a request (a dict or JSON text in the request format
/// of `nextok explain`: `logits`, `tokens`, `pipeline`, `params`, `prompt_ids`,
/// `selected_ids`, `selector`, `eos_token_ids`, `special_token_ids`), returned as the same
/// dict the CLI prints. Float logits may be `nan` / `inf` / `-inf`, as the request format's
/// strings. Errors name the request field at fault.
#[pyfunction]
fn explain<'py>(py: Python<'py>, request: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let text = if let Ok(s) = request.cast::<PyString>() {
        let text = s.to_str()?;
        // a syntax error names the document (the core names paths inside it)
        serde_json::from_str::<serde_json::Value>(text)
            .map_err(|e| crate::convert::parse_error("request", &e.to_string()))?;
        text.to_string()
    } else if request.cast::<pyo3::types::PyDict>().is_ok() {
        to_json(request, "", NonFinite::AsString)?.to_string()
    } else {
        return Err(Failure::argument(
            "request",
            format!("must be a dict or JSON text, got {}", type_name(request)),
        )
        .into());
    };
    let out = py
        .detach(|| nextok_engine::explain::explain_json(&text))
        .map_err(Failure::from)?;
    to_python(py, &out)
}

/// What this build of the module is and what it runs on this CPU: `version` (the package
/// version and git commit, as a trace's `nextok_version`), `compiled_features` (the SIMD
/// features the code was compiled for: `none` for the portable build, whose kernels choose
/// their instruction set when the process runs), `cpu_level` (the best kernel level this CPU
/// supports) and `kernels` (the level the kernels run at now).
#[pyfunction]
fn build_info(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    use nextok_core::cpu::Level;
    let d = pyo3::types::PyDict::new(py);
    d.set_item("version", nextok_engine::VERSION)?;
    d.set_item("compiled_features", nextok_model::simd_features())?;
    d.set_item("cpu_level", Level::detected().name())?;
    d.set_item("kernels", Level::current().name())?;
    Ok(d)
}

/// The preset names `Pipeline` accepts.
const PRESETS: [&str; 4] = ["reference", "hf", "vllm", "llama.cpp"];

/// The extension module.
/// The module's own allocations (cache, workspaces) come from mimalloc, as in the `nextok`
/// binary; the weights' planes take their own mappings, advised for huge pages (Python's
/// objects keep Python's allocator).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[pymodule]
fn _nextok(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("PRESETS", PRESETS.to_vec())?;
    m.add("FORMAT_VERSION", nextok_core::FORMAT_VERSION)?;
    m.add_class::<pipeline::PyPipeline>()?;
    m.add_class::<vocab::PyVocab>()?;
    m.add_class::<sampler::PySampler>()?;
    m.add_class::<sampler::PyState>()?;
    m.add_class::<sampler::PyStep>()?;
    m.add_class::<sampler::PyLogprobs>()?;
    m.add_class::<engine::PyEngine>()?;
    m.add_class::<engine::PyStream>()?;
    m.add_class::<service::PyService>()?;
    m.add_class::<service::PyResponse>()?;
    m.add_function(wrap_pyfunction!(explain, m)?)?;
    m.add_function(wrap_pyfunction!(build_info, m)?)?;
    m.add_function(wrap_pyfunction!(service::refusal, m)?)?;
    Ok(())
}
