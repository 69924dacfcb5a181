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
//! rejected by [`ConstraintState::commit`] with the state left unchanged.

#![warn(missing_docs)]

pub mod error;
pub mod gbnf;
mod llg;
mod machine;
pub mod schema;
mod vocab;

use std::sync::Arc;
use std::time::Duration;

use llguidance::api::TopLevelGrammar;
use llguidance::{JsonCompileOptions, ParserFactory};
use nextok_core::constraint::{ConstraintState, ConstraintStatus, TokenBitset};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

pub use error::{ConstraintError, ConstraintErrorKind, LimitKind};
pub use llg::LlguidanceBaseline;
pub use schema::{json_text_for_mask, Handling, KeywordUse, SchemaMode, SchemaReport, Validation};
pub use vocab::ConstraintVocab;

use llg::LlgState;
use machine::{ByteDfa, ChoiceTrie, Machine, DEAD, ENDED};

/// The exact llguidance version this crate wraps.
pub const LLGUIDANCE_VERSION: &str = "1.9.1";

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
/// [`ConstraintErrorKind::Limit`] error naming it. The llguidance limits are its `ParserLimits`.
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
    /// Objects in a JSON schema beyond which the validator for the check after generation is
    /// not built (its build grows faster than linearly along long `$ref` chains): a strict
    /// schema then reports its outputs as not checked; a relaxed one is refused.
    pub max_validator_objects: usize,
}

impl Default for Limits {
    fn default() -> Self {
        let l = llguidance::api::ParserLimits::default();
        Limits {
            max_compile_time: Some(Duration::from_secs(10)),
            max_states: 1_000_000,
            max_dfa_states: 256,
            mask_cache_bytes: 64 << 20,
            max_items_in_row: l.max_items_in_row,
            initial_lexer_fuel: l.initial_lexer_fuel,
            step_lexer_fuel: l.step_lexer_fuel,
            step_max_items: l.step_max_items,
            max_lexer_states: l.max_lexer_states,
            max_grammar_size: l.max_grammar_size,
            max_rules: 5_000,
            max_schema_objects: 20_000,
            max_validator_objects: 10_000,
        }
    }
}

/// The stack of the thread that compiles a constraint: compilation (nextok's GBNF converter and
/// llguidance's grammar and schema compilers) is recursive, and within [`Limits::max_rules`]
/// and [`Limits::max_schema_objects`] it needs far less than this (measured: a chain of 10,000
/// rules or 7,000 `$ref`s fits in a quarter of it). Only the pages touched are committed.
pub const COMPILE_STACK_BYTES: usize = 256 << 20;

/// Checks the size limits that bound the recursion depth of compiling `spec`.
fn check_depth(spec: &ConstraintSpec, limits: &Limits) -> Result<(), ConstraintError> {
    let (count, max, kind, what) = match spec {
        ConstraintSpec::Grammar { lark } => (
            lark_rule_count(lark),
            limits.max_rules,
            LimitKind::Rules,
            "the grammar defines",
        ),
        ConstraintSpec::Gbnf { gbnf } => (
            gbnf_rule_count(gbnf),
            limits.max_rules,
            LimitKind::Rules,
            "the grammar defines",
        ),
        ConstraintSpec::JsonSchema { schema, .. } => (
            object_count(schema, limits.max_schema_objects + 1),
            limits.max_schema_objects,
            LimitKind::SchemaObjects,
            "the schema has",
        ),
        _ => return Ok(()),
    };
    if count > max {
        let unit = match kind {
            LimitKind::SchemaObjects => "objects",
            _ => "rules",
        };
        let shown = if kind == LimitKind::SchemaObjects {
            format!("more than {max}")
        } else {
            count.to_string()
        };
        return Err(ConstraintError::limit_exceeded(
            kind,
            format!("{what} {shown} {unit}, the limit is {max}"),
        ));
    }
    Ok(())
}

