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
//!
//! Everything about one processor lives in its file: the config struct (its serde form), the
//! compiled struct, and two trait impls — `Compile` for the config (type tag, version,
//! validation, compilation) and `Apply` for the compiled form (what it reads, the step itself,
//! and, for a processor that keeps a sequence-constraint slot, that slot). This file only lists
//! the processors.
//!
//! How to add a processor:
//! 1. Write `processors/<name>.rs` with the config struct (`#[serde(deny_unknown_fields)]`,
//!    a `version` field defaulting to 1), a `Compiled` struct, `impl Compile for <Config>`
//!    (`NAME` is the snake_case of the enum arm, i.e. the JSON `"type"`) and
//!    `impl Apply for Compiled`.
//! 2. Add `pub mod <name>;` and one documented arm `<Arm>(<name>::<Config>)` to
//!    [`ProcessorConfig`].
//! 3. Add one line `<Arm>(<name>::<Config>),` to the `processors!` list below; it generates the
//!    [`Processor`] arm and every dispatch.
//! 4. Add an example of it to `EXAMPLES` in this file's test (which checks `NAME` against the
//!    serde tag) and its own unit tests in its file. The golden pipelines under
//!    `testdata/golden` stay unchanged unless a preset starts using the new processor.

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

/// What a processor's config provides (implemented in the processor's file).
pub(crate) trait Compile {
    /// The `"type"` tag: the snake_case name of the [`ProcessorConfig`] arm.
    const NAME: &'static str;
    /// The implementation version this build supports.
    const VERSION: u32;
    /// The compiled form.
    type Compiled: Apply;
    /// The config's declared version.
    fn version(&self) -> u32;
    /// Validates the config and compiles it (the version is already checked); `field` names the
    /// processor in errors (`processors[i]`).
    fn compile(&self, field: &str, ctx: &mut CompileCtx<'_>) -> Result<Self::Compiled>;
}

/// What a compiled processor does at each step (implemented in the processor's file).
pub(crate) trait Apply {
    /// Whether this processor is a truncation (changes the support, not logits).
    const TRUNCATION: bool = false;
    /// The parts of the decoder state this processor reads.
    fn reads(&self) -> &'static [StateField] {
        &[]
    }
    /// Applies the processor to the workspace.
    fn apply(&self, st: &DecoderState, ws: &mut Workspace, vocab: &VocabInfo) -> Result<()>;
    /// A fresh sequence-constraint slot, for a processor that keeps one (at the index it took
    /// with [`CompileCtx::take_slot`]).
    fn new_slot(&self) -> Option<SequenceSlot> {
        None
    }
    /// Advances this processor's slot in `slots` after `token` was appended at context
    /// position `pos`.
    fn consume(&self, _slots: &mut [SequenceSlot], _st: &DecoderState, _pos: usize, _token: u32) {}
}

pub(crate) fn v1() -> u32 {
    1
}

fn check_version(field: &str, got: u32, supported: u32) -> Result<()> {
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

impl CompileCtx<'_> {
    /// Takes the next sequence-constraint slot index.
    pub(crate) fn take_slot(&mut self) -> usize {
        let slot = self.next_slot;
        self.next_slot += 1;
        slot
    }
}

fn compile_one<C: Compile>(c: &C, idx: usize, ctx: &mut CompileCtx<'_>) -> Result<C::Compiled> {
    let field = format!("processors[{idx}]");
    check_version(&field, c.version(), C::VERSION)?;
    c.compile(&field, ctx)
}

