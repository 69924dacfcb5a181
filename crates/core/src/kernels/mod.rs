//! The slice kernels and their run-time dispatch: one place for every vectorised loop.
//!
//! * [`Isa`] — a [`Level`] of the crate's one CPU-feature switch ([`crate::cpu`]) that this
//!   CPU supports, as these kernels see it, passed explicitly to every kernel here (the
//!   workspace carries one, so tests can pin a level without touching the process-wide cap);
//! * `common` — what the kernels share with the rest of the crate (the candidate type, the top-k
//!   heap, `exp_f32` and its constants), a leaf that `support` and `math` import from;
//! * `scalar` — the portable bodies, written as plain arithmetic; [`multiversion!`] compiles
//!   each of them for the baseline target and, on x86-64, with AVX2 and AVX-512 enabled; and
//!   the branch-free compactions of the nucleus search;
//! * `avx2`, `avx512` — the versions written with intrinsics, where the compiler would not
//!   find the instructions on its own (compress stores, masked compares, exact rounding).
//!
//! Every version performs the same IEEE-754 operations in the same order (fused multiply-adds
//! exactly where the portable code has `mul_add`, the lane structure of every reduction written
//! out), so all of them return the same bits; only the speed differs. See [`crate::math`] for
//! the numerics themselves.
//!
//! Every `unsafe` block here says why it is sound: a target-feature function is only called at
//! an [`Isa`] the CPU supports, and every raw-pointer access stays within the slice it was
//! taken from.
//!
//! The kernels use nothing from the crate but `common` and [`crate::cpu`].

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

use crate::cpu::Level;
use common::{sift_down, Cand};

/// Block length of the block bounds (`Workspace::bmax`): scans skip whole blocks by them.
pub(crate) const BLOCK: usize = 64;

/// A [`Level`] that this CPU supports, as the slice kernels run it: [`Level::Scalar`] (the
/// baseline code), [`Level::Avx2`] or [`Level::Avx512`] ([`Level::Avx512Vnni`] runs the
/// AVX-512 code, which needs no VNNI; a build without AVX-512 kernels runs the AVX2 code
/// there). It can only be made by [`Isa::current`] and [`Isa::of`], which never go above
/// [`Level::detected`]; the target-feature kernels rely on that for their soundness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Isa(Level);

impl Isa {
    /// The highest level these kernels have code for.
    #[cfg(all(target_arch = "x86_64", nextok_avx512))]
    const TOP: Level = Level::Avx512;
    #[cfg(not(all(target_arch = "x86_64", nextok_avx512)))]
    const TOP: Level = Level::Avx2;

    /// The process-wide level ([`Level::current`]).
    #[inline]
    pub(crate) fn current() -> Isa {
        Isa(Level::current().min(Isa::TOP))
    }

    /// The code these kernels run for `level`: the best level this CPU supports up to `level`,
    /// at most the highest these kernels have.
    pub(crate) fn of(level: Level) -> Isa {
        Isa(level.effective().min(Isa::TOP))
    }

    /// One of [`Level::Scalar`], [`Level::Avx2`], [`Level::Avx512`].
    #[inline]
    pub(crate) fn get(self) -> Level {
        self.0
    }

    /// The name the sampler's reports give the level: `baseline`, `avx2`, `avx512`.
    pub(crate) fn name(self) -> &'static str {
        match self.0 {
            Level::Scalar => "baseline",
            Level::Avx2 => "avx2",
            Level::Avx512 | Level::Avx512Vnni => "avx512",
        }
    }
}

