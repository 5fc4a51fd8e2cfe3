//! `/healthz`, `/readyz` and `/metrics` on the metrics address.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::Metrics;

pub struct Health {
    pub metrics: Arc<Metrics>,
    pub runtime_up: AtomicBool,
    pub stopping: AtomicBool,
    pub transport_up: Box<dyn Fn() -> bool + Send + Sync>,
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(h): State<Arc<Health>>) -> impl IntoResponse {
    let mut missing = Vec::new();
    if h.stopping.load(Ordering::SeqCst) {
        missing.push("shutting down");
    }
    if !(h.transport_up)() {
        missing.push("broker not connected");
    }
    if !h.runtime_up.load(Ordering::SeqCst) {
        missing.push("runtime not reachable");
    }
    if missing.is_empty() {
        (StatusCode::OK, "ready\n".to_string())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", missing.join(", ")),
        )
    }
}

async fn metrics(State(h): State<Arc<Health>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        h.metrics.encode(),
    )
}

pub fn router(h: Arc<Health>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(h)
}

/// Binds first (so a taken port fails the start), then serves in the background.
pub async fn serve(addr: SocketAddr, h: Arc<Health>) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router(h)).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });
    Ok(local)
}
