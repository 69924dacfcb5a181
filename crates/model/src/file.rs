//! A GGUF model file, parsed once.
//!
//! [`GgufFile::open`] reads the metadata and the tensor descriptions with the vocabulary
//! crate's parser ([`nextok_vocab::gguf`]), which checks every size against the file's length
//! before anything is allocated from it. The same parsed metadata then serves the weights, the
//! vocabulary, the tokenizer and the chat template. Tensor data is mapped, not read: a loader
//! takes a tensor's bytes from the mapping, repacks them into its own planes, and then
//! [`GgufFile::release`]s them, so the mapped pages leave the process's resident memory as the
//! repacked copy replaces them, and nothing is copied or zeroed on the way (the pages stay in
//! the system's file cache). Like llama.cpp and candle, this assumes that nobody truncates the
//! file while a model loads from it (a mapping of a shrunk file faults).

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::{Mmap, UncheckedAdvice};

use nextok_vocab::gguf::{ggml_type_size, Gguf, GgufTensors, TensorInfo, Value};

use crate::error::{ModelError, ModelErrorKind, Result};

/// GGML type ids (the `ggml_type` of a tensor description).
pub mod ggml_type {
    /// 32-bit float.
    pub const F32: u32 = 0;
    /// IEEE half.
    pub const F16: u32 = 1;
    /// 4-bit, scale per 32.
    pub const Q4_0: u32 = 2;
    /// 4-bit, scale and minimum per 32.
    pub const Q4_1: u32 = 3;
    /// 5-bit, scale per 32.
    pub const Q5_0: u32 = 6;
    /// 5-bit, scale and minimum per 32.
    pub const Q5_1: u32 = 7;
    /// 8-bit, scale per 32.
    pub const Q8_0: u32 = 8;
    /// 2-bit K-quant (256 per super-block).
    pub const Q2_K: u32 = 10;
    /// 3-bit K-quant.
    pub const Q3_K: u32 = 11;
    /// 4-bit K-quant.
    pub const Q4_K: u32 = 12;
    /// 5-bit K-quant.
    pub const Q5_K: u32 = 13;
    /// 6-bit K-quant.
    pub const Q6_K: u32 = 14;
    /// 4-bit non-linear (a 16-value table), scale per 32.
    pub const IQ4_NL: u32 = 20;
    /// 4-bit non-linear, 6-bit scales per 32 in super-blocks of 256.
    pub const IQ4_XS: u32 = 23;
    /// brain float 16.
    pub const BF16: u32 = 30;

    /// GGML's name of a type id.
    pub fn name(t: u32) -> String {
        match t {
            F32 => "F32".into(),
            F16 => "F16".into(),
            Q4_0 => "Q4_0".into(),
            Q4_1 => "Q4_1".into(),
            Q5_0 => "Q5_0".into(),
            Q5_1 => "Q5_1".into(),
            Q8_0 => "Q8_0".into(),
            9 => "Q8_1".into(),
            Q2_K => "Q2_K".into(),
            Q3_K => "Q3_K".into(),
            Q4_K => "Q4_K".into(),
            Q5_K => "Q5_K".into(),
            Q6_K => "Q6_K".into(),
            15 => "Q8_K".into(),
            16 => "IQ2_XXS".into(),
            17 => "IQ2_XS".into(),
            18 => "IQ3_XXS".into(),
            19 => "IQ1_S".into(),
            IQ4_NL => "IQ4_NL".into(),
            21 => "IQ3_S".into(),
            22 => "IQ2_S".into(),
            IQ4_XS => "IQ4_XS".into(),
            24 => "I8".into(),
            25 => "I16".into(),
            26 => "I32".into(),
            27 => "I64".into(),
            28 => "F64".into(),
            29 => "IQ1_M".into(),
            BF16 => "BF16".into(),
            34 => "TQ1_0".into(),
            35 => "TQ2_0".into(),
            39 => "MXFP4".into(),
            other => format!("type {other}"),
        }
    }
}

/// A GGUF file: its metadata and tensor descriptions (parsed once), and the file mapped for
/// reading tensor data.
pub struct GgufFile {
    path: PathBuf,
    meta: Gguf,
    tensors: GgufTensors,
    index: HashMap<String, usize>,
    map: Mmap,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("tensors", &self.tensors.infos.len())
            .finish()
    }
}

fn format_err(msg: String) -> ModelError {
    ModelError::new(msg).with_kind(ModelErrorKind::Format)
}

