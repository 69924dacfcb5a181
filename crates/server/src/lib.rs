//! # nextok-server
//!
//! An OpenAI-compatible HTTP server over [`nextok_engine`] (axum on tokio):
//!
//! * `POST /v1/chat/completions`, `POST /v1/completions` — streaming (server-sent events ending
//!   with `data: [DONE]`, `stream_options.include_usage`) and not; OpenAI's parameters, vLLM's
//!   extra parameters and structured outputs, nextok's own options under `nextok`
//!   (see [`api`]);
//! * `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text, see [`metrics`]);
//! * `POST /v1/explain` — `nextok explain`'s request and `--json` response, or, given a
//!   `prompt` or `messages`, the ledger of the model's next step (after the output tokens in
//!   `accepted`, when given);
//! * `POST /v1/explain/cases` — step requests, each answered as `/v1/explain` answers it (its
//!   typed failure included) inside one 200 answer; `POST /v1/explain/beam`,
//!   `POST /v1/explain/streams` — beam search on a probability tree, random-stream scheduling
//!   (the ledger page's demonstrations, see [`page`]);
//! * `GET /` — the decoding ledger page, `GET /assets/{file}` its files (see [`page`]);
//! * `GET /v1/traces/{id}` — the JSON Lines trace of a request run with `nextok.trace: true`,
//!   as `nextok replay` reads it.
//!
//! Errors have OpenAI's shape `{"error": {"message", "type", "param", "code"}}` ([`ApiError`]).
//! The engine runs on its own scheduler thread; a request is prepared (tokenised, its constraint
//! compiled) on tokio's blocking pool, and its events reach the response through the
//! [`RequestHandle`](nextok_engine::RequestHandle). A client that goes away drops the handle,
//! which cancels the request and frees its KV cache.

#![warn(missing_docs)]

pub mod api;
mod error;
mod generate;
pub mod metrics;
pub mod page;

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use nextok_engine::{Engine, ErrorKind, Event};
use serde_json::{json, Value};

pub use error::ApiError;
pub use generate::{sidecar, SideEvent, Sidecar};

use api::Endpoint;

/// How the server answers.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The model's id in `/v1/models` and the `model` field requests must name (or leave out).
    pub model_id: String,
    /// When not empty, `/v1/*` needs `Authorization: Bearer <key>` with one of these keys; a
    /// trace can then be read only with the key of the request that made it.
    pub api_keys: Vec<String>,
    /// Largest request body in bytes (larger: 413).
    pub body_limit: usize,
    /// Traces kept for `GET /v1/traces/{id}` (the oldest go first).
    pub max_traces: usize,
    /// The most bytes the kept traces hold together (the oldest go first).
    pub max_trace_bytes: usize,
    /// The most bytes of raw logits one request's trace may store (`nextok.trace_logits`),
    /// bounded before it runs from its sequences, its `max_tokens` and the vocabulary.
    pub max_trace_logits_bytes: usize,
    /// Speculative decoding for requests that do not choose (`nextok.speculative`).
    pub speculative: Option<nextok_engine::speculative::SpecOptions>,
    /// Time a client has to send a `/v1/*` request's whole body once its headers are in (past
    /// it: 408, and the connection closes).
    pub body_read_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            model_id: "nextok".into(),
            api_keys: Vec::new(),
            body_limit: 4 << 20,
            max_traces: 64,
            max_trace_bytes: 256 << 20,
            max_trace_logits_bytes: 64 << 20,
            speculative: None,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
        }
    }
}

/// [`ServerConfig::body_read_timeout`]'s default.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// [`ServeOptions::header_read_timeout`]'s default.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How [`serve`] treats connections.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// After the shutdown signal, how long running requests may take to finish.
    pub grace: Duration,
    /// Time a client has to send a request's headers (each request's, on a kept-alive
    /// connection too); past it the connection is closed.
    pub header_read_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            grace: Duration::from_secs(30),
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
        }
    }
}

/// The model id a file is served under: its file name without `.gguf`.
pub fn model_id_of(path: &std::path::Path) -> String {
    let name = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| "nextok".into());
    name.strip_suffix(".gguf").unwrap_or(&name).to_string()
}

/// What every handler shares.
pub(crate) struct AppState {
    pub(crate) engine: Arc<Engine>,
    pub(crate) config: ServerConfig,
    pub(crate) metrics: metrics::Metrics,
    pub(crate) traces: Mutex<VecDeque<StoredTrace>>,
    pub(crate) started: u64,
    /// One model step after accepted tokens at a time (each runs its own forward pass outside
    /// the engine's batch).
    pub(crate) after_accepted: tokio::sync::Semaphore,
}

