//! One-step requests as data: the input of `nextok explain` and of the shared test vectors.
//!
//! ```json
//! {"logits": [2.0, 1.5, 0.5], "tokens": ["A", "B", "C"], "pipeline": "reference",
//!  "params": {"temperature": 0.8, "top_p": 0.8, "presence_penalty": 0.1, "frequency_penalty": 0.2},
//!  "prompt_ids": [], "selected_ids": [0, 0, 1], "selector": {"u": 0.63}}
//! ```
//!
//! `pipeline` is a preset name (`reference`, `hf`, `vllm`, `llama.cpp`) built from `params`, or
//! a full pipeline object; with a pipeline object, `params` may only carry the request-level
//! fields (`max_tokens`, `stop_token_ids`, `stop`, `ignore_eos`, `seed`, `constraint`, ...): the
//! request goes through the one resolver, [`crate::pipeline::resolve`]. Logits may be numbers or the
//! strings `"-inf"`, `"inf"`, `"nan"` (so bad input can be written down). `selector` is
//! `{"u": x}` (a fixed inverse-CDF position) or `{"seed": n}` (the request's random stream).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::pipeline::params::SamplingParams;
use crate::pipeline::resolve::{resolve, PipelineChoice, Request as ResolveRequest, Resolved};
use crate::pipeline::PipelineConfig;
use crate::record::StepRecord;
use crate::sampler::{Explanation, Sampler, TokenRow};
use crate::select::Draw;
use crate::state::DecoderState;
use crate::vocab::VocabInfo;

/// A preset name or a full pipeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum PipelineSpec {
    /// A preset name.
    Preset(String),
    /// A custom pipeline.
    Custom(PipelineConfig),
}

impl<'de> Deserialize<'de> for PipelineSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        match v {
            serde_json::Value::String(s) => Ok(PipelineSpec::Preset(s)),
            serde_json::Value::Object(_) => serde_path_to_error::deserialize(v)
                .map(PipelineSpec::Custom)
                .map_err(|e| serde::de::Error::custom(format!("at `{}`: {}", e.path(), e.inner()))),
            other => Err(serde::de::Error::custom(format!(
                "expected a preset name or a pipeline object, got {other}"
            ))),
        }
    }
}

impl Default for PipelineSpec {
    fn default() -> Self {
        PipelineSpec::Preset("reference".into())
    }
}

/// How the step draws its randomness.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelectorInput {
    /// A fixed `u ∈ [0, 1)`.
    #[serde(default)]
    pub u: Option<f64>,
    /// The random-stream seed.
    #[serde(default)]
    pub seed: Option<u64>,
}

/// A one-step request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepRequest {
    /// Raw logits, one per token.
    #[serde(with = "logit_list")]
    pub logits: Vec<f32>,
    /// Optional display names, one per token.
    #[serde(default)]
    pub tokens: Option<Vec<String>>,
    /// Preset name or pipeline object (default `reference`).
    #[serde(default)]
    pub pipeline: PipelineSpec,
    /// Sampling parameters.
    #[serde(default)]
    pub params: SamplingParams,
    /// Prompt ids.
    #[serde(default)]
    pub prompt_ids: Vec<u32>,
    /// Already selected ids.
    #[serde(default)]
    pub selected_ids: Vec<u32>,
    /// Fixed `u` or seed.
    #[serde(default)]
    pub selector: Option<SelectorInput>,
    /// EOS ids of the vocabulary.
    #[serde(default)]
    pub eos_token_ids: Vec<u32>,
    /// Special/control ids of the vocabulary.
    #[serde(default)]
    pub special_token_ids: Vec<u32>,
}

/// What `explain --json` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExplainOutput {
    /// Selected token id.
    pub selected: u32,
    /// Selected token name, when names were given.
    pub selected_token: Option<String>,
    /// Final support, ids ascending.
    pub support: Vec<u32>,
    /// Pipeline hash.
    pub pipeline_hash: String,
    /// The pipeline that ran.
    pub pipeline: PipelineConfig,
    /// The categorical `u`, when used.
    pub u: Option<f64>,
    /// One row per token.
    pub tokens: Vec<NamedRow>,
    /// The step record.
    pub record: StepRecord,
}

