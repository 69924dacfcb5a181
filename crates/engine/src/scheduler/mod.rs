//! The scheduler thread: continuous batching.
//!
//! Between iterations the scheduler drops cancelled requests (their cache blocks are freed) and
//! admits waiting ones, oldest first (preempted ones before the queue), while the running
//! sequences (`max_num_seqs`) and the KV cache (`kv_budget_bytes`) have room: a request needs
//! the blocks of its prompt now, not of its whole output — sequences take blocks as they grow.
//! An admitted request's prompt starts from the longest prefix the prefix cache holds (its
//! blocks are shared, not copied). See [`admission`].
//!
//! Each iteration is then one cycle of four steps over a [`Plan`]:
//!
//! 1. **plan** ([`plan`]) — makes room for the pass in the KV budget: the prefix cache gives up
//!    entries, prompt chunks wait, and as a last resort the request holding the most blocks is
//!    **preempted**: its blocks are freed and it goes back to the front of the queue with its
//!    sampler state; resumed, it recomputes its prompt and output so far (the model's rows are
//!    batch-invariant, so its cache and its tokens are exactly those it would have had). Then
//!    it plans **one** forward pass: one token for every decoding sequence (and the draft of a
//!    speculating one), then chunks of the prompts being prefilled, up to `max_batch_tokens`
//!    rows; while any sequence decodes, the prompt rows are those that keep the pass within
//!    `itl_target_ms` ([`pace`]: a fit of how long iterations take for their rows, measured
//!    here), at least `prefill_chunk_tokens`, which bounds the pause a long prompt puts
//!    between two tokens of a running stream;
//! 2. **run** ([`run`](mod@run)) — runs that pass, while the constraint masks of the decoding
//!    sequences are computed on the other threads of the pool (a mask depends only on the
//!    sequence's state); the prompts advance, and a request's `n` sequences fork the prompt's
//!    cache when its prefill completes (the prompt enters the [`prefix`] cache). The result,
//!    a [`ModelOutput`], says which logits rows are whose;
//! 3. **sample** ([`sample`]) — samples every row that has logits, rows in parallel, each
//!    sequence with its own sampler, state, workspace and random stream;
//! 4. **emit** ([`emit`]) — sends each request its events, finishes sequences, and releases
//!    their blocks.
//!
//! The plan and the model's output keep their vectors from one iteration to the next (as do
//! the sequences their buffers), so that an iteration allocates nothing once they have grown.
//!
//! Because the model's rows are batch-invariant and every sequence owns its random stream, a
//! request's tokens and step records are the same whatever else runs with it.

mod admission;
mod emit;
mod pace;
mod plan;
mod prefix;
mod run;
mod sample;
mod seq;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::error::{EngineError, ErrorKind};
use crate::queue::{Inner, ReqCtx};
use crate::request::Event;

use pace::Pace;
use plan::Plan;
use prefix::PrefixCache;
use run::{ModelOutput, Runner};
use seq::{Progress, Seq};

/// The scheduler thread's state: the running sequences, the preempted ones, the prefix cache,
/// and the buffers its iterations reuse.
struct Scheduler {
    /// What the engine's handle and this thread share.
    inner: Arc<Inner>,
    /// The sequences in the batch.
    running: Vec<Seq>,
    /// Preempted requests' sequences, in the order the requests were submitted: they are
    /// admitted again before the queue.
    preempted: VecDeque<Vec<Seq>>,
    /// Per-request progress, by request id.
    progress: HashMap<u64, Progress>,
    /// Prompts' caches kept for reuse.
    prefix: PrefixCache,
    /// The forward pass's reused buffers.
    runner: Runner,
    /// The last iteration's plan, whose vectors the next plan reuses.
    spare_plan: Plan,
    /// The last iteration's model output, whose vectors the next pass reuses.
    spare_out: ModelOutput,
    /// How long iterations take for their rows, which sizes the prompt chunk to
    /// `itl_target_ms`.
    pace: Pace,
    /// The sequences [`Scheduler::emit`] finishes, `(request id, index)`; kept for its
    /// allocation.
    finished: Vec<(u64, usize)>,
    /// The sampler's scratch, one workspace per group of sequences sampled together
    /// ([`Scheduler::sample`]), not one per sequence (each holds several vocabulary-sized
    /// buffers: megabytes at 150,000 tokens).
    workspaces: nextok_core::WorkspacePool,
}

/// The scheduler thread's body: admits, drops cancelled requests and runs iterations until the
/// engine shuts down.
pub(crate) fn run(inner: Arc<Inner>) {
    let pace = Pace::new(&inner.shared.model.weights.config);
    let vocab_size = inner.shared.model.weights.config.vocab_size;
    let mut s = Scheduler {
        inner,
        pace,
        running: Vec::new(),
        preempted: VecDeque::new(),
        progress: HashMap::new(),
        prefix: PrefixCache::default(),
        runner: Runner::default(),
        spare_plan: Plan::default(),
        spare_out: ModelOutput::default(),
        finished: Vec::new(),
        workspaces: nextok_core::WorkspacePool::lazy(vocab_size),
    };
    loop {
        if !s.admit() {
            s.shutdown();
            return;
        }
        s.drop_cancelled();
        if s.running.is_empty() {
            continue;
        }
        rayon::scope(|_| s.iteration());
        s.inner.iterations.fetch_add(1, Ordering::Relaxed);
    }
}

