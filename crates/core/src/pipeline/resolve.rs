//! One resolver from a request to what runs, as vLLM's `SamplingParams._verify_args` is one
//! place for its rules: every front end (the HTTP server, the CLI, the Python package, `explain`)
//! and the engine call [`resolve`], which owns every rule about a request's decoding side once:
//!
//! - `n >= 1`, `top_logprobs <= 20` ([`MAX_TOP_LOGPROBS`]);
//! - the stop conditions' rules, `max_tokens >= 1` and the stop strings'
//!   ([`StopConfig::check`], which compiling a sampler applies too);
//! - each sampling parameter's range (a preset reads the parameters; each range is the rule of
//!   the processor the parameter becomes, written once in that processor's module);
//! - an inline pipeline carries its own processors: a request with one sets none of
//!   [`SamplingParams::pipeline_fields`];
//! - the constraint is declared once ([`SamplingParams::constraint`]) and the pipeline has a
//!   grammar mask exactly when the request has a constraint.
//!
//! Errors name the resolver's fields (`top_p`, `max_tokens`, `n`, `top_logprobs`, `stop[1]`,
//! `pipeline`, ...). A front end maps these names onto its own (the server's `top_p` is `top_p`,
//! the CLI's is `--top-p`) and nothing else: it never checks a range or a conflict itself.
//!
//! What depends on the model (the context's room, the engine's limits) is the engine's to
//! check, after this.

use super::params::SamplingParams;
use super::presets::{self, Preset};
use super::{PipelineConfig, StopConfig};
use crate::error::{Error, Result};
use crate::processors::ProcessorConfig;

/// The most candidates a request may ask logprobs for besides the selected token (OpenAI's
/// `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Where a request's processors come from.
#[derive(Debug, Clone, PartialEq)]
pub enum PipelineChoice {
    /// A preset, built from the request's sampling parameters.
    Preset(Preset),
    /// A pipeline given as data (inline): it carries its own processors, so the request may set
    /// none of the sampling parameters a preset reads; the stop conditions come from the
    /// request's parameters.
    Config(PipelineConfig),
    /// A pipeline and stop conditions exactly as recorded (replay).
    Exact {
        /// The pipeline.
        pipeline: PipelineConfig,
        /// The stop conditions.
        stop: StopConfig,
    },
}

impl Default for PipelineChoice {
    fn default() -> Self {
        PipelineChoice::Preset(Preset::Reference)
    }
}

/// A request's decoding side, under the resolver's field names.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The sampling parameters (vLLM / OpenAI names), the constraint among them.
    pub params: &'a SamplingParams,
    /// Where the processors come from.
    pub pipeline: &'a PipelineChoice,
    /// Number of sequences.
    pub n: usize,
    /// Logprob candidates asked for per token, if any.
    pub top_logprobs: Option<usize>,
}

impl<'a> Request<'a> {
    /// One sequence, no logprobs.
    pub fn new(params: &'a SamplingParams, pipeline: &'a PipelineChoice) -> Request<'a> {
        Request {
            params,
            pipeline,
            n: 1,
            top_logprobs: None,
        }
    }
}

/// What a request runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The pipeline.
    pub pipeline: PipelineConfig,
    /// The stop conditions.
    pub stop: StopConfig,
}

