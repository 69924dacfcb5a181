//! Deterministic benchmark fixtures shared by the criterion benchmark (`benches/sampler.rs`)
//! and `nextok bench sampler`. Not part of the stable API.
//!
//! * [`Fixture`] — a realistic heavy-tailed logits row ([`nextok_testdata::rows::row`]) with its
//!   vocabulary facts: 256 reserved special tokens at the top of the vocabulary (hidden by the
//!   special mask, one of them the EOS) and a 96-token history (BOS, repeats of strong tokens
//!   and bulk tokens) so that history penalties act. The rows are drawn with nextok's own `ln`,
//!   so a fixture is the same on every platform.
//! * [`floor_sum`] — the floor: one streaming pass summing the logits in 8 `f32` lanes.
//! * [`Naive`] — what an engine does with a full sort of the vocabulary (HF, or llama.cpp with
//!   top-k off): the same processors as the case, softmax over V, a full sort by probability,
//!   cumulative sums, then an inverse-CDF draw.
//! * [`StepBench`] / [`BatchBench`] — ready-made per-step and batch workloads.

use std::time::{Duration, Instant};

use nextok_core::math::{exp_f32, ln_f64};
use nextok_core::WorkspacePool;
use nextok_core::{DecoderState, Preset, Result, Sampler, SamplingParams, StepResult, VocabInfo};
use nextok_core::{Draw, Workspace};
use nextok_testdata::rows::{self, Row};

pub use nextok_testdata::rows::{
    SplitMix64, FLAT_SIGMA, FLAT_STRONG_TOKENS, FLAT_VOCAB_SIZES, HISTORY_LEN, SPECIAL_TOKENS,
    STRONG_TOKENS, TARGET_VOCAB, VOCAB_SIZES,
};

/// Rows of the batch benchmark.
pub const BATCH_ROWS: usize = 64;

/// One benchmark row: vocabulary facts, raw logits and a token history.
#[derive(Debug, Clone)]
pub struct Fixture {
    /// Vocabulary facts (256 reserved special ids at the top, the second one EOS).
    pub vocab: VocabInfo,
    /// The raw logits.
    pub logits: Vec<f32>,
    /// The history (used as the prompt): BOS, then a mix of strong and bulk tokens.
    pub history: Vec<u32>,
    /// The strong token ids.
    pub strong: Vec<u32>,
}

impl From<Row> for Fixture {
    fn from(r: Row) -> Self {
        Fixture {
            vocab: VocabInfo {
                vocab_size: r.vocab_size(),
                eos_token_ids: vec![r.eos()],
                special_token_ids: r.special.clone().collect(),
            },
            logits: r.logits,
            history: r.history,
            strong: r.strong,
        }
    }
}

/// A deterministic fixture row for a vocabulary of `v` tokens (`v >= 1024`; see
/// [`rows::row`]).
pub fn fixture(v: usize, seed: u64) -> Fixture {
    rows::row(v, seed, ln_f64).into()
}

/// A deterministic flat row for a vocabulary of `v` tokens (`v >= 1024`): what high
/// temperatures and creative sampling produce (see [`rows::flat_row`]). Top-p 0.95 keeps a
/// large nucleus: about 14 thousand tokens at V = 128,256 and 49 thousand at 262,144.
pub fn flat_fixture(v: usize, seed: u64) -> Fixture {
    rows::flat_row(v, seed, ln_f64).into()
}

/// The benchmarked sampling configurations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// llama.cpp's default chain: special mask, repetition 1.1 + presence 0.5 + frequency 0.1
    /// over the last 64 tokens, top-k 40, top-p 0.95, min-p 0.05, temperature 0.8, categorical.
    DefaultChain,
    /// The reference order with only top-p 0.95 (top-k off, T = 1), categorical.
    TopPOnly,
    /// llama.cpp's default chain with the penalties off (llama.cpp's own defaults since its
    /// repetition penalty became 1.0): special mask, top-k 40, top-p 0.95, min-p 0.05,
    /// temperature 0.8, categorical. Run beside llama.cpp's sampler (`--llama-lib`).
    NoPenalties,
}

