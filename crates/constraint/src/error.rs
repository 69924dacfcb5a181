//! Typed errors of the constraint engine.
//!
//! [`ConstraintError`] is opaque: inspect it with [`ConstraintError::kind`] and the accessors
//! ([`ConstraintError::limit`], [`ConstraintError::keyword`], [`ConstraintError::pointer`], ...);
//! the engine failure underneath, when there is one, is its [`std::error::Error::source`].
//! Every error that a request can cause names its place: the keyword a JSON schema uses that the
//! engine does not support (and its JSON pointer), the line and column of a malformed GBNF rule,
//! the limit that a grammar exceeded. [`ConstraintError::to_core`] maps an error onto
//! `nextok_core::Error` for the [`nextok_core::constraint::ConstraintState`] methods.

use std::fmt;
use std::sync::Arc;

use nextok_core::ErrorKind;

/// The most characters of one line of an error's text: a longer line (an input quoted in full,
/// a caret under it) keeps only its first [`EXCERPT_HEAD_CHARS`] and last
/// [`EXCERPT_TAIL_CHARS`] characters, around `… (N chars) …` naming its length, so an error
/// never echoes unbounded input.
pub const MAX_ERROR_LINE_CHARS: usize = 200;
/// The characters a cut line keeps from its start (see [`MAX_ERROR_LINE_CHARS`]).
pub const EXCERPT_HEAD_CHARS: usize = 150;
/// The characters a cut line keeps from its end (see [`MAX_ERROR_LINE_CHARS`]).
pub const EXCERPT_TAIL_CHARS: usize = 40;
/// The most lines of an error's text; the rest is summarised as `… (N more lines)`.
pub const MAX_ERROR_LINES: usize = 12;

/// `s` as an error quotes it: control characters other than newlines escaped (`\u{1b}`,
/// `\t`), each line cut to an excerpt of at most [`MAX_ERROR_LINE_CHARS`] characters, at most
/// [`MAX_ERROR_LINES`] lines. Works in one pass over `s` and allocates only the excerpt.
pub fn bounded_text(s: &str) -> String {
    let mut out = String::new();
    let mut lines = s.split('\n');
    for (i, line) in lines.by_ref().enumerate() {
        if i == MAX_ERROR_LINES {
            let rest = 1 + s.split('\n').skip(MAX_ERROR_LINES + 1).count();
            out.push_str(&format!("\n… ({rest} more lines)"));
            break;
        }
        if i > 0 {
            out.push('\n');
        }
        let n = line.chars().count();
        if n <= MAX_ERROR_LINE_CHARS {
            push_escaped(&mut out, line.chars());
        } else {
            push_escaped(&mut out, line.chars().take(EXCERPT_HEAD_CHARS));
            out.push_str(&format!("… ({n} chars) …"));
            push_escaped(&mut out, line.chars().skip(n - EXCERPT_TAIL_CHARS));
        }
    }
    out
}

fn push_escaped(out: &mut String, chars: impl Iterator<Item = char>) {
    for c in chars {
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
}

/// A limit of the engine (see [`crate::Limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimitKind {
    /// Wall-clock time to compile a constraint ([`crate::Limits::max_compile_time`], off by
    /// default).
    CompileTime,
    /// Size of the compiled grammar in symbols ([`crate::Limits::max_grammar_size`]).
    GrammarSize,
    /// Work spent building the initial lexer, including checking which lexemes can match
    /// ([`crate::Limits::initial_lexer_fuel`]).
    CompileFuel,
    /// Number of lexer states ([`crate::Limits::max_lexer_states`]).
    LexerStates,
    /// Lexer work in one mask computation ([`crate::Limits::step_lexer_fuel`]).
    StepFuel,
    /// Parser items in one mask computation ([`crate::Limits::step_max_items`]).
    StepItems,
    /// Parser items in one row ([`crate::Limits::max_items_in_row`]).
    ItemsInRow,
    /// Number of states of a `choice` trie or a small-regex automaton
    /// ([`crate::Limits::max_states`]).
    States,
    /// Number of rules of a GBNF or Lark grammar ([`crate::Limits::max_rules`]).
    Rules,
    /// Number of objects in a JSON schema ([`crate::Limits::max_schema_objects`]).
    SchemaObjects,
    /// Nesting depth of objects and arrays in a JSON schema
    /// ([`crate::Limits::max_schema_depth`]).
    SchemaDepth,
    /// Objects in a JSON schema for building the check after generation
    /// ([`crate::Limits::max_validator_objects`]).
    ValidatorObjects,
    /// Nesting depth of groups in a GBNF grammar ([`crate::gbnf::MAX_GROUP_NESTING`], the Lark
    /// parser's own limit).
    GroupNesting,
}

