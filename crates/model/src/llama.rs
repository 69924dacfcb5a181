//! The llama forward pass: many sequences in one batch, on nextok's own kernels.
//!
//! The weights ([`LlamaWeights`]) are read from a GGUF file once and shared (behind an `Arc`)
//! by every sequence. [`LlamaWeights::forward_batch`] runs one forward pass over a batch of
//! sequences, each contributing any number of new tokens at its own position — a decode step
//! (one token), a chunk of a prompt, or a speculative draft — against its own paged KV cache
//! ([`SeqKv`]). All the rows of the batch go through each weight matrix together
//! ([`kernels::matmul`] reads every weight block once for all rows).
//!
//! **Batch invariance.** Every value a row produces is computed by the same sequence of
//! floating-point operations whatever else is in the batch, how the prompt was split into
//! chunks, and how many threads run it: the matrix kernels fix each output's reduction order,
//! attention runs per query row over that row's own keys in position order, and the norms,
//! rotary embeddings and activations are per row. A sequence's logits are therefore
//! bit-identical alone or in any batch, and a prefix computed once can be reused by another
//! sequence (the prefix cache) with the very values it would have computed itself.
//!
//! The architecture is llama as GGUF stores it: RMSNorm, rotary embeddings on adjacent pairs
//! (GGUF's Q/K weights are permuted for that layout), grouped-query attention, a SwiGLU
//! feed-forward, and an output matrix that is `output.weight` or, when absent, the token
//! embedding (tied). As in llama.cpp, matrices stay quantised and multiply activations quantised
//! to 8 bits per 32-value block, and queries, keys, values and attention weights are rounded to
//! half precision (the KV cache is `f16`). Q4_1 matrices can be re-quantised to Q8_0 at load
//! ([`Requant::Q8_0`]).

use std::cell::RefCell;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::Device;
use half::f16;
use rayon::prelude::*;

use crate::error::{ModelError, ModelErrorKind, Result};
use crate::kernels::attn::{self, dot};
use crate::kernels::{self, Activations, QMatrix};
use crate::kv::{KvGeometry, KvPool, SeqKv, BLOCK_POSITIONS};
use crate::LogitsSource;

/// What to do with the quantised matrices at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Requant {
    /// Keep every matrix in the file's format.
    #[default]
    Keep,
    /// Re-quantise Q4_0 / Q4_1 / Q5_0 / Q5_1 matrices to Q8_0 (faster kernels on x86; more memory).
    Q8_0,
}

impl Requant {
    /// `keep` or `q8_0`.
    pub fn name(self) -> &'static str {
        match self {
            Requant::Keep => "keep",
            Requant::Q8_0 => "q8_0",
        }
    }
}

/// Hyper-parameters read from `llama.*` metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Embedding width.
    pub n_embd: usize,
    /// Attention heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention).
    pub n_kv_head: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Feed-forward width.
    pub n_ff: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f64,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// Training context length (a sequence may not grow past it).
    pub context_length: usize,
    /// Rows of the output matrix (the logits row length).
    pub vocab_size: usize,
}

struct Layer {
    attn_norm: Vec<f32>,
    wq: QMatrix,
    wk: QMatrix,
    wv: QMatrix,
    wo: QMatrix,
    ffn_norm: Vec<f32>,
    w_gate: QMatrix,
    w_up: QMatrix,
    w_down: QMatrix,
}

/// The weights of a llama-architecture GGUF model, loaded for the CPU.
pub struct LlamaWeights {
    /// Hyper-parameters.
    pub config: LlamaConfig,
    embed: QMatrix,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    /// `None`: tied to the embedding.
    output: Option<QMatrix>,
    /// `cos` and `sin` of every (position, pair), `[context_length][head_dim / 2]`.
    rope_cos: Vec<f32>,
    rope_sin: Vec<f32>,
    pool: KvPool,
    /// The quantisation of the output matrix after load (for reports).
    pub output_dtype: String,
    /// The re-quantisation applied at load.
    pub requant: Requant,
}

impl std::fmt::Debug for LlamaWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaWeights")
            .field("config", &self.config)
            .field("output_dtype", &self.output_dtype)
            .field("requant", &self.requant)
            .finish()
    }
}