impl Case {
    /// Both cases.
    pub const ALL: [Case; 2] = [Case::DefaultChain, Case::TopPOnly];

    /// The cases run beside llama.cpp's sampler: both, and the default chain with penalties off.
    pub const WITH_PEER: [Case; 3] = [Case::DefaultChain, Case::NoPenalties, Case::TopPOnly];

    /// Human-readable name.
    pub fn name(&self) -> &'static str {
        match self {
            Case::DefaultChain => "llama.cpp default chain",
            Case::TopPOnly => "top-p 0.95 alone, top-k off",
            Case::NoPenalties => "llama.cpp default chain, no penalties",
        }
    }

    /// Short identifier (benchmark ids, JSON).
    pub fn key(&self) -> &'static str {
        match self {
            Case::DefaultChain => "default_chain",
            Case::TopPOnly => "top_p",
            Case::NoPenalties => "default_chain_no_penalties",
        }
    }

    /// The preset.
    pub fn preset(&self) -> Preset {
        match self {
            Case::DefaultChain | Case::NoPenalties => Preset::LlamaCpp,
            Case::TopPOnly => Preset::Reference,
        }
    }

    /// The request parameters.
    pub fn params(&self) -> SamplingParams {
        match self {
            Case::DefaultChain => SamplingParams {
                temperature: Some(0.8),
                top_k: Some(40),
                top_p: Some(0.95),
                min_p: Some(0.05),
                repetition_penalty: Some(1.1),
                presence_penalty: Some(0.5),
                frequency_penalty: Some(0.1),
                penalty_last_n: Some(64),
                ignore_eos: true,
                ..Default::default()
            },
            Case::TopPOnly => SamplingParams {
                top_p: Some(0.95),
                ignore_eos: true,
                ..Default::default()
            },
            Case::NoPenalties => SamplingParams {
                temperature: Some(0.8),
                top_k: Some(40),
                top_p: Some(0.95),
                min_p: Some(0.05),
                ignore_eos: true,
                ..Default::default()
            },
        }
    }

    /// The compiled sampler for `vocab`.
    pub fn sampler(&self, vocab: &VocabInfo) -> Sampler {
        Sampler::from_params(self.preset(), &self.params(), vocab.clone())
            .expect("benchmark pipelines are valid")
    }
}

/// The floor: one streaming pass summing the logits in 8 `f32` lanes (vectorises).
#[inline(never)]
pub fn floor_sum(xs: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = xs.chunks_exact(8);
    let rem = chunks.remainder();
    for c in chunks {
        for j in 0..8 {
            acc[j] += c[j];
        }
    }
    for (j, &x) in rem.iter().enumerate() {
        acc[j] += x;
    }
    acc.iter().sum()
}

/// The full-sort baseline: the case's processors done the obvious way, with a sort of the whole
/// vocabulary. Scratch buffers are reused, so it allocates nothing per step either.
#[derive(Debug, Clone)]
pub struct Naive {
    pairs: Vec<(f32, u32)>,
    window: Vec<u32>,
    probs: Vec<f64>,
    rng: SplitMix64,
}

impl Naive {
    /// A baseline for vocabularies of `v` tokens; `seed` keys its uniform draws.
    pub fn new(v: usize, seed: u64) -> Self {
        Naive {
            pairs: Vec::with_capacity(v),
            window: Vec::with_capacity(64),
            probs: Vec::with_capacity(v),
            rng: SplitMix64::new(seed),
        }
    }

    /// One step of `case` on `logits` with `history`; returns the token and the final support
    /// size.
    #[inline(never)]
    pub fn step(
        &mut self,
        case: Case,
        vocab: &VocabInfo,
        logits: &[f32],
        history: &[u32],
    ) -> (u32, usize) {
        let u = self.rng.unit();
        self.pairs.clear();
        self.pairs
            .extend(logits.iter().enumerate().map(|(i, &z)| (z, i as u32)));
        // special mask (EOS stays selectable)
        for &id in &vocab.special_token_ids {
            if !vocab.eos_token_ids.contains(&id) {
                self.pairs[id as usize].0 = f32::NEG_INFINITY;
            }
        }
        match case {
            Case::DefaultChain => self.default_chain(vocab, history, u, true),
            Case::NoPenalties => self.default_chain(vocab, history, u, false),
            Case::TopPOnly => self.top_p_only(u),
        }
    }

