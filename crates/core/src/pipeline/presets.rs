//! Presets: the reference order of 000 §3.3 and the orders HF transformers, vLLM and llama.cpp
//! use, built from [`SamplingParams`]. Disabled parameters leave their processor out, so the
//! pipeline (and its hash) lists only what acts.
//!
//! | preset | order |
//! |---|---|
//! | `reference` | special mask → min_tokens → allowed ids → banned sequences → no-repeat n-gram → logit bias → repetition → presence/frequency → temperature → top-k → top-p → min-p → typical-p → categorical |
//! | `hf` | logit bias → repetition (prompt+output) → no-repeat n-gram → banned sequences → min_tokens → allowed ids → presence/frequency → temperature → top-k (ties kept; default 50) → top-p (ascending tail) → min-p → typical-p (ties kept) → categorical |
//! | `vllm` | allowed ids → banned sequences (output only) → min_tokens → logit bias → repetition (prompt+output) → presence/frequency (output) → temperature (0 < T < 0.01 raised to 0.01) → min-p → top-k (ties kept) → top-p (ascending tail) → Gumbel-max (exponential race) |
//! | `llama.cpp` | logit bias → penalties over the last `penalty_last_n` (64) tokens → top-k (40) → typical-p → top-p (0.95) → min-p (0.05) → temperature (0.8) → categorical |
//!
//! Parameters an engine lacks (no-repeat n-gram in vLLM and llama.cpp, presence/frequency in HF,
//! allowed ids in HF and llama.cpp) are still honoured, next to the engine's nearest step, never
//! silently dropped.
//!
//! Only the reference order masks the vocabulary's special tokens (step 1); the engines do not
//! by default, so their presets don't either.
//!
//! `temperature = 0` is greedy in every preset: reference and llama.cpp keep the argmax at the
//! temperature's position (a `temperature: 0` processor) and select greedily; HF and vLLM drop the
//! warpers/truncations and select greedily over the processed logits (HF `do_sample=False`,
//! vLLM's greedy rows).

use std::str::FromStr;

use super::params::SamplingParams;
use super::{PipelineConfig, StopConfig};
use crate::error::{Error, Result};
use crate::processors::{
    allowed_ids::AllowedTokenIds, banned_sequences::BannedSequences, grammar_mask::GrammarMask,
    logit_bias::LogitBias, min_p::MinP, min_tokens::MinTokens, no_repeat_ngram::NoRepeatNgram,
    presence_frequency::PresenceFrequencyPenalty, repetition::RepetitionPenalty,
    special_mask::SpecialTokenMask, temperature::Temperature, top_k, top_k::TopK, top_p,
    top_p::TopP, typical_p::TypicalP, PenaltyScope, ProcessorConfig as P,
};
use crate::select::Selector;

/// A named processor order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// The 10-step order of 000 §3.3.
    Reference,
    /// Hugging Face transformers `generate`.
    Hf,
    /// vLLM (v1 sampler, PyTorch path).
    Vllm,
    /// llama.cpp's default sampler chain.
    LlamaCpp,
}

impl FromStr for Preset {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "reference" => Ok(Preset::Reference),
            "hf" | "transformers" => Ok(Preset::Hf),
            "vllm" => Ok(Preset::Vllm),
            "llama.cpp" | "llamacpp" | "llama_cpp" => Ok(Preset::LlamaCpp),
            other => Err(Error::invalid(
                "pipeline",
                format!("unknown preset `{other}` (expected reference, hf, vllm or llama.cpp)"),
            )),
        }
    }
}

impl Preset {
    /// All presets.
    pub const ALL: [Preset; 4] = [
        Preset::Reference,
        Preset::Hf,
        Preset::Vllm,
        Preset::LlamaCpp,
    ];

    /// The preset's name.
    pub fn name(&self) -> &'static str {
        match self {
            Preset::Reference => "reference",
            Preset::Hf => "hf",
            Preset::Vllm => "vllm",
            Preset::LlamaCpp => "llama.cpp",
        }
    }
}

struct Checked {
    temperature: f32,
    top_k: Option<i64>,
    top_p: Option<f64>,
    min_p: Option<f64>,
    typical_p: Option<f64>,
    presence: f32,
    frequency: f32,
    repetition: f32,
}

