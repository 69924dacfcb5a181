//! Logits processors: masks, transforms and truncations, one file per processor.
//!
//! Each processor is described by a serialisable config (a variant of [`ProcessorConfig`],
//! tagged by `"type"`, with a `version`) and compiled once per pipeline into a [`Processor`].
//! At each step a processor reads only the parts of the [`DecoderState`] it declares
//! ([`Processor::reads`]) through a shared reference, and writes only the step's
//! [`Workspace`] — it cannot change the selected history (000 invariant 3.1).
//!
//! Kinds:
//! * masks (`-inf`): [`special_mask`], [`min_tokens`], [`allowed_ids`], [`banned_sequences`],
//!   [`no_repeat_ngram`];
//! * transforms: [`logit_bias`], [`presence_frequency`], [`repetition`], [`temperature`];
//! * truncations (support): [`top_k`], [`top_p`], [`min_p`], [`typical_p`].

pub mod allowed_ids;
pub mod banned_sequences;
pub mod grammar_mask;
pub mod logit_bias;
pub mod min_p;
pub mod min_tokens;
pub mod no_repeat_ngram;
pub mod presence_frequency;
pub mod repetition;
pub mod scope;
pub mod special_mask;
pub mod temperature;
pub mod top_k;
pub mod top_p;
pub mod typical_p;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::state::{DecoderState, SequenceSlot};
use crate::support::Workspace;
use crate::vocab::VocabInfo;

pub use scope::PenaltyScope;

/// Parts of the decoder state a processor may read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateField {
    /// Prompt token ids.
    PromptIds,
    /// Selected (output) token ids.
    SelectedIds,
    /// Token counts.
    TokenCounts,
    /// The processor's own sequence-constraint automaton state.
    SequenceState,
    /// The step index / output length.
    StepIndex,
    /// The grammar/constraint state.
    GrammarState,
}

/// One processor's configuration: the pipeline-as-data form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ProcessorConfig {
    /// Hide special/control tokens (EOS and stop tokens stay selectable).
    SpecialTokenMask(special_mask::SpecialTokenMask),
    /// Hide EOS and stop tokens until `min_tokens` tokens were produced.
    MinTokens(min_tokens::MinTokens),
    /// Keep only the listed token ids.
    AllowedTokenIds(allowed_ids::AllowedTokenIds),
    /// Keep only the tokens the sequence's constraint allows (grammar, JSON schema, regex, choice).
    GrammarMask(grammar_mask::GrammarMask),
    /// Add a bias to listed token ids.
    LogitBias(logit_bias::LogitBias),
    /// Forbid the token that would complete a banned token sequence.
    BannedSequences(banned_sequences::BannedSequences),
    /// Forbid the token that would repeat an n-gram.
    NoRepeatNgram(no_repeat_ngram::NoRepeatNgram),
    /// Additive presence and frequency penalties (000 §3.5, first formula).
    PresenceFrequencyPenalty(presence_frequency::PresenceFrequencyPenalty),
    /// CTRL sign-aware repetition penalty (000 §3.5, second formula).
    RepetitionPenalty(repetition::RepetitionPenalty),
    /// Divide logits by a temperature (`0` = the declared greedy branch).
    Temperature(temperature::Temperature),
    /// Keep the k best tokens.
    TopK(top_k::TopK),
    /// Nucleus truncation.
    TopP(top_p::TopP),
    /// Keep tokens with probability at least `min_p` times the maximum.
    MinP(min_p::MinP),
    /// Locally typical truncation.
    TypicalP(typical_p::TypicalP),
}

pub(crate) fn v1() -> u32 {
    1
}

pub(crate) fn check_version(field: &str, got: u32, supported: u32) -> Result<()> {
    if got != supported {
        return Err(crate::Error::invalid(
            format!("{field}.version"),
            format!("version {got} is not supported (this build implements version {supported})"),
        ));
    }
    Ok(())
}

/// Compile-time context: vocabulary facts and request stop conditions.
pub(crate) struct CompileCtx<'a> {
    pub vocab: &'a VocabInfo,
    pub stop_ids: &'a [u32],
    pub next_slot: usize,
}

