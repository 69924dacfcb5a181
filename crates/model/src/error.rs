//! The model crate's error: one message naming what failed.

use std::fmt;

/// A failure while loading, fetching or running a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelError {
    message: String,
}

impl ModelError {
    /// An error with `message`, kept to one line: a backtrace that a dependency appends (a
    /// numbered frame list) is dropped, and the remaining lines are joined with `; `.
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
            message: lines.join("; "),
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ModelError {}

impl From<candle_core::Error> for ModelError {
    fn from(e: candle_core::Error) -> Self {
        ModelError::new(format!("tensor error: {e}"))
    }
}

impl From<nextok_vocab::VocabError> for ModelError {
    fn from(e: nextok_vocab::VocabError) -> Self {
        ModelError::new(e.to_string())
    }
}

impl From<crate::kernels::KernelError> for ModelError {
    fn from(e: crate::kernels::KernelError) -> Self {
        ModelError::new(format!("kernel: {e}"))
    }
}

impl From<std::io::Error> for ModelError {
    fn from(e: std::io::Error) -> Self {
        ModelError::new(format!("I/O error: {e}"))
    }
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, ModelError>;
