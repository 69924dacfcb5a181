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

use crate::kernels::{cand_weights, Level};
use crate::math::{exp_f32, ln_f64};
use crate::rng::{Purpose, RngState};
use crate::support::{Cand, Workspace};

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
    /// Speculative sampling's rejection rule (Leviathan et al. 2022) against the drafted token
    /// `x` of a deterministic drafter (its distribution `q` is a point mass at `x`): accept `x`
    /// with probability `min(1, p(x)/q(x)) = p(x)`, drawn as `u(seed, step, Accept, 0) < p(x)`;
    /// otherwise draw from the residual `(p − q)+`, which is `p` without `x`, renormalised, by
    /// inverse CDF in id order at `u(seed, step, Accept, 1)`. The token is distributed as `p`
    /// whatever `x` is. Greedy selection has a point-mass `p`, so it selects its argmax as
    /// always.
    Draft(u32),
}

/// What the rejection rule ([`Draw::Draft`]) decided.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftDecision {
    /// The drafted token.
    pub token: u32,
    /// Whether it was accepted.
    pub accepted: bool,
    /// The acceptance draw `u(seed, step, Accept, 0)` (`None` for greedy selection).
    pub accept_u: Option<f64>,
    /// The residual draw `u(seed, step, Accept, 1)`, when the draft was rejected.
    pub residual_u: Option<f64>,
}

/// What selection did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Selected {
    /// The selected token.
    pub token: u32,
    /// The `u` used by categorical selection (`None` for greedy and Gumbel).
    pub u: Option<f64>,
    /// The rejection rule's decision, for [`Draw::Draft`].
    pub draft: Option<DraftDecision>,
}

pub(crate) fn select(
    ws: &mut Workspace,
    selector: Selector,
    rng: &RngState,
    step: u64,
    draw: Draw,
) -> Option<Selected> {
    match (selector, draw) {
        (Selector::Greedy, _) => ws.argmax().map(|c| Selected {
            token: c.id,
            u: None,
            draft: match draw {
                Draw::Draft(x) => Some(DraftDecision {
                    token: x,
                    accepted: x == c.id,
                    accept_u: None,
                    residual_u: None,
                }),
                _ => None,
            },
        }),
        (_, Draw::Draft(x)) => rejection(ws, rng, step, x),
        (Selector::Categorical, _) => {
            let u = match draw {
                Draw::FixedU(u) => u,
                _ => rng.uniform(step, Purpose::Select, 0),
            };
            categorical(ws, u).map(|t| Selected {
                token: t,
                u: Some(u),
                draft: None,
            })
        }
        (Selector::Gumbel, _) => gumbel(ws, rng, step).map(|t| Selected {
            token: t,
            u: None,
            draft: None,
        }),
    }
}

/// Calls `f(id, weight)` over the support in id order while it returns `true`: the dense row
/// (`w` over all ids, `buf` marking the excluded ones) or the candidates `ids` with weights `w`.
fn walk(dense: bool, buf: &[f32], ids: &[Cand], w: &[f32], mut f: impl FnMut(u32, f32) -> bool) {
    if dense {
        for (i, (&wi, &z)) in w.iter().zip(buf).enumerate() {
            if z != f32::NEG_INFINITY && !f(i as u32, wi) {
                return;
            }
        }
    } else {
        for (c, &wi) in ids.iter().zip(w) {
            if !f(c.id, wi) {
                return;
            }
        }
    }
}

/// The sparse support in id order with its weights `exp(z − m)`, as categorical selection reads
/// it: the candidates themselves when already in id order (the dense top-p leaves its nucleus
/// so), else a copy sorted by id in `scratch` (the canonical order stays for the record).
fn sparse_in_id_order<'a>(
    level: Level,
    cands: &'a [Cand],
    scratch: &'a mut Vec<Cand>,
    aux: &mut Vec<Cand>,
    vocab_size: usize,
    w: &'a mut [f32],
    m: f32,
) -> (&'a [Cand], &'a [f32]) {
    let c: &'a [Cand] = if cands.is_sorted_by_key(|c| c.id) {
        cands
    } else {
        scratch.clear();
        scratch.extend_from_slice(cands);
        crate::support::sort_by_id(scratch, aux, vocab_size);
        scratch
    };
    let w = &mut w[..c.len()];
    cand_weights(level, c, m, w);
    (c, w)
}

/// [`Draw::Draft`] for categorical and Gumbel selection (both draw from the same `p`).
fn rejection(ws: &mut Workspace, rng: &RngState, step: u64, x: u32) -> Option<Selected> {
    let (m, s) = ws.normalize_any_order();
    // the support in id order with its weights (as categorical selection sees it)
    let (ids, w): (&[Cand], &[f32]) = if ws.dense {
        (&[], &ws.w[..])
    } else {
        ws.dense_w_valid = false;
        let level = ws.level();
        sparse_in_id_order(
            level,
            &ws.cands,
            &mut ws.scratch,
            &mut ws.aux,
            ws.v,
            &mut ws.w,
            m,
        )
    };
    let (dense, buf) = (ws.dense, &ws.buf[..]);
    let mut wx = 0.0f64;
    walk(dense, buf, ids, w, |id, wi| {
        if id == x {
            wx = wi as f64;
        }
        id < x
    });
    let px = wx / s;
    let accept_u = rng.uniform(step, Purpose::Accept, 0);
    if accept_u < px {
        return Some(Selected {
            token: x,
            u: None,
            draft: Some(DraftDecision {
                token: x,
                accepted: true,
                accept_u: Some(accept_u),
                residual_u: None,
            }),
        });
    }
    // the residual: p without x, by inverse CDF in id order
    let residual_u = rng.uniform(step, Purpose::Accept, 1);
    let rest = s - wx;
    let mut token = None;
    if rest > 0.0 {
        let mut cum = 0.0f64;
        walk(dense, buf, ids, w, |id, wi| {
            if id == x {
                return true;
            }
            cum += wi as f64 / rest;
            if wi > 0.0 {
                // the rounding guard, as categorical selection's
                token = Some(id);
            }
            residual_u >= cum
        });
    }
    // x holds all the mass (up to rounding) and still lost the draw: p is x's point mass
    let token = token.unwrap_or(x);
    Some(Selected {
        token,
        u: None,
        draft: Some(DraftDecision {
            token: x,
            accepted: token == x,
            accept_u: Some(accept_u),
            residual_u: Some(residual_u),
        }),
    })
}

fn categorical(ws: &mut Workspace, u: f64) -> Option<u32> {
    if ws.cand_w_valid && !ws.dense {
        // the large-nucleus top-p left the support in id order with its weights and `(m, S)`:
        // the state `normalize_any_order` would leave, without computing them again
        let (m, s) = ws.cand_norm;
        ws.norm_max = m;
        ws.norm_sum = s;
        ws.norm_valid = true;
        ws.dense_w_valid = false;
        let n = ws.cands.len();
        return inverse_cdf(ws.level(), &ws.cands, &ws.w[..n], s, u);
    }
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
        // (the dense weights are not in use while the support is sparse)
        ws.dense_w_valid = false;
        let level = ws.level();
        let (c, w) = sparse_in_id_order(
            level,
            &ws.cands,
            &mut ws.scratch,
            &mut ws.aux,
            ws.v,
            &mut ws.w,
            m,
        );
        inverse_cdf(level, c, w, s, u)
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

crate::kernels::multiversion! {
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
