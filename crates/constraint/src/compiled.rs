//! The compiled constraint: immutable and `Send + Sync`, shared through `Arc` by every
//! sequence that runs it. It holds the automaton (nextok's own, or llguidance's prototype
//! matcher), the vocabulary, the spec's hash (for digests) and, for `json_schema`, the keyword
//! report and the validator for the check after generation.

use std::sync::Arc;
use std::time::Duration;

use crate::machine::Machine;
use crate::schema::{self, SchemaReport, Validation};
use crate::state::SequenceState;
use crate::ConstraintVocab;

/// Who runs the automaton.
pub(crate) enum Backend {
    /// nextok's own automaton (`choice`, small regexes).
    Own(Machine),
    /// llguidance's prototype matcher (every sequence clones it).
    Llg(Box<crate::llg::LlgProto>),
}

/// A compiled constraint: immutable, `Send + Sync`; share it with `Arc` and start a
/// [`SequenceState`] per sequence with [`CompiledConstraint::start`].
pub struct CompiledConstraint {
    pub(crate) kind: &'static str,
    /// SHA-256 of the spec's canonical form.
    pub(crate) hash: [u8; 32],
    pub(crate) vocab: Arc<ConstraintVocab>,
    pub(crate) backend: Backend,
    pub(crate) compile_time: Duration,
    /// `json_schema` only: the keyword report and the post-generation validator.
    pub(crate) schema: Option<schema::SchemaCheck>,
}

impl std::fmt::Debug for CompiledConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledConstraint")
            .field("kind", &self.kind)
            .field("engine", &self.engine())
            .field("compile_time", &self.compile_time)
            .finish()
    }
}

impl CompiledConstraint {
    /// The spec's kind (`choice`, `regex`, ...).
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// Which engine runs it: `nextok` (own automaton) or `llguidance`.
    pub fn engine(&self) -> &'static str {
        match self.backend {
            Backend::Own(_) => "nextok",
            Backend::Llg(_) => "llguidance",
        }
    }

    /// Number of automaton states (nextok's own engine only).
    pub fn num_states(&self) -> Option<usize> {
        match &self.backend {
            Backend::Own(m) => Some(m.num_states()),
            Backend::Llg(_) => None,
        }
    }

    /// An estimate of the heap memory this compiled constraint holds, in bytes, for a cache
    /// to bound what it keeps: the automaton and its cached masks (nextok's own engine, at most
    /// [`Limits::mask_cache_bytes`](crate::Limits::mask_cache_bytes) of masks), or llguidance's
    /// lexer tables (its own estimate; they grow as sequences reach new lexer states, up to
    /// [`Limits::max_lexer_states`](crate::Limits::max_lexer_states)), plus the schema kept for
    /// the check after generation. Not counted: the vocabulary (shared by every constraint of
    /// the engine) and the sequences' own states. It may grow while sequences run: read it
    /// again before evicting.
    pub fn estimated_bytes(&self) -> usize {
        let backend = match &self.backend {
            Backend::Own(m) => m.estimated_bytes(),
            Backend::Llg(p) => p.lexer_bytes(),
        };
        backend + self.schema.as_ref().map_or(0, |c| c.estimated_bytes())
    }

    /// llguidance only: the lexer states built so far (shared by every sequence; at most
    /// [`Limits::max_lexer_states`](crate::Limits::max_lexer_states)). `None` for nextok's own
    /// engine.
    pub fn lexer_states(&self) -> Option<usize> {
        match &self.backend {
            Backend::Own(_) => None,
            Backend::Llg(p) => Some(p.lexer_states()),
        }
    }

    /// How long compiling took.
    pub fn compile_time(&self) -> Duration {
        self.compile_time
    }

    /// The vocabulary it was compiled for.
    pub fn vocab(&self) -> &Arc<ConstraintVocab> {
        &self.vocab
    }

    /// `json_schema` only: which keywords the mask enforces and which are checked after
    /// generation.
    pub fn schema_report(&self) -> Option<&SchemaReport> {
        self.schema.as_ref().map(|c| &c.report)
    }

    /// `json_schema` only: validates a finished output against the full schema (every
    /// keyword, formats asserted). `None` for other kinds.
    pub fn validate_output(&self, text: &[u8]) -> Option<Validation> {
        self.schema.as_ref().map(|c| c.validate(text))
    }

    /// A fresh state for one sequence.
    pub fn start(self: &Arc<Self>) -> SequenceState {
        SequenceState::start(self)
    }
}
