//! The constraint specification: what the output must match ([`ConstraintSpec`], chosen per
//! request, with its JSON options [`JsonOptions`]) and the [`Limits`] that bound compiling and
//! running it. Plain data: serialisable, hashable into the digest of the compiled constraint.

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use nextok_core::constraint::spec::{ConstraintSpec, JsonOptions};

/// Limits on compile time, automaton size and per-step work. Exceeding one is a
/// [`ConstraintErrorKind::Limit`](crate::ConstraintErrorKind::Limit) error naming it. The llguidance limits are its `ParserLimits`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Wall-clock compile time; checked when compilation ends (the fuel limits below bound the
    /// work itself). `None`: no limit.
    pub max_compile_time: Option<Duration>,
    /// Maximum states of a `choice` trie.
    pub max_states: usize,
    /// Regexes whose DFA has at most this many states run on nextok's own DFA; larger ones go
    /// to llguidance.
    pub max_dfa_states: usize,
    /// Memory for cached per-state masks of nextok's own automata, per compiled constraint.
    pub mask_cache_bytes: usize,
    /// llguidance: maximum Earley items in one row.
    pub max_items_in_row: usize,
    /// llguidance: work to build the initial lexer (compile time).
    pub initial_lexer_fuel: u64,
    /// llguidance: lexer work for one mask.
    pub step_lexer_fuel: u64,
    /// llguidance: Earley items for one mask.
    pub step_max_items: usize,
    /// llguidance: lexer states.
    pub max_lexer_states: usize,
    /// llguidance: grammar size in symbols.
    pub max_grammar_size: usize,
    /// Rules of a GBNF or Lark grammar. Compilation recurses along chains of rule references
    /// (`r0 ::= r1`, `r1 ::= r2`, …), so the number of rules bounds its depth; checked before
    /// compiling.
    pub max_rules: usize,
    /// Objects (subschemas and their keyword maps) in a JSON schema: compilation recurses along
    /// `$ref` chains and nesting, so the object count bounds its depth; checked before
    /// compiling.
    pub max_schema_objects: usize,
    /// Nesting depth of objects and arrays in a JSON schema (the root object is depth 1);
    /// checked before compiling, without recursion. Real schemas stay far below the default
    /// (64): the deepest of 1,131 real-world schemas nests 26 deep.
    pub max_schema_depth: usize,
    /// Objects in a JSON schema beyond which the validator for the check after generation is
    /// not built (its build grows faster than linearly along long `$ref` chains): a strict
    /// schema then reports its outputs as not checked; a relaxed one is refused.
    pub max_validator_objects: usize,
}

impl Default for Limits {
    fn default() -> Self {
        let mut l = Limits {
            max_compile_time: Some(Duration::from_secs(10)),
            max_states: 1_000_000,
            max_dfa_states: 256,
            mask_cache_bytes: 64 << 20,
            // llguidance's own limits: its defaults, set just below
            max_items_in_row: 0,
            initial_lexer_fuel: 0,
            step_lexer_fuel: 0,
            step_max_items: 0,
            max_lexer_states: 0,
            max_grammar_size: 0,
            max_rules: 5_000,
            max_schema_objects: 20_000,
            max_schema_depth: 64,
            max_validator_objects: 10_000,
        };
        crate::llg::set_default_parser_limits(&mut l);
        l
    }
}