/// Lines that start a Lark rule or terminal definition (`name:`, `?name:`, `NAME.2:`,
/// `name{x}:`); continuation lines start with `|`.
fn lark_rule_count(src: &str) -> usize {
    src.lines()
        .filter(|l| {
            let l = l.trim_start().trim_start_matches(['?', '!']);
            let name_end = l
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(l.len());
            if name_end == 0 || l.starts_with(|c: char| c.is_ascii_digit()) {
                return false;
            }
            let rest = &l[name_end..];
            let rest = rest.trim_start_matches(|c: char| {
                c == '.' || c == '-' || c.is_ascii_digit() || c == ' ' || c == '\t'
            });
            let rest = match rest.strip_prefix('{') {
                Some(r) => r.split_once('}').map_or("", |x| x.1).trim_start(),
                None => rest,
            };
            rest.starts_with(':')
        })
        .count()
}

/// Occurrences of `::=` (each GBNF rule has one).
fn gbnf_rule_count(src: &str) -> usize {
    src.matches("::=").count()
}

/// JSON objects in `v`, counting at most to `cap` (iterative: a deep value cannot overflow).
fn object_count(v: &Value, cap: usize) -> usize {
    let mut n = 0usize;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(m) => {
                n += 1;
                if n >= cap {
                    return n;
                }
                stack.extend(m.values());
            }
            Value::Array(a) => stack.extend(a.iter()),
            _ => {}
        }
    }
    n
}

/// Compiles constraints for one vocabulary. Build once per tokenizer and share it.
pub struct ConstraintEngine {
    vocab: Arc<ConstraintVocab>,
    factory: ParserFactory,
    limits: Limits,
}

impl std::fmt::Debug for ConstraintEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintEngine")
            .field("vocab", &self.vocab)
            .field("limits", &self.limits)
            .finish()
    }
}

impl ConstraintEngine {
    /// An engine over `vocab` with default [`Limits`].
    pub fn new(vocab: Arc<ConstraintVocab>) -> Result<ConstraintEngine, ConstraintError> {
        let mut factory = ParserFactory::new_simple(vocab.tok_env()).map_err(llg::engine_error)?;
        factory.quiet();
        Ok(ConstraintEngine {
            vocab,
            factory,
            limits: Limits::default(),
        })
    }

    /// Replaces the limits.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The vocabulary.
    pub fn vocab(&self) -> &Arc<ConstraintVocab> {
        &self.vocab
    }

    /// llguidance run directly on `spec`, without nextok's wrapper: the baseline that the mask
    /// benchmark measures the wrapper against. `choice` runs as a Lark alternation of the
    /// strings; the other kinds use the grammar that [`ConstraintEngine::compile`] hands to
    /// llguidance (llguidance's default limits apply).
    pub fn llguidance_baseline(
        &self,
        spec: &ConstraintSpec,
    ) -> Result<LlguidanceBaseline, ConstraintError> {
        let grammar = match (spec, self.llguidance_grammar(spec)?) {
            (_, Some(g)) => g,
            (ConstraintSpec::Choice { choices }, None) => {
                let alts: Vec<String> = choices
                    .iter()
                    .map(|c| Value::String(c.clone()).to_string())
                    .collect();
                TopLevelGrammar::from_lark(format!("start: {}\n", alts.join(" | ")))
            }
            (_, None) => return Err(ConstraintError::engine("no llguidance grammar")),
        };
        LlguidanceBaseline::new(&self.factory, grammar)
    }

    /// The llguidance grammar for a spec handled by llguidance (`None` for `choice`).
    fn llguidance_grammar(
        &self,
        spec: &ConstraintSpec,
    ) -> Result<Option<TopLevelGrammar>, ConstraintError> {
        Ok(match spec {
            ConstraintSpec::Choice { .. } => None,
            ConstraintSpec::Regex { pattern } => Some(TopLevelGrammar::from_regex(pattern)),
            ConstraintSpec::JsonSchema { schema, options } => {
                let p = schema::prepare(schema, options.schema_mode)?;
                Some(TopLevelGrammar::from_json_schema(json_with_options(
                    p.schema, options,
                )?))
            }
            ConstraintSpec::Json { options } => Some(TopLevelGrammar::from_json_schema(
                json_with_options(Value::Object(Default::default()), options)?,
            )),
            ConstraintSpec::Grammar { lark } => Some(TopLevelGrammar::from_lark(lark.clone())),
            ConstraintSpec::Gbnf { gbnf } => Some(TopLevelGrammar::from_lark(gbnf::to_lark(gbnf)?)),
        })
    }

