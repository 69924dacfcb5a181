//! The scheduler thread: continuous batching.
//!
//! Each iteration:
//! 1. drops cancelled requests (their cache blocks are freed) and admits waiting ones, oldest
//!    first (preempted ones before the queue), while the running sequences (`max_num_seqs`) and
//!    the KV cache (`kv_budget_bytes`) have room: a request needs the blocks of its prompt now,
//!    not of its whole output — sequences take blocks as they grow. An admitted request's
//!    prompt starts from the longest prefix the prefix cache holds (its blocks are shared, not
//!    copied);
//! 2. makes room for the pass in the KV budget: the prefix cache gives up entries, prompt
//!    chunks wait, and as a last resort the request holding the most blocks is **preempted**:
//!    its blocks are freed and it goes back to the front of the queue with its sampler state;
//!    resumed, it recomputes its prompt and output so far (the model's rows are
//!    batch-invariant, so its cache and its tokens are exactly those it would have had);
//! 3. plans **one** forward pass: one token for every decoding sequence, then chunks of the
//!    prompts being prefilled, up to `max_batch_tokens` rows (and at most
//!    `prefill_chunk_tokens` prompt rows while any sequence decodes, which bounds the pause a
//!    long prompt puts between two tokens of a running stream);
//! 4. runs it, while the constraint masks of the decoding sequences are computed on the other
//!    threads of the pool (a mask depends only on the sequence's state);
//! 5. samples every row that has logits, rows in parallel, each with its own sampler, state,
//!    workspace and random stream; a request's `n` sequences fork the prompt's cache when its
//!    prefill completes;
//! 6. sends each request its events, finishes sequences, and releases their blocks.
//!
//! Because the model's rows are batch-invariant and every sequence owns its random stream, a
//! request's tokens and step records are the same whatever else runs with it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use nextok_core::{DecoderState, Draw, FinishReason, Layer, Sampler, Workspace};
use nextok_model::{BatchSeq, KvGeometry, LogitRows, Scratch, SeqKv};
use rayon::prelude::*;

use crate::error::{EngineError, ErrorKind};
use crate::queue::{Inner, ReqCtx};
use crate::request::{Event, Timing, TokenLogprobs, Usage};
use crate::speculative::{Adaptive, Drafter, DrafterKind, ModelDrafter, SpecOptions};

enum Phase {
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

struct Seq {
    req: Arc<ReqCtx>,
    index: usize,
    state: DecoderState,
    ws: Workspace,
    stream: nextok_core::text::TextStream,
    kv: SeqKv,
    phase: Phase,
    /// The selected token not yet fed, then this iteration's draft.
    feed: Vec<u32>,
    /// What a preempted sequence feeds again (see [`Phase::Recompute`]); empty otherwise.
    replay: Vec<u32>,
    generated: usize,
    /// This iteration's steps (several when a draft was accepted).
    outs: Vec<StepOut>,
    /// This iteration's failure.
    err: Option<EngineError>,
    /// Speculative decoding's per-sequence part.
    spec: Option<SpecSeq>,
    /// Drafted tokens verified, and accepted, in this iteration.
    drafted: usize,
    accepted: usize,
}

/// A speculating sequence's drafter, draft length and token history (prompt and output).
struct SpecSeq {
    options: SpecOptions,
    drafter: Box<dyn Drafter>,
    adapt: Adaptive,
    history: Vec<u32>,
    draft: Vec<u32>,
}

struct StepOut {
    token: u32,
    text: String,
    finish: Option<Option<FinishReason>>,
    logprobs: Option<TokenLogprobs>,
    record: Option<Box<nextok_core::StepRecord>>,
    ledger: Option<Box<nextok_core::Explanation>>,
}

/// Per-request progress kept by the scheduler.
struct Progress {
    remaining: usize,
    usage: Usage,
    admitted: Instant,
    first_token: Option<Instant>,
}

struct PrefixEntry {
    ids: Arc<Vec<u32>>,
    kv: SeqKv,
    used: u64,
}

struct Scheduler {
    inner: Arc<Inner>,
    running: Vec<Seq>,
    /// Preempted requests' sequences, in the order the requests were submitted: they are
    /// admitted again before the queue.
    preempted: VecDeque<Vec<Seq>>,
    progress: HashMap<u64, Progress>,
    prefix: Vec<PrefixEntry>,
    clock: u64,
    scratch: Scratch,
    logits: Vec<f32>,
    bufs: Bufs,
}

/// An iteration's bookkeeping, kept between iterations so that planning a pass allocates
/// nothing once the vectors have grown (the batch's borrowed rows reuse their allocation
/// through [`recycle`]).
#[derive(Default)]
struct Bufs {
    plan: Vec<usize>,
    owner: Vec<usize>,
    nrows: Vec<usize>,
    row_of: Vec<Option<(usize, usize)>>,
    completed: Vec<usize>,
    finished: Vec<(u64, usize)>,
    batch: Vec<BatchSeq<'static>>,
    preps: Vec<(&'static Sampler, &'static DecoderState)>,
}

/// `v`'s allocation as an empty vector of another element type with the same size and
/// alignment (the standard library collects such a map in place; otherwise this allocates,
/// which changes nothing else).
fn recycle<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
}

