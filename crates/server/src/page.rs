//! The decoding ledger page (002's interactive page, computed by nextok): `GET /` serves it,
//! `GET /assets/{file}` its stylesheet and script modules, all embedded in the binary (plain
//! HTML, CSS and JavaScript modules under `crates/server/assets/`, no build step), with a
//! content security policy that allows no other origin. Every number on the page comes from
//! the server:
//!
//! * `POST /v1/explain` — the six-token ledger (step requests) and the model's next step;
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
