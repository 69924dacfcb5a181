//! A small reader of GGUF metadata (versions 2 and 3, little- or big-endian).
//!
//! A GGUF file starts with the magic `GGUF`, a `u32` version, the tensor count and the
//! metadata key–value count (`u64` each), then the key–value pairs: a string key, a `u32`
//! value type and the value. Strings are a `u64` byte length and UTF-8 bytes; arrays are a
//! `u32` element type, a `u64` count and the elements (arrays may nest). Tensor descriptions
//! and tensor data follow; this reader stops before them, so a model of any size is read in
//! the time its vocabulary takes.
//!
//! Every length is checked against the bytes left in the file before anything is allocated,
//! so a truncated or corrupt file is an error naming the key, never a huge allocation.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use crate::error::{Result, VocabError, VocabErrorKind};

/// The four bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";

/// Deepest nesting of arrays accepted.
const MAX_DEPTH: usize = 8;

/// Whether the file at `path` starts with the GGUF magic (an error only if it cannot be read).
pub fn has_gguf_magic(path: &Path) -> Result<bool> {
    let label = path.display().to_string();
    let mut f = File::open(path).map_err(|e| VocabError::io(&label, e))?;
    let mut m = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match f.read(&mut m[got..]) {
            Ok(0) => return Ok(false),
            Ok(k) => got += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(VocabError::io(&label, e)),
        }
    }
    Ok(m == MAGIC)
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Type 0.
    U8(u8),
    /// Type 1.
    I8(i8),
    /// Type 2.
    U16(u16),
    /// Type 3.
    I16(i16),
    /// Type 4.
    U32(u32),
    /// Type 5.
    I32(i32),
    /// Type 6.
    F32(f32),
    /// Type 7.
    Bool(bool),
    /// Type 8.
    String(String),
    /// Type 9.
    Array(Array),
    /// Type 10.
    U64(u64),
    /// Type 11.
    I64(i64),
    /// Type 12.
    F64(f64),
}

/// An array value: all elements of one type.
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    /// Elements of type 0.
    U8(Vec<u8>),
    /// Elements of type 1.
    I8(Vec<i8>),
    /// Elements of type 2.
    U16(Vec<u16>),
    /// Elements of type 3.
    I16(Vec<i16>),
    /// Elements of type 4.
    U32(Vec<u32>),
    /// Elements of type 5.
    I32(Vec<i32>),
    /// Elements of type 6.
    F32(Vec<f32>),
    /// Elements of type 7.
    Bool(Vec<bool>),
    /// Elements of type 8.
    String(Vec<String>),
    /// Elements of type 9 (each with its own element type).
    Array(Vec<Array>),
    /// Elements of type 10.
    U64(Vec<u64>),
    /// Elements of type 11.
    I64(Vec<i64>),
    /// Elements of type 12.
    F64(Vec<f64>),
}

/// The GGUF name of value type `t`.
pub fn type_name(t: u32) -> &'static str {
    match t {
        0 => "uint8",
        1 => "int8",
        2 => "uint16",
        3 => "int16",
        4 => "uint32",
        5 => "int32",
        6 => "float32",
        7 => "bool",
        8 => "string",
        9 => "array",
        10 => "uint64",
        11 => "int64",
        12 => "float64",
        _ => "unknown",
    }
}

