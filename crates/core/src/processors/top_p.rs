//! Top-p / nucleus (reference step 9). Rule `descending_prefix` (reference, llama.cpp): order
//! the support by (probability descending, id ascending) and keep the smallest prefix whose
//! cumulative probability is `>= p`, the boundary token included, at least `min_keep` tokens.
//! Rule `ascending_tail` (HF, vLLM): sort ascending and remove tokens while the ascending
//! cumulative probability is `<= 1 − p`, keeping at least `min_keep`. `p ∉ (0, 1]` is rejected;
//! `p = 1` keeps the whole support without computing anything.

use serde::{Deserialize, Serialize};

use super::{v1, Apply, Compile, CompileCtx};
use crate::error::{Error, Result};
use crate::kernels::{prefix_len, Isa};
use crate::math::exp_f32;
use crate::state::DecoderState;
use crate::support::Cand;
use crate::support::Workspace;
use crate::vocab::VocabInfo;

/// Implementation version.
pub const VERSION: u32 = 1;

/// Which engine's top-p rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// Smallest descending prefix with mass `>= p` (reference).
    #[default]
    DescendingPrefix,
    /// Remove the ascending tail with cumulative `<= 1 - p` (HF, vLLM).
    AscendingTail,
}

/// Config of top-p.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopP {
    /// Processor version.
    #[serde(default = "v1")]
    pub version: u32,
    /// Probability mass in `(0, 1]`.
    pub top_p: f64,
    /// Minimum number of tokens kept (≥ 1).
    #[serde(default = "one")]
    pub min_keep: usize,
    /// Rule.
    #[serde(default)]
    pub rule: Rule,
}

pub(crate) fn one() -> usize {
    1
}

/// Compiled form.
#[derive(Debug, Clone)]
pub struct Compiled {
    p: f64,
    min_keep: usize,
    rule: Rule,
}

/// The range rule of `top_p` (`(0, 1]`); the reason when `x` breaks it.
pub(crate) fn check(x: f64) -> std::result::Result<(), String> {
    if !(x > 0.0 && x <= 1.0) {
        return Err(format!("{x} is outside (0, 1]"));
    }
    Ok(())
}

impl Compile for TopP {
    const NAME: &'static str = "top_p";
    const VERSION: u32 = VERSION;
    type Compiled = Compiled;

    fn version(&self) -> u32 {
        self.version
    }

    fn compile(&self, field: &str, _ctx: &mut CompileCtx<'_>) -> Result<Compiled> {
        let p = self.top_p;
        check(p).map_err(|r| Error::invalid(format!("{field}.top_p"), r))?;
        if self.min_keep == 0 {
            return Err(Error::invalid(
                format!("{field}.min_keep"),
                "must be at least 1",
            ));
        }
        Ok(Compiled {
            p,
            min_keep: self.min_keep,
            rule: self.rule,
        })
    }
}

impl Apply for Compiled {
    const TRUNCATION: bool = true;

    fn apply(&self, _st: &DecoderState, ws: &mut Workspace, _vocab: &VocabInfo) -> Result<()> {
        if self.p >= 1.0 {
            return Ok(());
        }
        match self.rule {
            Rule::DescendingPrefix => ws.top_p(self.p, self.min_keep),
            Rule::AscendingTail => ws.top_p_ascending(self.p, self.min_keep),
        }
        Ok(())
    }
}

// The truncation itself, on the step's workspace.

impl Workspace {
    /// Top-p (reference rule): the smallest prefix in canonical order whose cumulative
    /// probability is `>= p`, at least `min_keep` long. `0 < p < 1`.
    pub(crate) fn top_p(&mut self, p: f64, min_keep: usize) {
        if self.dense {
            self.dense_top_p(p, min_keep);
        } else {
            let (m, s) = self.normalize();
            let n = sparse_prefix(self.level(), &self.cands, m, s, p, min_keep);
            if n < self.cands.len() {
                self.cands.truncate(n);
                self.invalidate();
            }
        }
    }

    /// HF/vLLM top-p rule: sort ascending, remove the tokens whose ascending cumulative
    /// probability is `<= 1 - p`, always keeping the `min_keep` most probable.
    pub(crate) fn top_p_ascending(&mut self, p: f64, min_keep: usize) {
        self.make_sparse();
        let (m, s) = self.normalize(); // sorts canonical (descending)
        let n = self.cands.len();
        let mut removed = 0usize;
        // compared in weight space, `Σ_tail w_i <= (1 − p)·S`, not as a sum of quotients
        // `w_i / S`: the weights are exact `f32` values, so at an exact boundary (18 equal
        // weights, p = 0.5: a tail of 9 holds exactly half) every partial sum and the bound
        // are exact and the comparison is exact arithmetic's, where summing quotients rounds
        // 9 × (1/18) above 0.5 and keeps one token too many
        let bound = (1.0 - p) * s;
        let mut cum = 0.0f64;
        for c in self.cands.iter().rev() {
            cum += exp_f32(c.z - m) as f64;
            if cum <= bound {
                removed += 1;
            } else {
                break;
            }
        }
        let keep = (n - removed).max(min_keep.min(n)).max(1);
        if keep < n {
            self.cands.truncate(keep);
            self.invalidate();
        }
    }
}

/// Returns the smallest `n >= max(1, min_keep)` such that the canonical-order cumulative
/// probability of the first `n` is `>= p` (or all of them).
fn sparse_prefix(level: Isa, c: &[Cand], m: f32, s: f64, p: f64, min_keep: usize) -> usize {
    prefix_len(level, c, m, s, p, min_keep).unwrap_or(c.len())
}
