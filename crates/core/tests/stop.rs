//! Stop strings and streaming text: the data cases in `testdata/stop/` and the hold-back
//! property (random texts split at random token boundaries).

use std::path::PathBuf;
use std::sync::Arc;

use nextok_core::stop::StopStrings;
use nextok_core::text::TextStream;
use nextok_core::{
    FinishReason, PipelineConfig, Sampler, Selector, StopConfig, TokenBytes, VocabInfo,
};
use proptest::prelude::*;
use serde_json::Value;

struct Built {
    sampler: Sampler,
    ids: Vec<u32>,
}

/// A vocabulary made of the case's distinct tokens, a greedy pipeline, and the token ids in order.
fn build(tokens: &[(Vec<u8>, bool)], stop: StopConfig) -> nextok_core::Result<Built> {
    let mut table: Vec<(Vec<u8>, bool)> = Vec::new();
    let mut ids = Vec::new();
    for t in tokens {
        let id = match table.iter().position(|x| x == t) {
            Some(i) => i,
            None => {
                table.push(t.clone());
                table.len() - 1
            }
        };
        ids.push(id as u32);
    }
    let vocab = VocabInfo {
        vocab_size: table.len(),
        eos_token_ids: vec![],
        special_token_ids: table
            .iter()
            .enumerate()
            .filter(|(_, t)| t.1)
            .map(|(i, _)| i as u32)
            .collect(),
    };
    let bytes = TokenBytes::new(table.iter().map(|t| t.0.clone()))?;
    let cfg = PipelineConfig::new(vec![], Selector::Greedy);
    let sampler = Sampler::new_with_tokens(cfg, vocab, stop, Some(Arc::new(bytes)))?;
    Ok(Built { sampler, ids })
}

struct Outcome {
    reason: Option<FinishReason>,
    token_index: Option<usize>,
    end_in_token: Option<usize>,
    chunks: Vec<String>,
    text: String,
}

fn run(b: &Built) -> Outcome {
    let s = &b.sampler;
    let mut st = s.new_state(&[], 0).unwrap();
    let mut stream = s.text_stream();
    let mut chunks = Vec::new();
    for (i, &id) in b.ids.iter().enumerate() {
        let reason = s.commit(&mut st, id).unwrap();
        let hit = st.stop_state().hit.clone();
        chunks.push(stream.push(s.visible_bytes(id), hit.as_ref()));
        if let Some(r) = reason {
            if hit.is_none() {
                chunks.push(stream.finish());
            }
            return Outcome {
                reason: Some(r),
                token_index: Some(i),
                end_in_token: hit.map(|h| h.end_in_token),
                chunks,
                text: stream.text().to_string(),
            };
        }
    }
    chunks.push(stream.finish());
    Outcome {
        reason: None,
        token_index: None,
        end_in_token: None,
        chunks,
        text: stream.text().to_string(),
    }
}

fn token_of(v: &Value) -> (Vec<u8>, bool) {
    match v {
        Value::String(s) => (s.as_bytes().to_vec(), false),
        Value::Object(o) if o.contains_key("hex") => {
            let h = o["hex"].as_str().unwrap();
            (
                (0..h.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
                    .collect(),
                false,
            )
        }
        Value::Object(o) if o.contains_key("special") => {
            (o["special"].as_str().unwrap().as_bytes().to_vec(), true)
        }
        other => panic!("bad token {other}"),
    }
}

#[test]
fn stop_cases_from_data() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/stop/cases.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 15);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let tokens: Vec<(Vec<u8>, bool)> = case["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(token_of)
            .collect();
        let stop = StopConfig {
            stop: case["stop"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap().to_string())
                .collect(),
            include_stop_str_in_output: case["include_stop_str_in_output"]
                .as_bool()
                .unwrap_or(false),
            ..Default::default()
        };
        let exp = &case["expect"];
        let built = build(&tokens, stop.clone());
        if let Some(err) = exp.get("error") {
            let e = built
                .err()
                .unwrap_or_else(|| panic!("{name}: expected an error"));
            assert_eq!(e.code(), err["code"].as_str().unwrap(), "{name}");
            assert_eq!(e.field(), err["field"].as_str(), "{name}");
            continue;
        }
        let out = run(&built.unwrap());
        match exp["reason"].as_str().unwrap() {
            "stop_string" => {
                let Some(FinishReason::StopString { pattern, .. }) = out.reason else {
                    panic!("{name}: finished with {:?}", out.reason)
                };
                if let Some(p) = exp.get("pattern") {
                    assert_eq!(pattern as u64, p.as_u64().unwrap(), "{name}: pattern");
                }
            }
            "none" => assert_eq!(out.reason, None, "{name}"),
            other => panic!("unknown reason {other}"),
        }
        if let Some(i) = exp.get("token_index") {
            assert_eq!(
                out.token_index,
                Some(i.as_u64().unwrap() as usize),
                "{name}: token index"
            );
        }
        if let Some(o) = exp.get("end_in_token") {
            assert_eq!(
                out.end_in_token,
                Some(o.as_u64().unwrap() as usize),
                "{name}: byte offset"
            );
        }
        assert_eq!(out.text, exp["text"].as_str().unwrap(), "{name}: text");
        assert_eq!(
            out.chunks.concat(),
            out.text,
            "{name}: chunks concatenate to the text"
        );
        if let Some(ch) = exp.get("chunks") {
            let want: Vec<&str> = ch
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_str().unwrap())
                .collect();
            assert_eq!(&out.chunks[..want.len()], &want[..], "{name}: chunks");
        }
        for c in &out.chunks {
            for s in &stop.stop {
                if !stop.include_stop_str_in_output {
                    assert!(
                        !c.contains(s.as_str()),
                        "{name}: chunk {c:?} contains stop {s:?}"
                    );
                }
            }
        }
    }
}

