//! Tests of the kernels: scalar and AVX2 paths bit for bit, batch and thread-count invariance,
//! agreement with candle and with an `f64` reference, activation quantisation, input errors.

use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use half::f16;

use super::*;

/// SplitMix64: a small deterministic generator, enough for test data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, n)`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// Uniform in `[-1, 1)`.
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Raw GGML bytes of a random matrix; `extreme` adds zero scales, −128 weights, huge and tiny
/// scales.
fn random_ggml(
    rng: &mut Rng,
    format: MatFormat,
    rows: usize,
    cols: usize,
    extreme: bool,
) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rows * cols / BLOCK {
        let kind = if extreme { rng.below(8) } else { 7 };
        let d = match kind {
            0 => 0.0,
            1 => 1000.0 * rng.unit(),
            2 => 1e-7 * rng.unit(),
            _ => 0.02 * rng.unit(),
        };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        match format {
            MatFormat::Q4_1 => {
                let m = if kind == 0 { 0.0 } else { 0.1 * rng.unit() };
                out.extend_from_slice(&f16::from_f32(m).to_le_bytes());
                for _ in 0..16 {
                    out.push(rng.next() as u8);
                }
            }
            MatFormat::Q8_0 => {
                for _ in 0..32 {
                    let q = if kind == 3 { -128 } else { rng.next() as i8 };
                    out.push(q as u8);
                }
            }
        }
    }
    out
}

/// Random activations, `n × cols`; `extreme` mixes zero rows and blocks, huge and tiny values
/// (including subnormals, whose inverse scale is infinite).
fn random_x(rng: &mut Rng, n: usize, cols: usize, extreme: bool) -> Vec<f32> {
    let mut x = vec![0f32; n * cols];
    for (b, row) in x.chunks_mut(cols).enumerate() {
        if extreme && b % 7 == 3 {
            continue; // an all-zero row
        }
        for blk in row.chunks_mut(BLOCK) {
            let scale = if extreme {
                match rng.below(8) {
                    0 => 0.0,
                    1 => 1e5,
                    2 => 1e-6,
                    3 => 1e-40,
                    4 => 1e-30,
                    _ => 1.0,
                }
            } else {
                1.0
            };
            for v in blk.iter_mut() {
                *v = scale * rng.unit();
            }
            if extreme && rng.below(5) == 0 {
                blk[rng.below(32) as usize] = 3e4;
            }
        }
    }
    x
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

fn assert_same(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(same(*g, *w), "{what}: element {i}: {g:e} vs {w:e}");
    }
}

fn run(level: Level, w: &QMatrix, a: &Activations) -> Vec<f32> {
    let mut out = vec![f32::NAN; a.rows() * w.rows()];
    matmul_with(level, w, a, &mut out).unwrap();
    out
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}

const FORMATS: [MatFormat; 2] = [MatFormat::Q4_1, MatFormat::Q8_0];

#[test]
fn scalar_and_avx2_agree_bitwise() {
    if Level::detect() != Level::Avx2 {
        eprintln!("no AVX2 on this CPU: nothing to compare");
        return;
    }
    let mut rng = Rng(1);
    let shapes: &[(usize, usize, usize)] = &[
        (1, 32, 1),
        (3, 64, 2),
        (7, 96, 3),
        (17, 224, 4),
        (5, 256, 5),
        (33, 288, 7),
        (64, 576, 13),
        (300, 32, 70),
        (19, 1536, 9),
        (130, 576, 70),
        (9, 576, 512),
        (300, 64, 512),
    ];
    for &format in &FORMATS {
        for &(rows, cols, n) in shapes {
            for extreme in [false, true] {
                let w = QMatrix::from_ggml(
                    format,
                    rows,
                    cols,
                    &random_ggml(&mut rng, format, rows, cols, extreme),
                )
                .unwrap();
                let x = random_x(&mut rng, n, cols, extreme);
                let mut a = Activations::new();
                a.quantize_with(Level::Scalar, &x, n, cols).unwrap();
                let want = run(Level::Scalar, &w, &a);
                let got = run(Level::Avx2, &w, &a);
                assert_same(
                    &got,
                    &want,
                    &format!("{format:?} {rows}x{cols} B={n} {extreme}"),
                );
            }
        }
    }
}