impl Scheduler {
    /// One iteration: [`plan`](Self::plan) → [`run`](Self::run) → [`sample`](Self::sample) →
    /// [`emit`](Self::emit). When the pass fails, nothing was computed: the requests of its
    /// batch fail, the others wait for the next iteration.
    ///
    /// The iteration's time, from planning to the last event sent, goes to [`Scheduler::pace`].
    fn iteration(&mut self) {
        let start = Instant::now();
        let Some(plan) = self.plan() else {
            return;
        };
        match self.run(&plan) {
            Ok(out) => {
                self.count_passes(&plan);
                self.sample(&out);
                self.emit();
                self.spare_out = out;
                let rows = plan.rows.iter().sum();
                let units = self.pace.units(rows, plan.logits_rows);
                self.pace.record(units, start.elapsed().as_secs_f64());
            }
            Err(e) => self.fail_pass(&plan, e),
        }
        self.spare_plan = plan;
    }

    /// Counts the pass `plan` planned once for each request it ran rows of (a request's `n`
    /// sequences share one count).
    fn count_passes(&mut self, plan: &Plan) {
        let pass = self.inner.iterations.load(Ordering::Relaxed);
        for &i in &plan.seqs {
            let id = self.running[i].req.prepared.info.id;
            if let Some(p) = self.progress.get_mut(&id) {
                if p.last_pass != Some(pass) {
                    p.last_pass = Some(pass);
                    p.passes = p.passes.saturating_add(1);
                }
            }
        }
    }

    /// Fails the requests of the pass `plan` planned, whose forward pass failed with `e` (the
    /// other requests stay).
    fn fail_pass(&mut self, plan: &Plan, e: nextok_model::ModelError) {
        let reqs: Vec<Arc<ReqCtx>> = plan
            .seqs
            .iter()
            .map(|&i| self.running[i].req.clone())
            .collect();
        for r in reqs {
            if self.progress.contains_key(&r.prepared.info.id) {
                self.fail(&r, EngineError::model(e.clone()));
            }
        }
    }

    /// Publishes the running sequences and the blocks they hold (a shared block counts for
    /// every sequence that holds it) to the engine's counters.
    fn publish(&self) {
        self.inner
            .running_seqs
            .store(self.running.len(), Ordering::Relaxed);
        let held: usize = self.running.iter().map(|s| s.kv.blocks()).sum();
        self.inner.reserved_blocks.store(held, Ordering::Relaxed);
    }

    /// Drops the sequences of cancelled requests (and of those whose handle is gone), running
    /// or preempted.
    fn drop_cancelled(&mut self) {
        let mut gone: Vec<Arc<ReqCtx>> = Vec::new();
        let cancelled = |r: &ReqCtx| r.cancel.load(Ordering::Relaxed) || r.tx.is_closed();
        self.running.retain(|s| {
            let c = cancelled(&s.req);
            if c && !gone.iter().any(|g| Arc::ptr_eq(g, &s.req)) {
                gone.push(s.req.clone());
            }
            !c
        });
        self.preempted.retain(|g| match g.first() {
            Some(s) if cancelled(&s.req) => {
                gone.push(s.req.clone());
                false
            }
            Some(_) => true,
            None => false,
        });
        for r in gone {
            self.release(&r);
        }
    }

    /// Forgets request `r`'s progress and publishes the counters.
    fn release(&mut self, r: &ReqCtx) {
        self.progress.remove(&r.prepared.info.id);
        self.publish();
    }

    /// Ends request `r` with `e` and removes its sequences. The counters are published first,
    /// so whoever sees the error sees the sequences gone.
    fn fail(&mut self, r: &Arc<ReqCtx>, e: EngineError) {
        self.running.retain(|s| !Arc::ptr_eq(&s.req, r));
        self.preempted
            .retain(|g| g.first().is_some_and(|s| !Arc::ptr_eq(&s.req, r)));
        self.release(r);
        let _ = r.tx.send(Event::Error(e));
    }

    /// Ends every admitted request with [`ErrorKind::Shutdown`] and empties the prefix cache.
    fn shutdown(&mut self) {
        let reqs: Vec<Arc<ReqCtx>> = self
            .running
            .iter()
            .chain(self.preempted.iter().flatten())
            .map(|s| s.req.clone())
            .collect();
        for r in reqs {
            if self.progress.contains_key(&r.prepared.info.id) {
                self.fail(
                    &r,
                    EngineError::new(ErrorKind::Shutdown, "the engine is shutting down"),
                );
            }
        }
        self.prefix.clear();
    }
}
