//! Text → token ids (feature `encode`).
//!
//! * From a `tokenizer.json` ([`Encoder::from_tokenizer_json_file`]): through the `tokenizers`
//!   crate, with the file's own normalizer, pre-tokenizer, model and added tokens.
//! * From GGUF metadata ([`Encoder::from_gguf`]), giving the ids llama.cpp gives for the same
//!   file (its `llama_tokenize` with special tokens parsed):
//!   - `tokenizer.ggml.model = gpt2` (byte-level BPE): the tokenizer a rebuilt
//!     `tokenizer.json` describes ([`tokenizer_json_from_gguf`]) is built for the `tokenizers`
//!     crate, its vocabulary and merges directly rather than through the JSON. Vocabulary from
//!     `tokenizer.ggml.tokens`, merges from `…merges` (split at the first space after the first
//!     byte, as llama.cpp does). Control (type 3) and unknown (2) tokens become special added
//!     tokens, user-defined (4) tokens plain added tokens (matched in any text). The
//!     pre-tokenizer follows `tokenizer.ggml.pre` (absent: `default`): llama.cpp's list of
//!     split regexes for that value is copied into a `Sequence` of `Split` steps (each regex
//!     splits the pieces of the previous one; text between matches stays a piece, as in
//!     llama.cpp's `unicode_regex_split`), then the byte-level map without its own regex. The
//!     values and their regexes ([`bpe_pre_tokenizer`]):
//!     * `llama3`, `llama-v3`, `llama-bpe`, `falcon3`, `falcon-h1`, `pixtral`, `midm-2.0`,
//!       `lfm2`, `jina-v5-nano` (Llama 3): the Llama-3 regex (numbers in runs of 1–3 digits),
//!       `ignore_merges` (a piece that is a token is taken whole), BOS added by default;
//!     * `dbrx`, `smaug-bpe`: the Llama-3 regex;
//!     * `qwen2`, `deepseek-r1-qwen`, `kormo`, `f2llmv2`, `stablelm2`, `hunyuan`, `solar-open`
//!       (Qwen 2 / 2.5 / 3): the same regex with every digit on its own;
//!     * `qwen35`: the Qwen regex with combining marks (`\p{M}`) joined to letters;
//!     * `gpt-2` (and nextok's `gpt2`), `phi-2`, `mpt`, `olmo`, `jais`, `trillion`,
//!       `granite-docling`, `exaone4` and the other names llama.cpp maps to GPT-2: the GPT-2
//!       regex;
//!     * `smollm`, `starcoder`, `refact`, `command-r`, `codeshell`, `exaone`, `minerva-7b`,
//!       `mellum2`: every digit on its own, then the GPT-2 regex;
//!     * `default`: llama.cpp's default list (punctuation runs, the GPT-2 regex, digit runs,
//!       then groups of three ASCII digits).
//!
//!     Any other value is an [`Unsupported`](VocabErrorKind::Unsupported) error naming
//!     `tokenizer.ggml.pre`.
//!   - `tokenizer.ggml.model = llama` (SentencePiece): llama.cpp's score-driven merge algorithm,
//!     implemented in this crate rather than through the `tokenizers` crate — see the `spm`
//!     module's documentation (in the source) for the algorithm and why.
//!
//!   For both: with `add_special_tokens`, BOS is prepended when `tokenizer.ggml.add_bos_token`
//!   is true (default: true for SentencePiece and the Llama-3 family, false otherwise) and EOS
//!   appended when `tokenizer.ggml.add_eos_token` is true (default false); the ids come from
//!   `tokenizer.ggml.bos_token_id` / `…eos_token_id`, else llama.cpp's defaults (1 and 2 for
//!   SentencePiece, 11 for BPE) when in range. Inconsistent metadata (array lengths that differ
//!   from the token count, ids out of range, a missing `<0xXX>` byte token, keys of the wrong
//!   type) is an error naming the GGUF key.
//!
//! Token types are corrected by token text first, as llama.cpp does (a normal token spelled
//! `</s>` or `<|im_end|>` is a control token; listed in the source at `token_types`).
//!
//! Known differences from llama.cpp, which the reference texts do not hit: special-token
//! strings that overlap each other are matched leftmost-longest by the `tokenizers` crate
//! (BPE), longest-first by llama.cpp; where llama.cpp picks one of several candidate
//! fill-in-the-middle tokens, all are taken.

use serde_json::{json, Map, Value as Json};

use crate::error::{Result, VocabError, VocabErrorKind};
use crate::gguf::{Array, Gguf, Value};
use crate::spm::Spm;

/// Encodes text into token ids.
pub struct Encoder {
    inner: Inner,
    label: String,
    /// Made on first use by [`Encoder::encode_with_text_spans`]: the tokenizer with its
    /// special tokens encoded as ordinary text, and a matcher of the special tokens' strings.
    plain: std::sync::OnceLock<Plain>,
}

/// The two implementations.
enum Inner {
    /// The `tokenizers` crate: a `tokenizer.json`, or a GGUF byte-level BPE vocabulary.
    Hf(Box<tokenizers::Tokenizer>),
    /// A GGUF SentencePiece vocabulary, llama.cpp's algorithm.
    Spm(Box<Spm>),
}

/// What [`Encoder::encode_with_text_spans`] needs beside the tokenizer.
struct Plain {
    /// The `tokenizers` tokenizer with special tokens as text (none for SentencePiece).
    tok: Option<tokenizers::Tokenizer>,
    /// The special tokens' strings, leftmost-longest (as `tokenizers` matches them), and ids.
    specials: Option<(aho_corasick::AhoCorasick, Vec<u32>)>,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder")
            .field("source", &self.label)
            .finish()
    }
}

