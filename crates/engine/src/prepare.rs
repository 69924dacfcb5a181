//! From a [`GenerateRequest`] to what the scheduler runs: the prompt's ids, the compiled
//! [`Sampler`], the compiled constraint, the seeds. All of it happens on the submitting thread,
//! never on the engine's: a constraint that is slow to compile delays only its own request.
//!
//! Per-model data is built once and shared: the token bytes (for stop strings and text), the
//! constraint engine's vocabulary and token trie, and compiled constraints, cached by the hash
//! of their spec.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use nextok_constraint::{CompiledConstraint, ConstraintEngine, ConstraintSpec, ConstraintVocab};
use nextok_core::pipeline::resolve::{resolve, Request as ResolveRequest, Resolved};
use nextok_core::{Sampler, TokenBytes};
use nextok_model::Model;
use sha2::{Digest, Sha256};

use crate::error::{EngineError, ErrorKind, Result};
use crate::request::{GenerateRequest, LogprobOptions, PipelineChoice, Prompt, RequestInfo};

/// Compiled constraints kept at most.
const CONSTRAINT_CACHE: usize = 64;

/// What the engine keeps per model.
pub(crate) struct ModelShared {
    pub(crate) model: Arc<nextok_model::Model>,
    pub(crate) token_bytes: Arc<TokenBytes>,
    /// The draft model for `speculative` requests with the `model` drafter.
    pub(crate) draft: Option<Arc<Model>>,
    constraint_engine:
        OnceLock<std::result::Result<ConstraintEngine, nextok_constraint::ConstraintError>>,
    constraints: Mutex<HashMap<String, (u64, Arc<CompiledConstraint>)>>,
    clock: std::sync::atomic::AtomicU64,
}

/// A request ready to run: what [`Engine::prepare`](crate::Engine::prepare) returns.
#[derive(Debug)]
pub struct Prepared {
    /// What the engine made of the request.
    pub info: RequestInfo,
    /// The compiled pipeline.
    pub sampler: Arc<Sampler>,
    /// The compiled constraint, if the request has one.
    pub constraint: Option<Arc<CompiledConstraint>>,
    /// Logprobs asked for.
    pub logprobs: Option<LogprobOptions>,
    /// Records asked for.
    pub records: Option<usize>,
    /// Whether each record carries its raw logits.
    pub trace_logits: bool,
    /// The ledger step asked for.
    pub ledger_step: Option<u64>,
    /// Speculative decoding asked for.
    pub speculative: Option<crate::speculative::SpecOptions>,
    /// The tokens each sequence resumes from (see [`GenerateRequest::resume`]), checked.
    pub resume: Option<Vec<Vec<u32>>>,
    /// A resumed request's sequence states, committed on the submitting thread and taken by
    /// the scheduler when it admits the request.
    pub(crate) resumed_states: ResumedStates,
}

/// The sequence states of a resumed request, computed once at preparation (empty otherwise).
#[derive(Default)]
pub(crate) struct ResumedStates(Mutex<Vec<Option<ResumedSeq>>>);

impl std::fmt::Debug for ResumedStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResumedStates")
    }
}

impl Prepared {
    /// The tokens sequence `seq` resumes from (empty when it starts afresh).
    pub fn resumed(&self, seq: usize) -> &[u32] {
        self.resume
            .as_ref()
            .and_then(|r| r.get(seq))
            .map_or(&[], Vec::as_slice)
    }

    /// Sequence `seq`'s state to start from: the one committed at preparation for a resumed
    /// request (taken once), else a fresh one.
    pub(crate) fn take_state(&self, seq: usize, ctx: usize) -> Result<ResumedSeq> {
        let kept = self
            .resumed_states
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(seq)
            .and_then(Option::take);
        match kept {
            Some(s) => Ok(s),
            None => self.resumed_state(seq, ctx),
        }
    }