fn md_usize(c: &gguf_file::Content, key: &str) -> Result<usize> {
    let v = c.metadata.get(key).ok_or_else(|| {
        ModelError::new(format!("GGUF metadata has no `{key}`")).with_kind(ModelErrorKind::Format)
    })?;
    v.to_u32()
        .map(|x| x as usize)
        .or_else(|_| v.to_u64().map(|x| x as usize))
        .map_err(|e| {
            ModelError::new(format!("GGUF metadata `{key}`: {e}"))
                .with_kind(ModelErrorKind::Format)
                .with_source(e)
        })
}

fn md_f32(c: &gguf_file::Content, key: &str) -> Option<f32> {
    c.metadata.get(key).and_then(|v| v.to_f32().ok())
}

/// Which rows of a sequence's new tokens need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitRows {
    /// None (a prompt chunk that is not the prompt's last).
    None,
    /// After the last new token (a decode step, the last prompt chunk).
    Last,
    /// After every new token (verifying a speculative draft).
    All,
}

/// One sequence's part of a batch: its cache and the tokens fed after it.
#[derive(Debug)]
pub struct BatchSeq<'a> {
    /// The sequence's cache; its length is the position of the first new token, and grows by
    /// `tokens.len()`.
    pub kv: &'a mut SeqKv,
    /// The new tokens (at least one).
    pub tokens: &'a [u32],
    /// Which of them need logits.
    pub logits: LogitRows,
}

/// Buffers a forward pass reuses from call to call (one per caller; nothing in it carries
/// over between calls).
#[derive(Default)]
pub struct Scratch {
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    tmp: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    acts: Activations,
    /// Per row: (sequence index, absolute position).
    rows: Vec<(usize, usize)>,
    /// Rows whose logits are returned, in order.
    logit_rows: Vec<usize>,
    /// The kernels' implementation (`None`: the best this CPU has; all give the same bits).
    level: Option<kernels::Level>,
}

impl Scratch {
    /// Buffers whose forward passes run the kernels at `level` (tests: every level gives the
    /// same bits).
    pub fn with_level(level: kernels::Level) -> Scratch {
        Scratch {
            level: Some(level),
            ..Scratch::default()
        }
    }
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scratch")
            .field("rows", &self.rows.len())
            .finish()
    }
}

fn resize(v: &mut Vec<f32>, n: usize) {
    v.clear();
    v.resize(n, 0.0);
}