    /// Compiles a constraint, on a thread with a [`COMPILE_STACK_BYTES`] stack after checking
    /// the limits that bound the depth of compilation ([`Limits::max_rules`],
    /// [`Limits::max_schema_objects`]).
    pub fn compile(
        &self,
        spec: &ConstraintSpec,
    ) -> Result<Arc<CompiledConstraint>, ConstraintError> {
        check_depth(spec, &self.limits)?;
        std::thread::scope(|s| {
            match std::thread::Builder::new()
                .name("nextok-compile".into())
                .stack_size(COMPILE_STACK_BYTES)
                .spawn_scoped(s, || self.compile_here(spec))
            {
                Ok(h) => h.join().unwrap_or_else(|_| {
                    Err(ConstraintError::engine(
                        "the constraint compiler failed (panicked)",
                    ))
                }),
                // no thread to be had: compile here (within the limits above)
                Err(_) => self.compile_here(spec),
            }
        })
    }

    fn compile_here(
        &self,
        spec: &ConstraintSpec,
    ) -> Result<Arc<CompiledConstraint>, ConstraintError> {
        let t0 = std::time::Instant::now();
        let hash = spec.hash();
        let own_dfa = match spec {
            ConstraintSpec::Regex { pattern } => {
                ByteDfa::build(pattern, self.limits.max_dfa_states)
            }
            _ => None,
        };
        let mut check = None;
        let backend = match spec {
            ConstraintSpec::JsonSchema { schema, options } => {
                let (m, c) = self.compile_schema(schema, options)?;
                check = Some(c);
                Backend::Llg(Box::new(m))
            }
            ConstraintSpec::Choice { choices } => {
                let t = ChoiceTrie::new(choices, self.limits.max_states)?;
                Backend::Own(Machine::choice(
                    t,
                    &self.vocab,
                    self.limits.mask_cache_bytes,
                ))
            }
            ConstraintSpec::Regex { pattern } if own_dfa.is_some() => {
                let d = own_dfa.expect("matched above");
                Backend::Own(Machine::dfa(d, &self.vocab, self.limits.mask_cache_bytes))
            }
            _ => {
                let input = match spec {
                    ConstraintSpec::Regex { .. } => "regex",
                    ConstraintSpec::JsonSchema { .. } => "json_schema",
                    ConstraintSpec::Json { .. } => "json",
                    ConstraintSpec::Gbnf { .. } => "gbnf",
                    _ => "grammar",
                };
                let g = self
                    .llguidance_grammar(spec)?
                    .expect("llguidance kinds have a grammar");
                let (m, _) = llg::compile(&self.factory, g, &self.limits, input)?;
                Backend::Llg(Box::new(m))
            }
        };
        let elapsed = t0.elapsed();
        if let Some(max) = self.limits.max_compile_time {
            if elapsed > max {
                return Err(ConstraintError::limit_exceeded(
                    LimitKind::CompileTime,
                    format!("compiling took {elapsed:?}, limit {max:?}"),
                ));
            }
        }
        Ok(Arc::new(CompiledConstraint {
            kind: spec.kind(),
            hash,
            vocab: self.vocab.clone(),
            backend,
            compile_time: elapsed,
            schema: check,
        }))
    }

