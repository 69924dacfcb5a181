//! Request sampling parameters under the names vLLM and the OpenAI API use.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
    /// A structured-output constraint (`{"choice": [..]}`, `{"regex": ".."}`,
    /// `{"json_schema": {..}}`, `{"json": true}`, `{"grammar": ".."}`, `{"gbnf": ".."}`),
    /// compiled at the edge by the constraint engine; its presence puts the grammar mask into the
    /// pipeline.
    #[serde(default)]
    pub constraint: Option<serde_json::Value>,
    /// What happens once the constraint accepts (default `only_end`).
    #[serde(default)]
    pub grammar_policy: Option<super::GrammarPolicy>,
}

impl SamplingParams {
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
