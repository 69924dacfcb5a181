//! Beam search over a [`LogitsSource`], one KV branch per hypothesis.
//!
//! Scores are sums of the **raw-layer** logprobs (log-softmax of the model's logits, in `f64`).
//! The rules, all explicit:
//!
//! * Each step every live hypothesis proposes its `2·B` best next tokens (ties → lower id).
//!   All proposals are ranked by cumulative logprob, descending; ties → the parent that ranked
//!   first, then the lower token id.
//! * Walking down the ranking, a proposal that is an EOS id becomes a **finished** hypothesis
//!   (the EOS token counts in its length) if it ranks within the first `B` proposals; any other
//!   proposal becomes a live hypothesis until `B` are live. A live hypothesis forks its
//!   parent's branch (the last child takes the parent's branch itself) and feeds its token.
//! * The search stops when `B` hypotheses have finished (early stopping, as Hugging Face's
//!   `early_stopping=True`), when none is live, or after `max_tokens` steps — the live
//!   hypotheses then finish by length.
//! * Final ranking: `score = logprob / len^α` (`α` = `length_penalty`; `α = 0` compares raw
//!   sums), descending; ties → the shorter hypothesis, then the lexicographically smaller ids.
//!
//! Greedy decoding is width 1.

use crate::error::{ModelError, Result};
use crate::LogitsSource;

/// Beam search parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct BeamConfig {
    /// Number of hypotheses kept (`B ≥ 1`).
    pub width: usize,
    /// `α` in `logprob / len^α`.
    pub length_penalty: f64,
    /// Most generated tokens per hypothesis.
    pub max_tokens: usize,
    /// Tokens that finish a hypothesis.
    pub eos_token_ids: Vec<u32>,
}

/// Why a hypothesis ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeamFinish {
    /// It selected an EOS id (included in `tokens`).
    Eos,
    /// It reached `max_tokens` (or the search ended while it was live).
    Length,
}

/// A finished hypothesis.
#[derive(Debug, Clone, PartialEq)]
pub struct Hypothesis {
    /// Generated ids (an EOS id last when `finish` is `Eos`).
    pub tokens: Vec<u32>,
    /// Sum of raw-layer logprobs.
    pub logprob: f64,
    /// `logprob / len^α`.
    pub score: f64,
    /// Why it ended.
    pub finish: BeamFinish,
}

struct Live<S> {
    tokens: Vec<u32>,
    logprob: f64,
    source: S,
    logits: Vec<f32>,
}

/// Log-softmax of `logits` in `f64`.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let s: f64 = logits.iter().map(|&z| (z as f64 - m).exp()).sum();
    let ln = s.ln();
    logits.iter().map(|&z| z as f64 - m - ln).collect()
}

fn score(logprob: f64, len: usize, alpha: f64) -> f64 {
    if alpha == 0.0 {
        logprob
    } else {
        logprob / (len.max(1) as f64).powf(alpha)
    }
}

/// Runs beam search from `prompt` (non-empty) on `source` (an empty branch). Returns the
/// finished hypotheses, best first.
pub fn beam_search<S: LogitsSource>(
    mut source: S,
    prompt: &[u32],
    cfg: &BeamConfig,
) -> Result<Vec<Hypothesis>> {
    if cfg.width == 0 {
        return Err(ModelError::new("beam width must be at least 1"));
    }
    if cfg.max_tokens == 0 {
        return Err(ModelError::new("max_tokens must be at least 1"));
    }
    let b = cfg.width;
    let logits = source.prefill(prompt)?;
    let mut live = vec![Live {
        tokens: Vec::new(),
        logprob: 0.0,
        source,
        logits,
    }];
    let mut finished: Vec<Hypothesis> = Vec::new();
    for _step in 0..cfg.max_tokens {
        // proposals: (cum logprob, parent index, token)
        let mut props: Vec<(f64, usize, u32)> = Vec::new();
        for (pi, h) in live.iter().enumerate() {
            let lp = log_softmax(&h.logits);
            let mut ids: Vec<u32> = (0..lp.len() as u32)
                .filter(|&i| lp[i as usize] > f64::NEG_INFINITY)
                .collect();
            ids.sort_by(|&x, &y| {
                lp[y as usize]
                    .partial_cmp(&lp[x as usize])
                    .unwrap()
                    .then(x.cmp(&y))
            });
            ids.truncate(2 * b);
            props.extend(ids.iter().map(|&t| (h.logprob + lp[t as usize], pi, t)));
        }
        props.sort_by(|x, y| {
            y.0.partial_cmp(&x.0)
                .unwrap()
                .then(x.1.cmp(&y.1))
                .then(x.2.cmp(&y.2))
        });
        let mut chosen: Vec<(f64, usize, u32)> = Vec::new();
        for (rank, &(lp, pi, t)) in props.iter().enumerate() {
            if cfg.eos_token_ids.contains(&t) {
                if rank < b {
                    let mut tokens = live[pi].tokens.clone();
                    tokens.push(t);
                    finished.push(Hypothesis {
                        score: score(lp, tokens.len(), cfg.length_penalty),
                        tokens,
                        logprob: lp,
                        finish: BeamFinish::Eos,
                    });
                }
            } else if chosen.len() < b {
                chosen.push((lp, pi, t));
            }
            if chosen.len() == b && rank + 1 >= b {
                break;
            }
        }
        if finished.len() >= b || chosen.is_empty() {
            live.clear();
            break;
        }
        // Children: fork the parent's branch, the last child of a parent takes it.
        let mut parents: Vec<Option<Live<S>>> = live.drain(..).map(Some).collect();
        let mut remaining = vec![0usize; parents.len()];
        for c in &chosen {
            remaining[c.1] += 1;
        }
        let mut next = Vec::with_capacity(chosen.len());
        for &(lp, pi, t) in &chosen {
            remaining[pi] -= 1;
            let (mut src, mut tokens) = if remaining[pi] == 0 {
                let p = parents[pi].take().expect("parent used once");
                (p.source, p.tokens)
            } else {
                let p = parents[pi].as_ref().expect("parent alive");
                (p.source.fork()?, p.tokens.clone())
            };
            tokens.push(t);
            let logits = if tokens.len() < cfg.max_tokens {
                src.decode_one(t)?
            } else {
                Vec::new() // finished by length; no logits needed
            };
            next.push(Live {
                tokens,
                logprob: lp,
                source: src,
                logits,
            });
        }
        live = next;
        if live.iter().all(|h| h.tokens.len() >= cfg.max_tokens) {
            break;
        }
    }
    for h in live {
        finished.push(Hypothesis {
            score: score(h.logprob, h.tokens.len(), cfg.length_penalty),
            tokens: h.tokens,
            logprob: h.logprob,
            finish: BeamFinish::Length,
        });
    }
    finished.sort_by(|x, y| {
        y.score
            .partial_cmp(&x.score)
            .unwrap()
            .then(x.tokens.len().cmp(&y.tokens.len()))
            .then(x.tokens.cmp(&y.tokens))
    });
    Ok(finished)
}
