//! Property tests of the decoding core (000 §3.7, §3.8, §3.10, §3.12).
//!
//! Inputs are random logits (with `-inf` entries, exact ties and magnitudes up to ±1e4; vocabulary
//! sizes 1..300 and a few around 5000), random pipelines built from [`SamplingParams`] for every
//! [`Preset`], and random custom orders of [`ProcessorConfig`] values. Every property is checked
//! against an independent, naive re-computation where one is possible (hard masks, top-k, top-p,
//! categorical inverse CDF, Gumbel race), not against the library itself.

use std::collections::{BTreeMap, BTreeSet};

use nextok_core::math::{self, exp_f32, ln_f64};
use nextok_core::processors::{
    allowed_ids::AllowedTokenIds, banned_sequences::BannedSequences, logit_bias::LogitBias,
    min_p::MinP, min_tokens::MinTokens, no_repeat_ngram::NoRepeatNgram,
    presence_frequency::PresenceFrequencyPenalty, repetition::RepetitionPenalty,
    special_mask::SpecialTokenMask, temperature::Temperature, top_k, top_k::TopK, top_p,
    top_p::TopP, typical_p::TypicalP, PenaltyScope, ProcessorConfig as P,
};
use nextok_core::record::CandidateRecord;
use nextok_core::rng::Purpose;
use nextok_core::{
    DecoderState, Draw, ErrorKind, PipelineConfig, Preset, Sampler, SamplingParams, Selector,
    StepRecord, StepResult, StopConfig, VocabInfo, WorkspacePool,
};
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::test_runner::Config;

const NEG_INF: f32 = f32::NEG_INFINITY;

/// Tolerance of "selection probabilities sum to 1": each `p_i = w_i / S` is one rounded division
/// and the sum adds at most ~5000 terms in `f64`, so the error is below `n · 2^-52 ≈ 1.1e-12`;
/// 1e-9 leaves three orders of magnitude of headroom while still catching any real
/// normalisation error (a wrong `S`, a missing or duplicated candidate).
const SUM_TOL: f64 = 1e-9;

/// The largest `u` below 1 (`1 − 2^-53`): exercises the categorical rounding guard.
const U_MAX: f64 = 1.0 - f64::EPSILON / 2.0;

fn cfg(cases: u32) -> Config {
    Config {
        cases,
        // no regression files next to the sources (other people own the tree); a failure prints
        // the minimal input instead
        failure_persistence: None,
        ..Config::default()
    }
}

// ------------------------------------------------------------------------------------------
// strategies
// ------------------------------------------------------------------------------------------

fn logit() -> impl Strategy<Value = f32> {
    prop_oneof![
        4 => -20.0f32..20.0,
        // a small value set makes exact ties common
        3 => prop::sample::select(vec![-1e4f32, -3.0, -1.0, 0.0, 0.5, 1.0, 2.0, 1e4]),
        1 => -1e4f32..1e4,
        1 => Just(NEG_INF),
    ]
}

/// Temperatures: the greedy branch, ordinary values, and tiny ones for which `z / T` overflows
/// `f32` (a finite logit must stay finite: the support and its probabilities stay well defined).
fn temperature_value() -> impl Strategy<Value = f32> {
    prop_oneof![2 => Just(0.0f32), 8 => 0.05f32..3.0, 1 => tiny_temperature()]
}

/// `10^-e` for `e ∈ [30, 38)`: ±1e4 / T overflows `f32`.
fn tiny_temperature() -> impl Strategy<Value = f32> {
    (30.0f32..38.0).prop_map(|e| 10f32.powf(-e))
}

fn vocab_len() -> impl Strategy<Value = usize> {
    prop_oneof![24 => 1usize..300, 1 => 4900usize..5100]
}

/// One request at one step: vocabulary, raw logits and history.
#[derive(Debug, Clone)]
struct Ctx {
    vocab: VocabInfo,
    logits: Vec<f32>,
    prompt: Vec<u32>,
    history: Vec<u32>,
    seed: u64,
}

impl Ctx {
    fn v(&self) -> usize {
        self.vocab.vocab_size
    }
}

fn ctx_for(v: usize) -> impl Strategy<Value = Ctx> {
    let id = 0..v as u32;
    (
        vec(logit(), v),
        vec(id.clone(), 0..3),
        vec(id.clone(), 0..4),
        vec(id.clone(), 0..8),
        vec(id, 0..6),
        any::<u64>(),
    )
        .prop_map(move |(logits, eos, special, prompt, history, seed)| Ctx {
            vocab: VocabInfo {
                vocab_size: v,
                eos_token_ids: eos,
                special_token_ids: special,
            },
            logits,
            prompt,
            history,
            seed,
        })
}

fn params_for(v: usize) -> impl Strategy<Value = SamplingParams> {
    let id = 0..v as u32;
    let a = (
        prop::option::of(temperature_value()),
        prop::option::of(-3i64..(v as i64 + 5)),
        prop::option::of(prop_oneof![4 => 0.01f64..1.0, 1 => Just(1.0)]),
        prop::option::of(prop_oneof![1 => Just(0.0f64), 3 => 0.0f64..0.6]),
        prop::option::of(prop_oneof![3 => 0.05f64..1.0, 1 => Just(1.0)]),
        prop::option::of(-2.0f32..=2.0),
        prop::option::of(-2.0f32..=2.0),
        prop::option::of(0.3f32..3.0),
    );
    let b = (
        btree_map(id.clone(), -100.0f32..=100.0, 0..4),
        prop::option::of(0u64..4),
        prop::option::of(1u64..40),
        vec(id.clone(), 0..2),
        prop::option::weighted(0.2, vec(id.clone(), 1..12)),
        vec(vec(id, 1..3), 0..3),
        prop::option::of(0usize..4),
        prop::option::of(0usize..10),
        any::<bool>(),
    );
    (a, b).prop_map(
        |(
            (temperature, top_k, top_p, min_p, typical_p, presence, frequency, repetition),
            (
                logit_bias,
                min_tokens,
                max_tokens,
                stop_token_ids,
                allowed_token_ids,
                bad_words_ids,
                no_repeat_ngram_size,
                penalty_last_n,
                ignore_eos,
            ),
        )| SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            typical_p,
            presence_penalty: presence,
            frequency_penalty: frequency,
            repetition_penalty: repetition,
            logit_bias,
            min_tokens,
            max_tokens,
            stop_token_ids,
            seed: None,
            allowed_token_ids,
            bad_words_ids,
            no_repeat_ngram_size,
            penalty_last_n,
            ignore_eos,
            ..Default::default()
        },
    )
}

fn preset() -> impl Strategy<Value = Preset> {
    prop::sample::select(Preset::ALL.to_vec())
}

fn preset_case() -> impl Strategy<Value = (Ctx, SamplingParams, Preset)> {
    vocab_len().prop_flat_map(|v| (ctx_for(v), params_for(v), preset()))
}

fn scope() -> impl Strategy<Value = PenaltyScope> {
    prop_oneof![
        Just(PenaltyScope::PromptAndOutput),
        Just(PenaltyScope::Output),
        (1usize..8).prop_map(|n| PenaltyScope::LastN { n }),
    ]
}

fn ties() -> impl Strategy<Value = top_k::Ties> {
    prop_oneof![Just(top_k::Ties::ById), Just(top_k::Ties::KeepAll)]
}

fn rule() -> impl Strategy<Value = top_p::Rule> {
    prop_oneof![
        Just(top_p::Rule::DescendingPrefix),
        Just(top_p::Rule::AscendingTail)
    ]
}

fn top_p_value() -> impl Strategy<Value = f64> {
    prop_oneof![6 => 0.01f64..1.0, 1 => Just(0.5), 1 => Just(1.0), 1 => 0.999f64..1.0]
}