impl Value {
    /// The GGUF value type number.
    pub fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::String(_) => 8,
            Value::Array(_) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }

    /// An integer value of any integer type, as `i128` (so every type fits).
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(x) => x as i128,
            Value::I8(x) => x as i128,
            Value::U16(x) => x as i128,
            Value::I16(x) => x as i128,
            Value::U32(x) => x as i128,
            Value::I32(x) => x as i128,
            Value::U64(x) => x as i128,
            Value::I64(x) => x as i128,
            _ => return None,
        })
    }

    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// A boolean value.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// An array value.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl Array {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The GGUF element type number.
    pub fn element_type(&self) -> u32 {
        match self {
            Array::U8(_) => 0,
            Array::I8(_) => 1,
            Array::U16(_) => 2,
            Array::I16(_) => 3,
            Array::U32(_) => 4,
            Array::I32(_) => 5,
            Array::F32(_) => 6,
            Array::Bool(_) => 7,
            Array::String(_) => 8,
            Array::Array(_) => 9,
            Array::U64(_) => 10,
            Array::I64(_) => 11,
            Array::F64(_) => 12,
        }
    }

    /// The elements of a string array.
    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            Array::String(v) => Some(v),
            _ => None,
        }
    }

    /// The elements of an integer array of any integer type, as `i64` (`u64` values above
    /// `i64::MAX` give `None`).
    pub fn to_i64s(&self) -> Option<Vec<i64>> {
        fn conv<T: Copy>(v: &[T], f: impl Fn(T) -> Option<i64>) -> Option<Vec<i64>> {
            v.iter().map(|&x| f(x)).collect()
        }
        match self {
            Array::U8(v) => conv(v, |x| Some(x as i64)),
            Array::I8(v) => conv(v, |x| Some(x as i64)),
            Array::U16(v) => conv(v, |x| Some(x as i64)),
            Array::I16(v) => conv(v, |x| Some(x as i64)),
            Array::U32(v) => conv(v, |x| Some(x as i64)),
            Array::I32(v) => conv(v, |x| Some(x as i64)),
            Array::U64(v) => conv(v, |x| i64::try_from(x).ok()),
            Array::I64(v) => conv(v, Some),
            _ => None,
        }
    }
}

/// Most dimensions of a GGUF tensor (GGML's `GGML_MAX_DIMS`).
pub const MAX_TENSOR_DIMS: usize = 4;

/// One tensor description of a GGUF file (dimensions in file order: the first varies fastest).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Tensor name.
    pub name: String,
    /// Dimensions.
    pub dims: Vec<u64>,
    /// GGML type id.
    pub ggml_type: u32,
    /// Offset of its data from the start of the data section.
    pub offset: u64,
}

/// The tensor descriptions of a GGUF file, each checked to lie inside the file.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensors {
    /// The descriptions, in file order.
    pub infos: Vec<TensorInfo>,
    /// Where the data section starts.
    pub data_offset: u64,
    /// The file's length.
    pub file_len: u64,
}

/// `(elements per block, bytes per block)` of a GGML type id (ggml's block structs), `None` when
/// unknown.
pub fn ggml_type_size(t: u32) -> Option<(u64, u64)> {
    Some(match t {
        0 => (1, 4),      // F32
        1 => (1, 2),      // F16
        2 => (32, 18),    // Q4_0
        3 => (32, 20),    // Q4_1
        6 => (32, 22),    // Q5_0
        7 => (32, 24),    // Q5_1
        8 => (32, 34),    // Q8_0
        9 => (32, 36),    // Q8_1
        10 => (256, 84),  // Q2_K
        11 => (256, 110), // Q3_K
        12 => (256, 144), // Q4_K
        13 => (256, 176), // Q5_K
        14 => (256, 210), // Q6_K
        15 => (256, 292), // Q8_K
        16 => (256, 66),  // IQ2_XXS
        17 => (256, 74),  // IQ2_XS
        18 => (256, 98),  // IQ3_XXS
        19 => (256, 50),  // IQ1_S
        20 => (32, 18),   // IQ4_NL
        21 => (256, 110), // IQ3_S
        22 => (256, 82),  // IQ2_S
        23 => (256, 136), // IQ4_XS
        24 => (1, 1),     // I8
        25 => (1, 2),     // I16
        26 => (1, 4),     // I32
        27 => (1, 8),     // I64
        28 => (1, 8),     // F64
        29 => (256, 56),  // IQ1_M
        30 => (1, 2),     // BF16
        34 => (256, 54),  // TQ1_0
        35 => (256, 66),  // TQ2_0
        39 => (32, 17),   // MXFP4
        _ => return None,
    })
}

