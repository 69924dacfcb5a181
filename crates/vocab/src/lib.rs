//! # nextok-vocab
//!
//! Token vocabularies as **exact bytes**. A [`Vocabulary`] holds, for every token id, the bytes
//! the token stands for ([`TokenBytes`]), the facts the decoding core needs ([`VocabInfo`]:
//! size, EOS ids, special ids), a display name and a [`TokenKind`]. Bytes are never `String`s:
//! a token may be part of a UTF-8 character (a byte-fallback `<0xE4>` token, or a byte-level
//! BPE token that splits a character), and stop strings, streaming and constraints work on
//! these bytes.
//!
//! Sources:
//!
//! * [`hf`] — a Hugging Face `tokenizer.json`: byte-level BPE (GPT-2 byte ↔ unicode map; Llama-3,
//!   Qwen, SmolLM) and SentencePiece-style vocabularies (`▁` for space, `<0xNN>` byte-fallback
//!   tokens; Llama-2, Gemma), with added and special tokens;
//! * [`gguf`] — a small reader of GGUF v2/v3 metadata (header and key–value pairs, stopping
//!   before tensor data), and [`Vocabulary::from_gguf`] for `tokenizer.ggml.*` vocabularies
//!   (`gpt2` and `llama` models);
//! * [`encode`] (feature `encode`, on by default) — text → ids: a `tokenizer.json` through the
//!   `tokenizers` crate; GGUF metadata with llama.cpp's ids — byte-level BPE vocabularies
//!   (Llama 3, Qwen 2/3, GPT-2, SmolLM, …) rebuilt for the `tokenizers` crate with llama.cpp's
//!   pre-tokenizer regexes, SentencePiece vocabularies (Llama 2, Phi-3, Gemma 3) by llama.cpp's
//!   score-driven merge algorithm implemented here.
//!
//! ```
//! use nextok_vocab::{LoadOptions, Vocabulary};
//! let json = r#"{"decoder": {"type": "ByteLevel"},
//!                 "model": {"type": "BPE", "vocab": {"Ġhi": 0, "Ã": 1, "©": 2}, "merges": []}}"#;
//! let v = Vocabulary::from_tokenizer_json(json.as_bytes(), "example", &LoadOptions::default()).unwrap();
//! assert_eq!(v.token(0), Some(&b" hi"[..]));
//! assert_eq!(v.token(1), Some(&[0xC3][..])); // half of "é"
//! assert_eq!(v.decode(&[1, 2]).unwrap(), "é".as_bytes());
//! ```
//!
//! ## How token bytes are derived
//!
//! The bytes of a token are what the tokenizer's *decoder* makes of that token, applied to the
//! token alone — the same per-token rules the Hugging Face decoders apply, so that for any id
//! sequence the concatenated bytes equal the decoded text (for sequences whose bytes are valid
//! UTF-8; Hugging Face replaces invalid UTF-8 with U+FFFD, nextok keeps the bytes).
//!
//! * `ByteLevel`: every character of the token is mapped back through the GPT-2 byte map
//!   ([`bytelevel`]); a token with a character outside the map (an added token containing a
//!   space, say) is taken literally as its UTF-8 bytes.
//! * `Replace(pattern → content)` with a string pattern (`▁` → space), `Metaspace` (`▁` → space),
//!   `ByteFallback` (a token spelled exactly `<0xNN>` is the single byte `NN`), `Fuse`.
//! * `Strip` after `Fuse` (Llama-2's `Strip(' ', 1, 0)`) and the first-token rule of a
//!   `Metaspace` decoder with a prepend scheme act on a whole decoded *sequence*, not on tokens:
//!   they remove the space that the tokenizer prepended to the first word of a prompt. Token
//!   bytes keep that space (token `▁Hello` is ` Hello`), and the rule is recorded in
//!   [`Vocabulary::sequence_strip`] for whoever renders a whole text from its first token.
//!   Generated text is a continuation, never the start of a sequence, so its bytes are exactly
//!   the concatenated token bytes.
//! * Added tokens (special or not) go through the same decoder, as in Hugging Face; for the
//!   usual special tokens (`<|eot_id|>`, `<eos>`, …) that leaves their content unchanged, while
//!   Gemma's added whitespace tokens `▁▁`, `▁▁▁`, … are runs of spaces, which is what the model
//!   means by them (plain text of two spaces encodes to the same ids).
//!
//! [`Vocabulary::decode`] concatenates token bytes (a continuation);
//! [`Vocabulary::decode_text`] also applies the sequence rule (a whole text).
//!
//! The test suite checks every token of the real Llama-3, Qwen3, Gemma-3 and Llama-2
//! `tokenizer.json` files and of the SmolLM2 GGUF vocabulary against the `tokenizers` crate's
//! decoder (`tests/real_files.rs`, data from `scripts/fetch-testdata.sh`).
//!
//! GGUF vocabularies follow llama.cpp: `gpt2` normal tokens undo the byte map; `llama` normal
//! tokens turn `▁` into a space, byte tokens (type 6, `<0xNN>`) are single bytes; control,
//! user-defined and unknown tokens are their text.
//!
//! ## Which tokens are special, which end a sequence
//!
//! Special ids ([`VocabInfo::special_token_ids`]) are the control tokens — `added_tokens` with
//! `"special": true` in a `tokenizer.json`, token type 3 in GGUF — plus the unknown token and
//! any padding ids added by [`LoadOptions::vocab_size`].
//!
//! EOS ids ([`VocabInfo::eos_token_ids`]): when the caller gives a list
//! ([`LoadOptions::eos_token_ids`], the CLI's `--eos-id`), exactly that list. Otherwise the
//! union of
//!
//! 1. the ids the file declares: GGUF `tokenizer.ggml.eos_token_id`, `…eot_token_id` and
//!    `…eom_token_id` (a `tokenizer.json` declares none: that lives in `tokenizer_config.json`
//!    and `generation_config.json`, which are not read);
//! 2. every *special* token whose text is one of [`END_MARKERS`] (`<|end_of_text|>`,
//!    `<|eot_id|>`, `<|im_end|>`, `<|endoftext|>`, `<eos>`, `</s>`, `<end_of_turn>`, …).
//!
//! Only special/control tokens are considered in step 2: Gemma has a plain (non-special) `</s>`
//! token for HTML strike-through, which is not an end of sequence. The BOS id is taken from a
//! `TemplateProcessing` post-processor (its first special token), GGUF
//! `tokenizer.ggml.bos_token_id`, or a special token named in [`BEGIN_MARKERS`].

