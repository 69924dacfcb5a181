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

use crate::kernels::{cand_weights, Isa};
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
    level: Isa,
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

/// Candidates per block of [`inverse_cdf`]'s skip.
const CDF_BLOCK: usize = 64;

crate::kernels::multiversion! {
    /// Inverse CDF over candidates in id order with weights `w`: the first whose running sum of
    /// `w / s` exceeds `u`, else the last with a positive weight ([`sequential_cdf`], the
    /// definition). Long lists skip whole blocks of [`CDF_BLOCK`] candidates by their sums in
    /// any order (`f64` lanes, one division per block) while the running sum certainly stays at
    /// most `u`; the block where it may cross is walked with the definition's terms from that
    /// estimate. The estimate and the sequential sum are both within `n · 2^-53` of the exact
    /// sum of the terms (which is about 1), so a crossing farther than `(4n + 64) · 2^-52` from
    /// `u` on both sides is the definition's; anything closer (or no crossing) goes to the
    /// sequential walk, so the result is always the definition's (unit test
    /// `blocked_inverse_cdf_is_the_sequential_one`).
    fn inverse_cdf(c: &[Cand], w: &[f32], s: f64, u: f64) -> Option<u32> {
        let n = c.len().min(w.len());
        let (c, w) = (&c[..n], &w[..n]);
        if n <= 2 * CDF_BLOCK || s.is_nan() || s <= 0.0 {
            return sequential_cdf(c, w, s, u);
        }
        let delta = (4 * n + 64) as f64 * f64::EPSILON;
        let mut a = 0.0f64;
        for (cb, wb) in c.chunks(CDF_BLOCK).zip(w.chunks(CDF_BLOCK)) {
            let mut lanes = [0.0f64; 8];
            let whole = wb.chunks_exact(8);
            let rest = whole.remainder();
            for ch in whole {
                for (l, &x) in lanes.iter_mut().zip(ch) {
                    *l += x as f64;
                }
            }
            for (l, &x) in lanes.iter_mut().zip(rest) {
                *l += x as f64;
            }
            let bs = lanes.iter().sum::<f64>() / s;
            if a + bs + delta <= u {
                // every running sum up to the block's end is certainly at most `u`
                a += bs;
                continue;
            }
            let mut cum = a;
            for (x, &wj) in cb.iter().zip(wb) {
                cum += wj as f64 / s;
                if cum + delta <= u {
                    continue;
                }
                if u < cum - delta && wj > 0.0 {
                    // certainly above `u` here, and certainly not before
                    return Some(x.id);
                }
                return sequential_cdf(c, w, s, u);
            }
            a = cum;
        }
        sequential_cdf(c, w, s, u)
    }
}

/// The definition of [`inverse_cdf`]: the running sum of `w / s` in order, the first candidate
/// where it exceeds `u`, else the last with a positive weight. The divisions are done 8 at a
/// time ahead of the sequential sum.
#[inline(always)]
fn sequential_cdf(c: &[Cand], w: &[f32], s: f64, u: f64) -> Option<u32> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::tests::supported_levels;

    /// The blocked walk against the definition, at every kernel level, on lists with zeros,
    /// ties, tiny and huge weights, for draws at, just below and just above every running sum
    /// (where only the sequential walk can decide) and at random.
    #[test]
    fn blocked_inverse_cdf_is_the_sequential_one() {
        let mut r = crate::kernels::tests::Rng(5);
        let mut fallbacks_possible = 0usize;
        for &n in &[1usize, 100, 129, 130, 200, 1000, 4099, 20_000] {
            for kind in 0..4 {
                let w: Vec<f32> = (0..n)
                    .map(|i| match kind {
                        0 => r.unit(),
                        1 => [0.0, 1.0, 0.5][r.below(3)],
                        2 => (r.unit() * 30.0 - 25.0).exp(),
                        _ => {
                            if i % 500 == 7 {
                                1e6
                            } else {
                                r.unit() * 1e-3
                            }
                        }
                    })
                    .collect();
                let c: Vec<Cand> = (0..n)
                    .map(|i| Cand {
                        id: 3 * i as u32 + 1,
                        z: 0.0,
                    })
                    .collect();
                let s: f64 = w.iter().map(|&x| x as f64).sum();
                if s <= 0.0 {
                    continue;
                }
                // the definition's running sums, and draws around them
                let mut cums = Vec::with_capacity(n);
                let mut cum = 0.0f64;
                for &x in &w {
                    cum += x as f64 / s;
                    cums.push(cum);
                }
                let mut us: Vec<f64> = (0..200).map(|_| r.unit() as f64).collect();
                for &cj in cums.iter().step_by(n / 50 + 1) {
                    for d in [-1i64, 0, 1] {
                        let u = f64::from_bits((cj.to_bits() as i64 + d) as u64);
                        if (0.0..1.0).contains(&u) {
                            us.push(u);
                            fallbacks_possible += 1;
                        }
                    }
                }
                us.extend([0.0, 1.0 - f64::EPSILON / 2.0, *cums.last().unwrap()]);
                for level in supported_levels() {
                    for &u in &us {
                        assert_eq!(
                            inverse_cdf(level, &c, &w, s, u),
                            sequential_cdf(&c, &w, s, u),
                            "n {n}, kind {kind}, u {u:e}, level {level:?}"
                        );
                    }
                }
            }
        }
        assert!(fallbacks_possible > 1000);
    }
}