/// GGUF metadata: header and key–value pairs in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct Gguf {
    /// Format version (2 or 3).
    pub version: u32,
    /// Whether the file is big-endian.
    pub big_endian: bool,
    /// Number of tensors described after the metadata (not read).
    pub tensor_count: u64,
    /// The key–value pairs, in file order.
    pub metadata: Vec<(String, Value)>,
    /// Offset of the first byte after the metadata (where tensor descriptions start).
    pub metadata_end: u64,
}

impl Gguf {
    /// Reads the metadata of the GGUF file at `path`.
    pub fn read_file(path: impl AsRef<Path>) -> Result<Gguf> {
        let path = path.as_ref();
        let label = path.display().to_string();
        let io = |e: std::io::Error| VocabError::io(&label, e);
        let f = File::open(path).map_err(io)?;
        let len = f.metadata().map_err(io)?.len();
        Gguf::read_from(BufReader::with_capacity(1 << 20, f), len, &label)
    }

    /// Reads metadata from `data` (a whole file or at least its metadata part).
    pub fn from_bytes(data: &[u8], label: &str) -> Result<Gguf> {
        Gguf::read_from(data, data.len() as u64, label)
    }

    /// Reads metadata from `r`, which holds at most `len` bytes; `label` names it in errors.
    pub fn read_from<R: Read>(r: R, len: u64, label: &str) -> Result<Gguf> {
        let mut rd = Reader {
            r,
            pos: 0,
            len,
            be: false,
            label,
            field: "header".into(),
        };
        Gguf::read_metadata(&mut rd)
    }