impl LlamaWeights {
    /// Loads a llama-architecture GGUF file (`general.architecture = llama`).
    pub fn load(path: &Path, requant: Requant) -> Result<LlamaWeights> {
        let device = Device::Cpu;
        // every size in the file is checked against its length before anything is allocated
        crate::check_gguf(path)?;
        let file = File::open(path).map_err(|e| {
            ModelError::new(format!("{}: cannot open: {e}", path.display()))
                .with_kind(ModelErrorKind::Io)
                .with_source(e)
        })?;
        let mut r = BufReader::new(file);
        let c = gguf_file::Content::read(&mut r).map_err(|e| {
            ModelError::new(format!("{}: not a GGUF file: {e}", path.display()))
                .with_kind(ModelErrorKind::Format)
                .with_source(e)
        })?;
        let arch = c
            .metadata
            .get("general.architecture")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .unwrap_or_default();
        if arch != "llama" {
            return Err(ModelError::new(format!(
                "{}: architecture `{arch}` is not supported (only `llama`)",
                path.display()
            )));
        }
        let n_head = md_usize(&c, "llama.attention.head_count")?;
        let n_kv_head = md_usize(&c, "llama.attention.head_count_kv").unwrap_or(n_head);
        let n_layer = md_usize(&c, "llama.block_count")?;
        let n_embd = md_usize(&c, "llama.embedding_length")?;
        if n_head == 0 || n_kv_head == 0 {
            return Err(ModelError::new(format!(
                "unsupported head layout: {n_head} heads, {n_kv_head} kv heads"
            )));
        }
        let head_dim = md_usize(&c, "llama.rope.dimension_count").unwrap_or(n_embd / n_head);
        let rms_eps = md_f32(&c, "llama.attention.layer_norm_rms_epsilon").unwrap_or(1e-5) as f64;
        let rope_theta = md_f32(&c, "llama.rope.freq_base").unwrap_or(10_000.0);
        let context_length = md_usize(&c, "llama.context_length").unwrap_or(2048);
        if n_head % n_kv_head != 0
            || head_dim.checked_mul(n_head) != Some(n_embd)
            || !head_dim.is_multiple_of(2)
        {
            return Err(ModelError::new(format!(
                "unsupported head layout: {n_head} heads, {n_kv_head} kv heads, head width {head_dim}, embedding {n_embd}"
            )));
        }
        if context_length == 0 || context_length > crate::MAX_CONTEXT {
            return Err(ModelError::new(format!(
                "invalid GGUF metadata: context length {context_length} (nextok runs 1 to {} positions)",
                crate::MAX_CONTEXT
            )));
        }
        if !rms_eps.is_finite() || rms_eps < 0.0 || !rope_theta.is_finite() || rope_theta <= 0.0 {
            return Err(ModelError::new(format!(
                "invalid GGUF metadata: rms epsilon {rms_eps}, rope base {rope_theta}"
            )));
        }

        let mut get = |name: &str| -> Result<QTensor> {
            c.tensor(&mut r, name, &device).map_err(|e| {
                ModelError::new(format!("tensor `{name}`: {e}"))
                    .with_kind(ModelErrorKind::Format)
                    .with_source(e)
            })
        };
        let matrix = |name: &str, t: QTensor| -> Result<QMatrix> {
            let slow = matches!(
                t.dtype(),
                GgmlDType::Q4_0 | GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1
            );
            let m = if requant == Requant::Q8_0 && slow {
                let dims = t.shape().dims2()?;
                let f = t
                    .dequantize(&Device::Cpu)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                QMatrix::quantize_q8_0(dims.0, dims.1, &f)
            } else {
                QMatrix::from_qtensor(&t)
            };
            m.map_err(|e| {
                ModelError::new(format!("tensor `{name}`: {e}"))
                    .with_kind(ModelErrorKind::Format)
                    .with_source(e)
            })
        };
        let vector = |name: &str, t: QTensor, len: usize| -> Result<Vec<f32>> {
            let v = t
                .dequantize(&Device::Cpu)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            if v.len() != len {
                return Err(ModelError::new(format!(
                    "tensor `{name}`: {} values, expected {len}",
                    v.len()
                )));
            }
            if v.iter().any(|x| !x.is_finite()) {
                return Err(ModelError::new(format!(
                    "tensor `{name}` holds non-finite values"
                )));
            }
            Ok(v)
        };

        let embd_q = get("token_embd.weight")?;
        let embed = matrix("token_embd.weight", embd_q)?;
        let vocab_size = embed.rows();
        if embed.cols() != n_embd {
            return Err(ModelError::new(format!(
                "tensor `token_embd.weight`: width {}, embedding length {n_embd}",
                embed.cols()
            )));
        }
        let norm = vector("output_norm.weight", get("output_norm.weight")?, n_embd)?;
        let output = match get("output.weight") {
            Ok(t) => Some(matrix("output.weight", t)?),
            Err(_) => None, // tied to the embedding
        };
        let output_dtype = format!("{:?}", output.as_ref().unwrap_or(&embed).format());
        let mut layers = Vec::with_capacity(n_layer.min(1024));
        let mut n_ff = 0;
        for i in 0..n_layer {
            let p = format!("blk.{i}");
            let t = |s: &str| format!("{p}.{s}.weight");
            let layer = Layer {
                attn_norm: vector(&t("attn_norm"), get(&t("attn_norm"))?, n_embd)?,
                wq: matrix(&t("attn_q"), get(&t("attn_q"))?)?,
                wk: matrix(&t("attn_k"), get(&t("attn_k"))?)?,
                wv: matrix(&t("attn_v"), get(&t("attn_v"))?)?,
                wo: matrix(&t("attn_output"), get(&t("attn_output"))?)?,
                ffn_norm: vector(&t("ffn_norm"), get(&t("ffn_norm"))?, n_embd)?,
                w_gate: matrix(&t("ffn_gate"), get(&t("ffn_gate"))?)?,
                w_up: matrix(&t("ffn_up"), get(&t("ffn_up"))?)?,
                w_down: matrix(&t("ffn_down"), get(&t("ffn_down"))?)?,
            };
            n_ff = layer.w_gate.rows();
            let kvd = n_kv_head * head_dim;
            let shapes = [
                (&layer.wq, n_embd, n_embd, "attn_q"),
                (&layer.wk, kvd, n_embd, "attn_k"),
                (&layer.wv, kvd, n_embd, "attn_v"),
                (&layer.wo, n_embd, n_embd, "attn_output"),
                (&layer.w_gate, n_ff, n_embd, "ffn_gate"),
                (&layer.w_up, n_ff, n_embd, "ffn_up"),
                (&layer.w_down, n_embd, n_ff, "ffn_down"),
            ];
            for (m, rows, cols, name) in shapes {
                if m.rows() != rows || m.cols() != cols {
                    return Err(ModelError::new(format!(
                        "tensor `{p}.{name}.weight`: {}x{}, expected {rows}x{cols}",
                        m.rows(),
                        m.cols()
                    )));
                }
            }
            layers.push(layer);
        }
        if let Some(o) = &output {
            if o.cols() != n_embd {
                return Err(ModelError::new(format!(
                    "tensor `output.weight`: width {}, embedding length {n_embd}",
                    o.cols()
                )));
            }
        }
        let vocab_size = output.as_ref().map_or(vocab_size, |o| o.rows());
        // RoPE tables for every position of the context.
        let half = head_dim / 2;
        let inv: Vec<f32> = (0..half)
            .map(|i| 1.0 / rope_theta.powf(2.0 * i as f32 / head_dim as f32))
            .collect();
        let mut rope_cos = Vec::with_capacity(context_length * half);
        let mut rope_sin = Vec::with_capacity(context_length * half);
        for p in 0..context_length {
            for &f in &inv {
                let a = p as f32 * f;
                rope_cos.push(a.cos());
                rope_sin.push(a.sin());
            }
        }
        let pool = KvPool::new(
            KvGeometry {
                n_layer,
                n_kv_head,
                head_dim,
            },
            None,
        );
        Ok(LlamaWeights {
            config: LlamaConfig {
                n_layer,
                n_embd,
                n_head,
                n_kv_head,
                head_dim,
                n_ff,
                rms_eps,
                rope_theta,
                context_length,
                vocab_size,
            },
            embed,
            layers,
            norm,
            output,
            rope_cos,
            rope_sin,
            pool,
            output_dtype,
            requant,
        })
    }

