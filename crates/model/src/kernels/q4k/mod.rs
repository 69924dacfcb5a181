//! Q4_K in bands of sixteen rows: the layout, the arithmetic (numerics `q4_k=2`) and the
//! kernels that multiply it by Q8_K activations.
//!
//! # Layout
//!
//! A GGML Q4_K super-block (256 values of one row) holds `f16 d`, `f16 dmin`, eight 6-bit
//! scales `sc_g` and mins `m_g` (one per 32-value group `g`) and 128 bytes of nibbles: byte
//! `32j + l` holds value `l` of group `2j` in its low nibble and value `l` of group `2j + 1`
//! in its high nibble. Here the rows are taken sixteen at a time (a **band**; the last band is
//! padded with zero rows), and for each band and super-block `k`:
//!
//! * the nibbles in 64-byte units `(j, p)` (`j = 0..4` group pairs, `p = 0..8` quads of
//!   positions): row `t` of the band owns bytes `4t..4t + 4`, GGML's bytes
//!   `32j + 4p..32j + 4p + 4` of that row's super-block. One load is then four positions of
//!   two groups of sixteen rows, and every 32-bit lane belongs to one row: a `vpdpbusd`
//!   against four activation bytes broadcast to every lane gives sixteen rows' partial dots at
//!   once, with no horizontal sum;
//! * the scales: eight rows of sixteen bytes (`sc_g` of rows `0..16`), then the mins in four
//!   pairs of sixteen-byte rows (`m_{2j}`, `m_{2j+1}` of row `t` at bytes `2t`, `2t + 1`);
//! * `d` and `dmin` of the sixteen rows, as `f16` bits.
//!
//! The planes of [`QMatrix`] hold these with the strides of sixteen rows, so that a band's data
//! starts where its first row's would (`qs[16 · band · qchunks]`, `sc[16 · band · nb]`,
//! `d[16 · band · nbp]`); 2.8 % more than the file (the scales and mins unpacked to bytes).
//!
//! # Arithmetic
//!
//! For each super-block `i` in order, with the activations' `f32` scale `d_a`, quants `a` and
//! sixteen `i16` sums `bs` of sixteen quants:
//!
//! * `isum = Σ_g sc_g · Σ_{e} q_{g,e} · a_{g,e}` and `imin = Σ_g m_g · (bs_{2g} + bs_{2g+1})`,
//!   exact integers (`|isum| < 2^25`; their conversion to `f32` rounds to nearest even, the
//!   same in every kernel);
//! * `acc = fma(d_a · f32(d_w), f32(isum), acc)`;
//! * `acc = fma(−(d_a · f32(dmin_w)), f32(imin), acc)`.
//!
//! Result: `acc`. One accumulator per output: a kernel holds sixteen rows' outputs in one
//! register and updates them with two fused multiply-adds per super-block (the first numerics,
//! `q4_k=1`, kept llama.cpp's `ggml_vec_dot_q4_K_q8_K` order: twelve accumulators per output
//! and a float step for every row and activation).

#[cfg(target_arch = "x86_64")]
mod x86;

use half::f16;

use super::band::BAND;
use super::{rd16, scale_min_k4, Acts, QMatrix};

/// Bytes of one band's nibbles per super-block.
const BAND_QS: usize = BAND * 128;

/// Stores GGML Q4_K block `k` of row `r` (`blk`: 144 bytes) in the band layout.
pub(super) fn put_block(w: &mut QMatrix, r: usize, k: usize, blk: &[u8]) {
    let (band, t) = (r / BAND, r % BAND);
    let dbase = band * BAND * w.nbp + k * BAND + t;
    w.d[dbase] = rd16(blk, 0);
    w.m[dbase] = rd16(blk, 2);
    let sbase = band * BAND * w.nb + k * BAND;
    for g in 0..8 {
        let (s, m) = scale_min_k4(g, &blk[4..16]);
        w.sc[sbase + g][t] = s;
        w.sc[sbase + 8 + 2 * (g / 2) + t / 8][2 * (t % 8) + g % 2] = m;
    }
    let qbase = band * BAND * w.qchunks + k * 64;
    for j in 0..4 {
        for p in 0..8 {
            let src = &blk[16 + 32 * j + 4 * p..16 + 32 * j + 4 * p + 4];
            let c = qbase + (j * 8 + p) * 2 + t / 8;
            w.qs[c].0[4 * (t % 8)..4 * (t % 8) + 4].copy_from_slice(src);
        }
    }
}

/// Quant `e` (`0..256`) of super-block `k` of row `r` (`0..16`).
pub(super) fn quant(w: &QMatrix, r: usize, k: usize, e: usize) -> i32 {
    let (band, t) = (r / BAND, r % BAND);
    let (g, l) = (e / 32, e % 32);
    let c = band * BAND * w.qchunks + k * 64 + ((g / 2) * 8 + l / 4) * 2 + t / 8;
    let b = w.qs[c].0[4 * (t % 8) + l % 4];
    ((b >> (4 * (g % 2))) & 0x0F) as i32
}

/// Scale `g` of super-block `k` of row `r`.
pub(super) fn scale(w: &QMatrix, r: usize, k: usize, g: usize) -> i32 {
    w.sc[(r / BAND) * BAND * w.nb + k * BAND + g][r % BAND] as i32
}

/// Min `g` of super-block `k` of row `r`.
pub(super) fn min(w: &QMatrix, r: usize, k: usize, g: usize) -> i32 {
    let t = r % BAND;
    w.sc[(r / BAND) * BAND * w.nb + k * BAND + 8 + 2 * (g / 2) + t / 8][2 * (t % 8) + g % 2] as i32
}

/// `f32` of `d` (`which = 0`) or `dmin` (`which = 1`) of super-block `k` of row `r`.
pub(super) fn scale_f32(w: &QMatrix, r: usize, k: usize, which: usize) -> f32 {
    let i = (r / BAND) * BAND * w.nbp + k * BAND + r % BAND;
    let bits = if which == 0 { w.d[i] } else { w.m[i] };
    f16::from_bits(bits).to_f32()
}

/// The dot of weight row `r` with activation row `b`, in the order of the module docs.
pub(super) fn dot(w: &QMatrix, r: usize, a: &Acts<'_>, b: usize) -> f32 {
    let mut acc = 0f32;
    for k in 0..w.nb {
        let blk = b * a.knb + k;
        let aq = &a.kq[blk * 8..(blk + 1) * 8];
        let mut isum = 0i32;
        for (g, aq) in aq.iter().enumerate() {
            let s: i32 = (0..32)
                .map(|l| quant(w, r, k, 32 * g + l) * (aq.0[l] as i8 as i32))
                .sum();
            isum += scale(w, r, k, g) * s;
        }
        let bs = &a.kbs[blk];
        let imin: i32 = (0..8)
            .map(|g| min(w, r, k, g) * (bs[2 * g] as i32 + bs[2 * g + 1] as i32))
            .sum();
        let da = a.kd[blk];
        acc = (da * scale_f32(w, r, k, 0)).mul_add(isum as f32, acc);
        acc = (-(da * scale_f32(w, r, k, 1))).mul_add(imin as f32, acc);
    }
    acc
}

/// This format's kernels for the band loop ([`super::band::run_rows`]).
pub(super) const KERNELS: super::band::BandKernels = super::band::BandKernels {
    #[cfg(target_arch = "x86_64")]
    vnni: x86::band_vnni,
    #[cfg(target_arch = "x86_64")]
    bw: x86::band_bw,
    #[cfg(target_arch = "x86_64")]
    avx2: x86::band_avx2,
    dot,
};