/// A ledger row with the token's name.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NamedRow {
    /// Display name (the id when no names were given).
    pub token: String,
    /// The values.
    #[serde(flatten)]
    pub row: TokenRow,
}

impl StepRequest {
    /// Parses a request; errors name the failing field.
    pub fn from_json(s: &str) -> Result<StepRequest> {
        crate::error::parse_json(s, "request")
    }

    /// Compiles the sampler and builds the state and draw this request describes.
    pub fn build(&self) -> Result<(Sampler, DecoderState, Draw)> {
        let v = self.logits.len();
        if v == 0 {
            return Err(Error::invalid("logits", "must contain at least one value"));
        }
        if let Some(t) = &self.tokens {
            if t.len() != v {
                return Err(Error::invalid(
                    "tokens",
                    format!("has {} names for {} logits", t.len(), v),
                ));
            }
        }
        let vocab = VocabInfo {
            vocab_size: v,
            eos_token_ids: self.eos_token_ids.clone(),
            special_token_ids: self.special_token_ids.clone(),
        };
        let choice = match &self.pipeline {
            PipelineSpec::Preset(name) => PipelineChoice::Preset(name.parse()?),
            PipelineSpec::Custom(cfg) => PipelineChoice::Config(cfg.clone()),
        };
        let Resolved {
            pipeline: cfg,
            stop,
        } = resolve(&ResolveRequest::new(&self.params, &choice))?;
        let sampler = Sampler::new(cfg, vocab, stop)?;
        let (draw, seed) = match self.selector {
            Some(SelectorInput {
                u: Some(_),
                seed: Some(_),
            }) => {
                return Err(Error::contradiction(
                    "selector",
                    "give either `u` or `seed`, not both",
                ))
            }
            Some(SelectorInput { u: Some(u), .. }) => {
                if !(0.0..1.0).contains(&u) {
                    return Err(Error::invalid(
                        "selector.u",
                        format!("{u} is outside [0, 1)"),
                    ));
                }
                (Draw::FixedU(u), self.params.sequence_seed(0))
            }
            Some(SelectorInput { seed: Some(s), .. }) => {
                if self.params.seed.is_some_and(|p| p != s) {
                    return Err(Error::contradiction(
                        "selector.seed",
                        "differs from params.seed",
                    ));
                }
                (Draw::Stream, s)
            }
            _ => (Draw::Stream, self.params.sequence_seed(0)),
        };
        // the history goes through the §3.10 transition, terminal checks included: a token after
        // the one that finished the sequence is an error naming it, and a history that has
        // finished (EOS, a stop token or string, `max_tokens`) leaves a finished state, whose step
        // fails with `already_finished`
        let mut state = sampler.state_with_history(&self.prompt_ids, &[], seed)?;
        for (i, &t) in self.selected_ids.iter().enumerate() {
            if state.is_finished() {
                return Err(Error::contradiction(
                    format!("selected_ids[{i}]"),
                    "the sequence had already finished before this token",
                ));
            }
            sampler.commit(&mut state, t).map_err(|e| match e.kind() {
                crate::ErrorKind::TokenOutOfRange {
                    token, vocab_size, ..
                } => Error::out_of_range(format!("selected_ids[{i}]"), *token, *vocab_size),
                _ => e,
            })?;
        }
        Ok((sampler, state, draw))
    }

    /// Runs the step and returns the full explanation.
    pub fn explain(&self) -> Result<(Sampler, Explanation)> {
        let (sampler, state, draw) = self.build()?;
        let ex = sampler.explain(&self.logits, &state, draw)?;
        Ok((sampler, ex))
    }

    /// The display name of token `id`.
    pub fn name(&self, id: u32) -> String {
        match &self.tokens {
            Some(t) => t
                .get(id as usize)
                .cloned()
                .unwrap_or_else(|| id.to_string()),
            None => id.to_string(),
        }
    }

