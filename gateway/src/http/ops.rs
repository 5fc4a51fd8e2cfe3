//! For probes and Prometheus: `/health` and `/metrics`, open to anyone who reaches the port.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use super::Server;

pub fn router(server: Arc<Server>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(server)
}

async fn health(State(s): State<Arc<Server>>) -> Response {
    let storage = s.app.store.ping().await;
    let body = json!({
        "status": if storage.is_ok() { "ok" } else { "degraded" },
        "storage": s.app.store.kind(),
        "storage_error": storage.as_ref().err().map(|e| e.to_string()),
        "transports": s.app.senders.configured(),
        "tools": s.app.tools().tools.len(),
    });
    let code = if storage.is_ok() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(body)).into_response()
}

async fn metrics(State(s): State<Arc<Server>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.app.metrics.encode(),
    )
        .into_response()
}