    /// Compiles a JSON schema under its [`SchemaMode`]: in relaxed mode, a keyword llguidance
    /// refuses is relaxed and compilation retried (a few rounds at most).
    fn compile_schema(
        &self,
        original: &Value,
        o: &JsonOptions,
    ) -> Result<(llguidance::Matcher, schema::SchemaCheck), ConstraintError> {
        let mode = o.schema_mode;
        let mut p = schema::prepare(original, mode)?;
        let mut opts = o.clone();
        if opts.coerce_one_of {
            schema::relax_refused(&mut p, "oneOf");
        }
        for _ in 0..8 {
            let g = TopLevelGrammar::from_json_schema(json_with_options(p.schema.clone(), &opts)?);
            match llg::compile(&self.factory, g, &self.limits, "json_schema") {
                Ok((m, _)) => {
                    let max = self.limits.max_validator_objects;
                    let objects = object_count(original, max + 1);
                    let check = schema::finish(original, p, mode, objects <= max);
                    if mode == SchemaMode::Relaxed
                        && !check.report.post_validation.is_empty()
                        && check.report.validator_error.is_some()
                    {
                        return Err(ConstraintError::limit_exceeded(
                            LimitKind::ValidatorObjects,
                            format!(
                                "the schema has more than {max} objects: relaxed keywords could \
                                 not be checked after generation"
                            ),
                        ));
                    }
                    return Ok((m, check));
                }
                Err(e) if e.kind() == ConstraintErrorKind::Unsupported => {
                    let keyword = e.keyword().unwrap_or_default();
                    if mode == SchemaMode::Relaxed {
                        let (changed, coerce) = schema::relax_refused(&mut p, keyword);
                        if coerce && !opts.coerce_one_of {
                            opts.coerce_one_of = true;
                            continue;
                        }
                        if changed && !coerce {
                            continue;
                        }
                    }
                    return Err(unsupported_at(original, &e, mode));
                }
                Err(e) if e.kind() == ConstraintErrorKind::Syntax => {
                    if mode == SchemaMode::Relaxed
                        && e.message().contains("regex parse error")
                        && schema::relax_patterns(&mut p, |rx| self.regex_refused(rx))
                    {
                        continue;
                    }
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(ConstraintError::engine(
            "relaxing the schema did not converge",
        ))
    }
}

impl ConstraintEngine {
    /// Whether llguidance refuses `rx` as a JSON-schema `pattern`.
    fn regex_refused(&self, rx: &str) -> bool {
        let g = TopLevelGrammar::from_json_schema(serde_json::json!({
            "type": "string",
            "pattern": rx,
        }));
        llg::compile(&self.factory, g, &self.limits, "json_schema").is_err()
    }
}

/// An llguidance refusal (an unsupported-keyword error) with the JSON pointer of the keyword
/// added.
fn unsupported_at(schema: &Value, refusal: &ConstraintError, mode: SchemaMode) -> ConstraintError {
    let keyword = refusal.keyword().unwrap_or_default();
    let message = refusal.message();
    let first = keyword.split(", ").next().unwrap_or("");
    let first = if first == "minProperties/maxProperties" {
        ["minProperties", "maxProperties"]
            .into_iter()
            .find(|k| schema::keyword_pointer(schema, k).is_some())
            .unwrap_or("minProperties")
    } else {
        first
    };
    let pointer = schema::keyword_pointer(schema, first);
    let place = match &pointer {
        Some(p) if p.is_empty() => " at `/`".to_string(),
        Some(p) => format!(" at `{p}`"),
        None => String::new(),
    };
    let hint = if mode == SchemaMode::Strict && first != "$ref" {
        "; schema_mode relaxed masks a superset and checks it after generation"
    } else {
        ""
    };
    let mut e = ConstraintError::unsupported(keyword, format!("{message}{place}{hint}"));
    if let Some(p) = pointer {
        e = e.at_pointer(p);
    }
    match refusal.shared_source() {
        Some(s) => e.with_shared_source(s),
        None => e,
    }
}

fn json_with_options(mut schema: Value, o: &JsonOptions) -> Result<Value, ConstraintError> {
    let mut opts = JsonCompileOptions {
        coerce_one_of: o.coerce_one_of,
        ..Default::default()
    };
    if o.compact {
        opts.whitespace_flexible = false;
        opts.item_separator = ",".into();
        opts.key_separator = ":".into();
    }
    match &mut schema {
        Value::Object(_) => opts.apply_to(&mut schema),
        Value::Bool(true) => {
            schema = Value::Object(Default::default());
            opts.apply_to(&mut schema);
        }
        Value::Bool(false) => {
            return Err(ConstraintError::unsatisfiable(
                "the schema `false` admits no value",
            ))
        }
        _ => {
            return Err(ConstraintError::syntax(
                "json_schema",
                "top level",
                "a schema must be an object or a boolean",
            ))
        }
    }
    Ok(schema)
}

enum Backend {
    Own(Machine),
    Llg(Box<llguidance::Matcher>),
}

/// A compiled constraint: immutable, `Send + Sync`; share it with `Arc` and start a
/// [`SequenceState`] per sequence with [`CompiledConstraint::start`].
pub struct CompiledConstraint {
    kind: &'static str,
    hash: [u8; 32],
    vocab: Arc<ConstraintVocab>,
    backend: Backend,
    compile_time: Duration,
    /// `json_schema` only: the keyword report and the post-generation validator.
    schema: Option<schema::SchemaCheck>,
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
        let inner = match &self.backend {
            Backend::Own(m) => Inner::Own {
                state: m.start(),
                history: Vec::new(),
            },
            Backend::Llg(m) => Inner::Llg(Box::new(LlgState {
                matcher: (**m).clone(),
                last_mask: None,
            })),
        };
        let mut s = SequenceState {
            compiled: self.clone(),
            inner,
            token_lens: Vec::new(),
            bytes: Vec::new(),
            status: ConstraintStatus::Running,
        };
        s.refresh_status();
        s
    }
}

#[derive(Clone)]
enum Inner {
    Own { state: u32, history: Vec<u32> },
    Llg(Box<LlgState>),
}

/// The constraint state of one sequence (implements [`ConstraintState`]). Forking clones it;
/// the compiled constraint is shared.
#[derive(Clone)]
pub struct SequenceState {
    compiled: Arc<CompiledConstraint>,
    inner: Inner,
    /// Byte length of each committed token (EOS: 0).
    token_lens: Vec<u32>,
    /// All committed bytes.
    bytes: Vec<u8>,
    status: ConstraintStatus,
}

impl std::fmt::Debug for SequenceState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SequenceState")
            .field("kind", &self.compiled.kind)
            .field("tokens", &self.token_lens.len())
            .field("status", &self.status)
            .finish()
    }
}

