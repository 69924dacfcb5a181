//! Rust errors as Python exceptions.
//!
//! The exception classes are defined in Python (`nextok/_errors.py`, so that they can also be
//! `ValueError`s and carry docstrings); this module instantiates them with the error's message,
//! its machine-readable `code`, the `field` it names and the kind's own details (`index`,
//! `stage`, `token`, …).

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyModule};

use nextok_constraint::ConstraintError;
use nextok_core::ErrorKind as CoreKind;
use nextok_engine::{EngineError, ErrorKind as EngineKind};
use nextok_vocab::VocabError;

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// A detail of an exception: a keyword argument of its constructor.
pub enum Detail {
    /// A string.
    Str(String),
    /// An unsigned integer.
    Int(u64),
}

/// An error on its way to Python: the exception class (by name, in `nextok._errors`), the
/// message, the code, the field and the details.
pub struct Failure {
    class: &'static str,
    message: String,
    code: Option<&'static str>,
    field: Option<String>,
    details: Vec<(&'static str, Detail)>,
}

impl Failure {
    /// An error of `class` with `message`.
    pub fn new(class: &'static str, message: impl Into<String>) -> Failure {
        Failure {
            class,
            message: message.into(),
            code: None,
            field: None,
            details: Vec::new(),
        }
    }

    /// A bad argument from Python (wrong type, shape, dtype, …), naming the argument.
    pub fn argument(field: impl Into<String>, message: impl Into<String>) -> Failure {
        let field = field.into();
        let message = format!("invalid `{field}`: {}", message.into());
        Failure::new("InvalidArgument", message)
            .code("invalid_argument")
            .field(field)
    }

    /// An out-of-domain parameter value, naming the parameter.
    pub fn parameter(field: impl Into<String>, message: impl Into<String>) -> Failure {
        let field = field.into();
        let message = format!("invalid `{field}`: {}", message.into());
        Failure::new("InvalidParameter", message)
            .code("invalid_parameter")
            .field(field)
    }

    /// Sets the code.
    pub fn code(mut self, code: &'static str) -> Failure {
        self.code = Some(code);
        self
    }

    /// Sets the field.
    pub fn field(mut self, field: impl Into<String>) -> Failure {
        self.field = Some(field.into());
        self
    }

    /// The same error as an instance of another class.
    pub fn reclass(mut self, class: &'static str) -> Failure {
        self.class = class;
        self
    }

    /// Whether a field is named.
    pub fn has_field(&self) -> bool {
        self.field.is_some()
    }

    /// Adds a detail.
    pub fn detail(mut self, name: &'static str, value: Detail) -> Failure {
        self.details.push((name, value));
        self
    }

    /// Prefixes the message (e.g. with the batch row).
    pub fn prefixed(mut self, prefix: &str) -> Failure {
        self.message = format!("{prefix}{}", self.message);
        self
    }

    /// The Python exception (an instance of the class, not yet raised).
    pub fn to_pyerr(&self, py: Python<'_>) -> PyErr {
        match self.instance(py) {
            Ok(e) => PyErr::from_value(e),
            Err(e) => e,
        }
    }

    /// The exception instance.
    pub fn instance<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let module = ERRORS.get_or_try_init(py, || {
            PyModule::import(py, "nextok._errors").map(Bound::unbind)
        })?;
        let class = module.bind(py).getattr(self.class)?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("code", self.code)?;
        kwargs.set_item("field", self.field.as_deref())?;
        for (name, value) in &self.details {
            match value {
                Detail::Str(s) => kwargs.set_item(*name, s)?,
                Detail::Int(i) => kwargs.set_item(*name, *i)?,
            }
        }
        class.call((self.message.as_str(),), Some(&kwargs))
    }
}

impl From<Failure> for PyErr {
    fn from(f: Failure) -> PyErr {
        Python::attach(|py| f.to_pyerr(py))
    }
}

impl From<nextok_core::Error> for Failure {
    fn from(e: nextok_core::Error) -> Failure {
        core_failure(&e)
    }
}

