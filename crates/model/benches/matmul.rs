//! Quantised matrix × batch of activations: `nextok_model::kernels::matmul` beside candle's
//! `QMatMul::forward` on the same weights and inputs, on SmolLM2-135M's shapes (576→576,
//! 576→1536 and 1536→576 Q4_1, the 576→49152 Q8_0 tied embedding), for B = 1, 4, 16, 64, 512
//! activation rows. The weights come from the real model (`scripts/fetch-testdata.sh`) when it
//! is present, else random blocks of the same shapes. Then every other weight format the kernels
//! keep as it is (Q4_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, F16, BF16, F32) on random 1536→576
//! matrices (the feed-forward down projection's shape; 1536 is a multiple of the K-quants' 256);
//! candle has no BF16 matrices, so that one runs alone. Both sides include quantising the
//! activations; throughput is in multiply-accumulates (`rows · cols · B`) per second.
//! Each SIMD kernel level the CPU has runs as its own line (`ours` is the best level,
//! `ours-avx2` etc. the others).
//!
//! Filter with e.g. `cargo bench -p nextok-model --bench matmul -- 'q4_1 576x576'` or
//! `-- 'q4_k.*/(ours|candle)/(1|64)$'`.

use candle_core::quantized::{
    ggml_file::qtensor_from_ggml, gguf_file, GgmlDType, QMatMul, QTensor,
};
use candle_core::{Device, Module, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use nextok_model::kernels::{matmul_with, Activations, Level, MatFormat, QMatrix};

const BATCHES: [usize; 5] = [1, 4, 16, 64, 512];

/// Deterministic pseudo-random numbers (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// The benchmarked matrices: (label, tensor).
fn matrices() -> Vec<(String, QTensor)> {
    let wanted = [
        ("blk.0.attn_q.weight", "q4_1 576x576 (attn_q)"),
        ("blk.0.ffn_up.weight", "q4_1 576->1536 (ffn_up)"),
        ("blk.0.ffn_down.weight", "q4_1 1536->576 (ffn_down)"),
        ("token_embd.weight", "q8_0 576->49152 (output)"),
    ];
    if let Some(path) = nextok_testdata::optional(nextok_testdata::SMOLLM2) {
        let mut f = std::fs::File::open(&path).unwrap();
        let content = gguf_file::Content::read(&mut f).unwrap();
        let got: Vec<_> = wanted
            .iter()
            .filter_map(|(name, label)| {
                let t = content.tensor(&mut f, name, &Device::Cpu).ok()?;
                Some((label.to_string(), t))
            })
            .collect();
        if got.len() == wanted.len() {
            eprintln!("matmul bench: weights from {}", path.display());
            return got;
        }
    }
    eprintln!("matmul bench: model absent, random weights");
    let mut rng = Rng(42);
    let shapes = [
        (GgmlDType::Q4_1, 576, 576),
        (GgmlDType::Q4_1, 1536, 576),
        (GgmlDType::Q4_1, 576, 1536),
        (GgmlDType::Q8_0, 49152, 576),
    ];
    shapes
        .iter()
        .zip(wanted)
        .map(|(&(dtype, rows, cols), (_, label))| {
            let x: Vec<f32> = (0..rows * cols).map(|_| rng.unit() * 0.05).collect();
            let t = Tensor::from_slice(&x, (rows, cols), &Device::Cpu).unwrap();
            let q = QTensor::quantize(&t, dtype).unwrap();
            let bytes = q.data().unwrap();
            let q = qtensor_from_ggml(dtype, &bytes, vec![rows, cols], &Device::Cpu).unwrap();
            (label.to_string(), q)
        })
        .collect()
}

/// The other formats: (label, our matrix, candle's when it has the format).
fn other_formats() -> Vec<(String, QMatrix, Option<QTensor>)> {
    let (rows, cols) = (576, 1536);
    let mut rng = Rng(43);
    let x: Vec<f32> = (0..rows * cols).map(|_| rng.unit() * 0.05).collect();
    let t = Tensor::from_slice(&x, (rows, cols), &Device::Cpu).unwrap();
    let mut out = Vec::new();
    for (dtype, name) in [
        (GgmlDType::Q4_0, "q4_0"),
        (GgmlDType::Q5_0, "q5_0"),
        (GgmlDType::Q5_1, "q5_1"),
        (GgmlDType::Q4K, "q4_k"),
        (GgmlDType::Q5K, "q5_k"),
        (GgmlDType::Q6K, "q6_k"),
        (GgmlDType::F16, "f16"),
        (GgmlDType::F32, "f32"),
    ] {
        let q = QTensor::quantize(&t, dtype).unwrap();
        let ours = QMatrix::from_qtensor(&q).unwrap();
        assert_eq!(ours.format().ggml_dtype(), Some(dtype));
        out.push((format!("{name} 1536->576"), ours, Some(q)));
    }
    let bf: Vec<u8> = x
        .iter()
        .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
        .collect();
    let ours = QMatrix::from_ggml(MatFormat::BF16, rows, cols, &bf).unwrap();
    out.push(("bf16 1536->576".to_string(), ours, None));
    out
}

fn bench(c: &mut Criterion) {
    let mut rng = Rng(7);
    let first = matrices().into_iter().map(|(label, qt)| {
        let ours = QMatrix::from_qtensor(&qt).unwrap();
        (label, ours, Some(qt))
    });
    for (label, ours, qt) in first.chain(other_formats()) {
        let (rows, cols) = (ours.rows(), ours.cols());
        let candle = qt.map(|qt| QMatMul::from_qtensor(qt).unwrap());
        let mut g = c.benchmark_group(format!("matmul/{label}"));
        g.sample_size(10);
        g.warm_up_time(std::time::Duration::from_millis(500));
        g.measurement_time(std::time::Duration::from_secs(2));
        for b in BATCHES {
            let x: Vec<f32> = (0..b * cols).map(|_| rng.unit()).collect();
            let xt = Tensor::from_slice(&x, (b, cols), &Device::Cpu).unwrap();
            g.throughput(Throughput::Elements((rows * cols * b) as u64));
            if let Some(candle) = &candle {
                g.bench_with_input(BenchmarkId::new("candle", b), &b, |bench, _| {
                    bench.iter(|| candle.forward(&xt).unwrap())
                });
            }
            let mut a = Activations::new();
            let mut out = vec![0f32; b * rows];
            // every SIMD level this CPU has ("ours" is the best, as `matmul` picks it)
            for level in Level::ALL.into_iter().filter(|l| l.supported()) {
                if level == Level::Scalar {
                    continue;
                }
                let name = if level == Level::current() {
                    "ours".to_string()
                } else {
                    format!("ours-{}", level.name())
                };
                g.bench_with_input(BenchmarkId::new(name, b), &b, |bench, _| {
                    bench.iter(|| {
                        a.quantize(&x, b, cols).unwrap();
                        matmul_with(level, &ours, &a, &mut out).unwrap();
                    })
                });
            }
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