impl SequenceState {
    /// The compiled constraint this state runs.
    pub fn compiled(&self) -> &Arc<CompiledConstraint> {
        &self.compiled
    }

    /// The bytes committed so far.
    pub fn committed_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Number of committed tokens.
    pub fn num_tokens(&self) -> usize {
        self.token_lens.len()
    }

    /// Whether `token` is allowed now (without committing it).
    pub fn allows(&mut self, token: u32) -> Result<bool, ConstraintError> {
        let vocab = &self.compiled.vocab;
        if token as usize >= vocab.vocab_size() {
            return Ok(false);
        }
        match (&self.compiled.backend, &mut self.inner) {
            (Backend::Own(m), Inner::Own { state, .. }) => {
                if vocab.is_eos(token) {
                    return Ok(m.accepting(*state) || *state == ENDED);
                }
                if vocab.is_special(token) || *state >= ENDED {
                    return Ok(false);
                }
                let b = vocab.token_bytes(token).unwrap_or(&[]);
                Ok(!b.is_empty() && m.run(*state, b) != DEAD)
            }
            (_, Inner::Llg(l)) => {
                if l.last_mask.is_none() {
                    let m = l
                        .matcher
                        .compute_mask_or_eos()
                        .map_err(|e| l.step_error(e))?;
                    l.last_mask = Some(m);
                }
                let m = l.last_mask.as_ref().expect("set above");
                let t = if vocab.is_eos(token) {
                    vocab.eos_token_ids()[0]
                } else {
                    token
                };
                Ok(m.is_allowed(t))
            }
            _ => unreachable!("backend and state kinds match"),
        }
    }

