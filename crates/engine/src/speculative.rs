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
//! The `rejection` mode ([`Acceptance::Rejection`]) is the classic rule instead (Leviathan et
//! al. 2022, with the drafter's distribution a point mass at its token): each drafted token is
//! accepted with probability `p(token)` under the acceptance draws of the sequence's stream,
//! otherwise replaced by a draw from the rest of `p` ([`nextok_core::Draw::Draft`]). Its tokens
//! are distributed as plain decoding's, but they are not plain decoding's tokens for the seed.
//!
//! Either way, a step that verified a drafted token says so in its record
//! ([`nextok_core::DraftRecord`]: the token, whether it was accepted, the rule).
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
    src: nextok_model::ModelSource,
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

/// How drafted tokens are accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Acceptance {
    /// A drafted token stands iff the step's own selection (plain decoding's draw) is that
    /// token: the output is plain decoding's, token for token.
    #[default]
    Exact,
    /// Leviathan's rejection rule ([`nextok_core::Draw::Draft`]): the output is distributed
    /// as plain decoding's, on the acceptance draws of the stream.
    Rejection,
}

impl Acceptance {
    /// Its name (`exact`, `rejection`).
    pub fn name(self) -> &'static str {
        match self {
            Acceptance::Exact => "exact",
            Acceptance::Rejection => "rejection",
        }
    }
}

impl std::str::FromStr for Acceptance {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "exact" => Ok(Acceptance::Exact),
            "rejection" => Ok(Acceptance::Rejection),
            other => Err(format!(
                "unknown acceptance mode `{other}` (expected exact or rejection)"
            )),
        }
    }
}

/// Which drafter proposes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DrafterKind {
    /// Prompt lookup ([`NgramDrafter`]).
    #[default]
    Ngram,
    /// The engine's draft model ([`ModelDrafter`]; see
    /// [`Engine::with_draft_model`](crate::Engine::with_draft_model)).
    Model,
}

/// Options of speculative decoding (as a trace header records them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SpecOptions {
    /// Which drafter proposes.
    #[serde(default)]
    pub drafter: DrafterKind,
    /// The most tokens one draft may hold.
    pub max_draft: usize,
    /// The prompt-lookup drafter's n-gram sizes.
    pub ngram: NgramDrafter,
    /// How drafted tokens are accepted.
    pub acceptance: Acceptance,
    /// Draft the bytes a request's constraint forces next before the drafter's guess
    /// ([`draft_next`]). On in [`SpecOptions::default`]; off when a trace header or a
    /// request's JSON leaves it out, as headers written before it did (their `rejection`
    /// draws replay as recorded).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub constraint_drafts: bool,
    /// How drafts follow the constraint, when `constraint_drafts` is on: `0`, its forced
    /// bytes, then the drafter's guess as it comes (builds of 2026-12-07); `1`
    /// ([`SpecOptions::DRAFT_RULES`]), in rounds: the guess is cut at the first token the
    /// constraint refuses and the bytes it forces there start the next round
    /// ([`draft_next`]). A trace header or request JSON without the field means `0`, so
    /// every trace replays the drafts it recorded.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub draft_rules: u32,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

impl Default for SpecOptions {
    fn default() -> Self {
        SpecOptions {
            drafter: DrafterKind::Ngram,
            max_draft: 7,
            ngram: NgramDrafter::default(),
            acceptance: Acceptance::Exact,
            constraint_drafts: true,
            draft_rules: SpecOptions::DRAFT_RULES,
        }
    }
}

/// What [`draft_next`] reuses from one draft to the next (no allocation once warm).
#[derive(Debug, Default)]
pub struct DraftScratch {
    /// The bytes the constraint forces at the point reached.
    forced: Vec<u8>,
    /// The drafter's guess of the current round.
    guess: Vec<u32>,
}

impl DraftScratch {
    /// Room for drafts of `max_draft` tokens.
    pub fn with_capacity(max_draft: usize) -> Self {
        DraftScratch {
            forced: Vec::with_capacity(64),
            guess: Vec::with_capacity(max_draft),
        }
    }
}

/// The constraint a draft follows ([`draft_next`]).
#[derive(Clone, Copy)]
pub struct ConstraintDrafts<'a> {
    /// The sequence's constraint state.
    pub slot: &'a nextok_core::state::GrammarSlot,
    /// The model, whose tokenizer splits the forced bytes as the model was trained to see them.
    pub model: &'a nextok_model::Model,
    /// Drafting rules 1: rounds ([`SpecOptions::draft_rules`]).
    pub rounds: bool,
}

