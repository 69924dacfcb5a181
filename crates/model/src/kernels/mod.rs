//! Quantised matrix × batch-of-activations kernels.
//!
//! [`matmul`] multiplies a weight matrix ([`QMatrix`], one row per output feature, kept in the
//! GGUF file's own format) by a batch of activation rows ([`Activations`]), which are converted
//! once per input to the format llama.cpp's CPU backend pairs with the weight format (its
//! `vec_dot_type`). Unlike candle's `k_quants::matmul`, which loops over activation rows outside
//! and re-reads the whole weight matrix once per row, every weight block is loaded once per group
//! of activation rows, and no memory is allocated per call. Work is split over weight rows on
//! rayon's current pool.
//!
//! | weights ([`MatFormat`]) | activations | integer part | float part |
//! |---|---|---|---|
//! | Q8_0 | Q8_0 | one sum per 32-block | bands of 16 rows: `q80` |
//! | Q4_0, Q5_0 | Q8_0 | one sum per 32-block | bands of 16 rows: `legacy` |
//! | Q4_1, Q5_1 | Q8_1 | one sum per 32-block | bands of 16 rows: `legacy` |
//! | Q4_K | Q8_K | one scaled sum and one min sum per 256-block | bands of 16 rows: `q4k` |
//! | Q6_K | Q8_K | one scaled sum per 256-block | bands of 16 rows: `q6k` |
//! | Q5_K | Q8_K | 8 scaled lane sums per 256-block | [K-quants](#q5_k-q6_k--q8_k) |
//! | F32, F16, BF16 | the same type | none | [float](#f32-f16-bf16) |
//!
//! # Exact semantics
//!
//! Every output element is computed by the same sequence of floating-point operations whatever
//! the batch size, whichever tile or remainder path computes it and whichever thread runs it, and
//! the scalar path ([`Level::Scalar`]) gives the same bits as the AVX2 path ([`Level::Avx2`]) and
//! the AVX-512 paths ([`Level::Avx512`], [`Level::Avx512Vnni`]), which only compute the exact
//! integer sums differently (see `avx512.rs`).
//! The sequences follow llama.cpp's AVX2 `ggml_vec_dot_*` functions (not bit for bit: llama.cpp
//! itself differs between its SIMD levels and its `sgemm` path). All `f16` → `f32` and
//! `bf16` → `f32` conversions are exact. Every integer partial sum named below is exact and
//! below 2^24 in magnitude, so converting it to `f32` is exact too; integer sums may therefore
//! be computed in any order.
//!
//! `hsum8(x)` is llama.cpp's `hsum_float_8`: `((x4 + x0) + (x6 + x2)) + ((x5 + x1) + (x7 + x3))`.
//!
//! ## Q8_0, Q4_0, Q5_0 × Q8_0
//!
//! (These formats now have their own layout and order, in bands of sixteen rows: see the `q80`
//! and `legacy` modules; the text below keeps their first order, `q8_0=1`, `q4_0=1`, `q5_0=1`,
//! `q4_1=1`, `q5_1=1`.)
//!
//! Weight quants `w_i` per 32-value block `k`: the `i8` (Q8_0), `nibble − 8` (Q4_0),
//! `(nibble | high_bit << 4) − 16` (Q5_0); element `i < 16` is the low nibble of byte `i` and
//! element `i ≥ 16` the high nibble of byte `i − 16` (GGML's layout), Q5_0's high bit of element
//! `i` is bit `i` of the block's `qh`. For each block `k` in order `0..cols/32`:
//!
//! * eight exact integer lane sums `p_j = Σ_{i=4j}^{4j+3} w_i · a_i` (`j = 0..8`);
//! * `acc_j = fma(f32(d_w) · f32(d_a), p_j as f32, acc_j)`: the scale product rounded to `f32`
//!   first, then one fused multiply-add.
//!
//! Result: `hsum8(acc)` (so `-0.0` stays `-0.0`).
//!
//! ## Q4_1, Q5_1 × Q8_1
//!
//! As above with unsigned quants (`nibble`, `nibble | high_bit << 4`), plus one fused
//! multiply-add per block in order, `summ = fma(f32(m_w), f32(s_a), summ)`. Result:
//! `hsum8(acc) + summ`.
//!
//! ## Q5_K, Q6_K × Q8_K
//!
//! (Q4_K and Q6_K have their own layout and order, in bands of sixteen rows: see the `q4k` and
//! `q6k` modules. The text below keeps their first orders, `q4_k=1` and `q6_k=1`, beside
//! Q5_K's, which shares them.)
//!
//! A 256-value super-block `i` has eight 32-value sub-blocks `s` (Q4_K/Q5_K: 6-bit scale `sc_s`
//! and min `m_s`, unsigned quants `q` in `0..16` / `0..32`) or sixteen 16-value sub-blocks
//! (Q6_K: `i8` scales, quants `q − 32` in `−32..32`). The activations' super-block has an `f32`
//! scale `d_a`, quants `a` and sixteen `i16` sums `bs_0..bs_16` of 16 quants each. For each
//! super-block `i` in order:
//!
//! * eight exact integer lane sums, lane `l = 0..8` covering elements `4l..4l+3` of each of the
//!   eight 32-value groups `g`: `isum_l = Σ_g scale(g, l) · Σ_{e=4l}^{4l+3} w_{g,e} · a_{g,e}`,
//!   where `scale(g, l) = sc_g` (Q4_K/Q5_K) or the Q6_K scale of the 16-value half of group `g`
//!   that lane `l` falls in (`scales[2g]` for `l < 4`, `scales[2g + 1]` for `l ≥ 4`);
//! * `acc_l = fma(d_a · f32(d_w), isum_l as f32, acc_l)`;
//! * Q4_K only: four exact integer sums `prod_t = m_{2t} · (bs_{4t} + bs_{4t+1}) + m_{2t+1} ·
//!   (bs_{4t+2} + bs_{4t+3})` (`t = 0..4`) and `accm_t = fma(dmin, prod_t as f32, accm_t)` with
//!   `dmin = −(d_a · f32(dmin_w))`;
//! * Q5_K only: `summs = fma(dmin, (Σ_t prod_t) as f32, summs)` with the same `dmin`.
//!
//! Result: `hsum8(acc)`, plus `((accm_0 + accm_2) + (accm_1 + accm_3))` for Q4_K, plus `summs`
//! for Q5_K (llama.cpp's `ggml_vec_dot_q{4,5,6}_K_q8_K`, AVX2 branch).
//!
//! ## F32, F16, BF16
//!
//! Four accumulators of eight lanes: element `e = 32s + 8j + l` (steps `s` in order) goes to
//! `acc[j][l]`. F32 and F16 (activations rounded to `f16`, nearest-even):
//! `acc[j][l] = fma(w_e, a_e, acc[j][l])`; then `c = (acc[0] + acc[2]) + (acc[1] + acc[3])`
//! lane-wise, `t_l = c_l + c_{l+4}` and the result is `(t_0 + t_1) + (t_2 + t_3)` (llama.cpp's
//! `GGML_F32_VEC_REDUCE`). BF16 (activations rounded to `bf16`, nearest-even):
//! `acc[j][l] = (w_e · a_e) + acc[j][l]` (a rounded product, then an add), the same `c`, and
//! the result `hsum8(c)` (llama.cpp's `ggml_vec_dot_bf16`).
//!
//! # Activation conversion
//!
//! * Q8_1 / Q8_0 per 32 values: `d = amax / 127`, `q = round_ties_even(x · (1/d))` (clamped to
//!   ±127, which only matters for non-finite input), `d` stored rounded to `f16`, and
//!   `s = f16(d · Σq)` with the unrounded `d` (GGML's `quantize_row_q8_1`); Q8_0 weights use `d`
//!   and `q`, Q4_1/Q5_1 weights also `s`.
//! * Q8_K per 256 values (GGML's `quantize_row_q8_K_ref`): `max` is the first value of largest
//!   magnitude; if it is zero everything is zero, else `iscale = −127 / max`,
//!   `q = min(round_ties_even(iscale · x), 127)` (and at least −127), `d = 1 / iscale` (`f32`),
//!   and `bs_j` the sum of quants `16j..16j+16`.
//! * F16 / BF16: each value rounded to nearest-even; F32: the values themselves.
//!
//! # Layout and tiling
//!
//! Weight quants and scales are repacked into separate planes at load (see [`QMatrix`]);
//! [`Activations`] converts its input lazily, once per format, the first time a matrix needs
//! it. Each task takes a range of weight rows; within it, tiles of rows small enough to stay in
//! L1 meet each group of four activation rows, and a register tile of one to four weight rows ×
//! one to four activation rows keeps its accumulators in registers. `benches/matmul.rs`
//! compares against candle's `QMatMul`.
//!
//! Non-finite activations give deterministic but meaningless results; non-finite weight scales
//! propagate to the outputs they touch (a NaN's payload bits are unspecified).

