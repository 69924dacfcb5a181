//! Object properties in any order: a JSON schema lowered to a parametric Lark grammar.
//!
//! JSON Schema does not order an object's properties, but llguidance's JSON compiler emits
//! them in schema order (and its key pattern for additional properties excludes every
//! declared name), so `{"b": 1, "a": 2}` is refused for `{"properties": {"a": …, "b": …}}`.
//! This module rewrites a schema into llguidance's Lark dialect, where an object becomes a
//! *parametric* rule over a 64-bit mask of the keys written so far:
//!
//! ```text
//! o0: "{" o0_a::0x0 "}"
//! o0_a::_ : ""                                 %if is_ones([0:1])   // required keys: low bits
//!         | K0_0 ":" v1 o0_b::set_bit(0)       %if bit_clear(0)
//!         | K0_1 ":" v2 o0_b::set_bit(1)       %if bit_clear(1)
//!         | X0 ":" v3 o0_b::_                                       // additionalProperties
//! o0_b::_ : ""                                 %if is_ones([0:1])
//!         | "," K0_0 ":" v1 o0_b::set_bit(0)   %if bit_clear(0)
//!         | …
//! K0_0: /"(a|\\u00[46]1)"/                     // every spelling of the decoded name
//! X0: /"…json string…"/ & ~(K0_0 | K0_1)
//! ```
//!
//! so every order is accepted, each key at most once, and the object closes only when every
//! required key is present. `minProperties` / `maxProperties` count the mask's bits; with
//! additional properties allowed, each additional key sets the next bit of a thermometer code
//! above the declared keys, so the bit count stays the property count.
//!
//! The lowering recurses through `properties`, `patternProperties` (several when the JSON
//! compiler finds them disjoint), `additionalProperties`, array `items`, `anyOf` (and `oneOf`
//! when it is read as `anyOf`), `allOf`, `$ref` (one rule per referenced pointer, so recursive
//! schemas stay finite), object keywords beside `anyOf` / `oneOf` / `allOf` / `$ref` (merged as
//! JSON Schema reads them) and `enum` / `const` values with objects. Every other subschema is a
//! leaf, compiled by llguidance's own JSON compiler (`%json { … }`) with the same options (and
//! the definitions its `$ref`s reach, moved under `$defs`); identical leaves and terminals are
//! shared. Whitespace and separators are the JSON compiler's. An object the lowering cannot
//! express (more than 64 keys and counters, a keyword beside `properties` it does not merge)
//! stays inside a leaf, in schema order, and [`Lowered::kept`] says which and why.
//!
//! Keys the schema does not declare are not tracked (there are unboundedly many): one written
//! twice is accepted, as a JSON parser keeps its last value. With `patternProperties` and
//! additional properties both allowed, an additional key must match no pattern; that is checked
//! on its raw text, so such a key is written without escapes.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use nextok_core::constraint::spec::PropertyOrder;

/// An object that keeps schema order, and why.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OrderKept {
    /// JSON pointer of the object's schema (`""` for the root).
    pub pointer: String,
    /// Why the lowering left it to the JSON compiler.
    pub reason: String,
}

/// A schema lowered to Lark.
#[derive(Debug, Clone)]
pub struct Lowered {
    /// The grammar (start rule `start`).
    pub lark: String,
    /// Objects lowered to any-order rules.
    pub objects: usize,
    /// Objects that keep schema order.
    pub kept: Vec<OrderKept>,
}

/// How the JSON compiler spells whitespace and separators, and what it decides for the
/// lowering.
pub struct LowerOptions<'a> {
    /// Any JSON whitespace between lexemes (else none).
    pub whitespace_flexible: bool,
    /// Read `oneOf` as `anyOf`.
    pub coerce_one_of: bool,
    /// llguidance's JSON options, put in every leaf as `x-guidance`.
    pub x_guidance: Value,
    /// Whether these `patternProperties` patterns are disjoint (no key matches two), as the
    /// JSON compiler decides it (it refuses overlapping ones).
    pub disjoint: &'a dyn Fn(&[&str]) -> bool,
}

/// How many times over the schema's own size its leaves may copy (with the definitions their
/// `$ref`s reach) before the lowering gives up and the schema keeps schema order.
pub const LEAF_COPIES: usize = 16;

/// How a lowering error that means "no value meets the schema" begins.
pub const UNSATISFIABLE: &str = "unsatisfiable: ";

/// Keys (declared and thermometer bits) one object may use: one 64-bit parameter.
pub const MAX_OBJECT_BITS: usize = 64;

/// The keywords that constrain a value (JSON Schema drafts 4 to 2020-12); every other key
/// (`title`, `$id`, draft 4's `id`, a vendor's own keys) is an annotation, as llguidance and
/// validators read it.
const VALIDATION: [&str; 44] = [
    "type",
    "enum",
    "const",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "format",
    "items",
    "prefixItems",
    "additionalItems",
    "unevaluatedItems",
    "contains",
    "maxContains",
    "minContains",
    "maxItems",
    "minItems",
    "uniqueItems",
    "properties",
    "patternProperties",
    "additionalProperties",
    "unevaluatedProperties",
    "propertyNames",
    "required",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "maxProperties",
    "minProperties",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "$ref",
    "$dynamicRef",
    "$recursiveRef",
    "contentSchema",
];

const OBJECT_KEYS: [&str; 7] = [
    "type",
    "properties",
    "patternProperties",
    "required",
    "additionalProperties",
    "minProperties",
    "maxProperties",
];

const ARRAY_KEYS: [&str; 4] = ["type", "items", "minItems", "maxItems"];

const TYPES: [&str; 6] = ["null", "boolean", "number", "string", "array", "object"];

/// Keywords whose value is one schema.
const SCHEMA_VALUED: [&str; 12] = [
    "items",
    "additionalItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "additionalProperties",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
];

/// Keywords whose value maps names to schemas (`dependencies` also holds name lists).
const SCHEMA_MAPS: [&str; 4] = [
    "properties",
    "patternProperties",
    "dependentSchemas",
    "dependencies",
];

/// Keywords whose value is a list of schemas.
const SCHEMA_LISTS: [&str; 5] = ["allOf", "anyOf", "oneOf", "prefixItems", "items"];

/// The subschemas of a schema object, outside `$defs` / `definitions` (reached by `$ref`).
fn subschemas(m: &Map<String, Value>) -> Vec<&Value> {
    let mut out = Vec::new();
    for (k, x) in m {
        let k = k.as_str();
        match x {
            Value::Object(sub) if SCHEMA_MAPS.contains(&k) => {
                out.extend(sub.values().filter(|y| y.is_object()));
            }
            Value::Array(list) if SCHEMA_LISTS.contains(&k) => out.extend(list.iter()),
            Value::Object(_) if SCHEMA_VALUED.contains(&k) => out.push(x),
            _ => {}
        }
    }
    out
}

