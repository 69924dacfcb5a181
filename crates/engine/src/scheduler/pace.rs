//! Pacing the prompt chunk to a target inter-token latency: [`Pace`] learns how long an
//! iteration takes for the rows it runs, and says how many prompt rows the next iteration may
//! add to its decode rows and still end within `itl_target_ms`.
//!
//! An iteration's time is modelled as `a + b·u`: `a` seconds whatever it runs (the pass over
//! every weight, waking the threads), `b` seconds per unit of work, where a row is one unit and
//! a row that also produces logits (a decode row, a draft row) is `1 + κ` units. `κ` is the
//! output matrix's multiply-adds over a row's multiply-adds in the blocks, from the model's
//! shape (0.27 for SmolLM2-135M, 1.7 for Gemma 3 270M's 262,144-token vocabulary), so that the
//! fit holds whether an iteration's rows are mostly decode rows or mostly prompt rows. `a` and
//! `b` come from a least-squares fit over the iterations measured, each weighing `DECAY` times
//! the one after it, so the model follows a machine whose speed drifts.

use nextok_model::ArchConfig;

/// How much each measured iteration weighs against the one after it.
const DECAY: f64 = 0.95;

/// Iterations measured before the fit is used.
const MIN_SAMPLES: u32 = 4;

/// The fitted cost of an iteration, from the iterations measured so far.
#[derive(Debug, Clone)]
pub(crate) struct Pace {
    /// The extra units of a row that produces logits (`κ`).
    logits_weight: f64,
    /// Decayed sums over the measured iterations of 1, u, u², t and u·t.
    s0: f64,
    s1: f64,
    s2: f64,
    t0: f64,
    t1: f64,
    /// Iterations measured (saturating).
    samples: u32,
}

impl Pace {
    /// A pace with nothing measured, for a model of shape `c`.
    pub(crate) fn new(c: &ArchConfig) -> Pace {
        let (d, q, kv) = (c.n_embd as f64, c.q_dim() as f64, c.kv_dim() as f64);
        // per layer: Q, K, V, the output projection, and three feed-forward matrices
        let block = c.n_layer as f64 * (d * (q + 2.0 * kv) + q * d + 3.0 * d * c.n_ff as f64);
        let head = c.vocab_size as f64 * d;
        let logits_weight = if block > 0.0 { head / block } else { 0.0 };
        Pace::with_logits_weight(logits_weight)
    }

    /// A pace with nothing measured, whose logits rows weigh `1 + logits_weight` units.
    pub(crate) fn with_logits_weight(logits_weight: f64) -> Pace {
        Pace {
            logits_weight: if logits_weight.is_finite() {
                logits_weight.max(0.0)
            } else {
                0.0
            },
            s0: 0.0,
            s1: 0.0,
            s2: 0.0,
            t0: 0.0,
            t1: 0.0,
            samples: 0,
        }
    }

    /// The units of an iteration of `rows` rows, `logits_rows` of which produce logits.
    pub(crate) fn units(&self, rows: usize, logits_rows: usize) -> f64 {
        rows as f64 + self.logits_weight * logits_rows as f64
    }

    /// Records an iteration of `units` that took `secs` seconds.
    pub(crate) fn record(&mut self, units: f64, secs: f64) {
        if !(units > 0.0 && secs.is_finite() && secs >= 0.0) {
            return;
        }
        for s in [
            &mut self.s0,
            &mut self.s1,
            &mut self.s2,
            &mut self.t0,
            &mut self.t1,
        ] {
            *s *= DECAY;
        }
        self.s0 += 1.0;
        self.s1 += units;
        self.s2 += units * units;
        self.t0 += secs;
        self.t1 += units * secs;
        self.samples = self.samples.saturating_add(1);
    }

