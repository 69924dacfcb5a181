//! Min-p: keep tokens whose probability is at least `min_p` times the largest probability,
//! decided as `exp(z_i − m) >= min_p` with `m` the support maximum (no normaliser needed), at
//! least `min_keep` tokens. `min_p ∈ (0, 1]`; `1` keeps the tokens tied with the maximum.

use serde::{Deserialize, Serialize};

use super::top_p::one;
use super::{v1, Apply, Compile, CompileCtx};
use crate::error::{Error, Result};
use crate::kernels::collect_min_p;
use crate::math::exp_f32;
use crate::state::DecoderState;
use crate::support::Workspace;
use crate::vocab::VocabInfo;

/// Implementation version.
pub const VERSION: u32 = 1;

/// Config of min-p.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MinP {
    /// Processor version.
    #[serde(default = "v1")]
    pub version: u32,
    /// Relative threshold in `(0, 1]`.
    pub min_p: f64,
    /// Minimum number of tokens kept (≥ 1).
    #[serde(default = "one")]
    pub min_keep: usize,
}

/// Compiled form.
#[derive(Debug, Clone)]
pub struct Compiled {
    alpha: f64,
    min_keep: usize,
}

/// The range rule of `min_p` (`(0, 1]`); the reason when `x` breaks it.
pub(crate) fn check(x: f64) -> std::result::Result<(), String> {
    if !(x > 0.0 && x <= 1.0) {
        return Err(format!("{x} is outside (0, 1]"));
    }
    Ok(())
}

impl Compile for MinP {
    const NAME: &'static str = "min_p";
    const VERSION: u32 = VERSION;
    type Compiled = Compiled;

    fn version(&self) -> u32 {
        self.version
    }

    fn compile(&self, field: &str, _ctx: &mut CompileCtx<'_>) -> Result<Compiled> {
        let a = self.min_p;
        check(a).map_err(|r| Error::invalid(format!("{field}.min_p"), r))?;
        if self.min_keep == 0 {
            return Err(Error::invalid(
                format!("{field}.min_keep"),
                "must be at least 1",
            ));
        }
        Ok(Compiled {
            alpha: a,
            min_keep: self.min_keep,
        })
    }
}

impl Apply for Compiled {
    const TRUNCATION: bool = true;

    fn apply(&self, _st: &DecoderState, ws: &mut Workspace, _vocab: &VocabInfo) -> Result<()> {
        ws.min_p(self.alpha, self.min_keep);
        Ok(())
    }
}

// The truncation itself, on the step's workspace.

impl Workspace {
    /// Min-p: keeps tokens with `w_i >= alpha` where `w_i = exp(z_i - m)` (i.e. `p_i >= alpha *
    /// p_max`), at least `min_keep`.
    pub(crate) fn min_p(&mut self, alpha: f64, min_keep: usize) {
        if self.dense {
            let m = self.dense_max();
            let lz = crate::math::ln_f64(alpha) as f32 - 1e-3;
            self.cands.clear();
            collect_min_p(self.level(), &self.buf, m, lz, alpha, &mut self.cands);
            if self.cands.len() < min_keep.min(self.dense_count) {
                // rare: fall back to the exact top-min_keep
                self.dense_top_k(min_keep.min(self.dense_count));
            }
            self.dense = false;
            self.sorted = false;
            self.invalidate();
        } else {
            self.sort_canonical();
            let m = self.cands.first().map(|c| c.z).unwrap_or(0.0);
            let mut n = 0;
            while n < self.cands.len()
                && (exp_f32(self.cands[n].z - m) as f64 >= alpha || n < min_keep)
            {
                n += 1;
            }
            if n < self.cands.len() {
                self.cands.truncate(n.max(1));
                self.invalidate();
            }
        }
    }
}
