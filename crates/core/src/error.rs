//! Typed errors.
//!
//! [`Error`] is opaque; inspect it with [`Error::kind`] and [`Error::field`]. Every error that a
//! caller's input can cause names the offending field (or logit index), and every fallible
//! operation leaves the caller's state untouched when it fails.

use std::fmt;

/// What went wrong.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A parameter is out of its domain (e.g. `top_p` outside `(0, 1]`).
    InvalidParameter {
        /// The parameter's name as in the pipeline config / API (`top_p`, `temperature`, ...).
        field: String,
        /// Why it is invalid.
        reason: String,
    },
    /// Two settings contradict each other (detected at validation, before any step runs).
    Contradiction {
        /// The fields involved, e.g. `min_tokens`.
        field: String,
        /// What contradicts what.
        reason: String,
    },
    /// A raw logit is NaN or `+inf`; `index` is the first bad index.
    NonFiniteLogit {
        /// First offending token index.
        index: usize,
        /// `"NaN"` or `"+inf"`.
        value: &'static str,
    },
    /// The logits row has the wrong length.
    VocabSizeMismatch {
        /// Expected vocabulary size.
        expected: usize,
        /// Length received.
        got: usize,
    },
    /// A token id is outside `0..vocab_size`.
    TokenOutOfRange {
        /// Where the id came from, e.g. `prompt_ids[3]`.
        field: String,
        /// The id.
        token: u64,
        /// The vocabulary size.
        vocab_size: usize,
    },
    /// After a stage, no token can be selected. The sampler was not called.
    EmptySupport {
        /// The processor (pipeline `type`) after which the support became empty.
        stage: String,
    },
    /// The sequence has already finished; no further step is allowed.
    AlreadyFinished,
    /// A pipeline config or request could not be parsed.
    Parse {
        /// The field or path being parsed.
        field: String,
        /// The parser's message.
        reason: String,
    },
}

/// The error type of nextok-core.
#[derive(Debug, Clone, PartialEq)]
pub struct Error {
    kind: ErrorKind,
}

impl Error {
    /// The kind of error.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }

    /// The request/config field the error is about, when there is one.
    pub fn field(&self) -> Option<&str> {
        match &self.kind {
            ErrorKind::InvalidParameter { field, .. }
            | ErrorKind::Contradiction { field, .. }
            | ErrorKind::TokenOutOfRange { field, .. }
            | ErrorKind::Parse { field, .. } => Some(field),
            ErrorKind::NonFiniteLogit { .. } | ErrorKind::VocabSizeMismatch { .. } => {
                Some("logits")
            }
            ErrorKind::EmptySupport { .. } => Some("support"),
            ErrorKind::AlreadyFinished => None,
        }
    }

    /// A short machine-readable code for the kind.
    pub fn code(&self) -> &'static str {
        match &self.kind {
            ErrorKind::InvalidParameter { .. } => "invalid_parameter",
            ErrorKind::Contradiction { .. } => "contradiction",
            ErrorKind::NonFiniteLogit { .. } => "non_finite_logit",
            ErrorKind::VocabSizeMismatch { .. } => "vocab_size_mismatch",
            ErrorKind::TokenOutOfRange { .. } => "token_out_of_range",
            ErrorKind::EmptySupport { .. } => "empty_support",
            ErrorKind::AlreadyFinished => "already_finished",
            ErrorKind::Parse { .. } => "parse",
        }
    }

    /// The same error with its field renamed by `rename`: how a front end names a field its own
    /// way (the CLI's `--top-p` for `top_p`). The fields a reason names in backticks are renamed
    /// too (`rename` leaves a name it does not know as it is).
    pub fn renamed(mut self, rename: impl Fn(&str) -> String) -> Self {
        match &mut self.kind {
            ErrorKind::InvalidParameter { field, reason }
            | ErrorKind::Contradiction { field, reason }
            | ErrorKind::Parse { field, reason } => {
                *field = rename(field);
                *reason = rename_quoted(reason, &rename);
            }
            ErrorKind::TokenOutOfRange { field, .. } => *field = rename(field),
            _ => {}
        }
        self
    }

    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ErrorKind::InvalidParameter {
            field: field.into(),
            reason: reason.into(),
        }
        .into()
    }

    pub(crate) fn contradiction(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ErrorKind::Contradiction {
            field: field.into(),
            reason: reason.into(),
        }
        .into()
    }

    pub(crate) fn out_of_range(field: impl Into<String>, token: u64, vocab_size: usize) -> Self {
        ErrorKind::TokenOutOfRange {
            field: field.into(),
            token,
            vocab_size,
        }
        .into()
    }

    pub(crate) fn parse(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ErrorKind::Parse {
            field: field.into(),
            reason: reason.into(),
        }
        .into()
    }
}