/// A finished request's trace, kept for `GET /v1/traces/{id}`.
pub(crate) struct StoredTrace {
    id: String,
    /// The API key (its index in [`ServerConfig::api_keys`]) of the request that made it.
    owner: ClientKey,
    text: Arc<String>,
}

/// Which of the server's API keys a request was authorised with (`None`: the server has none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClientKey(pub(crate) Option<usize>);

impl AppState {
    pub(crate) fn store_trace(&self, id: String, owner: ClientKey, text: String) {
        if text.len() > self.config.max_trace_bytes {
            return;
        }
        let mut t = self.traces.lock().unwrap_or_else(|p| p.into_inner());
        let mut bytes: usize = t.iter().map(|x| x.text.len()).sum();
        while t.len() >= self.config.max_traces.max(1)
            || bytes + text.len() > self.config.max_trace_bytes
        {
            match t.pop_front() {
                Some(old) => bytes -= old.text.len(),
                None => break,
            }
        }
        t.push_back(StoredTrace {
            id,
            owner,
            text: Arc::new(text),
        });
    }
}

/// What one stored raw logit may take in a trace at most: 4 bytes deflated (incompressible
/// data grows by a few bytes a block), in base64 (4/3), rounded up.
pub(crate) const TRACE_LOGITS_BYTES_PER_VALUE: u128 = 6;

/// A new trace id: `trace-` and 128 random bits from the operating system (32 hex digits), so
/// that no client can guess another's.
pub(crate) fn new_trace_id() -> Result<String, ApiError> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b)
        .map_err(|e| ApiError::internal(format!("no random source for a trace id: {e}")))?;
    let mut id = String::with_capacity(6 + 32);
    id.push_str("trace-");
    for x in b {
        id.push_str(&format!("{x:02x}"));
    }
    Ok(id)
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Marks a response whose request the handler logs and counts itself (generation requests,
/// at their end).
#[derive(Clone, Copy)]
pub(crate) struct SelfLogged;

/// The router over `engine`.
pub fn router(engine: Arc<Engine>, config: ServerConfig) -> Router {
    let state = Arc::new(AppState {
        engine,
        metrics: metrics::Metrics::default(),
        traces: Mutex::new(VecDeque::new()),
        started: unix_now(),
        after_accepted: tokio::sync::Semaphore::new(1),
        config,
    });
    let v1 = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/explain", post(explain))
        .route("/v1/explain/cases", post(page::cases))
        .route("/v1/explain/beam", post(page::beam))
        .route("/v1/explain/streams", post(page::streams))
        .route("/v1/traces/{id}", get(trace))
        // (the last layer runs first: the key is checked before the body is read)
        .route_layer(middleware::from_fn_with_state(state.clone(), read_body))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    Router::new()
        .merge(v1)
        .route("/", get(page::index))
        .route("/assets/{file}", get(page::asset))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.config.body_limit))
        .layer(middleware::from_fn_with_state(state.clone(), log))
        .with_state(state)
}

/// Serves `app` on `listener` (HTTP/1.1) until `shutdown` completes; then stops accepting,
/// lets running requests finish for at most `opts.grace`, and returns. A connection whose
/// client does not send a request's headers within `opts.header_read_timeout` is closed.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    opts: ServeOptions,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(opts.header_read_timeout);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            conn = listener.accept() => match conn {
                Ok(c) => c,
                Err(e) => {
                    // a connection that failed before it was accepted, or no file descriptor
                    // left: wait a little rather than spin, then go on
                    eprintln!("nextok: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        // streamed tokens go out as they come
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            // a connection's own failures (a client that went away, a header timeout) end only it
            let _ = conn.await;
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(opts.grace) => {
            eprintln!("nextok: shutdown: streams still running after {} s are cancelled", opts.grace.as_secs());
        }
    }
    Ok(())
}

/// Completes on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    eprintln!("nextok: shutting down: no new requests; running streams may finish");
}

fn endpoint_name(path: &str) -> &'static str {
    match path {
        "/v1/chat/completions" => "chat_completions",
        "/v1/completions" => "completions",
        "/v1/models" => "models",
        "/v1/explain" => "explain",
        "/v1/explain/cases" => "explain_cases",
        "/v1/explain/beam" => "explain_beam",
        "/v1/explain/streams" => "explain_streams",
        "/" => "page",
        p if p.starts_with("/assets/") => "page",
        "/health" => "health",
        "/metrics" => "metrics",
        p if p.starts_with("/v1/traces/") => "traces",
        _ => "other",
    }
}

