//! JSON-schema keyword policy: which keywords the token mask enforces exactly, which are relaxed
//! to a superset and checked after generation, and the post-generation validator.
//!
//! The mask is built by llguidance, which enforces a subset of JSON Schema exactly
//! ([`MASK_KEYWORDS`]). In [`SchemaMode::Strict`] (the default) a schema using anything else is
//! refused with an error naming the keyword and its JSON pointer. In [`SchemaMode::Relaxed`] the
//! mask is built from a copy of the schema with those keywords dropped (or `oneOf` read as
//! `anyOf`, an unknown `format` as its base type), which admits a superset of the valid
//! values; the finished output is then validated against the full schema by the `jsonschema`
//! crate. In both modes [`SchemaReport`] says which keyword was handled how, and
//! [`Validation`] carries the result of the check after generation.
//!
//! Formats that llguidance does not know but a regular expression can enforce exactly
//! (`full-date`, `url`, `uri-reference`, `semver`; and `ipv6`, whose llguidance expression lacks
//! the forms ending in an IPv4 address) are rewritten into a `pattern` in both
//! modes (see [`FORMAT_REGEXES`]).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::ConstraintError;
use crate::property_order::{OrderKept, PropertyOrder};

pub use nextok_core::constraint::spec::SchemaMode;

/// Keywords the mask enforces (llguidance's implemented set; `oneOf`, `minProperties`,
/// `maxProperties` and `patternProperties` only in the cases it can decide exactly).
pub const MASK_KEYWORDS: [&str; 27] = [
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "const",
    "enum",
    "type",
    "items",
    "additionalItems",
    "prefixItems",
    "minItems",
    "maxItems",
    "properties",
    "additionalProperties",
    "patternProperties",
    "required",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
];

/// Keywords the mask never enforces; [`SchemaMode::Relaxed`] drops them from the mask's copy of
/// the schema (dropping any of them only widens the set of values the mask admits).
pub const RELAXED_KEYWORDS: [&str; 18] = [
    "not",
    "uniqueItems",
    "dependencies",
    "dependentSchemas",
    "dependentRequired",
    "if",
    "then",
    "else",
    "contains",
    "minContains",
    "maxContains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "$dynamicRef",
    "$recursiveRef",
    "$dynamicAnchor",
    "$recursiveAnchor",
];

/// Formats llguidance enforces itself.
/// (`ipv6` is not among them: nextok's expression replaces llguidance's.)
const LLG_FORMATS: [&str; 9] = [
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "uuid",
    "uri",
];

/// Formats the `jsonschema` validator checks (with format assertion on).
const VALIDATOR_FORMATS: [&str; 22] = [
    "date",
    "date-time",
    "duration",
    "email",
    "hostname",
    "idn-email",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "iri",
    "iri-reference",
    "json-pointer",
    "regex",
    "relative-json-pointer",
    "time",
    "uri",
    "uri-reference",
    "uri-template",
    "uuid",
    "full-date",
    "url",
    "semver",
];

const PCHAR: &str = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})";
const H16: &str = "[0-9A-Fa-f]{1,4}";

fn ipv4() -> String {
    let oct = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
    format!(r"{oct}\.{oct}\.{oct}\.{oct}")
}

fn ipv6() -> String {
    let h = H16;
    let ls32 = format!("(?:{h}:{h}|{})", ipv4());
    let alts = [
        format!("(?:{h}:){{6}}{ls32}"),
        format!("::(?:{h}:){{5}}{ls32}"),
        format!("(?:{h})?::(?:{h}:){{4}}{ls32}"),
        format!("(?:(?:{h}:){{0,1}}{h})?::(?:{h}:){{3}}{ls32}"),
        format!("(?:(?:{h}:){{0,2}}{h})?::(?:{h}:){{2}}{ls32}"),
        format!("(?:(?:{h}:){{0,3}}{h})?::{h}:{ls32}"),
        format!("(?:(?:{h}:){{0,4}}{h})?::{ls32}"),
        format!("(?:(?:{h}:){{0,5}}{h})?::{h}"),
        format!("(?:(?:{h}:){{0,6}}{h})?::"),
    ];
    format!("(?:{})", alts.join("|"))
}

