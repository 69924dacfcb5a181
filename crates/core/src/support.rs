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
use crate::math::{self, exp_f32, multiversion};

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

/// The dense top-p exp pass remembers every token whose weight `w = exp(z - m)` is at least
/// `2^-(HIT_BUCKETS - 1)`, with the mass of those weights by binary order of magnitude; that only
/// steers how many tokens are collected and sorted (results never depend on it: `exp_f32` is
/// monotone, so every collection `w >= tau` is a prefix of the canonical order).
const HIT_BUCKETS: usize = 15;

/// Lower thresholds on `w` for the dense top-p when the heavy tokens do not hold the needed mass
/// (flat distributions); again they only steer how much is collected.
const LOW_TAUS: [f32; 8] = [
    1.0 / (1u64 << 15) as f32,
    1.0 / (1u64 << 16) as f32,
    1.0 / (1u64 << 17) as f32,
    1.0 / (1u64 << 18) as f32,
    1.0 / (1u64 << 19) as f32,
    1.0 / (1u64 << 21) as f32,
    1.0 / (1u64 << 24) as f32,
    1.0 / (1u64 << 30) as f32,
];

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
    /// Ids and weights of the heavy tokens found by the dense top-p exp pass.
    pub(crate) hits: Vec<(u32, f32)>,
    /// Second buffer for radix sorts of the support.
    pub(crate) aux: Vec<Cand>,
    /// The maximum of `buf` (as [`math::max_f32`] computes it) when `max_valid`.
    pub(crate) max_cache: f32,
    pub(crate) max_valid: bool,
    /// An upper bound of every block of [`BLOCK`] values of `buf` when `bmax_valid` (exact after
    /// loading; raised by edits, never lowered): scans skip whole blocks with it.
    pub(crate) bmax: Vec<f32>,
    pub(crate) bmax_valid: bool,
}