#[test]
fn activation_quantisation_scalar_and_avx2_agree() {
    let mut rng = Rng(2);
    for (n, cols) in [(1, 32), (3, 96), (70, 576), (5, 1536)] {
        for extreme in [false, true] {
            let x = random_x(&mut rng, n, cols, extreme);
            let mut s = Activations::new();
            s.quantize_with(Level::Scalar, &x, n, cols).unwrap();
            let mut v = Activations::new();
            v.quantize_with(Level::Avx2, &x, n, cols).unwrap();
            assert_eq!(s.q, v.q);
            assert_same(&s.d, &v.d, "d");
            assert_same(&s.s, &v.s, "s");
        }
    }
}

#[test]
fn activation_quantisation_follows_ggml() {
    // One block 0, 1, …, 31 scaled: amax = 31 · 0.5, d = amax / 127.
    let x: Vec<f32> = (0..32).map(|i| i as f32 * 0.5 - 8.0).collect();
    let mut a = Activations::new();
    a.quantize(&x, 1, 32).unwrap();
    let amax = 8.0f32;
    let d = amax / 127.0;
    let id = 1.0 / d;
    let q: Vec<i32> = x
        .iter()
        .map(|v| (v * id).round_ties_even() as i32)
        .collect();
    let got: Vec<i32> = a.q[0].0.iter().map(|&b| b as i8 as i32).collect();
    assert_eq!(got, q);
    assert_eq!(a.d[0], f16::from_f32(d).to_f32());
    let sum: i32 = q.iter().sum();
    assert_eq!(a.s[0], f16::from_f32(d * sum as f32).to_f32());
    // Padding lanes of the transposed `s` and of `d` are zero.
    assert!(a.s[1..4].iter().all(|&v| v == 0.0));
    assert!(a.d[1..8].iter().all(|&v| v == 0.0));
}

#[test]
fn batch_and_thread_invariance() {
    let mut rng = Rng(3);
    for &format in &FORMATS {
        for &(rows, cols, n) in &[(192, 576, 70), (37, 1536, 13), (300, 96, 9)] {
            let w = QMatrix::from_ggml(
                format,
                rows,
                cols,
                &random_ggml(&mut rng, format, rows, cols, true),
            )
            .unwrap();
            let x = random_x(&mut rng, n, cols, true);
            let mut a = Activations::new();
            a.quantize(&x, n, cols).unwrap();
            let batch = run(Level::detect(), &w, &a);
            for threads in [1, 2] {
                let other = pool(threads).install(|| run(Level::detect(), &w, &a));
                assert_same(&other, &batch, &format!("{threads} threads"));
            }
            let mut one = Activations::new();
            for b in 0..n {
                one.quantize(&x[b * cols..(b + 1) * cols], 1, cols).unwrap();
                for threads in [1, 2] {
                    let single = pool(threads).install(|| run(Level::detect(), &w, &one));
                    assert_same(
                        &single,
                        &batch[b * rows..(b + 1) * rows],
                        &format!("{format:?} {rows}x{cols}: row {b} of {n}, {threads} threads"),
                    );
                }
            }
            // A sub-batch starting at an odd row (other remainder paths).
            let sub = &x[3 * cols..(3 + 5) * cols];
            one.quantize(sub, 5, cols).unwrap();
            let got = run(Level::detect(), &w, &one);
            assert_same(
                &got,
                &batch[3 * rows..8 * rows],
                "rows 3..8 as a batch of 5",
            );
        }
    }
}

fn candle_qtensor(format: MatFormat, rows: usize, cols: usize, bytes: &[u8]) -> QTensor {
    let dtype = match format {
        MatFormat::Q4_1 => GgmlDType::Q4_1,
        MatFormat::Q8_0 => GgmlDType::Q8_0,
    };
    qtensor_from_ggml(dtype, bytes, vec![rows, cols], &Device::Cpu).unwrap()
}