/// RFC 3986 `authority` and the paths, queries and fragments around it.
fn uri_parts() -> (String, String, String, String) {
    let p = PCHAR;
    let seg = format!("{p}*");
    let seg_nz = format!("{p}+");
    let userinfo = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:]|%[0-9A-Fa-f]{2})*";
    let reg_name = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})*";
    let ipvfuture = r"v[0-9A-Fa-f]+\.[A-Za-z0-9\-._~!$&'()*+,;=:]+";
    let host = format!(r"(?:\[(?:{}|{ipvfuture})\]|{}|{reg_name})", ipv6(), ipv4());
    let authority = format!("(?:{userinfo}@)?{host}(?::[0-9]*)?");
    let abempty = format!("(?:/{seg})*");
    let absolute = format!("/(?:{seg_nz}(?:/{seg})*)?");
    let rootless = format!("{seg_nz}(?:/{seg})*");
    let tail = format!(r"(?:\?(?:{p}|[/?])*)?(?:#(?:{p}|[/?])*)?");
    let hier = format!("(?://{authority}{abempty}|{absolute}|{rootless}|)");
    let seg_nz_nc = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=@]|%[0-9A-Fa-f]{2})+";
    let relative = format!("(?://{authority}{abempty}|{absolute}|{seg_nz_nc}(?:/{seg})*|)");
    (
        hier,
        relative,
        tail,
        String::from("[A-Za-z][A-Za-z0-9+\\-.]*"),
    )
}

/// The regular expression (full match, without anchors) for a format nextok enforces by
/// rewriting it into a `pattern`; `None` for formats llguidance knows or nobody enforces.
pub fn format_regex(name: &str) -> Option<String> {
    Some(match name {
        "full-date" => concat!(
            "[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])",
            "|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)",
            "|02-(?:0[1-9]|1[0-9]|2[0-9]))"
        )
        .to_string(),
        "url" => {
            let (hier, _, tail, scheme) = uri_parts();
            format!("{scheme}:{hier}{tail}")
        }
        "uri-reference" => {
            let (hier, relative, tail, scheme) = uri_parts();
            format!("(?:{scheme}:{hier}|{relative}){tail}")
        }
        // llguidance's own `ipv6` lacks the forms ending in an IPv4 address (RFC 4291 2.2)
        "ipv6" => ipv6(),
        "semver" => concat!(
            r"(?:0|[1-9][0-9]*)\.(?:0|[1-9][0-9]*)\.(?:0|[1-9][0-9]*)",
            r"(?:-(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)",
            r"(?:\.(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*))*)?",
            r"(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?"
        )
        .to_string(),
        _ => return None,
    })
}

/// The formats [`format_regex`] knows.
pub const FORMAT_REGEXES: [&str; 5] = ["full-date", "url", "uri-reference", "ipv6", "semver"];

/// How one keyword of a schema was handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Handling {
    /// The token mask enforces it exactly.
    Mask,
    /// The mask admits a superset; the output is checked against it after generation.
    PostValidation,
    /// Neither the mask nor the validator checks it (a `format` nobody knows: an annotation
    /// in JSON Schema 2020-12).
    Unchecked,
}

/// One occurrence of a keyword: where it is and what it is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KeywordUse {
    /// The keyword, e.g. `not`, or `format:color` for a format.
    pub keyword: String,
    /// JSON pointer of the schema object that holds it (`""` for the root).
    pub pointer: String,
}

/// What the mask enforces of a JSON schema and what is left to the check after generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaReport {
    /// The mode the schema was compiled in.
    pub mode: SchemaMode,
    /// Keywords the mask enforces exactly (sorted; `format` as `format:NAME`).
    pub mask: Vec<String>,
    /// Keywords relaxed in the mask (dropped, or `oneOf` read as `anyOf`) and checked after
    /// generation, with where they are.
    pub post_validation: Vec<KeywordUse>,
    /// Keywords nobody checks (unknown formats).
    pub unchecked: Vec<KeywordUse>,
    /// Why the validator could not be built (then nothing is checked after generation), when
    /// that is known at compile time: past [`Limits::max_validator_objects`](crate::Limits), or
    /// in relaxed mode with relaxed keywords (the validator is built then, to refuse a schema
    /// nothing could check). Otherwise the validator is built with the first check, and an error
    /// building it is that check's result (`not checked: …`).
    pub validator_error: Option<String>,
    /// How the mask orders object properties: `any` when the schema was lowered to the
    /// any-order grammar (or had no object whose order matters), `schema` otherwise.
    #[serde(default = "schema_order")]
    pub property_order: PropertyOrder,
    /// Objects masked in any order.
    #[serde(default)]
    pub objects_any_order: usize,
    /// Objects that keep schema order although `any` was asked for, and why (`""` for the
    /// whole schema when it could not be lowered at all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub order_kept: Vec<OrderKept>,
}

fn schema_order() -> PropertyOrder {
    PropertyOrder::Schema
}

