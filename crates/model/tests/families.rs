//! Every supported family on tiny seeded models built here: each loads with its features, and
//! the forward pass keeps its promises for each — a row's logits are the same bits alone, in a
//! batch with other sequences, fed in chunks, and at every kernel level; Gemma 3's local layers
//! see only their window; fused and separate projections give the same logits.

use nextok_model::arch::{Arch, FfnAct, RopeStyle};
use nextok_model::kernels::{set_register_width, Level, RegisterWidth};
use nextok_model::{BatchSeq, LogitRows, ModelWeights, Requant, Scratch};
use nextok_vocab::gguf::Value as G;

mod common;
use common::tiny::{Tiny, E, FF, HEADS, KV_HEADS, V};
use common::{gguf, T};

/// The logits after every token of `ids`, fed in `chunks` (lengths), at `level`.
fn logits_in_chunks(w: &ModelWeights, ids: &[u32], chunks: &[usize], level: Level) -> Vec<f32> {
    logits_in_chunks_with(w, ids, chunks, &mut Scratch::with_level(level))
}

/// [`logits_in_chunks`] with the caller's buffers (which count the split attention steps).
fn logits_in_chunks_with(
    w: &ModelWeights,
    ids: &[u32],
    chunks: &[usize],
    s: &mut Scratch,
) -> Vec<f32> {
    let mut kv = w.default_pool().sequence();
    let mut out = Vec::new();
    let mut logits = Vec::new();
    let mut at = 0;
    for &c in chunks {
        let mut b = [BatchSeq {
            kv: &mut kv,
            tokens: &ids[at..at + c],
            logits: LogitRows::All,
        }];
        w.forward_batch(&mut b, s, &mut logits).unwrap();
        out.extend_from_slice(&logits);
        at += c;
    }
    assert_eq!(at, ids.len());
    out
}

fn prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + salt * 11 + 3) % V as u32)
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn every_family_loads_with_its_features() {
    for arch in Arch::ALL {
        let w = Tiny::of(arch).load();
        let c = &w.config;
        assert_eq!(c.arch, arch);
        assert_eq!(c.vocab_size, V as usize);
        assert_eq!(c.n_ff, FF as usize);
        let halves = arch != Arch::Llama;
        assert_eq!(c.rope_style == RopeStyle::Halves, halves, "{arch:?}");
        assert_eq!(c.act == FfnAct::GeluTanh, arch == Arch::Gemma3);
        assert_eq!(c.qk_norm, matches!(arch, Arch::Qwen3 | Arch::Gemma3));
        assert_eq!(c.post_norms, arch == Arch::Gemma3);
        // F32 matrices run on their own kernels: nothing is converted
        assert!(w.converted.is_empty(), "{:?}", w.converted);
        if arch == Arch::Gemma3 {
            let windows: Vec<Option<usize>> = c.layers.iter().map(|l| l.window).collect();
            let local = Some(5);
            assert_eq!(
                windows,
                vec![local, local, local, local, local, None, local]
            );
            assert_eq!(c.layers[0].rope.base, 10_000.0);
            assert_eq!(c.layers[5].rope.base, 1e6);
            assert_eq!(c.embed_scale, Some(8.0));
            assert_eq!(c.query_scale, Some(1.0 / 32f32.sqrt()));
        }
    }
}

