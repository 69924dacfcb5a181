//! A small llama forward pass on candle tensors, with the KV cache held outside the layers.
//!
//! The weights ([`LlamaWeights`]) are read from a GGUF file once and shared (behind an `Arc`)
//! by every branch; a [`LlamaSource`] is one sequence: its KV cache (one key and one value
//! tensor per layer, `[1, n_kv_heads, len, head_dim]`) and its length. Because candle tensors
//! are immutable and reference-counted, [`fork`](crate::LogitsSource::fork) is a clone of the
//! cache handles (the new branch shares the prefix and copies on its next append) and
//! [`truncate`](crate::LogitsSource::truncate) is a narrow of every cache tensor.
//!
//! The architecture is llama as GGUF stores it: RMSNorm, rotary embeddings on adjacent pairs
//! (GGUF's Q/K weights are permuted for that layout), grouped-query attention, a SwiGLU
//! feed-forward, and an output matrix that is `output.weight` or, when absent, the token
//! embedding (tied). Matrices stay quantised (candle's `QMatMul`); Q4_1 matrices can be
//! re-quantised to Q8_0 at load ([`Requant::Q8_0`]), which candle multiplies much faster on x86.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::{gguf_file, GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};

use crate::error::{ModelError, Result};
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
    /// RMSNorm epsilon.
    pub rms_eps: f64,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// Training context length (the cache may not grow past it).
    pub context_length: usize,
    /// Rows of the output matrix (the logits row length).
    pub vocab_size: usize,
}

struct Layer {
    attn_norm: Tensor,
    wq: QMatMul,
    wk: QMatMul,
    wv: QMatMul,
    wo: QMatMul,
    ffn_norm: Tensor,
    w_gate: QMatMul,
    w_up: QMatMul,
    w_down: QMatMul,
}

/// The weights of a llama-architecture GGUF model, loaded for the CPU.
pub struct LlamaWeights {
    /// Hyper-parameters.
    pub config: LlamaConfig,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    output: QMatMul,
    cos: Tensor,
    sin: Tensor,
    device: Device,
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
    let v = c
        .metadata
        .get(key)
        .ok_or_else(|| ModelError::new(format!("GGUF metadata has no `{key}`")))?;
    v.to_u32()
        .map(|x| x as usize)
        .or_else(|_| v.to_u64().map(|x| x as usize))
        .map_err(|e| ModelError::new(format!("GGUF metadata `{key}`: {e}")))
}

fn md_f32(c: &gguf_file::Content, key: &str) -> Option<f32> {
    c.metadata.get(key).and_then(|v| v.to_f32().ok())
}