/// A compiled processor (immutable, shareable across threads).
#[derive(Debug, Clone)]
pub enum Processor {
    /// See [`special_mask`].
    SpecialTokenMask(special_mask::Compiled),
    /// See [`min_tokens`].
    MinTokens(min_tokens::Compiled),
    /// See [`allowed_ids`].
    AllowedTokenIds(allowed_ids::Compiled),
    /// See [`grammar_mask`].
    GrammarMask(grammar_mask::Compiled),
    /// See [`logit_bias`].
    LogitBias(logit_bias::Compiled),
    /// See [`banned_sequences`].
    BannedSequences(banned_sequences::Compiled),
    /// See [`no_repeat_ngram`].
    NoRepeatNgram(no_repeat_ngram::Compiled),
    /// See [`presence_frequency`].
    PresenceFrequencyPenalty(presence_frequency::Compiled),
    /// See [`repetition`].
    RepetitionPenalty(repetition::Compiled),
    /// See [`temperature`].
    Temperature(temperature::Compiled),
    /// See [`top_k`].
    TopK(top_k::Compiled),
    /// See [`top_p`].
    TopP(top_p::Compiled),
    /// See [`min_p`].
    MinP(min_p::Compiled),
    /// See [`typical_p`].
    TypicalP(typical_p::Compiled),
}

impl ProcessorConfig {
    /// The `"type"` tag.
    pub fn type_name(&self) -> &'static str {
        match self {
            ProcessorConfig::SpecialTokenMask(_) => "special_token_mask",
            ProcessorConfig::MinTokens(_) => "min_tokens",
            ProcessorConfig::AllowedTokenIds(_) => "allowed_token_ids",
            ProcessorConfig::GrammarMask(_) => "grammar_mask",
            ProcessorConfig::LogitBias(_) => "logit_bias",
            ProcessorConfig::BannedSequences(_) => "banned_sequences",
            ProcessorConfig::NoRepeatNgram(_) => "no_repeat_ngram",
            ProcessorConfig::PresenceFrequencyPenalty(_) => "presence_frequency_penalty",
            ProcessorConfig::RepetitionPenalty(_) => "repetition_penalty",
            ProcessorConfig::Temperature(_) => "temperature",
            ProcessorConfig::TopK(_) => "top_k",
            ProcessorConfig::TopP(_) => "top_p",
            ProcessorConfig::MinP(_) => "min_p",
            ProcessorConfig::TypicalP(_) => "typical_p",
        }
    }

    /// The config's declared version.
    pub fn version(&self) -> u32 {
        match self {
            ProcessorConfig::SpecialTokenMask(c) => c.version,
            ProcessorConfig::MinTokens(c) => c.version,
            ProcessorConfig::AllowedTokenIds(c) => c.version,
            ProcessorConfig::GrammarMask(c) => c.version,
            ProcessorConfig::LogitBias(c) => c.version,
            ProcessorConfig::BannedSequences(c) => c.version,
            ProcessorConfig::NoRepeatNgram(c) => c.version,
            ProcessorConfig::PresenceFrequencyPenalty(c) => c.version,
            ProcessorConfig::RepetitionPenalty(c) => c.version,
            ProcessorConfig::Temperature(c) => c.version,
            ProcessorConfig::TopK(c) => c.version,
            ProcessorConfig::TopP(c) => c.version,
            ProcessorConfig::MinP(c) => c.version,
            ProcessorConfig::TypicalP(c) => c.version,
        }
    }

    pub(crate) fn compile(&self, idx: usize, ctx: &mut CompileCtx<'_>) -> Result<Processor> {
        let field = format!("processors[{idx}]");
        Ok(match self {
            ProcessorConfig::SpecialTokenMask(c) => {
                Processor::SpecialTokenMask(c.compile(&field, ctx)?)
            }
            ProcessorConfig::MinTokens(c) => Processor::MinTokens(c.compile(&field, ctx)?),
            ProcessorConfig::AllowedTokenIds(c) => {
                Processor::AllowedTokenIds(c.compile(&field, ctx)?)
            }
            ProcessorConfig::GrammarMask(c) => Processor::GrammarMask(c.compile(&field)?),
            ProcessorConfig::LogitBias(c) => Processor::LogitBias(c.compile(&field, ctx)?),
            ProcessorConfig::BannedSequences(c) => {
                Processor::BannedSequences(c.compile(&field, ctx)?)
            }
            ProcessorConfig::NoRepeatNgram(c) => Processor::NoRepeatNgram(c.compile(&field, ctx)?),
            ProcessorConfig::PresenceFrequencyPenalty(c) => {
                Processor::PresenceFrequencyPenalty(c.compile(&field, ctx)?)
            }
            ProcessorConfig::RepetitionPenalty(c) => {
                Processor::RepetitionPenalty(c.compile(&field, ctx)?)
            }
            ProcessorConfig::Temperature(c) => Processor::Temperature(c.compile(&field)?),
            ProcessorConfig::TopK(c) => Processor::TopK(c.compile(&field)?),
            ProcessorConfig::TopP(c) => Processor::TopP(c.compile(&field)?),
            ProcessorConfig::MinP(c) => Processor::MinP(c.compile(&field)?),
            ProcessorConfig::TypicalP(c) => Processor::TypicalP(c.compile(&field)?),
        })
    }
}

