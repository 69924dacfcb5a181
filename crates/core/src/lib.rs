//! # nextok-core
//!
//! The pure decoding core of nextok: from a row of raw logits to one token, in four named
//! layers, reproducibly. No I/O.
//!
//! * [`Workspace`] / [`support`] — raw logits → processed logits → candidate support;
//! * [`processors`] — masks, penalties, temperature, top-k/top-p/min-p/typical, one file each;
//! * [`pipeline`] — ordered, versioned pipelines as data, hashed; presets for the reference,
//!   HF, vLLM and llama.cpp orders;
//! * [`select`] — greedy, inverse-CDF categorical and Gumbel-max selection;
//! * [`rng`] — Philox4x32-10 counter-based per-request streams;
//! * [`state`] — the per-sequence [`DecoderState`] and its post-selection update;
//! * [`record`] — per-step records with logprobs labelled by [`Layer`];
//! * [`Sampler`] — the compiled pipeline: `step`, `select`, `commit`, `explain`, `step_batch`.
//!
//! ```
//! use nextok_core::{Sampler, SamplingParams, Preset, VocabInfo};
//! let params = SamplingParams { temperature: Some(0.8), top_p: Some(0.8), seed: Some(7), ..Default::default() };
//! let sampler = Sampler::from_params(Preset::Reference, &params, VocabInfo::plain(3)).unwrap();
//! let mut state = sampler.new_state(&[], params.sequence_seed(0)).unwrap();
//! let mut ws = sampler.new_workspace();
//! let r = sampler.step(&[2.0, 1.5, 0.5], &mut state, &mut ws).unwrap();
//! assert!(r.token < 2); // the support is {A, B}
//! ```

#![warn(missing_docs)]

#[doc(hidden)]
pub mod constraint;
pub mod cpu;
pub mod error;
mod fxhash;
mod kernels;
pub mod math;
pub mod numerics;
pub mod pipeline;
pub mod processors;
pub mod record;
pub mod request;
pub mod rng;
pub mod sampler;
pub mod select;
pub mod speculative;
pub mod state;
pub mod stop;
pub mod support;
pub mod text;
pub mod vocab;

pub use error::{Error, ErrorKind, Result};
pub use pipeline::params::SamplingParams;
pub use pipeline::presets::Preset;
pub use pipeline::{PipelineConfig, StopConfig, FORMAT_VERSION};
pub use record::{DraftRecord, DraftRule, Layer, Logprob, PackedLogits, StepRecord};
pub use request::{ExplainOutput, StepRequest};
pub use rng::RngState;
pub use sampler::{Explanation, Sampler, StepResult, TokenRow, WorkspacePool};
pub use select::{DraftDecision, Draw, Selected, Selector};
pub use state::{DecoderState, FinishReason, FinishStatus};
pub use support::Workspace;
pub use vocab::{TokenBytes, VocabInfo};
