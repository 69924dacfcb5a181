//! # nextok-engine
//!
//! One engine under every nextok front end (the CLI's `generate` and `replay`, the server, the
//! benchmarks): a model, a scheduler that advances many sequences together (continuous
//! batching), and the requests' events.
//!
//! * [`Engine`] — `submit` a [`GenerateRequest`] and read its [`Event`]s from the
//!   [`RequestHandle`], or `generate` for the whole [`Completion`];
//! * [`request`] — prompts (text, chat messages, ids), sampling parameters, the pipeline, the
//!   constraint declared once, `n`, logprobs, step records, the ledger;
//! * `scheduler` — admission under `max_num_seqs` and a KV budget, one
//!   forward pass per iteration over every decoding sequence plus prompt chunks, the prefix
//!   cache, forks for `n > 1`;
//! * [`explain`] — one step explained (the ledger), from logits given as data or from the
//!   model's step;
//! * [`trace`] — the trace format (a header line, then one step record per line) and replay;
//! * [`speculative`] — drafts verified in one forward pass, accepted exactly where plain
//!   decoding would select the same token;
//! * [`teaching`] — the ledger page's demonstrations: beam search on a probability tree, 002's
//!   random-stream scheduling and nextok's own per-request streams;
//! * [`solo`] — the one-sequence loop (`nextok bench decode`, the baseline of
//!   `nextok bench engine`) and beam search.
//!
//! A request's tokens and step records do not depend on what runs beside it: the model's rows
//! are batch-invariant and each sequence draws from its own counter-based random stream.
//!
//! ```no_run
//! use std::sync::Arc;
//! use nextok_engine::{Engine, EngineConfig, GenerateRequest, Prompt, ConstraintSpec};
//! let model = Arc::new(nextok_model::Model::load(&nextok_model::fetch::default_model()?, Default::default())?);
//! let engine = Engine::new(model, EngineConfig::default())?;
//! let schema = serde_json::json!({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]});
//! let mut req = GenerateRequest::new(Prompt::Text("A person as JSON: ".into()));
//! req.params.constraint = Some(ConstraintSpec::JsonSchema { schema, options: Default::default() });
//! println!("{}", engine.generate(req)?.sequences[0].text);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

mod config;
mod engine;
mod error;
pub mod explain;
mod prepare;
mod queue;
pub mod request;
pub(crate) mod scheduler;
pub mod solo;
pub mod speculative;
pub mod teaching;
pub mod trace;

/// This build's version: the package version, with the git commit it was built from as build
/// metadata (`0.1.0+g84e8bd9c1d2e`) when built from a checkout. A trace header records it.
pub const VERSION: &str = env!("NEXTOK_VERSION");

pub use config::{
    EngineConfig, DEFAULT_KV_BUDGET_BYTES, ITL_TARGET_MS, ITL_TARGET_MS_MAX, PREFILL_CHUNK_TOKENS,
};
pub use engine::{Completion, Engine, EngineStats, Recv, RequestHandle, SequenceOutput};
pub use error::{EngineError, ErrorKind, Result};
pub use nextok_constraint::ConstraintSpec;
pub use prepare::{fresh_seed, Prepared};
pub use request::{
    Event, GenerateRequest, LogprobOptions, PipelineChoice, Prompt, RequestInfo, Timing,
    TokenLogprobs, Usage,
};
