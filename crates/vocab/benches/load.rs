//! Load-time benchmarks: the 262k-token Gemma-3 `tokenizer.json`, the 128k-token Llama-3 one,
//! and the SmolLM2 GGUF metadata, with the `tokenizers` crate's own `Tokenizer::from_file` on
//! the Gemma-3 file for reference. The files come from `scripts/fetch-testdata.sh`
//! (`.testdata/` or `NEXTOK_TESTDATA`); an absent file skips its benchmark with a notice.
//!
//! `cargo bench -p nextok-vocab --bench load`

use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use nextok_vocab::gguf::Gguf;
use nextok_vocab::{LoadOptions, Vocabulary};

fn testdata(rel: &str) -> Option<PathBuf> {
    nextok_testdata::optional(rel)
}

fn load(c: &mut Criterion) {
    let mut g = c.benchmark_group("load");
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(4));
    let opts = LoadOptions::default();
    for name in ["gemma3", "llama3"] {
        if let Some(p) = testdata(&format!("{name}/tokenizer.json")) {
            g.bench_function(format!("{name}_tokenizer_json"), |b| {
                b.iter(|| Vocabulary::from_tokenizer_json_file(&p, &opts).unwrap())
            });
        }
    }
    if let Some(p) = testdata("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") {
        g.bench_function("smollm2_gguf_metadata", |b| {
            b.iter(|| Gguf::read_file(&p).unwrap())
        });
        g.bench_function("smollm2_gguf_vocabulary", |b| {
            b.iter(|| Vocabulary::from_gguf_file(&p, &opts).unwrap())
        });
    }
    // The reference takes most of a second per load: only in real bench runs (`--bench`), not
    // when `cargo test --all-targets` runs each benchmark once.
    let bench_mode = std::env::args().any(|a| a == "--bench");
    if let Some(p) = testdata("gemma3/tokenizer.json").filter(|_| bench_mode) {
        g.bench_function("gemma3_reference_tokenizers_from_file", |b| {
            b.iter(|| tokenizers::Tokenizer::from_file(&p).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, load);
criterion_main!(benches);
