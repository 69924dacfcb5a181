//! PLACEHOLDER (replaced by the real kernels before commit): dequantised f32 reference.
#![allow(missing_docs, clippy::all)]
use candle_core::quantized::{GgmlDType, QTensor};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatFormat {
    Q4_1,
    Q8_0,
}

#[derive(Debug)]
pub struct KernelError(String);
impl std::fmt::Display for KernelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for KernelError {}

pub struct QMatrix {
    format: MatFormat,
    rows: usize,
    cols: usize,
    w: Vec<f32>,
}
impl QMatrix {
    pub fn from_qtensor(t: &QTensor) -> Result<QMatrix, KernelError> {
        let dims = t.shape().dims().to_vec();
        let format = match t.dtype() {
            GgmlDType::Q4_1 => MatFormat::Q4_1,
            _ => MatFormat::Q8_0,
        };
        let f = t
            .dequantize(&candle_core::Device::Cpu)
            .map_err(|e| KernelError(e.to_string()))?;
        let w = f.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        Ok(QMatrix {
            format,
            rows: dims[0],
            cols: dims[1],
            w,
        })
    }
    pub fn quantize_q8_0(rows: usize, cols: usize, data: &[f32]) -> Result<QMatrix, KernelError> {
        Ok(QMatrix {
            format: MatFormat::Q8_0,
            rows,
            cols,
            w: data.to_vec(),
        })
    }
    pub fn format(&self) -> MatFormat {
        self.format
    }
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        out.copy_from_slice(&self.w[r * self.cols..(r + 1) * self.cols])
    }
}
pub struct Activations {
    x: Vec<f32>,
    n: usize,
    cols: usize,
}
impl Default for Activations {
    fn default() -> Self {
        Self::new()
    }
}
impl Activations {
    pub fn new() -> Self {
        Activations {
            x: Vec::new(),
            n: 0,
            cols: 0,
        }
    }
    pub fn quantize(&mut self, x: &[f32], n: usize, cols: usize) {
        self.x.clear();
        self.x.extend_from_slice(&x[..n * cols]);
        self.n = n;
        self.cols = cols;
    }
    pub fn rows(&self) -> usize {
        self.n
    }
}
pub fn matmul(w: &QMatrix, a: &Activations, out: &mut [f32]) {
    for b in 0..a.n {
        for r in 0..w.rows {
            let x = &a.x[b * a.cols..(b + 1) * a.cols];
            let wr = &w.w[r * w.cols..(r + 1) * w.cols];
            out[b * w.rows + r] = x.iter().zip(wr).map(|(a, b)| a * b).sum();
        }
    }
}
