//! nextok's forward pass against llama.cpp's on the same files (`testdata/reference/`, made by
//! `scripts/reference/model-logits.sh`; the tests never build llama.cpp):
//!
//! * the tiny seeded model of every family (llama, qwen2, qwen3, gemma3, phi3), rebuilt here
//!   and identified by SHA-256: the ten highest raw logits after every position of two prompts,
//!   and an 8-token greedy continuation;
//! * the same models quantised by llama.cpp's `llama-quantize` to Q8_0, Q4_0, Q5_1, Q4_1, Q5_0,
//!   F16 and BF16, and one-layer models with rows of 256 values quantised to Q4_K_M and Q5_K_M
//!   (committed in `testdata/tiny-quant/`, made by `scripts/reference/tiny-quant.sh`): the same
//!   prompts and continuations, every matrix format nextok has a kernel for among them;
//! * the same tiny models carrying their families' real tokenizers (Llama 3, Qwen 2, Gemma 3,
//!   Phi-3, from the test data): three texts as llama.cpp tokenized them (nextok's ids must be
//!   the same), the ten highest raw logits after every position, a 16-token greedy
//!   continuation;
//! * the real Gemma 3 270M Q4_K_M file: six prompts as llama.cpp tokenized them, the ten
//!   highest raw logits after every position, and a 16-token greedy continuation;
//! * the real Qwen2.5-Coder 0.5B and 1.5B Instruct Q4_K_M files (`fetch-testdata.sh --large`):
//!   the same for six prompts, with the bound the quantised tiny models use.
//!
//! The largest logit difference is printed and bounded; where a greedy continuation departs
//! from llama.cpp's, the step must be a near tie in nextok's own logits (a top-2 margin below
//! twice the largest measured logit difference).

mod common;

use std::sync::Arc;

use common::tiny::{Tiny, SEED};
use nextok_model::{LogitsSource, ModelSource, ModelWeights, Requant};
use serde_json::Value;

