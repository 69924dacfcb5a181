//! Portable scalar kernels: the reference the AVX2 kernels must match bit for bit.
//!
//! Each function spells out the operation sequence of the [module docs](super) one element at a
//! time; the AVX2 versions compute the same operations eight or 32 lanes at once.

use half::f16;

use super::{Activations, MatFormat, QMatrix, BLOCK};

/// `max |x_i|` over one block.
pub(super) fn amax(x: &[f32; BLOCK]) -> f32 {
    // Same result as `_mm256_max_ps` in any order for non-NaN input (max is exact).
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

/// The dots of weight rows `r0..r0 + nr` with activation rows `b0..b0 + n` (`nr, n ≤ 4`):
/// `res[ri][bi]`.
pub(super) fn dot_tile(
    w: &QMatrix,
    r0: usize,
    nr: usize,
    a: &Activations,
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

/// The dot of weight row `r` with activation row `b`, in the order of the module docs.
fn dot(w: &QMatrix, r: usize, a: &Activations, b: usize) -> f32 {
    let mut acc = [0f32; 8];
    let mut summ = 0f32;
    for k in 0..w.nb {
        let dw = f16::from_bits(w.d[r * w.nbp + k]).to_f32();
        let sc = dw * a.d[b * a.nbp + k];
        let aq = &a.q[b * a.nb + k].0;
        for (j, acc) in acc.iter_mut().enumerate() {
            let p: i32 = (4 * j..4 * j + 4)
                .map(|i| w.quant(r, k, i) * (aq[i] as i8 as i32))
                .sum();
            *acc = sc.mul_add(p as f32, *acc);
        }
        if w.format == MatFormat::Q4_1 {
            let m = f16::from_bits(w.m[r * w.nbp + k]).to_f32();
            summ = m.mul_add(a.s[k * a.np4 + b], summ);
        }
    }
    let h = hsum8(&acc);
    match w.format {
        MatFormat::Q4_1 => h + summ,
        MatFormat::Q8_0 => h,
    }
}

/// llama.cpp's `hsum_float_8` tree: `((x4 + x0) + (x6 + x2)) + ((x5 + x1) + (x7 + x3))`.
pub(super) fn hsum8(x: &[f32; 8]) -> f32 {
    ((x[4] + x[0]) + (x[6] + x[2])) + ((x[5] + x[1]) + (x[7] + x[3]))
}
