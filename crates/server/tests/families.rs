//! The server on every supported family: the tiny seeded model of each (llama, qwen2, qwen3,
//! gemma3, phi3) carrying its family's real tokenizer, driven through the router in process.
//! `/v1/explain` — what the page's real-model section calls — answers a text prompt with the
//! engine's own next token, and `/v1/completions` answers with the engine's tokens and a
//! trace that replays bit for bit.

#[path = "../../model/tests/common/mod.rs"]
mod common;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use nextok_engine::{Engine, EngineConfig, GenerateRequest, Prompt};
use nextok_model::{Model, Requant};
use nextok_server::ServerConfig;
use serde_json::{json, Value};
use tower::ServiceExt;

async fn call(app: &Router, req: Request<Body>) -> (StatusCode, Value) {
    let r = app.clone().oneshot(req).await.unwrap();
    let status = r.status();
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, v)
}

fn post(path: &str, body: &Value) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_family_explains_completes_and_traces_through_the_server() {
    let Some(tinies) = common::tiny::Tiny::all_with_real_vocab() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("nextok-server-families-{}", std::process::id()));
    const PROMPT: &str = " The capital of France is";
    for tiny in tinies {
        let name = tiny.arch.name();
        let path = tiny.write_to(&dir, &tiny.tensors(common::tiny::SEED));
        let model = Arc::new(Model::load(&path, Requant::Keep).expect("tiny model loads"));
        std::fs::remove_file(&path).unwrap();
        let engine = Arc::new(Engine::new(model, EngineConfig::default()).unwrap());
        let app = nextok_server::router(
            engine.clone(),
            ServerConfig {
                model_id: name.into(),
                ..Default::default()
            },
        );

        // the page's real-model section: the model's next step after a text prompt
        let body = json!({"prompt": PROMPT, "temperature": 0});
        let (status, out) = call(&app, post("/v1/explain", &body)).await;
        assert_eq!(status, StatusCode::OK, "{name}: {out}");
        let mut req = GenerateRequest::new(Prompt::Text(PROMPT.into()));
        req.params.temperature = Some(0.0);
        req.params.max_tokens = Some(6);
        req.params.ignore_eos = true;
        let e = engine.clone();
        let want = tokio::task::spawn_blocking(move || e.generate(req).unwrap())
            .await
            .unwrap();
        assert_eq!(
            out["selected"].as_u64().unwrap(),
            u64::from(want.sequences[0].tokens[0]),
            "{name}: explain"
        );
        assert!(out["tokens"].as_array().unwrap().len() > 1, "{name}: {out}");

        // a completion: the engine's tokens, and a trace that replays
        let body = json!({"prompt": PROMPT, "max_tokens": 6, "temperature": 0,
            "ignore_eos": true, "nextok": {"trace": true}});
        let (status, out) = call(&app, post("/v1/completions", &body)).await;
        assert_eq!(status, StatusCode::OK, "{name}: {out}");
        assert_eq!(out["usage"]["completion_tokens"], 6, "{name}: {out}");
        let id = out["nextok"]["trace_id"].as_str().expect("a trace id");
        let (status, text) = call(
            &app,
            Request::get(format!("/v1/traces/{id}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{name}");
        let (header, recorded) = nextok_engine::trace::parse(text.as_str().unwrap()).unwrap();
        assert_eq!(header.prompt_ids, want.info.prompt_ids, "{name}");
        let replay = nextok_engine::trace::replay_request(&header).unwrap();
        let e = engine.clone();
        let run = tokio::task::spawn_blocking(move || e.generate(replay).unwrap())
            .await
            .unwrap();
        assert_eq!(run.sequences[0].tokens, want.sequences[0].tokens, "{name}");
        assert_eq!(
            nextok_engine::trace::compare(&header, &engine.numerics(), &recorded, &run),
            Ok(6),
            "{name}: replay"
        );
        eprintln!("{name}: explain, completion and trace replay through the server");
    }
}
