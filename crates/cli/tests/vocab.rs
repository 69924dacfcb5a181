//! `nextok vocab` and `nextok tokenize` through the binary: small files made here (always),
//! and the real tokenizers and model fetched by `scripts/fetch-testdata.sh` into `.testdata/`
//! (or `NEXTOK_TESTDATA`). A missing real file skips its test with a notice, unless `CI` is
//! set, where it fails.

use std::process::Command;

use nextok_vocab::gguf::{write_metadata, Array, Value as G};
use serde_json::Value;

fn nextok(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nextok"))
        .args(args)
        .output()
        .expect("spawn nextok");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json_of(args: &[&str]) -> Value {
    let (code, out, err) = nextok(args);
    assert_eq!(code, 0, "{args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

/// Runs `args`, expects exit status 2 and one error line containing `needle`.
fn fails(args: &[&str], needle: &str) {
    let (code, out, err) = nextok(args);
    assert_eq!(code, 2, "{args:?}: stdout {out} stderr {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(needle), "{args:?}: {err:?} lacks {needle:?}");
}

fn scratch(name: &str, data: &[u8]) -> String {
    let dir = std::env::temp_dir().join(format!("nextok-cli-vocab-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p.display().to_string()
}

const TINY: &str = r#"{
  "added_tokens": [{"id": 4, "content": "<|endoftext|>", "single_word": false, "lstrip": false,
    "rstrip": false, "normalized": false, "special": true}],
  "normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
  "post_processor": null,
  "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
  "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
    "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
    "vocab": {"h": 0, "i": 1, "Ġ": 2, "hi": 3, "Ã": 5, "©": 6}, "merges": [["h", "i"]]}
}"#;

#[test]
fn vocab_and_tokenize_on_a_small_tokenizer_json() {
    let p = scratch("tiny.json", TINY.as_bytes());
    let v = json_of(&[
        "vocab",
        "--tokenizer",
        &p,
        "--json",
        "--id",
        "5,6",
        "--id",
        "4",
    ]);
    assert_eq!(v["vocab_size"], 7);
    assert_eq!(v["eos_token_ids"], serde_json::json!([4]));
    assert_eq!(v["special_token_ids"], serde_json::json!([4]));
    assert_eq!(v["partial_utf8_tokens"], 2);
    assert_eq!(v["tokens"][0]["bytes_hex"], "c3");
    assert_eq!(v["tokens"][0]["text"], "\\xc3");
    assert_eq!(v["tokens"][0]["utf8"], false);
    assert_eq!(v["tokens"][1]["bytes_hex"], "a9");
    assert_eq!(v["tokens"][2]["kind"], "control");
    assert_eq!(v["tokens"][2]["text"], "<|endoftext|>");

    let (code, out, _) = nextok(&["vocab", "--tokenizer", &p, "--id", "2"]);
    assert_eq!(code, 0);
    assert!(out.contains("tokens        7"), "{out}");
    assert!(out.contains("eos           4 <|endoftext|>"), "{out}");
    assert!(out.contains("[20]  \" \"  name \"Ġ\""), "{out}");

    let t = json_of(&["tokenize", "--tokenizer", &p, "--text", "hi hé", "--json"]);
    assert_eq!(t["ids"], serde_json::json!([3, 2, 0, 5, 6]));
    assert_eq!(t["bytes_hex"], "68692068c3a9");
    assert_eq!(t["round_trip"], true);

    // EOS override.
    let v = json_of(&["vocab", "--tokenizer", &p, "--json", "--eos-id", "3"]);
    assert_eq!(v["eos_token_ids"], serde_json::json!([3]));
}

#[test]
fn small_gguf_vocabulary_and_encoding() {
    let md = vec![
        ("tokenizer.ggml.model".to_string(), G::String("gpt2".into())),
        ("tokenizer.ggml.pre".to_string(), G::String("smollm".into())),
        (
            "tokenizer.ggml.tokens".to_string(),
            G::Array(Array::String(
                ["<|im_end|>", "h", "i", "Ġ", "hi", "1", "2"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
            )),
        ),
        (
            "tokenizer.ggml.token_type".to_string(),
            G::Array(Array::I32(vec![3, 1, 1, 1, 1, 1, 1])),
        ),
        (
            "tokenizer.ggml.merges".to_string(),
            G::Array(Array::String(vec!["h i".into()])),
        ),
        ("tokenizer.ggml.eos_token_id".to_string(), G::U32(0)),
    ];
    let p = scratch("tiny.gguf", &write_metadata(3, false, &md));
    let v = json_of(&["vocab", "--model", &p, "--json"]);
    assert_eq!(v["format"], "gguf");
    assert_eq!(v["vocab_size"], 7);
    assert_eq!(v["eos_token_ids"], serde_json::json!([0]));
    let t = json_of(&["tokenize", "--model", &p, "--text", "hi 12", "--json"]);
    assert_eq!(t["ids"], serde_json::json!([4, 3, 5, 6]));
    assert_eq!(t["round_trip"], true);
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let p = scratch("tiny2.json", TINY.as_bytes());
    fails(&["vocab"], "--tokenizer");
    fails(&["vocab", "--tokenizer", &p, "--model", &p], "not both");
    fails(
        &["vocab", "--tokenizer", "/no/such/tokenizer.json"],
        "/no/such/tokenizer.json",
    );
    fails(
        &["vocab", "--tokenizer", &p, "--id", "7"],
        "--id 7: token id out of range",
    );
    fails(&["vocab", "--tokenizer", &p, "--id", "x"], "--id \"x\"");
    fails(
        &["vocab", "--tokenizer", &p, "--eos-id", "99"],
        "eos_token_ids",
    );
    fails(
        &["vocab", "--tokenizer", &p, "--vocab-size", "3"],
        "vocab_size",
    );
    fails(&["vocab", "--model", &p], "not a GGUF file");
    let bad = scratch(
        "bad.json",
        br#"{"decoder": {"type": "ByteLevel"}, "model": {"vocab": {"a": 0, "b": 2}}}"#,
    );
    fails(
        &["vocab", "--tokenizer", &bad],
        "field `model.vocab`: token id 1 has no token",
    );
    let dup = scratch(
        "dup.json",
        br#"{"decoder": {"type": "WordPiece"}, "model": {"vocab": {"a": 0}}}"#,
    );
    fails(&["vocab", "--tokenizer", &dup], "field `decoder.type`");
    let trunc = write_metadata(
        3,
        false,
        &[("tokenizer.ggml.model".into(), G::String("gpt2".into()))],
    );
    let tp = scratch("trunc.gguf", &trunc[..trunc.len() - 2]);
    fails(&["vocab", "--model", &tp], "field `tokenizer.ggml.model`");
    let spm = write_metadata(
        3,
        false,
        &[
            ("tokenizer.ggml.model".into(), G::String("llama".into())),
            (
                "tokenizer.ggml.tokens".into(),
                G::Array(Array::String(vec!["a".into()])),
            ),
        ],
    );
    let sp = scratch("spm.gguf", &spm);
    // a SentencePiece vocabulary without its 256 byte-fallback tokens
    fails(
        &["tokenize", "--model", &sp, "--text", "a"],
        "field `tokenizer.ggml.tokens`",
    );
}

/// The real test-data file `rel`, or `None` (after a notice) when it is absent outside CI.
fn testdata(rel: &str) -> Option<String> {
    nextok_testdata::require(rel).map(|p| p.display().to_string())
}

#[test]
fn real_llama3_vocab_and_tokenize() {
    let Some(p) = testdata("llama3/tokenizer.json") else {
        return;
    };
    let v = json_of(&[
        "vocab",
        "--tokenizer",
        &p,
        "--json",
        "--id",
        "9906,1917,128009,15722",
    ]);
    assert_eq!(v["vocab_size"], 128_256);
    assert_eq!(v["eos_token_ids"], serde_json::json!([128_001, 128_009]));
    assert_eq!(v["bos_token_id"], 128_000);
    assert_eq!(v["special_token_ids"].as_array().unwrap().len(), 256);
    let hexes: Vec<&str> = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["bytes_hex"].as_str().unwrap())
        .collect();
    // "Hello", " world", "<|eot_id|>", and half of a CJK character.
    assert_eq!(
        hexes,
        ["48656c6c6f", "20776f726c64", "3c7c656f745f69647c3e", "e6ad"]
    );
    let t = json_of(&[
        "tokenize",
        "--tokenizer",
        &p,
        "--text",
        "Hello world",
        "--json",
    ]);
    assert_eq!(t["ids"], serde_json::json!([9906, 1917]));
    assert_eq!(t["round_trip"], true);
    let (code, out, _) = nextok(&["tokenize", "--tokenizer", &p, "--text", "naïve 🦀"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("the token bytes spell the text exactly"),
        "{out}"
    );
}

#[test]
fn real_gemma3_and_qwen3_vocab() {
    if let Some(p) = testdata("gemma3/tokenizer.json") {
        let v = json_of(&["vocab", "--tokenizer", &p, "--json", "--id", "138,300"]);
        assert_eq!(v["vocab_size"], 262_145);
        assert_eq!(v["eos_token_ids"], serde_json::json!([1, 106]));
        assert_eq!(v["tokens"][0]["bytes_hex"], "2020");
        assert_eq!(v["tokens"][1]["kind"], "byte");
        let t = json_of(&[
            "tokenize",
            "--tokenizer",
            &p,
            "--text",
            "Hello 世界",
            "--json",
        ]);
        assert_eq!(t["round_trip"], true);
    }
    if let Some(p) = testdata("qwen3/tokenizer.json") {
        let v = json_of(&["vocab", "--tokenizer", &p, "--json"]);
        assert_eq!(v["vocab_size"], 151_669);
        assert_eq!(v["eos_token_ids"], serde_json::json!([151_643, 151_645]));
        assert_eq!(v["bos_token_id"], Value::Null);
    }
}

#[test]
fn real_smollm2_gguf() {
    let Some(p) = testdata("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let v = json_of(&["vocab", "--model", &p, "--json", "--id", "2"]);
    assert_eq!(v["vocab_size"], 49_152);
    assert_eq!(v["eos_token_ids"], serde_json::json!([0, 2]));
    assert_eq!(v["bos_token_id"], 1);
    assert_eq!(v["special_token_ids"].as_array().unwrap().len(), 17);
    assert_eq!(v["tokens"][0]["name"], "<|im_end|>");
    let t = json_of(&[
        "tokenize",
        "--model",
        &p,
        "--text",
        "Hello world 2024",
        "--json",
    ]);
    assert_eq!(t["round_trip"], true);
    assert_eq!(t["ids"].as_array().unwrap().len(), 7);
    fails(&["vocab", "--tokenizer", &p], "this is a GGUF file");
}

/// Gemma 3 270M (a SentencePiece vocabulary of 262,144 tokens in the GGUF file): `vocab` and
/// `tokenize --model` read it from the file, and the ids (with the BOS token the file asks
/// for) are llama.cpp's on the same file (the committed reference's prompts).
#[test]
fn real_gemma3_gguf() {
    let Some(p) = testdata(nextok_testdata::GEMMA3_270M) else {
        return;
    };
    let v = json_of(&["vocab", "--model", &p, "--json", "--id", "2"]);
    assert_eq!(v["vocab_size"], 262_144);
    assert_eq!(v["bos_token_id"], 2);
    assert_eq!(v["tokens"][0]["name"], "<bos>");
    let reference: Value = serde_json::from_str(
        &std::fs::read_to_string(
            nextok_testdata::repo_root().join("testdata/reference/gemma-3-270m.llamacpp.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let prompts = reference["models"][0]["prompts"].as_array().unwrap();
    assert!(prompts.len() >= 5);
    for prompt in prompts {
        let text = prompt["text"].as_str().unwrap();
        let t = json_of(&[
            "tokenize",
            "--model",
            &p,
            "--text",
            text,
            "--add-special-tokens",
            "--json",
        ]);
        assert_eq!(t["ids"], prompt["ids"], "{text:?}");
        // without the BOS token, the bytes of the ids are the text
        let t = json_of(&["tokenize", "--model", &p, "--text", text, "--json"]);
        assert_eq!(t["round_trip"], true, "{text:?}");
    }
}
