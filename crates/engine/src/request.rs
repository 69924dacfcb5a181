//! What a front end asks the engine for ([`GenerateRequest`]) and what it gets back
//! ([`Event`]s on a [`RequestHandle`](crate::RequestHandle)).

use std::time::Duration;

use nextok_core::{
    Explanation, FinishReason, Layer, PipelineConfig, SamplingParams, StepRecord, StopConfig,
};
use nextok_model::chat::Message;

/// The prompt of a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Plain text, tokenised as is (special tokens written in it are recognised; BOS is
    /// prepended when the model asks for it).
    Text(String),
    /// Chat messages, rendered with the model's own chat template, ending with the assistant's
    /// turn.
    Chat(Vec<Message>),
    /// Token ids, fed as they are.
    Ids(Vec<u32>),
}

pub use nextok_core::pipeline::resolve::PipelineChoice;

/// Per-token logprobs a request asks for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogprobOptions {
    /// How many of the best final candidates to report besides the selected token.
    pub top: usize,
    /// The layer the values come from.
    pub layer: Layer,
}

/// One generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    /// The prompt.
    pub prompt: Prompt,
    /// Sampling parameters (vLLM / OpenAI names). `seed: None` draws a fresh seed, reported in
    /// [`RequestInfo::seeds`]. `max_tokens: None` runs to the context length. The
    /// structured-output constraint is `params.constraint`, declared once: the engine compiles
    /// it (cached by its content) and a preset's pipeline gets its grammar mask.
    pub params: SamplingParams,
    /// The pipeline.
    pub pipeline: PipelineChoice,
    /// Number of sequences; sequence `i` uses seed `seed + i` (wrapping) and shares the
    /// prompt's cache.
    pub n: usize,
    /// Per-token logprobs.
    pub logprobs: Option<LogprobOptions>,
    /// Send every step's [`StepRecord`] ([`Event::Record`]) with this many candidates.
    pub records: Option<usize>,
    /// With `records`: each record carries its step's raw logits, compressed
    /// ([`StepRecord::raw_logits`]), so its trace replays the sampler without the model
    /// (about 3 bytes a vocabulary entry a step).
    pub trace_logits: bool,
    /// Send the full ledger ([`Event::Ledger`]) of this step (0-based) of every sequence.
    pub ledger_step: Option<u64>,
    /// Speculate with prompt lookup, `exact` acceptance: the same tokens, records and events
    /// as without, fewer forward passes where drafts are accepted
    /// ([`crate::speculative`]).
    pub speculative: Option<crate::speculative::SpecOptions>,
    /// Resume a request from the tokens its sequences already produced (one list per
    /// sequence, `n` lists; a list may be empty): each sequence's sampler state commits its
    /// tokens as if it had selected them (penalties count them, the random stream advances,
    /// the constraint and stop strings consume them), its cache is computed for the prompt and
    /// those tokens, and it goes on from the next position. With the request's seed (which
    /// `params.seed` must give) the tokens that follow are the ones an uninterrupted run would
    /// have produced. The resumed tokens send no events; their text counts as already shown.
    pub resume: Option<Vec<Vec<u32>>>,
}

impl Default for GenerateRequest {
    fn default() -> Self {
        GenerateRequest {
            prompt: Prompt::Ids(Vec::new()),
            params: SamplingParams::default(),
            pipeline: PipelineChoice::default(),
            n: 1,
            logprobs: None,
            records: None,
            trace_logits: false,
            ledger_step: None,
            speculative: None,
            resume: None,
        }
    }
}

impl GenerateRequest {
    /// A request for `prompt` with default parameters.
    pub fn new(prompt: Prompt) -> GenerateRequest {
        GenerateRequest {
            prompt,
            ..Default::default()
        }
    }
}

