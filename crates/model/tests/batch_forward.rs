//! The batched forward pass on the real model: a sequence's logits are bit-identical however
//! its prompt is chunked, whatever shares its batch, and whichever kernel level runs it.

use std::sync::Arc;

use nextok_model::kernels::Level;
use nextok_model::{BatchSeq, KvCacheType, KvGeometry, KvPool, LogitRows, Model, Requant, Scratch};

fn model() -> Option<Arc<Model>> {
    let path = nextok_testdata::optional(nextok_testdata::SMOLLM2)?;
    Some(Arc::new(
        Model::load(&path, Requant::Keep).expect("model loads"),
    ))
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Feeds `ids` in chunks of `chunk` to a fresh sequence; the logits after every id.
fn run(m: &Model, ids: &[u32], chunk: usize, s: &mut Scratch) -> Vec<f32> {
    let w = &m.weights;
    let mut kv = w.default_pool().sequence();
    let mut all = Vec::new();
    let mut out = Vec::new();
    for c in ids.chunks(chunk) {
        let mut b = [BatchSeq {
            kv: &mut kv,
            tokens: c,
            logits: LogitRows::All,
        }];
        w.forward_batch(&mut b, s, &mut out).unwrap();
        all.extend_from_slice(&out);
    }
    all
}

#[test]
fn logits_do_not_depend_on_chunks_batch_or_kernel_level() {
    let Some(m) = model() else { return };
    let ids = m
        .encode_prompt("The lighthouse keeper climbed the stairs at dusk and")
        .unwrap();
    let reference = run(&m, &ids, ids.len(), &mut Scratch::default());
    assert_eq!(reference.len(), ids.len() * m.weights.config.vocab_size);
    for chunk in [1, 3, 7] {
        assert_eq!(
            bits(&run(&m, &ids, chunk, &mut Scratch::default())),
            bits(&reference),
            "chunks of {chunk}"
        );
    }
    for level in Level::ALL {
        if !level.supported() {
            eprintln!(
                "this CPU lacks the {} kernel level: not tested here",
                level.name()
            );
            continue;
        }
        assert_eq!(
            bits(&run(&m, &ids, 5, &mut Scratch::with_level(level))),
            bits(&reference),
            "{} kernels",
            level.name()
        );
    }
    // in one batch with two other sequences at other positions
    let w = &m.weights;
    let other = m.encode_prompt("Once upon a time").unwrap();
    let mut a = w.default_pool().sequence();
    let mut b = w.default_pool().sequence();
    let mut c = w.default_pool().sequence();
    let mut s = Scratch::default();
    let mut out = Vec::new();
    let mut batch = [BatchSeq {
        kv: &mut b,
        tokens: &other,
        logits: LogitRows::Last,
    }];
    w.forward_batch(&mut batch, &mut s, &mut out).unwrap();
    let mut batch = [
        BatchSeq {
            kv: &mut b,
            tokens: &ids[..2],
            logits: LogitRows::Last,
        },
        BatchSeq {
            kv: &mut a,
            tokens: &ids,
            logits: LogitRows::All,
        },
        BatchSeq {
            kv: &mut c,
            tokens: &other,
            logits: LogitRows::None,
        },
    ];
    w.forward_batch(&mut batch, &mut s, &mut out).unwrap();
    let v = w.config.vocab_size;
    assert_eq!(out.len(), (1 + ids.len()) * v);
    assert_eq!(bits(&out[v..]), bits(&reference), "batched with others");
    // a bad id leaves every sequence as it was
    let len = (a.len(), b.len());
    let mut batch = [
        BatchSeq {
            kv: &mut a,
            tokens: &[1],
            logits: LogitRows::Last,
        },
        BatchSeq {
            kv: &mut b,
            tokens: &[u32::MAX],
            logits: LogitRows::Last,
        },
    ];
    assert!(w.forward_batch(&mut batch, &mut s, &mut out).is_err());
    assert_eq!((a.len(), b.len()), len);
}

/// Feeds `ids` to a fresh sequence of `pool` in the chunks `chunks` (cycled); the logits after
/// every id from position `from` on, and how many layer steps split their attention.
fn run_in(
    m: &Model,
    pool: &KvPool,
    ids: &[u32],
    chunks: &[usize],
    from: usize,
    s: &mut Scratch,
) -> (Vec<f32>, u64) {
    let w = &m.weights;
    let v = w.config.vocab_size;
    let mut kv = pool.sequence();
    let (mut all, mut out) = (Vec::new(), Vec::new());
    let mut at = 0;
    for &c in chunks.iter().cycle() {
        if at == ids.len() {
            break;
        }
        let e = (at + c).min(ids.len());
        let logits = if e > from {
            LogitRows::All
        } else {
            LogitRows::None
        };
        let mut b = [BatchSeq {
            kv: &mut kv,
            tokens: &ids[at..e],
            logits,
        }];
        w.forward_batch(&mut b, s, &mut out).unwrap();
        if e > from {
            all.extend_from_slice(&out[from.saturating_sub(at) * v..]);
        }
        at = e;
    }
    (all, s.split_attention_steps())
}

/// A `q8_0` cache: a sequence's logits are the same bits whether its keys and values are read
/// converted a block at a time (prompt rows), in place (one decode row), or by a split
/// attention (Gemma 3's single key/value head past 256 positions); and they stay close to the
/// `f16` cache's. (The attention kernels give the same bits at every level: their unit tests.)
#[test]
fn a_q8_0_cache_gives_the_same_bits_on_every_path() {
    let text = "The lighthouse keeper climbed the stairs at dusk and lit the lamp. ".repeat(30);
    for file in [nextok_testdata::SMOLLM2, nextok_testdata::GEMMA3_270M] {
        let Some(path) = nextok_testdata::optional(file) else {
            continue;
        };
        let m = Model::load(&path, Requant::Keep).expect("model loads");
        let ids = m.encode_prompt(&text).unwrap();
        let ids = &ids[..ids.len().min(300)];
        assert!(ids.len() >= 280, "{file}: {} ids", ids.len());
        let g = m.weights.kv_geometry();
        let q8 = KvPool::new(
            KvGeometry {
                dtype: KvCacheType::Q8_0,
                ..g
            },
            None,
        );
        // the last rows' logits: a prompt of 270 rows then one row at a time, against chunks
        // of 37 rows, and against one row at a time from the start
        let from = 260;
        let mut s = Scratch::default();
        let (reference, before) = run_in(&m, &q8, ids, &[270, 1], from, &mut s);
        let (row_by_row, split) = run_in(&m, &q8, ids, &[1], from, &mut s);
        assert_eq!(bits(&row_by_row), bits(&reference), "{file}: row by row");
        let (chunked, _) = run_in(&m, &q8, ids, &[37], from, &mut s);
        assert_eq!(bits(&chunked), bits(&reference), "{file}: chunks of 37");
        eprintln!(
            "{file}: {} layer steps split their attention row by row",
            split - before
        );
        // the f16 cache's logits: close, not the same
        let (f16, _) = run_in(&m, m.weights.default_pool(), ids, &[270, 1], from, &mut s);
        let v = m.weights.config.vocab_size;
        let (mut worst, mut same_top, mut rows) = (0f32, 0, 0);
        for (a, b) in reference.chunks_exact(v).zip(f16.chunks_exact(v)) {
            let scale = b.iter().fold(0f32, |x, y| x.max(y.abs()));
            let d = a.iter().zip(b).fold(0f32, |x, (p, q)| x.max((p - q).abs()));
            worst = worst.max(d / scale);
            same_top += usize::from(argmax(a) == argmax(b));
            rows += 1;
        }
        eprintln!(
            "{file}: q8_0 against the f16 cache: largest difference {worst:.4} of the row's largest logit, the same top token at {same_top} of {rows} positions"
        );
        assert!(reference != f16, "{file}: the q8_0 cache changed nothing");
        assert!(worst < 0.1, "{file}: q8_0 logits {worst} from f16's");
        assert!(
            same_top * 10 >= rows * 9,
            "{file}: top token {same_top} of {rows}"
        );
    }
}

/// A one-sequence source over a pool of another cache type runs on it; a pool of another
/// shape is refused.
#[test]
fn a_source_takes_its_cache_from_the_pool_it_is_given() {
    let Some(m) = model() else { return };
    let w = m.weights.clone();
    let q8 = KvPool::new(
        KvGeometry {
            dtype: KvCacheType::Q8_0,
            ..w.kv_geometry()
        },
        None,
    );
    let ids = m.encode_prompt("The capital of France is").unwrap();
    let mut src = nextok_model::ModelSource::with_pool(w.clone(), &q8).unwrap();
    let got = src.prefill_all(&ids).unwrap();
    let (want, _) = run_in(&m, &q8, &ids, &[ids.len()], 0, &mut Scratch::default());
    assert_eq!(bits(&got), bits(&want));
    assert_eq!(q8.blocks_in_use(), 1);
    let other = KvPool::new(
        KvGeometry {
            head_dim: 32,
            ..w.kv_geometry()
        },
        None,
    );
    let e = nextok_model::ModelSource::with_pool(w, &other).unwrap_err();
    assert!(e.to_string().contains("is not this model's"), "{e}");
}

fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// A pass of more rows than the feed-forward takes at a time (it runs in slices of at most 128
/// rows, so that its widest buffers stay small) gives the bits of passes too short to slice.
#[test]
fn a_pass_wider_than_a_feed_forward_slice_gives_the_bits_of_narrow_ones() {
    let Some(m) = model() else {
        eprintln!("the default model is not in the test data: not tested here");
        return;
    };
    let text = "The lighthouse keeper climbed the stairs at dusk and lit the lamp. ".repeat(30);
    let ids = m.encode_prompt(&text).unwrap();
    let ids = &ids[..ids.len().min(300)];
    assert!(ids.len() >= 280, "{} ids", ids.len());
    let narrow = run(&m, ids, 50, &mut Scratch::default());
    for chunk in [ids.len(), 129, 257] {
        assert!(
            bits(&run(&m, ids, chunk, &mut Scratch::default())) == bits(&narrow),
            "passes of {chunk} rows"
        );
    }
}