pub(crate) fn run(inner: Arc<Inner>) {
    let mut s = Scheduler {
        inner,
        running: Vec::new(),
        preempted: VecDeque::new(),
        progress: HashMap::new(),
        prefix: Vec::new(),
        clock: 0,
        scratch: Scratch::default(),
        logits: Vec::new(),
        bufs: Bufs::default(),
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
    /// Admits preempted requests, then waiting ones, in order, while they fit ([`Self::fits`]);
    /// the first that does not fit waits, and so does everything behind it. Waits while there
    /// is nothing to do. `false` on shutdown.
    fn admit(&mut self) -> bool {
        let inner = self.inner.clone();
        let mut q = inner.lock();
        loop {
            if q.shutdown {
                for r in q.waiting.drain(..) {
                    let _ = r.tx.send(Event::Error(EngineError::new(
                        ErrorKind::Shutdown,
                        "the engine is shutting down",
                    )));
                }
                return false;
            }
            let mut blocked = false;
            while let Some(g) = self.preempted.front() {
                let need: usize = g.iter().map(Seq::blocks_to_resume).sum();
                if !self.fits(g.len(), need) {
                    blocked = true;
                    break;
                }
                if let Some(g) = self.preempted.pop_front() {
                    self.resume(g);
                }
            }
            while let Some(r) = q.waiting.front().filter(|_| !blocked) {
                if r.cancel.load(Ordering::Relaxed) || r.tx.is_closed() {
                    q.waiting.pop_front();
                    continue;
                }
                let info = &r.prepared.info;
                let n = info.seeds.len();
                // the prompt's blocks, and a copy of its last block for every other sequence
                let need = KvGeometry::blocks_for(info.prompt_ids.len()) + (n - 1);
                if !self.fits(n, need) {
                    break;
                }
                let Some(r) = q.waiting.pop_front() else {
                    break;
                };
                self.start(r);
            }
            if !self.running.is_empty() {
                return true;
            }
            q = inner.wake.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Whether `seqs` more sequences needing `need` blocks fit now: within `max_num_seqs`, and
    /// the blocks alive, plus `need`, plus a block of growth for every running sequence, within
    /// the budget. The prefix cache gives up entries, least recently used first, to make room.
    /// With nothing running anything fits (a request that could never fit was refused when it
    /// was submitted).
    fn fits(&mut self, seqs: usize, need: usize) -> bool {
        if self.running.len() + seqs > self.inner.config.max_num_seqs {
            return false;
        }
        loop {
            let alive = self.inner.pool.blocks_in_use();
            if self.running.is_empty()
                || alive + need + self.running.len() <= self.inner.budget_blocks
            {
                return true;
            }
            if !self.evict_prefix_entry() {
                return false;
            }
        }
    }

    /// Drops the least recently used prefix-cache entry; `false` when the cache is empty.
    fn evict_prefix_entry(&mut self) -> bool {
        match self.prefix.iter().enumerate().min_by_key(|(_, e)| e.used) {
            Some((i, _)) => {
                self.prefix.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Makes room in the KV budget for the next pass: the blocks its rows may need (every
    /// decoding sequence's token and longest draft, then the prompt chunks in plan order) must
    /// fit beside the blocks alive. Frees prefix-cache entries first, then holds the prompt
    /// chunks back (while some sequence decodes), then preempts the request holding the most
    /// blocks (the latest among equals) — never the last one running. Returns how many prompt
    /// rows the pass may take.
    fn make_room(&mut self) -> usize {
        let budget = self.inner.budget_blocks;
        let mut prefill_ok = true;
        loop {
            let (need, rows) = self.pass_bound(prefill_ok);
            if self.inner.pool.blocks_in_use() + need <= budget {
                return rows;
            }
            if self.evict_prefix_entry() {
                continue;
            }
            let decoding = self
                .running
                .iter()
                .any(|s| matches!(s.phase, Phase::Decode));
            if prefill_ok && decoding && rows > 0 {
                prefill_ok = false;
                continue;
            }
            // the request holding the most blocks
            let mut held: Vec<(u64, usize, Arc<ReqCtx>)> = Vec::new();
            for s in &self.running {
                let id = s.req.prepared.info.id;
                match held.iter_mut().find(|h| h.0 == id) {
                    Some(h) => h.1 += s.kv.blocks(),
                    None => held.push((id, s.kv.blocks(), s.req.clone())),
                }
            }
            if held.len() < 2 {
                return rows;
            }
            let Some(victim) = held.into_iter().max_by_key(|h| (h.1, h.0)).map(|h| h.2) else {
                return rows;
            };
            self.preempt(&victim);
        }
    }

    /// An upper bound of the blocks the next pass's rows need, and the prompt rows it plans
    /// (none unless `prefill`), computed as [`Self::iteration`] plans.
    fn pass_bound(&self, prefill: bool) -> (usize, usize) {
        let mut used = 0;
        let mut need = 0;
        for s in &self.running {
            if matches!(s.phase, Phase::Decode) {
                let rows = 1 + s.spec.as_ref().map_or(0, |sp| sp.options.max_draft);
                need += s.kv.blocks_to_write(rows);
                used += rows;
            }
        }
        if !prefill {
            return (need, 0);
        }
        let mut left_rows = self.prefill_share(used);
        let mut rows = 0;
        for s in &self.running {
            let Some(left) = s.rows_to_cache() else {
                continue;
            };
            let take = left.min(left_rows);
            left_rows -= take;
            rows += take;
            need += s.kv.blocks_to_write(take);
        }
        (need, rows)
    }

    /// The prompt rows a pass may take beside `used` decode rows: a bounded share
    /// (`prefill_chunk_tokens`) while sequences decode, the whole `max_batch_tokens` otherwise.
    fn prefill_share(&self, used: usize) -> usize {
        let budget = self.inner.config.max_batch_tokens;
        if used > 0 {
            budget
                .saturating_sub(used)
                .min(self.inner.config.prefill_chunk_tokens)
        } else {
            budget
        }
    }

    /// Takes request `r`'s sequences out of the batch and frees their blocks; they wait in
    /// [`Scheduler::preempted`] with their sampler state, to recompute their cache when
    /// admitted again.
    fn preempt(&mut self, r: &Arc<ReqCtx>) {
        let mut group = Vec::new();
        let mut i = 0;
        while i < self.running.len() {
            if Arc::ptr_eq(&self.running[i].req, r) {
                group.push(self.running.remove(i));
            } else {
                i += 1;
            }
        }
        for s in &mut group {
            s.phase = match s.phase {
                Phase::Decode => {
                    let prompt = &s.req.prepared.info.prompt_ids;
                    let out = s.state.selected_ids();
                    s.replay.clear();
                    s.replay.extend_from_slice(prompt);
                    // the pending token (the last selected) is fed when decoding resumes
                    s.replay
                        .extend_from_slice(&out[..out.len().saturating_sub(1)]);
                    debug_assert_eq!(s.replay.len(), s.kv.len());
                    Phase::Recompute { done: 0 }
                }
                Phase::Recompute { .. } => Phase::Recompute { done: 0 },
                Phase::Prefill { .. } => Phase::Prefill { done: 0 },
                Phase::AwaitFork => Phase::AwaitFork,
            };
            s.kv = self.inner.pool.sequence();
            s.feed.truncate(1);
            if let Some(sp) = &mut s.spec {
                sp.draft.clear();
            }
        }
        let id = r.prepared.info.id;
        let at = self
            .preempted
            .iter()
            .position(|g| g.first().is_some_and(|s| s.req.prepared.info.id > id))
            .unwrap_or(self.preempted.len());
        self.preempted.insert(at, group);
        self.inner.preemptions.fetch_add(1, Ordering::Relaxed);
        self.publish();
    }

    /// Puts a preempted request's sequences back in the batch: each starts again from the
    /// longest prefix the prefix cache holds.
    fn resume(&mut self, group: Vec<Seq>) {
        for mut s in group {
            match s.phase {
                Phase::Prefill { .. } => {
                    let (kv, done) = self
                        .lookup(&s.req.prepared.info.prompt_ids)
                        .unwrap_or_else(|| (self.inner.pool.sequence(), 0));
                    s.kv = kv;
                    s.phase = Phase::Prefill { done };
                }
                Phase::Recompute { .. } => {
                    let (kv, done) = match s.replay.len() {
                        0 => (self.inner.pool.sequence(), 0),
                        _ => {
                            let replay = std::mem::take(&mut s.replay);
                            let found = self.lookup(&replay);
                            s.replay = replay;
                            found.unwrap_or_else(|| (self.inner.pool.sequence(), 0))
                        }
                    };
                    s.kv = kv;
                    s.phase = Phase::Recompute { done };
                }
                Phase::Decode | Phase::AwaitFork => {}
            }
            self.running.push(s);
        }
        self.publish();
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

    fn start(&mut self, r: Arc<ReqCtx>) {
        let inner = self.inner.clone();
        let info = &r.prepared.info;
        let prompt = &info.prompt_ids;
        let (kv, cached) = match self.lookup(prompt) {
            Some((kv, n)) => (kv, n),
            None => (inner.pool.sequence(), 0),
        };
        inner
            .prompt_tokens
            .fetch_add(prompt.len() as u64, Ordering::Relaxed);
        inner
            .cached_tokens
            .fetch_add(cached as u64, Ordering::Relaxed);
        self.progress.insert(
            info.id,
            Progress {
                remaining: info.seeds.len(),
                usage: Usage {
                    prompt_tokens: prompt.len(),
                    cached_tokens: cached,
                    completion_tokens: 0,
                },
                admitted: Instant::now(),
                first_token: None,
            },
        );
        let sampler = &r.prepared.sampler;
        let mut kv = Some(kv);
        for (i, &seed) in info.seeds.iter().enumerate() {
            let mut state = match sampler.new_state(prompt, seed) {
                Ok(s) => s,
                Err(e) => {
                    self.fail(&r, EngineError::core(e));
                    return;
                }
            };
            if let Some(c) = &r.prepared.constraint {
                state.set_grammar(Box::new(c.start()));
            }
            sampler.reserve(&mut state, info.max_tokens as usize);
            self.running.push(Seq {
                req: r.clone(),
                index: i,
                state,
                ws: sampler.new_workspace(),
                stream: sampler.text_stream(),
                kv: kv.take().unwrap_or_else(|| inner.pool.sequence()),
                phase: if i == 0 {
                    Phase::Prefill { done: cached }
                } else {
                    Phase::AwaitFork
                },
                feed: Vec::with_capacity(1 + r.prepared.speculative.map_or(0, |o| o.max_draft)),
                replay: Vec::new(),
                generated: 0,
                outs: Vec::new(),
                err: None,
                spec: r.prepared.speculative.map(|o| SpecSeq {
                    options: o,
                    drafter: match (o.drafter, &inner.shared.draft) {
                        (DrafterKind::Model, Some(d)) => {
                            match ModelDrafter::new(d, &inner.shared.model) {
                                Ok(m) => Box::new(m) as Box<dyn Drafter>,
                                // (checked when the engine started): prompt lookup instead
                                Err(_) => Box::new(o.ngram),
                            }
                        }
                        _ => Box::new(o.ngram),
                    },
                    adapt: Adaptive::new(o.max_draft),
                    history: prompt.clone(),
                    draft: Vec::with_capacity(o.max_draft),
                }),
                drafted: 0,
                accepted: 0,
            });
        }
        self.publish();
    }

    /// The longest cached prefix of `prompt` (at most all but its last token, whose logits
    /// the request needs).
    fn lookup(&mut self, prompt: &[u32]) -> Option<(SeqKv, usize)> {
        let mut best: Option<(usize, usize)> = None;
        for (i, e) in self.prefix.iter().enumerate() {
            let common = e
                .ids
                .iter()
                .zip(prompt)
                .take_while(|(a, b)| a == b)
                .count()
                .min(prompt.len() - 1)
                .min(e.kv.len());
            if common > 0 && best.is_none_or(|(_, c)| common > c) {
                best = Some((i, common));
            }
        }
        let (i, n) = best?;
        self.clock += 1;
        self.prefix[i].used = self.clock;
        let mut kv = self.prefix[i].kv.clone();
        kv.truncate(n).ok()?;
        Some((kv, n))
    }

    fn remember(&mut self, ids: Arc<Vec<u32>>, kv: SeqKv) {
        let max = self.inner.config.prefix_cache_entries;
        if max == 0 {
            return;
        }
        self.clock += 1;
        self.prefix.retain(|e| e.ids != ids);
        if self.prefix.len() >= max {
            if let Some((i, _)) = self.prefix.iter().enumerate().min_by_key(|(_, e)| e.used) {
                self.prefix.swap_remove(i);
            }
        }
        self.prefix.push(PrefixEntry {
            ids,
            kv,
            used: self.clock,
        });
    }

    /// Drops prefix-cache entries, oldest first, while the cache blocks alive exceed the
    /// budget.
    fn trim_prefix_cache(&mut self) {
        while self.inner.pool.blocks_in_use() > self.inner.budget_blocks {
            if !self.evict_prefix_entry() {
                break;
            }
        }
    }

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

    fn release(&mut self, r: &ReqCtx) {
        self.progress.remove(&r.prepared.info.id);
        self.publish();
    }

    /// Ends request `r` with `e` and removes its sequences.
    fn fail(&mut self, r: &Arc<ReqCtx>, e: EngineError) {
        let _ = r.tx.send(Event::Error(e));
        self.running.retain(|s| !Arc::ptr_eq(&s.req, r));
        self.preempted
            .retain(|g| g.first().is_some_and(|s| !Arc::ptr_eq(&s.req, r)));
        self.release(r);
    }

    fn iteration(&mut self) {
        let prefill_rows = self.make_room();
        if self.running.is_empty() {
            return;
        }
        let budget = self.inner.config.max_batch_tokens;
        // 1. plan: decode rows first, then prompt chunks
        let mut bufs = std::mem::take(&mut self.bufs);
        let plan = &mut bufs.plan;
        plan.clear();
        plan.resize(self.running.len(), 0);
        let mut used = 0;
        for (i, s) in self.running.iter().enumerate() {
            if matches!(s.phase, Phase::Decode) {
                plan[i] = 1;
                used += 1;
            }
        }
        // drafts of speculating sequences, in the budget decode rows leave
        let ctx = self.inner.shared.model.weights.config.context_length;
        for (i, s) in self.running.iter_mut().enumerate() {
            if !matches!(s.phase, Phase::Decode) {
                continue;
            }
            s.feed.truncate(1);
            let Some(sp) = &mut s.spec else {
                continue;
            };
            let room = ctx.saturating_sub(s.kv.len() + 2);
            // rows past the output limit would never be verified
            let left = (s.req.prepared.info.max_tokens as usize).saturating_sub(s.generated + 1);
            let k = sp
                .adapt
                .next_len()
                .min(room)
                .min(left)
                .min(budget.saturating_sub(used));
            sp.drafter.draft(&sp.history, k, &mut sp.draft);
            s.feed.extend_from_slice(&sp.draft);
            plan[i] += sp.draft.len();
            used += sp.draft.len();
        }
        // prompt chunks: a bounded share while sequences decode, the whole budget otherwise
        let mut prefill = self.prefill_share(used).min(prefill_rows);
        for (i, s) in self.running.iter().enumerate() {
            let Some(left) = s.rows_to_cache() else {
                continue;
            };
            let take = left.min(prefill);
            prefill -= take;
            plan[i] = take;
        }
        // 2. one forward pass, the masks of decoding rows computed alongside
        let mut batch: Vec<BatchSeq<'_>> = recycle(std::mem::take(&mut bufs.batch));
        let mut preps: Vec<(&Sampler, &DecoderState)> = recycle(std::mem::take(&mut bufs.preps));
        let owner = &mut bufs.owner;
        owner.clear();
        for (i, s) in self.running.iter_mut().enumerate() {
            if plan[i] == 0 {
                continue;
            }
            let Seq {
                req,
                kv,
                phase,
                feed,
                state,
                replay,
                ..
            } = s;
            let (tokens, logits): (&[u32], LogitRows) = match phase {
                Phase::Decode => {
                    if state.grammar().is_some_and(|g| g.is_active()) {
                        preps.push((&req.prepared.sampler, &*state));
                    }
                    let rows = if feed.len() > 1 {
                        LogitRows::All
                    } else {
                        LogitRows::Last
                    };
                    (&feed[..], rows)
                }
                Phase::Prefill { done } => {
                    let ids = &req.prepared.info.prompt_ids;
                    let end = *done + plan[i];
                    let rows = if end == ids.len() {
                        LogitRows::Last
                    } else {
                        LogitRows::None
                    };
                    (&ids[*done..end], rows)
                }
                // the pending token was selected before the preemption: no logits
                Phase::Recompute { done } => (&replay[*done..*done + plan[i]], LogitRows::None),
                Phase::AwaitFork => continue,
            };
            owner.push(i);
            batch.push(BatchSeq { kv, tokens, logits });
        }
        let weights = self.inner.shared.model.weights.clone();
        let (scratch, logits) = (&mut self.scratch, &mut self.logits);
        let (fwd, prep) = rayon::join(
            || weights.forward_batch(&mut batch, scratch, logits),
            || {
                preps
                    .par_iter()
                    .map(|(sampler, state)| sampler.prepare(state))
                    .find_any(|r| r.is_err())
            },
        );
        let nrows = &mut bufs.nrows;
        nrows.clear();
        nrows.extend(batch.iter().map(|b| match b.logits {
            LogitRows::None => 0,
            LogitRows::Last => 1,
            LogitRows::All => b.tokens.len(),
        }));
        bufs.batch = recycle(batch);
        bufs.preps = recycle(preps);
        if let Err(e) = fwd {
            // nothing was computed: fail the requests of this batch, keep the others
            let reqs: Vec<Arc<ReqCtx>> =
                owner.iter().map(|&i| self.running[i].req.clone()).collect();
            for r in reqs {
                if self.progress.contains_key(&r.prepared.info.id) {
                    self.fail(&r, EngineError::model(e.clone()));
                }
            }
            self.bufs = bufs;
            return;
        }
        // a failed mask shows again in its step, where it ends that request alone
        let _ = prep;
        // 3. which rows have logits; prompts that completed; forks
        let vocab = self.inner.shared.model.weights.config.vocab_size;
        // (first row, rows) of each sequence's logits
        let row_of = &mut bufs.row_of;
        row_of.clear();
        row_of.resize(self.running.len(), None);
        let mut r = 0;
        let completed = &mut bufs.completed;
        completed.clear();
        for (k, &i) in owner.iter().enumerate() {
            let s = &mut self.running[i];
            match &mut s.phase {
                Phase::Prefill { done } => {
                    *done += plan[i];
                    if *done == s.req.prepared.info.prompt_ids.len() {
                        s.phase = Phase::Decode;
                        completed.push(i);
                    }
                }
                Phase::Recompute { done } => {
                    *done += plan[i];
                    if *done == s.replay.len() {
                        s.phase = Phase::Decode;
                        s.replay = Vec::new();
                    }
                }
                _ => {}
            }
            if nrows[k] > 0 {
                row_of[i] = Some((r, nrows[k]));
                r += nrows[k];
            }
        }
        for &i in completed.iter() {
            let kv = self.running[i].kv.clone();
            let req = self.running[i].req.clone();
            let row = row_of[i];
            for (j, s) in self.running.iter_mut().enumerate() {
                if Arc::ptr_eq(&s.req, &req) && matches!(s.phase, Phase::AwaitFork) {
                    s.kv = kv.clone();
                    s.phase = Phase::Decode;
                    row_of[j] = row;
                }
            }
            let ids = Arc::new(req.prepared.info.prompt_ids.clone());
            self.remember(ids, kv);
        }
        // 4. sample every sequence, in parallel; a speculating sequence steps through its rows
        //    while its selections agree with the draft
        let logits = &self.logits;
        self.running
            .par_iter_mut()
            .zip(row_of.par_iter())
            .for_each(|(s, row)| {
                s.outs.clear();
                s.err = None;
                s.drafted = 0;
                s.accepted = 0;
                if let Some((r0, count)) = *row {
                    s.step_rows(&logits[r0 * vocab..(r0 + count) * vocab], count, ctx);
                }
            });
        // 5. events, finishes
        let now = Instant::now();
        let finished = &mut bufs.finished;
        finished.clear();
        let mut failed: Vec<(Arc<ReqCtx>, EngineError)> = Vec::new();
        let mut sampled = 0u64;
        let (mut drafted, mut accepted) = (0u64, 0u64);
        for s in self.running.iter_mut() {
            drafted += s.drafted as u64;
            accepted += s.accepted as u64;
            let id = s.req.prepared.info.id;
            if let Some(e) = s.err.take() {
                if !failed.iter().any(|(r, _)| Arc::ptr_eq(r, &s.req)) {
                    failed.push((s.req.clone(), e));
                }
                continue;
            }
            for out in s.outs.drain(..) {
                sampled += 1;
                let tx = &s.req.tx;
                if let Some(l) = out.ledger {
                    let _ = tx.send(Event::Ledger {
                        seq: s.index,
                        explanation: l,
                    });
                }
                if let Some(rec) = out.record {
                    let _ = tx.send(Event::Record {
                        seq: s.index,
                        record: rec,
                    });
                }
                let _ = tx.send(Event::Token {
                    seq: s.index,
                    id: out.token,
                    text: out.text,
                    logprobs: out.logprobs,
                });
                s.generated += 1;
                if let Some(p) = self.progress.get_mut(&id) {
                    p.usage.completion_tokens += 1;
                    p.first_token.get_or_insert(now);
                }
                if let Some(reason) = out.finish {
                    let text = s.stream.finish();
                    let _ = tx.send(Event::Finish {
                        seq: s.index,
                        reason,
                        text,
                        tokens: s.generated,
                    });
                    finished.push((id, s.index));
                }
            }
        }
        self.inner
            .completion_tokens
            .fetch_add(sampled, Ordering::Relaxed);
        self.inner
            .draft_tokens
            .fetch_add(drafted, Ordering::Relaxed);
        self.inner
            .accepted_draft_tokens
            .fetch_add(accepted, Ordering::Relaxed);
        for (req, e) in failed {
            self.fail(&req, e);
        }
        let mut ended: Vec<Arc<ReqCtx>> = Vec::new();
        self.running.retain(|s| {
            let key = (s.req.prepared.info.id, s.index);
            if finished.contains(&key) {
                ended.push(s.req.clone());
                false
            } else {
                true
            }
        });
        for req in ended {
            let id = req.prepared.info.id;
            let done = match self.progress.get_mut(&id) {
                Some(p) => {
                    p.remaining -= 1;
                    p.remaining == 0
                }
                None => false,
            };
            if !done {
                continue;
            }
            if let Some(p) = self.progress.get(&id) {
                let sub = req.submitted;
                let timing = Timing {
                    queued: p.admitted.saturating_duration_since(sub),
                    time_to_first_token: p
                        .first_token
                        .map(|t| t.saturating_duration_since(sub))
                        .unwrap_or_default(),
                    total: now.saturating_duration_since(sub),
                };
                let _ = req.tx.send(Event::Done {
                    usage: p.usage,
                    timing,
                });
            }
            self.release(&req);
        }
        self.publish();
        self.trim_prefix_cache();
        self.bufs = bufs;
    }

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

impl Seq {
    /// The positions a prefilling or recomputing sequence has still to cache; `None` for the
    /// others.
    fn rows_to_cache(&self) -> Option<usize> {
        match self.phase {
            Phase::Prefill { done } => Some(self.req.prepared.info.prompt_ids.len() - done),
            Phase::Recompute { done } => Some(self.replay.len() - done),
            _ => None,
        }
    }

    /// The blocks a preempted sequence needs to be admitted again: its prompt, or its prompt
    /// and output so far (a forked one waits for the first).
    fn blocks_to_resume(&self) -> usize {
        match self.phase {
            Phase::Prefill { .. } => {
                KvGeometry::blocks_for(self.req.prepared.info.prompt_ids.len())
            }
            Phase::Recompute { .. } => KvGeometry::blocks_for(self.replay.len()),
            Phase::Decode | Phase::AwaitFork => 0,
        }
    }

    /// Steps through `count` rows of logits (`count > 1`: the pending token and a draft were
    /// fed): each row's selection is an output; the next row is used only while the selection
    /// equals the drafted token that row was computed after. Then the cache keeps the
    /// positions of the accepted tokens and the last selection becomes the pending token.
    fn step_rows(&mut self, rows: &[f32], count: usize, ctx: usize) {
        let vocab = rows.len() / count.max(1);
        let mut accepted = 0;
        let mut last = None;
        for j in 0..count {
            // the position the token selected now would be fed at
            let fed_at = self.kv.len() - (count - 1 - j);
            // the drafted token this row verifies
            let draft = if j + 1 < count {
                self.feed.get(j + 1).copied()
            } else {
                None
            };
            match self.sample(&rows[j * vocab..(j + 1) * vocab], fed_at, ctx, draft) {
                Err(e) => {
                    self.err = Some(e);
                    return;
                }
                Ok(o) => {
                    let (token, finished) = (o.token, o.finish.is_some());
                    self.outs.push(o);
                    if let Some(sp) = &mut self.spec {
                        sp.history.push(token);
                    }
                    last = Some(token);
                    if finished {
                        break;
                    }
                    if j + 1 < count && self.feed.get(j + 1) == Some(&token) {
                        accepted += 1;
                        continue;
                    }
                    break;
                }
            }
        }
        if count > 1 {
            self.drafted = count - 1;
            self.accepted = accepted;
            if let Some(sp) = &mut self.spec {
                sp.adapt.observe(count - 1, accepted);
            }
            let keep = self.kv.len() - (count - 1 - accepted);
            if let Err(e) = self.kv.truncate(keep) {
                self.err = Some(EngineError::model(e));
                return;
            }
        }
        if let Some(t) = last {
            self.feed.clear();
            self.feed.push(t);
        }
    }

    /// One step of this sequence on its logits row; the selected token would be fed at
    /// position `fed_at`; `draft` is the drafted token the row verifies.
    fn sample(
        &mut self,
        row: &[f32],
        fed_at: usize,
        ctx: usize,
        draft: Option<u32>,
    ) -> std::result::Result<StepOut, EngineError> {
        let p = &self.req.prepared;
        let sampler = &p.sampler;
        let spec = self
            .spec
            .as_ref()
            .map_or_else(SpecOptions::default, |s| s.options);
        let draw = spec.draw(draft);
        let ledger = match p.ledger_step {
            Some(k) if k == self.state.step() => Some(Box::new(
                sampler
                    .explain(row, &self.state, Draw::Stream)
                    .map_err(EngineError::core)?,
            )),
            _ => None,
        };
        let want_record = p.records.is_some() || p.logprobs.is_some();
        let (res, record) = if want_record {
            let cands = p.records.unwrap_or(0).max(p.logprobs.map_or(0, |l| l.top));
            let (res, mut rec) = sampler
                .step_recorded(row, &mut self.state, &mut self.ws, draw, cands)
                .map_err(EngineError::core)?;
            spec.mark(&mut rec, draft);
            (res, Some(rec))
        } else {
            (
                sampler
                    .step_draw(row, &mut self.state, &mut self.ws, draw)
                    .map_err(EngineError::core)?,
                None,
            )
        };
        let logprobs = match (&p.logprobs, &record) {
            (Some(l), Some(rec)) => {
                let sel = sampler
                    .logprob(row, &mut self.ws, rec.selected, l.layer)
                    .map_err(EngineError::core)?;
                let val = |c: &nextok_core::record::CandidateRecord| match l.layer {
                    Layer::Raw => c.raw_logprob,
                    Layer::Processed => c.processed_logprob,
                    Layer::Selection => c.selection_logprob,
                };
                Some(TokenLogprobs {
                    layer: l.layer,
                    selected: sel.value,
                    top: rec
                        .candidates
                        .iter()
                        .take(l.top)
                        .map(|c| (c.id, val(c)))
                        .collect(),
                })
            }
            _ => None,
        };
        let text = self.stream.push(
            sampler.visible_bytes(res.token),
            self.state.stop_state().hit.as_ref(),
        );
        let ctx_full = fed_at >= ctx;
        let finish = match res.finish {
            Some(r) => Some(Some(r)),
            None if ctx_full => Some(None),
            None => None,
        };
        Ok(StepOut {
            token: res.token,
            text,
            finish,
            logprobs,
            record: if p.records.is_some() {
                record.map(Box::new)
            } else {
                None
            },
            ledger,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pass's borrowed rows keep one allocation from iteration to iteration.
    #[test]
    fn recycle_keeps_the_allocation() {
        let a = 7u32;
        let mut v: Vec<(&u32, &u32)> = Vec::with_capacity(16);
        v.push((&a, &a));
        let (ptr, cap) = (v.as_ptr() as usize, v.capacity());
        let w: Vec<(&'static Sampler, &'static DecoderState)> = recycle(v);
        assert!(w.is_empty());
        assert_eq!((w.as_ptr() as usize, w.capacity()), (ptr, cap));
    }
}