/// Reference: earliest-ending match (longest at equal end) over the whole byte string.
fn reference_cut(text: &[u8], stops: &[Vec<u8>], include: bool) -> Option<usize> {
    for end in 1..=text.len() {
        let mut best: Option<usize> = None;
        for p in stops {
            if p.len() <= end && &text[end - p.len()..end] == p.as_slice() {
                best = Some(best.map_or(p.len(), |b: usize| b.max(p.len())));
            }
        }
        if let Some(len) = best {
            return Some(if include { end } else { end - len });
        }
    }
    None
}

fn alphabet_text() -> impl Strategy<Value = Vec<u8>> {
    // a small alphabet makes stop strings and near-misses frequent; include multi-byte chars
    prop::collection::vec(
        prop::sample::select(vec!["a", "b", "c", "é", "€", " ", "<", "/", ">"]),
        0..40,
    )
    .prop_map(|v| v.concat().into_bytes())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random texts split at random byte boundaries into tokens: the streamed chunks always
    /// concatenate to the final text, the final text is the reference cut, and no chunk — nor
    /// anything streamed before the end — contains a stop string.
    #[test]
    fn hold_back_never_streams_a_stop_string(
        text in alphabet_text(),
        cuts in prop::collection::vec(0usize..64, 0..20),
        stops in prop::collection::vec(prop::sample::select(vec!["ab", "bc", "</s>", "é", "c é", "€€", "a"]), 1..3),
        include in any::<bool>(),
    ) {
        let mut cuts: Vec<usize> = cuts.into_iter().filter(|&c| c < text.len()).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let mut tokens = Vec::new();
        let mut last = 0;
        for c in cuts.into_iter().chain(std::iter::once(text.len())) {
            if c > last {
                tokens.push((text[last..c].to_vec(), false));
                last = c;
            }
        }
        let stop_strings: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let stop = StopConfig { stop: stop_strings.clone(), include_stop_str_in_output: include, ..Default::default() };
        if tokens.is_empty() {
            return Ok(());
        }
        let built = build(&tokens, stop).unwrap();
        let out = run(&built);
        let patterns: Vec<Vec<u8>> = stop_strings.iter().map(|s| s.as_bytes().to_vec()).collect();
        let want = match reference_cut(&text, &patterns, include) {
            Some(end) => String::from_utf8_lossy(&text[..end]).into_owned(),
            None => String::from_utf8_lossy(&text).into_owned(),
        };
        prop_assert_eq!(&out.text, &want);
        prop_assert_eq!(out.chunks.concat(), out.text.clone());
        if !include {
            let mut streamed = String::new();
            for c in &out.chunks {
                streamed.push_str(c);
                for s in &stop_strings {
                    prop_assert!(!streamed.contains(s.as_str()), "streamed {:?} contains {:?}", streamed, s);
                }
            }
        }
    }
}

#[test]
fn holdback_unit() {
    let s = StopStrings::new(&["abc".to_string()]).unwrap();
    let mut t = TextStream::new(Some(Arc::new(s)), false);
    assert_eq!(t.push(b"xxab", None), "xx");
    assert_eq!(t.held_back(), 2);
}
