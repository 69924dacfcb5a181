//! GGML's 32-value nibble formats (Q4_0, Q4_1, Q5_0, Q5_1) in bands of sixteen rows: the
//! layout, the arithmetic (numerics `q4_0=2`, `q4_1=2`, `q5_0=2`, `q5_1=2`) and the kernels
//! that multiply them by Q8_0 / Q8_1 activations.
//!
//! # Layout
//!
//! A GGML block of these formats holds 32 values of one row: `f16 d`, Q4_1/Q5_1 an `f16 m`,
//! Q5_0/Q5_1 a 32-bit word `qh` of high bits (bit `i` for value `i`), and sixteen bytes of
//! nibbles: byte `l` holds value `l` in its low nibble and value `16 + l` in its high nibble.
//! Here the rows are taken sixteen at a time (a band, [`super::band`]; the last one padded with
//! zero rows), and for each band and block `k`:
//!
//! * the nibbles in four 64-byte units `p` (quads of bytes): row `t` of the band owns bytes
//!   `4t..4t + 4`, GGML's bytes `4p..4p + 4` of its block, so that the low nibbles of a unit
//!   are values `4p..4p + 4` and the high nibbles values `16 + 4p..16 + 4p + 4` of each row,
//!   and every 32-bit lane belongs to one row;
//! * Q5_0/Q5_1: eight 64-bit masks, two per unit (`lo`, then `hi`): bit `4t + j` of unit `p`'s
//!   `lo` is the high bit of value `4p + j` of row `t`, of its `hi` that of value
//!   `16 + 4p + j` (one masked byte add puts the fifth bit on sixty-four quants);
//! * `d` (and `m`) of the sixteen rows, as `f16` bits.
//!
//! The same bytes as the file. The planes of [`QMatrix`] hold them with the strides of sixteen
//! rows, so a band's data starts where its first row's would.
//!
//! # Arithmetic
//!
//! Weight quants `w_i`: `q − 8` (Q4_0), `q − 16` (Q5_0), `q` (Q4_1, Q5_1), `q` the nibble with
//! the high bit above it. For each block `k` in order, with the activations' scale `d_a`
//! (`f32(f16(d))`), quants `a` and, for Q4_1/Q5_1, `s_a = f32(f16(d · Σa))`:
//!
//! * `isum = Σ_{i<32} w_i · a_i`, exact (`|isum| ≤ 32 · 31 · 127 < 2^24`, so its conversion is
//!   exact too);
//! * `acc = fma(f32(d_w) · d_a, isum, acc)`;
//! * Q4_1/Q5_1: `acc = fma(f32(m_w), s_a, acc)`.
//!
//! Result: `acc`. One accumulator per output (the first numerics kept llama.cpp's
//! `ggml_vec_dot_q4_0_q8_0` order: eight lane accumulators per output summed by `hsum8` at the
//! end, and the minimum terms in a separate sum added last).

#[cfg(target_arch = "x86_64")]
mod x86;

use half::f16;

use super::band::BAND;
use super::{rd16, Acts, MatFormat, QMatrix, BLOCK};

/// Chunks of 32 bytes of one band's nibbles per block (four units of 64 bytes).
const BAND_CHUNKS: usize = 8;

/// Whether `format` has a minimum per block (`x = q · d + m`).
pub(super) fn has_min(format: MatFormat) -> bool {
    matches!(format, MatFormat::Q4_1 | MatFormat::Q5_1)
}

/// Whether `format` has a fifth bit per quant.
pub(super) fn has_high(format: MatFormat) -> bool {
    matches!(format, MatFormat::Q5_0 | MatFormat::Q5_1)
}

/// What is subtracted from the unsigned quant: 8 (Q4_0), 16 (Q5_0), else 0.
pub(super) fn offset(format: MatFormat) -> i32 {
    match format {
        MatFormat::Q4_0 => 8,
        MatFormat::Q5_0 => 16,
        _ => 0,
    }
}

