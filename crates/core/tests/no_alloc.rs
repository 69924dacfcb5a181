//! `Sampler::step` and `Sampler::select` allocate nothing once the workspace exists and the
//! state has room for its history (`Sampler::reserve`): a counting global allocator checks every
//! step after a short warm-up, for the two benchmark pipelines at V = 128,256 and on the flat
//! rows at 128,256 and 262,144 (the large-nucleus top-p, and the band search alone), for the greedy,
//! categorical and Gumbel selectors, and for every kernel version this CPU supports.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use nextok_bench::fixtures::{fixture, Case, StepBench, FLAT_VOCAB_SIZES, TARGET_VOCAB};
use nextok_core::cpu::{self, Level};
use nextok_core::math;
use nextok_core::{Draw, Preset, Sampler, SamplingParams};

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

fn check_bench_case(case: Case) {
    check_bench(case, StepBench::new(case, TARGET_VOCAB));
}

fn check_bench(case: Case, mut b: StepBench) {
    for _ in 0..WARM_UP {
        b.nextok();
        b.nextok_bands();
    }
    for _ in 0..STEPS {
        let n = allocations(|| {
            std::hint::black_box(b.nextok());
        });
        assert_eq!(n, 0, "{case:?}: step allocated");
        let n = allocations(|| {
            std::hint::black_box(b.nextok_select());
        });
        assert_eq!(n, 0, "{case:?}: select allocated");
        let n = allocations(|| {
            std::hint::black_box(b.nextok_bands());
        });
        assert_eq!(n, 0, "{case:?}: step with the band search alone allocated");
    }
}

fn check_params(name: &str, preset: Preset, params: SamplingParams) {
    let fx = fixture(TARGET_VOCAB, 5);
    let sampler = Sampler::from_params(preset, &params, fx.vocab.clone()).unwrap();
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
            for case in Case::ALL {
                check_bench_case(case);
                // flat rows: the dense top-p's large-nucleus path (nuclei of 14 and 53 thousand)
                for v in FLAT_VOCAB_SIZES {
                    check_bench(case, StepBench::flat(case, v));
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
