//! SentencePiece (`tokenizer.ggml.model = llama`) encoding from GGUF metadata, as llama.cpp
//! does it (`llm_tokenizer_spm` and `tokenizer_st_partition` in its `src/llama-vocab.cpp`).
//!
//! Why not the `tokenizers` crate: its BPE model merges by *rank* of an explicit merge list.
//! A GGUF SentencePiece vocabulary has no merges, only a score per token, and llama.cpp merges
//! the adjacent pair whose merged token has the highest score, ties going to the leftmost pair.
//! Hugging Face's `LlamaConverter` turns the scores into a merge list, but pairs whose merged
//! tokens have equal scores then get distinct ranks in list order, not by position, so the
//! two can differ; and a merge list for a 262,144-token vocabulary (Gemma 3) is millions of
//! pairs to build and hold. The algorithm itself is a few dozen lines, so it is implemented
//! here, step for step:
//!
//! 1. **Special tokens first.** The text is cut at occurrences of control, unknown and
//!    user-defined tokens, taken longest text first (ties: lower id first), each one splitting
//!    every remaining text fragment at all its occurrences, left to right. With
//!    `parse_special` off (the text spans of [`crate::encode::Encoder::encode_with_text_spans`])
//!    control and unknown tokens are not matched; user-defined tokens always are. A token with
//!    the `rstrip` attribute eats the ASCII whitespace after it; llama.cpp sets it for every
//!    special token of a model whose `general.name` contains `phi-3` / `phi3` (except `<unk>`,
//!    `<s>` and `<|endoftext|>`), and nothing else sets `lstrip`/`rstrip` for these vocabularies.
//! 2. **Each text fragment** gets one leading space when `tokenizer.ggml.add_space_prefix` is
//!    true (the default for this model type) and the fragment starts the text or follows a
//!    special token; then every space becomes `▁` (U+2581).
//! 3. **Merging.** The fragment is split into characters. Every adjacent pair whose
//!    concatenation is a token (any type) enters a priority queue keyed by that token's score
//!    (highest first, then leftmost). The best pair is merged unless one side has changed since
//!    it was queued, and the new symbol's pairs with its neighbours are queued.
//! 4. **Output.** Each final symbol is its token; a symbol that is no token (only single
//!    characters can be) becomes one token per UTF-8 byte: `<0xXX>` (upper-case hex), or the
//!    one-byte token string when there is no `<0xXX>` token.
//! 5. **BOS/EOS.** With `add_special`, BOS is prepended when `tokenizer.ggml.add_bos_token`
//!    (default true) and EOS appended when `tokenizer.ggml.add_eos_token` (default false).
//!
//! Token strings map to ids as in llama.cpp: a string that occurs twice maps to its last id;
//! an empty string is named `[EMPTY_<id>]`.
//!
//! Gemma 3 needs nothing beyond this: llama.cpp special-cases Gemma's vocabulary only for Gemma
//! 4's separate `gemma4` model type. Its converter writes `add_space_prefix = false` for Gemma
//! 1–3, and Gemma 3's newline and tab runs (`\n`, `\n\n`, …, `\t`, `\t\t`, …) are
//! user-defined tokens, so step 1 cuts them out whole, longest first, before any merging; runs
//! of spaces are merged from `▁` tokens like any other text.
//!
//! Token types are those of `tokenizer.ggml.token_type` after llama.cpp's corrections by token
//! text (see [`crate::encode`]): a normal token spelled like an end-of-generation marker
//! (`</s>` in Qwen's vocabulary, say) is a control token.

use std::collections::{BinaryHeap, HashMap};

use crate::error::{Result, VocabError, VocabErrorKind};
use crate::gguf::{Array, Gguf};

const TOKENS: &str = "tokenizer.ggml.tokens";
const SCORES: &str = "tokenizer.ggml.scores";

/// A token matched before tokenization (control, unknown or user-defined).
#[derive(Debug)]
struct Special {
    id: u32,
    text: String,
    /// Control or unknown: matched only with `parse_special`.
    needs_parse_special: bool,
    lstrip: bool,
    rstrip: bool,
}

/// A SentencePiece encoder rebuilt from GGUF metadata (see the module documentation).
#[derive(Debug)]
pub(crate) struct Spm {
    ids: HashMap<String, u32>,
    scores: Vec<f32>,
    byte_ids: [u32; 256],
    specials: Vec<Special>,
    add_space_prefix: bool,
    bos: Option<u32>,
    eos: Option<u32>,
}

/// A piece of the text after the special-token partition.
#[derive(Debug, Clone, Copy)]
enum Fragment {
    Text(usize, usize),
    Token(u32),
}

/// C's `isspace` on a byte (llama.cpp's strip rule).
fn c_isspace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