/// Drafts up to `k` tokens after `history` (the prompt and the output so far, its last token
/// the pending one) into `out`.
///
/// Without a constraint (`forced` is `None`) that is `drafter`'s guess. With one, the draft
/// follows the constraint in rounds:
/// 1. the tokens of the bytes the constraint forces at the point reached (the last token left
///    out, since it may merge with the bytes that follow);
/// 2. `drafter`'s guess after them, cut at the first token the constraint refuses;
/// 3. where it refused one and forces bytes there, the next round starts with those bytes.
///
/// Prompt lookup alone loses its place where the output departs from the prompt (a JSON
/// object's layout, its keys in the schema's order): a forced key puts it back on the
/// prompt's text, and a guess that runs into the wrong key is cut where the constraint takes
/// over. Each round adds a token or ends the draft. Under drafting rules 0 (`rounds` off)
/// there is one round and the guess is not cut. `history` is left as it was.
pub fn draft_next(
    drafter: &mut dyn Drafter,
    history: &mut Vec<u32>,
    forced: Option<ConstraintDrafts<'_>>,
    k: usize,
    scratch: &mut DraftScratch,
    out: &mut Vec<u32>,
) {
    out.clear();
    if k == 0 {
        return;
    }
    let Some(ConstraintDrafts {
        slot,
        model,
        rounds,
    }) = forced
    else {
        drafter.draft(history, k, out);
        return;
    };
    let n0 = history.len();
    slot.probe(&[], &mut scratch.forced);
    for _ in 0..=k {
        let before = out.len();
        if !scratch.forced.is_empty() {
            let bytes = &scratch.forced;
            // the whole characters among the bytes (a character cut by the end stays undrafted)
            let text = match std::str::from_utf8(bytes) {
                Ok(t) => t,
                Err(e) => std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default(),
            };
            if !text.is_empty() {
                if let Ok(ids) = model.encoder.encode(text, false) {
                    let keep = ids.len().saturating_sub(1).min(k - out.len());
                    out.extend_from_slice(&ids[..keep]);
                    history.extend_from_slice(&ids[..keep]);
                }
            }
        }
        if out.len() == k {
            break;
        }
        drafter.draft(history, k - out.len(), &mut scratch.guess);
        if !rounds {
            // rules 0: the guess as it comes
            out.extend_from_slice(&scratch.guess);
            break;
        }
        if scratch.guess.is_empty() {
            break;
        }
        // where the guess leaves the constraint, and what the constraint forces there
        history.extend_from_slice(&scratch.guess);
        let took = slot.probe(&history[n0..], &mut scratch.forced);
        if took < out.len() {
            // the forced bytes' tokens did not hold (a tokenizer the constraint reads
            // otherwise): keep what it takes and stop
            out.truncate(took);
            break;
        }
        let valid = took - out.len();
        out.extend_from_slice(&scratch.guess[..valid]);
        history.truncate(n0 + out.len());
        if valid == scratch.guess.len() || scratch.forced.is_empty() || out.len() == before {
            break;
        }
    }
    history.truncate(n0);
}

impl SpecOptions {
    /// The largest draft length accepted.
    pub const MAX_DRAFT: usize = 32;
    /// The current drafting rules ([`SpecOptions::draft_rules`]).
    pub const DRAFT_RULES: u32 = 1;

