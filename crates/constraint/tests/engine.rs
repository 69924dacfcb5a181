//! Behaviour of each constraint kind on a tiny hand-made vocabulary and on the real Llama-3
//! tokenizer (skipped with a notice when `.testdata/` is absent).

mod support;

use std::sync::Arc;

use nextok_constraint::{
    ConstraintEngine, ConstraintErrorKind, ConstraintSpec, ConstraintVocab, JsonOptions, LimitKind,
    Limits,
};
use nextok_core::constraint::{bitset_words, ConstraintState, ConstraintStatus};
use nextok_core::{TokenBytes, VocabInfo};
use serde_json::json;

/// Tokens: 0 EOS (special), 1 `{"`, 2 `ok`, 3 `":`, 4 `true`, 5 `false`, 6 `}`, 7 `{`, 8 `"`,
/// 9 `o`, 10 `k`, 11 `:`, 12 `t`, 13 `r`, 14 `u`, 15 `e`, 16 ` `, 17 `1`, 18 `2`, 19 `,`, 20 `[`,
/// 21 `]`, 22 `a`, 23 `b`, 24 `<pad>` special.
fn tiny() -> Arc<ConstraintEngine> {
    let toks: Vec<&[u8]> = vec![
        b"</s>", b"{\"", b"ok", b"\":", b"true", b"false", b"}", b"{", b"\"", b"o", b"k", b":",
        b"t", b"r", b"u", b"e", b" ", b"1", b"2", b",", b"[", b"]", b"a", b"b", b"<pad>",
    ];
    let bytes = TokenBytes::new(toks).unwrap();
    let info = VocabInfo {
        vocab_size: 25,
        eos_token_ids: vec![0],
        special_token_ids: vec![0, 24],
    };
    let v = ConstraintVocab::new(&bytes, &info).unwrap();
    Arc::new(ConstraintEngine::new(Arc::new(v)).unwrap())
}

fn allowed(s: &mut dyn ConstraintState, n: usize) -> Vec<u32> {
    let mut m = vec![0u64; bitset_words(n)];
    s.fill_mask(&mut m).unwrap();
    (0..n as u32)
        .filter(|&t| m[(t / 64) as usize] >> (t % 64) & 1 == 1)
        .collect()
}

