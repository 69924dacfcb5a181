//! A logits source that plays back a scripted tree: the logits after a prefix are looked up
//! by the prefix. For tests of everything above the model (beam search, forks, replays).

use std::collections::HashMap;

use crate::error::{ModelError, ModelErrorKind, Result};
use crate::LogitsSource;

/// Logits by context (prompt + generated ids); a context without an entry gets `fallback`.
#[derive(Debug, Clone)]
pub struct ScriptedSource {
    table: std::sync::Arc<HashMap<Vec<u32>, Vec<f32>>>,
    fallback: Vec<f32>,
    ctx: Vec<u32>,
}

impl ScriptedSource {
    /// A source over `table`; every row (and `fallback`) must have the same length.
    pub fn new(table: HashMap<Vec<u32>, Vec<f32>>, fallback: Vec<f32>) -> ScriptedSource {
        ScriptedSource {
            table: std::sync::Arc::new(table),
            fallback,
            ctx: Vec::new(),
        }
    }

    /// Logits whose softmax is `probs` (natural logs; zero probabilities become `-inf`).
    pub fn logits_of(probs: &[f64]) -> Vec<f32> {
        probs
            .iter()
            .map(|&p| {
                if p > 0.0 {
                    p.ln() as f32
                } else {
                    f32::NEG_INFINITY
                }
            })
            .collect()
    }

    fn row(&self) -> Vec<f32> {
        self.table
            .get(&self.ctx)
            .cloned()
            .unwrap_or_else(|| self.fallback.clone())
    }
}

impl LogitsSource for ScriptedSource {
    fn vocab_size(&self) -> usize {
        self.fallback.len()
    }
    fn prefill(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        if ids.is_empty() {
            return Err(
                ModelError::new("prefill needs at least one id").with_kind(ModelErrorKind::Invalid)
            );
        }
        self.ctx.extend_from_slice(ids);
        Ok(self.row())
    }
    fn decode_one(&mut self, token: u32) -> Result<Vec<f32>> {
        self.prefill(&[token])
    }
    fn fork(&self) -> Result<Self> {
        Ok(self.clone())
    }
    fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.ctx.len() {
            return Err(ModelError::new("truncate past the end").with_kind(ModelErrorKind::Invalid));
        }
        self.ctx.truncate(len);
        Ok(())
    }
    fn len(&self) -> usize {
        self.ctx.len()
    }
}
