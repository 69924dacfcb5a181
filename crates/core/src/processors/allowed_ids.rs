//! Allowed-token-ids mask: only the listed ids stay selectable (vLLM `allowed_token_ids`).

use serde::{Deserialize, Serialize};

use super::{check_version, v1, CompileCtx};
use crate::error::{Error, Result};
use crate::support::Workspace;

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

impl AllowedTokenIds {
    pub(crate) fn compile(&self, field: &str, ctx: &mut CompileCtx<'_>) -> Result<Compiled> {
        check_version(field, self.version, VERSION)?;
        if self.token_ids.is_empty() {
            return Err(Error::contradiction(
                format!("{field}.token_ids"),
                "the allowed set is empty, so no token could ever be selected",
            ));
        }
        for (i, &id) in self.token_ids.iter().enumerate() {
            if id as usize >= ctx.vocab.vocab_size {
                return Err(Error::out_of_range(
                    format!("{field}.token_ids[{i}]"),
                    id as u64,
                    ctx.vocab.vocab_size,
                ));
            }
        }
        let mut ids = self.token_ids.clone();
        ids.sort_unstable();
        ids.dedup();
        Ok(Compiled { ids })
    }
}

impl Compiled {
    pub(crate) fn apply(&self, ws: &mut Workspace) {
        ws.retain_ids(&self.ids);
    }
}