/// Defines a function whose body is compiled for the baseline target and, on x86-64, with AVX2
/// and AVX-512 enabled; the defined function takes an [`Isa`] first and runs that copy. The
/// body must be plain arithmetic (see the module docs): every copy returns identical results.
macro_rules! multiversion {
    ($(#[$attr:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$attr])*
        $vis fn $name(level: $crate::kernels::Isa, $($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn generic($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[cfg(nextok_avx512)]
                {
                    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi1,popcnt,fma")]
                    fn avx512($($arg: $ty),*) $(-> $ret)? {
                        generic($($arg),*)
                    }
                    if level.get() >= $crate::cpu::Level::Avx512 {
                        // SAFETY: an `Isa` never exceeds what the CPU supports, so it has
                        // these features.
                        return unsafe { avx512($($arg),*) };
                    }
                }
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) $(-> $ret)? {
                    generic($($arg),*)
                }
                if level.get() >= $crate::cpu::Level::Avx2 {
                    // SAFETY: an `Isa` never exceeds what the CPU supports, so it has these
                    // features.
                    return unsafe { avx2($($arg),*) };
                }
            }
            let _ = level;
            generic($($arg),*)
        }
    };
}
pub(crate) use multiversion;

pub(crate) mod common;
mod scalar;

#[cfg(target_arch = "x86_64")]
mod avx2;

#[cfg(all(target_arch = "x86_64", nextok_avx512))]
pub(crate) mod avx512;

#[cfg(test)]
pub(crate) mod tests;

pub(crate) use scalar::{
    cand_exp_sum, collect_min_p, filter_cands, filter_cands_w, gather, max_f32, nan_or_pos_inf,
    prefix_len, sum_f64_lanes,
};

/// `sum_i w[i]` when it is exact in any order, else `None` (see
/// [`scalar::exact_sum_any_order`]; the same lanes and bits at every level).
pub(crate) fn exact_sum_any_order(level: Isa, w: &[f32]) -> Option<f64> {
    #[cfg(all(target_arch = "x86_64", nextok_avx512))]
    if level.get() >= Level::Avx512 {
        // SAFETY: an `Isa` never exceeds what the CPU supports: it has AVX-512.
        let (acc, low) = unsafe { avx512::lane_sums16(w) };
        return scalar::exact_sum_finish(acc, low, &w[w.len() / 16 * 16..]);
    }
    scalar::exact_sum_any_order(level, w)
}

/// Writes `w[i] = exp_f32(z[i] - m)` for every `i` and returns the lane sum of `w` in `f64`
/// (see [`crate::math::exp_weights`]).
pub(crate) fn exp_weights(level: Isa, z: &[f32], m: f32, w: &mut [f32]) -> f64 {
    #[cfg(all(target_arch = "x86_64", nextok_avx512))]
    if level.get() >= Level::Avx512 {
        let mut acc = [0.0f64; 8]; // SAFETY: an `Isa` never exceeds what the CPU supports: it has AVX-512.
        let n = unsafe { avx512::exp_blocks::<true>(z, m, Some(&mut *w), &mut acc) };
        // SAFETY: the CPU has FMA (the level above includes it).
        return unsafe { exp_rest(z, m, Some(w), n, acc) };
    }
    #[cfg(target_arch = "x86_64")]
    if level.get() >= Level::Avx2 {
        let mut acc = [0.0f64; 8]; // SAFETY: an `Isa` never exceeds what the CPU supports: it has AVX2 and FMA.
        let n = unsafe { avx2::exp_blocks::<true>(z, m, Some(&mut *w), &mut acc) };
        // SAFETY: the CPU has FMA (the level above includes it).
        return unsafe { exp_rest(z, m, Some(w), n, acc) };
    }
    scalar::exp_weights(level, z, m, w)
}

/// `sum_i exp_f32(z[i] - m)` in the lane order of [`sum_f64_lanes`], without storing weights.
pub(crate) fn exp_sum(level: Isa, z: &[f32], m: f32) -> f64 {
    #[cfg(all(target_arch = "x86_64", nextok_avx512))]
    if level.get() >= Level::Avx512 {
        let mut acc = [0.0f64; 8]; // SAFETY: an `Isa` never exceeds what the CPU supports: it has AVX-512.
        let n = unsafe { avx512::exp_blocks::<true>(z, m, None, &mut acc) };
        // SAFETY: the CPU has FMA (the level above includes it).
        return unsafe { exp_rest(z, m, None, n, acc) };
    }
    #[cfg(target_arch = "x86_64")]
    if level.get() >= Level::Avx2 {
        let mut acc = [0.0f64; 8]; // SAFETY: an `Isa` never exceeds what the CPU supports: it has AVX2 and FMA.
        let n = unsafe { avx2::exp_blocks::<true>(z, m, None, &mut acc) };
        // SAFETY: the CPU has FMA (the level above includes it).
        return unsafe { exp_rest(z, m, None, n, acc) };
    }
    scalar::exp_sum(level, z, m)
}

/// [`exp_sum`] when `m` is at least every `z[i]` (the maximum): the same result, a little faster
/// (the clamp of large inputs cannot apply).
pub(crate) fn exp_sum_at_max(level: Isa, z: &[f32], m: f32) -> f64 {
    #[cfg(all(target_arch = "x86_64", nextok_avx512))]
    if level.get() >= Level::Avx512 && !m.is_nan() {
        let mut acc = [0.0f64; 8];
        // SAFETY: an `Isa` never exceeds what the CPU supports: it has AVX-512. (`z[i] - m <=
        // 0` for every `i`, the caller's contract, so skipping `min(88, x)` changes nothing.)
        let n = unsafe { avx512::exp_blocks::<false>(z, m, None, &mut acc) };
        // SAFETY: the CPU has FMA (the level above includes it).
        return unsafe { exp_rest(z, m, None, n, acc) };
    }
    #[cfg(target_arch = "x86_64")]
    if level.get() >= Level::Avx2 && !m.is_nan() {
        let mut acc = [0.0f64; 8];
        // SAFETY: an `Isa` never exceeds what the CPU supports: it has AVX2 and FMA. (`z[i] -
        // m <= 0` for every `i`, the caller's contract, so skipping `min(88, x)` changes
        // nothing.)
        let n = unsafe { avx2::exp_blocks::<false>(z, m, None, &mut acc) };
        // SAFETY: the CPU has FMA (the level above includes it).
        return unsafe { exp_rest(z, m, None, n, acc) };
    }
    scalar::exp_sum(level, z, m)
}

/// The end of the vector `exp` passes: from `n` on, `exp_f32(z[i] - m)` one at a time into lane
/// `i % 8` of `acc` (and into `w[i]` when given); returns the sum of the lanes, as
/// [`sum_f64_lanes`] orders it. Compiled with FMA, as the vector passes before it: built for the
/// x86-64 baseline, each `mul_add` of `exp_f32` would otherwise be a call.
///
/// # Safety
/// The CPU must have FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn exp_rest(
    z: &[f32],
    m: f32,
    mut w: Option<&mut [f32]>,
    n: usize,
    mut acc: [f64; 8],
) -> f64 {
    for (i, &x) in z.iter().enumerate().skip(n) {
        let e = common::exp_f32(x - m);
        if let Some(w) = w.as_deref_mut() {
            w[i] = e;
        }
        acc[i % 8] += e as f64;
    }
    acc.iter().sum()
}