/// The index in `d`/`m` of block `k` of row `r`.
fn scale_index(w: &QMatrix, r: usize, k: usize) -> usize {
    (r / BAND) * BAND * w.nbp + k * BAND + r % BAND
}

/// The index in `qh` of the first of block `k`'s sixteen words in `r`'s band (eight masks).
fn mask_index(w: &QMatrix, r: usize, k: usize) -> usize {
    (r / BAND) * BAND * w.nb + k * BAND
}

/// Stores GGML block `k` of row `r` (`blk`: the format's block size) in the band layout.
pub(super) fn put_block(w: &mut QMatrix, r: usize, k: usize, blk: &[u8]) {
    let (band, t) = (r / BAND, r % BAND);
    let si = scale_index(w, r, k);
    w.d[si] = rd16(blk, 0);
    let mut at = 2;
    if has_min(w.format) {
        w.m[si] = rd16(blk, 2);
        at = 4;
    }
    if has_high(w.format) {
        let qh = u32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]]);
        at += 4;
        let mi = mask_index(w, r, k);
        for p in 0..4 {
            for (half, first) in [(0, 4 * p), (1, 16 + 4 * p)] {
                for j in 0..4 {
                    if qh >> (first + j) & 1 == 1 {
                        let bit = 4 * t + j;
                        w.qh[mi + 2 * (2 * p + half) + bit / 32] |= 1 << (bit % 32);
                    }
                }
            }
        }
    }
    let nib = &blk[at..at + 16];
    let base = band * BAND * w.qchunks + k * BAND_CHUNKS;
    for p in 0..4 {
        let c = base + 2 * p + t / 8;
        w.qs[c].0[4 * (t % 8)..4 * (t % 8) + 4].copy_from_slice(&nib[4 * p..4 * p + 4]);
    }
}

/// Quant `i` (`0..32`) of block `k` of row `r`, as the kernels multiply it (`q − offset`).
pub(super) fn quant(w: &QMatrix, r: usize, k: usize, i: usize) -> i32 {
    let (band, t) = (r / BAND, r % BAND);
    let (hi, l) = (i / 16, i % 16);
    let (p, j) = (l / 4, l % 4);
    let c = band * BAND * w.qchunks + k * BAND_CHUNKS + 2 * p + t / 8;
    let b = w.qs[c].0[4 * (t % 8) + j];
    let mut q = ((b >> (4 * hi)) & 0x0F) as i32;
    if has_high(w.format) {
        let bit = 4 * t + j;
        let word = w.qh[mask_index(w, r, k) + 2 * (2 * p + hi) + bit / 32];
        q |= ((word >> (bit % 32) & 1) as i32) << 4;
    }
    q - offset(w.format)
}

/// The `f16` bits of `d` of block `k` of row `r`.
pub(super) fn d_bits(w: &QMatrix, r: usize, k: usize) -> u16 {
    w.d[scale_index(w, r, k)]
}

/// The `f16` bits of `m` of block `k` of row `r` (Q4_1, Q5_1).
pub(super) fn m_bits(w: &QMatrix, r: usize, k: usize) -> u16 {
    w.m[scale_index(w, r, k)]
}

/// The dot of weight row `r` with activation row `b`, in the order of the module docs.
pub(super) fn dot(w: &QMatrix, r: usize, a: &Acts<'_>, b: usize) -> f32 {
    let min = has_min(w.format);
    let mut acc = 0f32;
    for k in 0..w.nb {
        let aq = &a.q[b * a.nb + k].0;
        let isum: i32 = (0..BLOCK)
            .map(|i| quant(w, r, k, i) * (aq[i] as i8 as i32))
            .sum();
        let d = f16::from_bits(d_bits(w, r, k)).to_f32() * a.d[b * a.nbp + k];
        acc = d.mul_add(isum as f32, acc);
        if min {
            let m = f16::from_bits(m_bits(w, r, k)).to_f32();
            acc = m.mul_add(a.s[k * a.np4 + b], acc);
        }
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
