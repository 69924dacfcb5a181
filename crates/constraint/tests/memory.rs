//! Memory of JSON-schema constraints: small but deeply nested schemas (the issue's 60 nested
//! `properties`, 100-deep `items` and `additionalProperties`, 120-deep `items`) are refused by
//! [`Limits::max_schema_depth`] — and, allowed by a larger limit, compile and are checked after
//! generation without growing the process. Before, the check's validator ran each schema
//! through the `jsonschema` crate's process-wide meta-schema validator, which grew by about
//! 5 MB per level of nesting and kept it: 263 → 1,026 → 1,758 → 2,482 MB for three 1.9 KB
//! schemas.
//!
//! One test in its own binary, so that no other test shares the process whose memory it reads
//! (`VmRSS` and `VmHWM` of `/proc/self/status`; without `/proc` it says so and checks only
//! the errors).

use std::sync::Arc;

use nextok_constraint::{
    ConstraintEngine, ConstraintErrorKind, ConstraintSpec, ConstraintVocab, LimitKind, Limits,
};
use nextok_core::{TokenBytes, VocabInfo};
use serde_json::{json, Value};

/// The most the process may grow (resident, and at its peak) over the whole test.
const MAX_GROWTH_KB: u64 = 128 * 1024;

fn engine(limits: Limits) -> ConstraintEngine {
    let toks: Vec<&[u8]> = vec![
        b"</s>", b"[", b"]", b"{", b"}", b"\"", b":", b"1", b"a", b",",
    ];
    let bytes = TokenBytes::new(toks).unwrap();
    let info = VocabInfo {
        vocab_size: 10,
        eos_token_ids: vec![0],
        special_token_ids: vec![0],
    };
    let v = ConstraintVocab::new(&bytes, &info).unwrap();
    ConstraintEngine::new(Arc::new(v))
        .unwrap()
        .with_limits(limits)
}

/// `(VmRSS, VmHWM)` in kB, or `None` without `/proc`.
fn rss_kb() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// `depth` levels of `key` around an integer.
fn nested(key: &str, depth: usize) -> Value {
    let mut s = json!({"type": "integer"});
    for _ in 0..depth {
        s = match key {
            "items" => json!({"type": "array", "items": s}),
            "additionalProperties" => json!({"type": "object", "additionalProperties": s}),
            "prefixItems" => json!({"type": "array", "prefixItems": [s], "items": false}),
            "anyOf" => json!({"anyOf": [s, {"type": "null"}]}),
            _ => json!({"type": "object", "properties": {"a": s}, "required": ["a"]}),
        };
    }
    s
}

fn spec(schema: Value) -> ConstraintSpec {
    ConstraintSpec::JsonSchema {
        schema,
        options: Default::default(),
    }
}

#[test]
fn deep_schemas_are_refused_or_compiled_in_bounded_memory() {
    let issue = [
        ("properties", 60),
        ("items", 100),
        ("additionalProperties", 100),
        ("items", 120),
    ];
    // refused by default, naming the limit
    let e = engine(Limits::default());
    for (key, depth) in issue {
        let err = e.compile(&spec(nested(key, depth))).unwrap_err();
        assert_eq!(err.kind(), ConstraintErrorKind::Limit, "{err}");
        assert_eq!(err.limit(), Some(LimitKind::SchemaDepth), "{err}");
        assert!(err.to_string().contains("max_schema_depth"), "{err}");
        assert!(err.to_string().contains("64"), "{err}");
    }
    let start = rss_kb();
    if start.is_none() {
        eprintln!("notice: /proc/self/status is absent: memory growth not measured");
    }
    let report = |what: &str| {
        if let (Some((r0, h0)), Some((r, h))) = (start, rss_kb()) {
            eprintln!(
                "{what}: VmRSS {r} kB ({:+} kB), VmHWM {h} kB ({:+} kB)",
                r as i64 - r0 as i64,
                h as i64 - h0 as i64
            );
            assert!(
                r.saturating_sub(r0) < MAX_GROWTH_KB && h.saturating_sub(h0) < MAX_GROWTH_KB,
                "{what}: the process grew by {} kB resident, {} kB at its peak (bound {} kB)",
                r.saturating_sub(r0),
                h.saturating_sub(h0),
                MAX_GROWTH_KB
            );
        }
    };
    // within the default limit: differently shaped schemas 61 deep in JSON (before: ~150 to 300
    // MB each, kept), each compiled, checked after generation and dropped
    let e = engine(Limits::default());
    for key in [
        "items",
        "additionalProperties",
        "prefixItems",
        "anyOf",
        "properties",
    ] {
        // `items` and `additionalProperties` nest one JSON object a level, the others two
        let depth = match key {
            "items" | "additionalProperties" => 60,
            _ => 30,
        };
        let c = e
            .compile(&spec(nested(key, depth)))
            .unwrap_or_else(|err| panic!("{key} x{depth}: {err}"));
        let v = c.validate_output(b"1").unwrap();
        assert!(v.valid.is_some(), "{key}: {:?}", v.errors);
        assert!(c.estimated_bytes() > 0);
        drop(c);
        report(&format!("{key} x{depth}"));
    }
    // the issue's schemas under a larger limit: compiled and checked in bounded memory
    let e = engine(Limits {
        max_schema_depth: 1_000,
        ..Limits::default()
    });
    for (key, depth) in issue {
        let c = e
            .compile(&spec(nested(key, depth)))
            .unwrap_or_else(|err| panic!("{key} x{depth}: {err}"));
        let v = c.validate_output(b"1").unwrap();
        assert!(v.valid.is_some(), "{key}: {:?}", v.errors);
        drop(c);
        report(&format!("{key} x{depth} (max_schema_depth 1000)"));
    }
}