    /// `(a, b)`: seconds an iteration takes whatever it runs, and seconds per unit; `None`
    /// before [`MIN_SAMPLES`] iterations. When the iterations measured all had about the same
    /// work, or the fit's line would cost less than nothing at no work, the line goes through
    /// the origin, which overestimates the cost of a larger iteration, never underestimates it.
    pub(crate) fn fit(&self) -> Option<(f64, f64)> {
        if self.samples < MIN_SAMPLES || self.s1 <= 0.0 {
            return None;
        }
        let mean_u = self.s1 / self.s0;
        let mean_t = self.t0 / self.s0;
        let var = self.s2 / self.s0 - mean_u * mean_u;
        if var > (0.1 * mean_u).powi(2) {
            let b = (self.t1 / self.s0 - mean_u * mean_t) / var;
            let a = mean_t - b * mean_u;
            if b > 0.0 && a >= 0.0 {
                return Some((a, b));
            }
            if b > 0.0 {
                return Some((0.0, self.t1 / self.s2));
            }
        }
        Some((0.0, self.t0 / self.s1))
    }

    /// The prompt rows an iteration that already runs `decode_units` may add and still take at
    /// most `target` seconds (0 when the decode rows alone take longer); `None` before the fit
    /// is used.
    pub(crate) fn prompt_rows(&self, decode_units: f64, target: f64) -> Option<usize> {
        let (a, b) = self.fit()?;
        let rows = (target - a) / b - decode_units;
        Some(if rows.is_finite() && rows > 0.0 {
            rows.min(usize::MAX as f64 / 2.0) as usize
        } else {
            0
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Iterations that cost exactly `a + b·u` give back `a` and `b`, and the prompt rows that
    /// fill a target.
    #[test]
    fn an_exact_line_is_recovered() {
        let mut p = Pace::with_logits_weight(0.5);
        assert_eq!(p.fit(), None);
        let (a, b) = (0.004, 0.0015);
        for i in 0..40 {
            let (rows, logits) = (4 + (i * 37) % 300, 4 + i % 16);
            let u = p.units(rows, logits);
            p.record(u, a + b * u);
        }
        let (fa, fb) = p.fit().unwrap();
        assert!((fa - a).abs() < 1e-9 && (fb - b).abs() < 1e-12, "{fa} {fb}");
        // 16 decode rows are 24 units: (0.1006 - 0.004) / 0.0015 - 24 = 40.4
        assert_eq!(p.prompt_rows(p.units(16, 16), 0.1006), Some(40));
        // decode rows alone over the target: no prompt rows
        assert_eq!(p.prompt_rows(p.units(100, 100), 0.1), Some(0));
    }

    /// Iterations of one size give a line through the origin, which never promises more rows
    /// than fit; a line with a negative intercept goes through the origin too.
    #[test]
    fn degenerate_fits_overestimate_the_cost() {
        let mut p = Pace::with_logits_weight(0.0);
        for _ in 0..10 {
            p.record(20.0, 0.030);
        }
        let (a, b) = p.fit().unwrap();
        assert_eq!(a, 0.0);
        assert!((b - 0.0015).abs() < 1e-12);
        // true cost below the fitted one for anything larger than 20 units
        let mut q = Pace::with_logits_weight(0.0);
        for i in 0..20 {
            let u = 10.0 + 10.0 * i as f64;
            q.record(u, (0.002 * u - 0.01).max(0.0));
        }
        let (a, b) = q.fit().unwrap();
        assert_eq!(a, 0.0);
        assert!(b > 0.0);
    }

    /// Older iterations weigh less: after the machine slows down, the fit follows.
    #[test]
    fn the_fit_follows_a_slower_machine() {
        let mut p = Pace::with_logits_weight(0.0);
        for i in 0..50 {
            let u = 10.0 + (i % 10) as f64 * 20.0;
            p.record(u, 0.001 * u);
        }
        for i in 0..200 {
            let u = 10.0 + (i % 10) as f64 * 20.0;
            p.record(u, 0.002 * u);
        }
        let (_, b) = p.fit().unwrap();
        assert!((b - 0.002).abs() < 1e-6, "{b}");
    }

    /// Measurements that are not times are ignored; `κ` of a real shape.
    #[test]
    fn bad_measurements_are_ignored() {
        let mut p = Pace::with_logits_weight(f64::NAN);
        for _ in 0..10 {
            p.record(f64::NAN, 1.0);
            p.record(10.0, f64::INFINITY);
            p.record(0.0, 1.0);
            p.record(10.0, -1.0);
        }
        assert_eq!(p.fit(), None);
        assert_eq!(p.units(3, 3), 3.0);
    }
}
