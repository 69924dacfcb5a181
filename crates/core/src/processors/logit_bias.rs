//! Logit bias: `z'_i = z_i + b_i` for listed token ids (OpenAI `logit_bias`, range `[-100, 100]`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{v1, Apply, Compile, CompileCtx};
use crate::error::{Error, Result};
use crate::state::DecoderState;
use crate::support::Workspace;
use crate::vocab::VocabInfo;

/// Implementation version.
pub const VERSION: u32 = 1;

/// Config of the logit bias.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogitBias {
    /// Processor version.
    #[serde(default = "v1")]
    pub version: u32,
    /// Token id → bias added to its logit (JSON object keys are the ids as strings).
    #[serde(with = "id_map")]
    pub logit_bias: BTreeMap<u32, f32>,
}

/// Compiled form: `(id, bias)` sorted by id.
#[derive(Debug, Clone)]
pub struct Compiled {
    list: Vec<(u32, f32)>,
}

/// The range rule of one bias (`[-100, 100]`); the reason when `b` breaks it.
pub(crate) fn check(b: f32) -> std::result::Result<(), String> {
    if !b.is_finite() || !(-100.0..=100.0).contains(&b) {
        return Err(format!("{b} is outside [-100, 100]"));
    }
    Ok(())
}

impl Compile for LogitBias {
    const NAME: &'static str = "logit_bias";
    const VERSION: u32 = VERSION;
    type Compiled = Compiled;

    fn version(&self) -> u32 {
        self.version
    }

    fn compile(&self, field: &str, ctx: &mut CompileCtx<'_>) -> Result<Compiled> {
        let mut list = Vec::with_capacity(self.logit_bias.len());
        for (&id, &b) in &self.logit_bias {
            if id as usize >= ctx.vocab.vocab_size {
                return Err(Error::out_of_range(
                    format!("{field}.logit_bias[{id}]"),
                    id as u64,
                    ctx.vocab.vocab_size,
                ));
            }
            check(b).map_err(|r| Error::invalid(format!("{field}.logit_bias[{id}]"), r))?;
            list.push((id, b));
        }
        Ok(Compiled { list })
    }
}

impl Apply for Compiled {
    fn apply(&self, _st: &DecoderState, ws: &mut Workspace, _vocab: &VocabInfo) -> Result<()> {
        if ws.is_dense() || ws.exact {
            for &(id, b) in &self.list {
                ws.edit_buf(id, |z| z + b);
            }
        }
        if !ws.is_dense() {
            let list = &self.list;
            ws.edit_cands(|id, z| match list.binary_search_by_key(&id, |e| e.0) {
                Ok(i) => z + list[i].1,
                Err(_) => z,
            });
        }
        ws.after_transform();
        Ok(())
    }
}

/// `BTreeMap<u32, f32>` as a JSON object with string keys (works inside tagged enums too).
pub(crate) mod id_map {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(m: &BTreeMap<u32, f32>, s: S) -> Result<S::Ok, S::Error> {
        // keys in numeric id order in the canonical form
        let mut pairs: Vec<(u32, String, f32)> =
            m.iter().map(|(k, v)| (*k, k.to_string(), *v)).collect();
        pairs.sort_by_key(|p| p.0);
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(pairs.len()))?;
        for (_, k, v) in pairs {
            map.serialize_entry(&k, &v)?;
        }
        map.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<u32, f32>, D::Error> {
        let raw = BTreeMap::<String, f32>::deserialize(d)?;
        raw.into_iter()
            .map(|(k, v)| {
                k.parse::<u32>().map(|id| (id, v)).map_err(|_| {
                    serde::de::Error::custom(format!("logit_bias key `{k}` is not a token id"))
                })
            })
            .collect()
    }
}
