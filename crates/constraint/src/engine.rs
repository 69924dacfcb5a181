//! The constraint engine: [`ConstraintEngine`] holds a vocabulary and the [`Limits`], and
//! compiles a [`ConstraintSpec`] into a [`CompiledConstraint`] — on nextok's own automata
//! (`choice`, small regexes) or on llguidance (the rest) — after checking the limits that bound
//! the depth of compilation, on a thread with a large stack.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{JsonCompileOptions, ParserFactory};
use serde_json::Value;

use crate::compiled::{Backend, CompiledConstraint};
use crate::error::{ConstraintError, ConstraintErrorKind, LimitKind};
use crate::llg::{self, LlguidanceBaseline};
use crate::machine::{ByteDfa, ChoiceTrie, Machine};
use crate::property_order::{self, OrderKept, PropertyOrder};
use crate::schema::{self, SchemaMode};
use crate::spec::{ConstraintSpec, JsonOptions, Limits};
use crate::{gbnf, ConstraintVocab};

/// The stack of the thread that compiles a constraint: compilation (nextok's GBNF converter and
/// llguidance's grammar and schema compilers) is recursive, and within [`Limits::max_rules`]
/// and [`Limits::max_schema_objects`] it needs far less than this (measured: a chain of 10,000
/// rules or 7,000 `$ref`s fits in a quarter of it). Only the pages touched are committed.
pub const COMPILE_STACK_BYTES: usize = 256 << 20;

/// Runs `f` on a thread with a [`COMPILE_STACK_BYTES`] stack (compiling a constraint, building
/// and running the check after generation: all recursive), or here when no thread can be had
/// (within the limits that bound the depth). `None` when `f` panicked.
pub(crate) fn on_compile_stack<T: Send>(name: &str, f: impl Fn() -> T + Sync) -> Option<T> {
    std::thread::scope(|s| {
        match std::thread::Builder::new()
            .name(name.into())
            .stack_size(COMPILE_STACK_BYTES)
            .spawn_scoped(s, &f)
        {
            Ok(h) => h.join().ok(),
            Err(_) => Some(f()),
        }
    })
}

