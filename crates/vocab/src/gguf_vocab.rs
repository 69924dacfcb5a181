//! GGUF `tokenizer.ggml.*` metadata → [`Vocabulary`].
//!
//! Keys read: `tokenizer.ggml.model` (`gpt2` or `llama`), `tokenizer.ggml.tokens`,
//! `tokenizer.ggml.token_type` (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
//! 6 byte; all normal when absent), `tokenizer.ggml.bos_token_id`, `…eos_token_id`,
//! `…eot_token_id`, `…eom_token_id` and `tokenizer.ggml.add_space_prefix`.
//!
//! Bytes follow llama.cpp's detokenizer: normal tokens of a `gpt2` vocabulary undo the GPT-2
//! byte map; normal tokens of a `llama` (SentencePiece) vocabulary turn `▁` into a space; byte
//! tokens `<0xNN>` are one byte; control, user-defined, unknown and unused tokens are their
//! text. A `llama` vocabulary with `add_space_prefix` (the default) records the first-token
//! space strip as [`SequenceStrip::Strip`].

use crate::error::{Result, VocabError, VocabErrorKind};
use crate::gguf::{Gguf, Value};
use crate::{
    bytelevel, finish, ByteEncoding, Draft, LoadOptions, SequenceStrip, SourceFormat, TokenKind,
    Vocabulary, BEGIN_MARKERS,
};

/// Parses `<0xNN>` into its byte.
fn byte_token(s: &str) -> Option<u8> {
    let h = s.strip_prefix("<0x")?.strip_suffix('>')?;
    if h.len() != 2 {
        return None;
    }
    u8::from_str_radix(h, 16).ok()
}

