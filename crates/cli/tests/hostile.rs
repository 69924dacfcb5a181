//! Hostile and careless input through the `nextok` binary: every case ends in a one-line error
//! (exit 2) or a normal end, never a panic, an abort or a hang.

use std::io::{Read, Write};
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};

fn nextok_stdin(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_nextok"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn nextok");
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Exit status 2 with one line on stderr containing every needle, and no panic.
fn fails_with(o: &Output, needles: &[&str]) {
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` not in: {err}");
    }
}

fn explain(req: &Value) -> Output {
    nextok_stdin(&["explain", "-"], req.to_string().as_bytes())
}

#[test]
fn a_huge_token_name_is_cut_and_control_characters_are_escaped() {
    let long = "a".repeat(65_536);
    let req = json!({"logits": [1.0, 2.0, 0.5], "tokens": [long, "b\n\u{1b}[31mred", "c"]});
    let o = explain(&req);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(!out.contains('\u{1b}'), "{out}");
    assert!(out.contains("b\\n\\u{1b}[31mred"), "{out}");
    // every row fits the cut name: no line holds the whole name
    assert!(out.lines().all(|l| l.chars().count() < 200), "{out}");
    assert!(out.contains('…'), "{out}");
    assert!(out.contains("selected b\\n\\u{1b}[31mred (id 1)"), "{out}");
}

#[test]
fn trailing_data_after_a_request_is_refused() {
    let o = nextok_stdin(&["explain", "-"], b"{\"logits\": [1, 2]} {\"logits\": [3]}");
    fails_with(&o, &["request", "trailing"]);
    // whitespace after the document is fine
    let o = nextok_stdin(&["explain", "-"], b"{\"logits\": [1, 2]}\n\n  ");
    assert!(o.status.success(), "{}", text(&o.stderr));
}

#[test]
fn logits_outside_the_f32_range_are_refused_in_both_directions() {
    for v in [1e39, -1e39] {
        let o = explain(&json!({"logits": [v, 2.0]}));
        fails_with(&o, &["logits[0]", "f32 range"]);
    }
    // the largest finite f32 is a logit like any other
    let o = explain(&json!({"logits": [-3.4028235e38, 2.0]}));
    assert!(o.status.success(), "{}", text(&o.stderr));
    // a wrong type names the element and what is expected, not an internal type
    let o = explain(&json!({"logits": [1.0, true]}));
    fails_with(&o, &["logits[1]", "expected a number"]);
    assert!(!text(&o.stderr).contains("untagged"));
}

#[test]
fn a_closed_pipe_is_a_normal_end() {
    // an output far larger than a pipe's buffer; the reader takes one line and goes away
    let req = json!({"logits": vec![0.0; 50_000]});
    for args in [&["explain", "--json", "-"][..], &["explain", "-"][..]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_nextok"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(req.to_string().as_bytes())
            .unwrap();
        let mut first = [0u8; 16];
        child
            .stdout
            .as_mut()
            .unwrap()
            .read_exact(&mut first)
            .unwrap();
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let err = text(&o.stderr);
        assert!(o.status.success(), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?}: {err}");
    }
}

fn tiny_tokenizer_file() -> String {
    let json = json!({
        "version": "1.0",
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                          "use_regex": false},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                    "use_regex": false},
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}
    });
    let dir = std::env::temp_dir().join(format!("nextok-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("tokenizer.json");
    std::fs::write(&p, json.to_string()).unwrap();
    p.to_string_lossy().into_owned()
}

#[test]
fn an_absurd_vocabulary_size_is_refused_before_allocating() {
    let t = tiny_tokenizer_file();
    let o = nextok_stdin(
        &["vocab", "--tokenizer", &t, "--vocab-size", "4000000000"],
        b"",
    );
    fails_with(&o, &["vocab_size", "limit"]);
    // a padded vocabulary within the limit works, and a closed pipe ends it normally
    let mut child = Command::new(env!("CARGO_BIN_EXE_nextok"))
        .args([
            "vocab",
            "--tokenizer",
            &t,
            "--vocab-size",
            "100000",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 1];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(!text(&o.stderr).contains("panicked"));
}

#[test]
fn an_empty_support_without_a_constraint_is_not_called_a_constraint_error() {
    let o = explain(&json!({"logits": ["-inf", "-inf"]}));
    fails_with(&o, &["empty support"]);
    assert!(
        !text(&o.stderr).contains("constraint"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn a_finished_history_does_not_step() {
    let o = explain(&json!({"logits": [1.0, 0.0], "eos_token_ids": [1], "selected_ids": [0, 1]}));
    fails_with(&o, &["finished"]);
    let o =
        explain(&json!({"logits": [1.0, 0.0], "selected_ids": [0], "params": {"max_tokens": 1}}));
    fails_with(&o, &["finished"]);
}

#[test]
fn a_pipeline_file_with_sampling_flags_is_a_conflict() {
    let dir = std::env::temp_dir().join(format!("nextok-hostile-p-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("pipeline.json");
    std::fs::write(
        &p,
        r#"{"format_version": 1, "processors": [{"type": "temperature", "version": 1, "temperature": 0}], "selector": {"type": "greedy"}}"#,
    )
    .unwrap();
    let p = p.to_string_lossy().into_owned();
    // checked before any model is loaded
    let o = nextok_stdin(
        &[
            "generate",
            "hi",
            "--pipeline",
            &p,
            "--temperature",
            "0.5",
            "--top-k",
            "3",
            "--model",
            "no-such.gguf",
        ],
        b"",
    );
    fails_with(&o, &["--temperature", "--top-k", "pipeline"]);
    // trailing data after the pipeline document is refused
    let q = dir.join("trailing.json");
    std::fs::write(
        &q,
        r#"{"format_version": 1, "processors": [], "selector": {"type": "greedy"}} {}"#,
    )
    .unwrap();
    let o = nextok_stdin(
        &[
            "generate",
            "hi",
            "--pipeline",
            &q.to_string_lossy(),
            "--model",
            "no-such.gguf",
        ],
        b"",
    );
    fails_with(&o, &["trailing"]);
}

#[test]
fn replay_refuses_an_edited_header() {
    let Some(m) = nextok_testdata::require(nextok_testdata::SMOLLM2) else {
        return;
    };
    let m = m.to_string_lossy().into_owned();
    let dir = std::env::temp_dir().join(format!("nextok-hostile-r-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let t = dir.join("run.jsonl");
    let o = nextok_stdin(
        &[
            "generate",
            "Hello",
            "--temperature",
            "0.8",
            "--max-tokens",
            "3",
            "--seed",
            "5",
            "--trace",
            &t.to_string_lossy(),
            "--model",
            &m,
        ],
        b"",
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let lines: Vec<String> = std::fs::read_to_string(&t)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let edit = |f: &dyn Fn(&mut Value)| {
        let mut h: Value = serde_json::from_str(&lines[0]).unwrap();
        f(&mut h);
        let p = dir.join("edited.jsonl");
        let mut body = vec![h.to_string()];
        body.extend(lines[1..].iter().cloned());
        std::fs::write(&p, body.join("\n") + "\n").unwrap();
        nextok_stdin(&["replay", &p.to_string_lossy(), "--model", &m], b"")
    };
    // a changed temperature would be silently ignored (the recorded pipeline runs)
    let o = edit(&|h| h["params"]["temperature"] = json!(0.2));
    fails_with(&o, &["params", "pipeline"]);
    // so would a changed stop condition
    let o = edit(&|h| h["params"]["max_tokens"] = json!(2));
    fails_with(&o, &["params", "stop"]);
    // another model file is named with the recorded one
    let o = edit(&|h| h["model_sha256"] = json!("00"));
    assert_eq!(o.status.code(), Some(2));
    let err = text(&o.stderr);
    let last = err.trim_end().lines().last().unwrap_or("");
    assert!(
        last.starts_with("error: ") && last.contains("SHA-256"),
        "{err}"
    );
    assert!(last.contains("SmolLM2-135M-Instruct.Q4_1.gguf"), "{err}");
}

#[test]
fn beam_width_is_bounded_by_a_limit_and_the_kv_budget() {
    let Some(m) = nextok_testdata::require(nextok_testdata::SMOLLM2) else {
        return;
    };
    let m = m.to_string_lossy().into_owned();
    let last_line = |o: &Output| {
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        err.trim_end().lines().last().unwrap_or("").to_string()
    };
    let o = nextok_stdin(
        &["generate", "hi", "--beam-width", "512", "--model", &m],
        b"",
    );
    let l = last_line(&o);
    assert!(l.contains("beam_width") && l.contains("64"), "{l}");
    // refused by the check before decoding (its message, naming the beams, the tokens and the
    // budget, comes from nothing else), so no token is decoded: no work beyond loading
    let o = nextok_stdin(
        &[
            "generate",
            "hi",
            "--beam-width",
            "64",
            "--max-tokens",
            "8000",
            "--model",
            &m,
        ],
        b"",
    );
    let l = last_line(&o);
    assert!(l.contains("beam_width") && l.contains("budget"), "{l}");
    assert!(
        l.contains("64 beams of a") && l.contains("and 8000 tokens need"),
        "{l}"
    );
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
}

#[test]
fn field_paths_name_fields_not_internals() {
    let o = explain(&json!({"logits": [1.0, 2.0], "params": {"logit_bias": {"x": 1}}}));
    fails_with(&o, &["`params.logit_bias`", "key"]);
    assert!(!text(&o.stderr).contains(".?"), "{}", text(&o.stderr));
    let o = explain(
        &json!({"logits": [1.0, 2.0], "pipeline": {"format_version": 1,
        "processors": [{"type": "top_k", "top_k": "a"}], "selector": {"type": "greedy"}}}),
    );
    fails_with(&o, &["`pipeline.processors[0]`"]);
    // an unreadable file names its path
    let o = nextok_stdin(&["explain", "no-such-request.json"], b"");
    fails_with(&o, &["no-such-request.json"]);
}

/// A byte-level tokenizer whose tokens are the printable ASCII bytes, plus `</s>`.
fn ascii_tokenizer_file() -> String {
    let mut vocab = serde_json::Map::new();
    for (id, b) in (0x20u8..0x7f).enumerate() {
        // GPT-2's byte-to-unicode map for printable ASCII: space is `Ġ`
        let c = if b == b' ' { 'Ġ' } else { b as char };
        vocab.insert(c.to_string(), id.into());
    }
    let json = json!({
        "version": "1.0",
        "added_tokens": [{"id": 95, "content": "</s>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                          "use_regex": false},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                    "use_regex": false},
        "model": {"type": "BPE", "vocab": vocab, "merges": []}
    });
    scratch_file("ascii-tokenizer.json", &json.to_string())
}

fn scratch_file(name: &str, data: &str) -> String {
    let dir = std::env::temp_dir().join(format!("nextok-hostile-c-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p.to_string_lossy().into_owned()
}

#[test]
fn a_long_ref_chain_is_checked_without_overflowing_the_stack() {
    // 1,500 definitions, each a `$ref` to the next: `nextok constrain` aborted (SIGABRT,
    // stack overflow) building the validator for the check after generation on its main thread
    let mut defs = serde_json::Map::new();
    for i in 0..1_499 {
        defs.insert(
            format!("d{i}"),
            json!({"$ref": format!("#/$defs/d{}", i + 1)}),
        );
    }
    defs.insert("d1499".into(), json!({"type": "integer"}));
    let schema = json!({"$defs": defs, "$ref": "#/$defs/d0"});
    let s = scratch_file("ref-chain.json", &schema.to_string());
    let t = ascii_tokenizer_file();
    for (input, code, said) in [
        ("12", 0, "schema check: valid"),
        ("\"x\"", 1, "is not of type \"integer\""),
    ] {
        let o = nextok_stdin(
            &[
                "constrain",
                "--tokenizer",
                &t,
                "--json-schema",
                &s,
                "--text",
                input,
            ],
            b"",
        );
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        assert_eq!(o.status.code(), Some(code), "{input}: {out}{err}");
        assert!(out.contains(said), "{input}: {out}{err}");
    }
}

/// `depth` levels of `key` around an integer.
fn nested_schema(key: &str, depth: usize) -> Value {
    let mut s = json!({"type": "integer"});
    for _ in 0..depth {
        s = match key {
            "items" => json!({"type": "array", "items": s}),
            "additionalProperties" => json!({"type": "object", "additionalProperties": s}),
            _ => json!({"type": "object", "properties": {"a": s}, "required": ["a"]}),
        };
    }
    s
}

#[test]
fn deep_schemas_are_refused_naming_the_flag_and_the_limit() {
    // these grew the process by 0.5 to 1 GB (the check after generation's validator), and a
    // server by as much again for each differently shaped schema, never given back
    let t = ascii_tokenizer_file();
    for (key, depth) in [
        ("properties", 60),
        ("items", 100),
        ("additionalProperties", 100),
        ("items", 120),
    ] {
        let s = scratch_file("deep.json", &nested_schema(key, depth).to_string());
        let o = nextok_stdin(
            &[
                "constrain",
                "--tokenizer",
                &t,
                "--json-schema",
                &s,
                "--text",
                "1",
            ],
            b"",
        );
        fails_with(&o, &["--json-schema", "max_schema_depth", "64"]);
    }
    // within the limit, a deep schema compiles and checks its text
    let s = scratch_file("deep-ok.json", &nested_schema("items", 60).to_string());
    let text_in = format!("{}1{}", "[".repeat(60), "]".repeat(60));
    let o = nextok_stdin(
        &[
            "constrain",
            "--tokenizer",
            &t,
            "--json-schema",
            &s,
            "--text",
            &text_in,
        ],
        b"",
    );
    assert!(o.status.success(), "{}{}", text(&o.stdout), text(&o.stderr));
    assert!(text(&o.stdout).contains("schema check: valid"));
}

#[test]
fn an_invalid_regex_is_quoted_as_a_bounded_excerpt() {
    // 20,000 nested groups: the error line quoted the pattern whole, several times over
    let pattern = "(".repeat(20_000);
    let bounded = |o: &Output, needles: &[&str]| {
        let err = text(&o.stderr);
        let last = err.trim_end().lines().last().unwrap_or("").to_string();
        assert_eq!(o.status.code(), Some(2), "{}", &err[..err.len().min(2_000)]);
        assert!(
            !err.contains("panicked"),
            "{}",
            &err[..err.len().min(2_000)]
        );
        assert!(
            last.len() < 3_000,
            "{} chars: {}",
            last.len(),
            &last[..2_000]
        );
        assert!(
            last.contains("(20000 chars)") || last.contains("chars) …"),
            "{last}"
        );
        for n in needles {
            assert!(last.contains(n), "`{n}` not in: {last}");
        }
    };
    let t = ascii_tokenizer_file();
    let o = nextok_stdin(
        &[
            "constrain",
            "--tokenizer",
            &t,
            "--regex",
            &pattern,
            "--text",
            "a",
        ],
        b"",
    );
    fails_with(&o, &[]);
    bounded(&o, &["--regex", "regex"]);
    let req = json!({"logits": [1.0, 2.0, 0.5], "tokens": ["a", "b", "c"], "eos_token_ids": [2],
                     "params": {"constraint": {"type": "regex", "pattern": pattern}}});
    let o = explain(&req);
    fails_with(&o, &[]);
    bounded(&o, &["params.constraint"]);
    if let Some(m) = nextok_testdata::require(nextok_testdata::SMOLLM2) {
        let m = m.to_string_lossy().into_owned();
        let o = nextok_stdin(
            &[
                "generate",
                "hi",
                "--regex",
                &pattern,
                "--max-tokens",
                "2",
                "--model",
                &m,
            ],
            b"",
        );
        bounded(&o, &["constraint"]);
    }
}