#![warn(missing_docs)]

pub mod bytelevel;
pub mod display;
#[cfg(feature = "encode")]
pub mod encode;
pub mod error;
pub mod gguf;
mod gguf_vocab;
pub mod hf;
#[cfg(feature = "encode")]
mod spm;

use std::path::Path;

use serde::Serialize;
use sha2::{Digest, Sha256};

pub use error::{Result, VocabError, VocabErrorKind};
pub use nextok_core::{TokenBytes, VocabInfo};

/// Texts of special tokens that end a sequence (see the crate documentation for the rule).
pub const END_MARKERS: &[&str] = &[
    "</s>",
    "<eos>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<end_of_turn>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<｜end▁of▁sentence｜>",
];

/// Texts of special tokens that begin a sequence, used for [`Vocabulary::bos`] when the file
/// does not say.
pub const BEGIN_MARKERS: &[&str] = &[
    "<|begin_of_text|>",
    "<bos>",
    "<s>",
    "<|startoftext|>",
    "<｜begin▁of▁sentence｜>",
];

/// What a token is. The numbering of the first six follows GGUF's `tokenizer.ggml.token_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum TokenKind {
    /// An ordinary piece of text.
    Normal = 1,
    /// The unknown token (special).
    Unknown = 2,
    /// A control token: `<|eot_id|>`, `<bos>`, … (special).
    Control = 3,
    /// A user-defined token: a non-special added token (`<think>`, Gemma's `<unused0>`).
    UserDefined = 4,
    /// An unused slot (GGUF type 5).
    Unused = 5,
    /// A byte token: `<0xNN>` standing for one byte.
    Byte = 6,
    /// An id beyond the tokenizer's vocabulary, added by [`LoadOptions::vocab_size`] to match
    /// the model's logits: no bytes, special.
    Padding = 7,
}