/// Any processor config with valid parameters for a vocabulary of `v` tokens.
fn processor(v: usize, descending_top_p: bool) -> BoxedStrategy<P> {
    let id = 0..v as u32;
    let rule = if descending_top_p {
        rule().boxed()
    } else {
        Just(top_p::Rule::AscendingTail).boxed()
    };
    prop_oneof![
        vec(id.clone(), 0..3).prop_map(|token_ids| P::SpecialTokenMask(SpecialTokenMask {
            version: 1,
            token_ids
        })),
        (0u64..4).prop_map(|min_tokens| P::MinTokens(MinTokens {
            version: 1,
            min_tokens
        })),
        vec(id.clone(), 1..12).prop_map(|token_ids| P::AllowedTokenIds(AllowedTokenIds {
            version: 1,
            token_ids
        })),
        btree_map(id.clone(), -100.0f32..=100.0, 0..4).prop_map(|logit_bias| P::LogitBias(
            LogitBias {
                version: 1,
                logit_bias
            }
        )),
        (vec(vec(id, 1..3), 1..3), any::<bool>()).prop_map(|(sequences, include_prompt)| {
            P::BannedSequences(BannedSequences {
                version: 1,
                sequences,
                include_prompt,
            })
        }),
        (1usize..4).prop_map(|ngram_size| P::NoRepeatNgram(NoRepeatNgram {
            version: 1,
            ngram_size
        })),
        (-2.0f32..=2.0, -2.0f32..=2.0, scope(), any::<bool>()).prop_map(|(p, f, scope, ex)| {
            P::PresenceFrequencyPenalty(PresenceFrequencyPenalty {
                version: 1,
                presence_penalty: p,
                frequency_penalty: f,
                scope,
                exclude_special: ex,
            })
        }),
        (0.3f32..3.0, scope(), any::<bool>()).prop_map(|(r, scope, ex)| {
            P::RepetitionPenalty(RepetitionPenalty {
                version: 1,
                repetition_penalty: r,
                scope,
                exclude_special: ex,
            })
        }),
        temperature_value().prop_map(|temperature| {
            P::Temperature(Temperature {
                version: 1,
                temperature,
            })
        }),
        (1i64..(v as i64 + 3), ties()).prop_map(|(top_k, ties)| P::TopK(TopK {
            version: 1,
            top_k,
            ties
        })),
        (top_p_value(), 1usize..4, rule).prop_map(|(top_p, min_keep, rule)| P::TopP(TopP {
            version: 1,
            top_p,
            min_keep,
            rule
        })),
        (0.0001f64..=1.0, 1usize..4).prop_map(|(min_p, min_keep)| P::MinP(MinP {
            version: 1,
            min_p,
            min_keep
        })),
        (0.05f64..=1.0, 1usize..3, any::<bool>()).prop_map(|(typical_p, min_keep, keep_ties)| {
            P::TypicalP(TypicalP {
                version: 1,
                typical_p,
                min_keep,
                keep_ties,
            })
        }),
    ]
    .boxed()
}

fn selector() -> impl Strategy<Value = Selector> {
    prop_oneof![
        Just(Selector::Greedy),
        Just(Selector::Categorical),
        Just(Selector::Gumbel)
    ]
}

/// Keeps the first temperature only (two temperatures are a declared contradiction).
fn one_temperature(procs: Vec<P>) -> Vec<P> {
    let mut seen = false;
    procs
        .into_iter()
        .filter(|p| {
            if matches!(p, P::Temperature(_)) {
                if seen {
                    return false;
                }
                seen = true;
            }
            true
        })
        .collect()
}

fn custom_case(descending_top_p: bool) -> impl Strategy<Value = (Ctx, PipelineConfig, StopConfig)> {
    vocab_len().prop_flat_map(move |v| {
        (
            ctx_for(v),
            vec(processor(v, descending_top_p), 0..7),
            selector(),
            vec(0..v as u32, 0..2),
            any::<bool>(),
        )
            .prop_map(|(ctx, procs, sel, stop_ids, ignore_eos)| {
                let cfg = PipelineConfig::new(one_temperature(procs), sel);
                let stop = StopConfig {
                    stop_token_ids: stop_ids,
                    max_tokens: None,
                    ignore_eos,
                    ..Default::default()
                };
                (ctx, cfg, stop)
            })
    })
}

fn draw() -> impl Strategy<Value = Draw> {
    prop_oneof![
        3 => Just(Draw::Stream),
        2 => (0.0f64..1.0).prop_map(Draw::FixedU),
        1 => Just(Draw::FixedU(0.0)),
        1 => Just(Draw::FixedU(U_MAX)),
    ]
}

// ------------------------------------------------------------------------------------------
// naive re-computations
// ------------------------------------------------------------------------------------------

/// Naive hard masks of a pipeline at one step, straight from the definitions (000 §3.3–§3.5).
#[derive(Debug)]
struct Masks {
    /// Per token: whether some mask hides it.
    hidden: Vec<bool>,
    /// The first stage (`"raw"` or a processor type) after which every token is hidden, with
    /// its position (0 = raw, `i + 1` = processor `i`).
    empty_at: Option<(usize, String)>,
    /// Position of the first truncation (top-k/p, min-p, typical, `T = 0`). Masks after it act
    /// on a support the naive model does not track, so they may empty it earlier.
    first_truncation: Option<usize>,
}

fn hard_masks(cfg: &PipelineConfig, stop: &StopConfig, ctx: &Ctx) -> Masks {
    let vocab = &ctx.vocab;
    let mut hidden: Vec<bool> = ctx.logits.iter().map(|&x| x == NEG_INF).collect();
    let mut empty_at = hidden.iter().all(|&h| h).then(|| (0, "raw".to_string()));
    let mut first_truncation = None;
    let eos_stop: BTreeSet<u32> = vocab
        .eos_token_ids
        .iter()
        .chain(stop.stop_token_ids.iter())
        .copied()
        .collect();
    let all_ctx: Vec<u32> = ctx
        .prompt
        .iter()
        .chain(ctx.history.iter())
        .copied()
        .collect();
    for (i, p) in cfg.processors.iter().enumerate() {
        match p {
            P::SpecialTokenMask(c) => {
                for &id in &vocab.special_token_ids {
                    if !eos_stop.contains(&id) {
                        hidden[id as usize] = true;
                    }
                }
                for &id in &c.token_ids {
                    hidden[id as usize] = true;
                }
            }
            P::MinTokens(c) if (ctx.history.len() as u64) < c.min_tokens => {
                for &id in &eos_stop {
                    hidden[id as usize] = true;
                }
            }
            P::AllowedTokenIds(c) => {
                for (id, h) in hidden.iter_mut().enumerate() {
                    if !c.token_ids.contains(&(id as u32)) {
                        *h = true;
                    }
                }
            }
            P::BannedSequences(c) => {
                // the automaton ignores the prompt unless `include_prompt`
                let context: &[u32] = if c.include_prompt {
                    &all_ctx
                } else {
                    &ctx.history
                };
                for s in &c.sequences {
                    let (last, prefix) = s.split_last().unwrap();
                    if context.ends_with(prefix) {
                        hidden[*last as usize] = true;
                    }
                }
            }
            P::NoRepeatNgram(c) => {
                // every earlier occurrence of the current (n−1)-token suffix bans its follower
                let n = c.ngram_size;
                let len = all_ctx.len();
                if len + 1 >= n {
                    let suffix = &all_ctx[len + 1 - n..];
                    for s in 0..len {
                        if s + n - 1 < len && all_ctx[s..s + n - 1] == *suffix {
                            hidden[all_ctx[s + n - 1] as usize] = true;
                        }
                    }
                }
            }
            P::TopK(_) | P::TopP(_) | P::MinP(_) | P::TypicalP(_) => {
                first_truncation.get_or_insert(i + 1);
            }
            // `T = 0`, and a `T` so small that some `z / T` may leave the `f32` range (the
            // logits here stay within ±1e5 after bias and penalties), keep only the argmax
            P::Temperature(t) if t.temperature < 1e-30 => {
                first_truncation.get_or_insert(i + 1);
            }
            _ => {}
        }
        if empty_at.is_none() && hidden.iter().all(|&h| h) {
            empty_at = Some((i + 1, p.type_name().to_string()));
        }
    }
    Masks {
        hidden,
        empty_at,
        first_truncation,
    }
}

