//! Deep but small inputs: chains of rules and `$ref`s compile (on the compiler's own large
//! stack) up to the limits that bound compilation depth, and beyond them fail with a limit error
//! naming the limit — never a stack overflow.

use std::sync::Arc;

use nextok_constraint::{
    property_order, ConstraintEngine, ConstraintError, ConstraintErrorKind, ConstraintSpec,
    ConstraintVocab, JsonOptions, LimitKind, PropertyOrder,
};
use nextok_core::{TokenBytes, VocabInfo};
use serde_json::json;

fn engine() -> Arc<ConstraintEngine> {
    let toks: Vec<&[u8]> = vec![b"</s>", b"a", b"b", b"{", b"}", b"\"", b":", b"1"];
    let bytes = TokenBytes::new(toks).unwrap();
    let info = VocabInfo {
        vocab_size: 8,
        eos_token_ids: vec![0],
        special_token_ids: vec![0],
    };
    let v = ConstraintVocab::new(&bytes, &info).unwrap();
    Arc::new(ConstraintEngine::new(Arc::new(v)).unwrap())
}

/// `root ::= r0`, `r0 ::= r1`, …, `r{n} ::= "a"`.
fn gbnf_chain(n: usize) -> ConstraintSpec {
    let mut s = String::from("root ::= r0\n");
    for i in 0..n {
        s.push_str(&format!("r{i} ::= r{}\n", i + 1));
    }
    s.push_str(&format!("r{n} ::= \"a\"\n"));
    ConstraintSpec::Gbnf { gbnf: s }
}

fn lark_chain(n: usize) -> ConstraintSpec {
    let mut s = String::from("start: r0\n");
    for i in 0..n {
        s.push_str(&format!("r{i}: r{}\n", i + 1));
    }
    s.push_str(&format!("r{n}: \"a\"\n"));
    ConstraintSpec::Grammar { lark: s }
}

/// `n` object definitions, each with a property referring to the next.
fn schema_chain(n: usize) -> ConstraintSpec {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        defs.insert(
            format!("d{i}"),
            json!({"type": "object", "properties": {"a": {"$ref": format!("#/$defs/d{}", i + 1)}}}),
        );
    }
    defs.insert(format!("d{n}"), json!({"type": "integer"}));
    ConstraintSpec::JsonSchema {
        schema: json!({"$ref": "#/$defs/d0", "$defs": defs}),
        options: Default::default(),
    }
}

fn limit_of(
    r: Result<Arc<nextok_constraint::CompiledConstraint>, ConstraintError>,
) -> (LimitKind, String, ConstraintError) {
    match r {
        Err(e) if e.kind() == ConstraintErrorKind::Limit => {
            let limit = e.limit().expect("a limit error names its limit");
            (limit, e.message().to_string(), e)
        }
        other => panic!("expected a limit error, got {other:?}"),
    }
}

#[test]
fn long_rule_chains_compile_on_the_compilers_stack() {
    let e = engine();
    // each of these overflowed an 8 MB main-thread stack
    for spec in [gbnf_chain(3_000), lark_chain(3_000), schema_chain(1_000)] {
        let c = e.compile(&spec).unwrap_or_else(|err| panic!("{err}"));
        let _ = c.start();
    }
    // and at the limits themselves
    let max = e.limits().max_rules;
    e.compile(&gbnf_chain(max - 2)).unwrap();
    e.compile(&lark_chain(max - 2)).unwrap();
    e.compile(&schema_chain(e.limits().max_schema_objects / 3 - 2))
        .unwrap();
}

