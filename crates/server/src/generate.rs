//! Generation requests: submit to the engine, then answer as one JSON body or as a stream of
//! server-sent events. Either way the request is logged (one line) and counted when it ends;
//! a stream whose client goes away drops its [`RequestHandle`], cancelling the request.

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use nextok_core::{FinishReason, Layer, StepRecord};
use nextok_engine::trace::TraceHeader;
use nextok_engine::{Event, RequestHandle, TokenLogprobs, Usage};
use serde_json::{json, Value};

use crate::api::{self, ApiRequest, Endpoint, TRACE_CANDIDATES};
use crate::error::ApiError;
use crate::{AppState, ClientKey, SelfLogged};

/// OpenAI's stand-in for a logprob of minus infinity.
const NEG_INF_LOGPROB: f64 = -9999.0;

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(e.to_string())
}

/// A request naming another model: 404.
pub(crate) fn check_model(s: &AppState, req: &ApiRequest) -> Result<(), ApiError> {
    match &req.model {
        Some(m) if *m != s.config.model_id => Err(ApiError {
            param: Some("model".into()),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found_error",
                format!(
                    "the model `{m}` does not exist; this server serves `{}`",
                    s.config.model_id
                ),
            )
            .with_code("model_not_found")
        }),
        _ => Ok(()),
    }
}

/// What a caller of the router in the same process (no socket between them: the Python
/// binding's service, which a Ray replica runs) learns beside a generation answer's bytes:
/// the answer's id, `created` and seed, and the token ids behind its text. Put in a request's
/// extensions; an HTTP client cannot send one.
///
/// Every event is sent before the body chunk that shows it: after reading a chunk, the events
/// received so far cover exactly the tokens whose text the chunks so far carried (or hold back,
/// as a partial character or a possible stop string). With them a front end can resume the
/// answer elsewhere (`nextok.resume`) if this process is lost.
#[derive(Debug, Clone)]
pub struct Sidecar(std::sync::mpsc::Sender<SideEvent>);

/// One [`Sidecar`] event.
#[derive(Debug, Clone, PartialEq)]
pub enum SideEvent {
    /// The request was accepted: its answer's `id`, `created`, seed and sequence count.
    Started {
        /// The answer's `id`.
        id: String,
        /// The answer's `created`.
        created: u64,
        /// The request's seed (sequence `i` uses `seed + i`).
        seed: u64,
        /// Sequences.
        n: usize,
        /// The id of the trace the answer stores (`nextok.trace`), if any.
        trace_id: Option<String>,
    },
    /// Sequence `seq` selected token `id`.
    Token {
        /// Sequence index.
        seq: usize,
        /// Token id.
        id: u32,
    },
    /// Sequence `seq` ended (its `finish_reason` is in the chunk that follows).
    Finished {
        /// Sequence index.
        seq: usize,
    },
}

/// A [`Sidecar`] to put in a request's extensions, and the receiver of its events.
pub fn sidecar() -> (Sidecar, std::sync::mpsc::Receiver<SideEvent>) {
    let (tx, rx) = std::sync::mpsc::channel();
    (Sidecar(tx), rx)
}

