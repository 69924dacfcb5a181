//! `Sampler::step` and `Sampler::select` allocate nothing once the workspace exists and the
//! state has room for its history (`Sampler::reserve`): a counting global allocator checks every
//! step after a short warm-up, for the two benchmark pipelines at V = 128,256 and on the flat
//! rows at 128,256 and 262,144 (the large-nucleus top-p, and the band search alone), for the greedy,
//! categorical and Gumbel selectors, and for every kernel version this CPU supports.
//!
//! The rows are the sampler benchmark's (`nextok_testdata::rows`), and the two benchmark
//! pipelines are restated here as `nextok-bench` states them (`fixtures::Case`): the core's tests
//! do not depend on the benchmark crate.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use nextok_core::cpu::{self, Level};
use nextok_core::math::{self, ln_f64};
use nextok_core::{DecoderState, Draw, Preset, Sampler, SamplingParams, VocabInfo, Workspace};
use nextok_testdata::rows::{self, Row, FLAT_VOCAB_SIZES, TARGET_VOCAB};

/// Counts the allocations made by threads that asked to be counted.
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<usize> = const { Cell::new(0) };
}

fn note() {
    // `try_with`: the thread-locals may already be gone while a thread shuts down
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        }
    });
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made by `f` on this thread.
fn allocations(f: impl FnOnce()) -> usize {
    COUNT.with(|c| c.set(0));
    COUNTING.with(|on| on.set(true));
    f();
    COUNTING.with(|on| on.set(false));
    COUNT.with(|c| c.get())
}

/// The kernel versions to try: every one up to what this CPU supports.
fn levels() -> Vec<Level> {
    Level::ALL
        .into_iter()
        .filter(|&l| math::kernel_level(l) == l)
        .collect()
}

const WARM_UP: usize = 2;
const STEPS: usize = 12;

/// The vocabulary facts of a benchmark row: its special ids, the second one EOS.
fn vocab(row: &Row) -> VocabInfo {
    VocabInfo {
        vocab_size: row.vocab_size(),
        eos_token_ids: vec![row.eos()],
        special_token_ids: row.special.clone().collect(),
    }
}