fn reference(name: &str) -> Value {
    let p = nextok_testdata::repo_root()
        .join("testdata/reference")
        .join(name);
    serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn ranked(row: &[f32]) -> (u32, f32) {
    let mut best = (0usize, f32::NEG_INFINITY);
    let mut second = f32::NEG_INFINITY;
    for (i, &z) in row.iter().enumerate() {
        if z > best.1 {
            second = best.1;
            best = (i, z);
        } else if z > second {
            second = z;
        }
    }
    (best.0 as u32, best.1 - second)
}

/// What one prompt of one model gave.
struct Check {
    /// Largest |nextok − llama.cpp| over the reference's top-10 logits at every position.
    max_delta: f32,
    /// Leading greedy tokens equal to llama.cpp's.
    greedy_prefix: usize,
    /// Tokens in the reference's greedy continuation.
    greedy_len: usize,
    /// nextok's top-2 margin where its greedy continuation departs.
    margin_at_departure: Option<f32>,
}

fn check(w: &Arc<ModelWeights>, p: &Value) -> Check {
    let prompt = ids(&p["ids"]);
    let top = p["top"].as_array().unwrap();
    assert_eq!(top.len(), prompt.len());
    let v = w.config.vocab_size;
    let mut src = ModelSource::new(w.clone());
    let rows = src.prefill_all(&prompt).unwrap();
    let mut max_delta = 0f32;
    for (pos, t) in top.iter().enumerate() {
        let row = &rows[pos * v..(pos + 1) * v];
        for e in t.as_array().unwrap() {
            let id = e[0].as_u64().unwrap() as usize;
            let want = e[1].as_f64().unwrap() as f32;
            max_delta = max_delta.max((row[id] - want).abs());
        }
    }
    let greedy = ids(&p["greedy"]);
    let mut row = rows[(prompt.len() - 1) * v..].to_vec();
    let mut greedy_prefix = 0;
    let mut margin_at_departure = None;
    for &want in &greedy {
        let (t, margin) = ranked(&row);
        if t != want {
            margin_at_departure = Some(margin);
            break;
        }
        greedy_prefix += 1;
        row = src.decode_one(t).unwrap();
    }
    Check {
        max_delta,
        greedy_prefix,
        greedy_len: greedy.len(),
        margin_at_departure,
    }
}

fn assert_close(name: &str, c: &Check, bound: f32) {
    assert!(
        c.max_delta <= bound,
        "{name}: logits differ from llama.cpp's by {} (bound {bound})",
        c.max_delta
    );
    if let Some(m) = c.margin_at_departure {
        assert!(
            m <= 2.0 * c.max_delta.max(1e-3),
            "{name}: greedy departs from llama.cpp's after {} tokens where nextok's top-2 margin is {m} (not a near tie)",
            c.greedy_prefix
        );
    }
}

/// The tiny models: F32 weights (F32 kernels on both sides), so the logits agree to within
/// rounding; the bound is 4·10⁻³ (largest measured: printed).
#[test]
fn tiny_models_of_every_family_match_llama_cpp() {
    let r = reference("families.llamacpp.json");
    let dir = std::env::temp_dir().join(format!("nextok-llama-cpp-logits-{}", std::process::id()));
    let models = r["models"].as_array().unwrap();
    assert_eq!(models.len(), Tiny::all().len());
    for tiny in Tiny::all() {
        let entry = models
            .iter()
            .find(|m| m["file"].as_str() == Some(tiny.name().as_str()))
            .unwrap_or_else(|| panic!("no reference for {}", tiny.name()));
        let path = tiny.write_to(&dir, &tiny.tensors(SEED));
        assert_eq!(
            nextok_model::sha256_file(&path).unwrap(),
            entry["sha256"].as_str().unwrap(),
            "{}: the tiny model is not the file llama.cpp ran (rerun scripts/reference/model-logits.sh)",
            tiny.name()
        );
        let w = Arc::new(ModelWeights::load(&path, Requant::Keep).unwrap());
        for (i, p) in entry["prompts"].as_array().unwrap().iter().enumerate() {
            let c = check(&w, p);
            eprintln!(
                "{} prompt {i}: max |Δlogit| {:.2e}; greedy {}/{} match",
                tiny.name(),
                c.max_delta,
                c.greedy_prefix,
                c.greedy_len
            );
            assert_close(&tiny.name(), &c, 4e-3);
        }
    }
}

/// The tiny models with their families' real tokenizers: each text is encoded by nextok's
/// encoder from the file's own metadata into llama.cpp's ids, and the logits of those ids agree
/// to within rounding (F32 weights; the bound is 4·10⁻³, as for the small-vocabulary models).
#[test]
fn tiny_models_with_their_real_tokenizers_match_llama_cpp() {
    let Some(tinies) = Tiny::all_with_real_vocab() else {
        return;
    };
    let r = reference("families-vocab.llamacpp.json");
    let dir = std::env::temp_dir().join(format!("nextok-llama-cpp-vocab-{}", std::process::id()));
    let models = r["models"].as_array().unwrap();
    assert_eq!(models.len(), tinies.len());
    for tiny in tinies {
        let name = tiny.name();
        let entry = models
            .iter()
            .find(|m| m["file"].as_str() == Some(name.as_str()))
            .unwrap_or_else(|| panic!("no reference for {name}"));
        let path = tiny.write_to(&dir, &tiny.tensors(SEED));
        assert_eq!(
            nextok_model::sha256_file(&path).unwrap(),
            entry["sha256"].as_str().unwrap(),
            "{name}: not the file llama.cpp ran (rerun scripts/reference/model-logits.sh)"
        );
        let m = nextok_model::Model::load(&path, Requant::Keep).unwrap();
        assert_eq!(m.weights.config.vocab_size as u64, tiny.vocab_size());
        let encoder = {
            let f = nextok_model::file::GgufFile::open(&path).unwrap();
            nextok_vocab::encode::Encoder::from_gguf(f.meta(), &name).unwrap()
        };
        let prompts = entry["prompts"].as_array().unwrap();
        assert_eq!(prompts.len(), 3);
        for p in prompts {
            let text = p["text"].as_str().unwrap();
            assert_eq!(
                encoder.encode(text, true).unwrap(),
                ids(&p["ids"]),
                "{name} {text:?}: token ids"
            );
            let c = check(&m.weights, p);
            eprintln!(
                "{name} {text:?}: {} ids; max |Δlogit| {:.2e}; greedy {}/{} match",
                ids(&p["ids"]).len(),
                c.max_delta,
                c.greedy_prefix,
                c.greedy_len
            );
            assert_close(&name, &c, 4e-3);
        }
        std::fs::remove_file(&path).unwrap();
    }
}

/// The tiny models quantised by llama.cpp's `llama-quantize` to Q8_0, Q4_0, Q5_1, Q4_1, Q5_0,
/// F16 and BF16 (norms stay F32 and the output matrix is Q8_0 in the quantised files), and the
/// one-layer models with rows of 256 values in Q4_K_M and Q5_K_M (`testdata/tiny-quant/`,
/// committed with the reference), each on nextok's own kernels for its formats — every matrix
/// format nextok has a kernel for occurs among them: the files are the ones llama.cpp ran
/// (SHA-256), the top-10 logits stay within a bound of llama.cpp's, and every greedy token is
/// llama.cpp's except at a near tie. Both sides quantise the activations per block before each
/// product, so a last-bit difference anywhere can move one activation by a whole quantisation
/// step: many files agree to the bit, the others differ from some position on. The bound is
/// what llama.cpp allows itself: 0.25, or for a file where llama.cpp's own logits move further
/// between its two attention paths (flash attention on and off, recorded per file in the
/// reference as `flash_attn_delta`: up to 0.36 on Qwen 3 in Q5_K_M), that distance. nextok's
/// largest difference of each file is printed beside it.
#[test]
fn quantised_tiny_models_match_llama_cpp() {
    const BOUND: f32 = 0.25;
    let r = reference("families-quant.llamacpp.json");
    let dir = nextok_testdata::repo_root().join("testdata/tiny-quant");
    let models = r["models"].as_array().unwrap();
    // every family in every format, and no file without a reference
    let small = ["q8_0", "q4_0", "q5_1", "q4_1", "q5_0", "f16", "bf16"];
    let mut want: Vec<String> =
        Tiny::all()
            .iter()
            .flat_map(|t| small.map(|q| format!("{}-{q}.gguf", t.arch.name())))
            .chain(Tiny::all().iter().flat_map(|t| {
                ["q4_k_m", "q5_k_m"].map(|q| format!("{}-e256-{q}.gguf", t.arch.name()))
            }))
            .collect();
    let mut listed: Vec<String> = models
        .iter()
        .map(|m| m["file"].as_str().unwrap().to_string())
        .collect();
    let mut present: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".gguf"))
        .collect();
    want.sort();
    listed.sort();
    present.sort();
    assert_eq!(listed, want, "the reference's files");
    assert_eq!(present, want, "the files in {}", dir.display());
    let mut worst = (0f32, String::new());
    let mut formats = std::collections::BTreeSet::new();
    for entry in models {
        let name = entry["file"].as_str().unwrap();
        let path = dir.join(name);
        let (_, tensors) = nextok_vocab::gguf::Gguf::read_file_with_tensors(&path).unwrap();
        formats.extend(
            tensors
                .infos
                .iter()
                .filter(|t| t.dims.len() == 2)
                .map(|t| nextok_model::file::ggml_type::name(t.ggml_type)),
        );
        assert_eq!(
            nextok_model::sha256_file(&path).unwrap(),
            entry["sha256"].as_str().unwrap(),
            "{name}: not the file llama.cpp ran (rerun scripts/reference/tiny-quant.sh)"
        );
        let w = Arc::new(ModelWeights::load(&path, Requant::Keep).unwrap());
        assert!(
            w.converted.is_empty(),
            "{name}: matrices converted: {:?}",
            w.converted
        );
        let llama_own = entry["flash_attn_delta"].as_f64().unwrap() as f32;
        let bound = BOUND.max(llama_own);
        let mut file_max = 0f32;
        let mut greedy = (0, 0);
        for (i, p) in entry["prompts"].as_array().unwrap().iter().enumerate() {
            let c = check(&w, p);
            file_max = file_max.max(c.max_delta);
            greedy.0 += c.greedy_prefix;
            greedy.1 += c.greedy_len;
            if let Some(m) = c.margin_at_departure {
                eprintln!(
                    "{name} prompt {i}: greedy departs after {} tokens at a top-2 margin of {m:.2e}",
                    c.greedy_prefix
                );
            }
            assert_close(name, &c, bound);
        }
        eprintln!(
            "{name}: max |Δlogit| {file_max:.3}{} (llama.cpp's own with flash attention: \
             {llama_own:.3}); greedy {}/{} match",
            if file_max == 0.0 { " (same bits)" } else { "" },
            greedy.0,
            greedy.1
        );
        if file_max > worst.0 {
            worst = (file_max, name.to_string());
        }
    }
    eprintln!(
        "largest |Δlogit| {:.3} ({}); bound {BOUND} or llama.cpp's own distance; matrix formats: \
         {formats:?}",
        worst.0, worst.1
    );
    // (F32 matrices: the unquantised tiny models above)
    for f in [
        "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16",
    ] {
        assert!(
            formats.contains(f),
            "no matrix in {f} among the files: {formats:?}"
        );
    }
}