impl TokenKind {
    /// The kind for a GGUF `token_type` value (1–6); `None` otherwise.
    pub fn from_gguf(t: i64) -> Option<TokenKind> {
        Some(match t {
            1 => TokenKind::Normal,
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            5 => TokenKind::Unused,
            6 => TokenKind::Byte,
            _ => return None,
        })
    }

    /// Lower-case name (`normal`, `control`, `user_defined`, …).
    pub fn name(self) -> &'static str {
        match self {
            TokenKind::Normal => "normal",
            TokenKind::Unknown => "unknown",
            TokenKind::Control => "control",
            TokenKind::UserDefined => "user_defined",
            TokenKind::Unused => "unused",
            TokenKind::Byte => "byte",
            TokenKind::Padding => "padding",
        }
    }

    /// Whether tokens of this kind are special (control, unknown, padding).
    pub fn is_special(self) -> bool {
        matches!(
            self,
            TokenKind::Control | TokenKind::Unknown | TokenKind::Padding
        )
    }
}

/// How the tokenizer spells bytes in its token strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ByteEncoding {
    /// GPT-2 byte-level BPE: each byte is one character of the [`bytelevel`] map.
    ByteLevel,
    /// SentencePiece style: `▁` is a space, `<0xNN>` tokens are single bytes.
    SentencePiece,
    /// Token strings are the text itself.
    Plain,
}

/// A rule a decoder applies to a whole decoded sequence rather than to each token (see the
/// crate documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SequenceStrip {
    /// Remove up to `start` leading and `stop` trailing `content` characters of the whole text
    /// (a `Strip` decoder after `Fuse`; Llama-2 strips one leading space).
    Strip {
        /// The character removed.
        content: char,
        /// At most this many at the start.
        start: usize,
        /// At most this many at the end.
        stop: usize,
    },
    /// A `Metaspace` decoder with a prepend scheme: the first token of a sequence drops the
    /// spaces that came from `▁` (in practice the one leading space the tokenizer prepended).
    MetaspaceFirstToken,
}

/// Where a vocabulary came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceFormat {
    /// A Hugging Face `tokenizer.json`.
    TokenizerJson,
    /// GGUF metadata (`tokenizer.ggml.*`).
    Gguf,
}

/// The largest vocabulary size [`LoadOptions::vocab_size`] may ask for (2^22 = 4,194,304 ids,
/// sixteen times the largest vocabularies in use): padding ids cost memory per id.
pub const MAX_VOCAB_SIZE: usize = 1 << 22;

/// Caller's choices when loading.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// EOS ids to use instead of the derived ones (see the crate documentation).
    pub eos_token_ids: Option<Vec<u32>>,
    /// The model's vocabulary size (its logits row length) when it exceeds the tokenizer's:
    /// ids beyond the tokenizer become [`TokenKind::Padding`] tokens with no bytes. Smaller
    /// than the tokenizer's size is an error.
    pub vocab_size: Option<usize>,
}

/// A loaded vocabulary: exact bytes, core facts, names and kinds of every token.
#[derive(Debug, Clone, PartialEq)]
pub struct Vocabulary {
    /// The exact bytes of every token.
    pub bytes: TokenBytes,
    /// Size, EOS ids and special ids, validated (id lists sorted, deduplicated, in range).
    pub info: VocabInfo,
    /// Display form of each token: its string as the file spells it (`Ġhello`, `▁hello`,
    /// `<0x0A>`, `<|eot_id|>`; empty for padding). For display only — text work uses `bytes`.
    pub names: Vec<String>,
    /// The kind of each token.
    pub kinds: Vec<TokenKind>,
    /// The beginning-of-sequence id, when known.
    pub bos: Option<u32>,
    /// How the file spells bytes.
    pub byte_encoding: ByteEncoding,
    /// A rule the decoder applies to whole sequences (not part of any token's bytes).
    pub sequence_strip: Option<SequenceStrip>,
    /// The file format it came from.
    pub format: SourceFormat,
}

impl Vocabulary {
    /// Loads a `tokenizer.json` or a GGUF file, telling them apart by the GGUF magic.
    pub fn load(path: impl AsRef<Path>, opts: &LoadOptions) -> Result<Vocabulary> {
        let path = path.as_ref();
        if gguf::has_gguf_magic(path)? {
            Vocabulary::from_gguf_file(path, opts)
        } else {
            Vocabulary::from_tokenizer_json_file(path, opts)
        }
    }

