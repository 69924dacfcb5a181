//! Portable scalar kernels: the reference the AVX2 kernels must match bit for bit.
//!
//! Each function spells out the operation sequence of the [module docs](super) one element at a
//! time; the AVX2 versions compute the same operations eight or 32 lanes at once.

use half::f16;

use super::{Acts, Chunk, MatFormat, QMatrix, BLOCK, QK_K};

/// `max |x_i|` over one block, NaNs ignored (0 when every value is NaN or zero).
pub(super) fn amax(x: &[f32; BLOCK]) -> f32 {
    // The AVX2 code zeroes NaN lanes, then takes `_mm256_max_ps` in another order: the same
    // result (max is exact).
    x.iter()
        .fold(0f32, |m, v| if v.abs() > m { v.abs() } else { m })
}

/// `_mm256_max_ps(a, b)`: `a > b ? a : b` (so `b` when either is NaN).
#[inline]
fn max_ps(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// `_mm256_min_ps(a, b)`: `a < b ? a : b` (so `b` when either is NaN).
#[inline]
fn min_ps(a: f32, b: f32) -> f32 {
    if a < b {
        a
    } else {
        b
    }
}

/// Quantises one block with the inverse scale `id` into `q` and returns `Σq`:
/// `q_i = round_ties_even(min(max(x_i · id, −127), 127))`.
pub(super) fn quantize_block(x: &[f32; BLOCK], id: f32, q: &mut [u8; BLOCK]) -> i32 {
    let mut sum = 0i32;
    for (q, &v) in q.iter_mut().zip(x) {
        let v = min_ps(max_ps(v * id, -127.0), 127.0).round_ties_even() as i32;
        *q = v as i8 as u8;
        sum += v;
    }
    sum
}

/// Quantises one Q8_K super-block of 256 values into `q` (eight chunks of 32) and `bs` (the
/// sums of each 16 quants), as GGML's `quantize_row_q8_K`: `max` is the first value of the
/// largest magnitude (NaNs ignored), `q_i = clamp(round_ties_even(−127 / max · x_i), −127, 127)`
/// (a NaN product gives 0). Returns the scale `d = 1 / (−127 / max)`, or `None` (and writes
/// nothing) when every value is zero or NaN.
pub(super) fn q8_k_block(xs: &[f32; QK_K], q: &mut [Chunk], bs: &mut [i16; 16]) -> Option<f32> {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in xs {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        return None;
    }
    let iscale = -127.0 / max;
    for (e, &v) in xs.iter().enumerate() {
        // `as` saturates (NaN → 0); finite input never leaves −127..=127 anyway.
        let qi = ((iscale * v).round_ties_even() as i32).clamp(-127, 127);
        q[e / 32].0[e % 32] = qi as i8 as u8;
        bs[e / 16] += qi as i16;
    }
    Some(1.0 / iscale)
}

/// The dots of weight rows `r0..r0 + nr` with activation rows `b0..b0 + n` (`nr, n ≤ 4`):
/// `res[ri][bi]`.
pub(super) fn dot_tile(
    w: &QMatrix,
    r0: usize,
    nr: usize,
    a: &Acts<'_>,
    b0: usize,
    n: usize,
) -> [[f32; 4]; 4] {
    let mut res = [[0f32; 4]; 4];
    for (ri, res) in res.iter_mut().enumerate().take(nr) {
        for (bi, res) in res.iter_mut().enumerate().take(n) {
            *res = dot(w, r0 + ri, a, b0 + bi);
        }
    }
    res
}

/// The dot of weight row `r` with activation row `b`, in the order of the module docs (the
/// banded formats' in their own modules).
pub(super) fn dot(w: &QMatrix, r: usize, a: &Acts<'_>, b: usize) -> f32 {
    match w.format {
        MatFormat::Q4_K => super::q4k::dot(w, r, a, b),
        MatFormat::Q6_K => super::q6k::dot(w, r, a, b),
        MatFormat::Q8_0 => super::q80::dot(w, r, a, b),
        MatFormat::Q4_0 | MatFormat::Q4_1 | MatFormat::Q5_0 | MatFormat::Q5_1 => {
            super::legacy::dot(w, r, a, b)
        }
        MatFormat::Q5_K => dot_q5_k(w, r, a, b),
        MatFormat::F16 | MatFormat::BF16 | MatFormat::F32 => dot_float(w, r, a, b),
    }
}

/// Q5_K × Q8_K.
fn dot_q5_k(w: &QMatrix, r: usize, a: &Acts<'_>, b: usize) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for k in 0..w.nb {
        let blk = b * a.knb + k;
        let da = a.kd[blk];
        let dw = f16::from_bits(w.d[r * w.nbp + k]).to_f32();
        let sc = &w.sc[r * w.nb + k];
        let aq = &a.kq[blk * 8..(blk + 1) * 8];
        let mut isum = [0i32; 8];
        for (g, aq) in aq.iter().enumerate() {
            for (l, isum) in isum.iter_mut().enumerate() {
                let p: i32 = (4 * l..4 * l + 4)
                    .map(|e| w.kquant(r, k, 32 * g + e) * (aq.0[e] as i8 as i32))
                    .sum();
                *isum += sc[g] as i32 * p;
            }
        }
        let d = da * dw;
        for (acc, &isum) in acc.iter_mut().zip(&isum) {
            *acc = d.mul_add(isum as f32, *acc);
        }
        let bs = &a.kbs[blk];
        let prod: i32 = (0..4)
            .map(|t| {
                let s0 = bs[4 * t] as i32 + bs[4 * t + 1] as i32;
                let s1 = bs[4 * t + 2] as i32 + bs[4 * t + 3] as i32;
                sc[8 + 2 * t] as i32 * s0 + sc[8 + 2 * t + 1] as i32 * s1
            })
            .sum();
        let dmin = -(da * f16::from_bits(w.m[r * w.nbp + k]).to_f32());
        summs = dmin.mul_add(prod as f32, summs);
    }
    hsum8(&acc) + summs
}