    /// Sequence `seq`'s sampler state and text stream after the tokens it resumes from,
    /// committed as if it had selected them, and how it ended if they end it (`Some(None)`:
    /// the context is full). Errors name `resume[seq][j]`.
    pub(crate) fn resumed_state(&self, seq: usize, ctx: usize) -> Result<ResumedSeq> {
        let info = &self.info;
        let sampler = &self.sampler;
        let seed = info.seeds.get(seq).copied().unwrap_or(0);
        let tokens = self.resumed(seq);
        let mut state = sampler
            .new_state(&info.prompt_ids, seed)
            .map_err(EngineError::core)?;
        if let Some(c) = &self.constraint {
            state.set_grammar(Box::new(c.start()));
        }
        sampler.reserve(&mut state, info.max_tokens as usize);
        let mut stream = sampler.text_stream();
        let mut finish = None;
        for (j, &t) in tokens.iter().enumerate() {
            let field = || format!("resume[{seq}][{j}]");
            if finish.is_some() || state.is_finished() {
                return Err(EngineError::invalid(
                    field(),
                    "the sequence had already finished before this token",
                ));
            }
            let r = sampler
                .commit(&mut state, t)
                .map_err(|e| EngineError::invalid(field(), e.to_string()))?;
            stream.push(sampler.visible_bytes(t), state.stop_state().hit.as_ref());
            // the position this token is fed at (as a decoding step sees it)
            let fed_at = info.prompt_ids.len() + j;
            finish = match r {
                Some(reason) => Some(Some(reason)),
                None if fed_at >= ctx => Some(None),
                None => None,
            };
        }
        Ok(ResumedSeq {
            state,
            stream,
            finish,
        })
    }
}

/// A resumed sequence's state: see [`Prepared::resumed_state`].
pub(crate) struct ResumedSeq {
    pub(crate) state: nextok_core::DecoderState,
    pub(crate) stream: nextok_core::text::TextStream,
    pub(crate) finish: Option<Option<nextok_core::FinishReason>>,
}

impl ModelShared {
    pub(crate) fn new(model: Arc<Model>) -> ModelShared {
        let token_bytes = Arc::new(model.vocab.bytes.clone());
        ModelShared {
            model,
            token_bytes,
            draft: None,
            constraint_engine: OnceLock::new(),
            constraints: Mutex::new(HashMap::new()),
            clock: Default::default(),
        }
    }

    fn constraint_engine(&self) -> Result<&ConstraintEngine> {
        let e = self.constraint_engine.get_or_init(|| {
            let m = &self.model;
            let vocab = ConstraintVocab::new(&m.vocab.bytes, &m.vocab.info)?;
            ConstraintEngine::new(Arc::new(vocab))
        });
        e.as_ref()
            .map_err(|e| EngineError::constraint(e.clone()).with_field("constraint"))
    }

    /// Compiles `spec` once per distinct spec. At most [`CONSTRAINT_CACHE`] compiled
    /// constraints are kept, taking at most `max_bytes` in all (their own estimate, read again
    /// at every insertion since it grows as sequences reach new lexer states); the least
    /// recently used go first, and one larger than `max_bytes` alone is used but not kept.
    pub(crate) fn compile(
        &self,
        spec: &ConstraintSpec,
        max_bytes: usize,
    ) -> Result<Arc<CompiledConstraint>> {
        let key = serde_json::to_string(spec)
            .map(|s| {
                let d = Sha256::digest(s.as_bytes());
                d.iter().map(|b| format!("{b:02x}")).collect::<String>()
            })
            .map_err(|e| EngineError::invalid("constraint", e.to_string()))?;
        let now = self
            .clock
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some((t, c)) = self.lock_cache().get_mut(&key) {
            *t = now;
            return Ok(c.clone());
        }
        let engine = self.constraint_engine()?;
        let compiled = engine
            .compile(spec)
            .map_err(|e| EngineError::constraint(e).with_field("constraint"))?;
        let size = compiled.estimated_bytes();
        if size > max_bytes {
            return Ok(compiled);
        }
        let mut cache = self.lock_cache();
        // least recently used first, until one more fits by count and by bytes
        let mut total: usize = cache.values().map(|v| v.1.estimated_bytes()).sum();
        while !cache.is_empty() && (cache.len() >= CONSTRAINT_CACHE || total + size > max_bytes) {
            let Some(oldest) = cache
                .iter()
                .min_by_key(|(_, v)| v.0)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some((_, c)) = cache.remove(&oldest) {
                total = total.saturating_sub(c.estimated_bytes());
            }
        }
        cache.insert(key, (now, compiled.clone()));
        Ok(compiled)
    }

