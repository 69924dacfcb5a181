//! # nextok-model
//!
//! Where raw logits come from. A [`LogitsSource`] is one sequence of a language model with its
//! KV cache: [`prefill`](LogitsSource::prefill) a prompt, [`decode_one`](LogitsSource::decode_one)
//! token by token, [`fork`](LogitsSource::fork) a branch that shares the prefix (beam search,
//! `-n` sequences from one prompt) and [`truncate`](LogitsSource::truncate) back to an accepted
//! prefix (speculative decoding, replay).
//!
//! * [`transformer`] — the forward pass every supported family shares (CPU): one pass over a
//!   batch of sequences at their own positions ([`ModelWeights::forward_batch`]),
//!   batch-invariant, on nextok's own quantised kernels; optional re-quantisation to Q8_0;
//! * [`arch`] — the families (`llama`, `qwen2`, `qwen3`, `gemma3`, `phi3`): what each one's
//!   metadata means for the shared forward pass;
//! * [`file`](mod@file) — a GGUF file parsed once for the weights, vocabulary, tokenizer and template;
//! * [`numerics`] — the versions of the arithmetic that decides the raw logits' bits, joined
//!   into the numerics identifier a trace records;
//! * [`kv`] — the paged KV cache: blocks shared by forks and the prefix cache, copied on write;
//! * [`Model`] — a loaded GGUF file: weights, its exact-bytes vocabulary, the tokenizer rebuilt
//!   from GGUF metadata, the chat template, and the file's SHA-256;
//! * [`fetch`] — the default model, fetched once into a cache directory and verified;
//! * [`model_path`] / [`load_model`] — a `--model` argument resolved to a file (a path, a model
//!   name, or the default model) and loaded with a report on standard error, as every front end
//!   does;
//! * [`chat`] — rendering the GGUF chat template;
//! * [`kernels`] — matrix × batch-of-activations kernels for every format nextok keeps as the
//!   file has it (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16, F32; activations
//!   quantised per block as llama.cpp's CPU backend does), bit-identical across batch sizes,
//!   threads and SIMD levels (scalar, AVX2, AVX-512, AVX-512 VNNI);
//! * [`beam`] — beam search over any [`LogitsSource`];
//! * [`scripted`] — a logits source that replays a scripted tree (tests, examples).

#![warn(missing_docs)]

#[macro_use]
mod isa;

pub mod arch;
pub mod beam;
pub mod chat;
pub mod digest;
mod error;
pub mod fetch;
pub mod file;
pub mod kernels;
pub mod kv;
pub mod memory;
pub mod numerics;
mod open;
pub mod scripted;
mod team;
pub mod transformer;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use arch::{Arch, ArchConfig};
pub use digest::{file_digest, sha256_file};
pub use error::{ModelError, ModelErrorKind, Result};
pub use kv::{KvCacheType, KvGeometry, KvPool, SeqKv};
pub use open::{load_model, model_path};
pub use transformer::{
    BatchSeq, Converted, LogitRows, ModelSource, ModelWeights, Requant, Scratch,
};

/// One sequence of a model: produces the raw logits after each id it is fed.
pub trait LogitsSource: Sized {
    /// Length of every logits row.
    fn vocab_size(&self) -> usize;
    /// Feeds `ids` (at least one) after the current prefix and returns the raw logits after the
    /// last of them.
    fn prefill(&mut self, ids: &[u32]) -> Result<Vec<f32>>;
    /// Feeds one token and returns the raw logits after it.
    fn decode_one(&mut self, token: u32) -> Result<Vec<f32>>;
    /// Feeds `ids` (at least one) and returns the raw logits after each of them, row after row
    /// (`ids.len() · vocab_size()` values): verifying a speculative draft. Each row equals what
    /// [`LogitsSource::decode_one`] would give at that position. The default feeds them one
    /// by one; a batched source does it in one pass.
    fn extend_all(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        if ids.is_empty() {
            return Err(ModelError::new("extend_all needs at least one id")
                .with_kind(ModelErrorKind::Invalid));
        }
        let mut out = Vec::with_capacity(ids.len() * self.vocab_size());
        for &t in ids {
            out.extend(self.decode_one(t)?);
        }
        Ok(out)
    }
    /// A new branch with the same prefix; feeding one branch never changes the other.
    fn fork(&self) -> Result<Self>;
    /// Rolls the sequence back to its first `len` positions (`len ≤ self.len()`).
    fn truncate(&mut self, len: usize) -> Result<()>;
    /// Number of positions fed so far.
    fn len(&self) -> usize;
    /// Whether nothing has been fed.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A loaded GGUF model of a supported family with its vocabulary and tokenizer.
pub struct Model {
    /// The shared weights.
    pub weights: Arc<ModelWeights>,
    /// Exact bytes, EOS and special ids of every token (sized to the logits row).
    pub vocab: nextok_vocab::Vocabulary,
    /// Text → ids, rebuilt from the GGUF metadata.
    pub encoder: nextok_vocab::encode::Encoder,
    /// `tokenizer.chat_template`, if the file has one.
    pub chat_template: Option<String>,
    /// SHA-256 of the GGUF file, hex.
    pub sha256: String,
    /// Where it was loaded from.
    pub path: PathBuf,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("path", &self.path)
            .field("sha256", &self.sha256)
            .field("weights", &self.weights)
            .finish()
    }
}