#[test]
fn agrees_with_candle() {
    let mut rng = Rng(4);
    for &format in &FORMATS {
        for &(rows, cols, n) in &[(64, 576, 1), (192, 576, 5), (96, 1536, 3)] {
            let bytes = random_ggml(&mut rng, format, rows, cols, false);
            let w = QMatrix::from_ggml(format, rows, cols, &bytes).unwrap();
            let qt = candle_qtensor(format, rows, cols, &bytes);
            let mm = QMatMul::from_qtensor(qt).unwrap();
            let x = random_x(&mut rng, n, cols, false);
            let xt = Tensor::from_slice(&x, (n, cols), &Device::Cpu).unwrap();
            let want: Vec<f32> = mm
                .forward(&xt)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let mut a = Activations::new();
            a.quantize(&x, n, cols).unwrap();
            let got = run(Level::detect(), &w, &a);
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (i, (g, c)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - c).abs() <= 2e-3 * scale + 1e-6,
                    "{format:?} {rows}x{cols} B={n}: {i}: ours {g} candle {c} (scale {scale})"
                );
            }
        }
    }
}

#[test]
fn agrees_with_f64_reference() {
    let mut rng = Rng(5);
    for &format in &FORMATS {
        let (rows, cols, n) = (40, 576, 6);
        let w = QMatrix::from_ggml(
            format,
            rows,
            cols,
            &random_ggml(&mut rng, format, rows, cols, false),
        )
        .unwrap();
        let x = random_x(&mut rng, n, cols, false);
        let mut a = Activations::new();
        a.quantize(&x, n, cols).unwrap();
        let got = run(Level::detect(), &w, &a);
        let mut wr = vec![0f32; cols];
        for r in 0..rows {
            w.dequantize_row(r, &mut wr).unwrap();
            for b in 0..n {
                let xr = &x[b * cols..(b + 1) * cols];
                let exact: f64 = wr.iter().zip(xr).map(|(&w, &x)| w as f64 * x as f64).sum();
                // Bound of the activation quantisation error: per value `d/2` for the rounding
                // plus `127 d 2^-11` for the f16 scale; per Q4_1 block `|m| (16 d + |s| 2^-11)`
                // for the stored sum; plus f32 rounding of the accumulation.
                let mut bound = 0f64;
                for k in 0..cols / BLOCK {
                    let xs = &xr[k * BLOCK..(k + 1) * BLOCK];
                    let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                    let d = amax / 127.0;
                    let ws = &wr[k * BLOCK..(k + 1) * BLOCK];
                    let sw: f64 = ws.iter().map(|v| v.abs() as f64).sum();
                    bound += sw * d * (0.5 + 127.0 / 2048.0);
                    if format == MatFormat::Q4_1 {
                        let m = f16::from_bits(w.m[r * w.nbp + k]).to_f32().abs() as f64;
                        let sx: f64 = xs.iter().map(|v| v.abs() as f64).sum();
                        bound += m * (16.0 * d + sx / 2048.0);
                    }
                }
                let mag: f64 = wr
                    .iter()
                    .zip(xr)
                    .map(|(&w, &x)| (w as f64 * x as f64).abs())
                    .sum();
                bound = bound * 1.01 + 1e-5 * mag + 1e-9;
                let g = got[b * rows + r] as f64;
                assert!(
                    (g - exact).abs() <= bound,
                    "{format:?} row {r} act {b}: {g} vs {exact} (bound {bound})"
                );
            }
        }
    }
}

#[test]
fn dequantize_row_matches_candle() {
    let mut rng = Rng(6);
    for &format in &FORMATS {
        let (rows, cols) = (5, 96);
        let bytes = random_ggml(&mut rng, format, rows, cols, true);
        let w = QMatrix::from_ggml(format, rows, cols, &bytes).unwrap();
        let want: Vec<f32> = candle_qtensor(format, rows, cols, &bytes)
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let mut row = vec![0f32; cols];
        for r in 0..rows {
            w.dequantize_row(r, &mut row).unwrap();
            assert_same(&row, &want[r * cols..(r + 1) * cols], "dequantized row");
        }
        assert!(w.dequantize_row(rows, &mut row).is_err());
        assert!(w.dequantize_row(0, &mut row[1..]).is_err());
    }
}

