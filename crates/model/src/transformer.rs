//! The forward pass every supported family shares: many sequences in one batch, on nextok's
//! own kernels.
//!
//! The weights ([`ModelWeights`]) are read from a GGUF file once and shared (behind an `Arc`)
//! by every sequence. [`ModelWeights::forward_batch`] runs one forward pass over a batch of
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
//! **The block.** What differs between families is described by an [`ArchConfig`] (see
//! [`crate::arch`]); one layer is
//!
//! ```text
//! h = RMSNorm(x) · attn_norm
//! q, k, v = h·Wq (+bq), h·Wk (+bk), h·Wv (+bv)        (or one fused h·Wqkv)
//! q, k = RMSNorm_head(q) · q_norm, RMSNorm_head(k) · k_norm   (Qwen 3, Gemma 3)
//! q, k = rope(q), rope(k)                               (adjacent pairs or halves)
//! q = q · query_scale                                   (Gemma 3, Phi-3)
//! a = attention(q, K, V) over the layer's window        (Gemma 3's local layers)
//! x = x + [RMSNorm](a·Wo)                               (post-norm: Gemma 3)
//! h = RMSNorm(x) · ffn_norm
//! x = x + [RMSNorm](act(h·Wgate) ⊙ (h·Wup) · Wdown)     (SiLU or GELU; fused gate/up: Phi-3)
//! ```
//!
//! and the logits are `RMSNorm(x) · output_norm · Wout` (`Wout` = the token embedding when
//! the file has no `output.weight`). As in llama.cpp, matrices stay quantised and multiply
//! activations quantised to 8 bits per block, queries, keys, values and attention weights are
//! rounded to half precision (the KV cache is `f16`), the rotary angles are computed as GGML
//! computes them (`θ_{i+1} = θ_i · base^(−2/n_rot)` in `f32` from `θ_0 = position`, divided
//! by the file's frequency factors, times the linear scale), and GELU is GGML's: the input
//! rounded to `f16`, the tanh approximation evaluated in `f32` and rounded to `f16`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use half::f16;

use crate::arch::{Arch, ArchConfig, FfnAct, RopeSpec, RopeStyle};
use crate::error::{ModelError, ModelErrorKind, Result};
use crate::file::{ggml_type, GgufFile};
use crate::kernels::attn::{self, dot};
use crate::kernels::{self, Activations, Level, MatFormat, QMatrix};
use crate::kv::{KvGeometry, KvPool, KvRun, SeqKv, BLOCK_POSITIONS};
use crate::LogitsSource;
use nextok_vocab::gguf::TensorInfo;

/// What to do with the quantised matrices at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Requant {
    /// Keep every matrix in the file's format (nextok has kernels for Q4_0, Q4_1, Q5_0, Q5_1,
    /// Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16 and F32; other formats are converted to Q8_0 and
    /// reported).
    #[default]
    Keep,
    /// Re-quantise every matrix that is not Q8_0 to Q8_0 (the fastest kernels on x86; more
    /// memory, and logits that are no longer the file's).
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

/// The query/key/value projections of a layer.
enum Qkv {
    Separate(Box<[QMatrix; 3]>),
    /// One matrix whose rows are the query, key and value rows in that order.
    Fused(QMatrix),
}

/// The gate and up projections of a layer.
enum GateUp {
    Separate(Box<[QMatrix; 2]>),
    /// One matrix: the gate rows, then the up rows.
    Fused(QMatrix),
}

struct Layer {
    attn_norm: Vec<f32>,
    qkv: Qkv,
    /// Query, key and value biases (Qwen 2).
    bias: Option<[Vec<f32>; 3]>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    wo: QMatrix,
    post_attn_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    gate_up: GateUp,
    w_down: QMatrix,
    post_ffn_norm: Option<Vec<f32>>,
    /// Index into the model's rotary settings ([`ModelWeights`]' `ropes`).
    rope: usize,
}

/// A matrix the loader could not keep in the file's format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Converted {
    /// The tensor.
    pub tensor: String,
    /// Its format in the file.
    pub from: String,
    /// What it runs as.
    pub to: String,
}

/// The weights of a GGUF model of a supported family ([`Arch`]), loaded for the CPU.
pub struct ModelWeights {
    /// Hyper-parameters and features.
    pub config: ArchConfig,
    embed: QMatrix,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    /// `None`: tied to the embedding.
    output: Option<QMatrix>,
    /// The distinct rotary settings of the layers, and Llama 3's frequency factors: each
    /// forward pass computes the angles of its own rows' positions ([`rope_angles`]), so no
    /// table sized by the file's context length is built.
    ropes: Vec<RopeSpec>,
    rope_factors: Option<Vec<f32>>,
    pool: KvPool,
    /// The quantisation of the output matrix after load (for reports).
    pub output_dtype: String,
    /// The re-quantisation applied at load.
    pub requant: Requant,
    /// Matrices converted at load because nextok has no kernel for their format (reported once
    /// at load).
    pub converted: Vec<Converted>,
}

impl std::fmt::Debug for ModelWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelWeights")
            .field("config", &self.config)
            .field("output_dtype", &self.output_dtype)
            .field("requant", &self.requant)
            .finish()
    }
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
    fused: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    acts: Activations,
    /// Split attention ([`Split`]): each unit's first key, key count and where its scores and
    /// weights start; the scores and the weights.
    units: Vec<(usize, usize, usize)>,
    split_scores: Vec<f32>,
    split_weights: Vec<f32>,
    /// Per unit of a split attention: its score chunks done.
    split_done: Vec<std::sync::atomic::AtomicUsize>,
    /// How many layer steps ran their attention split ([`Scratch::split_attention_steps`]).
    split_steps: u64,
    /// Per row: (sequence index, absolute position).
    rows: Vec<(usize, usize)>,
    /// Per rotary setting of the model: `cos` and `sin` of each row's angles, `[row][n_rot / 2]`.
    rope: Vec<(Vec<f32>, Vec<f32>)>,
    /// Runs of consecutive rows of one sequence that attend together (first row, end row).
    groups: Vec<(usize, usize)>,
    /// Rows whose logits are returned, in order.
    logit_rows: Vec<usize>,
    /// The kernels' implementation (`None`: the process-wide one, [`kernels::Level::current`];
    /// all give the same bits).
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

    /// How many (forward pass, layer) steps so far computed their attention split over the
    /// threads by key chunks and value columns (a decode step at a long context with few
    /// key/value heads) rather than one task per (row, key/value head). The split gives the
    /// same bits; this count shows which way ran.
    pub fn split_attention_steps(&self) -> u64 {
        self.split_steps
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

fn format_err(msg: String) -> ModelError {
    ModelError::new(msg).with_kind(ModelErrorKind::Format)
}

/// Reads the matrices of a file, keeping each in its own format where a kernel exists.
struct MatrixLoader<'f> {
    f: &'f GgufFile,
    requant: Requant,
    converted: Vec<Converted>,
    /// Matrices repacked ahead, in parallel ([`MatrixLoader::repack_ahead`]), taken by
    /// [`MatrixLoader::load`] after its checks.
    ready: HashMap<String, Result<Repacked>>,
}

/// A matrix in its runtime format, and the conversion it went through if any.
type Repacked = (QMatrix, Option<Converted>);