/// A range rule of a processor, applied to the parameter `name` it is built from.
fn rule<T: Copy>(
    name: &str,
    v: Option<T>,
    check: fn(T) -> std::result::Result<(), String>,
) -> Result<()> {
    match v {
        Some(x) => check(x).map_err(|reason| Error::invalid(name, reason)),
        None => Ok(()),
    }
}

/// The parameters with the preset's defaults, each checked by the range rule of the processor
/// it becomes (written once, in that processor's module); a value that disables its processor
/// (`top_p = 1`, `min_p = 0`, `typical_p = 1`, `top_k <= 0`) is accepted and leaves it out.
fn check(p: &SamplingParams, preset: Preset) -> Result<Checked> {
    use crate::processors::{
        logit_bias, min_p, no_repeat_ngram, presence_frequency, repetition, temperature, typical_p,
    };
    let (dt, dk, dp, dm) = match preset {
        Preset::Hf => (1.0, Some(50), None, None),
        Preset::LlamaCpp => (0.8, Some(40), Some(0.95), Some(0.05)),
        _ => (1.0, None, None, None),
    };
    let temperature = p.temperature.unwrap_or(dt);
    rule("temperature", Some(temperature), temperature::check)?;
    let top_k = p.top_k.or(dk).filter(|&k| k > 0);
    let top_p = p.top_p.or(dp);
    rule("top_p", top_p, top_p::check)?;
    let min_p = p.min_p.or(dm).filter(|&x| x != 0.0);
    rule("min_p", min_p, min_p::check)?;
    rule("typical_p", p.typical_p, typical_p::check)?;
    let presence = p.presence_penalty.unwrap_or(0.0);
    let frequency = p.frequency_penalty.unwrap_or(0.0);
    rule(
        "presence_penalty",
        Some(presence),
        presence_frequency::check,
    )?;
    rule(
        "frequency_penalty",
        Some(frequency),
        presence_frequency::check,
    )?;
    let repetition = p.repetition_penalty.unwrap_or(1.0);
    rule(
        "no_repeat_ngram_size",
        p.no_repeat_ngram_size.filter(|&n| n > 0),
        no_repeat_ngram::check,
    )?;
    rule("repetition_penalty", Some(repetition), repetition::check)?;
    for (&id, &b) in &p.logit_bias {
        rule(&format!("logit_bias[{id}]"), Some(b), logit_bias::check)?;
    }
    Ok(Checked {
        temperature,
        top_k,
        top_p: top_p.filter(|&x| x < 1.0),
        min_p,
        typical_p: p.typical_p.filter(|&x| x < 1.0),
        presence,
        frequency,
        repetition,
    })
}

