//! Every supported family on tiny seeded models built here: each loads with its features, and
//! the forward pass keeps its promises for each — a row's logits are the same bits alone, in a
//! batch with other sequences, fed in chunks, and at every kernel level; Gemma 3's local layers
//! see only their window; fused and separate projections give the same logits.

use nextok_model::arch::{Arch, FfnAct, RopeStyle};
use nextok_model::kernels::Level;
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
            assert_eq!(
                bits(&alone),
                bits(&logits_in_chunks(&w, &a, &[4, 1, 6], level)),
                "{arch:?} chunks at {level:?}"
            );
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
        window: Some(3),
        fused_qkv: false,
        context: 64,
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