impl From<ConstraintError> for Failure {
    fn from(e: ConstraintError) -> Failure {
        let mut f = Failure::new("ConstraintError", e.to_string()).code(e.code());
        if let Some(field) = e.field() {
            f = f.field(field);
        }
        f
    }
}

impl From<VocabError> for Failure {
    fn from(e: VocabError) -> Failure {
        let kind = match e.kind() {
            nextok_vocab::VocabErrorKind::Io => "io",
            nextok_vocab::VocabErrorKind::Parse => "parse",
            nextok_vocab::VocabErrorKind::Invalid => "invalid",
            nextok_vocab::VocabErrorKind::Unsupported => "unsupported",
            _ => "other",
        };
        let mut f = Failure::new("VocabError", e.to_string())
            .code("vocab")
            .detail("kind", Detail::Str(kind.into()))
            .detail("source", Detail::Str(e.source_name().to_string()));
        if let Some(field) = e.field() {
            f = f.field(field);
        }
        f
    }
}

impl From<EngineError> for Failure {
    fn from(e: EngineError) -> Failure {
        // a core error underneath keeps its own class and details
        if let Some(core) =
            std::error::Error::source(&e).and_then(|s| s.downcast_ref::<nextok_core::Error>())
        {
            let mut f = core_failure(core);
            if let (Some(field), None) = (e.field(), &f.field) {
                f = f.field(field);
            }
            return f;
        }
        let (class, code) = match e.kind() {
            EngineKind::InvalidRequest => ("InvalidParameter", "invalid_parameter"),
            EngineKind::Constraint => ("ConstraintError", "constraint"),
            EngineKind::TooLarge => ("EngineError", "too_large"),
            EngineKind::QueueFull => ("EngineError", "queue_full"),
            EngineKind::Model => ("EngineError", "model"),
            EngineKind::Sampling => ("EngineError", "sampling"),
            EngineKind::Shutdown => ("EngineError", "shutdown"),
            _ => ("EngineError", "engine"),
        };
        let mut f = Failure::new(class, e.to_string()).code(e.code().unwrap_or(code));
        if let Some(field) = e.field() {
            f = f.field(field);
        }
        f
    }
}

/// The class and details of a core error.
fn core_failure(e: &nextok_core::Error) -> Failure {
    let message = e.to_string();
    let f = match e.kind() {
        CoreKind::InvalidParameter { .. } => Failure::new("InvalidParameter", message),
        CoreKind::Contradiction { .. } => Failure::new("Contradiction", message),
        CoreKind::NonFiniteLogit { index, value } => Failure::new("NonFiniteLogit", message)
            .detail("index", Detail::Int(*index as u64))
            .detail("value", Detail::Str((*value).to_string())),
        CoreKind::VocabSizeMismatch { expected, got } => Failure::new("VocabSizeMismatch", message)
            .detail("expected", Detail::Int(*expected as u64))
            .detail("got", Detail::Int(*got as u64)),
        CoreKind::TokenOutOfRange {
            token, vocab_size, ..
        } => Failure::new("TokenOutOfRange", message)
            .detail("token", Detail::Int(*token))
            .detail("vocab_size", Detail::Int(*vocab_size as u64)),
        CoreKind::EmptySupport { stage } => {
            Failure::new("EmptySupport", message).detail("stage", Detail::Str(stage.clone()))
        }
        CoreKind::AlreadyFinished => Failure::new("AlreadyFinished", message),
        CoreKind::Parse { .. } => Failure::new("ParseError", message),
        _ => Failure::new("NextokError", message),
    };
    let f = f.code(e.code());
    match e.field() {
        Some(field) => f.field(field),
        None => f,
    }
}

/// Results whose error is a [`Failure`].
pub type Result<T> = std::result::Result<T, Failure>;

/// A Rust-side invariant that failed (never expected; raised instead of panicking).
pub fn internal(what: &str) -> PyErr {
    PyRuntimeError::new_err(format!("nextok internal error: {what}"))
}