fn is_mask(p: &P) -> bool {
    matches!(
        p,
        P::SpecialTokenMask(_)
            | P::MinTokens(_)
            | P::AllowedTokenIds(_)
            | P::BannedSequences(_)
            | P::NoRepeatNgram(_)
    )
}

/// Top-k from the definition: the finite tokens by (score descending, id ascending); `k` of them
/// (`by_id`) or every token tied with the k-th (`keep_all`); all of them when `k` ≥ their count.
fn naive_top_k(z: &[f32], k: usize, ties: top_k::Ties) -> Vec<u32> {
    let mut live: Vec<u32> = (0..z.len() as u32)
        .filter(|&i| z[i as usize] > NEG_INF)
        .collect();
    live.sort_by(|&a, &b| {
        z[b as usize]
            .partial_cmp(&z[a as usize])
            .unwrap()
            .then(a.cmp(&b))
    });
    if k >= live.len() {
        return live;
    }
    let kth = z[live[k - 1] as usize];
    match ties {
        top_k::Ties::ById => live[..k].to_vec(),
        top_k::Ties::KeepAll => live.into_iter().filter(|&i| z[i as usize] >= kth).collect(),
    }
}

/// Top-p from the definition (000 §3.7) over `live`, with probabilities computed exactly as the
/// library does: `w_i = exp_f32(z_i − m)`; `S` is the 8-lane sum of [`math::exp_weights`] when
/// the support is still dense, else the sequential `f64` sum in (score desc, id asc) order;
/// `p_i = w_i / S` in `f64`. Tokens are ordered by probability descending; probabilities that are
/// equal only because of `f32` rounding or underflow (e.g. two weights flushed to 0) are ordered
/// by their exact score (what exact arithmetic would give), then by id.
fn naive_top_p(
    z: &[f32],
    live: &[u32],
    dense: bool,
    p: f64,
    min_keep: usize,
    rule: top_p::Rule,
) -> BTreeSet<u32> {
    if p >= 1.0 || live.is_empty() {
        return live.iter().copied().collect();
    }
    let m = live.iter().map(|&i| z[i as usize]).fold(NEG_INF, f32::max);
    let mut canon = live.to_vec();
    canon.sort_by(|&a, &b| {
        z[b as usize]
            .partial_cmp(&z[a as usize])
            .unwrap()
            .then(a.cmp(&b))
    });
    let s = if dense && rule == top_p::Rule::DescendingPrefix {
        let mut w = vec![0.0f32; z.len()];
        math::exp_weights(z, m, &mut w)
    } else {
        let mut s = 0.0f64;
        for &i in &canon {
            s += exp_f32(z[i as usize] - m) as f64;
        }
        s
    };
    let prob = |i: u32| exp_f32(z[i as usize] - m) as f64 / s;
    let mut order = live.to_vec();
    order.sort_by(|&a, &b| {
        prob(b)
            .partial_cmp(&prob(a))
            .unwrap()
            .then(z[b as usize].partial_cmp(&z[a as usize]).unwrap())
            .then(a.cmp(&b))
    });
    let n = order.len();
    let keep = match rule {
        top_p::Rule::DescendingPrefix => {
            let mut cum = 0.0f64;
            let mut keep = n;
            for (i, &id) in order.iter().enumerate() {
                cum += prob(id);
                if cum >= p && i + 1 >= min_keep {
                    keep = i + 1;
                    break;
                }
            }
            keep
        }
        top_p::Rule::AscendingTail => {
            // in weight space: the tail's weights against (1 − p)·S (docs/semantics.md §3)
            let bound = (1.0 - p) * s;
            let mut cum = 0.0f64;
            let mut removed = 0;
            for &id in order.iter().rev() {
                cum += exp_f32(z[id as usize] - m) as f64;
                if cum <= bound {
                    removed += 1;
                } else {
                    break;
                }
            }
            (n - removed).max(min_keep.min(n)).max(1)
        }
    };
    order[..keep].iter().copied().collect()
}

/// Inverse-CDF selection from the definition (000 §3.8): candidates by id ascending, the first
/// whose running sum exceeds `u`; the rounding guard returns the last candidate that has a
/// positive probability (a zero-probability token must never be selected).
fn naive_categorical(cands: &[CandidateRecord], u: f64) -> u32 {
    let mut by_id: Vec<&CandidateRecord> = cands.iter().collect();
    by_id.sort_by_key(|c| c.id);
    let mut cum = 0.0f64;
    let mut last = None;
    for c in by_id {
        cum += c.selection_prob;
        if c.selection_prob > 0.0 {
            last = Some(c.id);
        }
        if u < cum {
            return c.id;
        }
    }
    last.expect("a support has a positive-probability token")
}

/// Gumbel-max (exponential race) from the definition: `argmax w_i / E_i` with
/// `E_i = −ln u_i`, `u_i = uniform_open(step, Gumbel, id)`, ties → lowest id. Candidates are
/// visited in the given order, which must not matter.
fn naive_gumbel(cands: &[(u32, f32)], rng: &nextok_core::RngState, step: u64) -> Option<u32> {
    let m = cands.iter().map(|c| c.1).fold(NEG_INF, f32::max);
    let mut best: Option<(f64, u32)> = None;
    for &(id, z) in cands {
        let w = exp_f32(z - m) as f64;
        if w <= 0.0 {
            continue;
        }
        let key = w / -ln_f64(rng.uniform_open(step, Purpose::Gumbel, id));
        best = match best {
            Some((bk, bid)) if !(key > bk || (key == bk && id < bid)) => Some((bk, bid)),
            _ => Some((key, id)),
        };
    }
    best.map(|b| b.1)
}

fn ids(rec: &StepRecord) -> BTreeSet<u32> {
    rec.candidates.iter().map(|c| c.id).collect()
}

fn json(rec: &StepRecord) -> String {
    serde_json::to_string(rec).unwrap()
}

// ------------------------------------------------------------------------------------------
// the per-step checks shared by the preset and custom-pipeline properties
// ------------------------------------------------------------------------------------------

