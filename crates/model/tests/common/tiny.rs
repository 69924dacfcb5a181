//! Tiny seeded models of every supported family, written as GGUF files by the tests (and by
//! the example that feeds them to llama.cpp for the committed references).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nextok_model::arch::Arch;
use nextok_model::{ModelWeights, Requant};
use nextok_vocab::gguf::{Array, Gguf, Value as G};

use super::{gguf, random, Rng, T};

/// The seed of every tiny model's weights.
pub const SEED: u64 = 7;
pub const E: u64 = 64;
pub const FF: u64 = 96;
pub const V: u64 = 320;
pub const HEADS: u64 = 4;
pub const KV_HEADS: u64 = 2;
/// The embedding and feed-forward width of [`Tiny::wide`].
pub const WIDE: u64 = 256;

/// How a tiny model is built.
#[derive(Clone, Copy)]
pub struct Tiny {
    pub arch: Arch,
    pub layers: u64,
    /// Embedding width ([`E`], or [`WIDE`] for the K-quant files, whose rows hold 256 values).
    pub embd: u64,
    /// Feed-forward width ([`FF`], or [`WIDE`]).
    pub ff: u64,
    /// Gemma 3's sliding window.
    pub window: Option<u64>,
    /// Phi-3: one `attn_qkv` matrix (else separate Q/K/V).
    pub fused_qkv: bool,
    /// The context length the file declares.
    pub context: u64,
    /// The vocabulary: `None` for the small SentencePiece one of [`V`] tokens; else a GGUF file
    /// of the test data (relative to `nextok_testdata::dir()`) whose `tokenizer.*` metadata the
    /// model carries — its family's real tokenizer ([`Tiny::with_real_vocab`]).
    pub vocab: Option<&'static str>,
}

/// The test-data file whose tokenizer a family's tiny model carries with
/// [`Tiny::with_real_vocab`]: llama.cpp's vocabulary files of Llama 3 (`llama-bpe`), Qwen 2
/// (whose pre-tokenizer Qwen 3 shares) and Phi-3, and the real Gemma 3 file.
pub fn real_vocab_file(arch: Arch) -> &'static str {
    match arch {
        Arch::Llama => "llama-vocab/ggml-vocab-llama-bpe.gguf",
        Arch::Qwen2 | Arch::Qwen3 => "llama-vocab/ggml-vocab-qwen2.gguf",
        Arch::Gemma3 => nextok_testdata::GEMMA3_270M,
        Arch::Phi3 => "llama-vocab/ggml-vocab-phi-3.gguf",
    }
}

impl Tiny {
    pub fn of(arch: Arch) -> Tiny {
        Tiny {
            arch,
            layers: if arch == Arch::Gemma3 { 7 } else { 2 },
            embd: E,
            ff: FF,
            window: (arch == Arch::Gemma3).then_some(5),
            fused_qkv: arch == Arch::Phi3,
            context: 64,
            vocab: None,
        }
    }

    /// A one-layer model of `arch` whose matrices have rows of [`WIDE`] values (a multiple of
    /// the K-quants' 256-value super-blocks), for `llama-quantize`'s K-quant types.
    pub fn wide(arch: Arch) -> Tiny {
        Tiny {
            layers: 1,
            embd: WIDE,
            ff: WIDE,
            ..Tiny::of(arch)
        }
    }

    /// The tiny model of `arch` with its family's real tokenizer ([`real_vocab_file`]); `None`
    /// after a notice when the test data lacks the file (outside CI).
    pub fn with_real_vocab(arch: Arch) -> Option<Tiny> {
        let rel = real_vocab_file(arch);
        nextok_testdata::require(rel)?;
        Some(Tiny {
            vocab: Some(rel),
            ..Tiny::of(arch)
        })
    }

    /// The `tokenizer.*` metadata this model carries.
    fn vocab_metadata(&self) -> Vec<(String, G)> {
        match self.vocab {
            None => vocab(),
            Some(rel) => {
                let path = nextok_testdata::dir().join(rel);
                Gguf::read_file(&path)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
                    .metadata
                    .into_iter()
                    .filter(|(k, _)| k.starts_with("tokenizer."))
                    .collect()
            }
        }
    }

