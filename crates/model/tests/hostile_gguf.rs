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
    // refused by the checks that come before any work per block or per position (the rotary
    // tables are computed for every position at load): the messages name what the counts
    // were checked against, the file's tensors and nextok's most positions
    let m = load_err(
        "blocks.gguf",
        &gguf(
            &metadata(&[("llama.block_count", G::U64(1_000_000_000))]),
            &tensors(1.0),
        ),
    );
    assert!(m.contains("block_count"), "{m}");
    assert!(m.contains("1000000000 blocks for"), "{m}");
    let m = load_err(
        "ctx.gguf",
        &gguf(
            &metadata(&[("llama.context_length", G::U64(1 << 40))]),
            &tensors(1.0),
        ),
    );
    assert!(m.contains("context_length"), "{m}");
    let most = format!("1 to {} positions", nextok_model::MAX_CONTEXT);
    assert!(m.contains(&most), "{m}");
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

#[test]
fn rope_window_and_norm_settings_out_of_range_are_errors_naming_them() {
    let cases: [(&str, G, &str); 7] = [
        (
            "llama.rope.dimension_count",
            G::U32(7),
            "llama.rope.dimension_count",
        ),
        (
            "llama.rope.dimension_count",
            G::U32(64),
            "llama.rope.dimension_count",
        ),
        ("llama.rope.freq_base", G::F32(-1.0), "llama.rope.freq_base"),
        (
            "llama.rope.freq_base",
            G::F32(f32::NAN),
            "llama.rope.freq_base",
        ),
        (
            "llama.rope.scaling.type",
            G::String("yarn".into()),
            "llama.rope.scaling.type",
        ),
        (
            "llama.rope.scaling.factor",
            G::F32(-2.0),
            "llama.rope.scaling.factor",
        ),
        (
            "llama.attention.key_length",
            G::U32(0),
            "llama.attention.key_length",
        ),
    ];
    for (key, value, named) in cases {
        let m = load_err(
            "rope.gguf",
            &gguf(&metadata(&[(key, value.clone())]), &tensors(1.0)),
        );
        assert!(m.contains(named), "{key} = {value:?}: {m}");
    }
    // a norm of the wrong length, and Llama 3's frequency factors of the wrong length or sign
    let mut t = tensors(1.0);
    t.iter_mut()
        .find(|t| t.name == "blk.0.attn_norm.weight")
        .unwrap()
        .dims = vec![E - 1];
    t.iter_mut()
        .find(|t| t.name == "blk.0.attn_norm.weight")
        .unwrap()
        .data
        .truncate(4 * (E as usize - 1));
    let m = load_err("norm.gguf", &gguf(&metadata(&[]), &t));
    assert!(m.contains("blk.0.attn_norm.weight"), "{m}");
    for (len, v) in [(E / 2 - 1, 1.0), (E / 2, -1.0)] {
        let mut t = tensors(1.0);
        t.push(f32s("rope_freqs.weight", &[len], v));
        let m = load_err("freqs.gguf", &gguf(&metadata(&[]), &t));
        assert!(m.contains("rope_freqs.weight"), "{m}");
    }
    // Gemma 3: a sliding window of zero positions means none (as in llama.cpp: every layer is
    // global), and a window that is not a number is an error naming the key
    let tiny = common::tiny::Tiny::of(nextok_model::arch::Arch::Gemma3);
    for (value, err) in [(G::U32(0), false), (G::String("wide".into()), true)] {
        let mut md = tiny.metadata();
        for (k, v) in md.iter_mut() {
            if k == "gemma3.attention.sliding_window" {
                *v = value.clone();
            }
        }
        let data = gguf(&md, &tiny.tensors(7));
        if err {
            let m = load_err("window.gguf", &data);
            assert!(m.contains("gemma3.attention.sliding_window"), "{m}");
        } else {
            let w = ModelWeights::load(&write("window.gguf", &data), Requant::Keep).unwrap();
            assert!(w.config.layers.iter().all(|l| l.window.is_none()));
        }
    }
}

/// The widest heads and the longest context a file may declare take no memory sized by their
/// product: the rotary angles are computed for the positions a pass runs, not tabled for every
/// position of the context (a table would be 2^20 positions × 2,048 pairs × 2 `f32`, 16 GiB).
#[test]
fn the_longest_context_with_the_widest_heads_loads_and_runs() {
    const HD: u64 = 4096;
    let md = metadata(&[
        (
            "llama.context_length",
            G::U32(nextok_model::MAX_CONTEXT as u32),
        ),
        ("llama.attention.key_length", G::U32(HD as u32)),
        ("llama.attention.value_length", G::U32(HD as u32)),
        ("llama.rope.dimension_count", G::U32(HD as u32)),
    ]);
    let mut t = tensors(1.0);
    for t in t.iter_mut() {
        let wide = match t.name.as_str() {
            "blk.0.attn_q.weight" | "blk.0.attn_k.weight" | "blk.0.attn_v.weight" => [E, HD],
            "blk.0.attn_output.weight" => [HD, E],
            _ => continue,
        };
        *t = f32s(&t.name, &wide, 0.01);
    }
    let p = write("wide.gguf", &gguf(&md, &t));
    let w = ModelWeights::load(&p, Requant::Keep).expect("loads");
    assert_eq!(w.config.context_length, nextok_model::MAX_CONTEXT);
    let mut kv = w.default_pool().sequence();
    let mut logits = Vec::new();
    let mut b = [nextok_model::BatchSeq {
        kv: &mut kv,
        tokens: &[1, 2, 3],
        logits: nextok_model::LogitRows::Last,
    }];
    w.forward_batch(&mut b, &mut nextok_model::Scratch::default(), &mut logits)
        .unwrap();
    assert_eq!(logits.len(), V as usize);
    assert!(logits.iter().all(|x| x.is_finite()));
}