impl MatrixLoader<'_> {
    /// Repacks the two-dimensional matrices among `names` on every core (the rayon pool), each
    /// from the file's mapping, whose pages are released as each copy is made. Errors are kept
    /// for [`MatrixLoader::load`] to report in load order, after its own checks.
    fn repack_ahead(&mut self, names: &[String]) {
        use rayon::prelude::*;
        let (f, requant) = (self.f, self.requant);
        self.ready = names
            .par_iter()
            .filter_map(|name| {
                let t = f.info(name)?;
                let &[c, r] = t.dims.as_slice() else {
                    return None;
                };
                Some((
                    name.clone(),
                    repack(f, requant, name, t, c as usize, r as usize),
                ))
            })
            .collect();
    }

    /// Matrix `name` as `[rows, cols]` (GGUF dims `[cols, rows]`); `rows`/`cols` of `None`
    /// are taken from the file, given ones are checked.
    fn load(&mut self, name: &str, rows: Option<usize>, cols: Option<usize>) -> Result<QMatrix> {
        let t = self.f.require(name)?;
        let (fc, fr) = match t.dims.as_slice() {
            &[c, r] => (c as usize, r as usize),
            &[c] if rows == Some(1) => (c as usize, 1),
            d => {
                return Err(format_err(format!(
                    "tensor `{name}`: dimensions {d:?}, expected a matrix"
                )))
            }
        };
        if rows.is_some_and(|r| r != fr) || cols.is_some_and(|c| c != fc) {
            return Err(format_err(format!(
                "tensor `{name}`: {fr}x{fc}, expected {}x{}",
                rows.map_or("?".to_string(), |r| r.to_string()),
                cols.map_or("?".to_string(), |c| c.to_string()),
            )));
        }
        let (m, conv) = match self.ready.remove(name) {
            Some(r) => r?,
            None => repack(self.f, self.requant, name, t, fc, fr)?,
        };
        self.converted.extend(conv);
        Ok(m)
    }
}

/// Tensor `t` (`name`, `fr` rows of `fc` values) in its runtime format: kept where a kernel
/// exists, else dequantised and quantised to Q8_0. The file's pages of the tensor are released
/// once the copy is made.
fn repack(
    f: &GgufFile,
    requant: Requant,
    name: &str,
    t: &TensorInfo,
    fc: usize,
    fr: usize,
) -> Result<Repacked> {
    let kernel_err = |e: kernels::KernelError| {
        ModelError::new(format!("tensor `{name}`: {e}"))
            .with_kind(ModelErrorKind::Format)
            .with_source(e)
    };
    let bytes = f.bytes(t)?;
    let ty = t.ggml_type;
    let (fmt, kept) = runtime_format(ty, fc, requant);
    if kept {
        let m = QMatrix::from_ggml(fmt, fr, fc, bytes).map_err(kernel_err);
        f.release(t);
        return Ok((m?, None));
    }
    // no kernel for this format (or a re-quantisation was asked for): dequantise, then Q8_0
    let values = crate::file::to_f32(name, ty, bytes, vec![fc, fr])?;
    f.release(t);
    let asked = requant == Requant::Q8_0
        && MatFormat::from_ggml_type(ty).is_some_and(|f| fc.is_multiple_of(f.cols_multiple()));
    let conv = (!asked).then(|| Converted {
        tensor: name.to_string(),
        from: ggml_type::name(ty),
        to: "Q8_0".into(),
    });
    Ok((
        QMatrix::quantize_q8_0(fr, fc, &values).map_err(kernel_err)?,
        conv,
    ))
}

/// Bytes the weights of `f` will hold once loaded, an upper estimate from the tensor
/// descriptions alone: a matrix kept in its format as many as the file's bytes plus 1/32 (the
/// repacked scale planes are at most that much larger), one converted to Q8_0 34 bytes per 32
/// values, and any other tensor 4 bytes a value.
pub fn resident_estimate(f: &GgufFile, requant: Requant) -> u64 {
    let mut total = 0u64;
    for t in f.tensors() {
        let elems: u64 = t.dims.iter().product();
        let bytes = nextok_vocab::gguf::ggml_type_size(t.ggml_type)
            .map_or(elems.saturating_mul(4), |(block, size)| {
                (elems / block.max(1)).saturating_mul(size)
            });
        let add = match t.dims.as_slice() {
            &[c, _] => match runtime_format(t.ggml_type, c as usize, requant) {
                (_, true) => bytes.saturating_add(bytes / 32),
                (_, false) => (elems / 32).saturating_mul(34),
            },
            _ => elems.saturating_mul(4),
        };
        total = total.saturating_add(add);
    }
    total
}

/// The format a matrix of GGML type `ty` with `cols` columns runs in, and whether that is the
/// file's own (`false`: dequantised and re-quantised to Q8_0 at load): the file's format
/// wherever a kernel exists (all but Q2_K, Q3_K and the IQ types), except that
/// [`Requant::Q8_0`] turns every other format into Q8_0.
pub(crate) fn runtime_format(ty: u32, cols: usize, requant: Requant) -> (MatFormat, bool) {
    let native = MatFormat::from_ggml_type(ty).filter(|f| cols.is_multiple_of(f.cols_multiple()));
    match (native, requant) {
        (Some(MatFormat::Q8_0), _) => (MatFormat::Q8_0, true),
        (Some(f), Requant::Keep) => (f, true),
        _ => (MatFormat::Q8_0, false),
    }
}

/// The names of the matrices [`ModelWeights::from_file`] loads from `f` (`n_layer` blocks), in
/// load order, the ones the file has.
pub(crate) fn matrix_names(f: &GgufFile, n_layer: usize) -> Vec<String> {
    let mut out = vec!["token_embd.weight".to_string()];
    if f.info("output.weight").is_some() {
        out.push("output.weight".into());
    }
    for i in 0..n_layer {
        for s in [
            "attn_qkv",
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ] {
            let name = format!("blk.{i}.{s}.weight");
            if f.info(&name).is_some() {
                out.push(name);
            }
        }
    }
    out
}

impl ModelWeights {
    /// Calls `f` on every matrix: the embedding, the output (when not tied), then each layer's.
    fn each_matrix(&self, mut f: impl FnMut(&QMatrix)) {
        f(&self.embed);
        if let Some(o) = &self.output {
            f(o);
        }
        for l in &self.layers {
            match &l.qkv {
                Qkv::Separate(m) => m.iter().for_each(&mut f),
                Qkv::Fused(m) => f(m),
            }
            f(&l.wo);
            match &l.gate_up {
                GateUp::Separate(m) => m.iter().for_each(&mut f),
                GateUp::Fused(m) => f(m),
            }
            f(&l.w_down);
        }
    }

    /// The formats of every matrix as loaded (after re-quantisation and conversions), each once:
    /// what the model's numerics depend on ([`crate::numerics::identifier`]).
    pub fn matrix_formats(&self) -> Vec<MatFormat> {
        let mut out: Vec<MatFormat> = Vec::new();
        self.each_matrix(|m| {
            if !out.contains(&m.format()) {
                out.push(m.format());
            }
        });
        out
    }

    /// Bytes of memory the loaded matrices hold (quants and scales as repacked).
    pub fn matrix_bytes(&self) -> usize {
        let mut total = 0usize;
        self.each_matrix(|m| total = total.saturating_add(m.bytes()));
        total
    }

    /// What one single-stream decode step reads of the weights: the bytes of every matrix it
    /// multiplies (each layer's and the output, the embedding when it is the output too; an
    /// untied embedding gives one row, not counted), and their multiply-adds (one per weight).
    pub fn decode_step_reads(&self) -> (usize, usize) {
        let (mut bytes, mut macs) = (0usize, 0usize);
        self.each_matrix(|m| {
            bytes = bytes.saturating_add(m.bytes());
            macs = macs.saturating_add(m.rows().saturating_mul(m.cols()));
        });
        if self.output.is_some() {
            bytes -= self.embed.bytes();
            macs -= self.embed.rows() * self.embed.cols();
        }
        (bytes, macs)
    }

    /// Loads a GGUF file of a supported family (`general.architecture`: see [`Arch`]).
    pub fn load(path: &Path, requant: Requant) -> Result<ModelWeights> {
        let f = GgufFile::open(path)?;
        ModelWeights::from_file(&f, requant)
    }

