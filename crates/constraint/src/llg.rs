//! The llguidance back end: regular expressions that are too large for nextok's own DFA, JSON
//! schemas, any-JSON, Lark grammars and (converted) GBNF grammars.
//!
//! The grammar is compiled once into a prototype matcher held by the compiled constraint; every
//! sequence clones it (clones share llguidance's lexer caches). The wrapper converts
//! llguidance's 32-bit-word mask into nextok's 64-bit-word bitset, widens EOS to every EOS id of
//! the vocabulary, and keeps the committed bytes for the state digest.

use std::fmt;
use std::time::{Duration, Instant};

use llguidance::api::{GrammarInit, ParserLimits, StopReason, TopLevelGrammar};
use llguidance::toktrie::{InferenceCapabilities, SimpleVob};
use llguidance::{Logger, Matcher, ParserFactory};

use crate::error::{ConstraintError, LimitKind};
use crate::Limits;

/// Each llguidance limit of [`Limits`] beside llguidance's own field: the one place that pairs
/// them; both directions ([`parser_limits`], [`set_default_parser_limits`]) go through it.
#[allow(clippy::type_complexity)]
fn paired<'a>(
    n: &'a mut Limits,
    p: &'a mut ParserLimits,
) -> (
    [(&'a mut usize, &'a mut usize); 4],
    [(&'a mut u64, &'a mut u64); 2],
) {
    (
        [
            (&mut n.max_items_in_row, &mut p.max_items_in_row),
            (&mut n.step_max_items, &mut p.step_max_items),
            (&mut n.max_lexer_states, &mut p.max_lexer_states),
            (&mut n.max_grammar_size, &mut p.max_grammar_size),
        ],
        [
            (&mut n.initial_lexer_fuel, &mut p.initial_lexer_fuel),
            (&mut n.step_lexer_fuel, &mut p.step_lexer_fuel),
        ],
    )
}

/// Converts nextok limits to llguidance's.
pub(crate) fn parser_limits(l: &Limits) -> ParserLimits {
    let mut ours = l.clone();
    let mut p = ParserLimits {
        precompute_large_lexemes: true,
        verbose_errors: false,
        ..ParserLimits::default()
    };
    let (sizes, fuels) = paired(&mut ours, &mut p);
    sizes.into_iter().for_each(|(n, t)| *t = *n);
    fuels.into_iter().for_each(|(n, t)| *t = *n);
    p
}

/// Sets the llguidance limits of `l` to llguidance's defaults.
pub(crate) fn set_default_parser_limits(l: &mut Limits) {
    let mut theirs = ParserLimits::default();
    let (sizes, fuels) = paired(l, &mut theirs);
    sizes.into_iter().for_each(|(n, t)| *n = *t);
    fuels.into_iter().for_each(|(n, t)| *n = *t);
}

/// A compiled llguidance grammar: the prototype matcher that every sequence clones, and a
/// parser sharing its lexer, through which the size of llguidance's lexer caches is read.
pub(crate) struct LlgProto {
    pub(crate) matcher: Matcher,
    lexer: llguidance::earley::Parser,
}

impl LlgProto {
    /// llguidance's estimate of its lexer tables (regex terms, derivatives, DFA states and
    /// transitions), shared by every clone of the matcher; they grow as sequences reach new
    /// lexer states, up to [`Limits::max_lexer_states`].
    pub(crate) fn lexer_bytes(&self) -> usize {
        self.lexer.lexer_stats().num_bytes
    }

    /// The number of lexer states built so far.
    pub(crate) fn lexer_states(&self) -> usize {
        self.lexer.lexer_stats().num_states
    }
}

