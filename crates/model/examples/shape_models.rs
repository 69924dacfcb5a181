//! Writes F16 GGUF files with the exact hyper-parameters and tensor shapes of models no package
//! ships — Llama 3.2 1B and 3B, Llama 3.1 8B, Qwen3 4B — and their families' real tokenizers
//! (llama.cpp's vocabulary files in the test data), with seeded random weights: for speed and
//! memory measurements only, never for correctness claims. `scripts/shape-models.sh` quantises
//! them with llama.cpp's `llama-quantize` into the cache.
//!
//! ```sh
//! cargo run --release -p nextok-model --example shape_models -- DIR llama3.2-1b [qwen3-4b ...]
//! ```
//!
//! Tensors are written as they are generated (an 8B file is 16 GB; nothing holds it whole).

use std::io::Write;
use std::path::{Path, PathBuf};

use nextok_vocab::gguf::{write_metadata, Gguf, Value as G};

/// The tests' GGUF helpers: the seeded generator of their tiny models.
#[path = "../tests/common/mod.rs"]
mod common;
use common::Rng;

/// What a shape is.
struct Shape {
    name: &'static str,
    arch: &'static str,
    layers: u64,
    embd: u64,
    ff: u64,
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
    context: u64,
    rope_base: f32,
    eps: f32,
    tied: bool,
    /// Llama 3.1's rotary scaling (factor, original context) as a `rope_freqs.weight` tensor.
    llama3_rope: Option<(f32, u64)>,
    /// The test-data vocabulary file whose `tokenizer.*` keys the model carries.
    vocab: &'static str,
}

const LLAMA_VOCAB: &str = "llama-vocab/ggml-vocab-llama-bpe.gguf";
const QWEN_VOCAB: &str = "llama-vocab/ggml-vocab-qwen2.gguf";

/// The shapes, from the models' published configurations.
const SHAPES: [Shape; 4] = [
    Shape {
        name: "llama3.2-1b",
        arch: "llama",
        layers: 16,
        embd: 2048,
        ff: 8192,
        heads: 32,
        kv_heads: 8,
        head_dim: 64,
        context: 131_072,
        rope_base: 500_000.0,
        eps: 1e-5,
        tied: true,
        llama3_rope: Some((32.0, 8192)),
        vocab: LLAMA_VOCAB,
    },
    Shape {
        name: "llama3.2-3b",
        arch: "llama",
        layers: 28,
        embd: 3072,
        ff: 8192,
        heads: 24,
        kv_heads: 8,
        head_dim: 128,
        context: 131_072,
        rope_base: 500_000.0,
        eps: 1e-5,
        tied: true,
        llama3_rope: Some((32.0, 8192)),
        vocab: LLAMA_VOCAB,
    },
    Shape {
        name: "llama3.1-8b",
        arch: "llama",
        layers: 32,
        embd: 4096,
        ff: 14_336,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        context: 131_072,
        rope_base: 500_000.0,
        eps: 1e-5,
        tied: false,
        llama3_rope: Some((8.0, 8192)),
        vocab: LLAMA_VOCAB,
    },
    Shape {
        name: "qwen3-4b",
        arch: "qwen3",
        layers: 36,
        embd: 2560,
        ff: 9728,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        context: 40_960,
        rope_base: 1_000_000.0,
        eps: 1e-6,
        tied: true,
        llama3_rope: None,
        vocab: QWEN_VOCAB,
    },
];

/// A tensor to write: name, GGUF dimensions (first varies fastest), and its values.
struct Tensor {
    name: String,
    dims: Vec<u64>,
    fill: Fill,
}

enum Fill {
    /// F16, uniform in `[-a, a)` from the seeded generator.
    Random(f32),
    /// F32, these values.
    Values(Vec<f32>),
}

impl Tensor {
    fn elems(&self) -> u64 {
        self.dims.iter().product()
    }

    fn ggml_type(&self) -> u32 {
        match self.fill {
            Fill::Random(_) => 1,
            Fill::Values(_) => 0,
        }
    }

    fn bytes(&self) -> u64 {
        self.elems() * if self.ggml_type() == 1 { 2 } else { 4 }
    }
}

/// Llama 3.1's rotary frequency factors (llama.cpp's `convert_hf_to_gguf.py`, low frequency
/// factor 1, high 4).
fn llama3_factors(head_dim: u64, base: f32, factor: f32, original: u64) -> Vec<f32> {
    let (low, high) = (1.0f64, 4.0f64);
    let (low_wl, high_wl) = (original as f64 / low, original as f64 / high);
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / (base as f64).powf(2.0 * i as f64 / head_dim as f64);
            let wl = 2.0 * std::f64::consts::PI / freq;
            if wl < high_wl {
                1.0
            } else if wl > low_wl {
                factor
            } else {
                let smooth = (original as f64 / wl - low) / (high - low);
                (1.0 / ((1.0 - smooth) / factor as f64 + smooth)) as f32
            }
        })
        .collect()
}

