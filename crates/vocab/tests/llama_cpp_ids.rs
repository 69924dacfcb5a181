//! Token ids of GGUF vocabularies against llama.cpp's.
//!
//! Two sources of llama.cpp's ids, neither written by hand:
//!
//! * llama.cpp's own tokenizer test vectors: its vocabulary-only files
//!   `ggml-vocab-NAME.gguf` with `.inp` (texts separated by `\n__ggml_vocab_test__\n`) and
//!   `.out` (one line of ids per text), which its `test-tokenizer-0` checks with
//!   `add_special = false`. `scripts/fetch-testdata.sh` takes them out of the llama-cpp-python
//!   sdist into `.testdata/llama-vocab/`.
//! * `testdata/reference/llama-tokenize.json`: what llama.cpp's `llama-tokenize` printed for
//!   the texts of `testdata/reference/tokenize-texts.json` on those files and on Gemma 3 270M
//!   (`scripts/reference/llama-tokenize.sh` made it), with special tokens parsed, with and
//!   without the model's BOS/EOS.
//!
//! A missing test-data file fails under `CI` and prints a SKIPPED notice otherwise (the rule
//! of every real-data test, see `nextok-testdata`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use nextok_vocab::encode::Encoder;
use nextok_vocab::gguf::Gguf;

/// The vocabulary-only files whose `.inp` / `.out` vectors are checked, with the
/// `tokenizer.ggml.model` / `tokenizer.ggml.pre` each has.
const VOCABS: &[(&str, &str, &str)] = &[
    ("llama-spm", "llama", "default"),
    ("phi-3", "llama", "default"),
    ("llama-bpe", "gpt2", "llama-bpe"),
    ("qwen2", "gpt2", "qwen2"),
    ("qwen35", "gpt2", "qwen35"),
    ("gpt-2", "gpt2", "gpt-2"),
    ("starcoder", "gpt2", "starcoder"),
    ("refact", "gpt2", "refact"),
    ("command-r", "gpt2", "command-r"),
    ("mpt", "gpt2", "mpt"),
];

/// The encoder of the GGUF file at `path`, built once for all tests of this binary (a large
/// vocabulary takes seconds in a debug build).
fn encoder(path: &Path) -> Arc<Encoder> {
    type Cache = Mutex<HashMap<PathBuf, Arc<OnceLock<Arc<Encoder>>>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let slot = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap()
        .entry(path.to_path_buf())
        .or_default()
        .clone();
    slot.get_or_init(|| {
        let g = Gguf::read_file(path).unwrap();
        Arc::new(Encoder::from_gguf(&g, &path.display().to_string()).unwrap())
    })
    .clone()
}

/// llama.cpp's `read_tests`: texts split at the separator, ids one line per text.
fn read_vectors(inp: &Path, out: &Path) -> Vec<(String, Vec<u32>)> {
    let raw = std::fs::read_to_string(inp).unwrap();
    let texts: Vec<&str> = raw.split("\n__ggml_vocab_test__\n").collect();
    let texts = match texts.split_last() {
        Some((&"", rest)) => rest.to_vec(),
        _ => texts,
    };
    let lines: Vec<String> = std::fs::read_to_string(out)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(texts.len(), lines.len(), "{}", inp.display());
    texts
        .iter()
        .zip(lines)
        .map(|(t, l)| {
            let ids = l
                .split_ascii_whitespace()
                .map(|x| x.parse::<u32>().unwrap())
                .collect();
            (t.to_string(), ids)
        })
        .collect()
}

