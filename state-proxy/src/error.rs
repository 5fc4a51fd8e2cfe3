//! The contract's error answers: `{"error": code, "message": ...}` with the status the
//! runtime maps to a Python exception (404 FileNotFoundError, 409/412 FileExistsError, 400
//! ValueError, 403 PermissionError, 413 OSError(EFBIG), 503 ConnectionError, 504
//! TimeoutError, other 5xx OSError).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProxyError {
    #[error("key {key:?} is refused: {rule}")]
    BadKey { key: String, rule: &'static str },
    #[error("{field} {value:?} is refused: {rule}")]
    BadRequest {
        field: &'static str,
        value: String,
        rule: &'static str,
    },
    #[error("body of key {key:?} did not arrive whole: {detail}")]
    BodyBroken { key: String, detail: String },
    #[error("key {0:?} does not exist")]
    NotFound(String),
    #[error("key {0:?} already exists (exclusive create)")]
    Exists(String),
    #[error("key {0:?} changed since this connector read it (compare-and-set lost); read it again")]
    Conflict(String),
    #[error("attribute {attr:?} of key {key:?} is read-only")]
    ReadOnly { key: String, attr: String },
    #[error("attribute {attr:?} of key {key:?} is not set")]
    NoAttr { key: String, attr: String },
    #[error("body of key {key:?} is over the {limit}-byte limit of this connector's buffered mode")]
    TooLarge { key: String, limit: u64 },
    #[error("the backend is unreachable: {0}")]
    Unavailable(String),
    #[error("the backend did not answer within {0} s")]
    Timeout(u64),
    #[error("the backend failed: {0}")]
    Backend(String),
}

impl ProxyError {
    /// The code of the JSON body; stable, for clients and logs.
    pub fn code(&self) -> &'static str {
        match self {
            ProxyError::BadKey { .. } => "bad_key",
            ProxyError::BadRequest { .. } => "bad_request",
            ProxyError::BodyBroken { .. } => "body_broken",
            ProxyError::NotFound(_) => "not_found",
            ProxyError::Exists(_) => "exists",
            ProxyError::Conflict(_) => "conflict",
            ProxyError::ReadOnly { .. } => "read_only",
            ProxyError::NoAttr { .. } => "no_attribute",
            ProxyError::TooLarge { .. } => "too_large",
            ProxyError::Unavailable(_) => "unavailable",
            ProxyError::Timeout(_) => "timeout",
            ProxyError::Backend(_) => "backend_error",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::BadKey { .. }
            | ProxyError::BadRequest { .. }
            | ProxyError::BodyBroken { .. } => StatusCode::BAD_REQUEST,
            // The runtime's getxattr maps 404 to FileNotFoundError; a missing attribute of an
            // existing key is ENODATA there, which it gives for 400.
            ProxyError::NoAttr { .. } => StatusCode::BAD_REQUEST,
            ProxyError::NotFound(_) => StatusCode::NOT_FOUND,
            ProxyError::Exists(_) => StatusCode::PRECONDITION_FAILED,
            ProxyError::Conflict(_) => StatusCode::CONFLICT,
            ProxyError::ReadOnly { .. } => StatusCode::FORBIDDEN,
            ProxyError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::Backend(_) => StatusCode::BAD_GATEWAY,
        }
    }
}

impl IntoResponse for ProxyError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": self.code(), "message": self.to_string()});
        (self.status(), Json(body)).into_response()
    }
}

/// What a backend's failure was, from what the client library tells: the decision of
/// [`classify`], kept apart from the libraries' error types so it can be tested.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The request never reached the server (connection refused, DNS, TLS).
    Unreachable,
    /// The call took longer than the connector's bound.
    TimedOut,
    /// The server answered with this HTTP status.
    Status(u16),
    /// Anything else (a body that broke mid-way, a malformed answer).
    Other,
}

/// The contract's error for a backend failure on `key`. 412 from a conditional write is
/// not decided here: which refusal it is depends on the condition sent (see `cas`).
pub fn classify(failure: Failure, key: &str, timeout_secs: u64, detail: &str) -> ProxyError {
    match failure {
        Failure::Unreachable => ProxyError::Unavailable(detail.to_string()),
        Failure::TimedOut => ProxyError::Timeout(timeout_secs),
        Failure::Status(404) => ProxyError::NotFound(key.to_string()),
        // S3 answers 409 ConditionalRequestConflict when two conditional writes race.
        Failure::Status(409) => ProxyError::Conflict(key.to_string()),
        Failure::Status(503) => ProxyError::Unavailable(detail.to_string()),
        Failure::Status(s) => ProxyError::Backend(format!("status {s}: {detail}")),
        Failure::Other => ProxyError::Backend(detail.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_contract() {
        let cases = [
            (ProxyError::NotFound("a".into()), 404),
            (ProxyError::Exists("a".into()), 412),
            (ProxyError::Conflict("a".into()), 409),
            (
                ProxyError::BadKey {
                    key: "a/../b".into(),
                    rule: "r",
                },
                400,
            ),
            (
                ProxyError::ReadOnly {
                    key: "a".into(),
                    attr: "size".into(),
                },
                403,
            ),
            (
                ProxyError::TooLarge {
                    key: "a".into(),
                    limit: 1,
                },
                413,
            ),
            (ProxyError::Unavailable("x".into()), 503),
            (ProxyError::Timeout(3), 504),
            (ProxyError::Backend("x".into()), 502),
        ];
        for (err, status) in cases {
            assert_eq!(err.status().as_u16(), status, "{err}");
        }
    }

    #[test]
    fn backend_failures_map_to_contract_errors() {
        assert_eq!(
            classify(Failure::Unreachable, "k", 30, "refused"),
            ProxyError::Unavailable("refused".into())
        );
        assert_eq!(
            classify(Failure::TimedOut, "k", 30, ""),
            ProxyError::Timeout(30)
        );
        assert_eq!(
            classify(Failure::Status(404), "k", 30, ""),
            ProxyError::NotFound("k".into())
        );
        assert_eq!(
            classify(Failure::Status(409), "k", 30, ""),
            ProxyError::Conflict("k".into())
        );
        assert_eq!(
            classify(Failure::Status(500), "k", 30, "boom").status(),
            502
        );
    }

    #[test]
    fn the_message_names_the_key_and_rule() {
        let e = ProxyError::BadKey {
            key: "a//b".into(),
            rule: "no empty segments",
        };
        assert!(e.to_string().contains("a//b") && e.to_string().contains("no empty segments"));
    }
}
