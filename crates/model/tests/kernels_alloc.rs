//! `kernels::matmul` and `Activations::quantize` allocate nothing once the activation buffers are
//! big enough (every activation format: Q8_1, Q8_K, F16, BF16): counted with a global allocator,
//! single-threaded (inside a one-thread rayon pool) and, after a warm-up, on a two-thread pool.
//! On two threads, rayon's own bookkeeping (a worker's deque growing the first time it steals a
//! deeper job, which depends on timing on a loaded machine) may allocate once; an allocation of
//! the kernels would recur in every pass, so the test counts three passes after the warm-up and
//! asserts that one of them is zero.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use nextok_model::kernels::{matmul, Activations, MatFormat, QMatrix};

/// Counts allocations made while `COUNTING` is set.
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn matrix(format: MatFormat, rows: usize, cols: usize) -> QMatrix {
    let block = format.block_bytes();
    let bytes: Vec<u8> = (0..rows * cols / format.block_values() * block)
        .map(|i| match i % block {
            // small positive f16 scales of Q4_1 / Q8_0; values of 0..0x3f elsewhere (finite
            // whatever they encode)
            1 | 3 if matches!(format, MatFormat::Q4_1 | MatFormat::Q8_0) => 0x1c,
            _ => (i * 37 % 251) as u8 & 0x3f,
        })
        .collect();
    QMatrix::from_ggml(format, rows, cols, &bytes).unwrap()
}

/// Runs every batch size twice to size the buffers, then three more times, counting each pass.
fn count(threads: usize) -> Vec<usize> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let cols = 768;
    let mats = [
        matrix(MatFormat::Q4_1, 300, cols),
        matrix(MatFormat::Q8_0, 1000, cols),
        matrix(MatFormat::Q4_K, 200, cols),
        matrix(MatFormat::Q6_K, 100, cols),
        matrix(MatFormat::Q5_0, 100, cols),
        matrix(MatFormat::F16, 50, cols),
        matrix(MatFormat::BF16, 50, cols),
    ];
    let x: Vec<f32> = (0..70 * cols)
        .map(|i| (i % 97) as f32 / 50.0 - 1.0)
        .collect();
    let mut out = vec![0f32; 70 * 1000];
    let mut a = Activations::new();
    let mut counts = Vec::new();
    pool.install(|| {
        for pass in 0..5 {
            let counted = pass >= 2;
            if counted {
                ALLOCS.store(0, Ordering::SeqCst);
                COUNTING.store(true, Ordering::SeqCst);
            }
            for n in [70, 1, 3, 4, 9, 64] {
                a.quantize(&x[..n * cols], n, cols).unwrap();
                for w in &mats {
                    matmul(w, &a, &mut out[..n * w.rows()]).unwrap();
                }
            }
            COUNTING.store(false, Ordering::SeqCst);
            if counted {
                counts.push(ALLOCS.load(Ordering::SeqCst));
            }
        }
    });
    counts
}

#[test]
fn no_allocation_per_call() {
    // one thread: nothing but the kernels runs, so every pass must be zero
    let one = count(1);
    assert_eq!(one, [0, 0, 0], "allocations per pass on a one-thread pool");
    let two = count(2);
    assert!(
        two.contains(&0),
        "allocations per pass on a two-thread pool: {two:?} (the kernels allocate in every pass)"
    );
}
