//! Control/special-token mask (reference step 1): hides the vocabulary's special tokens and any
//! extra listed ids. EOS ids and request stop tokens stay selectable unless listed explicitly.

use serde::{Deserialize, Serialize};

use super::{v1, Apply, Compile, CompileCtx};
use crate::error::Result;
use crate::state::DecoderState;
use crate::support::Workspace;
use crate::vocab::check_ids;
use crate::vocab::VocabInfo;

/// Implementation version.
pub const VERSION: u32 = 1;

/// Config of the special-token mask.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecialTokenMask {
    /// Processor version.
    #[serde(default = "v1")]
    pub version: u32,
    /// Extra token ids to hide (always hidden, even EOS).
    #[serde(default)]
    pub token_ids: Vec<u32>,
}

/// Compiled form: the ids to mask.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub(crate) ids: Vec<u32>,
}

impl Compile for SpecialTokenMask {
    const NAME: &'static str = "special_token_mask";
    const VERSION: u32 = VERSION;
    type Compiled = Compiled;

    fn version(&self) -> u32 {
        self.version
    }

    fn compile(&self, field: &str, ctx: &mut CompileCtx<'_>) -> Result<Compiled> {
        let mut ids: Vec<u32> = ctx
            .vocab
            .special_token_ids
            .iter()
            .copied()
            .filter(|id| !ctx.vocab.eos_token_ids.contains(id) && !ctx.stop_ids.contains(id))
            .collect();
        check_ids(
            &format!("{field}.token_ids"),
            &self.token_ids,
            ctx.vocab.vocab_size,
        )?;
        ids.extend_from_slice(&self.token_ids);
        ids.sort_unstable();
        ids.dedup();
        Ok(Compiled { ids })
    }
}

impl Apply for Compiled {
    fn apply(&self, _st: &DecoderState, ws: &mut Workspace, _vocab: &VocabInfo) -> Result<()> {
        for &id in &self.ids {
            ws.mask(id);
        }
        Ok(())
    }
}

impl Default for SpecialTokenMask {
    fn default() -> Self {
        SpecialTokenMask {
            version: VERSION,
            token_ids: Vec::new(),
        }
    }
}
