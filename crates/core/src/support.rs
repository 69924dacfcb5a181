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
//! id; sparse: canonical order — computed in another order only when every partial sum is exact,
//! which gives the same bits, see `Workspace::normalize_any_order`). The dense top-p leaves its
//! nucleus in token-id order (see `dense_top_p`). Nothing here allocates after the workspace has
//! been created for a vocabulary size: all buffers are sized once.

use crate::error::{Error, ErrorKind, Result};
use crate::kernels::{
    self, cand_exp_sum, cand_weights, collect_band, collect_min_p, exact_sum_any_order,
    nan_or_pos_inf, prefix_len, sum_f32, Band, Level,
};
use crate::math::{self, exp_f32};

pub(crate) use crate::kernels::BLOCK;

/// One candidate: token id and processed logit (`repr(C)`: the AVX-512 kernels store whole
/// candidates as `(u32, f32)` pairs).
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
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

/// How far below the maximum (in logit units) the first band of the dense top-p reaches: tokens
/// with `z >= m - FIRST_BAND` (weights above about 1/16). Bands only steer how much is collected;
/// results never depend on them.
const FIRST_BAND: f32 = 2.8;

/// Buckets of the first level of the nucleus search: 16 per binary order of magnitude of the
/// weight (the last one takes every weight below about `2^-32`, and zero).
const NB1: usize = 512;

/// A boundary bucket with more tokens than this is split by 8 more bits of the weight before it
/// is sorted.
const SPLIT_ABOVE: usize = 64;

/// The large-nucleus top-p reads one 64-token block in this many (and the blocks with the
/// highest bounds) to estimate where the nucleus ends; it runs only on rows of at least eight
/// times as many blocks.
const SAMPLE_STRIDE: usize = 32;

/// Bins of the estimate's histogram: 1/16 of a logit each, 64 logits below the maximum (the last
/// takes everything further down, and the masked tokens).
const CUT_BINS: usize = 1024;

