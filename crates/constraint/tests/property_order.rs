//! Objects in any property order (`property_order: any`), checked with the real Llama-3
//! tokenizer:
//!
//! - on the maskbench subset (when present beside the repository), every valid instance the
//!   mask accepts is accepted in other key orders (random permutations of every object's keys,
//!   a few per instance) in schemas that keep no object in schema order; an instance with a
//!   declared key of its top object written twice, or without a required key of it, is
//!   rejected;
//! - on random small object schemas (nested objects, `required`, `additionalProperties` as
//!   `false` / a schema / absent, `min/maxProperties`, `patternProperties`), the mask accepts a
//!   random instance in a random key order exactly when the `jsonschema` validator accepts it
//!   and no declared key is written twice (undeclared keys are not tracked: there are
//!   unboundedly many);
//! - by hand: escaped spellings of declared names, duplicates, missing required keys, counts.

mod support;

use std::path::Path;
use std::sync::Arc;

use nextok_constraint::{
    json_text_for_mask, CompiledConstraint, ConstraintErrorKind, ConstraintSpec, JsonOptions,
    PropertyOrder, SchemaMode,
};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

fn any_order(schema: &Value, mode: SchemaMode) -> ConstraintSpec {
    ConstraintSpec::JsonSchema {
        schema: schema.clone(),
        options: JsonOptions {
            schema_mode: mode,
            property_order: Some(PropertyOrder::Any),
            ..Default::default()
        },
    }
}

/// Whether the mask accepts `text` (as the model would write it) to the end.
fn accepts(c: &Arc<CompiledConstraint>, text: &str) -> bool {
    let (_, enc) = support::llama3().expect("checked by the caller");
    let ids = enc.encode(&json_text_for_mask(text), false).unwrap();
    support::run(&mut c.start(), &ids).is_ok()
}

