//! Real tokenizers and a real model file, checked token by token against the `tokenizers`
//! crate (the Hugging Face implementation).
//!
//! The files are fetched by `scripts/fetch-testdata.sh` into `.testdata/` (or the directory in
//! `NEXTOK_TESTDATA`). When a file is absent the test prints a skip notice and passes — unless
//! the environment variable `CI` is set, where it fails.
//!
//! Method, for every token id of every tokenizer:
//!
//! * bytes that are valid UTF-8: `decode([id])` must equal the bytes (when the decoder has no
//!   sequence-level strip), and always `decode([anchor, id])` minus `decode([anchor])` must equal
//!   them, with `anchor` the plain token `a` — this is the comparison that survives decoders
//!   such as Llama-2's `Strip`, which eats the leading space of a sequence;
//! * bytes that are not valid UTF-8 (part of a character): the token is completed into valid
//!   UTF-8 with single-byte tokens before and after it (`[C3] + [A9]`, `[E4] + [B8 80]`…), and
//!   the decode of that id sequence must equal the concatenated bytes;
//! * bytes that can never be part of UTF-8 (`C0`, `C1`, `F5`–`FF`): the decode must equal what
//!   the decoder makes of invalid bytes (one U+FFFD per maximal invalid run for `ByteLevel`,
//!   one per byte for `ByteFallback`), so nothing else can hide there.

use std::path::PathBuf;
use std::time::Instant;

use nextok_vocab::encode::{tokenizer_json_from_gguf, Encoder};
use nextok_vocab::gguf::Gguf;
use nextok_vocab::{ByteEncoding, LoadOptions, TokenKind, Vocabulary};
use tokenizers::Tokenizer;

/// The test-data file `rel`, or `None` (after a notice) when it is absent outside CI.
fn testdata(rel: &str) -> Option<PathBuf> {
    nextok_testdata::require(rel)
}

#[derive(Debug, Default)]
struct Stats {
    tokens: usize,
    special: usize,
    valid_utf8: usize,
    partial_utf8: usize,
    never_utf8: usize,
    failures: Vec<String>,
}

/// What the Hugging Face decoders make of bytes that are not valid UTF-8 on their own.
fn lossy(v: &Vocabulary, b: &[u8]) -> String {
    match v.byte_encoding {
        // ByteFallback: one U+FFFD per byte of an invalid group.
        ByteEncoding::SentencePiece => "\u{FFFD}".repeat(b.len()),
        _ => String::from_utf8_lossy(b).into_owned(),
    }
}

/// Whether `b` is valid UTF-8 or a valid UTF-8 text cut short.
fn utf8_prefix_ok(b: &[u8]) -> bool {
    match std::str::from_utf8(b) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none(),
    }
}

/// Bytes, each with a single-byte token (`avail`), to put before and after `b` so that the
/// whole is valid UTF-8, if there are any.
fn completion(b: &[u8], avail: impl Fn(u8) -> bool) -> Option<(Vec<u8>, Vec<u8>)> {
    // Leading continuation bytes need a lead byte for a character of exactly that many more.
    let k = b.iter().take_while(|&&x| (0x80..0xC0).contains(&x)).count();
    let prefix = if k == 0 {
        vec![]
    } else {
        let want = k + 1;
        let lead = (0xC2..=0xF4u8).find(|&l| {
            let len = match l {
                0xC2..=0xDF => 2,
                0xE0..=0xEF => 3,
                _ => 4,
            };
            len == want && avail(l) && utf8_prefix_ok(&[&[l][..], &b[..k]].concat())
        })?;
        vec![lead]
    };
    let mut whole = [prefix.as_slice(), b].concat();
    if !utf8_prefix_ok(&whole) {
        return None; // invalid in the middle: no completion
    }
    let mut suffix = Vec::new();
    while std::str::from_utf8(&whole).is_err() {
        let c = (0x80..0xC0u8).find(|&c| {
            avail(c) && {
                let mut w = whole.clone();
                w.push(c);
                utf8_prefix_ok(&w)
            }
        })?;
        whole.push(c);
        suffix.push(c);
    }
    Some((prefix, suffix))
}