pub(crate) fn from_gguf(g: &Gguf, src: &str, opts: &LoadOptions) -> Result<Vocabulary> {
    let err = |kind, key: &str, msg: String| VocabError::new(kind, src, msg).with_field(key);
    let missing = |key: &str| {
        err(
            VocabErrorKind::Invalid,
            key,
            "missing (the file has no tokenizer vocabulary)".into(),
        )
    };
    let wrong_type = |key: &str, want: &str, v: &Value| {
        err(
            VocabErrorKind::Parse,
            key,
            format!(
                "expected {want}, found {}",
                crate::gguf::type_name(v.type_id())
            ),
        )
    };

    const MODEL: &str = "tokenizer.ggml.model";
    const TOKENS: &str = "tokenizer.ggml.tokens";
    const TYPES: &str = "tokenizer.ggml.token_type";

    let mv = g.get(MODEL).ok_or_else(|| missing(MODEL))?;
    let model = mv
        .as_str()
        .ok_or_else(|| wrong_type(MODEL, "a string", mv))?;
    let encoding = match model {
        "gpt2" => ByteEncoding::ByteLevel,
        "llama" => ByteEncoding::SentencePiece,
        other => {
            return Err(err(
                VocabErrorKind::Unsupported,
                MODEL,
                format!("tokenizer model `{other}` is not supported (gpt2 and llama are)"),
            ))
        }
    };
    let tv = g.get(TOKENS).ok_or_else(|| missing(TOKENS))?;
    let tokens = tv
        .as_array()
        .and_then(|a| a.as_strings())
        .ok_or_else(|| wrong_type(TOKENS, "an array of strings", tv))?;
    let n = tokens.len();
    let types: Option<Vec<i64>> = match g.get(TYPES) {
        None => None,
        Some(v) => {
            let t = v
                .as_array()
                .and_then(|a| a.to_i64s())
                .ok_or_else(|| wrong_type(TYPES, "an array of integers", v))?;
            if t.len() != n {
                return Err(err(
                    VocabErrorKind::Invalid,
                    TYPES,
                    format!("has {} entries for {n} tokens", t.len()),
                ));
            }
            Some(t)
        }
    };
    let id_key = |key: &str| -> Result<Option<u32>> {
        match g.get(key) {
            None => Ok(None),
            Some(v) => {
                let x = v.as_int().ok_or_else(|| wrong_type(key, "an integer", v))?;
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
    let mut declared_eos = Vec::new();
    for key in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        declared_eos.extend(id_key(key)?);
    }
    let declared_bos = id_key("tokenizer.ggml.bos_token_id")?;

    let mut buf = Vec::with_capacity(n * 8);
    let mut spans = Vec::with_capacity(n);
    let mut kinds = Vec::with_capacity(n);
    for (i, tok) in tokens.iter().enumerate() {
        let kind = match &types {
            None => TokenKind::Normal,
            Some(t) => TokenKind::from_gguf(t[i]).ok_or_else(|| {
                err(
                    VocabErrorKind::Invalid,
                    &format!("{TYPES}[{i}]"),
                    format!("unknown token type {} (expected 1 to 6)", t[i]),
                )
            })?,
        };
        let start = buf.len() as u32;
        match kind {
            TokenKind::Byte => {
                let b = byte_token(tok).ok_or_else(|| {
                    err(
                        VocabErrorKind::Invalid,
                        &format!("{TOKENS}[{i}]"),
                        format!("byte token {tok:?} is not of the form <0xNN>"),
                    )
                })?;
                buf.push(b);
            }
            TokenKind::Normal => match encoding {
                ByteEncoding::ByteLevel => {
                    bytelevel::decode_into(tok, &mut buf);
                }
                _ => {
                    for c in tok.chars() {
                        if c == '\u{2581}' {
                            buf.push(b' ');
                        } else {
                            let mut u = [0u8; 4];
                            buf.extend_from_slice(c.encode_utf8(&mut u).as_bytes());
                        }
                    }
                }
            },
            _ => buf.extend_from_slice(tok.as_bytes()),
        }
        spans.push((start, buf.len() as u32));
        kinds.push(kind);
    }

    let bos = declared_bos.or_else(|| {
        BEGIN_MARKERS.iter().find_map(|m| {
            tokens
                .iter()
                .zip(&kinds)
                .position(|(t, k)| *k == TokenKind::Control && t == m)
                .map(|i| i as u32)
        })
    });
    let add_space_prefix = g
        .get("tokenizer.ggml.add_space_prefix")
        .and_then(Value::as_bool)
        .unwrap_or(encoding == ByteEncoding::SentencePiece);
    let sequence_strip = (encoding == ByteEncoding::SentencePiece && add_space_prefix).then_some(
        SequenceStrip::Strip {
            content: ' ',
            start: 1,
            stop: 0,
        },
    );

    finish(
        Draft {
            source: src.to_string(),
            buf,
            spans,
            names: tokens.to_vec(),
            kinds,
            bos,
            declared_eos,
            byte_encoding: encoding,
            sequence_strip,
            format: SourceFormat::Gguf,
        },
        opts,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{write_metadata, Array};

    fn md(model: &str, tokens: &[&str], types: &[i32], extra: Vec<(String, Value)>) -> Gguf {
        let mut m = vec![
            (
                "tokenizer.ggml.model".to_string(),
                Value::String(model.into()),
            ),
            (
                "tokenizer.ggml.tokens".to_string(),
                Value::Array(Array::String(
                    tokens.iter().map(|s| s.to_string()).collect(),
                )),
            ),
            (
                "tokenizer.ggml.token_type".to_string(),
                Value::Array(Array::I32(types.to_vec())),
            ),
        ];
        m.extend(extra);
        Gguf::from_bytes(&write_metadata(3, false, &m), "t.gguf").unwrap()
    }

    #[test]
    fn gpt2_vocabulary() {
        let g = md(
            "gpt2",
            &["<|endoftext|>", "<|im_end|>", "Ġhi", "Ã", "a b"],
            &[3, 3, 1, 1, 4],
            vec![("tokenizer.ggml.eos_token_id".into(), Value::U32(1))],
        );
        let v = Vocabulary::from_gguf(&g, "t.gguf", &LoadOptions::default()).unwrap();
        assert_eq!(v.token(2).unwrap(), b" hi");
        assert_eq!(v.token(3).unwrap(), &[0xC3]);
        assert_eq!(v.token(4).unwrap(), b"a b");
        assert_eq!(v.info.eos_token_ids, vec![0, 1]);
        assert_eq!(v.info.special_token_ids, vec![0, 1]);
        assert_eq!(v.sequence_strip, None);
        assert_eq!(v.format, SourceFormat::Gguf);
    }

    #[test]
    fn llama_vocabulary() {
        let g = md(
            "llama",
            &["<unk>", "<s>", "</s>", "<0x0A>", "▁Hello", "<0xE4>"],
            &[2, 3, 3, 6, 1, 6],
            vec![
                ("tokenizer.ggml.bos_token_id".into(), Value::U32(1)),
                ("tokenizer.ggml.eos_token_id".into(), Value::U32(2)),
            ],
        );
        let v = Vocabulary::from_gguf(&g, "t.gguf", &LoadOptions::default()).unwrap();
        assert_eq!(v.token(3).unwrap(), b"\n");
        assert_eq!(v.token(4).unwrap(), b" Hello");
        assert_eq!(v.token(5).unwrap(), &[0xE4]);
        assert_eq!(v.bos, Some(1));
        assert_eq!(v.info.eos_token_ids, vec![2]);
        assert_eq!(v.info.special_token_ids, vec![0, 1, 2]);
        assert!(matches!(
            v.sequence_strip,
            Some(SequenceStrip::Strip { .. })
        ));
    }

    #[test]
    fn errors_name_keys_and_ids() {
        let load = |g: &Gguf| Vocabulary::from_gguf(g, "t.gguf", &LoadOptions::default());
        let e = load(&md("bert", &["a"], &[1], vec![])).unwrap_err();
        assert_eq!(e.field(), Some("tokenizer.ggml.model"));
        let e = load(&md("llama", &["a", "<0xZZ>"], &[1, 6], vec![])).unwrap_err();
        assert_eq!(e.field(), Some("tokenizer.ggml.tokens[1]"));
        let e = load(&md("llama", &["a", "b"], &[1, 9], vec![])).unwrap_err();
        assert_eq!(e.field(), Some("tokenizer.ggml.token_type[1]"));
        let e = load(&md("llama", &["a", "b"], &[1], vec![])).unwrap_err();
        assert_eq!(e.field(), Some("tokenizer.ggml.token_type"));
        let e = load(&md(
            "gpt2",
            &["a"],
            &[1],
            vec![("tokenizer.ggml.eos_token_id".into(), Value::U32(5))],
        ))
        .unwrap_err();
        assert_eq!(e.field(), Some("tokenizer.ggml.eos_token_id"));
        assert!(e.to_string().contains("token id 5 is out of range"), "{e}");
        let g = Gguf::from_bytes(&write_metadata(3, false, &[]), "t.gguf").unwrap();
        let e = load(&g).unwrap_err();
        assert_eq!(e.field(), Some("tokenizer.ggml.model"));
    }
}