fn check_step(
    s: &Sampler,
    stop: &StopConfig,
    ctx: &Ctx,
    draw: Draw,
) -> Result<Option<StepRecord>, TestCaseError> {
    let st = s
        .state_with_history(&ctx.prompt, &ctx.history, ctx.seed)
        .unwrap();
    let before = st.clone();
    let masks = hard_masks(s.config(), stop, ctx);
    let hidden = &masks.hidden;
    let mut ws = s.new_workspace();
    let res = s.select_recorded(&ctx.logits, &st, &mut ws, draw, usize::MAX);
    // processors never change history (invariant 3.1)
    prop_assert_eq!(&st, &before);
    // Whether the support must be empty, and at which stage: exactly known while every mask
    // precedes the first truncation; after a truncation a mask may empty the (unknown) truncated
    // support, but only a mask can, never a truncation or a transform.
    let exact = match (&masks.empty_at, masks.first_truncation) {
        (Some((at, _)), Some(t)) => *at < t,
        (None, Some(_)) => false,
        (_, None) => true,
    };
    let (sel, rec) = match res {
        Err(e) => {
            let ErrorKind::EmptySupport { stage } = e.kind().clone() else {
                return Err(TestCaseError::fail(format!("unexpected error {e:?}")));
            };
            prop_assert_eq!(e.code(), "empty_support");
            prop_assert_eq!(e.field(), Some("support"));
            if exact {
                let want = masks.empty_at.as_ref().map(|x| x.1.clone());
                prop_assert_eq!(Some(stage), want, "naive masks: {:?}", masks.empty_at);
            } else {
                let t = masks.first_truncation.unwrap();
                let last = masks.empty_at.as_ref().map_or(usize::MAX, |x| x.0);
                let ok =
                    s.config().processors.iter().enumerate().any(|(i, p)| {
                        i + 1 > t && i < last && is_mask(p) && p.type_name() == stage
                    });
                prop_assert!(
                    ok,
                    "support emptied by `{}`, not a mask after a truncation",
                    stage
                );
            }
            // the selector never ran; select and step fail alike and leave the state untouched
            let e2 = s.select(&ctx.logits, &st, &mut ws, draw).unwrap_err();
            prop_assert_eq!(&e2, &e);
            let mut st2 = st.clone();
            let e3 = s.step(&ctx.logits, &mut st2, &mut ws).unwrap_err();
            prop_assert_eq!(&e3, &e);
            prop_assert_eq!(&st2, &before);
            return Ok(None);
        }
        Ok((_, rec)) if masks.empty_at.is_some() => {
            return Err(TestCaseError::fail(format!(
                "every token is hard-masked ({:?}) but the step selected {}",
                masks.empty_at, rec.selected
            )))
        }
        Ok(x) => x,
    };
    let cands = &rec.candidates;

    // the support is non-empty, complete, in canonical order, and free of hard-masked tokens
    prop_assert!(!cands.is_empty());
    prop_assert_eq!(rec.support_size, cands.len());
    for w in cands.windows(2) {
        prop_assert!(
            w[0].processed_logit > w[1].processed_logit
                || (w[0].processed_logit == w[1].processed_logit && w[0].id < w[1].id),
            "candidates not in canonical order: {:?}",
            w
        );
    }
    for c in cands {
        prop_assert!(
            !hidden[c.id as usize],
            "hard-masked token {} in the support",
            c.id
        );
        prop_assert!(c.processed_logit.is_finite());
        prop_assert_eq!(c.raw_logit.to_bits(), ctx.logits[c.id as usize].to_bits());
        prop_assert!(c.raw_logit.is_finite());
    }
    prop_assert_eq!(sel.token, rec.selected);
    prop_assert!(
        ids(&rec).contains(&sel.token),
        "selected token not in the support"
    );
    prop_assert!(!hidden[sel.token as usize]);

    // stages: raw, then every processor in order; the support never grows
    let names: Vec<&str> = rec.stages.iter().map(|x| x.stage.as_str()).collect();
    let mut want = vec!["raw"];
    want.extend(s.config().processors.iter().map(|p| p.type_name()));
    prop_assert_eq!(names, want);
    for w in rec.stages.windows(2) {
        prop_assert!(
            w[1].support_size <= w[0].support_size,
            "support grew: {:?}",
            w
        );
    }
    prop_assert_eq!(rec.stages.last().unwrap().support_size, rec.support_size);

    // selection probabilities: a distribution over the support. A probability is 0 exactly when
    // its weight exp_f32(z − max) underflows (a score more than 87 below the maximum; the spec's
    // ±1e4 logits do that), otherwise it is in (0, 1].
    let zmax = cands[0].processed_logit;
    let total: f64 = cands.iter().map(|c| c.selection_prob).sum();
    prop_assert!(
        (total - 1.0).abs() <= SUM_TOL,
        "sum of selection probs {total}"
    );
    for c in cands {
        prop_assert!(c.selection_prob <= 1.0);
        let w = exp_f32(c.processed_logit - zmax);
        if w > 0.0 {
            prop_assert!(c.selection_prob > 0.0, "{:?}", c);
        } else {
            prop_assert_eq!(c.selection_prob, 0.0);
        }
    }
    let psel = cands
        .iter()
        .find(|c| c.id == sel.token)
        .unwrap()
        .selection_prob;
    prop_assert!(psel > 0.0, "selected token {} has probability 0", sel.token);

    // the selector, from its definition
    match s.selector() {
        Selector::Greedy => {
            prop_assert_eq!(sel.token, cands[0].id);
            prop_assert_eq!(sel.u, None);
        }
        Selector::Categorical => {
            let u = match draw {
                Draw::FixedU(u) => u,
                Draw::Stream => st.rng().uniform(st.step(), Purpose::Select, 0),
                Draw::Draft(_) => unreachable!("draw() gives no drafts (see rejection_draw.rs)"),
            };
            prop_assert_eq!(sel.u, Some(u));
            prop_assert_eq!(rec.rng.u, Some(u));
            prop_assert_eq!(sel.token, naive_categorical(cands, u));
        }
        Selector::Gumbel => {
            let mut list: Vec<(u32, f32)> =
                cands.iter().map(|c| (c.id, c.processed_logit)).collect();
            list.reverse();
            prop_assert_eq!(Some(sel.token), naive_gumbel(&list, &st.rng(), st.step()));
            prop_assert_eq!(sel.u, None);
        }
    }

    // the fast path (no layers kept) selects the same token with the same u
    let fast = s.select(&ctx.logits, &st, &mut ws, draw).unwrap();
    prop_assert_eq!(fast, sel);
    prop_assert_eq!(&st, &before);
    // ... and the workspace it used (its row read in place, copied or not) records the step as
    // before
    let (_, rec3) = s
        .select_recorded(&ctx.logits, &st, &mut ws, draw, usize::MAX)
        .unwrap();
    prop_assert_eq!(json(&rec3), json(&rec));

    // determinism: a dirty workspace (used on other logits first) gives the identical record
    let mut dirty = s.new_workspace();
    let other: Vec<f32> = ctx.logits.iter().rev().copied().collect();
    let _ = s.select_recorded(&other, &st, &mut dirty, Draw::Stream, 3);
    let (_, rec2) = s
        .select_recorded(&ctx.logits, &st, &mut dirty, draw, usize::MAX)
        .unwrap();
    prop_assert_eq!(json(&rec), json(&rec2));

    // explain: the same record, and a ledger consistent with it
    if ctx.v() <= 300 {
        let ex = s.explain(&ctx.logits, &st, draw).unwrap();
        prop_assert_eq!(json(&ex.record), json(&rec));
        prop_assert_eq!(ex.tokens.len(), ctx.v());
        let support = ids(&rec);
        for row in &ex.tokens {
            prop_assert_eq!(row.kept, support.contains(&row.id));
            prop_assert_eq!(row.selected, row.id == sel.token);
            if hidden[row.id as usize] {
                prop_assert!(!row.allowed && !row.kept && row.selection_prob == 0.0);
            }
        }
        prop_assert_eq!(&st, &before);
    }

    // step = select + commit (000 §3.10): history grows by exactly the selected token
    let stream = s.select(&ctx.logits, &st, &mut ws, Draw::Stream).unwrap();
    let mut st2 = st.clone();
    let r = s.step(&ctx.logits, &mut st2, &mut ws).unwrap();
    prop_assert_eq!(r.token, stream.token);
    prop_assert_eq!(r.u, stream.u);
    prop_assert_eq!(st2.step(), st.step() + 1);
    prop_assert_eq!(st2.rng().counter, st2.step());
    prop_assert_eq!(st2.rng().seed, ctx.seed);
    prop_assert_eq!(st2.prompt_ids(), st.prompt_ids());
    let mut hist = st.selected_ids().to_vec();
    hist.push(r.token);
    prop_assert_eq!(st2.selected_ids(), &hist[..]);
    prop_assert_eq!(st2.output_count(r.token), st.output_count(r.token) + 1);
    prop_assert_eq!(st2.total_count(r.token), st.total_count(r.token) + 1);
    Ok(Some(rec))
}