#[test]
fn a_row_is_the_same_alone_in_a_batch_in_chunks_and_at_every_level() {
    let levels: Vec<Level> = Level::ALL.into_iter().filter(|l| l.supported()).collect();
    for l in Level::ALL.into_iter().filter(|l| !l.supported()) {
        eprintln!(
            "this CPU lacks the {} kernel level: not tested here",
            l.name()
        );
    }
    eprintln!("kernel levels tested: {levels:?}");
    for arch in Arch::ALL {
        let w = Tiny::of(arch).load();
        let a = prompt(11, 1);
        let b = prompt(6, 2);
        let alone = logits_in_chunks(&w, &a, &[11], Level::Scalar);
        assert_eq!(alone.len(), 11 * V as usize);
        assert!(alone.iter().all(|x| x.is_finite()));
        for &level in &levels {
            // the AVX-512 levels at both register widths (VNNI tiles, attention kernels); the
            // width is process-wide, but every width gives the same bits
            let widths: &[RegisterWidth] = if level >= Level::Avx512 {
                &[RegisterWidth::Bits256, RegisterWidth::Bits512]
            } else {
                &[RegisterWidth::Auto]
            };
            for &width in widths {
                set_register_width(width);
                let got = logits_in_chunks(&w, &a, &[4, 1, 6], level);
                set_register_width(RegisterWidth::Auto);
                assert_eq!(
                    bits(&alone),
                    bits(&got),
                    "{arch:?} chunks at {level:?} {width:?}"
                );
            }
        }
        // `a` in one batch with `b`, each sequence at its own position
        let mut ka = w.default_pool().sequence();
        let mut kb = w.default_pool().sequence();
        let mut s = Scratch::default();
        let mut logits = Vec::new();
        let mut warm = [BatchSeq {
            kv: &mut kb,
            tokens: &b[..3],
            logits: LogitRows::None,
        }];
        w.forward_batch(&mut warm, &mut s, &mut logits).unwrap();
        let mut batch = [
            BatchSeq {
                kv: &mut kb,
                tokens: &b[3..],
                logits: LogitRows::Last,
            },
            BatchSeq {
                kv: &mut ka,
                tokens: &a,
                logits: LogitRows::All,
            },
        ];
        w.forward_batch(&mut batch, &mut s, &mut logits).unwrap();
        assert_eq!(
            bits(&alone),
            bits(&logits[V as usize..]),
            "{arch:?} in a batch"
        );
    }
}

#[test]
fn gemma3_local_layers_see_only_their_window() {
    // two local layers with a window of 3: position p depends on tokens p-4..=p only
    let tiny = Tiny {
        arch: Arch::Gemma3,
        layers: 2,
        embd: E,
        ff: FF,
        window: Some(3),
        fused_qkv: false,
        context: 64,
        vocab: None,
    };
    let w = tiny.load();
    assert!(w.config.layers.iter().all(|l| l.window == Some(3)));
    let a = prompt(10, 3);
    let mut b = a.clone();
    b[0] = (b[0] + 1) % V as u32;
    let la = logits_in_chunks(&w, &a, &[10], Level::current());
    let lb = logits_in_chunks(&w, &b, &[10], Level::current());
    let row = |l: &[f32], p: usize| bits(&l[p * V as usize..(p + 1) * V as usize]);
    for p in 0..=4 {
        assert_ne!(row(&la, p), row(&lb, p), "position {p} sees token 0");
    }
    for p in 5..10 {
        assert_eq!(row(&la, p), row(&lb, p), "position {p} is past the window");
    }
    // with a sixth, global layer, the last position sees token 0 again
    let tiny = Tiny { layers: 6, ..tiny };
    let w = tiny.load();
    assert_eq!(w.config.layers[5].window, None);
    let la = logits_in_chunks(&w, &a, &[10], Level::current());
    let lb = logits_in_chunks(&w, &b, &[10], Level::current());
    assert_ne!(row(&la, 9), row(&lb, 9));
}

#[test]
fn fused_and_separate_projections_give_the_same_logits() {
    // Phi-3 with one attn_qkv matrix against the same rows as three matrices
    let fused = Tiny::of(Arch::Phi3);
    let separate = Tiny {
        fused_qkv: false,
        ..fused
    };
    let tf = fused.tensors(7);
    let mut ts = Vec::new();
    let hd = fused.head_dim();
    let (qd, kvd) = (HEADS * hd, KV_HEADS * hd);
    for t in fused.tensors(7) {
        if let Some(layer) = t.name.strip_suffix(".attn_qkv.weight") {
            // rows are contiguous runs of E f32 values: split after qd and qd + kvd rows
            let row = E as usize * 4;
            let (q, rest) = t.data.split_at(qd as usize * row);
            let (k, v) = rest.split_at(kvd as usize * row);
            for (s, data, rows) in [("attn_q", q, qd), ("attn_k", k, kvd), ("attn_v", v, kvd)] {
                ts.push(T {
                    name: format!("{layer}.{s}.weight"),
                    dims: vec![E, rows],
                    ty: 0,
                    data: data.to_vec(),
                });
            }
        } else {
            ts.push(t);
        }
    }
    let wf = ModelWeights::load(&fused.file(&tf), Requant::Keep).unwrap();
    let ws = ModelWeights::load(&separate.file(&ts), Requant::Keep).unwrap();
    let a = prompt(7, 4);
    assert_eq!(
        bits(&logits_in_chunks(&wf, &a, &[7], Level::current())),
        bits(&logits_in_chunks(&ws, &a, &[7], Level::current()))
    );
}

