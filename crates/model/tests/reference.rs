//! Cross-implementation check against llama.cpp's outputs for SmolLM2-135M-Instruct Q4_1
//! (`testdata/reference/`): the tokenizer's ids for six texts, the top-5 set of raw logits after
//! three prompts, and the first 16 greedy tokens of each prompt.
//!
//! The model comes from `scripts/fetch-testdata.sh`. Without it these tests print a notice and
//! pass — unless `CI` is set, where they fail.

use std::path::PathBuf;
use std::sync::OnceLock;

use nextok_model::{LogitsSource, Model, Requant};
use serde_json::Value;

fn root() -> PathBuf {
    nextok_testdata::repo_root()
}

fn reference() -> Value {
    let p = root().join("testdata/reference/smollm2-135m-q4_1.llamacpp.json");
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn model_path() -> Option<PathBuf> {
    nextok_testdata::require(nextok_testdata::SMOLLM2)
}

fn model(requant: Requant) -> Option<&'static Model> {
    static KEEP: OnceLock<Option<Model>> = OnceLock::new();
    static Q8: OnceLock<Option<Model>> = OnceLock::new();
    let cell = match requant {
        Requant::Keep => &KEEP,
        Requant::Q8_0 => &Q8,
    };
    cell.get_or_init(|| model_path().map(|p| Model::load(&p, requant).unwrap()))
        .as_ref()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &z) in row.iter().enumerate() {
        if z > row[best] {
            best = i;
        }
    }
    best as u32
}

fn top5(row: &[f32]) -> Vec<u32> {
    let mut ix: Vec<u32> = (0..row.len() as u32).collect();
    ix.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
    let mut v = ix[..5].to_vec();
    v.sort_unstable();
    v
}

#[test]
fn tokenizer_matches_reference_ids() {
    let Some(m) = model(Requant::Keep) else {
        return;
    };
    let r = reference();
    for (name, t) in r["tokenize"].as_object().unwrap() {
        let text = t["text"].as_str().unwrap();
        assert_eq!(
            m.encoder.encode(text, false).unwrap(),
            ids(&t["ids"]),
            "{name}"
        );
    }
    for (name, p) in r["prompts"].as_object().unwrap() {
        let text = p["text"].as_str().unwrap();
        assert_eq!(
            m.encode_prompt(text).unwrap(),
            ids(&p["ids"]),
            "prompt {name}"
        );
    }
}

/// What one prompt gives against the reference.
struct PromptCheck {
    name: String,
    /// Our top-5 set after the prompt equals the reference's.
    top5_equal: bool,
    /// The sets differ only at a near tie on the reference's fifth place: every token in one
    /// set and not the other has a reference logit within [`MAX_DELTA`] of the reference's
    /// fifth.
    top5_near_tie: bool,
    /// How many of our top-5 are in the reference's top-5.
    top5_overlap: usize,
    /// The reference's top-1 is one of our top-2.
    top1_in_top2: bool,
    /// Largest |Δ| of the reference's top-5 logits.
    max_delta: f32,
    /// Length of the common prefix of our 32 greedy tokens and the reference's.
    greedy_prefix: usize,
    /// Steps (of 32) where our argmax equals the reference's token when the reference's tokens
    /// are fed (teacher forcing).
    forced_agree: usize,
}

fn check_prompts(requant: Requant) -> Option<Vec<PromptCheck>> {
    let m = model(requant)?;
    let r = reference();
    let mut out = Vec::new();
    for (name, p) in r["prompts"].as_object().unwrap() {
        let prompt = ids(&p["ids"]);
        let want: Vec<u32> = p["top20"].as_array().unwrap()[..5]
            .iter()
            .map(|e| e[0].as_u64().unwrap() as u32)
            .collect();
        let mut want_sorted = want.clone();
        want_sorted.sort_unstable();
        let greedy = ids(&p["greedy32"]);

        let mut src = m.source();
        let row0 = src.prefill(&prompt).unwrap();
        let ours = top5(&row0);
        let mut ranked: Vec<u32> = (0..row0.len() as u32).collect();
        ranked.sort_by(|&a, &b| {
            row0[b as usize]
                .total_cmp(&row0[a as usize])
                .then(a.cmp(&b))
        });
        let max_delta = p["top20"].as_array().unwrap()[..5]
            .iter()
            .map(|e| (row0[e[0].as_u64().unwrap() as usize] - e[1].as_f64().unwrap() as f32).abs())
            .fold(0f32, f32::max);

        let mut forced = src.fork().unwrap();
        let mut got = Vec::new();
        let mut row = row0.clone();
        for _ in 0..32 {
            let t = argmax(&row);
            got.push(t);
            row = src.decode_one(t).unwrap();
        }
        let greedy_prefix = got.iter().zip(&greedy).take_while(|(a, b)| a == b).count();
        let mut forced_agree = 0;
        let mut row = row0;
        for &t in &greedy {
            forced_agree += usize::from(argmax(&row) == t);
            row = forced.decode_one(t).unwrap();
        }
        let top20: Vec<(u32, f32)> = p["top20"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e[0].as_u64().unwrap() as u32, e[1].as_f64().unwrap() as f32))
            .collect();
        let fifth = top20[4].1;
        let near = |t: &u32| {
            top20
                .iter()
                .any(|&(id, z)| id == *t && (z - fifth).abs() <= MAX_DELTA)
        };
        let top5_near_tie = ours
            .iter()
            .filter(|t| !want.contains(t))
            .chain(want.iter().filter(|t| !ours.contains(t)))
            .all(near);
        let c = PromptCheck {
            name: name.clone(),
            top5_equal: ours == want_sorted,
            top5_near_tie,
            top5_overlap: ours.iter().filter(|t| want.contains(t)).count(),
            top1_in_top2: ranked[..2].contains(&want[0]),
            max_delta,
            greedy_prefix,
            forced_agree,
        };
        eprintln!(
            "{} ({}): top-5 equal {} (overlap {}/5, max |Δlogit| {:.3}); greedy: first {} of 32 match; teacher-forced argmax agrees at {}/32 steps",
            c.name,
            requant.name(),
            c.top5_equal,
            c.top5_overlap,
            c.max_delta,
            c.greedy_prefix,
            c.forced_agree
        );
        out.push(c);
    }
    Some(out)
}

