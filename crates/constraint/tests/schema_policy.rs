//! JSON-schema keyword policy with the real Llama-3 tokenizer: the formats the mask enforces
//! (valid and invalid samples of each), strict refusals naming keyword and pointer, relaxed
//! compilation with its report and the post-generation validation, and `\u` escapes.

mod support;

use nextok_constraint::{
    json_text_for_mask, ConstraintSpec, Handling, JsonOptions, SchemaMode, Validation,
};
use serde_json::{json, Value};

fn spec(schema: Value, mode: SchemaMode) -> ConstraintSpec {
    ConstraintSpec::JsonSchema {
        schema,
        options: JsonOptions {
            schema_mode: mode,
            ..Default::default()
        },
    }
}

/// Whether the mask accepts `text` (respelled as [`json_text_for_mask`] does).
fn mask_accepts(c: &std::sync::Arc<nextok_constraint::CompiledConstraint>, text: &str) -> bool {
    let (_, enc) = support::llama3().expect("checked by caller");
    let ids = enc.encode(&json_text_for_mask(text), false).unwrap();
    support::run(&mut c.start(), &ids).is_ok()
}

#[test]
fn formats_are_enforced_by_the_mask() {
    let Some((engine, _)) = support::llama3() else {
        return;
    };
    let date_ok: &[&str] = &["2024-02-29", "1999-12-31", "2000-01-01"];
    let date_bad: &[&str] = &["2024-13-01", "2024-1-01", "2024-04-31", "24-01-01"];
    let uri_ok: &[&str] = &[
        "https://example.com/a/b?c=d&e=%20#frag",
        "urn:isbn:0451450523",
        "mailto:a@b.example",
        "http://[::1]:8080/",
        "ftp://user:pw@192.168.0.1/x",
        "file:///etc/hosts",
    ];
    let uri_bad: &[&str] = &[
        "example.com/x",
        "http://exa mple.com",
        "1http://x",
        "http://x/<y>",
        "https://e.com/%zz",
    ];
    let cases: &[(&str, &[&str], &[&str])] = &[
        ("date", date_ok, date_bad),
        ("full-date", date_ok, date_bad),
        (
            "time",
            &["12:34:56Z", "23:59:60+01:00", "08:00:00.123-05:30"],
            &["24:00:00Z", "12:34Z", "12:34:56", "12:60:00Z"],
        ),
        (
            "date-time",
            &["2024-01-02T03:04:05Z", "2024-01-02t03:04:05.5+02:00"],
            &[
                "2024-01-02 03:04:05Z",
                "2024-01-02T03:04:05",
                "2024-02-30T00:00:00Z",
            ],
        ),
        (
            "email",
            &["a.b@example.com", "x+y@sub.example.org", "u@[192.168.0.1]"],
            &["a@", "@b.com", "a b@c.com", "a..b@c.com"],
        ),
        (
            "uuid",
            &[
                "123e4567-e89b-12d3-a456-426614174000",
                "00000000-0000-0000-0000-000000000000",
            ],
            &[
                "123e4567e89b12d3a456426614174000",
                "123e4567-e89b-12d3-a456-42661417400g",
                "123e4567-e89b-12d3-a456-4266141740",
            ],
        ),
        ("uri", uri_ok, uri_bad),
        ("url", uri_ok, uri_bad),
        (
            "uri-reference",
            &[
                "/a/b?c",
                "../x",
                "#frag",
                "",
                "https://e.com",
                "//host/p",
                "a/b:c",
            ],
            &["a b", "http://x/<y>", ":x", "%zz"],
        ),
        (
            "ipv4",
            &["192.168.0.1", "0.0.0.0", "255.255.255.255"],
            &["256.1.1.1", "1.2.3", "01.2.3.4", "1.2.3.4.5"],
        ),
        (
            "ipv6",
            &[
                "::1",
                "2001:db8::8a2e:370:7334",
                "fe80::",
                "1:2:3:4:5:6:7:8",
                "::ffff:192.168.0.1",
            ],
            &["1:2:3:4:5:6:7:8:9", "::g", "1::2::3", "12345::"],
        ),
        (
            "hostname",
            &["example.com", "a-b.c", "localhost"],
            &["-a.com", "a..b", "a_b.com", "a-.com"],
        ),
        (
            "semver",
            &["1.0.0", "1.2.3-alpha.1+build.5", "0.0.0-0", "10.20.30"],
            &["1.0", "01.0.0", "1.0.0-", "1.0.0+", "1.0.0-01", "v1.0.0"],
        ),
    ];
    for (format, good, bad) in cases {
        for mode in [SchemaMode::Strict, SchemaMode::Relaxed] {
            let c = engine
                .compile(&spec(json!({"type": "string", "format": format}), mode))
                .unwrap_or_else(|e| panic!("{format}: {e}"));
            let report = c.schema_report().unwrap();
            assert_eq!(
                report.handling(&format!("format:{format}")),
                Some(Handling::Mask),
                "{format}: {report:?}"
            );
            for s in *good {
                let text = serde_json::to_string(s).unwrap();
                assert!(mask_accepts(&c, &text), "{format}: valid {s:?} rejected");
            }
            for s in *bad {
                let text = serde_json::to_string(s).unwrap();
                assert!(!mask_accepts(&c, &text), "{format}: invalid {s:?} accepted");
            }
            // nextok's own formats: the validator checks them with the same expressions
            if ["full-date", "url", "uri-reference", "semver"].contains(format) {
                for s in *good {
                    let v = c.validate_output(serde_json::to_string(s).unwrap().as_bytes());
                    assert_eq!(v.unwrap().valid, Some(true), "{format}: {s:?}");
                }
                for s in *bad {
                    let v = c.validate_output(serde_json::to_string(s).unwrap().as_bytes());
                    assert_eq!(v.unwrap().valid, Some(false), "{format}: {s:?}");
                }
            }
        }
    }
}

