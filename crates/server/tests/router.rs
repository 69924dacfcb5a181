//! The router on the real model (SmolLM2-135M-Instruct, from the test data), driven in process
//! through tower: the shared test vectors through `/v1/explain`, OpenAI-shaped errors (400
//! naming the field, 401, 404, 413, 429 with `Retry-After`), answers equal to the engine's own
//! run, streams, disconnects that free the cache, traces that replay.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use nextok_engine::{Engine, EngineConfig, GenerateRequest, Prompt};
use nextok_model::{Model, Requant};
use nextok_server::ServerConfig;
use nextok_testdata::vectors::{self, Case, Minimum, Outcome};
use serde_json::{json, Value};
use tower::ServiceExt;

fn model() -> Option<Arc<Model>> {
    let path = nextok_testdata::require(nextok_testdata::SMOLLM2)?;
    static M: std::sync::OnceLock<Arc<Model>> = std::sync::OnceLock::new();
    Some(
        M.get_or_init(|| Arc::new(Model::load(&path, Requant::Keep).expect("model loads")))
            .clone(),
    )
}

const MODEL_ID: &str = "smollm2";

fn app_with(config: EngineConfig, server: ServerConfig) -> Option<(Router, Arc<Engine>)> {
    let engine = Arc::new(Engine::new(model()?, config).expect("engine starts"));
    Some((nextok_server::router(engine.clone(), server), engine))
}

fn app() -> Option<(Router, Arc<Engine>)> {
    app_with(
        EngineConfig::default(),
        ServerConfig {
            model_id: MODEL_ID.into(),
            ..Default::default()
        },
    )
}

fn post(path: &str, body: &Value) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

async fn call(app: &Router, req: Request<Body>) -> (StatusCode, axum::http::HeaderMap, Value) {
    let r = app.clone().oneshot(req).await.unwrap();
    let status = r.status();
    let headers = r.headers().clone();
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, headers, v)
}

