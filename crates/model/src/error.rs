//! The model crate's error: an opaque value with a [`kind`](ModelError::kind), one message
//! naming what failed, and the failure underneath (a tensor-library, I/O, vocabulary or template
//! error) as its [`source`](std::error::Error::source).

use std::fmt;
use std::sync::Arc;

/// What kind of problem a [`ModelError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ModelErrorKind {
    /// A file or a process could not be opened, read, written or run.
    Io,
    /// The model file is not usable: not a GGUF file, missing or invalid metadata, a tensor that
    /// cannot be read.
    Format,
    /// The tensor library failed.
    Tensor,
    /// A matrix kernel's input is wrong (shape, length, format).
    Kernel,
    /// The vocabulary could not be loaded.
    Vocab,
    /// The chat template could not be rendered.
    Template,
    /// An argument of the caller is invalid (an empty prompt, a position past the end, ...).
    Invalid,
    /// A fixed capacity is used up (the KV cache's block limit): the request may succeed later,
    /// when other sequences free their blocks.
    Capacity,
    /// Anything else.
    Other,
}

/// The failure underneath an error.
type Source = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// A failure while loading, fetching or running a model.
#[derive(Clone)]
pub struct ModelError {
    kind: ModelErrorKind,
    message: String,
    source: Option<Source>,
}

impl ModelError {
    /// An error with `message` (of kind [`ModelErrorKind::Other`] until
    /// [`with_kind`](ModelError::with_kind) says otherwise), kept to one line: a backtrace that
    /// a dependency appends (a numbered frame list) is dropped, and the remaining lines are
    /// joined with `; `.
    pub fn new(message: impl Into<String>) -> ModelError {
        let message: String = message.into();
        let is_frame = |l: &str| {
            let t = l.trim_start();
            t.starts_with("Stack backtrace")
                || t.split_once(": ")
                    .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        };
        let lines: Vec<&str> = message
            .lines()
            .take_while(|l| !is_frame(l))
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        ModelError {
            kind: ModelErrorKind::Other,
            message: lines.join("; "),
            source: None,
        }
    }

    /// The same error, of `kind`.
    pub fn with_kind(mut self, kind: ModelErrorKind) -> ModelError {
        self.kind = kind;
        self
    }

    /// The same error, with the failure underneath it (its [`source`](std::error::Error::source));
    /// the message is unchanged.
    pub fn with_source(
        mut self,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> ModelError {
        self.source = Some(Arc::from(source.into()));
        self
    }

    /// The kind of error.
    pub fn kind(&self) -> ModelErrorKind {
        self.kind
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Debug for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("ModelError");
        d.field("kind", &self.kind).field("message", &self.message);
        if let Some(s) = &self.source {
            d.field("source", s);
        }
        d.finish()
    }
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ModelError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

impl From<candle_core::Error> for ModelError {
    fn from(e: candle_core::Error) -> Self {
        ModelError::new(format!("tensor error: {e}"))
            .with_kind(ModelErrorKind::Tensor)
            .with_source(e)
    }
}

impl From<nextok_vocab::VocabError> for ModelError {
    fn from(e: nextok_vocab::VocabError) -> Self {
        ModelError::new(e.to_string())
            .with_kind(ModelErrorKind::Vocab)
            .with_source(e)
    }
}

impl From<crate::kernels::KernelError> for ModelError {
    fn from(e: crate::kernels::KernelError) -> Self {
        ModelError::new(format!("kernel: {e}"))
            .with_kind(ModelErrorKind::Kernel)
            .with_source(e)
    }
}

impl From<std::io::Error> for ModelError {
    fn from(e: std::io::Error) -> Self {
        ModelError::new(format!("I/O error: {e}"))
            .with_kind(ModelErrorKind::Io)
            .with_source(e)
    }
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, ModelError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_is_one_line_and_the_cause_is_kept() {
        let io = std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "gone\nStack backtrace:\n 0: x",
        );
        let e = ModelError::from(io);
        assert_eq!(e.to_string(), "I/O error: gone");
        assert_eq!(e.kind(), ModelErrorKind::Io);
        let src = std::error::Error::source(&e).expect("the I/O error is kept");
        assert!(src.to_string().starts_with("gone"), "{src}");
        let e = ModelError::new("plain");
        assert_eq!(e.kind(), ModelErrorKind::Other);
        assert!(std::error::Error::source(&e).is_none());
    }
}