#[test]
fn any_property_order_takes_long_chains_and_bounds_its_copies() {
    let e = engine();
    // compiling is bounded by work (the limits counted below), never by the machine's speed:
    // the chain of 1,000 once took 18.6 s on a loaded machine, past a 10 s wall-clock limit
    // that was then the default
    assert_eq!(e.limits().max_compile_time, None);
    let any = |spec: ConstraintSpec| match spec {
        ConstraintSpec::JsonSchema { schema, .. } => ConstraintSpec::JsonSchema {
            schema,
            options: JsonOptions {
                property_order: Some(PropertyOrder::Any),
                ..Default::default()
            },
        },
        other => other,
    };
    // every object of a chain of 1,000 lowered
    let c = e
        .compile(&any(schema_chain(1_000)))
        .unwrap_or_else(|err| panic!("{err}"));
    let r = c.schema_report().unwrap();
    assert_eq!(r.property_order, PropertyOrder::Any, "{:?}", r.order_kept);
    assert_eq!(r.objects_any_order, 1_000, "{:?}", r.order_kept);
    let _ = c.start();
    // at the limit of schema objects, the any-order grammar is past llguidance's grammar size:
    // the schema keeps schema order, and the report says why in a line
    let c = e
        .compile(&any(schema_chain(e.limits().max_schema_objects / 3 - 2)))
        .unwrap_or_else(|err| panic!("{err}"));
    let r = c.schema_report().unwrap();
    if r.property_order == PropertyOrder::Schema {
        let why = &r.order_kept[0].reason;
        assert!(
            why.contains("did not compile") && !why.contains('\n'),
            "{why}"
        );
    }
    let _ = c.start();
    // 50 leaves, each reaching 300 definitions: the copies are bounded (by bytes of leaf text:
    // LEAF_COPIES times the schema's size), and the schema keeps schema order saying why
    let mut defs = serde_json::Map::new();
    for i in 0..300 {
        let next = if i + 1 < 300 {
            json!({"$ref": format!("#/$defs/d{}", i + 1)})
        } else {
            json!({"type": "integer"})
        };
        defs.insert(format!("d{i}"), json!({"type": "array", "items": next}));
    }
    let mut props = serde_json::Map::new();
    for i in 0..50 {
        // distinct leaves (identical ones are shared), each reaching every definition
        props.insert(
            format!("p{i}"),
            json!({"type": "array", "items": {"$ref": "#/$defs/d0"}, "maxItems": i + 1}),
        );
    }
    let spec = any(ConstraintSpec::JsonSchema {
        schema: json!({"type": "object", "properties": props, "$defs": defs}),
        options: Default::default(),
    });
    let c = e.compile(&spec).unwrap_or_else(|err| panic!("{err}"));
    let r = c.schema_report().unwrap();
    assert_eq!(r.property_order, PropertyOrder::Schema);
    let copies = format!("{} times over", property_order::LEAF_COPIES);
    assert!(
        r.order_kept[0].reason.contains(&copies),
        "{:?}",
        r.order_kept
    );
}

#[test]
fn chains_beyond_the_limits_are_limit_errors_naming_the_limit() {
    let e = engine();
    let max = e.limits().max_rules;
    let (k, m, _) = limit_of(e.compile(&gbnf_chain(max + 10)));
    assert_eq!(k, LimitKind::Rules);
    assert!(m.contains(&max.to_string()), "{m}");
    let (k, _, _) = limit_of(e.compile(&lark_chain(max + 10)));
    assert_eq!(k, LimitKind::Rules);
    let (k, m, err) = limit_of(e.compile(&schema_chain(e.limits().max_schema_objects / 3 + 10)));
    assert_eq!(k, LimitKind::SchemaObjects);
    let shown = err.to_string();
    assert_eq!(shown, format!("limit max_schema_objects exceeded: {m}"));
    assert!(shown.contains("max_schema_objects"), "{shown}");
    // a huge grammar is refused by counting its rules (one pass over the text), before any
    // conversion or compilation: its last rule is malformed, which converting or compiling it
    // would have found
    for (spec, bad) in [
        (gbnf_chain(200_000), "bad ::= (\n"),
        (lark_chain(200_000), "bad: (\n"),
    ] {
        let spec = match spec {
            ConstraintSpec::Gbnf { gbnf } => ConstraintSpec::Gbnf { gbnf: gbnf + bad },
            ConstraintSpec::Grammar { lark } => ConstraintSpec::Grammar { lark: lark + bad },
            other => other,
        };
        let (k, m, _) = limit_of(e.compile(&spec));
        assert_eq!(k, LimitKind::Rules);
        assert!(m.contains("200003 rules"), "{m}");
    }
}

#[test]
fn deeply_nested_groups_are_refused() {
    let e = engine();
    let n = 20_000;
    let gbnf = format!("root ::= {}\"a\"{}", "(".repeat(n), ")".repeat(n));
    let (k, m, _) = limit_of(e.compile(&ConstraintSpec::Gbnf { gbnf }));
    assert_eq!(k, LimitKind::GroupNesting);
    assert!(m.contains("line 1"), "{m}");
    // Lark's own parser refuses deep nesting as a syntax error
    let lark = format!("start: {}\"a\"{}", "(".repeat(n), ")".repeat(n));
    let err = e.compile(&ConstraintSpec::Grammar { lark }).unwrap_err();
    assert!(err.to_string().contains("nested"), "{err}");
    // within the limit, groups work
    let gbnf = format!("root ::= {}\"a\"{}", "(".repeat(20), ")".repeat(20));
    e.compile(&ConstraintSpec::Gbnf { gbnf }).unwrap();
}

