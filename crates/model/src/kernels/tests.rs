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

/// A random `f16` scale; `kind` picks an edge case: 0 zero, 1 negative zero, 2 huge, 3 an `f16`
/// subnormal, else an ordinary value.
fn scale(rng: &mut Rng, kind: u64) -> [u8; 2] {
    let v = match kind {
        0 => 0.0,
        1 => -0.0,
        2 => 1000.0 * rng.unit(),
        3 => 1e-7 * rng.unit(),
        _ => 0.02 * rng.unit(),
    };
    f16::from_f32(v).to_le_bytes()
}

/// `n` random bytes; `kind` 4 gives all ones (the largest quants, every high bit, the largest
/// 6-bit scales and mins), 5 all zeros.
fn bytes(rng: &mut Rng, kind: u64, n: usize) -> Vec<u8> {
    (0..n)
        .map(|_| match kind {
            4 => 0xFF,
            5 => 0,
            _ => rng.next() as u8,
        })
        .collect()
}

/// Raw GGML bytes of a random matrix; `extreme` adds zero and negative-zero scales, huge and
/// subnormal scales, blocks of the largest and smallest quants (−128 for Q8_0, −128 and 127
/// Q6_K scales), and for the float formats zeros, the largest finite values and subnormals.
fn random_ggml(
    rng: &mut Rng,
    format: MatFormat,
    rows: usize,
    cols: usize,
    extreme: bool,
) -> Vec<u8> {
    let mut out = Vec::new();
    if matches!(format, MatFormat::F16 | MatFormat::BF16 | MatFormat::F32) {
        for _ in 0..rows * cols {
            let kind = if extreme { rng.below(12) } else { 11 };
            let v = match kind {
                0 => 0.0,
                1 => -0.0,
                2 => 1e-7 * rng.unit(),  // f16 subnormal
                3 => 1e-41 * rng.unit(), // f32 / bf16 subnormal (zero in f16)
                4 => 60000.0,
                5 => -60000.0,
                _ => rng.unit(),
            };
            match format {
                MatFormat::F16 => out.extend_from_slice(&f16::from_f32(v).to_le_bytes()),
                MatFormat::BF16 => out.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
                _ => out.extend_from_slice(&v.to_le_bytes()),
            }
        }
        return out;
    }
    for _ in 0..rows * cols / format.block_values() {
        let kind = if extreme { rng.below(10) } else { 9 };
        let d = scale(rng, kind);
        let m = scale(rng, if kind <= 1 { kind } else { 9 });
        match format {
            MatFormat::Q4_0 => {
                out.extend_from_slice(&d);
                out.extend(bytes(rng, kind, 16));
            }
            MatFormat::Q4_1 => {
                out.extend_from_slice(&d);
                out.extend_from_slice(&m);
                out.extend(bytes(rng, kind, 16));
            }
            MatFormat::Q5_0 => {
                out.extend_from_slice(&d);
                out.extend(bytes(rng, kind, 20));
            }
            MatFormat::Q5_1 => {
                out.extend_from_slice(&d);
                out.extend_from_slice(&m);
                out.extend(bytes(rng, kind, 20));
            }
            MatFormat::Q8_0 => {
                out.extend_from_slice(&d);
                for _ in 0..32 {
                    let q = match kind {
                        6 => -128,
                        7 => 127,
                        _ => rng.next() as i8,
                    };
                    out.push(q as u8);
                }
            }
            MatFormat::Q4_K | MatFormat::Q5_K => {
                out.extend_from_slice(&d);
                out.extend_from_slice(&m);
                out.extend(bytes(rng, kind, 12));
                let q = if format == MatFormat::Q4_K { 128 } else { 160 };
                out.extend(bytes(rng, kind, q));
            }
            MatFormat::Q6_K => {
                out.extend(bytes(rng, kind, 192));
                for _ in 0..16 {
                    out.push(match kind {
                        6 => 0x80,
                        7 => 0x7F,
                        _ => rng.next() as u8,
                    });
                }
                out.extend_from_slice(&d);
            }
            MatFormat::F16 | MatFormat::BF16 | MatFormat::F32 => unreachable!(),
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

/// The levels this CPU runs; says which it lacks (those are not compared here).
pub(super) fn levels() -> Vec<Level> {
    let (have, lack): (Vec<Level>, Vec<Level>) =
        Level::ALL.into_iter().partition(|l| l.supported());
    for l in &lack {
        eprintln!(
            "this CPU lacks the {} kernel level: it is not compared here",
            l.name()
        );
    }
    have
}

/// Test shapes of a format: (rows, cols), odd row counts (remainder tiles) and, for the 32-value
/// formats, block counts that are odd and not a multiple of 8 (half-used nibble chunks, padded
/// scale planes).
fn shapes(format: MatFormat) -> [(usize, usize); 2] {
    if format.cols_multiple() == QK_K {
        [(37, 256), (67, 1024)]
    } else {
        [(37, 96), (67, 1024)]
    }
}

fn candle_qtensor(format: MatFormat, rows: usize, cols: usize, bytes: &[u8]) -> Option<QTensor> {
    let dtype = format.ggml_dtype()?;
    Some(qtensor_from_ggml(dtype, bytes, vec![rows, cols], &Device::Cpu).unwrap())
}

/// Candle's dequantisation of GGML bytes (for BF16, candle's `bf16` → `f32` tensor conversion).
fn candle_dequantize(format: MatFormat, rows: usize, cols: usize, bytes: &[u8]) -> Vec<f32> {
    let t = match candle_qtensor(format, rows, cols, bytes) {
        Some(q) => q.dequantize(&Device::Cpu).unwrap(),
        None => {
            let v: Vec<half::bf16> = bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]))
                .collect();
            Tensor::from_vec(v, (rows, cols), &Device::Cpu)
                .unwrap()
                .to_dtype(candle_core::DType::F32)
                .unwrap()
        }
    };
    t.flatten_all().unwrap().to_vec1().unwrap()
}