impl Encoder {
    /// An encoder for the `tokenizer.json` at `path`.
    pub fn from_tokenizer_json_file(path: impl AsRef<std::path::Path>) -> Result<Encoder> {
        let path = path.as_ref();
        let label = path.display().to_string();
        let data = std::fs::read(path).map_err(|e| VocabError::io(&label, e))?;
        Encoder::from_tokenizer_json(&data, &label)
    }

    /// An encoder for a `tokenizer.json` held in memory; `label` names it in errors.
    pub fn from_tokenizer_json(data: &[u8], label: &str) -> Result<Encoder> {
        let tok = tokenizers::Tokenizer::from_bytes(data).map_err(|e| {
            VocabError::new(
                VocabErrorKind::Parse,
                label,
                format!("the tokenizers library cannot load it: {e}"),
            )
        })?;
        Ok(Encoder {
            inner: Inner::Hf(Box::new(tok)),
            label: label.to_string(),
            plain: std::sync::OnceLock::new(),
        })
    }

    /// An encoder rebuilt from GGUF metadata (see the module documentation).
    pub fn from_gguf(g: &Gguf, label: &str) -> Result<Encoder> {
        if model_of(g, label)? == "llama" {
            let n = token_count(g, label)?;
            let flags = Flags::read(g, label, n, true)?;
            let types = token_types(g, label)?;
            let spm = Spm::from_gguf(g, label, &flags, &types)?;
            return Ok(Encoder {
                inner: Inner::Spm(Box::new(spm)),
                label: label.to_string(),
                plain: std::sync::OnceLock::new(),
            });
        }
        Ok(Encoder {
            inner: Inner::Hf(Box::new(tokenizer_from_gguf(g, label)?)),
            label: label.to_string(),
            plain: std::sync::OnceLock::new(),
        })
    }

    /// The token ids of `text`. With `add_special_tokens` the tokenizer's post-processor adds
    /// what it adds (a BOS token, typically). Special tokens written in `text` (such as
    /// `<|im_end|>`) are recognised as such.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let tok = match &self.inner {
            Inner::Hf(tok) => tok,
            Inner::Spm(spm) => return Ok(spm.encode(text, &[], add_special_tokens)),
        };
        let enc = tok.encode(text, add_special_tokens).map_err(|e| {
            VocabError::new(
                VocabErrorKind::Invalid,
                &self.label,
                format!("cannot encode: {e}"),
            )
        })?;
        Ok(enc.get_ids().to_vec())
    }

    /// The token ids of `text` in which the special-token strings written inside `text_spans`
    /// (byte ranges of `text`) are ordinary text: only those outside every span become special
    /// tokens. A chat prompt passes its messages' contents as the spans, so that a message
    /// cannot write control tokens (`<|im_start|>system` inside a user's message stays text)
    /// and control tokens come from the chat template only. When no special-token string
    /// overlaps a span this is [`Encoder::encode`] exactly; otherwise the text is split at the
    /// special tokens outside the spans, each piece encoded with special tokens as text.
    pub fn encode_with_text_spans(
        &self,
        text: &str,
        text_spans: &[std::ops::Range<usize>],
        add_special_tokens: bool,
    ) -> Result<Vec<u32>> {
        let tok = match &self.inner {
            Inner::Hf(tok) => tok,
            Inner::Spm(spm) => return Ok(spm.encode(text, text_spans, add_special_tokens)),
        };
        let plain = self.plain.get_or_init(|| self.make_plain());
        let Some(plain_tok) = &plain.tok else {
            return self.encode(text, add_special_tokens);
        };
        let Some((matcher, ids)) = &plain.specials else {
            return self.encode(text, add_special_tokens);
        };
        let inside = |m: &aho_corasick::Match| {
            text_spans
                .iter()
                .any(|s| m.start() < s.end && s.start < m.end())
        };
        let matches: Vec<aho_corasick::Match> = matcher.find_iter(text).collect();
        if !matches.iter().any(inside) {
            return self.encode(text, add_special_tokens);
        }
        let err = |e: tokenizers::Error| {
            VocabError::new(
                VocabErrorKind::Invalid,
                &self.label,
                format!("cannot encode: {e}"),
            )
        };
        let mut tokens: Vec<tokenizers::Token> = Vec::new();
        let mut at = 0;
        let piece = |from: usize, to: usize, tokens: &mut Vec<tokenizers::Token>| {
            if from < to {
                let enc = plain_tok.encode(&text[from..to], false).map_err(err)?;
                for &id in enc.get_ids() {
                    tokens.push(tokenizers::Token::new(id, String::new(), (from, to)));
                }
            }
            Ok::<(), VocabError>(())
        };
        for m in matches.iter().filter(|m| !inside(m)) {
            piece(at, m.start(), &mut tokens)?;
            let id = ids[m.pattern().as_usize()];
            tokens.push(tokenizers::Token::new(
                id,
                text[m.range()].to_string(),
                (m.start(), m.end()),
            ));
            at = m.end();
        }
        piece(at, text.len(), &mut tokens)?;
        let enc = tokenizers::Encoding::from_tokens(tokens, 0);
        let enc = tok
            .post_process(enc, None, add_special_tokens)
            .map_err(err)?;
        Ok(enc.get_ids().to_vec())
    }

    /// The first special token's string written in `text`, if any.
    pub fn special_in<'t>(&self, text: &'t str) -> Option<&'t str> {
        let plain = self.plain.get_or_init(|| self.make_plain());
        let (matcher, _) = plain.specials.as_ref()?;
        matcher.find(text).map(|m| &text[m.range()])
    }

    /// The tokenizer with special tokens as text, and the matcher of their strings.
    fn make_plain(&self) -> Plain {
        let (tok, mut specials) = match &self.inner {
            Inner::Hf(t) => {
                let mut tok = tokenizers::Tokenizer::clone(t);
                tok.set_encode_special_tokens(true);
                let specials: Vec<(u32, String)> = t
                    .get_added_tokens_decoder()
                    .into_iter()
                    .filter(|(_, t)| t.special && !t.content.is_empty())
                    .map(|(id, t)| (id, t.content))
                    .collect();
                (Some(tok), specials)
            }
            Inner::Spm(spm) => (None, spm.special_strings()),
        };
        specials.sort();
        let matcher = aho_corasick::AhoCorasick::builder()
            .match_kind(aho_corasick::MatchKind::LeftmostLongest)
            .build(specials.iter().map(|(_, c)| c.as_str()))
            .ok();
        Plain {
            tok,
            specials: matcher.map(|m| (m, specials.iter().map(|(id, _)| *id).collect())),
        }
    }

    /// The underlying `tokenizers` tokenizer; `None` for a GGUF SentencePiece vocabulary,
    /// which this crate encodes itself.
    pub fn tokenizer(&self) -> Option<&tokenizers::Tokenizer> {
        match &self.inner {
            Inner::Hf(t) => Some(t),
            Inner::Spm(_) => None,
        }
    }
}