/// Checks every token of `v` against `tok` (see the file documentation).
fn check_all_tokens(v: &Vocabulary, tok: &Tokenizer) -> Stats {
    let mut st = Stats::default();
    let dec = |ids: &[u32]| tok.decode(ids, false).expect("decode");
    // Single-byte tokens, byte-fallback tokens first.
    let mut byte_id: [Option<u32>; 256] = [None; 256];
    for (id, b) in v.bytes.iter() {
        if b.len() == 1 {
            let slot = &mut byte_id[b[0] as usize];
            if slot.is_none() || v.kind(id) == Some(TokenKind::Byte) {
                *slot = Some(id);
            }
        }
    }
    let anchor = v
        .bytes
        .iter()
        .find(|&(id, b)| b == b"a" && v.kind(id) == Some(TokenKind::Normal))
        .map(|(id, _)| id)
        .expect("a plain token `a`");
    let anchor_text = dec(&[anchor]);
    let fail = |st: &mut Stats, msg: String| {
        if st.failures.len() < 20 {
            st.failures.push(msg);
        }
    };
    for (id, b) in v.bytes.iter() {
        st.tokens += 1;
        if v.info.is_special(id) {
            st.special += 1;
        }
        match std::str::from_utf8(b) {
            Ok(s) => {
                st.valid_utf8 += 1;
                if v.sequence_strip.is_none() && dec(&[id]) != s {
                    fail(
                        &mut st,
                        format!("id {id}: decode {:?} != {s:?}", dec(&[id])),
                    );
                }
                let both = dec(&[anchor, id]);
                if both.strip_prefix(anchor_text.as_str()) != Some(s) {
                    fail(
                        &mut st,
                        format!("id {id}: anchored decode {both:?} != {anchor_text:?} + {s:?}"),
                    );
                }
            }
            Err(_) => match completion(b, |x| byte_id[x as usize].is_some()) {
                Some((pre, suf)) => {
                    st.partial_utf8 += 1;
                    let mut ids = Vec::new();
                    for x in &pre {
                        ids.push(byte_id[*x as usize].expect("single-byte token"));
                    }
                    ids.push(id);
                    for x in &suf {
                        ids.push(byte_id[*x as usize].expect("single-byte token"));
                    }
                    let ours = v.decode(&ids).unwrap();
                    let want = [pre.as_slice(), b, suf.as_slice()].concat();
                    assert_eq!(ours, want, "single-byte tokens around id {id}");
                    let text = String::from_utf8(ours).unwrap();
                    if dec(&ids) != text {
                        fail(
                            &mut st,
                            format!("id {id}: decode {ids:?} = {:?} != {text:?}", dec(&ids)),
                        );
                    }
                }
                None => {
                    st.never_utf8 += 1;
                    if dec(&[id]) != lossy(v, b) {
                        fail(
                            &mut st,
                            format!(
                                "id {id}: lossy decode {:?} != {:?}",
                                dec(&[id]),
                                lossy(v, b)
                            ),
                        );
                    }
                }
            },
        }
        // Names are the tokenizer's own token strings; control tokens are their text.
        if tok.id_to_token(id).as_deref() != v.name(id) {
            fail(
                &mut st,
                format!(
                    "id {id}: name {:?} != {:?}",
                    v.name(id),
                    tok.id_to_token(id)
                ),
            );
        }
        if v.kind(id) == Some(TokenKind::Control) && v.name(id).unwrap().as_bytes() != b {
            fail(
                &mut st,
                format!("id {id}: control token bytes differ from its text"),
            );
        }
    }
    st
}