#[test]
fn quantize_q8_0_matches_candle_and_from_qtensor() {
    let mut rng = Rng(7);
    let (rows, cols) = (6, 128);
    let mut data = random_x(&mut rng, rows, cols, false);
    data[5] = 0.5; // a tie for `round` (after scaling) is unlikely; exercise plain values
    let w = QMatrix::quantize_q8_0(rows, cols, &data).unwrap();
    let t = Tensor::from_slice(&data, (rows, cols), &Device::Cpu).unwrap();
    let qt = QTensor::quantize(&t, GgmlDType::Q8_0).unwrap();
    let c = QMatrix::from_qtensor(&qt).unwrap();
    assert_eq!(c.format(), MatFormat::Q8_0);
    assert_eq!((c.rows(), c.cols()), (rows, cols));
    assert_eq!(w.qs, c.qs);
    assert_eq!(w.d, c.d);
    // Another format is re-quantised to Q8_0.
    let q4 = QTensor::quantize(&t, GgmlDType::Q4_0).unwrap();
    let r = QMatrix::from_qtensor(&q4).unwrap();
    assert_eq!(r.format(), MatFormat::Q8_0);
    let deq: Vec<f32> = q4
        .dequantize(&Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let want = QMatrix::quantize_q8_0(rows, cols, &deq).unwrap();
    assert_eq!(r.qs, want.qs);
    assert_eq!(r.d, want.d);
}

#[test]
fn bad_input_is_an_error() {
    let e = QMatrix::from_ggml(MatFormat::Q4_1, 2, 33, &[0; 40]).unwrap_err();
    assert!(matches!(e, KernelError::Shape(_)), "{e}");
    let e = QMatrix::from_ggml(MatFormat::Q4_1, 2, 32, &[0; 39]).unwrap_err();
    assert!(matches!(e, KernelError::Length { .. }), "{e}");
    let e = QMatrix::from_ggml(MatFormat::Q8_0, 2, 64, &[0; 4 * 34 + 1]).unwrap_err();
    assert!(matches!(e, KernelError::Length { .. }), "{e}");
    assert!(QMatrix::from_ggml(MatFormat::Q8_0, usize::MAX, 64, &[]).is_err());
    assert!(QMatrix::from_ggml(MatFormat::Q8_0, 0, 64, &[]).is_ok());
    assert!(QMatrix::quantize_q8_0(2, 32, &[0.0; 63]).is_err());
    assert!(QMatrix::quantize_q8_0(2, 48, &[0.0; 96]).is_err());
    let t = Tensor::zeros((64,), candle_core::DType::F32, &Device::Cpu).unwrap();
    let qt = QTensor::quantize(&t, GgmlDType::Q8_0).unwrap();
    assert!(matches!(
        QMatrix::from_qtensor(&qt),
        Err(KernelError::Shape(_))
    ));
    let mut a = Activations::new();
    assert!(a.quantize(&[0.0; 64], 2, 32).is_ok());
    assert!(a.quantize(&[0.0; 63], 2, 32).is_err());
    assert!(a.quantize(&[0.0; 40], 1, 40).is_err());
    let w = QMatrix::from_ggml(MatFormat::Q8_0, 3, 64, &[0; 6 * 34]).unwrap();
    let mut out = [0f32; 6];
    assert!(matches!(
        matmul(&w, &a, &mut out),
        Err(KernelError::Mismatch(_))
    ));
    a.quantize(&[0.0; 128], 2, 64).unwrap();
    assert!(matches!(
        matmul(&w, &a, &mut out[..5]),
        Err(KernelError::Length { .. })
    ));
    matmul(&w, &a, &mut out).unwrap();
    assert_eq!(out, [0.0; 6]);
    // An empty batch is fine.
    a.quantize(&[], 0, 64).unwrap();
    matmul(&w, &a, &mut []).unwrap();
}
