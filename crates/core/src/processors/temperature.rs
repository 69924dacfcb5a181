//! Temperature (reference step 6): `z̃_i = z_i / T` for `T > 0`. `T = 0` is never divided by:
//! it is the declared greedy branch — the support is reduced to the single best token
//! (processed logit descending, ties → lowest id) at this point of the pipeline, as llama.cpp
//! does, and the step consumes no random draw that matters.
//!
//! A positive `T` so small that some `z_i / T` of the support would leave the `f32` range acts
//! as the limit it approaches, `T → 0⁺`: the same greedy branch. (Saturating the quotients at
//! `±f32::MAX` instead would tie every overflowing token and sample uniformly among them.)

use serde::{Deserialize, Serialize};

use super::{v1, Apply, Compile, CompileCtx};
use crate::error::{Error, Result};
use crate::state::DecoderState;
use crate::support::Workspace;
use crate::vocab::VocabInfo;

/// Implementation version.
pub const VERSION: u32 = 1;

/// Config of the temperature.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Temperature {
    /// Processor version.
    #[serde(default = "v1")]
    pub version: u32,
    /// `T >= 0`, finite. `0` = greedy branch.
    pub temperature: f32,
}

/// Compiled form.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub(crate) t: f32,
}

/// The range rule of a temperature (finite, `>= 0`); the reason when `t` breaks it.
pub(crate) fn check(t: f32) -> std::result::Result<(), String> {
    if !t.is_finite() || t < 0.0 {
        return Err(format!("{t} must be finite and >= 0"));
    }
    Ok(())
}

impl Compile for Temperature {
    const NAME: &'static str = "temperature";
    const VERSION: u32 = VERSION;
    type Compiled = Compiled;

    fn version(&self) -> u32 {
        self.version
    }

    fn compile(&self, field: &str, _ctx: &mut CompileCtx<'_>) -> Result<Compiled> {
        let t = self.temperature;
        check(t).map_err(|r| Error::invalid(format!("{field}.temperature"), r))?;
        Ok(Compiled { t })
    }
}

impl Apply for Compiled {
    fn apply(&self, _st: &DecoderState, ws: &mut Workspace, _vocab: &VocabInfo) -> Result<()> {
        if self.t == 0.0 || (self.t < 1.0 && overflows(ws.max_abs_finite(), self.t)) {
            ws.keep_argmax();
        } else if self.t != 1.0 {
            ws.divide(self.t);
        }
        Ok(())
    }
}

/// Whether `z / t` leaves the `f32` range for `|z| = max_abs`.
fn overflows(max_abs: f32, t: f32) -> bool {
    f64::from(max_abs) / f64::from(t) > f64::from(f32::MAX)
}