impl Spm {
    /// Builds the encoder; every inconsistency is an error naming its GGUF key.
    pub(crate) fn from_gguf(
        g: &Gguf,
        label: &str,
        meta: &crate::encode::Flags,
        types: &[i64],
    ) -> Result<Spm> {
        let err = |kind, key: &str, msg: String| VocabError::new(kind, label, msg).with_field(key);
        let tv = g.get(TOKENS).ok_or_else(|| {
            err(
                VocabErrorKind::Invalid,
                TOKENS,
                "missing (the file has no tokenizer vocabulary)".into(),
            )
        })?;
        let tokens = tv.as_array().and_then(Array::as_strings).ok_or_else(|| {
            err(
                VocabErrorKind::Parse,
                TOKENS,
                "not an array of strings".into(),
            )
        })?;
        let n = tokens.len();
        if n == 0 || n > u32::MAX as usize {
            return Err(err(
                VocabErrorKind::Invalid,
                TOKENS,
                format!("{n} tokens (expected 1 to {})", u32::MAX),
            ));
        }
        let scores: Vec<f32> = match g.get(SCORES) {
            None => vec![0.0; n],
            Some(v) => {
                let s = match v.as_array() {
                    Some(Array::F32(s)) => s.clone(),
                    Some(Array::I32(s)) => s.iter().map(|&x| x as f32).collect(),
                    _ => {
                        return Err(err(
                            VocabErrorKind::Parse,
                            SCORES,
                            format!(
                                "expected an array of float32 or int32, found {}",
                                crate::gguf::type_name(v.type_id())
                            ),
                        ))
                    }
                };
                if s.len() != n {
                    return Err(err(
                        VocabErrorKind::Invalid,
                        SCORES,
                        format!("has {} entries for {n} tokens", s.len()),
                    ));
                }
                if let Some(i) = s.iter().position(|x| x.is_nan()) {
                    return Err(err(
                        VocabErrorKind::Invalid,
                        &format!("{SCORES}[{i}]"),
                        "is NaN".into(),
                    ));
                }
                s
            }
        };
        let mut ids: HashMap<String, u32> = HashMap::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            let name = if t.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                t.clone()
            };
            ids.insert(name, i as u32);
        }

        let mut byte_ids = [0u32; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            let hex = format!("<0x{b:02X}>");
            let id = ids.get(&hex).copied().or_else(|| {
                (b < 0x80)
                    .then(|| ids.get(&char::from(b as u8).to_string()).copied())
                    .flatten()
            });
            *slot = id.ok_or_else(|| {
                err(
                    VocabErrorKind::Invalid,
                    TOKENS,
                    format!(
                        "no byte-fallback token {hex} (SentencePiece vocabularies need all 256)"
                    ),
                )
            })?;
        }

        // Special tokens: control (3), user-defined (4) and unknown (2), longest text first.
        let phi3 = {
            let name = meta.model_name.to_lowercase();
            name.contains("phi-3") || name.contains("phi3")
        };
        let mut specials = Vec::new();
        for (i, (t, &ty)) in tokens.iter().zip(types).enumerate() {
            if matches!(ty, 2..=4) && !t.is_empty() {
                let rstrip = phi3 && !matches!(t.as_str(), "<unk>" | "<s>" | "<|endoftext|>");
                specials.push(Special {
                    id: i as u32,
                    text: t.clone(),
                    needs_parse_special: ty != 4,
                    lstrip: false,
                    rstrip,
                });
            }
        }
        specials.sort_by(|a, b| b.text.len().cmp(&a.text.len()).then(a.id.cmp(&b.id)));

        Ok(Spm {
            ids,
            scores,
            byte_ids,
            specials,
            add_space_prefix: meta.add_space_prefix.unwrap_or(true),
            bos: meta.add_bos.unwrap_or(true).then_some(meta.bos).flatten(),
            eos: meta.add_eos.unwrap_or(false).then_some(meta.eos).flatten(),
        })
    }

    /// The control and unknown tokens (those `parse_special` recognises): id and text.
    pub(crate) fn special_strings(&self) -> Vec<(u32, String)> {
        self.specials
            .iter()
            .filter(|s| s.needs_parse_special)
            .map(|s| (s.id, s.text.clone()))
            .collect()
    }

    /// The ids of `text`. Control and unknown token strings are recognised except where they
    /// overlap one of `text_spans` (byte ranges); `add_special` adds BOS/EOS as configured.
    pub(crate) fn encode(
        &self,
        text: &str,
        text_spans: &[std::ops::Range<usize>],
        add_special: bool,
    ) -> Vec<u32> {
        let mut out = Vec::new();
        if add_special {
            out.extend(self.bos);
        }
        let mut is_prev_special = true;
        for f in self.partition(text, text_spans) {
            match f {
                Fragment::Token(id) => {
                    out.push(id);
                    is_prev_special = true;
                }
                Fragment::Text(a, b) => {
                    let mut s = String::with_capacity((b - a) * 3 + 3);
                    if self.add_space_prefix && is_prev_special {
                        s.push('\u{2581}');
                    }
                    for c in text[a..b].chars() {
                        s.push(if c == ' ' { '\u{2581}' } else { c });
                    }
                    self.tokenize(&s, &mut out);
                    is_prev_special = false;
                }
            }
        }
        if add_special {
            out.extend(self.eos);
        }
        out
    }

    /// Cuts `text` at special tokens (step 1 of the module documentation).
    fn partition(&self, text: &str, text_spans: &[std::ops::Range<usize>]) -> Vec<Fragment> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Fragment::Text(0, text.len()));
        let bytes = text.as_bytes();
        let in_span = |a: usize, b: usize| text_spans.iter().any(|s| a < s.end && s.start < b);
        for sp in &self.specials {
            let needle = sp.text.as_str();
            if !frags.iter().any(|f| matches!(f, Fragment::Text(..))) {
                break;
            }
            let mut next = Vec::with_capacity(frags.len());
            for f in frags {
                let Fragment::Text(mut base, end) = f else {
                    next.push(f);
                    continue;
                };
                let mut from = base;
                while let Some(rel) = text[from..end].find(needle) {
                    let m = from + rel;
                    let m_end = m + needle.len();
                    if sp.needs_parse_special && in_span(m, m_end) {
                        // Not a special token here: look again one character further on.
                        from = m + text[m..].chars().next().map_or(1, char::len_utf8);
                        if from >= end {
                            break;
                        }
                        continue;
                    }
                    let mut left_end = m;
                    if sp.lstrip {
                        while left_end > base && c_isspace(bytes[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > base {
                        next.push(Fragment::Text(base, left_end));
                    }
                    next.push(Fragment::Token(sp.id));
                    let mut right = m_end;
                    if sp.rstrip {
                        while right < end && c_isspace(bytes[right]) {
                            right += 1;
                        }
                    }
                    base = right;
                    from = right;
                    if from >= end {
                        break;
                    }
                }
                if base < end {
                    next.push(Fragment::Text(base, end));
                }
            }
            frags = next;
        }
        frags
    }

    /// The score-driven merging of one escaped text fragment (steps 3 and 4).
    fn tokenize(&self, text: &str, out: &mut Vec<u32>) {
        #[derive(Clone, Copy)]
        struct Sym {
            start: usize,
            n: usize,
            prev: Option<usize>,
            next: Option<usize>,
        }
        struct Bigram {
            score: f32,
            left: usize,
            right: usize,
            size: usize,
        }
        impl PartialEq for Bigram {
            fn eq(&self, o: &Self) -> bool {
                self.cmp(o) == std::cmp::Ordering::Equal
            }
        }
        impl Eq for Bigram {}
        impl PartialOrd for Bigram {
            fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(o))
            }
        }
        impl Ord for Bigram {
            // Highest score first; equal scores: the leftmost pair first.
            fn cmp(&self, o: &Self) -> std::cmp::Ordering {
                self.score.total_cmp(&o.score).then(o.left.cmp(&self.left))
            }
        }

        let mut syms: Vec<Sym> = Vec::with_capacity(text.len());
        for (start, c) in text.char_indices() {
            let i = syms.len();
            syms.push(Sym {
                start,
                n: c.len_utf8(),
                prev: i.checked_sub(1),
                next: None,
            });
            if i > 0 {
                syms[i - 1].next = Some(i);
            }
        }
        let mut queue = BinaryHeap::new();
        let try_add = |queue: &mut BinaryHeap<Bigram>, syms: &[Sym], l: usize, r: usize| {
            let (a, b) = (syms[l], syms[r]);
            let piece = &text[a.start..a.start + a.n + b.n];
            if let Some(&id) = self.ids.get(piece) {
                queue.push(Bigram {
                    score: self.scores[id as usize],
                    left: l,
                    right: r,
                    size: piece.len(),
                });
            }
        };
        for i in 1..syms.len() {
            try_add(&mut queue, &syms, i - 1, i);
        }
        while let Some(bg) = queue.pop() {
            let (l, r) = (syms[bg.left], syms[bg.right]);
            if l.n == 0 || r.n == 0 || l.n + r.n != bg.size {
                continue;
            }
            syms[bg.left].n += r.n;
            syms[bg.right].n = 0;
            syms[bg.left].next = r.next;
            if let Some(nx) = r.next {
                syms[nx].prev = Some(bg.left);
            }
            if let Some(pv) = syms[bg.left].prev {
                try_add(&mut queue, &syms, pv, bg.left);
            }
            if let Some(nx) = syms[bg.left].next {
                try_add(&mut queue, &syms, bg.left, nx);
            }
        }
        let mut i = (!syms.is_empty()).then_some(0);
        while let Some(k) = i {
            let s = syms[k];
            let piece = &text[s.start..s.start + s.n];
            match self.ids.get(piece) {
                Some(&id) => out.push(id),
                None => out.extend(piece.bytes().map(|b| self.byte_ids[b as usize])),
            }
            i = s.next;
        }
    }
}
