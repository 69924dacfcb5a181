//! Matrices kept in bands of sixteen interleaved rows (Q4_K: [`super::q4k`], Q8_0:
//! [`super::q80`], Q6_K: [`super::q6k`], Q4_0, Q4_1, Q5_0 and Q5_1: [`super::legacy`]) and the loop that runs them.
//!
//! In a band, each 64-byte unit holds four consecutive quants of each of sixteen rows, so that
//! every 32-bit lane of a 512-bit register belongs to one row: a multiply-add against four
//! activation bytes broadcast to all lanes advances sixteen rows' dot products at once, and the
//! float step of a block updates sixteen outputs in one register. The format modules give the
//! layout and a tile of one band × up to four activation rows; this module walks a range of
//! bands against the batch.

use super::{legacy, q4k, q6k, q80, Acts, Level, MatFormat, QMatrix};

/// Rows per band.
pub(super) const BAND: usize = 16;

/// Whether matrices of `format` are kept in bands.
pub(super) fn banded(format: MatFormat) -> bool {
    matches!(
        format,
        MatFormat::Q4_K
            | MatFormat::Q6_K
            | MatFormat::Q8_0
            | MatFormat::Q4_0
            | MatFormat::Q4_1
            | MatFormat::Q5_0
            | MatFormat::Q5_1
    )
}

/// `rows` rounded up to whole bands.
pub(super) fn padded_rows(rows: usize) -> usize {
    rows.div_ceil(BAND) * BAND
}

/// A band tile by the format's scalar `dot` (row `r`, activation row `b`): `res[bi][t]` for row
/// `16 · band + t` and activation row `b0 + bi`, `bi < n`; padding rows give zero.
pub(super) fn scalar_tile(
    w: &QMatrix,
    band: usize,
    n: usize,
    b0: usize,
    dot: impl Fn(usize, usize) -> f32,
) -> [[f32; BAND]; 4] {
    let mut res = [[0f32; BAND]; 4];
    for (bi, res) in res.iter_mut().enumerate().take(n) {
        for (t, v) in res.iter_mut().enumerate() {
            if BAND * band + t < w.rows {
                *v = dot(BAND * band + t, b0 + bi);
            }
        }
    }
    res
}

/// A band tile from its two halves of eight rows (the AVX2 kernels' register width).
#[cfg(target_arch = "x86_64")]
pub(super) fn join_halves(mut half: impl FnMut(usize) -> [[f32; 8]; 4]) -> [[f32; BAND]; 4] {
    let mut res = [[0f32; BAND]; 4];
    for h in 0..2 {
        let r = half(h);
        for (res, r) in res.iter_mut().zip(&r) {
            res[8 * h..8 * h + 8].copy_from_slice(r);
        }
    }
    res
}

/// The four bytes at `p` as one `i32`, for a broadcast to every lane.
///
/// # Safety
/// `p..p + 4` must be readable.
#[inline(always)]
pub(super) unsafe fn quad(p: *const u8) -> i32 {
    // SAFETY: the caller's guarantee; any alignment.
    unsafe { p.cast::<i32>().read_unaligned() }
}

/// Activation bytes a tile of bands meets at once (the rest of the batch waits, so that the
/// activations stay in the second-level cache while the bands stream past them).
const ACT_BLOCK_BYTES: usize = 256 * 1024;

/// Computes rows `r0..r1` (`r0` a multiple of [`BAND`]) of a banded matrix against every
/// activation row: the bands of the range meet blocks of activation rows, four at a time.
///
/// # Safety
/// As [`super::run_rows`]: `out` valid for `a.n · w.rows` writes, this range written by no one
/// else, `a` prepared for `w`'s format, `level` effective.
pub(super) unsafe fn run_rows(
    level: Level,
    w: &QMatrix,
    a: &Acts<'_>,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    assert!(
        r0.is_multiple_of(BAND) && r1 <= w.rows,
        "a range of whole bands"
    );
    let block = (ACT_BLOCK_BYTES / w.cols.max(1)).max(4) / 4 * 4;
    let mut a0 = 0;
    while a0 < a.n {
        let a1 = (a0 + block).min(a.n);
        for band in r0 / BAND..r1.div_ceil(BAND) {
            let mut b0 = a0;
            while b0 < a1 {
                let n = (a1 - b0).min(4);
                // SAFETY: the caller's guarantees.
                let res = unsafe {
                    match w.format {
                        MatFormat::Q4_K => q4k::tile(level, w, band, a, b0, n),
                        MatFormat::Q6_K => q6k::tile(level, w, band, a, b0, n),
                        MatFormat::Q8_0 => q80::tile(level, w, band, a, b0, n),
                        MatFormat::Q4_0 | MatFormat::Q4_1 | MatFormat::Q5_0 | MatFormat::Q5_1 => {
                            legacy::tile(level, w, band, a, b0, n)
                        }
                        f => unreachable!("{f:?} is not kept in bands"),
                    }
                };
                for (bi, res) in res.iter().take(n).enumerate() {
                    for (t, v) in res.iter().enumerate() {
                        let r = BAND * band + t;
                        if r >= r1 {
                            break;
                        }
                        // SAFETY: `b0 + bi < a.n`, `r < r1 ≤ w.rows`: in bounds, and only this
                        // task writes rows `r0..r1`.
                        unsafe { *out.add((b0 + bi) * w.rows + r) = *v };
                    }
                }
                b0 += 4;
            }
        }
        a0 = a1;
    }
}
