//! Per-sequence state: [`SequenceState`] runs a [`CompiledConstraint`] for one sequence — it
//! fills the allowed-token bitset, consumes the selected token's bytes, reports the status,
//! forks (a clone), rolls back `k` tokens, reports forced bytes and a digest — and implements
//! [`ConstraintState`] for the sampler.

use std::sync::Arc;

use nextok_core::constraint::{ConstraintState, ConstraintStatus, TokenBitset};
use sha2::{Digest, Sha256};

use crate::compiled::{Backend, CompiledConstraint};
use crate::error::ConstraintError;
use crate::llg::{self, LlgState};
use crate::machine::{DEAD, ENDED};

#[derive(Clone)]
enum Inner {
    Own { state: u32, history: Vec<u32> },
    Llg(Box<LlgState>),
}

/// The constraint state of one sequence (implements [`ConstraintState`]). Forking clones it;
/// the compiled constraint is shared.
#[derive(Clone)]
pub struct SequenceState {
    compiled: Arc<CompiledConstraint>,
    inner: Inner,
    /// Byte length of each committed token (EOS: 0).
    token_lens: Vec<u32>,
    /// All committed bytes.
    bytes: Vec<u8>,
    status: ConstraintStatus,
}

impl std::fmt::Debug for SequenceState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SequenceState")
            .field("kind", &self.compiled.kind)
            .field("tokens", &self.token_lens.len())
            .field("status", &self.status)
            .finish()
    }
}

impl SequenceState {
    /// A fresh state running `compiled` (see [`CompiledConstraint::start`]).
    pub(crate) fn start(compiled: &Arc<CompiledConstraint>) -> SequenceState {
        let inner = match &compiled.backend {
            Backend::Own(m) => Inner::Own {
                state: m.start(),
                history: Vec::new(),
            },
            Backend::Llg(m) => Inner::Llg(Box::new(LlgState {
                matcher: m.matcher.clone(),
                last_mask: None,
            })),
        };
        let mut s = SequenceState {
            compiled: compiled.clone(),
            inner,
            token_lens: Vec::new(),
            bytes: Vec::new(),
            status: ConstraintStatus::Running,
        };
        s.refresh_status();
        s
    }

    /// The compiled constraint this state runs.
    pub fn compiled(&self) -> &Arc<CompiledConstraint> {
        &self.compiled
    }

    /// The bytes committed so far.
    pub fn committed_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Number of committed tokens.
    pub fn num_tokens(&self) -> usize {
        self.token_lens.len()
    }

    /// Whether `token` is allowed now (without committing it).
    pub fn allows(&mut self, token: u32) -> Result<bool, ConstraintError> {
        let vocab = &self.compiled.vocab;
        if token as usize >= vocab.vocab_size() {
            return Ok(false);
        }
        match (&self.compiled.backend, &mut self.inner) {
            (Backend::Own(m), Inner::Own { state, .. }) => {
                if vocab.is_eos(token) {
                    return Ok(m.accepting(*state) || *state == ENDED);
                }
                if vocab.is_special(token) || *state >= ENDED {
                    return Ok(false);
                }
                let b = vocab.token_bytes(token).unwrap_or(&[]);
                Ok(!b.is_empty() && m.run(*state, b) != DEAD)
            }
            (_, Inner::Llg(l)) => {
                if l.last_mask.is_none() {
                    let m = l
                        .matcher
                        .compute_mask_or_eos()
                        .map_err(|e| l.step_error(e))?;
                    l.last_mask = Some(m);
                }
                let m = l.last_mask.as_ref().expect("set above");
                let t = if vocab.is_eos(token) {
                    vocab.eos_token_ids()[0]
                } else {
                    token
                };
                Ok(m.is_allowed(t))
            }
            _ => unreachable!("backend and state kinds match"),
        }
    }

    fn refresh_status(&mut self) {
        self.status = match (&self.compiled.backend, &mut self.inner) {
            (Backend::Own(m), Inner::Own { state, .. }) => match *state {
                DEAD => ConstraintStatus::Dead,
                ENDED => ConstraintStatus::OnlyEnd,
                s => match (m.accepting(s), m.can_continue(s)) {
                    (true, true) => ConstraintStatus::Accepted,
                    (true, false) => ConstraintStatus::OnlyEnd,
                    (false, true) => ConstraintStatus::Running,
                    (false, false) => ConstraintStatus::Dead,
                },
            },
            (_, Inner::Llg(l)) => {
                if l.matcher.is_error() {
                    ConstraintStatus::Dead
                } else if l.matcher.is_stopped() {
                    ConstraintStatus::OnlyEnd
                } else if l.matcher.is_accepting().unwrap_or(false) {
                    ConstraintStatus::Accepted
                } else {
                    ConstraintStatus::Running
                }
            }
            _ => unreachable!("backend and state kinds match"),
        };
    }