    /// The shape of this model's KV cache.
    pub fn kv_geometry(&self) -> KvGeometry {
        self.pool.geometry()
    }

    /// The unlimited pool that [`LlamaSource::new`] takes its caches from.
    pub fn default_pool(&self) -> &KvPool {
        &self.pool
    }

    /// Runs one forward pass over `seqs`: each sequence's `tokens` at positions
    /// `kv.len()..kv.len() + tokens.len()`, appended to its cache. `logits` receives, sequence
    /// after sequence, the logits rows each asked for (`vocab_size` values each).
    ///
    /// Every input is checked before anything is computed (at least one token per sequence,
    /// ids inside the vocabulary, the context length); on an error no sequence's length
    /// changes.
    pub fn forward_batch(
        &self,
        seqs: &mut [BatchSeq<'_>],
        s: &mut Scratch,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let cfg = &self.config;
        let vocab = self.embed.rows() as u32;
        for (i, q) in seqs.iter().enumerate() {
            if q.tokens.is_empty() {
                return Err(ModelError::new(format!(
                    "sequence {i} of the batch has no tokens"
                )));
            }
            if let Some(&t) = q.tokens.iter().find(|&&t| t >= vocab) {
                return Err(ModelError::new(format!(
                    "token id {t} is outside the vocabulary ({vocab} tokens)"
                )));
            }
            let end = q.kv.len() + q.tokens.len();
            if end > cfg.context_length {
                return Err(ModelError::new(format!(
                    "context full: {end} positions of {}",
                    cfg.context_length
                )));
            }
        }
        for i in 0..seqs.len() {
            let n = seqs[i].tokens.len();
            if let Err(e) = seqs[i].kv.prepare_write(n) {
                for q in seqs[..=i].iter_mut() {
                    let len = q.kv.len();
                    let _ = q.kv.truncate(len); // drop the blocks allocated for this pass
                }
                return Err(e);
            }
        }
        rayon::scope(|_| self.forward_inner(seqs, s, logits))
    }

    fn forward_inner(
        &self,
        seqs: &mut [BatchSeq<'_>],
        s: &mut Scratch,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let cfg = &self.config;
        let (d, hd, nh, nkv) = (cfg.n_embd, cfg.head_dim, cfg.n_head, cfg.n_kv_head);
        let kvd = nkv * hd;
        s.rows.clear();
        s.logit_rows.clear();
        for (si, q) in seqs.iter().enumerate() {
            let start = s.rows.len();
            let pos = q.kv.len();
            s.rows.extend((0..q.tokens.len()).map(|i| (si, pos + i)));
            match q.logits {
                LogitRows::None => {}
                LogitRows::Last => s.logit_rows.push(s.rows.len() - 1),
                LogitRows::All => s.logit_rows.extend(start..s.rows.len()),
            }
        }
        let n = s.rows.len();
        resize(&mut s.x, n * d);
        let mut r = 0;
        for q in seqs.iter() {
            for &t in q.tokens {
                self.embed
                    .dequantize_row(t as usize, &mut s.x[r * d..(r + 1) * d])?;
                r += 1;
            }
        }
        resize(&mut s.h, n * d);
        resize(&mut s.q, n * d);
        resize(&mut s.k, n * kvd);
        resize(&mut s.v, n * kvd);
        resize(&mut s.att, n * d);
        resize(&mut s.tmp, n * d);
        resize(&mut s.gate, n * cfg.n_ff);
        resize(&mut s.up, n * cfg.n_ff);
        let level = s.level.unwrap_or_else(kernels::Level::detect);
        let eps = cfg.rms_eps as f32;
        let scale = 1.0 / (hd as f32).sqrt();
        for (li, layer) in self.layers.iter().enumerate() {
            rms_norm_rows(&s.x, &layer.attn_norm, eps, &mut s.h, d);
            s.acts.quantize_with(level, &s.h, n, d)?;
            kernels::matmul_with(level, &layer.wq, &s.acts, &mut s.q)?;
            kernels::matmul_with(level, &layer.wk, &s.acts, &mut s.k)?;
            kernels::matmul_with(level, &layer.wv, &s.acts, &mut s.v)?;
            for (row, &(_, pos)) in s.rows.iter().enumerate() {
                let (c, sn) = self.rope_at(pos);
                for head in s.q[row * d..(row + 1) * d].chunks_exact_mut(hd) {
                    rope(head, c, sn);
                    f16_round(head);
                }
                for head in s.k[row * kvd..(row + 1) * kvd].chunks_exact_mut(hd) {
                    rope(head, c, sn);
                    f16_round(head);
                }
                f16_round(&mut s.v[row * kvd..(row + 1) * kvd]);
            }
            for (row, &(si, pos)) in s.rows.iter().enumerate() {
                seqs[si].kv.write(
                    li,
                    pos,
                    &s.k[row * kvd..(row + 1) * kvd],
                    &s.v[row * kvd..(row + 1) * kvd],
                )?;
            }
            {
                let seqs: &[BatchSeq<'_>] = seqs;
                let rows = &s.rows;
                let qs = &s.q;
                let rep = nh / nkv;
                // A task per (row, key/value head), its query heads together: each key and
                // value block is converted once for all of them.
                s.att
                    .par_chunks_mut(rep * hd)
                    .enumerate()
                    .for_each(|(task, out)| {
                        let (row, g) = (task / nkv, task % nkv);
                        let (si, pos) = rows[row];
                        let q = &qs[row * d + g * rep * hd..row * d + (g + 1) * rep * hd];
                        attend(level, seqs[si].kv, li, g, pos, q, hd, scale, out);
                    });
            }
            s.acts.quantize_with(level, &s.att, n, d)?;
            kernels::matmul_with(level, &layer.wo, &s.acts, &mut s.tmp)?;
            add_in_place(&mut s.x, &s.tmp);
            rms_norm_rows(&s.x, &layer.ffn_norm, eps, &mut s.h, d);
            s.acts.quantize_with(level, &s.h, n, d)?;
            kernels::matmul_with(level, &layer.w_gate, &s.acts, &mut s.gate)?;
            kernels::matmul_with(level, &layer.w_up, &s.acts, &mut s.up)?;
            for (g, u) in s.gate.iter_mut().zip(&s.up) {
                *g = silu(*g) * *u;
            }
            s.acts.quantize_with(level, &s.gate, n, cfg.n_ff)?;
            kernels::matmul_with(level, &layer.w_down, &s.acts, &mut s.tmp)?;
            add_in_place(&mut s.x, &s.tmp);
        }
        for q in seqs.iter_mut() {
            let len = q.kv.len() + q.tokens.len();
            q.kv.set_len(len);
        }
        let nl = s.logit_rows.len();
        if nl == 0 {
            logits.clear();
            return Ok(());
        }
        // the final norm and the output matrix, only for the rows that need logits
        resize(&mut s.tmp, nl * d);
        for (i, &row) in s.logit_rows.iter().enumerate() {
            rms_norm_rows(
                &s.x[row * d..(row + 1) * d],
                &self.norm,
                eps,
                &mut s.tmp[i * d..(i + 1) * d],
                d,
            );
        }
        s.acts.quantize_with(level, &s.tmp, nl, d)?;
        let out = self.output.as_ref().unwrap_or(&self.embed);
        logits.clear();
        logits.resize(nl * out.rows(), 0.0);
        kernels::matmul_with(level, out, &s.acts, logits)?;
        Ok(())
    }

    fn rope_at(&self, pos: usize) -> (&[f32], &[f32]) {
        let half = self.config.head_dim / 2;
        (
            &self.rope_cos[pos * half..(pos + 1) * half],
            &self.rope_sin[pos * half..(pos + 1) * half],
        )
    }
}

thread_local! {
    /// Per thread: attention scores, their weights, one block of keys or values in `f32`, and
    /// an `f16` buffer for rounding.
    static ATTN_SCRATCH: RefCell<AttnScratch> = RefCell::new(AttnScratch::default());
}

#[derive(Default)]
struct AttnScratch {
    scores: Vec<f32>,
    weights: Vec<f32>,
    block: Vec<f32>,
    half: Vec<f16>,
}

/// Attention of the query heads `q` (`rep` heads of `head_dim`, sharing key/value head `g`)
/// at position `pos` over the sequence's keys `0..=pos` of `layer`; writes the `rep` outputs.
/// Each block of keys and values is converted to `f32` once for all `rep` heads.
#[allow(clippy::too_many_arguments)]
fn attend(
    level: kernels::Level,
    kv: &SeqKv,
    layer: usize,
    g: usize,
    pos: usize,
    q: &[f32],
    hd: usize,
    scale: f32,
    out: &mut [f32],
) {
    ATTN_SCRATCH.with(|cell| {
        let mut cell = cell.borrow_mut();
        let AttnScratch {
            scores,
            weights,
            block,
            half,
        } = &mut *cell;
        let rep = q.len() / hd;
        let len = pos + 1;
        scores.resize(rep * len, 0.0);
        weights.resize(rep * len, 0.0);
        half.resize(len, f16::ZERO);
        block.resize(BLOCK_POSITIONS * hd, 0.0);
        let blocks = len.div_ceil(BLOCK_POSITIONS);
        for b in 0..blocks {
            let here = (len - b * BLOCK_POSITIONS).min(BLOCK_POSITIONS);
            if b + 1 < blocks {
                attn::prefetch(kv.slab(b + 1, layer, 0, g));
            }
            f16_to_f32(
                &kv.slab(b, layer, 0, g)[..here * hd],
                &mut block[..here * hd],
            );
            attn::scores(
                level,
                q,
                &block[..here * hd],
                hd,
                scale,
                scores,
                len,
                b * BLOCK_POSITIONS,
            );
        }
        // softmax with nextok's exp (vectorised, the same bits at every SIMD level), the
        // weights rounded to f16 as llama.cpp multiplies them with the f16 values
        for h in 0..rep {
            let sc = &scores[h * len..(h + 1) * len];
            let w = &mut weights[h * len..(h + 1) * len];
            let m = sc.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            let sum = nextok_core::math::exp_weights(sc, m, w) as f32;
            for x in w.iter_mut() {
                *x /= sum;
            }
            use half::slice::HalfFloatSliceExt;
            half.convert_from_f32_slice(w);
            half.convert_to_f32_slice(w);
        }
        out.fill(0.0);
        for b in 0..blocks {
            let here = (len - b * BLOCK_POSITIONS).min(BLOCK_POSITIONS);
            if b + 1 < blocks {
                attn::prefetch(kv.slab(b + 1, layer, 1, g));
            }
            f16_to_f32(
                &kv.slab(b, layer, 1, g)[..here * hd],
                &mut block[..here * hd],
            );
            attn::accumulate(
                level,
                weights,
                len,
                b * BLOCK_POSITIONS,
                &block[..here * hd],
                hd,
                out,
            );
        }
    })
}

fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    src.convert_to_f32_slice(dst);
}

/// RMSNorm of each `d`-wide row of `x` into `out`, scaled by `w`.
fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32], d: usize) {
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let ss = dot(xr, xr);
        let m = (ss / d as f32 + eps).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = (v / m) * g;
        }
    }
}