/// A schema with every keyword the mask cannot enforce exactly.
fn hard_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": true,
                     "contains": {"const": "x"}},
            "n": {"type": "integer", "not": {"const": 13}},
            "kind": {"type": "string"},
            "color": {"type": "string", "format": "color"},
            "v": {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]},
            "extra": {"type": "object", "patternProperties": {"^a": {"type": "integer"},
                      "^ab": {"type": "integer", "minimum": 5}}, "additionalProperties": false,
                      "propertyNames": {"maxLength": 3}}
        },
        "required": ["tags", "n"],
        "if": {"properties": {"kind": {"const": "big"}}, "required": ["kind"]},
        "then": {"properties": {"n": {"minimum": 100}}},
        "dependentRequired": {"kind": ["color"]},
        "maxProperties": 5
    })
}

#[test]
fn strict_refuses_with_keyword_and_pointer() {
    let Some((engine, _)) = support::llama3() else {
        return;
    };
    for (schema, keyword, pointer) in [
        (
            json!({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": true}}}),
            "uniqueItems",
            "`/properties/a`",
        ),
        (
            json!({"type": "object", "properties": {"a": {"not": {"type": "null"}}}}),
            "not",
            "`/properties/a`",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "string", "format": "color"}}}),
            "format",
            "`/properties/a`",
        ),
        (
            json!({"$defs": {"v": {"oneOf": [{"type": "integer"}, {"type": "number"}]}},
                   "$ref": "#/$defs/v"}),
            "oneOf",
            "`/$defs/v`",
        ),
    ] {
        let e = engine
            .compile(&spec(schema, SchemaMode::Strict))
            .expect_err(keyword);
        assert_eq!(e.keyword(), Some(keyword), "{e}");
        assert!(e.to_string().contains(pointer), "{e}");
        // the pointer is also readable on its own
        assert_eq!(
            e.pointer().map(|p| format!("`{p}`")).as_deref(),
            Some(pointer),
            "{e}"
        );
    }
}

