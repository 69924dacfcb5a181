//! Hugging Face `tokenizer.json` → [`Vocabulary`].
//!
//! Only the parts that define token bytes are read: `model.vocab` (BPE, WordLevel and WordPiece
//! maps, or Unigram's list), `model.unk_token` / `model.unk_id`, `added_tokens`, `decoder` and
//! `post_processor` (for the BOS id). Merges, normalizer and pre-tokenizer are skipped without
//! being built, and token strings are borrowed from the input where JSON allows, which keeps a
//! 262k-token file well under a second (see the `load` bench).
//!
//! Token bytes are what the `decoder` makes of each token alone; see the crate documentation
//! for the supported decoders and how sequence-level rules (`Strip` after `Fuse`, `Metaspace`'s
//! first-token rule) are kept apart from token bytes.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use crate::error::{Result, VocabError, VocabErrorKind};
use crate::{
    bytelevel, finish, ByteEncoding, Draft, LoadOptions, SequenceStrip, SourceFormat, TokenKind,
    Vocabulary, BEGIN_MARKERS,
};

/// A string borrowed from the JSON input when it has no escapes.
struct CowStr<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for CowStr<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = CowStr<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(
                self,
                v: &'de str,
            ) -> std::result::Result<Self::Value, E> {
                Ok(CowStr(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Self::Value, E> {
                Ok(CowStr(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> std::result::Result<Self::Value, E> {
                Ok(CowStr(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V(std::marker::PhantomData))
    }
}

/// `model.vocab`: a `{piece: id}` map, or Unigram's `[[piece, score], …]` list (id = index).
struct VocabList<'a> {
    entries: Vec<(Cow<'a, str>, u32)>,
    is_list: bool,
}

impl<'de: 'a, 'a> Deserialize<'de> for VocabList<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = VocabList<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map from token to id, or a list of [token, score]")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut entries = Vec::with_capacity(m.size_hint().unwrap_or(0));
                while let Some((k, v)) = m.next_entry::<CowStr<'a>, u32>()? {
                    entries.push((k.0, v));
                }
                Ok(VocabList {
                    entries,
                    is_list: false,
                })
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut s: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut entries = Vec::with_capacity(s.size_hint().unwrap_or(0));
                while let Some((k, _score)) = s.next_element::<(CowStr<'a>, f64)>()? {
                    let id = u32::try_from(entries.len())
                        .map_err(|_| de::Error::custom("more than 2^32 tokens"))?;
                    entries.push((k.0, id));
                }
                Ok(VocabList {
                    entries,
                    is_list: true,
                })
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

#[derive(Deserialize)]
struct AddedToken<'a> {
    id: u32,
    #[serde(borrow)]
    content: Cow<'a, str>,
    #[serde(default)]
    special: bool,
}

#[derive(Deserialize)]
struct Model<'a> {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(borrow)]
    vocab: VocabList<'a>,
    #[serde(default)]
    unk_token: Option<String>,
    #[serde(default)]
    unk_id: Option<u32>,
}

#[derive(Deserialize)]
struct TokenizerFile<'a> {
    #[serde(borrow, default)]
    added_tokens: Vec<AddedToken<'a>>,
    #[serde(default)]
    decoder: Option<Value>,
    #[serde(default)]
    post_processor: Option<Value>,
    #[serde(borrow)]
    model: Model<'a>,
}

/// One per-token decoding step.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    ByteLevel,
    Replace {
        from: String,
        to: String,
    },
    ByteFallback,
    Strip {
        content: char,
        start: usize,
        stop: usize,
    },
    Metaspace {
        replacement: char,
    },
}

/// The decoder, split into per-token steps and a sequence-level rule.
#[derive(Debug, Clone, PartialEq, Default)]
struct DecoderPlan {
    steps: Vec<Step>,
    sequence_strip: Option<SequenceStrip>,
}

impl DecoderPlan {
    fn byte_encoding(&self) -> ByteEncoding {
        if self.steps.contains(&Step::ByteLevel) {
            ByteEncoding::ByteLevel
        } else if self.steps.iter().any(|s| {
            matches!(s, Step::ByteFallback | Step::Metaspace { .. })
                || matches!(s, Step::Replace { from, .. } if from == "\u{2581}")
        }) {
            ByteEncoding::SentencePiece
        } else {
            ByteEncoding::Plain
        }
    }

    /// Appends the bytes of token `piece` to `out`; returns whether it is a byte-fallback token.
    fn apply(&self, piece: &str, out: &mut Vec<u8>) -> bool {
        let mut text: Cow<'_, str> = Cow::Borrowed(piece);
        for step in &self.steps {
            match step {
                Step::Replace { from, to } => {
                    if text.contains(from.as_str()) {
                        text = Cow::Owned(text.replace(from.as_str(), to));
                    }
                }
                Step::Metaspace { replacement } => {
                    if text.contains(*replacement) {
                        text = Cow::Owned(text.replace(*replacement, " "));
                    }
                }
                Step::Strip {
                    content,
                    start,
                    stop,
                } => {
                    text = Cow::Owned(strip_chars(&text, *content, *start, *stop));
                }
                Step::ByteFallback => {
                    // The Hugging Face rule, verbatim: six bytes, `<0x`, `>`, hex in between.
                    if text.len() == 6 && text.starts_with("<0x") && text.ends_with('>') {
                        if let Ok(b) = u8::from_str_radix(&text[3..5], 16) {
                            out.push(b);
                            return true;
                        }
                    }
                }
                Step::ByteLevel => {
                    bytelevel::decode_into(&text, out);
                    return false;
                }
            }
        }
        out.extend_from_slice(text.as_bytes());
        false
    }
}

fn strip_chars(s: &str, content: char, start: usize, stop: usize) -> String {
    let chars: Vec<char> = s.chars().collect();
    let mut a = 0;
    while a < start.min(chars.len()) && chars[a] == content {
        a += 1;
    }
    let mut b = chars.len();
    let mut removed = 0;
    while removed < stop && b > a && chars[b - 1] == content {
        b -= 1;
        removed += 1;
    }
    chars[a..b].iter().collect()
}

fn unsupported(src: &str, field: &str, msg: impl Into<String>) -> VocabError {
    VocabError::new(VocabErrorKind::Unsupported, src, msg).with_field(field)
}

fn parse_err(src: &str, field: &str, msg: impl Into<String>) -> VocabError {
    VocabError::new(VocabErrorKind::Parse, src, msg).with_field(field)
}

fn one_char(s: &str) -> Option<char> {
    let mut it = s.chars();
    match (it.next(), it.next()) {
        (Some(c), None) => Some(c),
        _ => None,
    }
}

/// Flattens nested `Sequence` decoders into `(field path, decoder)` pairs.
fn flatten<'v>(v: &'v Value, path: String, out: &mut Vec<(String, &'v Value)>) {
    if v.get("type").and_then(Value::as_str) == Some("Sequence") {
        if let Some(list) = v.get("decoders").and_then(Value::as_array) {
            for (i, d) in list.iter().enumerate() {
                flatten(d, format!("{path}.decoders[{i}]"), out);
            }
            return;
        }
    }
    out.push((path, v));
}

/// Turns the `decoder` field into a plan, or says which part is not supported.
fn plan_decoder(decoder: Option<&Value>, src: &str) -> Result<DecoderPlan> {
    let Some(dec) = decoder.filter(|v| !v.is_null()) else {
        return Err(unsupported(
            src,
            "decoder",
            "no decoder: tokens would be joined with spaces, which has no per-token bytes",
        ));
    };
    let mut list = Vec::new();
    flatten(dec, "decoder".to_string(), &mut list);
    let mut plan = DecoderPlan::default();
    // After ByteLevel or Fuse the decoder works on one fused string; after ByteFallback on
    // groups of byte tokens. Per-token steps are only exact before either.
    let mut fused = false;
    let mut grouped = false;
    for (path, d) in list {
        let ty = d
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| parse_err(src, &format!("{path}.type"), "missing decoder type"))?;
        match ty {
            "ByteLevel" => {
                if fused || grouped {
                    return Err(unsupported(src, &path, "ByteLevel after Fuse or ByteFallback"));
                }
                plan.steps.push(Step::ByteLevel);
                fused = true;
            }
            "Fuse" => fused = true,
            "ByteFallback" => {
                if fused {
                    return Err(unsupported(src, &path, "ByteFallback after Fuse"));
                }
                plan.steps.push(Step::ByteFallback);
                grouped = true;
            }
            "Replace" => {
                let from = d
                    .get("pattern")
                    .and_then(|p| p.get("String"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        unsupported(src, &format!("{path}.pattern"), "only string patterns are supported")
                    })?;
                let to = d
                    .get("content")
                    .and_then(Value::as_str)
                    .ok_or_else(|| parse_err(src, &format!("{path}.content"), "missing string"))?;
                if fused || grouped {
                    return Err(unsupported(src, &path, "Replace after Fuse, ByteLevel or ByteFallback"));
                }
                plan.steps.push(Step::Replace {
                    from: from.to_string(),
                    to: to.to_string(),
                });
            }
            "Strip" => {
                let content = d
                    .get("content")
                    .and_then(Value::as_str)
                    .and_then(one_char)
                    .ok_or_else(|| parse_err(src, &format!("{path}.content"), "expected one character"))?;
                let num = |k: &str| -> Result<usize> {
                    d.get(k)
                        .and_then(Value::as_u64)
                        .map(|x| x as usize)
                        .ok_or_else(|| parse_err(src, &format!("{path}.{k}"), "expected a count"))
                };
                let (start, stop) = (num("start")?, num("stop")?);
                if fused {
                    if plan.sequence_strip.is_some() {
                        return Err(unsupported(src, &path, "more than one sequence-level rule"));
                    }
                    plan.sequence_strip = Some(SequenceStrip::Strip {
                        content,
                        start,
                        stop,
                    });
                } else if grouped {
                    return Err(unsupported(src, &path, "Strip between ByteFallback and Fuse"));
                } else {
                    plan.steps.push(Step::Strip {
                        content,
                        start,
                        stop,
                    });
                }
            }
            "Metaspace" => {
                if fused || grouped {
                    return Err(unsupported(src, &path, "Metaspace after Fuse, ByteLevel or ByteFallback"));
                }
                let replacement = d
                    .get("replacement")
                    .and_then(Value::as_str)
                    .and_then(one_char)
                    .unwrap_or('\u{2581}');
                let prepends = match d.get("prepend_scheme").and_then(Value::as_str) {
                    Some("never") => false,
                    Some(_) => true,
                    None => d
                        .get("add_prefix_space")
                        .and_then(Value::as_bool)
                        .unwrap_or(true),
                };
                plan.steps.push(Step::Metaspace { replacement });
                if prepends {
                    if plan.sequence_strip.is_some() {
                        return Err(unsupported(src, &path, "more than one sequence-level rule"));
                    }
                    plan.sequence_strip = Some(SequenceStrip::MetaspaceFirstToken);
                }
            }
            other => {
                return Err(unsupported(
                    src,
                    &format!("{path}.type"),
                    format!("decoder `{other}` is not supported (supported: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence)"),
                ))
            }
        }
    }
    Ok(plan)
}