fn expected_contradiction(params: &SamplingParams, vocab: &VocabInfo) -> bool {
    let min = params.min_tokens.unwrap_or(0);
    min > 0
        && params.max_tokens.is_some_and(|m| min > m)
        && !(vocab.eos_token_ids.is_empty() && params.stop_token_ids.is_empty())
}

// ------------------------------------------------------------------------------------------
// properties
// ------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(cfg(160))]

    /// Every preset, random request parameters: every successful step is well formed.
    #[test]
    fn preset_steps_are_well_formed((ctx, params, preset) in preset_case(), draw in draw()) {
        let s = match Sampler::from_params(preset, &params, ctx.vocab.clone()) {
            Ok(s) => {
                prop_assert!(!expected_contradiction(&params, &ctx.vocab));
                s
            }
            Err(e) => {
                prop_assert!(expected_contradiction(&params, &ctx.vocab), "{e:?}");
                prop_assert_eq!(e.code(), "contradiction");
                prop_assert_eq!(e.field(), Some("min_tokens"));
                return Ok(());
            }
        };
        // the preset lists only what acts, in a fixed format
        prop_assert_eq!(s.config().format_version, nextok_core::FORMAT_VERSION);
        let stop = s.stop().clone();
        if let Some(rec) = check_step(&s, &stop, &ctx, draw)? {
            // top_k <= 0 and top_p = 1 are "disabled": the processor is left out
            let has = |t: &str| s.config().processors.iter().any(|p| p.type_name() == t);
            if params.top_k.is_some_and(|k| k <= 0) {
                prop_assert!(!has("top_k"));
            }
            if params.top_p == Some(1.0) {
                prop_assert!(!has("top_p"));
            }
            // temperature 0 is greedy in every preset
            if params.temperature == Some(0.0) {
                prop_assert_eq!(s.selector(), Selector::Greedy);
                prop_assert_eq!(rec.selected, rec.candidates[0].id);
            }
        }
    }

    /// Random custom orders of processors and any selector.
    #[test]
    fn custom_pipelines_are_well_formed((ctx, cfg, stop) in custom_case(true), draw in draw()) {
        let s = Sampler::new(cfg, ctx.vocab.clone(), stop.clone()).unwrap();
        check_step(&s, &stop, &ctx, draw)?;
    }
}

/// Raw logits for the top-k/top-p properties (no penalties involved).
fn truncation_case() -> impl Strategy<Value = (Vec<f32>, Option<f32>)> {
    vocab_len().prop_flat_map(|v| {
        (
            vec(logit(), v),
            prop::option::of(prop_oneof![0.1f32..3.0, Just(0.5f32), Just(2.0f32)]),
        )
    })
}

fn processed(raw: &[f32], t: Option<f32>) -> Vec<f32> {
    match t {
        Some(t) => raw
            .iter()
            .map(|&x| if x > NEG_INF { x / t } else { x })
            .collect(),
        None => raw.to_vec(),
    }
}

fn support_of(s: &Sampler, raw: &[f32]) -> Option<StepRecord> {
    let st = s.new_state(&[], 1).unwrap();
    let mut ws = s.new_workspace();
    match s.select_recorded(raw, &st, &mut ws, Draw::FixedU(0.5), usize::MAX) {
        Ok((_, rec)) => Some(rec),
        Err(e) => {
            assert!(raw.iter().all(|&x| x == NEG_INF), "{e:?}");
            assert_eq!(
                e.kind(),
                &ErrorKind::EmptySupport {
                    stage: "raw".into()
                }
            );
            None
        }
    }
}

proptest! {
    #![proptest_config(cfg(200))]

    /// Top-p keeps exactly the minimal prefix of the naive computation, on the dense path (top-p
    /// first) and on the sparse path (top-k, then top-p), for both rules.
    #[test]
    fn top_p_is_the_minimal_prefix(
        (raw, t) in truncation_case(),
        p in top_p_value(),
        min_keep in 1usize..4,
        k in prop::option::of((1i64..320, ties())),
        rule in rule(),
    ) {
        let v = raw.len();
        let mut procs = Vec::new();
        if let Some(t) = t {
            procs.push(P::Temperature(Temperature { version: 1, temperature: t }));
        }
        if let Some((k, ties)) = k {
            procs.push(P::TopK(TopK { version: 1, top_k: k, ties }));
        }
        procs.push(P::TopP(TopP { version: 1, top_p: p, min_keep, rule }));
        let s = Sampler::new(
            PipelineConfig::new(procs, Selector::Greedy),
            VocabInfo::plain(v),
            StopConfig::default(),
        )
        .unwrap();
        let Some(rec) = support_of(&s, &raw) else { return Ok(()) };

        let z = processed(&raw, t);
        let finite = z.iter().filter(|x| **x > NEG_INF).count();
        let (live, dense) = match k {
            Some((k, ties)) if (k as usize) < finite => (naive_top_k(&z, k as usize, ties), false),
            _ => ((0..v as u32).filter(|&i| z[i as usize] > NEG_INF).collect(), true),
        };
        let want = naive_top_p(&z, &live, dense, p, min_keep, rule);
        prop_assert_eq!(ids(&rec), want);
        // the processed logits of the support are z exactly
        for c in &rec.candidates {
            prop_assert_eq!(c.processed_logit.to_bits(), z[c.id as usize].to_bits());
        }
    }

    /// Top-k keeps min(k, finite count) tokens with ties to the lower id (`by_id`), or every token
    /// tied with the k-th (`keep_all`), in a custom pipeline and through the presets.
    #[test]
    fn top_k_keeps_the_k_best(
        (raw, t) in truncation_case(),
        k in 1i64..320,
        ties in ties(),
        via_preset in any::<bool>(),
    ) {
        let v = raw.len();
        let s = if via_preset {
            // reference breaks ties by id, HF keeps them all
            let preset = match ties {
                top_k::Ties::ById => Preset::Reference,
                top_k::Ties::KeepAll => Preset::Hf,
            };
            let params = SamplingParams {
                temperature: Some(t.unwrap_or(1.0)),
                top_k: Some(k),
                top_p: Some(1.0),
                ..Default::default()
            };
            Sampler::from_params(preset, &params, VocabInfo::plain(v)).unwrap()
        } else {
            let mut procs = Vec::new();
            if let Some(t) = t {
                procs.push(P::Temperature(Temperature { version: 1, temperature: t }));
            }
            procs.push(P::TopK(TopK { version: 1, top_k: k, ties }));
            Sampler::new(
                PipelineConfig::new(procs, Selector::Categorical),
                VocabInfo::plain(v),
                StopConfig::default(),
            )
            .unwrap()
        };
        let Some(rec) = support_of(&s, &raw) else { return Ok(()) };
        let z = processed(&raw, t.filter(|&t| t != 1.0));
        let want: BTreeSet<u32> = naive_top_k(&z, k as usize, ties).into_iter().collect();
        let finite = z.iter().filter(|x| **x > NEG_INF).count();
        if ties == top_k::Ties::ById {
            prop_assert_eq!(want.len(), (k as usize).min(finite));
        }
        prop_assert_eq!(ids(&rec), want);
    }
}

// ------------------------------------------------------------------------------------------
// batches, determinism, saved streams
// ------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Row {
    logits: Vec<f32>,
    prompt: Vec<u32>,
    history: Vec<u32>,
    seed: u64,
}

fn batch_case() -> impl Strategy<Value = (VocabInfo, SamplingParams, Preset, Vec<Row>, Vec<usize>)>
{
    (1usize..120).prop_flat_map(|v| {
        let id = 0..v as u32;
        let row = (
            vec(logit(), v),
            vec(id.clone(), 0..5),
            vec(id.clone(), 0..5),
            any::<u64>(),
        )
            .prop_map(|(logits, prompt, history, seed)| Row {
                logits,
                prompt,
                history,
                seed,
            });
        (
            vec(id, 0..2).prop_map(move |eos| VocabInfo {
                vocab_size: v,
                eos_token_ids: eos,
                special_token_ids: vec![],
            }),
            params_for(v),
            preset(),
            vec(row, 1..7),
        )
            .prop_flat_map(|(vocab, params, preset, rows)| {
                let order: Vec<usize> = (0..rows.len()).collect();
                (
                    Just(vocab),
                    Just(params),
                    Just(preset),
                    Just(rows),
                    Just(order).prop_shuffle(),
                )
            })
    })
}