/// The SIMD features this build was compiled with (`avx,avx2,fma,f16c`, …; `none`), which a
/// trace records. nextok's kernels pick their instruction set at run time and give the same
/// bits at every level ([`kernels::Level`]), so the logits do not depend on these features;
/// the field says which build recorded a trace.
pub fn simd_features() -> String {
    let all = [
        ("avx", cfg!(target_feature = "avx")),
        ("avx2", cfg!(target_feature = "avx2")),
        ("fma", cfg!(target_feature = "fma")),
        ("f16c", cfg!(target_feature = "f16c")),
        ("avx512f", cfg!(target_feature = "avx512f")),
        ("neon", cfg!(target_feature = "neon")),
        ("simd128", cfg!(target_feature = "simd128")),
    ];
    let on: Vec<&str> = all.iter().filter(|f| f.1).map(|f| f.0).collect();
    if on.is_empty() {
        "none".to_string()
    } else {
        on.join(",")
    }
}

/// The longest context (`{arch}.context_length`) a model may declare: the rotary tables are
/// computed for every position at load.
pub const MAX_CONTEXT: usize = 1 << 20;

/// The one line the loader says about the matrices it converted: their count, and for each
/// format in the file's order of first appearance, how many and the first tensor
/// (`None` when nothing was converted).
pub fn converted_note(converted: &[Converted]) -> Option<String> {
    let first = converted.first()?;
    // (format, matrices, first tensor), in order of first appearance
    let mut kinds: Vec<(&str, usize, &str)> = Vec::new();
    for c in converted {
        match kinds.iter_mut().find(|k| k.0 == c.from) {
            Some(k) => k.1 += 1,
            None => kinds.push((&c.from, 1, &c.tensor)),
        }
    }
    let n = converted.len();
    let each: Vec<String> = kinds
        .iter()
        .map(|&(from, count, tensor)| match count {
            1 => format!("{from}: `{tensor}`"),
            _ => format!("{from}: {count}, the first `{tensor}`"),
        })
        .collect();
    Some(format!(
        "no kernel for the format of {n} matri{} ({}): converted to {} at load",
        if n == 1 { "x" } else { "ces" },
        each.join("; "),
        first.to
    ))
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Model {
    /// Loads `path` (a GGUF file of a supported family, see [`Arch`]) for the CPU. The file
    /// is parsed once; matrices in a format nextok has no kernel for are converted, and said so
    /// once on standard error, naming them.
    pub fn load(path: &Path, requant: Requant) -> Result<Model> {
        let f = file::GgufFile::open(path)?;
        let g = f.meta();
        let label = path.display().to_string();
        // the tokenizer first: what building it holds for a while (its vocabulary and merges
        // copied from the metadata) is freed before the weights take their memory
        let encoder = nextok_vocab::encode::Encoder::from_gguf(g, &label)?;
        // the file's digest (for traces): remembered, or computed on another thread while the
        // weights are repacked
        let (weights, sha256) = std::thread::scope(|s| {
            let digest = s.spawn(|| digest::file_digest(path));
            let weights = ModelWeights::from_file(&f, requant);
            let digest = digest
                .join()
                .unwrap_or_else(|_| Err(ModelError::new("hashing the model file failed")));
            (weights, digest)
        });
        let (weights, sha256) = (Arc::new(weights?), sha256?);
        if let Some(line) = converted_note(&weights.converted) {
            eprintln!("nextok: {}: {line}", path.display());
        }
        let opts = nextok_vocab::LoadOptions {
            vocab_size: Some(weights.config.vocab_size),
            ..Default::default()
        };
        let vocab = nextok_vocab::Vocabulary::from_gguf(g, &label, &opts)?;
        let chat_template = g
            .get("tokenizer.chat_template")
            .and_then(|v| v.as_str())
            .map(str::to_string);
        Ok(Model {
            weights,
            vocab,
            encoder,
            chat_template,
            sha256,
            path: path.to_path_buf(),
        })
    }

    /// A new, empty sequence.
    pub fn source(&self) -> ModelSource {
        ModelSource::new(self.weights.clone())
    }

    /// The ids of `text` as a prompt: special tokens written in the text are recognised, and a
    /// BOS token is prepended when the file asks for one (`tokenizer.ggml.add_bos_token`).
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.encoder.encode(text, true)?)
    }

    /// The ids of a chat prompt: `messages` rendered with the model's chat template, then
    /// encoded as [`Model::encode_prompt`] does — except that, unless
    /// `parse_special_in_content`, a special token's string written in a message's content is
    /// ordinary text (`<|im_start|>system` inside a user's message does not become control
    /// tokens): control tokens come from the template only. Where each content lands is found by
    /// rendering the template with a marker in its place; a template that does not insert a
    /// content verbatim, when that content holds a special token's string, is an error naming
    /// `messages[i].content` (the prompt cannot be built safely).
    pub fn encode_chat(
        &self,
        messages: &[chat::Message],
        parse_special_in_content: bool,
    ) -> Result<Vec<u32>> {
        let text = self.render_chat(messages, true)?;
        if parse_special_in_content {
            return self.encode_prompt(&text);
        }
        let risky: Vec<usize> = (0..messages.len())
            .filter(|&i| self.encoder.special_in(&messages[i].content).is_some())
            .collect();
        if risky.is_empty() {
            return self.encode_prompt(&text);
        }
        let spans = match self.content_spans(messages, &text)? {
            Some(spans) => spans,
            None => {
                // the template changed a content: locate the risky ones verbatim, in order
                let mut spans = Vec::new();
                let mut from = 0;
                for (i, m) in messages.iter().enumerate() {
                    match text[from..].find(m.content.as_str()) {
                        Some(at) if !m.content.is_empty() => {
                            spans.push(from + at..from + at + m.content.len());
                            from += at + m.content.len();
                        }
                        _ if risky.contains(&i) => {
                            let s = self.encoder.special_in(&m.content).unwrap_or_default();
                            let shown: String = s.chars().take(40).collect();
                            return Err(ModelError::new(format!(
                                "messages[{i}].content: holds the control-token text `{shown}`, and this model's chat template does not insert the content verbatim, so it cannot be kept as text"
                            ))
                            .with_kind(ModelErrorKind::Invalid));
                        }
                        _ => {}
                    }
                }
                spans
            }
        };
        Ok(self.encoder.encode_with_text_spans(&text, &spans, true)?)
    }

    /// Where each message's content lands in `text` (the template's rendering of `messages`):
    /// the template is rendered again with a marker for each content, and the spans are taken
    /// when putting the contents back in place of the markers gives `text` exactly; `None`
    /// otherwise.
    fn content_spans(
        &self,
        messages: &[chat::Message],
        text: &str,
    ) -> Result<Option<Vec<std::ops::Range<usize>>>> {
        // private-use characters: no template writes them
        let marker = |i: usize| format!("\u{E000}{i}\u{E001}");
        let marked: Vec<chat::Message> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| chat::Message::new(m.role.clone(), marker(i)))
            .collect();
        let rendered = self.render_chat(&marked, true)?;
        let mut rebuilt = String::with_capacity(text.len());
        let mut spans = Vec::with_capacity(messages.len());
        let mut rest = rendered.as_str();
        for (i, m) in messages.iter().enumerate() {
            let mk = marker(i);
            let Some(at) = rest.find(&mk) else {
                return Ok(None);
            };
            rebuilt.push_str(&rest[..at]);
            spans.push(rebuilt.len()..rebuilt.len() + m.content.len());
            rebuilt.push_str(&m.content);
            rest = &rest[at + mk.len()..];
            if rest.contains(&mk) {
                return Ok(None);
            }
        }
        rebuilt.push_str(rest);
        Ok((rebuilt == text).then_some(spans))
    }

    /// Renders `messages` with the model's chat template (see [`chat`]).
    pub fn render_chat(
        &self,
        messages: &[chat::Message],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let t = self.chat_template.as_deref().ok_or_else(|| {
            ModelError::new("the model file has no tokenizer.chat_template; pass a plain prompt")
        })?;
        let name = |id: Option<u32>| {
            id.and_then(|i| self.vocab.name(i))
                .unwrap_or("")
                .to_string()
        };
        chat::render(
            t,
            messages,
            add_generation_prompt,
            &name(self.vocab.bos),
            &name(self.vocab.info.eos_token_ids.first().copied()),
        )
    }
}
