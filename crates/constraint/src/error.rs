//! Typed errors of the constraint engine.
//!
//! Every error that a request can cause names its place: the keyword a JSON schema uses that the
//! engine does not support, the line and column of a malformed GBNF rule, the limit that a
//! grammar exceeded. [`ConstraintError::to_core`] maps an error onto `nextok_core::Error` for
//! the [`nextok_core::constraint::ConstraintState`] methods.

use std::fmt;

use nextok_core::ErrorKind;

/// A limit of the engine (see [`crate::Limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// Wall-clock time to compile a constraint ([`crate::Limits::max_compile_time`]).
    CompileTime,
    /// Size of the compiled grammar in symbols ([`crate::Limits::max_grammar_size`]).
    GrammarSize,
    /// Work spent building the initial lexer ([`crate::Limits::initial_lexer_fuel`]).
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
            LimitKind::ValidatorObjects => "max_validator_objects",
            LimitKind::GroupNesting => "max_group_nesting",
        }
    }
}

/// What went wrong while compiling or running a constraint.
#[derive(Debug, Clone, PartialEq)]
pub enum ConstraintError {
    /// The request itself is invalid (an empty `choice` list, a vocabulary without EOS, ...).
    Invalid {
        /// The field or input at fault.
        what: String,
        /// Why.
        message: String,
    },
    /// A grammar, regex or schema is malformed; `place` says where (`line 3, column 7`, a
    /// schema path, a rule name).
    Syntax {
        /// Which input: `regex`, `json_schema`, `grammar`, `gbnf`.
        input: &'static str,
        /// Where in it.
        place: String,
        /// What is wrong.
        message: String,
    },
    /// The input uses a feature (a JSON-schema keyword, a GBNF construct) that the engine does
    /// not support.
    Unsupported {
        /// The keyword or construct, e.g. `oneOf`, `format`, `<[token]>`.
        keyword: String,
        /// The engine's message.
        message: String,
    },
    /// The schema admits no value at all.
    Unsatisfiable {
        /// The engine's message.
        message: String,
    },
    /// A limit was exceeded.
    Limit {
        /// Which limit.
        limit: LimitKind,
        /// Details (the value reached, the configured limit).
        message: String,
    },
    /// A committed token is not allowed in the current state. The state is unchanged.
    Rejected {
        /// The token id.
        token: u32,
        /// Why.
        message: String,
    },
    /// Any other engine failure.
    Engine {
        /// The engine's message.
        message: String,
    },
}

impl ConstraintError {
    /// A short machine-readable code: `invalid`, `syntax`, `unsupported`, `unsatisfiable`,
    /// `limit`, `rejected`, `engine`.
    pub fn code(&self) -> &'static str {
        match self {
            ConstraintError::Invalid { .. } => "invalid",
            ConstraintError::Syntax { .. } => "syntax",
            ConstraintError::Unsupported { .. } => "unsupported",
            ConstraintError::Unsatisfiable { .. } => "unsatisfiable",
            ConstraintError::Limit { .. } => "limit",
            ConstraintError::Rejected { .. } => "rejected",
            ConstraintError::Engine { .. } => "engine",
        }
    }

    /// The unsupported keyword, when this is an [`ConstraintError::Unsupported`] error.
    pub fn keyword(&self) -> Option<&str> {
        match self {
            ConstraintError::Unsupported { keyword, .. } => Some(keyword),
            _ => None,
        }
    }

    /// This error as a `nextok_core::Error` (field `constraint`, or `token` for a rejection).
    pub fn to_core(&self) -> nextok_core::Error {
        let field = match self {
            ConstraintError::Rejected { .. } => "token",
            _ => "constraint",
        };
        ErrorKind::InvalidParameter {
            field: field.into(),
            reason: self.to_string(),
        }
        .into()
    }

    pub(crate) fn invalid(what: impl Into<String>, message: impl Into<String>) -> Self {
        ConstraintError::Invalid {
            what: what.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ConstraintError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConstraintError::Invalid { what, message } => write!(f, "{what}: {message}"),
            ConstraintError::Syntax {
                input,
                place,
                message,
            } => write!(f, "{input}: {place}: {message}"),
            ConstraintError::Unsupported { keyword, message } => {
                write!(f, "unsupported keyword `{keyword}`: {message}")
            }
            ConstraintError::Unsatisfiable { message } => write!(f, "unsatisfiable: {message}"),
            ConstraintError::Limit { limit, message } => {
                write!(f, "limit {} exceeded: {message}", limit.name())
            }
            ConstraintError::Rejected { token, message } => {
                write!(f, "token {token} rejected: {message}")
            }
            ConstraintError::Engine { message } => write!(f, "engine error: {message}"),
        }
    }
}

impl std::error::Error for ConstraintError {}

impl From<ConstraintError> for nextok_core::Error {
    fn from(e: ConstraintError) -> Self {
        e.to_core()
    }
}