    /// Reads the metadata and the tensor descriptions of the GGUF file at `path`, checking every
    /// description against the file: at most [`MAX_TENSOR_DIMS`] dimensions, an element count
    /// that does not overflow, a known type whose blocks divide the first dimension, and data
    /// that lies inside the file. A loader that allocates from these sizes afterwards allocates
    /// at most what the file holds.
    pub fn read_file_with_tensors(path: impl AsRef<Path>) -> Result<(Gguf, GgufTensors)> {
        let path = path.as_ref();
        let label = path.display().to_string();
        let io = |e: std::io::Error| VocabError::io(&label, e);
        let f = File::open(path).map_err(io)?;
        let len = f.metadata().map_err(io)?.len();
        let mut rd = Reader {
            r: BufReader::with_capacity(1 << 20, f),
            pos: 0,
            len,
            be: false,
            label: &label,
            field: "header".into(),
        };
        let g = Gguf::read_metadata(&mut rd)?;
        // each description takes at least 8 (name length) + 4 (dims) + 4 (type) + 8 (offset)
        rd.field = "tensor_count".into();
        rd.check(g.tensor_count, 24, "tensor descriptions")?;
        let mut infos = Vec::with_capacity(g.tensor_count as usize);
        for i in 0..g.tensor_count {
            rd.field = format!("tensors[{i}].name");
            let name = rd.string()?;
            rd.field = format!("tensor `{name}`");
            let n_dims = rd.u32()?;
            if n_dims as usize > MAX_TENSOR_DIMS {
                return Err(rd.err(
                    VocabErrorKind::Parse,
                    format!("{n_dims} dimensions (at most {MAX_TENSOR_DIMS})"),
                ));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(rd.u64()?);
            }
            let ggml_type = rd.u32()?;
            let offset = rd.u64()?;
            infos.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
            });
        }
        rd.field = "general.alignment".into();
        let alignment = match g.get("general.alignment").map(|v| v.as_int()) {
            None => 32,
            Some(Some(a)) if a > 0 && (a as u64).is_power_of_two() && a <= 1 << 20 => a as u64,
            Some(a) => {
                return Err(rd.err(
                    VocabErrorKind::Parse,
                    format!("{a:?} is not a power of two up to 2^20"),
                ))
            }
        };
        let data_offset = rd.pos.div_ceil(alignment) * alignment;
        for t in &infos {
            rd.field = format!("tensor `{}`", t.name);
            let elems = t
                .dims
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .filter(|&n| n <= 1 << 48);
            let Some(elems) = elems else {
                return Err(rd.err(
                    VocabErrorKind::Parse,
                    format!("dimensions {:?}: the element count overflows", t.dims),
                ));
            };
            let Some((block, size)) = ggml_type_size(t.ggml_type) else {
                return Err(rd.err(
                    VocabErrorKind::Unsupported,
                    format!("unknown tensor type {}", t.ggml_type),
                ));
            };
            if t.dims.first().is_some_and(|d| d % block != 0) {
                return Err(rd.err(
                    VocabErrorKind::Parse,
                    format!(
                        "dimensions {:?}: the first is not a multiple of the type's block of {block}",
                        t.dims
                    ),
                ));
            }
            let bytes = elems / block * size;
            let end = data_offset
                .checked_add(t.offset)
                .and_then(|s| s.checked_add(bytes));
            if end.is_none_or(|e| e > len) {
                return Err(rd.err(
                    VocabErrorKind::Parse,
                    format!(
                        "dimensions {:?} ({bytes} bytes at data offset {}) do not fit in the {len}-byte file (truncated or corrupt)",
                        t.dims, t.offset
                    ),
                ));
            }
        }
        Ok((
            g,
            GgufTensors {
                infos,
                data_offset,
                file_len: len,
            },
        ))
    }

    fn read_metadata<R: Read>(rd: &mut Reader<'_, R>) -> Result<Gguf> {
        let magic = rd.take::<4>()?;
        if magic != MAGIC {
            return Err(rd.err(
                VocabErrorKind::Parse,
                format!("not a GGUF file (magic {:02x?}, expected \"GGUF\")", magic),
            ));
        }
        let vb = rd.take::<4>()?;
        let (version, be) = match (u32::from_le_bytes(vb), u32::from_be_bytes(vb)) {
            (v @ (2 | 3), _) => (v, false),
            (_, v @ (2 | 3)) => (v, true),
            (1, _) | (_, 1) => {
                return Err(rd.err(
                    VocabErrorKind::Unsupported,
                    "GGUF version 1 is not supported (versions 2 and 3 are)".into(),
                ))
            }
            (v, _) => {
                return Err(rd.err(
                    VocabErrorKind::Unsupported,
                    format!("unknown GGUF version {v}"),
                ))
            }
        };
        rd.be = be;
        let tensor_count = rd.u64()?;
        let kv_count = rd.u64()?;
        // Each pair takes at least 8 (key length) + 4 (type) + 1 bytes.
        rd.check(kv_count, 13, "metadata count")?;
        let mut metadata = Vec::with_capacity(kv_count as usize);
        for i in 0..kv_count {
            rd.field = format!("metadata[{i}].key");
            let key = rd.string()?;
            rd.field = key.clone();
            let t = rd.u32()?;
            let v = rd.value(t, 0)?;
            metadata.push((key, v));
        }
        Ok(Gguf {
            version,
            big_endian: be,
            tensor_count,
            metadata,
            metadata_end: rd.pos,
        })
    }

    /// The value of `key` (the first, if a file repeats it).
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

struct Reader<'l, R> {
    r: R,
    pos: u64,
    len: u64,
    be: bool,
    label: &'l str,
    field: String,
}

macro_rules! num {
    ($name:ident, $t:ty, $n:literal) => {
        fn $name(&mut self) -> Result<$t> {
            let b = self.take::<$n>()?;
            Ok(if self.be {
                <$t>::from_be_bytes(b)
            } else {
                <$t>::from_le_bytes(b)
            })
        }
    };
}

macro_rules! nums {
    ($self:ident, $count:ident, $variant:ident, $read:ident, $size:literal) => {{
        $self.check($count, $size, "array")?;
        let mut v = Vec::with_capacity($count as usize);
        for _ in 0..$count {
            v.push($self.$read()?);
        }
        Array::$variant(v)
    }};
}

