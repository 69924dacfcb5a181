//! Per-step cost of nextok next to the floor (one summing pass over the logits) and a naive
//! full-sort sampler, for the llama.cpp default chain and for top-p alone, at four vocabulary
//! sizes; and batch stepping of 64 rows on one thread against two.
//!
//! `cargo bench -p nextok-bench --bench sampler` (criterion). For ratios measured in one
//! interleaved run use `nextok bench sampler`. The `flat/…` groups run the flat rows (a
//! Normal(0, 2) bulk and 20 strong tokens) with the dense top-p's large-nucleus path on
//! (`nextok`) and off (`bands`, the band search alone).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use nextok_bench::fixtures::{
    BatchBench, Case, StepBench, BATCH_ROWS, FLAT_VOCAB_SIZES, TARGET_VOCAB, VOCAB_SIZES,
};

fn per_step(c: &mut Criterion) {
    for case in Case::ALL {
        let mut group = c.benchmark_group(format!("step/{}", case.key()));
        group
            .sample_size(30)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        for v in VOCAB_SIZES {
            let mut b = StepBench::new(case, v);
            group.throughput(Throughput::Elements(v as u64));
            group.bench_with_input(BenchmarkId::new("floor", v), &v, |bn, _| {
                bn.iter(|| black_box(b.floor()))
            });
            group.bench_with_input(BenchmarkId::new("naive", v), &v, |bn, _| {
                bn.iter(|| black_box(b.naive()))
            });
            group.bench_with_input(BenchmarkId::new("nextok", v), &v, |bn, _| {
                bn.iter(|| black_box(b.nextok()))
            });
            if case == Case::TopPOnly {
                // the exact softmax normaliser alone, which a dense top-p must compute
                group.bench_with_input(BenchmarkId::new("normaliser", v), &v, |bn, _| {
                    bn.iter(|| black_box(b.normaliser()))
                });
            }
        }
        group.finish();
    }
}

fn flat(c: &mut Criterion) {
    for case in Case::ALL {
        let mut group = c.benchmark_group(format!("flat/{}", case.key()));
        group
            .sample_size(30)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        for v in FLAT_VOCAB_SIZES {
            let mut b = StepBench::flat(case, v);
            group.throughput(Throughput::Elements(v as u64));
            group.bench_with_input(BenchmarkId::new("floor", v), &v, |bn, _| {
                bn.iter(|| black_box(b.floor()))
            });
            group.bench_with_input(BenchmarkId::new("nextok", v), &v, |bn, _| {
                bn.iter(|| black_box(b.nextok()))
            });
            group.bench_with_input(BenchmarkId::new("bands", v), &v, |bn, _| {
                bn.iter(|| black_box(b.nextok_bands()))
            });
        }
        group.finish();
    }
}

fn batch(c: &mut Criterion) {
    for case in Case::ALL {
        let mut group = c.benchmark_group(format!("batch{BATCH_ROWS}/{}", case.key()));
        group
            .sample_size(20)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(3))
            .throughput(Throughput::Elements(BATCH_ROWS as u64));
        let mut b = BatchBench::new(case, TARGET_VOCAB, BATCH_ROWS, &[1, 2]);
        for threads in [1usize, 2] {
            group.bench_with_input(BenchmarkId::new("threads", threads), &threads, |bn, &t| {
                bn.iter_custom(|iters| (0..iters).map(|_| b.run(t)).sum())
            });
        }
        group.finish();
    }
}

criterion_group!(benches, per_step, flat, batch);
criterion_main!(benches);