/// One line per request on stderr, and the request counter.
async fn log(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let t0 = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let r = next.run(req).await;
    if r.extensions().get::<SelfLogged>().is_none() {
        let status = r.status().as_u16();
        s.metrics.request(endpoint_name(&path), status);
        eprintln!(
            "nextok: {method} {path} {status} {:.3}s",
            t0.elapsed().as_secs_f64()
        );
    }
    r
}

/// Reads a `/v1/*` request's whole body before the handler runs: at most
/// [`ServerConfig::body_limit`] bytes (a larger `Content-Length` is refused before anything is
/// read: 413), within [`ServerConfig::body_read_timeout`] (408), so that a slow client holds
/// neither a handler nor unbounded memory.
async fn read_body(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    use http_body_util::BodyExt;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!(
                "the request body is over the size limit ({} bytes)",
                s.config.body_limit
            ),
        )
        .with_code("request_too_large")
        .into_response()
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > s.config.body_limit as u64) {
        return too_large();
    }
    let (parts, body) = req.into_parts();
    let limited = http_body_util::Limited::new(body, s.config.body_limit);
    let bytes = match tokio::time::timeout(s.config.body_read_timeout, limited.collect()).await {
        Err(_) => {
            let mut r = ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!(
                    "the request body did not arrive within {} s",
                    s.config.body_read_timeout.as_secs_f64()
                ),
            )
            .with_code("request_timeout")
            .into_response();
            r.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
            return r;
        }
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => return too_large(),
        Ok(Err(e)) => {
            return ApiError::bad_body(format!("the request body could not be read: {e}"))
                .into_response()
        }
        Ok(Ok(c)) => c.to_bytes(),
    };
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await
}

/// `Authorization: Bearer <key>` when the server has a key.
/// (With API keys, the request's key is passed on to the handlers as a [`ClientKey`].)
async fn auth(State(s): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let mut client = ClientKey(None);
    if !s.config.api_keys.is_empty() {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        // every key is compared in full (no early exit on the first difference or match)
        let mut found = None;
        if let Some(g) = given {
            for (i, key) in s.config.api_keys.iter().enumerate() {
                let same = g.len() == key.len()
                    && g.bytes()
                        .zip(key.bytes())
                        .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                        == 0;
                if same && found.is_none() {
                    found = Some(i);
                }
            }
        }
        if found.is_none() {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "a missing or wrong API key (send `Authorization: Bearer <key>`)",
            )
            .with_code("invalid_api_key")
            .into_response();
        }
        client = ClientKey(found);
    }
    req.extensions_mut().insert(client);
    next.run(req).await
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found_error", "no such endpoint")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "this endpoint does not take that method",
    )
}

async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn metrics_text(State(s): State<Arc<AppState>>) -> Response {
    let text = s.metrics.render(&s.engine.stats());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn models(State(s): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{
        "id": s.config.model_id,
        "object": "model",
        "created": s.started,
        "owned_by": "nextok",
        "max_model_len": s.engine.model().weights.config.context_length,
    }]}))
}

/// A trace is found only by its id and only with the key that made it (another key's trace
/// answers exactly as a missing one).
async fn trace(
    State(s): State<Arc<AppState>>,
    Extension(client): Extension<ClientKey>,
    Path(id): Path<String>,
) -> Response {
    let found = {
        let t = s.traces.lock().unwrap_or_else(|p| p.into_inner());
        t.iter()
            .find(|x| x.id == id && x.owner == client)
            .map(|x| x.text.clone())
    };
    // the id is echoed at most in part
    let shown: String = id.chars().take(64).collect();
    match found {
        Some(text) => (
            [(header::CONTENT_TYPE, "application/x-ndjson")],
            text.as_str().to_owned(),
        )
            .into_response(),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!(
                "no trace `{shown}` (traces are kept for finished requests only, the latest {})",
                s.config.max_traces
            ),
        )
        .into_response(),
    }
}

/// The body as JSON: 413 past the limit, 400 when not JSON.
pub(crate) fn json_body(body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    let bytes = body.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "the request body is over the size limit",
            )
            .with_code("request_too_large")
        } else {
            ApiError::new(r.status(), "invalid_request_error", r.body_text())
        }
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_body(format!("the body is not valid JSON: {e}")))
}

async fn chat(
    State(s): State<Arc<AppState>>,
    Extension(client): Extension<ClientKey>,
    side: Option<Extension<Sidecar>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate::run(s, Endpoint::Chat, client, side.map(|e| e.0), body).await
}

async fn completions(
    State(s): State<Arc<AppState>>,
    Extension(client): Extension<ClientKey>,
    side: Option<Extension<Sidecar>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate::run(s, Endpoint::Completions, client, side.map(|e| e.0), body).await
}