    /// Loads the weights of an opened GGUF file.
    pub fn from_file(f: &GgufFile, requant: Requant) -> Result<ModelWeights> {
        let arch = Arch::of(f)?;
        let mut cfg = arch.config(f)?;
        let need = resident_estimate(f, requant);
        crate::memory::check(need, "the weights").map_err(|line| {
            ModelError::new(format!(
                "{}: {line}; a smaller quantisation of the model, or a machine with more memory, is needed",
                f.path().display()
            ))
            .with_kind(ModelErrorKind::Capacity)
        })?;
        let (d, qd, kvd, hd) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.head_dim);
        let mut ml = MatrixLoader {
            f,
            requant,
            converted: Vec::new(),
            ready: HashMap::new(),
        };
        ml.repack_ahead(&matrix_names(f, cfg.n_layer));
        let embed = ml.load("token_embd.weight", None, Some(d))?;
        let norm = f.vector("output_norm.weight", d)?;
        let output = match f.info("output.weight") {
            Some(_) => Some(ml.load("output.weight", None, Some(d))?),
            None => None, // tied to the embedding
        };
        let vocab_size = output.as_ref().unwrap_or(&embed).rows();
        if output.is_some() && embed.rows() < vocab_size {
            return Err(format_err(format!(
                "tensor `token_embd.weight`: {} rows for {vocab_size} output rows",
                embed.rows()
            )));
        }
        let output_dtype = format!("{:?}", output.as_ref().unwrap_or(&embed).format());
        let n_ff_md = f
            .get(&format!("{}.feed_forward_length", arch.name()))
            .and_then(|v| v.as_int())
            .and_then(|v| usize::try_from(v).ok());
        let (ropes_spec, rope_idx) = cfg.rope_tables();
        let mut layers = Vec::with_capacity(cfg.n_layer);
        let mut n_ff = 0usize;
        for (i, &rope) in rope_idx.iter().enumerate() {
            let p = format!("blk.{i}");
            let t = |s: &str| format!("{p}.{s}.weight");
            let has = |s: &str| f.info(&t(s)).is_some();
            let qkv = if has("attn_qkv") {
                Qkv::Fused(ml.load(&t("attn_qkv"), Some(qd + 2 * kvd), Some(d))?)
            } else {
                Qkv::Separate(Box::new([
                    ml.load(&t("attn_q"), Some(qd), Some(d))?,
                    ml.load(&t("attn_k"), Some(kvd), Some(d))?,
                    ml.load(&t("attn_v"), Some(kvd), Some(d))?,
                ]))
            };
            let bias = if f.info(&format!("{p}.attn_q.bias")).is_some() {
                Some([
                    f.vector(&format!("{p}.attn_q.bias"), qd)?,
                    f.vector(&format!("{p}.attn_k.bias"), kvd)?,
                    f.vector(&format!("{p}.attn_v.bias"), kvd)?,
                ])
            } else {
                None
            };
            let (q_norm, k_norm) = if cfg.qk_norm {
                (
                    Some(f.vector(&t("attn_q_norm"), hd)?),
                    Some(f.vector(&t("attn_k_norm"), hd)?),
                )
            } else {
                (None, None)
            };
            let wo = ml.load(&t("attn_output"), Some(d), Some(qd))?;
            let (post_attn_norm, post_ffn_norm) = if cfg.post_norms {
                (
                    Some(f.vector(&t("post_attention_norm"), d)?),
                    Some(f.vector(&t("post_ffw_norm"), d)?),
                )
            } else {
                (None, None)
            };
            let gate_up = if has("ffn_gate") {
                let gate = ml.load(&t("ffn_gate"), None, Some(d))?;
                let up = ml.load(&t("ffn_up"), Some(gate.rows()), Some(d))?;
                GateUp::Separate(Box::new([gate, up]))
            } else {
                let up = ml.load(&t("ffn_up"), None, Some(d))?;
                if !up.rows().is_multiple_of(2) {
                    return Err(format_err(format!(
                        "tensor `{}`: {} rows cannot hold the gate and up halves",
                        t("ffn_up"),
                        up.rows()
                    )));
                }
                GateUp::Fused(up)
            };
            let ff = match &gate_up {
                GateUp::Separate(m) => m[0].rows(),
                GateUp::Fused(m) => m.rows() / 2,
            };
            if i == 0 {
                n_ff = ff;
            }
            if ff != n_ff || ff == 0 || n_ff_md.is_some_and(|m| m != ff) {
                return Err(format_err(format!(
                    "tensor `{}`: feed-forward width {ff}, expected {}",
                    t("ffn_down"),
                    n_ff_md.unwrap_or(n_ff)
                )));
            }
            let w_down = ml.load(&t("ffn_down"), Some(d), Some(ff))?;
            layers.push(Layer {
                attn_norm: f.vector(&t("attn_norm"), d)?,
                qkv,
                bias,
                q_norm,
                k_norm,
                wo,
                post_attn_norm,
                ffn_norm: f.vector(&t("ffn_norm"), d)?,
                gate_up,
                w_down,
                post_ffn_norm,
                rope,
            });
        }
        cfg.n_ff = n_ff;
        cfg.vocab_size = vocab_size;
        let factors = if ropes_spec.iter().any(|s| s.freq_factors) {
            let v = f.vector("rope_freqs.weight", cfg.n_rot / 2)?;
            if v.iter().any(|&x| x <= 0.0) {
                return Err(format_err(
                    "tensor `rope_freqs.weight`: frequency factors must be positive".into(),
                ));
            }
            Some(v)
        } else {
            None
        };
        let pool = KvPool::new(
            KvGeometry {
                n_layer: cfg.n_layer,
                n_kv_head: cfg.n_kv_head,
                head_dim: hd,
                dtype: crate::kv::KvCacheType::F16,
            },
            None,
        );
        Ok(ModelWeights {
            config: cfg,
            embed,
            layers,
            norm,
            output,
            ropes: ropes_spec,
            rope_factors: factors,
            pool,
            output_dtype,
            requant,
            converted: ml.converted,
        })
    }

    /// The shape of this model's KV cache.
    pub fn kv_geometry(&self) -> KvGeometry {
        self.pool.geometry()
    }

    /// The unlimited pool that [`ModelSource::new`] takes its caches from.
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
        crate::team::with_team(|| self.forward_inner(seqs, s, logits))
    }

    fn forward_inner(
        &self,
        seqs: &mut [BatchSeq<'_>],
        s: &mut Scratch,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let cfg = &self.config;
        let (d, hd, nh, nkv) = (cfg.n_embd, cfg.head_dim, cfg.n_head, cfg.n_kv_head);
        let (qd, kvd, ff) = (cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
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
        // the rotary angles of the rows' positions, once per pass for every layer
        let half = cfg.n_rot / 2;
        s.rope.resize_with(self.ropes.len(), Default::default);
        for (spec, (cos, sin)) in self.ropes.iter().zip(s.rope.iter_mut()) {
            cos.clear();
            sin.clear();
            for &(_, pos) in &s.rows {
                rope_angles(spec, cfg.n_rot, pos, self.rope_factors.as_deref(), cos, sin);
            }
        }
        resize(&mut s.x, n * d);
        let mut r = 0;
        for q in seqs.iter() {
            for &t in q.tokens {
                let row = &mut s.x[r * d..(r + 1) * d];
                self.embed.dequantize_row(t as usize, row)?;
                if let Some(k) = cfg.embed_scale {
                    for v in row.iter_mut() {
                        *v *= k;
                    }
                }
                r += 1;
            }
        }
        resize(&mut s.h, n * d);
        resize(&mut s.q, n * qd);
        resize(&mut s.k, n * kvd);
        resize(&mut s.v, n * kvd);
        resize(&mut s.att, n * qd);
        resize(&mut s.tmp, n * d);
        // the feed-forward runs in slices of at most `FFN_SLICE_ROWS` rows (the same bits:
        // each row's outputs depend on that row alone), so its widest buffers stay that size
        let slices = n.div_ceil(FFN_SLICE_ROWS).max(1);
        let slice_rows = n.div_ceil(slices);
        resize(&mut s.gate, slice_rows * ff);
        resize(&mut s.up, slice_rows * ff);
        let level = s.level.unwrap_or_else(kernels::Level::current);
        let eps = cfg.rms_eps;
        // scores are scaled here unless the queries were scaled before attention
        let score_scale = match cfg.query_scale {
            Some(_) => 1.0,
            None => 1.0 / (hd as f32).sqrt(),
        };
        let gelu = matches!(cfg.act, FfnAct::GeluTanh).then(gelu_table);
        for (li, layer) in self.layers.iter().enumerate() {
            par_rms_norm_rows(level, &s.x, &layer.attn_norm, eps, &mut s.h, d);
            s.acts.quantize_with(level, &s.h, n, d)?;
            match &layer.qkv {
                Qkv::Separate(m) => {
                    let [wq, wk, wv] = &**m;
                    kernels::matmul_many_with(
                        level,
                        &s.acts,
                        &mut [(wq, &mut s.q), (wk, &mut s.k), (wv, &mut s.v)],
                    )?;
                }
                Qkv::Fused(w) => {
                    let width = qd + 2 * kvd;
                    resize(&mut s.fused, n * width);
                    kernels::matmul_with(level, w, &s.acts, &mut s.fused)?;
                    for (row, src) in s.fused.chunks_exact(width).enumerate() {
                        s.q[row * qd..(row + 1) * qd].copy_from_slice(&src[..qd]);
                        s.k[row * kvd..(row + 1) * kvd].copy_from_slice(&src[qd..qd + kvd]);
                        s.v[row * kvd..(row + 1) * kvd].copy_from_slice(&src[qd + kvd..]);
                    }
                }
            }
            if let Some([bq, bk, bv]) = &layer.bias {
                with_isa!(level, add_rows(&mut s.q, bq));
                with_isa!(level, add_rows(&mut s.k, bk));
                with_isa!(level, add_rows(&mut s.v, bv));
            }
            let (cos, sin) = &s.rope[layer.rope];
            let (style, q_norm, k_norm) = (
                cfg.rope_style,
                layer.q_norm.as_deref(),
                layer.k_norm.as_deref(),
            );
            // row by row, on the team when the batch is large (the same bits)
            crate::team::for_rows(&mut s.q, qd, &|r0, q| {
                let rot = Rotary {
                    cos: &cos[r0 * half..],
                    sin: &sin[r0 * half..],
                    half,
                    style,
                };
                with_isa!(
                    level,
                    query_rows(level, q, qd, hd, &rot, q_norm, eps, cfg.query_scale)
                );
            });
            crate::team::for_rows2(&mut s.k, kvd, &mut s.v, kvd, 2 * kvd, &|r0, k, v| {
                let rot = Rotary {
                    cos: &cos[r0 * half..],
                    sin: &sin[r0 * half..],
                    half,
                    style,
                };
                with_isa!(
                    level,
                    key_value_rows(level, k, v, kvd, hd, &rot, k_norm, eps)
                );
            });
            for (row, &(si, pos)) in s.rows.iter().enumerate() {
                seqs[si].kv.write(
                    li,
                    pos,
                    &s.k[row * kvd..(row + 1) * kvd],
                    &s.v[row * kvd..(row + 1) * kvd],
                )?;
            }
            if li == 0 {
                // runs of up to `ATTN_GROUP_ROWS` rows of one sequence (a prompt's rows)
                s.groups.clear();
                let mut r = 0;
                while r < s.rows.len() {
                    let mut run = r + 1;
                    while run < s.rows.len() && s.rows[run].0 == s.rows[r].0 {
                        run += 1;
                    }
                    let most = if run - r <= ATTN_ALONE_ROWS {
                        1
                    } else {
                        ATTN_GROUP_ROWS
                    };
                    while r < run {
                        let e = (r + most).min(run);
                        s.groups.push((r, e));
                        r = e;
                    }
                }
            }
            {
                let seqs: &[BatchSeq<'_>] = seqs;
                let rows = &s.rows;
                let groups = &s.groups;
                let qs = &s.q;
                let rep = nh / nkv;
                let window = cfg.layers[li].window;
                // A task per (run of rows, key/value head), the rows' query heads together:
                // each key and value block is converted once for all of them.
                let out = kernels::OutPtr(s.att.as_mut_ptr());
                let tasks = groups.len() * nkv;
                let longest = rows
                    .iter()
                    .map(|&(_, pos)| window.map_or(pos + 1, |w| (pos + 1).min(w)))
                    .max()
                    .unwrap_or(0);
                // Fewer tasks than threads (a decode step of a model with few key/value
                // heads) leaves threads without attention work: from `SPLIT_MIN_KEYS` keys on,
                // split it.
                if tasks < crate::team::threads()
                    && hd.is_multiple_of(SPLIT_COLS)
                    && longest >= SPLIT_MIN_KEYS
                {
                    let split = Split {
                        level,
                        seqs,
                        rows,
                        qs,
                        layer: li,
                        nkv,
                        rep,
                        hd,
                        window,
                        scale: score_scale,
                    };
                    split.run(
                        &mut s.units,
                        &mut s.split_scores,
                        &mut s.split_weights,
                        &mut s.split_done,
                        out,
                    );
                    s.split_steps += 1;
                } else {
                    crate::team::for_each(tasks, &|task| {
                        let ((r0, r1), g) = (groups[task / nkv], task % nkv);
                        let si = rows[r0].0;
                        let at = |i: usize| (r0 + i) * qd + g * rep * hd;
                        attend(
                            level,
                            seqs[si].kv,
                            li,
                            g,
                            r1 - r0,
                            &|i| {
                                let pos = rows[r0 + i].1;
                                window.map_or(0, |w| (pos + 1).saturating_sub(w))..pos + 1
                            },
                            &|i| &qs[at(i)..at(i) + rep * hd],
                            // SAFETY: `s.att` holds `rows · qd` values; row `r0 + i`'s heads of
                            // key/value head `g` are written by this task alone, and `attend`
                            // holds one row's output at a time
                            &|i| unsafe {
                                std::slice::from_raw_parts_mut(out.get().add(at(i)), rep * hd)
                            },
                            hd,
                            score_scale,
                        );
                    });
                }
            }
            s.acts.quantize_with(level, &s.att, n, qd)?;
            kernels::matmul_with(level, &layer.wo, &s.acts, &mut s.tmp)?;
            let post_attn_norm = layer.post_attn_norm.as_deref();
            par_residual(level, &mut s.x, &mut s.tmp, post_attn_norm, eps, d);
            par_rms_norm_rows(level, &s.x, &layer.ffn_norm, eps, &mut s.h, d);
            for r0 in (0..n).step_by(slice_rows) {
                let m = slice_rows.min(n - r0);
                s.acts
                    .quantize_with(level, &s.h[r0 * d..(r0 + m) * d], m, d)?;
                let (gate, up) = (&mut s.gate[..m * ff], &mut s.up[..m * ff]);
                match &layer.gate_up {
                    GateUp::Separate(w) => {
                        let [wg, wu] = &**w;
                        kernels::matmul_many_with(level, &s.acts, &mut [(wg, gate), (wu, up)])?;
                    }
                    GateUp::Fused(w) => {
                        resize(&mut s.fused, m * 2 * ff);
                        kernels::matmul_with(level, w, &s.acts, &mut s.fused)?;
                        for (row, src) in s.fused.chunks_exact(2 * ff).enumerate() {
                            gate[row * ff..(row + 1) * ff].copy_from_slice(&src[..ff]);
                            up[row * ff..(row + 1) * ff].copy_from_slice(&src[ff..]);
                        }
                    }
                }
                let up = &*up;
                crate::team::for_rows(gate, ff, &|g0, gate| {
                    let up = &up[g0 * ff..g0 * ff + gate.len()];
                    with_isa!(level, gated_activation(level, gate, up, gelu));
                });
                s.acts.quantize_with(level, &s.gate[..m * ff], m, ff)?;
                let out = &mut s.tmp[r0 * d..(r0 + m) * d];
                kernels::matmul_with(level, &layer.w_down, &s.acts, out)?;
            }
            par_residual(
                level,
                &mut s.x,
                &mut s.tmp,
                layer.post_ffn_norm.as_deref(),
                eps,
                d,
            );
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
            let (x, out) = (&s.x[row * d..(row + 1) * d], &mut s.tmp[i * d..(i + 1) * d]);
            with_isa!(level, rms_norm_rows(x, &self.norm, eps, out, d));
        }
        s.acts.quantize_with(level, &s.tmp, nl, d)?;
        let out = self.output.as_ref().unwrap_or(&self.embed);
        logits.clear();
        logits.resize(nl * out.rows(), 0.0);
        kernels::matmul_with(level, out, &s.acts, logits)?;
        if let Some(c) = cfg.final_softcap {
            // as llama.cpp's graph: scale by 1/c, tanh, scale by c
            let inv = 1.0 / c;
            for z in logits.iter_mut() {
                *z = (*z * inv).tanh() * c;
            }
        }
        Ok(())
    }
}

/// Appends the `n_rot / 2` rotary angles of `spec` at position `p` to `cos` and `sin`, as
/// GGML's `rope_cache_init` computes them: `θ_0 = p`, `θ_{i+1} = θ_i · base^(−2/n_rot)` in
/// `f32`, angle `scale · θ_i / factor_i`.
fn rope_angles(
    spec: &RopeSpec,
    n_rot: usize,
    p: usize,
    factors: Option<&[f32]>,
    cos: &mut Vec<f32>,
    sin: &mut Vec<f32>,
) {
    let theta_scale = spec.base.powf(-2.0 / n_rot as f32);
    let mut theta = p as f32;
    for i in 0..n_rot / 2 {
        let ff = match (spec.freq_factors, factors) {
            (true, Some(f)) => f[i],
            _ => 1.0,
        };
        let a = spec.scale * (theta / ff);
        cos.push(a.cos());
        sin.push(a.sin());
        theta *= theta_scale;
    }
}

/// GGML's GELU table: for every `f16` input, the tanh approximation evaluated in `f32` and
/// rounded to `f16`, kept as that `f16` value in `f32` (exact).
fn gelu_table() -> &'static [f32] {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    TABLE.get_or_init(|| {
        const SQRT_2_OVER_PI: f32 = 0.797_884_6;
        const COEF_A: f32 = 0.044_715;
        (0..=u16::MAX)
            .map(|b| {
                let x = f16::from_bits(b).to_f32();
                let y = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh());
                f16::from_f32(y).to_f32()
            })
            .collect()
    })
}

