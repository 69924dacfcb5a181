//! The portable kernel bodies: plain arithmetic, written so that the compiler can vectorise it.
//! Each `multiversion!` function here is compiled for every [`Isa`](super::Isa) and takes
//! the level to run first; the others are inlined into them. Last, the branch-free compactions
//! of the nucleus search ([`gather`], [`filter_cands`], [`filter_cands_w`]), which write through
//! raw pointers so that only the count depends on the data.

use super::common::{exp_f32, Cand};
use super::{Band, TopKScan, BLOCK};

multiversion! {
    /// Sum with a fixed association: lane `j` sums elements `j, j+8, j+16, ...` in `f64`, then
    /// the eight lanes are added in order 0..8.
    pub(crate) fn sum_f64_lanes(xs: &[f32]) -> f64 {
        sum_f64_lanes_inline(xs)
    }
}

#[inline(always)]
fn sum_f64_lanes_inline(xs: &[f32]) -> f64 {
    let mut acc = [0.0f64; 8];
    let chunks = xs.chunks_exact(8);
    let rem = chunks.remainder();
    for c in chunks {
        for j in 0..8 {
            acc[j] += c[j] as f64;
        }
    }
    for (j, &x) in rem.iter().enumerate() {
        acc[j] += x as f64;
    }
    acc.iter().sum()
}

multiversion! {
    /// Maximum of a slice that holds no NaN (`-inf` allowed). Empty gives `-inf`.
    pub(crate) fn max_f32(xs: &[f32]) -> f32 {
        max_f32_inline(xs)
    }
}