/// Block length of [`Workspace::bmax`].
pub(crate) const BLOCK: usize = 64;

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
            hits: Vec::with_capacity(vocab_size),
            aux: Vec::with_capacity(vocab_size),
            max_cache: f32::NEG_INFINITY,
            max_valid: false,
            bmax: vec![f32::NEG_INFINITY; vocab_size.div_ceil(BLOCK)],
            bmax_valid: false,
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
        // one pass: copy, validate, count the selectable tokens and take the maximum
        let (bad, count, max) = load(raw, &mut self.buf, &mut self.bmax);
        if bad {
            self.dense = true;
            self.dense_count = 0;
            self.cands.clear();
            self.max_valid = false;
            self.bmax_valid = false;
            self.norm_valid = false;
            self.dense_w_valid = false;
            return Err(check_logits(raw).expect("a NaN or +inf was seen"));
        }
        self.dense_count = count;
        self.max_cache = max;
        self.max_valid = true;
        self.bmax_valid = true;
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
            let old = self.buf[i];
            if old > f32::NEG_INFINITY {
                if old == self.max_cache {
                    self.max_valid = false;
                }
                self.buf[i] = f32::NEG_INFINITY;
                self.dense_count -= 1;
                self.invalidate();
            }
        } else {
            self.max_valid = false;
            self.buf[i] = f32::NEG_INFINITY;
            if let Some(pos) = self.cands.iter().position(|c| c.id == id) {
                self.cands.remove(pos);
                self.invalidate();
            }
        }
    }

    /// Keeps only tokens whose id is in `allowed` (sorted, deduplicated).
    ///
    /// A dense support stays dense when `allowed` holds at least a quarter of the vocabulary
    /// (a constraint inside a free-form string allows most tokens): the others are masked in
    /// place, so later truncations keep their dense, sort-free paths.
    pub(crate) fn retain_ids(&mut self, allowed: &[u32]) {
        if self.dense && allowed.len().saturating_mul(4) >= self.v {
            let mut next = 0usize;
            let mut count = 0usize;
            for (i, slot) in self.buf.iter_mut().enumerate() {
                if next < allowed.len() && allowed[next] as usize == i {
                    next += 1;
                    count += (*slot > f32::NEG_INFINITY) as usize;
                } else {
                    *slot = f32::NEG_INFINITY;
                }
            }
            if count != self.dense_count {
                self.dense_count = count;
                self.max_valid = false;
                self.invalidate();
            }
            return;
        }
        if self.dense {
            self.cands.clear();
            for &id in allowed {
                let z = self.buf[id as usize];
                if z > f32::NEG_INFINITY {
                    self.cands.push(Cand { id, z });
                }
            }
            self.max_valid = false;
            self.bmax_valid = false;
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
            self.max_valid = false;
            self.bmax_valid = false;
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
            if old == self.max_cache || new > self.max_cache {
                self.max_valid = false;
            }
            let b = &mut self.bmax[i / BLOCK];
            if new > *b {
                *b = new;
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

    /// Divides every processed logit by `t > 0`, saturating at `±f32::MAX`: a tiny `t` must not
    /// turn a finite logit into `±inf` (a `-inf` would hide the token without updating the
    /// support count, a `+inf` makes every probability NaN). Masked (`-inf`) entries stay masked.
    pub(crate) fn divide(&mut self, t: f32) {
        let div = |x: f32| {
            if x > f32::NEG_INFINITY {
                (x / t).clamp(-f32::MAX, f32::MAX)
            } else {
                x
            }
        };
        if self.dense || self.exact {
            for x in self.buf.iter_mut() {
                *x = div(*x);
            }
            // `div` is monotone: block bounds stay bounds, and the maximum maps to the new
            // maximum (only the sign of a zero maximum could depend on the order: recompute it)
            for b in self.bmax.iter_mut() {
                *b = div(*b);
            }
            self.max_cache = div(self.max_cache);
            self.max_valid &= self.max_cache != 0.0;
        } else {
            self.max_valid = false;
        }
        if !self.dense {
            for c in self.cands.iter_mut() {
                c.z = div(c.z);
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

    /// `math::max_f32(&self.buf)`, from the value taken while loading when no edit since could
    /// have changed it.
    #[inline]
    pub(crate) fn dense_max(&self) -> f32 {
        if self.max_valid {
            self.max_cache
        } else {
            math::max_f32(&self.buf)
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
    pub(crate) fn make_sparse(&mut self) {
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
            let m = self.dense_max();
            let s = math::exp_weights(&self.buf, m, &mut self.w);
            self.norm_max = m;
            self.norm_sum = s;
            self.dense_w_valid = true;
        } else {
            self.sort_canonical();
            let m = self.cands.first().map(|c| c.z).unwrap_or(f32::NEG_INFINITY);
            let s = cand_exp_sum(&self.cands, m);
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
            #[cfg(all(target_arch = "x86_64", nextok_avx512))]
            if math::simd::level() >= math::simd::AVX512 {
                // SAFETY: the CPU supports AVX-512 (`simd::detected`).
                unsafe { top_k_scan_avx512(buf, bmax, i, heap) };
            } else {
                top_k_scan(buf, bmax, i, heap);
            }
            #[cfg(not(all(target_arch = "x86_64", nextok_avx512)))]
            top_k_scan(buf, bmax, i, heap);
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
        let m = self.dense_max();
        // exp pass: the sum of the weights, and the heavy tokens with their masses by magnitude
        self.hits.clear();
        let (s, stored) = exp_weights_with_hits(&self.buf, m, &mut self.w, &mut self.hits);
        // the (approximate) mass of the heavy tokens by magnitude
        let mut hist = [0.0f64; HIT_BUCKETS];
        for &(_, x) in &self.hits {
            hist[hit_bucket(x)] += x as f64;
        }
        self.norm_max = m;
        self.norm_sum = s;
        self.norm_valid = true;
        self.dense_w_valid = stored;
        let need = p * s * (1.0 + 1e-4);
        let mut done = false;
        let mut mass = 0.0f64;
        if let Some(b) = hist.iter().position(|&h| {
            mass += h;
            mass >= need
        }) {
            // collect the hits down to the first magnitude that holds the needed mass
            let tau = f32::from_bits((127 - b as u32) << 23); // 2^-b
            self.cands.clear();
            for &(id, x) in &self.hits {
                if x >= tau {
                    self.cands.push(Cand {
                        id,
                        z: self.buf[id as usize],
                    });
                }
            }
            // collected in id order: a stable sort by score gives the canonical order
            sort_canonical_from_id_order(&mut self.cands, &mut self.aux);
            let all = self.cands.len() >= self.dense_count;
            if let Some(n) = dense_prefix(&self.cands, m, s, p, min_keep, all) {
                self.cands.truncate(n);
                done = true;
            }
        }
        if !done {
            if !self.dense_w_valid {
                math::exp_weights(&self.buf, m, &mut self.w);
                self.dense_w_valid = true;
            }
            // guaranteed: everything below this carries at most (1-p)/2 of the mass
            let guaranteed =
                (((1.0 - p) * s / (2.0 * self.dense_count.max(1) as f64)) as f32).max(0.0);
            // the largest lower threshold that (measured approximately, with a margin) still
            // holds the needed mass, never below the guaranteed one
            let masses = threshold_masses(&self.w);
            let mut tau = LOW_TAUS
                .iter()
                .zip(masses)
                .find(|(_, mass)| *mass >= need * 1.01)
                .map_or(guaranteed, |(&t, _)| t.max(guaranteed));
            loop {
                self.cands.clear();
                collect(&self.buf, &self.w, tau, &mut self.cands);
                sort_canonical_from_id_order(&mut self.cands, &mut self.aux);
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
        }
        self.dense = false;
        self.sorted = true;
        self.invalidate();
    }

    /// HF/vLLM top-p rule: sort ascending, remove the tokens whose ascending cumulative
    /// probability is `<= 1 - p`, always keeping the `min_keep` most probable.
    pub(crate) fn top_p_ascending(&mut self, p: f64, min_keep: usize) {
        self.make_sparse();
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
            let m = self.dense_max();
            let lz = crate::math::ln_f64(alpha) as f32 - 1e-3;
            self.cands.clear();
            collect_min_p(&self.buf, m, lz, alpha, &mut self.cands);
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
fn sparse_prefix(c: &[Cand], m: f32, s: f64, p: f64, min_keep: usize) -> usize {
    prefix_len(c, m, s, p, min_keep).unwrap_or(c.len())
}

/// Like [`sparse_prefix`] over a collected top set; `None` when the prefix is not certain to
/// lie inside the collected set (the caller then collects everything).
fn dense_prefix(c: &[Cand], m: f32, s: f64, p: f64, min_keep: usize, all: bool) -> Option<usize> {
    prefix_len(c, m, s, p, min_keep).or(if all { Some(c.len()) } else { None })
}

/// `exp_f32(c[j].z - m)` for up to 16 candidates (the rest of `out` is left alone).
#[inline(always)]
pub(crate) fn cand_exps(c: &[Cand], m: f32, out: &mut [f32; 16]) {
    if let Ok(c) = <&[Cand; 16]>::try_from(c) {
        for (o, x) in out.iter_mut().zip(c) {
            *o = exp_f32(x.z - m);
        }
    } else {
        for (o, x) in out.iter_mut().zip(c) {
            *o = exp_f32(x.z - m);
        }
    }
}

multiversion! {
    /// The smallest `n >= min_keep` whose cumulative probability `sum_{i<n} exp_f32(c[i].z - m)
    /// / s` (added in order) is `>= p`, if any. The weights are computed 16 at a time.
    fn prefix_len(c: &[Cand], m: f32, s: f64, p: f64, min_keep: usize) -> Option<usize> {
        let mut cum = 0.0f64;
        let mut e = [0.0f32; 16];
        for (b, block) in c.chunks(16).enumerate() {
            cand_exps(block, m, &mut e);
            for (j, &w) in e.iter().enumerate().take(block.len()) {
                cum += w as f64 / s;
                let i = 16 * b + j;
                if cum >= p && i + 1 >= min_keep {
                    return Some(i + 1);
                }
            }
        }
        None
    }
}

multiversion! {
    /// `sum_i exp_f32(c[i].z - m)` in `f64`, added in order.
    fn cand_exp_sum(c: &[Cand], m: f32) -> f64 {
        let mut s = 0.0f64;
        let mut e = [0.0f32; 16];
        for block in c.chunks(16) {
            cand_exps(block, m, &mut e);
            for &w in e.iter().take(block.len()) {
                s += w as f64;
            }
        }
        s
    }
}

/// Whether `x` is NaN or `+inf` (the raw logits nextok rejects); one comparison, so it vectorises.
#[inline(always)]
#[allow(clippy::neg_cmp_op_on_partial_ord)]
fn nan_or_pos_inf(x: f32) -> bool {
    !(x < f32::INFINITY)
}

/// A key whose ascending order is the descending order of `z` (no NaN), with `-0.0 == 0.0`.
#[inline(always)]
fn descending_key(z: f32) -> u32 {
    let b = (z + 0.0).to_bits(); // -0.0 + 0.0 = +0.0
    let ascending = if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    };
    !ascending
}

/// Stable LSD radix sort of `v` by the low `bits` bits of `key`, with `tmp` as scratch (no
/// allocation when `tmp` can hold `v`). Passes whose digit is the same for every element are
/// skipped.
fn radix_sort_by(v: &mut [Cand], tmp: &mut Vec<Cand>, bits: u32, key: impl Fn(&Cand) -> u32) {
    const DIGIT: u32 = 8;
    let n = v.len();
    tmp.clear();
    tmp.resize(n, Cand { id: 0, z: 0.0 });
    let mut in_v = true;
    let mut shift = 0;
    while shift < bits {
        let (src, dst) = if in_v {
            (&v[..], &mut tmp[..])
        } else {
            (&tmp[..], &mut v[..])
        };
        let mut count = [0usize; 1 << DIGIT];
        for c in src {
            count[((key(c) >> shift) & 0xff) as usize] += 1;
        }
        if !count.contains(&n) {
            let mut sum = 0;
            for c in count.iter_mut() {
                let k = *c;
                *c = sum;
                sum += k;
            }
            for c in src {
                let d = ((key(c) >> shift) & 0xff) as usize;
                dst[count[d]] = *c;
                count[d] += 1;
            }
            in_v = !in_v;
        }
        shift += DIGIT;
    }
    if !in_v {
        v.copy_from_slice(tmp);
    }
}

/// Sorts candidates listed in ascending id order into the canonical order (a stable sort by
/// score descending keeps equal scores in id order).
fn sort_canonical_from_id_order(v: &mut [Cand], tmp: &mut Vec<Cand>) {
    if v.len() < 128 {
        v.sort_unstable_by(canonical);
    } else {
        radix_sort_by(v, tmp, 32, |c| descending_key(c.z));
    }
}

/// Sorts candidates by id (ids are distinct and below `vocab_size`).
pub(crate) fn sort_by_id(v: &mut [Cand], tmp: &mut Vec<Cand>, vocab_size: usize) {
    if v.len() < 128 {
        v.sort_unstable_by_key(|c| c.id);
    } else {
        let bits = usize::BITS - vocab_size.saturating_sub(1).leading_zeros();
        radix_sort_by(v, tmp, bits, |c| c.id);
    }
}

/// "Worse" in a top-k heap: lower z, or equal z and higher id (the root holds the worst).
#[inline(always)]
fn worse(a: &Cand, b: &Cand) -> bool {
    a.z < b.z || (a.z == b.z && a.id > b.id)
}

#[inline(always)]
fn sift_down(h: &mut [Cand], mut i: usize) {
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
}

/// Whether any of the 32 values exceeds `t`.
#[inline(always)]
fn any_gt(c: &[f32], t: f32) -> bool {
    let mut acc = [f32::NEG_INFINITY; 8];
    for k in 0..4 {
        for j in 0..8 {
            let x = c[8 * k + j];
            acc[j] = if x > acc[j] { x } else { acc[j] };
        }
    }
    let mut any = false;
    for a in acc {
        any |= a > t;
    }
    any
}

/// Copies `raw` into `buf`, writes the maximum of every block of [`BLOCK`] values to `bmax`, and
/// returns (whether a NaN or `+inf` was seen, the number of values above `-inf`, the maximum
/// exactly as [`math::max_f32`] gives it).
fn load(raw: &[f32], buf: &mut [f32], bmax: &mut [f32]) -> (bool, usize, f32) {
    assert!(raw.len() == buf.len() && bmax.len() == raw.len().div_ceil(BLOCK));
    #[cfg(all(target_arch = "x86_64", nextok_avx512))]
    let (bad, count, max) = if math::simd::level() >= math::simd::AVX512 {
        // SAFETY: the CPU supports AVX-512 (`simd::detected`); the lengths are checked above.
        unsafe { load_avx512(raw, buf, bmax) }
    } else {
        load_kernel(raw, buf, bmax)
    };
    #[cfg(not(all(target_arch = "x86_64", nextok_avx512)))]
    let (bad, count, max) = load_kernel(raw, buf, bmax);
    // the maximum value is right; only the sign of a zero maximum depends on the order
    let max = if max == 0.0 && !bad {
        math::max_f32(raw)
    } else {
        max
    };
    (bad, count, max)
}

/// [`load`] on 16 lanes: one pass, copying, validating, counting, and taking the maximum with
/// 4 × 16 independent lanes (the maximum *value* does not depend on the order).
#[cfg(all(target_arch = "x86_64", nextok_avx512))]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt")]
unsafe fn load_avx512(raw: &[f32], buf: &mut [f32], bmax: &mut [f32]) -> (bool, usize, f32) {
    use std::arch::x86_64::*;
    let n = raw.len() / 64 * 64;
    let inf = _mm512_set1_ps(f32::INFINITY);
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut mx = [ninf; 4];
    let mut bad: u16 = 0;
    let mut cnt = _mm512_setzero_si512();
    let one = _mm512_set1_epi32(1);
    let mut i = 0;
    while i < n {
        let p = raw.as_ptr().add(i);
        let q = buf.as_mut_ptr().add(i);
        let mut x = [ninf; 4];
        for (k, (m, xk)) in mx.iter_mut().zip(x.iter_mut()).enumerate() {
            *xk = _mm512_loadu_ps(p.add(16 * k));
            let ok = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(*xk, inf);
            // a NaN or +inf is not copied: the load fails anyway (and a plain store would be
            // turned into a separate copy pass by the compiler)
            _mm512_mask_storeu_ps(q.add(16 * k), ok, *xk);
            bad |= !ok;
            cnt = _mm512_mask_add_epi32(cnt, _mm512_cmp_ps_mask::<_CMP_GT_OQ>(*xk, ninf), cnt, one);
            *m = _mm512_max_ps(*xk, *m);
        }
        let b = _mm512_max_ps(_mm512_max_ps(x[0], x[1]), _mm512_max_ps(x[2], x[3]));
        *bmax.get_unchecked_mut(i / 64) = _mm512_reduce_max_ps(b);
        i += 64;
    }
    let mut c = [0u32; 16];
    _mm512_storeu_si512(c.as_mut_ptr().cast(), cnt);
    let mut count: usize = c.iter().map(|&x| x as usize).sum();
    let mut m = f32::NEG_INFINITY;
    for v in mx {
        let mut a = [0.0f32; 16];
        _mm512_storeu_ps(a.as_mut_ptr(), v);
        for x in a {
            if x > m {
                m = x;
            }
        }
    }
    let mut any_bad = bad != 0;
    let mut tail = f32::NEG_INFINITY;
    for (&x, b) in raw[n..].iter().zip(buf[n..].iter_mut()) {
        *b = x;
        any_bad |= nan_or_pos_inf(x);
        count += (x > f32::NEG_INFINITY) as usize;
        if x > m {
            m = x;
        }
        if x > tail {
            tail = x;
        }
    }
    if n < raw.len() {
        bmax[n / 64] = tail;
    }
    (any_bad, count, m)
}

multiversion! {
    /// [`load`]: one pass, with 16 independent lanes for the maximum (its *value* does not depend
    /// on the order; the caller settles the sign of a zero maximum).
    fn load_kernel(raw: &[f32], buf: &mut [f32], bmax: &mut [f32]) -> (bool, usize, f32) {
        const L: usize = 16;
        let n = raw.len().min(buf.len()) / BLOCK * BLOCK;
        let mut bad = [0u32; L];
        let mut cnt = [0u32; L];
        let mut mx = [f32::NEG_INFINITY; L];
        for ((r, b), bm) in raw[..n]
            .chunks_exact(BLOCK)
            .zip(buf[..n].chunks_exact_mut(BLOCK))
            .zip(bmax.iter_mut())
        {
            let mut blk = [f32::NEG_INFINITY; L];
            for (rh, bh) in r.chunks_exact(L).zip(b.chunks_exact_mut(L)) {
                let v: [f32; L] = rh.try_into().expect("chunk");
                for j in 0..L {
                    let x = v[j];
                    bad[j] |= nan_or_pos_inf(x) as u32;
                    cnt[j] += (x > f32::NEG_INFINITY) as u32;
                    blk[j] = if x > blk[j] { x } else { blk[j] };
                }
                bh.copy_from_slice(&v);
            }
            for j in 0..L {
                mx[j] = if blk[j] > mx[j] { blk[j] } else { mx[j] };
            }
            *bm = blk.iter().fold(f32::NEG_INFINITY, |a, &x| if x > a { x } else { a });
        }
        let mut any_bad = false;
        let mut count = 0usize;
        let mut m = f32::NEG_INFINITY;
        for j in 0..L {
            any_bad |= bad[j] != 0;
            count += cnt[j] as usize;
            if mx[j] > m {
                m = mx[j];
            }
        }
        let mut tail = f32::NEG_INFINITY;
        for (&x, b) in raw[n..].iter().zip(buf[n..].iter_mut()) {
            *b = x;
            any_bad |= nan_or_pos_inf(x);
            count += (x > f32::NEG_INFINITY) as usize;
            if x > m {
                m = x;
            }
            if x > tail {
                tail = x;
            }
        }
        if n < raw.len() {
            bmax[n / BLOCK] = tail;
        }
        (any_bad, count, m)
    }
}

/// [`top_k_scan`] testing 64 values at a time.
#[cfg(all(target_arch = "x86_64", nextok_avx512))]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt")]
unsafe fn top_k_scan_avx512(buf: &[f32], bmax: &[f32], start: usize, heap: &mut [Cand]) {
    use std::arch::x86_64::*;
    let mut thr = heap[0].z;
    let mut enter = |i: usize, z: f32, thr: &mut f32| {
        if z > *thr {
            heap[0] = Cand { id: i as u32, z };
            sift_down(heap, 0);
            *thr = heap[0].z;
        }
    };
    // up to the next block boundary one by one, then whole blocks
    let first = start.next_multiple_of(BLOCK).min(buf.len());
    for (off, &z) in buf[start..first].iter().enumerate() {
        enter(start + off, z, &mut thr);
    }
    let n = first + (buf.len() - first) / BLOCK * BLOCK;
    let mut i = first;
    while i < n {
        if bmax.get(i / BLOCK).is_some_and(|&b| b <= thr) {
            i += BLOCK;
            continue;
        }
        let t = _mm512_set1_ps(thr);
        let p = buf.as_ptr().add(i);
        let m0 = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_loadu_ps(p), t);
        let m1 = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_loadu_ps(p.add(16)), t);
        let m2 = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_loadu_ps(p.add(32)), t);
        let m3 = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_loadu_ps(p.add(48)), t);
        let mut bits = m0 as u64 | (m1 as u64) << 16 | (m2 as u64) << 32 | (m3 as u64) << 48;
        // only the values above the threshold at the start of the block can enter; visiting
        // them in id order is the plain scan with the others skipped
        while bits != 0 {
            let j = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            enter(i + j, buf[i + j], &mut thr);
        }
        i += BLOCK;
    }
    for (off, &z) in buf[n..].iter().enumerate() {
        enter(n + off, z, &mut thr);
    }
}

multiversion! {
    /// The top-k scan from `start` with a full heap: only values strictly above the worst kept
    /// one enter. Blocks whose bound in `bmax` (when given) cannot enter are skipped, the others
    /// are tested with one vector comparison.
    fn top_k_scan(buf: &[f32], bmax: &[f32], start: usize, heap: &mut [Cand]) {
        let mut thr = heap[0].z;
        let mut enter = |i: usize, z: f32, thr: &mut f32| {
            if z > *thr {
                heap[0] = Cand { id: i as u32, z };
                sift_down(heap, 0);
                *thr = heap[0].z;
            }
        };
        let first = start.next_multiple_of(BLOCK).min(buf.len());
        for (off, &z) in buf[start..first].iter().enumerate() {
            enter(start + off, z, &mut thr);
        }
        let mut i = first;
        for c in buf[first..].chunks(BLOCK) {
            let skip = bmax.get(i / BLOCK).is_some_and(|&b| b <= thr)
                || (c.len() == BLOCK && !(any_gt(&c[..32], thr) || any_gt(&c[32..], thr)));
            if !skip {
                for (off, &z) in c.iter().enumerate() {
                    enter(i + off, z, &mut thr);
                }
            }
            i += c.len();
        }
    }
}

multiversion! {
    /// Pushes `(id, z)` for every `z` with `z - m >= lz` and `exp_f32(z - m) >= alpha`, in id
    /// order; blocks of 32 with no `z - m >= lz` are skipped with one vector test.
    fn collect_min_p(z: &[f32], m: f32, lz: f32, alpha: f64, out: &mut Vec<Cand>) {
        let mut i = 0;
        for c in z.chunks(32) {
            let mut acc = [f32::NEG_INFINITY; 8];
            if c.len() == 32 {
                for k in 0..4 {
                    for j in 0..8 {
                        let d = c[8 * k + j] - m;
                        acc[j] = if d > acc[j] { d } else { acc[j] };
                    }
                }
            }
            let mut near = c.len() < 32;
            for a in acc {
                near |= a >= lz;
            }
            if near {
                for (off, &x) in c.iter().enumerate() {
                    if x - m >= lz && exp_f32(x - m) as f64 >= alpha {
                        out.push(Cand { id: (i + off) as u32, z: x });
                    }
                }
            }
            i += c.len();
        }
    }
}

/// The magnitude bucket of a weight in `[2^-(HIT_BUCKETS-1), 1]`: `b` for `w` in `[2^-b, 2^(1-b))`.
#[inline(always)]
fn hit_bucket(w: f32) -> usize {
    let e = (w.to_bits() >> 23) as i32;
    (127 - e).clamp(0, HIT_BUCKETS as i32 - 1) as usize
}

/// The consumer of the dense top-p exp pass: the lane sum, and the heavy tokens.
struct HitScan<'a> {
    acc: [f64; 8],
    tmin: f32,
    hits: &'a mut Vec<(u32, f32)>,
}

/// Records the weights `>= tmin` of chunk `k` (rare: kept out of the vector loop).
#[cold]
#[inline(never)]
fn record_hits(k: usize, c: &[f32], tmin: f32, hits: &mut Vec<(u32, f32)>) {
    for (j, &x) in c.iter().enumerate() {
        if x >= tmin {
            hits.push(((math::EXP_CHUNK * k + j) as u32, x));
        }
    }
}

impl math::ChunkVisitor for HitScan<'_> {
    #[inline(always)]
    fn visit(&mut self, k: usize, c: &[f32; math::EXP_CHUNK]) {
        math::add_lanes16(&mut self.acc, c);
        let mut any = false;
        for &x in c {
            any |= x >= self.tmin;
        }
        if any {
            record_hits(k, c, self.tmin, self.hits);
        }
    }
}

/// Returns the lane sum of the weights `exp_f32(z[i] - m)` (the order of [`math::sum_f64_lanes`])
/// and whether they were also stored in `w`; pushes the id and weight of every weight
/// `>= 2^-(HIT_BUCKETS-1)` onto `hits`, in id order.
fn exp_weights_with_hits(
    z: &[f32],
    m: f32,
    w: &mut [f32],
    hits: &mut Vec<(u32, f32)>,
) -> (f64, bool) {
    #[cfg(all(target_arch = "x86_64", nextok_avx512))]
    if math::simd::level() >= math::simd::AVX512 {
        // SAFETY: the CPU supports AVX-512 (`simd::detected`).
        return (unsafe { exp_weights_with_hits_avx512(z, m, w, hits) }, true);
    }
    (exp_weights_with_hits_multi(z, m, w, hits), true)
}

#[cfg(all(target_arch = "x86_64", nextok_avx512))]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt")]
unsafe fn exp_weights_with_hits_avx512(
    z: &[f32],
    m: f32,
    w: &mut [f32],
    hits: &mut Vec<(u32, f32)>,
) -> f64 {
    let tmin = f32::from_bits((128 - HIT_BUCKETS as u32) << 23);
    let mut acc = [0.0f64; 8];
    let mut found = std::mem::take(hits);
    let on_hit = |start: usize, mut bits: u64, block: &[f32; 64]| {
        while bits != 0 {
            let j = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            found.push(((start + j) as u32, block[j]));
        }
    };
    let n = math::x86::exp_blocks(z, m, Some(&mut *w), &mut acc, tmin, on_hit);
    for (i, (&x, wi)) in z.iter().zip(w.iter_mut()).enumerate().skip(n) {
        let e = exp_f32(x - m);
        *wi = e;
        acc[i % 8] += e as f64;
        if e >= tmin {
            found.push((i as u32, e));
        }
    }
    *hits = found;
    acc.iter().sum()
}

multiversion! {
    fn exp_weights_with_hits_multi(
        z: &[f32],
        m: f32,
        w: &mut [f32],
        hits: &mut Vec<(u32, f32)>,
    ) -> f64 {
        let mut scan = HitScan {
            acc: [0.0f64; 8],
            tmin: f32::from_bits((128 - HIT_BUCKETS as u32) << 23),
            hits,
        };
        let n = math::exp_pass(z, m, w, &mut scan);
        let mut acc = scan.acc;
        for (i, &x) in z.iter().enumerate().skip(n) {
            let e = exp_f32(x - m);
            w[i] = e;
            acc[i % 8] += e as f64;
            if e >= scan.tmin {
                scan.hits.push((i as u32, e));
            }
        }
        acc.iter().sum()
    }
}

multiversion! {
    /// Pushes `(id, z)` for every token with `w >= tau` and `w > 0` (with `tau == 0`: every token
    /// above `-inf`), in id order.
    fn collect_weights(z: &[f32], w: &[f32], tau: f32, out: &mut Vec<Cand>) {
        let n = z.len().min(w.len());
        let keep = |x: f32, zi: f32| x >= tau && x > 0.0 || (tau == 0.0 && zi > f32::NEG_INFINITY);
        let n32 = n / 32 * 32;
        let mut i = 0;
        while i < n32 {
            let (zc, wc) = (&z[i..i + 32], &w[i..i + 32]);
            let mut bits = 0u32;
            for j in 0..32 {
                bits |= (keep(wc[j], zc[j]) as u32) << j;
            }
            while bits != 0 {
                let j = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                out.push(Cand {
                    id: (i + j) as u32,
                    z: zc[j],
                });
            }
            i += 32;
        }
        for j in n32..n {
            if keep(w[j], z[j]) {
                out.push(Cand { id: j as u32, z: z[j] });
            }
        }
    }
}

/// [`collect_weights`], 64 values at a time on AVX-512 when `tau > 0`.
fn collect(z: &[f32], w: &[f32], tau: f32, out: &mut Vec<Cand>) {
    #[cfg(all(target_arch = "x86_64", nextok_avx512))]
    if tau > 0.0 && math::simd::level() >= math::simd::AVX512 && z.len() == w.len() {
        // SAFETY: the CPU supports AVX-512 (`simd::detected`); the lengths are equal.
        return unsafe { collect_weights_avx512(z, w, tau, out) };
    }
    collect_weights(z, w, tau, out)
}

/// [`collect_weights`] for `tau > 0` (then `w >= tau` implies `w > 0`).
#[cfg(all(target_arch = "x86_64", nextok_avx512))]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt")]
unsafe fn collect_weights_avx512(z: &[f32], w: &[f32], tau: f32, out: &mut Vec<Cand>) {
    use std::arch::x86_64::*;
    let t = _mm512_set1_ps(tau);
    let n = w.len() / 64 * 64;
    let mut i = 0;
    while i < n {
        let p = w.as_ptr().add(i);
        let m0 = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_loadu_ps(p), t) as u64;
        let m1 = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_loadu_ps(p.add(16)), t) as u64;
        let m2 = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_loadu_ps(p.add(32)), t) as u64;
        let m3 = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_loadu_ps(p.add(48)), t) as u64;
        let mut bits = m0 | m1 << 16 | m2 << 32 | m3 << 48;
        while bits != 0 {
            let j = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            out.push(Cand {
                id: (i + j) as u32,
                z: z[i + j],
            });
        }
        i += 64;
    }
    for j in n..w.len() {
        if w[j] >= tau {
            out.push(Cand {
                id: j as u32,
                z: z[j],
            });
        }
    }
}