/// GELU of `x` as GGML's `ggml_vec_gelu_f32` computes it with its `f16` table, `h` being `x`
/// rounded to `f16`.
#[inline(always)]
fn gelu_f16(table: &[f32], x: f32, h: f16) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        table[h.to_bits() as usize]
    }
}

thread_local! {
    /// Per thread: attention scores, their weights and one block of keys or values in `f32`.
    static ATTN_SCRATCH: RefCell<AttnScratch> = RefCell::new(AttnScratch::default());
}

#[derive(Default)]
struct AttnScratch {
    scores: Vec<f32>,
    weights: Vec<f32>,
    block: Vec<f32>,
}

/// Attention of `n` consecutive rows of one sequence for key/value head `g` of `layer`: row `i`
/// has the query heads `q(i)` (`rep` heads of `head_dim`, sharing head `g`), attends over the
/// keys at positions `keys(i)` and writes its `rep` outputs to `out(i)`. Each block of keys and
/// values is converted to `f32` once for all the rows and heads that read it; every row's
/// scores, softmax and sums are the operations of a row alone, so its result does not depend on
/// the rows beside it.
#[allow(clippy::too_many_arguments)]
fn attend<'q, 'o>(
    level: kernels::Level,
    kv: &SeqKv,
    layer: usize,
    g: usize,
    n: usize,
    keys: &dyn Fn(usize) -> std::ops::Range<usize>,
    q: &dyn Fn(usize) -> &'q [f32],
    out: &dyn Fn(usize) -> &'o mut [f32],
    hd: usize,
    scale: f32,
) {
    if n == 0 {
        return;
    }
    if n == 1 {
        attend_one(level, kv, layer, g, keys(0), q(0), out(0), hd, scale);
        return;
    }
    ATTN_SCRATCH.with(|cell| {
        let mut cell = cell.borrow_mut();
        let AttnScratch {
            scores,
            weights,
            block,
        } = &mut *cell;
        let rep = q(0).len() / hd;
        // the union of the rows' keys, and the longest row (each row's scores and weights take
        // `rep · widest` values, its own keys first)
        let (mut lo_all, mut hi_all, mut widest) = (usize::MAX, 0, 0);
        for i in 0..n {
            let k = keys(i);
            lo_all = lo_all.min(k.start);
            hi_all = hi_all.max(k.end);
            widest = widest.max(k.len());
        }
        let all = lo_all..hi_all;
        let per_row = rep * widest;
        scores.resize(n * per_row, 0.0);
        weights.resize(n * per_row, 0.0);
        block.resize(BLOCK_POSITIONS * hd, 0.0);
        let (b0, b1) = (
            all.start / BLOCK_POSITIONS,
            all.end.div_ceil(BLOCK_POSITIONS),
        );
        // the keys (`part` 0) or values (1) block by block, each converted once: `f(row, its
        // keys, the offset of the block's first one among them, its part of the block)`
        let groups = kv.value_groups();
        let mut blocks = |part: usize, f: &mut BlockFn<'_>| {
            for b in b0..b1 {
                let (lo, hi, _) = block_span(b, &all);
                // the values' column groups side by side again
                let (pieces, cols) = if part == 0 {
                    (1, hd)
                } else {
                    (groups, hd / groups)
                };
                for c in 0..pieces {
                    if b + 1 < b1 && !kv.continues(b) {
                        attn::prefetch(kv.piece(b + 1, layer, part, g, c).bytes());
                    }
                    let src = kv.piece(b, layer, part, g, c);
                    if pieces == 1 {
                        src.positions(lo, hi, hd)
                            .to_f32(level, &mut block[..(hi - lo) * hd]);
                    } else {
                        for p in lo..hi {
                            let dst = &mut block[(p - lo) * hd + c * cols..][..cols];
                            src.positions(p, p + 1, cols).to_f32(level, dst);
                        }
                    }
                }
                for i in 0..n {
                    let k = keys(i);
                    if k.is_empty() || b < k.start / BLOCK_POSITIONS || b * BLOCK_POSITIONS >= k.end
                    {
                        continue;
                    }
                    let (rlo, rhi, off) = block_span(b, &k);
                    f(i, k, off, &block[(rlo - lo) * hd..(rhi - lo) * hd]);
                }
            }
        };
        blocks(0, &mut |i, k, off, ks| {
            let sc = &mut scores[i * per_row..(i + 1) * per_row];
            attn::scores(level, q(i), ks, hd, scale, sc, k.len(), off);
        });
        // softmax with nextok's exp (vectorised, the same bits at every SIMD level), the
        // weights rounded to f16 as llama.cpp multiplies them with the f16 values
        for i in 0..n {
            let len = keys(i).len();
            let (sc, w) = (
                &scores[i * per_row..(i + 1) * per_row],
                &mut weights[i * per_row..(i + 1) * per_row],
            );
            for h in 0..rep {
                softmax_f16(
                    level,
                    &sc[h * len..(h + 1) * len],
                    &mut w[h * len..(h + 1) * len],
                );
            }
            out(i).fill(0.0);
        }
        blocks(1, &mut |i, k, off, vs| {
            let w = &weights[i * per_row..(i + 1) * per_row];
            attn::accumulate(level, w, k.len(), off, vs, hd, out(i));
        });
    })
}

