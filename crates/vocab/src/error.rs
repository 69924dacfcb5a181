//! Loading errors. Every error names its source (file), and where it applies the field (a
//! JSON path or GGUF key) and the token id, so that one line says what is wrong. An I/O failure
//! underneath is kept as the error's [`source`](std::error::Error::source).

use std::fmt;
use std::sync::Arc;

/// What kind of problem a [`VocabError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum VocabErrorKind {
    /// The file could not be read.
    Io,
    /// The file is not well-formed (bad JSON, truncated GGUF, wrong type of a field).
    Parse,
    /// The file is well-formed but its contents are inconsistent (missing or duplicate ids,
    /// an id out of range, …), or a caller's option is invalid.
    Invalid,
    /// A well-formed feature this crate does not handle (e.g. a decoder type).
    Unsupported,
}

/// An error while loading a vocabulary or encoding text. Two errors are equal when kind,
/// source name, field and message are (the failure underneath is not compared).
#[derive(Debug, Clone)]
pub struct VocabError {
    kind: VocabErrorKind,
    source: String,
    field: Option<String>,
    message: String,
    cause: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

impl PartialEq for VocabError {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
            && self.source == other.source
            && self.field == other.field
            && self.message == other.message
    }
}

impl Eq for VocabError {}

impl VocabError {
    /// A new error about `source` (a file name, or a label such as `<memory>`).
    pub fn new(
        kind: VocabErrorKind,
        source: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        VocabError {
            kind,
            source: source.into(),
            field: None,
            message: message.into(),
            cause: None,
        }
    }

    /// A file of `source` that could not be read (`cannot read: …`), with the I/O error as the
    /// error's [`source`](std::error::Error::source).
    pub fn io(source: impl Into<String>, e: std::io::Error) -> Self {
        VocabError::new(VocabErrorKind::Io, source, format!("cannot read: {e}")).with_source(e)
    }

    /// The same error, with the failure underneath it (its
    /// [`source`](std::error::Error::source)); the message is unchanged.
    pub fn with_source(
        mut self,
        cause: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        self.cause = Some(Arc::from(cause.into()));
        self
    }

    /// The same error, naming `field` (a JSON path such as `model.vocab` or a GGUF key).
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// The kind of error.
    pub fn kind(&self) -> VocabErrorKind {
        self.kind
    }

    /// The file (or label) the error is about.
    pub fn source_name(&self) -> &str {
        &self.source
    }

    /// The field (JSON path or GGUF key), when there is one.
    pub fn field(&self) -> Option<&str> {
        self.field.as_deref()
    }

    /// The message without source and field.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for VocabError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`", self.source)?;
        if let Some(field) = &self.field {
            write!(f, ": field `{field}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for VocabError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

/// Result alias of this crate.
pub type Result<T, E = VocabError> = std::result::Result<T, E>;
