//! A GGUF writer for the model crate's tests: tiny models built in the test itself.

#![allow(dead_code)]

use nextok_vocab::gguf::{write_metadata, Value as G};

pub mod tiny;

/// A tensor: name, dimensions (first varies fastest), GGML type, data.
pub struct T {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: u32,
    pub data: Vec<u8>,
}

pub fn f32s(name: &str, dims: &[u64], v: f32) -> T {
    let n: u64 = dims.iter().product();
    T {
        name: name.into(),
        dims: dims.to_vec(),
        ty: 0,
        data: (0..n).flat_map(|_| v.to_le_bytes()).collect(),
    }
}

/// A GGUF v3 file: the metadata, the tensor descriptions, then the data (32-byte aligned).
pub fn gguf(md: &[(String, G)], tensors: &[T]) -> Vec<u8> {
    let mut out = write_metadata(3, false, md);
    out[8..16].copy_from_slice(&(tensors.len() as u64).to_le_bytes());
    let mut offset = 0u64;
    for t in tensors {
        out.extend_from_slice(&(t.name.len() as u64).to_le_bytes());
        out.extend_from_slice(t.name.as_bytes());
        out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&t.ty.to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        offset += (t.data.len() as u64).div_ceil(32) * 32;
    }
    while !out.len().is_multiple_of(32) {
        out.push(0);
    }
    for t in tensors {
        out.extend_from_slice(&t.data);
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
    }
    out
}

/// SplitMix64: a small seeded generator (the same sequence in any language).
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[-a, a)`, from the top 24 bits (exact in `f32`).
    pub fn uniform(&mut self, a: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        (2.0 * u - 1.0) * a
    }
}

/// An F32 tensor of seeded values: uniform in `[-a, a)` plus `offset`.
pub fn random(name: &str, dims: &[u64], rng: &mut Rng, a: f32, offset: f32) -> T {
    let n: u64 = dims.iter().product();
    T {
        name: name.into(),
        dims: dims.to_vec(),
        ty: 0,
        data: (0..n)
            .flat_map(|_| (offset + rng.uniform(a)).to_le_bytes())
            .collect(),
    }
}