impl LimitKind {
    /// The name of the limit as in [`crate::Limits`].
    pub fn name(self) -> &'static str {
        match self {
            LimitKind::CompileTime => "max_compile_time",
            LimitKind::GrammarSize => "max_grammar_size",
            LimitKind::CompileFuel => "initial_lexer_fuel",
            LimitKind::LexerStates => "max_lexer_states",
            LimitKind::StepFuel => "step_lexer_fuel",
            LimitKind::StepItems => "step_max_items",
            LimitKind::ItemsInRow => "max_items_in_row",
            LimitKind::States => "max_states",
            LimitKind::Rules => "max_rules",
            LimitKind::SchemaObjects => "max_schema_objects",
            LimitKind::SchemaDepth => "max_schema_depth",
            LimitKind::ValidatorObjects => "max_validator_objects",
            LimitKind::GroupNesting => "max_group_nesting",
        }
    }
}

/// What kind of problem a [`ConstraintError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConstraintErrorKind {
    /// The request itself is invalid (an empty `choice` list, a vocabulary without EOS, ...);
    /// [`ConstraintError::field`] names the field or input at fault.
    Invalid,
    /// A grammar, regex or schema is malformed; [`ConstraintError::input`] says which and
    /// [`ConstraintError::place`] where (`line 3, column 7`, a schema path, a rule name).
    Syntax,
    /// The input uses a feature (a JSON-schema keyword, a GBNF construct) that the engine does
    /// not support; [`ConstraintError::keyword`] names it.
    Unsupported,
    /// The schema admits no value at all.
    Unsatisfiable,
    /// A limit was exceeded; [`ConstraintError::limit`] says which.
    Limit,
    /// A committed token is not allowed in the current state (the state is unchanged);
    /// [`ConstraintError::token`] is its id.
    Rejected,
    /// Any other engine failure.
    Engine,
}

impl ConstraintErrorKind {
    /// A short machine-readable code: `invalid`, `syntax`, `unsupported`, `unsatisfiable`,
    /// `limit`, `rejected`, `engine`.
    pub fn code(self) -> &'static str {
        match self {
            ConstraintErrorKind::Invalid => "invalid",
            ConstraintErrorKind::Syntax => "syntax",
            ConstraintErrorKind::Unsupported => "unsupported",
            ConstraintErrorKind::Unsatisfiable => "unsatisfiable",
            ConstraintErrorKind::Limit => "limit",
            ConstraintErrorKind::Rejected => "rejected",
            ConstraintErrorKind::Engine => "engine",
        }
    }
}

/// The details of each kind (private: read them through the accessors).
#[derive(Debug, Clone, PartialEq)]
enum Repr {
    Invalid {
        what: String,
        message: String,
    },
    Syntax {
        input: &'static str,
        place: String,
        message: String,
    },
    Unsupported {
        keyword: String,
        pointer: Option<String>,
        message: String,
    },
    Unsatisfiable {
        message: String,
    },
    Limit {
        limit: LimitKind,
        message: String,
    },
    Rejected {
        token: u32,
        message: String,
    },
    Engine {
        message: String,
    },
}