impl GgufFile {
    /// Parses `path`'s metadata and tensor descriptions (every size checked against the file)
    /// and keeps the file open. Big-endian files are refused (tensor data is read
    /// little-endian); a tensor name that appears twice is an error naming it.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let (meta, tensors) = nextok_vocab::gguf::Gguf::read_file_with_tensors(path)?;
        if meta.big_endian {
            return Err(format_err(format!(
                "{}: big-endian GGUF files are not supported for models",
                path.display()
            )));
        }
        let mut index = HashMap::with_capacity(tensors.infos.len());
        for (i, t) in tensors.infos.iter().enumerate() {
            if index.insert(t.name.clone(), i).is_some() {
                return Err(format_err(format!(
                    "{}: tensor `{}` is described twice",
                    path.display(),
                    t.name
                )));
            }
        }
        let io_err = |what: &str, e: std::io::Error| {
            ModelError::new(format!("{}: cannot {what}: {e}", path.display()))
                .with_kind(ModelErrorKind::Io)
                .with_source(e)
        };
        let file = File::open(path).map_err(|e| io_err("open", e))?;
        // SAFETY: a read-only private mapping; the bytes are only read, and every tensor's range
        // was checked against the file's length when its description was parsed (see the
        // module docs for a file truncated meanwhile).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| io_err("map", e))?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            meta,
            tensors,
            index,
            map,
        })
    }

    /// Where the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The metadata.
    pub fn meta(&self) -> &Gguf {
        &self.meta
    }

    /// The metadata value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.meta.get(key)
    }

    /// The tensor descriptions, in the file's order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors.infos
    }

    /// Number of tensors the file describes.
    pub fn tensor_count(&self) -> usize {
        self.tensors.infos.len()
    }

    /// The description of tensor `name`.
    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors.infos[i])
    }

    /// The description of tensor `name`, or an error naming it.
    pub fn require(&self, name: &str) -> Result<&TensorInfo> {
        self.info(name).ok_or_else(|| {
            format_err(format!(
                "{}: tensor `{name}` is missing",
                self.path.display()
            ))
        })
    }

    /// The byte range of tensor `t` in the file.
    fn range(&self, t: &TensorInfo) -> Result<std::ops::Range<usize>> {
        let (block, size) = ggml_type_size(t.ggml_type).ok_or_else(|| {
            format_err(format!(
                "tensor `{}`: unknown format {}",
                t.name,
                ggml_type::name(t.ggml_type)
            ))
        })?;
        let elems: u64 = t.dims.iter().product();
        let too_large = || format_err(format!("tensor `{}`: outside the file", t.name));
        let n = usize::try_from(elems / block * size).map_err(|_| too_large())?;
        let start = self
            .tensors
            .data_offset
            .checked_add(t.offset)
            .and_then(|s| usize::try_from(s).ok())
            .ok_or_else(too_large)?;
        let end = start.checked_add(n).ok_or_else(too_large)?;
        if end > self.map.len() {
            return Err(too_large());
        }
        Ok(start..end)
    }

    /// The raw bytes of tensor `t`, from the mapping (its size was checked against the file at
    /// open, and is again here).
    pub fn bytes(&self, t: &TensorInfo) -> Result<&[u8]> {
        Ok(&self.map[self.range(t)?])
    }

    /// Drops the mapped pages that lie wholly inside tensor `t` from this process's resident
    /// memory (after its loader has copied what it needs); reading them again maps them again.
    pub fn release(&self, t: &TensorInfo) {
        let Ok(r) = self.range(t) else { return };
        let page = 4096;
        let (start, end) = (r.start.div_ceil(page) * page, r.end / page * page);
        if start < end {
            // SAFETY: a read-only private mapping that nothing writes: dropping its pages only
            // makes a later read fault them in again from the file, with the same bytes. No
            // reference into the range outlives this call in the loader (it has repacked them).
            let _ = unsafe {
                self.map
                    .unchecked_advise_range(UncheckedAdvice::DontNeed, start, end - start)
            };
        }
    }

    /// Tensor `name` as `f32` values (F32, F16 or BF16 tensors read directly, any other format
    /// dequantised), checked to hold `len` finite values.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let t = self.require(name)?;
        let elems: u64 = t.dims.iter().product();
        if elems != len as u64 {
            return Err(format_err(format!(
                "tensor `{name}`: {elems} values, expected {len}"
            )));
        }
        let b = self.bytes(t)?;
        let v = to_f32(
            name,
            t.ggml_type,
            b,
            t.dims.iter().map(|&d| d as usize).collect(),
        )?;
        if v.iter().any(|x| !x.is_finite()) {
            return Err(format_err(format!(
                "tensor `{name}` holds non-finite values"
            )));
        }
        Ok(v)
    }
}

/// The values of a tensor of GGML type `t` as `f32`: F32, F16 and BF16 read directly, any other
/// format dequantised ([`dequantize`]). `dims` in GGUF order.
pub(crate) fn to_f32(name: &str, t: u32, b: &[u8], dims: Vec<usize>) -> Result<Vec<f32>> {
    Ok(match t {
        ggml_type::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        ggml_type::F16 => b
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        ggml_type::BF16 => b
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        ggml_type::IQ4_NL | ggml_type::IQ4_XS => dequantize_iq4(t, b),
        other => dequantize(name, other, b, dims)?,
    })
}