    /// Fills `allowed` (ORs into it; the caller clears it) — the typed-error form of
    /// [`ConstraintState::fill_mask`].
    pub fn fill(&mut self, allowed: &mut TokenBitset) -> Result<(), ConstraintError> {
        let vocab = &self.compiled.vocab;
        let words = nextok_core::constraint::bitset_words(vocab.vocab_size());
        if allowed.len() < words {
            return Err(ConstraintError::invalid(
                "allowed",
                format!(
                    "bitset has {} words, the vocabulary needs {words}",
                    allowed.len()
                ),
            ));
        }
        match (&self.compiled.backend, &mut self.inner) {
            (Backend::Own(m), Inner::Own { state, .. }) => {
                m.fill(*state, vocab, &mut allowed[..words]);
                Ok(())
            }
            (_, Inner::Llg(l)) => {
                let mask = l
                    .matcher
                    .compute_mask_or_eos()
                    .map_err(|e| l.step_error(e))?;
                let src = mask.as_slice();
                let pairs = src.chunks_exact(2);
                let rest = pairs.remainder();
                let full = (src.len() / 2).min(words);
                for (w, p) in allowed[..full].iter_mut().zip(pairs) {
                    *w |= p[0] as u64 | ((p[1] as u64) << 32);
                }
                if full < words {
                    if let Some(&lo) = rest.first() {
                        allowed[full] |= lo as u64;
                    }
                }
                let eos = vocab.eos_token_ids();
                if mask.is_allowed(eos[0]) {
                    for &e in &eos[1..] {
                        allowed[(e / 64) as usize] |= 1u64 << (e % 64);
                    }
                }
                // Bits past the vocabulary (llguidance's mask may be longer) stay clear.
                let n = vocab.vocab_size();
                if !n.is_multiple_of(64) {
                    allowed[words - 1] &= (1u64 << (n % 64)) - 1;
                }
                l.last_mask = Some(mask);
                Ok(())
            }
            _ => unreachable!("backend and state kinds match"),
        }
    }

    /// Consumes `token` — the typed-error form of [`ConstraintState::commit`]. A token that is
    /// not allowed is rejected and the state is left unchanged.
    pub fn consume(&mut self, token: u32) -> Result<(), ConstraintError> {
        if !self.allows(token)? {
            let vocab = &self.compiled.vocab;
            let why = if token as usize >= vocab.vocab_size() {
                format!("out of range (vocab_size {})", vocab.vocab_size())
            } else if self.status == ConstraintStatus::OnlyEnd && !vocab.is_eos(token) {
                "the output is complete; only EOS may follow".to_string()
            } else if vocab.is_eos(token) {
                "EOS before the output is complete".to_string()
            } else if vocab.is_special(token) {
                "special tokens never match constraint text".to_string()
            } else {
                "its bytes do not continue any legal output".to_string()
            };
            return Err(ConstraintError::rejected(token, why));
        }
        let vocab = self.compiled.vocab.clone();
        let is_eos = vocab.is_eos(token);
        let tb: &[u8] = if is_eos {
            &[]
        } else {
            vocab.token_bytes(token).unwrap_or(&[])
        };
        match (&self.compiled.backend, &mut self.inner) {
            (Backend::Own(m), Inner::Own { state, history }) => {
                history.push(*state);
                *state = if is_eos { ENDED } else { m.run(*state, tb) };
            }
            (_, Inner::Llg(l)) => {
                let t = if is_eos {
                    vocab.eos_token_ids()[0]
                } else {
                    token
                };
                l.last_mask = None;
                if let Err(e) = l.matcher.consume_token(t) {
                    return Err(llg::engine_error(e));
                }
            }
            _ => unreachable!("backend and state kinds match"),
        }
        self.token_lens.push(tb.len() as u32);
        self.bytes.extend_from_slice(tb);
        self.refresh_status();
        Ok(())
    }

    /// Undoes the last `k` tokens — the typed-error form of [`ConstraintState::rollback`].
    pub fn undo(&mut self, k: usize) -> Result<(), ConstraintError> {
        if k > self.token_lens.len() {
            return Err(ConstraintError::invalid(
                "rollback",
                format!("{k} tokens requested, {} committed", self.token_lens.len()),
            ));
        }
        if k == 0 {
            return Ok(());
        }
        match &mut self.inner {
            Inner::Own { state, history } => {
                *state = history[history.len() - k];
                history.truncate(history.len() - k);
            }
            Inner::Llg(l) => {
                l.last_mask = None;
                l.matcher.rollback(k).map_err(llg::engine_error)?;
            }
        }
        let n = self.token_lens.len() - k;
        let removed: usize = self.token_lens[n..].iter().map(|&x| x as usize).sum();
        self.token_lens.truncate(n);
        self.bytes.truncate(self.bytes.len() - removed);
        self.refresh_status();
        Ok(())
    }

