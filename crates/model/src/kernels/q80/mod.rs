//! Q8_0 in bands of sixteen rows: the layout, the arithmetic (numerics `q8_0=2`) and the
//! kernels that multiply it by Q8_0 activations.
//!
//! # Layout
//!
//! A GGML Q8_0 block is `f16 d` and 32 `i8` quants. Here the rows are taken sixteen at a time
//! (a band, [`super::band`]; the last one padded with zero rows), and for each band and block
//! `k`: eight 64-byte units `p` (quads of positions), row `t` of the band owning bytes
//! `4t..4t + 4` of a unit, quants `4p..4p + 4` of its block; then `d` of the sixteen rows
//! (`d[16 · band · nbp + 16k + t]`). The same bytes as the file.
//!
//! # Arithmetic
//!
//! For each block `k` in order, with the activations' scale `d_a` (`f32(f16(d))`) and quants
//! `a`: `isum = Σ_{i<32} w_i · a_i`, exact (`|isum| ≤ 32 · 128 · 127 < 2^24`, so its conversion
//! is exact too), and `acc = fma(f32(d_w) · d_a, isum, acc)`. Result: `acc`. One accumulator per
//! output (the first numerics, `q8_0=1`, kept llama.cpp's `ggml_vec_dot_q8_0_q8_0` order: eight
//! lane accumulators per output, summed by `hsum8` at the end).

#[cfg(target_arch = "x86_64")]
mod x86;

use half::f16;

use super::band::BAND;
use super::{rd16, Acts, QMatrix, BLOCK};

/// Stores GGML Q8_0 block `k` of row `r` (`blk`: 34 bytes) in the band layout.
pub(super) fn put_block(w: &mut QMatrix, r: usize, k: usize, blk: &[u8]) {
    let (band, t) = (r / BAND, r % BAND);
    w.d[band * BAND * w.nbp + k * BAND + t] = rd16(blk, 0);
    let base = band * BAND * w.qchunks + k * 16;
    for p in 0..8 {
        let c = base + 2 * p + t / 8;
        w.qs[c].0[4 * (t % 8)..4 * (t % 8) + 4].copy_from_slice(&blk[2 + 4 * p..6 + 4 * p]);
    }
}

/// Quant `i` (`0..32`) of block `k` of row `r`.
pub(super) fn quant(w: &QMatrix, r: usize, k: usize, i: usize) -> i32 {
    let (band, t) = (r / BAND, r % BAND);
    let c = band * BAND * w.qchunks + k * 16 + 2 * (i / 4) + t / 8;
    w.qs[c].0[4 * (t % 8) + i % 4] as i8 as i32
}

/// The `f16` bits of `d` of block `k` of row `r`.
pub(super) fn d_bits(w: &QMatrix, r: usize, k: usize) -> u16 {
    w.d[(r / BAND) * BAND * w.nbp + k * BAND + r % BAND]
}

/// The dot of weight row `r` with activation row `b`, in the order of the module docs.
pub(super) fn dot(w: &QMatrix, r: usize, a: &Acts<'_>, b: usize) -> f32 {
    let mut acc = 0f32;
    for k in 0..w.nb {
        let aq = &a.q[b * a.nb + k].0;
        let isum: i32 = (0..BLOCK)
            .map(|i| quant(w, r, k, i) * (aq[i] as i8 as i32))
            .sum();
        let d = f16::from_bits(d_bits(w, r, k)).to_f32() * a.d[b * a.nbp + k];
        acc = d.mul_add(isum as f32, acc);
    }
    acc
}

/// This format's kernels for the band loop ([`super::band::run_rows`]).
pub(super) const KERNELS: super::band::BandKernels = super::band::BandKernels {
    #[cfg(target_arch = "x86_64")]
    vnni: x86::band_vnni,
    #[cfg(target_arch = "x86_64")]
    bw: x86::band_avx2,
    #[cfg(target_arch = "x86_64")]
    avx2: x86::band_avx2,
    dot,
};