#[test]
fn inconsistent_family_metadata_is_an_error_naming_the_key() {
    let tiny = Tiny::of(Arch::Qwen3);
    let t = tiny.tensors(7);
    let mut md = tiny.metadata();
    for (k, v) in md.iter_mut() {
        if k == "qwen3.attention.head_count_kv" {
            *v = G::U32(3);
        }
    }
    let dir = std::env::temp_dir().join(format!("nextok-families-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("bad-heads.gguf");
    std::fs::write(&p, gguf(&md, &t)).unwrap();
    let m = ModelWeights::load(&p, Requant::Keep)
        .unwrap_err()
        .to_string();
    assert!(m.contains("qwen3.attention.head_count_kv"), "{m}");
    // a family nextok does not run
    let mut md = tiny.metadata();
    md[0].1 = G::String("mamba".into());
    std::fs::write(&p, gguf(&md, &t)).unwrap();
    let m = ModelWeights::load(&p, Requant::Keep)
        .unwrap_err()
        .to_string();
    assert!(
        m.contains("general.architecture") && m.contains("mamba"),
        "{m}"
    );
    // a missing Q norm of a Qwen 3 layer
    let t: Vec<T> = tiny
        .tensors(7)
        .into_iter()
        .filter(|t| t.name != "blk.1.attn_q_norm.weight")
        .collect();
    std::fs::write(&p, gguf(&tiny.metadata(), &t)).unwrap();
    let m = ModelWeights::load(&p, Requant::Keep)
        .unwrap_err()
        .to_string();
    assert!(m.contains("blk.1.attn_q_norm.weight"), "{m}");
}

#[test]
fn long_context_decode_splits_attention_with_the_same_bits() {
    // A decode step at a long context has too few (row, key/value head) units to keep the
    // threads busy, so its attention is split by key chunks and value columns. The logits must
    // be the bits of the unsplit pass (a 420-token prompt in one chunk) at any thread count.
    // (The 400-token chunk's row-wise work — norms, rotary embeddings, the activation
    // function — is split among the team's threads too, from two threads on.)
    const N: usize = 420;
    const PREFIX: usize = 400;
    for arch in [Arch::Qwen3, Arch::Gemma3] {
        let tiny = Tiny {
            layers: 2,
            // Gemma 3: a local layer whose window is long enough to be split too
            window: (arch == Arch::Gemma3).then_some(300),
            context: 512,
            ..Tiny::of(arch)
        };
        let w = tiny.load();
        let ids = prompt(N, 5);
        let whole = logits_in_chunks(&w, &ids, &[N], Level::current());
        for threads in [1, 2, 3, 4] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let chunks: Vec<usize> = std::iter::once(PREFIX)
                .chain(std::iter::repeat_n(1, N - PREFIX))
                .collect();
            let (decoded, splits) = pool.install(|| {
                let mut s = Scratch::default();
                let out = logits_in_chunks_with(&w, &ids, &chunks, &mut s);
                (out, s.split_attention_steps())
            });
            assert_eq!(
                bits(&whole),
                bits(&decoded),
                "{arch:?} at {threads} threads"
            );
            // with no more threads than (row, key/value head) units, a decode step keeps one
            // task per unit; with more, every decode step splits every layer (each has more
            // than 256 keys to attend to)
            let expected = if threads <= KV_HEADS as usize {
                0
            } else {
                (N - PREFIX) * 2
            };
            assert_eq!(splits, expected as u64, "{arch:?} at {threads} threads");
        }
    }
}

/// `t` with every matrix (2-D tensor) re-encoded by `enc(values)`, which gives the new GGML
/// type, its bytes and the values those bytes stand for; also the same tensors as F32 holding
/// those values.
fn reencoded(t: Vec<T>, enc: impl Fn(&[f32]) -> (u32, Vec<u8>, Vec<f32>)) -> (Vec<T>, Vec<T>) {
    let (mut coded, mut twin) = (Vec::new(), Vec::new());
    for t in t {
        if t.dims.len() != 2 {
            twin.push(T {
                name: t.name.clone(),
                dims: t.dims.clone(),
                ty: t.ty,
                data: t.data.clone(),
            });
            coded.push(t);
            continue;
        }
        let v: Vec<f32> = t
            .data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let (ty, bytes, stands_for) = enc(&v);
        twin.push(T {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ty: 0,
            data: stands_for.iter().flat_map(|x| x.to_le_bytes()).collect(),
        });
        coded.push(T {
            ty,
            data: bytes,
            ..t
        });
    }
    (coded, twin)
}

/// llama.cpp's `kvalues_iq4nl`, written out here from ggml's source.
const IQ4_NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

#[test]
fn bf16_files_run_on_their_kernels_and_other_formats_are_converted_and_named() {
    let tiny = Tiny::of(Arch::Llama);
    let f32_file = tiny.load();
    let ids = prompt(9, 2);
    let reference = logits_in_chunks(&f32_file, &ids, &[9], Level::current());

    // BF16 matrices (ggml type 30) load and run on the BF16 kernels: nothing converted, the
    // logits near the F32 file's (the weights and activations rounded to bf16)
    let (bf16, _) = reencoded(tiny.tensors(common::tiny::SEED), |v| {
        let b: Vec<half::bf16> = v.iter().map(|&x| half::bf16::from_f32(x)).collect();
        let bytes = b.iter().flat_map(|x| x.to_le_bytes()).collect();
        (30, bytes, b.iter().map(|x| x.to_f32()).collect())
    });
    let w = ModelWeights::load(&tiny.file(&bf16), Requant::Keep).expect("a BF16 file loads");
    assert!(w.converted.is_empty(), "{:?}", w.converted);
    let got = logits_in_chunks(&w, &ids, &[9], Level::current());
    let worst = got
        .iter()
        .zip(&reference)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst < 0.1, "BF16 logits {worst} from the F32 file's");

    // IQ4_NL matrices (ggml type 20: no kernel of nextok's own) are dequantised as llama.cpp
    // does and converted to Q8_0, named: the same logits as an F32 file of the values they
    // stand for, re-quantised to Q8_0
    let (iq4, twin) = reencoded(tiny.tensors(common::tiny::SEED), |v| {
        let (mut bytes, mut vals) = (Vec::new(), Vec::new());
        for blk in v.chunks_exact(32) {
            let amax = blk.iter().fold(0f32, |m, x| m.max(x.abs()));
            let d = half::f16::from_f32(amax / 127.0);
            let df = d.to_f32();
            let q: Vec<u8> = blk
                .iter()
                .map(|&x| {
                    (0..16u8)
                        .min_by(|&a, &b| {
                            let ea = (df * f32::from(IQ4_NL[a as usize]) - x).abs();
                            let eb = (df * f32::from(IQ4_NL[b as usize]) - x).abs();
                            ea.total_cmp(&eb)
                        })
                        .unwrap()
                })
                .collect();
            bytes.extend(d.to_le_bytes());
            // value j in the low nibble of byte j, value j + 16 in its high nibble
            bytes.extend((0..16).map(|j| q[j] | (q[j + 16] << 4)));
            vals.extend(q.iter().map(|&k| df * f32::from(IQ4_NL[k as usize])));
        }
        (20, bytes, vals)
    });
    let w = ModelWeights::load(&tiny.file(&iq4), Requant::Keep).expect("an IQ4_NL file loads");
    let matrices = iq4.iter().filter(|t| t.dims.len() == 2).count();
    assert_eq!(w.converted.len(), matrices);
    assert!(w
        .converted
        .iter()
        .all(|c| c.from == "IQ4_NL" && c.to == "Q8_0"));
    let dir = std::env::temp_dir().join(format!("nextok-families-{}", std::process::id()));
    let twin_path = tiny.write_to(&dir.join("twin"), &twin);
    let wt = ModelWeights::load(&twin_path, Requant::Q8_0).unwrap();
    assert_eq!(
        bits(&logits_in_chunks(&w, &ids, &[9], Level::current())),
        bits(&logits_in_chunks(&wt, &ids, &[9], Level::current()))
    );
    let note = nextok_model::converted_note(&w.converted).unwrap();
    assert!(
        note.contains(&format!("{matrices} matrices"))
            && note.contains("IQ4_NL: ")
            && note.contains("`token_embd.weight`"),
        "{note}"
    );
    // a file of several such formats names each, with its first tensor
    let mut mixed = w.converted.clone();
    mixed[3].from = "Q2_K".into();
    mixed[5].from = "Q2_K".into();
    let note = nextok_model::converted_note(&mixed).unwrap();
    assert!(
        note.contains(&format!(
            "IQ4_NL: {}, the first `token_embd.weight`",
            matrices - 2
        )) && note.contains(&format!("Q2_K: 2, the first `{}`", mixed[3].tensor)),
        "{note}"
    );

    // a format with neither a kernel nor a converter (MXFP4, ggml type 39: blocks of 32 in
    // 17 bytes) is an error naming the tensor and the format
    let mut t = tiny.tensors(common::tiny::SEED);
    let down = t
        .iter_mut()
        .find(|t| t.name == "blk.0.ffn_down.weight")
        .unwrap();
    down.ty = 39;
    down.data = vec![0; (FF * E / 32 * 17) as usize];
    let m = ModelWeights::load(&tiny.file(&t), Requant::Keep)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        m.contains("blk.0.ffn_down.weight") && m.contains("MXFP4"),
        "{m}"
    );
}

