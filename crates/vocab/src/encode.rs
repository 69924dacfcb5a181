//! Text → token ids, through the `tokenizers` crate (feature `encode`).
//!
//! * From a `tokenizer.json`: the file's own normalizer, pre-tokenizer, model and added tokens.
//! * From GGUF metadata ([`Encoder::from_gguf`]): a byte-level BPE tokenizer is rebuilt from
//!   `tokenizer.ggml.tokens`, `…merges` and `…token_type`. Control tokens become special added
//!   tokens and user-defined tokens plain added tokens. The pre-tokenizer follows
//!   `tokenizer.ggml.pre`: `smollm` splits every digit on its own and then applies the GPT-2
//!   byte-level split without a prefix space; `gpt2` / `gpt-2` / `default` apply the GPT-2
//!   split alone. When `tokenizer.ggml.add_bos_token` is true the BOS token is prepended with
//!   `add_special_tokens`. SentencePiece (`llama`) GGUF vocabularies are not supported yet.

use serde_json::{json, Map, Value as Json};

use crate::error::{Result, VocabError, VocabErrorKind};
use crate::gguf::{Gguf, Value};

/// Encodes text into token ids.
pub struct Encoder {
    tok: tokenizers::Tokenizer,
    label: String,
    /// Made on first use by [`Encoder::encode_with_text_spans`]: the tokenizer with its
    /// special tokens encoded as ordinary text, and a matcher of the special tokens' strings.
    plain: std::sync::OnceLock<Plain>,
}

/// What [`Encoder::encode_with_text_spans`] needs beside the tokenizer.
struct Plain {
    tok: tokenizers::Tokenizer,
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
            tok,
            label: label.to_string(),
            plain: std::sync::OnceLock::new(),
        })
    }

    /// An encoder rebuilt from GGUF metadata (see the module documentation).
    pub fn from_gguf(g: &Gguf, label: &str) -> Result<Encoder> {
        let json = tokenizer_json_from_gguf(g, label)?;
        let text = serde_json::to_string(&json)
            .map_err(|e| VocabError::new(VocabErrorKind::Parse, label, e.to_string()))?;
        Encoder::from_tokenizer_json(text.as_bytes(), label)
    }

    /// The token ids of `text`. With `add_special_tokens` the tokenizer's post-processor adds
    /// what it adds (a BOS token, typically). Special tokens written in `text` (such as
    /// `<|im_end|>`) are recognised as such.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self.tok.encode(text, add_special_tokens).map_err(|e| {
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
        let plain = self.plain.get_or_init(|| self.make_plain());
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
                let enc = plain.tok.encode(&text[from..to], false).map_err(err)?;
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
        let enc = self
            .tok
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
        let mut tok = self.tok.clone();
        tok.set_encode_special_tokens(true);
        let mut specials: Vec<(u32, String)> = self
            .tok
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special && !t.content.is_empty())
            .map(|(id, t)| (id, t.content))
            .collect();
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

    /// The underlying `tokenizers` tokenizer.
    pub fn tokenizer(&self) -> &tokenizers::Tokenizer {
        &self.tok
    }
}

/// The `tokenizer.json` (as JSON) equivalent to a byte-level BPE GGUF vocabulary.
pub fn tokenizer_json_from_gguf(g: &Gguf, label: &str) -> Result<Json> {
    let err = |kind, key: &str, msg: String| VocabError::new(kind, label, msg).with_field(key);
    let model = g.get("tokenizer.ggml.model").and_then(Value::as_str);
    if model != Some("gpt2") {
        return Err(err(
            VocabErrorKind::Unsupported,
            "tokenizer.ggml.model",
            format!(
                "encoding is supported for gpt2 (byte-level BPE) vocabularies only, not {}",
                model.map_or("a missing model".to_string(), |m| format!("`{m}`"))
            ),
        ));
    }
    let pre = g
        .get("tokenizer.ggml.pre")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    let pre_tokenizer = match pre {
        "smollm" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            byte_level.clone()
        ]}),
        "gpt2" | "gpt-2" | "default" => byte_level.clone(),
        other => {
            return Err(err(
                VocabErrorKind::Unsupported,
                "tokenizer.ggml.pre",
                format!("pre-tokenizer `{other}` is not supported for encoding (smollm, gpt2 and default are)"),
            ))
        }
    };
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
    let types = g
        .get("tokenizer.ggml.token_type")
        .and_then(Value::as_array)
        .and_then(|a| a.to_i64s())
        .unwrap_or_else(|| vec![1; tokens.len()]);
    let merges = match g.get("tokenizer.ggml.merges") {
        None => Vec::new(),
        Some(v) => v
            .as_array()
            .and_then(|a| a.as_strings())
            .ok_or_else(|| {
                err(
                    VocabErrorKind::Parse,
                    "tokenizer.ggml.merges",
                    "not an array of strings".into(),
                )
            })?
            .to_vec(),
    };
    let mut merge_pairs = Vec::with_capacity(merges.len());
    for (i, m) in merges.iter().enumerate() {
        let (a, b) = m.split_once(' ').ok_or_else(|| {
            err(
                VocabErrorKind::Invalid,
                &format!("tokenizer.ggml.merges[{i}]"),
                format!("merge {m:?} is not two tokens separated by a space"),
            )
        })?;
        merge_pairs.push(json!([a, b]));
    }
    let mut vocab = Map::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        vocab.insert(t.clone(), json!(i));
        let ty = types.get(i).copied().unwrap_or(1);
        if ty == 3 || ty == 4 {
            added.push(json!({
                "id": i, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": ty == 3
            }));
        }
    }
    let add_bos = g
        .get("tokenizer.ggml.add_bos_token")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let bos = g
        .get("tokenizer.ggml.bos_token_id")
        .and_then(Value::as_int)
        .and_then(|b| usize::try_from(b).ok())
        .and_then(|b| tokens.get(b).map(|t| (b, t)));
    let post_processor = match (add_bos, bos) {
        (true, Some((id, name))) => json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": name, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": name, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {name.as_str(): {"id": name, "ids": [id], "tokens": [name]}}
        }),
        _ => Json::Null,
    };
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": merge_pairs
        }
    }))
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
                Value::String("qwen2".into()),
            ),
        ];
        let g = Gguf::from_bytes(&write_metadata(3, false, &md), "t.gguf").unwrap();
        let e = Encoder::from_gguf(&g, "t.gguf").unwrap_err();
        assert_eq!(e.field(), Some("tokenizer.ggml.pre"));
    }
}