pub mod attn;
mod avx2;
mod avx2k;
mod avx512;
mod band;
pub mod convert;
mod legacy;
mod plane;
mod q4k;
mod q6k;
mod q80;
mod scalar;
#[cfg(test)]
mod tests;

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use candle_core::quantized::{GgmlDType, QTensor};
use half::{bf16, f16};

/// `[f(0), f(1), …, f(N − 1)]`, for the SIMD kernels in place of `std::array::from_fn`.
///
/// A closure inside a function with target features has those features, and a function
/// without them (such as `std::array::from_fn`, built for the x86-64 baseline) cannot inline
/// it: each element would be a call, with its vector passed through memory. This function is
/// always inlined into its caller, so the closure is called, and inlined, there.
#[inline(always)]
pub(crate) fn array<T: Copy, const N: usize>(mut f: impl FnMut(usize) -> T) -> [T; N] {
    let mut a = [std::mem::MaybeUninit::<T>::uninit(); N];
    for (i, x) in a.iter_mut().enumerate() {
        x.write(f(i));
    }
    // SAFETY: every element was written above, and `[MaybeUninit<T>; N]` has the layout of
    // `[T; N]`.
    unsafe { std::mem::transmute_copy(&a) }
}

/// Number of values in one quantisation block of the 32-value formats (and the activations'
/// Q8_1 blocks).
pub const BLOCK: usize = 32;
/// Number of values in one super-block of the K-quant formats (and of Q8_K).
pub const QK_K: usize = 256;

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

/// Storage format of a [`QMatrix`] (GGML's block formats, same bytes as in a GGUF file).
// GGML's names.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MatFormat {
    /// GGML Q4_0: per 32 values `x = (q − 8) · d`, `q` in `0..16`.
    Q4_0,
    /// GGML Q4_1: per 32 values `x = q · d + m`, `q` in `0..16`.
    Q4_1,
    /// GGML Q5_0: per 32 values `x = (q − 16) · d`, `q` in `0..32`.
    Q5_0,
    /// GGML Q5_1: per 32 values `x = q · d + m`, `q` in `0..32`.
    Q5_1,
    /// GGML Q8_0: per 32 values `x = q · d`, `q` an `i8`.
    Q8_0,
    /// GGML Q4_K: per 256 values, eight sub-blocks with 6-bit scales and mins,
    /// `x = (d · sc) · q − dmin · m`, `q` in `0..16`.
    Q4_K,
    /// GGML Q5_K: as Q4_K with `q` in `0..32`.
    Q5_K,
    /// GGML Q6_K: per 256 values, sixteen sub-blocks with `i8` scales, `x = (d · sc) · (q − 32)`,
    /// `q` in `0..64`.
    Q6_K,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE single precision.
    F32,
}

/// Every [`MatFormat`].
pub const ALL_FORMATS: [MatFormat; 11] = [
    MatFormat::Q4_0,
    MatFormat::Q4_1,
    MatFormat::Q5_0,
    MatFormat::Q5_1,
    MatFormat::Q8_0,
    MatFormat::Q4_K,
    MatFormat::Q5_K,
    MatFormat::Q6_K,
    MatFormat::F16,
    MatFormat::BF16,
    MatFormat::F32,
];

/// Which activation conversion a weight format multiplies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ActFormat {
    /// Q8_1 blocks (Q8_0 weights and friends read only `d` and `q`).
    Q8,
    /// Q8_K super-blocks.
    Q8K,
    F16,
    BF16,
    F32,
}

impl MatFormat {
    /// Values per GGML block (32, 256 for the K-quants, 1 for the float formats).
    pub fn block_values(self) -> usize {
        match self {
            MatFormat::Q4_K | MatFormat::Q5_K | MatFormat::Q6_K => QK_K,
            MatFormat::F16 | MatFormat::BF16 | MatFormat::F32 => 1,
            _ => BLOCK,
        }
    }

    /// Bytes per GGML block.
    pub fn block_bytes(self) -> usize {
        match self {
            MatFormat::Q4_0 => 18,
            MatFormat::Q4_1 => Q4_1_BLOCK_BYTES,
            MatFormat::Q5_0 => 22,
            MatFormat::Q5_1 => 24,
            MatFormat::Q8_0 => Q8_0_BLOCK_BYTES,
            MatFormat::Q4_K => 144,
            MatFormat::Q5_K => 176,
            MatFormat::Q6_K => 210,
            MatFormat::F16 | MatFormat::BF16 => 2,
            MatFormat::F32 => 4,
        }
    }

    /// The number `cols` must be a multiple of: 256 for the K-quants, else 32.
    pub fn cols_multiple(self) -> usize {
        self.block_values().max(BLOCK)
    }

    /// The candle type of the same format (`None` for BF16, which candle's GGUF reader lacks).
    pub fn ggml_dtype(self) -> Option<GgmlDType> {
        Some(match self {
            MatFormat::Q4_0 => GgmlDType::Q4_0,
            MatFormat::Q4_1 => GgmlDType::Q4_1,
            MatFormat::Q5_0 => GgmlDType::Q5_0,
            MatFormat::Q5_1 => GgmlDType::Q5_1,
            MatFormat::Q8_0 => GgmlDType::Q8_0,
            MatFormat::Q4_K => GgmlDType::Q4K,
            MatFormat::Q5_K => GgmlDType::Q5K,
            MatFormat::Q6_K => GgmlDType::Q6K,
            MatFormat::F16 => GgmlDType::F16,
            MatFormat::F32 => GgmlDType::F32,
            MatFormat::BF16 => return None,
        })
    }

