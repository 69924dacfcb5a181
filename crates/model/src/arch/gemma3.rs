//! `gemma3`: Gemma 3 (text), as llama.cpp runs it.
//!
//! * token embeddings multiplied by `√n_embd`;
//! * per-head RMSNorm of queries and keys before the rotation; rotary embeddings on the two
//!   halves of each head;
//! * queries multiplied by `1 / √head_dim` (`1 / √(n_embd / n_head)` for the 62-layer 27B
//!   model) before attention, scores not scaled again;
//! * RMSNorm of the attention output and of the feed-forward output before each residual add
//!   (`post_attention_norm`, `post_ffw_norm`); the GGUF converter has already folded Gemma's
//!   `1 + w` into the norm weights;
//! * GeGLU feed-forward (tanh GELU of the gate times the up projection);
//! * interleaved local and global layers: when the file has `gemma3.attention.sliding_window`,
//!   five of every six layers (`i % 6 < 5`) attend to the last `sliding_window` positions only,
//!   with rotary base 10,000 and no scaling; every sixth layer is global, with the file's
//!   `rope.freq_base` and scaling. The pattern and the local base are llama.cpp's defaults,
//!   used when the file does not carry `attention.sliding_window_pattern` (one flag per layer,
//!   or a period) and `rope.freq_base_swa`, which llama.cpp reads when present;
//! * `final_logit_softcapping`, when the file has it: logits `c · tanh(z / c)`.

use super::{ArchConfig, FfnAct, Md, RopeSpec, RopeStyle};
use crate::error::Result;

/// One layer in this many is global.
const PATTERN: usize = 6;
/// Rotary base of the local layers.
const LOCAL_BASE: f32 = 10_000.0;

pub(super) fn configure(md: &Md<'_>, c: &mut ArchConfig) -> Result<()> {
    c.rope_style = RopeStyle::Halves;
    c.act = FfnAct::GeluTanh;
    c.qk_norm = true;
    c.post_norms = true;
    c.embed_scale = Some((c.n_embd as f32).sqrt());
    c.query_scale = Some(if c.n_layer == 62 {
        1.0 / ((c.n_embd / c.n_head) as f32).sqrt()
    } else {
        1.0 / (c.head_dim as f32).sqrt()
    });
    // what llama.cpp reads when the file carries it: the local layers' pattern (an array of
    // one flag per layer, or `n`: layer `i` is local when `n` is 0 or `i % n < n − 1`) and
    // rotary base, and a soft cap on the output logits
    let local_base = md.opt_f32("rope.freq_base_swa")?.unwrap_or(LOCAL_BASE);
    let softcap = md.opt_f32("final_logit_softcapping")?.unwrap_or(0.0);
    c.final_softcap = (softcap != 0.0).then_some(softcap);
    if let Some(w) = md.opt_usize("attention.sliding_window")? {
        if w > 0 {
            let n_layer = c.layers.len();
            let local: Vec<bool> = match md.opt_bools("attention.sliding_window_pattern") {
                Some(flags) if flags.len() == n_layer => flags.to_vec(),
                Some(flags) => {
                    return Err(md.err(
                        "attention.sliding_window_pattern",
                        format!("{} flags for {n_layer} layers", flags.len()),
                    ))
                }
                None => {
                    let n = md
                        .opt_usize("attention.sliding_window_pattern")?
                        .unwrap_or(PATTERN);
                    (0..n_layer).map(|i| n == 0 || i % n < n - 1).collect()
                }
            };
            for (l, local) in c.layers.iter_mut().zip(local) {
                if local {
                    l.window = Some(w);
                    l.rope = RopeSpec {
                        base: local_base,
                        scale: 1.0,
                        freq_factors: false,
                    };
                }
            }
        }
    }
    Ok(())
}
