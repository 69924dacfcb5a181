//! The commit of a selected token: the 000 §3.10 update and the terminal checks.

use super::Sampler;
use crate::constraint::ConstraintStatus;
use crate::error::{Error, ErrorKind, Result};
use crate::pipeline::GrammarPolicy;
use crate::state::{DecoderState, FinishReason, FinishStatus};

impl Sampler {
    /// Appends `token` to `state` with the 000 §3.10 update and returns the terminal reason, if
    /// the token ends the sequence. Fails (leaving `state` untouched) for an out-of-range id or a
    /// finished sequence.
    pub fn commit(&self, state: &mut DecoderState, token: u32) -> Result<Option<FinishReason>> {
        if state.is_finished() {
            return Err(ErrorKind::AlreadyFinished.into());
        }
        if token as usize >= self.vocab.vocab_size {
            return Err(Error::out_of_range(
                "token",
                token as u64,
                self.vocab.vocab_size,
            ));
        }
        // grammar first: a token the constraint rejects leaves the whole state untouched
        if let Some(g) = state.grammar.as_ref().filter(|g| g.active) {
            g.with(|e| e.commit(token))?;
        }
        self.advance(state, token);
        let accepted = match state.grammar.as_mut().filter(|g| g.active) {
            Some(g) => {
                let status = g.status();
                let done = matches!(
                    status,
                    ConstraintStatus::Accepted | ConstraintStatus::OnlyEnd
                );
                match self.stop.grammar_policy {
                    GrammarPolicy::StopOnAccept => done,
                    GrammarPolicy::OnlyEnd => status == ConstraintStatus::OnlyEnd,
                    GrammarPolicy::Continue => {
                        if done {
                            g.active = false;
                        }
                        false
                    }
                }
            }
            None => false,
        };
        let reason =
            if !self.stop.ignore_eos && self.vocab.eos_token_ids.binary_search(&token).is_ok() {
                Some(FinishReason::Eos { token })
            } else if self.stop_ids.binary_search(&token).is_ok() {
                Some(FinishReason::StopToken { token })
            } else if let Some(h) = &state.stop.hit {
                Some(FinishReason::StopString {
                    pattern: h.pattern,
                    end: h.end,
                })
            } else if accepted {
                Some(FinishReason::GrammarAccepted)
            } else if self
                .stop
                .max_tokens
                .is_some_and(|m| state.selected_ids.len() as u64 >= m)
            {
                Some(FinishReason::MaxTokens)
            } else {
                None
            };
        if let Some(r) = reason {
            state.finish = FinishStatus::Finished { reason: r };
        }
        Ok(reason)
    }

    /// The §3.10 update without terminal checks (token already validated).
    pub(super) fn advance(&self, st: &mut DecoderState, token: u32) {
        // 1. history
        st.selected_ids.push(token);
        // 2. counts
        *st.counts_output.entry(token).or_insert(0) += 1;
        *st.counts_all.entry(token).or_insert(0) += 1;
        // 3. sequence-constraint state
        let pos = st.context_len() - 1;
        let mut slots = std::mem::take(&mut st.sequence);
        self.consume_slots(&mut slots, st, pos, token);
        st.sequence = slots;
        // 4. grammar state: committed by `commit` before any other change, so that a token the
        //    constraint rejects leaves the whole state untouched
        // 5. stop matcher, on the token's visible bytes; a stop string that completes before
        //    `min_tokens` output tokens exist does not count (the scan goes on)
        st.stop.observed += 1;
        if let (Some(ss), Some(scan)) = (&self.stop_strings, st.stop.scan.as_mut()) {
            let counts = st.selected_ids.len() as u64 >= self.min_tokens;
            if let Some(&(_, k)) = self.special_stops.iter().find(|e| e.0 == token) {
                // a special token that is exactly a stop string stops like one (it adds no text)
                if counts && st.stop.hit.is_none() && self.stop.skip_special_tokens {
                    let at = scan.bytes_seen;
                    st.stop.hit = Some(crate::stop::StopHit {
                        pattern: k,
                        stop: self.stop.stop[k].clone(),
                        end: at,
                        start: at,
                        end_in_token: 0,
                    });
                }
            }
            if st.stop.hit.is_none() {
                let mut rest = self.visible_bytes(token);
                while let Some(hit) = ss.feed(scan, rest) {
                    if counts {
                        st.stop.hit = Some(hit);
                        break;
                    }
                    rest = &rest[hit.end_in_token..];
                }
            }
        }
        // 6. random stream: the counter moves to the next step
        st.rng.counter = st.step + 1;
        // 7. step index
        st.step += 1;
    }
}