/// The (approximate) mass of the weights `>= LOW_TAUS[k]`, for every `k`.
fn threshold_masses(w: &[f32]) -> [f64; 8] {
    #[cfg(all(target_arch = "x86_64", nextok_avx512))]
    if math::simd::level() >= math::simd::AVX512 {
        // SAFETY: the CPU supports AVX-512 (`simd::detected`).
        return unsafe { threshold_masses_avx512(w) };
    }
    threshold_masses_multi(w)
}

#[cfg(all(target_arch = "x86_64", nextok_avx512))]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt")]
unsafe fn threshold_masses_avx512(w: &[f32]) -> [f64; 8] {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_ps(); 8];
    let taus = LOW_TAUS.map(|t| _mm512_set1_ps(t));
    let n = w.len() / 16 * 16;
    let mut i = 0;
    while i < n {
        let x = _mm512_loadu_ps(w.as_ptr().add(i));
        for (a, t) in acc.iter_mut().zip(taus.iter()) {
            *a = _mm512_mask_add_ps(*a, _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, *t), *a, x);
        }
        i += 16;
    }
    let mut out = [0.0f64; 8];
    for ((o, a), &t) in out.iter_mut().zip(acc.iter()).zip(LOW_TAUS.iter()) {
        let mut l = [0.0f32; 16];
        _mm512_storeu_ps(l.as_mut_ptr(), *a);
        *o = l.iter().map(|&x| x as f64).sum::<f64>()
            + w[n..]
                .iter()
                .filter(|&&x| x >= t)
                .map(|&x| x as f64)
                .sum::<f64>();
    }
    out
}