/// Checks the size limits that bound the recursion depth of compiling `spec`.
fn check_depth(spec: &ConstraintSpec, limits: &Limits) -> Result<(), ConstraintError> {
    if let ConstraintSpec::JsonSchema { schema, .. } = spec {
        let max = limits.max_schema_depth;
        if nesting_depth(schema, max + 1) > max {
            return Err(ConstraintError::limit_exceeded(
                LimitKind::SchemaDepth,
                format!(
                    "the schema nests objects and arrays more than {max} deep, the limit is {max}"
                ),
            ));
        }
    }
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

/// The nesting depth of objects and arrays in `v` (a scalar is 0, `{}` and `[]` are 1),
/// counting at most to `cap` (iterative: a deep value cannot overflow).
fn nesting_depth(v: &Value, cap: usize) -> usize {
    let mut max = 0usize;
    let mut stack = vec![(v, 1usize)];
    while let Some((v, d)) = stack.pop() {
        if !(v.is_object() || v.is_array()) {
            continue;
        }
        max = max.max(d);
        if max >= cap {
            return max;
        }
        match v {
            Value::Object(m) => stack.extend(m.values().map(|c| (c, d + 1))),
            Value::Array(a) => stack.extend(a.iter().map(|c| (c, d + 1))),
            _ => {}
        }
    }
    max
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
    /// [`Limits::max_schema_objects`], [`Limits::max_schema_depth`]).
    pub fn compile(
        &self,
        spec: &ConstraintSpec,
    ) -> Result<Arc<CompiledConstraint>, ConstraintError> {
        check_depth(spec, &self.limits)?;
        on_compile_stack("nextok-compile", || self.compile_here(spec)).unwrap_or_else(|| {
            Err(ConstraintError::engine(
                "the constraint compiler failed (panicked)",
            ))
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
    ) -> Result<(llg::LlgProto, schema::SchemaCheck), ConstraintError> {
        let mode = o.schema_mode;
        let mut p = schema::prepare(original, mode)?;
        let mut opts = o.clone();
        if opts.coerce_one_of {
            schema::relax_refused(&mut p, "oneOf");
        }
        for _ in 0..8 {
            // in any order, the lowered grammar first: when it compiles, the ordered one is not
            // needed (its leaves are the JSON compiler's, so a keyword it refuses fails both
            // and is relaxed below)
            let order = self.any_order(&p.schema, &opts);
            if matches!(order, Some(AnyOrder::Lowered { .. })) {
                return self.schema_done(original, p, mode, None, order);
            }
            let g = TopLevelGrammar::from_json_schema(json_with_options(p.schema.clone(), &opts)?);
            match llg::compile(&self.factory, g, &self.limits, "json_schema") {
                Ok((m, _)) => {
                    return self.schema_done(original, p, mode, Some(m), order);
                }
                Err(e) if e.kind() == ConstraintErrorKind::Unsupported => {
                    let keyword = e.keyword().unwrap_or_default();
                    // counted properties the ordered grammar refuses, in a schema the
                    // any-order one found unsatisfiable: say that
                    if let (Some(AnyOrder::Kept(why)), "minProperties/maxProperties") =
                        (&order, keyword)
                    {
                        if let Some(why) = why.strip_prefix(property_order::UNSATISFIABLE) {
                            return Err(ConstraintError::unsatisfiable(why));
                        }
                    }
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
    /// The compiled schema: the ordered grammar `m`, or the any-order one `order` made (`m`
    /// is `None` only then), with the report and the check after generation.
    fn schema_done(
        &self,
        original: &Value,
        p: schema::Prepared,
        mode: SchemaMode,
        m: Option<llg::LlgProto>,
        order: Option<AnyOrder>,
    ) -> Result<(llg::LlgProto, schema::SchemaCheck), ConstraintError> {
        let ordered = || m.ok_or_else(|| ConstraintError::engine("no grammar for the schema"));
        let max = self.limits.max_validator_objects;
        let objects = object_count(original, max + 1);
        let mut check = schema::finish(original, p, mode, objects <= max);
        let m = match order {
            None => ordered()?,
            Some(AnyOrder::Lowered {
                matcher,
                objects,
                kept,
            }) => {
                check.report.property_order = PropertyOrder::Any;
                check.report.objects_any_order = objects;
                check.report.order_kept = kept;
                *matcher
            }
            Some(AnyOrder::NothingToLower) => {
                check.report.property_order = PropertyOrder::Any;
                ordered()?
            }
            Some(AnyOrder::Kept(why)) => {
                check.report.order_kept = vec![OrderKept {
                    pointer: String::new(),
                    reason: why,
                }];
                ordered()?
            }
        };
        if mode == SchemaMode::Relaxed
            && !check.report.post_validation.is_empty()
            && check.report.validator_error.is_some()
        {
            return Err(ConstraintError::limit_exceeded(
                LimitKind::ValidatorObjects,
                format!(
                    "the schema has more than {max} objects: relaxed keywords could not be \
                     checked after generation"
                ),
            ));
        }
        Ok((m, check))
    }
}

/// What `property_order: any` made of a schema.
enum AnyOrder {
    /// The any-order grammar, compiled.
    Lowered {
        matcher: Box<llg::LlgProto>,
        objects: usize,
        kept: Vec<OrderKept>,
    },
    /// No object whose order matters: the ordered grammar is exact.
    NothingToLower,
    /// The schema keeps schema order, for this reason.
    Kept(String),
}

impl ConstraintEngine {
    /// Lowers the prepared `schema` to the any-order grammar and compiles it, when `o` asks
    /// for any order (`None` when it does not).
    fn any_order(&self, schema: &Value, o: &JsonOptions) -> Option<AnyOrder> {
        if o.effective_property_order() != PropertyOrder::Any {
            return None;
        }
        let x_guidance = match json_with_options(Value::Object(Default::default()), o) {
            Ok(Value::Object(mut m)) => m.remove("x-guidance").unwrap_or_default(),
            _ => return Some(AnyOrder::Kept("the JSON options".into())),
        };
        let disjoint = |pats: &[&str]| {
            let m: serde_json::Map<String, Value> = pats
                .iter()
                .map(|p| (p.to_string(), Value::Object(Default::default())))
                .collect();
            let g = TopLevelGrammar::from_json_schema(serde_json::json!({
                "type": "object",
                "patternProperties": m,
            }));
            llg::compile(&self.factory, g, &self.limits, "json_schema").is_ok()
        };
        let lo = property_order::LowerOptions {
            whitespace_flexible: !o.compact,
            coerce_one_of: o.coerce_one_of,
            x_guidance,
            disjoint: &disjoint,
        };
        Some(match property_order::lower(schema, &lo) {
            Ok(None) => AnyOrder::NothingToLower,
            Ok(Some(l)) => {
                match llg::compile(
                    &self.factory,
                    TopLevelGrammar::from_lark(l.lark),
                    &self.limits,
                    "json_schema",
                ) {
                    Ok((matcher, _)) => AnyOrder::Lowered {
                        matcher: Box::new(matcher),
                        objects: l.objects,
                        kept: l.kept,
                    },
                    Err(e) => {
                        // the first line, bounded (llguidance may append a backtrace)
                        let e = e.to_string();
                        let first = e.lines().next().unwrap_or_default();
                        AnyOrder::Kept(format!(
                            "the any-order grammar did not compile: {}",
                            crate::error::bounded_text(first)
                        ))
                    }
                }
            }
            Err(why) => AnyOrder::Kept(why),
        })
    }

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
