//! Top-p / nucleus (reference step 9). Rule `descending_prefix` (reference, llama.cpp): order
//! the support by (probability descending, id ascending) and keep the smallest prefix whose
//! cumulative probability is `>= p`, the boundary token included, at least `min_keep` tokens.
//! Rule `ascending_tail` (HF, vLLM): sort ascending and remove tokens while the ascending
//! cumulative probability is `<= 1 − p`, keeping at least `min_keep`. `p ∉ (0, 1]` is rejected;
//! `p = 1` keeps the whole support without computing anything.

use serde::{Deserialize, Serialize};

use super::{v1, Apply, Compile, CompileCtx};
use crate::error::{Error, Result};
use crate::state::DecoderState;
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

impl Compile for TopP {
    const NAME: &'static str = "top_p";
    const VERSION: u32 = VERSION;
    type Compiled = Compiled;

    fn version(&self) -> u32 {
        self.version
    }

    fn compile(&self, field: &str, _ctx: &mut CompileCtx<'_>) -> Result<Compiled> {
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return Err(Error::invalid(
                format!("{field}.top_p"),
                format!("{p} is outside (0, 1]"),
            ));
        }
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
