//! The engine: a model, a scheduler thread, and the handles requests are answered through.
//!
//! [`Engine::submit`] prepares a request on the caller's thread (tokenising, compiling the
//! pipeline and the constraint, checking that it can ever fit) and queues it; the scheduler
//! thread ([`crate::scheduler`]) admits it when there is room and advances it together with
//! every other running sequence. The [`RequestHandle`] receives its [`Event`]s; dropping the
//! handle cancels the request and frees its cache.
//!
//! The queue, the request's context and the counters the two threads share are in
//! [`crate::queue`]; the configuration is in [`crate::config`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use nextok_core::FinishReason;
use nextok_model::{KvGeometry, KvPool, Model};
use tokio::sync::mpsc;

use crate::config::EngineConfig;
use crate::error::{EngineError, ErrorKind, Result};
use crate::prepare::{ModelShared, Prepared};
use crate::queue::{Inner, Queue, ReqCtx};
use crate::request::{Event, GenerateRequest, RequestInfo, TokenLogprobs, Usage};

/// Counters for monitoring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineStats {
    /// Sequences running.
    pub running_seqs: usize,
    /// Requests waiting for admission.
    pub waiting_requests: usize,
    /// Bytes of KV cache blocks alive (running sequences and the prefix cache).
    pub kv_bytes_in_use: usize,
    /// Bytes of the KV cache blocks the running sequences hold (a block shared by several
    /// sequences counts for each): sequences take blocks as they grow.
    pub kv_bytes_reserved: usize,
    /// Bytes of KV cache memory written at least once (blocks alive, and the slots of freed
    /// ones kept for reuse): the cache's share of the process's resident memory.
    pub kv_bytes_touched: usize,
    /// Prompt tokens of admitted requests, since start.
    pub prompt_tokens: u64,
    /// Prompt tokens served from the prefix cache, since start.
    pub cached_prompt_tokens: u64,
    /// Generated tokens, since start.
    pub completion_tokens: u64,
    /// Tokens drafted by speculative decoding and verified.
    pub draft_tokens: u64,
    /// Drafted tokens accepted.
    pub accepted_draft_tokens: u64,
    /// Forward passes run, since start.
    pub iterations: u64,
    /// Requests preempted (their cache freed, to be recomputed) to make room, since start.
    pub preemptions: u64,
    /// Compiled constraints kept for reuse.
    pub constraint_cache_entries: usize,
    /// Their estimated bytes (at most [`EngineConfig::constraint_cache_bytes`] when kept).
    pub constraint_cache_bytes: usize,
}

