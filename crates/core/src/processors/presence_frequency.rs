//! Presence and frequency penalties (000 §3.5, first formula):
//! `z'_i = z_i − presence · 1[c_i > 0] − frequency · c_i`, with `c_i` counted in the declared
//! scope. Special tokens are excluded by default.

use serde::{Deserialize, Serialize};

use super::{v1, Apply, Compile, CompileCtx, PenaltyScope, StateField};
use crate::error::{Error, Result};
use crate::state::DecoderState;
use crate::support::Workspace;
use crate::vocab::VocabInfo;

/// Implementation version.
pub const VERSION: u32 = 1;

/// Config of the additive presence/frequency penalty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PresenceFrequencyPenalty {
    /// Processor version.
    #[serde(default = "v1")]
    pub version: u32,
    /// Subtracted once from every token seen in scope (OpenAI range `[-2, 2]`).
    #[serde(default)]
    pub presence_penalty: f32,
    /// Subtracted per occurrence in scope (OpenAI range `[-2, 2]`).
    #[serde(default)]
    pub frequency_penalty: f32,
    /// Counting range (default: output only, as OpenAI and vLLM).
    #[serde(default = "default_scope")]
    pub scope: PenaltyScope,
    /// Whether special tokens are exempt (default true).
    #[serde(default = "crate::processors::presence_frequency::yes")]
    pub exclude_special: bool,
}

pub(crate) fn yes() -> bool {
    true
}

fn default_scope() -> PenaltyScope {
    PenaltyScope::Output
}

/// Compiled form.
#[derive(Debug, Clone)]
pub struct Compiled {
    presence: f32,
    frequency: f32,
    pub(crate) scope: PenaltyScope,
    exclude_special: bool,
}

/// The range rule of a presence or frequency penalty (`[-2, 2]`); the reason when `v` breaks
/// it.
pub(crate) fn check(v: f32) -> std::result::Result<(), String> {
    if !v.is_finite() || !(-2.0..=2.0).contains(&v) {
        return Err(format!("{v} is outside [-2, 2]"));
    }
    Ok(())
}

impl Compile for PresenceFrequencyPenalty {
    const NAME: &'static str = "presence_frequency_penalty";
    const VERSION: u32 = VERSION;
    type Compiled = Compiled;

    fn version(&self) -> u32 {
        self.version
    }

    fn compile(&self, field: &str, _ctx: &mut CompileCtx<'_>) -> Result<Compiled> {
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            check(v).map_err(|r| Error::invalid(format!("{field}.{name}"), r))?;
        }
        self.scope.validate(field)?;
        Ok(Compiled {
            presence: self.presence_penalty,
            frequency: self.frequency_penalty,
            scope: self.scope,
            exclude_special: self.exclude_special,
        })
    }
}

impl Compiled {
    #[inline]
    fn penalised(&self, z: f32, c: u32) -> f32 {
        if c == 0 {
            z
        } else {
            z - self.presence - self.frequency * c as f32
        }
    }
}

impl Apply for Compiled {
    fn reads(&self) -> &'static [StateField] {
        self.scope.reads()
    }

    fn apply(&self, st: &DecoderState, ws: &mut Workspace, vocab: &VocabInfo) -> Result<()> {
        apply_counted(&self.scope, self.exclude_special, st, ws, vocab, |z, c| {
            self.penalised(z, c)
        });
        Ok(())
    }
}

/// Shared driver for count-based penalties: dense support → edit the counted ids; sparse
/// support → edit candidates by their counts (and, when layers are kept, the counted ids).
pub(crate) fn apply_counted(
    scope: &PenaltyScope,
    exclude_special: bool,
    st: &DecoderState,
    ws: &mut Workspace,
    vocab: &VocabInfo,
    f: impl Fn(f32, u32) -> f32,
) {
    let skip = |id: u32| exclude_special && vocab.is_special(id);
    if ws.is_dense() || ws.exact {
        scope.for_each_count(st, ws, |ws, id, c| {
            if !skip(id) && (id as usize) < ws.v {
                ws.edit_buf(id, |z| f(z, c));
            }
        });
    }
    if !ws.is_dense() {
        let mut window = std::mem::take(&mut ws.ids_scratch);
        scope.sorted_window(st, &mut window);
        ws.edit_cands(|id, z| {
            if skip(id) {
                z
            } else {
                f(z, scope.count_in(st, &window, id))
            }
        });
        ws.ids_scratch = window;
    }
    ws.after_transform();
}