    /// The format of a GGML type id (a GGUF tensor's `ggml_type`: 0 F32, 1 F16, 2 Q4_0,
    /// 3 Q4_1, 6 Q5_0, 7 Q5_1, 8 Q8_0, 12 Q4_K, 13 Q5_K, 14 Q6_K, 30 BF16), when the kernels
    /// have it.
    pub fn from_ggml_type(id: u32) -> Option<MatFormat> {
        Some(match id {
            0 => MatFormat::F32,
            1 => MatFormat::F16,
            2 => MatFormat::Q4_0,
            3 => MatFormat::Q4_1,
            6 => MatFormat::Q5_0,
            7 => MatFormat::Q5_1,
            8 => MatFormat::Q8_0,
            12 => MatFormat::Q4_K,
            13 => MatFormat::Q5_K,
            14 => MatFormat::Q6_K,
            30 => MatFormat::BF16,
            _ => return None,
        })
    }

    /// The format of a candle type, when the kernels have one.
    pub fn from_ggml_dtype(t: GgmlDType) -> Option<MatFormat> {
        ALL_FORMATS.into_iter().find(|f| f.ggml_dtype() == Some(t))
    }

    /// The activation conversion llama.cpp pairs with this format.
    pub(crate) fn act(self) -> ActFormat {
        match self {
            MatFormat::Q4_0
            | MatFormat::Q4_1
            | MatFormat::Q5_0
            | MatFormat::Q5_1
            | MatFormat::Q8_0 => ActFormat::Q8,
            MatFormat::Q4_K | MatFormat::Q5_K | MatFormat::Q6_K => ActFormat::Q8K,
            MatFormat::F16 => ActFormat::F16,
            MatFormat::BF16 => ActFormat::BF16,
            MatFormat::F32 => ActFormat::F32,
        }
    }

    /// Whether the format is a K-quant (256-value super-blocks).
    fn is_k(self) -> bool {
        matches!(self, MatFormat::Q4_K | MatFormat::Q5_K | MatFormat::Q6_K)
    }

    /// Whether the format is F16, BF16 or F32.
    fn is_float(self) -> bool {
        matches!(self, MatFormat::F16 | MatFormat::BF16 | MatFormat::F32)
    }
}

/// Which implementation computes the kernels; all give the same bits. The workspace's one
/// CPU-feature switch, [`nextok_core::cpu::Level`], re-exported: its process-wide cap
/// ([`nextok_core::cpu::set_max_level`]) caps these kernels and the sampler's alike. The
/// conversion of the activations has AVX2 code only, which it also runs at the AVX-512 levels.
pub use nextok_core::cpu::Level;

/// The register width of the AVX-512 kernels that have two (the same bits either way, see
/// [`set_register_width`]): the VNNI tiles of the 32-value formats, and attention, whose
/// 256-bit code is the AVX2 kernels'.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegisterWidth {
    /// 256 bits where the CPU splits 512-bit operations in halves
    /// ([`nextok_core::cpu::splits_512_bit_ops`]: AMD Zen 4), 512 elsewhere.
    Auto,
    /// 256-bit registers: one weight row's eight lane sums per register in the VNNI tiles; the
    /// AVX2 attention kernels.
    Bits256,
    /// 512-bit registers: two weight rows per register in the VNNI tiles; the AVX-512 attention
    /// kernels.
    Bits512,
}

