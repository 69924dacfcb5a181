//! The engine's error: an opaque value with a kind to inspect and, for invalid requests, the
//! name of the field at fault (the server turns it into a 400 naming that field).

use std::fmt;

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
}

/// An engine error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineError {
    kind: ErrorKind,
    field: Option<String>,
    message: String,
    code: Option<&'static str>,
}

impl EngineError {
    /// An error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> EngineError {
        EngineError {
            kind,
            field: None,
            message: message.into(),
            code: None,
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

    pub(crate) fn model(e: nextok_model::ModelError) -> EngineError {
        EngineError::new(ErrorKind::Model, e.message().to_string())
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
        }
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

impl std::error::Error for EngineError {}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, EngineError>;