impl LlamaWeights {
    /// Loads a llama-architecture GGUF file (`general.architecture = llama`).
    pub fn load(path: &Path, requant: Requant) -> Result<LlamaWeights> {
        let device = Device::Cpu;
        let file = File::open(path)
            .map_err(|e| ModelError::new(format!("{}: cannot open: {e}", path.display())))?;
        let mut r = BufReader::new(file);
        let c = gguf_file::Content::read(&mut r)
            .map_err(|e| ModelError::new(format!("{}: not a GGUF file: {e}", path.display())))?;
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
        let head_dim = md_usize(&c, "llama.rope.dimension_count").unwrap_or(n_embd / n_head);
        let rms_eps = md_f32(&c, "llama.attention.layer_norm_rms_epsilon").unwrap_or(1e-5) as f64;
        let rope_theta = md_f32(&c, "llama.rope.freq_base").unwrap_or(10_000.0);
        let context_length = md_usize(&c, "llama.context_length").unwrap_or(2048);
        if n_head % n_kv_head != 0 || head_dim * n_head != n_embd {
            return Err(ModelError::new(format!(
                "unsupported head layout: {n_head} heads, {n_kv_head} kv heads, head width {head_dim}, embedding {n_embd}"
            )));
        }

        let mut get = |name: &str| -> Result<QTensor> {
            c.tensor(&mut r, name, &device)
                .map_err(|e| ModelError::new(format!("tensor `{name}`: {e}")))
        };
        let requantize = |t: QTensor| -> Result<QTensor> {
            let slow = matches!(
                t.dtype(),
                GgmlDType::Q4_0 | GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1
            );
            if requant == Requant::Q8_0 && slow {
                let f = t.dequantize(&Device::Cpu)?;
                Ok(QTensor::quantize(&f, GgmlDType::Q8_0)?)
            } else {
                Ok(t)
            }
        };
        let qm = |t: QTensor| -> Result<QMatMul> { Ok(QMatMul::from_qtensor(requantize(t)?)?) };
        let vec = |t: QTensor| -> Result<Tensor> { Ok(t.dequantize(&Device::Cpu)?) };

        let embd_q = get("token_embd.weight")?;
        let embed = embd_q.dequantize(&device)?;
        let vocab_size = embed.dim(0)?;
        let norm = vec(get("output_norm.weight")?)?;
        let output_q = match get("output.weight") {
            Ok(t) => t,
            Err(_) => embd_q, // tied to the embedding
        };
        let output_q = requantize(output_q)?;
        let output_dtype = format!("{:?}", output_q.dtype());
        let output = QMatMul::from_qtensor(output_q)?;
        let mut layers = Vec::with_capacity(n_layer);
        for i in 0..n_layer {
            let p = format!("blk.{i}");
            layers.push(Layer {
                attn_norm: vec(get(&format!("{p}.attn_norm.weight"))?)?,
                wq: qm(get(&format!("{p}.attn_q.weight"))?)?,
                wk: qm(get(&format!("{p}.attn_k.weight"))?)?,
                wv: qm(get(&format!("{p}.attn_v.weight"))?)?,
                wo: qm(get(&format!("{p}.attn_output.weight"))?)?,
                ffn_norm: vec(get(&format!("{p}.ffn_norm.weight"))?)?,
                w_gate: qm(get(&format!("{p}.ffn_gate.weight"))?)?,
                w_up: qm(get(&format!("{p}.ffn_up.weight"))?)?,
                w_down: qm(get(&format!("{p}.ffn_down.weight"))?)?,
            });
        }
        // RoPE tables for every position of the context.
        let half = head_dim / 2;
        let inv: Vec<f32> = (0..half)
            .map(|i| 1.0 / rope_theta.powf(2.0 * i as f32 / head_dim as f32))
            .collect();
        let inv = Tensor::from_vec(inv, (1, half), &device)?;
        let pos = Tensor::arange(0u32, context_length as u32, &device)?
            .to_dtype(DType::F32)?
            .reshape((context_length, 1))?;
        let freqs = pos.matmul(&inv)?;
        let cos = freqs.cos()?;
        let sin = freqs.sin()?;
        Ok(LlamaWeights {
            config: LlamaConfig {
                n_layer,
                n_embd,
                n_head,
                n_kv_head,
                head_dim,
                rms_eps,
                rope_theta,
                context_length,
                vocab_size,
            },
            embed,
            layers,
            norm,
            output,
            cos,
            sin,
            device,
            output_dtype,
            requant,
        })
    }

    fn rms_norm(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(x, w, self.config.rms_eps as f32)?)
    }

    /// Runs `ids` at positions `pos..pos + ids.len()` against `cache`, appending to it, and
    /// returns the logits after the last id.
    fn forward(
        &self,
        ids: &[u32],
        pos: usize,
        cache: &mut [Option<(Tensor, Tensor)>],
    ) -> Result<Vec<f32>> {
        let cfg = &self.config;
        let t = ids.len();
        if pos + t > cfg.context_length {
            return Err(ModelError::new(format!(
                "context full: {} positions of {}",
                pos + t,
                cfg.context_length
            )));
        }
        let ids_t = Tensor::new(ids, &self.device)?;
        let mut x = self.embed.index_select(&ids_t, 0)?.unsqueeze(0)?; // [1, t, d]
        let cos = self.cos.narrow(0, pos, t)?;
        let sin = self.sin.narrow(0, pos, t)?;
        let mask = if t > 1 {
            let total = pos + t;
            let m: Vec<f32> = (0..t)
                .flat_map(|i| {
                    (0..total).map(move |j| if j > pos + i { f32::NEG_INFINITY } else { 0.0 })
                })
                .collect();
            Some(Tensor::from_vec(m, (t, total), &self.device)?)
        } else {
            None
        };
        let (nh, nkv, hd) = (cfg.n_head, cfg.n_kv_head, cfg.head_dim);
        let scale = 1.0 / (hd as f64).sqrt();
        for (layer, slot) in self.layers.iter().zip(cache.iter_mut()) {
            let h = self.rms_norm(&x, &layer.attn_norm)?;
            let q = layer
                .wq
                .forward(&h)?
                .reshape((1, t, nh, hd))?
                .transpose(1, 2)?
                .contiguous()?;
            let k = layer
                .wk
                .forward(&h)?
                .reshape((1, t, nkv, hd))?
                .transpose(1, 2)?
                .contiguous()?;
            let v = layer
                .wv
                .forward(&h)?
                .reshape((1, t, nkv, hd))?
                .transpose(1, 2)?;
            let q = f16_round(&candle_nn::rotary_emb::rope_i(&q, &cos, &sin)?)?;
            let k = f16_round(&candle_nn::rotary_emb::rope_i(&k, &cos, &sin)?)?;
            let v = f16_round(&v)?;
            let (k, v) = match slot.take() {
                None => (k.contiguous()?, v.contiguous()?),
                Some((kc, vc)) => (Tensor::cat(&[&kc, &k], 2)?, Tensor::cat(&[&vc, &v], 2)?),
            };
            *slot = Some((k.clone(), v.clone()));
            let total = k.dim(2)?;
            let rep = nh / nkv;
            let (k, v) = if rep == 1 {
                (k, v)
            } else {
                (
                    k.unsqueeze(2)?
                        .expand((1, nkv, rep, total, hd))?
                        .reshape((1, nh, total, hd))?,
                    v.unsqueeze(2)?
                        .expand((1, nkv, rep, total, hd))?
                        .reshape((1, nh, total, hd))?,
                )
            };
            let att = (q.matmul(&k.t()?)? * scale)?;
            let att = match &mask {
                Some(m) => att.broadcast_add(m)?,
                None => att,
            };
            let att = f16_round(&candle_nn::ops::softmax_last_dim(&att)?)?;
            let y = att.matmul(&v.contiguous()?)?; // [1, nh, t, hd]
            let y = y.transpose(1, 2)?.reshape((1, t, nh * hd))?;
            let y = layer.wo.forward(&y)?;
            x = (x + y)?;
            let h = self.rms_norm(&x, &layer.ffn_norm)?;
            let g = layer.w_gate.forward(&h)?.silu()?;
            let u = layer.w_up.forward(&h)?;
            let y = layer.w_down.forward(&(g * u)?)?;
            x = (x + y)?;
        }
        let last = x.narrow(1, t - 1, 1)?;
        let last = self.rms_norm(&last, &self.norm)?;
        let logits = self.output.forward(&last)?;
        Ok(logits
            .flatten_all()?
            .to_dtype(DType::F32)?
            .to_vec1::<f32>()?)
    }
}