impl From<ErrorKind> for Error {
    fn from(kind: ErrorKind) -> Self {
        Error { kind }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ErrorKind::InvalidParameter { field, reason } => {
                write!(f, "invalid `{field}`: {reason}")
            }
            ErrorKind::Contradiction { field, reason } => {
                write!(f, "contradictory `{field}`: {reason}")
            }
            ErrorKind::NonFiniteLogit { index, value } => {
                write!(
                    f,
                    "invalid `logits`: logits[{index}] is {value} (first non-finite index)"
                )
            }
            ErrorKind::VocabSizeMismatch { expected, got } => {
                write!(
                    f,
                    "invalid `logits`: length {got}, vocabulary size is {expected}"
                )
            }
            ErrorKind::TokenOutOfRange {
                field,
                token,
                vocab_size,
            } => {
                write!(
                    f,
                    "invalid `{field}`: token id {token} is outside 0..{vocab_size}"
                )
            }
            ErrorKind::EmptySupport { stage } if stage == "grammar_mask" => {
                write!(f, "constraint error: empty support after `{stage}`: no selectable token left (sampler not called)")
            }
            ErrorKind::EmptySupport { stage } => {
                write!(
                    f,
                    "empty support after `{stage}`: no selectable token left (sampler not called)"
                )
            }
            ErrorKind::AlreadyFinished => write!(f, "the sequence has already finished"),
            ErrorKind::Parse { field, reason } => write!(f, "invalid `{field}`: {reason}"),
        }
    }
}

impl std::error::Error for Error {}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Parses JSON, naming the failing path in the error (`params.topp`, `processors[2].top_p`);
/// `root` names the document when the failure is at its top level.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(s: &str, root: &str) -> Result<T> {
    let de = &mut serde_json::Deserializer::from_str(s);
    let value = serde_path_to_error::deserialize(&mut *de).map_err(|e| {
        let path = e.path().to_string();
        let mut reason = e.into_inner().to_string();
        // a map key that failed to parse is `?` in the path: name the map and say "key"
        let (path, key) = match path.strip_suffix(".?") {
            Some(p) => (p.to_string(), true),
            None => (path, false),
        };
        let mut field = if path.is_empty() || path == "." {
            root.to_string()
        } else {
            path
        };
        if key {
            reason = format!("a key: {reason}");
        }
        // a nested document (a pipeline object inside a request) reports its own path first
        if let Some(rest) = reason.strip_prefix("at `") {
            if let Some((inner, msg)) = rest.split_once("`: ") {
                field = format!("{field}.{inner}");
                reason = msg.to_string();
            }
        }
        Error::parse(field, reason)
    })?;
    // one document: anything but whitespace after it is an error, not ignored
    de.end()
        .map_err(|e| Error::parse(root, format!("trailing data after the JSON document: {e}")))?;
    Ok(value)
}

/// `text` with every backticked field name (`` `top_k` ``, `` `stop[1]` ``) renamed.
fn rename_quoted(text: &str, rename: &impl Fn(&str) -> String) -> String {
    let is_name = |w: &str| {
        !w.is_empty()
            && w.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '[' | ']'))
    };
    let mut out = String::with_capacity(text.len());
    let mut parts = text.split('`');
    if let Some(first) = parts.next() {
        out.push_str(first);
    }
    // odd parts sit between backticks
    for (i, part) in parts.enumerate() {
        out.push('`');
        if i % 2 == 0 && is_name(part) {
            out.push_str(&rename(part));
        } else {
            out.push_str(part);
        }
    }
    out
}