impl<R: Read> Reader<'_, R> {
    fn err(&self, kind: VocabErrorKind, msg: String) -> VocabError {
        VocabError::new(kind, self.label, msg).with_field(self.field.clone())
    }

    /// Errors unless `count` items of at least `size` bytes each fit in what is left.
    fn check(&self, count: u64, size: u64, what: &str) -> Result<()> {
        let left = self.len.saturating_sub(self.pos);
        if count.checked_mul(size).is_none_or(|need| need > left) {
            return Err(self.err(
                VocabErrorKind::Parse,
                format!(
                    "{what} of {count} elements at offset {} does not fit in the {left} bytes left (truncated or corrupt file)",
                    self.pos
                ),
            ));
        }
        Ok(())
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.fill(&mut b)?;
        Ok(b)
    }

    fn fill(&mut self, b: &mut [u8]) -> Result<()> {
        if (b.len() as u64) > self.len.saturating_sub(self.pos) {
            return Err(self.truncated());
        }
        self.r.read_exact(b).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                self.truncated()
            } else {
                self.err(VocabErrorKind::Io, format!("cannot read: {e}"))
            }
        })?;
        self.pos += b.len() as u64;
        Ok(())
    }

    fn truncated(&self) -> VocabError {
        self.err(
            VocabErrorKind::Parse,
            format!("file ends at offset {} (truncated GGUF)", self.pos),
        )
    }

    num!(u8, u8, 1);
    num!(i8, i8, 1);
    num!(u16, u16, 2);
    num!(i16, i16, 2);
    num!(u32, u32, 4);
    num!(i32, i32, 4);
    num!(f32, f32, 4);
    num!(u64, u64, 8);
    num!(i64, i64, 8);
    num!(f64, f64, 8);

    fn bool(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(self.err(VocabErrorKind::Parse, format!("invalid bool byte {b}"))),
        }
    }

    fn string(&mut self) -> Result<String> {
        let n = self.u64()?;
        self.check(n, 1, "string")?;
        let mut b = vec![0u8; n as usize];
        self.fill(&mut b)?;
        String::from_utf8(b).map_err(|e| {
            self.err(
                VocabErrorKind::Parse,
                format!("string at offset {} is not UTF-8: {e}", self.pos - n),
            )
        })
    }

    fn value(&mut self, t: u32, depth: usize) -> Result<Value> {
        Ok(match t {
            0 => Value::U8(self.u8()?),
            1 => Value::I8(self.i8()?),
            2 => Value::U16(self.u16()?),
            3 => Value::I16(self.i16()?),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(self.i32()?),
            6 => Value::F32(self.f32()?),
            7 => Value::Bool(self.bool()?),
            8 => Value::String(self.string()?),
            9 => Value::Array(self.array(depth)?),
            10 => Value::U64(self.u64()?),
            11 => Value::I64(self.i64()?),
            12 => Value::F64(self.f64()?),
            t => return Err(self.err(VocabErrorKind::Parse, format!("unknown value type {t}"))),
        })
    }

    fn array(&mut self, depth: usize) -> Result<Array> {
        if depth >= MAX_DEPTH {
            return Err(self.err(
                VocabErrorKind::Parse,
                format!("arrays nested deeper than {MAX_DEPTH}"),
            ));
        }
        let et = self.u32()?;
        let n = self.u64()?;
        Ok(match et {
            0 => nums!(self, n, U8, u8, 1),
            1 => nums!(self, n, I8, i8, 1),
            2 => nums!(self, n, U16, u16, 2),
            3 => nums!(self, n, I16, i16, 2),
            4 => nums!(self, n, U32, u32, 4),
            5 => nums!(self, n, I32, i32, 4),
            6 => nums!(self, n, F32, f32, 4),
            7 => nums!(self, n, Bool, bool, 1),
            8 => nums!(self, n, String, string, 8),
            9 => {
                self.check(n, 12, "array")?;
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.array(depth + 1)?);
                }
                Array::Array(v)
            }
            10 => nums!(self, n, U64, u64, 8),
            11 => nums!(self, n, I64, i64, 8),
            12 => nums!(self, n, F64, f64, 8),
            t => {
                return Err(self.err(
                    VocabErrorKind::Parse,
                    format!("unknown array element type {t}"),
                ))
            }
        })
    }
}

