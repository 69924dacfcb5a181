//! `qwen2`: Qwen 2 / 2.5 — llama's block with biases on the Q, K and V projections
//! (`attn_{q,k,v}.bias`, read by the loader whenever a file has them) and rotary embeddings
//! on the two halves of each head.

use super::{ArchConfig, Md, RopeStyle};
use crate::error::Result;

pub(super) fn configure(_md: &Md<'_>, c: &mut ArchConfig) -> Result<()> {
    c.rope_style = RopeStyle::Halves;
    Ok(())
}
