//! The compiled sampler and the step transition.
//!
//! [`Sampler`] is the immutable compiled form of a [`PipelineConfig`] for one vocabulary and one
//! request's stop conditions (Config → compiled object, like regex-automata). Per-sequence state
//! lives in [`DecoderState`]; per-thread scratch in [`Workspace`]. One step is:
//!
//! 1. load and validate the raw logits (NaN / `+inf` → error naming the first bad index);
//! 2. apply the processors in order, recording the support size after each, failing with a
//!    constraint error (and never calling the selector) if the support becomes empty;
//! 3. select (greedy / categorical / Gumbel);
//! 4. commit: the 000 §3.10 update, in order — append, counts, sequence-constraint state,
//!    grammar slot, stop state, random stream, step index, terminal check.
//!
//! [`Sampler::step`] allocates nothing once the workspace exists (history vectors grow
//! amortised). Records and explanations are opt-in and allocate.

use rayon::prelude::*;

use crate::constraint::ConstraintStatus;
use crate::error::{Error, ErrorKind, Result};
use crate::math::{self, exp_f32, ln_f64};
use crate::pipeline::params::SamplingParams;
use crate::pipeline::presets::{self, Preset};
use crate::pipeline::GrammarPolicy;
use crate::pipeline::{PipelineConfig, StopConfig};
use crate::processors::{CompileCtx, Processor, ProcessorConfig};
use crate::record::{
    logits_digest, CandidateRecord, Layer, Logprob, ProcessorRef, RngRecord, StageSize, StepRecord,
};
use crate::rng::{RngState, RNG_ALGORITHM};
use crate::select::{self, Draw, Selected, Selector};
use crate::state::{DecoderState, FinishReason, FinishStatus, StopState};
use crate::stop::StopStrings;
use crate::support::{canonical, Cand, Workspace};
use crate::vocab::TokenBytes;
use crate::vocab::VocabInfo;
use std::sync::Arc;

/// The outcome of one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepResult {
    /// The selected token.
    pub token: u32,
    /// Set when this token ended the sequence.
    pub finish: Option<FinishReason>,
    /// The categorical `u` used, if any.
    pub u: Option<f64>,
}

/// One row of an explanation ledger (002's table), for every token of the vocabulary.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TokenRow {
    /// Token id.
    pub id: u32,
    /// Raw logit.
    pub raw_logit: f32,
    /// Raw-layer logprob.
    #[serde(with = "crate::record::f64_or_string")]
    pub raw_logprob: f64,
    /// Not hard-masked by any mask (processed logit finite).
    pub allowed: bool,
    /// Processed-layer probability (after masks, penalties, temperature; before truncation).
    pub initial_prob: f64,
    /// In the final support.
    pub kept: bool,
    /// Processed logit (`-inf` when masked).
    #[serde(with = "crate::record::f64_or_string")]
    pub processed_logit: f64,
    /// Processed-layer logprob.
    #[serde(with = "crate::record::f64_or_string")]
    pub processed_logprob: f64,
    /// Selection probability (0 outside the support).
    pub selection_prob: f64,
    /// Selection-layer logprob.
    #[serde(with = "crate::record::f64_or_string")]
    pub selection_logprob: f64,
    /// Whether this token was selected.
    pub selected: bool,
}

/// A full explanation of one step: the record plus a ledger row per token.
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    /// The step record.
    pub record: StepRecord,
    /// One row per vocabulary token, by id.
    pub tokens: Vec<TokenRow>,
}

/// Per-thread workspaces for batch stepping.
#[derive(Debug)]
pub struct WorkspacePool {
    workspaces: Vec<Workspace>,
}

impl WorkspacePool {
    /// `threads` workspaces for vocabularies of `vocab_size`.
    pub fn new(vocab_size: usize, threads: usize) -> Self {
        WorkspacePool {
            workspaces: (0..threads.max(1))
                .map(|_| Workspace::new(vocab_size))
                .collect(),
        }
    }
}

