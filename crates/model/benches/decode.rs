//! Decode speed on the real model (SmolLM2-135M-Instruct, from `scripts/fetch-testdata.sh`;
//! skipped with a notice when absent): one forward step at a fixed context (Q4_1 as shipped,
//! and re-quantised to Q8_0), and one sampler step on a real logits row, without and with a
//! step record serialised as a trace line. `nextok-model`'s docs/performance.md section
//! "Model" reports the numbers.

use std::path::PathBuf;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use nextok_core::{Draw, Preset, Sampler, SamplingParams};
use nextok_model::{LogitsSource, Model, Requant};

fn model_path() -> Option<PathBuf> {
    nextok_testdata::optional(nextok_testdata::SMOLLM2)
}

const PROMPT: &str = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWrite one sentence about a cat.<|im_end|>\n<|im_start|>assistant\n";

fn bench(c: &mut Criterion) {
    let Some(path) = model_path() else {
        return;
    };
    let mut g = c.benchmark_group("model");
    g.sample_size(20);
    g.measurement_time(std::time::Duration::from_secs(8));
    let mut row = Vec::new();
    let mut vocab = None;
    for requant in [Requant::Keep, Requant::Q8_0] {
        let m = Model::load(&path, requant).unwrap();
        let prompt = m.encode_prompt(PROMPT).unwrap();
        let mut src = m.source();
        row = src.prefill(&prompt).unwrap();
        let n = prompt.len();
        let name = match requant {
            Requant::Keep => "decode_one/q4_1",
            Requant::Q8_0 => "decode_one/q8_0",
        };
        g.bench_function(name, |b| {
            b.iter(|| {
                src.truncate(n).unwrap();
                src.decode_one(504).unwrap()
            })
        });
        vocab = Some((m.vocab.info.clone(), Arc::new(m.vocab.bytes.clone())));
    }
    let (info, bytes) = vocab.unwrap();
    let params = SamplingParams {
        temperature: Some(0.8),
        top_p: Some(0.95),
        seed: Some(1),
        ..Default::default()
    };
    let (cfg, stop) = nextok_core::pipeline::presets::build(Preset::Reference, &params).unwrap();
    let sampler = Sampler::new_with_tokens(cfg, info, stop, Some(bytes)).unwrap();
    let mut ws = sampler.new_workspace();
    g.bench_function("sampler_step/unconstrained", |b| {
        b.iter(|| {
            let mut st = sampler.new_state(&[], 1).unwrap();
            sampler.step(&row, &mut st, &mut ws).unwrap()
        })
    });
    g.bench_function("sampler_step/trace", |b| {
        b.iter(|| {
            let mut st = sampler.new_state(&[], 1).unwrap();
            let (_, rec) = sampler
                .step_recorded(&row, &mut st, &mut ws, Draw::Stream, 8)
                .unwrap();
            serde_json::to_string(&rec).unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
