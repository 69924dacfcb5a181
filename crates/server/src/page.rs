//! The decoding ledger page (002's interactive page, computed by nextok): `GET /` serves it,
//! `GET /assets/{file}` its stylesheet and script modules, all embedded in the binary (plain
//! HTML, CSS and JavaScript modules under `crates/server/assets/`, no build step), with a
//! content security policy that allows no other origin. Every number on the page comes from
//! the server:
//!
//! * `POST /v1/explain/cases` — the six-token ledger and the constraint cases: step requests
//!   (`/v1/explain`'s), each answered with `/v1/explain`'s status and body, the step's typed
//!   failure included, inside one 200 answer ([`cases`]): a designed failure such as top-k before
//!   the grammar mask is an answer the page renders, not a failed request the browser logs;
//! * `POST /v1/explain` — the model's next step;
//! * `POST /v1/explain/beam` — beam search on a probability tree
//!   ([`nextok_engine::teaching::beam_tree`]);
//! * `POST /v1/explain/streams` — 002's random-stream scheduling and nextok's Philox streams
//!   ([`nextok_engine::teaching::schedule_streams`]).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{json_body, ApiError, AppState};

/// The page's files: (name, content type, text).
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "ledger.css",
        "text/css; charset=utf-8",
        include_str!("../assets/ledger.css"),
    ),
    (
        "ledger.js",
        "text/javascript; charset=utf-8",
        include_str!("../assets/ledger.js"),
    ),
    (
        "util.js",
        "text/javascript; charset=utf-8",
        include_str!("../assets/util.js"),
    ),
];

const INDEX: &str = include_str!("../assets/index.html");

/// Only this origin: no network request leaves the server the page came from.
const CSP: &str = "default-src 'self'; img-src 'self' data:; style-src 'self'; \
                   script-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'";

fn page_headers(content_type: &'static str) -> [(header::HeaderName, &'static str); 3] {
    [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::CACHE_CONTROL, "no-cache"),
    ]
}

/// `GET /`.
pub(crate) async fn index() -> Response {
    (page_headers("text/html; charset=utf-8"), INDEX).into_response()
}

/// `GET /assets/{file}`.
pub(crate) async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, _, _)| *name == file) {
        Some((_, ty, text)) => (page_headers(ty), *text).into_response(),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!("no asset `{file}`"),
        )
        .into_response(),
    }
}

/// The body as `T`; a field that does not fit is named (`param`).
fn typed_body<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let v: Value = json_body(body)?;
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let msg = e.inner().to_string();
        if path == "." {
            ApiError::bad_body(msg)
        } else {
            ApiError::invalid(path, msg)
        }
    })
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> nextok_engine::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| ApiError::from_engine(&e, |f| f.to_string()))
}

/// At most this many cases in one `/v1/explain/cases` call.
pub const MAX_CASES: usize = 16;

/// The body of `/v1/explain/cases`: step requests, as `/v1/explain` takes them.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CasesRequest {
    cases: Vec<Value>,
}

/// `POST /v1/explain/cases` `{"cases": [step request…]}` → `{"cases": [{"status": 200,
/// "answer": {…}} | {"status": 400, "error": {…}}…]}`: each case is what `/v1/explain` answers
/// for that step request alone (the same engine call, the same error with its status), in order.
/// The call itself fails only when its body is not such a list (400) or has more than
/// [`MAX_CASES`] cases.
pub async fn cases(body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req: CasesRequest = typed_body(body)?;
    if req.cases.len() > MAX_CASES {
        return Err(ApiError::invalid(
            "cases",
            format!("{} cases; at most {MAX_CASES}", req.cases.len()),
        ));
    }
    let answers = tokio::task::spawn_blocking(move || {
        req.cases
            .into_iter()
            .map(|case| {
                match nextok_engine::explain::explain_json(&case.to_string())
                    .map_err(|e| crate::explain_error(&e, |f| f.to_string()))
                    .and_then(|out| {
                        // through its text, so that every number reads as `/v1/explain` writes
                        // it (an `f32` as its shortest digits, not widened to `f64`)
                        serde_json::to_string(&out)
                            .and_then(|t| serde_json::from_str::<Value>(&t))
                            .map_err(|e| ApiError::internal(e.to_string()))
                    }) {
                    Ok(answer) => serde_json::json!({"status": 200, "answer": answer}),
                    Err(e) => {
                        let mut v = e.body();
                        v["status"] = e.status.as_u16().into();
                        v
                    }
                }
            })
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(Json(serde_json::json!({ "cases": answers })).into_response())
}

/// `POST /v1/explain/beam`.
pub(crate) async fn beam(
    State(_s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: nextok_engine::teaching::BeamTreeRequest = typed_body(body)?;
    let out = blocking(move || nextok_engine::teaching::beam_tree(&req)).await?;
    Ok(Json(out).into_response())
}

/// `POST /v1/explain/streams`.
pub(crate) async fn streams(
    State(_s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: nextok_engine::teaching::StreamScheduleRequest = typed_body(body)?;
    let out = blocking(move || nextok_engine::teaching::schedule_streams(&req)).await?;
    Ok(Json(out).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cases of 002's shared vector, in order.
    fn vector_002() -> Vec<Value> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../testdata/vectors/002_constrained.json"
        );
        let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        v["cases"].as_array().unwrap().clone()
    }

    async fn call(body: Value) -> (StatusCode, Value) {
        let r = match cases(Ok(Bytes::from(body.to_string()))).await {
            Ok(r) => r,
            Err(e) => e.into_response(),
        };
        let status = r.status();
        let bytes = axum::body::to_bytes(r.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn a_designed_failure_is_an_answer_not_a_failed_call() {
        let vec = vector_002();
        let reqs: Vec<Value> = vec.iter().map(|c| c["request"].clone()).collect();
        let (status, out) = call(serde_json::json!({ "cases": reqs })).await;
        assert_eq!(status, StatusCode::OK, "{out}");
        let answers = out["cases"].as_array().unwrap();
        assert_eq!(answers.len(), vec.len());
        for (c, a) in vec.iter().zip(answers) {
            let want = &c["expect"];
            if let Some(err) = want.get("error") {
                // /v1/explain's own error: status, code and field of the engine's failure
                assert_eq!(a["status"], 400, "{a}");
                assert_eq!(a["error"]["code"], err["code"], "{a}");
                assert_eq!(a["error"]["param"], err["field"], "{a}");
                assert_eq!(a["error"]["type"], "invalid_request_error", "{a}");
                assert!(a.get("answer").is_none(), "{a}");
            } else {
                assert_eq!(a["status"], 200, "{a}");
                assert_eq!(a["answer"]["selected_token"], want["selected"], "{a}");
            }
        }
    }

    #[tokio::test]
    async fn a_body_that_is_not_a_list_of_cases_fails() {
        let (status, out) = call(serde_json::json!({ "case": [] })).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
        let (status, out) = call(serde_json::json!({ "cases": {} })).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
        assert_eq!(out["error"]["param"], "cases", "{out}");
        let one = vector_002()[0]["request"].clone();
        let (status, out) = call(serde_json::json!({ "cases": vec![one; MAX_CASES + 1] })).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
        assert_eq!(out["error"]["param"], "cases", "{out}");
        let (status, out) = call(serde_json::json!({ "cases": [] })).await;
        assert_eq!(status, StatusCode::OK, "{out}");
        assert_eq!(out["cases"], serde_json::json!([]));
    }
}
