//! The dense top-p without sorting the vocabulary or the nucleus: tokens collected in bands of
//! processed logit below the maximum, the boundary found by weight buckets (only the bucket that
//! holds it is sorted), the exact sequential sum deciding whenever the bucket sums are within
//! their rounding bound of `p`; and the large-nucleus path for flat rows, which estimates the cut
//! from a sample and collects everything above it in one pass. `Workspace::dense_top_p` below
//! tells the whole story.

use super::sort::{sort_by_id, sort_canonical_from_id_order};
use super::{Cand, Workspace, BLOCK};
use crate::kernels::{
    self, cand_weights, collect_band, exact_sum_any_order, filter_cands, filter_upto,
    gather_weight_key, prefix_len, split_heavy, Band, Isa, WeightKey,
};
use crate::math::{self, exp_f32};

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

impl Workspace {
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
    pub(crate) fn dense_top_p(&mut self, p: f64, min_keep: usize) {
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
                    level,
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
        // the collection never exceeds the row: sized once (no zeros written per step)
        if self.large_w.len() < self.v {
            self.large_w.resize(self.v, 0.0);
        }
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
            let n = self.cands.len();
            let total = cand_weights(level, &self.cands[start..], m, &mut self.large_w[start..n]);
            let all = lo <= -f32::MAX || self.cands.len() >= self.dense_count;
            let (walk, after) = heavy_first_walk(
                level,
                &self.cands[start..],
                (&self.large_w[start..n], total),
                st,
                (&mut self.light, &mut self.light_w),
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
                    return false;
                }
            }
        };
        let (n, sum) = if runs == 1 {
            // the nucleus, in id order (the collection is one run), its weights and their
            // exact sum when it applies
            filter_upto(
                level,
                &self.cands,
                &self.large_w[..self.cands.len()],
                at,
                &mut self.gath,
                &mut self.w,
            )
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
            (n, exact_sum_any_order(level, &self.w[..n]))
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
        match sum {
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
}

/// Like [`sparse_prefix`] over a collected top set; `None` when the prefix is not certain to
/// lie inside the collected set (the caller then collects everything).
fn dense_prefix(
    level: Isa,
    c: &[Cand],
    m: f32,
    s: f64,
    p: f64,
    min_keep: usize,
    all: bool,
) -> Option<usize> {
    prefix_len(level, c, m, s, p, min_keep).or(if all { Some(c.len()) } else { None })
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
fn band_weights(level: Isa, c: &[Cand], m: f32, w: &mut Vec<f32>) -> f64 {
    let start = w.len();
    w.resize(start + c.len(), 0.0);
    cand_weights(level, c, m, &mut w[start..])
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
    KEY1.of(w) as usize
}

/// The key of [`bucket1`]: [`wkey`] by 19 bits, capped (the `value` is set per gather).
const KEY1: WeightKey = WeightKey {
    shift: 19,
    max: (NB1 - 1) as u32,
    value: 0,
};

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
#[allow(clippy::too_many_arguments)]
fn nucleus_walk(
    level: Isa,
    c: &[Cand],
    w: &[f32],
    st: WalkState,
    gath: &mut Vec<Cand>,
    gath_w: &mut Vec<f32>,
    sub: &mut Vec<Cand>,
    tmp: &mut Vec<Cand>,
) -> Walk {
    nucleus_walk_on(level, c, w, st, gath, gath_w, sub, tmp).0
}

/// [`nucleus_walk`], also giving the state after the searched tokens when they are
/// [`Walk::Short`] (their count and weight sum added): the next band's search starts there.
#[allow(clippy::too_many_arguments)]
fn nucleus_walk_on(
    level: Isa,
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
        let key = WeightKey {
            value: b as u32,
            ..KEY1
        };
        gather_weight_key(level, c, w, key, gath, gath_w);
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

/// Below this many candidates [`heavy_first_walk`] searches them all by buckets.
const HEAVY_SPLIT_MIN: usize = 8192;

/// One weight in this many goes into the sample that places [`heavy_first_walk`]'s split.
const HEAVY_SAMPLE: usize = 16;

/// [`nucleus_walk_on`] for long collections, where the weight buckets of every token cost the
/// most: a sample of the weights places a bucket boundary below which, by the estimate (less
/// four standard deviations), the collection holds more than its mass after the top-p boundary,
/// so that the boundary lies below it. The tokens above it
/// (the heavy ones, a prefix of the canonical order: a higher bucket means a higher weight,
/// hence a higher logit) are only counted and summed, in one vector pass that also copies the
/// others out; when their count and sum leave the running sum certainly below `p` (the same
/// rounding bound as a bucket), the buckets search only the others, from there. Otherwise the
/// whole collection is searched as before: the split only changes the time.
#[allow(clippy::too_many_arguments)]
fn heavy_first_walk(
    level: Isa,
    c: &[Cand],
    (w, total): (&[f32], f64),
    st: WalkState,
    (light, light_w): (&mut Vec<Cand>, &mut Vec<f32>),
    gath: &mut Vec<Cand>,
    gath_w: &mut Vec<f32>,
    sub: &mut Vec<Cand>,
    tmp: &mut Vec<Cand>,
) -> (Walk, WalkState) {
    if c.len() >= HEAVY_SPLIT_MIN {
        if let Some(b) = heavy_bucket(w, total, st) {
            // weights whose bits exceed this have a first-level bucket below `b`
            let above = 0x3F80_0000i32 - ((b as i32) << 19);
            light_w.resize(c.len().max(light_w.len()), 0.0);
            let (hk, hm) = split_heavy(level, c, w, above, light, light_w);
            let k = st.k + hk;
            let mass = st.mass + hm;
            if mass / st.s < st.p - margin(k) {
                let st = WalkState { k, mass, ..st };
                let n = light.len();
                return nucleus_walk_on(level, light, &light_w[..n], st, gath, gath_w, sub, tmp);
            }
        }
    }
    nucleus_walk_on(level, c, w, st, gath, gath_w, sub, tmp)
}

/// The first-level bucket `b > 0` for [`heavy_first_walk`]: by a sample of one weight in
/// [`HEAVY_SAMPLE`], the buckets from `b` on hold, less four standard deviations of the
/// sampling error, more than the collection's mass after the top-p boundary (its whole mass
/// `M` less the mass still needed). The sample is counted from the lightest bucket up, where
/// the tokens are many and the estimate good (a few strong tokens, which a sample would
/// estimate badly, sit in the top buckets). `None` when no bucket qualifies, or the collection
/// may not reach the boundary.
fn heavy_bucket(w: &[f32], total: f64, st: WalkState) -> Option<usize> {
    let after = total - (st.p * st.s - st.mass);
    if after.is_nan() || after <= 0.0 {
        return None;
    }
    let mut mass = [0.0f64; NB1];
    let mut sq = [0.0f64; NB1];
    for &x in w.iter().step_by(HEAVY_SAMPLE) {
        let b = bucket1(x);
        let x = x as f64;
        mass[b] += x;
        sq[b] += x * x;
    }
    let f = HEAVY_SAMPLE as f64;
    let (mut est, mut var) = (0.0f64, 0.0f64);
    let needed = after * (1.0 + 1e-6);
    for b in (1..NB1).rev() {
        est += f * mass[b];
        var += f * (f - 1.0) * sq[b];
        // `est - 4 sd > needed`, squared (no square root per bucket)
        let d = est - needed;
        if d > 0.0 && d * d > 16.0 * var {
            return Some(b);
        }
    }
    None
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

/// Where the large-nucleus top-p cuts its collection: two processed logits below which, by an
/// estimate, the tokens above them hold the mass `need` (in weights `exp(z - m)`), the first
/// by a small margin, the second by a wide one. Blocks whose bound reaches a depth that few
/// blocks reach are read whole, one of the other blocks in [`SAMPLE_STRIDE`] stands for the
/// rest; the logits go into bins of 1/16 of a logit, and the cuts lie where the estimated mass,
/// and the estimated mass minus three standard deviations of the sampling error, reach `need`.
/// `-f32::MAX` (everything) when no such point is found. Only steers the search: the result is
/// checked.
fn flat_cuts(buf: &[f32], bmax: &[f32], m: f32, need: f64) -> (f32, f32) {
    let nblocks = buf.len() / BLOCK;
    let bounds = bmax.len() >= nblocks;
    let full_lo = if bounds {
        full_level(&bmax[..nblocks], m, nblocks / SAMPLE_STRIDE)
    } else {
        f32::INFINITY
    };
    let mut full = Counts::<CUT_BINS>::new();
    let mut samp = Counts::<CUT_BINS>::new();
    let mut idx = [0u32; BLOCK];
    // `z <= m`, so `(m - z) 16 >= 0` (`+inf` for a masked token, which `min` keeps in the last
    // bin); the bins are computed for a whole block first, which vectorises
    let bins = |block: &[f32], idx: &mut [u32; BLOCK]| {
        for (o, &z) in idx.iter_mut().zip(block) {
            *o = clamped_bin((m - z) * 16.0, CUT_BINS as u32 - 1);
        }
    };
    let block = |b: usize| &buf[b * BLOCK..(b + 1) * BLOCK];
    // the blocks read whole: those whose bound reaches `full_lo` (none without bounds), found
    // 16 bounds at a time by a mask
    let mut nfull = 0usize;
    if full_lo.is_finite() {
        for (c, chunk) in bmax[..nblocks].chunks(16).enumerate() {
            let mut bits = 0u32;
            for (j, &x) in chunk.iter().enumerate() {
                bits |= ((x >= full_lo) as u32) << j;
            }
            nfull += bits.count_ones() as usize;
            while bits != 0 {
                let b = c * 16 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                bins(block(b), &mut idx);
                full.add(&idx);
            }
        }
    }
    // one block in SAMPLE_STRIDE of the others
    let mut sampled = 0usize;
    for b in (SAMPLE_STRIDE / 2..nblocks).step_by(SAMPLE_STRIDE) {
        if bounds && bmax[b] >= full_lo {
            continue;
        }
        sampled += 1;
        bins(block(b), &mut idx);
        samp.add(&idx);
    }
    let tail = &buf[nblocks * BLOCK..];
    bins(tail, &mut idx);
    full.add(&idx[..tail.len()]);
    let full = full.counts();
    let samp = samp.counts();
    let other = nblocks - nfull;
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
        let edge = m - (b + 1) as f32 / 16.0;
        // `cum - 3 sd >= need`, squared (no square root per bin)
        let d = cum - need;
        if d >= 0.0 {
            if first.is_none() {
                first = Some(edge);
            }
            if d * d >= 9.0 * var {
                return (first.unwrap_or(edge), edge);
            }
        }
        wc *= STEP;
    }
    match first {
        Some(lo) => (lo, lo - 1.0),
        None => (-f32::MAX, -f32::MAX),
    }
}

/// The level above which [`flat_cuts`] reads blocks whole: the deepest `m - (i + 1) / 2`
/// (`i < 64`, in half logits) that at most `cap` blocks' bounds reach; `+inf` when even the
/// first is reached by more, the blocks counted by the depth of their bound below `m`.
fn full_level(bmax: &[f32], m: f32, cap: usize) -> f32 {
    let mut depth = Counts::<128>::new();
    let mut idx = [0u32; 256];
    for c in bmax.chunks(256) {
        for (o, &x) in idx.iter_mut().zip(c) {
            *o = clamped_bin((m - x) * 2.0, 64);
        }
        depth.add(&idx[..c.len()]);
    }
    let depth = depth.counts();
    let mut full_lo = f32::INFINITY;
    let mut reach = 0usize;
    for (i, &n) in depth[..64].iter().enumerate() {
        // the blocks whose bound is at least `m - (i + 1) / 2`
        reach += n as usize;
        if reach > cap {
            break;
        }
        full_lo = m - (i + 1) as f32 * 0.5;
    }
    full_lo
}

/// Counts of values below `N` (bins), in four interleaved histograms: runs of one bin, common
/// on flat rows, then do not chain every increment on the previous one.
struct Counts<const N: usize>([[u32; N]; 4]);

impl<const N: usize> Counts<N> {
    fn new() -> Self {
        Counts([[0; N]; 4])
    }

    /// Counts the bins `idx` (each below `N`).
    #[inline(always)]
    fn add(&mut self, idx: &[u32]) {
        let quads = idx.len() / 4 * 4;
        for q in idx[..quads].chunks_exact(4) {
            for (h, &b) in self.0.iter_mut().zip(q) {
                h[b as usize % N] += 1;
            }
        }
        for &b in &idx[quads..] {
            self.0[0][b as usize % N] += 1;
        }
    }

    /// The counts by bin.
    fn counts(&self) -> [u32; N] {
        std::array::from_fn(|b| self.0.iter().map(|h| h[b]).sum())
    }
}

/// `floor(d)` for `d >= 0`, capped at `max` (`max` for `+inf`, and for a NaN, which a row never
/// gives here), as `u32`: by adding `2^23`, whose `f32` spacing is 1, after taking off a half
/// (so the rounding to nearest lands on the floor except at exact integers, where it may give
/// the bin below: the bins only steer). Branch-free, so a loop of it vectorises.
#[inline(always)]
fn clamped_bin(d: f32, max: u32) -> u32 {
    let x = (d - 0.5).max(0.0).min(max as f32);
    (x + 8_388_608.0).to_bits() & 0x007F_FFFF
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
