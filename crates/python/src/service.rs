//! `nextok._Service`: the OpenAI-compatible API of `nextok serve` (the server crate's router),
//! called in process: a request in (method, path, headers, body), a status, headers and a
//! stream of body chunks out, with no socket between. What a Ray Serve replica runs: one
//! implementation of the API, whoever carries the bytes.
//!
//! Beside a generation answer's chunks the service gives what the server's side channel
//! ([`nextok_server::Sidecar`]) tells: the answer's id, `created` and seed, and the token ids
//! behind each chunk, so that a front end can resume the answer elsewhere (`nextok.resume`).

use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, OnceLock};

use axum::body::Body;
use axum::Router;
use http_body_util::BodyExt;
use nextok_server::{ServerConfig, SideEvent};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use tower::ServiceExt;

use crate::convert::type_name;
use crate::engine::PyEngine;
use crate::errors::Failure;

/// The runtime every service of the process shares (two worker threads: the engine has its
/// own scheduler thread, and the server's blocking work goes to the runtime's blocking pool).
fn runtime() -> Result<&'static tokio::runtime::Runtime, Failure> {
    static RT: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("nextok-service")
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| {
        Failure::new(
            "EngineError",
            format!("cannot start the service runtime: {e}"),
        )
    })
}

/// A whole answer: status, headers, body.
type Raw = (u16, Vec<(String, String)>, Vec<u8>);

/// A response's headers as `(name, value)` pairs (a value that is not UTF-8, lossily).
fn header_pairs(h: &axum::http::HeaderMap) -> Vec<(String, String)> {
    h.iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

/// The most header pairs a request may carry, and the most bytes of one header.
const MAX_HEADERS: usize = 100;
const MAX_HEADER_BYTES: usize = 16 << 10;

/// The API over one engine.
#[pyclass(module = "nextok", name = "_Service", frozen)]
pub struct PyService {
    router: Router,
    engine: Arc<nextok_engine::Engine>,
    model_id: String,
}

fn str_list(key: &str, v: &Bound<'_, PyAny>) -> Result<Vec<String>, Failure> {
    let mut out = Vec::new();
    let items = v.try_iter().map_err(|_| {
        Failure::argument(key, format!("must be a list of str, got {}", type_name(v)))
    })?;
    for (i, x) in items.enumerate() {
        let x = x.map_err(|e| Failure::argument(key, e.to_string()))?;
        out.push(x.extract::<String>().map_err(|_| {
            Failure::argument(
                format!("{key}[{i}]"),
                format!("must be a str, got {}", type_name(&x)),
            )
        })?);
    }
    Ok(out)
}

fn server_config(
    engine: &PyEngine,
    config: Option<&Bound<'_, PyDict>>,
) -> Result<ServerConfig, Failure> {
    let mut c = ServerConfig {
        model_id: nextok_server::model_id_of(std::path::Path::new(&engine.model_path)),
        ..Default::default()
    };
    let Some(config) = config else {
        return Ok(c);
    };
    for (k, v) in config.iter() {
        let key: String = k
            .extract()
            .map_err(|_| Failure::argument("config", "keys must be str"))?;
        if v.is_none() {
            continue;
        }
        let count = |v: &Bound<'_, PyAny>| -> Result<usize, Failure> {
            let n: i64 = v.extract().map_err(|_| {
                Failure::argument(&key, format!("must be an integer, got {}", type_name(v)))
            })?;
            usize::try_from(n).map_err(|_| Failure::argument(&key, format!("{n} is negative")))
        };
        match key.as_str() {
            "model_id" => {
                c.model_id = v.extract().map_err(|_| {
                    Failure::argument(&key, format!("must be a str, got {}", type_name(&v)))
                })?
            }
            "api_keys" => c.api_keys = str_list(&key, &v)?,
            "body_limit" => c.body_limit = count(&v)?,
            "max_traces" => c.max_traces = count(&v)?,
            "max_trace_bytes" => c.max_trace_bytes = count(&v)?,
            "speculative" => {
                let t: String = v.extract().map_err(|_| {
                    Failure::argument(&key, format!("must be a str, got {}", type_name(&v)))
                })?;
                c.speculative = Some(
                    nextok_engine::speculative::SpecOptions::parse(&t, Default::default())
                        .map_err(|e| Failure::argument(&key, e))?,
                );
            }
            other => {
                return Err(Failure::argument(
                    other,
                    "is not a service setting (model_id, api_keys, body_limit, max_traces, max_trace_bytes, speculative)",
                ))
            }
        }
    }
    Ok(c)
}

