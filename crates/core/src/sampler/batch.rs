//! Stepping many rows in parallel.

use rayon::prelude::*;

use super::{Sampler, StepResult};
use crate::error::{Error, ErrorKind, Result};
use crate::state::DecoderState;
use crate::support::Workspace;

/// Per-thread workspaces for batch stepping.
#[derive(Debug)]
pub struct WorkspacePool {
    workspaces: Vec<Workspace>,
}

impl WorkspacePool {
    /// `threads` workspaces for vocabularies of `vocab_size`.
    pub fn new(vocab_size: usize, threads: usize) -> Self {
        WorkspacePool {
            workspaces: (0..threads.max(1))
                .map(|_| Workspace::new(vocab_size))
                .collect(),
        }
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
