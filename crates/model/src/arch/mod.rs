//! Model families: what each GGUF architecture's metadata means, as one [`ArchConfig`] that
//! the shared forward pass ([`crate::transformer`]) runs.
//!
//! A family is one file here (its metadata keys, the defaults llama.cpp applies for values the
//! file does not carry, and the features it turns on) plus one arm in [`Arch::config`]. The
//! tensors are named as GGUF names them for every family (`blk.N.attn_q.weight`, ...); which of
//! the optional ones a layer has (biases, Q/K norms, post-norms, fused projections) is read from
//! the file and checked against the family's features by the loader.
//!
//! | family | rotary pairs | feed-forward | extras |
//! |---|---|---|---|
//! | `llama` (incl. Llama 3) | adjacent | SwiGLU | `rope_freqs` factors, linear scaling |
//! | `qwen2` | halves | SwiGLU | Q/K/V biases |
//! | `qwen3` | halves | SwiGLU | per-head Q/K RMSNorm |
//! | `gemma3` | halves | GeGLU (tanh) | √d embedding scale, Q/K norms, post-norms, sliding-window layers |
//! | `phi3` | halves | SwiGLU (fused gate/up) | fused QKV |

mod gemma3;
mod llama;
mod phi3;
mod qwen2;
mod qwen3;

use nextok_vocab::gguf::Value;

use crate::error::{ModelError, ModelErrorKind, Result};
use crate::file::GgufFile;

/// A model family nextok runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arch {
    /// `llama`: Llama 1–3.x, SmolLM2, Mistral-style files.
    Llama,
    /// `qwen2`: Qwen 2 / 2.5.
    Qwen2,
    /// `qwen3`: Qwen 3 (dense).
    Qwen3,
    /// `gemma3`: Gemma 3 (text).
    Gemma3,
    /// `phi3`: Phi-3 / Phi-3.5 / Phi-4 mini (without LongRoPE factors).
    Phi3,
}

impl Arch {
    /// Every family, in the order of the table above.
    pub const ALL: [Arch; 5] = [
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Gemma3,
        Arch::Phi3,
    ];

    /// The `general.architecture` value.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
            Arch::Phi3 => "phi3",
        }
    }

    /// The family of a `general.architecture` value.
    pub fn from_name(s: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == s)
    }

    /// The family of `f` (`general.architecture`), or an error naming the key.
    pub fn of(f: &GgufFile) -> Result<Arch> {
        let name = f
            .get("general.architecture")
            .and_then(Value::as_str)
            .ok_or_else(|| md_err(f, "general.architecture", "is missing".into()))?;
        Arch::from_name(name).ok_or_else(|| {
            let all: Vec<&str> = Arch::ALL.iter().map(|a| a.name()).collect();
            md_err(
                f,
                "general.architecture",
                format!("`{name}` is not supported (supported: {})", all.join(", ")),
            )
        })
    }

    /// The hyper-parameters and features of `f`, a file of this family. Vocabulary size and
    /// feed-forward width are filled in by the loader from the tensors.
    pub fn config(self, f: &GgufFile) -> Result<ArchConfig> {
        let md = Md { f, arch: self };
        let mut c = base(&md)?;
        match self {
            Arch::Llama => llama::configure(&md, &mut c)?,
            Arch::Qwen2 => qwen2::configure(&md, &mut c)?,
            Arch::Qwen3 => qwen3::configure(&md, &mut c)?,
            Arch::Gemma3 => gemma3::configure(&md, &mut c)?,
            Arch::Phi3 => phi3::configure(&md, &mut c)?,
        }
        c.validate(&md)?;
        Ok(c)
    }
}

/// How rotary embeddings pair the dimensions of a head (GGML's rope modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Dimensions `2i` and `2i + 1` (GGML "normal"; llama's GGUF Q/K weights are permuted
    /// for it).
    Adjacent,
    /// Dimensions `i` and `i + n_rot / 2` (GGML "neox").
    Halves,
}

/// The gate's activation in the gated feed-forward `act(gate) · up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnAct {
    /// SiLU (SwiGLU).
    Silu,
    /// GELU, tanh approximation, as GGML computes it: the input rounded to `f16`, the result
    /// looked up in a table of `f16` values (GeGLU).
    GeluTanh,
}

/// Rotary embedding frequencies of a layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeSpec {
    /// Base frequency.
    pub base: f32,
    /// Position scale (linear scaling: `1 / factor`).
    pub scale: f32,
    /// Whether the file's per-pair frequency factors (`rope_freqs.weight`) divide the angles.
    pub freq_factors: bool,
}

/// Attention settings of one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerSpec {
    /// Sliding window: a query at position `p` sees keys at `p - window < q ≤ p`; `None`: all.
    pub window: Option<usize>,
    /// Its rotary frequencies.
    pub rope: RopeSpec,
}