const TEXTS: &[&str] = &[
    "Hello world",
    "The quick brown fox jumps over the lazy dog.\n\n  Indented\tand tabbed",
    "Ünïcödé: naïve café, Ελληνικά, русский",
    "中文分词测试：你好，世界！日本語のテキスト。한국어",
    "Emoji 🦀🚀👩‍👩‍👧 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math",
    "Numbers 1234567890 3.14159 -42 1e-9",
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
    "   leading and trailing spaces   ",
];

/// Encodes [`TEXTS`] with the tokenizer and checks that the token bytes spell the text.
fn check_round_trips(v: &Vocabulary, enc: &Tokenizer) -> usize {
    let mut n = 0;
    for t in TEXTS {
        let ids = enc.encode(*t, false).unwrap().get_ids().to_vec();
        let bytes = v.decode_text(&ids).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            *t,
            "round trip of {t:?} through ids {ids:?}"
        );
        assert_eq!(enc.decode(&ids, false).unwrap(), *t);
        n += ids.len();
    }
    n
}

struct Expect {
    dir: &'static str,
    vocab_size: usize,
    eos: &'static [&'static str],
    bos: Option<&'static str>,
    encoding: ByteEncoding,
    strip: bool,
}

fn check_tokenizer_json(e: Expect) {
    let Some(path) = testdata(&format!("{}/tokenizer.json", e.dir)) else {
        return;
    };
    let t0 = Instant::now();
    let v = Vocabulary::from_tokenizer_json_file(&path, &LoadOptions::default()).unwrap();
    let load = t0.elapsed();
    let tok = Tokenizer::from_file(&path).unwrap();

    assert_eq!(v.len(), e.vocab_size);
    assert!(tok.id_to_token(v.len() as u32).is_none());
    assert_eq!(v.byte_encoding, e.encoding);
    assert_eq!(v.sequence_strip.is_some(), e.strip);
    let eos: Vec<&str> = v
        .info
        .eos_token_ids
        .iter()
        .map(|&i| v.name(i).unwrap())
        .collect();
    let mut want: Vec<&str> = e.eos.to_vec();
    want.sort_by_key(|n| tok.token_to_id(n));
    assert_eq!(eos, want, "EOS of {}", e.dir);
    assert_eq!(v.bos.map(|b| v.name(b).unwrap()), e.bos);
    // Special = added tokens flagged special (plus the unknown token).
    let hf_special = tok
        .get_added_tokens_decoder()
        .values()
        .filter(|a| a.special)
        .count();
    assert!(v.info.special_token_ids.len() >= hf_special);

    let st = check_all_tokens(&v, &tok);
    let tokens_in_round_trips = check_round_trips(&v, &tok);
    eprintln!(
        "{}: {} tokens checked ({} valid UTF-8, {} partial UTF-8 via completed sequences, {} never-UTF-8 bytes), {} special, EOS {:?}, BOS {:?}; {} texts / {} tokens round-tripped; load {:.1} ms (debug build)",
        e.dir,
        st.tokens,
        st.valid_utf8,
        st.partial_utf8,
        st.never_utf8,
        st.special,
        eos,
        e.bos,
        TEXTS.len(),
        tokens_in_round_trips,
        load.as_secs_f64() * 1e3
    );
    assert!(st.failures.is_empty(), "{}: {:#?}", e.dir, st.failures);
    assert_eq!(st.tokens, e.vocab_size);
}

#[test]
fn llama3_tokenizer_json() {
    check_tokenizer_json(Expect {
        dir: "llama3",
        vocab_size: 128_256,
        eos: &["<|end_of_text|>", "<|eot_id|>"],
        bos: Some("<|begin_of_text|>"),
        encoding: ByteEncoding::ByteLevel,
        strip: false,
    });
}

#[test]
fn qwen3_tokenizer_json() {
    check_tokenizer_json(Expect {
        dir: "qwen3",
        vocab_size: 151_669,
        eos: &["<|endoftext|>", "<|im_end|>"],
        bos: None,
        encoding: ByteEncoding::ByteLevel,
        strip: false,
    });
}