/// The Gemma 3 keys llama.cpp reads when a file carries them: the local layers' pattern (one
/// flag per layer, or a period), their rotary base, and a soft cap on the output logits.
#[test]
fn gemma3_reads_the_optional_keys_llama_cpp_reads() {
    let tiny = Tiny::of(Arch::Gemma3);
    let t = tiny.tensors(common::tiny::SEED);
    let dir = std::env::temp_dir().join(format!("nextok-families-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let load = |extra: Vec<(String, G)>| {
        let mut md = tiny.metadata();
        md.extend(extra);
        let p = dir.join(format!("gemma-keys-{}.gguf", md.len()));
        std::fs::write(&p, gguf(&md, &t)).unwrap();
        ModelWeights::load(&p, Requant::Keep)
    };
    let key = |k: &str| format!("gemma3.{k}");
    let windows = |w: &ModelWeights| -> Vec<bool> {
        w.config.layers.iter().map(|l| l.window.is_some()).collect()
    };
    let flags = vec![true, false, true, true, false, false, true];
    let w = load(vec![(
        key("attention.sliding_window_pattern"),
        G::Array(nextok_vocab::gguf::Array::Bool(flags.clone())),
    )])
    .unwrap();
    assert_eq!(windows(&w), flags);
    let w = load(vec![
        (key("attention.sliding_window_pattern"), G::U32(2)),
        (key("rope.freq_base_swa"), G::F32(5000.0)),
    ])
    .unwrap();
    assert_eq!(
        windows(&w),
        vec![true, false, true, false, true, false, true]
    );
    assert_eq!(w.config.layers[0].rope.base, 5000.0);
    assert_eq!(w.config.layers[1].rope.base, 1e6);
    // the soft cap: c · tanh(z / c) of the uncapped logits
    let plain = load(vec![]).unwrap();
    let capped = load(vec![(key("final_logit_softcapping"), G::F32(0.5))]).unwrap();
    let ids = prompt(6, 1);
    let z = logits_in_chunks(&plain, &ids, &[6], Level::current());
    let want: Vec<f32> = z.iter().map(|&z| (z * (1.0 / 0.5)).tanh() * 0.5).collect();
    let got = logits_in_chunks(&capped, &ids, &[6], Level::current());
    assert_eq!(bits(&got), bits(&want));
    assert!(got.iter().all(|z| z.abs() <= 0.5));
    // a pattern of the wrong length, a negative cap: errors naming the key
    let m = load(vec![(
        key("attention.sliding_window_pattern"),
        G::Array(nextok_vocab::gguf::Array::Bool(vec![true; 3])),
    )])
    .err()
    .unwrap()
    .to_string();
    assert!(m.contains("gemma3.attention.sliding_window_pattern"), "{m}");
    let m = load(vec![(key("final_logit_softcapping"), G::F32(-1.0))])
        .err()
        .unwrap()
        .to_string();
    assert!(m.contains("gemma3.final_logit_softcapping"), "{m}");
}

/// What a decode step reads: one multiply-add per weight of every matrix it multiplies (each
/// layer's and the output), the bytes of those matrices: all the loaded ones where the output
/// is the embedding (Qwen 3, Gemma 3), all but the embedding where it has its own.
#[test]
fn a_decode_step_reads_every_multiplied_matrix_once() {
    for tiny in Tiny::all() {
        let w = tiny.load();
        let c = &w.config;
        let (d, qd, kvd) = (c.n_embd, c.q_dim(), c.kv_dim());
        let per_layer = d * (qd + 2 * kvd) + qd * d + 3 * d * c.n_ff;
        let (bytes, macs) = w.decode_step_reads();
        assert_eq!(
            macs,
            c.n_layer * per_layer + c.vocab_size * d,
            "{}",
            tiny.name()
        );
        if matches!(tiny.arch, Arch::Qwen3 | Arch::Gemma3) {
            assert_eq!(bytes, w.matrix_bytes(), "{}", tiny.name());
        } else {
            assert!(bytes < w.matrix_bytes(), "{}", tiny.name());
        }
    }
}
