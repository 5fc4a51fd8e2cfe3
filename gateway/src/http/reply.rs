//! Refusals as JSON (`{"error": code, "message": text}` plus details), and reading a request
//! body under the size limit.

use axum::Json;
use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::access::Denied;
use crate::app::CallError;
use crate::store::StoreError;

/// A JSON error reply: `{"error": code, "message": text}` plus details.
pub fn error(
    status: StatusCode,
    code: &str,
    message: impl Into<String>,
    details: Option<Value>,
) -> Response {
    let mut body = json!({"error": code, "message": message.into()});
    if let (Some(d), Some(obj)) = (details, body.as_object_mut()) {
        obj.insert("details".into(), d);
    }
    (status, Json(body)).into_response()
}

pub fn store_error(e: &StoreError) -> Response {
    match e {
        StoreError::Unavailable(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "storage_unavailable",
            format!("{e}; nothing was accepted, retry later"),
            None,
        ),
        StoreError::Rejected(_) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "storage_error",
            e.to_string(),
            None,
        ),
    }
}

pub fn call_error(e: &CallError) -> Response {
    match e {
        CallError::UnknownTool { .. } => {
            error(StatusCode::NOT_FOUND, "unknown_tool", e.to_string(), None)
        }
        CallError::Arguments { errors, .. } => error(
            StatusCode::BAD_REQUEST,
            "invalid_arguments",
            e.to_string(),
            Some(json!(
                errors
                    .iter()
                    .map(|a| json!({"field": a.field, "value": a.value, "rule": a.rule}))
                    .collect::<Vec<_>>()
            )),
        ),
        CallError::Denied(d) => denied(d),
        CallError::Storage(s) => store_error(s),
        CallError::Send { source, .. } => error(
            if source.is_permanent() {
                StatusCode::BAD_GATEWAY
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            },
            "send_failed",
            e.to_string(),
            None,
        ),
    }
}

/// An access refusal (`crate::access`): 404 where an envelope must not be told apart from an
/// unknown one, else 403; the message names the rule.
pub fn denied(d: &Denied) -> Response {
    let status = if d.is_hidden() {
        StatusCode::NOT_FOUND
    } else {
        StatusCode::FORBIDDEN
    };
    error(status, d.code(), d.to_string(), None)
}

pub fn not_found(id: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "unknown_envelope",
        format!("no envelope with id {id:?}"),
        None,
    )
}

/// A fan-out child whose parent the reporter may not record it under: 404, the same for an
/// unknown parent and one of another namespace.
pub fn unknown_parent(e: &crate::access::UnknownParent) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "unknown_parent",
        e.to_string(),
        Some(json!({"parent_id": e.parent})),
    )
}

pub fn too_large(n: usize, max: usize) -> Response {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        format!("request body of {n} bytes exceeds the limit of {max} bytes (--max-body-bytes)"),
        None,
    )
}

/// Reads the body, turning the size limit into a 413.
async fn read_body(body: Body, max: usize) -> Result<Bytes, Box<Response>> {
    axum::body::to_bytes(body, max)
        .await
        .map_err(|_| Box::new(too_large(max + 1, max)))
}

/// Reads a JSON body into `T` under the size limit; a bad body is a 400 that names the field
/// and the problem.
pub async fn json_body<T: serde::de::DeserializeOwned>(
    body: Body,
    max: usize,
) -> Result<T, Box<Response>> {
    let bytes = read_body(body, max).await?;
    serde_json::from_slice(&bytes).map_err(|e| {
        Box::new(error(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            format!("request body: {e}"),
            None,
        ))
    })
}