    fn default_chain(
        &mut self,
        vocab: &VocabInfo,
        history: &[u32],
        u: f64,
        penalties: bool,
    ) -> (u32, usize) {
        if penalties {
            self.penalties(vocab, history);
        }
        // full sort by logit descending, then top-k 40
        self.pairs.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
        self.pairs.truncate(40);
        // softmax, top-p 0.95
        let n = self.softmax_sorted(1.0);
        let keep = self.top_p_len(n, 0.95);
        self.pairs.truncate(keep);
        // min-p 0.05
        let pmax = self.probs[0];
        let keep = self.probs[..keep]
            .iter()
            .take_while(|&&p| p >= 0.05 * pmax)
            .count()
            .max(1);
        self.pairs.truncate(keep);
        // temperature 0.8, softmax, draw
        let n = self.softmax_sorted(0.8);
        (self.draw(u), n)
    }

    /// Penalties over the last 64 tokens: repetition 1.1, then presence 0.5 / frequency 0.1.
    fn penalties(&mut self, vocab: &VocabInfo, history: &[u32]) {
        self.window.clear();
        self.window
            .extend_from_slice(&history[history.len().saturating_sub(64)..]);
        self.window.sort_unstable();
        let mut i = 0;
        while i < self.window.len() {
            let id = self.window[i];
            let mut j = i;
            while j < self.window.len() && self.window[j] == id {
                j += 1;
            }
            let c = (j - i) as f32;
            if !vocab.is_special(id) {
                let z = &mut self.pairs[id as usize].0;
                *z = if *z > 0.0 { *z / 1.1 } else { *z * 1.1 };
                *z = *z - 0.5 - 0.1 * c;
            }
            i = j;
        }
    }

    fn top_p_only(&mut self, u: f64) -> (u32, usize) {
        // softmax over V, full sort by probability descending, cumulative sum to 0.95
        let n = self.softmax_sorted_full();
        let keep = self.top_p_len(n, 0.95);
        self.pairs.truncate(keep);
        let n = self.softmax_sorted(1.0);
        (self.draw(u), n)
    }

    /// The top-p prefix of the sorted probabilities: the first `i + 1` whose cumulative sum
    /// reaches `p`, else all `n`.
    fn top_p_len(&self, n: usize, p: f64) -> usize {
        let mut cum = 0.0;
        for (i, q) in self.probs.iter().enumerate() {
            cum += q;
            if cum >= p {
                return i + 1;
            }
        }
        n
    }

    /// Probabilities of the (already sorted) pairs at temperature `t`.
    fn softmax_sorted(&mut self, t: f32) -> usize {
        let m = self.pairs[0].0 / t;
        self.probs.clear();
        let mut s = 0.0f64;
        for &(z, _) in &self.pairs {
            let w = exp_f32(z / t - m) as f64;
            s += w;
            self.probs.push(w);
        }
        for p in &mut self.probs {
            *p /= s;
        }
        self.pairs.len()
    }

    /// Softmax over the whole vocabulary, then a full sort by probability descending.
    fn softmax_sorted_full(&mut self) -> usize {
        let m = self
            .pairs
            .iter()
            .fold(f32::NEG_INFINITY, |m, &(z, _)| if z > m { z } else { m });
        let mut s = 0.0f64;
        for (z, _) in self.pairs.iter_mut() {
            let w = exp_f32(*z - m);
            s += w as f64;
            *z = w;
        }
        let inv = (1.0 / s) as f32;
        for (p, _) in self.pairs.iter_mut() {
            *p *= inv;
        }
        self.pairs.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
        self.probs.clear();
        self.probs.extend(self.pairs.iter().map(|&(p, _)| p as f64));
        self.pairs.len()
    }