/// Answers a generation request.
pub(crate) async fn run(
    s: Arc<AppState>,
    endpoint: Endpoint,
    client: ClientKey,
    side: Option<Sidecar>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match start(s, endpoint, client, side, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn start(
    s: Arc<AppState>,
    endpoint: Endpoint,
    client: ClientKey,
    side: Option<Sidecar>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let v = crate::json_body(body)?;
    let mut req = api::parse(endpoint, &v)?;
    check_model(&s, &req)?;
    req.gen.speculative = req.speculative.unwrap_or(s.config.speculative);
    let trace_id = match req.trace {
        true => Some(crate::new_trace_id()?),
        false => None,
    };
    let engine = s.engine.clone();
    let gen = req.gen.clone();
    let limit = req.trace_logits.then_some(s.config.max_trace_logits_bytes);
    let handle = tokio::task::spawn_blocking(move || {
        if let Some(limit) = limit {
            // the raw logits a trace would store are bounded before the request runs
            let p = engine.prepare(&gen)?;
            let vocab = engine.model().weights.config.vocab_size;
            let (n, max_tokens) = (p.info.seeds.len(), p.info.max_tokens);
            let most = (n as u128) * (max_tokens as u128) * (vocab as u128);
            let bytes = most * crate::TRACE_LOGITS_BYTES_PER_VALUE;
            if bytes > limit as u128 {
                return Ok(Err(format!(
                    "{n} sequences of up to {max_tokens} tokens would store up to {bytes} bytes of raw logits ({vocab} a step); this server stores at most {limit} a request: lower max_tokens or n"
                )));
            }
        }
        engine.submit(gen).map(Ok)
    })
    .await
    .map_err(internal)?
    .map_err(|e| ApiError::from_engine(&e, |f| req.param(f)))?
    .map_err(|m| ApiError::invalid(req.param("trace_logits"), m))?;
    let g = Gen::new(s, req, handle, trace_id, client, side);
    if g.req.stream {
        let stream = futures_util::stream::unfold(g, |mut g| async move {
            g.next_frame()
                .await
                .map(|frame| (Ok::<Bytes, std::convert::Infallible>(frame), g))
        });
        let mut r = Response::new(Body::from_stream(stream));
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/event-stream"),
        );
        h.insert(
            header::CACHE_CONTROL,
            header::HeaderValue::from_static("no-cache"),
        );
        r.extensions_mut().insert(SelfLogged);
        Ok(r)
    } else {
        let mut r = g.collect().await;
        r.extensions_mut().insert(SelfLogged);
        Ok(r)
    }
}

/// What one sequence has produced (non-streaming answers; counts for streams).
#[derive(Default)]
struct SeqOut {
    text: String,
    chars: usize,
    logprobs: Vec<Value>,
    tokens: Vec<String>,
    token_logprobs: Vec<f64>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<usize>,
    finish: Option<&'static str>,
    records: Vec<StepRecord>,
}

/// A generation in flight.
struct Gen {
    s: Arc<AppState>,
    req: ApiRequest,
    handle: RequestHandle,
    id: String,
    created: u64,
    t0: Instant,
    last_token: Option<Instant>,
    ttft: Option<f64>,
    seqs: Vec<SeqOut>,
    usage: Option<Usage>,
    /// HTTP status for the log: 200, 500 after an engine error; unset while running.
    outcome: Option<u16>,
    trace_id: Option<String>,
    /// The API key the request came with: its trace belongs to it.
    client: ClientKey,
    /// Stream state: frames to send, whether the end was sent, whether the first chunk (with
    /// the `nextok` object) went out.
    pending: std::collections::VecDeque<Bytes>,
    ended: bool,
    meta_sent: bool,
    /// The in-process caller's side channel, if any.
    side: Option<Sidecar>,
    /// Sequences whose end the client already received (a resumed answer).
    finished_before: Vec<usize>,
}

fn finish_name(r: Option<FinishReason>) -> &'static str {
    match r {
        Some(FinishReason::MaxTokens) | None => "length",
        Some(_) => "stop",
    }
}

fn layer_name(l: Layer) -> &'static str {
    match l {
        Layer::Raw => "raw",
        Layer::Processed => "processed",
        Layer::Selection => "selection",
    }
}

fn finite(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        NEG_INF_LOGPROB
    }
}

