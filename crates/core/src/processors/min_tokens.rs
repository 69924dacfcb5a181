//! Minimum-length EOS mask (reference step 2): while fewer than `min_tokens` output tokens exist,
//! EOS ids and request stop-token ids are hidden.

use serde::{Deserialize, Serialize};

use super::{v1, Apply, Compile, CompileCtx, StateField};
use crate::error::Result;
use crate::state::DecoderState;
use crate::support::Workspace;
use crate::vocab::VocabInfo;

/// Implementation version.
pub const VERSION: u32 = 1;

/// Config of the min-length mask.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MinTokens {
    /// Processor version.
    #[serde(default = "v1")]
    pub version: u32,
    /// Output tokens required before EOS/stop tokens may be selected.
    pub min_tokens: u64,
}

/// Compiled form.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub(crate) min_tokens: u64,
    pub(crate) ids: Vec<u32>,
}

impl Compile for MinTokens {
    const NAME: &'static str = "min_tokens";
    const VERSION: u32 = VERSION;
    type Compiled = Compiled;

    fn version(&self) -> u32 {
        self.version
    }

    fn compile(&self, _field: &str, ctx: &mut CompileCtx<'_>) -> Result<Compiled> {
        let mut ids: Vec<u32> = ctx
            .vocab
            .eos_token_ids
            .iter()
            .chain(ctx.stop_ids.iter())
            .copied()
            .collect();
        ids.sort_unstable();
        ids.dedup();
        Ok(Compiled {
            min_tokens: self.min_tokens,
            ids,
        })
    }
}

impl Apply for Compiled {
    fn reads(&self) -> &'static [StateField] {
        &[StateField::StepIndex]
    }

    fn apply(&self, st: &DecoderState, ws: &mut Workspace, _vocab: &VocabInfo) -> Result<()> {
        if (st.selected_ids.len() as u64) < self.min_tokens {
            for &id in &self.ids {
                ws.mask(id);
            }
        }
        Ok(())
    }
}