    /// The bytes forced next.
    pub fn forced(&mut self) -> Vec<u8> {
        match (&self.compiled.backend, &mut self.inner) {
            (Backend::Own(m), Inner::Own { state, .. }) => m.forced(*state),
            (_, Inner::Llg(l)) => l.matcher.compute_ff_bytes(),
            _ => unreachable!("backend and state kinds match"),
        }
    }

    /// How many of `tokens`, in order, this state takes, with the bytes forced after them in
    /// `forced` (cleared first); the state is left as it was — the typed-error form of
    /// [`ConstraintState::probe`]. nextok's automaton runs on a copy of its state number;
    /// llguidance's matcher consumes the tokens it takes and rolls them back (its own
    /// speculative path), its cached mask kept, as it belongs to the same state.
    pub fn probe_tokens(
        &mut self,
        tokens: &[u32],
        forced: &mut Vec<u8>,
    ) -> Result<usize, ConstraintError> {
        forced.clear();
        let vocab = self.compiled.vocab.clone();
        match (&self.compiled.backend, &mut self.inner) {
            (Backend::Own(m), Inner::Own { state, .. }) => {
                let mut s = *state;
                let mut n = 0;
                for &t in tokens {
                    if s >= ENDED || t as usize >= vocab.vocab_size() {
                        break;
                    }
                    if vocab.is_eos(t) {
                        // as `commit`: EOS where the output may end, then nothing
                        if !m.accepting(s) {
                            break;
                        }
                        s = ENDED;
                        n += 1;
                        continue;
                    }
                    if vocab.is_special(t) {
                        break;
                    }
                    let b = vocab.token_bytes(t).unwrap_or(&[]);
                    let next = if b.is_empty() { DEAD } else { m.run(s, b) };
                    if next == DEAD {
                        break;
                    }
                    s = next;
                    n += 1;
                }
                if s < ENDED {
                    forced.extend_from_slice(&m.forced(s));
                }
                Ok(n)
            }
            (_, Inner::Llg(l)) => {
                if l.matcher.is_stopped() {
                    return Ok(0);
                }
                // ids past the vocabulary are refused here, as `allows` does, never handed to
                // the matcher (which would stop on them)
                let upto = tokens
                    .iter()
                    .position(|&t| t as usize >= vocab.vocab_size())
                    .unwrap_or(tokens.len());
                let n = l
                    .matcher
                    .try_consume_tokens(&tokens[..upto])
                    .map_err(|e| l.step_error(e))?;
                if !l.matcher.is_stopped() {
                    forced.extend_from_slice(&l.matcher.compute_ff_bytes());
                }
                l.matcher.rollback(n).map_err(|e| l.step_error(e))?;
                Ok(n)
            }
            _ => unreachable!("backend and state kinds match"),
        }
    }

    /// The engine error that killed the state, if any.
    pub fn engine_error(&self) -> Option<String> {
        match &self.inner {
            Inner::Llg(l) => l.error(),
            Inner::Own { .. } => None,
        }
    }
}

impl ConstraintState for SequenceState {
    fn fill_mask(&mut self, allowed: &mut TokenBitset) -> nextok_core::Result<()> {
        self.fill(allowed).map_err(Into::into)
    }

    fn commit(&mut self, token: u32) -> nextok_core::Result<()> {
        self.consume(token).map_err(Into::into)
    }

    fn status(&self) -> ConstraintStatus {
        self.status
    }

    fn fork(&self) -> Box<dyn ConstraintState> {
        Box::new(self.clone())
    }

    fn rollback(&mut self, k: usize) -> nextok_core::Result<()> {
        self.undo(k).map_err(Into::into)
    }

    fn forced_bytes(&mut self) -> Vec<u8> {
        self.forced()
    }

    fn probe(&mut self, tokens: &[u32], forced: &mut Vec<u8>) -> nextok_core::Result<usize> {
        self.probe_tokens(tokens, forced).map_err(Into::into)
    }

    /// `kind:spec-hash:state-hash` — equal for states of the same compiled constraint that
    /// committed the same bytes (however they were tokenized).
    fn digest(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.compiled.hash);
        h.update(&self.bytes);
        h.update([matches!(self.status, ConstraintStatus::OnlyEnd) as u8]);
        let d: [u8; 32] = h.finalize().into();
        format!(
            "{}:{}:{}",
            self.compiled.kind,
            hex8(&self.compiled.hash),
            hex8(&d)
        )
    }
}

fn hex8(b: &[u8]) -> String {
    b[..8].iter().map(|x| format!("{x:02x}")).collect()
}
