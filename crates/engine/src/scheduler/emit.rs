//! Emitting a pass's steps: [`Scheduler::emit`] sends each request the events of its
//! sequences' steps (ledger, record, token, finish), counts them, ends the requests that
//! failed, finishes sequences, ends the requests whose sequences all finished (their usage and
//! timing) and releases their blocks.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::Scheduler;
use crate::error::EngineError;
use crate::queue::ReqCtx;
use crate::request::{Event, Timing};

impl Scheduler {
    /// Ends request `req`, all of whose sequences have finished: its `Done` event (usage and
    /// timing), then its blocks released.
    pub(super) fn end(&mut self, req: &Arc<ReqCtx>, now: Instant) {
        if let Some(p) = self.progress.get(&req.prepared.info.id) {
            let sub = req.submitted;
            let timing = Timing {
                queued: p.admitted.saturating_duration_since(sub),
                time_to_first_token: p
                    .first_token
                    .map(|t| t.saturating_duration_since(sub))
                    .unwrap_or_default(),
                total: now.saturating_duration_since(sub),
                forward_passes: p.passes,
            };
            let _ = req.tx.send(Event::Done {
                usage: p.usage,
                timing,
            });
        }
        self.release(req);
    }

    /// Sends the events of the steps [`Scheduler::sample`] left in the sequences, fails the
    /// requests whose step failed, removes finished sequences and ends the requests they
    /// complete; then publishes the counters and trims the prefix cache to the KV budget.
    pub(super) fn emit(&mut self) {
        let now = Instant::now();
        let mut finished = std::mem::take(&mut self.finished);
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
        // the counters first: whoever sees a request's end sees its sequences gone
        self.publish();
        for req in ended {
            let id = req.prepared.info.id;
            let done = match self.progress.get_mut(&id) {
                Some(p) => {
                    p.remaining -= 1;
                    p.remaining == 0
                }
                None => false,
            };
            if done {
                self.end(&req, now);
            }
        }
        self.publish();
        self.prefix.trim(&self.inner.pool, self.inner.budget_blocks);
        self.finished = finished;
    }
}
