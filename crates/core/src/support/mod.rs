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
//!
//! The code is split by concept: this file holds the [`Workspace`] and its simple edits and
//! normalisers; `load` validates and loads a row; `row` holds the dense row, which a step may
//! read in place from the caller's logits until its first edit; `nucleus` the dense top-p's
//! search for the nucleus boundary (bands, weight buckets, the large-nucleus path); `sort` the
//! canonical order, radix sorts and the top-k heap. Each truncation itself (top-k, top-p,
//! min-p, typical) is in its processor's file under `processors/`, as methods on the
//! [`Workspace`].
//! The vector loops they run are in the crate's `kernels` module.

use crate::error::{ErrorKind, Result};
use crate::kernels::{self, cand_exp_sum, cand_weights, exact_sum_any_order, Isa};

pub use crate::kernels::common::Cand;
pub(crate) use crate::kernels::BLOCK;
pub(crate) use row::Row;
pub(crate) use sort::{canonical, sort_by_id};

mod load;
mod nucleus;
mod row;
pub(crate) mod sort;

#[cfg(test)]
mod tests;

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
    /// Processed logits of every token (exact for all tokens while dense, or when `exact`); read
    /// from the caller's raw logits until the first edit when attached (see `row`).
    pub(crate) buf: Row,
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
    /// Weights of the candidates collected by the dense top-p's band search (parallel to
    /// `cands`).
    pub(crate) wts: Vec<f32>,
    /// Weights of the candidates collected by the large-nucleus top-p (its first `cands.len()`
    /// values, parallel to `cands`): sized to the vocabulary by the first step that takes that
    /// path (a sequence that never does holds none of it), never shrunk, so that later steps do
    /// not fill it with zeros.
    pub(crate) large_w: Vec<f32>,
    /// The tokens of one weight bucket of the dense top-p, and their weights.
    pub(crate) gath: Vec<Cand>,
    pub(crate) gath_w: Vec<f32>,
    /// The light part of a long collection of the large-nucleus top-p, and its weights (grown
    /// by the first step that splits a collection, never shrunk).
    pub(crate) light: Vec<Cand>,
    pub(crate) light_w: Vec<f32>,
    /// Second buffer for radix sorts of the support.
    pub(crate) aux: Vec<Cand>,
    /// The maximum of `buf` (as [`math::max_f32`] computes it) when `max_valid`.
    pub(crate) max_cache: f32,
    pub(crate) max_valid: bool,
    /// An upper bound of every block of [`BLOCK`] values of `buf` when `bmax_valid`: exact
    /// after loading, and kept exact by [`Workspace::edit_buf`] and [`Workspace::mask`] (raised
    /// with a raised value, recomputed when a block's top value is lowered); other edits may
    /// leave it above the block's maximum. Scans skip whole blocks with it.
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
    /// process-wide one ([`crate::cpu::Level::current`]).
    pub(crate) kernel_level: Option<Isa>,
}

impl Workspace {
    /// A workspace for vocabularies of `vocab_size` tokens.
    pub fn new(vocab_size: usize) -> Self {
        Workspace {
            v: vocab_size,
            buf: Row::new(vocab_size),
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
            large_w: Vec::new(),
            // swapped with `cands` (same capacity)
            gath: Vec::with_capacity(vocab_size + 16),
            gath_w: Vec::with_capacity(vocab_size),
            light: Vec::with_capacity(vocab_size),
            light_w: Vec::new(),
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
    pub(crate) fn level(&self) -> Isa {
        self.kernel_level.unwrap_or_else(Isa::current)
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

    /// Processed logit of every token (exact for all tokens when layers were requested), after
    /// [`Sampler::process`](crate::Sampler::process). `None` after a step that processed and
    /// selected in one call ([`Sampler::select`](crate::Sampler::select), `step`, `step_batch`)
    /// without editing the dense row: such a step reads the raw logits in place and keeps no
    /// copy.
    pub fn processed_logits(&self) -> Option<&[f32]> {
        (!self.buf.is_stale()).then_some(&self.buf[..])
    }

    #[inline]
    pub(crate) fn invalidate(&mut self) {
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

    /// After `buf[i]` went down from `old`: when `old` was its block's top value, the block's
    /// bound is recomputed, so that bounds stay exact (the top-k threshold relies on them; 64
    /// values, and only for a block's top token).
    #[inline]
    fn lowered(&mut self, i: usize, old: f32) {
        let blk = i / BLOCK;
        if old >= self.bmax[blk] {
            let end = (blk * BLOCK + BLOCK).min(self.buf.len());
            self.bmax[blk] = kernels::max_f32(self.level(), &self.buf[blk * BLOCK..end]);
        }
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
                self.lowered(i, old);
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
            self.buf[i] = new;
            let b = &mut self.bmax[i / BLOCK];
            if new > *b {
                *b = new;
            } else if new < old {
                self.lowered(i, old);
            }
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
            for &x in self.buf.iter() {
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
}
