//! `nextok constrain`: exit 0 when the text is accepted, 1 when rejected (naming the first
//! rejected token and the forced bytes), 2 on bad input. Uses a small byte-level tokenizer
//! written here, and the real Llama-3 tokenizer from `.testdata/` when present (skipped with a
//! notice otherwise).

use std::process::Command;

fn nextok(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nextok"))
        .args(args)
        .output()
        .expect("run nextok");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn scratch(name: &str, data: &str) -> String {
    let dir = std::env::temp_dir().join(format!("nextok-constrain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p.to_string_lossy().into_owned()
}

/// A tiny byte-level BPE tokenizer: every printable ASCII byte is a token, plus `</s>`.
fn tiny_tokenizer() -> String {
    let mut vocab = serde_json::Map::new();
    let mut id = 0;
    for b in 0x20u8..0x7f {
        let c = nextok_vocab_char(b);
        vocab.insert(c.to_string(), id.into());
        id += 1;
    }
    let json = serde_json::json!({
        "version": "1.0",
        "added_tokens": [{"id": id, "content": "</s>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                          "use_regex": false},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                    "use_regex": false},
        "model": {"type": "BPE", "vocab": vocab, "merges": []}
    });
    scratch("tokenizer.json", &json.to_string())
}

/// GPT-2's byte-to-unicode map for printable ASCII (space is `Ġ`).
fn nextok_vocab_char(b: u8) -> char {
    if b == b' ' {
        'Ġ'
    } else {
        b as char
    }
}

fn llama3() -> Option<String> {
    nextok_testdata::require(nextok_testdata::LLAMA3).map(|p| p.to_string_lossy().into_owned())
}

#[test]
fn choice_accepts_and_rejects() {
    let t = tiny_tokenizer();
    let ok = ["--choice", r#"{"ok":true}"#, "--choice", r#"{"ok":false}"#];
    let (code, out, err) = nextok(
        &[
            &["constrain", "--tokenizer", &t],
            &ok[..],
            &["--text", r#"{"ok":true}"#],
        ]
        .concat(),
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("accepted"), "{out}");
    let (code, out, _) = nextok(
        &[
            &["constrain", "--tokenizer", &t],
            &ok[..],
            &["--text", r#"{"ok":maybe}"#],
        ]
        .concat(),
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("token 6"), "{out}");
    assert!(out.contains("bytes \"m\""), "{out}");
    let (code, out, _) = nextok(
        &[
            &["constrain", "--tokenizer", &t],
            &ok[..],
            &["--text", r#"{"ok":"#],
        ]
        .concat(),
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("end of text"), "{out}");
}

#[test]
fn regex_json_grammar_gbnf() {
    let t = tiny_tokenizer();
    let run = |args: &[&str], text: &str| {
        nextok(&[&["constrain", "--tokenizer", &t], args, &["--text", text]].concat()).0
    };
    assert_eq!(run(&["--regex", "[0-9]{3}-[a-z]+"], "123-abc"), 0);
    assert_eq!(run(&["--regex", "[0-9]{3}-[a-z]+"], "12-abc"), 1);
    assert_eq!(run(&["--json"], r#"{"a": 1, "b": [2, 3]}"#), 0);
    assert_eq!(run(&["--json", "--compact"], r#"{"a": 1}"#), 1);
    let schema = r#"{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}"#;
    assert_eq!(run(&["--json-schema", schema], r#"{"n": 5}"#), 0);
    assert_eq!(run(&["--json-schema", schema], r#"{"n": "5"}"#), 1);
    let file = scratch("schema.json", schema);
    assert_eq!(run(&["--json-schema", &file], r#"{"n":5}"#), 0);
    let gbnf = scratch(
        "list.gbnf",
        "root ::= \"[\" num (\", \" num)* \"]\"\nnum ::= [0-9]+\n",
    );
    assert_eq!(run(&["--gbnf", &gbnf], "[1, 22, 333]"), 0);
    assert_eq!(run(&["--gbnf", &gbnf], "[1,2]"), 1);
    assert_eq!(run(&["--grammar", "start: \"a\"+ \"b\"\n"], "aaab"), 0);
    assert_eq!(run(&["--grammar", "start: \"a\"+ \"b\"\n"], "ba"), 1);
}

#[test]
fn bad_input_exits_2() {
    let t = tiny_tokenizer();
    let (code, _, err) = nextok(&[
        "constrain",
        "--tokenizer",
        &t,
        "--json-schema",
        "/no/such/file.json",
        "--text",
        "1",
    ]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = nextok(&[
        "constrain",
        "--tokenizer",
        &t,
        "--json-schema",
        r#"{"type":"string","format":"no-such-format"}"#,
        "--text",
        "1",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("format"), "{err}");
    let (code, _, err) = nextok(&[
        "constrain",
        "--tokenizer",
        &t,
        "--gbnf",
        "root ::= (\"a\"\n",
        "--text",
        "a",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("line 1"), "{err}");
    let (code, _, _) = nextok(&["constrain", "--tokenizer", &t, "--text", "a"]);
    assert_eq!(code, 2);
    let (code, _, _) = nextok(&[
        "constrain",
        "--tokenizer",
        "/no/such/tokenizer.json",
        "--json",
        "--text",
        "1",
    ]);
    assert_eq!(code, 2);
}

#[test]
fn llama3_choice_vector() {
    let Some(t) = llama3() else { return };
    let ok = ["--choice", r#"{"ok":true}"#, "--choice", r#"{"ok":false}"#];
    for (text, want) in [
        (r#"{"ok":true}"#, 0),
        (r#"{"ok":false}"#, 0),
        (r#"{"ok": true}"#, 1),
    ] {
        let (code, out, err) = nextok(
            &[
                &["constrain", "--tokenizer", &t],
                &ok[..],
                &["--text", text],
            ]
            .concat(),
        );
        assert_eq!(code, want, "{text}: {out}{err}");
    }
}

#[test]
fn llama3_schema_modes_escapes_and_order() {
    let Some(t) = llama3() else { return };
    let schema = r#"{"type":"object","properties":{"a":{"type":"string"},
        "tags":{"type":"array","items":{"type":"string"},"uniqueItems":true}},
        "required":["a","tags"]}"#;
    // `nextok constrain` on `schema`, with `--schema-mode` and `--property-order` when given
    let constrain = |schema: &str, mode: Option<&str>, order: Option<&str>, text: &str| {
        let mut args = vec!["constrain", "--tokenizer", &t, "--json-schema", schema];
        if let Some(m) = mode {
            args.extend(["--schema-mode", m]);
        }
        if let Some(o) = order {
            args.extend(["--property-order", o]);
        }
        args.extend(["--text", text]);
        nextok(&args)
    };
    let run_order =
        |mode: &str, order: Option<&str>, text: &str| constrain(schema, Some(mode), order, text);
    let run = |mode: &str, text: &str| run_order(mode, None, text);
    // strict: refused, naming the keyword and where it is
    let (code, _, err) = run("strict", r#"{"a": "x", "tags": []}"#);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("uniqueItems") && err.contains("/properties/tags"),
        "{err}"
    );
    // relaxed: the mask admits duplicates, the check after it refuses them; `json.dumps`
    // escapes (ensure_ascii) are accepted
    let (code, out, err) = run(
        "relaxed",
        r#"{"a": "\u00b0C \ud83d\ude00", "tags": ["p", "q"]}"#,
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("schema check: valid"), "{out}");
    assert!(out.contains("uniqueItems at /properties/tags"), "{out}");
    let (code, out, _) = run("relaxed", r#"{"a": "x", "tags": ["p", "p"]}"#);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("schema check: invalid"), "{out}");
    // another property order: relaxed mode takes any order (its default)
    let (code, out, err) = run("relaxed", r#"{"tags": [], "a": "x"}"#);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("properties in any order"), "{out}");
    // in schema order, rejected by the mask, and the rule is stated
    let (code, out, _) = run_order("relaxed", Some("schema"), r#"{"tags": [], "a": "x"}"#);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("schema check: valid"), "{out}");
    assert!(out.contains("order the schema lists them"), "{out}");
    // strict mode in any order, on a schema strict mode takes
    let strict_schema = r#"{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"}},"required":["a","b"]}"#;
    let strict = |order: Option<&str>, text: &str| constrain(strict_schema, None, order, text);
    assert_eq!(strict(None, r#"{"b": 1, "a": "x"}"#).0, 1);
    let (code, out, err) = strict(Some("any"), r#"{"b": 1, "a": "x"}"#);
    assert_eq!(code, 0, "{out}{err}");
    let (code, _, err) = strict(Some("sorted"), r#"{"a": "x", "b": 1}"#);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("property-order"), "{err}");
}