/// Rounds to half precision and back (llama.cpp keeps the KV cache in `f16` and multiplies the
/// attention in `f16`).
fn f16_round(x: &Tensor) -> Result<Tensor> {
    Ok(x.to_dtype(DType::F16)?.to_dtype(DType::F32)?)
}

/// One sequence of a llama model: shared weights plus this branch's KV cache.
#[derive(Clone)]
pub struct LlamaSource {
    weights: Arc<LlamaWeights>,
    cache: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
}

impl std::fmt::Debug for LlamaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaSource")
            .field("len", &self.len)
            .finish()
    }
}

impl LlamaSource {
    /// An empty sequence over `weights`.
    pub fn new(weights: Arc<LlamaWeights>) -> LlamaSource {
        let n = weights.config.n_layer;
        LlamaSource {
            weights,
            cache: vec![None; n],
            len: 0,
        }
    }

    /// The shared weights.
    pub fn weights(&self) -> &Arc<LlamaWeights> {
        &self.weights
    }
}

impl LogitsSource for LlamaSource {
    fn vocab_size(&self) -> usize {
        self.weights.config.vocab_size
    }

    fn prefill(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        if ids.is_empty() {
            return Err(ModelError::new("prefill needs at least one id"));
        }
        // candle parallelises the forward pass with rayon. A parallel call made from outside
        // rayon's pool hands its work to the pool and blocks on a lock until it is done, for
        // every such call; run from a pool thread, the calls join in directly (about 2x tokens/s
        // for SmolLM2-135M on 2 cores, `nextok bench decode`). From a pool thread this runs
        // inline.
        let (weights, pos, cache) = (&self.weights, self.len, &mut self.cache);
        let out = rayon::scope(|_| weights.forward(ids, pos, cache))?;
        self.len += ids.len();
        Ok(out)
    }

    fn decode_one(&mut self, token: u32) -> Result<Vec<f32>> {
        self.prefill(&[token])
    }

    fn fork(&self) -> Result<Self> {
        Ok(self.clone())
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.len {
            return Err(ModelError::new(format!(
                "cannot truncate to {len}: only {} positions",
                self.len
            )));
        }
        if len == self.len {
            return Ok(());
        }
        for slot in &mut self.cache {
            *slot = if len == 0 {
                None
            } else {
                match slot.take() {
                    Some((k, v)) => Some((k.narrow(2, 0, len)?, v.narrow(2, 0, len)?)),
                    None => None,
                }
            };
        }
        self.len = len;
        Ok(())
    }

    fn len(&self) -> usize {
        self.len
    }
}