/// The body of a JSON string as llguidance's JSON compiler takes it: no raw `"`, `\` or
/// control character; escapes `\" \\ \b \f \n \r \t` and `\uXXXX` (surrogates paired).
const STRING_BODY: &str = r#"(?:[^"\\\x00-\x1F]|\\["\\bfnrt]|\\u(?:[0-9a-ce-fA-CE-F][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}|[dD][89aAbB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}))*"#;

/// Lowers `schema` (already prepared: formats rewritten, relaxed keywords dropped). `Ok(None)`
/// when no object in it has an order to relax (the JSON compiler's grammar is then exact);
/// `Err` when the schema cannot be lowered at all (a `$ref` outside the document).
pub fn lower(schema: &Value, o: &LowerOptions) -> Result<Option<Lowered>, String> {
    // leaves carry copies of the definitions their `$ref`s reach: bounded against the schema
    let size = serde_json::to_string(schema).map_or(0, |t| t.len());
    let mut l = Lowerer {
        root: schema,
        o,
        leaf_budget: size.saturating_mul(LEAF_COPIES).saturating_add(1 << 16),
        term_names: HashMap::new(),
        rules: String::new(),
        terminals: String::new(),
        next: 0,
        refs: HashMap::new(),
        needs: HashMap::new(),
        kept: Vec::new(),
        objects: 0,
    };
    if !l.needs(schema, &mut Vec::new()) {
        return Ok(None);
    }
    let start = l.node(schema, "")?;
    let mut lark = String::new();
    if o.whitespace_flexible {
        lark.push_str("%llguidance { \"ignore_once\": true }\n%ignore /[\\x20\\x0A\\x0D\\x09]+/\n");
    }
    let _ = writeln!(lark, "start: {start}");
    lark.push_str(&l.rules);
    lark.push_str(&l.terminals);
    l.kept.sort();
    l.kept.dedup();
    Ok(Some(Lowered {
        lark,
        objects: l.objects,
        kept: l.kept,
    }))
}

struct Lowerer<'a> {
    root: &'a Value,
    o: &'a LowerOptions<'a>,
    /// Bytes of leaf text still allowed.
    leaf_budget: usize,
    /// Terminal definition (or leaf text) → its name: one per distinct definition.
    term_names: HashMap<String, String>,
    rules: String,
    terminals: String,
    next: usize,
    /// `$ref` pointer → its rule.
    refs: HashMap<String, String>,
    /// `$ref` pointer → whether its target has an order to relax.
    needs: HashMap<String, bool>,
    kept: Vec<OrderKept>,
    objects: usize,
}

fn validation_keys(m: &Map<String, Value>) -> impl Iterator<Item = &str> {
    m.keys()
        .map(String::as_str)
        .filter(|k| VALIDATION.contains(k))
}

/// The types a schema admits (all six when it says none).
fn types_of(m: &Map<String, Value>) -> Option<Vec<&str>> {
    match m.get("type") {
        None => Some(TYPES.to_vec()),
        Some(Value::String(t)) => Some(vec![t.as_str()]),
        Some(Value::Array(a)) => a.iter().map(Value::as_str).collect(),
        Some(_) => None,
    }
}

/// JSON-pointer text of `ptr` / `key`.
fn child(ptr: &str, key: &str) -> String {
    format!("{ptr}/{}", key.replace('~', "~0").replace('/', "~1"))
}