/// The GPT-2 split regex (llama.cpp's `LLAMA_VOCAB_PRE_TYPE_GPT2`).
const GPT2_RE: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// The Llama-3 split regex, as llama.cpp adapts it (case-insensitive contractions spelled out).
const LLAMA3_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The Qwen 2 split regex: Llama-3's with single digits.
const QWEN2_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The Qwen 3.5 split regex: Qwen 2's with combining marks joined to letters.
const QWEN35_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How a `tokenizer.ggml.pre` value pre-tokenizes (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BpePre {
    /// Split regexes, applied in order, each to the pieces of the one before.
    pub regexes: Vec<&'static str>,
    /// Whether a piece that is a whole token skips the merges.
    pub ignore_merges: bool,
    /// Whether BOS is added when `tokenizer.ggml.add_bos_token` is absent.
    pub add_bos_default: bool,
}

/// The pre-tokenizer llama.cpp uses for `pre` (a `tokenizer.ggml.pre` value), or `None` when
/// nextok does not support it.
pub fn bpe_pre_tokenizer(pre: &str) -> Option<BpePre> {
    let p = |regexes: Vec<&'static str>| BpePre {
        regexes,
        ignore_merges: false,
        add_bos_default: false,
    };
    Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => BpePre {
            regexes: vec![LLAMA3_RE],
            ignore_merges: true,
            add_bos_default: true,
        },
        "dbrx" | "smaug-bpe" => p(vec![LLAMA3_RE]),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "stablelm2" | "hunyuan"
        | "solar-open" => p(vec![QWEN2_RE]),
        "qwen35" => p(vec![QWEN35_RE]),
        "gpt2" | "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
        | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" | "mpt" | "olmo" | "jais"
        | "trillion" | "granite-docling" | "exaone4" => p(vec![GPT2_RE]),
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b"
        | "mellum2" => p(vec![r"\p{N}", GPT2_RE]),
        "default" => p(vec![
            r"[\p{P}\$\+<=>\^~\|]+",
            GPT2_RE,
            r"\p{N}+",
            r"[0-9][0-9][0-9]",
        ]),
        _ => return None,
    })
}

/// Tokenizer settings read from GGUF metadata, shared by both vocabulary kinds.
#[derive(Debug, Clone, Default)]
pub(crate) struct Flags {
    /// `general.name` (llama.cpp keys some token attributes on it).
    pub model_name: String,
    /// `tokenizer.ggml.add_space_prefix`.
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// The BOS id: the key's, else llama.cpp's default when in range.
    pub bos: Option<u32>,
    /// The EOS id: the key's, else llama.cpp's default when in range.
    pub eos: Option<u32>,
}

impl Flags {
    /// Reads the settings of a vocabulary of `n` tokens (`spm`: SentencePiece defaults).
    pub(crate) fn read(g: &Gguf, label: &str, n: usize, spm: bool) -> Result<Flags> {
        let err = |kind, key: &str, msg: String| VocabError::new(kind, label, msg).with_field(key);
        let wrong = |key: &str, want: &str, v: &Value| {
            err(
                VocabErrorKind::Parse,
                key,
                format!(
                    "expected {want}, found {}",
                    crate::gguf::type_name(v.type_id())
                ),
            )
        };
        let flag = |key: &str| -> Result<Option<bool>> {
            match g.get(key) {
                None => Ok(None),
                Some(v) => v.as_bool().map(Some).ok_or_else(|| wrong(key, "a bool", v)),
            }
        };
        let id = |key: &str, default: u32| -> Result<Option<u32>> {
            match g.get(key) {
                None => Ok(((default as usize) < n).then_some(default)),
                Some(v) => {
                    let x = v.as_int().ok_or_else(|| wrong(key, "an integer", v))?;
                    if x < 0 || x >= n as i128 {
                        return Err(err(
                            VocabErrorKind::Invalid,
                            key,
                            format!("token id {x} is out of range (vocabulary has {n} tokens)"),
                        ));
                    }
                    Ok(Some(x as u32))
                }
            }
        };
        let model_name = match g.get("general.name") {
            None => String::new(),
            Some(v) => v
                .as_str()
                .ok_or_else(|| wrong("general.name", "a string", v))?
                .to_string(),
        };
        Ok(Flags {
            model_name,
            add_space_prefix: flag("tokenizer.ggml.add_space_prefix")?,
            add_bos: flag("tokenizer.ggml.add_bos_token")?,
            add_eos: flag("tokenizer.ggml.add_eos_token")?,
            bos: id("tokenizer.ggml.bos_token_id", if spm { 1 } else { 11 })?,
            eos: id("tokenizer.ggml.eos_token_id", if spm { 2 } else { 11 })?,
        })
    }
}