/// A compiled pipeline for one vocabulary and one set of stop conditions.
#[derive(Debug, Clone)]
pub struct Sampler {
    config: PipelineConfig,
    processors: Vec<Processor>,
    selector: Selector,
    vocab: VocabInfo,
    stop: StopConfig,
    stop_ids: Vec<u32>,
    hash: String,
    tokens: Option<Arc<TokenBytes>>,
    stop_strings: Option<Arc<StopStrings>>,
    /// Special tokens whose bytes equal a whole stop string: (token, stop string index).
    special_stops: Vec<(u32, usize)>,
    min_tokens: u64,
}

impl Sampler {
    /// Validates and compiles `config`. Contradictions (an empty allowed set, a min-length mask
    /// hiding every stop token while `min_tokens > max_tokens`, two temperatures) are rejected here,
    /// before any step runs.
    pub fn new(config: PipelineConfig, vocab: VocabInfo, stop: StopConfig) -> Result<Sampler> {
        Sampler::new_with_tokens(config, vocab, stop, None)
    }

    /// Like [`new`](Self::new), with the exact bytes of every token, which stop strings and
    /// streaming text need. `tokens` must have one entry per vocabulary id.
    pub fn new_with_tokens(
        config: PipelineConfig,
        vocab: VocabInfo,
        stop: StopConfig,
        tokens: Option<Arc<TokenBytes>>,
    ) -> Result<Sampler> {
        config.check_format()?;
        let vocab = vocab.validated()?;
        let mut stop_ids = stop.stop_token_ids.clone();
        for (i, &t) in stop_ids.iter().enumerate() {
            if t as usize >= vocab.vocab_size {
                return Err(Error::out_of_range(
                    format!("stop_token_ids[{i}]"),
                    t as u64,
                    vocab.vocab_size,
                ));
            }
        }
        stop_ids.sort_unstable();
        stop_ids.dedup();
        if stop.max_tokens == Some(0) {
            return Err(Error::invalid("max_tokens", "must be at least 1"));
        }
        let mut ctx = CompileCtx {
            vocab: &vocab,
            stop_ids: &stop_ids,
            next_slot: 0,
        };
        let mut processors = Vec::with_capacity(config.processors.len());
        let mut temps = 0;
        for (i, p) in config.processors.iter().enumerate() {
            if matches!(p, ProcessorConfig::Temperature(_)) {
                temps += 1;
                if temps > 1 {
                    return Err(Error::contradiction(
                        format!("processors[{i}]"),
                        "a pipeline may contain at most one temperature",
                    ));
                }
            }
            processors.push(p.compile(i, &mut ctx)?);
        }
        for p in &processors {
            if let Processor::MinTokens(m) = p {
                if let Some(max) = stop.max_tokens {
                    if m.min_tokens > max && !m.ids.is_empty() {
                        return Err(Error::contradiction(
                            "min_tokens",
                            format!(
                                "min_tokens ({}) exceeds max_tokens ({max}) while the min-length mask hides the stop tokens {:?}: they could never be selected",
                                m.min_tokens, m.ids
                            ),
                        ));
                    }
                }
            }
        }
        if let Some(t) = &tokens {
            if t.len() != vocab.vocab_size {
                return Err(Error::invalid(
                    "vocabulary",
                    format!(
                        "{} token byte strings for a vocabulary of {}",
                        t.len(),
                        vocab.vocab_size
                    ),
                ));
            }
        }
        let stop_strings = if stop.stop.is_empty() {
            None
        } else {
            if tokens.is_none() {
                return Err(Error::contradiction(
                    "stop",
                    "stop strings are matched on token bytes; this sampler has no vocabulary bytes",
                ));
            }
            Some(Arc::new(StopStrings::new(&stop.stop)?))
        };
        let mut special_stops = Vec::new();
        if let (Some(ss), Some(t)) = (&stop_strings, &tokens) {
            for &id in &vocab.special_token_ids {
                if let Some(b) = t.get(id) {
                    if let Some(k) = ss.patterns().iter().position(|p| p.as_slice() == b) {
                        special_stops.push((id, k));
                    }
                }
            }
        }
        let min_tokens = processors
            .iter()
            .filter_map(|p| match p {
                Processor::MinTokens(m) => Some(m.min_tokens),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let hash = config.hash();
        let selector = config.selector;
        Ok(Sampler {
            config,
            processors,
            selector,
            vocab,
            stop,
            stop_ids,
            hash,
            tokens,
            stop_strings,
            special_stops,
            min_tokens,
        })
    }

    /// Builds a preset pipeline from request parameters and compiles it.
    pub fn from_params(
        preset: Preset,
        params: &SamplingParams,
        vocab: VocabInfo,
    ) -> Result<Sampler> {
        let (cfg, stop) = presets::build(preset, params)?;
        Sampler::new(cfg, vocab, stop)
    }

    /// The pipeline config.
    pub fn config(&self) -> &PipelineConfig {
        &self.config
    }
    /// The pipeline hash.
    pub fn pipeline_hash(&self) -> &str {
        &self.hash
    }
    /// The compiled processors, in order.
    pub fn processors(&self) -> &[Processor] {
        &self.processors
    }
    /// The selector.
    pub fn selector(&self) -> Selector {
        self.selector
    }
    /// Vocabulary facts.
    pub fn vocab(&self) -> &VocabInfo {
        &self.vocab
    }
    /// Stop conditions.
    pub fn stop(&self) -> &StopConfig {
        &self.stop
    }

    /// The compiled stop strings, if any (share them with a [`TextStream`](crate::text::TextStream)).
    pub fn stop_strings(&self) -> Option<Arc<StopStrings>> {
        self.stop_strings.clone()
    }

    /// The bytes `token` contributes to the output text: its exact bytes, or nothing for a
    /// special token when `skip_special_tokens` is set (and nothing without a byte table).
    pub fn visible_bytes(&self, token: u32) -> &[u8] {
        if self.stop.skip_special_tokens && self.vocab.is_special(token) {
            return &[];
        }
        self.tokens
            .as_ref()
            .and_then(|t| t.get(token))
            .unwrap_or(&[])
    }

    /// A streaming detokeniser for this request's stop strings.
    pub fn text_stream(&self) -> crate::text::TextStream {
        crate::text::TextStream::new(
            self.stop_strings.clone(),
            self.stop.include_stop_str_in_output,
        )
    }

    /// A workspace sized for this sampler's vocabulary.
    pub fn new_workspace(&self) -> Workspace {
        let mut ws = Workspace::new(self.vocab.vocab_size);
        ws.stages.reserve(self.processors.len() + 1);
        ws
    }

    /// A fresh decoder state for `prompt_ids` with the random stream keyed by `seed`.
    pub fn new_state(&self, prompt_ids: &[u32], seed: u64) -> Result<DecoderState> {
        for (i, &t) in prompt_ids.iter().enumerate() {
            if t as usize >= self.vocab.vocab_size {
                return Err(Error::out_of_range(
                    format!("prompt_ids[{i}]"),
                    t as u64,
                    self.vocab.vocab_size,
                ));
            }
        }
        let mut st = DecoderState {
            prompt_ids: prompt_ids.to_vec(),
            selected_ids: Vec::new(),
            counts_output: Default::default(),
            counts_all: Default::default(),
            sequence: self
                .processors
                .iter()
                .filter_map(|p| p.new_slot())
                .collect(),
            grammar: None,
            stop: StopState {
                scan: self.stop_strings.as_ref().map(|s| s.start()),
                ..StopState::default()
            },
            rng: RngState::new(seed),
            step: 0,
            finish: FinishStatus::Running,
        };
        for &t in prompt_ids {
            *st.counts_all.entry(t).or_insert(0) += 1;
        }
        let mut slots = std::mem::take(&mut st.sequence);
        for (pos, &t) in prompt_ids.iter().enumerate() {
            self.consume_slots(&mut slots, &st, pos, t);
        }
        st.sequence = slots;
        Ok(st)
    }

    /// Reserves room for `additional` more selected tokens in `state` (history and counts), so
    /// that the next `additional` steps allocate nothing; without it the history grows amortised.
    pub fn reserve(&self, state: &mut DecoderState, additional: usize) {
        state.selected_ids.reserve(additional);
        let distinct = additional.min(self.vocab.vocab_size);
        state.counts_output.reserve(distinct);
        state.counts_all.reserve(distinct);
    }

    /// A state that has already selected `selected_ids` (validated and committed one by one
    /// without stop checks, e.g. to reproduce a hand computation's history).
    pub fn state_with_history(
        &self,
        prompt_ids: &[u32],
        selected_ids: &[u32],
        seed: u64,
    ) -> Result<DecoderState> {
        let mut st = self.new_state(prompt_ids, seed)?;
        for (i, &t) in selected_ids.iter().enumerate() {
            if t as usize >= self.vocab.vocab_size {
                return Err(Error::out_of_range(
                    format!("selected_ids[{i}]"),
                    t as u64,
                    self.vocab.vocab_size,
                ));
            }
        }
        for &t in selected_ids {
            self.advance(&mut st, t);
        }
        Ok(st)
    }

    fn consume_slots(
        &self,
        slots: &mut [crate::state::SequenceSlot],
        st: &DecoderState,
        pos: usize,
        token: u32,
    ) {
        // each processor that keeps a slot advances its own (slots are in processor order)
        for p in &self.processors {
            p.consume(slots, st, pos, token);
        }
    }

    /// Runs the processors on `raw` for `state`; the support is left in `ws`.
    /// `exact` keeps every token's processed logit exact (needed for layer reports).
    pub fn process(
        &self,
        raw: &[f32],
        state: &DecoderState,
        ws: &mut Workspace,
        exact: bool,
    ) -> Result<()> {
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
        ws.load(raw, exact)?;
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
        self.process(raw, state, ws, false)?;
        self.select_processed(state, ws, draw)
    }

    fn select_processed(
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
    fn advance(&self, st: &mut DecoderState, token: u32) {
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

    /// One full step that also returns its [`StepRecord`] with up to `max_candidates` final
    /// candidates.
    pub fn step_recorded(
        &self,
        raw: &[f32],
        state: &mut DecoderState,
        ws: &mut Workspace,
        draw: Draw,
        max_candidates: usize,
    ) -> Result<(StepResult, StepRecord)> {
        let (sel, mut rec) = self.select_recorded(raw, state, ws, draw, max_candidates)?;
        let finish = self.commit(state, sel.token)?;
        rec.state_after = state.summary();
        Ok((
            StepResult {
                token: sel.token,
                finish,
                u: sel.u,
            },
            rec,
        ))
    }

    /// Selects and records without committing (`state_after` equals `state_before`).
    pub fn select_recorded(
        &self,
        raw: &[f32],
        state: &DecoderState,
        ws: &mut Workspace,
        draw: Draw,
        max_candidates: usize,
    ) -> Result<(Selected, StepRecord)> {
        check_draw(draw)?;
        self.process(raw, state, ws, true)?;
        let sel = self.select_processed(state, ws, draw)?;
        let layers = Layers::compute(raw, ws);
        let support = support_canonical(ws);
        let candidates = support
            .iter()
            .take(max_candidates)
            .map(|c| layers.candidate(raw, c.id, c.z))
            .collect();
        let before = state.summary();
        let rec = StepRecord {
            step: state.step,
            raw_logits_digest: logits_digest(raw),
            pipeline_hash: self.hash.clone(),
            processors: self
                .config
                .processors
                .iter()
                .map(|p| ProcessorRef {
                    kind: p.type_name().to_string(),
                    version: p.version(),
                })
                .collect(),
            selector: self.selector,
            stages: ws
                .stages
                .iter()
                .map(|(s, n)| StageSize {
                    stage: s.to_string(),
                    support_size: *n,
                })
                .collect(),
            support_size: support.len(),
            candidates,
            rng: RngRecord {
                algorithm: RNG_ALGORITHM.to_string(),
                seed: state.rng.seed,
                counter: state.step,
                u: sel.u,
                fixed_u: matches!(draw, Draw::FixedU(_)),
            },
            selected: sel.token,
            state_before: before.clone(),
            state_after: before,
            draft: sel.draft.map(|d| crate::record::DraftRecord {
                token: d.token,
                accepted: d.accepted,
                rule: crate::record::DraftRule::Rejection,
                accept_u: d.accept_u,
                residual_u: d.residual_u,
            }),
        };
        Ok((sel, rec))
    }

    /// A ledger row for every token plus the step record (for small teaching vocabularies and
    /// `nextok explain`). Does not change `state`.
    pub fn explain(&self, raw: &[f32], state: &DecoderState, draw: Draw) -> Result<Explanation> {
        let mut ws = self.new_workspace();
        let (sel, record) = self.select_recorded(raw, state, &mut ws, draw, usize::MAX)?;
        let layers = Layers::compute(raw, &mut ws);
        let support = support_canonical(&ws);
        let mut in_support = vec![None; self.vocab.vocab_size];
        for c in &support {
            in_support[c.id as usize] = Some(c.z);
        }
        let tokens = (0..self.vocab.vocab_size)
            .map(|i| {
                let id = i as u32;
                let pz = ws.buf[i];
                let processed_logprob = layers.processed(pz);
                let (selection_prob, selection_logprob) = match in_support[i] {
                    Some(z) => layers.selection(z),
                    None => (0.0, f64::NEG_INFINITY),
                };
                TokenRow {
                    id,
                    raw_logit: raw[i],
                    raw_logprob: layers.raw(raw[i]),
                    allowed: pz > f32::NEG_INFINITY,
                    initial_prob: if pz > f32::NEG_INFINITY {
                        processed_logprob.exp()
                    } else {
                        0.0
                    },
                    kept: in_support[i].is_some(),
                    processed_logit: pz as f64,
                    processed_logprob,
                    selection_prob,
                    selection_logprob,
                    selected: id == sel.token,
                }
            })
            .collect();
        Ok(Explanation { record, tokens })
    }

    /// The logprob of `token` in `layer` for the step currently held in `ws` (after
    /// [`select_recorded`](Self::select_recorded) or [`process`](Self::process) with `exact`).
    pub fn logprob(
        &self,
        raw: &[f32],
        ws: &mut Workspace,
        token: u32,
        layer: Layer,
    ) -> Result<Logprob> {
        if token as usize >= self.vocab.vocab_size {
            return Err(Error::out_of_range(
                "token",
                token as u64,
                self.vocab.vocab_size,
            ));
        }
        let layers = Layers::compute(raw, ws);
        let value = match layer {
            Layer::Raw => layers.raw(raw[token as usize]),
            Layer::Processed => layers.processed(ws.buf[token as usize]),
            Layer::Selection => {
                let z = if ws.dense {
                    Some(ws.buf[token as usize]).filter(|z| *z > f32::NEG_INFINITY)
                } else {
                    ws.cands.iter().find(|c| c.id == token).map(|c| c.z)
                };
                z.map(|z| layers.selection(z).1)
                    .unwrap_or(f64::NEG_INFINITY)
            }
        };
        Ok(Logprob { layer, value })
    }

    /// Steps many rows in parallel. `logits` holds `states.len()` rows of `vocab_size` values;
    /// `out[i]` receives row `i`'s result. Each row's result is identical to stepping it alone:
    /// rows share nothing but read-only pipeline data, and each draws from its own stream.
    pub fn step_batch(
        &self,
        logits: &[f32],
        states: &mut [DecoderState],
        pool: &mut WorkspacePool,
        out: &mut [Result<StepResult>],
    ) -> Result<()> {
        let v = self.vocab.vocab_size;
        if logits.len() != states.len() * v {
            return Err(ErrorKind::VocabSizeMismatch {
                expected: states.len() * v,
                got: logits.len(),
            }
            .into());
        }
        if out.len() != states.len() {
            return Err(Error::invalid(
                "out",
                format!("has {} slots for {} rows", out.len(), states.len()),
            ));
        }
        let n = states.len();
        if n == 0 {
            return Ok(());
        }
        let threads = pool.workspaces.len();
        let per = n.div_ceil(threads);
        states
            .par_chunks_mut(per)
            .zip(out.par_chunks_mut(per))
            .zip(logits.par_chunks(per * v))
            .zip(pool.workspaces.par_iter_mut())
            .for_each(|(((sts, outs), rows), ws)| {
                for ((st, o), row) in sts
                    .iter_mut()
                    .zip(outs.iter_mut())
                    .zip(rows.chunks_exact(v))
                {
                    *o = self.step(row, st, ws);
                }
            });
        Ok(())
    }
}

fn check_draw(draw: Draw) -> Result<()> {
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

/// The support in canonical order (allocates; record path only).
fn support_canonical(ws: &Workspace) -> Vec<Cand> {
    let mut v: Vec<Cand> = if ws.dense {
        ws.buf
            .iter()
            .enumerate()
            .filter(|(_, z)| **z > f32::NEG_INFINITY)
            .map(|(i, &z)| Cand { id: i as u32, z })
            .collect()
    } else {
        ws.cands.clone()
    };
    v.sort_unstable_by(canonical);
    v
}

/// Normalisers of the three layers for the step in a workspace.
struct Layers {
    raw_max: f32,
    raw_ln: f64,
    proc_max: f32,
    proc_ln: f64,
    sel_max: f32,
    sel_sum: f64,
    sel_ln: f64,
}

impl Layers {
    fn compute(raw: &[f32], ws: &mut Workspace) -> Layers {
        let raw_max = math::max_f32(raw);
        let raw_ln = ln_f64(math::exp_sum(raw, raw_max));
        let proc_max = math::max_f32(&ws.buf);
        let proc_ln = ln_f64(math::exp_sum(&ws.buf, proc_max));
        let (sel_max, sel_sum) = ws.normalize();
        Layers {
            raw_max,
            raw_ln,
            proc_max,
            proc_ln,
            sel_max,
            sel_sum,
            sel_ln: ln_f64(sel_sum),
        }
    }
    fn raw(&self, x: f32) -> f64 {
        if x == f32::NEG_INFINITY {
            f64::NEG_INFINITY
        } else {
            (x - self.raw_max) as f64 - self.raw_ln
        }
    }
    fn processed(&self, z: f32) -> f64 {
        if z == f32::NEG_INFINITY {
            f64::NEG_INFINITY
        } else {
            (z - self.proc_max) as f64 - self.proc_ln
        }
    }
    fn selection(&self, z: f32) -> (f64, f64) {
        let p = exp_f32(z - self.sel_max) as f64 / self.sel_sum;
        (p, (z - self.sel_max) as f64 - self.sel_ln)
    }
    fn candidate(&self, raw: &[f32], id: u32, z: f32) -> CandidateRecord {
        let (p, lp) = self.selection(z);
        CandidateRecord {
            id,
            raw_logit: raw[id as usize],
            processed_logit: z,
            raw_logprob: self.raw(raw[id as usize]),
            processed_logprob: self.processed(z),
            selection_logprob: lp,
            selection_prob: p,
        }
    }
}
