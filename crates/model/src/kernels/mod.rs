//! Quantised matrix × batch-of-activations kernels.
//!
//! [`matmul`] multiplies a quantised weight matrix ([`QMatrix`], GGML Q4_1 or Q8_0 blocks, one
//! row per output feature) by a batch of activation rows quantised to GGML Q8_1 blocks
//! ([`Activations`]). Unlike candle's `k_quants::matmul`, which loops over activation rows outside
//! and re-reads the whole weight matrix once per row, every weight block is loaded once per group
//! of four activation rows, and no memory is allocated per call. Work is split over weight rows on
//! rayon's current pool.
//!
//! # Exact semantics
//!
//! Every output element is computed by the same sequence of floating-point operations whatever
//! the batch size, whichever tile or remainder path computes it and whichever thread runs it, and
//! the scalar path ([`Level::Scalar`]) gives the same bits as the AVX2 path ([`Level::Avx2`]). The
//! sequence is the one of llama.cpp's AVX2 `ggml_vec_dot_q8_0_q8_0` / `ggml_vec_dot_q4_1_q8_1`:
//!
//! * for each block `k` in order `0..cols/32`, eight exact integer lane sums
//!   `p_j = Σ_{i=4j}^{4j+3} w_i · a_i` (`j = 0..8`), with the block's 32 elements in order
//!   (for Q4_1, element `i < 16` is the low nibble of byte `i` and element `i ≥ 16` the high
//!   nibble of byte `i − 16`, GGML's layout);
//! * `acc_j = fma(f32(d_w) · f32(d_a), p_j as f32, acc_j)`: the scale product rounded to `f32`
//!   first, then one fused multiply-add;
//! * Q4_1 only: `summ = fma(f32(m_w), f32(s_a), summ)`, one fused multiply-add per block in order;
//! * result = `((acc_4 + acc_0) + (acc_6 + acc_2)) + ((acc_5 + acc_1) + (acc_7 + acc_3))`
//!   (llama.cpp's `hsum_float_8`: upper half + lower half, then the two pairs, then the last
//!   pair), plus `summ` for Q4_1 (nothing is added for Q8_0, so `-0.0` stays `-0.0`).
//!
//! All `f16` → `f32` conversions are exact (F16C or the `half` crate). `|p_j| ≤ 4 · 128 · 127`
//! is below 2^24, so `p_j as f32` is exact too.
//!
//! # Layout and tiling
//!
//! Weight quants and scales are repacked into separate planes (see [`QMatrix`]); activation
//! quants, scales and block sums into [`Activations`] (`s` stored transposed, so four activation
//! rows' sums load at once). Each task takes a range of weight rows; within it, tiles of rows
//! small enough to stay in L1 meet each group of four activation rows, and a register tile of
//! one to four weight rows × one to four activation rows keeps its accumulators in registers.
//! Scale products are computed eight blocks at a time. `benches/matmul.rs` compares against
//! candle's `QMatMul`.
//!
//! Non-finite activations give deterministic but meaningless results; non-finite weight scales
//! propagate to the outputs they touch (a NaN's payload bits are unspecified).

pub mod attn;
mod avx2;
mod scalar;
#[cfg(test)]
mod tests;

use candle_core::quantized::{GgmlDType, QTensor};
use half::f16;

/// Number of values in one quantisation block (all formats here).
pub const BLOCK: usize = 32;

/// Bytes of one GGML Q4_1 block: `f16 d`, `f16 m`, 16 bytes of nibbles.
pub const Q4_1_BLOCK_BYTES: usize = 20;
/// Bytes of one GGML Q8_0 block: `f16 d`, 32 `i8`.
pub const Q8_0_BLOCK_BYTES: usize = 34;

/// What is wrong with a kernel's input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelError {
    /// A dimension is not usable (not a multiple of 32, overflow, not a matrix).
    Shape(String),
    /// A buffer has the wrong number of elements or bytes.
    Length {
        /// Which buffer.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The length the shape asks for.
        expected: usize,
    },
    /// The weight format cannot be handled.
    Format(String),
    /// Two operands do not fit together.
    Mismatch(String),
}

