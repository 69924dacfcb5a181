//! Compiling a pipeline: validation, contradictions, stop conditions.

use std::sync::Arc;

use super::Sampler;
use crate::error::{Error, Result};
use crate::pipeline::params::SamplingParams;
use crate::pipeline::presets::{self, Preset};
use crate::pipeline::{PipelineConfig, StopConfig};
use crate::processors::{CompileCtx, Processor, ProcessorConfig};
use crate::stop::StopStrings;
use crate::vocab::{sorted_ids, TokenBytes, VocabInfo};

impl Sampler {
    /// Validates and compiles `config`. Contradictions (an empty allowed set, a min-length mask
    /// hiding every stop token while `min_tokens > max_tokens`, two temperatures) are rejected here,
    /// before any step runs.
    pub fn new(config: PipelineConfig, vocab: VocabInfo, stop: StopConfig) -> Result<Sampler> {
        Sampler::new_with_tokens(config, vocab, stop, None)
    }

    /// Like [`new`](Self::new), with the exact bytes of every token, which stop strings and
    /// streaming text need. `tokens` must have one entry per vocabulary id.
    pub fn new_with_tokens(
        config: PipelineConfig,
        vocab: VocabInfo,
        stop: StopConfig,
        tokens: Option<Arc<TokenBytes>>,
    ) -> Result<Sampler> {
        config.check_format()?;
        let vocab = vocab.validated()?;
        let stop_ids = sorted_ids("stop_token_ids", &stop.stop_token_ids, vocab.vocab_size)?;
        stop.check()?;
        let mut ctx = CompileCtx {
            vocab: &vocab,
            stop_ids: &stop_ids,
            next_slot: 0,
        };
        let mut processors = Vec::with_capacity(config.processors.len());
        let mut temps = 0;
        for (i, p) in config.processors.iter().enumerate() {
            if matches!(p, ProcessorConfig::Temperature(_)) {
                temps += 1;
                if temps > 1 {
                    return Err(Error::contradiction(
                        format!("processors[{i}]"),
                        "a pipeline may contain at most one temperature",
                    ));
                }
            }
            processors.push(p.compile(i, &mut ctx)?);
        }
        for p in &processors {
            if let Processor::MinTokens(m) = p {
                if let Some(max) = stop.max_tokens {
                    if m.min_tokens > max && !m.ids.is_empty() {
                        return Err(Error::contradiction(
                            "min_tokens",
                            format!(
                                "min_tokens ({}) exceeds max_tokens ({max}) while the min-length mask hides the stop tokens {:?}: they could never be selected",
                                m.min_tokens, m.ids
                            ),
                        ));
                    }
                }
            }
        }
        if let Some(t) = &tokens {
            if t.len() != vocab.vocab_size {
                return Err(Error::invalid(
                    "vocabulary",
                    format!(
                        "{} token byte strings for a vocabulary of {}",
                        t.len(),
                        vocab.vocab_size
                    ),
                ));
            }
        }
        let stop_strings = if stop.stop.is_empty() {
            None
        } else {
            if tokens.is_none() {
                return Err(Error::contradiction(
                    "stop",
                    "stop strings are matched on token bytes; this sampler has no vocabulary bytes",
                ));
            }
            Some(Arc::new(StopStrings::new(&stop.stop)?))
        };
        let mut special_stops = Vec::new();
        if let (Some(ss), Some(t)) = (&stop_strings, &tokens) {
            for &id in &vocab.special_token_ids {
                if let Some(b) = t.get(id) {
                    if let Some(k) = ss.patterns().iter().position(|p| p.as_slice() == b) {
                        special_stops.push((id, k));
                    }
                }
            }
        }
        let min_tokens = processors
            .iter()
            .filter_map(|p| match p {
                Processor::MinTokens(m) => Some(m.min_tokens),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let hash = config.hash();
        let selector = config.selector;
        Ok(Sampler {
            config,
            processors,
            selector,
            vocab,
            stop,
            stop_ids,
            hash,
            tokens,
            stop_strings,
            special_stops,
            min_tokens,
        })
    }

    /// Builds a preset pipeline from request parameters and compiles it. `params.seed` is not
    /// part of the pipeline: create each sequence's state with
    /// [`params.sequence_seed(i)`](SamplingParams::sequence_seed).
    pub fn from_params(
        preset: Preset,
        params: &SamplingParams,
        vocab: VocabInfo,
    ) -> Result<Sampler> {
        let (cfg, stop) = presets::build(preset, params)?;
        Sampler::new(cfg, vocab, stop)
    }
}
