//! What the output of a request must match, as plain data: [`ConstraintSpec`] with its JSON
//! options ([`JsonOptions`], [`SchemaMode`], [`PropertyOrder`]). Serialisable and hashable; the
//! constraint engine (`nextok-constraint`) compiles it into token masks.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

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

/// How the keywords that the mask cannot enforce exactly are handled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SchemaMode {
    /// Refuse the schema, naming the keyword and its JSON pointer.
    #[default]
    Strict,
    /// Mask with those keywords relaxed to a superset; validate the output against the full
    /// schema after generation.
    Relaxed,
}

impl SchemaMode {
    /// `strict` or `relaxed`.
    pub fn name(self) -> &'static str {
        match self {
            SchemaMode::Strict => "strict",
            SchemaMode::Relaxed => "relaxed",
        }
    }

    /// Whether this is the default, [`SchemaMode::Strict`].
    pub fn is_strict(&self) -> bool {
        *self == SchemaMode::Strict
    }
}

impl std::str::FromStr for SchemaMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "strict" => Ok(SchemaMode::Strict),
            "relaxed" => Ok(SchemaMode::Relaxed),
            other => Err(format!("unknown schema mode `{other}` (strict, relaxed)")),
        }
    }
}

/// How a JSON-schema constraint orders an object's properties.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PropertyOrder {
    /// Schema order: declared properties in the order the schema lists them, additional
    /// properties after them (llguidance's JSON compiler; key tokens are forced; fastest).
    Schema,
    /// Any order, each key at most once, required keys present (a parametric grammar).
    Any,
}

impl PropertyOrder {
    /// `schema` or `any`.
    pub fn name(self) -> &'static str {
        match self {
            PropertyOrder::Schema => "schema",
            PropertyOrder::Any => "any",
        }
    }
}

impl std::str::FromStr for PropertyOrder {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "schema" => Ok(PropertyOrder::Schema),
            "any" => Ok(PropertyOrder::Any),
            other => Err(format!("unknown property order `{other}` (schema, any)")),
        }
    }
}