/// Activation value `e` of row `b` in the format float weights of `format` multiply.
#[inline]
fn act_val(a: &Acts<'_>, format: MatFormat, b: usize, e: usize) -> f32 {
    let i = b * a.cols + e;
    match format {
        MatFormat::F16 => f16::from_bits(a.h[i]).to_f32(),
        MatFormat::BF16 => half::bf16::from_bits(a.bh[i]).to_f32(),
        _ => a.x[i],
    }
}

/// F32, F16, BF16.
fn dot_float(w: &QMatrix, r: usize, a: &Acts<'_>, b: usize) -> f32 {
    let bf = w.format == MatFormat::BF16;
    let mut acc = [[0f32; 8]; 4];
    for s in 0..w.cols / 32 {
        for (j, acc) in acc.iter_mut().enumerate() {
            for (l, acc) in acc.iter_mut().enumerate() {
                let e = 32 * s + 8 * j + l;
                let (x, y) = (w.fval(r, e), act_val(a, w.format, b, e));
                *acc = if bf { x * y + *acc } else { x.mul_add(y, *acc) };
            }
        }
    }
    let c: [f32; 8] = std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    if bf {
        hsum8(&c)
    } else {
        reduce8(&c)
    }
}

/// llama.cpp's `hsum_float_8` tree: `((x4 + x0) + (x6 + x2)) + ((x5 + x1) + (x7 + x3))`.
pub(super) fn hsum8(x: &[f32; 8]) -> f32 {
    ((x[4] + x[0]) + (x[6] + x[2])) + ((x[5] + x[1]) + (x[7] + x[3]))
}

/// The last step of llama.cpp's `GGML_F32_VEC_REDUCE` (AVX): `t_l = x_l + x_{l+4}`, then
/// `(t_0 + t_1) + (t_2 + t_3)`.
pub(super) fn reduce8(x: &[f32; 8]) -> f32 {
    let t: [f32; 4] = std::array::from_fn(|l| x[l] + x[l + 4]);
    (t[0] + t[1]) + (t[2] + t[3])
}
