//! The compiled sampler and the step transition.
//!
//! [`Sampler`] is the immutable compiled form of a [`PipelineConfig`] for one vocabulary and one
//! request's stop conditions (Config → compiled object, like regex-automata). Per-sequence state
//! lives in [`DecoderState`](crate::state::DecoderState); per-thread scratch in [`Workspace`]. One step is:
//!
//! 1. load and validate the raw logits (NaN / `+inf` → error naming the first bad index);
//! 2. apply the processors in order, recording the support size after each, failing with a
//!    constraint error (and never calling the selector) if the support becomes empty;
//! 3. select (greedy / categorical / Gumbel);
//! 4. commit: the 000 §3.10 update, in order — append, counts, sequence-constraint state,
//!    grammar slot, stop state, random stream, step index, terminal check.
//!
//! [`Sampler::step`] allocates nothing once the workspace exists (history vectors grow
//! amortised). Records and explanations are opt-in and allocate.
//!
//! The code is split by concept:
//! * `compile`: [`Sampler::new`] — validation and compilation of a pipeline;
//! * `state`: a sequence's decoder state — creation, history, sequence-constraint slots;
//! * `step`: processing and selection ([`Sampler::step`], [`Sampler::select`]);
//! * `commit`: the 000 §3.10 update and the terminal checks ([`Sampler::commit`]);
//! * `report`: step records, explanations and logprobs ([`Sampler::step_recorded`],
//!   [`Sampler::explain`]);
//! * `batch`: many rows in parallel ([`Sampler::step_batch`], [`WorkspacePool`]).

mod batch;
mod commit;
mod compile;
mod report;
mod state;
mod step;

use std::sync::Arc;

use crate::pipeline::{PipelineConfig, StopConfig};
use crate::processors::Processor;
use crate::select::Selector;
use crate::state::FinishReason;
use crate::stop::StopStrings;
use crate::support::Workspace;
use crate::vocab::{TokenBytes, VocabInfo};

pub use batch::WorkspacePool;
pub use report::{Explanation, TokenRow};

/// The outcome of one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepResult {
    /// The selected token.
    pub token: u32,
    /// Set when this token ended the sequence.
    pub finish: Option<FinishReason>,
    /// The categorical `u` used, if any.
    pub u: Option<f64>,
}

/// A compiled pipeline for one vocabulary and one set of stop conditions.
#[derive(Debug, Clone)]
pub struct Sampler {
    config: PipelineConfig,
    processors: Vec<Processor>,
    selector: Selector,
    vocab: VocabInfo,
    stop: StopConfig,
    stop_ids: Vec<u32>,
    hash: String,
    tokens: Option<Arc<TokenBytes>>,
    stop_strings: Option<Arc<StopStrings>>,
    /// Special tokens whose bytes equal a whole stop string: (token, stop string index).
    special_stops: Vec<(u32, usize)>,
    min_tokens: u64,
}

impl Sampler {
    /// The pipeline config.
    pub fn config(&self) -> &PipelineConfig {
        &self.config
    }

    /// The pipeline hash.
    pub fn pipeline_hash(&self) -> &str {
        &self.hash
    }

    /// The compiled processors, in order.
    pub fn processors(&self) -> &[Processor] {
        &self.processors
    }

    /// The selector.
    pub fn selector(&self) -> Selector {
        self.selector
    }

    /// Vocabulary facts.
    pub fn vocab(&self) -> &VocabInfo {
        &self.vocab
    }

    /// Stop conditions.
    pub fn stop(&self) -> &StopConfig {
        &self.stop
    }

    /// The compiled stop strings, if any (share them with a [`TextStream`](crate::text::TextStream)).
    pub fn stop_strings(&self) -> Option<Arc<StopStrings>> {
        self.stop_strings.clone()
    }

    /// The bytes `token` contributes to the output text: its exact bytes, or nothing for a
    /// special token when `skip_special_tokens` is set (and nothing without a byte table).
    pub fn visible_bytes(&self, token: u32) -> &[u8] {
        if self.stop.skip_special_tokens && self.vocab.is_special(token) {
            return &[];
        }
        self.tokens
            .as_ref()
            .and_then(|t| t.get(token))
            .unwrap_or(&[])
    }

    /// A streaming detokeniser for this request's stop strings.
    pub fn text_stream(&self) -> crate::text::TextStream {
        crate::text::TextStream::new(
            self.stop_strings.clone(),
            self.stop.include_stop_str_in_output,
        )
    }

    /// A workspace sized for this sampler's vocabulary.
    pub fn new_workspace(&self) -> Workspace {
        let mut ws = Workspace::new(self.vocab.vocab_size);
        ws.stages.reserve(self.processors.len() + 1);
        ws
    }
}
