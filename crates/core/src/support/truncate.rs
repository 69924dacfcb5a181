//! The truncations of the support: top-k (a heap over the dense row, or the sorted sparse
//! support), top-p (sparse here; the dense search is in `nucleus`), the HF/vLLM ascending top-p,
//! min-p and typical.

use super::sort::worse;
use super::{canonical, Cand, TopKTies, Workspace};
use crate::kernels::{self, collect_min_p, prefix_len, Level};
use crate::math::{self, exp_f32};

impl Workspace {
    /// Top-k with the given tie rule. `k >= 1`.
    pub(crate) fn top_k(&mut self, k: usize, ties: TopKTies) {
        if self.support_len() <= k {
            return;
        }
        if self.dense {
            self.dense_top_k(k);
            if ties == TopKTies::KeepAll {
                let kth = self.cands[k - 1].z;
                self.cands.clear();
                for (i, &z) in self.buf.iter().enumerate() {
                    if z >= kth {
                        self.cands.push(Cand { id: i as u32, z });
                    }
                }
                self.sorted = false;
            }
            self.dense = false;
        } else {
            self.sort_canonical();
            let mut keep = k;
            if ties == TopKTies::KeepAll {
                let kth = self.cands[k - 1].z;
                while keep < self.cands.len() && self.cands[keep].z == kth {
                    keep += 1;
                }
            }
            self.cands.truncate(keep);
        }
        self.invalidate();
    }

    /// Dense top-k by a size-k heap whose root is the worst kept candidate; result in
    /// canonical order in `cands`.
    fn dense_top_k(&mut self, k: usize) {
        let level = self.level();
        let heap = &mut self.cands;
        heap.clear();
        let buf = &self.buf;
        let mut i = 0usize;
        // fill with the first k finite entries
        while heap.len() < k && i < buf.len() {
            let z = buf[i];
            if z > f32::NEG_INFINITY {
                heap.push(Cand { id: i as u32, z });
                // sift up
                let mut j = heap.len() - 1;
                while j > 0 {
                    let p = (j - 1) / 2;
                    if worse(&heap[j], &heap[p]) {
                        heap.swap(j, p);
                        j = p;
                    } else {
                        break;
                    }
                }
            }
            i += 1;
        }
        // scan the rest; a later id with an equal z is worse, so only strictly greater enters
        if heap.len() == k && i < buf.len() {
            let bmax: &[f32] = if self.bmax_valid { &self.bmax } else { &[] };
            kernels::top_k_scan(level, buf, bmax, i, heap);
        }
        heap.sort_unstable_by(canonical);
        self.sorted = true;
    }

    /// Top-p (reference rule): the smallest prefix in canonical order whose cumulative
    /// probability is `>= p`, at least `min_keep` long. `0 < p < 1`.
    pub(crate) fn top_p(&mut self, p: f64, min_keep: usize) {
        if self.dense {
            self.dense_top_p(p, min_keep);
        } else {
            let (m, s) = self.normalize();
            let n = sparse_prefix(self.level(), &self.cands, m, s, p, min_keep);
            if n < self.cands.len() {
                self.cands.truncate(n);
                self.invalidate();
            }
        }
    }

    /// HF/vLLM top-p rule: sort ascending, remove the tokens whose ascending cumulative
    /// probability is `<= 1 - p`, always keeping the `min_keep` most probable.
    pub(crate) fn top_p_ascending(&mut self, p: f64, min_keep: usize) {
        self.make_sparse();
        let (m, s) = self.normalize(); // sorts canonical (descending)
        let n = self.cands.len();
        let mut removed = 0usize;
        // compared in weight space, `Σ_tail w_i <= (1 − p)·S`, not as a sum of quotients
        // `w_i / S`: the weights are exact `f32` values, so at an exact boundary (18 equal
        // weights, p = 0.5: a tail of 9 holds exactly half) every partial sum and the bound
        // are exact and the comparison is exact arithmetic's, where summing quotients rounds
        // 9 × (1/18) above 0.5 and keeps one token too many
        let bound = (1.0 - p) * s;
        let mut cum = 0.0f64;
        for c in self.cands.iter().rev() {
            cum += exp_f32(c.z - m) as f64;
            if cum <= bound {
                removed += 1;
            } else {
                break;
            }
        }
        let keep = (n - removed).max(min_keep.min(n)).max(1);
        if keep < n {
            self.cands.truncate(keep);
            self.invalidate();
        }
    }