fn placeholder() -> nextok_core::Result<StepResult> {
    Ok(StepResult {
        token: u32::MAX,
        finish: None,
        u: None,
    })
}

fn run_batch(
    s: &Sampler,
    rows: &[&Row],
    states: &mut [DecoderState],
    threads: usize,
) -> Vec<nextok_core::Result<StepResult>> {
    let v = s.vocab().vocab_size;
    let flat: Vec<f32> = rows.iter().flat_map(|r| r.logits.iter().copied()).collect();
    let mut out = vec![placeholder(); rows.len()];
    s.step_batch(&flat, states, &mut WorkspacePool::new(v, threads), &mut out)
        .unwrap();
    out
}

proptest! {
    #![proptest_config(cfg(48))]

    /// A request's token depends neither on its batch position, its neighbours nor the number of
    /// workspaces: `step_batch` equals stepping every row alone.
    #[test]
    fn batch_rows_equal_single_rows((vocab, params, preset, rows, order) in batch_case()) {
        let Ok(s) = Sampler::from_params(preset, &params, vocab) else { return Ok(()) };
        let states: Vec<DecoderState> = rows
            .iter()
            .map(|r| s.state_with_history(&r.prompt, &r.history, r.seed).unwrap())
            .collect();
        let alone: Vec<(nextok_core::Result<StepResult>, DecoderState)> = rows
            .iter()
            .zip(&states)
            .map(|(r, st)| {
                let mut st = st.clone();
                let mut ws = s.new_workspace();
                (s.step(&r.logits, &mut st, &mut ws), st)
            })
            .collect();
        let refs: Vec<&Row> = rows.iter().collect();
        for threads in 1..=3 {
            let mut sts = states.clone();
            let out = run_batch(&s, &refs, &mut sts, threads);
            for i in 0..rows.len() {
                prop_assert_eq!(&out[i], &alone[i].0, "row {} threads {}", i, threads);
                prop_assert_eq!(&sts[i], &alone[i].1);
            }
        }
        // a different order (other neighbours, other positions)
        let permuted: Vec<&Row> = order.iter().map(|&i| &rows[i]).collect();
        for threads in 1..=3 {
            let mut sts: Vec<DecoderState> = order.iter().map(|&i| states[i].clone()).collect();
            let out = run_batch(&s, &permuted, &mut sts, threads);
            for (j, &i) in order.iter().enumerate() {
                prop_assert_eq!(&out[j], &alone[i].0);
                prop_assert_eq!(&sts[j], &alone[i].1);
            }
        }
        // the same request twice in one batch: two identical, independent streams
        let twice = [&rows[0], &rows[0]];
        let mut sts = vec![states[0].clone(), states[0].clone()];
        let out = run_batch(&s, &twice, &mut sts, 2);
        prop_assert_eq!(&out[0], &alone[0].0);
        prop_assert_eq!(&out[1], &alone[0].0);
    }

    /// Same inputs and seed → same tokens and byte-identical records; a cloned state, and a state
    /// rebuilt from the saved stream (`rng()`) and history, continue identically.
    #[test]
    fn decoding_is_deterministic_and_resumable(
        (ctx, params, preset) in preset_case(),
        steps in 1usize..6,
        split in 0usize..6,
    ) {
        let Ok(s) = Sampler::from_params(preset, &params, ctx.vocab.clone()) else { return Ok(()) };
        let row = |i: usize| -> Vec<f32> {
            let mut l = ctx.logits.clone();
            l.rotate_left(i % ctx.v());
            l
        };
        // run `n` steps from `st`, starting at step number `from`; also says whether the run
        // ended early (finished, or a constraint error)
        let run = |st: &mut DecoderState, from: usize, n: usize| -> (Vec<String>, bool) {
            let mut ws = s.new_workspace();
            let mut out = Vec::new();
            for i in from..from + n {
                if st.is_finished() {
                    return (out, true);
                }
                match s.step_recorded(&row(i), st, &mut ws, Draw::Stream, usize::MAX) {
                    Ok((r, rec)) => {
                        assert_eq!(r.token, rec.selected);
                        out.push(json(&rec));
                    }
                    Err(e) => {
                        out.push(format!("{e:?}"));
                        return (out, true);
                    }
                }
            }
            (out, false)
        };
        let st0 = s.state_with_history(&ctx.prompt, &ctx.history, ctx.seed).unwrap();
        let mut a = st0.clone();
        let ra = run(&mut a, 0, steps);
        let mut b = st0.clone();
        let rb = run(&mut b, 0, steps);
        prop_assert_eq!(&ra, &rb);
        prop_assert_eq!(&a, &b);

        // split the same run: clone after `split` steps, and rebuild from the saved stream
        let mut c = st0.clone();
        let split = split.min(steps);
        let (mut first, ended) = run(&mut c, 0, split);
        if ended || c.is_finished() {
            return Ok(());
        }
        let saved = c.rng();
        prop_assert_eq!(saved.seed, ctx.seed);
        prop_assert_eq!(saved.counter, c.step());
        let rebuilt = s
            .state_with_history(c.prompt_ids(), c.selected_ids(), saved.seed)
            .unwrap();
        prop_assert_eq!(rebuilt.rng(), saved);
        prop_assert_eq!(&rebuilt, &c);
        let mut cloned = c.clone();
        let (rest_cloned, _) = run(&mut cloned, split, steps - split);
        let mut rebuilt = rebuilt;
        let (rest_rebuilt, _) = run(&mut rebuilt, split, steps - split);
        prop_assert_eq!(&rest_cloned, &rest_rebuilt);
        first.extend(rest_cloned);
        prop_assert_eq!(&first, &ra.0);
        prop_assert_eq!(&cloned, &a);
    }
}

// ------------------------------------------------------------------------------------------
// Gumbel-max: a token's noise is keyed by its id, not by the candidate list
// ------------------------------------------------------------------------------------------

fn gumbel_case() -> impl Strategy<Value = (Vec<f32>, Vec<bool>, Vec<usize>, f32, u64, u64, usize)> {
    (2usize..200).prop_flat_map(|v| {
        let order: Vec<usize> = (0..v).collect();
        (
            vec(logit(), v),
            vec(any::<bool>(), v),
            Just(order).prop_shuffle(),
            0.2f32..2.0,
            any::<u64>(),
            0u64..1000,
            1usize..v + 1,
        )
    })
}

