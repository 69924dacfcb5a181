//! Locally typical truncation: with `H` the entropy of the current support distribution, order
//! tokens by `|−log p_i − H|` ascending (ties → lower id) and keep the smallest prefix whose
//! cumulative probability is `>= typical_p`, at least `min_keep`. `keep_ties` also keeps tokens
//! tied with the last kept deviation (HF). `typical_p ∈ (0, 1]`; `1` keeps everything.
//! On a dense (untruncated) support this needs every probability and a sort of the support.

use serde::{Deserialize, Serialize};

use super::top_p::one;
use super::{v1, Apply, Compile, CompileCtx};
use crate::error::{Error, Result};
use crate::math::{self, exp_f32};
use crate::state::DecoderState;
use crate::support::Cand;
use crate::support::Workspace;
use crate::vocab::VocabInfo;

/// Implementation version.
pub const VERSION: u32 = 1;

/// Config of typical-p.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypicalP {
    /// Processor version.
    #[serde(default = "v1")]
    pub version: u32,
    /// Mass in `(0, 1]`.
    pub typical_p: f64,
    /// Minimum number of tokens kept (≥ 1).
    #[serde(default = "one")]
    pub min_keep: usize,
    /// Keep tokens tied with the last kept deviation.
    #[serde(default)]
    pub keep_ties: bool,
}

/// Compiled form.
#[derive(Debug, Clone)]
pub struct Compiled {
    tau: f64,
    min_keep: usize,
    keep_ties: bool,
}

/// The range rule of `typical_p` (`(0, 1]`); the reason when `x` breaks it.
pub(crate) fn check(x: f64) -> std::result::Result<(), String> {
    if !(x > 0.0 && x <= 1.0) {
        return Err(format!("{x} is outside (0, 1]"));
    }
    Ok(())
}

impl Compile for TypicalP {
    const NAME: &'static str = "typical_p";
    const VERSION: u32 = VERSION;
    type Compiled = Compiled;

    fn version(&self) -> u32 {
        self.version
    }

    fn compile(&self, field: &str, _ctx: &mut CompileCtx<'_>) -> Result<Compiled> {
        let t = self.typical_p;
        check(t).map_err(|r| Error::invalid(format!("{field}.typical_p"), r))?;
        if self.min_keep == 0 {
            return Err(Error::invalid(
                format!("{field}.min_keep"),
                "must be at least 1",
            ));
        }
        Ok(Compiled {
            tau: t,
            min_keep: self.min_keep,
            keep_ties: self.keep_ties,
        })
    }
}

impl Apply for Compiled {
    const TRUNCATION: bool = true;

    fn apply(&self, _st: &DecoderState, ws: &mut Workspace, _vocab: &VocabInfo) -> Result<()> {
        if self.tau < 1.0 {
            ws.typical(self.tau, self.min_keep, self.keep_ties);
        }
        Ok(())
    }
}

// The truncation itself, on the step's workspace.

impl Workspace {
    /// Typical-p: order by `|−log p_i − H|` ascending (ties → lower id), keep the smallest prefix
    /// whose cumulative probability is `>= tau` (at least `min_keep`); with `keep_ties`, also every
    /// token tied with the last kept deviation (HF).
    pub(crate) fn typical(&mut self, tau: f64, min_keep: usize, keep_ties: bool) {
        self.make_sparse();
        let (m, s) = self.normalize();
        let ln_s = math::ln_f64(s);
        // entropy H = -sum p log p
        let mut h = 0.0f64;
        for c in &self.cands {
            let lp = (c.z - m) as f64 - ln_s;
            let p = exp_f32(c.z - m) as f64 / s;
            if p > 0.0 {
                h -= p * lp;
            }
        }
        self.tscratch.clear();
        for c in &self.cands {
            let lp = (c.z - m) as f64 - ln_s;
            self.tscratch.push(((-lp - h).abs(), c.id, c.z));
        }
        let idx = &mut self.tscratch;
        idx.sort_unstable_by(|a, b| {
            a.0.partial_cmp(&b.0)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(a.1.cmp(&b.1))
        });
        let mut cum = 0.0f64;
        let mut n = 0usize;
        for &(_, _, z) in idx.iter() {
            cum += exp_f32(z - m) as f64 / s;
            n += 1;
            if cum >= tau && n >= min_keep {
                break;
            }
        }
        if keep_ties {
            while n < idx.len() && idx[n].0 == idx[n - 1].0 {
                n += 1;
            }
        }
        if n < idx.len() {
            self.cands.clear();
            for &(_, id, z) in &idx[..n] {
                self.cands.push(Cand { id, z });
            }
            self.sorted = false;
            self.invalidate();
        }
    }
}
