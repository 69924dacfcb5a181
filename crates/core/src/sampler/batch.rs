//! Stepping many rows in parallel.

use rayon::prelude::*;

use super::{Sampler, StepResult};
use crate::error::{Error, ErrorKind, Result};
use crate::state::DecoderState;
use crate::support::Workspace;

/// Per-thread workspaces for stepping many rows at once. A workspace holds nothing from one
/// step to the next (the same bits whichever row used it before), so a batch needs as many as
/// step at once, not one per sequence; each holds several vocabulary-sized buffers.
#[derive(Debug)]
pub struct WorkspacePool {
    vocab_size: usize,
    workspaces: Vec<Workspace>,
}

impl WorkspacePool {
    /// `threads` workspaces for vocabularies of `vocab_size`.
    pub fn new(vocab_size: usize, threads: usize) -> Self {
        let mut pool = WorkspacePool::lazy(vocab_size);
        pool.lend(threads);
        pool
    }

    /// No workspace until [`WorkspacePool::lend`] asks for some.
    pub fn lazy(vocab_size: usize) -> Self {
        WorkspacePool {
            vocab_size,
            workspaces: Vec::new(),
        }
    }

    /// `n` workspaces (at least one), the pool grown to `n` when it holds fewer (once, as a
    /// batch first reaches that many groups).
    pub fn lend(&mut self, n: usize) -> &mut [Workspace] {
        let n = n.max(1);
        if self.workspaces.len() < n {
            let v = self.vocab_size;
            self.workspaces.resize_with(n, || Workspace::new(v));
        }
        &mut self.workspaces[..n]
    }
}

impl Sampler {
    /// Steps many rows in parallel. `logits` holds `states.len()` rows of `vocab_size` values;
    /// `out[i]` receives row `i`'s result. Each row's result is identical to stepping it alone:
    /// rows share nothing but read-only pipeline data, and each draws from its own stream.
    pub fn step_batch(
        &self,
        logits: &[f32],
        states: &mut [DecoderState],
        pool: &mut WorkspacePool,
        out: &mut [Result<StepResult>],
    ) -> Result<()> {
        let v = self.vocab.vocab_size;
        if logits.len() != states.len() * v {
            return Err(ErrorKind::VocabSizeMismatch {
                expected: states.len() * v,
                got: logits.len(),
            }
            .into());
        }
        if out.len() != states.len() {
            return Err(Error::invalid(
                "out",
                format!("has {} slots for {} rows", out.len(), states.len()),
            ));
        }
        let n = states.len();
        if n == 0 {
            return Ok(());
        }
        let threads = pool.workspaces.len();
        let per = n.div_ceil(threads);
        states
            .par_chunks_mut(per)
            .zip(out.par_chunks_mut(per))
            .zip(logits.par_chunks(per * v))
            .zip(pool.workspaces.par_iter_mut())
            .for_each(|(((sts, outs), rows), ws)| {
                for ((st, o), row) in sts
                    .iter_mut()
                    .zip(outs.iter_mut())
                    .zip(rows.chunks_exact(v))
                {
                    *o = self.step(row, st, ws);
                }
            });
        Ok(())
    }
}
