//! Step records (000 §3.12): everything needed to explain and replay one selection.
//! Serialised as one JSON object per step (JSON Lines in a trace).
//!
//! Every logprob carries its layer in its name: `raw_logprob` (log-softmax of the raw logits over
//! the whole vocabulary), `processed_logprob` (log-softmax of the processed logits over every
//! token not hard-masked), `selection_logprob` (log of the selection probability, renormalised
//! over the final support).

use serde::{Deserialize, Serialize};

use crate::select::Selector;
use crate::state::StateSummary;

/// The layer a logprob belongs to. There is no unlabelled logprob in nextok.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// Softmax of the raw logits over the vocabulary.
    Raw,
    /// Softmax of the processed logits (after masks, penalties, temperature) over unmasked tokens.
    Processed,
    /// The selection distribution, renormalised over the final support.
    Selection,
}

/// A logprob with its layer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Logprob {
    /// Which layer.
    pub layer: Layer,
    /// Natural-log probability (`-inf` when the token is impossible in that layer).
    #[serde(with = "f64_or_string")]
    pub value: f64,
}

/// A processor name and version as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessorRef {
    /// Pipeline `"type"` tag.
    #[serde(rename = "type")]
    pub kind: String,
    /// Implementation version.
    pub version: u32,
}

/// Support size after one stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageSize {
    /// `"raw"` or a processor `"type"`.
    pub stage: String,
    /// Candidates left.
    pub support_size: usize,
}

/// One final candidate with its values in every layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateRecord {
    /// Token id.
    pub id: u32,
    /// Raw logit.
    pub raw_logit: f32,
    /// Processed logit.
    pub processed_logit: f32,
    /// Raw-layer logprob.
    #[serde(with = "f64_or_string")]
    pub raw_logprob: f64,
    /// Processed-layer logprob.
    #[serde(with = "f64_or_string")]
    pub processed_logprob: f64,
    /// Selection-layer logprob.
    #[serde(with = "f64_or_string")]
    pub selection_logprob: f64,
    /// Selection probability.
    pub selection_prob: f64,
}

/// The random stream as used by one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RngRecord {
    /// Generator algorithm.
    pub algorithm: String,
    /// Key (the request seed).
    pub seed: u64,
    /// Counter step field used by this step.
    pub counter: u64,
    /// The categorical `u`, when one was used.
    pub u: Option<f64>,
    /// Whether `u` was supplied by the caller instead of the stream.
    pub fixed_u: bool,
}

/// One step's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Step index.
    pub step: u64,
    /// Digest of the raw logits row (see [`logits_digest`]).
    pub raw_logits_digest: String,
    /// Pipeline hash.
    pub pipeline_hash: String,
    /// Ordered processors with versions.
    pub processors: Vec<ProcessorRef>,
    /// Selector.
    pub selector: Selector,
    /// Support size after loading (`raw`) and after each processor.
    pub stages: Vec<StageSize>,
    /// Final support size.
    pub support_size: usize,
    /// Final candidates in canonical order (processed logit descending, id ascending), at most
    /// the requested number.
    pub candidates: Vec<CandidateRecord>,
    /// Random stream.
    pub rng: RngRecord,
    /// Selected token.
    pub selected: u32,
    /// State before the step.
    pub state_before: StateSummary,
    /// State after the step.
    pub state_after: StateSummary,
    /// Speculative decoding: the drafted token this step verified and what became of it
    /// (absent on steps that verified no draft).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft: Option<DraftRecord>,
    /// The step's raw logits row, compressed ([`PackedLogits`]), when the request asked for
    /// them (`generate --trace-logits`): a trace that carries them replays its sampler,
    /// constraint and stop logic without the model. Not part of the step's decision: a replay
    /// compares every other field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_logits: Option<PackedLogits>,
}

/// A logits row stored in a trace: the `f32` values' little-endian bytes split into four
/// planes (every value's first byte, then every second byte, …), deflated, in base64. The
/// planes put the sign and exponent bytes of neighbouring values side by side, which deflate
/// shrinks; the low mantissa bytes stay close to random, so a row takes about 3 bytes a value
/// in the trace (with base64's third), against 4 unpacked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackedLogits {
    /// The encoding, `f32le-planes-deflate-base64`.
    pub encoding: String,
    /// How many values the row has.
    pub len: usize,
    /// The encoded bytes.
    pub data: String,
}

impl PackedLogits {
    /// The only encoding.
    pub const ENCODING: &'static str = "f32le-planes-deflate-base64";

