//! Admission and the KV budget: which requests enter the batch ([`Scheduler::admit`]), whether
//! they fit ([`Scheduler::fits`]), making room for a pass ([`Scheduler::make_room`]: the prefix
//! cache gives up entries, prompt chunks wait, a request is preempted), preempting and resuming
//! a request, and starting an admitted request's sequences.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use nextok_model::KvGeometry;

use super::seq::{Phase, Progress, Seq, SpecSeq};
use super::Scheduler;
use crate::error::{EngineError, ErrorKind};
use crate::queue::ReqCtx;
use crate::request::{Event, Usage};
use crate::speculative::{Adaptive, Drafter, DrafterKind, ModelDrafter};

impl Scheduler {
    /// Admits preempted requests, then waiting ones, in order, while they fit ([`Self::fits`]);
    /// the first that does not fit waits, and so does everything behind it. Waits while there
    /// is nothing to do. `false` on shutdown.
    pub(super) fn admit(&mut self) -> bool {
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
                // the prompt's blocks, and a copy of its last block for every other sequence;
                // a resumed request's sequences each cache their prompt and tokens
                let need = match &r.prepared.resume {
                    None => KvGeometry::blocks_for(info.prompt_ids.len()) + (n - 1),
                    Some(res) => res
                        .iter()
                        .map(|t| KvGeometry::blocks_for(info.prompt_ids.len() + t.len()))
                        .sum(),
                };
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
            if !self.prefix.evict() {
                return false;
            }
        }
    }

    /// Makes room in the KV budget for the next pass: the blocks its rows may need (every
    /// decoding sequence's token and longest draft, then the prompt chunks in plan order) must
    /// fit beside the blocks alive. Frees prefix-cache entries first, then holds the prompt
    /// chunks back (while some sequence decodes), then preempts the request holding the most
    /// blocks (the latest among equals) — never the last one running. Returns how many prompt
    /// rows the pass may take.
    pub(super) fn make_room(&mut self) -> usize {
        let budget = self.inner.budget_blocks;
        let mut prefill_ok = true;
        loop {
            let (need, rows) = self.pass_bound(prefill_ok);
            if self.inner.pool.blocks_in_use() + need <= budget {
                return rows;
            }
            if self.prefix.evict() {
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
    /// (none unless `prefill`), computed as [`Self::plan`] plans.
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

    /// The prompt rows a pass may take beside `used` decode rows: while sequences decode, the
    /// rows that keep the pass within `itl_target_ms` ([`Pace`](super::pace::Pace); at least
    /// `prefill_chunk_tokens`, exactly that when the target is 0 or nothing is measured yet);
    /// the whole `max_batch_tokens` otherwise.
    pub(super) fn prefill_share(&self, used: usize) -> usize {
        let config = &self.inner.config;
        let budget = config.max_batch_tokens;
        if used == 0 {
            return budget;
        }
        let floor = config.prefill_chunk_tokens;
        let paced = match config.itl_target_ms {
            0 => None,
            ms => self
                .pace
                .prompt_rows(self.pace.units(used, used), ms as f64 / 1e3),
        };
        budget
            .saturating_sub(used)
            .min(paced.map_or(floor, |p| p.max(floor)))
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
                        .prefix
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
                            let found = self.prefix.lookup(&replay);
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

    /// Admits request `r`: its progress, and its `n` sequences — the first prefills the prompt
    /// from the longest prefix the prefix cache holds, the others wait to fork it. Builds a
    /// speculating sequence's drafter.
    fn start(&mut self, r: Arc<ReqCtx>) {
        let inner = self.inner.clone();
        let info = &r.prepared.info;
        let prompt = &info.prompt_ids;
        let (kv, cached) = match self.prefix.lookup(prompt) {
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
                passes: 0,
                last_pass: None,
            },
        );
        let ctx = inner.shared.model.weights.config.context_length;
        // every sequence's state first: a failure leaves nothing of the request running
        let mut states = Vec::with_capacity(info.seeds.len());
        for i in 0..info.seeds.len() {
            match r.prepared.take_state(i, ctx) {
                Ok(s) => states.push(s),
                Err(e) => {
                    self.fail(&r, e);
                    return;
                }
            }
        }
        let resumed_tokens: usize = (0..states.len()).map(|i| r.prepared.resumed(i).len()).sum();
        if let Some(p) = self.progress.get_mut(&info.id) {
            p.usage.completion_tokens += resumed_tokens;
        }
        let mut kv = Some(kv);
        // the sequence that caches the prompt (the others fork it): the first that starts
        // afresh
        let mut prefiller = None;
        for (i, st) in states.into_iter().enumerate() {
            let resumed = r.prepared.resumed(i);
            if let Some(reason) = st.finish {
                // its tokens already end it: it ends now, with the text held back
                let mut stream = st.stream;
                let _ = r.tx.send(Event::Finish {
                    seq: i,
                    reason,
                    text: stream.finish(),
                    tokens: resumed.len(),
                });
                if let Some(p) = self.progress.get_mut(&info.id) {
                    p.remaining -= 1;
                }
                continue;
            }
            let (phase, seq_kv, replay, feed) = if resumed.is_empty() {
                let phase = if prefiller.is_none() {
                    prefiller = Some(i);
                    Phase::Prefill { done: cached }
                } else {
                    Phase::AwaitFork
                };
                let seq_kv = match phase {
                    Phase::Prefill { .. } => kv.take().unwrap_or_else(|| inner.pool.sequence()),
                    _ => inner.pool.sequence(),
                };
                (phase, seq_kv, Vec::new(), None)
            } else {
                // the prompt and every resumed token but the last are cached as a preempted
                // sequence's are; the last is the pending token, fed when decoding starts
                let mut replay = Vec::with_capacity(prompt.len() + resumed.len());
                replay.extend_from_slice(prompt);
                replay.extend_from_slice(&resumed[..resumed.len() - 1]);
                let (seq_kv, done) = self
                    .prefix
                    .lookup(&replay)
                    .unwrap_or_else(|| (inner.pool.sequence(), 0));
                let phase = if done == replay.len() {
                    Phase::Decode
                } else {
                    Phase::Recompute { done }
                };
                (phase, seq_kv, replay, resumed.last().copied())
            };
            let mut feed_buf =
                Vec::with_capacity(1 + r.prepared.speculative.map_or(0, |o| o.max_draft));
            feed_buf.extend(feed);
            self.running.push(Seq {
                req: r.clone(),
                index: i,
                state: st.state,
                stream: st.stream,
                kv: seq_kv,
                phase,
                feed: feed_buf,
                replay,
                generated: resumed.len(),
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
                    history: prompt.iter().chain(resumed).copied().collect(),
                    draft: Vec::with_capacity(o.max_draft),
                    scratch: crate::speculative::DraftScratch::with_capacity(o.max_draft),
                }),
                drafted: 0,
                accepted: 0,
            });
        }
        // every sequence's tokens ended it: the request is done
        let done = self
            .progress
            .get(&info.id)
            .is_some_and(|p| p.remaining == 0);
        if done {
            self.end(&r, Instant::now());
        }
        self.publish();
    }
}
