//! Matrices kept in bands of sixteen interleaved rows (Q4_K: [`super::q4k`], Q8_0:
//! [`super::q80`], Q6_K: [`super::q6k`], Q4_0, Q4_1, Q5_0 and Q5_1: [`super::legacy`]) and the loop that runs them.
//!
//! In a band, each 64-byte unit holds four consecutive quants of each of sixteen rows, so that
//! every 32-bit lane of a 512-bit register belongs to one row: a multiply-add against four
//! activation bytes broadcast to all lanes advances sixteen rows' dot products at once, and the
//! float step of a block updates sixteen outputs in one register. The format modules give the
//! layout and a tile of one band × up to [`TILE`] activation rows; this module walks a range of
//! bands against the batch.

use super::{legacy, q4k, q6k, q80, Acts, Level, MatFormat, QMatrix};

/// Rows per band.
pub(super) const BAND: usize = 16;

/// Activation rows one tile takes at most. At 512 bits a tile of eight keeps its sums in
/// registers for the formats whose blocks unpack into few (the nibble formats, Q8_0): a
/// verification pass of five to eight rows then reads the weights once, not twice. Kernels
/// of at most four rows (AVX2's sixteen registers, the K-quants) make their tiles of eight
/// from two of four ([`in_fours`]). Which rows share a tile never changes an output's bits.
pub(super) const TILE: usize = 8;

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

/// What a banded format gives the band loop: its tile of one band × up to [`TILE`] activation
/// rows at each x86 level, and its scalar dot of one row with one activation row (the scalar
/// level's tile, and the reference every level equals bit for bit). A new banded format is a
/// module with a `KERNELS` of these and one line in [`kernels_of`].
pub(super) struct BandKernels {
    /// AVX-512 with VNNI.
    #[cfg(target_arch = "x86_64")]
    pub(super) vnni: Tile,
    /// AVX-512 BW without VNNI (the AVX2 tile where the format has no other).
    #[cfg(target_arch = "x86_64")]
    pub(super) bw: Tile,
    /// AVX2 with FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    pub(super) avx2: Tile,
    /// Row `r` of the matrix with activation row `b`.
    pub(super) dot: fn(&QMatrix, usize, &Acts<'_>, usize) -> f32,
}

/// A tile: the dots of band `band`'s sixteen rows with activation rows `b0..b0 + n`
/// (`1 ≤ n ≤ TILE`), `res[bi][t]` for row `16 · band + t` (padding rows give zero).
///
/// # Safety
/// The tile's level must be effective on this CPU, the activations prepared for the
/// matrix's format, `band` a band of the matrix.
#[cfg(target_arch = "x86_64")]
pub(super) type Tile = unsafe fn(&QMatrix, usize, &Acts<'_>, usize, usize) -> [[f32; BAND]; TILE];

/// The kernels of a banded format.
fn kernels_of(format: MatFormat) -> &'static BandKernels {
    match format {
        MatFormat::Q4_K => &q4k::KERNELS,
        MatFormat::Q6_K => &q6k::KERNELS,
        MatFormat::Q8_0 => &q80::KERNELS,
        MatFormat::Q4_0 | MatFormat::Q4_1 | MatFormat::Q5_0 | MatFormat::Q5_1 => &legacy::KERNELS,
        f => unreachable!("{f:?} is not kept in bands"),
    }
}

/// Band `band` × activation rows `b0..b0 + n` with `k` at `level`.
///
/// # Safety
/// `level` must be effective on this CPU, `a` prepared for `w`'s format, `band` a band of `w`.
#[inline]
unsafe fn tile(
    k: &BandKernels,
    level: Level,
    w: &QMatrix,
    band: usize,
    a: &Acts<'_>,
    b0: usize,
    n: usize,
) -> [[f32; BAND]; TILE] {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the caller's level is effective, which is what each tile needs.
        match level {
            Level::Avx512Vnni => return unsafe { (k.vnni)(w, band, a, b0, n) },
            Level::Avx512 => return unsafe { (k.bw)(w, band, a, b0, n) },
            Level::Avx2 => return unsafe { (k.avx2)(w, band, a, b0, n) },
            Level::Scalar => {}
        }
    }
    let _ = level;
    scalar_tile(w, band, n, b0, |r, b| (k.dot)(w, r, a, b))
}

/// A band tile by the format's scalar `dot` (row `r`, activation row `b`): `res[bi][t]` for row
/// `16 · band + t` and activation row `b0 + bi`, `bi < n`; padding rows give zero.
fn scalar_tile(
    w: &QMatrix,
    band: usize,
    n: usize,
    b0: usize,
    dot: impl Fn(usize, usize) -> f32,
) -> [[f32; BAND]; TILE] {
    let mut res = [[0f32; BAND]; TILE];
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

/// `match $n` over the row counts `$k` (and `$last` for any other), each arm running `$call`
/// with `$N` bound to its count as a constant.
#[cfg(target_arch = "x86_64")]
macro_rules! rows_of {
    ($n:expr, $N:ident => $call:expr; $($k:literal)*; $last:literal) => {
        match $n {
            $($k => {
                const $N: usize = $k;
                $call
            })*
            _ => {
                const $N: usize = $last;
                $call
            }
        }
    };
}

/// Runs `$call` with `$N` bound, as a constant, to the number of activation rows `$n`
/// (`1..=TILE`; more count as `TILE`): the one place a tile's row count becomes a kernel's
/// const parameter.
#[cfg(target_arch = "x86_64")]
macro_rules! rows {
    ($n:expr, $N:ident => $call:expr) => {
        $crate::kernels::band::rows_of!($n, $N => $call; 1 2 3 4 5 6 7; 8)
    };
}

/// [`rows!`] for kernels of at most four activation rows (more count as four; see
/// [`in_fours`]).
#[cfg(target_arch = "x86_64")]
macro_rules! rows4 {
    ($n:expr, $N:ident => $call:expr) => {
        $crate::kernels::band::rows_of!($n, $N => $call; 1 2 3; 4)
    };
}

#[cfg(target_arch = "x86_64")]
pub(super) use {rows, rows4, rows_of};

/// A tile of `n ≤ TILE` activation rows from a kernel of at most four: `four(o, m)` gives
/// activation rows `o..o + m` of the tile (`m ≤ 4`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn in_fours<const R: usize>(
    n: usize,
    mut four: impl FnMut(usize, usize) -> [[f32; BAND]; R],
) -> [[f32; BAND]; TILE] {
    let mut res = [[0f32; BAND]; TILE];
    let mut o = 0;
    while o < n {
        let m = (n - o).min(4);
        let r = four(o, m);
        res[o..o + m].copy_from_slice(&r[..m]);
        o += 4;
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
/// activation row: the bands of the range meet blocks of activation rows, [`TILE`] at a time.
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
    let k = kernels_of(w.format);
    let block = (ACT_BLOCK_BYTES / w.cols.max(1)).max(TILE) / TILE * TILE;
    let mut a0 = 0;
    while a0 < a.n {
        let a1 = (a0 + block).min(a.n);
        for band in r0 / BAND..r1.div_ceil(BAND) {
            let mut b0 = a0;
            while b0 < a1 {
                let n = (a1 - b0).min(TILE);
                // SAFETY: the caller's guarantees.
                let res = unsafe { tile(k, level, w, band, a, b0, n) };
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
                b0 += TILE;
            }
        }
        a0 = a1;
    }
}
