//! A running sequence ([`Seq`]), its phase ([`Phase`]: prefill, waiting to fork, decode,
//! recompute after a preemption), its speculative part ([`SpecSeq`]), the steps an iteration
//! produced for it ([`StepOut`]), and its request's [`Progress`].

use std::sync::Arc;
use std::time::Instant;

use nextok_core::{DecoderState, FinishReason};
use nextok_model::{KvGeometry, SeqKv};

use crate::error::EngineError;
use crate::queue::ReqCtx;
use crate::request::{TokenLogprobs, Usage};
use crate::speculative::{Adaptive, Drafter, SpecOptions};

/// Where a sequence is: caching its prompt, waiting to fork, decoding, or caching again what a
/// preemption freed.
pub(super) enum Phase {
    /// Prompt positions `0..done` are cached.
    Prefill { done: usize },
    /// Waits for the first sequence of its request to finish the prompt, then forks it.
    AwaitFork,
    /// `feed` holds the token to feed (and a draft after it, while one is verified).
    Decode,
    /// After a preemption: positions `0..done` of `replay` (the prompt and the output so far but
    /// the pending token) are cached again; then `Decode`.
    Recompute { done: usize },
}

/// One of a request's `n` sequences: its sampler state, text stream and cache (the sampler's
/// scratch is the scheduler's, [`Scheduler::sample`]).
pub(super) struct Seq {
    /// Its request.
    pub(super) req: Arc<ReqCtx>,
    /// Its index among the request's sequences.
    pub(super) index: usize,
    /// The sampler's state (history, counts, processors' and constraint's states).
    pub(super) state: DecoderState,
    /// The visible text so far.
    pub(super) stream: nextok_core::text::TextStream,
    /// Its KV cache.
    pub(super) kv: SeqKv,
    /// Where it is.
    pub(super) phase: Phase,
    /// The selected token not yet fed, then this iteration's draft.
    pub(super) feed: Vec<u32>,
    /// What a preempted sequence feeds again (see [`Phase::Recompute`]); empty otherwise.
    pub(super) replay: Vec<u32>,
    /// Tokens it has generated.
    pub(super) generated: usize,
    /// This iteration's steps (several when a draft was accepted).
    pub(super) outs: Vec<StepOut>,
    /// This iteration's failure.
    pub(super) err: Option<EngineError>,
    /// Speculative decoding's per-sequence part.
    pub(super) spec: Option<SpecSeq>,
    /// Drafted tokens verified in this iteration.
    pub(super) drafted: usize,
    /// Drafted tokens accepted in this iteration.
    pub(super) accepted: usize,
}

/// A speculating sequence's drafter, draft length and token history (prompt and output).
pub(super) struct SpecSeq {
    /// The request's speculative options.
    pub(super) options: SpecOptions,
    /// What proposes the drafts.
    pub(super) drafter: Box<dyn Drafter>,
    /// The draft length, adapted to the acceptance so far.
    pub(super) adapt: Adaptive,
    /// The prompt and the output so far.
    pub(super) history: Vec<u32>,
    /// This iteration's draft.
    pub(super) draft: Vec<u32>,
    /// What drafting reuses ([`crate::speculative::draft_next`]).
    pub(super) scratch: crate::speculative::DraftScratch,
}

/// One step a sequence took in an iteration: what [`Scheduler::emit`](super::Scheduler::emit)
/// sends.
pub(super) struct StepOut {
    /// The selected token.
    pub(super) token: u32,
    /// The text it made visible.
    pub(super) text: String,
    /// `Some` when the sequence finishes here (`Some(None)`: the context is full).
    pub(super) finish: Option<Option<FinishReason>>,
    /// Its logprobs, when asked for.
    pub(super) logprobs: Option<TokenLogprobs>,
    /// Its step record, when asked for.
    pub(super) record: Option<Box<nextok_core::StepRecord>>,
    /// Its ledger, when this is the step asked for.
    pub(super) ledger: Option<Box<nextok_core::Explanation>>,
}

/// Per-request progress kept by the scheduler.
pub(super) struct Progress {
    /// Sequences not finished yet.
    pub(super) remaining: usize,
    /// Token counts so far.
    pub(super) usage: Usage,
    /// When it was admitted.
    pub(super) admitted: Instant,
    /// When its first token was sampled.
    pub(super) first_token: Option<Instant>,
    /// Forward passes that ran any of its rows.
    pub(super) passes: u32,
    /// The engine iteration that last counted in `passes`.
    pub(super) last_pass: Option<u64>,
}

impl Seq {
    /// The positions a prefilling or recomputing sequence has still to cache; `None` for the
    /// others.
    pub(super) fn rows_to_cache(&self) -> Option<usize> {
        match self.phase {
            Phase::Prefill { done } => Some(self.req.prepared.info.prompt_ids.len() - done),
            Phase::Recompute { done } => Some(self.replay.len() - done),
            _ => None,
        }
    }

    /// The blocks a preempted sequence needs to be admitted again: its prompt, or its prompt
    /// and output so far (a forked one waits for the first).
    pub(super) fn blocks_to_resume(&self) -> usize {
        match self.phase {
            Phase::Prefill { .. } => {
                KvGeometry::blocks_for(self.req.prepared.info.prompt_ids.len())
            }
            Phase::Recompute { .. } => KvGeometry::blocks_for(self.replay.len()),
            Phase::Decode | Phase::AwaitFork => 0,
        }
    }
}