multiversion! {
    /// [`threshold_masses`], one threshold per pass.
    fn threshold_masses_multi(w: &[f32]) -> [f64; 8] {
        let mut out = [0.0f64; 8];
        for (o, &t) in out.iter_mut().zip(LOW_TAUS.iter()) {
            let mut acc = [0.0f32; 16];
            let mut chunks = w.chunks_exact(16);
            for c in &mut chunks {
                for j in 0..16 {
                    acc[j] += if c[j] >= t { c[j] } else { 0.0 };
                }
            }
            *o = acc.iter().map(|&x| x as f64).sum::<f64>()
                + chunks
                    .remainder()
                    .iter()
                    .filter(|&&x| x >= t)
                    .map(|&x| x as f64)
                    .sum::<f64>();
        }
        out
    }
}

/// Returns the error for the first NaN or `+inf` in `raw`, if any.
pub(crate) fn check_logits(raw: &[f32]) -> Option<Error> {
    // fast vectorisable test first; locate the index only when something is wrong
    let mut bad = false;
    for c in raw.chunks(64) {
        let mut b = false;
        for &x in c {
            b |= nan_or_pos_inf(x);
        }
        if b {
            bad = true;
            break;
        }
    }
    if !bad {
        return None;
    }
    raw.iter().position(|x| nan_or_pos_inf(*x)).map(|index| {
        let value = if raw[index].is_nan() { "NaN" } else { "+inf" };
        ErrorKind::NonFiniteLogit { index, value }.into()
    })
}

