//! `phi3`: Phi-3 / Phi-3.5 / Phi-4 mini — a fused QKV projection (`attn_qkv`, or separate
//! Q/K/V in some files) and a fused gate/up projection (`ffn_up` holds the gate rows then the
//! up rows; no `ffn_gate`), rotary embeddings on the two halves of each head, queries
//! multiplied by `1 / √head_dim` before attention.
//!
//! As in llama.cpp, a sliding window in the metadata is ignored (Phi-3 files declare one their
//! training did not use the way llama.cpp's window works). Files with LongRoPE factors
//! (`rope_factors_long.weight`, the 128k variants) are refused with an error naming the tensor.

use super::{ArchConfig, Md, RopeStyle};
use crate::error::Result;

pub(super) fn configure(md: &Md<'_>, c: &mut ArchConfig) -> Result<()> {
    c.rope_style = RopeStyle::Halves;
    c.query_scale = Some(1.0 / (c.head_dim as f32).sqrt());
    for t in ["rope_factors_long.weight", "rope_factors_short.weight"] {
        if md.file().info(t).is_some() {
            return Err(md.err(
                "rope.scaling",
                format!("tensor `{t}`: LongRoPE scaling (Phi-3 128k files) is not supported"),
            ));
        }
    }
    Ok(())
}