/// The real Gemma 3 270M Q4_K_M file on nextok's own kernels for its Q5_0, Q4_K, Q6_K and Q8_0
/// matrices (no re-quantisation): nextok's token ids are llama.cpp's, the top-10 logits at every
/// position stay within 2.5 of llama.cpp's, and the greedy continuations match except at near
/// ties. The bound is what llama.cpp allows itself: on these prompts its own logits move by up
/// to 2.09 between its two attention paths (flash attention on and off, measured with the same
/// build); nextok's largest difference is printed (2.07 when the reference was made).
#[test]
fn gemma_3_270m_matches_llama_cpp() {
    let Some(path) = nextok_testdata::require(nextok_testdata::GEMMA3_270M) else {
        return;
    };
    let r = reference("gemma-3-270m.llamacpp.json");
    let entry = &r["models"][0];
    let w = Arc::new(ModelWeights::load(&path, Requant::Keep).unwrap());
    assert!(
        w.converted.is_empty(),
        "matrices converted: {:?}",
        w.converted
    );
    let encoder = {
        let f = nextok_model::file::GgufFile::open(&path).unwrap();
        nextok_vocab::encode::Encoder::from_gguf(f.meta(), "gemma").unwrap()
    };
    for p in entry["prompts"].as_array().unwrap() {
        let text = p["text"].as_str().unwrap();
        assert_eq!(
            encoder.encode(text, true).unwrap(),
            ids(&p["ids"]),
            "{text:?}: token ids"
        );
        let c = check(&w, p);
        eprintln!(
            "gemma-3-270m {text:?}: max |Δlogit| {:.3}; greedy {}/{} match{}",
            c.max_delta,
            c.greedy_prefix,
            c.greedy_len,
            c.margin_at_departure
                .map(|m| format!(" (departs at a top-2 margin of {m:.3})"))
                .unwrap_or_default()
        );
        assert_close(text, &c, 2.5);
    }
}