#[test]
fn llama_cpp_test_vectors() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for &(name, model, pre) in VOCABS {
        let base = format!("llama-vocab/ggml-vocab-{name}.gguf");
        let (Some(gguf), Some(inp), Some(out)) = (
            nextok_testdata::require(&base),
            nextok_testdata::require(&format!("{base}.inp")),
            nextok_testdata::require(&format!("{base}.out")),
        ) else {
            continue;
        };
        let g = Gguf::read_file(&gguf).unwrap();
        assert_eq!(g.get("tokenizer.ggml.model").unwrap().as_str(), Some(model));
        assert_eq!(g.get("tokenizer.ggml.pre").unwrap().as_str(), Some(pre));
        let enc = encoder(&gguf);
        for (text, want) in read_vectors(&inp, &out) {
            let got = enc.encode(&text, false).unwrap();
            checked += 1;
            if got != want {
                failures.push(format!("{name}: {text:?}\n  got  {got:?}\n  want {want:?}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} texts differ from llama.cpp:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[derive(serde::Deserialize)]
struct Reference {
    /// Test-data file (relative to the test-data directory) → text id → ids.
    files: BTreeMap<String, RefFile>,
}

#[derive(serde::Deserialize)]
struct RefFile {
    /// Ids with the model's BOS/EOS (`llama-tokenize` without `--no-bos`).
    with_special: Vec<Vec<u32>>,
    /// Ids without them (`--no-bos`).
    without_special: Vec<Vec<u32>>,
}

fn reference_dir() -> std::path::PathBuf {
    nextok_testdata::repo_root().join("testdata/reference")
}

fn reference_texts() -> Vec<String> {
    let p = reference_dir().join("tokenize-texts.json");
    let v: Vec<String> = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    assert!(v.len() >= 20);
    v
}

#[test]
fn llama_tokenize_reference() {
    let texts = reference_texts();
    let r: Reference = serde_json::from_slice(
        &std::fs::read(reference_dir().join("llama-tokenize.json")).unwrap(),
    )
    .unwrap();
    assert!(r.files.contains_key("gemma3/gemma-3-270m-q4_k_m.gguf"));
    assert!(r.files.len() >= 6);
    let mut checked = 0;
    let mut failures = Vec::new();
    for (rel, want) in &r.files {
        let Some(path) = nextok_testdata::require(rel) else {
            continue;
        };
        assert_eq!(want.with_special.len(), texts.len(), "{rel}");
        assert_eq!(want.without_special.len(), texts.len(), "{rel}");
        let enc = encoder(&path);
        for (i, text) in texts.iter().enumerate() {
            for (add, want) in [
                (true, &want.with_special[i]),
                (false, &want.without_special[i]),
            ] {
                let got = enc.encode(text, add).unwrap();
                checked += 1;
                if &got != want {
                    failures.push(format!(
                        "{rel} text {i} {text:?} add_special={add}\n  got  {got:?}\n  want {want:?}"
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} encodings differ from llama-tokenize:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Gemma 3's vocabulary: SentencePiece, no space prefix, control tokens as single ids, special
/// strings inside chat-message spans kept as text.
#[test]
fn gemma3_encoder() {
    let Some(path) = nextok_testdata::require("gemma3/gemma-3-270m-q4_k_m.gguf") else {
        return;
    };
    let g = Gguf::read_file(&path).unwrap();
    assert_eq!(
        g.get("tokenizer.ggml.tokens")
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        262_144
    );
    let enc = Encoder::from_gguf(&g, "gemma3").unwrap();
    assert!(enc.tokenizer().is_none());
    let v = nextok_vocab::Vocabulary::from_gguf(&g, "gemma3", &Default::default()).unwrap();
    let text = "<start_of_turn>user\nHello <end_of_turn>\n";
    let ids = enc.encode(text, true).unwrap();
    assert_eq!(ids[0], 2, "BOS");
    assert_eq!(v.name(ids[1]), Some("<start_of_turn>"));
    assert_eq!(v.decode(&ids[1..]).unwrap(), text.as_bytes());
    // The same text as the content of a message: its control-token strings are text.
    let span = 0..text.len();
    let plain = enc
        .encode_with_text_spans(text, std::slice::from_ref(&span), false)
        .unwrap();
    assert!(plain.iter().all(|&id| !v.info.is_special(id)), "{plain:?}");
    assert_eq!(v.decode(&plain).unwrap(), text.as_bytes());
    assert_eq!(enc.special_in(text), Some("<start_of_turn>"));
}