/// A small deterministic generator (xorshift), so that the maskbench part needs no seed file.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// `v` as compact JSON with every object's keys in a random order.
fn shuffled(v: &Value, rng: &mut Rng) -> String {
    match v {
        Value::Object(m) => {
            let mut entries: Vec<(&String, &Value)> = m.iter().collect();
            for i in (1..entries.len()).rev() {
                let j = rng.below(i + 1);
                entries.swap(i, j);
            }
            let parts: Vec<String> = entries
                .iter()
                .map(|(k, x)| format!("{}:{}", Value::String((*k).clone()), shuffled(x, rng)))
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(a) => {
            let parts: Vec<String> = a.iter().map(|x| shuffled(x, rng)).collect();
            format!("[{}]", parts.join(","))
        }
        _ => v.to_string(),
    }
}

/// Compact JSON of `entries` as one object, in that order (duplicates kept).
fn object_text(entries: &[(String, String)]) -> String {
    let parts: Vec<String> = entries
        .iter()
        .map(|(k, v)| format!("{}:{v}", Value::String(k.clone())))
        .collect();
    format!("{{{}}}", parts.join(","))
}

#[derive(Default, Debug)]
struct Tally {
    schemas: usize,
    lowered: usize,
    permutations: usize,
    duplicates: usize,
    missing: usize,
    failures: Vec<String>,
}

fn run_maskbench(dir: &Path, sample: usize) -> Tally {
    let (engine, _) = support::llama3().expect("checked by the caller");
    let mut t = Tally::default();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for p in support::schema_files(dir, sample) {
        let v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        let Ok(c) = engine.compile(&any_order(&v["schema"], SchemaMode::Relaxed)) else {
            continue;
        };
        t.schemas += 1;
        let report = c.schema_report().expect("json_schema");
        if report.property_order != PropertyOrder::Any || !report.order_kept.is_empty() {
            continue;
        }
        t.lowered += 1;
        let root = &v["schema"];
        for (i, test) in v["tests"].as_array().into_iter().flatten().enumerate() {
            if !test["valid"].as_bool().unwrap_or(true) {
                continue;
            }
            let data = &test["data"];
            let compact = serde_json::to_string(data).unwrap();
            if !accepts(&c, &compact) {
                continue; // refused for another reason than order (the suite reports those)
            }
            for _ in 0..3 {
                let text = shuffled(data, &mut rng);
                t.permutations += 1;
                if !accepts(&c, &text) {
                    t.failures
                        .push(format!("{name} test {i}: a permutation is refused: {text}"));
                }
            }
            let Some(obj) = data.as_object() else {
                continue;
            };
            let entries: Vec<(String, String)> = obj
                .iter()
                .map(|(k, x)| (k.clone(), x.to_string()))
                .collect();
            let declared = root.get("properties").and_then(Value::as_object);
            // a declared key of the top object twice
            if let Some((k, x)) = entries
                .iter()
                .find(|(k, _)| declared.is_some_and(|d| d.contains_key(k)))
            {
                let mut twice = entries.clone();
                twice.push((k.clone(), x.clone()));
                let text = object_text(&twice);
                t.duplicates += 1;
                if accepts(&c, &text) {
                    t.failures.push(format!(
                        "{name} test {i}: a duplicate key is accepted: {text}"
                    ));
                }
            }
            // a required key of the top object left out
            let required: Vec<&str> = root
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if let Some(k) = required.iter().find(|k| obj.contains_key(**k)) {
                let fewer: Vec<(String, String)> =
                    entries.iter().filter(|(x, _)| x != k).cloned().collect();
                let text = object_text(&fewer);
                t.missing += 1;
                if accepts(&c, &text) {
                    t.failures.push(format!(
                        "{name} test {i}: required {k:?} left out is accepted: {text}"
                    ));
                }
            }
        }
    }
    t
}

/// The maskbench subset (`NEXTOK_MASKBENCH_SAMPLE=n` checks every n-th schema; default 10).
#[test]
fn maskbench_permutations_duplicates_and_missing_keys() {
    let Some(dir) = support::maskbench_dir("the maskbench permutations") else {
        return;
    };
    if support::llama3().is_none() {
        return;
    }
    let t = run_maskbench(&dir, support::maskbench_sample());
    eprintln!(
        "maskbench any order: {} schemas, {} with every object in any order; {} permutations, \
         {} duplicate-key and {} missing-key instances; {} failures",
        t.schemas,
        t.lowered,
        t.permutations,
        t.duplicates,
        t.missing,
        t.failures.len()
    );
    assert!(
        t.lowered > 0 && t.permutations > 0 && t.duplicates > 0 && t.missing > 0,
        "{t:?}"
    );
    assert!(
        t.failures.is_empty(),
        "{:#?}",
        &t.failures[..t.failures.len().min(20)]
    );
}

#[test]
fn escaped_names_duplicates_required_and_counts() {
    let Some((engine, _)) = support::llama3() else {
        return;
    };
    let schema = json!({
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b/é": {"type": "string"}, "c": {"type": "boolean"}},
        "required": ["a", "c"],
        "additionalProperties": false
    });
    let c = engine
        .compile(&any_order(&schema, SchemaMode::Strict))
        .unwrap();
    let report = c.schema_report().unwrap();
    assert_eq!(report.property_order, PropertyOrder::Any);
    assert_eq!(report.objects_any_order, 1);
    assert!(
        report.summary().contains("properties in any order"),
        "{}",
        report.summary()
    );
    for ok in [
        r#"{"a":1,"b/é":"x","c":true}"#,
        r#"{"c":true,"a":1}"#,
        r#"{"b/é":"x","c":false,"a":-3}"#,
        // escaped spellings of a declared name are that name
        r#"{"\u0061":1,"c":true}"#,
        r#"{"b/\u00e9":"x","a":1,"c":true}"#,
        r#"{"b/\u00E9":"x","a":1,"c":true}"#,
        r#"{ "c" : true , "a" : 2 }"#,
    ] {
        assert!(accepts(&c, ok), "refused: {ok}");
    }
    for bad in [
        r#"{"a":1,"a":2,"c":true}"#,
        r#"{"a":1,"c":true,"\u0061":2}"#,
        r#"{"a":1}"#,
        r#"{"c":true}"#,
        r#"{"a":"1","c":true}"#,
        r#"{"a":1,"c":true,"d":1}"#,
        r#"{"a":1,"c":true,"b/é":2}"#,
        r#"{}"#,
    ] {
        assert!(!accepts(&c, bad), "accepted: {bad}");
    }
    // counts with additional properties: the declared ones and the others together
    let schema = json!({
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "additionalProperties": {"type": "integer"},
        "minProperties": 2,
        "maxProperties": 3
    });
    let c = engine
        .compile(&any_order(&schema, SchemaMode::Strict))
        .unwrap();
    for ok in [
        r#"{"x":1,"a":2}"#,
        r#"{"x":1,"y":2}"#,
        r#"{"x":1,"a":2,"y":3}"#,
    ] {
        assert!(accepts(&c, ok), "refused: {ok}");
    }
    for bad in [
        r#"{"a":2}"#,
        r#"{"x":1}"#,
        r#"{"x":1,"a":2,"y":3,"z":4}"#,
        r#"{"x":"s","a":2}"#,
    ] {
        assert!(!accepts(&c, bad), "accepted: {bad}");
    }
    // several patterns: lowered when no key matches two, else left to the JSON compiler
    let two = |a: &str, b: &str| {
        json!({"type": "object", "properties": {"k": {"type": "integer"}},
               "patternProperties": {a: {"type": "integer"}, b: {"type": "boolean"}},
               "additionalProperties": false})
    };
    let c = engine
        .compile(&any_order(&two("^x", "^y"), SchemaMode::Strict))
        .unwrap();
    let r = c.schema_report().unwrap();
    assert!(
        r.order_kept.is_empty() && r.objects_any_order == 1,
        "{:?}",
        r.order_kept
    );
    assert!(accepts(&c, r#"{"y1":true,"x1":1,"k":2}"#));
    assert!(!accepts(&c, r#"{"y1":1,"k":2}"#) && !accepts(&c, r#"{"z":1}"#));
    // overlapping ones: refused in strict mode as in schema order; relaxed mode drops them
    // (checked after generation) and lowers the rest
    let e = engine
        .compile(&any_order(&two("^x", "1$"), SchemaMode::Strict))
        .unwrap_err();
    assert_eq!(e.kind(), ConstraintErrorKind::Unsupported, "{e}");
    assert!(e.to_string().contains("patternProperties"), "{e}");
    let c = engine
        .compile(&any_order(&two("^x", "1$"), SchemaMode::Relaxed))
        .unwrap();
    let r = c.schema_report().unwrap();
    assert_eq!(
        r.post_keywords(),
        ["additionalProperties", "patternProperties"]
    );
    assert!(accepts(&c, r#"{"x1":true,"k":2}"#));
    // schema order, asked for, still refuses another order; relaxed mode defaults to any
    let ordered = ConstraintSpec::JsonSchema {
        schema: json!({"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a", "b"]}),
        options: JsonOptions::default(),
    };
    let c = engine.compile(&ordered).unwrap();
    assert_eq!(
        c.schema_report().unwrap().property_order,
        PropertyOrder::Schema
    );
    assert!(accepts(&c, r#"{"a":1,"b":2}"#) && !accepts(&c, r#"{"b":2,"a":1}"#));
    let relaxed = ConstraintSpec::JsonSchema {
        schema: json!({"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a", "b"]}),
        options: JsonOptions {
            schema_mode: SchemaMode::Relaxed,
            ..Default::default()
        },
    };
    let c = engine.compile(&relaxed).unwrap();
    assert_eq!(
        c.schema_report().unwrap().property_order,
        PropertyOrder::Any
    );
    assert!(accepts(&c, r#"{"b":2,"a":1}"#));
}

/// A random small object schema: up to five properties of simple types or nested objects.
fn small_schema() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(json!({"type": "integer"})),
        Just(json!({"type": "string", "maxLength": 3})),
        Just(json!({"type": "boolean"})),
        Just(json!({"enum": [1, "x"]})),
    ];
    let object = |inner: BoxedStrategy<Value>| {
        (
            proptest::collection::btree_map("[a-e]", inner, 0..5),
            proptest::collection::vec(any::<bool>(), 5),
            0..4u8,
            proptest::option::of(0..4usize),
            proptest::option::of(1..5usize),
            any::<bool>(),
        )
            .prop_map(|(props, req, extra, min, max, pattern)| {
                let n_props = props.len();
                let required: Vec<Value> = props
                    .keys()
                    .zip(req)
                    .filter(|(_, r)| *r)
                    .map(|(k, _)| Value::String(k.clone()))
                    .collect();
                let mut m = Map::new();
                m.insert("type".into(), json!("object"));
                m.insert(
                    "properties".into(),
                    Value::Object(props.into_iter().collect()),
                );
                if !required.is_empty() {
                    m.insert("required".into(), Value::Array(required));
                }
                match extra {
                    0 => {}
                    1 => {
                        m.insert("additionalProperties".into(), json!(false));
                    }
                    2 => {
                        m.insert("additionalProperties".into(), json!({"type": "integer"}));
                    }
                    _ => {
                        m.insert("additionalProperties".into(), json!(true));
                    }
                }
                if pattern {
                    m.insert(
                        "patternProperties".into(),
                        json!({"^z": {"type": "boolean"}}),
                    );
                }
                // at most as many as can be written (more is another test: unsatisfiable)
                let min = min.map(|n| {
                    if extra == 1 && !pattern {
                        n.min(n_props)
                    } else {
                        n
                    }
                });
                if let Some(min) = min {
                    m.insert("minProperties".into(), json!(min));
                }
                if let Some(max) = max {
                    m.insert("maxProperties".into(), json!(max.max(min.unwrap_or(0))));
                }
                Value::Object(m)
            })
    };
    let nested = object(leaf.clone().boxed()).boxed();
    object(prop_oneof![3 => leaf, 1 => nested].boxed())
}

/// A random instance for an object schema: keys from the declared ones and a few others, in a
/// random order, sometimes one twice; values of random types.
fn instance() -> impl Strategy<Value = Vec<(String, String)>> {
    let value = prop_oneof![
        (-3i64..3).prop_map(|i| i.to_string()),
        "[a-c]{0,4}".prop_map(|s| Value::String(s).to_string()),
        any::<bool>().prop_map(|b| b.to_string()),
        Just(r#"{"a":1}"#.to_string()),
        Just(r#"{"b":"x","a":2}"#.to_string()),
        Just("{}".to_string()),
    ];
    proptest::collection::vec(("[a-f]|z[a-b]", value), 0..6)
}

proptest! {
    // 128 cases unless PROPTEST_CASES says otherwise
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(128)
    ))]

    #[test]
    fn the_mask_agrees_with_the_validator_in_every_order(
        schema in small_schema(),
        instances in proptest::collection::vec(instance(), 8),
    ) {
        let Some((engine, _)) = support::llama3() else {
            return Ok(());
        };
        let c = match engine.compile(&any_order(&schema, SchemaMode::Strict)) {
            Ok(c) => c,
            // more required keys than maxProperties allows
            Err(e) if e.kind() == ConstraintErrorKind::Unsatisfiable => return Ok(()),
            Err(e) => panic!("{schema}: {e}"),
        };
        prop_assert_eq!(c.schema_report().unwrap().property_order, PropertyOrder::Any);
        prop_assert!(c.schema_report().unwrap().order_kept.is_empty());
        let validator = jsonschema::validator_for(&schema).unwrap();
        let declared = |k: &str| {
            schema["properties"].get(k).is_some()
                || schema["required"].as_array().is_some_and(|r| r.iter().any(|x| x == k))
        };
        for entries in instances {
            let text = object_text(&entries);
            let mut keys: Vec<&String> = entries.iter().map(|(k, _)| k).collect();
            keys.sort();
            let mut twice: Vec<&String> = keys.windows(2).filter(|w| w[0] == w[1]).map(|w| w[0]).collect();
            twice.dedup();
            let want = if twice.iter().any(|k| declared(k)) {
                // a declared key written twice: refused
                false
            } else if !twice.is_empty() {
                // other keys are not tracked (there are unboundedly many): a parser keeps the
                // last value, and the counts differ, so there is nothing to compare
                continue;
            } else {
                let value: Value = serde_json::from_str(&text).unwrap();
                validator.is_valid(&value)
            };
            prop_assert_eq!(accepts(&c, &text), want, "schema {} instance {}", schema, text);
        }
    }
}