    /// Loads a Hugging Face `tokenizer.json` file.
    pub fn from_tokenizer_json_file(
        path: impl AsRef<Path>,
        opts: &LoadOptions,
    ) -> Result<Vocabulary> {
        let path = path.as_ref();
        let label = path.display().to_string();
        let data = std::fs::read(path).map_err(|e| VocabError::io(&label, e))?;
        hf::from_slice(&data, &label, opts)
    }

    /// Loads a Hugging Face `tokenizer.json` from memory; `label` names it in errors.
    pub fn from_tokenizer_json(data: &[u8], label: &str, opts: &LoadOptions) -> Result<Vocabulary> {
        hf::from_slice(data, label, opts)
    }

    /// Loads the vocabulary from a GGUF file's metadata (the tensor data is not read).
    pub fn from_gguf_file(path: impl AsRef<Path>, opts: &LoadOptions) -> Result<Vocabulary> {
        let path = path.as_ref();
        let g = gguf::Gguf::read_file(path)?;
        Vocabulary::from_gguf(&g, &path.display().to_string(), opts)
    }

    /// Builds the vocabulary from parsed GGUF metadata; `label` names the file in errors.
    pub fn from_gguf(g: &gguf::Gguf, label: &str, opts: &LoadOptions) -> Result<Vocabulary> {
        gguf_vocab::from_gguf(g, label, opts)
    }

    /// Number of token ids.
    pub fn len(&self) -> usize {
        self.info.vocab_size
    }

    /// Whether the vocabulary is empty (never, once loaded).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of token `id`.
    pub fn token(&self, id: u32) -> Option<&[u8]> {
        self.bytes.get(id)
    }

    /// The display name of token `id`.
    pub fn name(&self, id: u32) -> Option<&str> {
        self.names.get(id as usize).map(String::as_str)
    }

    /// The kind of token `id`.
    pub fn kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    /// The first id whose display name is `name`.
    pub fn id_of_name(&self, name: &str) -> Option<u32> {
        self.names.iter().position(|n| n == name).map(|i| i as u32)
    }

    /// The concatenated bytes of `ids` (no sequence rule applied); an error names the first id
    /// out of range.
    pub fn decode(&self, ids: &[u32]) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let b = self.bytes.get(id).ok_or_else(|| {
                VocabError::new(
                    VocabErrorKind::Invalid,
                    "ids",
                    format!(
                        "ids[{i}] = {id} is out of range (vocabulary has {} tokens)",
                        self.len()
                    ),
                )
            })?;
            out.extend_from_slice(b);
        }
        Ok(out)
    }

    /// The bytes of `ids` as a *whole sequence* (a text that starts at `ids[0]`): the token
    /// bytes with [`Vocabulary::sequence_strip`] applied, as the tokenizer's decoder would. For
    /// a continuation (generated text after a prompt) use [`Vocabulary::decode`].
    pub fn decode_text(&self, ids: &[u32]) -> Result<Vec<u8>> {
        let mut out = self.decode(ids)?;
        match self.sequence_strip {
            None => {}
            Some(SequenceStrip::Strip {
                content,
                start,
                stop,
            }) => {
                let mut u = [0u8; 4];
                let c = content.encode_utf8(&mut u).as_bytes();
                let mut a = 0;
                for _ in 0..start {
                    if out[a..].starts_with(c) {
                        a += c.len();
                    }
                }
                let mut b = out.len();
                for _ in 0..stop {
                    if b >= a + c.len() && out[..b].ends_with(c) {
                        b -= c.len();
                    }
                }
                out = out[a..b].to_vec();
            }
            Some(SequenceStrip::MetaspaceFirstToken) => {
                if let Some(&first) = ids.first() {
                    let n = self.bytes.get(first).map_or(0, <[u8]>::len);
                    let head: Vec<u8> = out[..n].iter().copied().filter(|&b| b != b' ').collect();
                    out.splice(..n, head);
                }
            }
        }
        Ok(out)
    }

    /// Ids whose bytes are not valid UTF-8 on their own (parts of characters).
    pub fn partial_utf8_ids(&self) -> Vec<u32> {
        self.bytes
            .iter()
            .filter(|(_, b)| std::str::from_utf8(b).is_err())
            .map(|(id, _)| id)
            .collect()
    }

    /// SHA-256 (lower-case hex) of the byte table: the vocabulary size, then each token's
    /// length (u32 little-endian) and bytes. Two vocabularies with the same digest give every
    /// id the same bytes.
    pub fn bytes_digest(&self) -> String {
        let mut h = Sha256::new();
        h.update((self.len() as u64).to_le_bytes());
        for (_, b) in self.bytes.iter() {
            h.update((b.len() as u32).to_le_bytes());
            h.update(b);
        }
        display::hex_compact(&h.finalize())
    }
}