#[test]
fn relaxed_masks_a_superset_and_validates_the_rest() {
    let Some((engine, _)) = support::llama3() else {
        return;
    };
    assert!(engine
        .compile(&spec(hard_schema(), SchemaMode::Strict))
        .is_err());
    let c = engine
        .compile(&spec(hard_schema(), SchemaMode::Relaxed))
        .unwrap();
    let r = c.schema_report().unwrap();
    assert_eq!(r.mode, SchemaMode::Relaxed);
    for k in [
        "uniqueItems",
        "contains",
        "not",
        "if",
        "then",
        "dependentRequired",
        "oneOf",
        "propertyNames",
    ] {
        assert_eq!(r.handling(k), Some(Handling::PostValidation), "{k}: {r:?}");
    }
    assert_eq!(r.handling("format:color"), Some(Handling::Unchecked));
    assert_eq!(r.handling("required"), Some(Handling::Mask));
    assert_eq!(r.handling("type"), Some(Handling::Mask));
    assert!(r
        .post_validation
        .iter()
        .any(|k| k.keyword == "not" && k.pointer == "/properties/n"));
    assert!(r.validator_error.is_none());
    assert!(
        r.summary().contains("not at /properties/n"),
        "{}",
        r.summary()
    );

    let good = r#"{"tags": ["x", "y"], "n": 1, "v": 2.5}"#;
    assert!(mask_accepts(&c, good));
    assert_eq!(
        c.validate_output(good.as_bytes()).unwrap().valid,
        Some(true)
    );
    // each of these passes the mask and fails one relaxed keyword
    for (bad, keyword) in [
        (r#"{"tags": ["x", "x"], "n": 1}"#, "uniqueItems"),
        (r#"{"tags": ["y"], "n": 1}"#, "contains"),
        (r#"{"tags": ["x"], "n": 13}"#, "not"),
        (r#"{"tags": ["x"], "n": 1, "kind": "big"}"#, "if/then"),
        (r#"{"tags": ["x"], "n": 1, "v": 3}"#, "oneOf"),
        (
            r#"{"tags": ["x"], "n": 1, "extra": {"abcd": 7}}"#,
            "propertyNames",
        ),
    ] {
        assert!(mask_accepts(&c, bad), "{keyword}: mask rejects {bad}");
        let v: Validation = c.validate_output(bad.as_bytes()).unwrap();
        assert_eq!(v.valid, Some(false), "{keyword}: {bad}");
        assert!(!v.errors.is_empty());
    }
    // the mask still enforces what it can
    assert!(!mask_accepts(&c, r#"{"tags": ["x"]}"#));
    assert!(!mask_accepts(&c, r#"{"tags": ["x"], "n": "1"}"#));
    // not JSON at all: invalid, never "valid"
    assert_eq!(c.validate_output(b"{\"tags\"").unwrap().valid, Some(false));
}

#[test]
fn relaxed_order_rule_and_escapes() {
    let Some((engine, _)) = support::llama3() else {
        return;
    };
    let schema = json!({"type": "object", "properties": {"a": {"type": "string"},
                        "b": {"type": "string", "pattern": "^[°a-z]+$"}}, "required": ["a", "b"]});
    let c = engine
        .compile(&spec(schema.clone(), SchemaMode::Strict))
        .unwrap();
    // `json.dumps` (ensure_ascii) spelling: \u escapes of non-control characters and a
    // surrogate pair; respelled for the mask, the value is the same
    let dumped = r#"{"a": "\u00b0C \ud83d\ude00 \/", "b": "\u00b0c"}"#;
    assert!(mask_accepts(&c, dumped));
    assert_eq!(
        c.validate_output(dumped.as_bytes()).unwrap().valid,
        Some(true)
    );
    // control escapes are kept and accepted
    assert!(mask_accepts(&c, r#"{"a": "x\u0001\n", "b": "z"}"#));
    // properties out of schema order: valid per the validator, refused by the mask
    let swapped = r#"{"b": "z", "a": "x"}"#;
    assert!(!mask_accepts(&c, swapped));
    assert_eq!(
        c.validate_output(swapped.as_bytes()).unwrap().valid,
        Some(true)
    );
}

#[test]
fn relaxed_drops_patterns_the_mask_cannot_take() {
    let Some((engine, _)) = support::llama3() else {
        return;
    };
    let schema = json!({"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^(?=.*[0-9])[a-z0-9]+$"},
        "n": {"type": "integer"}}, "required": ["code", "n"]});
    assert!(engine
        .compile(&spec(schema.clone(), SchemaMode::Strict))
        .is_err());
    let c = engine.compile(&spec(schema, SchemaMode::Relaxed)).unwrap();
    let r = c.schema_report().unwrap();
    assert_eq!(
        r.handling("pattern"),
        Some(Handling::PostValidation),
        "{r:?}"
    );
    assert_eq!(r.post_validation[0].pointer, "/properties/code");
    let no_digit = r#"{"code": "abc", "n": 1}"#;
    assert!(mask_accepts(&c, no_digit));
    assert_eq!(
        c.validate_output(no_digit.as_bytes()).unwrap().valid,
        Some(false)
    );
    let ok = r#"{"code": "ab1", "n": 1}"#;
    assert!(mask_accepts(&c, ok));
    assert_eq!(c.validate_output(ok.as_bytes()).unwrap().valid, Some(true));
    assert!(!mask_accepts(&c, r#"{"code": "ab1", "n": "1"}"#));
}

#[test]
fn formats_on_non_strings_and_the_validator_limit() {
    let Some((engine, _)) = support::llama3() else {
        return;
    };
    // `format` on an integer: nobody checks it; strict compiles as llguidance always did
    let s = json!({"type": "object", "properties": {"n": {"type": "integer", "format": "int32"}}});
    let c = engine
        .compile(&spec(s.clone(), SchemaMode::Strict))
        .unwrap();
    let r = c.schema_report().unwrap();
    assert_eq!(
        r.handling("format:int32"),
        Some(Handling::Unchecked),
        "{r:?}"
    );
    assert!(!r.mask.iter().any(|k| k.starts_with("format")), "{r:?}");
    // past Limits::max_validator_objects: strict outputs are "not checked", relaxed refused
    let small = nextok_constraint::ConstraintEngine::new(engine.vocab().clone())
        .unwrap()
        .with_limits(nextok_constraint::Limits {
            max_validator_objects: 1,
            ..Default::default()
        });
    let c = small.compile(&spec(s, SchemaMode::Strict)).unwrap();
    assert!(c.schema_report().unwrap().validator_error.is_some());
    assert_eq!(c.validate_output(br#"{"n": 1}"#).unwrap().valid, None);
    let relaxed = json!({"type": "array", "items": {"type": "integer"}, "uniqueItems": true,
                         "maxItems": 3, "minItems": 1});
    let e = small
        .compile(&spec(relaxed.clone(), SchemaMode::Relaxed))
        .unwrap_err();
    assert!(e.to_string().contains("max_validator_objects"), "{e}");
    assert!(engine.compile(&spec(relaxed, SchemaMode::Relaxed)).is_ok());
}