/// How far a logit may be from the reference's (the file's own quantisation).
const MAX_DELTA: f32 = 0.75;

/// The file's own quantisation: the top-5 sets equal (or different only at a near tie on the
/// fifth place: `story`'s fifth and sixth are 0.20 apart in the reference and swap places since
/// the numerics `q4_1=2`), logits within [`MAX_DELTA`], and the
/// first 16 greedy tokens match except for `story`, whose first step is a near tie in the
/// reference itself (504 at 26.669 vs 49 at 26.659): there the reference's tokens are fed and
/// our argmax must agree at 28 or more of the 32 steps (31 measured).
#[test]
fn logits_and_greedy_match_reference_q4_1() {
    let Some(res) = check_prompts(Requant::Keep) else {
        return;
    };
    let first16: usize = res.iter().map(|c| c.greedy_prefix.min(16)).sum();
    let full32: usize = res.iter().map(|c| c.greedy_prefix).sum();
    eprintln!(
        "q4_1: {first16}/48 of the first 16 greedy tokens, {full32}/96 of 32, match in full prefix"
    );
    for c in &res {
        assert!(
            c.top5_equal || c.top5_near_tie,
            "{}: top-5 set differs beyond a near tie",
            c.name
        );
        assert!(
            c.max_delta < MAX_DELTA,
            "{}: logits off by {}",
            c.name,
            c.max_delta
        );
        if c.name == "story" {
            assert!(
                c.forced_agree >= 28,
                "{}: teacher-forced agreement {}",
                c.name,
                c.forced_agree
            );
        } else {
            assert!(
                c.greedy_prefix >= 16,
                "{}: only {} greedy tokens match",
                c.name,
                c.greedy_prefix
            );
        }
    }
}

/// Re-quantised to Q8_0 the model is not the reference's any more: the reference's top-1 must
/// stay in our top-2 and four of the top-5 must agree.
#[test]
fn q8_0_requant_stays_close() {
    let Some(res) = check_prompts(Requant::Q8_0) else {
        return;
    };
    let first16: usize = res.iter().map(|c| c.greedy_prefix.min(16)).sum();
    eprintln!("q8_0: {first16}/48 of the first 16 greedy tokens match in full prefix");
    for c in &res {
        assert!(
            c.top1_in_top2,
            "{}: reference top-1 not in our top-2",
            c.name
        );
        assert!(
            c.top5_overlap >= 4,
            "{}: top-5 overlap {}",
            c.name,
            c.top5_overlap
        );
    }
}

#[test]
fn fork_and_truncate_reproduce_logits() {
    let Some(m) = model(Requant::Keep) else {
        return;
    };
    let r = reference();
    let prompt = ids(&r["prompts"]["capital"]["ids"]);
    let mut a = m.source();
    let row0 = a.prefill(&prompt).unwrap();
    let mut b = a.fork().unwrap();
    let ra = a.decode_one(504).unwrap();
    let rb1 = b.decode_one(7026).unwrap();
    assert_ne!(ra, rb1);
    // truncating b back to the prompt and feeding A's token gives A's row, bit for bit
    b.truncate(prompt.len()).unwrap();
    assert_eq!(b.len(), prompt.len());
    assert_eq!(b.decode_one(504).unwrap(), ra);
    // a fresh prefill of the prompt equals the first one
    let mut c = m.source();
    assert_eq!(c.prefill(&prompt).unwrap(), row0);
    assert!(a.truncate(prompt.len() + 5).is_err());
}

#[test]
#[ignore]
fn print_logit_deviation() {
    let Some(m) = model(Requant::Keep) else {
        return;
    };
    let r = reference();
    for (name, p) in r["prompts"].as_object().unwrap() {
        let mut src = m.source();
        let row = src.prefill(&ids(&p["ids"])).unwrap();
        let mut worst = 0f32;
        let mut line = String::new();
        for e in p["top20"].as_array().unwrap() {
            let id = e[0].as_u64().unwrap() as usize;
            let v = e[1].as_f64().unwrap() as f32;
            worst = worst.max((row[id] - v).abs());
            line.push_str(&format!(" {id}:{:+.3}", row[id] - v));
        }
        eprintln!("{name}: max |Δ| over top-20 {worst:.4};{line}");
    }
}
