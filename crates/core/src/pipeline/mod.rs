//! Pipelines as data.
//!
//! A [`PipelineConfig`] is an ordered list of processor configs plus a selector, with a format
//! version. It serialises to JSON with `"type"` tags, and its [`hash`](PipelineConfig::hash) — the
//! SHA-256 of its canonical JSON (struct field order, maps sorted by key, shortest round-trip
//! floats) — names it in traces. [`presets`] builds the reference, HF, vLLM and llama.cpp orders
//! from request parameters ([`params::SamplingParams`], named as in vLLM and the OpenAI API).

pub mod params;
pub mod presets;
pub mod resolve;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::processors::ProcessorConfig;
use crate::select::Selector;

/// The pipeline format version this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

/// An ordered, versioned processor pipeline and its selector.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// Format version (must equal [`FORMAT_VERSION`]).
    pub format_version: u32,
    /// Processors in application order.
    pub processors: Vec<ProcessorConfig>,
    /// Selection rule.
    #[serde(default)]
    pub selector: Selector,
}

/// Request-level stop conditions (token level).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StopConfig {
    /// Extra token ids that end the sequence (OpenAI/vLLM `stop_token_ids`).
    #[serde(default)]
    pub stop_token_ids: Vec<u32>,
    /// Maximum number of output tokens (`None` = unlimited).
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Do not stop on the vocabulary's EOS ids (vLLM `ignore_eos`).
    #[serde(default)]
    pub ignore_eos: bool,
    /// Stop strings, matched on the output bytes across token boundaries.
    #[serde(default)]
    pub stop: Vec<String>,
    /// Keep the matched stop string in the output text (default: cut before it).
    #[serde(default)]
    pub include_stop_str_in_output: bool,
    /// Special tokens contribute no bytes to the output text or to stop matching (default true).
    #[serde(default = "yes")]
    pub skip_special_tokens: bool,
    /// What happens once an attached constraint accepts the output.
    #[serde(default)]
    pub grammar_policy: GrammarPolicy,
}

/// What happens once the constraint accepts the output (000 §3.10: acceptance is not stopping).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum GrammarPolicy {
    /// Finish (`grammar_accepted`) as soon as the output is a complete legal output.
    StopOnAccept,
    /// Keep masking: after acceptance only what the constraint still allows (e.g. trailing
    /// whitespace) or EOS may follow; finish when nothing but EOS may (default).
    #[default]
    OnlyEnd,
    /// Stop masking once accepted and continue with ordinary generation.
    Continue,
}

fn yes() -> bool {
    true
}

impl PipelineConfig {
    /// A pipeline with the given processors and selector at the current format version.
    pub fn new(processors: Vec<ProcessorConfig>, selector: Selector) -> Self {
        PipelineConfig {
            format_version: FORMAT_VERSION,
            processors,
            selector,
        }
    }

    /// Parses a pipeline from JSON; errors name the failing path.
    pub fn from_json(s: &str) -> Result<Self> {
        let p: PipelineConfig = crate::error::parse_json(s, "pipeline")?;
        p.check_format()?;
        Ok(p)
    }

    pub(crate) fn check_format(&self) -> Result<()> {
        if self.format_version != FORMAT_VERSION {
            return Err(Error::invalid(
                "format_version",
                format!(
                    "{} is not supported (this build reads {FORMAT_VERSION})",
                    self.format_version
                ),
            ));
        }
        Ok(())
    }

    /// Canonical JSON (what the hash covers).
    pub fn canonical_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// `sha256:` + hex SHA-256 of the canonical JSON.
    pub fn hash(&self) -> String {
        let d = Sha256::digest(self.canonical_json().as_bytes());
        let mut s = String::with_capacity(7 + 64);
        s.push_str("sha256:");
        for b in d {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }
}

impl StopConfig {
    /// The rules of stop conditions, in one place: `max_tokens >= 1` and the stop strings'
    /// ([`crate::stop::check`]). The resolver checks a request's, and compiling a sampler
    /// checks the ones it is given.
    pub fn check(&self) -> Result<()> {
        if self.max_tokens == Some(0) {
            return Err(Error::invalid("max_tokens", "must be at least 1"));
        }
        crate::stop::check(&self.stop)
    }

    /// The stop conditions a request's parameters set: the one place they are read from
    /// [`SamplingParams`](params::SamplingParams).
    pub fn from_params(p: &params::SamplingParams) -> StopConfig {
        StopConfig {
            stop_token_ids: p.stop_token_ids.clone(),
            max_tokens: p.max_tokens,
            ignore_eos: p.ignore_eos,
            stop: p.stop.clone(),
            include_stop_str_in_output: p.include_stop_str_in_output,
            skip_special_tokens: p.skip_special_tokens.unwrap_or(true),
            grammar_policy: p.grammar_policy.unwrap_or_default(),
        }
    }
}

impl Default for StopConfig {
    fn default() -> Self {
        StopConfig {
            stop_token_ids: Vec::new(),
            max_tokens: None,
            ignore_eos: false,
            stop: Vec::new(),
            include_stop_str_in_output: false,
            skip_special_tokens: true,
            grammar_policy: GrammarPolicy::OnlyEnd,
        }
    }
}