/// Checks `req` against every rule and returns the pipeline and stop conditions it runs. The
/// first rule broken is the error, naming its field.
pub fn resolve(req: &Request<'_>) -> Result<Resolved> {
    let p = req.params;
    if req.n == 0 {
        return Err(Error::invalid("n", "must be at least 1"));
    }
    if let Some(t) = req.top_logprobs {
        if t > MAX_TOP_LOGPROBS {
            return Err(Error::invalid(
                "top_logprobs",
                format!("{t} is above the limit of {MAX_TOP_LOGPROBS}"),
            ));
        }
    }
    StopConfig::from_params(p).check()?;
    let (pipeline, stop) = match req.pipeline {
        PipelineChoice::Preset(preset) => presets::build(*preset, p)?,
        PipelineChoice::Config(cfg) => {
            if let Some(field) = p.first_pipeline_field() {
                let set: Vec<String> = p.pipeline_fields_set().map(|f| format!("`{f}`")).collect();
                return Err(Error::contradiction(
                    field,
                    format!(
                        "an inline pipeline carries its own sampling parameters; give {} in the pipeline",
                        set.join(", ")
                    ),
                ));
            }
            cfg.check_format()?;
            (cfg.clone(), StopConfig::from_params(p))
        }
        PipelineChoice::Exact { pipeline, stop } => {
            pipeline.check_format()?;
            (pipeline.clone(), stop.clone())
        }
    };
    // the constraint is declared once: a pipeline has a grammar mask exactly when the request
    // has a constraint (never a constraint silently ignored, nor a mask with nothing to mask)
    let has_mask = pipeline
        .processors
        .iter()
        .any(|q| matches!(q, ProcessorConfig::GrammarMask(_)));
    match (p.constraint.is_some(), has_mask) {
        (true, false) => Err(Error::contradiction(
            "pipeline",
            "the request has a constraint but the pipeline has no grammar_mask processor",
        )),
        (false, true) => Err(Error::contradiction(
            "pipeline",
            "the pipeline has a grammar_mask processor but the request no constraint",
        )),
        _ => Ok(Resolved { pipeline, stop }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::constraint::spec::ConstraintSpec;
    use crate::ErrorKind;

    fn field(e: &Error) -> String {
        e.field().unwrap_or_default().to_string()
    }

    fn fails(
        params: SamplingParams,
        pipeline: PipelineChoice,
        n: usize,
        top: Option<usize>,
    ) -> Error {
        let req = Request {
            params: &params,
            pipeline: &pipeline,
            n,
            top_logprobs: top,
        };
        resolve(&req).expect_err("the request breaks a rule")
    }

    fn inline() -> PipelineChoice {
        PipelineChoice::Config(PipelineConfig::new(Vec::new(), Default::default()))
    }

    /// Each rule names its field; the request-shape rules come first.
    #[test]
    fn every_rule_names_its_field() {
        let d = SamplingParams::default;
        let reference = PipelineChoice::default;
        assert_eq!(field(&fails(d(), reference(), 0, None)), "n");
        assert_eq!(field(&fails(d(), reference(), 1, Some(21))), "top_logprobs");
        let e = fails(
            SamplingParams {
                max_tokens: Some(0),
                ..d()
            },
            reference(),
            0,
            None,
        );
        assert_eq!(field(&e), "n", "n is checked first");
        let zero = SamplingParams {
            max_tokens: Some(0),
            ..d()
        };
        assert_eq!(field(&fails(zero, reference(), 1, None)), "max_tokens");
        let empty = SamplingParams {
            stop: vec!["a".into(), String::new()],
            ..d()
        };
        assert_eq!(field(&fails(empty, reference(), 1, None)), "stop[1]");
        // each range rule, in every preset (NaN as JSON is refused, so the ranges' other ends)
        for (body, name) in [
            (serde_json::json!({"top_p": 1.5}), "top_p"),
            (serde_json::json!({"min_p": -0.1}), "min_p"),
            (serde_json::json!({"typical_p": 0.0}), "typical_p"),
            (serde_json::json!({"temperature": -1.0}), "temperature"),
            (
                serde_json::json!({"presence_penalty": 3.0}),
                "presence_penalty",
            ),
            (
                serde_json::json!({"frequency_penalty": -2.5}),
                "frequency_penalty",
            ),
            (
                serde_json::json!({"repetition_penalty": 0.0}),
                "repetition_penalty",
            ),
            (
                serde_json::json!({"no_repeat_ngram_size": 1 << 20}),
                "no_repeat_ngram_size",
            ),
            (
                serde_json::json!({"logit_bias": {"3": 101.0}}),
                "logit_bias[3]",
            ),
        ] {
            let params: SamplingParams = serde_json::from_value(body).unwrap();
            for preset in Preset::ALL {
                let e = fails(params.clone(), PipelineChoice::Preset(preset), 1, None);
                assert_eq!(field(&e), name, "{preset:?}: {e}");
                assert!(
                    matches!(e.kind(), ErrorKind::InvalidParameter { .. }),
                    "{e}"
                );
            }
        }
    }

    /// An inline pipeline refuses every parameter a preset would read, naming it; the
    /// request-level ones (stop conditions, seed, constraint) are its own.
    #[test]
    fn an_inline_pipeline_refuses_each_sampling_parameter() {
        let p = SamplingParams {
            max_tokens: Some(3),
            stop: vec!["x".into()],
            seed: Some(1),
            ignore_eos: true,
            ..Default::default()
        };
        let r = resolve(&Request::new(&p, &inline())).unwrap();
        assert_eq!(r.stop, StopConfig::from_params(&p));
        let full: SamplingParams = serde_json::from_value(serde_json::json!({
            "temperature": 0.5, "top_k": 3, "top_p": 0.5, "min_p": 0.1, "typical_p": 0.5,
            "presence_penalty": 0.1, "frequency_penalty": 0.1, "repetition_penalty": 1.1,
            "logit_bias": {"1": 1.0}, "min_tokens": 1, "allowed_token_ids": [1],
            "bad_words_ids": [[1]], "no_repeat_ngram_size": 2, "penalty_last_n": 8
        }))
        .unwrap();
        // every field of the list is refused on its own
        let mut seen = Vec::new();
        for name in SamplingParams::pipeline_fields() {
            let mut one = serde_json::to_value(SamplingParams::default()).unwrap();
            one[name] = serde_json::to_value(&full).unwrap()[name].clone();
            let one: SamplingParams = serde_json::from_value(one).unwrap();
            let e = fails(one, inline(), 1, None);
            assert_eq!(field(&e), name);
            assert!(matches!(e.kind(), ErrorKind::Contradiction { .. }), "{e}");
            seen.push(name);
        }
        assert_eq!(seen.len(), 14);
    }

    /// The constraint and the grammar mask come together.
    #[test]
    fn a_constraint_and_a_grammar_mask_come_together() {
        let with = SamplingParams {
            constraint: Some(ConstraintSpec::Choice {
                choices: vec!["a".into()],
            }),
            ..Default::default()
        };
        // a preset puts the mask in
        let r = resolve(&Request::new(&with, &PipelineChoice::default())).unwrap();
        assert!(r
            .pipeline
            .processors
            .iter()
            .any(|q| matches!(q, ProcessorConfig::GrammarMask(_))));
        // an inline pipeline without one is refused, and a mask without a constraint
        assert_eq!(field(&fails(with.clone(), inline(), 1, None)), "pipeline");
        let masked = PipelineChoice::Config(PipelineConfig::new(
            vec![ProcessorConfig::GrammarMask(
                crate::processors::grammar_mask::GrammarMask { version: 1 },
            )],
            Default::default(),
        ));
        assert_eq!(
            field(&fails(SamplingParams::default(), masked.clone(), 1, None)),
            "pipeline"
        );
        assert!(resolve(&Request::new(&with, &masked)).is_ok());
    }
}