/// Resolves a `#…` reference inside `root`.
fn resolve<'v>(root: &'v Value, r: &str) -> Option<&'v Value> {
    let frag = r.strip_prefix('#')?;
    let decoded = percent_decode(frag)?;
    if decoded.is_empty() {
        return Some(root);
    }
    root.pointer(&decoded)
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A Lark regex for `"name"` in every JSON spelling that decodes to `name` (as llguidance's
/// strings accept them: a character raw where JSON allows it, or escaped).
fn key_regex(name: &str) -> String {
    fn hex4(out: &mut String, u: u16) {
        for c in format!("{u:04x}").chars() {
            if c.is_ascii_alphabetic() {
                let _ = write!(out, "[{}{}]", c, c.to_ascii_uppercase());
            } else {
                out.push(c);
            }
        }
    }
    let mut out = String::from("\"");
    for c in name.chars() {
        out.push_str("(?:");
        let mut buf = [0u16; 2];
        let units = c.encode_utf16(&mut buf);
        // the raw character where JSON allows it, or its short escape
        match c {
            '"' => out.push_str(r#"\\"|"#),
            '\\' => out.push_str(r"\\\\|"),
            '\u{08}' => out.push_str(r"\\b|"),
            '\u{0C}' => out.push_str(r"\\f|"),
            '\n' => out.push_str(r"\\n|"),
            '\r' => out.push_str(r"\\r|"),
            '\t' => out.push_str(r"\\t|"),
            c if (c as u32) < 0x20 => {} // `\u00XX` only
            c if c.is_ascii_alphanumeric() || !c.is_ascii() => {
                out.push(c);
                out.push('|');
            }
            c => {
                let _ = write!(out, "\\x{:02X}|", c as u32);
            }
        }
        for u in units.iter() {
            out.push_str(r"\\u");
            hex4(&mut out, *u);
        }
        out.push(')');
    }
    out.push('"');
    // Lark regex literal: `/` must be escaped
    out.replace('/', "\\/")
}

/// `a` ∧ `b` for two schemas of object keywords only: `None` when the merge is not exact
/// here, `Some(None)` when nothing meets both.
fn merge_objects(a: &Map<String, Value>, b: &Value) -> Option<Option<Map<String, Value>>> {
    let b = match b {
        Value::Bool(true) => return Some(Some(a.clone())),
        Value::Bool(false) => return Some(None),
        Value::Object(b) => b,
        _ => return None,
    };
    if !validation_keys(b).all(|k| OBJECT_KEYS.contains(&k) && k != "patternProperties")
        || a.contains_key("patternProperties")
    {
        return None;
    }
    let mut out = Map::new();
    // type: the intersection
    let ta = types_of(a)?;
    let tb = types_of(b)?;
    let types: Vec<Value> = ta
        .iter()
        .filter(|t| tb.contains(t))
        .map(|t| Value::String(t.to_string()))
        .collect();
    if types.is_empty() {
        return Some(None);
    }
    if a.contains_key("type") || b.contains_key("type") {
        out.insert("type".into(), Value::Array(types));
    }
    let empty = Map::new();
    let pa = a.get("properties").map_or(Some(&empty), Value::as_object)?;
    let pb = b.get("properties").map_or(Some(&empty), Value::as_object)?;
    let apa = a
        .get("additionalProperties")
        .filter(|v| **v != Value::Bool(true));
    let apb = b
        .get("additionalProperties")
        .filter(|v| **v != Value::Bool(true));
    if apa.is_some() && apb.is_some() {
        return None;
    }
    // a key one side declares and the other does not meets the other's additionalProperties
    let both = |x: &Value, y: Option<&Value>| -> Value {
        match y {
            None => x.clone(),
            Some(Value::Bool(false)) => Value::Bool(false),
            Some(y) if *x == Value::Bool(true) || *x == Value::Object(Map::new()) => y.clone(),
            Some(y) => serde_json::json!({ "allOf": [x, y] }),
        }
    };
    let mut props = Map::new();
    for (k, x) in pa {
        props.insert(
            k.clone(),
            match pb.get(k) {
                Some(y) if x == y => x.clone(),
                Some(y) => serde_json::json!({ "allOf": [x, y] }),
                None => both(x, apb),
            },
        );
    }
    for (k, y) in pb {
        if !pa.contains_key(k) {
            props.insert(k.clone(), both(y, apa));
        }
    }
    let mut required: Vec<Value> = Vec::new();
    for r in [a.get("required"), b.get("required")].into_iter().flatten() {
        for x in r.as_array()? {
            if !required.contains(x) {
                required.push(x.clone());
            }
        }
    }
    // a required key neither side declares meets the additionalProperties there is
    if let Some(ap) = apa.or(apb) {
        for r in &required {
            let r = r.as_str()?;
            if !props.contains_key(r) {
                props.insert(r.to_string(), ap.clone());
            }
        }
    }
    if required
        .iter()
        .any(|r| r.as_str().and_then(|r| props.get(r)) == Some(&Value::Bool(false)))
    {
        return Some(None);
    }
    if !props.is_empty() {
        out.insert("properties".into(), Value::Object(props));
    }
    if !required.is_empty() {
        out.insert("required".into(), Value::Array(required));
    }
    if let Some(ap) = apa.or(apb) {
        out.insert("additionalProperties".into(), ap.clone());
    }
    let num = |m: &Map<String, Value>, k: &str| m.get(k).map(|v| v.as_u64());
    for (k, pick) in [("minProperties", true), ("maxProperties", false)] {
        let v = match (num(a, k), num(b, k)) {
            (Some(None), _) | (_, Some(None)) => return None,
            (Some(Some(x)), Some(Some(y))) => Some(if pick { x.max(y) } else { x.min(y) }),
            (Some(Some(x)), None) | (None, Some(Some(x))) => Some(x),
            (None, None) => None,
        };
        if let Some(v) = v {
            out.insert(k.into(), Value::from(v));
        }
    }
    Some(Some(out))
}

/// Whether a schema plainly admits no value: `false`, or an object-only schema whose required
/// keys exceed `maxProperties` or include a property that admits no value.
fn never(v: &Value) -> bool {
    let m = match v {
        Value::Bool(b) => return !b,
        Value::Object(m) => m,
        _ => return false,
    };
    if types_of(m).is_none_or(|t| t != ["object"]) {
        return false;
    }
    let required: Vec<&str> = m
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut distinct = required.clone();
    distinct.sort_unstable();
    distinct.dedup();
    let max = m.get("maxProperties").and_then(Value::as_u64);
    if max.is_some_and(|mx| (distinct.len() as u64) > mx) {
        return true;
    }
    let props = m.get("properties").and_then(Value::as_object);
    distinct
        .iter()
        .any(|r| props.and_then(|p| p.get(*r)).is_some_and(never))
}

/// Whether a JSON value has an object of two or more keys (whose order a constant fixes).
fn value_needs(v: &Value) -> bool {
    match v {
        Value::Object(o) => o.len() >= 2 || o.values().any(value_needs),
        Value::Array(a) => a.iter().any(value_needs),
        _ => false,
    }
}

/// A key written without escapes.
const RAW_KEY: &str = r#""[^"\\\x00-\x1F]*""#;

/// A JSON-schema `pattern` (a search; `\d`, `\w` ASCII) as a Lark regex over a key written
/// without escapes, quotes included; `None` when an anchor is not at an end.
fn raw_search_regex(pattern: &str) -> Option<String> {
    let rx = llguidance::regex_to_lark(pattern, "dw");
    let chars: Vec<char> = rx.chars().collect();
    let (mut esc, mut class) = (false, false);
    let mut anchors = Vec::new();
    for (i, &c) in chars.iter().enumerate() {
        if esc {
            esc = false;
            continue;
        }
        match c {
            '\\' => esc = true,
            '[' if !class => class = true,
            ']' if class => class = false,
            '^' | '$' if !class => anchors.push((i, c)),
            _ => {}
        }
    }
    let last = chars.len().checked_sub(1)?;
    let start = anchors.iter().any(|&(i, c)| i == 0 && c == '^');
    let end = anchors.iter().any(|&(i, c)| i == last && c == '$' && i > 0);
    if anchors.len() != usize::from(start) + usize::from(end) {
        return None;
    }
    let body: String = chars[usize::from(start)..chars.len() - usize::from(end)]
        .iter()
        .collect();
    let pre = if start { "" } else { "(?s:.*)" };
    let suf = if end { "" } else { "(?s:.*)" };
    Some(format!("\"{pre}(?:{body}){suf}\""))
}

/// The type a keyword constrains, for keywords of one type.
fn keyword_type(k: &str) -> Option<&'static str> {
    Some(match k {
        "items" | "prefixItems" | "additionalItems" | "unevaluatedItems" | "contains"
        | "minContains" | "maxContains" | "minItems" | "maxItems" | "uniqueItems" => "array",
        "minLength" | "maxLength" | "pattern" | "format" => "string",
        "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" | "multipleOf" => "number",
        "properties"
        | "patternProperties"
        | "additionalProperties"
        | "required"
        | "minProperties"
        | "maxProperties"
        | "propertyNames"
        | "dependentRequired"
        | "dependentSchemas"
        | "dependencies"
        | "unevaluatedProperties" => "object",
        _ => return None,
    })
}

/// `pattern` as llguidance reads a JSON-schema pattern (a search; `\d`, `\w` ASCII), over
/// a name's bytes; `None` when it does not compile here.
fn ascii_regex(pattern: &str) -> Option<regex_automata::meta::Regex> {
    regex_automata::meta::Builder::new()
        .syntax(
            regex_automata::util::syntax::Config::new()
                .unicode(false)
                .utf8(false),
        )
        .build(pattern)
        .ok()
}

fn and_all(conds: Vec<String>) -> Option<String> {
    let mut it = conds.into_iter();
    let first = it.next()?;
    Some(it.fold(first, |acc, c| format!("and({acc}, {c})")))
}

impl Lowerer<'_> {
    fn fresh(&mut self) -> usize {
        self.next += 1;
        self.next - 1
    }

    /// Whether `v` has, anywhere (through `$ref`s), an object whose properties could come in
    /// another order than the schema's.
    fn needs(&mut self, v: &Value, seen: &mut Vec<String>) -> bool {
        self.needs_inner(v, seen).0
    }

    /// (whether `v` needs lowering, whether the answer passed a `$ref` still being decided:
    /// a `false` then is not final and is not cached).
    fn needs_inner(&mut self, v: &Value, seen: &mut Vec<String>) -> (bool, bool) {
        let Value::Object(m) = v else {
            return (false, false);
        };
        let declared = m
            .get("properties")
            .and_then(Value::as_object)
            .map_or(0, |p| p.len())
            + m.get("required")
                .and_then(Value::as_array)
                .map_or(0, |r| r.len());
        let additional = !matches!(m.get("additionalProperties"), Some(Value::Bool(false)))
            || m.get("patternProperties").is_some();
        // min/maxProperties: counted here (the JSON compiler takes them only when every
        // declared key is required)
        let counted = m.contains_key("minProperties") || m.contains_key("maxProperties");
        if declared >= 2 || (declared >= 1 && additional) || counted {
            return (true, false);
        }
        // an `enum` / `const` object value is the same value in any key order
        let values = m
            .get("enum")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .chain(m.get("const"));
        if values.into_iter().any(value_needs) {
            return (true, false);
        }
        let mut open = false;
        if let Some(Value::String(r)) = m.get("$ref") {
            if let Some(&n) = self.needs.get(r) {
                if n {
                    return (true, false);
                }
            } else if seen.contains(r) {
                open = true;
            } else {
                seen.push(r.clone());
                let (n, o) = match resolve(self.root, r) {
                    Some(t) => self.needs_inner(t, seen),
                    None => (false, false),
                };
                seen.pop();
                if n || !o {
                    self.needs.insert(r.clone(), n);
                }
                if n {
                    return (true, false);
                }
                open |= o;
            }
        }
        for x in subschemas(m) {
            let (n, o) = self.needs_inner(x, seen);
            if n {
                return (true, false);
            }
            open |= o;
        }
        (false, open)
    }

    /// The rule for the subschema `v` at `ptr`.
    fn node(&mut self, v: &Value, ptr: &str) -> Result<String, String> {
        let m = match v {
            Value::Bool(true) => return self.leaf(&Value::Object(Map::new())),
            Value::Object(m) => m,
            _ => return self.leaf(v),
        };
        if !self.needs(v, &mut Vec::new()) {
            return self.leaf(v);
        }
        let keys: Vec<&str> = validation_keys(m).collect();
        // keywords of types the schema does not admit constrain nothing
        if let Some(types) = types_of(m) {
            let idle = |k: &str| {
                let t = keyword_type(k);
                t.is_some_and(|t| {
                    !(types.contains(&t) || t == "number" && types.contains(&"integer"))
                })
            };
            if keys.iter().any(|k| idle(k)) {
                let nm: Map<String, Value> = m
                    .iter()
                    .filter(|(k, _)| !idle(k))
                    .map(|(a, b)| (a.clone(), b.clone()))
                    .collect();
                return self.node(&Value::Object(nm), ptr);
            }
        }
        // a reference beside object keywords: the target merged with them
        if keys.len() > 1
            && keys.contains(&"$ref")
            && keys.iter().all(|k| *k == "$ref" || OBJECT_KEYS.contains(k))
        {
            if let Some(Value::String(r)) = m.get("$ref") {
                if let Some(Value::Object(t)) = resolve(self.root, r) {
                    let tkeys: Vec<&str> = validation_keys(t).collect();
                    if tkeys.iter().all(|k| OBJECT_KEYS.contains(k)) {
                        let base: Map<String, Value> = m
                            .iter()
                            .filter(|(k, _)| k.as_str() != "$ref")
                            .map(|(a, b)| (a.clone(), b.clone()))
                            .collect();
                        if let Some(merged) = merge_objects(&base, &Value::Object(t.clone())) {
                            let Some(merged) = merged else {
                                return Err(format!(
                                    "{UNSATISFIABLE}the object at `{ptr}` admits no value"
                                ));
                            };
                            return self.node(&Value::Object(merged), ptr);
                        }
                    }
                }
            }
        }
        // a reference: one rule per target
        if keys == ["$ref"] {
            let Some(Value::String(r)) = m.get("$ref") else {
                return self.leaf(v);
            };
            if let Some(name) = self.refs.get(r) {
                return Ok(name.clone());
            }
            let target = resolve(self.root, r).ok_or_else(|| {
                format!("`$ref` {r:?} at `{ptr}` is not a pointer into the schema")
            })?;
            let name = format!("r{}", self.fresh());
            self.refs.insert(r.clone(), name.clone());
            let tptr = r.trim_start_matches('#').to_string();
            let body = self.node(target, &tptr)?;
            let _ = writeln!(self.rules, "{name}: {body}");
            return Ok(name);
        }
        // alternatives
        let alt_key = if keys == ["anyOf"] {
            Some("anyOf")
        } else if keys == ["oneOf"] && self.o.coerce_one_of {
            Some("oneOf")
        } else {
            None
        };
        if let Some(k) = alt_key {
            if let Some(Value::Array(branches)) = m.get(k) {
                if !branches.is_empty() {
                    let mut alts = Vec::with_capacity(branches.len());
                    for (i, b) in branches.iter().enumerate() {
                        alts.push(self.node(b, &format!("{ptr}/{k}/{i}"))?);
                    }
                    let name = format!("u{}", self.fresh());
                    let _ = writeln!(self.rules, "{name}: {}", alts.join(" | "));
                    return Ok(name);
                }
            }
        }
        if keys == ["allOf"] {
            if let Some(Value::Array(b)) = m.get("allOf") {
                // branches that constrain nothing (left so by relaxed keywords) drop out
                let live: Vec<(usize, &Value)> = b
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| match x {
                        Value::Bool(true) => false,
                        Value::Object(xm) => validation_keys(xm).next().is_some(),
                        _ => true,
                    })
                    .collect();
                if live.len() == 1 {
                    let (i, x) = live[0];
                    return self.node(x, &format!("{ptr}/allOf/{i}"));
                }
            }
        }
        // `enum` / `const` values with objects: each value in any key order
        if keys == ["enum"] || keys == ["const"] {
            let values: Vec<&Value> = match m.get("const") {
                Some(c) => vec![c],
                None => m
                    .get("enum")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().collect())
                    .unwrap_or_default(),
            };
            if !values.is_empty() {
                let mut alts = Vec::with_capacity(values.len());
                for x in values {
                    alts.push(self.constant(x)?);
                }
                let name = format!("u{}", self.fresh());
                let _ = writeln!(self.rules, "{name}: {}", alts.join(" | "));
                return Ok(name);
            }
        }
        // object keywords beside `anyOf` / `oneOf` (read as `anyOf`) / `allOf` of object
        // keywords: each branch merged with them, as JSON Schema reads it
        if let Some(merged) = self.merged_branches(m, &keys) {
            let mut alts = Vec::with_capacity(merged.len());
            for (i, b) in merged.iter().enumerate() {
                alts.push(self.node(b, &format!("{ptr}/(merged branch {i})"))?);
            }
            if alts.is_empty() {
                return Err(format!(
                    "{UNSATISFIABLE}no branch of the object at `{ptr}` admits a value"
                ));
            }
            let name = format!("u{}", self.fresh());
            let _ = writeln!(self.rules, "{name}: {}", alts.join(" | "));
            return Ok(name);
        }
        let types = types_of(m);
        if let Some(types) = &types {
            if types.contains(&"object") && keys.iter().all(|k| OBJECT_KEYS.contains(k)) {
                if let Some(obj) = self.object(m, ptr)? {
                    return self.with_other_types(obj, types, "object");
                }
                return self.leaf(v);
            }
            if types.contains(&"array")
                && keys.iter().all(|k| ARRAY_KEYS.contains(k))
                && !matches!(
                    m.get("items"),
                    Some(Value::Array(_)) | Some(Value::Bool(false))
                )
            {
                let arr = self.array(m, ptr)?;
                return self.with_other_types(arr, types, "array");
            }
        }
        let why: Vec<&str> = keys
            .iter()
            .copied()
            .filter(|k| !OBJECT_KEYS.contains(k))
            .collect();
        self.kept.push(OrderKept {
            pointer: ptr.to_string(),
            reason: format!(
                "`{}` here: compiled by the JSON compiler, objects inside in schema order",
                why.join("`, `")
            ),
        });
        self.leaf(v)
    }

    /// The branches of an object with `anyOf` / `oneOf` (read as `anyOf`) / `allOf` beside
    /// object keywords, each merged with those keywords (`allOf` folded into one); `None` when
    /// they are not all object keywords or a merge is not exact.
    fn merged_branches(&self, m: &Map<String, Value>, keys: &[&str]) -> Option<Vec<Value>> {
        let comb: Vec<&str> = keys
            .iter()
            .copied()
            .filter(|k| matches!(*k, "anyOf" | "oneOf" | "allOf"))
            .collect();
        if comb.len() != 1
            || !keys
                .iter()
                .all(|k| OBJECT_KEYS.contains(k) || comb.contains(k))
        {
            return None;
        }
        let k = comb[0];
        if k == "oneOf" && !self.o.coerce_one_of {
            return None;
        }
        // a branch that is only a reference stands for its target
        let mut branches: Vec<&Value> = Vec::new();
        for b in m.get(k)?.as_array()? {
            let mut b = b;
            for _ in 0..8 {
                match b {
                    Value::Object(bm) if validation_keys(bm).eq(["$ref"]) => {
                        b = resolve(self.root, bm.get("$ref")?.as_str()?)?;
                    }
                    _ => break,
                }
            }
            branches.push(b);
        }
        let mut base: Map<String, Value> = m
            .iter()
            .filter(|(key, _)| OBJECT_KEYS.contains(&key.as_str()))
            .map(|(a, b)| (a.clone(), b.clone()))
            .collect();
        if k == "allOf" {
            for b in branches {
                match merge_objects(&base, b)? {
                    Some(x) => base = x,
                    None => return Some(Vec::new()),
                }
            }
            return Some(vec![Value::Object(base)]);
        }
        let mut out = Vec::with_capacity(branches.len());
        for b in branches {
            if let Some(x) = merge_objects(&base, b)? {
                out.push(Value::Object(x));
            }
        }
        Some(out)
    }

    /// The terminal defined as `def` (one per distinct definition), named `prefix` + a number.
    fn terminal(&mut self, prefix: &str, def: String) -> String {
        if let Some(t) = self.term_names.get(&def) {
            return t.clone();
        }
        let t = format!("{prefix}{}", self.fresh());
        let _ = writeln!(self.terminals, "{t}: {def}");
        self.term_names.insert(def, t.clone());
        t
    }

    /// The rule for exactly the JSON value `v`, its objects' keys in any order.
    fn constant(&mut self, v: &Value) -> Result<String, String> {
        if !value_needs(v) {
            let mut c = Map::new();
            c.insert("const".into(), v.clone());
            return self.leaf(&Value::Object(c));
        }
        match v {
            Value::Object(o) => {
                let mut props = Map::new();
                for (k, x) in o {
                    let mut c = Map::new();
                    c.insert("const".into(), x.clone());
                    props.insert(k.clone(), Value::Object(c));
                }
                let mut m = Map::new();
                m.insert("type".into(), Value::String("object".into()));
                m.insert("properties".into(), Value::Object(props));
                m.insert(
                    "required".into(),
                    Value::Array(o.keys().map(|k| Value::String(k.clone())).collect()),
                );
                m.insert("additionalProperties".into(), Value::Bool(false));
                self.object(&m, "(a constant)")?
                    .ok_or_else(|| "a constant object the lowering cannot express".to_string())
            }
            Value::Array(a) => {
                let mut items = Vec::with_capacity(a.len());
                for x in a {
                    items.push(self.constant(x)?);
                }
                let name = format!("c{}", self.fresh());
                let _ = writeln!(self.rules, "{name}: \"[\" {} \"]\"", items.join(" \",\" "));
                Ok(name)
            }
            _ => unreachable!("value_needs is false for scalars"),
        }
    }

    /// `rule`, or also the schema's other types (`type` absent or a list) as a leaf.
    fn with_other_types(
        &mut self,
        rule: String,
        types: &[&str],
        this: &str,
    ) -> Result<String, String> {
        let others: Vec<Value> = types
            .iter()
            .filter(|t| **t != this)
            .map(|t| Value::String(t.to_string()))
            .collect();
        if others.is_empty() {
            return Ok(rule);
        }
        let mut m = Map::new();
        m.insert("type".into(), Value::Array(others));
        let leaf = self.leaf(&Value::Object(m))?;
        let name = format!("u{}", self.fresh());
        let _ = writeln!(self.rules, "{name}: {rule} | {leaf}");
        Ok(name)
    }

    /// An object with `properties` / `required` / `additionalProperties` / `minProperties` /
    /// `maxProperties` as a parametric rule; `None` when it cannot be (kept, with why).
    fn object(&mut self, m: &Map<String, Value>, ptr: &str) -> Result<Option<String>, String> {
        let keep = |s: &mut Self, reason: String| {
            s.kept.push(OrderKept {
                pointer: ptr.to_string(),
                reason,
            });
            Ok(None)
        };
        let empty = Map::new();
        let props = match m.get("properties") {
            None => &empty,
            Some(Value::Object(p)) => p,
            Some(_) => return keep(self, "`properties` is not an object".into()),
        };
        let mut required: Vec<&str> = Vec::new();
        if let Some(r) = m.get("required") {
            let Some(r) = r.as_array() else {
                return keep(self, "`required` is not an array".into());
            };
            for x in r {
                let Some(s) = x.as_str() else {
                    return keep(self, "`required` holds a non-string".into());
                };
                if !required.contains(&s) {
                    required.push(s);
                }
            }
        }
        let additional = m.get("additionalProperties");
        let additional_allowed = !matches!(additional, Some(Value::Bool(false)));
        let patterns: Vec<(&String, &Value)> = match m.get("patternProperties") {
            None => Vec::new(),
            Some(Value::Object(p)) => p.iter().collect(),
            Some(_) => return keep(self, "`patternProperties` is not an object".into()),
        };
        // a key matching two patterns would have to meet both schemas: several patterns only
        // when no key matches two (as the JSON compiler decides it)
        if patterns.len() > 1 {
            let pats: Vec<&str> = patterns.iter().map(|(p, _)| p.as_str()).collect();
            if !(self.o.disjoint)(&pats) {
                return keep(
                    self,
                    "`patternProperties` whose patterns overlap: left to the JSON compiler".into(),
                );
            }
        }
        // per pattern: the declared names it matches, and when keys must be told apart by it
        // (an additional key matches no pattern; a pattern key is no declared name), its
        // regex over raw key text: such keys are then written without escapes
        let mut raw: Vec<Option<String>> = Vec::with_capacity(patterns.len());
        let mut matched: Vec<Vec<&str>> = Vec::with_capacity(patterns.len());
        for (pat, _) in &patterns {
            let Some(rx) = ascii_regex(pat) else {
                return keep(self, format!("pattern {pat:?} of `patternProperties`"));
            };
            let names: Vec<&str> = props
                .keys()
                .map(String::as_str)
                .chain(required.iter().copied())
                .filter(|name| rx.is_match(name.as_bytes()))
                .collect();
            if additional_allowed || !names.is_empty() {
                let Some(r) = raw_search_regex(pat) else {
                    return keep(
                        self,
                        format!("pattern {pat:?} of `patternProperties` has anchors inside"),
                    );
                };
                raw.push(Some(r));
            } else {
                raw.push(None);
            }
            matched.push(names);
        }
        // a declared key a pattern matches meets both schemas
        let with_patterns = |name: &str, s: Option<&Value>| -> Option<Value> {
            let mut all: Vec<Value> = s.into_iter().cloned().collect();
            for (j, (_, ps)) in patterns.iter().enumerate() {
                if matched[j].contains(&name)
                    && **ps != Value::Bool(true)
                    && **ps != Value::Object(Map::new())
                {
                    all.push((*ps).clone());
                }
            }
            match all.len() {
                0 => None,
                1 => all.pop(),
                _ => {
                    if all.contains(&Value::Bool(false)) {
                        return Some(Value::Bool(false));
                    }
                    Some(serde_json::json!({ "allOf": all }))
                }
            }
        };
        let open_keys = additional_allowed || !patterns.is_empty();
        let count = |k: &str| -> Result<Option<usize>, ()> {
            match m.get(k) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .or_else(|| {
                        v.as_f64()
                            .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                            .map(|f| f as u64)
                    })
                    .map(|n| Some(n.min(u32::MAX as u64) as usize))
                    .ok_or(()),
            }
        };
        let (Ok(min_p), Ok(max_p)) = (count("minProperties"), count("maxProperties")) else {
            return keep(
                self,
                "`minProperties` / `maxProperties` is not a count".into(),
            );
        };
        // declared keys: required ones first (the low bits), each with its value schema
        let mut declared: Vec<(&str, Option<Value>)> = Vec::new();
        for &r in &required {
            let own = match props.get(r) {
                Some(s) => Some(s),
                // a required key no property declares: a pattern's or the additional schema
                None if matched.iter().any(|m| m.contains(&r)) => None,
                None => match additional {
                    Some(Value::Bool(false)) => {
                        return keep(self, format!("required property {r:?} is not allowed"))
                    }
                    other => other,
                },
            };
            match with_patterns(r, own) {
                Some(x) if never(&x) => {
                    return Err(format!(
                        "{UNSATISFIABLE}required property {r:?} at `{ptr}` admits no value"
                    ))
                }
                s => declared.push((r, s)),
            }
        }
        let n_required = declared.len();
        let mut forbidden: Vec<&str> = Vec::new();
        for (k, s) in props {
            if required.contains(&k.as_str()) {
                continue;
            }
            match with_patterns(k, Some(s)) {
                Some(x) if never(&x) => forbidden.push(k),
                s => declared.push((k, s)),
            }
        }
        let n = declared.len();
        // thermometer bits counting additional keys, when a property count is bounded
        let counted = open_keys && (min_p.is_some() || max_p.is_some());
        // (up to `maxProperties` additional keys; with only `minProperties`, the count
        // saturates there)
        let therm = if counted {
            max_p.or(min_p).unwrap_or(0)
        } else {
            0
        };
        if n + therm > MAX_OBJECT_BITS {
            return keep(
                self,
                format!(
                    "{n} declared keys{}: more than {MAX_OBJECT_BITS} in one object",
                    if therm > 0 {
                        format!(" and {therm} counted additional ones")
                    } else {
                        String::new()
                    }
                ),
            );
        }
        if let (Some(mn), Some(mx)) = (min_p, max_p) {
            if mn > mx {
                return keep(self, "`minProperties` is above `maxProperties`".into());
            }
        }
        if max_p.is_some_and(|mx| mx < n_required) {
            return keep(self, "`maxProperties` is below the required keys".into());
        }
        if min_p.is_some_and(|mn| mn > n + therm) && !open_keys {
            return keep(self, "`minProperties` is above the keys allowed".into());
        }
        let id = self.fresh();
        self.objects += 1;
        // values
        let mut values = Vec::with_capacity(n);
        for (k, s) in &declared {
            let p = child(&child(ptr, "properties"), k);
            values.push(match s {
                Some(s) => self.node(s, &p)?,
                None => self.leaf(&Value::Object(Map::new()))?,
            });
        }
        // terminals, shared between objects with the same definition
        let mut names = Vec::with_capacity(n + forbidden.len());
        for (k, _) in &declared {
            names.push(self.terminal("K", format!("/{}/", key_regex(k))));
        }
        let mut all_names = names.clone();
        for k in &forbidden {
            all_names.push(self.terminal("K", format!("/{}/", key_regex(k))));
        }
        let not_names = if all_names.is_empty() {
            String::new()
        } else {
            format!(" & ~({})", all_names.join(" | "))
        };
        // keys beyond the declared ones: (key, value) per pattern, then the additional ones
        let mut extras: Vec<(String, String)> = Vec::new();
        for (j, (pat, sch)) in patterns.iter().enumerate() {
            if matches!(sch, Value::Bool(false)) {
                continue;
            }
            let k = if let (Some(rx), false) = (&raw[j], matched[j].is_empty()) {
                // a key the pattern matches that no declared name spells
                self.terminal("P", format!("/{RAW_KEY}/ & /{rx}/{not_names}"))
            } else {
                let mut key = Map::new();
                key.insert("type".into(), Value::String("string".into()));
                key.insert("pattern".into(), Value::String((*pat).clone()));
                self.leaf(&Value::Object(key))?
            };
            let v = self.node(sch, &child(&child(ptr, "patternProperties"), pat))?;
            extras.push((k, v));
        }
        if additional_allowed {
            let pats: Vec<String> = raw.iter().flatten().map(|r| format!("/{r}/")).collect();
            let xname = if pats.is_empty() {
                let body = format!("/\"{}\"/", STRING_BODY.replace('/', "\\/"));
                self.terminal("X", format!("{body}{not_names}"))
            } else {
                self.terminal(
                    "X",
                    format!("/{RAW_KEY}/{not_names} & ~({})", pats.join(" | ")),
                )
            };
            let v = match additional {
                Some(s @ Value::Object(_)) => {
                    self.node(s, &format!("{ptr}/additionalProperties"))?
                }
                _ => self.leaf(&Value::Object(Map::new()))?,
            };
            extras.push((xname, v));
        }
        // conditions
        let mut end = Vec::new();
        if n_required > 0 {
            end.push(format!("is_ones([0:{n_required}])"));
        }
        if let Some(mn) = min_p.filter(|&mn| mn > 0) {
            end.push(format!("bit_count_ge(_, {mn})"));
        }
        let room = max_p.map(|mx| format!("bit_count_lt(_, {mx})"));
        let (a, b) = (format!("o{id}_a"), format!("o{id}_b"));
        if n == 0 && therm == 0 && end.is_empty() {
            // nothing to count: plain rules (llguidance refuses a parameter nothing uses)
            for (rule, comma) in [(&a, ""), (&b, "\",\" ")] {
                let mut alts = vec!["\"\"".to_string()];
                for (key, x) in &extras {
                    alts.push(format!("{comma}{key} \":\" {x} {b}"));
                }
                let _ = writeln!(self.rules, "{rule}: {}", alts.join("\n    | "));
            }
            let name = format!("o{id}");
            let _ = writeln!(self.rules, "{name}: \"{{\" {a} \"}}\"");
            return Ok(Some(name));
        }
        for (rule, comma) in [(&a, ""), (&b, "\",\" ")] {
            let mut alts = Vec::new();
            alts.push(match and_all(end.clone()) {
                Some(c) => format!("\"\" %if {c}"),
                None => "\"\"".to_string(),
            });
            for (i, t) in names.iter().enumerate() {
                let mut c = vec![format!("bit_clear({i})")];
                c.extend(room.clone());
                let cond = and_all(c).expect("one condition");
                alts.push(format!(
                    "{comma}{t} \":\" {} {b}::set_bit({i}) %if {cond}",
                    values[i]
                ));
            }
            for (key, x) in &extras {
                if therm == 0 {
                    let tail = match and_all(room.clone().into_iter().collect()) {
                        Some(c) => format!(" %if {c}"),
                        None => String::new(),
                    };
                    alts.push(format!("{comma}{key} \":\" {x} {b}::_{tail}"));
                } else {
                    for j in 0..therm {
                        let bit = n + j;
                        let mut c = vec![format!("bit_clear({bit})")];
                        if j > 0 {
                            c.push(format!("bit_set({})", bit - 1));
                        }
                        c.extend(room.clone());
                        let cond = and_all(c).expect("one condition");
                        alts.push(format!(
                            "{comma}{key} \":\" {x} {b}::set_bit({bit}) %if {cond}"
                        ));
                    }
                    if max_p.is_none() {
                        // past the minimum: further additional keys need no count
                        alts.push(format!(
                            "{comma}{key} \":\" {x} {b}::_ %if bit_set({})",
                            n + therm - 1
                        ));
                    }
                }
            }
            let _ = writeln!(self.rules, "{rule}::_ : {}", alts.join("\n    | "));
        }
        let name = format!("o{id}");
        let _ = writeln!(self.rules, "{name}: \"{{\" {a}::0x0 \"}}\"");
        Ok(Some(name))
    }

    /// An array of `items` (any when absent) with `minItems` / `maxItems`.
    fn array(&mut self, m: &Map<String, Value>, ptr: &str) -> Result<String, String> {
        let item = match m.get("items") {
            None | Some(Value::Bool(true)) => self.leaf(&Value::Object(Map::new()))?,
            Some(s) => self.node(s, &format!("{ptr}/items"))?,
        };
        let get = |k: &str| {
            m.get(k)
                .and_then(Value::as_u64)
                .map(|n| n.min(u32::MAX as u64) as usize)
        };
        let min = get("minItems").unwrap_or(0);
        let max = get("maxItems");
        let name = format!("a{}", self.fresh());
        let rest = match (min.saturating_sub(1), max.map(|x| x.saturating_sub(1))) {
            (0, None) => format!("(\",\" {item})*"),
            (lo, None) => format!("(\",\" {item}){{{lo},}}"),
            (lo, Some(hi)) => format!("(\",\" {item}){{{lo},{hi}}}"),
        };
        let body = match (min, max) {
            (_, Some(0)) => "\"[\" \"]\"".to_string(),
            (0, _) => format!("\"[\" \"]\" | \"[\" {item} {rest} \"]\""),
            _ => format!("\"[\" {item} {rest} \"]\""),
        };
        if let (Some(hi), true) = (max, min > max.unwrap_or(usize::MAX)) {
            return Err(format!(
                "{UNSATISFIABLE}`minItems` above `maxItems` ({hi}) at `{ptr}`"
            ));
        }
        let _ = writeln!(self.rules, "{name}: {body}");
        Ok(name)
    }

    /// `v` compiled by llguidance's JSON compiler, with the definitions its `$ref`s reach.
    fn leaf(&mut self, v: &Value) -> Result<String, String> {
        let mut leaf = match v {
            Value::Object(_) => v.clone(),
            Value::Bool(true) => Value::Object(Map::new()),
            Value::Bool(false) => return Err(format!("{UNSATISFIABLE}a `false` subschema")),
            _ => return Err("a subschema that is not an object".into()),
        };
        let mut defs = Map::new();
        let mut moved: HashMap<String, String> = HashMap::new();
        let mut todo: Vec<Value> = Vec::new();
        self.rewrite_refs(&mut leaf, &mut moved, &mut todo)?;
        while let Some(t) = todo.pop() {
            let (name, mut body) = match t {
                Value::Array(mut a) if a.len() == 2 => {
                    let body = a.pop().expect("two");
                    let name = a.pop().expect("two");
                    (name.as_str().unwrap_or_default().to_string(), body)
                }
                _ => return Err("internal: a moved definition".into()),
            };
            self.rewrite_refs(&mut body, &mut moved, &mut todo)?;
            defs.insert(name, body);
        }
        if let Value::Object(m) = &mut leaf {
            m.remove("$defs");
            m.remove("definitions");
            m.remove("$id");
            m.remove("$schema");
            if !defs.is_empty() {
                m.insert("$defs".into(), Value::Object(defs));
            }
            m.insert("x-guidance".into(), self.o.x_guidance.clone());
        }
        let text = serde_json::to_string(&leaf).map_err(|e| e.to_string())?;
        if let Some(name) = self.term_names.get(&text) {
            return Ok(name.clone());
        }
        let name = format!("j{}", self.fresh());
        self.term_names.insert(text.clone(), name.clone());
        self.leaf_budget = self.leaf_budget.checked_sub(text.len()).ok_or_else(|| {
            format!(
                "the any-order grammar would copy the definitions its leaves use more than \
                 {LEAF_COPIES} times over"
            )
        })?;
        let _ = writeln!(self.rules, "{name}: %json {text}");
        Ok(name)
    }

    /// Points every `$ref` in `v` (outside `$defs` / `definitions`, which are not schemas
    /// here) at a moved copy of its target under `$defs`.
    fn rewrite_refs(
        &self,
        v: &mut Value,
        moved: &mut HashMap<String, String>,
        todo: &mut Vec<Value>,
    ) -> Result<(), String> {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get_mut("$ref") {
                    let name = match moved.get(r.as_str()) {
                        Some(n) => n.clone(),
                        None => {
                            let target = resolve(self.root, r).ok_or_else(|| {
                                format!("`$ref` {r:?} is not a pointer into the schema")
                            })?;
                            let n = format!("nextok_{}", moved.len());
                            moved.insert(r.clone(), n.clone());
                            let mut t = target.clone();
                            if let Value::Object(tm) = &mut t {
                                tm.remove("$defs");
                                tm.remove("definitions");
                                tm.remove("$id");
                            }
                            todo.push(Value::Array(vec![Value::String(n.clone()), t]));
                            n
                        }
                    };
                    *r = format!("#/$defs/{name}");
                }
                for (k, x) in m.iter_mut() {
                    match x {
                        Value::Object(sub) if SCHEMA_MAPS.contains(&k.as_str()) => {
                            for y in sub.values_mut() {
                                if y.is_object() {
                                    self.rewrite_refs(y, moved, todo)?;
                                }
                            }
                        }
                        Value::Array(list) if SCHEMA_LISTS.contains(&k.as_str()) => {
                            for y in list {
                                self.rewrite_refs(y, moved, todo)?;
                            }
                        }
                        Value::Object(_) if SCHEMA_VALUED.contains(&k.as_str()) => {
                            self.rewrite_refs(x, moved, todo)?;
                        }
                        _ => {}
                    }
                }
                Ok(())
            }
            Value::Array(a) => {
                for x in a {
                    self.rewrite_refs(x, moved, todo)?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn opts() -> LowerOptions<'static> {
        LowerOptions {
            whitespace_flexible: true,
            coerce_one_of: false,
            x_guidance: json!({}),
            disjoint: &|_| false,
        }
    }

    #[test]
    fn key_regexes_spell_every_escape() {
        let rx = regex_automata::meta::Regex::new(&format!(
            "^(?:{})$",
            key_regex("a/\"é").replace("\\/", "/")
        ))
        .unwrap();
        for ok in [
            r#""a/\"é""#,
            r#""\u0061\/\u0022\u00e9""#,
            r#""a\u002F\u0022\u00E9""#,
        ] {
            // `\/` is not an escape llguidance's strings take
            let want = !ok.contains(r"\/");
            assert_eq!(rx.is_match(ok), want, "{ok}");
        }
        assert!(!rx.is_match(r#""b/\"é""#));
    }

    #[test]
    fn nothing_to_lower_is_none() {
        let s = json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": false});
        assert!(lower(&s, &opts()).unwrap().is_none());
        let s = json!({"type": "array", "items": {"type": "integer"}});
        assert!(lower(&s, &opts()).unwrap().is_none());
    }

    #[test]
    fn objects_are_counted_and_kept_ones_say_why() {
        let s = json!({
            "type": "object",
            "properties": {
                "a": {"type": "object", "properties": {"x": {}, "y": {}}},
                "b": {"type": "object", "properties": {"x": {}, "y": {}}, "propertyNames": {"maxLength": 3}}
            },
            "required": ["a"]
        });
        let l = lower(&s, &opts()).unwrap().unwrap();
        assert_eq!(l.objects, 2, "{}", l.lark);
        assert_eq!(l.kept.len(), 1);
        assert_eq!(l.kept[0].pointer, "/properties/b");
        assert!(l.kept[0].reason.contains("propertyNames"), "{:?}", l.kept);
    }

    #[test]
    fn refs_outside_the_document_are_refused() {
        let s = json!({"type": "object", "properties": {"a": {"$ref": "other.json#/x"}, "b": {}}});
        assert!(lower(&s, &opts()).is_err());
    }
}
