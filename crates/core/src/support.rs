//! The per-step working set: processed logits and the candidate support.
//!
//! A [`Workspace`] holds, for one step, the processed logits of every token (`buf`, dense) and
//! the candidate support, in one of two representations:
//!
//! * **dense** — every token whose processed logit is finite is a candidate (before any
//!   truncation). Masks and penalties edit single entries of `buf` in O(1).
//! * **sparse** — after the first truncation (top-k, top-p, min-p, typical, allowed-ids, T = 0)
//!   the support is an explicit list of `(id, processed logit)` pairs, kept in the canonical
//!   order *(processed logit descending, token id ascending)* whenever probabilities are needed.
//!
//! Probabilities over the current support are always `w_i / S` with `w_i = exp_f32(z_i − m)`,
//! `m` the support maximum and `S` the `f64` sum of the `w_i` in a fixed order (dense: 8 lanes by
//! id; sparse: canonical order). Nothing here allocates after the workspace has been created for
//! a vocabulary size: all buffers are sized once.

use crate::error::{Error, ErrorKind, Result};
use crate::math::{self, exp_f32};

/// One candidate: token id and processed logit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cand {
    /// Token id.
    pub id: u32,
    /// Processed logit.
    pub z: f32,
}

/// Canonical order: processed logit descending, then token id ascending.
#[inline]
pub(crate) fn canonical(a: &Cand, b: &Cand) -> std::cmp::Ordering {
    b.z.partial_cmp(&a.z)
        .unwrap_or(std::cmp::Ordering::Equal)
        .then(a.id.cmp(&b.id))
}

/// Thresholds on `w = exp(z - m)` whose masses are measured during the dense exp pass; they
/// only steer how many tokens the dense top-p collects (results never depend on them).
const TAUS: [f32; 4] = [1e-1, 1e-2, 1e-3, 1e-4];

/// How top-k treats tokens tied with the k-th value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopKTies {
    /// Exactly k tokens; ties at the boundary go to the lower token id.
    ById,
    /// Every token whose logit equals the k-th value is kept (HF, vLLM).
    KeepAll,
}

/// Per-step scratch space and the current support. Create one per thread and reuse it.
#[derive(Debug, Clone)]
pub struct Workspace {
    pub(crate) v: usize,
    /// Processed logits of every token (exact for all tokens while dense, or when `exact`).
    pub(crate) buf: Vec<f32>,
    /// Dense weights `exp(buf - norm_max)` when `dense_w_valid`.
    pub(crate) w: Vec<f32>,
    pub(crate) dense: bool,
    pub(crate) dense_count: usize,
    pub(crate) cands: Vec<Cand>,
    pub(crate) scratch: Vec<Cand>,
    pub(crate) sorted: bool,
    pub(crate) norm_valid: bool,
    pub(crate) norm_max: f32,
    pub(crate) norm_sum: f64,
    pub(crate) dense_w_valid: bool,
    pub(crate) exact: bool,
    pub(crate) stages: Vec<(&'static str, usize)>,
    pub(crate) tscratch: Vec<(f64, u32, f32)>,
    pub(crate) ids_scratch: Vec<u32>,
}

impl Workspace {
    /// A workspace for vocabularies of `vocab_size` tokens.
    pub fn new(vocab_size: usize) -> Self {
        Workspace {
            v: vocab_size,
            buf: vec![0.0; vocab_size],
            w: vec![0.0; vocab_size],
            dense: true,
            dense_count: 0,
            cands: Vec::with_capacity(vocab_size),
            scratch: Vec::with_capacity(vocab_size),
            sorted: false,
            norm_valid: false,
            norm_max: 0.0,
            norm_sum: 0.0,
            dense_w_valid: false,
            exact: false,
            stages: Vec::with_capacity(64),
            tscratch: Vec::with_capacity(vocab_size),
            ids_scratch: Vec::with_capacity(1024),
        }
    }

    /// The vocabulary size this workspace was made for.
    pub fn vocab_size(&self) -> usize {
        self.v
    }

