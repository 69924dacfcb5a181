//! Selection over the final support (reference step 10).
//!
//! * **Greedy** — argmax of the processed logit over the support, ties → lowest token id.
//!   Consumes no random number.
//! * **Categorical** — inverse CDF: candidates ordered by token id ascending, one `u ∈ [0, 1)`,
//!   the first token whose running `f64` sum of selection probabilities exceeds `u`; if rounding
//!   leaves `u` at or above the final sum, the last candidate with a positive probability
//!   (000 §3.8's rounding guard; a candidate whose weight underflowed to 0 is never returned).
//! * **Gumbel-max** (exponential race) — for each candidate `E_i = −ln u_i` with `u_i ∈ (0, 1)`
//!   drawn at counter `(step, Gumbel, token id)`; select `argmax w_i / E_i` (ties → lowest id).
//!   A token's noise depends only on (seed, step, id), never on the order or size of the list.

use serde::{Deserialize, Serialize};

use crate::math::{exp_f32, ln_f64};
use crate::rng::{Purpose, RngState};
use crate::support::{cand_weights, Cand, Workspace};

/// The selection rule of a pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Selector {
    /// Argmax, ties → lowest id.
    Greedy,
    /// Inverse-CDF categorical sampling in token-id order.
    #[default]
    Categorical,
    /// Gumbel-max via an exponential race keyed by token id.
    Gumbel,
}

/// Where the randomness of a step comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Draw {
    /// The sequence's own counter-based stream.
    Stream,
    /// A fixed inverse-CDF position `u ∈ [0, 1)` (teaching, replay of hand computations).
    FixedU(f64),
}

/// What selection did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Selected {
    /// The selected token.
    pub token: u32,
    /// The `u` used by categorical selection (`None` for greedy and Gumbel).
    pub u: Option<f64>,
}

pub(crate) fn select(
    ws: &mut Workspace,
    selector: Selector,
    rng: &RngState,
    step: u64,
    draw: Draw,
) -> Option<Selected> {
    match selector {
        Selector::Greedy => ws.argmax().map(|c| Selected {
            token: c.id,
            u: None,
        }),
        Selector::Categorical => {
            let u = match draw {
                Draw::Stream => rng.uniform(step, Purpose::Select, 0),
                Draw::FixedU(u) => u,
            };
            categorical(ws, u).map(|t| Selected {
                token: t,
                u: Some(u),
            })
        }
        Selector::Gumbel => gumbel(ws, rng, step).map(|t| Selected { token: t, u: None }),
    }
}

fn categorical(ws: &mut Workspace, u: f64) -> Option<u32> {
    let (m, s) = ws.normalize_any_order();
    if ws.dense {
        let mut cum = 0.0f64;
        let mut last = None;
        for (i, &w) in ws.w.iter().enumerate() {
            if ws.buf[i] == f32::NEG_INFINITY {
                continue;
            }
            cum += w as f64 / s;
            if w > 0.0 {
                // the rounding guard never returns a token whose weight underflowed to 0
                last = Some(i as u32);
            }
            if u < cum {
                return Some(i as u32);
            }
        }
        last
    } else {
        // id-ascending order (the dense top-p leaves its nucleus so); else over a copy, keeping
        // the canonical order for the record
        let c = if ws.cands.is_sorted_by_key(|c| c.id) {
            &ws.cands
        } else {
            ws.scratch.clear();
            ws.scratch.extend_from_slice(&ws.cands);
            crate::support::sort_by_id(&mut ws.scratch, &mut ws.aux, ws.v);
            &ws.scratch
        };
        // (the dense weights are not in use while the support is sparse)
        ws.dense_w_valid = false;
        let w = &mut ws.w[..c.len()];
        cand_weights(c, m, w);
        inverse_cdf(c, w, s, u)
    }
}

fn gumbel(ws: &mut Workspace, rng: &RngState, step: u64) -> Option<u32> {
    let (m, _s) = ws.normalize_any_order();
    let mut best: Option<(f64, u32)> = None;
    let mut consider = |id: u32, z: f32| {
        let w = exp_f32(z - m) as f64;
        if w <= 0.0 {
            return;
        }
        let e = -ln_f64(rng.uniform_open(step, Purpose::Gumbel, id));
        let key = w / e;
        match best {
            Some((bk, bid)) if !(key > bk || (key == bk && id < bid)) => {}
            _ => best = Some((key, id)),
        }
    };
    if ws.dense {
        for (i, &z) in ws.buf.iter().enumerate() {
            if z > f32::NEG_INFINITY {
                consider(i as u32, z);
            }
        }
    } else {
        for c in &ws.cands {
            consider(c.id, c.z);
        }
    }
    best.map(|b| b.1)
}

crate::math::multiversion! {
    /// Inverse CDF over candidates in id order with weights `w`: the first whose running sum of
    /// `w / s` exceeds `u`, else the last with a positive weight. The divisions are done 8 at a
    /// time ahead of the sequential sum.
    fn inverse_cdf(c: &[Cand], w: &[f32], s: f64, u: f64) -> Option<u32> {
        let mut cum = 0.0f64;
        let mut last = None;
        let mut t = [0.0f64; 8];
        for (cb, wb) in c.chunks(8).zip(w.chunks(8)) {
            for (tj, &wj) in t.iter_mut().zip(wb) {
                *tj = wj as f64 / s;
            }
            for ((x, &wj), &tj) in cb.iter().zip(wb).zip(t.iter()) {
                cum += tj;
                if wj > 0.0 {
                    // the rounding guard never returns a token whose weight underflowed to 0
                    last = Some(x.id);
                }
                if u < cum {
                    return Some(x.id);
                }
            }
        }
        last
    }
}