proptest! {
    #![proptest_config(cfg(96))]

    #[test]
    fn gumbel_selection_ignores_list_order_and_masked_tokens(
        (raw, mask, order, t, seed, step, k) in gumbel_case(),
    ) {
        let v = raw.len();
        let temp = P::Temperature(Temperature { version: 1, temperature: t });
        let sampler = |procs: Vec<P>| {
            Sampler::new(
                PipelineConfig::new(procs, Selector::Gumbel),
                VocabInfo::plain(v),
                StopConfig::default(),
            )
            .unwrap()
        };
        let history: Vec<u32> = (0..step).map(|i| (i % v as u64) as u32).collect();
        let pick = |s: &Sampler, logits: &[f32]| -> Option<u32> {
            let st = s.state_with_history(&[], &history, seed).unwrap();
            let mut ws = s.new_workspace();
            s.select(logits, &st, &mut ws, Draw::Stream).ok().map(|x| x.token)
        };
        let dense = sampler(vec![temp.clone()]);
        let Some(w) = pick(&dense, &raw) else {
            prop_assert!(raw.iter().all(|&x| x == NEG_INF));
            return Ok(());
        };
        let rng = dense.state_with_history(&[], &history, seed).unwrap().rng();

        // per-token noise is a pure function of (seed, step, id): the same in any visiting order
        let noise: Vec<f64> = (0..v as u32).map(|i| rng.uniform_open(step, Purpose::Gumbel, i)).collect();
        for &i in &order {
            prop_assert_eq!(rng.uniform_open(step, Purpose::Gumbel, i as u32), noise[i]);
            prop_assert!(noise[i] > 0.0 && noise[i] < 1.0);
        }

        // the naive race over the candidates in a shuffled order picks the same token
        let z = processed(&raw, Some(t));
        let shuffled: Vec<(u32, f32)> = order
            .iter()
            .filter(|&&i| z[i] > NEG_INF)
            .map(|&i| (i as u32, z[i]))
            .collect();
        prop_assert_eq!(naive_gumbel(&shuffled, &rng, step), Some(w));

        // masking other tokens (keeping the maximum, so weights are unchanged) keeps the winner
        let argmax = (0..v).fold(0, |b, i| if z[i] > z[b] { i } else { b });
        let masked: Vec<f32> = (0..v)
            .map(|i| if mask[i] && i != w as usize && i != argmax { NEG_INF } else { raw[i] })
            .collect();
        prop_assert_eq!(pick(&dense, &masked), Some(w));

        // the same race over an explicit candidate list (id order) ...
        let all = P::AllowedTokenIds(AllowedTokenIds { version: 1, token_ids: (0..v as u32).rev().collect() });
        prop_assert_eq!(pick(&sampler(vec![all, temp.clone()]), &raw), Some(w));
        // ... and over a top-k list (score order) that contains the winner
        let topk = naive_top_k(&z, k, top_k::Ties::ById);
        if topk.contains(&w) {
            let p = P::TopK(TopK { version: 1, top_k: k as i64, ties: top_k::Ties::ById });
            prop_assert_eq!(pick(&sampler(vec![temp, p]), &raw), Some(w));
        }
    }
}

// ------------------------------------------------------------------------------------------
// dense and sparse supports agree
// ------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(cfg(96))]

    /// Every processor gives the same support whether it runs on the dense representation or on
    /// an explicit candidate list (forced by a leading allowed-ids processor listing every id).
    /// (Descending top-p is excluded: on a dense support its normaliser is the declared 8-lane
    /// sum, which may differ in the last bits; the top-p property checks both paths exactly.)
    #[test]
    fn dense_and_sparse_supports_agree((ctx, cfg, stop) in custom_case(false), draw in draw()) {
        let v = ctx.v();
        let a = Sampler::new(cfg.clone(), ctx.vocab.clone(), stop.clone()).unwrap();
        let mut procs = vec![P::AllowedTokenIds(AllowedTokenIds { version: 1, token_ids: (0..v as u32).collect() })];
        procs.extend(cfg.processors.iter().cloned());
        let b = Sampler::new(PipelineConfig::new(procs, cfg.selector), ctx.vocab.clone(), stop).unwrap();
        let run = |s: &Sampler| {
            let st = s.state_with_history(&ctx.prompt, &ctx.history, ctx.seed).unwrap();
            let mut ws = s.new_workspace();
            s.select_recorded(&ctx.logits, &st, &mut ws, draw, usize::MAX)
        };
        match (run(&a), run(&b)) {
            (Err(ea), Err(eb)) => prop_assert_eq!(ea, eb),
            (Ok((sa, ra)), Ok((sb, rb))) => {
                prop_assert_eq!(ids(&ra), ids(&rb));
                for (ca, cb) in ra.candidates.iter().zip(&rb.candidates) {
                    prop_assert_eq!(ca.id, cb.id);
                    prop_assert_eq!(ca.processed_logit.to_bits(), cb.processed_logit.to_bits());
                    prop_assert!((ca.selection_prob - cb.selection_prob).abs() <= 1e-12);
                }
                match cfg.selector {
                    Selector::Categorical => {
                        // equal unless u sits within rounding distance of a cumulative boundary
                        let u = sa.u.unwrap();
                        let mut by_id = ra.candidates.clone();
                        by_id.sort_by_key(|c| c.id);
                        let mut cum = 0.0;
                        let near = by_id.iter().any(|c| {
                            cum += c.selection_prob;
                            (cum - u).abs() < 1e-9
                        });
                        if !near {
                            prop_assert_eq!(sa.token, sb.token);
                        }
                    }
                    _ => prop_assert_eq!(sa.token, sb.token),
                }
            }
            (x, y) => prop_assert!(false, "dense {:?} vs sparse {:?}", x.map(|r| r.0), y.map(|r| r.0)),
        }
    }
}

// ------------------------------------------------------------------------------------------
// the categorical rounding guard and the distribution actually sampled
// ------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(cfg(64))]

    /// With `u` just below 1 the running sum may end below `u` (rounding); the guard must then
    /// return a token that has positive probability, never one whose weight underflowed to 0.
    #[test]
    fn rounding_guard_never_selects_a_zero_probability_token(
        head in vec(-5.0f32..5.0, 2..9),
        tail in 1usize..4,
        dense in any::<bool>(),
    ) {
        let mut raw = head.clone();
        raw.resize(head.len() + tail, -1e4);
        let v = raw.len();
        let procs = if dense {
            vec![]
        } else {
            vec![P::TopK(TopK { version: 1, top_k: (v - 1) as i64, ties: top_k::Ties::ById })]
        };
        let s = Sampler::new(
            PipelineConfig::new(procs, Selector::Categorical),
            VocabInfo::plain(v),
            StopConfig::default(),
        )
        .unwrap();
        let st = s.new_state(&[], 0).unwrap();
        let mut ws = s.new_workspace();
        let (sel, rec) = s
            .select_recorded(&raw, &st, &mut ws, Draw::FixedU(U_MAX), usize::MAX)
            .unwrap();
        prop_assert!((sel.token as usize) < head.len(), "selected zero-probability token {}", sel.token);
        prop_assert_eq!(sel.token, naive_categorical(&rec.candidates, U_MAX));
    }
}

proptest! {
    #![proptest_config(cfg(64))]

    /// A tiny temperature (`z / T` beyond the `f32` range) is a transform, not a mask: it keeps
    /// every finite token finite, leaves the support size unchanged, and top-k after it (either
    /// tie rule) still keeps min(k, support) tokens or more only for ties.
    #[test]
    fn tiny_temperature_is_an_exact_division_or_the_greedy_limit(
        raw in vec(prop_oneof![-1e4f32..1e4, -1e-4f32..1e-4, Just(NEG_INF), Just(-1e4f32), Just(1e4f32)], 1..60),
        t in tiny_temperature(),
        k in prop::option::of((1i64..8, ties())),
        sel in selector(),
        u in 0.0f64..1.0,
    ) {
        let v = raw.len();
        let mut procs = vec![P::Temperature(Temperature { version: 1, temperature: t })];
        if let Some((k, ties)) = k {
            procs.push(P::TopK(TopK { version: 1, top_k: k, ties }));
        }
        let s = Sampler::new(PipelineConfig::new(procs, sel), VocabInfo::plain(v), StopConfig::default()).unwrap();
        let st = s.new_state(&[], 3).unwrap();
        let mut ws = s.new_workspace();
        let finite = raw.iter().filter(|x| **x > NEG_INF).count();
        let (sel, rec) = match s.select_recorded(&raw, &st, &mut ws, Draw::FixedU(u), usize::MAX) {
            Ok(x) => x,
            Err(e) => {
                prop_assert_eq!(finite, 0, "{:?}", e);
                return Ok(());
            }
        };
        prop_assert_eq!(rec.stages[1].stage.as_str(), "temperature");
        let max_abs = raw.iter().filter(|x| x.is_finite()).fold(0f32, |m, x| m.max(x.abs()));
        if f64::from(max_abs) / f64::from(t) > f64::from(f32::MAX) {
            // some z / T leaves the f32 range: the limit T → 0⁺, the greedy branch
            let best = (0..v).fold(0, |b, i| if raw[i] > raw[b] { i } else { b });
            prop_assert_eq!(rec.stages[1].support_size, 1);
            prop_assert_eq!(sel.token as usize, best);
        } else {
            // an exact division: the support is unchanged
            prop_assert_eq!(rec.stages[1].support_size, finite);
            if let Some((k, top_k::Ties::ById)) = k {
                prop_assert_eq!(rec.support_size, finite.min(k as usize));
            }
            prop_assert!(rec.support_size >= finite.min(k.map_or(usize::MAX, |x| x.0 as usize)));
        }
        let total: f64 = rec.candidates.iter().map(|c| c.selection_prob).sum();
        prop_assert!((total - 1.0).abs() <= SUM_TOL, "sum {}", total);
        for c in &rec.candidates {
            prop_assert!(c.processed_logit.is_finite());
            prop_assert!(c.selection_prob.is_finite());
            // the sign and order of the raw logits survive the division
            prop_assert_eq!(c.processed_logit > 0.0, c.raw_logit > 0.0);
        }
        let p = rec.candidates.iter().find(|c| c.id == sel.token).unwrap().selection_prob;
        prop_assert!(p > 0.0);
    }
}