impl Gen {
    fn new(
        s: Arc<AppState>,
        req: ApiRequest,
        handle: RequestHandle,
        trace_id: Option<String>,
        client: ClientKey,
        side: Option<Sidecar>,
    ) -> Gen {
        let n = handle.info.seeds.len();
        let prefix = match req.endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completions => "cmpl",
        };
        let resume = req.resume.as_ref();
        let id = resume
            .and_then(|r| r.id.clone())
            .unwrap_or_else(|| format!("{prefix}-{}", handle.info.id));
        let created = resume
            .and_then(|r| r.created)
            .unwrap_or_else(crate::unix_now);
        // a resumed stream's client already has the role chunks and nextok's object
        let meta_sent = resume.is_some();
        let finished_before = resume.map(|r| r.finished.clone()).unwrap_or_default();
        if let Some(sc) = &side {
            let _ = sc.0.send(SideEvent::Started {
                id: id.clone(),
                created,
                seed: handle.info.params.seed.unwrap_or(0),
                n,
                trace_id: trace_id.clone(),
            });
        }
        Gen {
            s,
            req,
            id,
            created,
            t0: Instant::now(),
            last_token: None,
            ttft: None,
            seqs: (0..n).map(|_| SeqOut::default()).collect(),
            usage: None,
            outcome: None,
            trace_id,
            client,
            pending: Default::default(),
            ended: false,
            meta_sent,
            handle,
            side,
            finished_before,
        }
    }

    fn path(&self) -> &'static str {
        match self.req.endpoint {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
        }
    }

    /// nextok's part of a response: what a client needs to know it got.
    fn meta(&self) -> Value {
        let info = &self.handle.info;
        let mut m = json!({
            "pipeline_hash": info.pipeline_hash,
            "seed": info.seeds.first(),
        });
        if self.req.logprobs {
            m["logprob_layer"] = json!(layer_name(self.req.layer));
        }
        if let Some(t) = &self.trace_id {
            m["trace_id"] = json!(t);
        }
        if let Some(sp) = &info.speculative {
            m["speculative"] = json!(sp);
        }
        if let Some(r) = info.schema_report() {
            // which keywords the mask enforces and which only the check after generation
            m["schema"] = serde_json::to_value(r).unwrap_or(Value::Null);
        }
        m
    }

    /// The check of sequence `seq`'s finished text against the full JSON schema, as JSON
    /// (`None` without a JSON-schema constraint).
    fn validation(&self, seq: usize) -> Option<Value> {
        let text = self.seqs.get(seq).map(|s| s.text.as_str()).unwrap_or("");
        let v = self.handle.info.validate_output(text)?;
        Some(json!({"index": seq, "valid": v.valid, "errors": v.errors}))
    }

    fn token_name(&self, id: u32) -> (String, Vec<u8>) {
        let b = self
            .s
            .engine
            .model()
            .vocab
            .token(id)
            .unwrap_or(&[])
            .to_vec();
        (String::from_utf8_lossy(&b).into_owned(), b)
    }

    /// A chat logprob entry.
    fn chat_entry(&self, id: u32, l: &TokenLogprobs) -> Value {
        let (tok, bytes) = self.token_name(id);
        let top: Vec<Value> = l
            .top
            .iter()
            .map(|(c, v)| {
                let (t, b) = self.token_name(*c);
                json!({"token": t, "logprob": finite(*v), "bytes": b})
            })
            .collect();
        json!({"token": tok, "logprob": finite(l.selected), "bytes": bytes, "top_logprobs": top})
    }

    /// A completions logprob entry: (token, logprob, {token: logprob} of the top).
    fn completion_entry(&self, id: u32, l: &TokenLogprobs) -> (String, f64, Value) {
        let (tok, _) = self.token_name(id);
        let mut top = serde_json::Map::new();
        for (c, v) in &l.top {
            top.insert(self.token_name(*c).0, json!(finite(*v)));
        }
        (tok, finite(l.selected), Value::Object(top))
    }

    fn usage_json(&self) -> Value {
        let u = self.usage.unwrap_or_default();
        json!({
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        })
    }

    /// The next event, with the latency metrics.
    async fn next_event(&mut self) -> Option<Event> {
        let ev = self.handle.next_event().await;
        if let Some(Event::Token { .. }) = &ev {
            let now = Instant::now();
            match self.last_token {
                None => {
                    let d = now - self.t0;
                    self.ttft = Some(d.as_secs_f64());
                    self.s.metrics.ttft(d);
                }
                Some(t) => self.s.metrics.itl(now - t),
            }
            self.last_token = Some(now);
        }
        ev
    }

    /// The request finished: its trace is stored.
    fn on_done(&mut self, usage: Usage) {
        self.usage = Some(usage);
        self.outcome = Some(200);
        self.s
            .metrics
            .tokens(usage.prompt_tokens, usage.completion_tokens);
        if let Some(tid) = &self.trace_id {
            let header = TraceHeader::new(
                &self.handle.info,
                self.s.engine.model(),
                &self.req.pipeline_source,
                TRACE_CANDIDATES,
            )
            .with_raw_logits(self.req.trace_logits);
            let text =
                nextok_engine::trace::text(&header, self.seqs.iter().map(|s| s.records.as_slice()));
            self.s.store_trace(tid.clone(), self.client, text);
        }
    }

    /// Absorbs an event into the per-sequence outputs (non-streaming answers), and tells the
    /// side channel.
    fn absorb(&mut self, ev: &Event) {
        if let Some(sc) = &self.side {
            let _ = match ev {
                Event::Token { seq, id, .. } => sc.0.send(SideEvent::Token { seq: *seq, id: *id }),
                Event::Finish { seq, .. } => sc.0.send(SideEvent::Finished { seq: *seq }),
                _ => Ok(()),
            };
        }
        match ev {
            Event::Token {
                seq,
                id,
                text,
                logprobs,
            } => {
                let entry = logprobs.as_ref().map(|l| match self.req.endpoint {
                    Endpoint::Chat => (Some(self.chat_entry(*id, l)), None),
                    Endpoint::Completions => (None, Some(self.completion_entry(*id, l))),
                });
                if let Some(s) = self.seqs.get_mut(*seq) {
                    match entry {
                        Some((Some(c), _)) => s.logprobs.push(c),
                        Some((None, Some((t, lp, top)))) => {
                            s.tokens.push(t);
                            s.token_logprobs.push(lp);
                            s.top_logprobs.push(top);
                            s.text_offset.push(s.chars);
                        }
                        _ => {}
                    }
                    s.chars += text.chars().count();
                    s.text.push_str(text);
                }
            }
            Event::Record { seq, record } => {
                if let Some(s) = self.seqs.get_mut(*seq) {
                    s.records.push((**record).clone());
                }
            }
            Event::Finish {
                seq, reason, text, ..
            } => {
                if let Some(s) = self.seqs.get_mut(*seq) {
                    s.chars += text.chars().count();
                    s.text.push_str(text);
                    s.finish = Some(finish_name(*reason));
                }
            }
            _ => {}
        }
    }

    /// Collects everything and answers with one JSON body.
    async fn collect(mut self) -> Response {
        while let Some(ev) = self.next_event().await {
            match ev {
                Event::Done { usage, .. } => {
                    self.on_done(usage);
                    return axum::Json(self.full_response()).into_response();
                }
                Event::Error(e) => {
                    self.outcome = Some(500);
                    let req = &self.req;
                    return ApiError::from_engine(&e, |f| req.param(f)).into_response();
                }
                ev => self.absorb(&ev),
            }
        }
        self.outcome = Some(500);
        internal("the engine stopped before the request finished").into_response()
    }

    fn full_response(&self) -> Value {
        let choices: Vec<Value> = self
            .seqs
            .iter()
            .enumerate()
            .map(|(i, s)| match self.req.endpoint {
                Endpoint::Chat => json!({
                    "index": i,
                    "message": {"role": "assistant", "content": s.text},
                    "logprobs": if self.req.logprobs { json!({"content": s.logprobs}) } else { Value::Null },
                    "finish_reason": s.finish,
                }),
                Endpoint::Completions => json!({
                    "index": i,
                    "text": s.text,
                    "logprobs": if self.req.logprobs { json!({
                        "tokens": s.tokens,
                        "token_logprobs": s.token_logprobs,
                        "top_logprobs": s.top_logprobs,
                        "text_offset": s.text_offset,
                    }) } else { Value::Null },
                    "finish_reason": s.finish,
                }),
            })
            .collect();
        json!({
            "id": self.id,
            "object": match self.req.endpoint { Endpoint::Chat => "chat.completion", Endpoint::Completions => "text_completion" },
            "created": self.created,
            "model": self.s.config.model_id,
            "system_fingerprint": self.fingerprint(),
            "choices": choices,
            "usage": self.usage_json(),
            "nextok": self.meta_with_validation(),
        })
    }

    /// [`Gen::meta`] with the check of every finished sequence against the JSON schema.
    fn meta_with_validation(&self) -> Value {
        let mut m = self.meta();
        let v: Vec<Value> = (0..self.seqs.len())
            .filter_map(|i| self.validation(i))
            .collect();
        if !v.is_empty() {
            m["validation"] = Value::Array(v);
        }
        m
    }

    fn fingerprint(&self) -> String {
        let sha = &self.s.engine.model().sha256;
        format!("nextok-{}", &sha[..sha.len().min(12)])
    }

    /// A streamed chunk with these choices.
    fn chunk(&mut self, choices: Vec<Value>) -> Bytes {
        self.chunk_with(choices, None)
    }

    /// A streamed chunk with these choices and, when given, a sequence's schema check in its
    /// `nextok` object.
    fn chunk_with(&mut self, choices: Vec<Value>, validation: Option<Value>) -> Bytes {
        let mut c = json!({
            "id": self.id,
            "object": match self.req.endpoint { Endpoint::Chat => "chat.completion.chunk", Endpoint::Completions => "text_completion" },
            "created": self.created,
            "model": self.s.config.model_id,
            "system_fingerprint": self.fingerprint(),
            "choices": choices,
        });
        if !self.meta_sent {
            c["nextok"] = self.meta();
            self.meta_sent = true;
        }
        if let Some(v) = validation {
            if c.get("nextok").is_none() {
                c["nextok"] = json!({});
            }
            c["nextok"]["validation"] = json!([v]);
        }
        frame(&c)
    }

    /// The next server-sent event, `None` after `data: [DONE]`.
    async fn next_frame(&mut self) -> Option<Bytes> {
        loop {
            if let Some(f) = self.pending.pop_front() {
                return Some(f);
            }
            if self.ended {
                return None;
            }
            if !self.meta_sent && self.req.endpoint == Endpoint::Chat {
                // the assistant's role first, one event per choice, all in one body chunk (a
                // client that got any of the answer got them all: see `nextok.resume`)
                let mut roles = Vec::new();
                for i in 0..self.seqs.len() {
                    let c = self.chunk(vec![json!({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null})]);
                    roles.extend_from_slice(&c);
                }
                self.pending.push_back(Bytes::from(roles));
                continue;
            }
            let Some(ev) = self.next_event().await else {
                self.outcome = Some(500);
                let e = internal("the engine stopped before the request finished");
                self.pending.push_back(frame(&e.body()));
                self.pending
                    .push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                self.ended = true;
                continue;
            };
            self.absorb(&ev);
            match ev {
                Event::Token {
                    seq,
                    id,
                    text,
                    logprobs,
                } => {
                    if text.is_empty() && logprobs.is_none() {
                        continue;
                    }
                    let c = match self.req.endpoint {
                        Endpoint::Chat => {
                            let lp = logprobs
                                .as_ref()
                                .map(|l| json!({"content": [self.chat_entry(id, l)]}))
                                .unwrap_or(Value::Null);
                            json!({"index": seq, "delta": {"content": text}, "logprobs": lp, "finish_reason": null})
                        }
                        Endpoint::Completions => {
                            let lp = match logprobs.as_ref() {
                                Some(l) => {
                                    let (t, v, top) = self.completion_entry(id, l);
                                    let off = self
                                        .seqs
                                        .get(seq)
                                        .and_then(|s| s.text_offset.last().copied())
                                        .unwrap_or(0);
                                    json!({"tokens": [t], "token_logprobs": [v], "top_logprobs": [top], "text_offset": [off]})
                                }
                                None => Value::Null,
                            };
                            json!({"index": seq, "text": text, "logprobs": lp, "finish_reason": null})
                        }
                    };
                    let f = self.chunk(vec![c]);
                    self.pending.push_back(f);
                }
                Event::Finish {
                    seq, reason, text, ..
                } => {
                    if self.finished_before.contains(&seq) {
                        // (a resumed answer: the client has this sequence's end)
                        continue;
                    }
                    let fr = finish_name(reason);
                    let c = match self.req.endpoint {
                        Endpoint::Chat => {
                            let delta = if text.is_empty() {
                                json!({})
                            } else {
                                json!({"content": text})
                            };
                            json!({"index": seq, "delta": delta, "logprobs": null, "finish_reason": fr})
                        }
                        Endpoint::Completions => {
                            json!({"index": seq, "text": text, "logprobs": null, "finish_reason": fr})
                        }
                    };
                    // the sequence's text is complete (absorbed above): its schema check
                    let v = self.validation(seq);
                    let f = self.chunk_with(vec![c], v);
                    self.pending.push_back(f);
                }
                Event::Done { usage, .. } => {
                    self.on_done(usage);
                    if self.req.include_usage {
                        let mut c = json!({
                            "id": self.id,
                            "object": match self.req.endpoint { Endpoint::Chat => "chat.completion.chunk", Endpoint::Completions => "text_completion" },
                            "created": self.created,
                            "model": self.s.config.model_id,
                            "choices": [],
                            "usage": self.usage_json(),
                        });
                        if let Some(t) = &self.trace_id {
                            c["nextok"] = json!({"trace_id": t});
                        }
                        self.pending.push_back(frame(&c));
                    }
                    self.pending
                        .push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                    self.ended = true;
                }
                Event::Error(e) => {
                    self.outcome = Some(500);
                    let req = &self.req;
                    let body = ApiError::from_engine(&e, |f| req.param(f)).body();
                    self.pending.push_back(frame(&body));
                    self.pending
                        .push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                    self.ended = true;
                }
                Event::Record { .. } | Event::Ledger { .. } => {}
            }
        }
    }
}

fn frame(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

impl Drop for Gen {
    fn drop(&mut self) {
        // 499: the client went away before the end (the handle's drop cancels the request)
        let status = self.outcome.unwrap_or(499);
        let ep = match self.req.endpoint {
            Endpoint::Chat => "chat_completions",
            Endpoint::Completions => "completions",
        };
        self.s.metrics.request(ep, status);
        let generated: usize = match self.usage {
            Some(u) => u.completion_tokens,
            None => 0,
        };
        let finish: Vec<&str> = self.seqs.iter().map(|s| s.finish.unwrap_or("-")).collect();
        eprintln!(
            "nextok: POST {} {status} {} {}n={} prompt={} completion={} ttft={} total={:.3}s finish={}",
            self.path(),
            self.id,
            if self.req.stream { "stream " } else { "" },
            self.seqs.len(),
            self.handle.info.prompt_ids.len(),
            generated,
            self.ttft
                .map(|t| format!("{t:.3}s"))
                .unwrap_or_else(|| "-".into()),
            self.t0.elapsed().as_secs_f64(),
            finish.join(","),
        );
    }
}