/// Texts llama.cpp makes end-of-generation tokens, typing them control whatever the file says.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Fill-in-the-middle token texts llama.cpp types control when the file names no such token:
/// the key(s) and the texts.
const FIM_TEXTS: &[(&[&str], &[&str])] = &[
    (
        &[
            "tokenizer.ggml.fim_pre_token_id",
            "tokenizer.ggml.prefix_token_id",
        ],
        &[
            "<|fim_prefix|>",
            "<fim-prefix>",
            "<fim_prefix>",
            "<｜fim▁begin｜>",
            "<PRE>",
            "▁<PRE>",
            "<|code_prefix|>",
            "<|prefix|>",
        ],
    ),
    (
        &[
            "tokenizer.ggml.fim_suf_token_id",
            "tokenizer.ggml.suffix_token_id",
        ],
        &[
            "<|fim_suffix|>",
            "<fim-suffix>",
            "<fim_suffix>",
            "<｜fim▁hole｜>",
            "<SUF>",
            "▁<SUF>",
            "<|code_suffix|>",
            "<|suffix|>",
        ],
    ),
    (
        &[
            "tokenizer.ggml.fim_mid_token_id",
            "tokenizer.ggml.middle_token_id",
        ],
        &[
            "<|fim_middle|>",
            "<fim-middle>",
            "<fim_middle>",
            "<｜fim▁end｜>",
            "<MID>",
            "▁<MID>",
            "<|code_middle|>",
            "<|middle|>",
        ],
    ),
    (
        &["tokenizer.ggml.fim_pad_token_id"],
        &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    ),
    (
        &["tokenizer.ggml.fim_rep_token_id"],
        &[
            "<|fim_repo|>",
            "<|repo_name|>",
            "<fim-repo>",
            "<REPO>",
            "<reponame>",
        ],
    ),
    (&["tokenizer.ggml.fim_sep_token_id"], &["<|file_sep|>"]),
];

/// `tokenizer.ggml.token_type` (all normal when absent), checked (one known type per token)
/// and corrected by token text as llama.cpp's vocabulary loader does:
///
/// * end-of-generation texts (`<|im_end|>`, `</s>`, `<end_of_turn>`, … — [`EOG_TEXTS`]) and,
///   when the file names no such token, fill-in-the-middle texts (`<|fim_prefix|>`, …) become
///   control (3);
/// * `<|channel|>`, `<|message|>`, `<|start|>`, `<|constrain|>` become user-defined (4), and so
///   does `<|end|>` beside `<|return|>` and `<|call|>` (or `<|call(s)|>` and `<|flush|>`);
/// * `</s>` beside `<|tool_response>` or `<|plamo:eos|>` becomes normal (1).
///
/// Where llama.cpp takes one fill-in-the-middle token of several candidates (in hash order),
/// every candidate is made control here.
pub(crate) fn token_types(g: &Gguf, label: &str) -> Result<Vec<i64>> {
    const TYPES: &str = "tokenizer.ggml.token_type";
    let err = |kind, key: &str, msg: String| VocabError::new(kind, label, msg).with_field(key);
    let tokens = g
        .get("tokenizer.ggml.tokens")
        .and_then(Value::as_array)
        .and_then(Array::as_strings)
        .ok_or_else(|| {
            err(
                VocabErrorKind::Invalid,
                "tokenizer.ggml.tokens",
                "missing or not an array of strings".into(),
            )
        })?;
    let n = tokens.len();
    let mut types = match g.get(TYPES) {
        None => vec![1; n],
        Some(v) => {
            let t = v.as_array().and_then(Array::to_i64s).ok_or_else(|| {
                err(
                    VocabErrorKind::Parse,
                    TYPES,
                    "not an array of integers".into(),
                )
            })?;
            if t.len() != n {
                return Err(err(
                    VocabErrorKind::Invalid,
                    TYPES,
                    format!("has {} entries for {n} tokens", t.len()),
                ));
            }
            t
        }
    };
    if let Some(i) = types.iter().position(|t| !(1..=6).contains(t)) {
        return Err(err(
            VocabErrorKind::Invalid,
            &format!("{TYPES}[{i}]"),
            format!("unknown token type {} (expected 1 to 6)", types[i]),
        ));
    }
    let has = |text: &str| tokens.iter().any(|t| t == text);
    let set = |types: &mut Vec<i64>, texts: &[&str], ty: i64| {
        for (i, t) in tokens.iter().enumerate() {
            if texts.contains(&t.as_str()) {
                types[i] = ty;
            }
        }
    };
    set(&mut types, EOG_TEXTS, 3);
    for (keys, texts) in FIM_TEXTS {
        if keys.iter().all(|k| g.get(k).is_none()) {
            set(&mut types, texts, 3);
        }
    }
    set(
        &mut types,
        &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"],
        4,
    );
    let call = has("<|call|>") || has("<|calls|>");
    if has("<|end|>") && call && (has("<|return|>") || has("<|flush|>")) {
        set(&mut types, &["<|end|>"], 4);
    }
    if has("</s>") && (has("<|tool_response>") || has("<|plamo:eos|>")) {
        set(&mut types, &["</s>"], 1);
    }
    Ok(types)
}

/// `tokenizer.ggml.model`, which must be a string.
fn model_of<'g>(g: &'g Gguf, label: &str) -> Result<&'g str> {
    const MODEL: &str = "tokenizer.ggml.model";
    match g.get(MODEL) {
        Some(Value::String(s)) => Ok(s),
        Some(v) => Err(VocabError::new(
            VocabErrorKind::Parse,
            label,
            format!(
                "expected a string, found {}",
                crate::gguf::type_name(v.type_id())
            ),
        )
        .with_field(MODEL)),
        None => Err(VocabError::new(
            VocabErrorKind::Unsupported,
            label,
            "encoding needs a tokenizer model (gpt2 or llama); the key is missing",
        )
        .with_field(MODEL)),
    }
}

