//! The constraint specification: what the output must match ([`ConstraintSpec`], chosen per
//! request, with its JSON options [`JsonOptions`]) and the [`Limits`] that bound compiling and
//! running it. Plain data: serialisable, hashable into the digest of the compiled constraint.

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use nextok_core::constraint::spec::{ConstraintSpec, JsonOptions};

/// Limits on compile work, automaton size and per-step work. Exceeding one is a
/// [`ConstraintErrorKind::Limit`](crate::ConstraintErrorKind::Limit) error naming it. The llguidance limits are its `ParserLimits`.
///
/// Compiling is bounded by work, not by time: the input's size ([`Limits::max_rules`],
/// [`Limits::max_schema_objects`], [`Limits::max_schema_depth`]), the automata's size
/// ([`Limits::max_states`], [`Limits::max_dfa_states`], [`Limits::max_grammar_size`],
/// [`Limits::max_lexer_states`]) and llguidance's fuel ([`Limits::initial_lexer_fuel`]); so
/// whether a constraint compiles does not depend on how fast or how loaded the machine is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Wall-clock compile time, off (`None`) by default. It is checked only when compilation
    /// ends, so it bounds no work (the limits below do): it only refuses a finished result,
    /// and whether it does depends on the machine's speed and load (a 1,000-object schema
    /// chain took 18.6 s on a loaded machine, against the 10 s this once defaulted to). For
    /// embedders that would rather refuse a slow compile than use it; nextok never sets it.
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
            // compilation is bounded by the work limits below, not by time
            max_compile_time: None,
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