/// Builds the pipeline and stop config of `preset` for `params`, checking each parameter's
/// range. The request's other rules (`max_tokens`, `n`, the stop strings, the constraint) are
/// [`resolve`](super::resolve::resolve)'s, which calls this.
pub fn build(preset: Preset, params: &SamplingParams) -> Result<(PipelineConfig, StopConfig)> {
    let c = check(params, preset)?;
    let greedy = c.temperature == 0.0;
    let mut v: Vec<P> = Vec::new();
    let stop = StopConfig::from_params(params);
    let special = || {
        P::SpecialTokenMask(SpecialTokenMask {
            version: 1,
            token_ids: Vec::new(),
        })
    };
    let grammar = params
        .constraint
        .as_ref()
        .map(|_| P::GrammarMask(GrammarMask { version: 1 }));
    let min_tokens = params.min_tokens.filter(|&n| n > 0).map(|n| {
        P::MinTokens(MinTokens {
            version: 1,
            min_tokens: n,
        })
    });
    let allowed = params.allowed_token_ids.as_ref().map(|ids| {
        P::AllowedTokenIds(AllowedTokenIds {
            version: 1,
            token_ids: ids.clone(),
        })
    });
    let banned = |include_prompt: bool| {
        (!params.bad_words_ids.is_empty()).then(|| {
            P::BannedSequences(BannedSequences {
                version: 1,
                sequences: params.bad_words_ids.clone(),
                include_prompt,
            })
        })
    };
    let ngram = params.no_repeat_ngram_size.filter(|&n| n > 0).map(|n| {
        P::NoRepeatNgram(NoRepeatNgram {
            version: 1,
            ngram_size: n,
        })
    });
    let bias = (!params.logit_bias.is_empty()).then(|| {
        P::LogitBias(LogitBias {
            version: 1,
            logit_bias: params.logit_bias.clone(),
        })
    });
    let rep = |scope: PenaltyScope| {
        (c.repetition != 1.0).then_some({
            P::RepetitionPenalty(RepetitionPenalty {
                version: 1,
                repetition_penalty: c.repetition,
                scope,
                exclude_special: true,
            })
        })
    };
    let presfreq = |scope: PenaltyScope| {
        (c.presence != 0.0 || c.frequency != 0.0).then_some({
            P::PresenceFrequencyPenalty(PresenceFrequencyPenalty {
                version: 1,
                presence_penalty: c.presence,
                frequency_penalty: c.frequency,
                scope,
                exclude_special: true,
            })
        })
    };
    let temp = |t: f32| {
        (t != 1.0).then_some({
            P::Temperature(Temperature {
                version: 1,
                temperature: t,
            })
        })
    };
    let topk = |ties: top_k::Ties| {
        c.top_k.map(|k| {
            P::TopK(TopK {
                version: 1,
                top_k: k,
                ties,
            })
        })
    };
    let topp = |rule: top_p::Rule| {
        c.top_p.map(|p| {
            P::TopP(TopP {
                version: 1,
                top_p: p,
                min_keep: 1,
                rule,
            })
        })
    };
    let minp = || {
        c.min_p.map(|a| {
            P::MinP(MinP {
                version: 1,
                min_p: a,
                min_keep: 1,
            })
        })
    };
    let typical = |keep_ties: bool| {
        c.typical_p.map(|t| {
            P::TypicalP(TypicalP {
                version: 1,
                typical_p: t,
                min_keep: 1,
                keep_ties,
            })
        })
    };

    let mut selector = Selector::Categorical;
    match preset {
        Preset::Reference => {
            v.push(special());
            v.extend(min_tokens);
            v.extend(grammar);
            v.extend(allowed);
            v.extend(banned(true));
            v.extend(ngram);
            v.extend(bias);
            v.extend(rep(PenaltyScope::PromptAndOutput));
            v.extend(presfreq(PenaltyScope::Output));
            if greedy {
                v.extend(temp(0.0));
                selector = Selector::Greedy;
            } else {
                v.extend(temp(c.temperature));
                v.extend(topk(top_k::Ties::ById));
                v.extend(topp(top_p::Rule::DescendingPrefix));
                v.extend(minp());
                v.extend(typical(false));
            }
        }
        Preset::Hf => {
            v.extend(bias);
            v.extend(rep(PenaltyScope::PromptAndOutput));
            v.extend(ngram);
            v.extend(banned(true));
            v.extend(min_tokens);
            v.extend(grammar);
            v.extend(allowed);
            v.extend(presfreq(PenaltyScope::Output));
            if greedy {
                selector = Selector::Greedy;
            } else {
                v.extend(temp(c.temperature));
                v.extend(topk(top_k::Ties::KeepAll));
                v.extend(topp(top_p::Rule::AscendingTail));
                v.extend(minp());
                v.extend(typical(true));
            }
        }
        Preset::Vllm => {
            v.extend(grammar);
            v.extend(allowed);
            v.extend(banned(false));
            v.extend(ngram);
            v.extend(min_tokens);
            v.extend(bias);
            v.extend(rep(PenaltyScope::PromptAndOutput));
            v.extend(presfreq(PenaltyScope::Output));
            if greedy || c.temperature < 1e-5 {
                selector = Selector::Greedy;
            } else {
                v.extend(temp(c.temperature.max(0.01)));
                v.extend(minp());
                v.extend(topk(top_k::Ties::KeepAll));
                v.extend(topp(top_p::Rule::AscendingTail));
                v.extend(typical(false));
                selector = Selector::Gumbel;
            }
        }
        Preset::LlamaCpp => {
            let n = params.penalty_last_n.unwrap_or(64);
            v.extend(grammar);
            v.extend(allowed);
            v.extend(banned(true));
            v.extend(ngram);
            v.extend(min_tokens);
            v.extend(bias);
            if n > 0 {
                v.extend(rep(PenaltyScope::LastN { n }));
                v.extend(presfreq(PenaltyScope::LastN { n }));
            }
            v.extend(topk(top_k::Ties::ById));
            v.extend(typical(false));
            v.extend(topp(top_p::Rule::DescendingPrefix));
            v.extend(minp());
            if greedy {
                v.extend(temp(0.0));
                selector = Selector::Greedy;
            } else {
                v.extend(temp(c.temperature));
            }
        }
    }
    Ok((PipelineConfig::new(v, selector), stop))
}