impl std::fmt::Display for KernelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KernelError::Shape(s) => write!(f, "bad shape: {s}"),
            KernelError::Length {
                what,
                got,
                expected,
            } => write!(f, "bad length: {what} has {got}, expected {expected}"),
            KernelError::Format(s) => write!(f, "bad format: {s}"),
            KernelError::Mismatch(s) => write!(f, "shape mismatch: {s}"),
        }
    }
}

impl std::error::Error for KernelError {}

/// Storage format of a [`QMatrix`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatFormat {
    /// GGML Q4_1: per 32 values `x = q · d + m`, `q` in `0..16`.
    Q4_1,
    /// GGML Q8_0: per 32 values `x = q · d`, `q` an `i8`.
    Q8_0,
}

/// Which implementation computes the kernels. All give the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Portable scalar code (the reference).
    Scalar,
    /// AVX2 + FMA + F16C. Falls back to [`Level::Scalar`] when the CPU lacks them.
    Avx2,
}

impl Level {
    /// The best level this CPU supports.
    pub fn detect() -> Level {
        if avx2::available() {
            Level::Avx2
        } else {
            Level::Scalar
        }
    }

    /// `self`, or [`Level::Scalar`] when the CPU cannot run it.
    fn effective(self) -> Level {
        match self {
            Level::Avx2 if avx2::available() => Level::Avx2,
            _ => Level::Scalar,
        }
    }
}

/// 32 bytes aligned to 32: one Q8 block's quants, or two Q4_1 blocks' nibbles.
#[repr(C, align(32))]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct Chunk(pub(crate) [u8; 32]);

/// `n` rounded up to a multiple of 8 (the stride of the per-block scale planes, so that eight
/// scales can always be loaded at once).
fn pad8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// A quantised weight matrix, repacked for the kernels.
///
/// `rows` are output features, `cols` input features (`cols % 32 == 0`). Internally the quants
/// and the `f16` scales live in separate planes: Q8_0 keeps one 32-byte chunk per block; Q4_1
/// packs blocks `2p` and `2p + 1` into one chunk (byte `i` holds element `i` of block `2p` in its
/// low nibble and element `i` of block `2p + 1` in its high nibble), so one load and two masks
/// unpack two blocks in element order.
#[derive(Clone, Debug)]
pub struct QMatrix {
    format: MatFormat,
    rows: usize,
    cols: usize,
    /// Blocks per row.
    nb: usize,
    /// Stride of the scale planes (`nb` rounded up to 8, zero padded).
    nbp: usize,
    /// Chunks per row in `qs`.
    qchunks: usize,
    qs: Vec<Chunk>,
    /// `f16` bits of the block scales, `rows × nbp`.
    d: Vec<u16>,
    /// Q4_1: `f16` bits of the block minimums, `rows × nbp`; Q8_0: empty.
    m: Vec<u16>,
}

fn check_cols(rows: usize, cols: usize) -> Result<usize, KernelError> {
    if !cols.is_multiple_of(BLOCK) {
        return Err(KernelError::Shape(format!(
            "cols = {cols} is not a multiple of {BLOCK}"
        )));
    }
    rows.checked_mul(cols)
        .ok_or_else(|| KernelError::Shape(format!("{rows} × {cols} overflows")))
}

fn rd16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

impl QMatrix {
    fn empty(format: MatFormat, rows: usize, cols: usize) -> QMatrix {
        let nb = cols / BLOCK;
        let nbp = pad8(nb);
        let qchunks = match format {
            MatFormat::Q4_1 => nb.div_ceil(2),
            MatFormat::Q8_0 => nb,
        };
        QMatrix {
            format,
            rows,
            cols,
            nb,
            nbp,
            qchunks,
            qs: vec![Chunk::default(); rows * qchunks],
            d: vec![0; rows * nbp],
            m: match format {
                MatFormat::Q4_1 => vec![0; rows * nbp],
                MatFormat::Q8_0 => Vec::new(),
            },
        }
    }