/// llama.cpp's table of the 16 values an IQ4_NL / IQ4_XS quant stands for (`kvalues_iq4nl`).
const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// IQ4_NL (`t` = 20: blocks of 32, an `f16` scale and 16 bytes of nibbles) or IQ4_XS (23:
/// super-blocks of 256 with 6-bit scales per 32) as llama.cpp's `dequantize_row_iq4_nl` /
/// `_iq4_xs` compute them (the byte count was checked against the tensor's dimensions).
fn dequantize_iq4(t: u32, b: &[u8]) -> Vec<f32> {
    let f16 = |lo: u8, hi: u8| half::f16::from_le_bytes([lo, hi]).to_f32();
    // 32 values from 16 bytes of nibbles: the low nibbles first, then the high ones
    let nibbles = |out: &mut Vec<f32>, dl: f32, qs: &[u8]| {
        let lo = qs
            .iter()
            .map(|&q| dl * f32::from(IQ4_VALUES[usize::from(q & 0xf)]));
        out.extend(lo);
        let hi = qs
            .iter()
            .map(|&q| dl * f32::from(IQ4_VALUES[usize::from(q >> 4)]));
        out.extend(hi);
    };
    let mut out = Vec::with_capacity(b.len() * 2);
    if t == ggml_type::IQ4_NL {
        for blk in b.chunks_exact(18) {
            nibbles(&mut out, f16(blk[0], blk[1]), &blk[2..]);
        }
    } else {
        for blk in b.chunks_exact(136) {
            let d = f16(blk[0], blk[1]);
            let scales_h = u16::from_le_bytes([blk[2], blk[3]]);
            let (scales_l, qs) = (&blk[4..8], &blk[8..]);
            for ib in 0..8 {
                let ls = i32::from((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf)
                    | (i32::from((scales_h >> (2 * ib)) & 3) << 4);
                nibbles(&mut out, d * (ls - 32) as f32, &qs[ib * 16..(ib + 1) * 16]);
            }
        }
    }
    out
}

/// Dequantises GGML blocks of type `t` with candle's reference code (the formats nextok has no
/// kernel of its own for). `dims` in GGUF order (first varies fastest).
pub(crate) fn dequantize(
    name: &str,
    t: u32,
    bytes: &[u8],
    mut dims: Vec<usize>,
) -> Result<Vec<f32>> {
    use candle_core::quantized::GgmlDType;
    let dt = match t {
        ggml_type::Q4_0 => GgmlDType::Q4_0,
        ggml_type::Q4_1 => GgmlDType::Q4_1,
        ggml_type::Q5_0 => GgmlDType::Q5_0,
        ggml_type::Q5_1 => GgmlDType::Q5_1,
        ggml_type::Q8_0 => GgmlDType::Q8_0,
        ggml_type::Q2_K => GgmlDType::Q2K,
        ggml_type::Q3_K => GgmlDType::Q3K,
        ggml_type::Q4_K => GgmlDType::Q4K,
        ggml_type::Q5_K => GgmlDType::Q5K,
        ggml_type::Q6_K => GgmlDType::Q6K,
        other => {
            return Err(format_err(format!(
                "tensor `{name}`: format {} is not supported",
                ggml_type::name(other)
            )))
        }
    };
    dims.reverse();
    let q = candle_core::quantized::ggml_file::qtensor_from_ggml(
        dt,
        bytes,
        dims,
        &candle_core::Device::Cpu,
    )?;
    Ok(q.dequantize(&candle_core::Device::Cpu)?
        .flatten_all()?
        .to_vec1::<f32>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// IQ4_XS by hand: scale 1, 6-bit block scales `(ib + 1) + 32` (low nibbles 1..8, high bits
    /// all 2), every byte `0xF0` (low nibble → −127, high nibble → 113).
    #[test]
    fn iq4_xs_blocks_dequantise_as_llama_cpp_defines_them() {
        let mut b = vec![0x00, 0x3C, 0xAA, 0xAA, 0x21, 0x43, 0x65, 0x87];
        b.extend([0xF0u8; 128]);
        let v = to_f32("t", ggml_type::IQ4_XS, &b, vec![256]).unwrap();
        assert_eq!(v.len(), 256);
        for (ib, block) in v.chunks_exact(32).enumerate() {
            let dl = (ib + 1) as f32;
            assert!(
                block[..16].iter().all(|&x| x == -127.0 * dl),
                "{ib}: {block:?}"
            );
            assert!(
                block[16..].iter().all(|&x| x == 113.0 * dl),
                "{ib}: {block:?}"
            );
        }
        // IQ4_NL: scale 0.5, value j in byte j's low nibble (index j % 16), value j + 16 in
        // its high nibble (index 15 − j % 16)
        let mut b = vec![0x00, 0x38];
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let v = to_f32("t", ggml_type::IQ4_NL, &b, vec![32]).unwrap();
        for j in 0..16 {
            assert_eq!(v[j], 0.5 * f32::from(IQ4_VALUES[j]));
            assert_eq!(v[j + 16], 0.5 * f32::from(IQ4_VALUES[15 - j]));
        }
    }
}
