//! The model's numerics, versioned: what decides every bit of the raw logits.
//!
//! A request's raw logits are a function of the model file, the prompt and the arithmetic that
//! runs it. nextok keeps that arithmetic the same on every x86 CPU and at every kernel level
//! (scalar, AVX2, AVX-512, AVX-512 VNNI, both register widths), so a trace replays bit for bit
//! wherever the same build runs. Across builds it can change: a kernel that sums in another
//! order, a graph that rounds once more. Each part that decides bits carries a version here,
//! and [`identifier`] joins the parts one model uses into the **numerics identifier** a trace
//! header records:
//!
//! * `graph.<family>` — the forward pass as that family runs it (norms, rotary embeddings,
//!   activations, residuals, soft-caps, the order of every operation) — [`graph_version`];
//! * `attention` — scores, softmax, weights rounded to `f16`, values summed in position order —
//!   [`ATTENTION`];
//! * `kv.<type>` — what the KV cache stores — [`kv_version`];
//! * one entry per matrix format the loaded weights hold (`q4_1`, `q8_0`, `q6_k`, …): the block
//!   format's dequantisation, the activations' quantisation it multiplies and the kernel's
//!   reduction order — [`format_version`].
//!
//! The engine adds the sampler's own part (`sampler`, [`nextok_core::numerics::SAMPLER`]).
//!
//! **Any change that moves a bit moves the identifier**: bump the part the change touches,
//! re-record the golden traces (`scripts/record-golden.sh`) and add a line to the numerics
//! history in `docs/semantics.md`. The golden-trace test fails until all three are done.

use std::collections::BTreeSet;

use crate::arch::Arch;
use crate::error::Result;
use crate::file::GgufFile;
use crate::kernels::MatFormat;
use crate::kv::KvCacheType;
use crate::transformer::{matrix_names, runtime_format, ModelWeights, Requant};

/// The scheme of the identifier's text (its first word, `nx1`).
pub const SCHEME: &str = "nx1";

/// What is known of the numerics before they were versioned, for the message of a replay of
/// such a trace whose raw logits differ (docs/semantics.md §13.1 has the whole history).
pub const BEFORE_VERSIONING: &str = "builds before commit 13a3671 (2026-12-03) computed the rotary angles otherwise, and no other change of bits came until the numerics were versioned";

/// The version of `attention`: scores `dot(q, k) · scale` in eight lanes, `exp_f32` softmax,
/// weights rounded to `f16`, values accumulated by fused multiply-adds in position order.
pub const ATTENTION: u32 = 1;

/// The version of each family's forward pass (bump every family a change of the shared pass
/// touches).
pub fn graph_version(arch: Arch) -> u32 {
    match arch {
        Arch::Llama => 1,
        Arch::Qwen2 => 1,
        Arch::Qwen3 => 1,
        Arch::Gemma3 => 1,
        Arch::Phi3 => 1,
    }
}

/// The version of what a KV cache of type `t` stores.
pub fn kv_version(t: KvCacheType) -> u32 {
    match t {
        KvCacheType::F16 => 1,
        KvCacheType::Q8_0 => 1,
    }
}

/// The version of a matrix format's arithmetic (its dequantisation, the activations'
/// quantisation it multiplies, the kernel's reduction order).
pub fn format_version(f: MatFormat) -> u32 {
    match f {
        MatFormat::Q4_0 => 2,
        MatFormat::Q4_1 => 2,
        MatFormat::Q5_0 => 2,
        MatFormat::Q5_1 => 2,
        MatFormat::Q8_0 => 2,
        MatFormat::Q4_K => 2,
        MatFormat::Q5_K => 1,
        MatFormat::Q6_K => 2,
        MatFormat::F16 => 1,
        MatFormat::BF16 => 1,
        MatFormat::F32 => 1,
    }
}

/// A format's name in the identifier (`q4_1`, `q6_k`, `bf16`).
pub fn format_name(f: MatFormat) -> String {
    format!("{f:?}").to_ascii_lowercase()
}

/// The model's part of the numerics identifier for `weights` run on a `kv` cache:
/// `nx1 graph.llama=1 attention=1 kv.f16=1 q4_1=1 q8_0=1` (formats in name order).
pub fn identifier(weights: &ModelWeights, kv: KvCacheType) -> String {
    compose(weights.config.arch, kv, weights.matrix_formats())
}

/// [`identifier`] of the model in the GGUF file `f` loaded with `requant`, from the file's
/// metadata and tensor descriptions alone (no weight is read): what a replay checks before it
/// loads anything.
pub fn identifier_of_file(f: &GgufFile, requant: Requant, kv: KvCacheType) -> Result<String> {
    let arch = Arch::of(f)?;
    let cfg = arch.config(f)?;
    let mut formats = Vec::new();
    for name in matrix_names(f, cfg.n_layer) {
        let t = f.require(&name)?;
        let cols = t.dims.first().copied().unwrap_or(0) as usize;
        formats.push(runtime_format(t.ggml_type, cols, requant).0);
    }
    Ok(compose(arch, kv, formats))
}

fn compose(arch: Arch, kv: KvCacheType, formats: Vec<MatFormat>) -> String {
    let formats: BTreeSet<String> = formats
        .into_iter()
        .map(|f| format!("{}={}", format_name(f), format_version(f)))
        .collect();
    let mut s = format!(
        "{SCHEME} graph.{}={} attention={ATTENTION} kv.{}={}",
        arch.name(),
        graph_version(arch),
        kv.name(),
        kv_version(kv)
    );
    for f in formats {
        s.push(' ');
        s.push_str(&f);
    }
    s
}

/// The parts in which two identifiers differ, as `part: a → b` (`—` where one lacks the part),
/// for a message.
pub fn differences(a: &str, b: &str) -> Vec<String> {
    fn parts(s: &str) -> Vec<(&str, &str)> {
        s.split_whitespace()
            .map(|w| w.split_once('=').unwrap_or(("scheme", w)))
            .collect()
    }
    let (pa, pb) = (parts(a), parts(b));
    let keys: Vec<&str> = pa.iter().chain(&pb).map(|p| p.0).collect();
    let mut seen = BTreeSet::new();
    let get = |ps: &[(&str, &str)], k: &str| {
        ps.iter()
            .find(|p| p.0 == k)
            .map_or("—".to_string(), |p| p.1.to_string())
    };
    let mut out = Vec::new();
    for k in keys {
        if !seen.insert(k) {
            continue;
        }
        let (x, y) = (get(&pa, k), get(&pb, k));
        if x != y {
            out.push(format!("{k}: {x} → {y}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_name_the_parts_that_moved() {
        let a = "nx1 graph.llama=1 attention=1 kv.f16=1 q4_1=1 q8_0=1 sampler=1";
        let b = "nx1 graph.llama=2 attention=1 kv.f16=1 q4_1=1 q8_0=1 sampler=1";
        assert_eq!(differences(a, b), ["graph.llama: 1 → 2"]);
        assert!(differences(a, a).is_empty());
        let c = "nx1 graph.llama=1 attention=1 kv.f16=1 q8_0=1 sampler=1";
        assert_eq!(differences(a, c), ["q4_1: 1 → —"]);
    }

    #[test]
    fn format_names_are_ggml_names_in_lower_case() {
        assert_eq!(format_name(MatFormat::Q4_K), "q4_k");
        assert_eq!(format_name(MatFormat::BF16), "bf16");
    }
}