    /// The constraint to draft from, when these options draft from it: the slot, the model
    /// (whose tokenizer splits its forced bytes) and whether drafts go in rounds.
    pub fn constraint_source<'a>(
        &self,
        slot: Option<&'a nextok_core::state::GrammarSlot>,
        model: &'a nextok_model::Model,
    ) -> Option<ConstraintDrafts<'a>> {
        slot.filter(|_| self.constraint_drafts)
            .map(|slot| ConstraintDrafts {
                slot,
                model,
                rounds: self.draft_rules >= 1,
            })
    }

    /// Options from their text form, `ngram` or `ngram:K` (prompt lookup with drafts of at
    /// most `K` tokens, `1..=32`, default 7) or `model` / `model:K` (the engine's draft
    /// model), with `acceptance`. The error says what is wrong with the text (the caller
    /// names the field).
    pub fn parse(text: &str, acceptance: Acceptance) -> std::result::Result<SpecOptions, String> {
        let (kind, k) = match text.split_once(':') {
            Some((kind, k)) => (kind, Some(k)),
            None => (text, None),
        };
        let drafter = match kind {
            "ngram" => DrafterKind::Ngram,
            "model" => DrafterKind::Model,
            _ => {
                return Err(format!(
                    "unknown drafter `{kind}` (expected `ngram`, `ngram:K`, `model` or `model:K`)"
                ))
            }
        };
        let mut o = SpecOptions {
            drafter,
            acceptance,
            ..SpecOptions::default()
        };
        if let Some(k) = k {
            o.max_draft = match k.parse::<usize>() {
                Ok(k) if (1..=Self::MAX_DRAFT).contains(&k) => k,
                _ => {
                    return Err(format!(
                        "the draft length `{k}` must be a whole number from 1 to {}",
                        Self::MAX_DRAFT
                    ))
                }
            };
        }
        Ok(o)
    }

    /// Refuses options no drafter can run: a draft length outside `1..=32`, n-gram sizes
    /// outside `1..=32` or with the shortest above the longest. Errors name the field
    /// (`speculative.max_draft`, `speculative.ngram.min_ngram`, …).
    pub fn check(&self) -> crate::Result<()> {
        let range = |field: &str, v: usize| {
            if (1..=Self::MAX_DRAFT).contains(&v) {
                Ok(())
            } else {
                Err(crate::EngineError::invalid(
                    field,
                    format!("{v} is outside 1..={}", Self::MAX_DRAFT),
                ))
            }
        };
        range("speculative.max_draft", self.max_draft)?;
        range("speculative.ngram.max_ngram", self.ngram.max_ngram)?;
        range("speculative.ngram.min_ngram", self.ngram.min_ngram)?;
        if self.ngram.min_ngram > self.ngram.max_ngram {
            return Err(crate::EngineError::invalid(
                "speculative.ngram.min_ngram",
                format!(
                    "{} is above max_ngram ({})",
                    self.ngram.min_ngram, self.ngram.max_ngram
                ),
            ));
        }
        if self.draft_rules > Self::DRAFT_RULES {
            return Err(crate::EngineError::invalid(
                "speculative.draft_rules",
                format!(
                    "{} is not a drafting rule this build knows (0..={})",
                    self.draft_rules,
                    Self::DRAFT_RULES
                ),
            ));
        }
        Ok(())
    }

    /// The draw of a step that verifies the drafted token `x` (`None` past the draft).
    pub fn draw(&self, x: Option<u32>) -> nextok_core::Draw {
        match (self.acceptance, x) {
            (Acceptance::Rejection, Some(x)) => nextok_core::Draw::Draft(x),
            _ => nextok_core::Draw::Stream,
        }
    }

    /// Completes the record of a step that verified the drafted token `x` and selected
    /// `selected` (the rejection rule's records are complete already).
    pub fn mark(&self, rec: &mut nextok_core::StepRecord, x: Option<u32>) {
        if let (Some(x), None) = (x, &rec.draft) {
            rec.draft = Some(nextok_core::DraftRecord {
                token: x,
                accepted: rec.selected == x,
                rule: nextok_core::DraftRule::Exact,
                accept_u: None,
                residual_u: None,
            });
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

/// The first draft's length: the model's register tiles take four activation rows at a time,
/// so where a step is one read of the weights (1.5B and up) a pass of four rows costs about
/// one of one row, and a first guess that fails costs little; full acceptance grows the length
/// from there. (With a 135M model, whose weights sit in the L3 cache, each row past the first
/// adds about a quarter of a one-row pass: first drafts of 1 or 2 tokens were measured, and
/// they change the passes of the speculative bench by a pass or two either way.)
const FIRST_DRAFT: usize = 3;
/// Drafts rejected at their first token in a row before drafting pauses.
const MISSES_BEFORE_PAUSE: usize = 3;
/// Steps the first pause lasts.
const PAUSE_STEPS: usize = 8;
/// The longest pause.
const MAX_PAUSE_STEPS: usize = 128;

impl Adaptive {
    /// Starts at `max` tokens or the first draft's length, whichever is shorter.
    pub fn new(max: usize) -> Adaptive {
        Adaptive {
            max,
            k: max.min(FIRST_DRAFT),
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
        // the first draft is short; full acceptance grows it up to the maximum
        assert_eq!(a.next_len(), FIRST_DRAFT);
        a.observe(FIRST_DRAFT, FIRST_DRAFT);
        assert_eq!(a.next_len(), 4);
        a.observe(4, 4);
        assert_eq!(a.next_len(), 4);
        assert_eq!(Adaptive::new(2).next_len(), 2);
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