/// `POST /v1/explain`.
async fn explain(
    State(s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let v = json_body(body)?;
    let is_step = v.as_object().is_some_and(|o| o.contains_key("logits"));
    if is_step {
        let text = v.to_string();
        let out = tokio::task::spawn_blocking(move || nextok_engine::explain::explain_json(&text))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
            .map_err(|e| explain_error(&e, |f| f.to_string()))?;
        return Ok(Json(out).into_response());
    }
    // the model's next step, after the output tokens already accepted, if any
    let mut v = v;
    let accepted: Option<Vec<u32>> = match v.as_object_mut().and_then(|o| o.remove("accepted")) {
        None | Some(Value::Null) => None,
        Some(a) => Some(serde_json::from_value(a).map_err(|e| {
            ApiError::invalid("accepted", format!("must be a list of token ids: {e}"))
        })?),
    };
    let ep = if v.as_object().is_some_and(|o| o.contains_key("messages")) {
        Endpoint::Chat
    } else {
        Endpoint::Completions
    };
    let mut req = api::parse(ep, &v)?;
    generate::check_model(&s, &req)?;
    if req.gen.n != 1 {
        return Err(ApiError::invalid("n", "the ledger explains one sequence"));
    }
    // the one step after the accepted tokens: the length of `accepted` sets `max_tokens`, so a
    // limit on it is `accepted`'s (the client sent no `max_tokens` that counts here)
    let ctx = s.engine.model().weights.config.context_length;
    if let Some(a) = &accepted {
        if a.len() >= ctx {
            return Err(ApiError::invalid(
                "accepted",
                format!("{} token ids; the context holds {ctx}", a.len()),
            ));
        }
    }
    req.gen.params.max_tokens = Some(accepted.as_ref().map_or(0, |a| a.len()) as u64 + 1);
    req.gen.ledger_step = Some(0);
    req.gen.logprobs = None;
    req.gen.records = None;
    if let Some(accepted) = accepted {
        let _one = s
            .after_accepted
            .acquire()
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let engine = s.engine.clone();
        let gen = req.gen.clone();
        let acc = accepted.clone();
        let (prepared, (ex, finish)) = tokio::task::spawn_blocking(move || {
            let p = engine.prepare(&gen)?;
            let ex = nextok_engine::explain::model_step_after(engine.model(), &p, &acc)?;
            Ok::<_, nextok_engine::EngineError>((p, ex))
        })
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| {
            explain_error(&e, |f| {
                if f.starts_with("accepted") {
                    f.to_string()
                } else if f == "max_tokens" {
                    "accepted".to_string()
                } else {
                    req.param(f)
                }
            })
        })?;
        let mut r = model_step_body(&s, &prepared.info, &ex)?;
        r["accepted"] = json!(accepted);
        r["selected_finishes"] = json!(finish);
        return Ok(Json(r).into_response());
    }
    let engine = s.engine.clone();
    let gen = req.gen.clone();
    let mut h = tokio::task::spawn_blocking(move || engine.submit(gen))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| ApiError::from_engine(&e, |f| req.param(f)))?;
    while let Some(ev) = h.next_event().await {
        match ev {
            Event::Ledger { explanation, .. } => {
                return Ok(Json(model_step_body(&s, &h.info, &explanation)?).into_response());
            }
            Event::Error(e) => return Err(explain_error(&e, |f| req.param(f))),
            Event::Done { .. } => break,
            _ => {}
        }
    }
    Err(ApiError::internal(
        "the engine ended the request without a ledger",
    ))
}

/// The answer of `/v1/explain` for a model step: its ledger (20 support rows, then 10 outside),
/// the prompt's ids and count, and the seed.
fn model_step_body(
    s: &AppState,
    info: &nextok_engine::RequestInfo,
    ex: &nextok_core::Explanation,
) -> Result<Value, ApiError> {
    let out = nextok_engine::explain::model_step_output(s.engine.model(), info, ex, 20, 10);
    let mut body = serde_json::to_value(out).map_err(|e| ApiError::internal(e.to_string()))?;
    body["prompt_tokens"] = json!(info.prompt_ids.len());
    body["prompt_ids"] = json!(info.prompt_ids);
    body["seed"] = json!(info.seeds.first());
    Ok(body)
}

/// Every error of an explained step but the model's and the engine's own is the request's.
fn explain_error(e: &nextok_engine::EngineError, param: impl Fn(&str) -> String) -> ApiError {
    let api = match e.kind() {
        ErrorKind::Sampling => ApiError {
            param: e.field().map(&param),
            ..ApiError::invalid("", e.to_string())
        },
        _ => ApiError::from_engine(e, param),
    };
    match (api.code, e.code()) {
        (None, Some(code)) => api.with_code(code),
        _ => api,
    }
}