#[test]
fn dequantize_row_matches_candle_every_format() {
    let mut rng = Rng(6);
    for format in ALL_FORMATS {
        for (rows, cols) in shapes(format) {
            for extreme in [false, true] {
                let bytes = random_ggml(&mut rng, format, rows, cols, extreme);
                let w = QMatrix::from_ggml(format, rows, cols, &bytes).unwrap();
                assert_eq!(w.format(), format);
                let want = candle_dequantize(format, rows, cols, &bytes);
                let mut row = vec![0f32; cols];
                for r in 0..rows {
                    w.dequantize_row(r, &mut row).unwrap();
                    assert_same(
                        &row,
                        &want[r * cols..(r + 1) * cols],
                        &format!("{format:?} {rows}x{cols} row {r}"),
                    );
                }
                assert!(w.dequantize_row(rows, &mut row).is_err());
                assert!(w.dequantize_row(0, &mut row[1..]).is_err());
            }
        }
    }
}

/// Every format at every level this CPU has, batch sizes 1 to 9, one to three threads: each
/// output row has the bits of the scalar code computing that activation row alone.
#[test]
fn every_format_bitwise_across_levels_batches_and_threads() {
    let mut rng = Rng(11);
    let pools = [pool(1), pool(2), pool(3)];
    for format in ALL_FORMATS {
        for (rows, cols) in shapes(format) {
            let w = QMatrix::from_ggml(
                format,
                rows,
                cols,
                &random_ggml(&mut rng, format, rows, cols, true),
            )
            .unwrap();
            let x = random_x(&mut rng, 9, cols, true);
            let mut a = Activations::new();
            let alone: Vec<Vec<f32>> = (0..9)
                .map(|b| {
                    a.quantize(&x[b * cols..(b + 1) * cols], 1, cols).unwrap();
                    pools[0].install(|| run(Level::Scalar, &w, &a))
                })
                .collect();
            for level in levels() {
                for n in 1..=9 {
                    a.quantize(&x[..n * cols], n, cols).unwrap();
                    for (t, p) in pools.iter().enumerate() {
                        let got = p.install(|| run(level, &w, &a));
                        for (b, want) in alone.iter().enumerate().take(n) {
                            assert_same(
                                &got[b * rows..(b + 1) * rows],
                                want,
                                &format!(
                                    "{format:?} {rows}x{cols} {level:?} B={n} row {b}, {} threads",
                                    t + 1
                                ),
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The exact value of weight `e` of row `r` from its stored parts, and (for the K-quants and
/// the formats with a minimum) the magnitude of the two parts the kernels sum separately.
fn exact_weight(w: &QMatrix, r: usize, e: usize) -> (f64, f64) {
    let h = |b: u16| f16::from_bits(b).to_f32() as f64;
    match w.format {
        MatFormat::F16 | MatFormat::BF16 | MatFormat::F32 => {
            let v = w.fval(r, e) as f64;
            (v, v.abs())
        }
        MatFormat::Q4_K => {
            let (k, i) = (e / QK_K, e % QK_K);
            let a = q4k::scale_f32(w, r, k, 0) as f64
                * q4k::scale(w, r, k, i / 32) as f64
                * q4k::quant(w, r, k, i) as f64;
            let b = q4k::scale_f32(w, r, k, 1) as f64 * q4k::min(w, r, k, i / 32) as f64;
            (a - b, a.abs() + b.abs())
        }
        MatFormat::Q6_K => {
            let (k, i) = (e / QK_K, e % QK_K);
            let q = w.kquant(r, k, i) as f64;
            let v = q6k::d_f32(w, r, k) as f64 * q6k::scale(w, r, k, i / 16) as f64 * (q - 32.0);
            (v, v.abs())
        }
        MatFormat::Q5_K => {
            let (k, i) = (e / QK_K, e % QK_K);
            let d = h(w.d[r * w.nbp + k]);
            let sc = &w.sc[r * w.nb + k];
            let q = w.kquant(r, k, i) as f64;
            let a = d * sc[i / 32] as f64 * q;
            let b = h(w.m[r * w.nbp + k]) * sc[8 + i / 32] as f64;
            (a - b, a.abs() + b.abs())
        }
        _ => {
            let (k, i) = (e / BLOCK, e % BLOCK);
            let a = h(w.block_d(r, k)) * w.quant(r, k, i) as f64;
            let b = match w.format {
                MatFormat::Q4_1 | MatFormat::Q5_1 => h(w.block_m(r, k)),
                _ => 0.0,
            };
            (a + b, a.abs() + b.abs())
        }
    }
}

/// The activation values weights of `format` multiply (dequantised: `q · d` for Q8_1 / Q8_K,
/// the rounded values for F16 / BF16), row `b`.
fn exact_acts(a: &Activations, format: MatFormat, b: usize) -> Vec<f64> {
    let v = a.view(Level::Scalar, format).unwrap();
    let cols = a.cols();
    (0..cols)
        .map(|e| match format.act() {
            ActFormat::Q8 => {
                let (k, i) = (e / BLOCK, e % BLOCK);
                v.q[b * v.nb + k].0[i] as i8 as f64 * v.d[b * v.nbp + k] as f64
            }
            ActFormat::Q8K => {
                let k = e / QK_K;
                let q = v.kq[(b * v.knb + k) * 8 + (e % QK_K) / 32].0[e % 32] as i8 as f64;
                q * v.kd[b * v.knb + k] as f64
            }
            ActFormat::F16 => f16::from_bits(v.h[b * cols + e]).to_f32() as f64,
            ActFormat::BF16 => half::bf16::from_bits(v.bh[b * cols + e]).to_f32() as f64,
            ActFormat::F32 => v.x[b * cols + e] as f64,
        })
        .collect()
}

/// Every format against an `f64` dot product of the exactly dequantised weights with the
/// dequantised activations. The kernels' only errors are `f32` roundings: at most
/// `(cols/32 + 10) · 2^-24` of the magnitude of the summed terms (the chain of one lane is at
/// most `cols/32` block steps long, plus scale products, conversions and the final sums), plus
/// for Q4_1 / Q5_1 the difference between the stored block sum `s` and the sum of the block's
/// dequantised activations, times `|m|`.
#[test]
fn every_format_agrees_with_f64_reference() {
    let mut rng = Rng(5);
    for format in ALL_FORMATS {
        for (rows, cols) in shapes(format) {
            let n = 5;
            let w = QMatrix::from_ggml(
                format,
                rows,
                cols,
                &random_ggml(&mut rng, format, rows, cols, true),
            )
            .unwrap();
            let mut x = random_x(&mut rng, n, cols, false);
            x[..BLOCK].fill(0.0); // a zero block
            let mut a = Activations::new();
            a.quantize(&x, n, cols).unwrap();
            let got = run(Level::current(), &w, &a);
            let v = a.view(Level::Scalar, format).unwrap();
            for b in 0..n {
                let av = exact_acts(&a, format, b);
                for r in 0..rows {
                    let (mut exact, mut mag) = (0f64, 0f64);
                    for (e, &ae) in av.iter().enumerate() {
                        let (we, wm) = exact_weight(&w, r, e);
                        exact += we * ae;
                        mag += wm * ae.abs();
                    }
                    let mut serr = 0f64;
                    if matches!(format, MatFormat::Q4_1 | MatFormat::Q5_1) {
                        for k in 0..cols / BLOCK {
                            let m = f16::from_bits(w.block_m(r, k)).to_f32() as f64;
                            let sum: f64 = av[k * BLOCK..(k + 1) * BLOCK].iter().sum();
                            serr += m.abs() * (v.s[k * v.np4 + b] as f64 - sum).abs();
                        }
                    }
                    let bound =
                        (cols / 32 + 10) as f64 * f64::powi(2.0, -24) * mag + 1.01 * serr + 1e-30;
                    let g = got[b * rows + r] as f64;
                    assert!(
                        (g - exact).abs() <= bound,
                        "{format:?} {rows}x{cols} row {r} act {b}: {g} vs {exact} (bound {bound})"
                    );
                }
            }
        }
    }
}

#[test]
fn every_simd_level_agrees_with_scalar_bitwise() {
    let levels: Vec<Level> = levels()
        .into_iter()
        .filter(|l| *l != Level::Scalar)
        .collect();
    if levels.is_empty() {
        eprintln!("no SIMD kernel level on this CPU: nothing to compare");
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
        (9, 768, 70),
        // Q4_K: more activation rows than one block of them meets at once (`q4k::run_rows`)
        (40, 4096, 70),
    ];
    for format in ALL_FORMATS {
        for &(rows, cols, n) in shapes {
            if !cols.is_multiple_of(format.cols_multiple()) {
                continue;
            }
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
                for &level in &levels {
                    // the VNNI kernels at both register widths (the others have one)
                    let widths: &[RegisterWidth] = if level == Level::Avx512Vnni {
                        &[RegisterWidth::Bits256, RegisterWidth::Bits512]
                    } else {
                        &[RegisterWidth::Auto]
                    };
                    for &width in widths {
                        set_register_width(width);
                        let got = run(level, &w, &a);
                        set_register_width(RegisterWidth::Auto);
                        assert_same(
                            &got,
                            &want,
                            &format!(
                                "{format:?} {rows}x{cols} B={n} {extreme} {} {width:?}",
                                level.name()
                            ),
                        );
                    }
                }
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
            s.quantize(&x, n, cols).unwrap();
            let sv = s.view(Level::Scalar, MatFormat::Q4_1).unwrap();
            let mut v = Activations::new();
            v.quantize(&x, n, cols).unwrap();
            let vv = v.view(Level::Avx2, MatFormat::Q4_1).unwrap();
            assert_eq!(sv.q, vv.q);
            assert_same(sv.d, vv.d, "d");
            assert_same(sv.s, vv.s, "s");
        }
    }
    // Non-finite values in every lane position: the same (meaningless) blocks at both levels.
    for special in [f32::NAN, f32::INFINITY, -f32::INFINITY, -9e26] {
        for pos in 0..32 {
            let mut x: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) / 7.0).collect();
            x[pos] = special;
            x[32 + (pos * 7) % 32] = f32::NAN;
            let mut s = Activations::new();
            s.quantize(&x, 2, 32).unwrap();
            let sv = s.view(Level::Scalar, MatFormat::Q8_0).unwrap();
            let mut v = Activations::new();
            v.quantize(&x, 2, 32).unwrap();
            let vv = v.view(Level::Avx2, MatFormat::Q8_0).unwrap();
            assert_eq!(sv.q, vv.q, "{special} at {pos}");
            assert_same(sv.d, vv.d, "d");
            assert_same(sv.s, vv.s, "s");
        }
    }
}

/// Q8_K super-blocks: the AVX2 conversion (used at every SIMD level) gives the scalar code's
/// quants, sums and scales, also for NaNs, infinities, subnormal maxima (an infinite inverse
/// scale), ties of the largest magnitude and all-zero blocks.
#[test]
fn q8_k_activations_scalar_and_avx2_agree() {
    if !Level::Avx2.supported() {
        eprintln!("this CPU lacks AVX2: the Q8_K conversions are not compared here");
        return;
    }
    let convert = |x: &[f32], n: usize, cols: usize, level: Level| {
        let mut a = Activations::new();
        a.quantize(x, n, cols).unwrap();
        let v = a.view(level, MatFormat::Q6_K).unwrap();
        let q: Vec<[u8; 32]> = v.kq.iter().map(|c| c.0).collect();
        (q, v.kd.to_vec(), v.kbs.to_vec())
    };
    let check = |x: &[f32], n: usize, cols: usize, what: &str| {
        let (sq, sd, sb) = convert(x, n, cols, Level::Scalar);
        let (vq, vd, vb) = convert(x, n, cols, Level::Avx2);
        assert_eq!(sq, vq, "{what}: quants");
        assert_same(&vd, &sd, &format!("{what}: scales"));
        assert_eq!(sb, vb, "{what}: sums");
    };
    let mut rng = Rng(31);
    for (n, cols) in [(1, 256), (3, 512), (9, 1536)] {
        for extreme in [false, true] {
            let x = random_x(&mut rng, n, cols, extreme);
            check(&x, n, cols, &format!("{n}x{cols} extreme {extreme}"));
        }
    }
    let base: Vec<f32> = (0..256).map(|i| (i as f32 - 120.0) / 9.0).collect();
    for special in [f32::NAN, f32::INFINITY, -f32::INFINITY, 1e-40, -3e38] {
        for pos in [0, 7, 8, 100, 255] {
            let mut x = base.clone();
            x[pos] = special;
            check(&x, 1, 256, &format!("{special} at {pos}"));
        }
    }
    // the largest magnitude twice with opposite signs (the first counts), in either order
    for (a, b) in [(-20.0f32, 20.0f32), (20.0, -20.0)] {
        let mut x = base.clone();
        x[40] = a;
        x[41] = b;
        check(&x, 1, 256, &format!("{a} then {b}"));
    }
    // only subnormals and zeros (an infinite inverse scale), only NaNs, only zeros
    let mut x = vec![0f32; 256];
    x[3] = 1e-42;
    x[200] = -2e-42;
    check(&x, 1, 256, "subnormal maximum");
    check(&[f32::NAN; 256], 1, 256, "all NaN");
    check(&[0.0; 256], 1, 256, "all zero");
    // products that land on ties: 127 / 2 · (k + ½) / 63.5 for small k
    let x: Vec<f32> = (0..256)
        .map(|i| ((i % 9) as f32 - 4.0) * 0.5 / 63.5 * 2.0)
        .collect();
    check(&x, 1, 256, "ties");
}

#[test]
fn activation_quantisation_follows_ggml() {
    // One block 0, 1, …, 31 scaled: amax = 31 · 0.5, d = amax / 127.
    let x: Vec<f32> = (0..32).map(|i| i as f32 * 0.5 - 8.0).collect();
    let mut a = Activations::new();
    a.quantize(&x, 1, 32).unwrap();
    let v = a.view(Level::current(), MatFormat::Q8_0).unwrap();
    let amax = 8.0f32;
    let d = amax / 127.0;
    let id = 1.0 / d;
    let q: Vec<i32> = x
        .iter()
        .map(|v| (v * id).round_ties_even() as i32)
        .collect();
    let got: Vec<i32> = v.q[0].0.iter().map(|&b| b as i8 as i32).collect();
    assert_eq!(got, q);
    assert_eq!(v.d[0], f16::from_f32(d).to_f32());
    let sum: i32 = q.iter().sum();
    assert_eq!(v.s[0], f16::from_f32(d * sum as f32).to_f32());
    // Padding lanes of the transposed `s` and of `d` are zero.
    assert!(v.s[1..4].iter().all(|&v| v == 0.0));
    assert!(v.d[1..8].iter().all(|&v| v == 0.0));
}

#[test]
fn q8_k_activations_follow_ggml() {
    // Two rows of one super-block: the largest magnitude is negative in the first (so the scale
    // is positive), positive in the second, and appears twice (the first one counts).
    let mut x: Vec<f32> = (0..512)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
        .collect();
    x[10] = -9.5;
    x[300] = 9.5;
    x[301] = -9.5;
    x[260..264].fill(0.0);
    let mut a = Activations::new();
    a.quantize(&x, 2, 256).unwrap();
    let v = a.view(Level::current(), MatFormat::Q4_K).unwrap();
    for b in 0..2 {
        let xs = &x[b * 256..(b + 1) * 256];
        let max = if b == 0 { -9.5f32 } else { 9.5 };
        let iscale = -127.0 / max;
        assert_eq!(v.kd[b], 1.0 / iscale);
        let mut bs = [0i16; 16];
        for (e, &xv) in xs.iter().enumerate() {
            let q = (iscale * xv).round_ties_even() as i32;
            assert!((-127..=127).contains(&q));
            assert_eq!(
                v.kq[b * 8 + e / 32].0[e % 32] as i8 as i32,
                q,
                "row {b} value {e}"
            );
            bs[e / 16] += q as i16;
        }
        assert_eq!(v.kbs[b], bs);
    }
    // An all-zero super-block: zero scale, quants and sums.
    a.quantize(&[0.0; 256], 1, 256).unwrap();
    let v = a.view(Level::current(), MatFormat::Q6_K).unwrap();
    assert_eq!(v.kd[0].to_bits(), 0);
    assert!(v.kq.iter().all(|c| c.0 == [0; 32]));
    assert_eq!(v.kbs[0], [0; 16]);
    // F16 and BF16 activations are the values rounded to nearest-even.
    let x = [1.0f32 + 1.0 / 4096.0, -3.0e-8, 70000.0, 1.0 + 1.0 / 256.0];
    let x: Vec<f32> = x.iter().cycle().take(32).copied().collect();
    a.quantize(&x, 1, 32).unwrap();
    let v = a.view(Level::current(), MatFormat::F16).unwrap();
    for (h, &xv) in v.h.iter().zip(&x) {
        assert_eq!(*h, f16::from_f32(xv).to_bits());
    }
    assert_eq!(v.h[0], f16::from_f32(1.0).to_bits()); // a tie rounds to even
    let v = a.view(Level::current(), MatFormat::BF16).unwrap();
    for (h, &xv) in v.bh.iter().zip(&x) {
        assert_eq!(*h, half::bf16::from_f32(xv).to_bits());
    }
    assert_eq!(v.bh[3], half::bf16::from_f32(1.0).to_bits()); // a tie rounds to even
}

#[test]
fn batch_and_thread_invariance() {
    let mut rng = Rng(3);
    for format in ALL_FORMATS {
        for &(rows, cols, n) in &[(192, 768, 70), (37, 1536, 13), (300, 256, 9)] {
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
            let batch = run(Level::current(), &w, &a);
            for threads in [1, 2] {
                let other = pool(threads).install(|| run(Level::current(), &w, &a));
                assert_same(&other, &batch, &format!("{format:?}: {threads} threads"));
            }
            let mut one = Activations::new();
            for b in 0..n {
                one.quantize(&x[b * cols..(b + 1) * cols], 1, cols).unwrap();
                let single = run(Level::current(), &w, &one);
                assert_same(
                    &single,
                    &batch[b * rows..(b + 1) * rows],
                    &format!("{format:?} {rows}x{cols}: row {b} of {n}"),
                );
            }
            // A sub-batch starting at an odd row (other remainder paths).
            let sub = &x[3 * cols..(3 + 5) * cols];
            one.quantize(sub, 5, cols).unwrap();
            let got = run(Level::current(), &w, &one);
            assert_same(
                &got,
                &batch[3 * rows..8 * rows],
                &format!("{format:?}: rows 3..8 as a batch of 5"),
            );
        }
    }
}

/// Inside a forward pass's team, a large batch's activations are converted row runs at a time
/// on the team's threads: the Q8_1 and Q8_K conversions (and the products) are the bits of the
/// one-thread conversion.
#[test]
fn activation_conversion_on_a_team_is_the_same_bits() {
    let mut rng = Rng(21);
    let (rows, cols, n) = (40, 512, 300);
    let x = random_x(&mut rng, n, cols, true);
    for format in [
        MatFormat::Q8_0,
        MatFormat::Q4_1,
        MatFormat::Q4_K,
        MatFormat::Q6_K,
    ] {
        let w = QMatrix::from_ggml(
            format,
            rows,
            cols,
            &random_ggml(&mut rng, format, rows, cols, true),
        )
        .unwrap();
        let convert_and_run = || {
            let mut a = Activations::new();
            a.quantize(&x, n, cols).unwrap();
            run(Level::current(), &w, &a)
        };
        let splits = || crate::team::ROW_SPLITS.with(|c| c.get());
        let alone = pool(1).install(convert_and_run);
        for threads in [2, 3] {
            let (team, split) = pool(threads).install(|| {
                let before = splits();
                let out = crate::team::with_team(convert_and_run);
                (out, splits() - before)
            });
            assert_same(&team, &alone, &format!("{format:?}: a team of {threads}"));
            assert_eq!(split, 1, "{format:?}: the conversion ran on the team");
        }
    }
}

/// One activation buffer shared by matrices of every format, in any order and from several
/// threads at once: each conversion is made once per batch and gives the results of a fresh
/// buffer.
#[test]
fn mixed_formats_share_one_activation_buffer() {
    let mut rng = Rng(12);
    let (rows, cols, n) = (23, 512, 6);
    let mats: Vec<QMatrix> = ALL_FORMATS
        .iter()
        .map(|&f| {
            QMatrix::from_ggml(f, rows, cols, &random_ggml(&mut rng, f, rows, cols, false)).unwrap()
        })
        .collect();
    let mut a = Activations::new();
    for round in 0..2 {
        let x = random_x(&mut rng, n, cols, round == 1);
        a.quantize(&x, n, cols).unwrap();
        let want: Vec<Vec<f32>> = mats
            .iter()
            .map(|w| {
                let mut fresh = Activations::new();
                fresh.quantize(&x, n, cols).unwrap();
                run(Level::current(), w, &fresh)
            })
            .collect();
        let got: Vec<Vec<f32>> = pool(3).install(|| {
            use rayon::prelude::*;
            mats.par_iter()
                .rev()
                .map(|w| run(Level::current(), w, &a))
                .collect()
        });
        for ((w, got), want) in mats.iter().rev().zip(&got).zip(want.iter().rev()) {
            assert_same(got, want, &format!("{:?} round {round}", w.format()));
        }
    }
}

#[test]
fn agrees_with_candle() {
    let mut rng = Rng(4);
    for format in ALL_FORMATS {
        if format.ggml_dtype().is_none() {
            continue;
        }
        for &(rows, cols, n) in &[(64, 768, 1), (96, 1536, 3)] {
            let bytes = random_ggml(&mut rng, format, rows, cols, false);
            let w = QMatrix::from_ggml(format, rows, cols, &bytes).unwrap();
            let qt = candle_qtensor(format, rows, cols, &bytes).unwrap();
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
            let got = run(Level::current(), &w, &a);
            // Both sides quantise the activations per block of `blk` values with a step of
            // at most `amax / 127`, each rounding a value by at most half a step (candle's Q8_K
            // uses −128 / max, ours −127 / max), so they differ by at most
            // `Σ_blocks amax / 127 · Σ |w|` (nothing for the float formats), plus the roundings
            // of the `f16` scales and the sums.
            let blk = match format.act() {
                ActFormat::Q8 => BLOCK,
                ActFormat::Q8K => QK_K,
                _ => 0,
            };
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let mut wr = vec![0f32; cols];
            for r in 0..rows {
                w.dequantize_row(r, &mut wr).unwrap();
                for b in 0..n {
                    let xr = &x[b * cols..(b + 1) * cols];
                    let mut bound = 2e-3 * scale as f64 + 1e-6;
                    if blk > 0 {
                        for (xs, ws) in xr.chunks(blk).zip(wr.chunks(blk)) {
                            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                            let sw: f64 = ws.iter().map(|v| v.abs() as f64).sum();
                            bound += amax / 127.0 * sw;
                        }
                    }
                    let (g, c) = (got[b * rows + r], want[b * rows + r]);
                    assert!(
                        ((g - c) as f64).abs() <= bound,
                        "{format:?} {rows}x{cols} B={n}: row {r} act {b}: ours {g} candle {c} \
                         (bound {bound})"
                    );
                }
            }
        }
    }
}

#[test]
fn quantize_q8_0_matches_candle_and_from_qtensor() {
    let mut rng = Rng(7);
    let (rows, cols) = (6, 256);
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
    assert_eq!(c.converted_from(), None);
    // Formats with a kernel keep their own format and bytes…
    for dtype in [
        GgmlDType::Q4_0,
        GgmlDType::Q5_1,
        GgmlDType::Q4K,
        GgmlDType::Q6K,
    ] {
        let q = QTensor::quantize(&t, dtype).unwrap();
        let m = QMatrix::from_qtensor(&q).unwrap();
        assert_eq!(m.format().ggml_dtype(), Some(dtype));
        assert_eq!(m.converted_from(), None);
        let direct = QMatrix::from_ggml(m.format(), rows, cols, &q.data().unwrap()).unwrap();
        assert_eq!(m.qs, direct.qs);
        // …unless re-quantisation to Q8_0 is asked for.
        let r = QMatrix::from_qtensor_as(&q, Some(MatFormat::Q8_0)).unwrap();
        assert_eq!(r.format(), MatFormat::Q8_0);
        let deq: Vec<f32> = q
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
    // A format without a kernel is re-quantised to Q8_0 and says so.
    let q3 = QTensor::quantize(&t, GgmlDType::Q3K).unwrap();
    let r = QMatrix::from_qtensor(&q3).unwrap();
    assert_eq!(r.format(), MatFormat::Q8_0);
    assert_eq!(r.converted_from(), Some(GgmlDType::Q3K));
    assert!(QMatrix::from_qtensor_as(&q3, Some(MatFormat::Q4_K)).is_err());
}

#[test]
fn ggml_type_ids() {
    for f in ALL_FORMATS {
        if let Some(t) = f.ggml_dtype() {
            assert_eq!(MatFormat::from_ggml_dtype(t), Some(f));
        }
    }
    let ids: Vec<u32> = (0..40)
        .filter(|&i| MatFormat::from_ggml_type(i).is_some())
        .collect();
    assert_eq!(ids, [0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 30]);
    assert_eq!(MatFormat::from_ggml_type(30), Some(MatFormat::BF16));
    assert_eq!(MatFormat::from_ggml_type(10), None); // Q2_K
}

#[test]
fn bad_input_is_an_error() {
    let e = QMatrix::from_ggml(MatFormat::Q4_1, 2, 33, &[0; 40]).unwrap_err();
    assert!(matches!(e, KernelError::Shape(_)), "{e}");
    let e = QMatrix::from_ggml(MatFormat::Q4_1, 2, 32, &[0; 39]).unwrap_err();
    assert!(matches!(e, KernelError::Length { .. }), "{e}");
    let e = QMatrix::from_ggml(MatFormat::Q8_0, 2, 64, &[0; 4 * 34 + 1]).unwrap_err();
    assert!(matches!(e, KernelError::Length { .. }), "{e}");
    for f in ALL_FORMATS {
        let (rows, cols) = (3, f.cols_multiple());
        let len = rows * cols / f.block_values() * f.block_bytes();
        assert!(
            QMatrix::from_ggml(f, rows, cols, &vec![0; len]).is_ok(),
            "{f:?}"
        );
        let e = QMatrix::from_ggml(f, rows, cols, &vec![0; len - 1]).unwrap_err();
        assert!(matches!(e, KernelError::Length { .. }), "{f:?}: {e}");
        let e = QMatrix::from_ggml(f, rows, cols + 16, &vec![0; len]).unwrap_err();
        assert!(matches!(e, KernelError::Shape(_)), "{f:?}: {e}");
        assert!(
            QMatrix::from_ggml(f, usize::MAX, cols, &[]).is_err(),
            "{f:?}"
        );
        assert!(
            QMatrix::from_ggml(f, usize::MAX / 2, cols, &[0; 64]).is_err(),
            "{f:?}"
        );
        assert!(QMatrix::from_ggml(f, 0, cols, &[]).is_ok(), "{f:?}");
    }
    // K-quants need a multiple of 256 columns.
    let e = QMatrix::from_ggml(MatFormat::Q4_K, 1, 96, &[0; 144]).unwrap_err();
    assert!(matches!(e, KernelError::Shape(_)), "{e}");
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
    // Q8_K activations need a multiple of 256 columns.
    assert!(matches!(
        a.prepare(Level::current(), MatFormat::Q6_K),
        Err(KernelError::Shape(_))
    ));
    // An empty batch is fine.
    a.quantize(&[], 0, 64).unwrap();
    matmul(&w, &a, &mut []).unwrap();
}

mod arbitrary {
    //! Arbitrary bytes as weights (any scale bits: NaN, infinities, subnormals, negative zero)
    //! and arbitrary activations.

    use proptest::prelude::*;

    use super::*;

    /// A format, a row count, a column count, the matrix's GGML bytes, and `n` activation rows.
    fn case() -> impl Strategy<Value = (MatFormat, usize, usize, Vec<u8>, usize, Vec<f32>)> {
        (0..ALL_FORMATS.len(), 1usize..4, 1usize..3, 1usize..6).prop_flat_map(|(f, rows, m, n)| {
            let format = ALL_FORMATS[f];
            let cols = m * format.cols_multiple();
            let len = rows * cols / format.block_values() * format.block_bytes();
            let x = prop_oneof![
                4 => -2.0f32..2.0,
                1 => prop::num::f32::ANY,
                1 => Just(0.0f32),
            ];
            (
                Just(format),
                Just(rows),
                Just(cols),
                prop::collection::vec(any::<u8>(), len),
                Just(n),
                prop::collection::vec(x, n * cols),
            )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn arbitrary_blocks((format, rows, cols, bytes, n, x) in case()) {
            let w = QMatrix::from_ggml(format, rows, cols, &bytes).unwrap();
            let want = candle_dequantize(format, rows, cols, &bytes);
            let mut row = vec![0f32; cols];
            for r in 0..rows {
                w.dequantize_row(r, &mut row).unwrap();
                for (g, c) in row.iter().zip(&want[r * cols..(r + 1) * cols]) {
                    prop_assert!(same(*g, *c), "{format:?}: dequantised {g:e} vs candle {c:e}");
                }
            }
            let mut a = Activations::new();
            a.quantize(&x, n, cols).unwrap();
            let scalar = run(Level::Scalar, &w, &a);
            let best = run(Level::current(), &w, &a);
            for (i, (s, b)) in scalar.iter().zip(&best).enumerate() {
                prop_assert!(same(*s, *b), "{format:?} B={n}: {i}: scalar {s:e} vs {b:e}");
            }
            let mut one = Activations::new();
            for b in 0..n {
                one.quantize(&x[b * cols..(b + 1) * cols], 1, cols).unwrap();
                let alone = run(Level::current(), &w, &one);
                for (i, (s, v)) in alone.iter().zip(&best[b * rows..(b + 1) * rows]).enumerate() {
                    prop_assert!(same(*s, *v), "{format:?} row {b} alone: {i}: {s:e} vs {v:e}");
                }
            }
        }
    }
}