    fn draw(&self, u: f64) -> u32 {
        let mut cum = 0.0;
        for (p, &(_, id)) in self.probs.iter().zip(&self.pairs) {
            cum += p;
            if u < cum {
                return id;
            }
        }
        self.pairs.last().map(|p| p.1).unwrap_or(0)
    }
}

/// One per-step workload: a fixture row, the case's sampler with its state and workspace, and
/// the naive baseline.
#[derive(Debug)]
pub struct StepBench {
    /// The case.
    pub case: Case,
    /// The fixture row.
    pub fixture: Fixture,
    /// The compiled sampler.
    pub sampler: Sampler,
    /// The decoding state (its history grows as `nextok` steps run).
    pub state: DecoderState,
    /// The workspace.
    pub ws: Workspace,
    /// A second workspace with the dense top-p's large-nucleus path off (the band search alone,
    /// [`Workspace::set_large_nucleus_top_p`]): the same tokens, the time before that path.
    pub ws_bands: Workspace,
    /// The full-sort baseline.
    pub naive: Naive,
    max: f32,
}

impl StepBench {
    /// The workload of `case` at vocabulary size `v`.
    pub fn new(case: Case, v: usize) -> Self {
        Self::with_fixture(case, fixture(v, v as u64))
    }

    /// The workload of `case` on the flat row of vocabulary size `v` ([`flat_fixture`]).
    pub fn flat(case: Case, v: usize) -> Self {
        Self::with_fixture(case, flat_fixture(v, v as u64))
    }

    /// The workload of `case` on a given row, vocabulary and history (for example a real
    /// model's logits row, its vocabulary and the prompt).
    ///
    /// # Panics
    ///
    /// When a history id is outside the vocabulary.
    pub fn with_fixture(case: Case, fixture: Fixture) -> Self {
        let v = fixture.logits.len();
        let sampler = case.sampler(&fixture.vocab);
        let mut state = sampler
            .new_state(&fixture.history, 42)
            .expect("fixture history is in range");
        sampler.reserve(&mut state, 1 << 16);
        let ws = sampler.new_workspace();
        let mut ws_bands = sampler.new_workspace();
        ws_bands.set_large_nucleus_top_p(false);
        StepBench {
            case,
            ws_bands,
            naive: Naive::new(v, 42),
            max: nextok_core::math::max_f32(&fixture.logits),
            fixture,
            sampler,
            state,
            ws,
        }
    }

    /// The floor on this row.
    #[inline]
    pub fn floor(&self) -> f32 {
        floor_sum(&self.fixture.logits)
    }

    /// The exact softmax normaliser of the row alone: one `exp_f32` per token and the `f64` lane
    /// sum ([`nextok_core::math::exp_sum`]) — the part of a dense top-p that no shortcut may skip.
    #[inline]
    pub fn normaliser(&self) -> f64 {
        let z = &self.fixture.logits;
        nextok_core::math::exp_sum(z, self.max)
    }

    /// One naive full-sort step; returns the token.
    #[inline]
    pub fn naive(&mut self) -> u32 {
        let f = &self.fixture;
        self.naive
            .step(self.case, &f.vocab, &f.logits, self.state.prompt_ids())
            .0
    }

    /// One nextok step (select and commit); returns the token.
    #[inline]
    pub fn nextok(&mut self) -> u32 {
        self.sampler
            .step(&self.fixture.logits, &mut self.state, &mut self.ws)
            .expect("benchmark step succeeds")
            .token
    }

    /// One nextok step with the large-nucleus top-p off ([`StepBench::ws_bands`]); returns the
    /// token.
    #[inline]
    pub fn nextok_bands(&mut self) -> u32 {
        self.sampler
            .step(&self.fixture.logits, &mut self.state, &mut self.ws_bands)
            .expect("benchmark step succeeds")
            .token
    }