/// The engine failure underneath an error.
pub(crate) type Source = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong while compiling or running a constraint: an opaque value with a
/// [`kind`](ConstraintError::kind), the details of that kind through accessors, and the engine
/// failure underneath (if any) as its [`source`](std::error::Error::source).
#[derive(Clone)]
pub struct ConstraintError {
    repr: Repr,
    source: Option<Source>,
}

impl ConstraintError {
    /// The kind of error.
    pub fn kind(&self) -> ConstraintErrorKind {
        match self.repr {
            Repr::Invalid { .. } => ConstraintErrorKind::Invalid,
            Repr::Syntax { .. } => ConstraintErrorKind::Syntax,
            Repr::Unsupported { .. } => ConstraintErrorKind::Unsupported,
            Repr::Unsatisfiable { .. } => ConstraintErrorKind::Unsatisfiable,
            Repr::Limit { .. } => ConstraintErrorKind::Limit,
            Repr::Rejected { .. } => ConstraintErrorKind::Rejected,
            Repr::Engine { .. } => ConstraintErrorKind::Engine,
        }
    }

    /// A short machine-readable code: `invalid`, `syntax`, `unsupported`, `unsatisfiable`,
    /// `limit`, `rejected`, `engine` (see [`ConstraintErrorKind::code`]).
    pub fn code(&self) -> &'static str {
        self.kind().code()
    }

    /// The message without the prefix that [`Display`](fmt::Display) puts before it (the
    /// field, input and place, keyword, limit or token).
    pub fn message(&self) -> &str {
        match &self.repr {
            Repr::Invalid { message, .. }
            | Repr::Syntax { message, .. }
            | Repr::Unsupported { message, .. }
            | Repr::Unsatisfiable { message }
            | Repr::Limit { message, .. }
            | Repr::Rejected { message, .. }
            | Repr::Engine { message } => message,
        }
    }

    /// The field or input at fault, for an [`ConstraintErrorKind::Invalid`] error (`choice`,
    /// `vocabulary`, `rollback`, ...).
    pub fn field(&self) -> Option<&str> {
        match &self.repr {
            Repr::Invalid { what, .. } => Some(what),
            _ => None,
        }
    }

    /// Which input is malformed, for a [`ConstraintErrorKind::Syntax`] error: `regex`,
    /// `json_schema`, `json`, `grammar`, `gbnf`.
    pub fn input(&self) -> Option<&'static str> {
        match &self.repr {
            Repr::Syntax { input, .. } => Some(input),
            _ => None,
        }
    }

    /// Where in the input, for a [`ConstraintErrorKind::Syntax`] error (`line 3, column 7`, a
    /// schema path, `top level`).
    pub fn place(&self) -> Option<&str> {
        match &self.repr {
            Repr::Syntax { place, .. } => Some(place),
            _ => None,
        }
    }

    /// The unsupported keyword or construct, for an [`ConstraintErrorKind::Unsupported`] error
    /// (e.g. `oneOf`, `format`, `token reference`; several are joined with `, `).
    pub fn keyword(&self) -> Option<&str> {
        match &self.repr {
            Repr::Unsupported { keyword, .. } => Some(keyword),
            _ => None,
        }
    }

    /// The JSON pointer of the unsupported keyword in the schema (`""` for the root), when it
    /// was found.
    pub fn pointer(&self) -> Option<&str> {
        match &self.repr {
            Repr::Unsupported { pointer, .. } => pointer.as_deref(),
            _ => None,
        }
    }

    /// The limit exceeded, for a [`ConstraintErrorKind::Limit`] error.
    pub fn limit(&self) -> Option<LimitKind> {
        match &self.repr {
            Repr::Limit { limit, .. } => Some(*limit),
            _ => None,
        }
    }

    /// The rejected token id, for a [`ConstraintErrorKind::Rejected`] error.
    pub fn token(&self) -> Option<u32> {
        match &self.repr {
            Repr::Rejected { token, .. } => Some(*token),
            _ => None,
        }
    }

    /// This error as a `nextok_core::Error` (field `constraint`, or `token` for a rejection).
    pub fn to_core(&self) -> nextok_core::Error {
        let field = match self.repr {
            Repr::Rejected { .. } => "token",
            _ => "constraint",
        };
        ErrorKind::InvalidParameter {
            field: field.into(),
            reason: self.to_string(),
        }
        .into()
    }

    /// Every error is made here: each text it holds is cut to a bounded excerpt
    /// ([`bounded_text`]), so no front end echoes unbounded input.
    fn new(mut repr: Repr) -> Self {
        match &mut repr {
            Repr::Invalid { what, message } => {
                bound(what);
                bound(message);
            }
            Repr::Syntax { place, message, .. } => {
                bound(place);
                bound(message);
            }
            Repr::Unsupported {
                keyword,
                pointer,
                message,
            } => {
                bound(keyword);
                if let Some(p) = pointer {
                    bound(p);
                }
                bound(message);
            }
            Repr::Unsatisfiable { message }
            | Repr::Limit { message, .. }
            | Repr::Rejected { message, .. }
            | Repr::Engine { message } => bound(message),
        }
        ConstraintError { repr, source: None }
    }

    /// The same error, with the failure underneath it.
    pub(crate) fn with_source(
        mut self,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        self.source = Some(Arc::from(source.into()));
        self
    }

    /// The same error, with a source shared with another error.
    pub(crate) fn with_shared_source(mut self, source: Source) -> Self {
        self.source = Some(source);
        self
    }

    /// The failure underneath, shared (to carry it over to a derived error).
    pub(crate) fn shared_source(&self) -> Option<Source> {
        self.source.clone()
    }

    pub(crate) fn invalid(what: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(Repr::Invalid {
            what: what.into(),
            message: message.into(),
        })
    }

    pub(crate) fn syntax(
        input: &'static str,
        place: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self::new(Repr::Syntax {
            input,
            place: place.into(),
            message: message.into(),
        })
    }

    pub(crate) fn unsupported(keyword: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(Repr::Unsupported {
            keyword: keyword.into(),
            pointer: None,
            message: message.into(),
        })
    }

    /// The same error, naming the JSON pointer of the unsupported keyword.
    pub(crate) fn at_pointer(mut self, at: impl Into<String>) -> Self {
        if let Repr::Unsupported { pointer, .. } = &mut self.repr {
            let mut p = at.into();
            bound(&mut p);
            *pointer = Some(p);
        }
        self
    }

    pub(crate) fn unsatisfiable(message: impl Into<String>) -> Self {
        Self::new(Repr::Unsatisfiable {
            message: message.into(),
        })
    }

    pub(crate) fn limit_exceeded(limit: LimitKind, message: impl Into<String>) -> Self {
        Self::new(Repr::Limit {
            limit,
            message: message.into(),
        })
    }

    pub(crate) fn rejected(token: u32, message: impl Into<String>) -> Self {
        Self::new(Repr::Rejected {
            token,
            message: message.into(),
        })
    }

    pub(crate) fn engine(message: impl Into<String>) -> Self {
        Self::new(Repr::Engine {
            message: message.into(),
        })
    }
}