/// Rotary embedding of one head on adjacent pairs.
#[inline]
fn rope(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    for ((p, &c), &s) in x.chunks_exact_mut(2).zip(cos).zip(sin) {
        let (a, b) = (p[0], p[1]);
        p[0] = a * c - b * s;
        p[1] = a * s + b * c;
    }
}

/// Rounds to half precision and back (llama.cpp keeps the KV cache in `f16` and multiplies the
/// attention in `f16`).
#[inline]
fn f16_round(x: &mut [f32]) {
    for v in x {
        *v = f16::from_f32(*v).to_f32();
    }
}

#[inline]
fn silu(x: f32) -> f32 {
    x / (1.0 + nextok_core::math::exp_f32(-x))
}

fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += *b;
    }
}

/// One sequence of a llama model: shared weights plus this branch's KV cache.
pub struct LlamaSource {
    weights: Arc<LlamaWeights>,
    kv: SeqKv,
    scratch: Scratch,
    logits: Vec<f32>,
}

impl Clone for LlamaSource {
    fn clone(&self) -> Self {
        LlamaSource {
            weights: self.weights.clone(),
            kv: self.kv.clone(),
            scratch: Scratch::default(),
            logits: Vec::new(),
        }
    }
}

impl std::fmt::Debug for LlamaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaSource")
            .field("len", &self.kv.len())
            .finish()
    }
}