    /// One nextok selection without changing the state.
    #[inline]
    pub fn nextok_select(&mut self) -> u32 {
        self.sampler
            .select(
                &self.fixture.logits,
                &self.state,
                &mut self.ws,
                Draw::Stream,
            )
            .expect("benchmark select succeeds")
            .token
    }

    /// The final support size of nextok's selection on this row (for reports and checks).
    pub fn nextok_support(&mut self) -> usize {
        self.sampler
            .process(&self.fixture.logits, &self.state, &mut self.ws, false)
            .expect("benchmark process succeeds");
        self.ws.support_len()
    }
}

/// The batch workload: [`BATCH_ROWS`] distinct rows stepped together by
/// [`Sampler::step_batch`] on a rayon pool of a given size.
#[derive(Debug)]
pub struct BatchBench {
    /// The case.
    pub case: Case,
    sampler: Sampler,
    logits: Vec<f32>,
    states: Vec<DecoderState>,
    out: Vec<Result<StepResult>>,
    pools: Vec<(usize, rayon::ThreadPool, WorkspacePool)>,
}

impl BatchBench {
    /// `rows` rows of `case` at vocabulary size `v`, with rayon pools of each of `threads`.
    pub fn new(case: Case, v: usize, rows: usize, threads: &[usize]) -> Self {
        let mut logits = Vec::with_capacity(rows * v);
        let mut histories = Vec::with_capacity(rows);
        let mut vocab = None;
        for r in 0..rows {
            let f = fixture(v, (v as u64) << 8 | r as u64);
            logits.extend_from_slice(&f.logits);
            histories.push(f.history);
            vocab.get_or_insert(f.vocab);
        }
        let sampler = case.sampler(&vocab.expect("rows >= 1"));
        let states = histories
            .iter()
            .enumerate()
            .map(|(r, h)| {
                let mut st = sampler.new_state(h, r as u64).expect("valid history");
                sampler.reserve(&mut st, 1 << 16);
                st
            })
            .collect();
        let out = (0..rows)
            .map(|_| {
                Ok(StepResult {
                    token: 0,
                    finish: None,
                    u: None,
                })
            })
            .collect();
        let pools = threads
            .iter()
            .map(|&n| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .build()
                    .expect("thread pool");
                (n, pool, WorkspacePool::new(v, n))
            })
            .collect();
        BatchBench {
            case,
            sampler,
            logits,
            states,
            out,
            pools,
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.states.len()
    }

    /// Steps every row once on the pool of `threads` threads; returns the elapsed time.
    pub fn run(&mut self, threads: usize) -> Duration {
        let (_, pool, wsp) = self
            .pools
            .iter_mut()
            .find(|(n, _, _)| *n == threads)
            .expect("a pool of that size was built");
        let (sampler, logits, states, out) =
            (&self.sampler, &self.logits, &mut self.states, &mut self.out);
        let t0 = Instant::now();
        pool.install(|| sampler.step_batch(logits, states, wsp, out))
            .expect("batch shapes match");
        let dt = t0.elapsed();
        for o in out.iter() {
            if let Err(e) = o {
                panic!("batch row failed: {e}");
            }
        }
        dt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixtures_are_deterministic() {
        let a = fixture(4096, 3);
        let b = fixture(4096, 3);
        assert_eq!(a.logits, b.logits);
        assert_eq!(a.history, b.history);
        assert_eq!(a.history.len(), HISTORY_LEN);
        let m = a.logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        assert!((8.0..=15.0).contains(&m));
    }

    #[test]
    fn naive_and_nextok_agree_on_the_support() {
        for case in Case::ALL {
            let mut b = StepBench::new(case, 8192);
            let n = b.nextok_support();
            let f = &b.fixture;
            let (tok, naive_n) = b
                .naive
                .step(case, &f.vocab, &f.logits, b.state.prompt_ids());
            assert!(
                naive_n.abs_diff(n) <= 1,
                "{case:?}: naive support {naive_n}, nextok support {n}"
            );
            assert!((tok as usize) < 8192);
        }
    }
}