/// Replaces `s` by its bounded excerpt when it needs one.
fn bound(s: &mut String) {
    let needs = s.len() > MAX_ERROR_LINE_CHARS
        || s.chars().any(|c| c.is_control() && c != '\n')
        || s.bytes().filter(|&b| b == b'\n').count() >= MAX_ERROR_LINES;
    if needs {
        *s = bounded_text(s);
    }
}

impl fmt::Debug for ConstraintError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("ConstraintError");
        d.field("kind", &self.kind()).field("repr", &self.repr);
        if let Some(s) = &self.source {
            d.field("source", s);
        }
        d.finish()
    }
}

impl fmt::Display for ConstraintError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.repr {
            Repr::Invalid { what, message } => write!(f, "{what}: {message}"),
            Repr::Syntax {
                input,
                place,
                message,
            } => write!(f, "{input}: {place}: {message}"),
            Repr::Unsupported {
                keyword, message, ..
            } => {
                write!(f, "unsupported keyword `{keyword}`: {message}")
            }
            Repr::Unsatisfiable { message } => write!(f, "unsatisfiable: {message}"),
            Repr::Limit { limit, message } => {
                write!(f, "limit {} exceeded: {message}", limit.name())
            }
            Repr::Rejected { token, message } => {
                write!(f, "token {token} rejected: {message}")
            }
            Repr::Engine { message } => write!(f, "engine error: {message}"),
        }
    }
}