#[cfg(test)]
mod tests {
    //! Every kernel version (baseline, AVX2, AVX-512 as the CPU allows) against plain scalar
    //! code written the obvious way: same bits, same sets, same orders.

    use super::*;
    use crate::math::simd;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn unit(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 24) as f32
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// Logit rows that stress the kernels: odd lengths, ties, signed zeros, `-inf`, huge and
    /// tiny ranges, values far below the maximum (weights flushed to 0).
    fn rows() -> Vec<Vec<f32>> {
        let mut r = Rng(11);
        let mut out = Vec::new();
        for &n in &[
            1usize, 7, 8, 15, 16, 17, 63, 64, 65, 127, 200, 1000, 4099, 70_001,
        ] {
            for kind in 0..7 {
                let row: Vec<f32> = (0..n)
                    .map(|_| match kind {
                        0 => (r.unit() - 0.5) * 20.0,
                        1 => (r.below(5) as f32) - 2.0,
                        2 => [0.0, -0.0, -1.0][r.below(3)],
                        3 => (r.unit() - 0.5) * 400.0,
                        4 => (r.unit() - 0.9) * 1e-3,
                        5 => {
                            if r.below(4) == 0 {
                                f32::NEG_INFINITY
                            } else {
                                (r.unit() - 0.5) * 30.0
                            }
                        }
                        _ => {
                            if r.below(50) == 0 {
                                12.0 + r.unit() * 3.0
                            } else {
                                (r.unit() - 0.5) * 8.0
                            }
                        }
                    })
                    .collect();
                out.push(row);
            }
        }
        out
    }

