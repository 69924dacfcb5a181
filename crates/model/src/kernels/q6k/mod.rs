//! Q6_K in bands of sixteen rows: the layout, the arithmetic (numerics `q6_k=2`) and the
//! kernels that multiply it by Q8_K activations.
//!
//! # Layout
//!
//! A GGML Q6_K super-block (256 values of one row) holds 128 bytes `ql` of low nibbles, 64
//! bytes `qh` of high bit pairs, sixteen `i8` scales (one per 16-value sub-block) and `f16 d`.
//! In each half `n` (values `128n..128n + 128`), byte `l` (`l < 32`) of `ql` (from `64n`) holds
//! value `l` in its low nibble and value `64 + l` in its high one, byte `32 + l` values
//! `32 + l` and `96 + l`, and byte `l` of `qh` (from `32n`) the high bits of values `l`,
//! `32 + l`, `64 + l`, `96 + l` in its bit pairs `0`, `2`, `4`, `6`. Here the rows are taken
//! sixteen at a time (a band, [`super::band`]; the last one padded with zero rows), and for each
//! band and super-block `k`:
//!
//! * the quants in 64-byte units, row `t` of the band owning bytes `4t..4t + 4`, three units per
//!   half `n` and quad `p` (`p = 0..8`): GGML's `ql` bytes `64n + 4p..+4`, `ql` bytes
//!   `64n + 32 + 4p..+4` and `qh` bytes `32n + 4p..+4` of that row's super-block. The three
//!   give the four quads of values `128n + 32c + 4p..+4` (`c = 0..4`), 6 bits each, of sixteen
//!   rows at once, every 32-bit lane one row's;
//! * the scales: sixteen rows of sixteen bytes (scale `s` of rows `0..16`);
//! * `d` of the sixteen rows, as `f16` bits.
//!
//! The same bytes as the file. The planes of [`QMatrix`] hold them with the strides of sixteen
//! rows, so a band's data starts where its first row's would.
//!
//! # Arithmetic
//!
//! For each super-block `i` in order, with the activations' `f32` scale `d_a`, quants `a`:
//!
//! * `isum = Σ_s sc_s · Σ_{e in s} (q_e − 32) · a_e` over the sixteen sub-blocks `s`, an exact
//!   integer (`|isum| < 2^28`; its conversion to `f32` rounds to nearest even, the same in
//!   every kernel);
//! * `acc = fma(d_a · f32(d_w), f32(isum), acc)`.
//!
//! Result: `acc`. One accumulator per output (the first numerics, `q6_k=1`, kept llama.cpp's
//! `ggml_vec_dot_q6_K_q8_K` order: eight lane accumulators per output summed by `hsum8`).

#[cfg(target_arch = "x86_64")]
mod x86;

use half::f16;

use super::band::BAND;
use super::{rd16, Acts, QMatrix};

/// Chunks of 32 bytes of one band's quants per super-block (48 units of 64 bytes).
const BAND_CHUNKS: usize = 96;

/// Stores GGML Q6_K block `k` of row `r` (`blk`: 210 bytes) in the band layout.
pub(super) fn put_block(w: &mut QMatrix, r: usize, k: usize, blk: &[u8]) {
    let (band, t) = (r / BAND, r % BAND);
    w.d[band * BAND * w.nbp + k * BAND + t] = rd16(blk, 208);
    let sbase = band * BAND * w.nb + k * BAND;
    for s in 0..16 {
        w.sc[sbase + s][t] = blk[192 + s];
    }
    let qbase = band * BAND * w.qchunks + k * BAND_CHUNKS;
    for n in 0..2 {
        for p in 0..8 {
            let srcs = [64 * n + 4 * p, 64 * n + 32 + 4 * p, 128 + 32 * n + 4 * p];
            for (j, src) in srcs.into_iter().enumerate() {
                let c = qbase + 2 * ((n * 8 + p) * 3 + j) + t / 8;
                w.qs[c].0[4 * (t % 8)..4 * (t % 8) + 4].copy_from_slice(&blk[src..src + 4]);
            }
        }
    }
}

/// Quant `e` (`0..256`) of super-block `k` of row `r`, unsigned (`0..64`).
pub(super) fn quant(w: &QMatrix, r: usize, k: usize, e: usize) -> i32 {
    let (band, t) = (r / BAND, r % BAND);
    let (n, c, l) = (e / 128, (e % 128) / 32, e % 32);
    let (p, i) = (l / 4, l % 4);
    let byte = |j: usize| {
        let ch = band * BAND * w.qchunks + k * BAND_CHUNKS + 2 * ((n * 8 + p) * 3 + j) + t / 8;
        w.qs[ch].0[4 * (t % 8) + i]
    };
    let low = (byte(c % 2) >> (4 * (c / 2))) & 0x0F;
    let high = (byte(2) >> (2 * c)) & 3;
    (low | high << 4) as i32
}

/// Scale `s` (`0..16`) of super-block `k` of row `r`.
pub(super) fn scale(w: &QMatrix, r: usize, k: usize, s: usize) -> i32 {
    w.sc[(r / BAND) * BAND * w.nb + k * BAND + s][r % BAND] as i8 as i32
}

/// `f32` of `d` of super-block `k` of row `r`.
pub(super) fn d_f32(w: &QMatrix, r: usize, k: usize) -> f32 {
    f16::from_bits(w.d[(r / BAND) * BAND * w.nbp + k * BAND + r % BAND]).to_f32()
}

/// The dot of weight row `r` with activation row `b`, in the order of the module docs.
pub(super) fn dot(w: &QMatrix, r: usize, a: &Acts<'_>, b: usize) -> f32 {
    let mut acc = 0f32;
    for k in 0..w.nb {
        let blk = b * a.knb + k;
        let aq = &a.kq[blk * 8..(blk + 1) * 8];
        let isum: i32 = (0..16)
            .map(|s| {
                let sub: i32 = (16 * s..16 * s + 16)
                    .map(|e| (quant(w, r, k, e) - 32) * (aq[e / 32].0[e % 32] as i8 as i32))
                    .sum();
                scale(w, r, k, s) * sub
            })
            .sum();
        acc = (a.kd[blk] * d_f32(w, r, k)).mul_add(isum as f32, acc);
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