    /// From raw GGML block bytes (Q4_1 block: `f16 d`, `f16 m`, 16 bytes of nibbles = 20 bytes;
    /// Q8_0 block: `f16 d`, 32 `i8` = 34 bytes), row-major. Errors when `cols` is not a multiple
    /// of 32 or `bytes` has not exactly `rows · cols / 32` blocks.
    pub fn from_ggml(
        format: MatFormat,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<QMatrix, KernelError> {
        let n = check_cols(rows, cols)?;
        let bsize = match format {
            MatFormat::Q4_1 => Q4_1_BLOCK_BYTES,
            MatFormat::Q8_0 => Q8_0_BLOCK_BYTES,
        };
        let expected = (n / BLOCK)
            .checked_mul(bsize)
            .ok_or_else(|| KernelError::Shape(format!("{rows} × {cols} overflows")))?;
        if bytes.len() != expected {
            return Err(KernelError::Length {
                what: "weight bytes",
                got: bytes.len(),
                expected,
            });
        }
        let mut w = QMatrix::empty(format, rows, cols);
        let nb = w.nb;
        for r in 0..rows {
            for k in 0..nb {
                let blk = &bytes[(r * nb + k) * bsize..(r * nb + k + 1) * bsize];
                w.d[r * w.nbp + k] = rd16(blk, 0);
                match format {
                    MatFormat::Q8_0 => {
                        w.qs[r * w.qchunks + k].0.copy_from_slice(&blk[2..34]);
                    }
                    MatFormat::Q4_1 => {
                        w.m[r * w.nbp + k] = rd16(blk, 2);
                        let nib = &blk[4..20];
                        let chunk = &mut w.qs[r * w.qchunks + k / 2].0;
                        let shift = if k.is_multiple_of(2) { 0 } else { 4 };
                        for i in 0..16 {
                            chunk[i] |= (nib[i] & 0x0F) << shift;
                            chunk[i + 16] |= (nib[i] >> 4) << shift;
                        }
                    }
                }
            }
        }
        Ok(w)
    }

    /// From a candle `QTensor` of shape `[rows, cols]`. Q4_1 and Q8_0 tensors are taken as they
    /// are; every other format is dequantized to `f32` and re-quantised to Q8_0 with
    /// [`QMatrix::quantize_q8_0`] (so the result is not the file's exact weights).
    pub fn from_qtensor(t: &QTensor) -> Result<QMatrix, KernelError> {
        let (rows, cols) = match t.shape().dims() {
            &[rows, cols] => (rows, cols),
            d => {
                return Err(KernelError::Shape(format!(
                    "expected a matrix [rows, cols], got {d:?}"
                )))
            }
        };
        let candle = |e: candle_core::Error| KernelError::Format(e.to_string());
        match t.dtype() {
            GgmlDType::Q4_1 => {
                QMatrix::from_ggml(MatFormat::Q4_1, rows, cols, &t.data().map_err(candle)?)
            }
            GgmlDType::Q8_0 => {
                QMatrix::from_ggml(MatFormat::Q8_0, rows, cols, &t.data().map_err(candle)?)
            }
            _ => {
                check_cols(rows, cols)?;
                let f = t
                    .dequantize(&candle_core::Device::Cpu)
                    .and_then(|f| f.flatten_all())
                    .and_then(|f| f.to_vec1::<f32>())
                    .map_err(candle)?;
                QMatrix::quantize_q8_0(rows, cols, &f)
            }
        }
    }

    /// Quantises a row-major `f32` matrix to Q8_0 with GGML's rule (`quantize_row_q8_0_ref`):
    /// per 32 values `d = amax / 127`, `q = round(x / d)` (half away from zero) computed as
    /// `x · (1/d)`, `d` stored as `f16`. Gives the same blocks as candle's
    /// `QTensor::quantize(.., Q8_0)`.
    pub fn quantize_q8_0(rows: usize, cols: usize, data: &[f32]) -> Result<QMatrix, KernelError> {
        let n = check_cols(rows, cols)?;
        if data.len() != n {
            return Err(KernelError::Length {
                what: "matrix values",
                got: data.len(),
                expected: n,
            });
        }
        let mut w = QMatrix::empty(MatFormat::Q8_0, rows, cols);
        let nb = w.nb;
        for r in 0..rows {
            for k in 0..nb {
                let x = &data[(r * nb + k) * BLOCK..(r * nb + k + 1) * BLOCK];
                let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                w.d[r * w.nbp + k] = f16::from_f32(d).to_bits();
                let q = &mut w.qs[r * w.qchunks + k].0;
                for (q, &v) in q.iter_mut().zip(x) {
                    *q = (v * id).round() as i8 as u8;
                }
            }
        }
        Ok(w)
    }

    /// Storage format.
    pub fn format(&self) -> MatFormat {
        self.format
    }

    /// Number of rows (output features).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns (input features).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Quant `i` (0..32) of block `k` of row `r`: the nibble for Q4_1, the `i8` for Q8_0.
    #[inline]
    fn quant(&self, r: usize, k: usize, i: usize) -> i32 {
        match self.format {
            MatFormat::Q8_0 => self.qs[r * self.qchunks + k].0[i] as i8 as i32,
            MatFormat::Q4_1 => {
                let b = self.qs[r * self.qchunks + k / 2].0[i];
                (if k.is_multiple_of(2) {
                    b & 0x0F
                } else {
                    b >> 4
                }) as i32
            }
        }
    }

    /// Writes row `r` dequantized (`q · d + m` for Q4_1, `q · d` for Q8_0, as GGML and candle
    /// do) into `out` (`out.len() == cols`).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<(), KernelError> {
        if r >= self.rows {
            return Err(KernelError::Shape(format!(
                "row {r} of a matrix with {} rows",
                self.rows
            )));
        }
        if out.len() != self.cols {
            return Err(KernelError::Length {
                what: "output row",
                got: out.len(),
                expected: self.cols,
            });
        }
        for k in 0..self.nb {
            let d = f16::from_bits(self.d[r * self.nbp + k]).to_f32();
            let m = match self.format {
                MatFormat::Q4_1 => Some(f16::from_bits(self.m[r * self.nbp + k]).to_f32()),
                MatFormat::Q8_0 => None,
            };
            for i in 0..BLOCK {
                let q = self.quant(r, k, i) as f32;
                out[k * BLOCK + i] = match m {
                    Some(m) => q * d + m,
                    None => q * d,
                };
            }
        }
        Ok(())
    }
}