    /// Packs a row.
    pub fn pack(row: &[f32]) -> PackedLogits {
        use std::io::Write;
        let n = row.len();
        let mut planes = vec![0u8; 4 * n];
        for (i, x) in row.iter().enumerate() {
            let b = x.to_le_bytes();
            for (p, &byte) in b.iter().enumerate() {
                planes[p * n + i] = byte;
            }
        }
        let mut z = flate2::write::DeflateEncoder::new(
            Vec::with_capacity(3 * n),
            flate2::Compression::fast(),
        );
        // writing into a Vec cannot fail
        let _ = z.write_all(&planes);
        let bytes = z.finish().unwrap_or_default();
        use base64::Engine as _;
        PackedLogits {
            encoding: Self::ENCODING.to_string(),
            len: n,
            data: base64::engine::general_purpose::STANDARD.encode(bytes),
        }
    }

    /// The row, checked: the encoding must be known, `len` at most `max_len` (the vocabulary
    /// a replay expects; nothing is allocated from `len` before this check) and the data must
    /// inflate to exactly `4 · len` bytes.
    pub fn unpack(&self, max_len: usize) -> Result<Vec<f32>, String> {
        use std::io::Read;
        if self.encoding != Self::ENCODING {
            return Err(format!(
                "raw_logits.encoding: `{}` (expected {})",
                self.encoding,
                Self::ENCODING
            ));
        }
        if self.len > max_len {
            return Err(format!(
                "raw_logits.len: {} values, more than the vocabulary's {max_len}",
                self.len
            ));
        }
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(self.data.as_bytes())
            .map_err(|e| format!("raw_logits.data: not base64: {e}"))?;
        let want = 4 * self.len;
        let mut planes = Vec::with_capacity(want);
        // one byte more than expected tells a longer stream from an exact one
        flate2::read::DeflateDecoder::new(bytes.as_slice())
            .take(want as u64 + 1)
            .read_to_end(&mut planes)
            .map_err(|e| format!("raw_logits.data: not deflate data: {e}"))?;
        if planes.len() != want {
            return Err(format!(
                "raw_logits.data: {} bytes unpacked, expected {want} ({} values)",
                planes.len(),
                self.len
            ));
        }
        let n = self.len;
        Ok((0..n)
            .map(|i| {
                f32::from_le_bytes([
                    planes[i],
                    planes[n + i],
                    planes[2 * n + i],
                    planes[3 * n + i],
                ])
            })
            .collect())
    }
}

/// How a drafted token was judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DraftRule {
    /// Accepted iff the step's own selection (plain decoding's draw) equals it.
    Exact,
    /// The rejection rule of [`Draw::Draft`](crate::Draw::Draft).
    Rejection,
}

/// A step's drafted token (speculative decoding).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DraftRecord {
    /// The drafted token.
    pub token: u32,
    /// Whether the step accepted it (the selected token is the drafted one).
    pub accepted: bool,
    /// The rule that judged it.
    pub rule: DraftRule,
    /// The rejection rule's acceptance draw (`u(seed, step, Accept, 0)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accept_u: Option<f64>,
    /// The rejection rule's residual draw (`u(seed, step, Accept, 1)`), after a rejection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub residual_u: Option<f64>,
}

/// A fast, platform-independent 64-bit digest of a logits row: eight lanes over the `f32` bit
/// patterns (lane `j` takes indices `≡ j mod 8`), each `h = (h ^ bits) * K` rotated, then folded
/// with the length. Printed as `"x64:<16 hex digits>"`.
pub fn logits_digest(xs: &[f32]) -> String {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut lanes = [0u64; 8];
    for (j, l) in lanes.iter_mut().enumerate() {
        *l = K.wrapping_mul(j as u64 + 1);
    }
    let chunks = xs.chunks_exact(8);
    let rem = chunks.remainder();
    for c in chunks {
        for j in 0..8 {
            lanes[j] = ((lanes[j] ^ c[j].to_bits() as u64).wrapping_mul(K)).rotate_left(29);
        }
    }
    for (j, &x) in rem.iter().enumerate() {
        lanes[j] = ((lanes[j] ^ x.to_bits() as u64).wrapping_mul(K)).rotate_left(29);
    }
    let mut h = xs.len() as u64;
    for l in lanes {
        h = (h ^ l).wrapping_mul(K).rotate_left(31);
    }
    format!("x64:{h:016x}")
}

/// Serialises `f64` as a JSON number, or the strings `"-inf"` / `"inf"` / `"nan"` when not
/// finite (JSON has no infinities), and reads both forms back.
pub mod f64_or_string {
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serialise.
    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f64(*v)
        } else if v.is_nan() {
            s.serialize_str("nan")
        } else if *v > 0.0 {
            s.serialize_str("inf")
        } else {
            s.serialize_str("-inf")
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        N(f64),
        S(String),
    }

    /// Deserialise.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        match Repr::deserialize(d)? {
            Repr::N(x) => Ok(x),
            Repr::S(s) => match s.as_str() {
                "-inf" => Ok(f64::NEG_INFINITY),
                "inf" => Ok(f64::INFINITY),
                "nan" => Ok(f64::NAN),
                other => Err(serde::de::Error::custom(format!("not a number: {other}"))),
            },
        }
    }
}