/// When the band search of the dense top-p gives up (for the large-nucleus path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Never: it decides.
    Never,
    /// At the first band that would read more than an eighth of the row's blocks.
    Wide,
    /// As `Wide`, and after a first band that does not hold the mass `p`.
    AfterFirst,
}

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
    /// Weights of the candidates collected by the dense top-p (parallel to `cands`).
    pub(crate) wts: Vec<f32>,
    /// The tokens of one weight bucket of the dense top-p, and their weights.
    pub(crate) gath: Vec<Cand>,
    pub(crate) gath_w: Vec<f32>,
    /// Second buffer for radix sorts of the support.
    pub(crate) aux: Vec<Cand>,
    /// The maximum of `buf` (as [`math::max_f32`] computes it) when `max_valid`.
    pub(crate) max_cache: f32,
    pub(crate) max_valid: bool,
    /// An upper bound of every block of [`BLOCK`] values of `buf` when `bmax_valid` (exact after
    /// loading; raised by edits, never lowered): scans skip whole blocks with it.
    pub(crate) bmax: Vec<f32>,
    pub(crate) bmax_valid: bool,
    /// Whether the dense top-p may take its large-nucleus path ([`Workspace::dense_top_p`]).
    pub(crate) large_nucleus: bool,
    /// Set when the sparse support is in id order, `w[..cands.len()]` holds its weights
    /// `exp_f32(z - cand_norm.0)` and `cand_norm` is `(m, S)` as
    /// [`Workspace::normalize_any_order`] computes them without sorting (the large-nucleus
    /// top-p leaves them so for selection). Cleared by every change of the support or its
    /// order. The normaliser of the processors (`norm_valid`) is left alone: they see the
    /// support exactly as after the band search.
    pub(crate) cand_w_valid: bool,
    pub(crate) cand_norm: (f32, f64),
    /// The kernel level for this workspace, when pinned (tests); `None` follows the
    /// process-wide one ([`crate::math::simd::level`]).
    pub(crate) kernel_level: Option<Level>,
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
            // slack for the 16-wide stores of the AVX-512 band collection
            cands: Vec::with_capacity(vocab_size + 16),
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
            wts: Vec::with_capacity(vocab_size),
            // swapped with `cands` (same capacity)
            gath: Vec::with_capacity(vocab_size + 16),
            gath_w: Vec::with_capacity(vocab_size),
            aux: Vec::with_capacity(vocab_size),
            max_cache: f32::NEG_INFINITY,
            max_valid: false,
            bmax: vec![f32::NEG_INFINITY; vocab_size.div_ceil(BLOCK)],
            bmax_valid: false,
            large_nucleus: true,
            cand_w_valid: false,
            cand_norm: (0.0, 0.0),
            kernel_level: None,
        }
    }

    /// The kernel level this workspace's kernels run at: the pinned one, else the process-wide
    /// one.
    #[inline]
    pub(crate) fn level(&self) -> Level {
        self.kernel_level.unwrap_or_else(Level::current)
    }

    /// Turns the dense top-p's path for large nuclei on (the default) or off.
    ///
    /// Off, a dense top-p always runs the band search, which collects tokens in bands of
    /// processed logit from the top down: the reference the large-nucleus path is tested and
    /// benchmarked against. The supports and the selected tokens are identical either way; only
    /// the time differs (see `docs/performance.md`, "Flat rows").
    pub fn set_large_nucleus_top_p(&mut self, on: bool) {
        self.large_nucleus = on;
    }

    /// Whether the dense top-p's path for large nuclei is on.
    pub fn large_nucleus_top_p(&self) -> bool {
        self.large_nucleus
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
        let (bad, count, max) = kernels::load(self.level(), raw, &mut self.buf, &mut self.bmax);
        if bad {
            self.dense = true;
            self.dense_count = 0;
            self.cands.clear();
            self.max_valid = false;
            self.bmax_valid = false;
            self.norm_valid = false;
            self.dense_w_valid = false;
            self.cand_w_valid = false;
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
        self.cand_w_valid = false;
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
        self.cand_w_valid = false;
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
        self.cand_w_valid = false;
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

    /// The largest magnitude of a finite processed logit in the support (`0` when none).
    pub(crate) fn max_abs_finite(&self) -> f32 {
        let mut m = 0.0f32;
        if self.dense {
            // the top is cached; the bottom is a branch-free minimum over the unmasked entries
            // (processed logits are never NaN or `+inf`)
            let top = self.dense_max();
            let mut lo = f32::INFINITY;
            for &x in &self.buf {
                let y = if x == f32::NEG_INFINITY {
                    f32::INFINITY
                } else {
                    x
                };
                lo = if y < lo { y } else { lo };
            }
            if top.is_finite() {
                m = top.abs();
            }
            if lo.is_finite() {
                m = m.max(lo.abs());
            }
        } else {
            for c in &self.cands {
                if c.z.is_finite() {
                    m = m.max(c.z.abs());
                }
            }
        }
        m
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
            kernels::max_f32(self.level(), &self.buf)
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
        self.cand_w_valid = false;
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
            self.cand_w_valid = false;
        }
    }

    /// Computes `(m, S)` over the current support.
    pub(crate) fn normalize(&mut self) -> (f32, f64) {
        if self.norm_valid {
            return (self.norm_max, self.norm_sum);
        }
        if self.dense {
            let m = self.dense_max();
            let s = kernels::exp_weights(self.level(), &self.buf, m, &mut self.w);
            self.norm_max = m;
            self.norm_sum = s;
            self.dense_w_valid = true;
        } else {
            self.sort_canonical();
            let m = self.cands.first().map(|c| c.z).unwrap_or(f32::NEG_INFINITY);
            let s = cand_exp_sum(self.level(), &self.cands, m);
            self.norm_max = m;
            self.norm_sum = s;
        }
        self.norm_valid = true;
        (self.norm_max, self.norm_sum)
    }

    /// `(m, S)` exactly as [`Workspace::normalize`] gives them, without sorting an unsorted
    /// sparse support when that is not needed: when every partial sum of the weights is exactly
    /// representable in `f64`, the canonical-order sum equals the sum in any order (see
    /// [`exact_sum_any_order`]). Leaves the support's order alone in that case.
    pub(crate) fn normalize_any_order(&mut self) -> (f32, f64) {
        let level = self.level();
        if self.norm_valid {
            return (self.norm_max, self.norm_sum);
        }
        if !self.dense && !self.sorted {
            // the first candidate in canonical order: the highest z, ties to the lowest id
            if let Some(best) = self.argmax() {
                // (the dense weights are not in use while the support is sparse)
                self.dense_w_valid = false;
                let w = &mut self.w[..self.cands.len()];
                cand_weights(level, &self.cands, best.z, w);
                if let Some(s) = exact_sum_any_order(level, w) {
                    self.norm_max = best.z;
                    self.norm_sum = s;
                    self.norm_valid = true;
                    return (best.z, s);
                }
            }
        }
        self.normalize()
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

    /// Dense top-p without sorting the vocabulary or the nucleus.
    ///
    /// One pass computes the normaliser `S`. Then tokens are collected in bands of processed
    /// logit below the maximum (`z` in `[lo, hi)`, blocks whose bound in `bmax` is below `lo`
    /// skipped), each band a further piece of the canonical order, until their mass could hold
    /// `p`. The boundary is found by weight buckets ([`nucleus_walk`]): buckets wholly before it
    /// are only counted, and only the bucket that holds it is sorted. The cumulative sum of the
    /// buckets before it is not the sequential one of the definition, but within a proven
    /// rounding bound of it; when `p` lies within that bound the exact sequential sum decides
    /// ([`dense_prefix`] over the sorted collection), so the result is always the definition's.
    /// The nucleus is then the set `{z > z_b} ∪ {z = z_b, id <= id_b}` for the boundary token
    /// `(z_b, id_b)`, collected in id order.
    ///
    /// On a flat row the bands soon read most of the row, each time from the top again. There
    /// the large-nucleus path ([`Workspace::large_nucleus_top_p`]) takes over: it estimates from
    /// a sample where the nucleus ends, collects every token above that in one pass, and finds
    /// the boundary among them with the same weight buckets and the same rounding bound; it
    /// leaves the nucleus's weights and normaliser for selection. Whatever it cannot decide
    /// with certainty goes back to the band search, so the nucleus is the same either way.
    fn dense_top_p(&mut self, p: f64, min_keep: usize) {
        // `m` is the maximum of `buf`
        let m = self.dense_max();
        let s = kernels::exp_sum_at_max(self.level(), &self.buf, m);
        let nblocks = self.v / BLOCK;
        if self.large_nucleus && nblocks >= 8 * SAMPLE_STRIDE {
            // the first band first: it decides most peaked rows
            if self.band_top_p(m, s, p, min_keep, Stop::AfterFirst) {
                self.dense = false;
                self.invalidate();
                return;
            }
            let bmax: &[f32] = if self.bmax_valid { &self.bmax } else { &[] };
            let cuts = flat_cuts(&self.buf, bmax, m, p * s);
            // where the band search reads few blocks down to the estimated cut, it is quick
            let narrow = 8 * blocks_at_or_above(bmax, nblocks, cuts.0) <= nblocks;
            if narrow && self.band_top_p(m, s, p, min_keep, Stop::Wide) {
                self.dense = false;
                self.invalidate();
                return;
            }
            if self.large_top_p(m, s, p, min_keep, cuts) {
                return;
            }
        }
        let done = self.band_top_p(m, s, p, min_keep, Stop::Never);
        debug_assert!(done);
        self.dense = false;
        self.invalidate();
    }

    /// The band search of [`Workspace::dense_top_p`]. Gives up as `stop` says (returning
    /// `false`, the support unchanged); otherwise leaves the nucleus in `cands` and returns
    /// `true` (the caller marks the support sparse).
    fn band_top_p(&mut self, m: f32, s: f64, p: f64, min_keep: usize, stop: Stop) -> bool {
        let level = self.level();
        let need = p * s;
        self.cands.clear();
        self.wts.clear();
        let mut mass = 0.0f64;
        let mut hi = f32::INFINITY;
        let mut depth = FIRST_BAND;
        // set once the collection is sorted canonically and decided by the exact prefix
        let mut exact = false;
        // how many runs of ascending ids the collection is made of
        let mut runs = 0usize;
        let nblocks = self.v / BLOCK;
        loop {
            let last = depth >= -math::EXP_F32_FLUSH + 1.0;
            let lo = if last { -f32::MAX } else { m - depth };
            let bmax: &[f32] = if self.bmax_valid { &self.bmax } else { &[] };
            if !exact && 8 * blocks_at_or_above(bmax, nblocks, lo) > nblocks {
                if stop != Stop::Never {
                    self.cands.clear();
                    self.wts.clear();
                    return false;
                }
                // a band that reads much of the row collects everything from the top again (the
                // bands before it hold few tokens), so that the collection is one run in id order
                self.cands.clear();
                self.wts.clear();
                mass = 0.0;
                hi = f32::INFINITY;
                runs = 0;
            }
            let start = self.cands.len();
            if lo < hi {
                collect_band(level, &self.buf, bmax, Band::new(lo, hi), &mut self.cands);
                runs += 1;
            }
            let all = last || self.cands.len() >= self.dense_count;
            if exact {
                // a lower band only extends the canonical order
                sort_canonical_from_id_order(&mut self.cands[start..], &mut self.aux);
            } else {
                mass += band_weights(level, &self.cands[start..], m, &mut self.wts);
                if !all && mass < need * (1.0 - 1e-9) {
                    // not enough mass collected yet: the boundary is further down
                    if stop == Stop::AfterFirst {
                        self.cands.clear();
                        self.wts.clear();
                        return false;
                    }
                    hi = lo;
                    depth = self.next_depth(m, depth, mass < 0.5 * need);
                    continue;
                }
                let st = WalkState {
                    m,
                    s,
                    p,
                    k: 0,
                    mass: 0.0,
                };
                let walk = nucleus_walk(
                    &self.cands,
                    &self.wts,
                    st,
                    &mut self.gath,
                    &mut self.gath_w,
                    &mut self.scratch,
                    &mut self.aux,
                );
                match walk {
                    Walk::Found(n, at) if n >= min_keep => {
                        // the nucleus: every token before the boundary token in canonical order
                        let before = |c: &Cand| c.z > at.z || (c.z == at.z && c.id <= at.id);
                        if runs <= 1 {
                            // the collection is in id order
                            filter_cands(&self.cands, &self.wts, |c, _| before(c), &mut self.gath);
                            std::mem::swap(&mut self.cands, &mut self.gath);
                        } else if 8 * blocks_at_or_above(bmax, nblocks, at.z) < 6 * n {
                            // few blocks hold it: read them again, in id order
                            self.cands.clear();
                            let band = Band {
                                lo: at.z,
                                hi: f32::INFINITY,
                                tie_z: at.z,
                                tie_id: at.id,
                            };
                            collect_band(level, &self.buf, bmax, band, &mut self.cands);
                        } else {
                            // the collection holds it, in runs of ascending ids
                            filter_cands(&self.cands, &self.wts, |c, _| before(c), &mut self.gath);
                            std::mem::swap(&mut self.cands, &mut self.gath);
                            sort_by_id(&mut self.cands, &mut self.aux, self.v);
                        }
                        debug_assert_eq!(self.cands.len(), n);
                        self.sorted = false;
                        break;
                    }
                    Walk::Short if !all => {
                        hi = lo;
                        depth = self.next_depth(m, depth, false);
                        continue;
                    }
                    Walk::Short => {
                        // certain: no prefix reaches p, every token stays
                        self.sorted = false;
                        break;
                    }
                    _ => {
                        // too close to call (or min_keep decides): the exact sequential sum
                        exact = true;
                        sort_canonical_from_id_order(&mut self.cands, &mut self.aux);
                    }
                }
            }
            if let Some(n) = dense_prefix(level, &self.cands, m, s, p, min_keep, all) {
                self.cands.truncate(n);
                self.sorted = true;
                break;
            }
            hi = lo;
            depth = self.next_depth(m, depth, false);
        }
        true
    }

    /// The large-nucleus path of [`Workspace::dense_top_p`]: one collection from an estimated
    /// cut, the boundary by [`nucleus_walk`], the nucleus in id order with its weights in
    /// `w` and its normaliser. Returns `false`, the support still dense, when the collection does
    /// not certainly hold the boundary (or `min_keep` decides): the band search then decides.
    fn large_top_p(&mut self, m: f32, s: f64, p: f64, min_keep: usize, cuts: (f32, f32)) -> bool {
        let level = self.level();
        let bmax: &[f32] = if self.bmax_valid { &self.bmax } else { &[] };
        let (mut lo, next) = cuts;
        self.cands.clear();
        self.wts.clear();
        let mut st = WalkState {
            m,
            s,
            p,
            k: 0,
            mass: 0.0,
        };
        let mut hi = f32::INFINITY;
        let mut runs = 0usize;
        let mut step = 0.5f32;
        let (found, at) = loop {
            let start = self.cands.len();
            collect_band(level, &self.buf, bmax, Band::new(lo, hi), &mut self.cands);
            runs += 1;
            self.wts.resize(self.cands.len(), 0.0);
            cand_weights(level, &self.cands[start..], m, &mut self.wts[start..]);
            let all = lo <= -f32::MAX || self.cands.len() >= self.dense_count;
            let (walk, after) = nucleus_walk_on(
                &self.cands[start..],
                &self.wts[start..],
                st,
                &mut self.gath,
                &mut self.gath_w,
                &mut self.scratch,
                &mut self.aux,
            );
            match walk {
                Walk::Found(n, at) if n >= min_keep => break (n, at),
                Walk::Short if !all => {
                    // certain: the boundary is further down; the next band starts there
                    st = after;
                    hi = lo;
                    // first a third of the way to the wide cut (about one standard
                    // deviation of the estimate), then in doubling steps
                    lo = if runs == 1 && next < lo {
                        lo - (lo - next) / 3.0
                    } else {
                        lo - step
                    };
                    if lo <= m - 87.0 {
                        lo = -f32::MAX;
                    }
                    step *= 2.0;
                }
                _ => {
                    self.cands.clear();
                    self.wts.clear();
                    return false;
                }
            }
        };
        // as one integer comparison of canonical keys: no branch on the data
        let key = |c: &Cand| (descending_key(c.z) as u64) << 32 | c.id as u64;
        let last = key(&at);
        let before = |c: &Cand| key(c) <= last;
        let n = if runs == 1 {
            // the nucleus, in id order (the collection is one run), and its weights
            filter_cands_w(&self.cands, &self.wts, before, &mut self.gath, &mut self.w)
        } else {
            // several runs: read the nucleus again from the row, in id order
            self.gath.clear();
            let band = Band {
                lo: at.z,
                hi: f32::INFINITY,
                tie_z: at.z,
                tie_id: at.id,
            };
            collect_band(level, &self.buf, bmax, band, &mut self.gath);
            let n = self.gath.len();
            cand_weights(level, &self.gath, m, &mut self.w[..n]);
            n
        };
        debug_assert_eq!(n, found);
        std::mem::swap(&mut self.cands, &mut self.gath);
        self.dense = false;
        self.sorted = false;
        self.dense_w_valid = false;
        // the normaliser selection needs, as `normalize_any_order` would compute it (not set as
        // the processors' normaliser: `normalize` would then skip sorting the support, which
        // later processors read in canonical order): the nucleus holds the maximum, and its
        // first token in canonical order (the lowest id of that value) gives its sign when it is
        // a zero
        let m = if m == 0.0 {
            self.cands.iter().find(|c| c.z == 0.0).map_or(m, |c| c.z)
        } else {
            m
        };
        self.norm_valid = false;
        match exact_sum_any_order(level, &self.w[..n]) {
            Some(sum) => {
                self.cand_norm = (m, sum);
                self.cand_w_valid = true;
            }
            None => self.cand_w_valid = false,
        }
        true
    }

    /// The depth below the maximum `m` of the next band after one that reached `depth`: two
    /// binary orders of magnitude of weight further (four when `far` from the needed mass), and
    /// further while the band stays sparse (overshooting costs little there); a band that reads
    /// more than a third of the blocks anyway goes two more, so that few passes read the bulk of
    /// a flat row.
    fn next_depth(&self, m: f32, depth: f32, far: bool) -> f32 {
        const STEP: f32 = 1.4; // about 2 ln 2
        let nblocks = self.v / BLOCK;
        let bmax: &[f32] = if self.bmax_valid { &self.bmax } else { &[] };
        let reads = |d: f32| blocks_at_or_above(bmax, nblocks, m - d);
        let mut d = depth + if far { 2.0 * STEP } else { STEP };
        while d < 88.0 && 16 * reads(d + STEP) < nblocks {
            d += STEP;
        }
        if 3 * reads(d) > nblocks {
            d += STEP;
        }
        d
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

/// Like [`sparse_prefix`] over a collected top set; `None` when the prefix is not certain to
/// lie inside the collected set (the caller then collects everything).
fn dense_prefix(
    level: Level,
    c: &[Cand],
    m: f32,
    s: f64,
    p: f64,
    min_keep: usize,
    all: bool,
) -> Option<usize> {
    prefix_len(level, c, m, s, p, min_keep).or(if all { Some(c.len()) } else { None })
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
pub(crate) fn worse(a: &Cand, b: &Cand) -> bool {
    a.z < b.z || (a.z == b.z && a.id > b.id)
}

#[inline(always)]
pub(crate) fn sift_down(h: &mut [Cand], mut i: usize) {
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

/// How many blocks [`collect_band`] reads for a band starting at `lo` (all without bounds).
fn blocks_at_or_above(bmax: &[f32], nblocks: usize, lo: f32) -> usize {
    if bmax.len() < nblocks {
        return nblocks;
    }
    let mut n = 0usize;
    for c in bmax[..nblocks].chunks(16) {
        let mut k = 0u32;
        for &x in c {
            k += (x >= lo) as u32;
        }
        n += k as usize;
    }
    n
}

/// Appends `exp_f32(c[i].z - m)` for every candidate to `w` and returns their sum (in an
/// unspecified order: it only steers the search).
fn band_weights(level: Level, c: &[Cand], m: f32, w: &mut Vec<f32>) -> f64 {
    let start = w.len();
    w.resize(start + c.len(), 0.0);
    cand_weights(level, c, m, &mut w[start..]);
    sum_f32(level, &w[start..])
}

/// The weight's distance below 1 in `f32` bits (0 for `w >= 1`): a key that never increases
/// with `w`.
#[inline(always)]
fn wkey(w: f32) -> u32 {
    0x3F80_0000u32.saturating_sub(w.to_bits())
}

/// The first-level bucket of a weight.
#[inline(always)]
fn bucket1(w: f32) -> usize {
    ((wkey(w) >> 19) as usize).min(NB1 - 1)
}

/// A bound on the distance between the search's estimate of a cumulative probability after `n`
/// tokens and the definition's sequential sum (both within `(n + few) · 2^-53` of the exact sum
/// of the terms, which is at most about 1): twice that, and generous.
#[inline]
fn margin(n: usize) -> f64 {
    (4 * n + 4096) as f64 * f64::EPSILON
}

/// Where the search stands: the count `k` and the weight sum `mass` of the tokens wholly before
/// the current bucket (every prefix up to them is certain to stay below `p`).
#[derive(Debug, Clone, Copy)]
struct WalkState {
    m: f32,
    s: f64,
    p: f64,
    k: usize,
    mass: f64,
}

/// The outcome of a nucleus search.
enum Walk {
    /// Certain: the first `n` tokens in canonical order, the last of which is this one.
    Found(usize, Cand),
    /// Certain: no prefix of the searched tokens reaches `p`.
    Short,
    /// Too close to call with the rounding bound.
    Unsure,
}

/// Finds the top-p boundary among the candidates `c` (weights `w`), a prefix of the canonical
/// order in any order: buckets by weight are counted, and the bucket that holds the boundary is
/// split ([`SPLIT_ABOVE`]) or sorted and walked with the definition's terms.
fn nucleus_walk(
    c: &[Cand],
    w: &[f32],
    st: WalkState,
    gath: &mut Vec<Cand>,
    gath_w: &mut Vec<f32>,
    sub: &mut Vec<Cand>,
    tmp: &mut Vec<Cand>,
) -> Walk {
    nucleus_walk_on(c, w, st, gath, gath_w, sub, tmp).0
}

/// [`nucleus_walk`], also giving the state after the searched tokens when they are
/// [`Walk::Short`] (their count and weight sum added): the next band's search starts there.
fn nucleus_walk_on(
    c: &[Cand],
    w: &[f32],
    mut st: WalkState,
    gath: &mut Vec<Cand>,
    gath_w: &mut Vec<f32>,
    sub: &mut Vec<Cand>,
    tmp: &mut Vec<Cand>,
) -> (Walk, WalkState) {
    let (count, mass) = histogram::<NB1>(w, bucket1);
    for b in 0..NB1 {
        if count[b] == 0 {
            continue;
        }
        let k2 = st.k + count[b] as usize;
        let m2 = st.mass + mass[b];
        if m2 / st.s < st.p - margin(k2) {
            st.k = k2;
            st.mass = m2;
            continue;
        }
        gather(c, w, |x| bucket1(x) == b, gath, gath_w);
        let r = if gath.len() > SPLIT_ABOVE && b < NB1 - 1 {
            split_walk(gath, gath_w, st, sub, tmp)
        } else {
            sorted_walk(gath, st, tmp)
        };
        match r {
            Walk::Short => {
                st.k = k2;
                st.mass = m2;
            }
            r => return (r, st),
        }
    }
    (Walk::Short, st)
}

/// Counts and weight sums of the weights by `key` (below `N`). Long inputs use four interleaved
/// histograms, so that runs of equal keys (common in flat rows) do not chain every update on the
/// previous one.
fn histogram<const N: usize>(w: &[f32], key: impl Fn(f32) -> usize) -> ([u32; N], [f64; N]) {
    let mut c = [0u32; N];
    let mut m = [0.0f64; N];
    if w.len() < 4 * N {
        for &x in w {
            let b = key(x).min(N - 1);
            c[b] += 1;
            m[b] += x as f64;
        }
        return (c, m);
    }
    let mut count = [[0u32; N]; 4];
    let mut mass = [[0.0f64; N]; 4];
    let chunks = w.chunks_exact(4);
    let rest = chunks.remainder();
    for ch in chunks {
        for (j, &x) in ch.iter().enumerate() {
            let b = key(x).min(N - 1);
            count[j][b] += 1;
            mass[j][b] += x as f64;
        }
    }
    for &x in rest {
        let b = key(x).min(N - 1);
        count[0][b] += 1;
        mass[0][b] += x as f64;
    }
    for j in 0..4 {
        for b in 0..N {
            c[b] += count[j][b];
            m[b] += mass[j][b];
        }
    }
    (c, m)
}

/// Copies the candidates (and weights) whose weight passes `keep` to `out` (and `out_w`),
/// without a branch on the data (only the count advances).
fn gather(
    c: &[Cand],
    w: &[f32],
    keep: impl Fn(f32) -> bool,
    out: &mut Vec<Cand>,
    out_w: &mut Vec<f32>,
) {
    let n = c.len().min(w.len());
    out.clear();
    out_w.clear();
    out.reserve(n);
    out_w.reserve(n);
    let (p, pw) = (out.as_mut_ptr(), out_w.as_mut_ptr());
    let mut k = 0usize;
    for (cc, &x) in c[..n].iter().zip(&w[..n]) {
        // SAFETY: `k <= ` the number of candidates seen so far `< n <=` both capacities.
        unsafe {
            p.add(k).write(*cc);
            pw.add(k).write(x);
        }
        k += keep(x) as usize;
    }
    // SAFETY: the first `k` elements of both were written.
    unsafe {
        out.set_len(k);
        out_w.set_len(k);
    }
}

/// Copies the candidates `c[i]` for which `keep(c[i], w[i])` holds to `out`, in order, without a
/// branch on the data.
fn filter_cands(c: &[Cand], w: &[f32], keep: impl Fn(&Cand, f32) -> bool, out: &mut Vec<Cand>) {
    let n = c.len().min(w.len());
    out.clear();
    out.reserve(n);
    let p = out.as_mut_ptr();
    let mut k = 0usize;
    for (cc, &x) in c[..n].iter().zip(&w[..n]) {
        // SAFETY: `k <` the number of candidates seen so far `<= n <=` the capacity.
        unsafe { p.add(k).write(*cc) };
        k += keep(cc, x) as usize;
    }
    // SAFETY: the first `k` elements were written.
    unsafe { out.set_len(k) };
}

/// Like [`filter_cands`], also copying the kept weights to the front of `out_w` (at least as
/// long as `c`); returns how many were kept.
fn filter_cands_w(
    c: &[Cand],
    w: &[f32],
    keep: impl Fn(&Cand) -> bool,
    out: &mut Vec<Cand>,
    out_w: &mut [f32],
) -> usize {
    let n = c.len().min(w.len()).min(out_w.len());
    out.clear();
    out.reserve(n);
    let p = out.as_mut_ptr();
    let pw = out_w.as_mut_ptr();
    let mut k = 0usize;
    for (cc, &x) in c[..n].iter().zip(&w[..n]) {
        // SAFETY: `k <` the number of candidates seen so far `<= n <=` both capacities.
        unsafe {
            p.add(k).write(*cc);
            pw.add(k).write(x);
        }
        k += keep(cc) as usize;
    }
    // SAFETY: the first `k` elements were written.
    unsafe { out.set_len(k) };
    k
}

/// Where the large-nucleus top-p cuts its collection: two processed logits below which, by an
/// estimate, the tokens above them hold the mass `need` (in weights `exp(z - m)`), the first
/// by a small margin, the second by a wide one. Blocks whose bound reaches a depth that few blocks reach are read whole, one of the
/// other blocks in [`SAMPLE_STRIDE`] stands for the rest; the logits go into bins of 1/16 of a
/// logit, and the cuts lie where the estimated mass, and the estimated mass minus three
/// standard deviations of the sampling error, reach `need`. `-f32::MAX` (everything) when no such point
/// is found. Only steers the search: the result is checked.
fn flat_cuts(buf: &[f32], bmax: &[f32], m: f32, need: f64) -> (f32, f32) {
    let nblocks = buf.len() / BLOCK;
    // the deepest level (in steps of half a logit) that at most one block in SAMPLE_STRIDE
    // reaches: those blocks are read whole
    let mut full_lo = f32::INFINITY;
    if bmax.len() >= nblocks {
        // blocks by the depth of their bound below `m`, in half logits
        let mut depth = [0u32; 65];
        for &x in &bmax[..nblocks] {
            let d = (m - x) * 2.0;
            depth[if d < 64.0 { d as usize } else { 64 }] += 1;
        }
        let cap = nblocks / SAMPLE_STRIDE;
        let mut reach = 0usize;
        for (i, &n) in depth[..64].iter().enumerate() {
            // the blocks whose bound is at least `m - (i + 1) / 2`
            reach += n as usize;
            if reach > cap {
                break;
            }
            full_lo = m - (i + 1) as f32 * 0.5;
        }
    }
    let mut full = [0u32; CUT_BINS];
    let mut samp = [0u32; CUT_BINS];
    // `z <= m`, so `d >= 0` (`+inf` for a masked token): a 32-bit conversion of the clamped
    // value, which is one instruction
    let bin = |z: f32| ((m - z) * 16.0).min((CUT_BINS - 1) as f32) as i32 as usize;
    let (mut other, mut sampled) = (0usize, 0usize);
    for (b, block) in buf[..nblocks * BLOCK].chunks_exact(BLOCK).enumerate() {
        if bmax.get(b).is_some_and(|&x| x >= full_lo) {
            for &z in block {
                full[bin(z)] += 1;
            }
        } else {
            other += 1;
            if b % SAMPLE_STRIDE == SAMPLE_STRIDE / 2 {
                sampled += 1;
                for &z in block {
                    samp[bin(z)] += 1;
                }
            }
        }
    }
    for &z in &buf[nblocks * BLOCK..] {
        full[bin(z)] += 1;
    }
    let f = if sampled > 0 {
        other as f64 / sampled as f64
    } else {
        0.0
    };
    // the weight at the middle of bin b is exp(-(b + 1/2) / 16)
    const STEP: f64 = 0.939_413_062_813_475_8; // exp(-1/16)
    let mut wc = 0.969_233_234_476_344_1; // exp(-1/32)
    let (mut cum, mut var) = (0.0f64, 0.0f64);
    let mut first = None;
    for b in 0..CUT_BINS - 1 {
        let ns = samp[b] as f64;
        cum += (full[b] as f64 + f * ns) * wc;
        var += f * (f - 1.0) * ns * wc * wc;
        let sd = var.sqrt();
        let edge = m - (b + 1) as f32 / 16.0;
        if first.is_none() && cum >= need {
            first = Some(edge);
        }
        if cum - 3.0 * sd >= need {
            return (first.unwrap_or(edge), edge);
        }
        wc *= STEP;
    }
    match first {
        Some(lo) => (lo, lo - 1.0),
        None => (-f32::MAX, -f32::MAX),
    }
}

/// [`nucleus_walk`]'s second level: the tokens of one first-level bucket, by 8 more bits.
fn split_walk(
    c: &[Cand],
    w: &[f32],
    mut st: WalkState,
    sub: &mut Vec<Cand>,
    tmp: &mut Vec<Cand>,
) -> Walk {
    let key = |x: f32| ((wkey(x) >> 11) & 0xff) as usize;
    let (count, mass) = histogram::<256>(w, key);
    for b in 0..256 {
        if count[b] == 0 {
            continue;
        }
        let k2 = st.k + count[b] as usize;
        let m2 = st.mass + mass[b];
        if m2 / st.s < st.p - margin(k2) {
            st.k = k2;
            st.mass = m2;
            continue;
        }
        filter_cands(c, w, |_, x| key(x) == b, sub);
        match sorted_walk(sub, st, tmp) {
            Walk::Short => {
                st.k = k2;
                st.mass = m2;
            }
            r => return r,
        }
    }
    Walk::Short
}

/// Sorts one bucket canonically and adds its terms `exp_f32(z - m) / S` one by one after the
/// tokens before it.
fn sorted_walk(c: &mut [Cand], st: WalkState, tmp: &mut Vec<Cand>) -> Walk {
    // a bucket keeps the relative order of the collection: equal values are in id order
    sort_canonical_from_id_order(c, tmp);
    let mut cum = st.mass / st.s;
    for (j, x) in c.iter().enumerate() {
        cum += exp_f32(x.z - st.m) as f64 / st.s;
        let n = st.k + j + 1;
        if cum >= st.p + margin(n) {
            return Walk::Found(n, *x);
        }
        if cum > st.p - margin(n) {
            return Walk::Unsure;
        }
    }
    Walk::Short
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
    //! The workspace's truncations at every kernel level (pinned per workspace, so these tests
    //! never touch the process-wide cap) against plain scalar code written the obvious way: same
    //! sets, same orders, same bits.

    use super::*;
    use crate::kernels::tests::{bits, exp_sum_ref, levels, max_ref, rows, Rng};

    #[test]
    fn block_bounds_follow_edits_and_temperature() {
        const NAME: &str = "block_bounds_follow_edits_and_temperature";
        for level in levels(NAME) {
            for row in rows() {
                let n = row.len();
                let mut r = Rng(n as u64);
                let mut ws = Workspace::new(n);
                ws.kernel_level = Some(level);
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
                        assert_eq!(ws.cands, &canon[..k], "level {level:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn truncation_kernels_match_scalar_at_every_level() {
        const NAME: &str = "truncation_kernels_match_scalar_at_every_level";
        for level in levels(NAME) {
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
                    ws.kernel_level = Some(level);
                    ws.load(&row, false).unwrap();
                    ws.top_k(k, TopKTies::ById);
                    let want = &canon[..k.min(canon.len())];
                    assert_eq!(ws.support_len(), want.len());
                    if !ws.dense {
                        assert_eq!(ws.cands, want, "level {level:?}, k {k}");
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
                for (p, min_keep) in [
                    (0.1, 1),
                    (0.5, 1),
                    (0.9, 1),
                    (0.95, 1),
                    (0.999, 1),
                    (0.5, 3),
                    (0.95, 40),
                    (0.999_999, 1),
                ] {
                    let mut ws = Workspace::new(n);
                    ws.kernel_level = Some(level);
                    ws.load(&row, false).unwrap();
                    let (s, _) = exp_sum_ref(&row, m);
                    let mut cum = 0.0f64;
                    let mut keep = canon.len();
                    for (i, c) in canon.iter().enumerate() {
                        cum += exp_f32(c.z - m) as f64 / s;
                        if cum >= p && i + 1 >= min_keep {
                            keep = i + 1;
                            break;
                        }
                    }
                    ws.top_p(p, min_keep);
                    // the dense top-p leaves the nucleus in id order (or canonical order when
                    // the exact sequential sum decided)
                    let mut got = ws.cands.clone();
                    got.sort_by(canonical);
                    assert_eq!(
                        got,
                        &canon[..keep],
                        "level {level:?}, p {p}, min_keep {min_keep}"
                    );
                    assert!(
                        ws.sorted || ws.cands.is_sorted_by_key(|c| c.id),
                        "level {level:?}, p {p}"
                    );
                    // the normaliser over the nucleus, without and with sorting it
                    let (m1, s1) = ws.normalize_any_order();
                    ws.norm_valid = false;
                    let mut plain = 0.0f64;
                    for c in &canon[..keep] {
                        plain += exp_f32(c.z - m) as f64;
                    }
                    let (m2, s2) = ws.normalize();
                    assert_eq!(s2.to_bits(), plain.to_bits());
                    assert_eq!((m1.to_bits(), s1.to_bits()), (m2.to_bits(), s2.to_bits()));
                }
                // min-p
                for alpha in [0.01, 0.1, 0.5] {
                    let mut ws = Workspace::new(n);
                    ws.kernel_level = Some(level);
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
                    assert_eq!(got, want, "level {level:?}, min-p {alpha}");
                }
            }
        }
    }
}
