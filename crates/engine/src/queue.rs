//! What the engine's handle and the scheduler thread share: the waiting queue, each request's
//! context, and the counters.
//!
//! [`Engine`](crate::Engine) (`engine.rs`) prepares a request into a [`ReqCtx`], pushes it on
//! the [`Queue`] and wakes the scheduler; the scheduler thread ([`crate::scheduler`]) admits
//! requests from the queue, answers them through their [`ReqCtx`] and publishes its counters in
//! [`Inner`]. Both import from this module, and neither from the other but for the engine
//! starting the scheduler thread, so there is no import loop inside the engine.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use nextok_model::KvPool;
use tokio::sync::mpsc;

use crate::config::EngineConfig;
use crate::prepare::{ModelShared, Prepared};
use crate::request::Event;

/// A request's fixed part, shared by its sequences.
pub(crate) struct ReqCtx {
    /// The prepared request: its info (id, prompt, seeds, limits), sampler and options.
    pub(crate) prepared: Prepared,
    /// Where the request's events go.
    pub(crate) tx: mpsc::UnboundedSender<Event>,
    /// Set when the request's handle cancels it (or is dropped).
    pub(crate) cancel: Arc<AtomicBool>,
    /// When it was submitted.
    pub(crate) submitted: Instant,
}

/// The requests waiting for admission, and whether the engine is shutting down.
pub(crate) struct Queue {
    /// Waiting requests, in the order they were submitted.
    pub(crate) waiting: VecDeque<Arc<ReqCtx>>,
    /// Set when the engine is dropped: nothing more is admitted.
    pub(crate) shutdown: bool,
}

/// The state the engine's handle and its scheduler thread share.
pub(crate) struct Inner {
    /// The model and the caches requests are prepared with.
    pub(crate) shared: ModelShared,
    /// How the engine schedules.
    pub(crate) config: EngineConfig,
    /// The KV budget, in cache blocks.
    pub(crate) budget_blocks: usize,
    /// The pool every sequence's cache takes its blocks from.
    pub(crate) pool: KvPool,
    /// The waiting queue (see [`Inner::lock`]).
    pub(crate) queue: Mutex<Queue>,
    /// Wakes the scheduler thread when a request arrives or the engine shuts down.
    pub(crate) wake: Condvar,
    /// The next request's id.
    pub(crate) next_id: AtomicU64,
    /// Sequences running (published by the scheduler).
    pub(crate) running_seqs: AtomicUsize,
    /// Cache blocks the running sequences hold (published by the scheduler).
    pub(crate) reserved_blocks: AtomicUsize,
    /// Prompt tokens of admitted requests, since start.
    pub(crate) prompt_tokens: AtomicU64,
    /// Prompt tokens served from the prefix cache, since start.
    pub(crate) cached_tokens: AtomicU64,
    /// Generated tokens, since start.
    pub(crate) completion_tokens: AtomicU64,
    /// Drafted tokens verified, since start.
    pub(crate) draft_tokens: AtomicU64,
    /// Drafted tokens accepted, since start.
    pub(crate) accepted_draft_tokens: AtomicU64,
    /// Forward passes run, since start.
    pub(crate) iterations: AtomicU64,
    /// Requests preempted, since start.
    pub(crate) preemptions: AtomicU64,
}

impl Inner {
    /// The queue, locked (a panic while it was held does not poison it for the others).
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}
