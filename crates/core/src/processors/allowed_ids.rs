//! Allowed-token-ids mask: only the listed ids stay selectable (vLLM `allowed_token_ids`).

use serde::{Deserialize, Serialize};

use super::{v1, Apply, Compile, CompileCtx};
use crate::error::{Error, Result};
use crate::state::DecoderState;
use crate::support::Workspace;
use crate::vocab::sorted_ids;
use crate::vocab::VocabInfo;

/// Implementation version.
pub const VERSION: u32 = 1;

/// Config of the allowed-ids mask.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllowedTokenIds {
    /// Processor version.
    #[serde(default = "v1")]
    pub version: u32,
    /// The allowed ids (must be non-empty).
    pub token_ids: Vec<u32>,
}

/// Compiled form: sorted, deduplicated ids.
#[derive(Debug, Clone)]
pub struct Compiled {
    ids: Vec<u32>,
}

impl Compile for AllowedTokenIds {
    const NAME: &'static str = "allowed_token_ids";
    const VERSION: u32 = VERSION;
    type Compiled = Compiled;

    fn version(&self) -> u32 {
        self.version
    }

    fn compile(&self, field: &str, ctx: &mut CompileCtx<'_>) -> Result<Compiled> {
        if self.token_ids.is_empty() {
            return Err(Error::contradiction(
                format!("{field}.token_ids"),
                "the allowed set is empty, so no token could ever be selected",
            ));
        }
        let ids = sorted_ids(
            &format!("{field}.token_ids"),
            &self.token_ids,
            ctx.vocab.vocab_size,
        )?;
        Ok(Compiled { ids })
    }
}

impl Apply for Compiled {
    fn apply(&self, _st: &DecoderState, ws: &mut Workspace, _vocab: &VocabInfo) -> Result<()> {
        ws.retain_ids(&self.ids);
        Ok(())
    }
}
