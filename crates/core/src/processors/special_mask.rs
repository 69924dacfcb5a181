//! Control/special-token mask (reference step 1): hides the vocabulary's special tokens and any
//! extra listed ids. EOS ids and request stop tokens stay selectable unless listed explicitly.

use serde::{Deserialize, Serialize};

use super::{check_version, v1, CompileCtx};
use crate::error::{Error, Result};
use crate::support::Workspace;

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

impl SpecialTokenMask {
    pub(crate) fn compile(&self, field: &str, ctx: &mut CompileCtx<'_>) -> Result<Compiled> {
        check_version(field, self.version, VERSION)?;
        let mut ids: Vec<u32> = ctx
            .vocab
            .special_token_ids
            .iter()
            .copied()
            .filter(|id| !ctx.vocab.eos_token_ids.contains(id) && !ctx.stop_ids.contains(id))
            .collect();
        for (i, &id) in self.token_ids.iter().enumerate() {
            if id as usize >= ctx.vocab.vocab_size {
                return Err(Error::out_of_range(
                    format!("{field}.token_ids[{i}]"),
                    id as u64,
                    ctx.vocab.vocab_size,
                ));
            }
            ids.push(id);
        }
        ids.sort_unstable();
        ids.dedup();
        Ok(Compiled { ids })
    }
}

impl Compiled {
    pub(crate) fn apply(&self, ws: &mut Workspace) {
        for &id in &self.ids {
            ws.mask(id);
        }
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
