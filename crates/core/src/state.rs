//! Per-sequence decoder state (000 §3.2) and the post-selection transition (000 §3.10).
//!
//! A [`DecoderState`] is everything about one sequence that processors may read: prompt ids,
//! selected ids, token counts, sequence-constraint automaton states, a slot for grammar state,
//! stop state, the random stream, the step index and the finish status. It holds no model KV.
//! Processors only read it; it is changed only by [`Sampler::commit`](crate::Sampler::commit),
//! which applies the §3.10 update in order.

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::fxhash::FxHashMap;
use crate::rng::RngState;

/// Why a sequence finished (token-level terminal reasons).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum FinishReason {
    /// An EOS id of the vocabulary was selected.
    Eos {
        /// The EOS token.
        token: u32,
    },
    /// A request `stop_token_ids` entry was selected.
    StopToken {
        /// The stop token.
        token: u32,
    },
    /// A stop string completed in the output bytes.
    StopString {
        /// Index of the stop string in the request's `stop` list.
        pattern: usize,
        /// Byte offset in the output where the stop string ends (exclusive).
        end: u64,
    },
    /// The constraint accepted the output and the request's grammar policy ends there.
    GrammarAccepted,
    /// `max_tokens` output tokens were produced.
    MaxTokens,
}

/// Running, or finished with a reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum FinishStatus {
    /// More steps may run.
    Running,
    /// Terminal; no further step is allowed.
    Finished {
        /// Why.
        #[serde(flatten)]
        reason: FinishReason,
    },
}

/// Token occurrence counts (sparse).
pub type Counts = FxHashMap<u32, u32>;

/// State of one sequence-constraint processor (banned sequences or no-repeat n-gram).
#[derive(Debug, Clone, PartialEq)]
pub enum SequenceSlot {
    /// Current node of the banned-sequence automaton.
    Banned {
        /// Automaton node id.
        node: u32,
    },
    /// Index of the (n−1)-grams seen so far: hash of the (n−1)-gram → start positions.
    NGram {
        /// Map from the hash of an (n−1)-gram to the positions where it starts.
        index: FxHashMap<u64, Vec<u32>>,
    },
}

/// The grammar slot: a constraint engine's per-sequence state (000 §3.4).
///
/// Cloning forks the engine state (beams, `n > 1`); equality compares digests. The engine sits
/// behind a mutex because filling a mask may update the engine's caches; processors still only
/// read the decoder state, and only the step transition commits tokens to it.
///
/// The slot also caches the mask of its current engine state: [`crate::Sampler::prepare`]
/// fills it ahead of the step (for example on another thread while the model computes the
/// logits), and the grammar-mask processor then uses it instead of asking the engine again.
/// Every call that may change the engine state ([`GrammarSlot::with`]) drops the cache under the
/// same lock, so a cached mask always belongs to the state it is read with.
pub struct GrammarSlot {
    engine: std::sync::Mutex<Box<dyn crate::constraint::ConstraintState>>,
    pub(crate) mask: std::sync::Mutex<MaskCache>,
    /// Whether the constraint still masks (it stops masking after acceptance under the
    /// `continue` policy).
    pub(crate) active: bool,
}