/// Compiles `grammar` into a prototype matcher.
pub(crate) fn compile(
    factory: &ParserFactory,
    grammar: TopLevelGrammar,
    limits: &Limits,
    input: &'static str,
) -> Result<(LlgProto, Duration), ConstraintError> {
    let t0 = Instant::now();
    let parser = factory
        .create_parser_from_init_ext(
            GrammarInit::Serialized(grammar),
            Logger::new(0, 0),
            InferenceCapabilities::default(),
            parser_limits(limits),
        )
        .map_err(|e| classify(&format!("{e:#}"), input).with_source(e))?;
    let lexer = parser.parser.clone();
    let mut m = Matcher::new(Ok(parser));
    // The first mask builds the initial lexer state; errors in the grammar that llguidance
    // finds only then surface here, at compile time.
    if let Err(e) = m.compute_mask() {
        return Err(classify(&format!("{e:#}"), input).with_source(e));
    }
    // No time check here: this compile may be a probe (`regex_refused`, `disjoint`) or an
    // attempt with a fallback (the any-order grammar), whose outcome must not depend on the
    // machine's load; the optional `max_compile_time` is checked once, on the whole compile.
    // Start sequences from a fresh prototype (the probe mask above is not state).
    Ok((LlgProto { matcher: m, lexer }, t0.elapsed()))
}

/// Maps an llguidance error message to a typed error.
pub(crate) fn classify(msg: &str, input: &'static str) -> ConstraintError {
    let first = msg.lines().next().unwrap_or(msg).trim().to_string();
    if let Some(rest) = msg.split("Unimplemented keys: ").nth(1) {
        let list = rest.lines().next().unwrap_or(rest);
        let keys: Vec<String> = list
            .trim_matches(|c| c == '[' || c == ']')
            .split(',')
            .map(|k| k.trim().trim_matches('"').to_string())
            .filter(|k| !k.is_empty())
            .collect();
        return ConstraintError::unsupported(keys.join(", "), first);
    }
    if msg.contains("oneOf constraints are not supported") {
        return ConstraintError::unsupported(
            "oneOf",
            "oneOf is not supported exactly (set coerce_one_of to treat it as anyOf)",
        );
    }
    if let Some(rest) = msg.split("Unknown format: ").nth(1) {
        let f = rest.split_whitespace().next().unwrap_or("");
        return ConstraintError::unsupported("format", format!("format `{f}` is not supported"));
    }
    for (needle, keyword) in [
        (
            "min/maxProperties only supported",
            "minProperties/maxProperties",
        ),
        ("is not present in a registry", "$ref"),
        ("circular references with sibling keys", "$ref"),
        ("patternProperty regexes", "patternProperties"),
    ] {
        if msg.contains(needle) {
            return ConstraintError::unsupported(keyword, first);
        }
    }
    if msg.contains("NoExtensionBias") {
        // llguidance's word for a grammar whose start derives no finite string
        return ConstraintError::unsatisfiable("no finite text matches: a rule (or `$ref`) refers to itself with no way out (a cycle without a base case)");
    }
    if msg.contains("Unsatisfiable schema") {
        return ConstraintError::unsatisfiable(first);
    }
    let limit = if msg.contains("grammar size (number of symbols) too big") {
        Some(LimitKind::GrammarSize)
    } else if msg.contains("initial lexer configuration (grammar) too big")
        || msg.contains("initial_lexer_fuel")
        // the initial fuel spent checking which lexemes can match at all
        || msg.contains("fuel exhausted when checking relevance of lexemes")
    {
        Some(LimitKind::CompileFuel)
    } else if msg.contains("items; max is") {
        Some(LimitKind::ItemsInRow)
    } else if msg.contains("lexer states") || msg.contains("max_lexer_states") {
        Some(LimitKind::LexerStates)
    } else {
        None
    };
    if let Some(limit) = limit {
        return ConstraintError::limit_exceeded(limit, first);
    }
    // llguidance puts the place first ("at line 3 ...", "(line 2)"), or names the schema path
    // in a "while processing" line.
    let place = msg
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("while processing ")
                .map(str::to_string)
        })
        .or_else(|| {
            msg.find("line ").map(|i| {
                msg[i..]
                    .split([':', ')', '\n'])
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_string()
            })
        })
        .unwrap_or_else(|| "top level".into());
    // the whole message: a regex parse error's first line says only "regex parse error:"
    let message = msg
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    ConstraintError::syntax(input, place, message)
}

