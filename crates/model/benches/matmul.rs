//! Quantised matrix × batch of activations: `nextok_model::kernels::matmul` beside candle's
//! `QMatMul::forward` on the same weights and inputs, on SmolLM2-135M's shapes (576→576,
//! 576→1536 and 1536→576 Q4_1, the 576→49152 Q8_0 tied embedding), for B = 1, 4, 16, 64, 512
//! activation rows. The weights come from the real model (`scripts/fetch-testdata.sh`) when it
//! is present, else random blocks of the same shapes. Both sides include quantising the
//! activations; throughput is in multiply-accumulates (`rows · cols · B`) per second.
//!
//! Filter with e.g. `cargo bench -p nextok-model --bench matmul -- 'q4_1 576x576'`.

use candle_core::quantized::{
    ggml_file::qtensor_from_ggml, gguf_file, GgmlDType, QMatMul, QTensor,
};
use candle_core::{Device, Module, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use nextok_model::kernels::{matmul, Activations, QMatrix};

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

fn bench(c: &mut Criterion) {
    let mut rng = Rng(7);
    for (label, qt) in matrices() {
        let (rows, cols) = qt.shape().dims2().unwrap();
        let ours = QMatrix::from_qtensor(&qt).unwrap();
        let candle = QMatMul::from_qtensor(qt).unwrap();
        let mut g = c.benchmark_group(format!("matmul/{label}"));
        g.sample_size(10);
        g.warm_up_time(std::time::Duration::from_millis(500));
        g.measurement_time(std::time::Duration::from_secs(2));
        for b in BATCHES {
            let x: Vec<f32> = (0..b * cols).map(|_| rng.unit()).collect();
            let xt = Tensor::from_slice(&x, (b, cols), &Device::Cpu).unwrap();
            g.throughput(Throughput::Elements((rows * cols * b) as u64));
            g.bench_with_input(BenchmarkId::new("candle", b), &b, |bench, _| {
                bench.iter(|| candle.forward(&xt).unwrap())
            });
            let mut a = Activations::new();
            let mut out = vec![0f32; b * rows];
            g.bench_with_input(BenchmarkId::new("ours", b), &b, |bench, _| {
                bench.iter(|| {
                    a.quantize(&x, b, cols).unwrap();
                    matmul(&ours, &a, &mut out).unwrap();
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