/// [`attend`] for one row (a decode step): reads the cache's keys and values in place,
/// a run of blocks that follow one another in memory at a time, converting them in registers
/// ([`attn::scores_kv`], [`attn::accumulate_kv`]; the same bits as converting each block into
/// a buffer first).
#[allow(clippy::too_many_arguments)]
fn attend_one(
    level: kernels::Level,
    kv: &SeqKv,
    layer: usize,
    g: usize,
    keys: std::ops::Range<usize>,
    q: &[f32],
    out: &mut [f32],
    hd: usize,
    scale: f32,
) {
    ATTN_SCRATCH.with(|cell| {
        let mut cell = cell.borrow_mut();
        let AttnScratch {
            scores,
            weights,
            block,
        } = &mut *cell;
        let rep = q.len() / hd;
        let len = keys.len();
        scores.resize(rep * len, 0.0);
        weights.resize(rep * len, 0.0);
        for_runs(kv, layer, (0, 0), g, &keys, hd, &mut |k, _, off| {
            attn::scores_kv(level, q, k, hd, scale, scores, len, off);
        });
        for h in 0..rep {
            softmax_f16(
                level,
                &scores[h * len..(h + 1) * len],
                &mut weights[h * len..(h + 1) * len],
            );
        }
        // the values column group by column group, in pieces that stay in the L1 cache while
        // the kernel goes over their columns
        let groups = kv.value_groups();
        let cols = hd / groups;
        let acc = block;
        for c in 0..groups {
            acc.clear();
            acc.resize(rep * cols, 0.0);
            values_run(level, kv, layer, (g, c), &keys, weights, cols, acc);
            for (h, o) in out.chunks_exact_mut(hd).enumerate() {
                o[c * cols..(c + 1) * cols].copy_from_slice(&acc[h * cols..(h + 1) * cols]);
            }
        }
    })
}