/// `w[i] = exp_f32(c[i].z - m)` for every candidate (`w` at least as long as `c`). Returns
/// their sum in 8 `f64` lanes (lane `i % 8`, in order, then the lanes in order; the same bits
/// at every level), which only steers the searches that use it.
pub(crate) fn cand_weights(level: Isa, c: &[Cand], m: f32, w: &mut [f32]) -> f64 {
    assert!(w.len() >= c.len());
    let lanes = 'lanes: {
        #[cfg(all(target_arch = "x86_64", nextok_avx512))]
        if level.get() >= Level::Avx512 {
            // SAFETY: an `Isa` never exceeds what the CPU supports: it has AVX-512.
            break 'lanes unsafe { avx512::cand_weights(c, m, w) };
        }
        #[cfg(target_arch = "x86_64")]
        if level.get() >= Level::Avx2 {
            // SAFETY: an `Isa` never exceeds what the CPU supports: it has AVX2 and FMA.
            break 'lanes unsafe { avx2::cand_weights(c, m, w) };
        }
        scalar::cand_weights(level, c, m, w)
    };
    lanes.iter().sum()
}

/// Copies `raw` into `buf`, writes the maximum of every block of [`BLOCK`] values to `bmax`, and
/// returns (whether a NaN or `+inf` was seen, the number of values above `-inf`, the maximum
/// exactly as [`max_f32`] gives it).
pub(crate) fn load(
    level: Isa,
    raw: &[f32],
    buf: &mut [f32],
    bmax: &mut [f32],
) -> (bool, usize, f32) {
    assert!(raw.len() == buf.len() && bmax.len() == raw.len().div_ceil(BLOCK));
    #[cfg(all(target_arch = "x86_64", nextok_avx512))]
    let (bad, count, max) = if level.get() >= Level::Avx512 {
        // SAFETY: an `Isa` never exceeds what the CPU supports: it has AVX-512.
        unsafe { avx512::load(raw, buf, bmax) }
    } else {
        scalar::load(level, raw, buf, bmax)
    };
    #[cfg(not(all(target_arch = "x86_64", nextok_avx512)))]
    let (bad, count, max) = scalar::load(level, raw, buf, bmax);
    (bad, count, settle_zero_max(level, raw, bad, max))
}

