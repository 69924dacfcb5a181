//! Grammar mask (reference step 3): keeps only the tokens the sequence's constraint allows,
//! `A(q_t)` of 000 §3.4 — the tokens whose bytes keep the output a prefix of some legal output
//! (EOS only where the constraint accepts). The constraint state lives in the decoder state's
//! grammar slot; without one attached the processor does nothing. If a pipeline puts a
//! truncation before this mask and nothing legal is left, the step fails with the constraint
//! error of 000 §3.12 (empty support after `grammar_mask`), never a silent resample.

use serde::{Deserialize, Serialize};

use super::{v1, Apply, Compile, CompileCtx, StateField};
use crate::error::Result;
use crate::state::DecoderState;
use crate::support::Workspace;
use crate::vocab::VocabInfo;

/// Implementation version.
pub const VERSION: u32 = 1;

/// Config of the grammar mask.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrammarMask {
    /// Processor version.
    #[serde(default = "v1")]
    pub version: u32,
}

/// Compiled form.
#[derive(Debug, Clone)]
pub struct Compiled;

impl Compile for GrammarMask {
    const NAME: &'static str = "grammar_mask";
    const VERSION: u32 = VERSION;
    type Compiled = Compiled;

    fn version(&self) -> u32 {
        self.version
    }

    fn compile(&self, _field: &str, _ctx: &mut CompileCtx<'_>) -> Result<Compiled> {
        Ok(Compiled)
    }
}

impl Apply for Compiled {
    fn reads(&self) -> &'static [StateField] {
        &[StateField::GrammarState]
    }

    fn apply(&self, st: &DecoderState, ws: &mut Workspace, _vocab: &VocabInfo) -> Result<()> {
        let Some(g) = st.grammar.as_ref().filter(|g| g.active) else {
            return Ok(());
        };
        let v = ws.vocab_size();
        g.with_mask(v, |m| ws.retain_ids(&m.allowed))?;
        Ok(())
    }
}

impl Default for GrammarMask {
    fn default() -> Self {
        GrammarMask { version: VERSION }
    }
}