/// Generates [`Processor`] and the dispatch of [`ProcessorConfig`] and [`Processor`] from the
/// list of `Arm(module::Config)` lines.
macro_rules! processors {
    ($($arm:ident($module:ident::$config:ident),)*) => {
        /// A compiled processor (immutable, shareable across threads).
        #[derive(Debug, Clone)]
        pub enum Processor {
            $(
                #[doc = concat!("See [`", stringify!($module), "`].")]
                $arm($module::Compiled),
            )*
        }

        /// The `"type"` tag of every processor, in list order.
        #[cfg(test)]
        const NAMES: &[&str] = &[$(<$module::$config as Compile>::NAME,)*];

        impl ProcessorConfig {
            /// The `"type"` tag.
            pub fn type_name(&self) -> &'static str {
                match self {
                    $(ProcessorConfig::$arm(_) => <$module::$config as Compile>::NAME,)*
                }
            }

            /// The config's declared version.
            pub fn version(&self) -> u32 {
                match self {
                    $(ProcessorConfig::$arm(c) => c.version(),)*
                }
            }

            pub(crate) fn compile(&self, idx: usize, ctx: &mut CompileCtx<'_>) -> Result<Processor> {
                Ok(match self {
                    $(ProcessorConfig::$arm(c) => Processor::$arm(compile_one(c, idx, ctx)?),)*
                })
            }
        }

        impl Processor {
            /// The `"type"` tag of the processor.
            pub fn type_name(&self) -> &'static str {
                match self {
                    $(Processor::$arm(_) => <$module::$config as Compile>::NAME,)*
                }
            }

            /// The parts of the decoder state this processor reads.
            pub fn reads(&self) -> &'static [StateField] {
                match self {
                    $(Processor::$arm(c) => c.reads(),)*
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
                    $(Processor::$arm(c) => c.apply(st, ws, vocab),)*
                }
            }

            /// A fresh sequence-constraint slot for this processor, if it keeps one.
            pub(crate) fn new_slot(&self) -> Option<SequenceSlot> {
                match self {
                    $(Processor::$arm(c) => c.new_slot(),)*
                }
            }

            /// Advances this processor's slot in `slots` (all of the state's slots) after `token`
            /// was appended at context position `pos`.
            pub(crate) fn consume(
                &self,
                slots: &mut [SequenceSlot],
                st: &DecoderState,
                pos: usize,
                token: u32,
            ) {
                match self {
                    $(Processor::$arm(c) => c.consume(slots, st, pos, token),)*
                }
            }

            /// Whether this processor is a truncation (changes the support, not logits).
            pub fn is_truncation(&self) -> bool {
                match self {
                    $(Processor::$arm(_) => <$module::Compiled as Apply>::TRUNCATION,)*
                }
            }
        }
    };
}

// The one list of processors: each line generates the processor's `Processor` arm and its
// arm in every dispatch below. Order is the order of the enums, not of a pipeline.
processors! {
    SpecialTokenMask(special_mask::SpecialTokenMask),
    MinTokens(min_tokens::MinTokens),
    AllowedTokenIds(allowed_ids::AllowedTokenIds),
    GrammarMask(grammar_mask::GrammarMask),
    LogitBias(logit_bias::LogitBias),
    BannedSequences(banned_sequences::BannedSequences),
    NoRepeatNgram(no_repeat_ngram::NoRepeatNgram),
    PresenceFrequencyPenalty(presence_frequency::PresenceFrequencyPenalty),
    RepetitionPenalty(repetition::RepetitionPenalty),
    Temperature(temperature::Temperature),
    TopK(top_k::TopK),
    TopP(top_p::TopP),
    MinP(min_p::MinP),
    TypicalP(typical_p::TypicalP),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One example of every processor, as JSON.
    const EXAMPLES: &str = r#"[
        {"type": "special_token_mask"},
        {"type": "min_tokens", "min_tokens": 1},
        {"type": "allowed_token_ids", "token_ids": [1]},
        {"type": "grammar_mask"},
        {"type": "logit_bias", "logit_bias": {"1": 2.0}},
        {"type": "banned_sequences", "sequences": [[1, 2]]},
        {"type": "no_repeat_ngram", "ngram_size": 2},
        {"type": "presence_frequency_penalty", "presence_penalty": 0.5},
        {"type": "repetition_penalty", "repetition_penalty": 1.1},
        {"type": "temperature", "temperature": 0.7},
        {"type": "top_k", "top_k": 3},
        {"type": "top_p", "top_p": 0.9},
        {"type": "min_p", "min_p": 0.1},
        {"type": "typical_p", "typical_p": 0.9}
    ]"#;

    #[test]
    fn type_names_match_the_serde_tags() {
        let values: Vec<serde_json::Value> = serde_json::from_str(EXAMPLES).unwrap();
        let mut names = Vec::new();
        for v in values {
            let cfg: ProcessorConfig = serde_json::from_value(v.clone()).unwrap();
            let tag = serde_json::to_value(&cfg).unwrap()["type"].clone();
            assert_eq!(tag, v["type"]);
            assert_eq!(tag, cfg.type_name());
            names.push(cfg.type_name());
        }
        names.sort_unstable();
        let mut all = NAMES.to_vec();
        all.sort_unstable();
        assert_eq!(names, all, "every processor needs an example here");
    }
}