    /// Runs the step and returns what `explain --json` prints.
    pub fn explain_output(&self) -> Result<ExplainOutput> {
        self.explain_output_with(|_, _| Ok(()))
    }

    /// Like [`explain_output`](Self::explain_output), letting the caller prepare the state
    /// first — e.g. attach a constraint engine advanced over `selected_ids`.
    pub fn explain_output_with(
        &self,
        prepare: impl FnOnce(&Sampler, &mut DecoderState) -> Result<()>,
    ) -> Result<ExplainOutput> {
        let (sampler, mut state, draw) = self.build()?;
        prepare(&sampler, &mut state)?;
        let ex = sampler.explain(&self.logits, &state, draw)?;
        let mut support: Vec<u32> = ex.tokens.iter().filter(|r| r.kept).map(|r| r.id).collect();
        support.sort_unstable();
        let selected = ex.record.selected;
        Ok(ExplainOutput {
            selected,
            selected_token: self.tokens.as_ref().map(|_| self.name(selected)),
            support,
            pipeline_hash: sampler.pipeline_hash().to_string(),
            pipeline: sampler.config().clone(),
            u: ex.record.rng.u,
            tokens: ex
                .tokens
                .iter()
                .map(|r| NamedRow {
                    token: self.name(r.id),
                    row: r.clone(),
                })
                .collect(),
            record: ex.record,
        })
    }
}

/// Logits as JSON: numbers, or the strings `"-inf"`, `"inf"`, `"nan"`. A number outside the
/// `f32` range (e.g. `1e39`) is refused rather than rounded to an infinity: `+1e39` would
/// become a rejected `+inf` and `-1e39` a silent mask.
mod logit_list {
    use std::fmt;

    use serde::de::{self, SeqAccess, Visitor};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize)]
    #[serde(untagged)]
    enum L {
        N(f32),
        S(&'static str),
    }

    pub fn serialize<S: Serializer>(v: &[f32], s: S) -> Result<S::Ok, S::Error> {
        let items: Vec<L> = v
            .iter()
            .map(|&x| {
                if x.is_finite() {
                    L::N(x)
                } else if x.is_nan() {
                    L::S("nan")
                } else if x > 0.0 {
                    L::S("inf")
                } else {
                    L::S("-inf")
                }
            })
            .collect();
        items.serialize(s)
    }

    /// One logit.
    struct Logit(f32);

    impl<'de> Deserialize<'de> for Logit {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Logit;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a number in the f32 range or one of \"-inf\", \"inf\", \"nan\"")
                }
                fn visit_f64<E: de::Error>(self, x: f64) -> Result<Logit, E> {
                    let y = x as f32;
                    if y.is_finite() {
                        Ok(Logit(y))
                    } else {
                        Err(E::custom(format!(
                            "{x:e} is outside the f32 range (magnitude at most {:e}); write \"-inf\" to mask a token",
                            f32::MAX
                        )))
                    }
                }
                fn visit_i64<E: de::Error>(self, x: i64) -> Result<Logit, E> {
                    Ok(Logit(x as f32))
                }
                fn visit_u64<E: de::Error>(self, x: u64) -> Result<Logit, E> {
                    Ok(Logit(x as f32))
                }
                fn visit_str<E: de::Error>(self, s: &str) -> Result<Logit, E> {
                    match s {
                        "-inf" => Ok(Logit(f32::NEG_INFINITY)),
                        "inf" | "+inf" => Ok(Logit(f32::INFINITY)),
                        "nan" | "NaN" => Ok(Logit(f32::NAN)),
                        _ => Err(E::invalid_value(de::Unexpected::Str(s), &self)),
                    }
                }
            }
            d.deserialize_any(V)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f32>, D::Error> {
        struct Seq;
        impl<'de> Visitor<'de> for Seq {
            type Value = Vec<f32>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of logits")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Vec<f32>, A::Error> {
                // no size hint is trusted for the allocation beyond what the input holds
                let mut v = Vec::new();
                while let Some(Logit(x)) = a.next_element()? {
                    v.push(x);
                }
                Ok(v)
            }
        }
        d.deserialize_seq(Seq)
    }
}
