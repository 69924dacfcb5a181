//! The batched forward pass on the real model: a sequence's logits are bit-identical however
//! its prompt is chunked, whatever shares its batch, and whichever kernel level runs it.

use std::sync::Arc;

use nextok_model::kernels::Level;
use nextok_model::{BatchSeq, LogitRows, Model, Requant, Scratch};

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