    /// Validates `raw` (no NaN, no `+inf`, right length) and loads it as the processed logits.
    /// `-inf` raw logits are allowed and mean "not selectable".
    pub(crate) fn load(&mut self, raw: &[f32], exact: bool) -> Result<()> {
        if raw.len() != self.v {
            return Err(ErrorKind::VocabSizeMismatch {
                expected: self.v,
                got: raw.len(),
            }
            .into());
        }
        if let Some(e) = check_logits(raw) {
            return Err(e);
        }
        self.buf.copy_from_slice(raw);
        self.dense_count = raw.iter().filter(|&&x| x > f32::NEG_INFINITY).count();
        self.dense = true;
        self.cands.clear();
        self.sorted = false;
        self.norm_valid = false;
        self.dense_w_valid = false;
        self.exact = exact;
        self.stages.clear();
        Ok(())
    }

    /// Number of candidates in the support.
    #[inline]
    pub fn support_len(&self) -> usize {
        if self.dense {
            self.dense_count
        } else {
            self.cands.len()
        }
    }

    /// Whether the support is still dense (no truncation yet).
    pub fn is_dense(&self) -> bool {
        self.dense
    }

    /// Processed logit of every token (exact for all tokens when layers were requested).
    pub fn processed_logits(&self) -> &[f32] {
        &self.buf
    }

    #[inline]
    fn invalidate(&mut self) {
        self.norm_valid = false;
        self.dense_w_valid = false;
    }

    pub(crate) fn record_stage(&mut self, name: &'static str) {
        if self.stages.len() < self.stages.capacity() {
            self.stages.push((name, self.support_len()));
        }
    }

    pub(crate) fn ensure_nonempty(&self, stage: &str) -> Result<()> {
        if self.support_len() == 0 {
            return Err(ErrorKind::EmptySupport {
                stage: stage.to_string(),
            }
            .into());
        }
        Ok(())
    }

    /// Hard-masks one token (`-inf`).
    pub(crate) fn mask(&mut self, id: u32) {
        let i = id as usize;
        if i >= self.v {
            return;
        }
        if self.dense {
            if self.buf[i] > f32::NEG_INFINITY {
                self.buf[i] = f32::NEG_INFINITY;
                self.dense_count -= 1;
                self.invalidate();
            }
        } else {
            self.buf[i] = f32::NEG_INFINITY;
            if let Some(pos) = self.cands.iter().position(|c| c.id == id) {
                self.cands.remove(pos);
                self.invalidate();
            }
        }
    }

    /// Keeps only tokens whose id is in `allowed` (sorted, deduplicated).
    pub(crate) fn retain_ids(&mut self, allowed: &[u32]) {
        if self.dense {
            self.cands.clear();
            for &id in allowed {
                let z = self.buf[id as usize];
                if z > f32::NEG_INFINITY {
                    self.cands.push(Cand { id, z });
                }
            }
            if self.exact {
                self.buf.fill(f32::NEG_INFINITY);
                for c in &self.cands {
                    self.buf[c.id as usize] = c.z;
                }
            }
            self.dense = false;
            self.sorted = false;
        } else {
            let before = self.cands.len();
            self.cands.retain(|c| allowed.binary_search(&c.id).is_ok());
            if self.exact {
                // every token outside `allowed` is masked in the processed layer
                let buf = &mut self.buf;
                let mut next = 0usize;
                for (i, slot) in buf.iter_mut().enumerate() {
                    if next < allowed.len() && allowed[next] as usize == i {
                        next += 1;
                    } else {
                        *slot = f32::NEG_INFINITY;
                    }
                }
            }
            if self.cands.len() == before {
                return;
            }
        }
        self.invalidate();
    }

