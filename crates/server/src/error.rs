//! Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`, with the HTTP
//! status that goes with them.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use nextok_engine::{EngineError, ErrorKind};
use serde_json::json;

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, `authentication_error`, ...).
    pub kind: &'static str,
    /// The request field at fault.
    pub param: Option<String>,
    /// A short machine-readable code.
    pub code: Option<&'static str>,
    /// Seconds for `Retry-After` (429, 503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// A 400 naming `param`.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.into()),
            code: None,
            retry_after: None,
        }
    }

    /// A 400 about the body as a whole (not JSON, not an object).
    pub fn bad_body(message: impl Into<String>) -> ApiError {
        ApiError {
            param: None,
            ..ApiError::invalid("", message)
        }
    }

    /// A 500 `server_error` (a task that failed or panicked, output that would not serialise).
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// An error with `status` and `kind`.
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// The same error with `code`.
    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }

    /// A request the resolver refused, its field renamed by `param` (the resolver names
    /// [`SamplingParams`](nextok_core::SamplingParams) fields; the request may have said it
    /// otherwise), message included.
    pub fn from_core(e: nextok_core::Error, param: impl Fn(&str) -> String) -> ApiError {
        let e = e.renamed(param);
        ApiError::invalid(e.field().unwrap_or_default().to_string(), e.to_string())
    }

    /// An engine error, its field renamed by `param` (the engine names
    /// [`SamplingParams`](nextok_core::SamplingParams) fields; the request may have said it
    /// otherwise).
    pub fn from_engine(e: &EngineError, param: impl Fn(&str) -> String) -> ApiError {
        let field = e.field().map(&param);
        let message = e.to_string();
        match e.kind() {
            ErrorKind::InvalidRequest | ErrorKind::Constraint => ApiError {
                param: field,
                ..ApiError::invalid("", message)
            },
            ErrorKind::TooLarge => {
                let code = match e.field() {
                    Some("n") => "too_many_sequences",
                    _ => "context_length_exceeded",
                };
                ApiError {
                    param: field,
                    ..ApiError::invalid("", message)
                }
                .with_code(code)
            }
            ErrorKind::QueueFull => ApiError {
                retry_after: Some(1),
                ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
            }
            .with_code("queue_full"),
            ErrorKind::Shutdown => ApiError {
                retry_after: Some(5),
                ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
            },
            _ => ApiError {
                param: field,
                ..ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
            },
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.param {
            Some(p) => write!(f, "{} ({p}): {}", self.status.as_u16(), self.message),
            None => write!(f, "{}: {}", self.status.as_u16(), self.message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}
