//! Shared by the targets: a small vocabulary over which constraints compile.

use std::sync::Arc;

use nextok_constraint::{ConstraintEngine, ConstraintVocab};
use nextok_core::{TokenBytes, VocabInfo};

/// 40 tokens: EOS, the JSON punctuation, a few letters, digits and words.
pub fn engine() -> Arc<ConstraintEngine> {
    let toks: Vec<&[u8]> = vec![
        b"</s>", b"{", b"}", b"[", b"]", b"\"", b":", b",", b" ", b"\n", b"a", b"b", b"c", b"x",
        b"0", b"1", b"2", b"9", b"-", b".", b"e", b"true", b"false", b"null", b"\"a\"", b"{\"",
        b"\":", b"ab", b"\\", b"u", b"E", b"+", b"(", b")", b"*", b"|", b"t", b"r", b"n", b"f",
    ];
    let n = toks.len();
    let bytes = TokenBytes::new(toks).expect("token bytes");
    let info = VocabInfo {
        vocab_size: n,
        eos_token_ids: vec![0],
        special_token_ids: vec![0],
    };
    let v = ConstraintVocab::new(&bytes, &info).expect("vocabulary");
    Arc::new(ConstraintEngine::new(Arc::new(v)).expect("engine"))
}

/// Steps a compiled constraint a little: masks and a few commits of allowed tokens.
pub fn exercise(c: &Arc<nextok_constraint::CompiledConstraint>) {
    use nextok_core::constraint::{bitset_words, ConstraintState};
    let mut s = c.start();
    let n = 40;
    for _ in 0..4 {
        let mut m = vec![0u64; bitset_words(n)];
        if s.fill_mask(&mut m).is_err() {
            return;
        }
        let Some(t) = (1..n as u32).find(|&t| m[(t / 64) as usize] >> (t % 64) & 1 == 1) else {
            return;
        };
        if s.commit(t).is_err() {
            return;
        }
    }
}