#[pymethods]
impl PyService {
    /// The API over `engine` (an `_Engine`), with `config` (`model_id`, `api_keys`,
    /// `body_limit`, `max_traces`, `max_trace_bytes`, `speculative`).
    #[new]
    #[pyo3(signature = (engine, config = None))]
    fn new(
        engine: &Bound<'_, PyEngine>,
        config: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyService> {
        let e = engine.get();
        let c = server_config(e, config)?;
        let model_id = c.model_id.clone();
        // (the router's state holds the engine; the runtime exists before any request)
        runtime()?;
        Ok(PyService {
            router: nextok_server::router(e.engine.clone(), c),
            engine: e.engine.clone(),
            model_id,
        })
    }

    /// The model id the API serves.
    #[getter]
    fn model_id(&self) -> &str {
        &self.model_id
    }

    /// Sends one request (the GIL released until the response's head is ready): `method`,
    /// `path` (with its query), `headers` (a list of `(name, value)`), `body` (bytes).
    #[pyo3(signature = (method, path, headers = Vec::new(), body = Vec::new()))]
    fn request(
        &self,
        py: Python<'_>,
        method: &str,
        path: &str,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    ) -> PyResult<PyResponse> {
        if headers.len() > MAX_HEADERS {
            return Err(Failure::argument(
                "headers",
                format!("{} headers; at most {MAX_HEADERS}", headers.len()),
            )
            .into());
        }
        let mut b = axum::http::Request::builder()
            .method(
                axum::http::Method::from_bytes(method.as_bytes())
                    .map_err(|e| Failure::argument("method", e.to_string()))?,
            )
            .uri(
                path.parse::<axum::http::Uri>()
                    .map_err(|e| Failure::argument("path", e.to_string()))?,
            );
        for (i, (k, v)) in headers.iter().enumerate() {
            if k.len() + v.len() > MAX_HEADER_BYTES {
                return Err(Failure::argument(format!("headers[{i}]"), "is too long").into());
            }
            let name = axum::http::HeaderName::from_bytes(k.as_bytes())
                .map_err(|e| Failure::argument(format!("headers[{i}]"), e.to_string()))?;
            let value = axum::http::HeaderValue::from_str(v)
                .map_err(|e| Failure::argument(format!("headers[{i}]"), e.to_string()))?;
            b = b.header(name, value);
        }
        let (side, rx) = nextok_server::sidecar();
        let mut req = b
            .body(Body::from(body))
            .map_err(|e| Failure::argument("request", e.to_string()))?;
        req.extensions_mut().insert(side);
        let rt = runtime()?;
        let router = self.router.clone();
        let resp = py
            .detach(|| rt.block_on(router.oneshot(req)))
            .map_err(|e| Failure::new("EngineError", e.to_string()))?;
        let status = resp.status().as_u16();
        let headers = header_pairs(resp.headers());
        let mut started = None;
        let mut early = Vec::new();
        for e in rx.try_iter() {
            match e {
                SideEvent::Started {
                    id,
                    created,
                    seed,
                    n,
                    trace_id,
                } => started = Some((id, created, seed, n, trace_id)),
                other => early.push(other),
            }
        }
        Ok(PyResponse {
            status,
            headers,
            started,
            cancel: tokio::sync::Notify::new(),
            closed: std::sync::atomic::AtomicBool::new(false),
            inner: Mutex::new(Some(Flow {
                body: resp.into_body(),
                side: rx,
                early,
                ended: false,
            })),
        })
    }

    /// The engine's counters now: `running_seqs`, `waiting_requests`, `kv_bytes_in_use`,
    /// `kv_bytes_reserved`, `kv_bytes_touched`, `prompt_tokens`, `cached_prompt_tokens`, `completion_tokens`,
    /// `iterations`, `preemptions`, and its limits `max_num_seqs`, `max_waiting`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.engine.stats();
        let c = self.engine.config();
        let d = PyDict::new(py);
        d.set_item("running_seqs", s.running_seqs)?;
        d.set_item("waiting_requests", s.waiting_requests)?;
        d.set_item("kv_bytes_in_use", s.kv_bytes_in_use)?;
        d.set_item("kv_bytes_reserved", s.kv_bytes_reserved)?;
        d.set_item("kv_bytes_touched", s.kv_bytes_touched)?;
        d.set_item("prompt_tokens", s.prompt_tokens)?;
        d.set_item("cached_prompt_tokens", s.cached_prompt_tokens)?;
        d.set_item("completion_tokens", s.completion_tokens)?;
        d.set_item("iterations", s.iterations)?;
        d.set_item("preemptions", s.preemptions)?;
        d.set_item("max_num_seqs", c.max_num_seqs)?;
        d.set_item("max_waiting", c.max_waiting)?;
        Ok(d)
    }
}