impl std::error::Error for ConstraintError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

impl From<ConstraintError> for nextok_core::Error {
    fn from(e: ConstraintError) -> Self {
        e.to_core()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_cut_to_an_excerpt_naming_their_length() {
        let input = "(".repeat(20_000);
        let msg = format!(
            "invalid regex \"{input}\"\n{}^\nerror: nest limit",
            " ".repeat(20_010)
        );
        let e = ConstraintError::syntax("regex", "top level", msg);
        let shown = e.to_string();
        assert!(shown.chars().count() < 3 * MAX_ERROR_LINE_CHARS, "{shown}");
        assert!(shown.contains("(20016 chars)"), "{shown}");
        assert!(shown.contains("… (20011 chars) …"), "{shown}");
        assert!(shown.ends_with("error: nest limit"), "{shown}");
        assert!(
            shown.starts_with("regex: top level: invalid regex \"((("),
            "{shown}"
        );
        for line in shown.lines() {
            // an excerpt, plus the prefix Display puts before the first line
            assert!(line.chars().count() <= MAX_ERROR_LINE_CHARS + 40, "{line}");
        }
        // every kind and every text it holds, the pointer too
        let long = "k".repeat(5_000);
        let shown = [
            ConstraintError::invalid(long.clone(), long.clone()),
            ConstraintError::unsupported(long.clone(), long.clone()).at_pointer(long.clone()),
            ConstraintError::unsatisfiable(long.clone()),
            ConstraintError::limit_exceeded(LimitKind::Rules, long.clone()),
            ConstraintError::rejected(1, long.clone()),
            ConstraintError::engine(long.clone()),
        ];
        for e in shown {
            assert!(e.to_string().len() < 3 * MAX_ERROR_LINE_CHARS, "{e}");
            assert!(
                e.pointer()
                    .is_none_or(|p| p.chars().count() <= MAX_ERROR_LINE_CHARS + 30),
                "{e:?}"
            );
        }
    }

    #[test]
    fn many_lines_and_control_characters_are_bounded() {
        let msg = "line\n".repeat(1_000);
        let shown = ConstraintError::engine(msg).to_string();
        assert_eq!(shown.lines().count(), MAX_ERROR_LINES + 1, "{shown}");
        assert!(shown.ends_with("… (989 more lines)"), "{shown}");
        let shown = ConstraintError::engine("red \u{1b}[31m\ttab").to_string();
        assert_eq!(shown, "engine error: red \\u{1b}[31m\\ttab");
        // short texts are kept as they are, multi-byte characters counted as characters
        let s = "é".repeat(MAX_ERROR_LINE_CHARS);
        assert_eq!(bounded_text(&s), s);
        let cut = bounded_text(&"é".repeat(MAX_ERROR_LINE_CHARS + 1));
        assert!(cut.starts_with(&"é".repeat(EXCERPT_HEAD_CHARS)), "{cut}");
        assert!(cut.ends_with(&"é".repeat(EXCERPT_TAIL_CHARS)), "{cut}");
    }
}
