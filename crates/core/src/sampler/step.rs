//! One step: process the logits, select, commit.

use super::{Sampler, StepResult};
use crate::error::{Error, ErrorKind, Result};
use crate::processors::Processor;
use crate::select::{self, Draw, Selected};
use crate::state::DecoderState;
use crate::support::Workspace;

impl Sampler {
    /// Runs the processors on `raw` for `state`; the support is left in `ws`.
    /// `exact` keeps every token's processed logit exact (needed for layer reports).
    pub fn process(
        &self,
        raw: &[f32],
        state: &DecoderState,
        ws: &mut Workspace,
        exact: bool,
    ) -> Result<()> {
        self.check_ready(state, ws)?;
        ws.load(raw, exact)?;
        self.run_processors(state, ws)
    }

    /// The checks before loading a row.
    fn check_ready(&self, state: &DecoderState, ws: &Workspace) -> Result<()> {
        if state.is_finished() {
            return Err(ErrorKind::AlreadyFinished.into());
        }
        if ws.v != self.vocab.vocab_size {
            return Err(ErrorKind::VocabSizeMismatch {
                expected: self.vocab.vocab_size,
                got: ws.v,
            }
            .into());
        }
        Ok(())
    }

    /// The processors, in order, on the loaded row.
    fn run_processors(&self, state: &DecoderState, ws: &mut Workspace) -> Result<()> {
        ws.record_stage("raw");
        ws.ensure_nonempty("raw")?;
        for p in &self.processors {
            p.apply(state, ws, &self.vocab)?;
            ws.record_stage(p.type_name());
            ws.ensure_nonempty(p.type_name())?;
        }
        Ok(())
    }

    /// Processes and selects without changing `state`.
    pub fn select(
        &self,
        raw: &[f32],
        state: &DecoderState,
        ws: &mut Workspace,
        draw: Draw,
    ) -> Result<Selected> {
        check_draw(draw)?;
        self.check_ready(state, ws)?;
        if self.reads_in_place() {
            // the raw logits are read in place (copied only if a processor edits the dense
            // row after all), for the length of the closure
            ws.with_attached(raw, false, |ws| {
                self.run_processors(state, ws)?;
                self.select_processed(state, ws, draw)
            })?
        } else {
            ws.load(raw, false)?;
            self.run_processors(state, ws)?;
            self.select_processed(state, ws, draw)
        }
    }

    /// Whether a step reads the raw logits in place: when every processor is a truncation, a
    /// temperature after the first truncation (which divides the truncated support, not the
    /// dense row) or a special-token mask with no token to mask, nothing writes the dense row,
    /// and loading it would only copy it. Any other pipeline (masks, penalties, biases, a
    /// temperature first) edits the row: it is copied in the same pass that checks it, since
    /// an edit of a row read in place would copy it in a pass of its own.
    fn reads_in_place(&self) -> bool {
        let mut truncated = false;
        for p in &self.processors {
            match p {
                Processor::TopK(_)
                | Processor::TopP(_)
                | Processor::MinP(_)
                | Processor::TypicalP(_) => truncated = true,
                Processor::Temperature(_) if truncated => {}
                // a vocabulary without special tokens leaves the special-token mask nothing
                Processor::SpecialTokenMask(m) if m.ids.is_empty() => {}
                _ => return false,
            }
        }
        true
    }

    pub(super) fn select_processed(
        &self,
        state: &DecoderState,
        ws: &mut Workspace,
        draw: Draw,
    ) -> Result<Selected> {
        select::select(ws, self.selector, &state.rng, state.step, draw).ok_or_else(|| {
            ErrorKind::EmptySupport {
                stage: "selection".into(),
            }
            .into()
        })
    }

    /// Does the part of the next step that depends only on the decoder state, not on the
    /// logits: the constraint's allowed-token mask, cached in the state's grammar slot. Call it
    /// while the model computes the logits (it takes `&DecoderState`, so it can run on another
    /// thread); the step then uses the cached mask. Without a constraint, or when the pipeline
    /// has no grammar mask, it does nothing. Calling it is never required: a step computes a
    /// missing mask itself, and the result is the same either way.
    pub fn prepare(&self, state: &DecoderState) -> Result<()> {
        let Some(g) = state.grammar.as_ref().filter(|g| g.active) else {
            return Ok(());
        };
        if !self
            .processors
            .iter()
            .any(|p| matches!(p, Processor::GrammarMask(_)))
        {
            return Ok(());
        }
        g.with_mask(self.vocab.vocab_size, |_| ())
    }

    /// One full step: process, select from the sequence's stream, commit.
    pub fn step(
        &self,
        raw: &[f32],
        state: &mut DecoderState,
        ws: &mut Workspace,
    ) -> Result<StepResult> {
        self.step_draw(raw, state, ws, Draw::Stream)
    }

    /// [`Sampler::step`] with the randomness of `draw` (for example [`Draw::Draft`], the
    /// rejection rule of speculative sampling).
    pub fn step_draw(
        &self,
        raw: &[f32],
        state: &mut DecoderState,
        ws: &mut Workspace,
        draw: Draw,
    ) -> Result<StepResult> {
        let sel = self.select(raw, state, ws, draw)?;
        let finish = self.commit(state, sel.token)?;
        Ok(StepResult {
            token: sel.token,
            finish,
            u: sel.u,
        })
    }
}

pub(super) fn check_draw(draw: Draw) -> Result<()> {
    if let Draw::FixedU(u) = draw {
        if !(0.0..1.0).contains(&u) {
            return Err(Error::invalid(
                "selector.u",
                format!("{u} is outside [0, 1)"),
            ));
        }
    }
    Ok(())
}