/// Everything the shared forward pass needs to know about a model.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchConfig {
    /// The family.
    pub arch: Arch,
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Embedding width.
    pub n_embd: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention).
    pub n_kv_head: usize,
    /// Width of one head (keys, values and queries).
    pub head_dim: usize,
    /// Rotated dimensions of each head (the first `n_rot`; `≤ head_dim`, even).
    pub n_rot: usize,
    /// Feed-forward width (from the tensors).
    pub n_ff: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// The longest sequence this model runs.
    pub context_length: usize,
    /// Rows of the output matrix (from the tensors).
    pub vocab_size: usize,
    /// Rotary pairing.
    pub rope_style: RopeStyle,
    /// Per layer: window and rotary frequencies.
    pub layers: Vec<LayerSpec>,
    /// `Some(s)`: queries are multiplied by `s` before attention and scores are not scaled
    /// (Gemma, Phi-3); `None`: scores are scaled by `1 / √head_dim` (llama, Qwen).
    pub query_scale: Option<f32>,
    /// Multiplies the token embeddings (Gemma: `√n_embd`).
    pub embed_scale: Option<f32>,
    /// `Some(c)`: the output logits are soft-capped, `c · tanh(z / c)` (Gemma 3 files that carry
    /// `final_logit_softcapping`).
    pub final_softcap: Option<f32>,
    /// Feed-forward activation.
    pub act: FfnAct,
    /// Per-head RMSNorm of queries and keys before rotation (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// RMSNorm of the attention and feed-forward outputs before the residual add
    /// (`post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
}

impl ArchConfig {
    /// Width of all query heads together.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of all key (or value) heads together.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
    }

    /// The distinct rotary settings of the layers, and each layer's index into them.
    pub fn rope_tables(&self) -> (Vec<RopeSpec>, Vec<usize>) {
        let mut specs: Vec<RopeSpec> = Vec::new();
        let idx = self
            .layers
            .iter()
            .map(|l| match specs.iter().position(|s| *s == l.rope) {
                Some(i) => i,
                None => {
                    specs.push(l.rope);
                    specs.len() - 1
                }
            })
            .collect();
        (specs, idx)
    }

    fn validate(&self, md: &Md<'_>) -> Result<()> {
        let (nh, nkv, hd) = (self.n_head, self.n_kv_head, self.head_dim);
        if nh == 0 || nkv == 0 || !nh.is_multiple_of(nkv) {
            return Err(md.err(
                "attention.head_count_kv",
                format!("{nkv} key/value heads for {nh} query heads (must divide them)"),
            ));
        }
        if hd == 0 || !hd.is_multiple_of(2) || hd > 4096 {
            return Err(md.err(
                "attention.key_length",
                format!("head width {hd} (must be even, 2 to 4096)"),
            ));
        }
        if self.n_rot == 0 || !self.n_rot.is_multiple_of(2) || self.n_rot > hd {
            return Err(md.err(
                "rope.dimension_count",
                format!("{} rotated dimensions for heads of {hd}", self.n_rot),
            ));
        }
        if self.n_embd == 0 || nh.checked_mul(hd).is_none_or(|q| q > 1 << 20) {
            return Err(md.err(
                "embedding_length",
                format!("embedding {}, {nh} heads of {hd}", self.n_embd),
            ));
        }
        if self.context_length == 0 || self.context_length > crate::MAX_CONTEXT {
            return Err(md.err(
                "context_length",
                format!(
                    "{} (nextok runs 1 to {} positions)",
                    self.context_length,
                    crate::MAX_CONTEXT
                ),
            ));
        }
        if !self.rms_eps.is_finite() || self.rms_eps < 0.0 {
            return Err(md.err(
                "attention.layer_norm_rms_epsilon",
                format!("{}", self.rms_eps),
            ));
        }
        for l in &self.layers {
            let ok = |x: f32| x.is_finite() && x > 0.0;
            if !ok(l.rope.base) || !ok(l.rope.scale) {
                return Err(md.err(
                    "rope.freq_base",
                    format!("base {}, scale {}", l.rope.base, l.rope.scale),
                ));
            }
            if l.window == Some(0) {
                return Err(md.err("attention.sliding_window", "0".into()));
            }
        }
        for s in [self.query_scale, self.embed_scale].into_iter().flatten() {
            if !s.is_finite() {
                return Err(md.err("attention.key_length", format!("scale {s}")));
            }
        }
        if let Some(c) = self.final_softcap {
            if !c.is_finite() || c <= 0.0 {
                return Err(md.err("final_logit_softcapping", format!("{c}")));
            }
        }
        Ok(())
    }
}

fn md_err(f: &GgufFile, key: &str, msg: String) -> ModelError {
    ModelError::new(format!(
        "{}: GGUF metadata `{key}`: {msg}",
        f.path().display()
    ))
    .with_kind(ModelErrorKind::Format)
}

/// Metadata of one family: keys are `{arch}.{key}`.
pub(crate) struct Md<'a> {
    f: &'a GgufFile,
    arch: Arch,
}

