//! Corrupt and hostile GGUF files: every one is a one-line error before anything large is
//! allocated — never a panic, an abort or an attempt to allocate what the file cannot hold.

use std::path::PathBuf;

use nextok_model::{ModelWeights, Requant};
use nextok_vocab::gguf::Value as G;

mod common;
use common::{f32s, gguf, T};

const E: u64 = 32; // embedding width (one head of 32)
const V: u64 = 8; // vocabulary

fn metadata(edit: &[(&str, G)]) -> Vec<(String, G)> {
    let mut md: Vec<(String, G)> = vec![
        ("general.architecture".into(), G::String("llama".into())),
        ("llama.attention.head_count".into(), G::U32(1)),
        ("llama.attention.head_count_kv".into(), G::U32(1)),
        ("llama.block_count".into(), G::U32(1)),
        ("llama.embedding_length".into(), G::U32(E as u32)),
        ("llama.context_length".into(), G::U32(64)),
        (
            "llama.attention.layer_norm_rms_epsilon".into(),
            G::F32(1e-5),
        ),
    ];
    for (k, v) in edit {
        match md.iter_mut().find(|(n, _)| n == k) {
            Some(e) => e.1 = v.clone(),
            None => md.push((k.to_string(), v.clone())),
        }
    }
    md
}

/// A tiny valid llama model (F32 tensors, re-quantised at load); `norm` fills `output_norm`.
fn tensors(norm: f32) -> Vec<T> {
    let mut t = vec![
        f32s("token_embd.weight", &[E, V], 0.01),
        f32s("output_norm.weight", &[E], norm),
    ];
    for s in [
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    ] {
        t.push(f32s(&format!("blk.0.{s}.weight"), &[E, E], 0.01));
    }
    for s in ["attn_norm", "ffn_norm"] {
        t.push(f32s(&format!("blk.0.{s}.weight"), &[E], 1.0));
    }
    t
}

fn write(name: &str, data: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nextok-hostile-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p
}

fn load_err(name: &str, data: &[u8]) -> String {
    let p = write(name, data);
    match ModelWeights::load(&p, Requant::Keep) {
        Ok(_) => panic!("{name}: loaded"),
        Err(e) => {
            let m = e.to_string();
            assert!(!m.contains('\n'), "{name}: {m}");
            m
        }
    }
}

#[test]
fn the_tiny_model_loads() {
    let p = write("ok.gguf", &gguf(&metadata(&[]), &tensors(1.0)));
    let w = ModelWeights::load(&p, Requant::Keep).unwrap();
    assert_eq!(w.config.vocab_size, V as usize);
}

#[test]
fn zero_heads_are_errors() {
    for key in [
        "llama.attention.head_count",
        "llama.attention.head_count_kv",
    ] {
        let m = load_err(
            "heads.gguf",
            &gguf(&metadata(&[(key, G::U32(0))]), &tensors(1.0)),
        );
        assert!(m.contains("head"), "{m}");
    }
    // a head count whose product with the head width overflows
    let m = load_err(
        "heads2.gguf",
        &gguf(
            &metadata(&[
                ("llama.attention.head_count", G::U64(1 << 62)),
                ("llama.attention.head_count_kv", G::U64(1 << 62)),
                ("llama.rope.dimension_count", G::U64(8)),
            ]),
            &tensors(1.0),
        ),
    );
    assert!(m.contains("head"), "{m}");
}

#[test]
fn counts_and_dimensions_beyond_the_file_are_errors() {
    // a tensor count near 2^63
    let mut f = gguf(&metadata(&[]), &tensors(1.0));
    f[8..16].copy_from_slice(&(1u64 << 63).to_le_bytes());
    let m = load_err("count.gguf", &f);
    assert!(
        m.contains("tensor_count") || m.contains("tensor descriptions"),
        "{m}"
    );
    // dimensions whose product overflows
    let mut t = tensors(1.0);
    t[0].dims = vec![1 << 62, 1 << 4];
    let m = load_err("overflow.gguf", &gguf(&metadata(&[]), &t));
    assert!(
        m.contains("token_embd.weight") && m.contains("overflows"),
        "{m}"
    );
    // dimensions whose data (1 TB) is far larger than the file
    let mut t = tensors(1.0);
    t[0].dims = vec![E, 1 << 33];
    let m = load_err("huge.gguf", &gguf(&metadata(&[]), &t));
    assert!(
        m.contains("token_embd.weight") && m.contains("do not fit"),
        "{m}"
    );
    // too many dimensions, an unknown type, a zero alignment
    let mut t = tensors(1.0);
    t[1].dims = vec![E, 1, 1, 1, 1];
    assert!(load_err("dims.gguf", &gguf(&metadata(&[]), &t)).contains("dimensions"));
    let mut t = tensors(1.0);
    t[1].ty = 99;
    assert!(load_err("type.gguf", &gguf(&metadata(&[]), &t)).contains("unknown tensor type"));
    let m = load_err(
        "align.gguf",
        &gguf(
            &metadata(&[("general.alignment", G::U32(0))]),
            &tensors(1.0),
        ),
    );
    assert!(m.contains("general.alignment"), "{m}");
}

#[test]
fn absurd_sizes_in_the_metadata_are_errors() {
    let t = std::time::Instant::now();
    let m = load_err(
        "blocks.gguf",
        &gguf(
            &metadata(&[("llama.block_count", G::U64(1_000_000_000))]),
            &tensors(1.0),
        ),
    );
    assert!(m.contains("block_count"), "{m}");
    let m = load_err(
        "ctx.gguf",
        &gguf(
            &metadata(&[("llama.context_length", G::U64(1 << 40))]),
            &tensors(1.0),
        ),
    );
    assert!(m.contains("context_length"), "{m}");
    assert!(t.elapsed().as_secs() < 10);
}

#[test]
fn non_finite_norm_weights_and_epsilon_are_errors() {
    let m = load_err("nan.gguf", &gguf(&metadata(&[]), &tensors(f32::NAN)));
    assert!(
        m.contains("output_norm.weight") && m.contains("non-finite"),
        "{m}"
    );
    let m = load_err(
        "eps.gguf",
        &gguf(
            &metadata(&[("llama.attention.layer_norm_rms_epsilon", G::F32(f32::NAN))]),
            &tensors(1.0),
        ),
    );
    assert!(m.contains("epsilon"), "{m}");
}
