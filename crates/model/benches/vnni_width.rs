//! The AVX-512 VNNI kernels of the 32-value formats at both register widths, side by side in one
//! process: each repetition runs one product at 512-bit and one at 256-bit width, alternating
//! which goes first, on one thread; the report gives each width's fastest and median time and
//! their ratio. Where the 512-bit setting has no VNNI tile for a shape (Q4_1; Q8_0 up to 16
//! activation rows; one activation row of Q8_0 at either width) it runs the AVX2 tiles. On
//! these shared machines, back-to-back pairs in one process are what keeps the
//! comparison fair (separate criterion runs drifted by 30 % here).
//!
//! `cargo bench -p nextok-model --bench vnni_width` (add `-- 40` for 40 repetitions).

use std::time::Instant;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use nextok_model::kernels::{
    matmul_with, set_register_width, Activations, Level, QMatrix, RegisterWidth,
};

/// SplitMix64 in `[-1, 1)`.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

fn main() {
    if !Level::Avx512Vnni.supported() {
        println!("this CPU lacks AVX-512 VNNI: there are no two widths to compare here");
        return;
    }
    let reps: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(20);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a pool of one thread");
    println!(
        "AVX-512 VNNI kernels, one thread, {reps} alternating pairs (auto picks {:?} here)",
        nextok_model::kernels::register_width()
    );
    println!("| format | matrix | activation rows | 512-bit min / median µs | 256-bit min / median µs | 512 / 256 (min) |");
    println!("|---|---|---:|---:|---:|---:|");
    let mut rng = Rng(7);
    for (dtype, rows, cols) in [
        (GgmlDType::Q4_0, 576, 1536),
        (GgmlDType::Q4_1, 576, 1536),
        (GgmlDType::Q5_0, 576, 1536),
        (GgmlDType::Q5_1, 576, 1536),
        (GgmlDType::Q8_0, 1536, 576),
    ] {
        let x: Vec<f32> = (0..rows * cols).map(|_| rng.unit() * 0.05).collect();
        let t = Tensor::from_slice(&x, (rows, cols), &Device::Cpu).expect("a tensor");
        let w = QMatrix::from_qtensor(&QTensor::quantize(&t, dtype).expect("quantised"))
            .expect("a matrix");
        for n in [1usize, 4, 16, 64, 512] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
            let mut a = Activations::new();
            a.quantize(&x, n, cols).expect("activations");
            a.prepare(Level::Avx512Vnni, w.format()).expect("converted");
            let mut out = vec![0f32; n * rows];
            let mut times = [Vec::new(), Vec::new()];
            for i in 0..2 * reps {
                // alternate which width goes first in each pair
                let v = (i + i / 2) % 2;
                set_register_width([RegisterWidth::Bits512, RegisterWidth::Bits256][v]);
                let t0 = Instant::now();
                pool.install(|| matmul_with(Level::Avx512Vnni, &w, &a, &mut out).expect("product"));
                times[v].push(t0.elapsed().as_secs_f64() * 1e6);
            }
            set_register_width(RegisterWidth::Auto);
            for t in &mut times {
                t.sort_by(f64::total_cmp);
            }
            let (w5, w2) = (&times[0], &times[1]);
            println!(
                "| {dtype:?} | {cols}→{rows} | {n} | {:.0} / {:.0} | {:.0} / {:.0} | {:.2} |",
                w5[0],
                w5[reps / 2],
                w2[0],
                w2[reps / 2],
                w5[0] / w2[0]
            );
        }
    }
}