/// The real Qwen2.5-Coder 0.5B (Q5_0/Q8_0/Q4_K/Q6_K) and 1.5B (Q4_K/Q6_K) Instruct files as
/// shipped: llama.cpp's token ids, its raw logits within the bound of the quantised tiny models
/// (0.25, or how far llama.cpp's own logits move between its two attention paths on the same
/// prompts, recorded per file as `flash_attn_delta`), greedy continuations equal except at a
/// near tie. `scripts/test.sh` fetches them (`fetch-testdata.sh --large`, 1.6 GB); elsewhere,
/// without them, the test says so and checks nothing.
#[test]
fn qwen2_5_coder_files_match_llama_cpp() {
    const BOUND: f32 = 0.25;
    let r = reference("qwen2.5-coder.llamacpp.json");
    let models = r["models"].as_array().unwrap();
    let files = [
        nextok_testdata::QWEN25_CODER_05B,
        nextok_testdata::QWEN25_CODER_15B,
    ];
    assert_eq!(models.len(), files.len());
    for rel in files {
        let Some(path) = nextok_testdata::require(rel) else {
            continue;
        };
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let entry = models
            .iter()
            .find(|m| m["file"].as_str() == Some(name.as_str()))
            .unwrap_or_else(|| panic!("no reference for {name}"));
        let w = Arc::new(ModelWeights::load(&path, Requant::Keep).unwrap());
        assert!(
            w.converted.is_empty(),
            "{name}: matrices converted: {:?}",
            w.converted
        );
        assert_eq!(
            nextok_model::sha256_file(&path).unwrap(),
            entry["sha256"].as_str().unwrap(),
            "{name}: not the file llama.cpp ran"
        );
        let encoder = {
            let f = nextok_model::file::GgufFile::open(&path).unwrap();
            nextok_vocab::encode::Encoder::from_gguf(f.meta(), "qwen2").unwrap()
        };
        let llama_own = entry["flash_attn_delta"].as_f64().unwrap() as f32;
        let bound = BOUND.max(llama_own);
        let (mut file_max, mut greedy) = (0f32, (0, 0));
        for p in entry["prompts"].as_array().unwrap() {
            let text = p["text"].as_str().unwrap();
            assert_eq!(
                encoder.encode(text, true).unwrap(),
                ids(&p["ids"]),
                "{name} {text:?}: token ids"
            );
            let c = check(&w, p);
            file_max = file_max.max(c.max_delta);
            greedy.0 += c.greedy_prefix;
            greedy.1 += c.greedy_len;
            if let Some(m) = c.margin_at_departure {
                eprintln!(
                    "{name} {text:?}: greedy departs after {} tokens at a top-2 margin of {m:.3}",
                    c.greedy_prefix
                );
            }
            assert_close(&name, &c, bound);
        }
        eprintln!(
            "{name}: max |Δlogit| {file_max:.3} (bound {bound:.3}: llama.cpp's own with flash \
             attention {llama_own:.3}); greedy {}/{} match",
            greedy.0, greedy.1
        );
    }
}
