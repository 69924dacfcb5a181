//! The AVX2 kernels, written with intrinsics (the compiler does not find the packing
//! permutations on its own). Every function here requires AVX2, BMI1 and POPCNT: the dispatch in
//! [`super`] calls them only at [`simd::AVX2`](super::simd::AVX2) or above.

use std::arch::x86_64::*;

use super::{Band, BLOCK};
use crate::support::Cand;

/// For every 8-bit mask, the positions of its set bits in order (then zeros): the permutation
/// that packs the kept lanes of an 8-lane vector to its front.
static COMPRESS8: [[u32; 8]; 256] = compress8();

const fn compress8() -> [[u32; 8]; 256] {
    let mut t = [[0u32; 8]; 256];
    let mut mask = 0;
    while mask < 256 {
        let (mut j, mut k) = (0, 0);
        while j < 8 {
            if (mask >> j) & 1 == 1 {
                t[mask][k] = j as u32;
                k += 1;
            }
            j += 1;
        }
        mask += 1;
    }
    t
}

/// [`super::collect_band`] on 8 lanes: the kept values of each vector are packed to its front
/// with a permutation from [`COMPRESS8`] and stored with their ids as whole `Cand` vectors, the
/// length advancing by the number kept (no branch on the values but one per block). `TIE`:
/// whether `band` excludes anything by `tie_z`.
#[target_feature(enable = "avx2,bmi1,popcnt")]
pub(super) fn collect_band<const TIE: bool>(
    buf: &[f32],
    bmax: &[f32],
    band: Band,
    out: &mut Vec<Cand>,
) {
    let nblocks = buf.len() / BLOCK;
    let lo = _mm256_set1_ps(band.lo);
    let hi = _mm256_set1_ps(band.hi);
    let tz = _mm256_set1_ps(band.tie_z);
    // ids stay below 2^31 (`u32` ids of a vocabulary held in memory), so signed compares do
    let tid = _mm256_set1_epi32(band.tie_id.min(i32::MAX as u32) as i32);
    let iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (b, block) in buf.chunks_exact(BLOCK).enumerate() {
        if bmax.get(b).is_some_and(|&x| x < band.lo) {
            continue;
        }
        let base = b * BLOCK;
        let p = block.as_ptr();
        let mut x = [_mm256_setzero_ps(); 8];
        for (k, xk) in x.iter_mut().enumerate() {
            // SAFETY: `block` holds `BLOCK` = 64 values: the load reads `block[8 k..8 k + 8]`.
            *xk = unsafe { _mm256_loadu_ps(p.add(8 * k)) };
        }
        let mut masks = [0u32; 8];
        let mut any = 0u32;
        for (k, mk) in masks.iter_mut().enumerate() {
            let mut keep = _mm256_and_ps(
                _mm256_cmp_ps::<_CMP_GE_OQ>(x[k], lo),
                _mm256_cmp_ps::<_CMP_LT_OQ>(x[k], hi),
            );
            if TIE {
                let ids = _mm256_add_epi32(iota, _mm256_set1_epi32((base + 8 * k) as i32));
                let tie = _mm256_and_ps(
                    _mm256_cmp_ps::<_CMP_EQ_OQ>(x[k], tz),
                    _mm256_castsi256_ps(_mm256_cmpgt_epi32(ids, tid)),
                );
                keep = _mm256_andnot_ps(tie, keep);
            }
            *mk = _mm256_movemask_ps(keep) as u32;
            any |= *mk;
        }
        if any == 0 {
            continue;
        }
        if out.capacity() - out.len() < BLOCK + 8 {
            // no room for whole stores (only near a full buffer): one at a time
            for (k, &mk) in masks.iter().enumerate() {
                let mut bits = mk;
                while bits != 0 {
                    let j = 8 * k + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    out.push(Cand {
                        id: (base + j) as u32,
                        z: block[j],
                    });
                }
            }
            continue;
        }
        let old = out.len();
        let mut len = old;
        let q = out.as_mut_ptr().cast::<i32>();
        for (k, &mk) in masks.iter().enumerate() {
            let xi = _mm256_castps_si256(x[k]);
            let ids = _mm256_add_epi32(iota, _mm256_set1_epi32((base + 8 * k) as i32));
            // SAFETY: every entry of `COMPRESS8` is 8 `u32`s: the load reads one entry.
            let perm = unsafe { _mm256_loadu_si256(COMPRESS8[mk as usize].as_ptr().cast()) };
            let ci = _mm256_permutevar8x32_epi32(ids, perm);
            let cz = _mm256_permutevar8x32_epi32(xi, perm);
            let l = _mm256_unpacklo_epi32(ci, cz); // i0 z0 i1 z1 | i4 z4 i5 z5
            let h = _mm256_unpackhi_epi32(ci, cz); // i2 z2 i3 z3 | i6 z6 i7 z7
                                                   // SAFETY: `len <= old + 8 k`, and `old + 64 + 8 <= out.capacity()` (checked above):
                                                   // the two stores write the 8 `Cand`s (16 `i32`s) from `len` within the allocation.
            unsafe {
                let at = q.add(2 * len);
                _mm256_storeu_si256(at.cast(), _mm256_permute2x128_si256::<0x20>(l, h));
                _mm256_storeu_si256(at.add(8).cast(), _mm256_permute2x128_si256::<0x31>(l, h));
            }
            len += mk.count_ones() as usize;
        }
        // SAFETY: `len <= old + 64 <= out.capacity()`; the first `len` were written as whole
        // `Cand { id, z }` values (`repr(C)`: `id`, `z`; any bits are valid for both).
        unsafe { out.set_len(len) };
    }
    for (i, &z) in buf.iter().enumerate().skip(nblocks * BLOCK) {
        if band.keeps(i, z) {
            out.push(Cand { id: i as u32, z });
        }
    }
}