/// The length of `tokenizer.ggml.tokens`.
fn token_count(g: &Gguf, label: &str) -> Result<usize> {
    g.get("tokenizer.ggml.tokens")
        .and_then(Value::as_array)
        .and_then(Array::as_strings)
        .map(<[String]>::len)
        .ok_or_else(|| {
            VocabError::new(
                VocabErrorKind::Invalid,
                label,
                "missing or not an array of strings",
            )
            .with_field("tokenizer.ggml.tokens")
        })
}

/// The `tokenizer.json` (as JSON) equivalent to a byte-level BPE (`gpt2`) GGUF vocabulary
/// (see the module documentation); [`Encoder::from_gguf`] builds the same tokenizer without
/// the JSON.
pub fn tokenizer_json_from_gguf(g: &Gguf, label: &str) -> Result<Json> {
    let p = bpe_from_gguf(g, label)?;
    let mut json = p.skeleton;
    let vocab: Map<String, Json> = p
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    json["model"]["vocab"] = Json::Object(vocab);
    json["model"]["merges"] = p.merges.iter().map(|(a, b)| json!([a, b])).collect();
    json["added_tokens"] = p
        .added
        .iter()
        .map(|&(i, special)| {
            json!({
                "id": i, "content": p.tokens[i], "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": special
            })
        })
        .collect();
    Ok(json)
}

/// What a byte-level BPE GGUF vocabulary gives a tokenizer: the `tokenizer.json` without its
/// vocabulary, merges and added tokens (pre-tokenizer, decoder, post-processor), and those.
struct BpeFromGguf<'g> {
    skeleton: Json,
    tokens: &'g [String],
    merges: Vec<(&'g str, &'g str)>,
    /// Added tokens: id, and whether special.
    added: Vec<(usize, bool)>,
    ignore_merges: bool,
}