/// The `data:` payloads of a whole event stream.
/// The trace of an answer (`nextok.trace_id`), fetched with `GET /v1/traces/{id}` and parsed.
async fn trace_of(app: &Router, out: &Value) -> (nextok_engine::trace::TraceHeader, Vec<Value>) {
    let id = out["nextok"]["trace_id"].as_str().expect("a trace id");
    let (status, _, text) = call(
        app,
        Request::get(format!("/v1/traces/{id}"))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    nextok_engine::trace::parse(text.as_str().unwrap()).unwrap()
}

fn events(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// One case through `/v1/explain`; counts the requests expected to succeed and to fail.
async fn check_case(app: &Router, case: Case, counts: &Mutex<(usize, usize)>) -> Outcome {
    let ctx = case.ctx();
    let req = case.request();
    let exp = case.expect();
    let (status, _, out) = call(app, post("/v1/explain", req)).await;
    if let Some(err) = exp.get("error") {
        counts.lock().unwrap().1 += 1;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{ctx}: {out}");
        assert_eq!(out["error"]["type"], "invalid_request_error", "{ctx}");
        let Some(field) = err["field"].as_str() else {
            // an error of the request as a whole (e.g. already_finished): its code
            assert_eq!(out["error"]["code"], err["code"], "{ctx}: {out}");
            return Outcome::Pass;
        };
        let head = field.split(['[', '.']).next().unwrap();
        let param = out["error"]["param"].as_str().unwrap_or_default();
        let message = out["error"]["message"].as_str().unwrap_or_default();
        assert!(
            param.contains(head) || message.contains(head),
            "{ctx}: the error names neither in param nor message `{head}`: {out}"
        );
        assert_eq!(out["error"]["type"], "invalid_request_error", "{ctx}");
        return Outcome::Pass;
    }
    counts.lock().unwrap().0 += 1;
    assert_eq!(status, StatusCode::OK, "{ctx}: {out}");
    vectors::check_explain_json(&case, &out);
    Outcome::Pass
}

#[tokio::test]
async fn explain_runs_every_shared_vector() {
    let Some((app, _)) = app() else { return };
    // (expected to succeed, expected to fail)
    let counts = Mutex::new((0, 0));
    let min = Minimum {
        files: 5,
        cases_run: 40,
    };
    if vectors::run_async(min, |case| check_case(&app, case, &counts))
        .await
        .is_none()
    {
        return;
    }
    let (ok, failures) = *counts.lock().unwrap();
    assert!(ok >= 20 && failures >= 10, "{ok} ok, {failures} failures");
}

#[tokio::test]
async fn explain_the_models_next_step() {
    let Some((app, engine)) = app() else { return };
    let body = json!({"prompt": "The capital of France is", "temperature": 0});
    let (status, _, out) = call(&app, post("/v1/explain", &body)).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    // greedy: the engine's own first token
    let mut req = GenerateRequest::new(Prompt::Text("The capital of France is".into()));
    req.params.temperature = Some(0.0);
    req.params.max_tokens = Some(1);
    let want = tokio::task::spawn_blocking(move || engine.generate(req).unwrap())
        .await
        .unwrap();
    assert_eq!(
        out["selected"].as_u64().unwrap(),
        want.sequences[0].tokens[0] as u64
    );
    assert_eq!(
        out["support"].as_array().unwrap().len(),
        1,
        "greedy: one token"
    );
    assert!(out["tokens"].as_array().unwrap().len() > 1);
}

#[tokio::test]
async fn errors_have_openais_shape() {
    let Some((app, _)) = app_with(
        EngineConfig::default(),
        ServerConfig {
            model_id: MODEL_ID.into(),
            body_limit: 4096,
            ..Default::default()
        },
    ) else {
        return;
    };
    let msgs = json!([{"role": "user", "content": "hi"}]);
    for (body, param) in [
        (json!({"messages": msgs, "temperature": -1}), "temperature"),
        (json!({"messages": msgs, "top_p": 2}), "top_p"),
        (
            json!({"messages": msgs, "max_tokens": 100000}),
            "max_tokens",
        ),
        (
            json!({"messages": msgs, "max_completion_tokens": 100000}),
            "max_completion_tokens",
        ),
        (
            json!({"messages": msgs, "logit_bias": {"999999": 1}}),
            "logit_bias",
        ),
        (
            json!({"messages": msgs, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}}),
            "response_format.json_schema.schema",
        ),
        (
            json!({"messages": msgs, "guided_regex": "("}),
            "guided_regex",
        ),
        (json!({"messages": msgs, "n": 1000}), "n"),
    ] {
        let (status, _, out) = call(&app, post("/v1/chat/completions", &body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {out}");
        let p = out["error"]["param"].as_str().unwrap_or_default();
        assert!(
            p.starts_with(param),
            "{body}: param {p:?}, expected {param}: {out}"
        );
        for k in ["message", "type", "param", "code"] {
            assert!(out["error"].get(k).is_some(), "{k} missing: {out}");
        }
    }
    let (status, _, out) = call(
        &app,
        post(
            "/v1/completions",
            &json!({"prompt": [999999], "max_tokens": 2}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(out["error"]["param"], "prompt[0]");
    // not JSON
    let r = Request::post("/v1/completions")
        .body(Body::from("{not json"))
        .unwrap();
    let (status, _, out) = call(&app, r).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(out["error"]["param"].is_null());
    // unknown model
    let (status, _, out) = call(
        &app,
        post("/v1/completions", &json!({"model": "gpt-4", "prompt": "x"})),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(out["error"]["code"], "model_not_found");
    // over the body limit
    let big = json!({"prompt": "x".repeat(10_000)});
    let (status, _, out) = call(&app, post("/v1/completions", &big)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{out}");
    assert_eq!(out["error"]["code"], "request_too_large");
    // unknown route
    let (status, _, _) = call(
        &app,
        Request::get("/v2/nothing").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, out) = call(
        &app,
        Request::get("/v1/completions").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(out["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn an_api_key_guards_v1_only() {
    let Some((app, _)) = app_with(
        EngineConfig::default(),
        ServerConfig {
            model_id: MODEL_ID.into(),
            api_keys: vec!["sesame".into()],
            ..Default::default()
        },
    ) else {
        return;
    };
    let get = |auth: Option<&str>| {
        let mut r = Request::get("/v1/models");
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        r.body(Body::empty()).unwrap()
    };
    let (s, h, out) = call(&app, get(None)).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(out["error"]["type"], "authentication_error");
    assert!(h.get("www-authenticate").is_some());
    let (s, _, _) = call(&app, get(Some("Bearer wrong"))).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _, out) = call(&app, get(Some("Bearer sesame"))).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(out["data"][0]["id"], MODEL_ID);
    let (s, _, _) = call(&app, Request::get("/health").body(Body::empty()).unwrap()).await;
    assert_eq!(s, StatusCode::OK);
}

#[tokio::test]
async fn answers_equal_the_engines_run_streamed_or_not() {
    let Some((app, engine)) = app() else { return };
    let body = json!({"model": MODEL_ID, "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 12, "seed": 11, "temperature": 0.9, "n": 2});
    let (status, _, out) = call(&app, post("/v1/chat/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let texts: Vec<String> = out["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["message"]["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(texts.len(), 2);
    // the engine alone, sequence i with seed 11 + i
    for (i, t) in texts.iter().enumerate() {
        let mut req = GenerateRequest::new(Prompt::Chat(vec![nextok_model::chat::Message::new(
            "user",
            "Name a colour.",
        )]));
        req.params.max_tokens = Some(12);
        req.params.seed = Some(11 + i as u64);
        req.params.temperature = Some(0.9);
        let e = engine.clone();
        let want = tokio::task::spawn_blocking(move || e.generate(req).unwrap())
            .await
            .unwrap();
        assert_eq!(*t, want.sequences[0].text, "sequence {i}");
    }
    // streamed: the same text, chunk by chunk, then usage and [DONE]
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({"include_usage": true});
    let r = app
        .clone()
        .oneshot(post("/v1/chat/completions", &sbody))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    let evs = events(std::str::from_utf8(&bytes).unwrap());
    assert_eq!(evs.last().map(String::as_str), Some("[DONE]"));
    let mut got = [String::new(), String::new()];
    let mut finishes = 0;
    let mut usage = None;
    for e in &evs[..evs.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        if let Some(u) = v.get("usage") {
            assert!(v["choices"].as_array().unwrap().is_empty());
            usage = Some(u.clone());
            continue;
        }
        for c in v["choices"].as_array().unwrap() {
            let i = c["index"].as_u64().unwrap() as usize;
            if let Some(t) = c["delta"]["content"].as_str() {
                got[i].push_str(t);
            }
            if !c["finish_reason"].is_null() {
                finishes += 1;
            }
        }
    }
    assert_eq!(got.to_vec(), texts);
    assert_eq!(finishes, 2);
    let usage = usage.expect("a usage chunk");
    for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(usage[k], out["usage"][k], "{k}");
    }
}

#[tokio::test]
async fn a_full_queue_answers_429_with_retry_after() {
    let Some((app, engine)) = app_with(
        EngineConfig {
            max_num_seqs: 1,
            max_waiting: 1,
            ..Default::default()
        },
        ServerConfig {
            model_id: MODEL_ID.into(),
            ..Default::default()
        },
    ) else {
        return;
    };
    let long = json!({"prompt": "Count to a thousand:", "max_tokens": 400, "ignore_eos": true, "stream": true});
    // one running, one waiting: both streams stay open while the third asks
    let a = app
        .clone()
        .oneshot(post("/v1/completions", &long))
        .await
        .unwrap();
    assert_eq!(a.status(), StatusCode::OK);
    // the first is admitted (running) before the second queues (the wall clock is only a
    // stall guard: admission waits for no work)
    let t0 = Instant::now();
    while engine.stats().running_seqs == 0 {
        assert!(t0.elapsed() < Duration::from_secs(300), "never admitted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let b = app
        .clone()
        .oneshot(post("/v1/completions", &long))
        .await
        .unwrap();
    assert_eq!(b.status(), StatusCode::OK);
    let (status, headers, out) = call(&app, post("/v1/completions", &long)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{out}");
    assert!(headers.get("retry-after").is_some());
    assert_eq!(out["error"]["type"], "rate_limit_error");
    drop((a, b));
}

#[tokio::test]
async fn a_client_that_goes_away_frees_its_cache() {
    let Some((app, engine)) = app() else { return };
    let body = json!({"prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": true, "stream": true});
    let r = app
        .clone()
        .oneshot(post("/v1/completions", &body))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let mut b = r.into_body();
    let mut frames = 0;
    while frames < 20 {
        // a stall guard per frame, not a speed: 20 frames come however slow the machine
        match tokio::time::timeout(Duration::from_secs(300), b.frame()).await {
            Ok(Some(Ok(_))) => frames += 1,
            Ok(_) => break,
            Err(_) => panic!("no frame in 300 s after {frames}: the stream stalled"),
        }
    }
    assert_eq!(frames, 20, "the stream runs");
    let during = engine.stats();
    assert_eq!(during.running_seqs, 1);
    assert!(during.kv_bytes_reserved > 0);
    drop(b);
    // freed within a few engine iterations (the next one sees the cancel), not when its 1,000
    // tokens would have ended (~980 more): bounded in iterations; the wall clock is only a
    // stall guard, for an engine that stops iterating
    let dropped = engine.stats().iterations;
    let t0 = Instant::now();
    loop {
        let s = engine.stats();
        assert!(s.iterations <= dropped + 16, "not freed: {s:?}");
        if s.running_seqs == 0 && s.kv_bytes_reserved == 0 {
            assert!(s.kv_bytes_in_use < during.kv_bytes_in_use);
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(300), "stalled: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // the metrics say so, and count the request as 499
    let (_, _, text) = call(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    let text = text.as_str().unwrap().to_string();
    assert!(text.contains("nextok_running_sequences 0\n"), "{text}");
    assert!(text.contains("nextok_kv_bytes_reserved 0\n"), "{text}");
    assert!(
        text.contains("nextok_requests_total{endpoint=\"completions\",status=\"499\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("nextok_time_to_first_token_seconds_count 1\n"),
        "{text}"
    );
}

#[tokio::test]
async fn a_trace_replays_bit_for_bit() {
    let Some((app, engine)) = app() else { return };
    let body = json!({"prompt": "List three colours:", "max_tokens": 10, "seed": 5, "n": 2,
        "temperature": 0.8, "guided_regex": "[a-z ,]+", "nextok": {"trace": true, "pipeline": "vllm"}});
    let (status, _, out) = call(&app, post("/v1/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let (header, recorded) = trace_of(&app, &out).await;
    assert_eq!(header.seeds, vec![5, 6]);
    assert_eq!(header.pipeline_source, "vllm");
    let steps: usize = out["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert_eq!(recorded.len(), steps);
    let req = nextok_engine::trace::replay_request(&header).unwrap();
    let now = engine.numerics();
    assert_eq!(header.numerics.as_deref(), Some(now.as_str()));
    let run = tokio::task::spawn_blocking(move || engine.generate(req).unwrap())
        .await
        .unwrap();
    assert_eq!(
        nextok_engine::trace::compare(&header, &now, &recorded, &run),
        Ok(steps)
    );
    let (status, _, _) = call(
        &app,
        Request::get("/v1/traces/trace-none")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// `nextok.trace_logits` stores every step's raw logits in the trace (its sampler then replays
/// without the model); it needs `nextok.trace`, and what one request may store is bounded
/// before it runs.
#[tokio::test]
async fn a_trace_with_its_logits_replays_its_sampler_and_is_bounded() {
    let Some((app, engine)) = app_with(
        EngineConfig::default(),
        ServerConfig {
            model_id: MODEL_ID.into(),
            max_trace_logits_bytes: 8 << 20,
            ..Default::default()
        },
    ) else {
        return;
    };
    let body = json!({"prompt": "Name a colour:", "max_tokens": 4, "seed": 3, "temperature": 0.9,
        "nextok": {"trace": true, "trace_logits": true}});
    let (status, _, out) = call(&app, post("/v1/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let (header, recorded) = trace_of(&app, &out).await;
    assert!(header.raw_logits);
    assert_eq!(header.numerics.as_deref(), Some(engine.numerics().as_str()));
    assert!(recorded.iter().all(|l| l["raw_logits"]["len"] == 49152));
    let steps = out["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    let e = engine.clone();
    let replayed = tokio::task::spawn_blocking(move || {
        nextok_engine::trace::replay_on(&e, &header, &recorded, true).map_err(|e| e.to_string())
    })
    .await
    .unwrap();
    assert_eq!(replayed, Ok(steps));

    // without a trace there is nowhere to store them
    let body = json!({"prompt": "x", "max_tokens": 2, "nextok": {"trace_logits": true}});
    let (status, _, out) = call(&app, post("/v1/completions", &body)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
    assert_eq!(out["error"]["param"], "nextok.trace_logits", "{out}");
    // 2 x 100 tokens of 49,152 logits: more than this server's 8 MiB, refused before it runs
    let before = engine.stats().prompt_tokens;
    let body = json!({"prompt": "x", "max_tokens": 100, "n": 2,
        "nextok": {"trace": true, "trace_logits": true}});
    let (status, _, out) = call(&app, post("/v1/completions", &body)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
    assert_eq!(out["error"]["param"], "nextok.trace_logits", "{out}");
    assert!(
        out["error"]["message"]
            .as_str()
            .unwrap()
            .contains("lower max_tokens"),
        "{out}"
    );
    assert_eq!(engine.stats().prompt_tokens, before, "nothing ran");
}

#[tokio::test]
async fn shutdown_lets_a_running_stream_finish_and_refuses_new_connections() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some((app, _)) = app() else { return };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(nextok_server::serve(
        listener,
        app,
        async {
            let _ = rx.await;
        },
        // far longer than the stream takes, and than the stall guards below: the server must
        // stop when the stream ends, not when the grace runs out
        nextok_server::ServeOptions {
            grace: Duration::from_secs(600),
            ..Default::default()
        },
    ));
    let body = json!({"prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": true, "stream": true, "seed": 1}).to_string();
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(body.as_bytes()).await.unwrap();
    // the stream has started (the timeouts here are stall guards, not speeds)
    let mut first = vec![0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(300), conn.read(&mut first))
        .await
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    tx.send(()).unwrap();
    // ... and finishes
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(300), conn.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&rest);
    assert!(text.contains("data: [DONE]"), "{text}");
    assert!(text.contains("\"finish_reason\":\"length\""), "{text}");
    let r = tokio::time::timeout(Duration::from_secs(300), server)
        .await
        .expect("the server stops")
        .unwrap();
    assert!(r.is_ok());
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn property_order_is_a_request_option_and_reported() {
    let Some((app, _)) = app() else { return };
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"},
                        "b": {"type": "integer"}}, "required": ["a", "b"]});
    let msgs = json!([{"role": "user", "content": "Two numbers as JSON."}]);
    let rf = json!({"type": "json_schema", "json_schema": {"name": "d", "schema": schema}});
    for (order, flat) in [("any", false), ("schema", true)] {
        let mut body = json!({"messages": msgs, "response_format": rf, "max_tokens": 30,
                              "seed": 3, "temperature": 1.0});
        if flat {
            body["nextok_property_order"] = json!(order);
        } else {
            body["nextok"] = json!({"property_order": order});
        }
        let (status, _, out) = call(&app, post("/v1/chat/completions", &body)).await;
        assert_eq!(status, StatusCode::OK, "{out}");
        assert_eq!(out["nextok"]["schema"]["property_order"], order, "{out}");
        if order == "any" {
            assert_eq!(out["nextok"]["schema"]["objects_any_order"], 1, "{out}");
        }
    }
    // strict mode defaults to schema order, relaxed to any
    let body = json!({"messages": msgs, "response_format": rf, "max_tokens": 30,
                      "nextok": {"schema_mode": "relaxed"}});
    let (status, _, out) = call(&app, post("/v1/chat/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["nextok"]["schema"]["property_order"], "any", "{out}");
    // a bad value, and the option without a JSON schema
    for (body, param) in [
        (
            json!({"messages": msgs, "response_format": rf, "nextok": {"property_order": "sorted"}}),
            "nextok.property_order",
        ),
        (
            json!({"messages": msgs, "nextok_property_order": "any"}),
            "nextok_property_order",
        ),
    ] {
        let (status, _, out) = call(&app, post("/v1/chat/completions", &body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
        assert_eq!(out["error"]["param"], param, "{out}");
    }
}

#[tokio::test]
async fn relaxed_schema_mode_reports_and_validates() {
    let Some((app, _)) = app() else { return };
    let schema = json!({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                        "minItems": 1, "maxItems": 3, "uniqueItems": true});
    let msgs = json!([{"role": "user", "content": "Three digits as a JSON array."}]);
    let rf = json!({"type": "json_schema", "json_schema": {"name": "d", "schema": schema}});
    // strict (the default): refused, naming the keyword and where it is
    let (status, _, out) = call(
        &app,
        post(
            "/v1/chat/completions",
            &json!({"messages": msgs, "response_format": rf, "max_tokens": 30}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
    let msg = out["error"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("uniqueItems") && msg.contains("`/`"), "{out}");
    // schema_mode without a JSON schema
    let (status, _, out) = call(
        &app,
        post(
            "/v1/chat/completions",
            &json!({"messages": msgs, "nextok": {"schema_mode": "relaxed"}}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
    assert_eq!(out["error"]["param"], "nextok.schema_mode", "{out}");
    // relaxed: the report, and each choice checked against the full schema
    let body = json!({"messages": msgs, "response_format": rf, "max_tokens": 30, "n": 2,
                      "seed": 5, "temperature": 1.0, "nextok": {"schema_mode": "relaxed"}});
    let (status, _, out) = call(&app, post("/v1/chat/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let nx = &out["nextok"];
    assert_eq!(nx["schema"]["mode"], "relaxed", "{nx}");
    assert_eq!(nx["schema"]["post_validation"][0]["keyword"], "uniqueItems");
    assert!(nx["schema"]["mask"]
        .as_array()
        .unwrap()
        .contains(&json!("maxItems")));
    for (i, c) in out["choices"].as_array().unwrap().iter().enumerate() {
        let text = c["message"]["content"].as_str().unwrap();
        // the mask guarantees the shape when the output is complete; uniqueness only the check
        let want = match serde_json::from_str::<Vec<i64>>(text) {
            Ok(v) => {
                let mut u = v.clone();
                u.sort();
                u.dedup();
                u.len() == v.len()
            }
            Err(_) => false,
        };
        assert_eq!(nx["validation"][i]["index"], i, "{nx}");
        assert_eq!(nx["validation"][i]["valid"], want, "{text}: {nx}");
    }
    // streamed: each choice's last chunk carries its check
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let r = app
        .clone()
        .oneshot(post("/v1/chat/completions", &sbody))
        .await
        .unwrap();
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    let evs = events(std::str::from_utf8(&bytes).unwrap());
    let mut checks = 0;
    for e in &evs[..evs.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        if let Some(a) = v["nextok"]["validation"].as_array() {
            assert!(!v["choices"][0]["finish_reason"].is_null());
            assert!(a[0]["valid"].is_boolean());
            checks += 1;
        }
    }
    assert_eq!(checks, 2);
}

#[tokio::test]
async fn the_page_and_its_assets_are_served_same_origin() {
    let Some((app, _)) = app() else { return };
    let get = |p: &str| Request::get(p).body(Body::empty()).unwrap();
    let (status, headers, body) = call(&app, get("/")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'self'") && csp.contains("connect-src 'self'"));
    let html = body.as_str().unwrap();
    // every asset the page names is served, and none is fetched from elsewhere
    for asset in ["/assets/ledger.css", "/assets/ledger.js"] {
        assert!(html.contains(asset), "{asset}");
    }
    assert!(!html.contains("http://") && !html.contains("https://"));
    for (asset, ty) in [
        ("/assets/ledger.css", "text/css"),
        ("/assets/ledger.js", "text/javascript"),
        ("/assets/util.js", "text/javascript"),
    ] {
        let (status, headers, body) = call(&app, get(asset)).await;
        assert_eq!(status, StatusCode::OK, "{asset}");
        assert!(headers["content-type"].to_str().unwrap().starts_with(ty));
        let text = body.as_str().unwrap();
        assert!(!text.contains("https://"), "{asset} names another origin");
    }
    let (status, _, out) = call(&app, get("/assets/nope.js")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(out["error"]["type"], "not_found_error");
}

fn tree() -> Value {
    json!([
        {"token": "A", "p": 0.6, "children": [{"token": "x", "p": 0.51}, {"token": "y", "p": 0.49}]},
        {"token": "B", "p": 0.4, "children": [{"token": "x", "p": 0.99}, {"token": "y", "p": 0.01}]}
    ])
}

#[tokio::test]
async fn explain_beam_on_002s_tree() {
    let Some((app, _)) = app() else { return };
    for (width, path, p, rows) in [(1, ["A", "x"], 0.306, 4), (2, ["B", "x"], 0.396, 6)] {
        let (status, _, out) = call(
            &app,
            post("/v1/explain/beam", &json!({"tree": tree(), "width": width})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{out}");
        assert_eq!(out["best"][0]["path"], json!(path));
        // the tree's logits are f32
        assert!((out["best"][0]["joint_prob"].as_f64().unwrap() - p).abs() < 1e-6);
        assert_eq!(out["steps"].as_array().unwrap().len(), rows);
        let kept = out["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["kept"] == json!(true) && r["depth"] == json!(2))
            .count();
        assert_eq!(kept, width);
    }
    for (body, param) in [
        (json!({"tree": tree(), "width": 0}), "width"),
        (json!({"tree": tree(), "width": "two"}), "width"),
        (json!({"tree": tree()}), ""),
        (
            json!({"tree": [{"token": "A", "p": 2.0}], "width": 1}),
            "tree[0].p",
        ),
        (json!({"tree": tree(), "width": 1, "extra": 1}), ""),
    ] {
        let (status, _, out) = call(&app, post("/v1/explain/beam", &body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {out}");
        assert_eq!(out["error"]["type"], "invalid_request_error");
        if !param.is_empty() {
            assert_eq!(out["error"]["param"], param, "{body}: {out}");
        }
    }
}

fn streams(ownership: &str, order: &str, pause: Option<usize>, on_resume: &str) -> Value {
    let mut v = json!({
        "tokens": ["x", "y", "z"],
        "requests": [
            {"name": "A", "probs": [0.2, 0.3, 0.5], "u": [0.12, 0.66, 0.23], "seed": 1},
            {"name": "B", "probs": [0.5, 0.25, 0.25], "u": [0.87, 0.49, 0.72], "seed": 2},
            {"name": "C", "probs": [0.1, 0.2, 0.7], "u": [0.34, 0.91, 0.05], "seed": 3}
        ],
        "global_u": [0.12, 0.87, 0.34, 0.66, 0.49, 0.91, 0.23, 0.72, 0.05],
        "draws": 3,
        "orders": [order.chars().map(|c| c.to_string()).collect::<Vec<_>>()],
        "ownership": ownership,
        "on_resume": on_resume
    });
    if let Some(after) = pause {
        v["pause"] = json!({"request": "B", "after": after});
    }
    v
}

fn outputs(out: &Value) -> Vec<(String, String)> {
    out["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let toks: Vec<&str> = o[1]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap_or("-"))
                .collect();
            (o[0].as_str().unwrap().to_string(), toks.join(" "))
        })
        .collect()
}

#[tokio::test]
async fn explain_streams_on_002s_requests() {
    let Some((app, _)) = app() else { return };
    let want: Vec<(String, String)> = [("A", "x z y"), ("B", "z x y"), ("C", "z z x")]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    // the vector's per-request draws, whatever the order
    let vec: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../testdata/vectors/002_random_streams.json"
        ))
        .unwrap(),
    )
    .unwrap();
    assert!(vec["source"]
        .as_str()
        .unwrap()
        .contains("A → x z y, B → z x y, C → z z x"));
    for order in ["ABC", "CBA", "BCA"] {
        let (status, _, out) = call(
            &app,
            post(
                "/v1/explain/streams",
                &streams("request", order, Some(1), "resume"),
            ),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{out}");
        assert_eq!(outputs(&out), want, "{order}");
    }
    // the global list: 002's draws in A-B-C order only
    let (_, _, abc) = call(
        &app,
        post(
            "/v1/explain/streams",
            &streams("global", "ABC", None, "resume"),
        ),
    )
    .await;
    assert_eq!(outputs(&abc), want);
    let (_, _, cba) = call(
        &app,
        post(
            "/v1/explain/streams",
            &streams("global", "CBA", None, "resume"),
        ),
    )
    .await;
    assert_ne!(outputs(&cba), want);
    assert_eq!(cba["draws"][0]["request"], "C");
    assert_eq!(cba["draws"][0]["u"], 0.12);
    // Philox: the same whatever the order
    let (_, _, p1) = call(
        &app,
        post(
            "/v1/explain/streams",
            &streams("philox", "ABC", None, "resume"),
        ),
    )
    .await;
    let (_, _, p2) = call(
        &app,
        post(
            "/v1/explain/streams",
            &streams("philox", "CAB", Some(2), "resume"),
        ),
    )
    .await;
    assert_eq!(outputs(&p1), outputs(&p2));
    // typed errors name the field
    let mut bad = streams("request", "ABC", None, "resume");
    bad["orders"] = json!([["A", "B", "D"]]);
    let (status, _, out) = call(&app, post("/v1/explain/streams", &bad)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(out["error"]["param"], "orders[0][2]");
    let mut bad = streams("request", "ABC", None, "resume");
    bad["ownership"] = json!("nobody");
    let (status, _, out) = call(&app, post("/v1/explain/streams", &bad)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(out["error"]["param"], "ownership");
}

#[tokio::test]
async fn the_model_step_follows_an_accepted_prefix_of_ids() {
    let Some((app, _)) = app() else { return };
    let body = json!({"prompt": "The capital of France is", "temperature": 0});
    let (status, _, first) = call(&app, post("/v1/explain", &body)).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let mut ids: Vec<u64> = first["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(ids.len() as u64, first["prompt_tokens"].as_u64().unwrap());
    ids.push(first["selected"].as_u64().unwrap());
    let (status, _, next) = call(
        &app,
        post("/v1/explain", &json!({"prompt": ids, "temperature": 0})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{next}");
    assert_eq!(next["prompt_ids"], json!(ids));
    assert_eq!(next["record"]["selected"], next["selected"]);
}

#[tokio::test]
async fn the_model_step_after_accepted_tokens_is_the_generations_step() {
    let Some((app, engine)) = app() else { return };
    for constraint in [None, Some(json!({"choice": ["Paris is lovely", "Lyon"]}))] {
        // the engine's own generation: four tokens
        let mut req = GenerateRequest::new(Prompt::Text("The capital of France is".into()));
        req.params.temperature = Some(0.7);
        req.params.top_p = Some(0.9);
        req.params.seed = Some(3);
        req.params.max_tokens = Some(4);
        if let Some(c) = &constraint {
            req.params.constraint = Some(nextok_engine::ConstraintSpec::Choice {
                choices: serde_json::from_value(c["choice"].clone()).unwrap(),
            });
        }
        let e = engine.clone();
        let want = tokio::task::spawn_blocking(move || e.generate(req).unwrap())
            .await
            .unwrap();
        let toks = want.sequences[0].tokens.clone();
        assert!(toks.len() >= 2, "{toks:?}");
        for k in 0..toks.len() {
            let mut body = json!({"prompt": "The capital of France is", "temperature": 0.7,
                "top_p": 0.9, "seed": 3, "accepted": &toks[..k]});
            if let Some(c) = &constraint {
                body["structured_outputs"] = c.clone();
            }
            let (status, _, out) = call(&app, post("/v1/explain", &body)).await;
            assert_eq!(status, StatusCode::OK, "{out}");
            assert_eq!(out["selected"], json!(toks[k]), "step {k} of {toks:?}");
            assert_eq!(out["record"]["step"], json!(k));
            assert_eq!(out["accepted"], json!(&toks[..k]));
        }
    }
    // a token the constraint refuses, and a token after the end, are named
    let body = json!({"prompt": "x", "structured_outputs": {"choice": ["Paris"]},
        "accepted": [2]});
    let (status, _, out) = call(&app, post("/v1/explain", &body)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
    assert_eq!(out["error"]["param"], "accepted[0]");
    let body = json!({"prompt": "x", "accepted": "no"});
    let (status, _, out) = call(&app, post("/v1/explain", &body)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
    assert_eq!(out["error"]["param"], "accepted");
}

/// `/v1/explain/cases` answers every case as `/v1/explain` would, a case's failure included,
/// inside one 200 answer (the ledger page's designed failures are answers, not failed requests).
#[tokio::test]
async fn explain_cases_answer_each_case_as_explain_does() {
    let Some((app, _)) = app() else { return };
    let good: Value =
        serde_json::from_str(include_str!("../../../examples/hand_computation.json")).unwrap();
    let mut bad = good.clone();
    bad["params"]["temperature"] = json!(-1.0);
    let (status, _, one) = call(&app, post("/v1/explain", &good)).await;
    assert_eq!(status, StatusCode::OK);
    let (bad_status, _, bad_alone) = call(&app, post("/v1/explain", &bad)).await;
    assert_eq!(bad_status, StatusCode::BAD_REQUEST);
    let (status, _, v) = call(
        &app,
        post("/v1/explain/cases", &json!({"cases": [good, bad]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["cases"][0]["status"], 200);
    assert_eq!(v["cases"][0]["answer"], one);
    assert_eq!(v["cases"][1]["status"], 400);
    assert_eq!(v["cases"][1]["error"], bad_alone["error"]);
    // the call itself: a list of at most 16
    let many: Vec<Value> = (0..17).map(|_| json!({})).collect();
    let (status, _, v) = call(&app, post("/v1/explain/cases", &json!({"cases": many}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["param"], "cases");
}

/// A stream read chunk by chunk through the side channel: each chunk (a whole `data:` event or
/// several), and the side events received once it was read.
async fn side_stream(
    app: &Router,
    body: &Value,
) -> (Vec<Bytes>, Vec<Vec<nextok_server::SideEvent>>) {
    let (side, rx) = nextok_server::sidecar();
    let mut req = post("/v1/chat/completions", body);
    req.extensions_mut().insert(side);
    let r = app.clone().oneshot(req).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let mut body = r.into_body();
    let (mut chunks, mut sides) = (Vec::new(), Vec::new());
    // (the first events arrive with the head: they go with the first chunk)
    while let Some(f) = body.frame().await {
        let Ok(data) = f.unwrap().into_data() else {
            continue;
        };
        chunks.push(data);
        sides.push(rx.try_iter().collect());
    }
    (chunks, sides)
}

/// The answer's events, each choice's in order (choices may interleave differently after a
/// resume: sequences resumed at different lengths step together), with the usage chunk's
/// `cached_tokens` (which reports the serving engine's prefix cache) left out.
fn comparable(chunks: &[Bytes]) -> String {
    let text: String = chunks
        .iter()
        .map(|c| String::from_utf8(c.to_vec()).unwrap())
        .collect();
    let mut evs: Vec<(u64, String)> = events(&text)
        .into_iter()
        .map(|e| match serde_json::from_str::<Value>(&e) {
            Ok(mut v) => {
                if v.get("usage").is_some() {
                    v["usage"]["prompt_tokens_details"] = Value::Null;
                }
                let choice = v["choices"][0]["index"].as_u64().unwrap_or(u64::MAX - 1);
                (choice, v.to_string())
            }
            _ => (u64::MAX, e),
        })
        .collect();
    evs.sort_by_key(|e| e.0);
    evs.into_iter().map(|e| e.1).collect::<Vec<_>>().join("\n")
}

type Bytes = axum::body::Bytes;

#[tokio::test]
async fn a_stream_cut_anywhere_resumes_to_the_same_bytes() {
    use nextok_server::SideEvent;
    let Some((app, _)) = app() else { return };
    // no seed: the answer's own seed travels on the side channel
    let body = json!({"model": MODEL_ID,
        "messages": [{"role": "user", "content": "Write two short sentences about the sea."}],
        "max_tokens": 40, "temperature": 0.8, "n": 2, "logprobs": true, "top_logprobs": 2,
        "stop": [". "], "stream": true, "stream_options": {"include_usage": true}});
    let (chunks, sides) = side_stream(&app, &body).await;
    let (id, created, seed, n) = match sides[0].first() {
        Some(SideEvent::Started {
            id,
            created,
            seed,
            n,
            ..
        }) => (id.clone(), *created, *seed, *n),
        other => panic!("the first side event is {other:?}"),
    };
    assert_eq!(n, 2);
    let full = comparable(&chunks);
    assert!(full.ends_with("[DONE]"));
    // cut after every third chunk, and after the last but the end
    let cuts: Vec<usize> = (1..chunks.len() - 1).step_by(3).collect();
    assert!(cuts.len() >= 4, "a stream of {} chunks", chunks.len());
    for cut in cuts {
        let mut tokens = vec![Vec::new(); n];
        let mut finished = Vec::new();
        for e in sides[..cut].iter().flatten() {
            match e {
                SideEvent::Token { seq, id } => tokens[*seq].push(*id),
                SideEvent::Finished { seq } => finished.push(*seq),
                SideEvent::Started { .. } => {}
            }
        }
        let mut rb = body.clone();
        rb["seed"] = json!(seed);
        rb["nextok"] = json!({"resume": {"tokens": tokens, "id": id, "created": created,
            "finished": finished}});
        let (rest, _) = side_stream(&app, &rb).await;
        let mut got = chunks[..cut].to_vec();
        got.extend(rest);
        assert_eq!(comparable(&got), full, "cut after chunk {cut}");
    }
    // a resumed token the sequence could not have produced names its place
    let mut rb = body.clone();
    rb["seed"] = json!(seed);
    rb["nextok"] = json!({"resume": {"tokens": [[1, 2], [u32::MAX]]}});
    let (status, _, out) = call(&app, post("/v1/chat/completions", &rb)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
    assert_eq!(out["error"]["param"], "nextok.resume.tokens[1][0]", "{out}");
    // without the seed it is refused, naming it
    let mut rb = body.clone();
    rb["nextok"] = json!({"resume": {"tokens": [[], []]}});
    let (status, _, out) = call(&app, post("/v1/chat/completions", &rb)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
    assert_eq!(out["error"]["param"], "seed", "{out}");
}