/// What the engine made of a request, known at submission.
#[derive(Debug, Clone)]
pub struct RequestInfo {
    /// The engine's id for the request.
    pub id: u64,
    /// The prompt's token ids.
    pub prompt_ids: Vec<u32>,
    /// The sampling parameters as run (`seed` and `max_tokens` filled in).
    pub params: SamplingParams,
    /// The pipeline as run.
    pub pipeline: PipelineConfig,
    /// Its hash.
    pub pipeline_hash: String,
    /// Stop conditions.
    pub stop: StopConfig,
    /// One seed per sequence.
    pub seeds: Vec<u64>,
    /// The effective output limit per sequence.
    pub max_tokens: u64,
    /// Speculative decoding, when the request asked for it.
    pub speculative: Option<crate::speculative::SpecOptions>,
    /// The compiled constraint, if any: for a JSON schema, its keyword report
    /// ([`CompiledConstraint::schema_report`](nextok_constraint::CompiledConstraint::schema_report))
    /// and the check of a finished output against the full schema
    /// ([`CompiledConstraint::validate_output`](nextok_constraint::CompiledConstraint::validate_output)).
    pub constraint: Option<std::sync::Arc<nextok_constraint::CompiledConstraint>>,
    /// The engine's KV cache type, which the request's logits depend on.
    pub kv_cache: nextok_model::KvCacheType,
}

impl RequestInfo {
    /// The JSON-schema keyword report, when the constraint is a JSON schema.
    pub fn schema_report(&self) -> Option<&nextok_constraint::SchemaReport> {
        self.constraint.as_ref().and_then(|c| c.schema_report())
    }

    /// Validates a finished output against the request's full JSON schema (`None` when the
    /// constraint is not a JSON schema).
    pub fn validate_output(&self, text: &str) -> Option<nextok_constraint::Validation> {
        self.constraint
            .as_ref()
            .and_then(|c| c.validate_output(text.as_bytes()))
    }
}

/// A selected token's logprobs in the requested layer.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// The layer the values come from.
    pub layer: Layer,
    /// The selected token's logprob.
    pub selected: f64,
    /// The best final candidates `(id, logprob)`, best first.
    pub top: Vec<(u32, f64)>,
}

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens whose cache came from the prefix cache.
    pub cached_tokens: usize,
    /// Generated tokens, all sequences.
    pub completion_tokens: usize,
}

/// Where a request's time went.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Timing {
    /// Submission to admission.
    pub queued: Duration,
    /// Submission to the first token of the first sequence.
    pub time_to_first_token: Duration,
    /// Submission to the last event.
    pub total: Duration,
    /// Forward passes that ran any of the request's rows: one per prompt chunk (a prompt
    /// beside decoding sequences goes in chunks), per pass recomputing its cache after a
    /// preemption, and per decode step (a verified draft is one pass).
    pub forward_passes: u32,
}

/// What a request's handle yields, in order. Each sequence sends its `Token`s (and `Record`s
/// and `Ledger` when asked) then one `Finish`; after every sequence has finished, `Done` ends
/// the request. An `Error` ends it early.
#[derive(Debug, Clone)]
pub enum Event {
    /// A selected token.
    Token {
        /// Sequence index (`0..n`).
        seq: usize,
        /// Token id.
        id: u32,
        /// The text that can be shown now (settled UTF-8, no part of a stop string).
        text: String,
        /// Logprobs, when asked for.
        logprobs: Option<TokenLogprobs>,
    },
    /// The step record of a step (when asked for), sent before that step's `Token`.
    Record {
        /// Sequence index.
        seq: usize,
        /// The record.
        record: Box<StepRecord>,
    },
    /// The full ledger of the step asked for, before it runs.
    Ledger {
        /// Sequence index.
        seq: usize,
        /// Every token's row at every layer, and the step record.
        explanation: Box<Explanation>,
    },
    /// A sequence ended.
    Finish {
        /// Sequence index.
        seq: usize,
        /// Why (`None`: the context is full).
        reason: Option<FinishReason>,
        /// The text held back until now (a partial character, a possible stop-string start).
        text: String,
        /// Tokens generated by this sequence.
        tokens: usize,
    },
    /// The request is complete.
    Done {
        /// Token counts.
        usage: Usage,
        /// Timing.
        timing: Timing,
    },
    /// The request failed; nothing follows.
    Error(crate::EngineError),
}
