//! `qwen3`: Qwen 3 (dense) — no biases, a per-head RMSNorm of queries and keys
//! (`attn_q_norm`, `attn_k_norm`, `head_dim` wide) before the rotation, rotary embeddings on
//! the two halves of each head, and heads that may be wider than `n_embd / n_head`
//! (`attention.key_length`).

use super::{ArchConfig, Md, RopeStyle};
use crate::error::Result;

pub(super) fn configure(_md: &Md<'_>, c: &mut ArchConfig) -> Result<()> {
    c.rope_style = RopeStyle::Halves;
    c.qk_norm = true;
    Ok(())
}
