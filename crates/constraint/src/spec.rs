//! The constraint specification: what the output must match ([`ConstraintSpec`], chosen per
//! request, with its JSON options [`JsonOptions`]) and the [`Limits`] that bound compiling and
//! running it. Plain data: serialisable, hashable into the digest of the compiled constraint.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::property_order::PropertyOrder;
use crate::schema::SchemaMode;

/// Options for JSON output (`json_schema` and `json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JsonOptions {
    /// No whitespace between tokens (`{"a":1,"b":[2,3]}`) instead of any JSON whitespace.
    pub compact: bool,
    /// Treat `oneOf` as `anyOf` (accepts values matching more than one branch). Off by default:
    /// `oneOf` is then an unsupported keyword.
    pub coerce_one_of: bool,
    /// What to do with keywords the mask cannot enforce exactly ([`SchemaMode`]; `json_schema`
    /// only). Left out of the canonical form when strict, so strict specs hash as before.
    #[serde(skip_serializing_if = "SchemaMode::is_strict")]
    pub schema_mode: SchemaMode,
    /// How an object's properties may be ordered ([`PropertyOrder`]; `json_schema` only).
    /// Unset: `any` in relaxed mode (which promises to lose no valid instance), `schema` in
    /// strict mode. Left out of the canonical form when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub property_order: Option<PropertyOrder>,
}

impl JsonOptions {
    /// The property order in force: the one set, else `any` in relaxed mode and `schema` in
    /// strict mode.
    pub fn effective_property_order(&self) -> PropertyOrder {
        self.property_order.unwrap_or(match self.schema_mode {
            SchemaMode::Relaxed => PropertyOrder::Any,
            SchemaMode::Strict => PropertyOrder::Schema,
        })
    }
}

/// What the output must match, chosen per request. JSON form: `{"type": "choice", "choices":
/// [...]}`, `{"type": "regex", "pattern": ...}`, `{"type": "json_schema", "schema": {...}}`,
/// `{"type": "json"}`, `{"type": "grammar", "lark": ...}`, `{"type": "gbnf", "gbnf": ...}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ConstraintSpec {
    /// Exactly one of these strings.
    Choice {
        /// The strings.
        choices: Vec<String>,
    },
    /// A full match of a regular expression (Rust `regex` syntax).
    Regex {
        /// The pattern.
        pattern: String,
    },
    /// A JSON value valid against a JSON schema.
    JsonSchema {
        /// The schema.
        schema: Value,
        /// Whitespace and `oneOf` options.
        #[serde(default)]
        options: JsonOptions,
    },
    /// Any JSON value.
    Json {
        /// Whitespace options.
        #[serde(default)]
        options: JsonOptions,
    },
    /// A Lark-style EBNF grammar (llguidance's dialect; the start rule is `start`).
    Grammar {
        /// The grammar text.
        lark: String,
    },
    /// A llama.cpp GBNF grammar (the start rule is `root`).
    Gbnf {
        /// The grammar text.
        gbnf: String,
    },
}

impl ConstraintSpec {
    /// The kind's name: `choice`, `regex`, `json_schema`, `json`, `grammar`, `gbnf`.
    pub fn kind(&self) -> &'static str {
        match self {
            ConstraintSpec::Choice { .. } => "choice",
            ConstraintSpec::Regex { .. } => "regex",
            ConstraintSpec::JsonSchema { .. } => "json_schema",
            ConstraintSpec::Json { .. } => "json",
            ConstraintSpec::Grammar { .. } => "grammar",
            ConstraintSpec::Gbnf { .. } => "gbnf",
        }
    }

    /// SHA-256 of the canonical JSON form (identifies the compiled constraint in digests).
    pub fn hash(&self) -> [u8; 32] {
        let s = serde_json::to_vec(self).unwrap_or_default();
        Sha256::digest(&s).into()
    }
}

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
