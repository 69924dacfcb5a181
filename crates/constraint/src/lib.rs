//! # nextok-constraint
//!
//! Structured output for nextok: a byte-level constraint engine behind
//! [`nextok_core::constraint::ConstraintState`] (000 §3.4). A constraint is chosen per request
//! ([`ConstraintSpec`]), compiled once against a vocabulary ([`ConstraintEngine::compile`] →
//! [`CompiledConstraint`], immutable, `Send + Sync`, shared through `Arc`), and every sequence
//! gets its own [`SequenceState`]: it fills the allowed-token bitset, consumes the selected
//! token's bytes, reports accepted / only-end / dead / running, forks, rolls back `k` tokens,
//! reports forced bytes and a digest.
//!
//! The code by concept: `spec` (what to match, its options and limits),
//! `engine` (compiling), `compiled` (the shared compiled constraint), `state` (one sequence's
//! state), `error`, and the back ends: `machine` (nextok's own automata), `llg` (llguidance),
//! with `vocab` (the vocabulary as both see it), `schema` (the JSON-schema keyword policy) and
//! `gbnf` (GBNF to Lark).
//!
//! Kinds and who runs them:
//!
//! | kind | engine |
//! |---|---|
//! | `choice` — a finite set of strings | nextok: a trie of the choices walked against a byte trie of the vocabulary |
//! | `regex` — small (at most [`Limits::max_dfa_states`] DFA states) | nextok: a dense byte DFA walked against the vocabulary trie |
//! | `regex` — larger | llguidance |
//! | `json_schema` (draft 2020-12 as far as llguidance supports it), `json` (any value) | llguidance |
//! | `grammar` (Lark-style EBNF) | llguidance |
//! | `gbnf` (llama.cpp GBNF) | converted to Lark by [`gbnf::to_lark`], then llguidance |
//!
//! For nextok's own automata, the mask of every automaton state is cached in the compiled
//! constraint the first time it is needed (when the cache fits [`Limits::mask_cache_bytes`]),
//! so later masks — for any sequence sharing the compiled constraint — are a copy.
//!
//! JSON output allows any JSON whitespace between tokens by default (`{"a": 1, "b": [2, 3]}`
//! as Python's `json.dumps` writes it); [`JsonOptions::compact`] forbids it.
//!
//! llguidance is an implementation detail: no llguidance type appears in this crate's API
//! ([`LLGUIDANCE_VERSION`] says which version runs; [`LlguidanceBaseline`] runs it directly,
//! for benchmarks).
//!
//! Semantics at the edges: EOS ids (all of them) are allowed exactly when the output so far is
//! complete; special tokens never match constraint text; a token that is not allowed is
//! rejected by [`ConstraintState::commit`](nextok_core::constraint::ConstraintState::commit)
//! with the state left unchanged.

#![warn(missing_docs)]

mod compiled;
mod engine;
pub mod error;
pub mod gbnf;
mod llg;
mod machine;
pub mod property_order;
pub mod schema;
mod spec;
mod state;
mod vocab;

pub use compiled::CompiledConstraint;
pub use engine::{ConstraintEngine, COMPILE_STACK_BYTES};
pub use error::{ConstraintError, ConstraintErrorKind, LimitKind};
pub use llg::LlguidanceBaseline;
pub use property_order::{OrderKept, PropertyOrder};
pub use schema::{json_text_for_mask, Handling, KeywordUse, SchemaMode, SchemaReport, Validation};
pub use spec::{ConstraintSpec, JsonOptions, Limits};
pub use state::SequenceState;
pub use vocab::ConstraintVocab;

/// The exact llguidance version this crate wraps.
pub const LLGUIDANCE_VERSION: &str = "1.9.1";

#[cfg(test)]
mod send_sync {
    fn assert_send_sync<T: Send + Sync>() {}
    #[test]
    fn compiled_is_send_sync() {
        assert_send_sync::<super::CompiledConstraint>();
        assert_send_sync::<super::ConstraintEngine>();
        fn assert_send<T: Send>() {}
        assert_send::<super::SequenceState>();
    }
}
