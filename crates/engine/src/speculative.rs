//! Speculative decoding that returns exactly the tokens plain decoding would.
//!
//! A [`Drafter`] guesses the next few tokens cheaply; the target model scores the pending token
//! and the whole draft in one forward pass (one row of logits per position); then the
//! sequence's own sampler steps through those rows in order, exactly as plain decoding steps
//! through one row per model call. A drafted token is **accepted** when the sampler selects it
//! at its position with the sequence's own draw (the counter-based stream keys the draw by the
//! step, so it is the draw plain decoding uses there). At the first difference the sampler's
//! selection is emitted, the rows after it are discarded and the cache is cut back to the
//! accepted positions. Because the model's rows are batch-invariant (a row computed among the
//! draft's rows equals the row a one-token call computes), every step sees the very logits,
//! state and draw of plain decoding: the tokens, the step records and the finish reason are
//! identical; only the time changes. This is the `exact` acceptance mode.
//!
//! Drafting is adaptive ([`Adaptive`]): the draft length grows while drafts are accepted in
//! full, halves when one is rejected at its first token, and drafting pauses after repeated
//! misses, so a sequence the drafter cannot predict runs at the speed of plain decoding.

/// Proposes tokens that may follow a context.
pub trait Drafter: Send {
    /// Writes up to `k` tokens likely to follow `context` into `out` (cleared first); nothing
    /// when it has no guess.
    fn draft(&mut self, context: &[u32], k: usize, out: &mut Vec<u32>);
}

/// Prompt lookup: finds the latest earlier occurrence of the context's last `n` tokens (longest
/// `n` first, from `max_ngram` down to `min_ngram`) in the prompt and the output so far, and
/// proposes the tokens that followed it. Needs no second model; pays off where the output
/// copies from the prompt (extraction, editing, structured output about a given text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramDrafter {
    /// Longest suffix matched.
    pub max_ngram: usize,
    /// Shortest suffix matched (at least 1).
    pub min_ngram: usize,
}

impl Default for NgramDrafter {
    fn default() -> Self {
        NgramDrafter {
            max_ngram: 4,
            min_ngram: 2,
        }
    }
}

impl Drafter for NgramDrafter {
    fn draft(&mut self, context: &[u32], k: usize, out: &mut Vec<u32>) {
        out.clear();
        if k == 0 {
            return;
        }
        let len = context.len();
        for n in (self.min_ngram.max(1)..=self.max_ngram).rev() {
            if len <= n {
                continue;
            }
            let tail = &context[len - n..];
            // the latest earlier occurrence whose continuation is not empty
            for i in (0..len - n).rev() {
                if &context[i..i + n] == tail {
                    let start = i + n;
                    let end = (start + k).min(len);
                    out.extend_from_slice(&context[start..end]);
                    return;
                }
            }
        }
    }
}

/// A draft model: a smaller (or more coarsely quantised) model with the target's vocabulary,
/// proposing its greedy continuation. It keeps its own cache in step with the context: each
/// draft cuts it back to the longest prefix it shares with the context, feeds the rest, then
/// decodes `k` tokens greedily (raw logits, lowest id on ties).
pub struct ModelDrafter {
    src: nextok_model::LlamaSource,
    /// The tokens `src` has been fed, in order.
    fed: Vec<u32>,
}

impl std::fmt::Debug for ModelDrafter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelDrafter")
            .field("fed", &self.fed.len())
            .finish()
    }
}

impl ModelDrafter {
    /// A drafter from `draft` for a `target` model; refused unless both vocabularies hold the
    /// same tokens (the same bytes for every id).
    pub fn new(
        draft: &nextok_model::Model,
        target: &nextok_model::Model,
    ) -> crate::Result<ModelDrafter> {
        let (a, b) = (&draft.vocab.bytes, &target.vocab.bytes);
        if a.len() != b.len() {
            return Err(crate::EngineError::invalid(
                "draft_model",
                format!(
                    "its vocabulary has {} tokens, the target's {}",
                    a.len(),
                    b.len()
                ),
            ));
        }
        if let Some(id) = (0..a.len() as u32).find(|&i| a.get(i) != b.get(i)) {
            return Err(crate::EngineError::invalid(
                "draft_model",
                format!("token {id} differs from the target's: the vocabularies do not match"),
            ));
        }
        Ok(ModelDrafter {
            src: draft.source(),
            fed: Vec::new(),
        })
    }
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

impl Drafter for ModelDrafter {
    fn draft(&mut self, context: &[u32], k: usize, out: &mut Vec<u32>) {
        use nextok_model::LogitsSource;
        out.clear();
        if k == 0 || context.is_empty() {
            return;
        }
        // the shared prefix, keeping at least the last context token to feed (its logits give
        // the first draft token)
        let common = self
            .fed
            .iter()
            .zip(context)
            .take_while(|(a, b)| a == b)
            .count()
            .min(context.len() - 1);
        if self.src.truncate(common).is_err() {
            self.fed.clear();
            let _ = self.src.truncate(0);
        }
        self.fed.truncate(self.src.len());
        let Ok(row) = self.src.prefill(&context[self.fed.len()..]) else {
            return;
        };
        self.fed.extend_from_slice(&context[self.fed.len()..]);
        let mut t = argmax(&row);
        for i in 0..k {
            out.push(t);
            if i + 1 == k {
                break;
            }
            let Ok(row) = self.src.decode_one(t) else {
                return;
            };
            self.fed.push(t);
            t = argmax(&row);
        }
    }
}

/// Options of speculative decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecOptions {
    /// The most tokens one draft may hold.
    pub max_draft: usize,
    /// The prompt-lookup drafter's n-gram sizes.
    pub ngram: NgramDrafter,
}