    fn refresh_status(&mut self) {
        self.status = match (&self.compiled.backend, &mut self.inner) {
            (Backend::Own(m), Inner::Own { state, .. }) => match *state {
                DEAD => ConstraintStatus::Dead,
                ENDED => ConstraintStatus::OnlyEnd,
                s => match (m.accepting(s), m.can_continue(s)) {
                    (true, true) => ConstraintStatus::Accepted,
                    (true, false) => ConstraintStatus::OnlyEnd,
                    (false, true) => ConstraintStatus::Running,
                    (false, false) => ConstraintStatus::Dead,
                },
            },
            (_, Inner::Llg(l)) => {
                if l.matcher.is_error() {
                    ConstraintStatus::Dead
                } else if l.matcher.is_stopped() {
                    ConstraintStatus::OnlyEnd
                } else if l.matcher.is_accepting().unwrap_or(false) {
                    ConstraintStatus::Accepted
                } else {
                    ConstraintStatus::Running
                }
            }
            _ => unreachable!("backend and state kinds match"),
        };
    }

    /// Fills `allowed` (ORs into it; the caller clears it) — the typed-error form of
    /// [`ConstraintState::fill_mask`].
    pub fn fill(&mut self, allowed: &mut TokenBitset) -> Result<(), ConstraintError> {
        let vocab = &self.compiled.vocab;
        let words = nextok_core::constraint::bitset_words(vocab.vocab_size());
        if allowed.len() < words {
            return Err(ConstraintError::invalid(
                "allowed",
                format!(
                    "bitset has {} words, the vocabulary needs {words}",
                    allowed.len()
                ),
            ));
        }
        match (&self.compiled.backend, &mut self.inner) {
            (Backend::Own(m), Inner::Own { state, .. }) => {
                m.fill(*state, vocab, &mut allowed[..words]);
                Ok(())
            }
            (_, Inner::Llg(l)) => {
                let mask = l
                    .matcher
                    .compute_mask_or_eos()
                    .map_err(|e| l.step_error(e))?;
                let src = mask.as_slice();
                let pairs = src.chunks_exact(2);
                let rest = pairs.remainder();
                let full = (src.len() / 2).min(words);
                for (w, p) in allowed[..full].iter_mut().zip(pairs) {
                    *w |= p[0] as u64 | ((p[1] as u64) << 32);
                }
                if full < words {
                    if let Some(&lo) = rest.first() {
                        allowed[full] |= lo as u64;
                    }
                }
                let eos = vocab.eos_token_ids();
                if mask.is_allowed(eos[0]) {
                    for &e in &eos[1..] {
                        allowed[(e / 64) as usize] |= 1u64 << (e % 64);
                    }
                }
                // Bits past the vocabulary (llguidance's mask may be longer) stay clear.
                let n = vocab.vocab_size();
                if !n.is_multiple_of(64) {
                    allowed[words - 1] &= (1u64 << (n % 64)) - 1;
                }
                l.last_mask = Some(mask);
                Ok(())
            }
            _ => unreachable!("backend and state kinds match"),
        }
    }

