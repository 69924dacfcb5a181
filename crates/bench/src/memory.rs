//! What bounds decode far into a context: how fast this machine reads memory, and how many
//! bytes of the KV cache a decode step reads at a position.
//!
//! Between positions 50 and 1,800 only attention's work grows, and with it the cache it reads
//! (every layer's keys and values at every position it sees). `nextok bench engine` divides
//! those extra bytes by the extra time of a step to get the rate at which the step takes the
//! cache, and sets it beside the rate a plain read of memory reaches on the same machine
//! ([`read_gbs`]): the decode ratio of one machine can then be read against another's.

use std::time::Instant;

/// Bytes the plain read goes over: far more than any CPU's caches.
const READ_BYTES: usize = 256 << 20;

/// Passes of the plain read; the fastest counts.
const READ_PASSES: usize = 8;

/// GB/s (10⁹ bytes a second) that one thread, then `threads` threads reach reading a 256 MiB
/// buffer once, each its own contiguous share, summing it as 64-bit words (the fastest of eight
/// passes each; the buffer is written first, so its pages exist, and serves both).
pub(crate) fn read_gbs(threads: usize) -> [f64; 2] {
    let words = READ_BYTES / 8;
    let buf: Vec<u64> = (0..words as u64).collect();
    [1, threads.max(1)].map(|threads| {
        let share = words.div_ceil(threads);
        let mut best = f64::INFINITY;
        for _ in 0..READ_PASSES {
            let t = Instant::now();
            let total = std::thread::scope(|s| {
                let parts: Vec<_> = buf
                    .chunks(share)
                    .map(|part| s.spawn(move || sum_words(part)))
                    .collect();
                parts
                    .into_iter()
                    .map(|p| p.join().unwrap_or_default())
                    .fold(0u64, u64::wrapping_add)
            });
            std::hint::black_box(total);
            best = best.min(t.elapsed().as_secs_f64());
        }
        READ_BYTES as f64 / best / 1e9
    })
}

/// The wrapping sum of `x`, sixteen independent sums at a time (so the loop is bound by the
/// reads, not by one chain of adds). On x86-64 the sums are SSE2 registers: written as plain
/// Rust, the compiler turns the loop over blocks into gathers, several times slower than the
/// memory.
fn sum_words(x: &[u64]) -> u64 {
    let (blocks, tail) = x.as_chunks::<16>();
    let mut acc = [0u64; 16];
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of x86-64; load `j` of a block reads its bytes `16j..16j + 16`, and
    // store `j` writes `acc[2j..2j + 2]`
    unsafe {
        use std::arch::x86_64::{
            __m128i, _mm_add_epi64, _mm_loadu_si128, _mm_setzero_si128, _mm_storeu_si128,
        };
        let mut v = [_mm_setzero_si128(); 8];
        for b in blocks {
            let p = b.as_ptr().cast::<__m128i>();
            for (j, v) in v.iter_mut().enumerate() {
                *v = _mm_add_epi64(*v, _mm_loadu_si128(p.add(j)));
            }
        }
        for (j, v) in v.iter().enumerate() {
            _mm_storeu_si128(acc.as_mut_ptr().add(2 * j).cast(), *v);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    for b in blocks {
        acc = std::array::from_fn(|i| acc[i].wrapping_add(b[i]));
    }
    let tail = tail.iter().fold(0u64, |a, &v| a.wrapping_add(v));
    acc.iter().fold(tail, |a, &v| a.wrapping_add(v))
}

/// Mean bytes of the cache each of the `steps` decode steps from position `pos` on reads: the
/// step at position `p` reads, in every layer, the keys and values of the positions the layer's
/// sliding window (`windows`, one per layer; `None`: all) lets it see, `min(p + 1, window)` of
/// them, at `bytes_per_position / layers` bytes each.
pub(crate) fn cache_bytes_per_step(
    windows: &[Option<usize>],
    bytes_per_position: usize,
    pos: usize,
    steps: usize,
) -> f64 {
    let per_layer = bytes_per_position as f64 / windows.len().max(1) as f64;
    let steps = steps.max(1);
    let positions: usize = (pos..pos + steps)
        .map(|p| {
            windows
                .iter()
                .map(|w| w.map_or(p + 1, |w| (p + 1).min(w)))
                .sum::<usize>()
        })
        .sum();
    positions as f64 * per_layer / steps as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sum_covers_every_word_and_the_tail() {
        let x: Vec<u64> = (1..=35).collect();
        assert_eq!(sum_words(&x), 35 * 36 / 2);
        assert_eq!(sum_words(&[u64::MAX, 2]), 1);
        assert_eq!(sum_words(&[]), 0);
    }

    #[test]
    fn a_step_reads_the_positions_each_layer_sees() {
        // two layers of 10 bytes a position each: the step at position 9 reads 10 positions in
        // both; at 10, 11 in the full layer and 4 in the windowed one
        let w = [None, Some(4)];
        assert_eq!(cache_bytes_per_step(&[None, None], 20, 9, 1), 200.0);
        assert_eq!(cache_bytes_per_step(&w, 20, 10, 1), 150.0);
        // steps at positions 10 and 11: (11 + 4 + 12 + 4) / 2 positions of 10 bytes
        assert_eq!(cache_bytes_per_step(&w, 20, 10, 2), 155.0);
    }
}
