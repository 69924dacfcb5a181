//! The classic speculative-sampling acceptance rule (Leviathan et al. 2022; Chen et al. 2023),
//! on nextok's counter-based random stream.
//!
//! A draft token `x` proposed from the drafter's distribution `q` is accepted with probability
//! `min(1, p(x) / q(x))`, where `p` is the target's selection distribution at that position;
//! when it is rejected, a token is drawn from the residual `(p − q)+`, normalised. Whatever
//! `q` is, the token that comes out is distributed as `p` (but it is not, token for token,
//! the token plain decoding draws with the same seed: for that, see the engine's `exact`
//! mode).
//!
//! Draws: the acceptance test uses `u(seed, step, Purpose::Accept, 0)`, the residual draw
//! `u(seed, step, Purpose::Accept, 1)` (inverse CDF in token-id order), so a request's draws
//! never depend on its batch.

use crate::error::{Error, Result};
use crate::rng::{Purpose, RngState};

/// What the acceptance rule decided at one position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acceptance {
    /// The draft token stands.
    Accepted,
    /// The draft token is rejected; this token (drawn from the residual) replaces it.
    Replaced(u32),
}

fn check(name: &str, d: &[f64]) -> Result<f64> {
    let mut sum = 0.0;
    for (i, &v) in d.iter().enumerate() {
        if !(v.is_finite() && v >= 0.0) {
            return Err(Error::invalid(
                format!("{name}[{i}]"),
                format!("is {v}; probabilities must be finite and non-negative"),
            ));
        }
        sum += v;
    }
    if sum <= 0.0 {
        return Err(Error::invalid(name, format!("{name} has no mass")));
    }
    Ok(sum)
}

/// Leviathan's rule at `step` of the stream `rng` for the draft token `x`, with the target's
/// distribution `p` and the drafter's `q` (same length, each summing to 1 up to rounding;
/// both are normalised here). Errors name `p`, `q` or `x` when they are unusable.
pub fn accept_or_replace(
    rng: &RngState,
    step: u64,
    p: &[f64],
    q: &[f64],
    x: u32,
) -> Result<Acceptance> {
    if p.len() != q.len() {
        return Err(Error::invalid(
            "q",
            format!("p has {} entries and q {}", p.len(), q.len()),
        ));
    }
    let (sp, sq) = (check("p", p)?, check("q", q)?);
    let xi = x as usize;
    if xi >= p.len() {
        return Err(Error::invalid(
            "x",
            format!("x = {x} is outside the {} tokens", p.len()),
        ));
    }
    let (px, qx) = (p[xi] / sp, q[xi] / sq);
    if qx <= 0.0 {
        return Err(Error::invalid(
            "x",
            format!("x = {x} has q(x) = 0: the drafter cannot have proposed it"),
        ));
    }
    let u = rng.uniform(step, Purpose::Accept, 0);
    if u < (px / qx).min(1.0) {
        return Ok(Acceptance::Accepted);
    }
    // the residual (p − q)+, by inverse CDF in id order
    let mut total = 0.0;
    for (a, b) in p.iter().zip(q) {
        total += (a / sp - b / sq).max(0.0);
    }
    if total <= 0.0 {
        // p = q up to rounding: a rejection had probability ~0; draw from p
        return Ok(Acceptance::Replaced(inverse_cdf(
            p,
            sp,
            rng.uniform(step, Purpose::Accept, 1),
        )));
    }
    let target = rng.uniform(step, Purpose::Accept, 1) * total;
    let mut acc = 0.0;
    let mut last = 0;
    for (i, (a, b)) in p.iter().zip(q).enumerate() {
        let r = (a / sp - b / sq).max(0.0);
        if r > 0.0 {
            last = i;
            acc += r;
            if target < acc {
                return Ok(Acceptance::Replaced(i as u32));
            }
        }
    }
    // rounding left `target` at the very end: the last token with residual mass
    Ok(Acceptance::Replaced(last as u32))
}

fn inverse_cdf(p: &[f64], sum: f64, u: f64) -> u32 {
    let target = u * sum;
    let mut acc = 0.0;
    let mut last = 0;
    for (i, &v) in p.iter().enumerate() {
        if v > 0.0 {
            last = i;
            acc += v;
            if target < acc {
                return i as u32;
            }
        }
    }
    last as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Draws a token from `q` with a stream of its own (the drafter's sampling).
    fn draw_q(rng: &RngState, step: u64, q: &[f64]) -> u32 {
        inverse_cdf(q, q.iter().sum(), rng.uniform(step, Purpose::Select, 0))
    }

    fn chi_square(counts: &[u64], p: &[f64], n: u64) -> f64 {
        counts
            .iter()
            .zip(p)
            .map(|(&c, &pi)| {
                let e = pi * n as f64;
                (c as f64 - e).powi(2) / e
            })
            .sum()
    }

    /// Output histogram over `n` positions of drafting from `q` then applying `rule`.
    fn histogram(
        p: &[f64],
        q: &[f64],
        n: u64,
        rule: impl Fn(&RngState, u64, u32) -> u32,
    ) -> Vec<u64> {
        let target = RngState::new(42);
        let drafter = RngState::new(7);
        let mut counts = vec![0u64; p.len()];
        for step in 0..n {
            let x = draw_q(&drafter, step, q);
            counts[rule(&target, step, x) as usize] += 1;
        }
        counts
    }

    #[test]
    fn the_output_is_distributed_as_the_target() {
        // 6 tokens, q far from p (and q puts mass where p has none)
        let p = [0.40, 0.25, 0.15, 0.10, 0.10, 0.0];
        let q = [0.10, 0.10, 0.30, 0.05, 0.25, 0.20];
        let n = 100_000;
        let counts = histogram(&p, &q, n, |rng, step, x| {
            match accept_or_replace(rng, step, &p, &q, x).unwrap() {
                Acceptance::Accepted => x,
                Acceptance::Replaced(t) => t,
            }
        });
        assert_eq!(counts[5], 0, "no token outside p's support");
        // chi-square over the 5 tokens p supports: 4 degrees of freedom, 0.1 % critical value
        let chi = chi_square(&counts[..5], &p[..5], n);
        assert!(chi < 18.47, "chi-square {chi}: {counts:?}");
        // the control: accepting every draft gives q, which the same test rejects
        let counts = histogram(&p, &q, n, |_, _, x| x);
        let chi = chi_square(&counts[..5], &p[..5], n);
        assert!(chi > 1000.0, "control chi-square {chi}");
    }

    #[test]
    fn equal_distributions_accept_everything_and_bad_input_is_named() {
        let p = [0.5, 0.3, 0.2];
        let rng = RngState::new(3);
        for step in 0..200 {
            let x = (step % 3) as u32;
            assert_eq!(
                accept_or_replace(&rng, step, &p, &p, x).unwrap(),
                Acceptance::Accepted
            );
        }
        let err =
            |p: &[f64], q: &[f64], x| accept_or_replace(&rng, 0, p, q, x).unwrap_err().to_string();
        assert!(err(&[0.5, f64::NAN], &[0.5, 0.5], 0).contains("p[1]"));
        assert!(err(&[0.5, 0.5], &[1.0, 0.0], 1).contains("q(x) = 0"));
        assert!(err(&[0.5, 0.5], &[0.5, 0.5], 2).contains("x = 2"));
        assert!(err(&[0.5, 0.5], &[1.0], 0).contains("entries"));
        assert!(err(&[0.0, 0.0], &[0.5, 0.5], 0).contains("no mass"));
    }
}