impl LlamaSource {
    /// An empty sequence over `weights` (its cache from the weights' default pool).
    pub fn new(weights: Arc<LlamaWeights>) -> LlamaSource {
        let kv = weights.default_pool().sequence();
        LlamaSource {
            weights,
            kv,
            scratch: Scratch::default(),
            logits: Vec::new(),
        }
    }

    /// The shared weights.
    pub fn weights(&self) -> &Arc<LlamaWeights> {
        &self.weights
    }

    /// This sequence's cache.
    pub fn kv(&self) -> &SeqKv {
        &self.kv
    }

    /// Feeds `ids` and returns the logits after every one of them (`ids.len()` rows).
    pub fn prefill_all(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        self.run(ids, LogitRows::All)
    }

    fn run(&mut self, ids: &[u32], rows: LogitRows) -> Result<Vec<f32>> {
        if ids.is_empty() {
            return Err(
                ModelError::new("prefill needs at least one id").with_kind(ModelErrorKind::Invalid)
            );
        }
        let mut batch = [BatchSeq {
            kv: &mut self.kv,
            tokens: ids,
            logits: rows,
        }];
        self.weights
            .forward_batch(&mut batch, &mut self.scratch, &mut self.logits)?;
        Ok(self.logits.clone())
    }
}

impl LogitsSource for LlamaSource {
    fn vocab_size(&self) -> usize {
        self.weights.config.vocab_size
    }

    fn prefill(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        self.run(ids, LogitRows::Last)
    }

    fn decode_one(&mut self, token: u32) -> Result<Vec<f32>> {
        self.run(&[token], LogitRows::Last)
    }

    fn extend_all(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        self.run(ids, LogitRows::All)
    }

    fn fork(&self) -> Result<Self> {
        Ok(self.clone())
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        self.kv.truncate(len)
    }

    fn len(&self) -> usize {
        self.kv.len()
    }
}