fn tensors(s: &Shape, vocab: u64) -> Vec<Tensor> {
    let (e, ff, qd, kvd) = (s.embd, s.ff, s.heads * s.head_dim, s.kv_heads * s.head_dim);
    // weights small enough that 36 layers of random residual updates stay finite
    let w = |name: String, dims: &[u64]| Tensor {
        name,
        dims: dims.to_vec(),
        fill: Fill::Random(0.5 / (dims[0] as f32).sqrt()),
    };
    let ones = |name: String, n: u64| Tensor {
        name,
        dims: vec![n],
        fill: Fill::Values(vec![1.0; n as usize]),
    };
    let mut out = vec![w("token_embd.weight".into(), &[e, vocab])];
    if !s.tied {
        out.push(w("output.weight".into(), &[e, vocab]));
    }
    out.push(ones("output_norm.weight".into(), e));
    if let Some((factor, original)) = s.llama3_rope {
        out.push(Tensor {
            name: "rope_freqs.weight".into(),
            dims: vec![s.head_dim / 2],
            fill: Fill::Values(llama3_factors(s.head_dim, s.rope_base, factor, original)),
        });
    }
    for i in 0..s.layers {
        let t = |n: &str| format!("blk.{i}.{n}.weight");
        out.push(ones(t("attn_norm"), e));
        out.push(w(t("attn_q"), &[e, qd]));
        out.push(w(t("attn_k"), &[e, kvd]));
        out.push(w(t("attn_v"), &[e, kvd]));
        if s.arch == "qwen3" {
            out.push(ones(t("attn_q_norm"), s.head_dim));
            out.push(ones(t("attn_k_norm"), s.head_dim));
        }
        out.push(w(t("attn_output"), &[qd, e]));
        out.push(ones(t("ffn_norm"), e));
        out.push(w(t("ffn_gate"), &[e, ff]));
        out.push(w(t("ffn_up"), &[e, ff]));
        out.push(w(t("ffn_down"), &[ff, e]));
    }
    out
}

fn metadata(s: &Shape, vocab_md: Vec<(String, G)>) -> Vec<(String, G)> {
    let k = |n: &str| format!("{}.{n}", s.arch);
    let mut md = vec![
        ("general.architecture".to_string(), G::String(s.arch.into())),
        (
            "general.name".to_string(),
            G::String(format!("{} shape (seeded random weights)", s.name)),
        ),
        (k("block_count"), G::U32(s.layers as u32)),
        (k("context_length"), G::U32(s.context as u32)),
        (k("embedding_length"), G::U32(s.embd as u32)),
        (k("feed_forward_length"), G::U32(s.ff as u32)),
        (k("attention.head_count"), G::U32(s.heads as u32)),
        (k("attention.head_count_kv"), G::U32(s.kv_heads as u32)),
        (k("attention.key_length"), G::U32(s.head_dim as u32)),
        (k("attention.value_length"), G::U32(s.head_dim as u32)),
        (k("rope.freq_base"), G::F32(s.rope_base)),
        (k("attention.layer_norm_rms_epsilon"), G::F32(s.eps)),
    ];
    if s.arch == "llama" {
        md.push((k("rope.dimension_count"), G::U32(s.head_dim as u32)));
    }
    md.extend(vocab_md);
    md
}

fn write(s: &Shape, dir: &Path) -> std::io::Result<PathBuf> {
    let vocab_path = nextok_testdata::dir().join(s.vocab);
    let vocab_md: Vec<(String, G)> = Gguf::read_file(&vocab_path)
        .map_err(|e| std::io::Error::other(format!("{}: {e}", vocab_path.display())))?
        .metadata
        .into_iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .collect();
    let vocab = match vocab_md.iter().find(|(k, _)| k == "tokenizer.ggml.tokens") {
        Some((_, G::Array(nextok_vocab::gguf::Array::String(t)))) => t.len() as u64,
        _ => return Err(std::io::Error::other("no tokenizer.ggml.tokens")),
    };
    let ts = tensors(s, vocab);
    let mut head = write_metadata(3, false, &metadata(s, vocab_md));
    head[8..16].copy_from_slice(&(ts.len() as u64).to_le_bytes());
    let mut offset = 0u64;
    for t in &ts {
        head.extend_from_slice(&(t.name.len() as u64).to_le_bytes());
        head.extend_from_slice(t.name.as_bytes());
        head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            head.extend_from_slice(&d.to_le_bytes());
        }
        head.extend_from_slice(&t.ggml_type().to_le_bytes());
        head.extend_from_slice(&offset.to_le_bytes());
        offset += t.bytes().div_ceil(32) * 32;
    }
    while !head.len().is_multiple_of(32) {
        head.push(0);
    }
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("{}-f16.gguf", s.name));
    let part = path.with_extension("gguf.part");
    let mut out = std::io::BufWriter::with_capacity(1 << 22, std::fs::File::create(&part)?);
    out.write_all(&head)?;
    let mut rng = Rng(0x5EED ^ s.layers);
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 22);
    for t in &ts {
        match &t.fill {
            Fill::Values(v) => {
                for x in v {
                    out.write_all(&x.to_le_bytes())?;
                }
            }
            Fill::Random(a) => {
                let mut left = t.elems();
                while left > 0 {
                    let n = left.min(1 << 20);
                    buf.clear();
                    for _ in 0..n {
                        let x = half::f16::from_f32(rng.uniform(*a));
                        buf.extend_from_slice(&x.to_le_bytes());
                    }
                    out.write_all(&buf)?;
                    left -= n;
                }
            }
        }
        let pad = (t.bytes().div_ceil(32) * 32 - t.bytes()) as usize;
        out.write_all(&[0u8; 32][..pad])?;
    }
    out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    std::fs::rename(&part, &path)?;
    Ok(path)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let names: Vec<&str> = SHAPES.iter().map(|s| s.name).collect();
    if args.len() < 2 {
        eprintln!(
            "usage: shape_models DIR SHAPE... (shapes: {})",
            names.join(", ")
        );
        std::process::exit(2);
    }
    let dir = PathBuf::from(&args[0]);
    for name in &args[1..] {
        let Some(s) = SHAPES.iter().find(|s| s.name == name) else {
            eprintln!(
                "shape_models: unknown shape `{name}` (shapes: {})",
                names.join(", ")
            );
            std::process::exit(2);
        };
        match write(s, &dir) {
            Ok(p) => println!("{}", p.display()),
            Err(e) => {
                eprintln!("shape_models: {name}: {e}");
                std::process::exit(1);
            }
        }
    }
}