    /// Tokens in this model's vocabulary (rows of its embedding and output matrices).
    pub fn vocab_size(&self) -> u64 {
        if self.vocab.is_none() {
            return V;
        }
        let md = self.vocab_metadata();
        match md.iter().find(|(k, _)| k == "tokenizer.ggml.tokens") {
            Some((_, G::Array(Array::String(t)))) => t.len() as u64,
            _ => panic!("{:?}: no tokenizer.ggml.tokens", self.vocab),
        }
    }

    pub fn head_dim(&self) -> u64 {
        match self.arch {
            // heads wider than n_embd / n_head, as in the real files
            Arch::Qwen3 | Arch::Gemma3 => 2 * self.embd / HEADS,
            _ => self.embd / HEADS,
        }
    }

    pub fn metadata(&self) -> Vec<(String, G)> {
        let a = self.arch.name();
        let k = |s: &str| format!("{a}.{s}");
        let mut md = vec![
            ("general.architecture".to_string(), G::String(a.into())),
            (k("block_count"), G::U32(self.layers as u32)),
            (k("embedding_length"), G::U32(self.embd as u32)),
            (k("feed_forward_length"), G::U32(self.ff as u32)),
            (k("attention.head_count"), G::U32(HEADS as u32)),
            (k("attention.head_count_kv"), G::U32(KV_HEADS as u32)),
            (k("attention.key_length"), G::U32(self.head_dim() as u32)),
            (k("attention.value_length"), G::U32(self.head_dim() as u32)),
            (k("context_length"), G::U32(self.context as u32)),
            (k("attention.layer_norm_rms_epsilon"), G::F32(1e-6)),
            (
                k("rope.freq_base"),
                G::F32(if self.arch == Arch::Gemma3 { 1e6 } else { 1e4 }),
            ),
        ];
        if let Some(w) = self.window {
            md.push((k("attention.sliding_window"), G::U32(w as u32)));
        }
        md.extend(self.vocab_metadata());
        md
    }

    pub fn tensors(&self, seed: u64) -> Vec<T> {
        let mut rng = Rng(seed);
        let hd = self.head_dim();
        let v = self.vocab_size();
        let (e, ff) = (self.embd, self.ff);
        let (qd, kvd) = (HEADS * hd, KV_HEADS * hd);
        let w = |n: &str, dims: &[u64], rng: &mut Rng| {
            let fan_in = dims[0] as f32;
            random(n, dims, rng, 1.5 / fan_in.sqrt(), 0.0)
        };
        let norm = |n: &str, len: u64, rng: &mut Rng| random(n, &[len], rng, 0.2, 1.0);
        let mut t = vec![
            random("token_embd.weight", &[e, v], &mut rng, 1.0, 0.0),
            norm("output_norm.weight", e, &mut rng),
        ];
        if matches!(self.arch, Arch::Llama | Arch::Qwen2 | Arch::Phi3) {
            t.push(w("output.weight", &[e, v], &mut rng));
        }
        if self.arch == Arch::Llama {
            // Llama 3's frequency factors
            t.push(random("rope_freqs.weight", &[hd / 2], &mut rng, 0.5, 2.0));
        }
        for i in 0..self.layers {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            t.push(norm(&n("attn_norm"), e, &mut rng));
            if self.fused_qkv {
                t.push(w(&n("attn_qkv"), &[e, qd + 2 * kvd], &mut rng));
            } else {
                t.push(w(&n("attn_q"), &[e, qd], &mut rng));
                t.push(w(&n("attn_k"), &[e, kvd], &mut rng));
                t.push(w(&n("attn_v"), &[e, kvd], &mut rng));
            }
            if self.arch == Arch::Qwen2 {
                for (s, len) in [("attn_q", qd), ("attn_k", kvd), ("attn_v", kvd)] {
                    t.push(random(
                        &format!("blk.{i}.{s}.bias"),
                        &[len],
                        &mut rng,
                        0.3,
                        0.0,
                    ));
                }
            }
            if matches!(self.arch, Arch::Qwen3 | Arch::Gemma3) {
                t.push(norm(&n("attn_q_norm"), hd, &mut rng));
                t.push(norm(&n("attn_k_norm"), hd, &mut rng));
            }
            t.push(w(&n("attn_output"), &[qd, e], &mut rng));
            if self.arch == Arch::Gemma3 {
                t.push(norm(&n("post_attention_norm"), e, &mut rng));
                t.push(norm(&n("post_ffw_norm"), e, &mut rng));
            }
            t.push(norm(&n("ffn_norm"), e, &mut rng));
            if self.arch == Arch::Phi3 {
                t.push(w(&n("ffn_up"), &[e, 2 * ff], &mut rng));
            } else {
                t.push(w(&n("ffn_gate"), &[e, ff], &mut rng));
                t.push(w(&n("ffn_up"), &[e, ff], &mut rng));
            }
            t.push(w(&n("ffn_down"), &[ff, e], &mut rng));
        }
        t
    }

