//! CTRL sign-aware repetition penalty (000 §3.5, second formula): for a token with `c_i > 0`
//! in scope, `z/r` if `z > 0`, else `z·r`. Special tokens are excluded by default.

use serde::{Deserialize, Serialize};

use super::presence_frequency::apply_counted;
use super::{v1, Apply, Compile, CompileCtx, PenaltyScope, StateField};
use crate::error::{Error, Result};
use crate::state::DecoderState;
use crate::support::Workspace;
use crate::vocab::VocabInfo;

/// Implementation version.
pub const VERSION: u32 = 1;

/// The smallest repetition penalty: near 0, `z / r` saturates for ordinary logits and ties
/// every penalised token (the penalty would sample uniformly among them).
pub const MIN_PENALTY: f32 = 0.01;

/// The largest repetition penalty (the mirror of [`MIN_PENALTY`]: `z · r` for negative `z`).
pub const MAX_PENALTY: f32 = 100.0;

/// Config of the repetition penalty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepetitionPenalty {
    /// Processor version.
    #[serde(default = "v1")]
    pub version: u32,
    /// `r > 0`; `r > 1` discourages repeats, `r < 1` encourages them, `1` does nothing.
    pub repetition_penalty: f32,
    /// Counting range (default: prompt + output, as HF and vLLM).
    #[serde(default = "default_scope")]
    pub scope: PenaltyScope,
    /// Whether special tokens are exempt (default true).
    #[serde(default = "crate::processors::presence_frequency::yes")]
    pub exclude_special: bool,
}

fn default_scope() -> PenaltyScope {
    PenaltyScope::PromptAndOutput
}

/// Compiled form.
#[derive(Debug, Clone)]
pub struct Compiled {
    r: f32,
    pub(crate) scope: PenaltyScope,
    exclude_special: bool,
}

/// The range rule of a repetition penalty (`[MIN_PENALTY, MAX_PENALTY]`); the reason when
/// `r` breaks it.
pub(crate) fn check(r: f32) -> std::result::Result<(), String> {
    if !r.is_finite() || !(MIN_PENALTY..=MAX_PENALTY).contains(&r) {
        return Err(format!("{r} must be in [{MIN_PENALTY}, {MAX_PENALTY}]"));
    }
    Ok(())
}

impl Compile for RepetitionPenalty {
    const NAME: &'static str = "repetition_penalty";
    const VERSION: u32 = VERSION;
    type Compiled = Compiled;

    fn version(&self) -> u32 {
        self.version
    }

    fn compile(&self, field: &str, _ctx: &mut CompileCtx<'_>) -> Result<Compiled> {
        let r = self.repetition_penalty;
        check(r).map_err(|e| Error::invalid(format!("{field}.repetition_penalty"), e))?;
        self.scope.validate(field)?;
        Ok(Compiled {
            r,
            scope: self.scope,
            exclude_special: self.exclude_special,
        })
    }
}

impl Apply for Compiled {
    fn reads(&self) -> &'static [StateField] {
        self.scope.reads()
    }

    fn apply(&self, st: &DecoderState, ws: &mut Workspace, vocab: &VocabInfo) -> Result<()> {
        let r = self.r;
        apply_counted(&self.scope, self.exclude_special, st, ws, vocab, |z, c| {
            if c == 0 {
                z
            } else if z > 0.0 {
                z / r
            } else {
                z * r
            }
        });
        Ok(())
    }
}
