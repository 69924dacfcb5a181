//! Request sampling parameters under the names vLLM and the OpenAI API use.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::constraint::spec::ConstraintSpec;

/// Sampling parameters of one request. Unknown fields are rejected by name.
///
/// Disabled values (what users of vLLM / OpenAI expect): `top_k <= 0`, `top_p = 1`,
/// `min_p = 0`, `typical_p = 1`, `presence_penalty = frequency_penalty = 0`,
/// `repetition_penalty = 1`. `temperature = 0` selects greedily.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SamplingParams {
    /// Temperature `>= 0` (`0` = greedy).
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Top-k; `<= 0` disables.
    #[serde(default)]
    pub top_k: Option<i64>,
    /// Top-p in `(0, 1]`; `1` disables.
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Min-p in `[0, 1]`; `0` disables.
    #[serde(default)]
    pub min_p: Option<f64>,
    /// Typical-p in `(0, 1]`; `1` disables.
    #[serde(default)]
    pub typical_p: Option<f64>,
    /// Presence penalty in `[-2, 2]`.
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    /// Frequency penalty in `[-2, 2]`.
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    /// Repetition penalty `> 0`; `1` disables.
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    /// Token id → additive bias in `[-100, 100]`.
    #[serde(default)]
    pub logit_bias: BTreeMap<u32, f32>,
    /// EOS/stop tokens are hidden until this many output tokens exist.
    #[serde(default)]
    pub min_tokens: Option<u64>,
    /// Output token limit.
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Extra stop token ids.
    #[serde(default)]
    pub stop_token_ids: Vec<u32>,
    /// The request's random-stream seed (default 0): the one place a seed is given. It is not
    /// part of the pipeline (nor of its hash); sequence `i` of the request draws from
    /// [`sequence_seed(i)`](Self::sequence_seed), the value its decoder state is created with.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Only these ids may be selected (vLLM `allowed_token_ids`).
    #[serde(default)]
    pub allowed_token_ids: Option<Vec<u32>>,
    /// Token sequences that must not be completed (HF `bad_words_ids`).
    #[serde(default)]
    pub bad_words_ids: Vec<Vec<u32>>,
    /// HF `no_repeat_ngram_size`; `0` disables.
    #[serde(default)]
    pub no_repeat_ngram_size: Option<usize>,
    /// Window of the llama.cpp penalties (`penalty_last_n`); only the llama.cpp preset uses it.
    #[serde(default)]
    pub penalty_last_n: Option<usize>,
    /// Do not stop on EOS (vLLM `ignore_eos`).
    #[serde(default)]
    pub ignore_eos: bool,
    /// Stop strings (OpenAI `stop`: one string or a list).
    #[serde(default, deserialize_with = "one_or_many")]
    pub stop: Vec<String>,
    /// Keep a matched stop string in the output (vLLM `include_stop_str_in_output`).
    #[serde(default)]
    pub include_stop_str_in_output: bool,
    /// Hide special tokens' bytes from the text and from stop matching (default true).
    #[serde(default)]
    pub skip_special_tokens: Option<bool>,
    /// The request's structured-output constraint — the one place a request gives it
    /// (`{"type": "choice", "choices": [..]}`, `{"type": "regex", "pattern": ".."}`,
    /// `{"type": "json_schema", "schema": {..}}`, `{"type": "json"}`, `{"type": "grammar",
    /// "lark": ".."}`, `{"type": "gbnf", "gbnf": ".."}`). The constraint engine compiles it; its
    /// presence puts the grammar mask into a preset's pipeline, and an inline pipeline must have
    /// one.
    #[serde(default)]
    pub constraint: Option<ConstraintSpec>,
    /// What happens once the constraint accepts (default `only_end`).
    #[serde(default)]
    pub grammar_policy: Option<super::GrammarPolicy>,
}

/// Whether a request sets one parameter.
type IsSet = fn(&SamplingParams) -> bool;

/// The parameters a preset turns into processors, under their request names, with whether
/// `p` sets each: an inline pipeline carries its own processors, so a request with one may set
/// none of these ([`resolve`](super::resolve::resolve) refuses it naming the first).
const PIPELINE_FIELDS: [(&str, IsSet); 14] = [
    ("temperature", |p| p.temperature.is_some()),
    ("top_k", |p| p.top_k.is_some()),
    ("top_p", |p| p.top_p.is_some()),
    ("min_p", |p| p.min_p.is_some()),
    ("typical_p", |p| p.typical_p.is_some()),
    ("presence_penalty", |p| p.presence_penalty.is_some()),
    ("frequency_penalty", |p| p.frequency_penalty.is_some()),
    ("repetition_penalty", |p| p.repetition_penalty.is_some()),
    ("logit_bias", |p| !p.logit_bias.is_empty()),
    ("min_tokens", |p| p.min_tokens.is_some()),
    ("allowed_token_ids", |p| p.allowed_token_ids.is_some()),
    ("bad_words_ids", |p| !p.bad_words_ids.is_empty()),
    ("no_repeat_ngram_size", |p| p.no_repeat_ngram_size.is_some()),
    ("penalty_last_n", |p| p.penalty_last_n.is_some()),
];

impl SamplingParams {
    /// The names of every parameter a preset turns into processors (`temperature`, `top_p`,
    /// ...): what an inline pipeline excludes. Front ends map these names onto their own.
    pub fn pipeline_fields() -> impl Iterator<Item = &'static str> {
        PIPELINE_FIELDS.iter().map(|f| f.0)
    }

    /// The parameters this request sets that a preset would turn into processors (in
    /// [`pipeline_fields`](Self::pipeline_fields) order).
    pub fn pipeline_fields_set(&self) -> impl Iterator<Item = &'static str> + '_ {
        PIPELINE_FIELDS.iter().filter(|f| (f.1)(self)).map(|f| f.0)
    }

    /// The first of [`pipeline_fields_set`](Self::pipeline_fields_set), if any.
    pub fn first_pipeline_field(&self) -> Option<&'static str> {
        self.pipeline_fields_set().next()
    }

    /// The seed of sequence `i` of this request, `seed + i` (wrapping; a missing seed reads as
    /// 0): the value to give [`Sampler::new_state`](crate::Sampler::new_state) for that
    /// sequence, so that each of `n` sequences equals a single request with its seed.
    pub fn sequence_seed(&self, i: u64) -> u64 {
        self.seed.unwrap_or(0).wrapping_add(i)
    }
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match Option::<OneOrMany>::deserialize(d)? {
        None => Vec::new(),
        Some(OneOrMany::One(s)) => vec![s],
        Some(OneOrMany::Many(v)) => v,
    })
}

#[cfg(test)]
mod tests {
    use super::SamplingParams;

    /// Semantics §5: sequence `i` of a request draws from `seed + i` (wrapping); a request
    /// without a seed counts as seed 0.
    #[test]
    fn sequence_seeds_follow_the_request_seed() {
        let p = SamplingParams {
            seed: Some(7),
            ..Default::default()
        };
        assert_eq!(p.sequence_seed(0), 7);
        assert_eq!(p.sequence_seed(2), 9);
        let none = SamplingParams::default();
        assert_eq!(none.sequence_seed(0), 0);
        assert_eq!(none.sequence_seed(3), 3);
        let top = SamplingParams {
            seed: Some(u64::MAX),
            ..Default::default()
        };
        assert_eq!(top.sequence_seed(1), 0);
    }
}