impl Md<'_> {
    fn full(&self, key: &str) -> String {
        format!("{}.{key}", self.arch.name())
    }

    /// An error naming `{arch}.{key}`.
    pub(crate) fn err(&self, key: &str, msg: String) -> ModelError {
        md_err(self.f, &self.full(key), msg)
    }

    fn value(&self, key: &str) -> Option<&Value> {
        self.f.get(&self.full(key))
    }

    /// An unsigned integer (also accepted: an array whose elements are all equal, as some
    /// converters write per-layer head counts).
    pub(crate) fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        let Some(v) = self.value(key) else {
            return Ok(None);
        };
        let n = match v {
            Value::Array(a) => {
                let all = a.to_i64s().unwrap_or_default();
                match all.first() {
                    Some(&x) if all.iter().all(|&y| y == x) => Some(x as i128),
                    _ => None,
                }
            }
            v => v.as_int(),
        };
        match n.and_then(|n| usize::try_from(n).ok()) {
            Some(n) => Ok(Some(n)),
            None => Err(self.err(key, format!("{v:?} is not a non-negative integer"))),
        }
    }

    /// A required unsigned integer.
    pub(crate) fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?
            .ok_or_else(|| self.err(key, "is missing".into()))
    }

    /// A float.
    pub(crate) fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::F32(x)) => Ok(Some(*x)),
            Some(Value::F64(x)) => Ok(Some(*x as f32)),
            Some(v) => match v.as_int() {
                Some(i) => Ok(Some(i as f32)),
                None => Err(self.err(key, format!("{v:?} is not a number"))),
            },
        }
    }

    /// An array of booleans (`None` when the key is absent or holds something else).
    pub(crate) fn opt_bools(&self, key: &str) -> Option<&[bool]> {
        match self.value(key) {
            Some(Value::Array(nextok_vocab::gguf::Array::Bool(b))) => Some(b),
            _ => None,
        }
    }

    /// A string.
    pub(crate) fn opt_str(&self, key: &str) -> Option<&str> {
        self.value(key).and_then(Value::as_str)
    }

    /// The file.
    pub(crate) fn file(&self) -> &GgufFile {
        self.f
    }
}

/// What every family shares: the llama-style keys and llama.cpp's defaults for them.
fn base(md: &Md<'_>) -> Result<ArchConfig> {
    let n_layer = md.usize("block_count")?;
    // every layer has tensors: a block count above the tensor count is corrupt metadata
    if n_layer == 0 || n_layer > md.file().tensor_count() {
        return Err(md.err(
            "block_count",
            format!("{n_layer} blocks for {} tensors", md.file().tensor_count()),
        ));
    }
    let n_embd = md.usize("embedding_length")?;
    let n_head = md.usize("attention.head_count")?;
    let n_kv_head = md.opt_usize("attention.head_count_kv")?.unwrap_or(n_head);
    if n_head == 0 {
        return Err(md.err("attention.head_count", "0".into()));
    }
    let head_dim = match md.opt_usize("attention.key_length")? {
        Some(k) => k,
        None => n_embd / n_head,
    };
    if let Some(v) = md.opt_usize("attention.value_length")? {
        if v != head_dim {
            return Err(md.err(
                "attention.value_length",
                format!("{v}, keys are {head_dim} wide (different widths are not supported)"),
            ));
        }
    }
    let n_rot = md.opt_usize("rope.dimension_count")?.unwrap_or(head_dim);
    let rms_eps = md
        .opt_f32("attention.layer_norm_rms_epsilon")?
        .unwrap_or(1e-5);
    let context_length = md.opt_usize("context_length")?.unwrap_or(2048);
    let base = md.opt_f32("rope.freq_base")?.unwrap_or(10_000.0);
    let scale = rope_scale(md)?;
    Ok(ArchConfig {
        arch: md.arch,
        n_layer,
        n_embd,
        n_head,
        n_kv_head,
        head_dim,
        n_rot,
        n_ff: 0,
        rms_eps,
        context_length,
        vocab_size: 0,
        rope_style: RopeStyle::Adjacent,
        layers: vec![
            LayerSpec {
                window: None,
                rope: RopeSpec {
                    base,
                    scale,
                    freq_factors: false,
                },
            };
            n_layer
        ],
        query_scale: None,
        embed_scale: None,
        final_softcap: None,
        act: FfnAct::Silu,
        qk_norm: false,
        post_norms: false,
    })
}

/// The position scale from `rope.scaling.*` / `rope.scale_linear` (llama.cpp's reading):
/// `none` and `linear` are supported; YaRN and LongRoPE scaling are errors naming the key.
fn rope_scale(md: &Md<'_>) -> Result<f32> {
    let mut factor = md.opt_f32("rope.scale_linear")?.unwrap_or(0.0);
    if let Some(f) = md.opt_f32("rope.scaling.factor")? {
        factor = f;
    }
    match md.opt_str("rope.scaling.type") {
        None | Some("none") | Some("linear") => {}
        Some(other) => {
            return Err(md.err(
                "rope.scaling.type",
                format!("`{other}` is not supported (none and linear are)"),
            ))
        }
    }
    if md.opt_str("rope.scaling.type") == Some("none") || factor == 0.0 {
        return Ok(1.0);
    }
    if !factor.is_finite() || factor <= 0.0 {
        return Err(md.err("rope.scaling.factor", format!("{factor}")));
    }
    Ok(1.0 / factor)
}