    /// Consumes `token` — the typed-error form of [`ConstraintState::commit`]. A token that is
    /// not allowed is rejected and the state is left unchanged.
    pub fn consume(&mut self, token: u32) -> Result<(), ConstraintError> {
        if !self.allows(token)? {
            let vocab = &self.compiled.vocab;
            let why = if token as usize >= vocab.vocab_size() {
                format!("out of range (vocab_size {})", vocab.vocab_size())
            } else if self.status == ConstraintStatus::OnlyEnd && !vocab.is_eos(token) {
                "the output is complete; only EOS may follow".to_string()
            } else if vocab.is_eos(token) {
                "EOS before the output is complete".to_string()
            } else if vocab.is_special(token) {
                "special tokens never match constraint text".to_string()
            } else {
                "its bytes do not continue any legal output".to_string()
            };
            return Err(ConstraintError::rejected(token, why));
        }
        let vocab = self.compiled.vocab.clone();
        let is_eos = vocab.is_eos(token);
        let tb: &[u8] = if is_eos {
            &[]
        } else {
            vocab.token_bytes(token).unwrap_or(&[])
        };
        match (&self.compiled.backend, &mut self.inner) {
            (Backend::Own(m), Inner::Own { state, history }) => {
                history.push(*state);
                *state = if is_eos { ENDED } else { m.run(*state, tb) };
            }
            (_, Inner::Llg(l)) => {
                let t = if is_eos {
                    vocab.eos_token_ids()[0]
                } else {
                    token
                };
                l.last_mask = None;
                if let Err(e) = l.matcher.consume_token(t) {
                    return Err(llg::engine_error(e));
                }
            }
            _ => unreachable!("backend and state kinds match"),
        }
        self.token_lens.push(tb.len() as u32);
        self.bytes.extend_from_slice(tb);
        self.refresh_status();
        Ok(())
    }

    /// Undoes the last `k` tokens — the typed-error form of [`ConstraintState::rollback`].
    pub fn undo(&mut self, k: usize) -> Result<(), ConstraintError> {
        if k > self.token_lens.len() {
            return Err(ConstraintError::invalid(
                "rollback",
                format!("{k} tokens requested, {} committed", self.token_lens.len()),
            ));
        }
        if k == 0 {
            return Ok(());
        }
        match &mut self.inner {
            Inner::Own { state, history } => {
                *state = history[history.len() - k];
                history.truncate(history.len() - k);
            }
            Inner::Llg(l) => {
                l.last_mask = None;
                l.matcher.rollback(k).map_err(llg::engine_error)?;
            }
        }
        let n = self.token_lens.len() - k;
        let removed: usize = self.token_lens[n..].iter().map(|&x| x as usize).sum();
        self.token_lens.truncate(n);
        self.bytes.truncate(self.bytes.len() - removed);
        self.refresh_status();
        Ok(())
    }

    /// The bytes forced next.
    pub fn forced(&mut self) -> Vec<u8> {
        match (&self.compiled.backend, &mut self.inner) {
            (Backend::Own(m), Inner::Own { state, .. }) => m.forced(*state),
            (_, Inner::Llg(l)) => l.matcher.compute_ff_bytes(),
            _ => unreachable!("backend and state kinds match"),
        }
    }

    /// The engine error that killed the state, if any.
    pub fn engine_error(&self) -> Option<String> {
        match &self.inner {
            Inner::Llg(l) => l.error(),
            Inner::Own { .. } => None,
        }
    }
}

impl ConstraintState for SequenceState {
    fn fill_mask(&mut self, allowed: &mut TokenBitset) -> nextok_core::Result<()> {
        self.fill(allowed).map_err(Into::into)
    }

    fn commit(&mut self, token: u32) -> nextok_core::Result<()> {
        self.consume(token).map_err(Into::into)
    }

    fn status(&self) -> ConstraintStatus {
        self.status
    }

    fn fork(&self) -> Box<dyn ConstraintState> {
        Box::new(self.clone())
    }

    fn rollback(&mut self, k: usize) -> nextok_core::Result<()> {
        self.undo(k).map_err(Into::into)
    }

    fn forced_bytes(&mut self) -> Vec<u8> {
        self.forced()
    }

    /// `kind:spec-hash:state-hash` — equal for states of the same compiled constraint that
    /// committed the same bytes (however they were tokenized).
    fn digest(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.compiled.hash);
        h.update(&self.bytes);
        h.update([matches!(self.status, ConstraintStatus::OnlyEnd) as u8]);
        let d: [u8; 32] = h.finalize().into();
        format!(
            "{}:{}:{}",
            self.compiled.kind,
            hex8(&self.compiled.hash),
            hex8(&d)
        )
    }
}

fn hex8(b: &[u8]) -> String {
    b[..8].iter().map(|x| format!("{x:02x}")).collect()
}

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
