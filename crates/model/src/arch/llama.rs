//! `llama`: Llama 1–3.x and the many files that share its graph (SmolLM2, Mistral-style).
//!
//! Rotary embeddings on adjacent pairs (the GGUF converter permutes Q/K for that layout), a
//! SwiGLU feed-forward, `1 / √head_dim` score scaling. Llama 3.x files carry their `llama3`
//! rope scaling as per-pair frequency factors (`rope_freqs.weight`), which divide the angles.

use super::{ArchConfig, Md, RopeStyle};
use crate::error::Result;

pub(super) fn configure(md: &Md<'_>, c: &mut ArchConfig) -> Result<()> {
    c.rope_style = RopeStyle::Adjacent;
    let factors = md.file().info("rope_freqs.weight").is_some();
    for l in &mut c.layers {
        l.rope.freq_factors = factors;
    }
    Ok(())
}