/// The BOS token text from the post-processor, when it adds one.
fn bos_from_post_processor(pp: Option<&Value>) -> Option<String> {
    let pp = pp?;
    match pp.get("type").and_then(Value::as_str)? {
        "Sequence" => pp
            .get("processors")?
            .as_array()?
            .iter()
            .find_map(|p| bos_from_post_processor(Some(p))),
        "TemplateProcessing" => {
            let first = pp.get("single")?.as_array()?.first()?;
            let st = first.get("SpecialToken")?;
            let name = st.get("id")?.as_str()?;
            Some(name.to_string())
        }
        "BertProcessing" | "RobertaProcessing" => {
            Some(pp.get("cls")?.as_array()?.first()?.as_str()?.to_string())
        }
        _ => None,
    }
}

/// Parses a `tokenizer.json` held in `data`; `src` names it in errors.
pub fn from_slice(data: &[u8], src: &str, opts: &LoadOptions) -> Result<Vocabulary> {
    if data.starts_with(&crate::gguf::MAGIC) {
        return Err(VocabError::new(
            VocabErrorKind::Parse,
            src,
            "not a tokenizer.json: this is a GGUF file (load it as GGUF)",
        ));
    }
    let file: TokenizerFile<'_> = serde_json::from_slice(data).map_err(|e| {
        VocabError::new(
            VocabErrorKind::Parse,
            src,
            format!("not a tokenizer.json: {e}"),
        )
    })?;
    let model_kind = file
        .model
        .kind
        .as_deref()
        .unwrap_or(if file.model.vocab.is_list {
            "Unigram"
        } else {
            "BPE"
        });
    match model_kind {
        "BPE" | "WordLevel" | "WordPiece" | "Unigram" => {}
        other => {
            return Err(unsupported(
                src,
                "model.type",
                format!("model type `{other}` is not supported"),
            ))
        }
    }
    let plan = plan_decoder(file.decoder.as_ref(), src)?;

    let invalid = |field: &str, msg: String| {
        VocabError::new(VocabErrorKind::Invalid, src, msg).with_field(field)
    };

    // Which piece each id has; added tokens take precedence (as in Hugging Face decoding).
    let total = file.model.vocab.entries.len() + file.added_tokens.len();
    let mut max_id: Option<u32> = None;
    for &(_, id) in &file.model.vocab.entries {
        max_id = max_id.max(Some(id));
    }
    for a in &file.added_tokens {
        max_id = max_id.max(Some(a.id));
    }
    let Some(max_id) = max_id else {
        return Err(invalid("model.vocab", "the vocabulary is empty".into()));
    };
    let n = max_id as usize + 1;
    if n > total {
        // Some id below `max_id` has no token: find the first one without a dense table.
        let mut ids: Vec<u32> = file.model.vocab.entries.iter().map(|e| e.1).collect();
        ids.extend(file.added_tokens.iter().map(|a| a.id));
        ids.sort_unstable();
        ids.dedup();
        let missing = ids
            .iter()
            .enumerate()
            .find(|(i, &id)| *i as u32 != id)
            .map(|(i, _)| i)
            .unwrap_or(ids.len());
        return Err(invalid(
            "model.vocab",
            format!("token id {missing} has no token (ids go up to {max_id})"),
        ));
    }
    const NONE: u32 = u32::MAX;
    let mut model_of = vec![NONE; n];
    for (i, &(_, id)) in file.model.vocab.entries.iter().enumerate() {
        let slot = &mut model_of[id as usize];
        if *slot != NONE {
            return Err(invalid(
                "model.vocab",
                format!("token id {id} appears twice"),
            ));
        }
        *slot = i as u32;
    }
    let mut added_of = vec![NONE; n];
    for (i, a) in file.added_tokens.iter().enumerate() {
        let slot = &mut added_of[a.id as usize];
        if *slot != NONE {
            return Err(invalid(
                &format!("added_tokens[{i}].id"),
                format!("token id {} appears twice", a.id),
            ));
        }
        *slot = i as u32;
    }

    let unk_id = match (&file.model.unk_id, &file.model.unk_token) {
        (Some(id), _) => Some(*id),
        (None, Some(t)) => file
            .model
            .vocab
            .entries
            .iter()
            .find(|(p, _)| p == t)
            .map(|&(_, id)| id),
        _ => None,
    };

    let mut buf = Vec::with_capacity(data.len() / 4);
    let mut spans = Vec::with_capacity(n);
    let mut names = Vec::with_capacity(n);
    let mut kinds = Vec::with_capacity(n);
    for id in 0..n {
        let (piece, kind): (&str, TokenKind) = if added_of[id] != NONE {
            let a = &file.added_tokens[added_of[id] as usize];
            let k = if a.special {
                TokenKind::Control
            } else {
                TokenKind::UserDefined
            };
            (&a.content, k)
        } else if model_of[id] != NONE {
            (
                &file.model.vocab.entries[model_of[id] as usize].0,
                TokenKind::Normal,
            )
        } else {
            return Err(invalid(
                "model.vocab",
                format!("token id {id} has no token"),
            ));
        };
        let start = buf.len() as u32;
        let is_byte = plan.apply(piece, &mut buf);
        spans.push((start, buf.len() as u32));
        let kind = match kind {
            TokenKind::Normal if Some(id as u32) == unk_id => TokenKind::Unknown,
            TokenKind::Normal if is_byte => TokenKind::Byte,
            k => k,
        };
        kinds.push(kind);
        names.push(piece.to_owned());
    }

    let special_named = |name: &str| -> Option<u32> {
        file.added_tokens
            .iter()
            .find(|a| a.special && a.content == name)
            .map(|a| a.id)
    };
    let bos = bos_from_post_processor(file.post_processor.as_ref())
        .and_then(|name| {
            special_named(&name).or_else(|| {
                file.model
                    .vocab
                    .entries
                    .iter()
                    .find(|(p, _)| p == &name)
                    .map(|&(_, id)| id)
            })
        })
        .or_else(|| BEGIN_MARKERS.iter().find_map(|m| special_named(m)));

    finish(
        Draft {
            source: src.to_string(),
            buf,
            spans,
            names,
            kinds,
            bos,
            declared_eos: Vec::new(),
            byte_encoding: plan.byte_encoding(),
            sequence_strip: plan.sequence_strip,
            format: SourceFormat::TokenizerJson,
        },
        opts,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(json: &str) -> Result<Vocabulary> {
        from_slice(json.as_bytes(), "t.json", &LoadOptions::default())
    }

    const BYTE_LEVEL: &str = r#"{
      "added_tokens": [
        {"id": 5, "content": "<|end_of_text|>", "special": true},
        {"id": 6, "content": "<|begin_of_text|>", "special": true},
        {"id": 7, "content": "<think>", "special": false}
      ],
      "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
      "model": {"type": "BPE", "vocab": {"Ġhello": 0, "Ċ": 1, "Ã": 2, "©": 3, "a\"b": 4}, "merges": ["Ġ h"]}
    }"#;

    #[test]
    fn byte_level_tokens_and_markers() {
        let v = load(BYTE_LEVEL).unwrap();
        assert_eq!(v.len(), 8);
        assert_eq!(v.token(0).unwrap(), b" hello");
        assert_eq!(v.token(1).unwrap(), b"\n");
        assert_eq!(v.token(2).unwrap(), &[0xC3]);
        assert_eq!(v.token(3).unwrap(), &[0xA9]);
        assert_eq!(v.decode(&[2, 3]).unwrap(), "é".as_bytes());
        assert_eq!(v.token(4).unwrap(), b"a\"b");
        assert_eq!(v.token(5).unwrap(), b"<|end_of_text|>");
        assert_eq!(v.info.eos_token_ids, vec![5]);
        assert_eq!(v.info.special_token_ids, vec![5, 6]);
        assert_eq!(v.bos, Some(6));
        assert_eq!(v.kind(7), Some(TokenKind::UserDefined));
        assert_eq!(v.byte_encoding, ByteEncoding::ByteLevel);
        assert_eq!(v.sequence_strip, None);
        assert_eq!(v.partial_utf8_ids(), vec![2, 3]);
        assert_eq!(v.names[0], "Ġhello");
    }

    #[test]
    fn caller_eos_and_padding() {
        let opts = LoadOptions {
            eos_token_ids: Some(vec![7]),
            vocab_size: Some(10),
        };
        let v = from_slice(BYTE_LEVEL.as_bytes(), "t.json", &opts).unwrap();
        assert_eq!(v.len(), 10);
        assert_eq!(v.info.eos_token_ids, vec![7]);
        assert_eq!(v.info.special_token_ids, vec![5, 6, 8, 9]);
        assert_eq!(v.token(9).unwrap(), b"");
        assert_eq!(v.kind(8), Some(TokenKind::Padding));

        let bad = LoadOptions {
            eos_token_ids: Some(vec![10]),
            vocab_size: Some(10),
        };
        let e = from_slice(BYTE_LEVEL.as_bytes(), "t.json", &bad).unwrap_err();
        assert_eq!(e.field(), Some("eos_token_ids"));
        assert!(e.to_string().contains("= 10 is out of range"), "{e}");
        let small = LoadOptions {
            vocab_size: Some(3),
            ..Default::default()
        };
        let e = from_slice(BYTE_LEVEL.as_bytes(), "t.json", &small).unwrap_err();
        assert_eq!(e.field(), Some("vocab_size"));
    }

    const SPM: &str = r#"{
      "added_tokens": [
        {"id": 0, "content": "<unk>", "special": true},
        {"id": 1, "content": "<s>", "special": true},
        {"id": 2, "content": "</s>", "special": true}
      ],
      "post_processor": {"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [], "special_tokens": {}},
      "decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
      "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": true,
        "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x0A>": 3, "<0xE4>": 4, "▁▁": 5, "▁Hello": 6, "<0x4G>": 7},
        "merges": []}
    }"#;

    #[test]
    fn sentencepiece_with_strip() {
        let v = load(SPM).unwrap();
        assert_eq!(v.token(3).unwrap(), b"\n");
        assert_eq!(v.kind(3), Some(TokenKind::Byte));
        assert_eq!(v.token(4).unwrap(), &[0xE4]);
        assert_eq!(v.token(5).unwrap(), b"  ");
        assert_eq!(v.token(6).unwrap(), b" Hello");
        assert_eq!(v.token(7).unwrap(), b"<0x4G>");
        assert_eq!(v.kind(7), Some(TokenKind::Normal));
        assert_eq!(v.bos, Some(1));
        assert_eq!(v.info.eos_token_ids, vec![2]);
        assert_eq!(v.info.special_token_ids, vec![0, 1, 2]);
        assert_eq!(v.byte_encoding, ByteEncoding::SentencePiece);
        assert_eq!(v.decode(&[6, 6]).unwrap(), b" Hello Hello");
        assert_eq!(v.decode_text(&[6, 6]).unwrap(), b"Hello Hello");
        assert_eq!(v.decode_text(&[5, 6]).unwrap(), b"  Hello");
        assert_eq!(
            v.sequence_strip,
            Some(SequenceStrip::Strip {
                content: ' ',
                start: 1,
                stop: 0
            })
        );
    }

    #[test]
    fn unigram_metaspace() {
        let json = r#"{"added_tokens": [], "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
          "model": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0], ["▁a", -1.5], ["b", -2.0]]}}"#;
        let v = load(json).unwrap();
        assert_eq!(v.len(), 3);
        assert_eq!(v.kind(0), Some(TokenKind::Unknown));
        assert_eq!(v.info.special_token_ids, vec![0]);
        assert_eq!(v.token(1).unwrap(), b" a");
        assert_eq!(v.sequence_strip, Some(SequenceStrip::MetaspaceFirstToken));
        assert_eq!(v.decode_text(&[1, 1, 2]).unwrap(), b"a ab");
    }

    #[test]
    fn per_token_strip_before_fuse() {
        let json = r#"{"decoder": {"type": "Sequence", "decoders": [{"type": "Strip", "content": "x", "start": 2, "stop": 1}]},
          "model": {"vocab": {"xxxaxx": 0, "x": 1}}}"#;
        let v = load(json).unwrap();
        assert_eq!(v.token(0).unwrap(), b"xax");
        assert_eq!(v.token(1).unwrap(), b"");
        assert_eq!(v.sequence_strip, None);
    }

    #[test]
    fn errors_name_the_field() {
        let e = load(r#"{"model": {"vocab": {"a": 0}}}"#).unwrap_err();
        assert_eq!(e.field(), Some("decoder"));
        assert_eq!(e.kind(), VocabErrorKind::Unsupported);

        let e = load(r#"{"decoder": {"type": "WordPiece"}, "model": {"vocab": {"a": 0}}}"#)
            .unwrap_err();
        assert_eq!(e.field(), Some("decoder.type"));

        let e = load(r#"{"decoder": {"type": "Sequence", "decoders": [{"type": "Fuse"}, {"type": "Replace", "pattern": {"String": "a"}, "content": "b"}]}, "model": {"vocab": {"a": 0}}}"#)
            .unwrap_err();
        assert_eq!(e.field(), Some("decoder.decoders[1]"));

        let e = load(r#"{"decoder": {"type": "ByteLevel"}, "model": {"vocab": {"a": 0, "b": 2}}}"#)
            .unwrap_err();
        assert_eq!(e.field(), Some("model.vocab"));
        assert!(e.to_string().contains("token id 1 has no token"), "{e}");

        let e = load(r#"{"decoder": {"type": "ByteLevel"}, "model": {"vocab": {"a": 0, "b": 0}}}"#)
            .unwrap_err();
        assert!(e.to_string().contains("token id 0 appears twice"), "{e}");

        let e = load(
            r#"{"decoder": {"type": "ByteLevel"}, "model": {"vocab": {"a": 0, "b": 4000000000}}}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("token id 1 has no token"), "{e}");

        let e = load("{not json").unwrap_err();
        assert_eq!(e.kind(), VocabErrorKind::Parse);
        assert!(
            e.to_string().starts_with("`t.json`: not a tokenizer.json"),
            "{e}"
        );
    }
}