/// Per-sequence llguidance state.
#[derive(Clone)]
pub(crate) struct LlgState {
    pub(crate) matcher: Matcher,
    /// The last mask computed (valid until the next commit / rollback).
    pub(crate) last_mask: Option<SimpleVob>,
}

impl LlgState {
    pub(crate) fn error(&self) -> Option<String> {
        self.matcher.get_error()
    }

    /// Maps a step failure (llguidance's stop reason) to a typed error with the failure as its
    /// source.
    pub(crate) fn step_error<E>(&self, e: E) -> ConstraintError
    where
        E: fmt::Display + Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    {
        let msg = format!("{e:#}");
        let err = match self.matcher.stop_reason() {
            StopReason::LexerTooComplex => {
                ConstraintError::limit_exceeded(LimitKind::StepFuel, msg)
            }
            StopReason::ParserTooComplex => {
                ConstraintError::limit_exceeded(LimitKind::StepItems, msg)
            }
            _ => ConstraintError::engine(msg),
        };
        err.with_source(e)
    }
}

/// An engine failure of llguidance as a typed error, with the failure as its source.
pub(crate) fn engine_error<E>(e: E) -> ConstraintError
where
    E: fmt::Display + Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
{
    ConstraintError::engine(format!("{e:#}")).with_source(e)
}

/// llguidance run directly, without nextok's wrapper (no conversion of the mask to nextok's
/// bitset, no widening of EOS): the baseline of the mask benchmark. Made by
/// [`crate::ConstraintEngine::llguidance_baseline`]; clones share llguidance's lexer caches.
#[derive(Clone)]
pub struct LlguidanceBaseline {
    matcher: Matcher,
}

impl std::fmt::Debug for LlguidanceBaseline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlguidanceBaseline").finish_non_exhaustive()
    }
}

impl LlguidanceBaseline {
    pub(crate) fn new(
        factory: &ParserFactory,
        grammar: TopLevelGrammar,
    ) -> Result<LlguidanceBaseline, ConstraintError> {
        let parser = factory.create_parser(grammar).map_err(engine_error)?;
        Ok(LlguidanceBaseline {
            matcher: Matcher::new(Ok(parser)),
        })
    }

    /// Computes the mask of allowed tokens (in llguidance's own form; it is dropped).
    pub fn compute_mask(&mut self) -> Result<(), ConstraintError> {
        self.matcher.compute_mask().map(drop).map_err(engine_error)
    }

    /// Consumes `token`.
    pub fn consume(&mut self, token: u32) -> Result<(), ConstraintError> {
        self.matcher.consume_token(token).map_err(engine_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_map_both_ways() {
        let d = ParserLimits::default();
        let p = parser_limits(&Limits::default());
        assert_eq!(p.max_items_in_row, d.max_items_in_row);
        assert_eq!(p.initial_lexer_fuel, d.initial_lexer_fuel);
        assert_eq!(p.step_lexer_fuel, d.step_lexer_fuel);
        assert_eq!(p.step_max_items, d.step_max_items);
        assert_eq!(p.max_lexer_states, d.max_lexer_states);
        assert_eq!(p.max_grammar_size, d.max_grammar_size);
        assert!(p.precompute_large_lexemes && !p.verbose_errors);
        let l = Limits {
            max_items_in_row: 1,
            initial_lexer_fuel: 2,
            step_lexer_fuel: 3,
            step_max_items: 4,
            max_lexer_states: 5,
            max_grammar_size: 6,
            ..Limits::default()
        };
        let p = parser_limits(&l);
        assert_eq!(
            (
                p.max_items_in_row,
                p.initial_lexer_fuel,
                p.step_lexer_fuel,
                p.step_max_items,
                p.max_lexer_states,
                p.max_grammar_size
            ),
            (1, 2, 3, 4, 5, 6)
        );
    }
}