impl SchemaReport {
    /// How `keyword` (as in [`schema_keywords`]) was handled; a keyword that occurs in more
    /// than one way reports its weakest handling.
    pub fn handling(&self, keyword: &str) -> Option<Handling> {
        if self.unchecked.iter().any(|k| k.keyword == keyword) {
            Some(Handling::Unchecked)
        } else if self.post_validation.iter().any(|k| k.keyword == keyword) {
            Some(Handling::PostValidation)
        } else if self.mask.iter().any(|k| k == keyword) {
            Some(Handling::Mask)
        } else {
            None
        }
    }

    /// Keywords checked after generation (sorted, unique).
    pub fn post_keywords(&self) -> Vec<String> {
        let s: BTreeSet<&str> = self
            .post_validation
            .iter()
            .map(|k| k.keyword.as_str())
            .collect();
        s.into_iter().map(str::to_string).collect()
    }

    /// One line: `mode relaxed; mask: a, b; checked after: c at /x, …`.
    pub fn summary(&self) -> String {
        let uses = |v: &[KeywordUse]| {
            v.iter()
                .map(|k| {
                    if k.pointer.is_empty() {
                        format!("{} at /", k.keyword)
                    } else {
                        format!("{} at {}", k.keyword, k.pointer)
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut s = format!(
            "schema mode {}; mask enforces: {}",
            self.mode.name(),
            if self.mask.is_empty() {
                "(nothing)".to_string()
            } else {
                self.mask.join(", ")
            }
        );
        if !self.post_validation.is_empty() {
            s.push_str(&format!(
                "; checked after generation: {}",
                uses(&self.post_validation)
            ));
        }
        if !self.unchecked.is_empty() {
            s.push_str(&format!("; not checked: {}", uses(&self.unchecked)));
        }
        s.push_str(&format!(
            "; properties in {} order",
            self.property_order.name()
        ));
        if !self.order_kept.is_empty() {
            let kept: Vec<String> = self
                .order_kept
                .iter()
                .map(|k| {
                    let at = if k.pointer.is_empty() {
                        "/"
                    } else {
                        &k.pointer
                    };
                    format!("{at} ({})", k.reason)
                })
                .collect();
            s.push_str(&format!("; schema order kept at: {}", kept.join(", ")));
        }
        s
    }
}

/// The result of validating a finished output against the full schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Validation {
    /// `Some(true)`: valid; `Some(false)`: invalid (see `errors`); `None`: not checked (no
    /// validator, see `errors`).
    pub valid: Option<bool>,
    /// The first few errors, each `pointer: message`.
    pub errors: Vec<String>,
}

impl Validation {
    /// `valid`, `invalid: …` or `not checked: …`.
    pub fn summary(&self) -> String {
        match self.valid {
            Some(true) => "valid".into(),
            Some(false) => format!("invalid: {}", self.errors.join("; ")),
            None => format!("not checked: {}", self.errors.join("; ")),
        }
    }
}

/// Most errors a [`Validation`] lists.
const MAX_ERRORS: usize = 5;

/// The compiled post-generation check of a JSON schema.
///
/// The validator is built when the first output is checked, so that it adds nothing to the time
/// to the first mask — except in relaxed mode with relaxed keywords, where a schema the
/// validator cannot take must be refused at compile time (nothing would check those keywords).
pub(crate) struct SchemaCheck {
    pub(crate) report: SchemaReport,
    /// The full schema, until the validator is built from it.
    schema: Value,
    /// [`value_bytes`] of the full schema.
    schema_bytes: usize,
    validator: std::sync::OnceLock<Result<jsonschema::Validator, String>>,
}

/// An estimate of the heap memory of `v` (iterative: a deep value cannot overflow).
fn value_bytes(v: &Value) -> usize {
    use std::mem::size_of;
    let mut n = 0usize;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        n += size_of::<Value>();
        match v {
            Value::String(s) => n += s.capacity(),
            Value::Array(a) => stack.extend(a.iter()),
            Value::Object(m) => {
                for (k, v) in m {
                    n += size_of::<String>() + k.capacity() + 2 * size_of::<usize>();
                    stack.push(v);
                }
            }
            _ => {}
        }
    }
    n
}

impl SchemaCheck {
    /// Validates `text`, on a thread with a [`crate::COMPILE_STACK_BYTES`] stack: building the
    /// validator and validating both recurse along `$ref` chains and nesting (a chain of 1,500
    /// `$ref`s overflowed an 8 MiB main-thread stack).
    pub(crate) fn validate(&self, text: &[u8]) -> Validation {
        crate::engine::on_compile_stack("nextok-validate", || self.validate_here(text))
            .unwrap_or_else(|| Validation {
                valid: None,
                errors: vec!["the validator failed (panicked)".into()],
            })
    }

    /// An estimate of the heap memory held: the schema kept until the validator is built, or
    /// the validator (estimated from the schema it was built from).
    pub(crate) fn estimated_bytes(&self) -> usize {
        // a validator taken as 4 times its schema in memory: over the 1,125 maskbench schemas
        // that compile (relaxed, their instances run), the estimates of all the compiled
        // constraints summed to 632 MB for 683 MB of process growth
        const VALIDATOR_PER_SCHEMA_BYTE: usize = 4;
        let built = matches!(self.validator.get(), Some(Ok(_)));
        value_bytes(&self.schema)
            + usize::from(built) * self.schema_bytes * VALIDATOR_PER_SCHEMA_BYTE
    }

    fn validate_here(&self, text: &[u8]) -> Validation {
        let built = self.validator.get_or_init(|| build_validator(&self.schema));
        let v = match built {
            Ok(v) => v,
            Err(e) => {
                return Validation {
                    valid: None,
                    errors: vec![e.clone()],
                }
            }
        };
        let value: Value = match serde_json::from_slice(text) {
            Ok(x) => x,
            Err(e) => {
                return Validation {
                    valid: Some(false),
                    errors: vec![format!("not JSON: {e}")],
                }
            }
        };
        let errors: Vec<String> = v
            .iter_errors(&value)
            .take(MAX_ERRORS)
            .map(|e| {
                let p = e.instance_path.to_string();
                // the message quotes the output: an excerpt of it
                crate::error::bounded_text(&format!("{}: {e}", if p.is_empty() { "/" } else { &p }))
            })
            .collect();
        Validation {
            valid: Some(errors.is_empty()),
            errors,
        }
    }
}

/// nextok's format regexes as the validator checks them, compiled once per process: a
/// validator is built for every compiled schema, and compiling the `url` and `uri-reference`
/// expressions each time cost more than the mask's own compile. `ipv6` keeps the validator's
/// own check (a parser).
fn format_checkers() -> Result<&'static [(&'static str, regex_automata::meta::Regex)], String> {
    type Checkers = Result<Vec<(&'static str, regex_automata::meta::Regex)>, String>;
    static CHECKERS: std::sync::OnceLock<Checkers> = std::sync::OnceLock::new();
    CHECKERS
        .get_or_init(|| {
            FORMAT_REGEXES
                .into_iter()
                .filter(|f| *f != "ipv6")
                .map(|name| {
                    let rx =
                        format_regex(name).ok_or_else(|| format!("format {name}: no regex"))?;
                    regex_automata::meta::Regex::new(&format!("^(?:{rx})$"))
                        .map(|re| (name, re))
                        .map_err(|e| format!("format {name}: {e}"))
                })
                .collect()
        })
        .as_deref()
        .map_err(Clone::clone)
}

/// The URI under which the validator holds the schema (see [`build_validator`]): beside the
/// `jsonschema` crate's default base URI (`json-schema:///`), so relative `$ref`s and `id`s
/// resolve as they did against it (a URN would refuse them).
const SCHEMA_URI: &str = "json-schema:///nextok-schema.json";

/// Builds the validator for the full schema (format assertion on; nextok's extra formats
/// checked with the same regexes as the mask).
///
/// The schema is a resource that the validator's root `{"$ref": SCHEMA_URI}` refers to, so the
/// `jsonschema` crate does not check it against its draft's meta-schema (llguidance has parsed
/// it already): that check runs a process-wide meta-schema validator whose recursive
/// references expand lazily, one copy of the meta-schema for each level of nesting (about
/// 5 MB each), kept for the life of the process — a 100-deep schema of 1.9 KB grew the
/// process by 700 MB that was never given back, and each differently shaped schema by as much
/// again. `$ref`s inside the schema resolve against it (or its own `$id`) as before: on the
/// 1,131 maskbench schemas the validator builds and judges every test instance as before.
fn build_validator(schema: &Value) -> Result<jsonschema::Validator, String> {
    let mut o = jsonschema::options().should_validate_formats(true);
    for (name, re) in format_checkers()?.iter() {
        let re = re.clone();
        o = o.with_format(*name, move |s: &str| re.is_match(s));
    }
    let refused = |e: &dyn std::fmt::Display, at: &str| {
        let at = at.strip_prefix("/$ref").unwrap_or(at);
        crate::error::bounded_text(&format!("the validator refuses the schema at `{at}`: {e}"))
    };
    let resource =
        jsonschema::Resource::from_contents(schema.clone()).map_err(|e| refused(&e, ""))?;
    o.with_resource(SCHEMA_URI, resource)
        .build(&serde_json::json!({ "$ref": SCHEMA_URI }))
        .map_err(|e| refused(&e, &e.schema_path.to_string()))
}

fn escape_ptr(k: &str) -> String {
    k.replace('~', "~0").replace('/', "~1")
}

/// Keywords whose value is a map of names to subschemas.
const MAP_KEYWORDS: [&str; 6] = [
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
];
/// Keywords whose value is a subschema (or, for `items`, possibly an array of them).
const ONE_KEYWORDS: [&str; 12] = [
    "additionalProperties",
    "additionalItems",
    "items",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "contentSchema",
];
/// Keywords whose value is an array of subschemas.
const LIST_KEYWORDS: [&str; 4] = ["allOf", "anyOf", "oneOf", "prefixItems"];

/// Calls `f` on every schema object in `root` with its JSON pointer (iterative).
fn visit<'a>(root: &'a Value, mut f: impl FnMut(&'a Map<String, Value>, &str)) {
    let mut stack: Vec<(&'a Value, String)> = vec![(root, String::new())];
    while let Some((v, ptr)) = stack.pop() {
        let Value::Object(m) = v else { continue };
        f(m, &ptr);
        for (k, sub) in m {
            let kp = format!("{ptr}/{}", escape_ptr(k));
            if MAP_KEYWORDS.contains(&k.as_str()) {
                if let Value::Object(mm) = sub {
                    for (name, s) in mm {
                        stack.push((s, format!("{kp}/{}", escape_ptr(name))));
                    }
                }
            } else if ONE_KEYWORDS.contains(&k.as_str()) || LIST_KEYWORDS.contains(&k.as_str()) {
                match sub {
                    Value::Array(a) => {
                        for (i, s) in a.iter().enumerate() {
                            stack.push((s, format!("{kp}/{i}")));
                        }
                    }
                    s => stack.push((s, kp)),
                }
            }
        }
    }
}

/// Calls `f` on every schema object in `root`, mutably, with its JSON pointer.
fn visit_mut(v: &mut Value, ptr: &str, f: &mut impl FnMut(&mut Map<String, Value>, &str)) {
    let Value::Object(m) = v else { return };
    f(m, ptr);
    for (k, sub) in m.iter_mut() {
        let kp = format!("{ptr}/{}", escape_ptr(k));
        if MAP_KEYWORDS.contains(&k.as_str()) {
            if let Value::Object(mm) = sub {
                for (name, s) in mm.iter_mut() {
                    visit_mut(s, &format!("{kp}/{}", escape_ptr(name)), f);
                }
            }
        } else if ONE_KEYWORDS.contains(&k.as_str()) || LIST_KEYWORDS.contains(&k.as_str()) {
            match sub {
                Value::Array(a) => {
                    for (i, s) in a.iter_mut().enumerate() {
                        visit_mut(s, &format!("{kp}/{i}"), f);
                    }
                }
                s => visit_mut(s, &kp, f),
            }
        }
    }
}

/// The JSON-Schema keywords a schema uses (those of [`MASK_KEYWORDS`] and
/// [`RELAXED_KEYWORDS`]; `format` as `format:NAME`), sorted.
pub fn schema_keywords(schema: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    visit(schema, |m, _| {
        for (k, v) in m {
            if k != "format"
                && (MASK_KEYWORDS.contains(&k.as_str()) || RELAXED_KEYWORDS.contains(&k.as_str()))
            {
                out.insert(k.clone());
            }
            if k == "format" {
                if let Some(f) = v.as_str() {
                    out.insert(format!("format:{f}"));
                }
            }
        }
    });
    out
}

/// Where `keyword` first occurs in `schema` (a JSON pointer), if anywhere.
pub fn keyword_pointer(schema: &Value, keyword: &str) -> Option<String> {
    let mut found: Vec<String> = Vec::new();
    visit(schema, |m, p| {
        if m.contains_key(keyword) {
            found.push(p.to_string());
        }
    });
    found.sort();
    found.into_iter().next()
}

/// The schema the mask is built from, and what was done to get it.
pub(crate) struct Prepared {
    pub(crate) schema: Value,
    pub(crate) post: Vec<KeywordUse>,
    pub(crate) unchecked: Vec<KeywordUse>,
}

/// Rewrites formats (both modes) and, in relaxed mode, drops [`RELAXED_KEYWORDS`] and unknown
/// formats. Strict mode refuses an unknown format with its pointer.
pub(crate) fn prepare(schema: &Value, mode: SchemaMode) -> Result<Prepared, ConstraintError> {
    let mut out = schema.clone();
    let mut post = Vec::new();
    let mut unchecked = Vec::new();
    let mut refusal: Option<ConstraintError> = None;
    visit_mut(&mut out, "", &mut |m, ptr| {
        if mode == SchemaMode::Relaxed {
            for k in RELAXED_KEYWORDS {
                if m.remove(k).is_some() {
                    post.push(KeywordUse {
                        keyword: k.to_string(),
                        pointer: ptr.to_string(),
                    });
                }
            }
        }
        let Some(f) = m.get("format").and_then(Value::as_str).map(str::to_string) else {
            return;
        };
        // `format` applies to strings only: on a schema whose `type` admits no string, nobody
        // checks it (llguidance and the validator both pass over it)
        let stringy = match m.get("type") {
            Some(Value::String(t)) => t == "string",
            Some(Value::Array(a)) => a.iter().any(|t| t == "string"),
            _ => true,
        };
        if !stringy {
            m.remove("format");
            unchecked.push(KeywordUse {
                keyword: format!("format:{f}"),
                pointer: ptr.to_string(),
            });
            return;
        }
        if LLG_FORMATS.contains(&f.as_str()) {
            return;
        }
        if let Some(rx) = format_regex(&f) {
            m.remove("format");
            let pat = Value::String(format!("^(?:{rx})$"));
            if m.contains_key("pattern") {
                let extra = serde_json::json!({ "pattern": pat });
                match m.get_mut("allOf") {
                    Some(Value::Array(a)) => a.push(extra),
                    _ => {
                        m.insert("allOf".into(), Value::Array(vec![extra]));
                    }
                }
            } else {
                m.insert("pattern".into(), pat);
            }
            return;
        }
        match mode {
            SchemaMode::Strict => {
                if refusal.is_none() {
                    refusal = Some(
                        ConstraintError::unsupported(
                            "format",
                            format!(
                                "format `{f}` at `{}` is not enforced by the mask \
                                 (schema_mode relaxed treats it as its base type)",
                                if ptr.is_empty() { "/" } else { ptr }
                            ),
                        )
                        .at_pointer(ptr),
                    );
                }
            }
            SchemaMode::Relaxed => {
                m.remove("format");
                let u = KeywordUse {
                    keyword: format!("format:{f}"),
                    pointer: ptr.to_string(),
                };
                if VALIDATOR_FORMATS.contains(&f.as_str()) {
                    post.push(u);
                } else {
                    unchecked.push(u);
                }
            }
        }
    });
    if let Some(e) = refusal {
        return Err(e);
    }
    Ok(Prepared {
        schema: out,
        post,
        unchecked,
    })
}

/// Drops the `pattern`s (and `patternProperties` with a pattern) for which `bad` says the
/// mask's regex engine cannot take them (look-around, back-references, anchors inside groups):
/// relaxed mode's answer to a regex llguidance refuses. Returns whether anything changed.
pub(crate) fn relax_patterns(p: &mut Prepared, bad: impl Fn(&str) -> bool) -> bool {
    let mut changed = false;
    let post = &mut p.post;
    visit_mut(&mut p.schema, "", &mut |m, ptr| {
        if m.get("pattern").and_then(Value::as_str).is_some_and(&bad) {
            m.remove("pattern");
            changed = true;
            post.push(KeywordUse {
                keyword: "pattern".into(),
                pointer: ptr.to_string(),
            });
        }
        let pp_bad = m
            .get("patternProperties")
            .and_then(Value::as_object)
            .is_some_and(|pp| pp.keys().any(|k| bad(k)));
        if pp_bad {
            for k in [
                "patternProperties",
                "additionalProperties",
                "unevaluatedProperties",
            ] {
                if m.remove(k).is_some() {
                    changed = true;
                    post.push(KeywordUse {
                        keyword: k.into(),
                        pointer: ptr.to_string(),
                    });
                }
            }
        }
    });
    changed
}

/// Relaxes the keyword llguidance refused (`refused`, as in
/// the keyword of an unsupported-keyword `ConstraintError`) in `p`; returns whether anything changed and
/// whether `oneOf` must now be read as `anyOf`.
pub(crate) fn relax_refused(p: &mut Prepared, refused: &str) -> (bool, bool) {
    if refused == "oneOf" {
        let mut uses = Vec::new();
        visit(&p.schema, |m, ptr| {
            if m.contains_key("oneOf") {
                uses.push(KeywordUse {
                    keyword: "oneOf".into(),
                    pointer: ptr.to_string(),
                });
            }
        });
        p.post.extend(uses);
        return (true, true);
    }
    let keys: Vec<String> = match refused {
        "minProperties/maxProperties" => vec!["minProperties".into(), "maxProperties".into()],
        "$ref" | "format" | "" => return (false, false),
        other => other.split(", ").map(str::to_string).collect(),
    };
    let mut changed = false;
    let post = &mut p.post;
    visit_mut(&mut p.schema, "", &mut |m, ptr| {
        for k in &keys {
            if m.remove(k.as_str()).is_some() {
                changed = true;
                post.push(KeywordUse {
                    keyword: k.clone(),
                    pointer: ptr.to_string(),
                });
                // Without its pattern properties an object must admit any other property for
                // the mask to stay a superset.
                if k == "patternProperties" {
                    for extra in ["additionalProperties", "unevaluatedProperties"] {
                        if m.remove(extra).is_some() {
                            post.push(KeywordUse {
                                keyword: extra.into(),
                                pointer: ptr.to_string(),
                            });
                        }
                    }
                }
            }
        }
    });
    (changed, false)
}

/// Builds the report and the validator once the mask's schema compiled.
pub(crate) fn finish(
    original: &Value,
    p: Prepared,
    mode: SchemaMode,
    build_check: bool,
) -> SchemaCheck {
    let mut post = p.post;
    post.sort();
    post.dedup();
    let mut unchecked = p.unchecked;
    unchecked.sort();
    unchecked.dedup();
    // The mask enforces what is left in its copy of the schema; keywords of RELAXED_KEYWORDS
    // still there (strict mode: where llguidance ignores them) are not enforced by it.
    let left = schema_keywords(&p.schema);
    let mut mask: Vec<String> = left
        .into_iter()
        .filter(|k| !RELAXED_KEYWORDS.contains(&k.as_str()))
        .filter(|k| !post.iter().any(|u| &u.keyword == k))
        .collect();
    // a format rewritten into a pattern is enforced by the mask under its own name
    for k in schema_keywords(original) {
        if let Some(f) = k.strip_prefix("format:") {
            if FORMAT_REGEXES.contains(&f) && !mask.contains(&k) {
                mask.push(k);
            }
        }
    }
    if mode == SchemaMode::Strict {
        visit(&p.schema, |m, ptr| {
            for k in RELAXED_KEYWORDS {
                if m.contains_key(k) {
                    post.push(KeywordUse {
                        keyword: k.to_string(),
                        pointer: ptr.to_string(),
                    });
                }
            }
        });
        post.sort();
        post.dedup();
    }
    mask.sort();
    mask.dedup();
    let validator = std::sync::OnceLock::new();
    let mut validator_error = None;
    let mut schema = Value::Null;
    if !build_check {
        let e = "the schema has too many objects for the check after generation \
                 (Limits::max_validator_objects)"
            .to_string();
        validator_error = Some(e.clone());
        let _ = validator.set(Err(e));
    } else if mode == SchemaMode::Relaxed && !post.is_empty() {
        // relaxed keywords: refused at compile time if nothing could check them
        let built = build_validator(original);
        validator_error = built.as_ref().err().cloned();
        let _ = validator.set(built);
    } else {
        schema = original.clone();
    }
    SchemaCheck {
        report: SchemaReport {
            mode,
            mask,
            post_validation: post,
            unchecked,
            validator_error,
            property_order: PropertyOrder::Schema,
            objects_any_order: 0,
            order_kept: Vec::new(),
        },
        schema,
        schema_bytes: value_bytes(original),
        validator,
    }
}

/// The spelling of a JSON text that the mask checks: string escapes the mask does not take
/// (`\uXXXX` for a character other than a control character, including surrogate pairs, and
/// `\/`) are written as the character itself (`\u0022` as `\"`, `\u005c` as `\\`). The value
/// is unchanged; text without such escapes is returned as it is.
pub fn json_text_for_mask(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains('\\') {
        return std::borrow::Cow::Borrowed(text);
    }
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut in_str = false;
    let hex4 = |at: usize| -> Option<u32> {
        let s = text.get(at..at + 4)?;
        if s.bytes().all(|c| c.is_ascii_hexdigit()) {
            u32::from_str_radix(s, 16).ok()
        } else {
            None
        }
    };
    let mut last = 0;
    while i < b.len() {
        let c = b[i];
        if !in_str {
            if c == b'"' {
                in_str = true;
            }
            i += 1;
            continue;
        }
        match c {
            b'"' => {
                in_str = false;
                i += 1;
            }
            b'\\' if i + 1 < b.len() => {
                let e = b[i + 1];
                if e == b'/' {
                    out.push_str(&text[last..i]);
                    out.push('/');
                    i += 2;
                    last = i;
                } else if e == b'u' {
                    let Some(u) = hex4(i + 2) else {
                        i += 2;
                        continue;
                    };
                    let (ch, len) = if (0xD800..0xDC00).contains(&u) {
                        match (text.get(i + 6..i + 8), hex4(i + 8)) {
                            (Some("\\u"), Some(lo)) if (0xDC00..0xE000).contains(&lo) => (
                                char::from_u32(0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00)),
                                12,
                            ),
                            _ => (None, 6),
                        }
                    } else {
                        (char::from_u32(u), 6)
                    };
                    match ch {
                        Some(ch) if ch >= ' ' && ch != '\u{7f}' => {
                            out.push_str(&text[last..i]);
                            match ch {
                                '"' => out.push_str("\\\""),
                                '\\' => out.push_str("\\\\"),
                                c => out.push(c),
                            }
                            i += len;
                            last = i;
                        }
                        _ => i += len,
                    }
                } else {
                    i += 2;
                }
            }
            _ => i += 1,
        }
    }
    if last == 0 {
        return std::borrow::Cow::Borrowed(text);
    }
    out.push_str(&text[last..]);
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn escapes_are_respelled() {
        assert_eq!(json_text_for_mask(r#"{"a":"x"}"#), r#"{"a":"x"}"#);
        assert_eq!(json_text_for_mask(r#""\u00b0C""#), "\"°C\"");
        assert_eq!(json_text_for_mask(r#""\ud83d\ude00""#), "\"😀\"");
        assert_eq!(json_text_for_mask(r#""\u0022\u005c\/""#), r#""\"\\/""#);
        // control characters and lone surrogates keep their escapes
        assert_eq!(
            json_text_for_mask(r#""\u0001\ud800x""#),
            r#""\u0001\ud800x""#
        );
        // outside strings nothing changes; `\\u` is an escaped backslash then `u`
        assert_eq!(json_text_for_mask(r#"["\\u00b0"]"#), r#"["\\u00b0"]"#);
        // the value is the same
        let t = r#"{"k\u00e9y": ["\u00b0", "a\/b", "\ud83d\ude00"]}"#;
        let a: Value = serde_json::from_str(t).unwrap();
        let b: Value = serde_json::from_str(&json_text_for_mask(t)).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn relaxed_drops_with_pointers_and_strict_refuses_unknown_format() {
        let s = json!({"type": "object", "properties": {
            "a": {"type": "array", "uniqueItems": true},
            "not": {"not": {"type": "null"}},
            "c": {"type": "string", "format": "color"},
            "d": {"type": "string", "format": "semver"}}});
        let p = prepare(&s, SchemaMode::Relaxed).unwrap();
        let mut post: Vec<_> = p.post.iter().map(|k| (&*k.keyword, &*k.pointer)).collect();
        post.sort();
        assert_eq!(
            post,
            vec![("not", "/properties/not"), ("uniqueItems", "/properties/a")]
        );
        assert_eq!(p.unchecked[0].keyword, "format:color");
        assert_eq!(p.unchecked[0].pointer, "/properties/c");
        assert!(p.schema["properties"]["d"]["pattern"].is_string());
        assert!(p.schema["properties"]["not"].get("not").is_none());
        let e = prepare(&s, SchemaMode::Strict).err().unwrap();
        assert_eq!(e.keyword(), Some("format"));
        assert!(e.to_string().contains("/properties/c"), "{e}");
    }

    #[test]
    fn keywords_and_pointers() {
        let s = json!({"$defs": {"x": {"if": {"const": 1}, "then": {"minimum": 0}}},
                       "anyOf": [{"$ref": "#/$defs/x"}, {"format": "uuid"}]});
        let k: Vec<_> = schema_keywords(&s).into_iter().collect();
        assert_eq!(
            k,
            [
                "$ref",
                "anyOf",
                "const",
                "format:uuid",
                "if",
                "minimum",
                "then"
            ]
        );
        assert_eq!(keyword_pointer(&s, "if").as_deref(), Some("/$defs/x"));
        assert_eq!(keyword_pointer(&s, "format").as_deref(), Some("/anyOf/1"));
    }
}

#[cfg(test)]
mod format_tests {
    use super::*;

    #[test]
    fn format_regexes_full_match() {
        let re = |f: &str| {
            regex_automata::meta::Regex::new(&format!("^(?:{})$", format_regex(f).unwrap()))
                .unwrap()
        };
        let ip6 = re("ipv6");
        for ok in [
            "::ffff:192.168.0.1",
            "::1",
            "1:2:3:4:5:6:7:8",
            "64:ff9b::10.0.0.1",
        ] {
            assert!(ip6.is_match(ok), "{ok}");
        }
        for bad in ["1::2::3", "::ffff:256.0.0.1", ":1"] {
            assert!(!ip6.is_match(bad), "{bad}");
        }
    }
}