    fn levels() -> Vec<u8> {
        (simd::BASELINE..=simd::detected()).collect()
    }

    fn max_ref(xs: &[f32]) -> f32 {
        let mut acc = [f32::NEG_INFINITY; 8];
        let chunks = xs.chunks_exact(8);
        let rem = chunks.remainder();
        for c in chunks {
            for j in 0..8 {
                acc[j] = if c[j] > acc[j] { c[j] } else { acc[j] };
            }
        }
        let mut m = f32::NEG_INFINITY;
        for &x in rem.iter().chain(acc.iter()) {
            if x > m {
                m = x;
            }
        }
        m
    }

    fn exp_sum_ref(z: &[f32], m: f32) -> (f64, Vec<f32>) {
        let mut acc = [0.0f64; 8];
        let mut w = vec![0.0f32; z.len()];
        for (i, &x) in z.iter().enumerate() {
            w[i] = exp_f32(x - m);
            acc[i % 8] += w[i] as f64;
        }
        (acc.iter().sum(), w)
    }

    fn bits(xs: &[f32]) -> Vec<u32> {
        xs.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn load_matches_scalar_at_every_level() {
        let restore = simd::level();
        for level in levels() {
            simd::set_max_level(level);
            for row in rows() {
                let mut buf = vec![1.0f32; row.len()];
                let mut bmax = vec![0.0f32; row.len().div_ceil(BLOCK)];
                let (bad, count, max) = load(&row, &mut buf, &mut bmax);
                assert!(!bad);
                assert_eq!(bits(&buf), bits(&row));
                for (b, block) in bmax.iter().zip(row.chunks(BLOCK)) {
                    assert_eq!(*b, max_ref(block), "level {level}");
                }
                let want = row.iter().filter(|x| **x > f32::NEG_INFINITY).count();
                assert_eq!(count, want, "level {level}");
                assert_eq!(max.to_bits(), max_ref(&row).to_bits(), "level {level}");
                assert_eq!(math::max_f32(&row).to_bits(), max_ref(&row).to_bits());
                for bad_value in [f32::NAN, f32::INFINITY] {
                    let mut r2 = row.clone();
                    let at = row.len() / 2;
                    r2[at] = bad_value;
                    assert!(load(&r2, &mut buf, &mut bmax).0, "level {level}");
                }
            }
        }
        simd::set_max_level(restore);
    }

    #[test]
    fn exp_kernels_match_scalar_at_every_level() {
        let restore = simd::level();
        for level in levels() {
            simd::set_max_level(level);
            for row in rows() {
                let m = max_ref(&row);
                if m == f32::NEG_INFINITY {
                    continue;
                }
                let (s, w_ref) = exp_sum_ref(&row, m);
                let mut w = vec![0.0f32; row.len()];
                assert_eq!(math::exp_weights(&row, m, &mut w).to_bits(), s.to_bits());
                assert_eq!(bits(&w), bits(&w_ref), "level {level}");
                assert_eq!(math::exp_sum(&row, m).to_bits(), s.to_bits());
                let mut hits = Vec::new();
                let (s2, stored) = exp_weights_with_hits(&row, m, &mut w, &mut hits);
                assert_eq!(s2.to_bits(), s.to_bits(), "level {level}");
                if stored {
                    assert_eq!(bits(&w), bits(&w_ref));
                }
                let tmin = f32::from_bits((128 - HIT_BUCKETS as u32) << 23);
                let want: Vec<(u32, u32)> = w_ref
                    .iter()
                    .enumerate()
                    .filter(|(_, &x)| x >= tmin)
                    .map(|(i, &x)| (i as u32, x.to_bits()))
                    .collect();
                let got: Vec<(u32, u32)> = hits.iter().map(|&(i, x)| (i, x.to_bits())).collect();
                assert_eq!(got, want, "level {level}");
            }
        }
        simd::set_max_level(restore);
    }

    #[test]
    fn block_bounds_follow_edits_and_temperature() {
        let restore = simd::level();
        for level in levels() {
            simd::set_max_level(level);
            for row in rows() {
                let n = row.len();
                let mut r = Rng(n as u64);
                let mut ws = Workspace::new(n);
                ws.load(&row, false).unwrap();
                let mut z = row.clone();
                // raise, lower and mask a few entries, then divide by a temperature
                for _ in 0..8 {
                    let i = r.below(n);
                    let d = (r.unit() - 0.3) * 50.0;
                    ws.edit_buf(i as u32, |x| x + d);
                    if z[i] > f32::NEG_INFINITY {
                        z[i] += d;
                    }
                    let j = r.below(n);
                    ws.mask(j as u32);
                    z[j] = f32::NEG_INFINITY;
                }
                ws.divide(0.7);
                for x in z.iter_mut() {
                    if *x > f32::NEG_INFINITY {
                        *x = (*x / 0.7).clamp(-f32::MAX, f32::MAX);
                    }
                }
                assert_eq!(bits(&ws.buf), bits(&z));
                assert_eq!(ws.dense_max().to_bits(), max_ref(&z).to_bits());
                let mut canon: Vec<Cand> = z
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| **x > f32::NEG_INFINITY)
                    .map(|(i, &x)| Cand { id: i as u32, z: x })
                    .collect();
                canon.sort_by(canonical);
                let k = 5.min(canon.len());
                if k > 0 {
                    ws.top_k(k, TopKTies::ById);
                    if !ws.dense {
                        assert_eq!(ws.cands, &canon[..k], "level {level}");
                    }
                }
            }
        }
        simd::set_max_level(restore);
    }