/// Pearson's statistic of `counts` against `probs` over `n` draws, cells with an expected count
/// below 5 merged; returns (statistic, degrees of freedom).
fn chi_square(counts: &BTreeMap<u32, u64>, probs: &[(u32, f64)], n: u64) -> (f64, usize) {
    let mut cells: Vec<(f64, f64)> = Vec::new();
    let mut rest = (0.0, 0.0);
    for &(id, p) in probs {
        let e = p * n as f64;
        let o = *counts.get(&id).unwrap_or(&0) as f64;
        if e < 5.0 {
            rest.0 += o;
            rest.1 += e;
        } else {
            cells.push((o, e));
        }
    }
    if rest.1 > 0.0 {
        cells.push(rest);
    }
    let stat = cells.iter().map(|(o, e)| (o - e) * (o - e) / e).sum();
    (stat, cells.len().saturating_sub(1))
}

proptest! {
    #![proptest_config(cfg(8))]

    /// The frequencies of categorical (inverse CDF) and Gumbel-max selection over many seeds
    /// match the selection probabilities. The bound 40 + 2·df is far in the tail (p < 1e-7 for
    /// df ≤ 7), so a correct sampler essentially never fails, while sampling from a wrong
    /// distribution (uniform, unnormalised, off by one candidate) is caught at once.
    #[test]
    fn empirical_frequencies_match_selection_probabilities(
        raw in vec(-2.5f32..2.5, 2..8),
        gumbel in any::<bool>(),
        base in any::<u64>(),
        t in 0.5f32..2.0,
    ) {
        let v = raw.len();
        let s = Sampler::new(
            PipelineConfig::new(
                vec![P::Temperature(Temperature { version: 1, temperature: t })],
                if gumbel { Selector::Gumbel } else { Selector::Categorical },
            ),
            VocabInfo::plain(v),
            StopConfig::default(),
        )
        .unwrap();
        let mut ws = s.new_workspace();
        let st = s.new_state(&[], base).unwrap();
        let (_, rec) = s.select_recorded(&raw, &st, &mut ws, Draw::Stream, usize::MAX).unwrap();
        let probs: Vec<(u32, f64)> = rec.candidates.iter().map(|c| (c.id, c.selection_prob)).collect();
        let n = 3000u64;
        let mut counts = BTreeMap::new();
        for i in 0..n {
            let st = s.new_state(&[], base.wrapping_add(i.wrapping_mul(0x9E37_79B9))).unwrap();
            let tok = s.select(&raw, &st, &mut ws, Draw::Stream).unwrap().token;
            *counts.entry(tok).or_insert(0u64) += 1;
        }
        let (stat, df) = chi_square(&counts, &probs, n);
        prop_assert!(stat < 40.0 + 2.0 * df as f64, "chi2 {stat} df {df}: {counts:?} vs {probs:?}");
    }
}

proptest! {
    #![proptest_config(cfg(96))]

    /// Top-k on rows long enough for the block-bound threshold (at least four blocks of 64 per
    /// kept token), with exact ties, masked tokens, and the top tokens of the blocks with the
    /// highest maxima lowered by logit biases or masked by an allow-list (which leaves the
    /// bounds above the blocks' maxima, so that the threshold's collection can fall short): the
    /// k best, ties by id, as the naive computation.
    #[test]
    fn top_k_on_long_rows(
        raw in (256usize..12_000).prop_flat_map(|v| prop_oneof![
            vec(logit(), v),
            // distinct values: a lowered maximum is its block's only token at the bound
            vec(-20.0f32..20.0, v),
        ]),
        k in 1i64..64,
        lowered in 0usize..80,
        down in 1.0f32..60.0,
        raised in btree_map(any::<u32>(), -100.0f32..=100.0, 0..4),
        by_allow_list in any::<bool>(),
    ) {
        let v = raw.len();
        // the biases: the maxima of the `lowered` blocks with the highest maxima lowered by
        // `down` (their bounds stay above them), a few tokens anywhere moved
        let mut tops: Vec<usize> = (0..v.div_ceil(64))
            .map(|b| {
                (b * 64..(b * 64 + 64).min(v))
                    .max_by(|&i, &j| raw[i].total_cmp(&raw[j]).then(j.cmp(&i)))
                    .unwrap_or(b * 64)
            })
            .collect();
        tops.sort_by(|&i, &j| raw[j].total_cmp(&raw[i]).then(i.cmp(&j)));
        let mut bias: BTreeMap<u32, f32> = BTreeMap::new();
        for &top in tops.iter().take(lowered) {
            bias.insert(top as u32, -down);
        }
        for (&id, &b) in &raised {
            bias.insert(id % v as u32, b);
        }
        // or the same tokens masked by an allow-list of all the others (masked in place, the
        // support still dense: the bounds stay above the blocks' new maxima)
        let allowed: Option<Vec<u32>> = by_allow_list.then(|| {
            (0..v as u32).filter(|id| !bias.get(id).is_some_and(|&b| b < 0.0)).collect()
        });
        let mut procs = Vec::new();
        match &allowed {
            Some(token_ids) => procs.push(P::AllowedTokenIds(AllowedTokenIds {
                version: 1,
                token_ids: token_ids.clone(),
            })),
            None => procs.push(P::LogitBias(LogitBias { version: 1, logit_bias: bias.clone() })),
        }
        procs.push(P::TopK(TopK { version: 1, top_k: k, ties: top_k::Ties::ById }));
        let s = Sampler::new(
            PipelineConfig::new(procs, Selector::Greedy),
            VocabInfo::plain(v),
            StopConfig::default(),
        )
        .unwrap();
        let mut z = raw.clone();
        for (&id, &b) in &bias {
            let x = &mut z[id as usize];
            if allowed.is_some() {
                if b < 0.0 {
                    *x = NEG_INF;
                }
            } else if *x > NEG_INF {
                *x += b;
                if *x == f32::INFINITY {
                    *x = f32::MAX;
                }
            }
        }
        let Some(rec) = support_of(&s, &raw) else { return Ok(()) };
        let finite = z.iter().filter(|x| **x > NEG_INF).count();
        let want: BTreeSet<u32> = naive_top_k(&z, (k as usize).min(finite), top_k::Ties::ById)
            .into_iter()
            .collect();
        prop_assert_eq!(ids(&rec), want);
    }
}