fn choice_ok() -> ConstraintSpec {
    ConstraintSpec::Choice {
        choices: vec![r#"{"ok":true}"#.into(), r#"{"ok":false}"#.into()],
    }
}

#[test]
fn choice_masks_follow_the_trie() {
    let e = tiny();
    let c = e.compile(&choice_ok()).unwrap();
    assert_eq!(c.engine(), "nextok");
    let mut s = c.start();
    assert_eq!(allowed(&mut s, 25), vec![1, 7]);
    s.commit(1).unwrap();
    assert_eq!(allowed(&mut s, 25), vec![2, 9]);
    assert_eq!(s.forced_bytes(), b"ok\":".to_vec());
    s.commit(2).unwrap();
    s.commit(3).unwrap();
    assert_eq!(allowed(&mut s, 25), vec![4, 5, 12]);
    assert_eq!(s.status(), ConstraintStatus::Running);
    let mut f = s.fork();
    s.commit(4).unwrap();
    s.commit(6).unwrap();
    assert_eq!(s.status(), ConstraintStatus::OnlyEnd);
    assert_eq!(allowed(&mut s, 25), vec![0]);
    // Rejections leave the state unchanged.
    assert!(f.commit(6).is_err());
    assert!(f.commit(0).is_err());
    assert!(f.commit(24).is_err());
    f.commit(5).unwrap();
    f.commit(6).unwrap();
    f.commit(0).unwrap();
    assert_eq!(f.status(), ConstraintStatus::OnlyEnd);
    // Rollback.
    let d = s.digest();
    s.rollback(2).unwrap();
    assert_eq!(allowed(&mut s, 25), vec![4, 5, 12]);
    s.commit(12).unwrap();
    s.commit(13).unwrap();
    s.commit(14).unwrap();
    s.commit(15).unwrap();
    s.commit(6).unwrap();
    assert_eq!(s.digest(), d, "same bytes, same digest");
    assert!(s.rollback(99).is_err());
}

#[test]
fn choice_prefix_is_accepted_and_continues() {
    let e = tiny();
    let c = e
        .compile(&ConstraintSpec::Choice {
            choices: vec!["a".into(), "ab".into()],
        })
        .unwrap();
    let mut s = c.start();
    s.commit(22).unwrap();
    assert_eq!(s.status(), ConstraintStatus::Accepted);
    assert_eq!(allowed(&mut s, 25), vec![0, 23]);
    let err = e
        .compile(&ConstraintSpec::Choice { choices: vec![] })
        .unwrap_err();
    assert_eq!(err.kind(), ConstraintErrorKind::Invalid, "{err}");
    assert_eq!(err.field(), Some("choice"), "{err}");
}

#[test]
fn small_regex_runs_on_own_dfa_and_large_on_llguidance() {
    let e = tiny();
    let c = e
        .compile(&ConstraintSpec::Regex {
            pattern: "[12]+(,[12]+)*".into(),
        })
        .unwrap();
    assert_eq!(c.engine(), "nextok");
    let mut s = c.start();
    assert_eq!(allowed(&mut s, 25), vec![17, 18]);
    s.commit(17).unwrap();
    assert_eq!(s.status(), ConstraintStatus::Accepted);
    assert_eq!(allowed(&mut s, 25), vec![0, 17, 18, 19]);
    s.commit(19).unwrap();
    assert_eq!(s.status(), ConstraintStatus::Running);
    assert!(s.commit(0).is_err());

    let limits = Limits {
        max_dfa_states: 1,
        ..Limits::default()
    };
    let e2 = ConstraintEngine::new(e.vocab().clone())
        .unwrap()
        .with_limits(limits);
    let c2 = e2
        .compile(&ConstraintSpec::Regex {
            pattern: "[12]+(,[12]+)*".into(),
        })
        .unwrap();
    assert_eq!(c2.engine(), "llguidance");
    let mut s2 = c2.start();
    assert_eq!(allowed(&mut s2, 25), vec![17, 18]);
    s2.commit(17).unwrap();
    assert_eq!(allowed(&mut s2, 25), vec![0, 17, 18, 19]);
    assert_eq!(s2.status(), ConstraintStatus::Accepted);
}

#[test]
fn json_schema_whitespace_and_compact() {
    let e = tiny();
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}},
                        "required": ["ok"], "additionalProperties": false});
    let c = e
        .compile(&ConstraintSpec::JsonSchema {
            schema: schema.clone(),
            options: JsonOptions::default(),
        })
        .unwrap();
    let mut s = c.start();
    // {"ok": true}
    for t in [1, 2, 3, 16, 4, 6] {
        s.commit(t).unwrap();
    }
    assert!(matches!(
        s.status(),
        ConstraintStatus::Accepted | ConstraintStatus::OnlyEnd
    ));
    assert!(allowed(&mut s, 25).contains(&0));
    let compact = e
        .compile(&ConstraintSpec::JsonSchema {
            schema,
            options: JsonOptions {
                compact: true,
                ..Default::default()
            },
        })
        .unwrap();
    let mut s = compact.start();
    for t in [1, 2, 3] {
        s.commit(t).unwrap();
    }
    assert!(
        !allowed(&mut s, 25).contains(&16),
        "no space in compact mode"
    );
    assert!(s.commit(16).is_err());
    s.commit(4).unwrap();
}