/// [`max_f32`] for inlining into other kernels.
#[inline(always)]
pub(crate) fn max_f32_inline(xs: &[f32]) -> f32 {
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

multiversion! {
    /// [`super::exp_weights`].
    pub(super) fn exp_weights(z: &[f32], m: f32, w: &mut [f32]) -> f64 {
        exp_weights_inline(z, m, w)
    }
}

#[inline(always)]
fn exp_weights_inline(z: &[f32], m: f32, w: &mut [f32]) -> f64 {
    let mut acc = LaneSum([0.0f64; 8]);
    let n = exp_pass(z, m, w, &mut acc);
    let mut acc = acc.0;
    for (i, (zv, wv)) in z[n..].iter().zip(w[n..].iter_mut()).enumerate() {
        let e = exp_f32(*zv - m);
        *wv = e;
        acc[(n + i) % 8] += e as f64;
    }
    acc.iter().sum()
}

multiversion! {
    /// [`super::exp_sum`].
    pub(super) fn exp_sum(z: &[f32], m: f32) -> f64 {
        exp_sum_inline(z, m)
    }
}

#[inline(always)]
fn exp_sum_inline(z: &[f32], m: f32) -> f64 {
    let mut acc = LaneSum([0.0f64; 8]);
    let n = exp_pass_ring(z, m, &mut acc);
    let mut acc = acc.0;
    for (i, &x) in z[n..].iter().enumerate() {
        acc[(n + i) % 8] += exp_f32(x - m) as f64;
    }
    acc.iter().sum()
}

/// Chunk length of [`exp_pass`].
const EXP_CHUNK: usize = 16;
/// How many chunks ahead [`exp_pass`] computes weights before they are consumed.
const EXP_LEAD: usize = 8;

/// A consumer of the weight chunks of [`exp_pass`], called once per chunk in order.
trait ChunkVisitor {
    /// Chunk `k` (values `16 k .. 16 k + 16`).
    fn visit(&mut self, k: usize, c: &[f32; EXP_CHUNK]);
}

/// The `f64` lane sum of [`sum_f64_lanes`] as a chunk consumer.
struct LaneSum([f64; 8]);

impl ChunkVisitor for LaneSum {
    #[inline(always)]
    fn visit(&mut self, _k: usize, c: &[f32; EXP_CHUNK]) {
        add_lanes16(&mut self.0, c);
    }
}

/// `exp_f32(z[j] - m)` for one chunk.
#[inline(always)]
fn exp_chunk(z: &[f32], m: f32) -> [f32; EXP_CHUNK] {
    let mut e = [0.0f32; EXP_CHUNK];
    for (ej, &zj) in e.iter_mut().zip(z) {
        *ej = exp_f32(zj - m);
    }
    e
}

/// Adds a chunk to the eight `f64` lanes: element `j` to lane `j % 8`, in index order.
#[inline(always)]
fn add_lanes16(acc: &mut [f64; 8], c: &[f32; EXP_CHUNK]) {
    for j in 0..8 {
        acc[j] += c[j] as f64;
    }
    for j in 0..8 {
        acc[j] += c[8 + j] as f64;
    }
}

/// Writes `w[i] = exp_f32(z[i] - m)` for the whole chunks of `z` (16 values each) and gives every
/// chunk, in order, to `v`. The weights are computed a few chunks ahead of their consumption so
/// that the long latency of `exp_f32` overlaps the (sequential) consumer; the order of the
/// consumer's operations is unchanged. Returns the number of values covered (the caller handles
/// the rest).
#[inline(always)]
fn exp_pass<V: ChunkVisitor>(z: &[f32], m: f32, w: &mut [f32], v: &mut V) -> usize {
    const C: usize = EXP_CHUNK;
    let nc = z.len().min(w.len()) / C;
    let lead = nc.min(EXP_LEAD);
    for k in 0..nc {
        let e = exp_chunk(&z[C * k..C * k + C], m);
        w[C * k..C * k + C].copy_from_slice(&e);
        if k >= lead {
            let j = k - lead;
            v.visit(j, w[C * j..C * j + C].try_into().expect("chunk"));
        }
    }
    for j in nc - lead..nc {
        v.visit(j, w[C * j..C * j + C].try_into().expect("chunk"));
    }
    nc * C
}

/// [`exp_pass`] without storing the weights (a small ring buffer holds the chunks in flight).
#[inline(always)]
fn exp_pass_ring<V: ChunkVisitor>(z: &[f32], m: f32, v: &mut V) -> usize {
    const C: usize = EXP_CHUNK;
    let mut ring = [[0.0f32; C]; EXP_LEAD];
    let nc = z.len() / C;
    let lead = nc.min(EXP_LEAD);
    for k in 0..nc {
        let e = exp_chunk(&z[C * k..C * k + C], m);
        if k >= lead {
            let j = k - lead;
            v.visit(j, &ring[j % EXP_LEAD]);
        }
        ring[k % EXP_LEAD] = e;
    }
    for j in nc - lead..nc {
        v.visit(j, &ring[j % EXP_LEAD]);
    }
    nc * C
}

/// `exp_f32(c[j].z - m)` for up to 16 candidates (the rest of `out` is left alone).
#[inline(always)]
fn cand_exps(c: &[Cand], m: f32, out: &mut [f32; 16]) {
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
    /// [`super::cand_weights`], 16 at a time: the values are first copied out of the pairs, so
    /// that `exp_f32` runs on whole vectors. Returns the weights' 8 `f64` lane sums (lane
    /// `i % 8`, in order).
    pub(super) fn cand_weights(c: &[Cand], m: f32, w: &mut [f32]) -> [f64; 8] {
        let mut x = [0.0f32; 16];
        let blocks = c.chunks_exact(16);
        let rest = blocks.remainder();
        for (block, out) in blocks.zip(w.chunks_exact_mut(16)) {
            for (xj, cj) in x.iter_mut().zip(block) {
                *xj = cj.z - m;
            }
            for (o, &xj) in out.iter_mut().zip(&x) {
                *o = exp_f32(xj);
            }
        }
        let n = c.len() - rest.len();
        for (o, cj) in w[n..].iter_mut().zip(rest) {
            *o = exp_f32(cj.z - m);
        }
        let mut lanes = [0.0f64; 8];
        for (i, &x) in w[..c.len()].iter().enumerate() {
            lanes[i % 8] += x as f64;
        }
        lanes
    }
}

multiversion! {
    /// The smallest `n >= min_keep` whose cumulative probability `sum_{i<n} exp_f32(c[i].z - m)
    /// / s` (added in order) is `>= p`, if any. The weights are computed 16 at a time.
    pub(crate) fn prefix_len(c: &[Cand], m: f32, s: f64, p: f64, min_keep: usize) -> Option<usize> {
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
    pub(crate) fn cand_exp_sum(c: &[Cand], m: f32) -> f64 {
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

multiversion! {
    /// `sum_i w[i]` (non-negative weights) when it is exact in `f64` whatever the order of the
    /// additions, else `None`. Every weight is a multiple of `g = 2^(e - 23)`, `2^e` the binary
    /// magnitude of the smallest positive one, and no partial sum exceeds the exact total: with
    /// the total below `2^(30 + e)` every partial sum is a multiple of `g` below `2^53 g`, so every
    /// addition is exact, in the canonical order as in any other.
    pub(crate) fn exact_sum_any_order(w: &[f32]) -> Option<f64> {
        let mut acc = [0.0f64; 16];
        let mut low = [u32::MAX; 16];
        let chunks = w.chunks_exact(16);
        let rest = chunks.remainder();
        for c in chunks {
            for j in 0..16 {
                acc[j] += c[j] as f64;
                // the bits of a non-negative `f32` order like its value; zero is skipped
                let b = c[j].to_bits();
                low[j] = if b != 0 && b < low[j] { b } else { low[j] };
            }
        }
        exact_sum_finish(acc, low, rest)
    }
}

/// The end of [`exact_sum_any_order`] from the 16 lane sums and smallest non-zero bits of the
/// whole chunks of 16 weights (lane `j`: weights `16 i + j`, in order) and the `rest`.
pub(crate) fn exact_sum_finish(
    mut acc: [f64; 16],
    mut low: [u32; 16],
    rest: &[f32],
) -> Option<f64> {
    for (j, &x) in rest.iter().enumerate() {
        acc[j] += x as f64;
        let b = x.to_bits();
        low[j] = if b != 0 && b < low[j] { b } else { low[j] };
    }
    let low = low.iter().copied().min().unwrap_or(u32::MAX);
    let sum: f64 = acc.iter().sum();
    if low == u32::MAX {
        // every weight is 0
        return Some(sum);
    }
    let e = (low >> 23) as i32 - 127; // a subnormal gives -127: never exact enough
                                      // no partial sum exceeds the exact total, which is within a relative `n 2^-53` of `sum`
    if sum * (1.0 + 1e-6) >= 2f64.powi(30 + e) {
        return None;
    }
    Some(sum)
}

/// Whether `x` is NaN or `+inf` (the raw logits nextok rejects); one comparison, so it vectorises.
#[inline(always)]
#[allow(clippy::neg_cmp_op_on_partial_ord)]
pub(crate) fn nan_or_pos_inf(x: f32) -> bool {
    !(x < f32::INFINITY)
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

multiversion! {
    /// [`super::load`]: one pass, with 16 independent lanes for the maximum (its *value* does not
    /// depend on the order; the caller settles the sign of a zero maximum).
    pub(super) fn load(raw: &[f32], buf: &mut [f32], bmax: &mut [f32]) -> (bool, usize, f32) {
        load_inline::<true>(raw, buf, bmax)
    }
}

multiversion! {
    /// [`super::scan`]: [`load`] without the copy.
    pub(super) fn scan(raw: &[f32], bmax: &mut [f32]) -> (bool, usize, f32) {
        load_inline::<false>(raw, &mut [], bmax)
    }
}

/// The bound of one block exactly as [`load`] and [`scan`] write it to `bmax`, bits included:
/// the *value* is the block's maximum whatever the order, but the sign of a zero maximum (`+0.0`
/// beside `-0.0`) is the one the pass's order meets first. A whole block of [`BLOCK`] values
/// goes by 16 lanes (lane `j` holds elements `j, j + 16, j + 32, j + 48` and keeps the first of
/// its largest, then the lanes in order keep the first); a shorter block (the row's last) goes
/// in order. A NaN is never taken (the row is rejected anyway). Vector versions of the pass use
/// this to settle a zero bound.
pub(super) fn block_max(r: &[f32]) -> f32 {
    const L: usize = 16;
    if r.len() != BLOCK {
        return r
            .iter()
            .fold(f32::NEG_INFINITY, |a, &x| if x > a { x } else { a });
    }
    let mut blk = [f32::NEG_INFINITY; L];
    for rh in r.chunks_exact(L) {
        for j in 0..L {
            blk[j] = if rh[j] > blk[j] { rh[j] } else { blk[j] };
        }
    }
    blk.iter()
        .fold(f32::NEG_INFINITY, |a, &x| if x > a { x } else { a })
}

/// [`load`] (copying `raw` into `buf` when `COPY`; `buf` is not used otherwise). Its block
/// bounds are [`block_max`]'s, bit for bit (the same lanes, the same comparisons).
#[inline(always)]
fn load_inline<const COPY: bool>(
    raw: &[f32],
    buf: &mut [f32],
    bmax: &mut [f32],
) -> (bool, usize, f32) {
    const L: usize = 16;
    let n = if COPY {
        raw.len().min(buf.len())
    } else {
        raw.len()
    } / BLOCK
        * BLOCK;
    let mut bad = [0u32; L];
    let mut cnt = [0u32; L];
    let mut mx = [f32::NEG_INFINITY; L];
    // the copy's destination, `L` values at a time, in step with the reads (`n <= buf.len()`
    // when `COPY`)
    let mut out = COPY.then(|| buf[..n].chunks_exact_mut(L));
    for (r, bm) in raw[..n].chunks_exact(BLOCK).zip(bmax.iter_mut()) {
        let mut blk = [f32::NEG_INFINITY; L];
        for rh in r.chunks_exact(L) {
            let v: [f32; L] = rh.try_into().expect("chunk");
            for j in 0..L {
                let x = v[j];
                bad[j] |= nan_or_pos_inf(x) as u32;
                cnt[j] += (x > f32::NEG_INFINITY) as u32;
                blk[j] = if x > blk[j] { x } else { blk[j] };
            }
            if let Some(bh) = out.as_mut().and_then(|o| o.next()) {
                bh.copy_from_slice(&v);
            }
        }
        for j in 0..L {
            mx[j] = if blk[j] > mx[j] { blk[j] } else { mx[j] };
        }
        *bm = blk
            .iter()
            .fold(f32::NEG_INFINITY, |a, &x| if x > a { x } else { a });
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
    for (i, &x) in raw.iter().enumerate().skip(n) {
        if COPY {
            buf[i] = x;
        }
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

multiversion! {
    /// [`super::top_k_scan`] over whole blocks (`buf` ends at a block boundary, `start` is one):
    /// blocks whose bound in `bmax` (when given) cannot enter are skipped, the others are tested
    /// with one vector comparison and only then offered value by value.
    pub(super) fn top_k_blocks(buf: &[f32], bmax: &[f32], start: usize, scan: &mut TopKScan<'_>) {
        let mut i = start;
        for c in buf[start..].chunks_exact(BLOCK) {
            let skip = bmax.get(i / BLOCK).is_some_and(|&b| b <= scan.thr)
                || !(any_gt(&c[..32], scan.thr) || any_gt(&c[32..], scan.thr));
            if !skip {
                scan.offer_run(i, c);
            }
            i += BLOCK;
        }
    }
}

multiversion! {
    /// Pushes `(id, z)` for every `z` with `z - m >= lz` and `exp_f32(z - m) >= alpha`, in id
    /// order; blocks of 32 with no `z - m >= lz` are skipped with one vector test.
    pub(crate) fn collect_min_p(z: &[f32], m: f32, lz: f32, alpha: f64, out: &mut Vec<Cand>) {
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

multiversion! {
    /// [`super::collect_band`], 64 values at a time.
    pub(super) fn collect_band(buf: &[f32], bmax: &[f32], band: Band, out: &mut Vec<Cand>) {
        let n = buf.len() / BLOCK * BLOCK;
        for (b, c) in buf[..n].chunks_exact(BLOCK).enumerate() {
            if bmax.get(b).is_some_and(|&x| x < band.lo) {
                continue;
            }
            let base = b * BLOCK;
            let mut bits = 0u64;
            for (j, &z) in c.iter().enumerate() {
                bits |= (band.keeps(base + j, z) as u64) << j;
            }
            while bits != 0 {
                let j = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                out.push(Cand { id: (base + j) as u32, z: c[j] });
            }
        }
        for (i, &z) in buf.iter().enumerate().skip(n) {
            if band.keeps(i, z) {
                out.push(Cand { id: i as u32, z });
            }
        }
    }
}

/// Copies the candidates (and weights) whose weight passes `keep` to `out` (and `out_w`),
/// without a branch on the data (only the count advances).
pub(crate) fn gather(
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
pub(crate) fn filter_cands(
    c: &[Cand],
    w: &[f32],
    keep: impl Fn(&Cand, f32) -> bool,
    out: &mut Vec<Cand>,
) {
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
pub(crate) fn filter_cands_w(
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