    #[test]
    fn truncation_kernels_match_scalar_at_every_level() {
        let restore = simd::level();
        for level in levels() {
            simd::set_max_level(level);
            for row in rows() {
                let n = row.len();
                let finite: Vec<Cand> = row
                    .iter()
                    .enumerate()
                    .filter(|(_, z)| **z > f32::NEG_INFINITY)
                    .map(|(i, &z)| Cand { id: i as u32, z })
                    .collect();
                if finite.is_empty() {
                    continue;
                }
                let mut canon = finite.clone();
                canon.sort_by(canonical);
                // top-k
                for k in [1usize, 3, 40, 100] {
                    let mut ws = Workspace::new(n);
                    ws.load(&row, false).unwrap();
                    ws.top_k(k, TopKTies::ById);
                    let want = &canon[..k.min(canon.len())];
                    assert_eq!(ws.support_len(), want.len());
                    if !ws.dense {
                        assert_eq!(ws.cands, want, "level {level}, k {k}");
                    }
                }
                // radix sorts
                let mut v = finite.clone();
                let mut tmp = Vec::new();
                sort_canonical_from_id_order(&mut v, &mut tmp);
                assert_eq!(v, canon);
                let mut by_id = canon.clone();
                sort_by_id(&mut by_id, &mut tmp, n);
                assert_eq!(by_id, finite);
                // top-p: the smallest canonical prefix with mass >= p
                let m = canon[0].z;
                for p in [0.1, 0.5, 0.9, 0.95, 0.999] {
                    let mut ws = Workspace::new(n);
                    ws.load(&row, false).unwrap();
                    let (s, _) = exp_sum_ref(&row, m);
                    let mut cum = 0.0f64;
                    let mut keep = canon.len();
                    for (i, c) in canon.iter().enumerate() {
                        cum += exp_f32(c.z - m) as f64 / s;
                        if cum >= p {
                            keep = i + 1;
                            break;
                        }
                    }
                    ws.top_p(p, 1);
                    assert_eq!(ws.cands, &canon[..keep], "level {level}, p {p}");
                    let mut plain = 0.0f64;
                    for c in &canon[..keep] {
                        plain += exp_f32(c.z - m) as f64;
                    }
                    assert_eq!(ws.normalize().1.to_bits(), plain.to_bits());
                }
                // min-p
                for alpha in [0.01, 0.1, 0.5] {
                    let mut ws = Workspace::new(n);
                    ws.load(&row, false).unwrap();
                    ws.min_p(alpha, 1);
                    let lz = math::ln_f64(alpha) as f32 - 1e-3;
                    let mut want: Vec<Cand> = finite
                        .iter()
                        .copied()
                        .filter(|c| c.z - m >= lz && exp_f32(c.z - m) as f64 >= alpha)
                        .collect();
                    if want.is_empty() {
                        want.push(canon[0]);
                    }
                    let mut got = ws.cands.clone();
                    got.sort_by_key(|c| c.id);
                    want.sort_by_key(|c| c.id);
                    assert_eq!(got, want, "level {level}, min-p {alpha}");
                }
            }
        }
        simd::set_max_level(restore);
    }
}