/// The cached mask of a grammar slot: the bitset and the allowed ids ascending.
#[derive(Debug, Default)]
pub(crate) struct MaskCache {
    pub(crate) bits: Vec<u64>,
    pub(crate) allowed: Vec<u32>,
    /// Whether `bits`/`allowed` hold the mask of the engine's current state.
    pub(crate) ready: bool,
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl GrammarSlot {
    /// Wraps an engine state.
    pub fn new(engine: Box<dyn crate::constraint::ConstraintState>) -> Self {
        GrammarSlot {
            engine: std::sync::Mutex::new(engine),
            mask: Default::default(),
            active: true,
        }
    }

    /// Runs `f` on the engine state (which it may change: the cached mask is dropped).
    pub fn with<R>(
        &self,
        f: impl FnOnce(&mut Box<dyn crate::constraint::ConstraintState>) -> R,
    ) -> R {
        // lock order everywhere: mask, then engine
        let mut cache = lock(&self.mask);
        let mut g = lock(&self.engine);
        cache.ready = false;
        f(&mut g)
    }

    /// Runs `f` on the engine state without changing it (the cached mask stays).
    fn read<R>(&self, f: impl FnOnce(&dyn crate::constraint::ConstraintState) -> R) -> R {
        let g = lock(&self.engine);
        f(&**g)
    }

    /// Makes the cached mask current for a vocabulary of `vocab_size` tokens (a no-op when it
    /// already is), then runs `f` on it.
    pub(crate) fn with_mask<R>(
        &self,
        vocab_size: usize,
        f: impl FnOnce(&MaskCache) -> R,
    ) -> Result<R> {
        let mut cache = lock(&self.mask);
        if !cache.ready {
            let c = &mut *cache;
            c.bits.clear();
            c.bits
                .resize(crate::constraint::bitset_words(vocab_size), 0);
            lock(&self.engine).fill_mask(&mut c.bits)?;
            c.allowed.clear();
            for (w, &word) in c.bits.iter().enumerate() {
                let mut x = word;
                while x != 0 {
                    let id = w * 64 + x.trailing_zeros() as usize;
                    if id < vocab_size {
                        c.allowed.push(id as u32);
                    }
                    x &= x - 1;
                }
            }
            c.ready = true;
        }
        Ok(f(&cache))
    }

    /// Whether the mask of the current engine state is cached (see [`crate::Sampler::prepare`]).
    pub fn mask_ready(&self) -> bool {
        lock(&self.mask).ready
    }

    /// The engine's digest.
    pub fn digest(&self) -> String {
        self.read(|e| e.digest())
    }

    /// The engine's status.
    pub fn status(&self) -> crate::constraint::ConstraintStatus {
        self.read(|e| e.status())
    }

    /// Whether the constraint still masks.
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// How many of `tokens`, in order, the constraint takes from the current state, with
    /// the bytes it forces after them in `forced` (cleared first; with no tokens, the bytes it
    /// forces next, whatever the model says): every token, and nothing
    /// forced, once it no longer masks; none, and nothing forced, where the engine fails. The
    /// state and its cached mask stay as they are.
    pub fn probe(&self, tokens: &[u32], forced: &mut Vec<u8>) -> usize {
        forced.clear();
        if !self.active {
            return tokens.len();
        }
        match lock(&self.engine).probe(tokens, forced) {
            Ok(n) => n.min(tokens.len()),
            Err(_) => {
                forced.clear();
                0
            }
        }
    }
}

impl Clone for GrammarSlot {
    fn clone(&self) -> Self {
        GrammarSlot {
            engine: std::sync::Mutex::new(self.read(|e| e.fork())),
            mask: Default::default(),
            active: self.active,
        }
    }
}

impl PartialEq for GrammarSlot {
    fn eq(&self, other: &Self) -> bool {
        self.active == other.active && self.digest() == other.digest()
    }
}

impl std::fmt::Debug for GrammarSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarSlot")
            .field("digest", &self.digest())
            .field("active", &self.active)
            .finish()
    }
}

/// Stop-matcher state: tokens observed, the stop-string automaton state over the output
/// bytes, and the stop string that ended the sequence, if one did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopState {
    /// Number of output tokens observed.
    pub observed: u64,
    /// Stop-string scan state (`None` when the request has no stop strings).
    pub scan: Option<crate::stop::StopScan>,
    /// The stop string that completed, with its byte offsets.
    pub hit: Option<crate::stop::StopHit>,
}