#[test]
fn errors_are_typed_and_name_the_place() {
    let e = tiny();
    let err = e
        .compile(&ConstraintSpec::JsonSchema {
            schema: json!({"type": "object", "x-unknown-but-fine": 1,
                           "properties": {"a": {"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}}}),
            options: JsonOptions::default(),
        })
        .unwrap_err();
    assert_eq!(err.keyword(), Some("oneOf"), "{err}");
    assert_eq!(err.kind(), ConstraintErrorKind::Unsupported, "{err}");
    assert_eq!(err.pointer(), Some("/properties/a"), "{err}");
    // llguidance's refusal is kept underneath
    assert!(std::error::Error::source(&err).is_some(), "{err:?}");
    let err = e
        .compile(&ConstraintSpec::JsonSchema {
            schema: json!({"type": "string", "format": "no-such-format"}),
            options: JsonOptions::default(),
        })
        .unwrap_err();
    assert_eq!(err.code(), "unsupported", "{err}");
    assert!(err.to_string().contains("no-such-format"), "{err}");
    let err = e
        .compile(&ConstraintSpec::Grammar {
            lark: "start: foo\n".into(),
        })
        .unwrap_err();
    assert_eq!(err.code(), "syntax", "{err}");
    let err = e
        .compile(&ConstraintSpec::Gbnf {
            gbnf: "root ::= \"a\" (\n".into(),
        })
        .unwrap_err();
    assert!(err.to_string().contains("line 1"), "{err}");
    let tight = Limits {
        max_grammar_size: 3,
        ..Limits::default()
    };
    let e2 = ConstraintEngine::new(e.vocab().clone())
        .unwrap()
        .with_limits(tight);
    let err = e2
        .compile(&ConstraintSpec::Json {
            options: JsonOptions::default(),
        })
        .unwrap_err();
    assert_eq!(err.kind(), ConstraintErrorKind::Limit, "{err}");
    assert_eq!(err.limit(), Some(LimitKind::GrammarSize), "{err}");
    let e3 = ConstraintEngine::new(e.vocab().clone())
        .unwrap()
        .with_limits(Limits {
            max_states: 4,
            ..Limits::default()
        });
    let err = e3.compile(&choice_ok()).unwrap_err();
    assert_eq!(err.kind(), ConstraintErrorKind::Limit, "{err}");
    assert_eq!(err.limit(), Some(LimitKind::States), "{err}");
}

#[test]
fn gbnf_and_lark_grammars() {
    let e = tiny();
    let g = "root ::= \"[\" item (\",\" ws? item)* \"]\"\nitem ::= [12] | \"true\"\nws ::= \" \"\n";
    let c = e.compile(&ConstraintSpec::Gbnf { gbnf: g.into() }).unwrap();
    let mut s = c.start();
    for t in [20, 17, 19, 16, 4, 21] {
        s.commit(t).unwrap_or_else(|err| panic!("token {t}: {err}"));
    }
    assert_eq!(s.status(), ConstraintStatus::OnlyEnd);
    let c = e
        .compile(&ConstraintSpec::Grammar {
            lark: "start: \"a\"+ \"b\"\n".into(),
        })
        .unwrap();
    let mut s = c.start();
    s.commit(22).unwrap();
    s.commit(22).unwrap();
    assert!(s.commit(0).is_err());
    s.commit(23).unwrap();
    assert!(allowed(&mut s, 25).contains(&0));
}

#[test]
fn llguidance_state_forks_and_rolls_back() {
    let e = tiny();
    let c = e
        .compile(&ConstraintSpec::Json {
            options: JsonOptions::default(),
        })
        .unwrap();
    let mut s = c.start();
    s.commit(20).unwrap();
    s.commit(17).unwrap();
    let f = s.fork();
    let d = f.digest();
    s.commit(19).unwrap();
    s.commit(18).unwrap();
    s.commit(21).unwrap();
    assert!(matches!(
        s.status(),
        ConstraintStatus::Accepted | ConstraintStatus::OnlyEnd
    ));
    s.rollback(3).unwrap();
    assert_eq!(s.digest(), d);
    assert_eq!(s.status(), ConstraintStatus::Running);
}

#[test]
fn llama3_choice_test_vector() {
    let Some((engine, enc)) = support::llama3() else {
        return;
    };
    let c = engine.compile(&choice_ok()).unwrap();
    for text in [r#"{"ok":true}"#, r#"{"ok":false}"#] {
        let ids = enc.encode(text, false).unwrap();
        let mut s = c.start();
        assert_eq!(support::run(&mut s, &ids), Ok(()), "{text}");
        assert_eq!(s.status(), ConstraintStatus::OnlyEnd);
    }
    for text in [r#"{"ok": true}"#, r#"{"ok":tru}"#, r#"{"ok":true}}"#] {
        let ids = enc.encode(text, false).unwrap();
        assert!(support::run(&mut c.start(), &ids).is_err(), "{text}");
    }
    // Every token of `{"` is allowed first; the mask is the exact token set.
    let mut s = c.start();
    let n = engine.vocab().vocab_size();
    let a = allowed(&mut s, n);
    let first: Vec<u32> = (0..n as u32)
        .filter(|&t| {
            let b = engine.vocab().token_bytes(t).unwrap();
            !b.is_empty()
                && !engine.vocab().is_special(t)
                && (br#"{"ok":true}"#.starts_with(b) || br#"{"ok":false}"#.starts_with(b))
        })
        .collect();
    assert_eq!(a, first);
}

#[test]
fn llama3_json_dumps_style_accepted() {
    let Some((engine, enc)) = support::llama3() else {
        return;
    };
    let c = engine
        .compile(&ConstraintSpec::Json {
            options: JsonOptions::default(),
        })
        .unwrap();
    for text in [
        r#"{"a": 1, "b": [2, 3]}"#,
        r#"{"a":1,"b":[2,3]}"#,
        "{\n  \"a\": [\n    1\n  ]\n}",
    ] {
        let ids = enc.encode(text, false).unwrap();
        assert_eq!(support::run(&mut c.start(), &ids), Ok(()), "{text}");
    }
    let compact = engine
        .compile(&ConstraintSpec::Json {
            options: JsonOptions {
                compact: true,
                ..Default::default()
            },
        })
        .unwrap();
    let ids = enc.encode(r#"{"a": 1}"#, false).unwrap();
    assert!(support::run(&mut compact.start(), &ids).is_err());
}

/// nextok's own DFA and llguidance give the same mask at every step of a text, on the real
/// Llama-3 vocabulary (and so do `choice` and its equivalent regex).
#[test]
fn llama3_own_dfa_masks_equal_llguidance() {
    let Some((engine, enc)) = support::llama3() else {
        return;
    };
    let only_llg = ConstraintEngine::new(engine.vocab().clone())
        .unwrap()
        .with_limits(Limits {
            max_dfa_states: 0,
            ..Limits::default()
        });
    let n = engine.vocab().vocab_size();
    let cases = [
        (r"[0-9]{4}-[0-9]{2}-[0-9]{2}", "2024-11-30"),
        (r"(yes|no|maybe)", "maybe"),
        (r"[a-z]+@[a-z]+\.(com|org)", "ada@example.org"),
        (r"héllo wörld|\d+", "héllo wörld"),
        (r"[^\n]{1,12}", "any text hér"),
    ];
    for (pattern, text) in cases {
        let spec = ConstraintSpec::Regex {
            pattern: pattern.into(),
        };
        let own = engine.compile(&spec).unwrap();
        assert_eq!(own.engine(), "nextok", "{pattern}");
        let llg = only_llg.compile(&spec).unwrap();
        assert_eq!(llg.engine(), "llguidance", "{pattern}");
        let (mut a, mut b) = (own.start(), llg.start());
        for t in enc.encode(text, false).unwrap() {
            assert_eq!(
                allowed(&mut a, n),
                allowed(&mut b, n),
                "{pattern} before {t}"
            );
            assert_eq!(a.status(), b.status(), "{pattern}");
            a.commit(t).unwrap();
            b.commit(t).unwrap();
        }
        assert_eq!(allowed(&mut a, n), allowed(&mut b, n), "{pattern} at end");
        assert_eq!(a.status(), b.status(), "{pattern} at end");
    }
}

/// What the trait's default `probe` gives: a fork commits the tokens until one is refused.
fn probe_by_fork(s: &dyn ConstraintState, tokens: &[u32]) -> (usize, Vec<u8>) {
    let mut f = s.fork();
    let n = tokens.iter().take_while(|&&t| f.commit(t).is_ok()).count();
    (n, f.forced_bytes())
}

#[test]
fn probing_a_guess_leaves_the_state_and_agrees_with_a_fork() {
    let e = tiny();
    let schema = ConstraintSpec::JsonSchema {
        schema: json!({
            "type": "object",
            "properties": {"ok": {"type": "boolean"}},
            "required": ["ok"],
            "additionalProperties": false
        }),
        options: JsonOptions::default(),
    };
    for spec in [choice_ok(), schema] {
        let c = e.compile(&spec).unwrap();
        let mut s = c.start();
        s.commit(1).unwrap(); // `{"`
        let digest = s.digest();
        let mask = allowed(&mut s, 25);
        let guesses: [&[u32]; 6] = [
            &[],
            &[2, 3, 4, 6],    // `ok":true}`: all of it
            &[2, 3, 4, 6, 0], // and EOS after the end
            &[9, 10, 19],     // `o`, `k`, then `,` refused: `":` forced there
            &[22, 2],         // `a` refused at once: `ok":` forced
            &[2, 99, 3],      // an id past the vocabulary stops the guess
        ];
        for g in guesses {
            let mut forced = Vec::new();
            let n = s.probe(g, &mut forced).unwrap();
            assert_eq!((n, forced), probe_by_fork(&s, g), "{spec:?}: {g:?}");
            // the state, its digest and its mask are as before
            assert_eq!(s.digest(), digest);
            assert_eq!(allowed(&mut s, 25), mask);
        }
        let mut forced = Vec::new();
        assert_eq!(s.probe(&[9, 10, 19], &mut forced).unwrap(), 2);
        // the key's closing quote (the choice: and its colon; JSON allows a space first)
        assert!(
            !forced.is_empty() && b"\":".starts_with(&forced),
            "{spec:?}: {forced:?}"
        );
        // committing after probes goes on from the unprobed state
        s.commit(2).unwrap();
        s.commit(3).unwrap();
        assert!(allowed(&mut s, 25).contains(&4), "{spec:?}");
    }
}