    /// The compiled constraints kept, and their estimated bytes.
    pub(crate) fn cache_stats(&self) -> (usize, usize) {
        let cache = self.lock_cache();
        let bytes = cache.values().map(|v| v.1.estimated_bytes()).sum();
        (cache.len(), bytes)
    }

    fn lock_cache(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, (u64, Arc<CompiledConstraint>)>> {
        // a panic while holding the lock cannot leave the map inconsistent: use it anyway
        self.constraints.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The prompt's ids (`parse_special_in_messages`: see
    /// [`EngineConfig::parse_special_in_messages`](crate::EngineConfig)).
    pub(crate) fn prompt_ids(
        &self,
        prompt: &Prompt,
        parse_special_in_messages: bool,
    ) -> Result<Vec<u32>> {
        let m = &self.model;
        let ids = match prompt {
            Prompt::Ids(ids) => {
                let v = m.vocab.info.vocab_size;
                if let Some((i, &t)) = ids.iter().enumerate().find(|(_, &t)| t as usize >= v) {
                    return Err(EngineError::invalid(
                        format!("prompt[{i}]"),
                        format!("token id {t} is outside the vocabulary ({v} tokens)"),
                    ));
                }
                ids.clone()
            }
            Prompt::Text(t) => m
                .encode_prompt(t)
                .map_err(|e| EngineError::invalid("prompt", e.message().to_string()))?,
            Prompt::Chat(msgs) => {
                if msgs.is_empty() {
                    return Err(EngineError::invalid("messages", "no messages"));
                }
                m.encode_chat(msgs, parse_special_in_messages)
                    .map_err(|e| EngineError::invalid("messages", e.message().to_string()))?
            }
        };
        if ids.is_empty() {
            return Err(EngineError::invalid(
                "prompt",
                "the prompt encodes to no tokens",
            ));
        }
        Ok(ids)
    }

    /// Everything but admission: ids, pipeline, sampler, constraint, seeds, limits. An `n`
    /// above the engine's `max_num_seqs` is refused before anything is sized by it.
    pub(crate) fn prepare(
        &self,
        req: &GenerateRequest,
        id: u64,
        config: &crate::EngineConfig,
    ) -> Result<Prepared> {
        // every rule about the request's decoding side, once (errors name the request's fields)
        let resolved = resolve(&ResolveRequest {
            params: &req.params,
            pipeline: &req.pipeline,
            n: req.n,
            top_logprobs: req.logprobs.map(|l| l.top),
        })
        .map_err(EngineError::core)?;
        if req.trace_logits && req.records.is_none() {
            return Err(EngineError::invalid(
                "trace_logits",
                "raw logits are stored in step records: ask for records (a trace) too",
            ));
        }
        let max_seqs = config.max_num_seqs;
        if req.n > max_seqs {
            return Err(EngineError::new(
                ErrorKind::TooLarge,
                format!("{} sequences; the engine runs at most {max_seqs}", req.n),
            )
            .with_field("n"));
        }
        if let Some(spec) = &req.speculative {
            spec.check()?;
            if spec.drafter == crate::speculative::DrafterKind::Model && self.draft.is_none() {
                return Err(EngineError::invalid(
                    "speculative.drafter",
                    "this engine has no draft model (load one with --draft-model)",
                ));
            }
        }
        let ctx = self.model.weights.config.context_length;
        let prompt_ids = self.prompt_ids(&req.prompt, config.parse_special_in_messages)?;
        if prompt_ids.len() >= ctx {
            return Err(EngineError::new(
                ErrorKind::TooLarge,
                format!(
                    "the prompt has {} tokens; the context holds {ctx} (prompt and output)",
                    prompt_ids.len()
                ),
            )
            .with_field("prompt"));
        }
        let room = (ctx - prompt_ids.len()) as u64;
        let mut params = req.params.clone();
        if let (Some(m), Some(limit)) = (params.max_tokens, config.max_tokens_limit) {
            if m > limit {
                return Err(EngineError::invalid(
                    "max_tokens",
                    format!("{m} is over this server's limit of {limit}"),
                ));
            }
        }
        let max_tokens = match params.max_tokens {
            None => match config.default_max_tokens.or(config.max_tokens_limit) {
                Some(d) => d.min(room),
                None => room,
            },
            Some(m) if m > room => {
                return Err(EngineError::new(
                    ErrorKind::TooLarge,
                    format!(
                    "{m} tokens after a prompt of {} exceed the context of {ctx}; at most {room}",
                    prompt_ids.len()
                ),
                )
                .with_field("max_tokens"))
            }
            Some(m) => m,
        };
        params.max_tokens = Some(max_tokens);
        // the request's seed, resolved once: every sequence's seed derives from it
        params.seed = Some(params.seed.unwrap_or_else(fresh_seed));
        // the output limit is the engine's: the stop conditions take the effective one
        let Resolved { pipeline, mut stop } = resolved;
        if !matches!(req.pipeline, PipelineChoice::Exact { .. }) {
            stop.max_tokens = Some(max_tokens);
        }
        let sampler = Sampler::new_with_tokens(
            pipeline.clone(),
            self.model.vocab.info.clone(),
            stop.clone(),
            Some(self.token_bytes.clone()),
        )
        .map_err(EngineError::core)?;
        let constraint = match &params.constraint {
            Some(s) => Some(self.compile(s, config.constraint_cache_bytes)?),
            None => None,
        };
        // a state for the prompt checks the prompt against the pipeline (ids, history limits)
        sampler
            .new_state(&prompt_ids, params.sequence_seed(0))
            .map_err(EngineError::core)?;
        let seeds = (0..req.n as u64).map(|i| params.sequence_seed(i)).collect();
        if let Some(r) = &req.resume {
            if req.params.seed.is_none() {
                return Err(EngineError::invalid(
                    "seed",
                    "a resumed request needs the seed its first run used (the response's seed)",
                ));
            }
            if r.len() != req.n {
                return Err(EngineError::invalid(
                    "resume",
                    format!("{} token lists for {} sequences (n)", r.len(), req.n),
                ));
            }
            let v = self.model.vocab.info.vocab_size;
            for (i, t) in r.iter().enumerate() {
                if t.len() as u64 > max_tokens {
                    return Err(EngineError::invalid(
                        format!("resume[{i}]"),
                        format!("{} tokens; the request's limit is {max_tokens}", t.len()),
                    ));
                }
                if let Some((j, &x)) = t.iter().enumerate().find(|(_, &x)| x as usize >= v) {
                    return Err(EngineError::invalid(
                        format!("resume[{i}][{j}]"),
                        format!("token id {x} is outside the vocabulary ({v} tokens)"),
                    ));
                }
            }
        }
        let mut prepared = Prepared {
            info: RequestInfo {
                id,
                prompt_ids,
                params,
                pipeline_hash: sampler.pipeline_hash().to_string(),
                pipeline,
                stop,
                seeds,
                max_tokens,
                speculative: req.speculative,
                constraint: constraint.clone(),
                kv_cache: config.kv_cache_type,
            },
            sampler: Arc::new(sampler),
            constraint,
            logprobs: req.logprobs,
            records: req.records,
            trace_logits: req.trace_logits,
            ledger_step: req.ledger_step,
            speculative: req.speculative,
            resume: req.resume.clone(),
            resumed_states: ResumedStates::default(),
        };
        // every resumed sequence's tokens are committed here, once, on the submitting thread
        // (a token the sequence could not have selected is the request's error); the scheduler
        // takes the states when it admits the request
        if prepared.resume.is_some() {
            let states = (0..req.n)
                .map(|i| prepared.resumed_state(i, ctx).map(Some))
                .collect::<Result<Vec<_>>>()?;
            prepared.resumed_states = ResumedStates(Mutex::new(states));
        }
        Ok(prepared)
    }
}

/// A seed nobody chose: the process's random hasher keys mixed with the clock.
pub fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    h.write_u128(t);
    h.finish()
}