    /// Applies `f` to the processed logit of `id` in `buf` if it is not masked. A result of
    /// `-inf` masks the token; `+inf` is clamped to `f32::MAX`.
    #[inline]
    pub(crate) fn edit_buf(&mut self, id: u32, f: impl Fn(f32) -> f32) {
        let i = id as usize;
        let old = self.buf[i];
        if old > f32::NEG_INFINITY {
            let mut new = f(old);
            if new == f32::INFINITY {
                new = f32::MAX;
            }
            self.buf[i] = new;
            if self.dense && new == f32::NEG_INFINITY {
                self.dense_count -= 1;
            }
        }
    }

    /// Applies `f(id, z)` to every candidate of a sparse support (`-inf` results leave it).
    pub(crate) fn edit_cands(&mut self, f: impl Fn(u32, f32) -> f32) {
        for c in self.cands.iter_mut() {
            let mut z = f(c.id, c.z);
            if z == f32::INFINITY {
                z = f32::MAX;
            }
            c.z = z;
        }
        self.cands.retain(|c| c.z > f32::NEG_INFINITY);
    }

    /// Marks cached order and normalisers stale after a transform.
    pub(crate) fn after_transform(&mut self) {
        self.sorted = false;
        self.invalidate();
    }

    /// Divides every processed logit by `t > 0`.
    pub(crate) fn divide(&mut self, t: f32) {
        if self.dense || self.exact {
            for x in self.buf.iter_mut() {
                *x /= t;
            }
        }
        if !self.dense {
            for c in self.cands.iter_mut() {
                c.z /= t;
            }
        }
        // canonical order is preserved by a positive division except where it creates ties,
        // which the next sort resolves by id
        self.sorted = false;
        self.invalidate();
    }

    /// Keeps only the argmax (ties → lowest id): the declared `temperature = 0` branch.
    pub(crate) fn keep_argmax(&mut self) {
        let best = self.argmax();
        if let Some(c) = best {
            self.cands.clear();
            self.cands.push(c);
            self.dense = false;
            self.sorted = true;
            self.invalidate();
        }
    }

    /// The support's best candidate by processed logit, ties → lowest id.
    pub(crate) fn argmax(&self) -> Option<Cand> {
        if self.dense {
            let mut best: Option<Cand> = None;
            let mut bz = f32::NEG_INFINITY;
            for (i, &z) in self.buf.iter().enumerate() {
                if z > bz {
                    bz = z;
                    best = Some(Cand { id: i as u32, z });
                }
            }
            best
        } else {
            let mut best: Option<Cand> = None;
            for &c in &self.cands {
                match best {
                    None => best = Some(c),
                    Some(b) if c.z > b.z || (c.z == b.z && c.id < b.id) => best = Some(c),
                    _ => {}
                }
            }
            best
        }
    }

    /// Materialises the dense support as a sparse candidate list (all finite tokens).
    pub(crate) fn to_sparse(&mut self) {
        if !self.dense {
            return;
        }
        self.cands.clear();
        for (i, &z) in self.buf.iter().enumerate() {
            if z > f32::NEG_INFINITY {
                self.cands.push(Cand { id: i as u32, z });
            }
        }
        self.dense = false;
        self.sorted = false;
    }

    /// Sorts the sparse support into canonical order.
    pub(crate) fn sort_canonical(&mut self) {
        if !self.sorted {
            self.cands.sort_unstable_by(canonical);
            self.sorted = true;
        }
    }