    /// Min-p: keeps tokens with `w_i >= alpha` where `w_i = exp(z_i - m)` (i.e. `p_i >= alpha *
    /// p_max`), at least `min_keep`.
    pub(crate) fn min_p(&mut self, alpha: f64, min_keep: usize) {
        if self.dense {
            let m = self.dense_max();
            let lz = crate::math::ln_f64(alpha) as f32 - 1e-3;
            self.cands.clear();
            collect_min_p(self.level(), &self.buf, m, lz, alpha, &mut self.cands);
            if self.cands.len() < min_keep.min(self.dense_count) {
                // rare: fall back to the exact top-min_keep
                self.dense_top_k(min_keep.min(self.dense_count));
            }
            self.dense = false;
            self.sorted = false;
            self.invalidate();
        } else {
            self.sort_canonical();
            let m = self.cands.first().map(|c| c.z).unwrap_or(0.0);
            let mut n = 0;
            while n < self.cands.len()
                && (exp_f32(self.cands[n].z - m) as f64 >= alpha || n < min_keep)
            {
                n += 1;
            }
            if n < self.cands.len() {
                self.cands.truncate(n.max(1));
                self.invalidate();
            }
        }
    }

    /// Typical-p: order by `|−log p_i − H|` ascending (ties → lower id), keep the smallest prefix
    /// whose cumulative probability is `>= tau` (at least `min_keep`); with `keep_ties`, also every
    /// token tied with the last kept deviation (HF).
    pub(crate) fn typical(&mut self, tau: f64, min_keep: usize, keep_ties: bool) {
        self.make_sparse();
        let (m, s) = self.normalize();
        let ln_s = math::ln_f64(s);
        // entropy H = -sum p log p
        let mut h = 0.0f64;
        for c in &self.cands {
            let lp = (c.z - m) as f64 - ln_s;
            let p = exp_f32(c.z - m) as f64 / s;
            if p > 0.0 {
                h -= p * lp;
            }
        }
        self.tscratch.clear();
        for c in &self.cands {
            let lp = (c.z - m) as f64 - ln_s;
            self.tscratch.push(((-lp - h).abs(), c.id, c.z));
        }
        let idx = &mut self.tscratch;
        idx.sort_unstable_by(|a, b| {
            a.0.partial_cmp(&b.0)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(a.1.cmp(&b.1))
        });
        let mut cum = 0.0f64;
        let mut n = 0usize;
        for &(_, _, z) in idx.iter() {
            cum += exp_f32(z - m) as f64 / s;
            n += 1;
            if cum >= tau && n >= min_keep {
                break;
            }
        }
        if keep_ties {
            while n < idx.len() && idx[n].0 == idx[n - 1].0 {
                n += 1;
            }
        }
        if n < idx.len() {
            self.cands.clear();
            for &(_, id, z) in &idx[..n] {
                self.cands.push(Cand { id, z });
            }
            self.sorted = false;
            self.invalidate();
        }
    }
}

/// Returns the smallest `n >= max(1, min_keep)` such that the canonical-order cumulative
/// probability of the first `n` is `>= p` (or all of them).
fn sparse_prefix(level: Level, c: &[Cand], m: f32, s: f64, p: f64, min_keep: usize) -> usize {
    prefix_len(level, c, m, s, p, min_keep).unwrap_or(c.len())
}