/// [`load`] without the copy: writes the block maxima of `raw` to `bmax` and returns (whether a
/// NaN or `+inf` was seen, the number of values above `-inf`, the maximum exactly as
/// [`max_f32`] gives it). The portable pass at every level (its AVX-512 build included).
pub(crate) fn scan(level: Isa, raw: &[f32], bmax: &mut [f32]) -> (bool, usize, f32) {
    assert!(bmax.len() == raw.len().div_ceil(BLOCK));
    let (bad, count, max) = scalar::scan(level, raw, bmax);
    (bad, count, settle_zero_max(level, raw, bad, max))
}

/// The maximum a load pass found, as [`max_f32`] gives it: its value is right, only the sign of
/// a zero maximum depends on the order the pass took.
fn settle_zero_max(level: Isa, raw: &[f32], bad: bool, max: f32) -> f32 {
    if max == 0.0 && !bad {
        max_f32(level, raw)
    } else {
        max
    }
}

/// A bucket of weights for [`gather_weight_key`]: the weights `w` (not negative) whose key
/// `min((bits(1.0) - bits(w)) >> shift, max)` (the distance below 1 in `f32` bits, 0 for `w >=
/// 1`) is `value`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WeightKey {
    pub(crate) shift: u32,
    pub(crate) max: u32,
    pub(crate) value: u32,
}

impl WeightKey {
    /// The key of one weight.
    #[inline(always)]
    pub(crate) fn of(&self, w: f32) -> u32 {
        (0x3F80_0000u32.saturating_sub(w.to_bits()) >> self.shift).min(self.max)
    }
}

/// Copies the candidates (and weights) whose weight is in the bucket `key` to `out` (and
/// `out_w`), in order ([`gather`] with that test).
pub(crate) fn gather_weight_key(
    level: Isa,
    c: &[Cand],
    w: &[f32],
    key: WeightKey,
    out: &mut Vec<Cand>,
    out_w: &mut Vec<f32>,
) {
    #[cfg(target_arch = "x86_64")]
    if level.get() >= Level::Avx2 {
        let n = c.len().min(w.len());
        out.clear();
        out_w.clear();
        // the workspace's buffers hold any collection: no allocation there
        out.reserve(n);
        out_w.reserve(n);
        // SAFETY: an `Isa` never exceeds what the CPU supports: it has AVX2.
        return unsafe { avx2::gather_weight_key(c, w, key, out, out_w) };
    }
    let _ = level;
    gather(c, w, |x| key.of(x) == key.value, out, out_w)
}

/// A full top-k heap (its root the worst kept candidate, see `support::sort`) during the scan of
/// the rest of the row, with the root's value as the threshold to enter.
pub(crate) struct TopKScan<'a> {
    heap: &'a mut [Cand],
    thr: f32,
}

impl<'a> TopKScan<'a> {
    /// Starts a scan with a full, non-empty heap.
    fn new(heap: &'a mut [Cand]) -> Self {
        let thr = heap[0].z;
        TopKScan { heap, thr }
    }

    /// Offers token `i`: it enters only when strictly above the worst kept one (a later id with
    /// an equal value is worse).
    #[inline(always)]
    fn offer(&mut self, i: usize, z: f32) {
        if z > self.thr {
            self.heap[0] = Cand { id: i as u32, z };
            sift_down(self.heap, 0);
            self.thr = self.heap[0].z;
        }
    }

    /// Offers the tokens `start, start + 1, ...` with values `zs`, in order.
    #[inline(always)]
    fn offer_run(&mut self, start: usize, zs: &[f32]) {
        for (off, &z) in zs.iter().enumerate() {
            self.offer(start + off, z);
        }
    }
}

