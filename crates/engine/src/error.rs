//! The engine's error: an opaque value with a kind to inspect and, for invalid requests, the
//! name of the field at fault (the server turns it into a 400 naming that field). The library
//! error it wraps (the core's, the model's, the constraint engine's) is its
//! [`source`](std::error::Error::source).

use std::fmt;
use std::sync::Arc;

/// What went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A field of the request is invalid or contradicts another (the field is named).
    InvalidRequest,
    /// The request can never run: its prompt plus `max_tokens` exceed the context or the KV
    /// budget (the field is named).
    TooLarge,
    /// The waiting queue is full; retry later.
    QueueFull,
    /// The constraint failed to compile (the field is `constraint`).
    Constraint,
    /// The model failed while running the request.
    Model,
    /// A step of the sampler failed (for example a constraint that leaves no token).
    Sampling,
    /// The engine is shutting down.
    Shutdown,
    /// The caller stopped waiting and cancelled the request
    /// ([`RequestHandle::collect_until`](crate::RequestHandle::collect_until)).
    Cancelled,
}

/// The library error underneath an engine error.
type Source = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// An engine error. Two errors are equal when kind, field, message and code are (the source is
/// not compared).
#[derive(Clone)]
pub struct EngineError {
    kind: ErrorKind,
    field: Option<String>,
    message: String,
    code: Option<&'static str>,
    source: Option<Source>,
}

impl PartialEq for EngineError {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
            && self.field == other.field
            && self.message == other.message
            && self.code == other.code
    }
}

impl Eq for EngineError {}

impl fmt::Debug for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("EngineError");
        d.field("kind", &self.kind)
            .field("field", &self.field)
            .field("message", &self.message)
            .field("code", &self.code);
        if let Some(s) = &self.source {
            d.field("source", s);
        }
        d.finish()
    }
}

impl EngineError {
    /// An error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> EngineError {
        EngineError {
            kind,
            field: None,
            message: message.into(),
            code: None,
            source: None,
        }
    }

    /// An invalid field.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> EngineError {
        EngineError::new(ErrorKind::InvalidRequest, message).with_field(field)
    }

    /// The same error, naming `field`.
    pub fn with_field(mut self, field: impl Into<String>) -> EngineError {
        self.field = Some(field.into());
        self
    }

    /// The kind.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }

    /// The request field at fault, if one is.
    pub fn field(&self) -> Option<&str> {
        self.field.as_deref()
    }

    /// The message (without the field).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The core's machine-readable code (e.g. `already_finished`) when the error came from a
    /// sampler step.
    pub fn code(&self) -> Option<&'static str> {
        self.code
    }

    /// The same error, with the library error underneath it.
    pub(crate) fn with_source(
        mut self,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> EngineError {
        self.source = Some(Arc::from(source.into()));
        self
    }

    pub(crate) fn model(e: nextok_model::ModelError) -> EngineError {
        EngineError::new(ErrorKind::Model, e.message().to_string()).with_source(e)
    }

    /// A constraint that failed to build or compile (the message is the constraint error's).
    pub(crate) fn constraint(e: nextok_constraint::ConstraintError) -> EngineError {
        EngineError::new(ErrorKind::Constraint, e.to_string()).with_source(e)
    }

    pub(crate) fn core(e: nextok_core::Error) -> EngineError {
        let field = e.field().map(str::to_string);
        let kind = match e.kind() {
            nextok_core::ErrorKind::InvalidParameter { .. }
            | nextok_core::ErrorKind::Contradiction { .. }
            | nextok_core::ErrorKind::TokenOutOfRange { .. }
            | nextok_core::ErrorKind::Parse { .. } => ErrorKind::InvalidRequest,
            _ => ErrorKind::Sampling,
        };
        EngineError {
            kind,
            field,
            message: e.to_string(),
            code: Some(e.code()),
            source: None,
        }
        .with_source(e)
    }
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) if !self.message.contains(field.as_str()) => {
                write!(f, "`{field}`: {}", self.message)
            }
            _ => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for EngineError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, EngineError>;