/// Adds the values of column group `c` of key/value head `g` (`(g, c)`) at the positions
/// `keys`, weighted by `weights` (`rep` heads of `keys.len()`), to `acc` (`rep · cols`), in
/// pieces that stay in the L1 cache while the kernel goes over their columns.
#[allow(clippy::too_many_arguments)]
fn values_run(
    level: kernels::Level,
    kv: &SeqKv,
    layer: usize,
    (g, c): (usize, usize),
    keys: &std::ops::Range<usize>,
    weights: &[f32],
    cols: usize,
    acc: &mut [f32],
) {
    let len = keys.len();
    for_runs(kv, layer, (1, c), g, keys, cols, &mut |v, here, off| {
        // the run's memory (`q8_0`: the quants, the scales left to the hardware prefetcher)
        let run = v.bytes();
        let per_position = run.len() / here.max(1);
        let mut p = 0;
        while p < here {
            let e = (p + VALUES_PIECE).min(here);
            attn::prefetch_ahead(
                run,
                p * per_position,
                (e - p) * per_position,
                attn::VALUES_AHEAD,
            );
            let piece = v.positions(p, e, cols);
            attn::accumulate_kv(level, weights, len, off + p, piece, cols, e - p, cols, acc);
            p = e;
        }
    });
}

/// What [`for_runs`] runs on each run: `f(its values, positions, offset of its first among
/// the keys)`.
type RunFn<'a> = dyn FnMut(KvRun<'_>, usize, usize) + 'a;

/// The keys (`part` `(0, 0)`) or a column group `c` of the values (`(1, c)`) of key/value head
/// `g` in `layer` at the positions `keys` (`cols` values each), a run of blocks that follow one
/// another in memory at a time; the start of each run is asked for into L2 before `f` reads it.
fn for_runs(
    kv: &SeqKv,
    layer: usize,
    (part, c): (usize, usize),
    g: usize,
    keys: &std::ops::Range<usize>,
    cols: usize,
    f: &mut RunFn<'_>,
) {
    let (b0, b1) = (
        keys.start / BLOCK_POSITIONS,
        keys.end.div_ceil(BLOCK_POSITIONS),
    );
    let mut b = b0;
    while b < b1 {
        let (run, nb) = kv.piece_run(b, b1 - b, layer, part, g, c);
        let start = b * BLOCK_POSITIONS;
        let lo = keys.start.max(start);
        let hi = keys.end.min(start + nb * BLOCK_POSITIONS);
        let here = run.positions(lo - start, hi - start, cols);
        // the start of the run, which the kernels' own requests `ahead` bytes ahead skip: the
        // CPU's prefetchers take a while to follow a new run
        let ahead = if part == 0 {
            attn::KEYS_AHEAD
        } else {
            attn::VALUES_AHEAD
        };
        let bytes = here.bytes();
        attn::prefetch_l2(&bytes[..ahead.min(bytes.len())]);
        f(here, hi - lo, lo - keys.start);
        b += nb;
    }
}

/// What [`attend`] runs on each row's part of a converted cache block: `f(row, its keys, the
/// offset of the block's first one among them, its part of the block)`.
type BlockFn<'a> = dyn FnMut(usize, std::ops::Range<usize>, usize, &[f32]) + 'a;

/// The part of cache block `b` inside `keys`: its first and end offsets in the block, and the
/// first one's offset from `keys.start`.
fn block_span(b: usize, keys: &std::ops::Range<usize>) -> (usize, usize, usize) {
    let lo = keys.start.max(b * BLOCK_POSITIONS);
    let hi = keys.end.min((b + 1) * BLOCK_POSITIONS);
    (
        lo - b * BLOCK_POSITIONS,
        hi - b * BLOCK_POSITIONS,
        lo - keys.start,
    )
}

/// Rows a pass's feed-forward takes at a time at most: its gate and up outputs and their
/// activations are the widest buffers of a pass (`n_ff` values a row: 37 MB for 512 rows of
/// a 1.5B model), and slices of this many rows keep them a quarter of that while each weight
/// band still meets a hundred-odd rows. Every row's outputs are the same bits in any slicing.
const FFN_SLICE_ROWS: usize = 128;

/// Positions of values [`attend_one`] gives the kernel at a time (2 KiB of a column group of
/// 32 `f16` values).
const VALUES_PIECE: usize = 32;

/// Rows of one sequence (a prompt's) that attend in one task at most, sharing each block of
/// keys and values converted to `f32`.
const ATTN_GROUP_ROWS: usize = 8;

/// A sequence with at most this many rows in a pass (a decode step, a speculative draft's
/// verification) attends row by row ([`attend_one`], reading the cache in place), each row a
/// task of its own.
const ATTN_ALONE_ROWS: usize = 8;

/// Attention is split ([`Split`]) from this many keys on.
const SPLIT_MIN_KEYS: usize = 256;

/// The value columns one task of a split attention accumulates: one column group of the cache,
/// which it reads as one run.
const SPLIT_COLS: usize = crate::kv::VALUE_COLUMNS;

/// Attention for a few (row, key/value head) units over long key ranges — a decode step at a
/// long context, where one task per unit would leave threads idle (a model with one key/value
/// head has one such task per layer) — split in two parallel steps, computing exactly what
/// [`attend`] computes:
///
/// 1. the scores, in chunks of whole cache blocks (each key's score as [`attend`] computes
///    it); the task that finishes a unit's last chunk then computes each of its query heads'
///    softmax, over its scores gathered in position order;
/// 2. the weighted sum of the values, one column group of the cache (`SPLIT_COLS` columns, one
///    run of memory) per task ([`attn::accumulate_kv`]; each output value sums the same
///    products in the same position order).
///
/// Only when there are fewer units than threads: on a two-vCPU machine, splitting the three
/// units of a SmolLM2 decode step over two threads measured slower than one task per unit, the
/// cache's values in column groups too (docs/performance.md).
struct Split<'a, 'b> {
    level: kernels::Level,
    seqs: &'a [BatchSeq<'b>],
    rows: &'a [(usize, usize)],
    qs: &'a [f32],
    layer: usize,
    nkv: usize,
    rep: usize,
    hd: usize,
    window: Option<usize>,
    scale: f32,
}