/// The tokenizer [`tokenizer_json_from_gguf`] describes, built directly: the small parts
/// through their JSON, the vocabulary and merges through the BPE builder, the added tokens as
/// the JSON loader adds them (after the model, so each keeps its vocabulary id). The JSON of a
/// 150,000-token vocabulary held about 200 MB while it was built and parsed.
fn tokenizer_from_gguf(g: &Gguf, label: &str) -> Result<tokenizers::Tokenizer> {
    let parse = |e: String| {
        VocabError::new(
            VocabErrorKind::Parse,
            label,
            format!("the tokenizers library cannot load it: {e}"),
        )
    };
    let p = bpe_from_gguf(g, label)?;
    let mut tok = tokenizers::Tokenizer::from_bytes(p.skeleton.to_string().as_bytes())
        .map_err(|e| parse(e.to_string()))?;
    let mut vocab = tokenizers::models::bpe::Vocab::default();
    vocab.reserve(p.tokens.len());
    for (i, t) in p.tokens.iter().enumerate() {
        vocab.insert(t.clone(), i as u32);
    }
    let merges = p
        .merges
        .iter()
        .map(|&(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let bpe = tokenizers::models::bpe::BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(p.ignore_merges)
        .build()
        .map_err(|e| parse(e.to_string()))?;
    tok.with_model(bpe);
    let added: Vec<tokenizers::AddedToken> = p
        .added
        .iter()
        .map(|&(i, special)| {
            tokenizers::AddedToken::from(p.tokens[i].clone(), special)
                .single_word(false)
                .lstrip(false)
                .rstrip(false)
                .normalized(false)
        })
        .collect();
    tok.add_tokens(&added);
    Ok(tok)
}

/// The parts of a byte-level BPE GGUF vocabulary, every key checked (see [`BpeFromGguf`]).
fn bpe_from_gguf<'g>(g: &'g Gguf, label: &str) -> Result<BpeFromGguf<'g>> {
    let err = |kind, key: &str, msg: String| VocabError::new(kind, label, msg).with_field(key);
    let model = model_of(g, label)?;
    if model != "gpt2" {
        return Err(err(
            VocabErrorKind::Unsupported,
            "tokenizer.ggml.model",
            format!(
                "encoding is supported for gpt2 (byte-level BPE) and llama (SentencePiece) \
                 vocabularies, not `{model}`"
            ),
        ));
    }
    let pre = match g.get("tokenizer.ggml.pre") {
        None => "default",
        Some(v) => v.as_str().ok_or_else(|| {
            err(
                VocabErrorKind::Parse,
                "tokenizer.ggml.pre",
                format!(
                    "expected a string, found {}",
                    crate::gguf::type_name(v.type_id())
                ),
            )
        })?,
    };
    let bpe_pre = bpe_pre_tokenizer(pre).ok_or_else(|| {
        err(
            VocabErrorKind::Unsupported,
            "tokenizer.ggml.pre",
            format!(
                "pre-tokenizer `{pre}` is not supported for encoding (the Llama-3, Qwen 2/3, \
                 GPT-2, SmolLM and default families are)"
            ),
        )
    })?;
    let mut steps: Vec<Json> = bpe_pre
        .regexes
        .iter()
        .map(|r| json!({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": false}))
        .collect();
    steps.push(json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}));
    let pre_tokenizer = json!({"type": "Sequence", "pretokenizers": steps});
    let tokens = g
        .get("tokenizer.ggml.tokens")
        .and_then(Value::as_array)
        .and_then(|a| a.as_strings())
        .ok_or_else(|| {
            err(
                VocabErrorKind::Invalid,
                "tokenizer.ggml.tokens",
                "missing or not an array of strings".into(),
            )
        })?;
    let n = tokens.len();
    let types = token_types(g, label)?;
    let merges = match g.get("tokenizer.ggml.merges") {
        None => &[][..],
        Some(v) => v.as_array().and_then(|a| a.as_strings()).ok_or_else(|| {
            err(
                VocabErrorKind::Parse,
                "tokenizer.ggml.merges",
                "not an array of strings".into(),
            )
        })?,
    };
    let mut merge_pairs = Vec::with_capacity(merges.len());
    for (i, m) in merges.iter().enumerate() {
        // llama.cpp: the first space after the first byte.
        let at = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1);
        let (a, b) = at.map(|p| (&m[..p], &m[p + 1..])).ok_or_else(|| {
            err(
                VocabErrorKind::Invalid,
                &format!("tokenizer.ggml.merges[{i}]"),
                format!("merge {m:?} is not two tokens separated by a space"),
            )
        })?;
        merge_pairs.push((a, b));
    }
    let added = (0..n)
        .filter(|&i| matches!(types[i], 2..=4) && !tokens[i].is_empty())
        .map(|i| (i, types[i] != 4))
        .collect();
    let flags = Flags::read(g, label, n, false)?;
    let bos = flags
        .add_bos
        .unwrap_or(bpe_pre.add_bos_default)
        .then_some(flags.bos)
        .flatten();
    let eos = flags
        .add_eos
        .unwrap_or(false)
        .then_some(flags.eos)
        .flatten();
    let post_processor = if bos.is_none() && eos.is_none() {
        Json::Null
    } else {
        let st = |id: u32| json!({"SpecialToken": {"id": tokens[id as usize], "type_id": 0}});
        let seq = |s: &str, t: u32| json!({"Sequence": {"id": s, "type_id": t}});
        let mut single = Vec::new();
        let mut pair = Vec::new();
        let mut special_tokens = Map::new();
        if let Some(b) = bos {
            single.push(st(b));
            pair.push(st(b));
        }
        single.push(seq("A", 0));
        pair.push(seq("A", 0));
        pair.push(seq("B", 1));
        if let Some(e) = eos {
            single.push(st(e));
            pair.push(st(e));
        }
        for id in bos.iter().chain(eos.iter()) {
            let name = &tokens[*id as usize];
            special_tokens.insert(
                name.clone(),
                json!({"id": name, "ids": [id], "tokens": [name]}),
            );
        }
        json!({
            "type": "TemplateProcessing",
            "single": single,
            "pair": pair,
            "special_tokens": special_tokens
        })
    };
    let skeleton = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": bpe_pre.ignore_merges, "vocab": {}, "merges": []
        }
    });
    Ok(BpeFromGguf {
        skeleton,
        tokens,
        merges: merge_pairs,
        added,
        ignore_merges: bpe_pre.ignore_merges,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{write_metadata, Array};

    #[test]
    fn tiny_gguf_encoder() {
        let tokens: Vec<String> = ["<|endoftext|>", "h", "i", "Ġ", "hi", "Ġhi", "1", "2", "12"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let md = vec![
            (
                "tokenizer.ggml.model".to_string(),
                Value::String("gpt2".into()),
            ),
            (
                "tokenizer.ggml.pre".to_string(),
                Value::String("smollm".into()),
            ),
            (
                "tokenizer.ggml.tokens".to_string(),
                Value::Array(Array::String(tokens)),
            ),
            (
                "tokenizer.ggml.token_type".to_string(),
                Value::Array(Array::I32(vec![3, 1, 1, 1, 1, 1, 1, 1, 1])),
            ),
            (
                "tokenizer.ggml.merges".to_string(),
                Value::Array(Array::String(vec![
                    "h i".into(),
                    "Ġ hi".into(),
                    "1 2".into(),
                ])),
            ),
        ];
        let g = Gguf::from_bytes(&write_metadata(3, false, &md), "t.gguf").unwrap();
        let enc = Encoder::from_gguf(&g, "t.gguf").unwrap();
        assert_eq!(enc.encode("hi hi", false).unwrap(), vec![4, 5]);
        // Digits are split one by one, so the merge `1 2` never applies.
        assert_eq!(enc.encode("12", false).unwrap(), vec![6, 7]);
        assert_eq!(enc.encode("hi<|endoftext|>", false).unwrap(), vec![4, 0]);
    }

    #[test]
    fn unsupported_pre_tokenizer_is_named() {
        let md = vec![
            (
                "tokenizer.ggml.model".to_string(),
                Value::String("gpt2".into()),
            ),
            (
                "tokenizer.ggml.pre".to_string(),
                Value::String("no-such-pre".into()),
            ),
        ];
        let g = Gguf::from_bytes(&write_metadata(3, false, &md), "t.gguf").unwrap();
        let e = Encoder::from_gguf(&g, "t.gguf").unwrap_err();
        assert_eq!(e.field(), Some("tokenizer.ggml.pre"));
        assert_eq!(e.kind(), VocabErrorKind::Unsupported);
        assert!(e.to_string().contains("no-such-pre"), "{e}");
    }

    fn kv(key: &str, v: Value) -> (String, Value) {
        (key.to_string(), v)
    }

    fn strings(v: &[&str]) -> Value {
        Value::Array(Array::String(v.iter().map(|s| s.to_string()).collect()))
    }

    /// A byte-level vocabulary: the 256 byte characters, then `extra`; merges as given.
    fn bpe_gguf(pre: &str, extra: &[&str], merges: &[&str]) -> Gguf {
        let mut tokens: Vec<String> = (0..=255u8)
            .map(|b| crate::bytelevel::encode(&[b]))
            .collect();
        tokens.extend(extra.iter().map(|s| s.to_string()));
        let md = vec![
            kv("tokenizer.ggml.model", Value::String("gpt2".into())),
            kv("tokenizer.ggml.pre", Value::String(pre.into())),
            kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens))),
            kv("tokenizer.ggml.merges", strings(merges)),
        ];
        Gguf::from_bytes(&write_metadata(3, false, &md), "t.gguf").unwrap()
    }

    #[test]
    fn digit_rules_of_the_pre_tokenizers() {
        let merges = ["1 2", "12 3", "123 4", "3 4"];
        let extra = ["12", "123", "1234", "34"];
        let id = |s: &str| 256 + extra.iter().position(|e| *e == s).unwrap() as u32;
        let b = |c: char| c as u32; // the byte-level character of an ASCII digit is itself
                                    // Qwen 2: every digit alone.
        let q = Encoder::from_gguf(&bpe_gguf("qwen2", &extra, &merges), "t").unwrap();
        assert_eq!(
            q.encode("1234", false).unwrap(),
            vec![b('1'), b('2'), b('3'), b('4')]
        );
        // Llama 3: runs of up to three digits.
        let l = Encoder::from_gguf(&bpe_gguf("llama-bpe", &extra, &merges), "t").unwrap();
        assert_eq!(l.encode("1234", false).unwrap(), vec![id("123"), b('4')]);
        // GPT-2: a whole number.
        let g = Encoder::from_gguf(&bpe_gguf("gpt-2", &extra, &merges), "t").unwrap();
        assert_eq!(g.encode("1234", false).unwrap(), vec![id("1234")]);
    }

    /// A SentencePiece vocabulary: `<unk>`, `<s>`, `</s>`, the 256 byte tokens, then `extra`
    /// (text, score, type); `more` replaces or adds keys.
    fn spm_md(extra: &[(&str, f32, i32)], more: Vec<(String, Value)>) -> Vec<(String, Value)> {
        let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
        let mut scores = vec![0.0f32; 3];
        let mut types = vec![2, 3, 3];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            scores.push(0.0);
            types.push(6);
        }
        for (t, s, ty) in extra {
            tokens.push(t.to_string());
            scores.push(*s);
            types.push(*ty);
        }
        let mut md = vec![
            kv("tokenizer.ggml.model", Value::String("llama".into())),
            kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens))),
            kv("tokenizer.ggml.scores", Value::Array(Array::F32(scores))),
            kv("tokenizer.ggml.token_type", Value::Array(Array::I32(types))),
        ];
        for (k, v) in more {
            md.retain(|(key, _)| *key != k);
            md.push((k, v));
        }
        md
    }

    fn spm(extra: &[(&str, f32, i32)], more: Vec<(String, Value)>) -> Result<Encoder> {
        let g = Gguf::from_bytes(&write_metadata(3, false, &spm_md(extra, more)), "t.gguf")?;
        Encoder::from_gguf(&g, "t.gguf")
    }

    const SPM_EXTRA: &[(&str, f32, i32)] = &[
        ("\u{2581}", -1.0, 1),  // 259
        ("a", -2.0, 1),         // 260
        ("b", -2.0, 1),         // 261
        ("ab", -3.0, 1),        // 262
        ("ba", -3.0, 1),        // 263
        ("\u{2581}a", -4.0, 1), // 264
        ("<ctl>", 0.0, 3),      // 265
        ("<usr>", 0.0, 4),      // 266
    ];

    #[test]
    fn spm_merges_by_score_then_leftmost() {
        let e = spm(SPM_EXTRA, vec![]).unwrap();
        // "▁aba": pairs ▁a (-4), ab (-3), ba (-3): ab wins (above ▁a, left of ba).
        assert_eq!(e.encode("aba", false).unwrap(), vec![259, 262, 260]);
        // Without the prefix space.
        let e2 = spm(
            SPM_EXTRA,
            vec![kv("tokenizer.ggml.add_space_prefix", Value::Bool(false))],
        )
        .unwrap();
        assert_eq!(e2.encode("aba", false).unwrap(), vec![262, 260]);
        // Byte fallback for a character that is no token: é is C3 A9.
        assert_eq!(e2.encode("é", false).unwrap(), vec![3 + 0xC3, 3 + 0xA9]);
        // BOS by default with add_special; none without.
        assert_eq!(e2.encode("a", true).unwrap(), vec![1, 260]);
        assert_eq!(e2.encode("", true).unwrap(), vec![1]);
        assert_eq!(e2.encode("", false).unwrap(), Vec::<u32>::new());
        // EOS when asked for.
        let e3 = spm(
            SPM_EXTRA,
            vec![
                kv("tokenizer.ggml.add_eos_token", Value::Bool(true)),
                kv("tokenizer.ggml.add_bos_token", Value::Bool(false)),
                kv("tokenizer.ggml.add_space_prefix", Value::Bool(false)),
            ],
        )
        .unwrap();
        assert_eq!(e3.encode("a", true).unwrap(), vec![260, 2]);
    }

    #[test]
    fn spm_special_tokens_and_spans() {
        let e = spm(SPM_EXTRA, vec![]).unwrap();
        // Control tokens are cut out; the text after a special token gets the space prefix.
        assert_eq!(e.encode("a<ctl>a", false).unwrap(), vec![264, 265, 264]);
        // Inside a text span the control token is text; user-defined tokens always match.
        let span = 0..7;
        let spans = std::slice::from_ref(&span);
        let ids = e.encode_with_text_spans("a<ctl>a", spans, false).unwrap();
        assert!(!ids.contains(&265), "{ids:?}");
        assert_eq!(
            e.encode_with_text_spans("<usr>", spans, false).unwrap(),
            vec![266]
        );
        assert_eq!(e.special_in("x<ctl>"), Some("<ctl>"));
        assert_eq!(e.special_in("x<usr>"), None);
        // Phi-3: special tokens strip the whitespace after them.
        let phi = spm(
            SPM_EXTRA,
            vec![
                kv("general.name", Value::String("Phi3".into())),
                kv("tokenizer.ggml.add_space_prefix", Value::Bool(false)),
            ],
        )
        .unwrap();
        assert_eq!(phi.encode("<ctl> \n\ta", false).unwrap(), vec![265, 260]);
        assert_eq!(e.encode("<ctl> a", false).unwrap(), vec![265, 259, 264]);
    }

    #[test]
    fn spm_bad_metadata_names_the_key() {
        let field = |more: Vec<(String, Value)>| spm(SPM_EXTRA, more).unwrap_err();
        let e = field(vec![kv(
            "tokenizer.ggml.scores",
            Value::Array(Array::F32(vec![0.0; 3])),
        )]);
        assert_eq!(e.field(), Some("tokenizer.ggml.scores"));
        assert!(
            e.to_string().contains("has 3 entries for 267 tokens"),
            "{e}"
        );
        let e = field(vec![kv(
            "tokenizer.ggml.scores",
            Value::Array(Array::String(vec!["x".into(); 267])),
        )]);
        assert_eq!(e.field(), Some("tokenizer.ggml.scores"));
        assert_eq!(e.kind(), VocabErrorKind::Parse);
        let mut nan = vec![0.0f32; 267];
        nan[100] = f32::NAN;
        let e = field(vec![kv(
            "tokenizer.ggml.scores",
            Value::Array(Array::F32(nan)),
        )]);
        assert_eq!(e.field(), Some("tokenizer.ggml.scores[100]"));
        let e = field(vec![kv(
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(vec![1; 5])),
        )]);
        assert_eq!(e.field(), Some("tokenizer.ggml.token_type"));
        let e = field(vec![kv("tokenizer.ggml.bos_token_id", Value::U32(267))]);
        assert_eq!(e.field(), Some("tokenizer.ggml.bos_token_id"));
        assert!(e.to_string().contains("out of range"), "{e}");
        let e = field(vec![kv(
            "tokenizer.ggml.add_bos_token",
            Value::String("yes".into()),
        )]);
        assert_eq!(e.field(), Some("tokenizer.ggml.add_bos_token"));
        let mut types = vec![1i32; 267];
        types[7] = 42;
        let e = field(vec![kv(
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(types)),
        )]);
        assert_eq!(e.field(), Some("tokenizer.ggml.token_type[7]"));
        // A byte token missing: <0x80> renamed.
        let mut md = spm_md(SPM_EXTRA, vec![]);
        if let Value::Array(Array::String(t)) = &mut md[1].1 {
            t[3 + 0x80] = "<0x80x>".into();
        }
        let g = Gguf::from_bytes(&write_metadata(3, false, &md), "t.gguf").unwrap();
        let e = Encoder::from_gguf(&g, "t.gguf").unwrap_err();
        assert_eq!(e.field(), Some("tokenizer.ggml.tokens"));
        assert!(e.to_string().contains("<0x80>"), "{e}");
        // Wrong types of the model and the tokens.
        let e = field(vec![kv("tokenizer.ggml.model", Value::U32(1))]);
        assert_eq!(e.field(), Some("tokenizer.ggml.model"));
        let e = field(vec![kv("tokenizer.ggml.tokens", Value::U32(1))]);
        assert_eq!(e.field(), Some("tokenizer.ggml.tokens"));
    }

    #[test]
    fn tokens_retyped_by_text_as_llama_cpp_does() {
        // `</s>` typed normal is an end-of-generation token for llama.cpp: matched whole.
        let g = bpe_gguf("qwen2", &["</s>", "<|fim_prefix|>"], &[]);
        let e = Encoder::from_gguf(&g, "t").unwrap();
        assert_eq!(e.encode("a</s>", false).unwrap(), vec![b'a' as u32, 256]);
        assert_eq!(e.special_in("x</s>"), Some("</s>"));
        assert_eq!(e.encode("<|fim_prefix|>", false).unwrap(), vec![257]);
        // Named by its key, the fill-in-the-middle token is left as the file types it.
        let mut md = vec![kv("tokenizer.ggml.fim_pre_token_id", Value::U32(0))];
        let tokens: Vec<String> = (0..=255u8)
            .map(|b| crate::bytelevel::encode(&[b]))
            .chain(["<|fim_prefix|>".to_string()])
            .collect();
        md.push(kv("tokenizer.ggml.model", Value::String("gpt2".into())));
        md.push(kv("tokenizer.ggml.pre", Value::String("qwen2".into())));
        md.push(kv(
            "tokenizer.ggml.tokens",
            Value::Array(Array::String(tokens)),
        ));
        let g = Gguf::from_bytes(&write_metadata(3, false, &md), "t.gguf").unwrap();
        let types = token_types(&g, "t").unwrap();
        assert_eq!(types[256], 1);
        // `</s>` beside `<|tool_response>` stays normal.
        let g = bpe_gguf("qwen2", &["</s>", "<|tool_response>"], &[]);
        let types = token_types(&g, "t").unwrap();
        assert_eq!((types[256], types[257]), (1, 3));
    }

    #[test]
    fn bpe_bad_metadata_names_the_key() {
        let g = bpe_gguf("qwen2", &["ab"], &["ab"]);
        let e = Encoder::from_gguf(&g, "t").unwrap_err();
        assert_eq!(e.field(), Some("tokenizer.ggml.merges[0]"));
        let mut md = vec![
            kv("tokenizer.ggml.model", Value::String("gpt2".into())),
            kv("tokenizer.ggml.pre", Value::String("qwen2".into())),
            kv("tokenizer.ggml.tokens", strings(&["a", "b"])),
            kv(
                "tokenizer.ggml.token_type",
                Value::Array(Array::I32(vec![1])),
            ),
        ];
        let load = |md: &[(String, Value)]| {
            let g = Gguf::from_bytes(&write_metadata(3, false, md), "t.gguf").unwrap();
            Encoder::from_gguf(&g, "t").unwrap_err()
        };
        assert_eq!(load(&md).field(), Some("tokenizer.ggml.token_type"));
        md.pop();
        md.push(kv("tokenizer.ggml.eos_token_id", Value::I32(-1)));
        md.push(kv("tokenizer.ggml.add_eos_token", Value::Bool(true)));
        assert_eq!(load(&md).field(), Some("tokenizer.ggml.eos_token_id"));
        md.truncate(3);
        md[1] = kv("tokenizer.ggml.pre", Value::U8(1));
        assert_eq!(load(&md).field(), Some("tokenizer.ggml.pre"));
    }
}