/// The top-k scan of `buf` from `start` into a full heap: only values strictly above the worst
/// kept one enter. The values up to the next block boundary and after the last whole block are
/// offered one by one; the whole blocks in between go to a kernel, which skips the blocks whose
/// bound in `bmax` (when given) cannot enter and offers the others' candidates in id order.
pub(crate) fn top_k_scan(level: Isa, buf: &[f32], bmax: &[f32], start: usize, heap: &mut [Cand]) {
    let mut scan = TopKScan::new(heap);
    let first = start.next_multiple_of(BLOCK).min(buf.len());
    let end = first + (buf.len() - first) / BLOCK * BLOCK;
    scan.offer_run(start, &buf[start..first]);
    #[cfg(all(target_arch = "x86_64", nextok_avx512))]
    if level.get() >= Level::Avx512 {
        // SAFETY: an `Isa` never exceeds what the CPU supports: it has AVX-512.
        unsafe { avx512::top_k_blocks(&buf[..end], bmax, first, &mut scan) };
    } else {
        scalar::top_k_blocks(level, &buf[..end], bmax, first, &mut scan);
    }
    #[cfg(not(all(target_arch = "x86_64", nextok_avx512)))]
    scalar::top_k_blocks(level, &buf[..end], bmax, first, &mut scan);
    scan.offer_run(end, &buf[end..]);
}

/// A band of processed logits for [`collect_band`]: `lo <= z < hi`, except the tokens with
/// `z == tie_z` and `id > tie_id` (a NaN `tie_z` excludes nothing).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Band {
    pub(crate) lo: f32,
    pub(crate) hi: f32,
    pub(crate) tie_z: f32,
    pub(crate) tie_id: u32,
}

impl Band {
    /// `lo <= z < hi`, no tie exclusion.
    pub(crate) fn new(lo: f32, hi: f32) -> Band {
        Band {
            lo,
            hi,
            tie_z: f32::NAN,
            tie_id: 0,
        }
    }

    /// Whether token `id` with value `z` is in the band.
    #[inline(always)]
    pub(crate) fn keeps(&self, id: usize, z: f32) -> bool {
        z >= self.lo && z < self.hi && !(z == self.tie_z && id > self.tie_id as usize)
    }
}

/// The candidates (and weights) up to `at` in canonical order — `z > at.z`, or `z = at.z` and
/// `id <= at.id` — in order, to `out` and `out_w` ([`filter_cands_w`] with that test, for values
/// that are never NaN); returns how many, and the kept weights' sum when it is exact in any
/// order (as [`exact_sum_any_order`] of the kept weights gives it; the lanes here are the input
/// index modulo 16, the same at every level, so a sum near its bound may be `None` here and
/// `Some` there or the reverse, and whenever either is `Some` it is the exact sum).
pub(crate) fn filter_upto(
    level: Isa,
    c: &[Cand],
    w: &[f32],
    at: Cand,
    out: &mut Vec<Cand>,
    out_w: &mut [f32],
) -> (usize, Option<f64>) {
    #[cfg(target_arch = "x86_64")]
    if level.get() >= Level::Avx2 && out_w.len() >= c.len().min(w.len()) {
        out.clear();
        out.reserve(c.len().min(w.len()));
        #[cfg(nextok_avx512)]
        if level.get() >= Level::Avx512 {
            // SAFETY: an `Isa` never exceeds what the CPU supports: it has AVX-512.
            let (n, acc, low) = unsafe { avx512::filter_upto(c, w, at, out, out_w) };
            return (n, scalar::exact_sum_finish(acc, low, &[]));
        }
        // SAFETY: an `Isa` never exceeds what the CPU supports: it has AVX2, BMI1 and POPCNT.
        let (n, acc, low) = unsafe { avx2::filter_upto(c, w, at, out, out_w) };
        return (n, scalar::exact_sum_finish(acc, low, &[]));
    }
    let _ = level;
    let keep = |x: &Cand| x.z > at.z || (x.z == at.z && x.id <= at.id);
    let n = filter_cands_w(c, w, keep, out, out_w);
    let mut acc = [0.0f64; 16];
    let mut low = [u32::MAX; 16];
    for (i, (x, &wx)) in c.iter().zip(w).enumerate() {
        if keep(x) {
            acc[i % 16] += wx as f64;
            let b = wx.to_bits();
            low[i % 16] = if b != 0 && b < low[i % 16] {
                b
            } else {
                low[i % 16]
            };
        }
    }
    (n, scalar::exact_sum_finish(acc, low, &[]))
}

/// The candidates after the last whole vector of the nucleus filter's packing loop (fewer than
/// 16), for its 16 lane sums: whether each is kept (up to `at` in canonical order), its weight
/// noted in lane `i % 16` (one per lane at most).
#[cfg(target_arch = "x86_64")]
pub(crate) struct UptoTail {
    at: Cand,
    acc: [f64; 16],
    low: [u32; 16],
}