impl Split<'_, '_> {
    /// Writes each unit's `rep · hd` outputs at `out + unit · rep · hd` (the layout of the
    /// forward pass's attention output).
    fn run(
        &self,
        units: &mut Vec<(usize, usize, usize)>,
        scores: &mut Vec<f32>,
        weights: &mut Vec<f32>,
        done: &mut Vec<std::sync::atomic::AtomicUsize>,
        out: kernels::OutPtr,
    ) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (rep, hd, nkv) = (self.rep, self.hd, self.nkv);
        units.clear();
        let mut total = 0;
        for &(_, pos) in self.rows {
            let first = self.window.map_or(0, |w| (pos + 1).saturating_sub(w));
            for _ in 0..nkv {
                // each unit's scores and weights start after the units before it
                units.push((first, pos + 1 - first, total));
                total += rep * (pos + 1 - first);
            }
        }
        // every value is written before it is read: grow, never clear
        if scores.len() < total {
            scores.resize(total, 0.0);
            weights.resize(total, 0.0);
        }
        let threads = crate::team::threads();
        let chunks = (4 * threads).div_ceil(units.len()).max(1);
        let blocks = |first: usize, len: usize| {
            (
                first / BLOCK_POSITIONS,
                (first + len).div_ceil(BLOCK_POSITIONS),
            )
        };
        // chunk `c` of unit `u`: cache blocks, and keys (offsets from the unit's first key)
        let chunk = |u: usize, c: usize| {
            let (first, len, _) = units[u];
            let (b0, b1) = blocks(first, len);
            let n = b1 - b0;
            let (c0, c1) = (b0 + n * c / chunks, b0 + n * (c + 1) / chunks);
            let k0 = (c0 * BLOCK_POSITIONS).max(first) - first;
            let k1 = (c1 * BLOCK_POSITIONS).min(first + len).max(first) - first;
            (c0, c1, k0, k1.max(k0))
        };
        let units = &units[..];
        let sp = kernels::OutPtr(scores.as_mut_ptr());
        let wp = kernels::OutPtr(weights.as_mut_ptr());
        // grow, never shrink; every unit's count starts at zero
        if done.len() < units.len() {
            done.resize_with(units.len(), || AtomicUsize::new(0));
        }
        for d in &done[..units.len()] {
            d.store(0, Ordering::Relaxed);
        }
        let done = &done[..units.len()];
        // 1. scores: chunk `c` of unit `u` writes `rep × (k1 − k0)` values (stride `k1 − k0`)
        // at the unit's base `+ rep · k0`; the task that finishes a unit's last chunk computes
        // its heads' softmax into their weights (the unit's base `+ h · len`)
        crate::team::for_each(units.len() * chunks, &|t| {
            let (u, c) = (t / chunks, t % chunks);
            let (_, _, k0, k1) = chunk(u, c);
            let (row, g) = (u / nkv, u % nkv);
            let (first, len, base) = units[u];
            if k1 > k0 {
                let (si, _) = self.rows[row];
                let kv = &*self.seqs[si].kv;
                let q = self.q(row, g);
                // SAFETY: the chunks' ranges are disjoint parts of `scores`, which holds
                // `total` values and outlives this step
                let sc = unsafe {
                    std::slice::from_raw_parts_mut(sp.get().add(base + rep * k0), rep * (k1 - k0))
                };
                let keys = first + k0..first + k1;
                for_runs(kv, self.layer, (0, 0), g, &keys, hd, &mut |k, _, off| {
                    attn::scores_kv(self.level, q, k, hd, self.scale, sc, k1 - k0, off);
                });
            }
            // the last chunk to finish sees every other chunk's scores (acquire of their
            // releases)
            if done[u].fetch_add(1, Ordering::AcqRel) + 1 < chunks {
                return;
            }
            // SAFETY: every chunk of this unit is written and no other task touches its
            // scores or weights in this step
            let (sc, w) = unsafe {
                (
                    std::slice::from_raw_parts(sp.get().add(base), rep * len),
                    std::slice::from_raw_parts_mut(wp.get().add(base), rep * len),
                )
            };
            ATTN_SCRATCH.with(|cell| {
                let mut cell = cell.borrow_mut();
                let gathered = &mut cell.scores;
                gathered.resize(len, 0.0);
                for h in 0..rep {
                    for c in 0..chunks {
                        let (_, _, k0, k1) = chunk(u, c);
                        let n = k1 - k0;
                        gathered[k0..k1]
                            .copy_from_slice(&sc[rep * k0 + h * n..rep * k0 + (h + 1) * n]);
                    }
                    softmax_f16(self.level, gathered, &mut w[h * len..(h + 1) * len]);
                }
            });
        });
        // 2. the values, `SPLIT_COLS` columns (one column group of the cache) per task
        let cols = hd / SPLIT_COLS;
        crate::team::for_each(units.len() * cols, &|t| {
            let (u, cc) = (t / cols, t % cols);
            let (row, g) = (u / nkv, u % nkv);
            let (si, _) = self.rows[row];
            let kv = &*self.seqs[si].kv;
            let (first, len, base) = units[u];
            // SAFETY: the weights are written and no longer change in this step
            let w = unsafe { std::slice::from_raw_parts(wp.get().add(base), rep * len) };
            let c0 = cc * SPLIT_COLS;
            ATTN_SCRATCH.with(|cell| {
                let mut cell = cell.borrow_mut();
                let acc = &mut cell.weights;
                acc.clear();
                acc.resize(rep * SPLIT_COLS, 0.0);
                // the column group's own run of values
                let keys = first..first + len;
                values_run(
                    self.level,
                    kv,
                    self.layer,
                    (g, cc),
                    &keys,
                    w,
                    SPLIT_COLS,
                    acc,
                );
                for h in 0..rep {
                    // SAFETY: `out` holds every unit's `rep · hd` outputs; this task alone
                    // writes columns `c0..c0 + SPLIT_COLS` of this unit's heads
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            acc[h * SPLIT_COLS..].as_ptr(),
                            out.get().add(u * rep * hd + h * hd + c0),
                            SPLIT_COLS,
                        );
                    }
                }
            });
        });
    }

    /// The query heads of `row` that share key/value head `g`.
    fn q(&self, row: usize, g: usize) -> &[f32] {
        let (rep, hd) = (self.rep, self.hd);
        let qd = self.nkv * rep * hd;
        &self.qs[row * qd + g * rep * hd..row * qd + (g + 1) * rep * hd]
    }
}

/// One head's attention weights from its scores: softmax with nextok's exp (vectorised, the
/// same bits at every SIMD level), rounded to f16 as llama.cpp multiplies them with the f16
/// values.
fn softmax_f16(level: Level, sc: &[f32], w: &mut [f32]) {
    let m = sc.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let sum = nextok_core::math::exp_weights(sc, m, w) as f32;
    for x in w.iter_mut() {
        *x /= sum;
    }
    kernels::convert::f16_round(level, w);
}

/// RMSNorm of each `d`-wide row of `x` into `out`, scaled by `w`.
#[inline(always)]
fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32], d: usize) {
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let ss = dot(xr, xr);
        let m = (ss / d as f32 + eps).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = (v / m) * g;
        }
    }
}

/// [`rms_norm_rows`] on the team when the batch is large (the same bits).
fn par_rms_norm_rows(level: Level, x: &[f32], w: &[f32], eps: f32, out: &mut [f32], d: usize) {
    crate::team::for_rows(out, d, &|r0, out| {
        let x = &x[r0 * d..r0 * d + out.len()];
        with_isa!(level, rms_norm_rows(x, w, eps, out, d));
    });
}

/// The residual step after attention or the feed-forward block: `y` normalised in place by
/// `norm` (when the layer has one), then added to `x`; row by row, on the team when the batch
/// is large (the same bits).
fn par_residual(
    level: Level,
    x: &mut [f32],
    y: &mut [f32],
    norm: Option<&[f32]>,
    eps: f32,
    d: usize,
) {
    crate::team::for_rows2(x, d, y, d, 2 * d, &|_, x, y| {
        with_isa!(level, residual_rows(x, y, norm, eps, d));
    });
}

/// [`par_residual`]'s work on a run of rows.
#[inline(always)]
fn residual_rows(x: &mut [f32], y: &mut [f32], norm: Option<&[f32]>, eps: f32, d: usize) {
    if let Some(w) = norm {
        for row in y.chunks_exact_mut(d) {
            rms_norm_in_place(row, w, eps);
        }
    }
    add_in_place(x, y);
}

/// RMSNorm of one vector in place (the same operations as [`rms_norm_rows`]).
#[inline(always)]
fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let ss = dot(x, x);
    let m = (ss / x.len() as f32 + eps).sqrt();
    for (v, &g) in x.iter_mut().zip(w) {
        *v = (*v / m) * g;
    }
}

/// The rotary angles of a run of rows: row `i`'s `half` cosines and sines start at `i · half`.
struct Rotary<'a> {
    cos: &'a [f32],
    sin: &'a [f32],
    half: usize,
    style: RopeStyle,
}

impl Rotary<'_> {
    /// Rotates one head of row `i` of the run.
    #[inline(always)]
    fn apply(&self, i: usize, head: &mut [f32]) {
        let (a, b) = (i * self.half, (i + 1) * self.half);
        rope(self.style, head, &self.cos[a..b], &self.sin[a..b]);
    }
}