/// The benchmark's two pipelines (`nextok_bench::fixtures::Case::ALL`): llama.cpp's default
/// chain, and top-p 0.95 alone with top-k off.
fn bench_cases() -> [(&'static str, Preset, SamplingParams); 2] {
    [
        (
            "llama.cpp default chain",
            Preset::LlamaCpp,
            SamplingParams {
                temperature: Some(0.8),
                top_k: Some(40),
                top_p: Some(0.95),
                min_p: Some(0.05),
                repetition_penalty: Some(1.1),
                presence_penalty: Some(0.5),
                frequency_penalty: Some(0.1),
                penalty_last_n: Some(64),
                ignore_eos: true,
                ..Default::default()
            },
        ),
        (
            "top-p 0.95 alone, top-k off",
            Preset::Reference,
            SamplingParams {
                top_p: Some(0.95),
                ignore_eos: true,
                ..Default::default()
            },
        ),
    ]
}

/// A benchmark workload, as the sampler benchmark builds it: the row's history as the prompt,
/// room for 65,536 tokens, and a second workspace with the large-nucleus top-p off.
struct Bench {
    logits: Vec<f32>,
    sampler: Sampler,
    state: DecoderState,
    ws: Workspace,
    ws_bands: Workspace,
}

impl Bench {
    fn new(preset: Preset, params: &SamplingParams, row: Row) -> Self {
        let sampler = Sampler::from_params(preset, params, vocab(&row)).unwrap();
        let mut state = sampler.new_state(&row.history, 42).unwrap();
        sampler.reserve(&mut state, 1 << 16);
        let ws = sampler.new_workspace();
        let mut ws_bands = sampler.new_workspace();
        ws_bands.set_large_nucleus_top_p(false);
        Bench {
            logits: row.logits,
            sampler,
            state,
            ws,
            ws_bands,
        }
    }

    fn step(&mut self) -> u32 {
        let (logits, state, ws) = (&self.logits, &mut self.state, &mut self.ws);
        self.sampler.step(logits, state, ws).unwrap().token
    }

    fn step_bands(&mut self) -> u32 {
        let (logits, state, ws) = (&self.logits, &mut self.state, &mut self.ws_bands);
        self.sampler.step(logits, state, ws).unwrap().token
    }

    fn select(&mut self) -> u32 {
        let (logits, state, ws) = (&self.logits, &self.state, &mut self.ws);
        self.sampler
            .select(logits, state, ws, Draw::Stream)
            .unwrap()
            .token
    }
}

fn check_bench(name: &str, mut b: Bench) {
    for _ in 0..WARM_UP {
        b.step();
        b.step_bands();
    }
    for _ in 0..STEPS {
        let n = allocations(|| {
            std::hint::black_box(b.step());
        });
        assert_eq!(n, 0, "{name}: step allocated");
        let n = allocations(|| {
            std::hint::black_box(b.select());
        });
        assert_eq!(n, 0, "{name}: select allocated");
        let n = allocations(|| {
            std::hint::black_box(b.step_bands());
        });
        assert_eq!(n, 0, "{name}: step with the band search alone allocated");
    }
}

fn check_params(name: &str, preset: Preset, params: SamplingParams) {
    let fx = rows::row(TARGET_VOCAB, 5, ln_f64);
    let vocab = vocab(&fx);
    let sampler = Sampler::from_params(preset, &params, vocab).unwrap();
    let mut state = sampler.new_state(&fx.history, 9).unwrap();
    sampler.reserve(&mut state, 1024);
    let mut ws = sampler.new_workspace();
    for _ in 0..WARM_UP {
        sampler.step(&fx.logits, &mut state, &mut ws).unwrap();
    }
    for i in 0..STEPS {
        let n = allocations(|| {
            std::hint::black_box(sampler.step(&fx.logits, &mut state, &mut ws).unwrap());
        });
        assert_eq!(n, 0, "{name}: step {i} allocated");
        let n = allocations(|| {
            std::hint::black_box(
                sampler
                    .select(&fx.logits, &state, &mut ws, Draw::Stream)
                    .unwrap(),
            );
        });
        assert_eq!(n, 0, "{name}: select {i} allocated");
        let n = allocations(|| {
            std::hint::black_box(
                sampler
                    .select(&fx.logits, &state, &mut ws, Draw::FixedU(0.5))
                    .unwrap(),
            );
        });
        assert_eq!(n, 0, "{name}: select with a fixed u, step {i}, allocated");
    }
}

fn selector_cases() -> Vec<(&'static str, Preset, SamplingParams)> {
    vec![
        (
            "greedy (reference, temperature 0)",
            Preset::Reference,
            SamplingParams {
                temperature: Some(0.0),
                ignore_eos: true,
                ..Default::default()
            },
        ),
        (
            "greedy (hf)",
            Preset::Hf,
            SamplingParams {
                temperature: Some(0.0),
                repetition_penalty: Some(1.2),
                ignore_eos: true,
                ..Default::default()
            },
        ),
        (
            "categorical over the whole vocabulary (reference, T = 0.9)",
            Preset::Reference,
            SamplingParams {
                temperature: Some(0.9),
                presence_penalty: Some(0.3),
                ignore_eos: true,
                ..Default::default()
            },
        ),
        (
            "categorical (hf: top-k 50 with ties, ascending top-p, typical-p)",
            Preset::Hf,
            SamplingParams {
                temperature: Some(0.7),
                top_p: Some(0.9),
                typical_p: Some(0.95),
                ignore_eos: true,
                ..Default::default()
            },
        ),
        (
            "categorical (reference: min-p over the whole vocabulary)",
            Preset::Reference,
            SamplingParams {
                min_p: Some(0.02),
                ignore_eos: true,
                ..Default::default()
            },
        ),
        (
            "gumbel (vllm: min-p, top-k, top-p)",
            Preset::Vllm,
            SamplingParams {
                temperature: Some(0.7),
                top_k: Some(100),
                top_p: Some(0.9),
                min_p: Some(0.01),
                frequency_penalty: Some(0.2),
                ignore_eos: true,
                ..Default::default()
            },
        ),
    ]
}

#[test]
fn step_and_select_do_not_allocate() {
    let levels = levels();
    let names: Vec<&str> = levels.iter().map(|&l| math::kernel_name(l)).collect();
    eprintln!("step_and_select_do_not_allocate: kernel levels tested: {names:?}");
    for level in levels {
        // the level is process-wide here: `with_max_level` serialises the tests that set it
        cpu::with_max_level(level, || {
            assert_eq!(math::kernel_level(Level::current()), level);
            for (name, preset, params) in bench_cases() {
                let row = rows::row(TARGET_VOCAB, TARGET_VOCAB as u64, ln_f64);
                check_bench(name, Bench::new(preset, &params, row));
                // flat rows: the dense top-p's large-nucleus path (nuclei of 14 and 53 thousand)
                for v in FLAT_VOCAB_SIZES {
                    let row = rows::flat_row(v, v as u64, ln_f64);
                    check_bench(name, Bench::new(preset, &params, row));
                }
            }
            for (name, preset, params) in selector_cases() {
                check_params(name, preset, params);
            }
        });
    }
}

#[test]
fn the_counter_sees_allocations() {
    let n = allocations(|| {
        std::hint::black_box(vec![1u8; 100]);
    });
    assert!(n >= 1);
}