/// Writes GGUF metadata (no tensors): the inverse of [`Gguf::read_from`], for tests and tools
/// that need a small GGUF file.
pub fn write_metadata(version: u32, big_endian: bool, metadata: &[(String, Value)]) -> Vec<u8> {
    struct W {
        out: Vec<u8>,
        be: bool,
    }
    macro_rules! put {
        ($w:expr, $x:expr) => {{
            let x = $x;
            if $w.be {
                $w.out.extend_from_slice(&x.to_be_bytes())
            } else {
                $w.out.extend_from_slice(&x.to_le_bytes())
            }
        }};
    }
    fn string(w: &mut W, s: &str) {
        put!(w, s.len() as u64);
        w.out.extend_from_slice(s.as_bytes());
    }
    fn array(w: &mut W, a: &Array) {
        put!(w, a.element_type());
        put!(w, a.len() as u64);
        match a {
            Array::U8(v) => v.iter().for_each(|x| put!(w, *x)),
            Array::I8(v) => v.iter().for_each(|x| put!(w, *x)),
            Array::U16(v) => v.iter().for_each(|x| put!(w, *x)),
            Array::I16(v) => v.iter().for_each(|x| put!(w, *x)),
            Array::U32(v) => v.iter().for_each(|x| put!(w, *x)),
            Array::I32(v) => v.iter().for_each(|x| put!(w, *x)),
            Array::F32(v) => v.iter().for_each(|x| put!(w, *x)),
            Array::Bool(v) => v.iter().for_each(|x| w.out.push(*x as u8)),
            Array::String(v) => v.iter().for_each(|x| string(w, x)),
            Array::Array(v) => v.iter().for_each(|x| array(w, x)),
            Array::U64(v) => v.iter().for_each(|x| put!(w, *x)),
            Array::I64(v) => v.iter().for_each(|x| put!(w, *x)),
            Array::F64(v) => v.iter().for_each(|x| put!(w, *x)),
        }
    }
    fn value(w: &mut W, v: &Value) {
        match v {
            Value::U8(x) => put!(w, *x),
            Value::I8(x) => put!(w, *x),
            Value::U16(x) => put!(w, *x),
            Value::I16(x) => put!(w, *x),
            Value::U32(x) => put!(w, *x),
            Value::I32(x) => put!(w, *x),
            Value::F32(x) => put!(w, *x),
            Value::Bool(x) => w.out.push(*x as u8),
            Value::String(s) => string(w, s),
            Value::Array(a) => array(w, a),
            Value::U64(x) => put!(w, *x),
            Value::I64(x) => put!(w, *x),
            Value::F64(x) => put!(w, *x),
        }
    }
    let mut w = W {
        out: MAGIC.to_vec(),
        be: big_endian,
    };
    put!(w, version);
    put!(w, 0u64);
    put!(w, metadata.len() as u64);
    for (k, v) in metadata {
        string(&mut w, k);
        put!(w, v.type_id());
        value(&mut w, v);
    }
    w.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_type() -> Vec<(String, Value)> {
        vec![
            ("u8".into(), Value::U8(200)),
            ("i8".into(), Value::I8(-5)),
            ("u16".into(), Value::U16(60000)),
            ("i16".into(), Value::I16(-30000)),
            ("u32".into(), Value::U32(4_000_000_000)),
            ("i32".into(), Value::I32(-2_000_000_000)),
            ("f32".into(), Value::F32(1.5)),
            ("bool".into(), Value::Bool(true)),
            ("str".into(), Value::String("héllo".into())),
            ("u64".into(), Value::U64(u64::MAX)),
            ("i64".into(), Value::I64(i64::MIN)),
            ("f64".into(), Value::F64(-0.25)),
            ("a.u8".into(), Value::Array(Array::U8(vec![1, 2]))),
            ("a.i8".into(), Value::Array(Array::I8(vec![-1]))),
            ("a.u16".into(), Value::Array(Array::U16(vec![7]))),
            ("a.i16".into(), Value::Array(Array::I16(vec![-7]))),
            ("a.u32".into(), Value::Array(Array::U32(vec![9, 10]))),
            ("a.i32".into(), Value::Array(Array::I32(vec![1, 3, 6]))),
            ("a.f32".into(), Value::Array(Array::F32(vec![0.5]))),
            (
                "a.bool".into(),
                Value::Array(Array::Bool(vec![true, false])),
            ),
            (
                "a.str".into(),
                Value::Array(Array::String(vec!["a".into(), "".into()])),
            ),
            ("a.u64".into(), Value::Array(Array::U64(vec![u64::MAX]))),
            ("a.i64".into(), Value::Array(Array::I64(vec![-9]))),
            ("a.f64".into(), Value::Array(Array::F64(vec![2.0]))),
            (
                "a.nested".into(),
                Value::Array(Array::Array(vec![
                    Array::String(vec!["x".into()]),
                    Array::I32(vec![]),
                ])),
            ),
        ]
    }

    #[test]
    fn round_trips_every_type_both_endians_both_versions() {
        let md = every_type();
        for version in [2, 3] {
            for be in [false, true] {
                let bytes = write_metadata(version, be, &md);
                let g = Gguf::from_bytes(&bytes, "t.gguf").unwrap();
                assert_eq!(g.version, version);
                assert_eq!(g.big_endian, be);
                assert_eq!(g.metadata, md);
                assert_eq!(g.metadata_end, bytes.len() as u64);
                assert_eq!(g.get("str").unwrap().as_str(), Some("héllo"));
                assert_eq!(g.get("u64").unwrap().as_int(), Some(u64::MAX as i128));
                assert_eq!(
                    g.get("a.i32").unwrap().as_array().unwrap().to_i64s(),
                    Some(vec![1, 3, 6])
                );
            }
        }
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = write_metadata(3, false, &every_type());
        for cut in 0..bytes.len() {
            let e = Gguf::from_bytes(&bytes[..cut], "t.gguf").unwrap_err();
            assert_eq!(e.kind(), VocabErrorKind::Parse, "cut {cut}: {e}");
        }
    }

    #[test]
    fn bad_headers_and_values() {
        let e = Gguf::from_bytes(b"GGML\x03\0\0\0", "t.gguf").unwrap_err();
        assert!(e.to_string().contains("not a GGUF file"), "{e}");
        let e = Gguf::from_bytes(b"GGUF\x01\0\0\0", "t.gguf").unwrap_err();
        assert_eq!(e.kind(), VocabErrorKind::Unsupported);
        let e = Gguf::from_bytes(b"GGUF\x07\0\0\0", "t.gguf").unwrap_err();
        assert!(e.to_string().contains("unknown GGUF version 7"), "{e}");

        // A huge array count is refused before allocating.
        let mut b = write_metadata(3, false, &[]);
        b[16..24].copy_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&3u64.to_le_bytes());
        b.extend_from_slice(b"key");
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&8u32.to_le_bytes());
        b.extend_from_slice(&u64::MAX.to_le_bytes());
        let e = Gguf::from_bytes(&b, "t.gguf").unwrap_err();
        assert_eq!(e.field(), Some("key"));
        assert!(e.to_string().contains("does not fit"), "{e}");

        // Unknown value type, invalid bool, invalid UTF-8.
        for (t, payload, msg) in [
            (13u32, vec![], "unknown value type 13"),
            (7, vec![2u8], "invalid bool byte 2"),
            (
                8,
                [2u64.to_le_bytes().to_vec(), vec![0xff, 0xfe]].concat(),
                "not UTF-8",
            ),
        ] {
            let mut b = write_metadata(3, false, &[]);
            b[16..24].copy_from_slice(&1u64.to_le_bytes());
            b.extend_from_slice(&1u64.to_le_bytes());
            b.extend_from_slice(b"k");
            b.extend_from_slice(&t.to_le_bytes());
            b.extend_from_slice(&payload);
            let e = Gguf::from_bytes(&b, "t.gguf").unwrap_err();
            assert_eq!(e.field(), Some("k"));
            assert!(e.to_string().contains(msg), "{e}");
        }
    }
}