    /// The file name of this model.
    pub fn name(&self) -> String {
        format!(
            "tiny-{}-{}l-w{}{}{}{}.gguf",
            self.arch.name(),
            self.layers,
            self.window.unwrap_or(0),
            if self.fused_qkv { "-fused" } else { "" },
            if self.embd != E {
                format!("-e{}", self.embd)
            } else {
                String::new()
            },
            if self.vocab.is_some() { "-vocab" } else { "" }
        )
    }

    /// Writes this model with `tensors` into `dir`.
    pub fn write_to(&self, dir: &Path, tensors: &[T]) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        // tests running in parallel write the same model: write aside, then rename in place
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = dir.join(self.name());
        let tmp = dir.join(format!("{}.{n}.part", self.name()));
        std::fs::write(&tmp, gguf(&self.metadata(), tensors)).unwrap();
        std::fs::rename(&tmp, &p).unwrap();
        p
    }

    /// Writes this model with `tensors` into a temporary directory.
    pub fn file(&self, tensors: &[T]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("nextok-families-{}", std::process::id()));
        self.write_to(&dir, tensors)
    }

    pub fn load(&self) -> Arc<ModelWeights> {
        let p = self.file(&self.tensors(SEED));
        Arc::new(ModelWeights::load(&p, Requant::Keep).expect("tiny model loads"))
    }
}

/// A SentencePiece vocabulary of [`V`] tokens (`<unk>`, `<s>`, `</s>`, the 256 byte tokens,
/// then `▁t0`, `▁t1`, ...): what llama.cpp needs to load the file; the forward pass ignores it.
fn vocab() -> Vec<(String, G)> {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2i32, 3, 3];
    for b in 0..256 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    let mut i = 0;
    while tokens.len() < V as usize {
        tokens.push(format!("\u{2581}t{i}"));
        types.push(1);
        i += 1;
    }
    let scores: Vec<f32> = (0..tokens.len())
        .map(|i| if types[i] == 1 { -(i as f32) } else { 0.0 })
        .collect();
    vec![
        ("tokenizer.ggml.model".into(), G::String("llama".into())),
        (
            "tokenizer.ggml.tokens".into(),
            G::Array(Array::String(tokens)),
        ),
        ("tokenizer.ggml.scores".into(), G::Array(Array::F32(scores))),
        (
            "tokenizer.ggml.token_type".into(),
            G::Array(Array::I32(types)),
        ),
        ("tokenizer.ggml.unknown_token_id".into(), G::U32(0)),
        ("tokenizer.ggml.bos_token_id".into(), G::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), G::U32(2)),
    ]
}

impl Tiny {
    /// The default tiny model of every family (the ones the llama.cpp references cover).
    pub fn all() -> Vec<Tiny> {
        Arch::ALL.into_iter().map(Tiny::of).collect()
    }

    /// The tiny model of every family with its real tokenizer ([`Tiny::with_real_vocab`]);
    /// `None` when the test data lacks one of the files (outside CI).
    pub fn all_with_real_vocab() -> Option<Vec<Tiny>> {
        Arch::ALL.into_iter().map(Tiny::with_real_vocab).collect()
    }
}