/// What a loader hands to [`finish`]: bytes laid out flat, one span per id.
pub(crate) struct Draft {
    pub source: String,
    pub buf: Vec<u8>,
    /// `(start, end)` into `buf` for each id.
    pub spans: Vec<(u32, u32)>,
    pub names: Vec<String>,
    pub kinds: Vec<TokenKind>,
    pub bos: Option<u32>,
    /// EOS ids the file itself declares (GGUF keys).
    pub declared_eos: Vec<u32>,
    pub byte_encoding: ByteEncoding,
    pub sequence_strip: Option<SequenceStrip>,
    pub format: SourceFormat,
}

/// Applies the caller's options and the EOS rule, and validates.
pub(crate) fn finish(mut d: Draft, opts: &LoadOptions) -> Result<Vocabulary> {
    let src = d.source.clone();
    let invalid = |field: &str, msg: String| {
        VocabError::new(VocabErrorKind::Invalid, &src, msg).with_field(field)
    };
    if d.buf.len() > u32::MAX as usize {
        return Err(invalid(
            "tokens",
            "token bytes exceed 4 GiB in total".into(),
        ));
    }
    let n_tok = d.spans.len();
    if n_tok == 0 {
        return Err(invalid("tokens", "the vocabulary has no tokens".into()));
    }
    if let Some(size) = opts.vocab_size {
        if size < n_tok {
            return Err(invalid(
                "vocab_size",
                format!("{size} is smaller than the tokenizer's {n_tok} tokens"),
            ));
        }
        if size > MAX_VOCAB_SIZE {
            return Err(invalid(
                "vocab_size",
                format!("{size} is above the limit of {MAX_VOCAB_SIZE} tokens"),
            ));
        }
        let end = d.buf.len() as u32;
        d.spans.resize(size, (end, end));
        d.names.resize(size, String::new());
        d.kinds.resize(size, TokenKind::Padding);
    }
    let n = d.spans.len();
    let eos = match &opts.eos_token_ids {
        Some(ids) => {
            for (i, &id) in ids.iter().enumerate() {
                if id as usize >= n {
                    return Err(invalid(
                        "eos_token_ids",
                        format!(
                            "eos_token_ids[{i}] = {id} is out of range (vocabulary has {n} tokens)"
                        ),
                    ));
                }
            }
            ids.clone()
        }
        None => {
            let mut v: Vec<u32> = d
                .declared_eos
                .iter()
                .copied()
                .filter(|&id| (id as usize) < n)
                .collect();
            for (id, (name, kind)) in d.names.iter().zip(&d.kinds).enumerate() {
                if *kind == TokenKind::Control && END_MARKERS.contains(&name.as_str()) {
                    v.push(id as u32);
                }
            }
            v
        }
    };
    let special: Vec<u32> = d
        .kinds
        .iter()
        .enumerate()
        .filter(|(_, k)| k.is_special())
        .map(|(i, _)| i as u32)
        .collect();
    let info = VocabInfo {
        vocab_size: n,
        eos_token_ids: eos,
        special_token_ids: special,
    }
    .validated()
    .map_err(|e| invalid("vocab", e.to_string()))?;
    let buf = &d.buf;
    let bytes = TokenBytes::new(d.spans.iter().map(|&(s, e)| &buf[s as usize..e as usize]))
        .map_err(|e| invalid("tokens", e.to_string()))?;
    Ok(Vocabulary {
        bytes,
        info,
        names: d.names,
        kinds: d.kinds,
        bos: d.bos.filter(|&b| (b as usize) < n),
        byte_encoding: d.byte_encoding,
        sequence_strip: d.sequence_strip,
        format: d.format,
    })
}