/// A running engine over one model. Dropping it stops admitting, ends every request with
/// [`ErrorKind::Shutdown`] and joins the scheduler thread.
pub struct Engine {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("config", &self.inner.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Engine {
    /// Starts an engine (and its scheduler thread) over `model`.
    pub fn new(model: Arc<Model>, config: EngineConfig) -> Result<Engine> {
        Engine::start(ModelShared::new(model), config)
    }

    /// [`Engine::new`] with a draft model for speculative requests that choose the `model`
    /// drafter; refused unless its vocabulary holds the target's tokens, byte for byte.
    pub fn with_draft_model(
        model: Arc<Model>,
        draft: Arc<Model>,
        config: EngineConfig,
    ) -> Result<Engine> {
        crate::speculative::ModelDrafter::new(&draft, &model)?;
        let mut shared = ModelShared::new(model);
        shared.draft = Some(draft);
        Engine::start(shared, config)
    }

    /// The draft model, when the engine has one.
    pub fn draft_model(&self) -> Option<&Arc<Model>> {
        self.inner.shared.draft.as_ref()
    }

    fn start(shared: ModelShared, config: EngineConfig) -> Result<Engine> {
        let model = shared.model.clone();
        if config.max_num_seqs == 0 {
            return Err(EngineError::invalid("max_num_seqs", "must be at least 1"));
        }
        if config.max_batch_tokens < config.max_num_seqs {
            return Err(EngineError::invalid(
                "max_batch_tokens",
                format!(
                    "{} is below max_num_seqs ({}): every running sequence needs a row",
                    config.max_batch_tokens, config.max_num_seqs
                ),
            ));
        }
        for (field, v) in [
            ("default_max_tokens", config.default_max_tokens),
            ("max_tokens_limit", config.max_tokens_limit),
        ] {
            if v == Some(0) {
                return Err(EngineError::invalid(field, "must be at least 1"));
            }
        }
        if let (Some(d), Some(l)) = (config.default_max_tokens, config.max_tokens_limit) {
            if d > l {
                return Err(EngineError::invalid(
                    "default_max_tokens",
                    format!("{d} is over max_tokens_limit ({l})"),
                ));
            }
        }
        if config.prefill_chunk_tokens == 0 {
            return Err(EngineError::invalid(
                "prefill_chunk_tokens",
                "must be at least 1: prompts would never advance while others decode",
            ));
        }
        if config.itl_target_ms > crate::ITL_TARGET_MS_MAX {
            return Err(EngineError::invalid(
                "itl_target_ms",
                format!(
                    "{} is over {} (ten minutes)",
                    config.itl_target_ms,
                    crate::ITL_TARGET_MS_MAX
                ),
            ));
        }
        let c = &model.weights.config;
        let geometry = KvGeometry {
            n_layer: c.n_layer,
            n_kv_head: c.n_kv_head,
            head_dim: c.head_dim,
            dtype: config.kv_cache_type,
        };
        geometry
            .check()
            .map_err(|m| EngineError::invalid("kv_cache_type", m))?;
        // The memory guard: the budget must fit in what is left beside the loaded model. The
        // default budget shrinks to 90 % of that; a budget the caller set is refused.
        let mut config = config;
        if let Some((room, source)) = nextok_model::memory::available() {
            let room = usize::try_from(room).unwrap_or(usize::MAX);
            if config.kv_budget_bytes > room {
                if config.kv_budget_bytes == crate::config::DEFAULT_KV_BUDGET_BYTES {
                    config.kv_budget_bytes = room / 10 * 9;
                } else {
                    return Err(EngineError::invalid(
                        "kv_budget_bytes",
                        format!(
                            "{} of KV cache would not fit: {} is available beside the model ({source})",
                            nextok_model::memory::show(config.kv_budget_bytes as u64),
                            nextok_model::memory::show(room as u64),
                        ),
                    ));
                }
            }
        }
        let budget_blocks = config.kv_budget_bytes / geometry.block_bytes().max(1);
        if budget_blocks == 0 {
            return Err(EngineError::invalid(
                "kv_budget_bytes",
                format!("below one cache block ({} bytes)", geometry.block_bytes()),
            ));
        }
        let inner = Arc::new(Inner {
            shared,
            budget_blocks,
            pool: KvPool::new(geometry, None),
            config,
            queue: Mutex::new(Queue {
                waiting: VecDeque::new(),
                shutdown: false,
            }),
            wake: Condvar::new(),
            next_id: AtomicU64::new(1),
            running_seqs: AtomicUsize::new(0),
            reserved_blocks: AtomicUsize::new(0),
            prompt_tokens: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
            draft_tokens: AtomicU64::new(0),
            accepted_draft_tokens: AtomicU64::new(0),
            iterations: AtomicU64::new(0),
            preemptions: AtomicU64::new(0),
        });
        let run = inner.clone();
        let thread = std::thread::Builder::new()
            .name("nextok-engine".into())
            .spawn(move || crate::scheduler::run(run))
            .map_err(|e| EngineError::new(ErrorKind::Model, format!("cannot start: {e}")))?;
        Ok(Engine {
            inner,
            thread: Some(thread),
        })
    }

    /// The KV cache budget in bytes, as the engine runs with it (after the memory guard; whole
    /// blocks).
    pub fn kv_budget_bytes(&self) -> usize {
        let (blocks, block) = self.kv_budget();
        blocks.saturating_mul(block)
    }

    /// The KV cache budget in blocks, and the bytes of one block.
    pub(crate) fn kv_budget(&self) -> (usize, usize) {
        (
            self.inner.budget_blocks,
            self.inner.pool.geometry().block_bytes(),
        )
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.inner.shared.model
    }

    /// The numerics identifier of this engine's requests: its model on its KV cache type with
    /// this build's sampler ([`crate::trace::numerics`]).
    pub fn numerics(&self) -> String {
        crate::trace::numerics(self.model(), self.inner.config.kv_cache_type)
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// Current counters.
    pub fn stats(&self) -> EngineStats {
        let i = &self.inner;
        let block = i.pool.geometry().block_bytes();
        let cache = i.shared.cache_stats();
        EngineStats {
            running_seqs: i.running_seqs.load(Ordering::Relaxed),
            waiting_requests: i.lock().waiting.len(),
            kv_bytes_in_use: i.pool.bytes_in_use(),
            kv_bytes_touched: i.pool.bytes_touched(),
            kv_bytes_reserved: i.reserved_blocks.load(Ordering::Relaxed) * block,
            prompt_tokens: i.prompt_tokens.load(Ordering::Relaxed),
            cached_prompt_tokens: i.cached_tokens.load(Ordering::Relaxed),
            completion_tokens: i.completion_tokens.load(Ordering::Relaxed),
            draft_tokens: i.draft_tokens.load(Ordering::Relaxed),
            accepted_draft_tokens: i.accepted_draft_tokens.load(Ordering::Relaxed),
            iterations: i.iterations.load(Ordering::Relaxed),
            preemptions: i.preemptions.load(Ordering::Relaxed),
            constraint_cache_entries: cache.0,
            constraint_cache_bytes: cache.1,
        }
    }

    /// Prepares `req` on this thread and queues it. Errors: an invalid field
    /// ([`ErrorKind::InvalidRequest`], [`ErrorKind::Constraint`]), a request that can never fit
    /// ([`ErrorKind::TooLarge`]), a full queue ([`ErrorKind::QueueFull`]).
    pub fn submit(&self, req: GenerateRequest) -> Result<RequestHandle> {
        let i = &self.inner;
        let id = i.next_id.fetch_add(1, Ordering::Relaxed);
        let prepared = i.shared.prepare(&req, id, &i.config)?;
        let info = &prepared.info;
        let n = info.seeds.len();
        let prompt = info.prompt_ids.len();
        let out = info.max_tokens as usize;
        let reservation =
            KvGeometry::blocks_for(prompt + out) + (n - 1) * (KvGeometry::blocks_for(out) + 1);
        if reservation > i.budget_blocks {
            let block = i.pool.geometry().block_bytes();
            return Err(EngineError::new(
                ErrorKind::TooLarge,
                format!(
                    "{n} sequence(s) of a {prompt}-token prompt and {out} tokens need {} bytes of KV cache; the budget is {}",
                    reservation * block,
                    i.budget_blocks * block
                ),
            )
            .with_field("max_tokens"));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let info = prepared.info.clone();
        let ctx = Arc::new(ReqCtx {
            prepared,
            tx,
            cancel: cancel.clone(),
            submitted: Instant::now(),
        });
        {
            let mut q = i.lock();
            if q.shutdown {
                return Err(EngineError::new(
                    ErrorKind::Shutdown,
                    "the engine is shutting down",
                ));
            }
            if q.waiting.len() >= i.config.max_waiting {
                return Err(EngineError::new(
                    ErrorKind::QueueFull,
                    format!("{} requests are waiting; retry later", q.waiting.len()),
                ));
            }
            q.waiting.push_back(ctx);
        }
        i.wake.notify_all();
        Ok(RequestHandle { info, rx, cancel })
    }

    /// Prepares `req` without queueing it (the engine's caches are used): for callers that
    /// drive a sequence themselves, like the one-sequence loop of [`crate::solo`].
    pub fn prepare(&self, req: &GenerateRequest) -> Result<Prepared> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        self.inner.shared.prepare(req, id, &self.inner.config)
    }

    /// Submits `req` and collects everything it produces (blocking; not from an async task).
    pub fn generate(&self, req: GenerateRequest) -> Result<Completion> {
        let mut h = self.submit(req)?;
        h.collect_all()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.inner.lock().shutdown = true;
        self.inner.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A submitted request: its [`RequestInfo`] and the stream of its [`Event`]s. Dropping it
/// cancels the request (its sequences stop at the next iteration and free their cache).
#[derive(Debug)]
pub struct RequestHandle {
    /// What the engine made of the request.
    pub info: RequestInfo,
    rx: mpsc::UnboundedReceiver<Event>,
    cancel: Arc<AtomicBool>,
}

impl RequestHandle {
    /// The next event, waiting for it (blocking: not from an async task). `None` after the
    /// last.
    pub fn recv(&mut self) -> Option<Event> {
        self.rx.blocking_recv()
    }

    /// The next event (async). `None` after the last.
    pub async fn next_event(&mut self) -> Option<Event> {
        self.rx.recv().await
    }

    /// Cancels the request now.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// The next event, waiting at most `timeout` (blocking: not from an async task).
    pub fn recv_timeout(&mut self, timeout: std::time::Duration) -> Recv {
        let Some(rt) = timer_runtime() else {
            // no timer thread could be started: wait without a bound
            return match self.recv() {
                Some(e) => Recv::Event(e),
                None => Recv::Closed,
            };
        };
        let rx = &mut self.rx;
        match rt.block_on(async { tokio::time::timeout(timeout, rx.recv()).await }) {
            Ok(Some(e)) => Recv::Event(e),
            Ok(None) => Recv::Closed,
            Err(_) => Recv::Timeout,
        }
    }

    /// Waits for every event and gathers them (blocking).
    pub fn collect_all(&mut self) -> Result<Completion> {
        self.collect_until(|| false)
    }

    /// Like [`collect_all`](Self::collect_all), asking `stop` at least every 100 ms while it
    /// waits: when `stop` says so, the request is cancelled (its sequences stop at the next
    /// iteration and free their cache) and the result is an [`ErrorKind::Cancelled`] error. A
    /// caller that must notice an interrupt (Ctrl-C in Python) waits this way.
    pub fn collect_until(&mut self, mut stop: impl FnMut() -> bool) -> Result<Completion> {
        let n = self.info.seeds.len();
        let mut c = Completion {
            info: self.info.clone(),
            sequences: (0..n).map(|_| SequenceOutput::default()).collect(),
            usage: Usage::default(),
            timing: Default::default(),
        };
        let every = std::time::Duration::from_millis(100);
        let mut asked = std::time::Instant::now();
        loop {
            let got = self.recv_timeout(every);
            if asked.elapsed() >= every {
                if stop() {
                    self.cancel();
                    return Err(EngineError::new(
                        ErrorKind::Cancelled,
                        "the request was cancelled while its caller waited",
                    ));
                }
                asked = std::time::Instant::now();
            }
            let e = match got {
                Recv::Event(e) => e,
                Recv::Closed => break,
                Recv::Timeout => continue,
            };
            match e {
                Event::Token {
                    seq,
                    id,
                    text,
                    logprobs,
                } => {
                    if let Some(s) = c.sequences.get_mut(seq) {
                        s.tokens.push(id);
                        s.text.push_str(&text);
                        if let Some(l) = logprobs {
                            s.logprobs.push(l);
                        }
                    }
                }
                Event::Record { seq, record } => {
                    if let Some(s) = c.sequences.get_mut(seq) {
                        s.records.push(*record);
                    }
                }
                Event::Ledger { seq, explanation } => {
                    if let Some(s) = c.sequences.get_mut(seq) {
                        s.ledger = Some(*explanation);
                    }
                }
                Event::Finish {
                    seq, reason, text, ..
                } => {
                    if let Some(s) = c.sequences.get_mut(seq) {
                        s.text.push_str(&text);
                        s.finish = reason;
                    }
                }
                Event::Done { usage, timing } => {
                    c.usage = usage;
                    c.timing = timing;
                    return Ok(c);
                }
                Event::Error(e) => return Err(e),
            }
        }
        Err(EngineError::new(
            ErrorKind::Shutdown,
            "the engine stopped before the request finished",
        ))
    }
}

/// What [`RequestHandle::recv_timeout`] got.
#[derive(Debug)]
pub enum Recv {
    /// The next event.
    Event(Event),
    /// The request's events are over.
    Closed,
    /// Nothing arrived in time.
    Timeout,
}

/// The runtime whose timer bounds [`RequestHandle::recv_timeout`]'s waits: one worker
/// thread drives the timer; each waiting thread runs its own wait. `None` when the thread
/// could not be started.
fn timer_runtime() -> Option<&'static tokio::runtime::Runtime> {
    static RT: std::sync::OnceLock<Option<tokio::runtime::Runtime>> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("nextok-timer")
            .enable_time()
            .build()
            .ok()
    })
    .as_ref()
}

impl Iterator for RequestHandle {
    type Item = Event;
    fn next(&mut self) -> Option<Event> {
        self.recv()
    }
}

impl Drop for RequestHandle {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

/// Everything one sequence produced.
#[derive(Debug, Clone, Default)]
pub struct SequenceOutput {
    /// Selected token ids.
    pub tokens: Vec<u32>,
    /// The visible text.
    pub text: String,
    /// Why it ended (`None`: the context is full).
    pub finish: Option<FinishReason>,
    /// Step records, when asked for.
    pub records: Vec<nextok_core::StepRecord>,
    /// Per-token logprobs, when asked for.
    pub logprobs: Vec<TokenLogprobs>,
    /// The ledger of the step asked for.
    pub ledger: Option<nextok_core::Explanation>,
}

/// A finished request.
#[derive(Debug, Clone)]
pub struct Completion {
    /// What the engine made of the request.
    pub info: RequestInfo,
    /// One output per sequence.
    pub sequences: Vec<SequenceOutput>,
    /// Token counts.
    pub usage: Usage,
    /// Timing.
    pub timing: crate::request::Timing,
}