#[test]
fn errors_say_what_is_wrong() {
    let e = engine();
    // a regex parse error keeps its whole text, not just "regex parse error:"
    let m = e
        .compile(&ConstraintSpec::Regex {
            pattern: "a(b".into(),
        })
        .unwrap_err()
        .to_string();
    assert!(m.contains("unclosed group"), "{m}");
    // a cycle without a base case is named, in grammars and schemas alike
    for spec in [
        ConstraintSpec::Gbnf {
            gbnf: "root ::= x\nx ::= root".into(),
        },
        ConstraintSpec::Grammar {
            lark: "start: start".into(),
        },
        ConstraintSpec::JsonSchema {
            schema: json!({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}),
            options: Default::default(),
        },
    ] {
        let err = e.compile(&spec).unwrap_err();
        assert_eq!(err.code(), "unsatisfiable", "{err}");
        assert!(err.to_string().contains("cycle"), "{err}");
        assert!(!err.to_string().contains("NoExtensionBias"), "{err}");
    }
    // a huge bounded repetition: nextok's own automaton gives up at its size limits and
    // llguidance, whose lexer is lazy, builds only the states the first mask needs — not one
    // per repetition
    let c = e
        .compile(&ConstraintSpec::Regex {
            pattern: "a{99999999}".into(),
        })
        .unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(c.engine(), "llguidance");
    let states = c.lexer_states().unwrap();
    assert!(states < 100, "{states} lexer states");
}

#[test]
fn work_limits_refuse_what_would_take_long_to_compile() {
    // a one-line Lark terminal whose lexeme llguidance cannot show non-empty within its
    // initial fuel: a limit error naming `initial_lexer_fuel`, not a syntax error
    let e = engine();
    let lark = "start: A\nA: /[ab]*a[ab]{14}/ & /[ab]*b[ab]{14}/ & ~/[ab]*a[ab]{15}/\n";
    let (k, m, err) = limit_of(e.compile(&ConstraintSpec::Grammar { lark: lark.into() }));
    assert_eq!(k, LimitKind::CompileFuel);
    assert!(m.contains("fuel"), "{m}");
    assert!(err.to_string().contains("initial_lexer_fuel"), "{err}");
    // a 100,000-value enum: the same limit
    let values: Vec<String> = (0..100_000).map(|i| format!("value number {i}")).collect();
    let (k, _, _) = limit_of(e.compile(&ConstraintSpec::JsonSchema {
        schema: json!({ "enum": values }),
        options: Default::default(),
    }));
    assert_eq!(k, LimitKind::CompileFuel);
}

/// `{"$defs": {"d0": {"$ref": "#/$defs/d1"}, …, "d{n-1}": {"type": "integer"}}, "$ref":
/// "#/$defs/d0"}`: a chain of `n` definitions, each only a `$ref` to the next.
fn ref_chain(n: usize) -> ConstraintSpec {
    let mut defs = serde_json::Map::new();
    for i in 0..n - 1 {
        defs.insert(
            format!("d{i}"),
            json!({"$ref": format!("#/$defs/d{}", i + 1)}),
        );
    }
    defs.insert(format!("d{}", n - 1), json!({"type": "integer"}));
    ConstraintSpec::JsonSchema {
        schema: json!({"$defs": defs, "$ref": "#/$defs/d0"}),
        options: Default::default(),
    }
}

#[test]
fn a_long_ref_chain_is_checked_after_generation_without_overflowing() {
    let e = engine();
    // 1,500 overflowed the caller's stack when the check after generation built its validator
    // (here: the test thread's 2 MiB; `nextok constrain`: the 8 MiB main thread)
    for n in [1_500, 5_000] {
        let c = e
            .compile(&ref_chain(n))
            .unwrap_or_else(|err| panic!("{err}"));
        let v = c.validate_output(b"1").unwrap();
        assert_eq!(v.valid, Some(true), "{n}: {:?}", v.errors);
        let v = c.validate_output(b"\"x\"").unwrap();
        assert_eq!(v.valid, Some(false), "{n}: {:?}", v.errors);
        assert!(v.errors[0].contains("integer"), "{:?}", v.errors);
    }
}

#[test]
fn error_texts_quote_a_bounded_excerpt_of_the_input() {
    let e = engine();
    // 20,000 nested groups: the message quoted the pattern whole, three times (80,000 chars)
    let err = e
        .compile(&ConstraintSpec::Regex {
            pattern: "(".repeat(20_000),
        })
        .unwrap_err();
    let shown = err.to_string();
    assert!(shown.starts_with("regex: "), "{shown}");
    assert!(
        shown.len() < 3_000,
        "{} chars: {}",
        shown.len(),
        &shown[..3_000]
    );
    assert!(shown.contains("chars) …"), "{shown}");
    assert!(err.to_core().to_string().len() < 3_100, "{}", err.to_core());
    // an unsupported keyword under a huge property name: the pointer is an excerpt too
    let name = "p".repeat(50_000);
    let schema = json!({"type": "object", "properties": {name: {"not": {"type": "null"}}}});
    let err = e
        .compile(&ConstraintSpec::JsonSchema {
            schema,
            options: Default::default(),
        })
        .unwrap_err();
    assert_eq!(err.keyword(), Some("not"), "{err}");
    assert!(err.to_string().len() < 3_000, "{}", err.to_string().len());
    let p = err.pointer().expect("the pointer is found");
    assert!(p.len() < 300 && p.contains("(50012 chars)"), "{p}");
}