/// A run of query rows (`qd` wide, heads `hd` wide) made ready for attention: each head
/// normalised (when the family has query norms), rotated, scaled (when the family scales
/// queries before attention) and rounded to `f16`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn query_rows(
    level: Level,
    q: &mut [f32],
    qd: usize,
    hd: usize,
    rot: &Rotary<'_>,
    norm: Option<&[f32]>,
    eps: f32,
    scale: Option<f32>,
) {
    for (i, q) in q.chunks_exact_mut(qd).enumerate() {
        for head in q.chunks_exact_mut(hd) {
            if let Some(w) = norm {
                rms_norm_in_place(head, w, eps);
            }
            rot.apply(i, head);
            if let Some(k) = scale {
                for v in head.iter_mut() {
                    *v *= k;
                }
            }
            kernels::convert::f16_round(level, head);
        }
    }
}

/// A run of key and value rows (`kvd` wide) made ready for the cache: each key head normalised
/// (when the family has key norms), rotated and rounded to `f16`; the values rounded to `f16`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn key_value_rows(
    level: Level,
    k: &mut [f32],
    v: &mut [f32],
    kvd: usize,
    hd: usize,
    rot: &Rotary<'_>,
    norm: Option<&[f32]>,
    eps: f32,
) {
    for (i, (k, v)) in k
        .chunks_exact_mut(kvd)
        .zip(v.chunks_exact_mut(kvd))
        .enumerate()
    {
        for head in k.chunks_exact_mut(hd) {
            if let Some(w) = norm {
                rms_norm_in_place(head, w, eps);
            }
            rot.apply(i, head);
            kernels::convert::f16_round(level, head);
        }
        kernels::convert::f16_round(level, v);
    }
}

/// The feed-forward block's gate: `gate ← act(gate) · up`, with SiLU, or GGML's tabled GELU when
/// `gelu` holds its table.
#[inline(always)]
fn gated_activation(level: Level, gate: &mut [f32], up: &[f32], gelu: Option<&[f32]>) {
    match gelu {
        None => {
            for (g, u) in gate.iter_mut().zip(up) {
                *g = silu(*g) * *u;
            }
        }
        Some(table) => {
            // the table's index, `f16` bits, converted 64 values at a time
            let mut h = [f16::ZERO; 64];
            for (g, u) in gate.chunks_mut(64).zip(up.chunks(64)) {
                let h = &mut h[..g.len()];
                kernels::convert::f32_to_f16(level, g, h);
                for ((g, u), &h) in g.iter_mut().zip(u).zip(h.iter()) {
                    *g = gelu_f16(table, *g, h) * *u;
                }
            }
        }
    }
}

/// Rotary embedding of one head's first `2 · cos.len()` dimensions (the rest pass through).
#[inline(always)]
fn rope(style: RopeStyle, x: &mut [f32], cos: &[f32], sin: &[f32]) {
    match style {
        RopeStyle::Adjacent => {
            for ((p, &c), &s) in x.chunks_exact_mut(2).zip(cos).zip(sin) {
                let (a, b) = (p[0], p[1]);
                p[0] = a * c - b * s;
                p[1] = a * s + b * c;
            }
        }
        RopeStyle::Halves => {
            let half = cos.len();
            let (lo, hi) = x[..2 * half].split_at_mut(half);
            for (((a, b), &c), &s) in lo.iter_mut().zip(hi.iter_mut()).zip(cos).zip(sin) {
                let (x0, x1) = (*a, *b);
                *a = x0 * c - x1 * s;
                *b = x0 * s + x1 * c;
            }
        }
    }
}

#[inline(always)]
fn silu(x: f32) -> f32 {
    x / (1.0 + nextok_core::math::exp_f32(-x))
}

#[inline(always)]
fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += *b;
    }
}

/// Adds `b` to every `b.len()`-wide row of `x`.
#[inline(always)]
fn add_rows(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        add_in_place(row, b);
    }
}

/// One sequence of a model: shared weights plus this branch's KV cache.
pub struct ModelSource {
    weights: Arc<ModelWeights>,
    kv: SeqKv,
    scratch: Scratch,
    logits: Vec<f32>,
}

impl Clone for ModelSource {
    fn clone(&self) -> Self {
        ModelSource {
            weights: self.weights.clone(),
            kv: self.kv.clone(),
            scratch: Scratch::default(),
            logits: Vec::new(),
        }
    }
}

impl std::fmt::Debug for ModelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelSource")
            .field("len", &self.kv.len())
            .finish()
    }
}

impl ModelSource {
    /// An empty sequence over `weights` (its cache from the weights' default pool).
    pub fn new(weights: Arc<ModelWeights>) -> ModelSource {
        let kv = weights.default_pool().sequence();
        ModelSource {
            weights,
            kv,
            scratch: Scratch::default(),
            logits: Vec::new(),
        }
    }

    /// An empty sequence over `weights` with its cache from `pool` (a pool of another cache
    /// type, say), which must have the weights' shape.
    pub fn with_pool(weights: Arc<ModelWeights>, pool: &KvPool) -> Result<ModelSource> {
        let (want, got) = (weights.kv_geometry(), pool.geometry());
        if (want.n_layer, want.n_kv_head, want.head_dim)
            != (got.n_layer, got.n_kv_head, got.head_dim)
        {
            return Err(ModelError::new(format!(
                "a KV pool of {} layers, {} heads of {} is not this model's ({}, {}, {})",
                got.n_layer,
                got.n_kv_head,
                got.head_dim,
                want.n_layer,
                want.n_kv_head,
                want.head_dim
            ))
            .with_kind(ModelErrorKind::Invalid));
        }
        Ok(ModelSource {
            weights,
            kv: pool.sequence(),
            scratch: Scratch::default(),
            logits: Vec::new(),
        })
    }

    /// The shared weights.
    pub fn weights(&self) -> &Arc<ModelWeights> {
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

impl LogitsSource for ModelSource {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_matches_the_formula_within_f16_rounding() {
        let t = gelu_table();
        for &x in &[-9.5f32, -3.0, -0.5, 0.0, 0.25, 1.0, 2.5, 9.9] {
            let exact = 0.5 * x * (1.0 + (0.797_884_6 * x * (1.0 + 0.044_715 * x * x)).tanh());
            let got = gelu_f16(t, x, f16::from_f32(x));
            assert!(
                (got - exact).abs() <= 2e-3 * exact.abs().max(1.0),
                "{x}: {got} vs {exact}"
            );
        }
        assert_eq!(gelu_f16(t, -11.0, f16::from_f32(-11.0)), 0.0);
        assert_eq!(gelu_f16(t, 12.0, f16::from_f32(12.0)), 12.0);
    }

    #[test]
    fn rope_halves_rotates_pairs_across_the_two_halves() {
        // one pair rotated by 90°: (1, 0) → (0, 1) at dims 0 and 2 of a 4-wide head
        let mut x = [1.0f32, 5.0, 0.0, 7.0];
        rope(RopeStyle::Halves, &mut x[..], &[0.0, 1.0], &[1.0, 0.0]);
        assert_eq!(x, [0.0, 5.0, 1.0, 7.0]);
        let mut y = [1.0f32, 0.0, 5.0, 7.0];
        rope(RopeStyle::Adjacent, &mut y[..], &[0.0, 1.0], &[1.0, 0.0]);
        assert_eq!(y, [0.0, 1.0, 5.0, 7.0]);
    }

    #[test]
    fn rope_angles_follow_ggml_recurrence() {
        let spec = RopeSpec {
            base: 10_000.0,
            scale: 0.5,
            freq_factors: true,
        };
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        rope_angles(&spec, 8, 2, Some(&[1.0, 2.0, 4.0, 8.0]), &mut cos, &mut sin);
        assert_eq!(cos.len(), 4);
        let ts = 10_000f32.powf(-2.0 / 8.0);
        let mut theta = 2.0f32;
        for i in 0..4 {
            let a = 0.5 * (theta / [1.0, 2.0, 4.0, 8.0][i]);
            assert_eq!(cos[i], a.cos());
            assert_eq!(sin[i], a.sin());
            theta *= ts;
        }
    }
}
