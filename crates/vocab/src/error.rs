//! Loading errors. Every error names its source (file), and where it applies the field (a
//! JSON path or GGUF key) and the token id, so that one line says what is wrong.

use std::fmt;

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

/// An error while loading a vocabulary or encoding text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VocabError {
    kind: VocabErrorKind,
    source: String,
    field: Option<String>,
    message: String,
}

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
        }
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

impl std::error::Error for VocabError {}

/// Result alias of this crate.
pub type Result<T, E = VocabError> = std::result::Result<T, E>;