impl Default for SpecOptions {
    fn default() -> Self {
        SpecOptions {
            max_draft: 5,
            ngram: NgramDrafter::default(),
        }
    }
}

/// What speculation did for one sequence.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Forward passes that verified a draft (with at least one drafted token).
    pub verifications: usize,
    /// Tokens drafted in those passes.
    pub drafted: usize,
    /// Drafted tokens accepted.
    pub accepted: usize,
}

impl SpecStats {
    /// Accepted / drafted (`0` when nothing was drafted).
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    /// Tokens accepted per verification (`0` when none ran).
    pub fn mean_accepted(&self) -> f64 {
        if self.verifications == 0 {
            0.0
        } else {
            self.accepted as f64 / self.verifications as f64
        }
    }
}

/// The draft length, adapted to how well drafts have done.
#[derive(Debug, Clone)]
pub struct Adaptive {
    max: usize,
    k: usize,
    misses: usize,
    pause: usize,
    /// Length of the next pause: doubles with every pause, back to [`PAUSE_STEPS`] once a
    /// draft is accepted.
    next_pause: usize,
}

/// Drafts rejected at their first token in a row before drafting pauses.
const MISSES_BEFORE_PAUSE: usize = 3;
/// Steps the first pause lasts.
const PAUSE_STEPS: usize = 8;
/// The longest pause.
const MAX_PAUSE_STEPS: usize = 128;

impl Adaptive {
    /// Starts at `max` tokens.
    pub fn new(max: usize) -> Adaptive {
        Adaptive {
            max,
            k: max,
            misses: 0,
            pause: 0,
            next_pause: PAUSE_STEPS,
        }
    }

    /// The length of the next draft (`0`: do not draft this step).
    pub fn next_len(&mut self) -> usize {
        if self.pause > 0 {
            self.pause -= 1;
            return 0;
        }
        self.k
    }

    /// Records that a draft of `drafted` tokens had `accepted` accepted.
    pub fn observe(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        if accepted == 0 {
            self.k = (self.k / 2).max(1);
            self.misses += 1;
            if self.misses >= MISSES_BEFORE_PAUSE {
                self.misses = 0;
                self.pause = self.next_pause;
                self.next_pause = (self.next_pause * 2).min(MAX_PAUSE_STEPS);
            }
            return;
        }
        self.misses = 0;
        self.next_pause = PAUSE_STEPS;
        self.k = if accepted == drafted {
            (self.k + 1).min(self.max)
        } else {
            accepted
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_proposes_what_followed_the_latest_match() {
        let mut d = NgramDrafter {
            max_ngram: 3,
            min_ngram: 1,
        };
        let mut out = Vec::new();
        // "1 2 3 4 5 … 1 2 3" → the longest suffix (2 3 after … 1) matched at 1..3 → 4 5
        d.draft(&[1, 2, 3, 4, 5, 9, 1, 2, 3], 2, &mut out);
        assert_eq!(out, [4, 5]);
        d.draft(&[1, 2, 3, 4, 5, 9, 1, 2, 3], 10, &mut out);
        assert_eq!(out, [4, 5, 9, 1, 2, 3]);
        // the latest occurrence wins: 7 8 then 7 6 → after "7" comes 6
        d.draft(&[7, 8, 7, 6, 7], 1, &mut out);
        assert_eq!(out, [6]);
        // no earlier occurrence of any suffix
        d.draft(&[1, 2, 3], 4, &mut out);
        assert!(out.is_empty());
        d.draft(&[1, 2, 1], 0, &mut out);
        assert!(out.is_empty());
        d.draft(&[], 3, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn adaptive_length_grows_shrinks_and_pauses() {
        let mut a = Adaptive::new(4);
        assert_eq!(a.next_len(), 4);
        a.observe(4, 1);
        assert_eq!(a.next_len(), 1);
        a.observe(1, 1);
        assert_eq!(a.next_len(), 2);
        for _ in 0..MISSES_BEFORE_PAUSE {
            let k = a.next_len();
            a.observe(k, 0);
        }
        for _ in 0..PAUSE_STEPS {
            assert_eq!(a.next_len(), 0);
        }
        assert_eq!(a.next_len(), 1);
        // the next pause is twice as long, until a draft is accepted
        for _ in 0..MISSES_BEFORE_PAUSE {
            let k = a.next_len();
            a.observe(k, 0);
        }
        for _ in 0..2 * PAUSE_STEPS {
            assert_eq!(a.next_len(), 0);
        }
        a.observe(1, 1);
        assert_eq!(a.next_len(), 2);
        for _ in 0..MISSES_BEFORE_PAUSE {
            let k = a.next_len();
            a.observe(k, 0);
        }
        for _ in 0..PAUSE_STEPS {
            assert_eq!(a.next_len(), 0);
        }
        assert_eq!(a.next_len(), 1);
        a.observe(0, 0); // nothing drafted changes nothing
        assert_eq!(a.next_len(), 1);
    }
}