    /// Computes `(m, S)` over the current support.
    pub(crate) fn normalize(&mut self) -> (f32, f64) {
        if self.norm_valid {
            return (self.norm_max, self.norm_sum);
        }
        if self.dense {
            let m = math::max_f32(&self.buf);
            let s = math::exp_weights(&self.buf, m, &mut self.w);
            self.norm_max = m;
            self.norm_sum = s;
            self.dense_w_valid = true;
        } else {
            self.sort_canonical();
            let m = self.cands.first().map(|c| c.z).unwrap_or(f32::NEG_INFINITY);
            let mut s = 0.0f64;
            for c in &self.cands {
                s += exp_f32(c.z - m) as f64;
            }
            self.norm_max = m;
            self.norm_sum = s;
        }
        self.norm_valid = true;
        (self.norm_max, self.norm_sum)
    }

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
        let heap = &mut self.cands;
        heap.clear();
        // "worse" = lower z, or equal z and higher id; root holds the worst.
        let worse = |a: &Cand, b: &Cand| a.z < b.z || (a.z == b.z && a.id > b.id);
        let sift_down = |h: &mut Vec<Cand>, mut i: usize| {
            let n = h.len();
            loop {
                let l = 2 * i + 1;
                if l >= n {
                    break;
                }
                let r = l + 1;
                let mut w = l;
                if r < n && worse(&h[r], &h[l]) {
                    w = r;
                }
                if worse(&h[w], &h[i]) {
                    h.swap(w, i);
                    i = w;
                } else {
                    break;
                }
            }
        };
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
        let mut thr = heap[0].z;
        // scan the rest; a later id with an equal z is worse, so only strictly greater enters
        const CH: usize = 16;
        while i < buf.len() {
            let end = (i + CH).min(buf.len());
            let chunk = &buf[i..end];
            if math::max_f32(chunk) > thr {
                for (off, &z) in chunk.iter().enumerate() {
                    if z > thr {
                        heap[0] = Cand {
                            id: (i + off) as u32,
                            z,
                        };
                        sift_down(heap, 0);
                        thr = heap[0].z;
                    }
                }
            }
            i = end;
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
            let n = sparse_prefix(&self.cands, m, s, p, min_keep);
            if n < self.cands.len() {
                self.cands.truncate(n);
                self.invalidate();
            }
        }
    }

    fn dense_top_p(&mut self, p: f64, min_keep: usize) {
        let m = math::max_f32(&self.buf);
        // exp pass: weights, their sum, and the masses above a few thresholds
        let (s, masses) = exp_weights_with_masses(&self.buf, m, &mut self.w);
        self.norm_max = m;
        self.norm_sum = s;
        self.norm_valid = true;
        self.dense_w_valid = true;
        let need = p * s * (1.0 + 1e-4);
        let mut tau = 0.0f32;
        for (j, &t) in TAUS.iter().enumerate() {
            if masses[j] >= need {
                tau = t;
                break;
            }
        }
        if tau == 0.0 {
            // guaranteed: everything below tau carries at most (1-p)/2 of the mass
            tau = (((1.0 - p) * s / (2.0 * self.dense_count.max(1) as f64)) as f32).max(0.0);
        }
        loop {
            self.cands.clear();
            const CH: usize = 16;
            let w = &self.w;
            let mut i = 0;
            while i < w.len() {
                let end = (i + CH).min(w.len());
                let chunk = &w[i..end];
                if math::max_f32(chunk) >= tau {
                    for (off, &x) in chunk.iter().enumerate() {
                        if x >= tau && x > 0.0
                            || (tau == 0.0 && self.buf[i + off] > f32::NEG_INFINITY)
                        {
                            self.cands.push(Cand {
                                id: (i + off) as u32,
                                z: self.buf[i + off],
                            });
                        }
                    }
                }
                i = end;
            }
            self.cands.sort_unstable_by(canonical);
            let all = self.cands.len() >= self.dense_count;
            match dense_prefix(&self.cands, m, s, p, min_keep, all) {
                Some(n) => {
                    self.cands.truncate(n);
                    break;
                }
                None => {
                    if tau == 0.0 {
                        break;
                    }
                    tau = 0.0;
                }
            }
        }
        self.dense = false;
        self.sorted = true;
        self.invalidate();
    }