/// A response's body and side channel, while it is read.
struct Flow {
    body: Body,
    side: Receiver<SideEvent>,
    /// Side events that came with the head.
    early: Vec<SideEvent>,
    /// The body ended while chunks were coalesced.
    ended: bool,
}

/// One response: its status, headers, what the answer is (`started`), and its body chunks.
#[pyclass(module = "nextok", name = "_Response", frozen)]
pub struct PyResponse {
    status: u16,
    headers: Vec<(String, String)>,
    started: Option<(String, u64, u64, usize, Option<String>)>,
    /// Wakes a `next_chunk` waiting for the body when the response is closed.
    cancel: tokio::sync::Notify,
    closed: std::sync::atomic::AtomicBool,
    inner: Mutex<Option<Flow>>,
}

#[pymethods]
impl PyResponse {
    /// The HTTP status.
    #[getter]
    fn status(&self) -> u16 {
        self.status
    }

    /// The headers, as `(name, value)` pairs.
    #[getter]
    fn headers(&self) -> Vec<(String, String)> {
        self.headers.clone()
    }

    /// For a generation answer: `{"id", "created", "seed", "n", "trace_id"}`; otherwise
    /// `None`.
    #[getter]
    fn started<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some((id, created, seed, n, trace_id)) = &self.started else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("id", id)?;
        d.set_item("created", created)?;
        d.set_item("seed", seed)?;
        d.set_item("n", n)?;
        d.set_item("trace_id", trace_id)?;
        Ok(Some(d))
    }

    /// The next body chunk (the GIL released while it waits), as `(data, tokens, finished)`:
    /// `tokens` the `(sequence, token id)` pairs selected since the previous chunk, `finished`
    /// the sequences that ended; `None` after the last. With `coalesce > 1`, up to that many
    /// chunks that are ready already come as one (nothing waits for more): fewer, larger
    /// chunks when the reader is slower than the engine.
    #[allow(clippy::type_complexity)]
    #[pyo3(signature = (coalesce = 1))]
    fn next_chunk<'py>(
        &self,
        py: Python<'py>,
        coalesce: usize,
    ) -> PyResult<Option<(Bound<'py, PyBytes>, Vec<(usize, u32)>, Vec<usize>)>> {
        use std::sync::atomic::Ordering;
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if self.closed.load(Ordering::Acquire) {
            *guard = None;
        }
        if guard.as_ref().is_some_and(|f| f.ended) {
            *guard = None;
        }
        let Some(flow) = guard.as_mut() else {
            return Ok(None);
        };
        let rt = runtime()?;
        let cancel = &self.cancel;
        let data = py.detach(|| {
            rt.block_on(async {
                loop {
                    tokio::select! {
                        // closed from another thread: the wait ends, the answer is dropped
                        _ = cancel.notified() => return Ok(None),
                        f = flow.body.frame() => match f {
                            None => return Ok(None),
                            Some(Err(e)) => return Err(e.to_string()),
                            Some(Ok(f)) => {
                                if let Ok(d) = f.into_data() {
                                    return Ok(Some(d));
                                }
                            }
                        },
                    }
                }
            })
        });
        let data = match data {
            Ok(Some(d)) if coalesce > 1 => {
                use futures_util::FutureExt;
                let mut all = d.to_vec();
                for _ in 1..coalesce.min(4096) {
                    match flow.body.frame().now_or_never() {
                        Some(Some(Ok(f))) => {
                            if let Ok(more) = f.into_data() {
                                all.extend_from_slice(&more);
                            }
                        }
                        Some(None) => {
                            // the end: the next call returns `None` without polling again
                            flow.ended = true;
                            break;
                        }
                        Some(Some(Err(e))) => {
                            *guard = None;
                            return Err(Failure::new("EngineError", e.to_string()).into());
                        }
                        // nothing ready yet
                        None => break,
                    }
                }
                axum::body::Bytes::from(all)
            }
            Ok(Some(d)) => d,
            Ok(None) => {
                *guard = None;
                return Ok(None);
            }
            Err(e) => {
                *guard = None;
                return Err(Failure::new("EngineError", e).into());
            }
        };
        let mut tokens = Vec::new();
        let mut finished = Vec::new();
        for e in flow.early.drain(..).chain(flow.side.try_iter()) {
            match e {
                SideEvent::Token { seq, id } => tokens.push((seq, id)),
                SideEvent::Finished { seq } => finished.push(seq),
                SideEvent::Started { .. } => {}
            }
        }
        Ok(Some((PyBytes::new(py, &data), tokens, finished)))
    }

    /// Stops reading: the answer is cancelled (its request's cache freed), also while another
    /// thread waits in `next_chunk` (which then returns `None`).
    fn close(&self) {
        use std::sync::atomic::Ordering;
        self.closed.store(true, Ordering::Release);
        // a waiting `next_chunk` wakes (or the next one returns at once)
        self.cancel.notify_one();
        if let Ok(mut guard) = self.inner.try_lock() {
            *guard = None;
        }
    }
}

/// The answer `nextok serve` gives when it cannot take a request now, as `(status, headers,
/// body)`: `kind` `"queue_full"` (429, `Retry-After: 1`, code `queue_full`) or `"shutdown"`
/// (503, `Retry-After: 5`), with `message`. A front end that refuses a request itself (every
/// replica full) answers with exactly these bytes.
#[pyfunction]
pub fn refusal(kind: &str, message: &str) -> PyResult<Raw> {
    use axum::response::IntoResponse;
    use nextok_engine::{EngineError, ErrorKind};
    let k = match kind {
        "queue_full" => ErrorKind::QueueFull,
        "shutdown" => ErrorKind::Shutdown,
        other => {
            return Err(Failure::argument(
                "kind",
                format!("{other:?} is not `queue_full` or `shutdown`"),
            )
            .into())
        }
    };
    let r = nextok_server::ApiError::from_engine(&EngineError::new(k, message), |f| f.to_string())
        .into_response();
    let status = r.status().as_u16();
    let headers = header_pairs(r.headers());
    let rt = runtime()?;
    let body = rt
        .block_on(r.into_body().collect())
        .map_err(|e| Failure::new("EngineError", e.to_string()))?
        .to_bytes()
        .to_vec();
    Ok((status, headers, body))
}