/// The decoder state of one sequence at the start of a step.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderState {
    pub(crate) prompt_ids: Vec<u32>,
    pub(crate) selected_ids: Vec<u32>,
    pub(crate) counts_output: Counts,
    pub(crate) counts_all: Counts,
    pub(crate) sequence: Vec<SequenceSlot>,
    pub(crate) grammar: Option<GrammarSlot>,
    pub(crate) stop: StopState,
    pub(crate) rng: RngState,
    pub(crate) step: u64,
    pub(crate) finish: FinishStatus,
}

impl DecoderState {
    /// Prompt token ids.
    pub fn prompt_ids(&self) -> &[u32] {
        &self.prompt_ids
    }
    /// Selected (output) token ids `y[1..t-1]`.
    pub fn selected_ids(&self) -> &[u32] {
        &self.selected_ids
    }
    /// Occurrences of `id` in the output.
    pub fn output_count(&self, id: u32) -> u32 {
        self.counts_output.get(&id).copied().unwrap_or(0)
    }
    /// Occurrences of `id` in prompt + output.
    pub fn total_count(&self, id: u32) -> u32 {
        self.counts_all.get(&id).copied().unwrap_or(0)
    }
    /// The random stream's state (save it to resume the stream later).
    pub fn rng(&self) -> RngState {
        self.rng
    }
    /// The index of the next step (0-based; equals the number of selected tokens).
    pub fn step(&self) -> u64 {
        self.step
    }
    /// Running or finished.
    pub fn finish(&self) -> FinishStatus {
        self.finish
    }
    /// The grammar-state slot.
    pub fn grammar(&self) -> Option<&GrammarSlot> {
        self.grammar.as_ref()
    }

    /// Attaches a constraint engine's state (before the first step).
    pub fn set_grammar(&mut self, engine: Box<dyn crate::constraint::ConstraintState>) {
        self.grammar = Some(GrammarSlot::new(engine));
    }
    /// The stop-matcher state.
    pub fn stop_state(&self) -> &StopState {
        &self.stop
    }
    /// Whether the sequence is finished.
    pub fn is_finished(&self) -> bool {
        matches!(self.finish, FinishStatus::Finished { .. })
    }
    /// The token at context position `i` (prompt first, then output).
    #[inline]
    pub(crate) fn context_at(&self, i: usize) -> u32 {
        let p = self.prompt_ids.len();
        if i < p {
            self.prompt_ids[i]
        } else {
            self.selected_ids[i - p]
        }
    }
    /// Length of prompt + output.
    #[inline]
    pub(crate) fn context_len(&self) -> usize {
        self.prompt_ids.len() + self.selected_ids.len()
    }

    /// A compact, serialisable summary for step records.
    pub fn summary(&self) -> StateSummary {
        StateSummary {
            step: self.step,
            prompt_len: self.prompt_ids.len(),
            output_len: self.selected_ids.len(),
            last_token: self.selected_ids.last().copied(),
            sequence_nodes: self
                .sequence
                .iter()
                .map(|s| match s {
                    SequenceSlot::Banned { node } => *node as u64,
                    SequenceSlot::NGram { index } => index.len() as u64,
                })
                .collect(),
            grammar: self.grammar.as_ref().map(|g| g.digest()),
            stop_scan: self.stop.scan,
            rng_counter: self.rng.counter,
            finish: self.finish,
        }
    }
}

/// What a step record says about the state before and after a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateSummary {
    /// Step index.
    pub step: u64,
    /// Prompt length.
    pub prompt_len: usize,
    /// Output length.
    pub output_len: usize,
    /// Last selected token.
    pub last_token: Option<u32>,
    /// Per sequence-constraint processor: automaton node (banned) or index size (n-gram).
    pub sequence_nodes: Vec<u64>,
    /// Grammar state digest, if a grammar is active.
    pub grammar: Option<String>,
    /// Stop-string automaton state and output bytes seen.
    pub stop_scan: Option<crate::stop::StopScan>,
    /// RNG counter (next step's draws).
    pub rng_counter: u64,
    /// Finish status.
    pub finish: FinishStatus,
}