    /// HF/vLLM top-p rule: sort ascending, remove the tokens whose ascending cumulative
    /// probability is `<= 1 - p`, always keeping the `min_keep` most probable.
    pub(crate) fn top_p_ascending(&mut self, p: f64, min_keep: usize) {
        self.to_sparse();
        let (m, s) = self.normalize(); // sorts canonical (descending)
        let n = self.cands.len();
        let mut removed = 0usize;
        let mut cum = 0.0f64;
        for c in self.cands.iter().rev() {
            cum += exp_f32(c.z - m) as f64 / s;
            if cum <= 1.0 - p {
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
            let m = math::max_f32(&self.buf);
            let lz = crate::math::ln_f64(alpha) as f32 - 1e-3;
            self.cands.clear();
            for (i, &z) in self.buf.iter().enumerate() {
                if z - m >= lz && exp_f32(z - m) as f64 >= alpha {
                    self.cands.push(Cand { id: i as u32, z });
                }
            }
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
        self.to_sparse();
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
fn sparse_prefix(c: &[Cand], m: f32, s: f64, p: f64, min_keep: usize) -> usize {
    let mut cum = 0.0f64;
    for (i, x) in c.iter().enumerate() {
        cum += exp_f32(x.z - m) as f64 / s;
        if cum >= p && i + 1 >= min_keep {
            return i + 1;
        }
    }
    c.len()
}

/// Like [`sparse_prefix`] over a collected top set; `None` when the prefix is not certain to
/// lie inside the collected set (the caller then collects everything).
fn dense_prefix(c: &[Cand], m: f32, s: f64, p: f64, min_keep: usize, all: bool) -> Option<usize> {
    let mut cum = 0.0f64;
    for (i, x) in c.iter().enumerate() {
        cum += exp_f32(x.z - m) as f64 / s;
        if cum >= p && i + 1 >= min_keep {
            return Some(i + 1);
        }
    }
    if all {
        Some(c.len())
    } else {
        None
    }
}

/// `w[i] = exp_f32(z[i] - m)`; returns the lane sum and the (approximate, `f32`) masses of the
/// weights `>= TAUS[j]`.
fn exp_weights_with_masses(z: &[f32], m: f32, w: &mut [f32]) -> (f64, [f64; 4]) {
    let mut acc = [0.0f64; 8];
    let mut mass = [[0.0f32; 8]; 4];
    let n8 = z.len() / 8 * 8;
    let (zh, zt) = z.split_at(n8);
    let (wh, wt) = w.split_at_mut(n8);
    for (zc, wc) in zh.chunks_exact(8).zip(wh.chunks_exact_mut(8)) {
        let mut e = [0.0f32; 8];
        for j in 0..8 {
            e[j] = exp_f32(zc[j] - m);
        }
        wc.copy_from_slice(&e);
        for j in 0..8 {
            acc[j] += e[j] as f64;
        }
        for (t, mt) in TAUS.iter().zip(mass.iter_mut()) {
            for j in 0..8 {
                mt[j] += if e[j] >= *t { e[j] } else { 0.0 };
            }
        }
    }
    for (j, (zv, wv)) in zt.iter().zip(wt.iter_mut()).enumerate() {
        let e = exp_f32(*zv - m);
        *wv = e;
        acc[j] += e as f64;
        for (t, mt) in TAUS.iter().zip(mass.iter_mut()) {
            mt[j] += if e >= *t { e } else { 0.0 };
        }
    }
    let s = acc.iter().sum();
    let mut out = [0.0f64; 4];
    for (o, mt) in out.iter_mut().zip(mass.iter()) {
        *o = mt.iter().map(|&x| x as f64).sum();
    }
    (s, out)
}

/// Returns the error for the first NaN or `+inf` in `raw`, if any.
pub(crate) fn check_logits(raw: &[f32]) -> Option<Error> {
    // fast vectorisable test first; locate the index only when something is wrong
    let mut bad = false;
    for c in raw.chunks(64) {
        let mut b = false;
        for &x in c {
            b |= !(x < f32::INFINITY);
        }
        if b {
            bad = true;
            break;
        }
    }
    if !bad {
        return None;
    }
    raw.iter().position(|x| !(*x < f32::INFINITY)).map(|index| {
        let value = if raw[index].is_nan() { "NaN" } else { "+inf" };
        ErrorKind::NonFiniteLogit { index, value }.into()
    })
}