impl Processor {
    /// The `"type"` tag of the processor.
    pub fn type_name(&self) -> &'static str {
        match self {
            Processor::SpecialTokenMask(_) => "special_token_mask",
            Processor::MinTokens(_) => "min_tokens",
            Processor::AllowedTokenIds(_) => "allowed_token_ids",
            Processor::GrammarMask(_) => "grammar_mask",
            Processor::LogitBias(_) => "logit_bias",
            Processor::BannedSequences(_) => "banned_sequences",
            Processor::NoRepeatNgram(_) => "no_repeat_ngram",
            Processor::PresenceFrequencyPenalty(_) => "presence_frequency_penalty",
            Processor::RepetitionPenalty(_) => "repetition_penalty",
            Processor::Temperature(_) => "temperature",
            Processor::TopK(_) => "top_k",
            Processor::TopP(_) => "top_p",
            Processor::MinP(_) => "min_p",
            Processor::TypicalP(_) => "typical_p",
        }
    }

    /// The parts of the decoder state this processor reads.
    pub fn reads(&self) -> &'static [StateField] {
        match self {
            Processor::SpecialTokenMask(_) => &[],
            Processor::MinTokens(_) => &[StateField::StepIndex],
            Processor::AllowedTokenIds(_) => &[],
            Processor::GrammarMask(_) => &[StateField::GrammarState],
            Processor::LogitBias(_) => &[],
            Processor::BannedSequences(_) => &[StateField::SequenceState],
            Processor::NoRepeatNgram(_) => &[
                StateField::PromptIds,
                StateField::SelectedIds,
                StateField::SequenceState,
            ],
            Processor::PresenceFrequencyPenalty(c) => c.scope.reads(),
            Processor::RepetitionPenalty(c) => c.scope.reads(),
            Processor::Temperature(_) => &[],
            Processor::TopK(_) => &[],
            Processor::TopP(_) => &[],
            Processor::MinP(_) => &[],
            Processor::TypicalP(_) => &[],
        }
    }

    /// Applies the processor to the workspace.
    pub(crate) fn apply(
        &self,
        st: &DecoderState,
        ws: &mut Workspace,
        vocab: &VocabInfo,
    ) -> Result<()> {
        match self {
            Processor::SpecialTokenMask(c) => c.apply(ws),
            Processor::MinTokens(c) => c.apply(st, ws),
            Processor::AllowedTokenIds(c) => c.apply(ws),
            Processor::GrammarMask(c) => return c.apply(st, ws),
            Processor::LogitBias(c) => c.apply(ws),
            Processor::BannedSequences(c) => c.apply(st, ws),
            Processor::NoRepeatNgram(c) => c.apply(st, ws),
            Processor::PresenceFrequencyPenalty(c) => c.apply(st, ws, vocab),
            Processor::RepetitionPenalty(c) => c.apply(st, ws, vocab),
            Processor::Temperature(c) => c.apply(ws),
            Processor::TopK(c) => c.apply(ws),
            Processor::TopP(c) => c.apply(ws),
            Processor::MinP(c) => c.apply(ws),
            Processor::TypicalP(c) => c.apply(ws),
        }
        Ok(())
    }

    /// Whether this processor keeps a sequence-constraint slot in the decoder state.
    pub(crate) fn has_slot(&self) -> bool {
        matches!(
            self,
            Processor::BannedSequences(_) | Processor::NoRepeatNgram(_)
        )
    }

    /// A fresh sequence-constraint slot for this processor, if it keeps one.
    pub(crate) fn new_slot(&self) -> Option<SequenceSlot> {
        match self {
            Processor::BannedSequences(_) => Some(SequenceSlot::Banned { node: 0 }),
            Processor::NoRepeatNgram(_) => Some(SequenceSlot::NGram {
                index: Default::default(),
            }),
            _ => None,
        }
    }

    /// Advances this processor's slot after `token` was appended at context position `pos`.
    pub(crate) fn consume(
        &self,
        slot: &mut SequenceSlot,
        st: &DecoderState,
        pos: usize,
        token: u32,
    ) {
        match (self, slot) {
            (Processor::BannedSequences(c), SequenceSlot::Banned { node }) => {
                *node =
                    c.automaton
                        .next(*node, token, c.include_prompt || pos >= st.prompt_ids.len())
            }
            (Processor::NoRepeatNgram(c), SequenceSlot::NGram { index }) => {
                c.consume(index, st, pos)
            }
            _ => {}
        }
    }

    /// Whether this processor is a truncation (changes the support, not logits).
    pub fn is_truncation(&self) -> bool {
        matches!(
            self,
            Processor::TopK(_) | Processor::TopP(_) | Processor::MinP(_) | Processor::TypicalP(_)
        )
    }
}