static REGISTER_WIDTH: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Sets the register width of the AVX-512 kernels that have two, process-wide (tests and
/// benchmarks: results do not change, only the speed).
pub fn set_register_width(width: RegisterWidth) {
    let code = match width {
        RegisterWidth::Auto => 0,
        RegisterWidth::Bits256 => 1,
        RegisterWidth::Bits512 => 2,
    };
    REGISTER_WIDTH.store(code, std::sync::atomic::Ordering::Relaxed);
}

/// The register width the AVX-512 kernels that have two run at now (never
/// [`RegisterWidth::Auto`]).
pub fn register_width() -> RegisterWidth {
    if bits_256() {
        RegisterWidth::Bits256
    } else {
        RegisterWidth::Bits512
    }
}

/// Whether the AVX-512 kernels that have two widths run on 256-bit registers now.
#[inline]
fn bits_256() -> bool {
    match REGISTER_WIDTH.load(std::sync::atomic::Ordering::Relaxed) {
        0 => nextok_core::cpu::splits_512_bit_ops(),
        c => c == 1,
    }
}

/// 32 bytes aligned to 32: one Q8 block's quants, two 4-bit blocks' nibbles, a quarter of a
/// K-quant super-block's nibbles, 16 `f16`/`bf16` or 8 `f32` values.
#[repr(C, align(32))]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct Chunk(pub(crate) [u8; 32]);

/// `n` rounded up to a multiple of 8 (the stride of the per-block scale planes, so that eight
/// scales can always be loaded at once).
fn pad8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// A weight matrix in a kernel format, repacked for the kernels.
///
/// `rows` are output features, `cols` input features (`cols` a multiple of 32, of 256 for the
/// K-quants). Internally the quants and the `f16` scales live in separate planes:
///
/// * Q8_0 is kept in bands of sixteen rows, interleaved (the `q80` module's layout);
/// * Q4_0, Q4_1, Q5_0 and Q5_1 are kept in bands of sixteen rows, interleaved (the `legacy`
///   module's layout; Q5_0/Q5_1's high bits as 64-bit byte masks in `qh`);
/// * Q4_K is kept in bands of sixteen rows, interleaved (the `q4k` module's layout);
/// * Q6_K is kept in bands of sixteen rows, interleaved (the `q6k` module's layout);
/// * Q5_K keeps GGML's quant bytes as they are, one super-block after the other (four chunks
///   of nibbles and one chunk of high bits), with its 6-bit scales and mins unpacked to bytes;
/// * F16, BF16 and F32 keep the values in chunks.
#[derive(Clone, Debug)]
pub struct QMatrix {
    format: MatFormat,
    rows: usize,
    cols: usize,
    /// Blocks per row: 32-value blocks, 256-value super-blocks for the K-quants, 32-value
    /// groups for the float formats.
    nb: usize,
    /// Stride of the scale planes (`nb` rounded up to 8, zero padded).
    nbp: usize,
    /// Chunks per row in `qs`.
    qchunks: usize,
    qs: plane::ChunkPlane,
    /// `f16` bits of the block scales (`d`), `rows × nbp`; empty for the float formats.
    d: plane::Plane<u16>,
    /// Q4_1/Q5_1: `f16` bits of the block minimums; Q4_K/Q5_K: of `dmin`; `rows × nbp`; else
    /// empty.
    m: plane::Plane<u16>,
    /// Q5_0/Q5_1: the blocks' high bits as byte masks in the band layout (`legacy`), `rows × nb`
    /// words; else empty.
    qh: plane::Plane<u32>,
    /// Q5_K: the eight 6-bit scales then the eight 6-bit mins of each super-block, `rows × nb`;
    /// Q4_K and Q6_K: their scales (and mins) in the band layout (`q4k`, `q6k`); else empty.
    sc: plane::Plane<[u8; 16]>,
    /// The file's format when it had no kernel and was re-quantised.
    converted_from: Option<GgmlDType>,
}

fn check_cols(rows: usize, cols: usize) -> Result<usize, KernelError> {
    check_cols_of(rows, cols, BLOCK)
}

fn check_cols_of(rows: usize, cols: usize, multiple: usize) -> Result<usize, KernelError> {
    if !cols.is_multiple_of(multiple) {
        return Err(KernelError::Shape(format!(
            "cols = {cols} is not a multiple of {multiple}"
        )));
    }
    rows.checked_mul(cols)
        .ok_or_else(|| KernelError::Shape(format!("{rows} × {cols} overflows")))
}

fn rd16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn h2f(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// GGML's `get_scale_min_k4`: scale and min `j` (`0..8`) of a Q4_K/Q5_K super-block.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

impl QMatrix {
    fn empty(format: MatFormat, rows: usize, cols: usize) -> QMatrix {
        let nb = cols / format.cols_multiple();
        // Q4_K's and Q8_0's planes hold whole bands of rows (see `band`)
        let prows = if band::banded(format) {
            band::padded_rows(rows)
        } else {
            rows
        };
        let nbp = pad8(nb);
        let qchunks = match format {
            MatFormat::Q4_0 | MatFormat::Q4_1 | MatFormat::Q5_0 | MatFormat::Q5_1 => nb.div_ceil(2),
            MatFormat::Q8_0 => nb,
            MatFormat::Q4_K => 4 * nb,
            MatFormat::Q5_K => 5 * nb,
            MatFormat::Q6_K => 6 * nb,
            MatFormat::F16 | MatFormat::BF16 => 2 * nb,
            MatFormat::F32 => 4 * nb,
        };
        let has_min = matches!(
            format,
            MatFormat::Q4_1 | MatFormat::Q5_1 | MatFormat::Q4_K | MatFormat::Q5_K
        );
        QMatrix {
            format,
            rows,
            cols,
            nb,
            nbp,
            qchunks,
            qs: plane::ChunkPlane::zeroed(prows * qchunks),
            d: if format.is_float() {
                plane::Plane::empty()
            } else {
                plane::Plane::zeroed(prows * nbp)
            },
            m: if has_min {
                plane::Plane::zeroed(prows * nbp)
            } else {
                plane::Plane::empty()
            },
            qh: if matches!(format, MatFormat::Q5_0 | MatFormat::Q5_1) {
                plane::Plane::zeroed(prows * nb)
            } else {
                plane::Plane::empty()
            },
            sc: if format.is_k() {
                plane::Plane::zeroed(prows * nb)
            } else {
                plane::Plane::empty()
            },
            converted_from: None,
        }
    }

    /// From raw GGML bytes, row-major, exactly as a GGUF file stores the tensor (block sizes in
    /// [`MatFormat::block_bytes`]; F16/BF16/F32 little-endian values). Errors when `cols` is not
    /// a multiple of [`MatFormat::cols_multiple`] or `bytes` has not exactly the length the
    /// shape asks for; allocates only after those checks (about as much as `bytes`).
    pub fn from_ggml(
        format: MatFormat,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<QMatrix, KernelError> {
        let n = check_cols_of(rows, cols, format.cols_multiple())?;
        let bsize = format.block_bytes();
        let bvals = format.block_values();
        let expected = (n / bvals)
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
        if format.is_float() {
            let row_bytes = cols * bsize;
            for r in 0..rows {
                let src = &bytes[r * row_bytes..(r + 1) * row_bytes];
                let dst = &mut w.qs[r * w.qchunks..(r + 1) * w.qchunks];
                for (c, s) in dst.iter_mut().zip(src.chunks_exact(32)) {
                    c.0.copy_from_slice(s);
                }
            }
            return Ok(w);
        }
        let nb = w.nb;
        for r in 0..rows {
            for k in 0..nb {
                let blk = &bytes[(r * nb + k) * bsize..(r * nb + k + 1) * bsize];
                w.put_block(r, k, blk);
            }
        }
        Ok(w)
    }

    /// Stores GGML block `k` of row `r` (`blk` has the format's block size).
    fn put_block(&mut self, r: usize, k: usize, blk: &[u8]) {
        let (nbp, qc) = (self.nbp, self.qchunks);
        let chunks = |w: &mut QMatrix, first: usize, src: &[u8]| {
            for (j, s) in src.chunks_exact(32).enumerate() {
                w.qs[r * qc + first + j].0.copy_from_slice(s);
            }
        };
        match self.format {
            MatFormat::Q8_0 => q80::put_block(self, r, k, blk),
            MatFormat::Q4_0 | MatFormat::Q4_1 | MatFormat::Q5_0 | MatFormat::Q5_1 => {
                legacy::put_block(self, r, k, blk)
            }
            MatFormat::Q4_K => q4k::put_block(self, r, k, blk),
            MatFormat::Q5_K => {
                self.d[r * nbp + k] = rd16(blk, 0);
                self.m[r * nbp + k] = rd16(blk, 2);
                let scales = &blk[4..16];
                let sc = &mut self.sc[r * self.nb + k];
                for j in 0..8 {
                    let (s, m) = scale_min_k4(j, scales);
                    sc[j] = s;
                    sc[8 + j] = m;
                }
                chunks(self, 5 * k, &blk[48..176]);
                chunks(self, 5 * k + 4, &blk[16..48]);
            }
            MatFormat::Q6_K => q6k::put_block(self, r, k, blk),
            MatFormat::F16 | MatFormat::BF16 | MatFormat::F32 => {
                unreachable!("float formats are copied whole")
            }
        }
    }

    /// From a candle `QTensor` of shape `[rows, cols]`, in the tensor's own format when the
    /// kernels have it (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, F32). Any other
    /// format (Q2_K, Q3_K, …) is dequantized to `f32` and re-quantised to Q8_0 with
    /// [`QMatrix::quantize_q8_0`]; [`QMatrix::converted_from`] then names the file's format.
    pub fn from_qtensor(t: &QTensor) -> Result<QMatrix, KernelError> {
        QMatrix::from_qtensor_as(t, None)
    }

    /// [`QMatrix::from_qtensor`], re-quantising to `requant` (only [`MatFormat::Q8_0`] is
    /// supported) every tensor that is not already in that format. `None` keeps the file's
    /// format.
    pub fn from_qtensor_as(
        t: &QTensor,
        requant: Option<MatFormat>,
    ) -> Result<QMatrix, KernelError> {
        let (rows, cols) = match t.shape().dims() {
            &[rows, cols] => (rows, cols),
            d => {
                return Err(KernelError::Shape(format!(
                    "expected a matrix [rows, cols], got {d:?}"
                )))
            }
        };
        let candle = |e: candle_core::Error| KernelError::Format(e.to_string());
        if let Some(f) = requant {
            if f != MatFormat::Q8_0 {
                return Err(KernelError::Format(format!(
                    "re-quantisation to {f:?} is not supported (only Q8_0)"
                )));
            }
        }
        let native = MatFormat::from_ggml_dtype(t.dtype())
            .filter(|f| cols.is_multiple_of(f.cols_multiple()));
        match (native, requant) {
            (Some(f), None) => QMatrix::from_ggml(f, rows, cols, &t.data().map_err(candle)?),
            (Some(f), Some(r)) if f == r => {
                QMatrix::from_ggml(f, rows, cols, &t.data().map_err(candle)?)
            }
            _ => {
                check_cols(rows, cols)?;
                let f = t
                    .dequantize(&candle_core::Device::Cpu)
                    .and_then(|f| f.flatten_all())
                    .and_then(|f| f.to_vec1::<f32>())
                    .map_err(candle)?;
                let mut m = QMatrix::quantize_q8_0(rows, cols, &f)?;
                if native.is_none() {
                    m.converted_from = Some(t.dtype());
                }
                Ok(m)
            }
        }
    }

    /// When the source tensor's format has no kernel here and the matrix was re-quantised to
    /// Q8_0 by [`QMatrix::from_qtensor`]: that format.
    pub fn converted_from(&self) -> Option<GgmlDType> {
        self.converted_from
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
                let mut blk = [0u8; Q8_0_BLOCK_BYTES];
                blk[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
                for (q, &v) in blk[2..].iter_mut().zip(x) {
                    *q = (v * id).round() as i8 as u8;
                }
                q80::put_block(&mut w, r, k, &blk);
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

    /// Bytes of weight data held (quants and scales).
    pub fn bytes(&self) -> usize {
        self.qs.len() * 32
            + (self.d.len() + self.m.len()) * 2
            + self.qh.len() * 4
            + self.sc.len() * 16
    }

    /// The `f16` bits of the scale `d` of 32-value block `k` of row `r` (Q4_0, Q4_1, Q5_0, Q5_1,
    /// Q8_0).
    #[inline]
    fn block_d(&self, r: usize, k: usize) -> u16 {
        if self.format == MatFormat::Q8_0 {
            q80::d_bits(self, r, k)
        } else {
            legacy::d_bits(self, r, k)
        }
    }

    /// Quant `i` (0..32) of 32-value block `k` of row `r` of a Q4_0/Q4_1/Q5_0/Q5_1/Q8_0
    /// matrix, as the kernels multiply it: `q − 8` (Q4_0), `q` (Q4_1, Q5_1), `q − 16` (Q5_0),
    /// the `i8` (Q8_0).
    #[inline]
    fn quant(&self, r: usize, k: usize, i: usize) -> i32 {
        match self.format {
            MatFormat::Q8_0 => q80::quant(self, r, k, i),
            MatFormat::Q4_0 | MatFormat::Q4_1 | MatFormat::Q5_0 | MatFormat::Q5_1 => {
                legacy::quant(self, r, k, i)
            }
            _ => unreachable!("not a 32-value block format"),
        }
    }

    /// The `f16` bits of the minimum `m` of 32-value block `k` of row `r` (Q4_1, Q5_1).
    #[inline]
    fn block_m(&self, r: usize, k: usize) -> u16 {
        legacy::m_bits(self, r, k)
    }

    /// Quant `e` (0..256) of super-block `k` of row `r` of a K-quant matrix, unsigned
    /// (`0..16`, `0..32`, `0..64`).
    #[inline]
    fn kquant(&self, r: usize, k: usize, e: usize) -> i32 {
        let base = r * self.qchunks;
        let (g, l) = (e / 32, e % 32);
        match self.format {
            MatFormat::Q4_K => q4k::quant(self, r, k, e),
            MatFormat::Q5_K => {
                let b = self.qs[base + 5 * k + g / 2].0[l];
                let h = self.qs[base + 5 * k + 4].0[l];
                (((b >> (4 * (g & 1))) & 0x0F) | (((h >> g) & 1) << 4)) as i32
            }
            MatFormat::Q6_K => q6k::quant(self, r, k, e),
            _ => unreachable!("not a K-quant format"),
        }
    }

    /// Value `e` of row `r` of a float matrix, as `f32` (exact).
    #[inline]
    fn fval(&self, r: usize, e: usize) -> f32 {
        let row = &self.qs[r * self.qchunks..(r + 1) * self.qchunks];
        match self.format {
            MatFormat::F32 => {
                let c = &row[e / 8].0[(e % 8) * 4..(e % 8) * 4 + 4];
                f32::from_le_bytes([c[0], c[1], c[2], c[3]])
            }
            MatFormat::F16 => h2f(rd16(&row[e / 16].0, (e % 16) * 2)),
            MatFormat::BF16 => bf16::from_bits(rd16(&row[e / 16].0, (e % 16) * 2)).to_f32(),
            _ => unreachable!("not a float format"),
        }
    }

    /// Writes row `r` dequantized into `out` (`out.len() == cols`), with GGML's and candle's
    /// arithmetic: `q · d` (Q8_0, Q4_0, Q5_0 with `q` signed), `q · d + m` (Q4_1, Q5_1),
    /// `(d · sc) · q − dmin · m` (Q4_K, Q5_K), `(d · sc) · q` (Q6_K), exact conversions for the
    /// float formats.
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
        match self.format {
            MatFormat::F16 | MatFormat::BF16 | MatFormat::F32 => {
                for (e, o) in out.iter_mut().enumerate() {
                    *o = self.fval(r, e);
                }
            }
            MatFormat::Q4_K => {
                for k in 0..self.nb {
                    let d = q4k::scale_f32(self, r, k, 0);
                    let dmin = q4k::scale_f32(self, r, k, 1);
                    for e in 0..QK_K {
                        let g = e / 32;
                        let d1 = d * q4k::scale(self, r, k, g) as f32;
                        let m1 = dmin * q4k::min(self, r, k, g) as f32;
                        out[k * QK_K + e] = d1 * q4k::quant(self, r, k, e) as f32 - m1;
                    }
                }
            }
            MatFormat::Q5_K => {
                for k in 0..self.nb {
                    let d = h2f(self.d[r * self.nbp + k]);
                    let dmin = h2f(self.m[r * self.nbp + k]);
                    let sc = &self.sc[r * self.nb + k];
                    for e in 0..QK_K {
                        let g = e / 32;
                        let d1 = d * sc[g] as f32;
                        let m1 = dmin * sc[8 + g] as f32;
                        out[k * QK_K + e] = d1 * self.kquant(r, k, e) as f32 - m1;
                    }
                }
            }
            MatFormat::Q6_K => {
                for k in 0..self.nb {
                    let d = q6k::d_f32(self, r, k);
                    for e in 0..QK_K {
                        let s = q6k::scale(self, r, k, e / 16) as f32;
                        let q = (self.kquant(r, k, e) - 32) as f32;
                        out[k * QK_K + e] = d * s * q;
                    }
                }
            }
            _ => {
                for k in 0..self.nb {
                    let d = h2f(self.block_d(r, k));
                    let m = match self.format {
                        MatFormat::Q4_1 | MatFormat::Q5_1 => Some(h2f(self.block_m(r, k))),
                        _ => None,
                    };
                    for i in 0..BLOCK {
                        let q = self.quant(r, k, i) as f32;
                        out[k * BLOCK + i] = match m {
                            Some(m) => q * d + m,
                            None => q * d,
                        };
                    }
                }
            }
        }
        Ok(())
    }
}

/// A value computed at most once between resets, in storage that is kept (and reused) across
/// resets: a `OnceLock` whose contents survive `reset` so that re-filling allocates nothing.
struct Lazy<T> {
    ready: AtomicBool,
    init: Mutex<()>,
    data: UnsafeCell<T>,
}

// SAFETY: `data` is written only by `get`'s initialiser, which runs while `ready` is false and
// the `init` lock is held (so by one thread at a time, and before any shared reference to it has
// been handed out since the last `reset`, which needs `&mut self`); after `ready` is set
// (release) it is only read, through shared references (acquire).
unsafe impl<T: Send + Sync> Sync for Lazy<T> {}

impl<T: Default> Default for Lazy<T> {
    fn default() -> Self {
        Lazy {
            ready: AtomicBool::new(false),
            init: Mutex::new(()),
            data: UnsafeCell::new(T::default()),
        }
    }
}

impl<T: Default> Clone for Lazy<T> {
    /// A clone starts unconverted (it converts again when asked).
    fn clone(&self) -> Self {
        Lazy::default()
    }
}

impl<T> std::fmt::Debug for Lazy<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lazy")
            .field("ready", &self.ready.load(Ordering::Relaxed))
            .finish()
    }
}

impl<T> Lazy<T> {
    /// The value, filled by `fill` first if it is not ready. `fill` must leave the storage
    /// fully written (it gets whatever the previous batch left there).
    fn get(&self, fill: impl FnOnce(&mut T)) -> &T {
        if !self.ready.load(Ordering::Acquire) {
            let _guard = self.init.lock().unwrap_or_else(PoisonError::into_inner);
            if !self.ready.load(Ordering::Acquire) {
                // SAFETY: `ready` is false and we hold `init`: no other thread writes `data`, and
                // no shared reference to it exists (they are handed out only once `ready` is set,
                // and `reset`, which clears it, takes `&mut self`).
                fill(unsafe { &mut *self.data.get() });
                self.ready.store(true, Ordering::Release);
            }
        }
        // SAFETY: `ready` is set, so `data` is no longer written until `reset(&mut self)`.
        unsafe { &*self.data.get() }
    }

    /// Marks the value stale (the storage is kept).
    fn reset(&mut self) {
        *self.ready.get_mut() = false;
    }
}

/// Q8_1 blocks of a batch.
#[derive(Clone, Debug, Default)]
struct Q8Buf {
    nb: usize,
    nbp: usize,
    np4: usize,
    q: Vec<Chunk>,
    d: Vec<f32>,
    s: Vec<f32>,
    /// The exact sum of each block's quants, `n × nb`.
    qsum: Vec<i32>,
}

/// Q8_K super-blocks of a batch.
#[derive(Clone, Debug, Default)]
struct Q8KBuf {
    knb: usize,
    kq: Vec<Chunk>,
    kd: Vec<f32>,
    kbs: Vec<[i16; 16]>,
}

/// A reusable buffer of activation rows, converted on demand to the formats the weight formats
/// need (see the [module docs](self#activation-conversion)).
///
/// [`Activations::quantize`] takes a batch (a copy of the values, nothing converted yet); each
/// format is computed the first time a [`matmul`] (or [`Activations::prepare`]) needs it and
/// reused by every other matrix of that format, also from other threads (a conversion runs once,
/// under a lock, then the buffer is only read). The Q8_1 / Q8_K scales are kept as the exact
/// `f32` values of what GGML stores. Allocates nothing once the buffers have held a batch at
/// least as large.
#[derive(Clone, Debug, Default)]
pub struct Activations {
    n: usize,
    cols: usize,
    /// The values, `n × cols` (the F32 activations).
    x: Vec<f32>,
    q8: Lazy<Q8Buf>,
    q8k: Lazy<Q8KBuf>,
    /// F16 bits of `x`.
    h: Lazy<Vec<u16>>,
    /// BF16 bits of `x`.
    bh: Lazy<Vec<u16>>,
}

/// What the kernels read of an [`Activations`]: the values and the conversion one weight format
/// needs (the other conversions' slices are empty).
pub(crate) struct Acts<'a> {
    n: usize,
    cols: usize,
    x: &'a [f32],
    /// Q8_1: 32-value blocks per row.
    nb: usize,
    /// Q8_1: stride of `d` (`nb` rounded up to 8).
    nbp: usize,
    /// Q8_1: stride of `s` (`n` rounded up to 4).
    np4: usize,
    /// Q8_1: `n × nb` blocks of quants.
    q: &'a [Chunk],
    /// Q8_1: `f32(f16(d))`, `n × nbp`, zero padded.
    d: &'a [f32],
    /// Q8_1: `f32(f16(s))`, transposed: `s[k · np4 + b]`, zero padded.
    s: &'a [f32],
    /// Q8_1: the exact sum of each block's quants, `n × nb`.
    qsum: &'a [i32],
    /// Q8_K: super-blocks per row.
    knb: usize,
    /// Q8_K: `n × knb × 8` chunks of quants.
    kq: &'a [Chunk],
    /// Q8_K: `d`, `n × knb`.
    kd: &'a [f32],
    /// Q8_K: the sixteen block sums of each super-block, `n × knb`.
    kbs: &'a [[i16; 16]],
    /// F16 bits of `x`.
    h: &'a [u16],
    /// BF16 bits of `x`.
    bh: &'a [u16],
}

impl Activations {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes `n` rows of `cols` values (`x` row-major, `x.len() == n · cols`,
    /// `cols % 32 == 0`). Allocates nothing once the buffer has held a batch at least as large.
    pub fn quantize(&mut self, x: &[f32], n: usize, cols: usize) -> Result<(), KernelError> {
        self.quantize_with(Level::current(), x, n, cols)
    }

    /// [`Activations::quantize`] with a chosen implementation (all give the same bits). Nothing
    /// is converted here, so `level` is unused: each conversion runs at the level of the first
    /// [`matmul_with`] (or [`Activations::prepare`]) that needs it.
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
        self.n = n;
        self.cols = cols;
        self.x.clear();
        self.x.extend_from_slice(x);
        self.q8.reset();
        self.q8k.reset();
        self.h.reset();
        self.bh.reset();
        let _ = level;
        Ok(())
    }

    /// Converts the current batch to the activation format that weights of `format` multiply,
    /// unless already done (once per batch and format, whichever thread asks first). Errors when
    /// `cols` does not suit the format (a K-quant needs a multiple of 256).
    pub fn prepare(&self, level: Level, format: MatFormat) -> Result<(), KernelError> {
        self.view(level, format).map(|_| ())
    }

    /// The kernels' view for weights of `format`, converting first if needed.
    pub(crate) fn view(&self, level: Level, format: MatFormat) -> Result<Acts<'_>, KernelError> {
        let mut v = Acts {
            n: self.n,
            cols: self.cols,
            x: &self.x,
            nb: 0,
            nbp: 0,
            np4: 0,
            q: &[],
            d: &[],
            s: &[],
            qsum: &[],
            knb: 0,
            kq: &[],
            kd: &[],
            kbs: &[],
            h: &[],
            bh: &[],
        };
        match format.act() {
            ActFormat::F32 => {}
            ActFormat::Q8 => {
                let b = self.q8.get(|b| self.to_q8_1(level.effective(), b));
                (v.nb, v.nbp, v.np4, v.q, v.d, v.s) = (b.nb, b.nbp, b.np4, &b.q, &b.d, &b.s);
                v.qsum = &b.qsum;
            }
            ActFormat::Q8K => {
                if !self.cols.is_multiple_of(QK_K) {
                    return Err(KernelError::Shape(format!(
                        "Q8_K activations need cols a multiple of {QK_K}, got {}",
                        self.cols
                    )));
                }
                let b = self.q8k.get(|b| self.to_q8_k(level.effective(), b));
                (v.knb, v.kq, v.kd, v.kbs) = (b.knb, &b.kq, &b.kd, &b.kbs);
            }
            ActFormat::F16 => {
                v.h = self.h.get(|h| {
                    h.clear();
                    h.extend(self.x.iter().map(|&v| f16::from_f32(v).to_bits()));
                });
            }
            ActFormat::BF16 => {
                v.bh = self.bh.get(|h| {
                    h.clear();
                    h.extend(self.x.iter().map(|&v| bf16::from_f32(v).to_bits()));
                });
            }
        }
        Ok(v)
    }

    /// Q8_1 blocks of `x` (see the module docs).
    fn to_q8_1(&self, level: Level, buf: &mut Q8Buf) {
        let (n, cols) = (self.n, self.cols);
        let nb = cols / BLOCK;
        buf.nb = nb;
        buf.nbp = pad8(nb);
        buf.np4 = n.div_ceil(4) * 4;
        buf.q.clear();
        buf.q.resize(n * nb, Chunk::default());
        buf.d.clear();
        buf.d.resize(n * buf.nbp, 0.0);
        buf.s.clear();
        buf.s.resize(nb * buf.np4, 0.0);
        buf.qsum.clear();
        buf.qsum.resize(n * nb, 0);
        // row by row, on the team when the batch is large (the same bits)
        let (x, np4, nbp) = (&self.x, buf.np4, buf.nbp);
        let s = crate::team::SharedMut::new(&mut buf.s);
        let s = &s;
        let qsum = crate::team::SharedMut::new(&mut buf.qsum);
        let qsum = &qsum;
        crate::team::for_rows2(&mut buf.q, nb, &mut buf.d, nbp, cols, &|b0, q, d| {
            for (i, (q, d)) in q
                .chunks_exact_mut(nb)
                .zip(d.chunks_exact_mut(nbp))
                .enumerate()
            {
                let b = b0 + i;
                for k in 0..nb {
                    let xs: &[f32; BLOCK] = x[(b * nb + k) * BLOCK..(b * nb + k + 1) * BLOCK]
                        .try_into()
                        .expect("a block is 32 values");
                    let amax = if level >= Level::Avx2 {
                        // SAFETY: the caller passed an effective level: the CPU has AVX2, FMA,
                        // F16C.
                        unsafe { avx2::amax(xs) }
                    } else {
                        scalar::amax(xs)
                    };
                    let dk = amax / 127.0;
                    let id = if dk != 0.0 { 1.0 / dk } else { 0.0 };
                    let q = &mut q[k].0;
                    let sum = if level >= Level::Avx2 {
                        // SAFETY: as above.
                        unsafe { avx2::quantize_block(xs, id, q) }
                    } else {
                        scalar::quantize_block(xs, id, q)
                    };
                    d[k] = f16::from_f32(dk).to_f32();
                    // SAFETY: `s` (`nb · np4` values) stays borrowed by this call, and entry
                    // `k · np4 + b` belongs to row `b`, which only this task converts.
                    unsafe { s.slice(k * np4 + b, 1)[0] = f16::from_f32(dk * sum as f32).to_f32() };
                    // SAFETY: as above, entry `b · nb + k` belongs to row `b`.
                    unsafe { qsum.slice(b * nb + k, 1)[0] = sum };
                }
            }
        });
    }

    /// Q8_K super-blocks of `x` (see the module docs; `cols % 256 == 0`).
    fn to_q8_k(&self, level: Level, buf: &mut Q8KBuf) {
        let n = self.n;
        let knb = self.cols / QK_K;
        buf.knb = knb;
        buf.kq.clear();
        buf.kq.resize(n * knb * 8, Chunk::default());
        buf.kd.clear();
        buf.kd.resize(n * knb, 0.0);
        buf.kbs.clear();
        buf.kbs.resize(n * knb, [0; 16]);
        // row by row, on the team when the batch is large (the same bits)
        let x = &self.x;
        let kbs = crate::team::SharedMut::new(&mut buf.kbs);
        let kbs = &kbs;
        crate::team::for_rows2(
            &mut buf.kq,
            knb * 8,
            &mut buf.kd,
            knb,
            self.cols,
            &|b0, kq, kd| {
                for (i, (q, d)) in kq.chunks_exact_mut(8).zip(kd.iter_mut()).enumerate() {
                    let blk = b0 * knb + i;
                    let xs: &[f32; QK_K] = x[blk * QK_K..(blk + 1) * QK_K]
                        .try_into()
                        .expect("a super-block is 256 values");
                    // SAFETY: `kbs` (`n · knb` entries) stays borrowed by this call, and entry
                    // `blk` belongs to a row only this task converts.
                    let bs = unsafe { &mut kbs.slice(blk, 1)[0] };
                    let scale = if level >= Level::Avx2 {
                        // SAFETY: the caller passed an effective level: the CPU has AVX2, FMA, F16C.
                        unsafe { avx2::q8_k_block(xs, q, bs) }
                    } else {
                        scalar::q8_k_block(xs, q, bs)
                    };
                    // all zero (or NaN): zero quants, sums and scale, as the buffers are
                    *d = scale.unwrap_or(0.0);
                }
            },
        );
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
/// computed as described in the [module docs](self) on the best [`Level`] of this CPU,
/// converting the activations to the format `w` needs first (once per batch and format).
///
/// Parallel over weight-row ranges on rayon's current pool (it may be called from a pool
/// thread), or on the team of the forward pass calling it; small products run on the calling
/// thread. Allocates nothing once `a` is warm.
/// Errors (and writes nothing) when `a.cols() != w.cols()` or `out.len() != a.rows() · w.rows()`.
pub fn matmul(w: &QMatrix, a: &Activations, out: &mut [f32]) -> Result<(), KernelError> {
    matmul_with(Level::current(), w, a, out)
}

/// Below this many block dot products (`rows · cols/32 · batch`) a product runs on the calling
/// thread: waking a second thread costs more than it saves.
const PARALLEL_MIN_WORK: usize = 8192;

/// Raw output pointer shared by the row-range tasks, each writing disjoint elements.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);
// SAFETY: the tasks of one `matmul_with` call write pairwise disjoint elements of a buffer that
// the call borrows mutably for its whole duration.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer (a method, so that closures capture the whole `Send` wrapper).
    pub(crate) fn get(self) -> *mut f32 {
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
    matmul_many_with(level, a, &mut [(w, out)])
}

/// Matrices multiplied by one set of activations in one parallel step (the query, key and value
/// projections, or the gate and up projections): [`matmul_with`] for each `(w, out)` pair, with
/// the same bits, the rows of all of them split among the threads together so that they meet
/// once instead of once per matrix. At most [`MANY_MAX`] matrices; checks every pair before
/// writing anything.
pub fn matmul_many_with(
    level: Level,
    a: &Activations,
    parts: &mut [(&QMatrix, &mut [f32])],
) -> Result<(), KernelError> {
    if parts.len() > MANY_MAX {
        return Err(KernelError::Mismatch(format!(
            "{} matrices in one step, at most {MANY_MAX}",
            parts.len()
        )));
    }
    let mut starts = [0usize; MANY_MAX + 1];
    for (i, (w, out)) in parts.iter().enumerate() {
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
        // whole bands of rows (Q4_K's unit, see `q4k`), so that every task starts on one
        starts[i + 1] = starts[i]
            + if a.n == 0 {
                0
            } else {
                band::padded_rows(w.rows)
            };
    }
    let total = starts[parts.len()];
    if total == 0 {
        return Ok(());
    }
    let level = level.effective();
    // every matrix's view of the activations (converted once per format), then its rows
    let mut views: [Option<Acts<'_>>; MANY_MAX] = Default::default();
    let mut ptrs = [OutPtr(std::ptr::null_mut()); MANY_MAX];
    let mut work = 0usize;
    for (i, (w, out)) in parts.iter_mut().enumerate() {
        views[i] = Some(a.view(level, w.format)?);
        ptrs[i] = OutPtr(out.as_mut_ptr());
        work = work.saturating_add((a.n * w.rows).saturating_mul((w.cols / BLOCK).max(1)));
    }
    let threads = crate::team::threads();
    // Many activation rows (a prompt): several tasks per thread, claimed as threads come free,
    // so that a thread slowed down for a while (by another process on its core) does not keep
    // the others waiting at the end of the step. A few rows (decoding): one range per thread,
    // each read as one stream.
    let per_thread = if a.n > ONE_ROW_TILES_UP_TO { 4 } else { 1 };
    let tasks = if work < PARALLEL_MIN_WORK || threads <= 1 {
        1
    } else {
        (threads * per_thread).min(total)
    };
    let (views, ptrs, starts) = (&views, &ptrs, &starts[..=parts.len()]);
    let mats: [Option<&QMatrix>; MANY_MAX] = std::array::from_fn(|i| parts.get(i).map(|p| p.0));
    let mats = &mats;
    let run = |t: usize| {
        // this task's share of the rows of all the matrices, one after the other
        let band = |x: usize| x / band::BAND * band::BAND;
        let (g0, g1) = (band(total * t / tasks), band(total * (t + 1) / tasks));
        for i in 0..starts.len() - 1 {
            let (s0, s1) = (starts[i].max(g0), starts[i + 1].min(g1));
            let (Some(w), Some(a)) = (mats[i], &views[i]) else {
                continue;
            };
            let (r0, r1) = (
                s0.saturating_sub(starts[i]),
                s1.saturating_sub(starts[i]).min(w.rows),
            );
            if r0 >= r1 {
                continue;
            }
            // SAFETY: `ptrs[i]` points to `a.n · w.rows` elements borrowed mutably by this call;
            // this task writes only `out[b · rows + r]` for `r` in its own range.
            unsafe { run_rows(level, w, a, r0, r1, ptrs[i].get()) };
        }
    };
    crate::team::for_each(tasks, &run);
    Ok(())
}

/// Matrices [`matmul_many_with`] takes in one step at most.
pub const MANY_MAX: usize = 3;

/// Up to this many activation rows, a tile holds one weight row (see [`run_rows`]).
const ONE_ROW_TILES_UP_TO: usize = 16;

/// Bytes of weights (quants and scales) kept hot in L1 while a tile of rows meets every group of
/// activation rows.
const TILE_BYTES: usize = 16 * 1024;

/// Computes rows `r0..r1` of the weight matrix against every activation row.
///
/// # Safety
/// `out` must be valid for writes of `a.n · w.rows` elements, `a.cols == w.cols`, `r1 ≤ w.rows`
/// (`r0` a multiple of 16 for Q4_K),
/// `a` must be prepared for `w.format`, and `level` must be runnable on this CPU.
unsafe fn run_rows(level: Level, w: &QMatrix, a: &Acts<'_>, r0: usize, r1: usize, out: *mut f32) {
    if band::banded(w.format) {
        // SAFETY: the caller's guarantees; `r0` is a whole number of bands (`matmul_many_with`).
        return unsafe { band::run_rows(level, w, a, r0, r1, out) };
    }
    let row_bytes = w.bytes() / w.rows.max(1);
    let tile = (TILE_BYTES / row_bytes.max(1)).max(1);
    let mut t0 = r0;
    while t0 < r1 {
        let t1 = (t0 + tile).min(r1);
        let mut b0 = 0;
        while b0 < a.n {
            let nb = (a.n - b0).min(4);
            // (Only Q5_K and the float formats reach these tiles: the others run in bands,
            // `band`.) Register tiles of several weight rows × `nb` activation rows (measured on
            // Zen 3 and Zen 4, whole forward passes and `benches/matmul.rs`): one activation row
            // takes two weight rows at once (Q5_K 10 % faster than one); a few activation rows
            // (a speculative draft, a handful of streams, up to `ONE_ROW_TILES_UP_TO`) one
            // weight row, 1.3–1.9× faster than two at 2–8 rows; more, two weight rows (eight
            // independent accumulator chains). The last rows of a range go one by one: same
            // operations per element, same bits.
            let nr = match nb {
                1 => 2,
                _ if a.n <= ONE_ROW_TILES_UP_TO => 1,
                _ => 2,
            };
            let mut r = t0;
            while r < t1 {
                let nr = if r + nr <= t1 { nr } else { 1 };
                let res = match level {
                    // SAFETY: the caller checked that the CPU has AVX-512 F/BW/VL and VNNI.
                    Level::Avx512Vnni => unsafe { avx512::dot_tile_vnni(w, r, nr, a, b0, nb) },
                    // SAFETY: the caller checked that the CPU has AVX-512 F/BW/VL.
                    Level::Avx512 => unsafe { avx512::dot_tile(w, r, nr, a, b0, nb) },
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
