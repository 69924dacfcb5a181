//! The command-line tool's error: the one-line message printed after `error: ` (exit status 2),
//! and the library error it came from, if any, as its [`source`](std::error::Error::source).
//!
//! The library errors convert with `?` (their message is the error's own text); a message
//! that names a flag or a file is a `String` (`?` converts it too), or
//! [`CliError::context`] to keep the library error underneath.

use std::fmt;

/// The failure underneath a [`CliError`].
type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An error of a `nextok` subcommand.
pub(crate) struct CliError {
    message: String,
    source: Option<Source>,
    /// Already reported on standard output (`replay --json`): exit with status 1 and print
    /// nothing more.
    silent: bool,
}

impl CliError {
    /// `prefix: error`, with `error` kept as the source.
    pub(crate) fn context<E>(prefix: impl fmt::Display, e: E) -> CliError
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        CliError {
            message: format!("{prefix}: {e}"),
            source: Some(Box::new(e)),
            silent: false,
        }
    }

    /// A failure the command has already reported as data: exit status 1, no `error:` line.
    pub(crate) fn silent() -> CliError {
        CliError {
            message: String::new(),
            source: None,
            silent: true,
        }
    }

    /// Whether the failure was already reported ([`CliError::silent`]).
    pub(crate) fn is_silent(&self) -> bool {
        self.silent
    }

    /// The message, as printed after `error: `.
    pub(crate) fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Debug for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("CliError");
        d.field("message", &self.message);
        if let Some(s) = &self.source {
            d.field("source", s);
        }
        d.finish()
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CliError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

impl From<String> for CliError {
    fn from(message: String) -> Self {
        CliError {
            message,
            source: None,
            silent: false,
        }
    }
}

impl From<&str> for CliError {
    fn from(message: &str) -> Self {
        CliError::from(message.to_string())
    }
}

/// A library error: its own text is the message, and it is the source.
macro_rules! from_library_error {
    ($($t:ty),* $(,)?) => {$(
        impl From<$t> for CliError {
            fn from(e: $t) -> Self {
                CliError {
                    message: e.to_string(),
                    source: Some(Box::new(e)),
                    silent: false,
                }
            }
        }
    )*};
}

from_library_error!(
    nextok_core::Error,
    nextok_vocab::VocabError,
    nextok_constraint::ConstraintError,
    nextok_model::ModelError,
    nextok_engine::EngineError,
    serde_json::Error,
    std::io::Error,
);
