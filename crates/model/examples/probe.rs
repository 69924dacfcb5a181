use nextok_model::{LogitsSource, Model, Requant};
use std::time::Instant;
fn cpu() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let f: Vec<&str> = s.rsplit(')').next().unwrap().split_whitespace().collect();
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
}
fn main() {
    let path = nextok_testdata::optional(nextok_testdata::SMOLLM2).unwrap();
    let args: Vec<String> = std::env::args().collect();
    let q = if args.get(1).map(|s| s.as_str()) == Some("q8") {
        Requant::Q8_0
    } else {
        Requant::Keep
    };
    let what = args.get(2).cloned().unwrap_or("all".into());
    let reps: usize = std::env::var("R")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    if what == "mm" {
        mm_micro(args[1] == "q8");
        return;
    }
    if what == "micro" {
        attn_micro(if args[1] == "scalar" {
            nextok_model::kernels::Level::Scalar
        } else {
            nextok_model::kernels::Level::Avx2
        });
        return;
    }
    let m = Model::load(&path, q).unwrap();
    let ids: Vec<u32> = (0..2100u32).map(|i| 100 + (i * 7919) % 40000).collect();
    if what == "all" || what == "prefill" {
        let mut src = m.source();
        let mut best = 0f64;
        let c0 = cpu();
        for _ in 0..reps {
            let t = Instant::now();
            src.truncate(0).unwrap();
            src.prefill(&ids[..512]).unwrap();
            best = best.max(512.0 / t.elapsed().as_secs_f64());
        }
        println!(
            "prefill512 best {best:.1} tok/s cpu {:.3} ms/tok",
            (cpu() - c0) * 1000.0 / (512 * reps) as f64
        );
    }
    for pos in [50usize, 1800] {
        if what != "all" && what != format!("d{pos}") {
            continue;
        }
        let mut src = m.source();
        src.prefill(&ids[..pos]).unwrap();
        let n = 20;
        let mut best = 0f64;
        let c0 = cpu();
        for _ in 0..reps {
            let t = Instant::now();
            for i in 0..n {
                src.truncate(pos).unwrap();
                src.decode_one(ids[pos + i]).unwrap();
            }
            best = best.max(n as f64 / t.elapsed().as_secs_f64());
        }
        println!(
            "decode@{pos} best {best:.1} tok/s cpu {:.2} ms/tok",
            (cpu() - c0) * 1000.0 / (n * reps) as f64
        );
    }
}
#[allow(dead_code)]
fn attn_micro(level: nextok_model::kernels::Level) {
    use nextok_model::kernels::attn;
    let hd = 64;
    let len = 1800;
    let rep = 3;
    let q: Vec<f32> = (0..rep * hd)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let kv: Vec<f32> = (0..len * hd)
        .map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0)
        .collect();
    let mut scores = vec![0f32; rep * len];
    let mut out = vec![0f32; rep * hd];
    for _ in 0..30 {
        for b in 0..len.div_ceil(16) {
            let here = (len - b * 16).min(16);
            attn::scores(
                level,
                &q,
                &kv[b * 16 * hd..(b * 16 + here) * hd],
                hd,
                0.125,
                &mut scores,
                len,
                b * 16,
            );
        }
        for b in 0..len.div_ceil(16) {
            let here = (len - b * 16).min(16);
            attn::accumulate(
                level,
                &scores,
                len,
                b * 16,
                &kv[b * 16 * hd..(b * 16 + here) * hd],
                hd,
                &mut out,
            );
        }
    }
    println!("{}", out[0]);
}
#[allow(dead_code)]
fn mm_micro(q8: bool) {
    use nextok_model::kernels::{matmul, Activations, QMatrix};
    let (rows, cols) = (1536, 576);
    let data: Vec<f32> = (0..rows * cols)
        .map(|i| (((i * 7919) % 1000) as f32 - 500.0) / 500.0)
        .collect();
    let w = if q8 {
        QMatrix::quantize_q8_0(rows, cols, &data).unwrap()
    } else {
        // Q4_1 from candle's quantizer
        let t =
            candle_core::Tensor::from_vec(data.clone(), (rows, cols), &candle_core::Device::Cpu)
                .unwrap();
        let qt =
            candle_core::quantized::QTensor::quantize(&t, candle_core::quantized::GgmlDType::Q4_1)
                .unwrap();
        QMatrix::from_qtensor(&qt).unwrap()
    };
    for b in [1usize, 16, 64] {
        let x: Vec<f32> = (0..b * cols)
            .map(|i| (((i * 31) % 200) as f32 - 100.0) / 100.0)
            .collect();
        let mut a = Activations::new();
        a.quantize(&x, b, cols).unwrap();
        let mut out = vec![0f32; b * rows];
        let reps = 400 / b.max(4) * 4;
        let mut best = f64::MAX;
        for _ in 0..reps {
            let t = Instant::now();
            matmul(&w, &a, &mut out).unwrap();
            best = best.min(t.elapsed().as_secs_f64());
        }
        let gmacs = (rows * cols * b) as f64 / best / 1e9;
        println!(
            "{} B={b} best {:.1} us  {gmacs:.1} GMAC/s  chk {}",
            if q8 { "q8_0" } else { "q4_1" },
            best * 1e6,
            out.iter().map(|v| *v as f64).sum::<f64>()
        );
    }
}