#[cfg(target_arch = "x86_64")]
impl UptoTail {
    pub(crate) fn new(at: Cand) -> UptoTail {
        UptoTail {
            at,
            acc: [0.0; 16],
            low: [u32::MAX; 16],
        }
    }

    /// Whether candidate `i`, `x` with weight `wx`, is kept; a kept weight is noted.
    pub(crate) fn offer(&mut self, i: usize, x: &Cand, wx: f32) -> bool {
        let kept = x.z > self.at.z || (x.z == self.at.z && x.id <= self.at.id);
        if kept {
            self.acc[i % 16] = wx as f64;
            let b = wx.to_bits();
            self.low[i % 16] = if b != 0 { b } else { u32::MAX };
        }
        kept
    }

    /// Adds the noted weights to the vector loop's lane sums and minima (one addition per
    /// lane: the lanes' sums in index order).
    pub(crate) fn finish(&self, sums: &mut [f64; 16], lows: &mut [u32; 16]) {
        for j in 0..16 {
            sums[j] += self.acc[j];
            lows[j] = lows[j].min(self.low[j]);
        }
    }
}

/// Splits candidates by weight: those whose weight's bits exceed `above` (compared as `i32`:
/// for weights `>= 0`, the weights above `f32::from_bits(above)`) are only counted and summed
/// (in 8 `f64` lanes, lane `i % 8`, then the lanes in order: the sum of a set in a fixed order,
/// within the usual rounding bound of any other), the others are copied in order to `out` and
/// `out_w`. Returns the heavy count and sum.
pub(crate) fn split_heavy(
    level: Isa,
    c: &[Cand],
    w: &[f32],
    above: i32,
    out: &mut Vec<Cand>,
    out_w: &mut [f32],
) -> (usize, f64) {
    let n = c.len().min(w.len());
    #[cfg(target_arch = "x86_64")]
    if level.get() >= Level::Avx2 && out_w.len() >= n {
        out.clear();
        out.reserve(n);
        #[cfg(nextok_avx512)]
        if level.get() >= Level::Avx512 {
            // SAFETY: an `Isa` never exceeds what the CPU supports: it has AVX-512.
            let (heavy, sums) = unsafe { avx512::split_heavy(c, w, above, out, out_w) };
            return (heavy, sums.iter().sum());
        }
        // SAFETY: an `Isa` never exceeds what the CPU supports: it has AVX2, BMI1 and POPCNT.
        let (heavy, sums) = unsafe { avx2::split_heavy(c, w, above, out, out_w) };
        return (heavy, sums.iter().sum());
    }
    let _ = level;
    let mut sums = [0.0f64; 8];
    let mut heavy = 0usize;
    out.clear();
    let mut k = 0usize;
    for (i, (x, &wx)) in c[..n].iter().zip(&w[..n]).enumerate() {
        if wx.to_bits() as i32 > above {
            heavy += 1;
            sums[i % 8] += wx as f64;
        } else {
            out.push(*x);
            out_w[k] = wx;
            k += 1;
        }
    }
    (heavy, sums.iter().sum())
}

/// Appends `(id, z)` for every token of `band`, in id order. Blocks of [`BLOCK`] values whose
/// bound in `bmax` (when given) is below `band.lo` are skipped unread.
pub(crate) fn collect_band(level: Isa, buf: &[f32], bmax: &[f32], band: Band, out: &mut Vec<Cand>) {
    // the bands of one step are disjoint, so this never allocates for a workspace's own buffers
    // (capacity `v + 16`); the AVX-512 version stores 16 candidates at a time
    out.reserve(buf.len().saturating_sub(out.len()) + 16);
    #[cfg(all(target_arch = "x86_64", nextok_avx512))]
    if level.get() >= Level::Avx512 {
        // SAFETY: an `Isa` never exceeds what the CPU supports: it has AVX-512.
        return unsafe {
            if band.tie_z.is_nan() {
                avx512::collect_band::<false>(buf, bmax, band, out)
            } else {
                avx512::collect_band::<true>(buf, bmax, band, out)
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    if level.get() >= Level::Avx2 {
        // SAFETY: an `Isa` never exceeds what the CPU supports: it has AVX2, BMI1 and POPCNT.
        return unsafe {
            if band.tie_z.is_nan() {
                avx2::collect_band::<false>(buf, bmax, band, out)
            } else {
                avx2::collect_band::<true>(buf, bmax, band, out)
            }
        };
    }
    scalar::collect_band(level, buf, bmax, band, out)
}