/// A reusable buffer of activation rows quantised to GGML Q8_1 semantics.
///
/// Per 32 values: `d = amax / 127`, `q = round_ties_even(x · (1/d))` (clamped to ±127, which only
/// matters for non-finite input) as `i8`, `d` stored rounded to `f16`, and
/// `s = f16(d · Σq)` with the unrounded `d`, as GGML's `quantize_row_q8_1` does. Q8_0 weights use
/// `d` and `q`; Q4_1 weights also use `s`. The scales are kept as the exact `f32` values of those
/// `f16`s.
#[derive(Clone, Debug, Default)]
pub struct Activations {
    n: usize,
    cols: usize,
    nb: usize,
    /// Stride of `d` (`nb` rounded up to 8).
    nbp: usize,
    /// Stride of `s` (`n` rounded up to 4).
    np4: usize,
    /// `n × nb` blocks of quants.
    q: Vec<Chunk>,
    /// `f32(f16(d))`, `n × nbp`, zero padded.
    d: Vec<f32>,
    /// `f32(f16(s))`, transposed: `s[k · np4 + b]`, zero padded.
    s: Vec<f32>,
}

impl Activations {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Quantises `n` rows of `cols` values (`x` row-major, `x.len() == n · cols`,
    /// `cols % 32 == 0`). Allocates nothing once the buffer has held a batch at least as large.
    pub fn quantize(&mut self, x: &[f32], n: usize, cols: usize) -> Result<(), KernelError> {
        self.quantize_with(Level::detect(), x, n, cols)
    }

    /// [`Activations::quantize`] with a chosen implementation (all give the same bits).
    pub fn quantize_with(
        &mut self,
        level: Level,
        x: &[f32],
        n: usize,
        cols: usize,
    ) -> Result<(), KernelError> {
        let len = check_cols(n, cols)?;
        if x.len() != len {
            return Err(KernelError::Length {
                what: "activation values",
                got: x.len(),
                expected: len,
            });
        }
        let nb = cols / BLOCK;
        self.n = n;
        self.cols = cols;
        self.nb = nb;
        self.nbp = pad8(nb);
        self.np4 = n.div_ceil(4) * 4;
        self.q.clear();
        self.q.resize(n * nb, Chunk::default());
        self.d.clear();
        self.d.resize(n * self.nbp, 0.0);
        self.s.clear();
        self.s.resize(nb * self.np4, 0.0);
        let level = level.effective();
        for b in 0..n {
            for k in 0..nb {
                let xs: &[f32; BLOCK] = x[(b * nb + k) * BLOCK..(b * nb + k + 1) * BLOCK]
                    .try_into()
                    .expect("a block is 32 values");
                let amax = match level {
                    // SAFETY: `effective` checked that the CPU has AVX2, FMA and F16C.
                    Level::Avx2 => unsafe { avx2::amax(xs) },
                    Level::Scalar => scalar::amax(xs),
                };
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                let q = &mut self.q[b * nb + k].0;
                let sum = match level {
                    // SAFETY: as above.
                    Level::Avx2 => unsafe { avx2::quantize_block(xs, id, q) },
                    Level::Scalar => scalar::quantize_block(xs, id, q),
                };
                self.d[b * self.nbp + k] = f16::from_f32(d).to_f32();
                self.s[k * self.np4 + b] = f16::from_f32(d * sum as f32).to_f32();
            }
        }
        Ok(())
    }

    /// Number of rows quantised by the last [`Activations::quantize`].
    pub fn rows(&self) -> usize {
        self.n
    }

    /// Number of values per row.
    pub fn cols(&self) -> usize {
        self.cols
    }
}

/// `out[b · w.rows() + r] = dot(weight row r, activation row b)` for every `b < a.rows()`,
/// computed as described in the [module docs](self) on the best [`Level`] of this CPU.
///
/// Parallel over weight-row ranges on rayon's current pool (it may be called from a pool
/// thread); small products run on the calling thread. Allocates nothing. Errors (and writes
/// nothing) when `a.cols() != w.cols()` or `out.len() != a.rows() · w.rows()`.
pub fn matmul(w: &QMatrix, a: &Activations, out: &mut [f32]) -> Result<(), KernelError> {
    matmul_with(Level::detect(), w, a, out)
}

/// Below this many block dot products (`rows · cols/32 · batch`) a product runs on the calling
/// thread: waking a second thread costs more than it saves.
const PARALLEL_MIN_WORK: usize = 8192;

/// Raw output pointer shared by the row-range tasks, each writing disjoint elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: the tasks of one `matmul_with` call write pairwise disjoint elements of a buffer that
// the call borrows mutably for its whole duration.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer (a method, so that closures capture the whole `Send` wrapper).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// [`matmul`] with a chosen implementation (all give the same bits).
pub fn matmul_with(
    level: Level,
    w: &QMatrix,
    a: &Activations,
    out: &mut [f32],
) -> Result<(), KernelError> {
    if a.cols != w.cols {
        return Err(KernelError::Mismatch(format!(
            "activations have {} columns, the matrix {}",
            a.cols, w.cols
        )));
    }
    let expected = a.n * w.rows;
    if out.len() != expected {
        return Err(KernelError::Length {
            what: "output",
            got: out.len(),
            expected,
        });
    }
    if expected == 0 {
        return Ok(());
    }
    let level = level.effective();
    let work = expected.saturating_mul(w.nb.max(1));
    let threads = rayon::current_num_threads();
    let tasks = if work < PARALLEL_MIN_WORK || threads <= 1 {
        1
    } else {
        threads.min(w.rows)
    };
    let ptr = OutPtr(out.as_mut_ptr());
    let run = |t: usize| {
        let r0 = w.rows * t / tasks;
        let r1 = w.rows * (t + 1) / tasks;
        // SAFETY: `ptr` points to `a.n · w.rows` elements borrowed mutably by this call; this
        // task writes only `out[b · rows + r]` for `r` in its own range `r0..r1`.
        unsafe { run_rows(level, w, a, r0, r1, ptr.get()) };
    };
    if tasks == 1 {
        run(0);
    } else {
        use rayon::prelude::*;
        (0..tasks).into_par_iter().for_each(run);
    }
    Ok(())
}

/// Up to this many activation rows, a tile holds one weight row (see [`run_rows`]).
const ONE_ROW_TILES_UP_TO: usize = 16;

/// Bytes of weights (quants and scales) kept hot in L1 while a tile of rows meets every group of
/// activation rows.
const TILE_BYTES: usize = 16 * 1024;

/// Computes rows `r0..r1` of the weight matrix against every activation row.
///
/// # Safety
/// `out` must be valid for writes of `a.n · w.rows` elements, `a.cols == w.cols`, `r1 ≤ w.rows`,
/// and `level` must be runnable on this CPU.
unsafe fn run_rows(
    level: Level,
    w: &QMatrix,
    a: &Activations,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    let row_bytes = w.qchunks * 32 + w.nbp * if w.m.is_empty() { 2 } else { 4 };
    let tile = (TILE_BYTES / row_bytes.max(1)).max(1);
    let mut t0 = r0;
    while t0 < r1 {
        let t1 = (t0 + tile).min(r1);
        let mut b0 = 0;
        while b0 < a.n {
            let nb = (a.n - b0).min(4);
            // Register tiles of several weight rows × `nb` activation rows (measured on Zen 3,
            // whole forward passes of the default model, alternating):
            // * one activation row: four Q4_1 rows at once hide the FMA latency; Q8_0 is
            //   memory-bound and fastest row by row;
            // * a few activation rows (a speculative draft, a handful of streams, up to
            //   `ONE_ROW_TILES_UP_TO`): one weight row, 1.3–1.9× faster than two at 2–8 rows;
            // * more: two weight rows, eight independent accumulator chains, ~10 % faster for
            //   Q8_0 at 64 rows (a tie at 16–32; Q4_1 within 3 %).
            // The last rows of a range go one by one: same operations per element, same bits.
            let nr = match (nb, w.format) {
                (1, MatFormat::Q4_1) => 4,
                (1, MatFormat::Q8_0) => 1,
                _ if a.n <= ONE_ROW_TILES_UP_TO => 1,
                _ => 2,
            };
            let mut r = t0;
            while r < t1 {
                let nr = if r + nr <= t1 { nr } else { 1 };
                let res = match level {
                    // SAFETY: the caller checked that the CPU has AVX2, FMA and F16C.
                    Level::Avx2 => unsafe { avx2::dot_tile(w, r, nr, a, b0, nb) },
                    Level::Scalar => scalar::dot_tile(w, r, nr, a, b0, nb),
                };
                for (ri, res) in res.iter().take(nr).enumerate() {
                    for (bi, v) in res.iter().take(nb).enumerate() {
                        // SAFETY: `b0 + bi < a.n` and `r + ri < r1 ≤ w.rows`, so the index is in
                        // bounds of the caller's buffer, and no other task writes these rows.
                        unsafe { *out.add((b0 + bi) * w.rows + r + ri) = *v };
                    }
                }
                r += nr;
            }
            b0 += 4;
        }
        t0 = t1;
    }
}