#[test]
fn gemma3_tokenizer_json() {
    check_tokenizer_json(Expect {
        dir: "gemma3",
        vocab_size: 262_145,
        eos: &["<eos>", "<end_of_turn>"],
        bos: Some("<bos>"),
        encoding: ByteEncoding::SentencePiece,
        strip: false,
    });
}

#[test]
fn llama2_tokenizer_json_with_strip_decoder() {
    check_tokenizer_json(Expect {
        dir: "llama2",
        vocab_size: 32_000,
        eos: &["</s>"],
        bos: Some("<s>"),
        encoding: ByteEncoding::SentencePiece,
        strip: true,
    });
}

const SMOLLM2: &str = "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

#[test]
fn smollm2_gguf_vocabulary() {
    let Some(path) = testdata(SMOLLM2) else {
        return;
    };
    let t0 = Instant::now();
    let g = Gguf::read_file(&path).unwrap();
    let read = t0.elapsed();
    assert_eq!(g.version, 3);
    assert!(!g.big_endian);
    assert_eq!(g.tensor_count, 272);
    assert_eq!(g.metadata.len(), 33);
    assert_eq!(
        g.get("general.architecture").unwrap().as_str(),
        Some("llama")
    );
    assert_eq!(g.get("llama.vocab_size").unwrap().as_int(), Some(49_152));
    assert_eq!(
        g.get("tokenizer.ggml.pre").unwrap().as_str(),
        Some("smollm")
    );

    let v = Vocabulary::from_gguf(&g, "smollm2", &LoadOptions::default()).unwrap();
    assert_eq!(v.len(), 49_152);
    assert_eq!(v.byte_encoding, ByteEncoding::ByteLevel);
    assert_eq!(v.sequence_strip, None);
    // eos_token_id is 2 (<|im_end|>); <|endoftext|> (0) is a control token named as an end.
    assert_eq!(v.info.eos_token_ids, vec![0, 2]);
    assert_eq!(v.name(2), Some("<|im_end|>"));
    assert_eq!(v.bos, Some(1));
    assert_eq!(v.info.special_token_ids, (0..17).collect::<Vec<u32>>());
    assert!(v.kinds[17..].iter().all(|&k| k == TokenKind::Normal));
    for id in 0..17 {
        assert_eq!(v.token(id).unwrap(), v.name(id).unwrap().as_bytes());
    }
    // The same vocabulary through the file-level entry points.
    let v2 = Vocabulary::load(&path, &LoadOptions::default()).unwrap();
    assert_eq!(v2, v);

    // Unlike Llama-3 and Qwen3, SmolLM2's byte-level alphabet lacks 21 bytes: 8 that are valid
    // in UTF-8 text (control characters and the lead bytes F1, F2) and the 13 never-UTF-8
    // bytes. Text containing them cannot be encoded without loss.
    let mut single = [false; 256];
    for (_, b) in v.bytes.iter() {
        if b.len() == 1 {
            single[b[0] as usize] = true;
        }
    }
    let missing: Vec<u8> = (0..=255u8).filter(|&b| !single[b as usize]).collect();
    assert_eq!(
        missing,
        [
            0x04, 0x06, 0x13, 0x14, 0x16, 0x1d, 0xc0, 0xc1, 0xf1, 0xf2, 0xf5, 0xf6, 0xf7, 0xf8,
            0xf9, 0xfa, 0xfb, 0xfc, 0xfd, 0xfe, 0xff
        ]
    );
    // The merges agree with the bytes: bytes(a b) is bytes(a) followed by bytes(b).
    let merges = g
        .get("tokenizer.ggml.merges")
        .unwrap()
        .as_array()
        .unwrap()
        .as_strings()
        .unwrap();
    assert_eq!(merges.len(), 48_900);
    let index: std::collections::HashMap<&str, u32> = v
        .names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i as u32))
        .collect();
    for m in merges {
        let (a, b) = m.split_once(' ').unwrap();
        let ab = format!("{a}{b}");
        let (ia, ib, iab) = (index[a], index[b], index[ab.as_str()]);
        let joined = [v.token(ia).unwrap(), v.token(ib).unwrap()].concat();
        assert_eq!(v.token(iab).unwrap(), joined.as_slice(), "merge {m:?}");
    }

    // The tokenizer rebuilt from the same metadata (tokens, merges, smollm pre-tokenizer):
    // every token against the Hugging Face ByteLevel decoder, and texts round-trip.
    let enc = Encoder::from_gguf(&g, "smollm2").unwrap();
    let st = check_all_tokens(&v, enc.tokenizer().unwrap());
    assert!(st.failures.is_empty(), "{:#?}", st.failures);
    let n_rt = check_round_trips(&v, enc.tokenizer().unwrap());

    let hello = enc.encode("Hello world", false).unwrap();
    assert_eq!(v.decode(&hello).unwrap(), b"Hello world");
    assert_eq!(hello.len(), 2);
    assert_eq!(v.name(hello[1]), Some("Ġworld"));
    // Digits one by one; no prefix space; control tokens recognised in text.
    let digits = enc.encode("2024", false).unwrap();
    assert_eq!(digits.len(), 4);
    assert_eq!(v.decode(&digits).unwrap(), b"2024");
    let chat = enc.encode("<|im_start|>user\nHi<|im_end|>", false).unwrap();
    assert_eq!(chat.first(), Some(&1));
    assert_eq!(chat.last(), Some(&2));
    assert_eq!(v.decode(&chat).unwrap(), b"<|im_start|>user\nHi<|im_end|>");

    // The tokenizer.json equivalent of the metadata, loaded by the tokenizer.json path, gives
    // the same bytes, specials and EOS.
    let json = serde_json::to_vec(&tokenizer_json_from_gguf(&g, "smollm2").unwrap()).unwrap();
    let vj =
        Vocabulary::from_tokenizer_json(&json, "smollm2.json", &LoadOptions::default()).unwrap();
    assert_eq!(vj.bytes_digest(), v.bytes_digest());
    assert_eq!(vj.info, v.info);
    // ... and the same ids as the encoder built from the metadata without the JSON
    let enc_json = Encoder::from_tokenizer_json(&json, "smollm2.json").unwrap();
    for text in TEXTS
        .iter()
        .copied()
        .chain(["<|im_start|>user\nHi<|im_end|>", "2024 Hello world"])
    {
        for special in [false, true] {
            assert_eq!(
                enc.encode(text, special).unwrap(),
                enc_json.encode(text, special).unwrap(),
                "{text:?} (add_special_tokens {special})"
            );
        }
    }

    eprintln!(
        "smollm2 GGUF: metadata read in {:.1} ms (debug build); {} tokens checked ({} valid UTF-8, {} partial UTF-8, {} never-UTF-8 bytes), {} special, EOS {:?}; {} merges consistent; {} texts / {} tokens round-tripped",
        read.as_secs_f64() * 1e3,
        st.tokens,
        st.valid_utf8,
        st.partial_utf8,
        st.never_utf8,
        st.special,
        v.info.eos_token_ids,
        merges.len(),
        TEXTS.len(),
        n_rt
    );
}

#[test]
fn eos_override_and_model_size_padding_on_a_real_file() {
    let Some(path) = testdata("qwen3/tokenizer.json") else {
        return;
    };
    // Qwen3 models have 151,936 logits for 151,669 tokenizer ids.
    let opts = LoadOptions {
        eos_token_ids: Some(vec![151_645]),
        vocab_size: Some(151_936),
    };
    let v = Vocabulary::from_tokenizer_json_file(&path, &opts).unwrap();
    assert_eq!(v.len(), 151_936);
    assert_eq!(v.info.eos_token_ids, vec![151_645]);
    assert_eq!(v.kind(151_700), Some(TokenKind::Padding));
    assert!(v.info.is_special(151_935));
    assert_eq!(v.token(151_935), Some(&b""[..]));
}
