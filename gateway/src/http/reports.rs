//! For the sidecars: their reports (`asya_transport::report`) of progress, fan-out children
//! and final statuses. A report token reports only on envelopes of its own namespace
//! (`crate::access::may_report`); the guard has already refused client tokens.

use std::sync::Arc;

use asya_transport::report::{ChildReport, FinalReport};
use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};

use super::Server;
use super::reply::{denied, error, json_body, not_found, store_error, unknown_parent};
use crate::access::{self, Principal};
use crate::store::{Progress, Record, Status, now_ms};

pub fn router(server: Arc<Server>) -> Router {
    Router::new()
        .route("/envelopes", post(report_child))
        .route("/envelopes/{id}/progress", post(report_progress))
        .route("/envelopes/{id}/final", post(report_final))
        .with_state(server)
}

/// A sidecar tells of a fan-out child; idempotent.
async fn report_child(
    State(s): State<Arc<Server>>,
    Extension(who): Extension<Principal>,
    body: Body,
) -> Response {
    let c: ChildReport = match json_body(body, s.guard.max_body_bytes).await {
        Ok(c) => c,
        Err(r) => return *r,
    };
    if c.id.is_empty() || c.parent_id.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            "id and parent_id must not be empty",
            None,
        );
    }
    s.app.metrics.report("child");
    let route = c.route.map(|r| r.actors).unwrap_or_default();
    match create_child(&s, &who, &c.id, &c.parent_id, route).await {
        Ok(r) => (StatusCode::CREATED, Json(r)).into_response(),
        Err(r) => *r,
    }
}

/// Stores a fan-out child (idempotent), with its parent's tool and namespace. The parent must
/// be an envelope the gateway knows, of the reporter's namespace (an unknown parent and one
/// of another namespace get the same 404, `crate::access::child_namespace`), and a reporter
/// is refused an existing id of another namespace (a create leaves it unchanged, so the
/// check after it is exact).
async fn create_child(
    s: &Server,
    who: &Principal,
    id: &str,
    parent_id: &str,
    route: Vec<String>,
) -> Result<Record, Box<Response>> {
    let parent = s
        .app
        .store
        .get(parent_id)
        .await
        .map_err(|e| Box::new(store_error(&e)))?;
    let known = parent.as_ref().map(|p| p.namespace.as_deref());
    let namespace = access::child_namespace(who, parent_id, known).map_err(|e| {
        s.app.metrics.refused("access");
        Box::new(unknown_parent(&e))
    })?;
    let now = now_ms();
    let rec = Record {
        id: id.to_string(),
        parent_id: Some(parent_id.to_string()),
        tool: parent.and_then(|p| p.tool),
        status: Status::Running,
        progress: 0.0,
        actor: None,
        route,
        result: None,
        error: None,
        created_ms: now,
        updated_ms: now,
        namespace,
    };
    let stored = s
        .app
        .store
        .create(&rec)
        .await
        .map_err(|e| Box::new(store_error(&e)))?;
    access::may_report(who, id, stored.namespace.as_deref()).map_err(|d| refuse(s, &d))?;
    Ok(stored)
}

/// A report refused by `crate::access`, counted (`asya_gateway_requests_refused_total{kind="access"}`).
fn refuse(s: &Server, d: &access::Denied) -> Box<Response> {
    s.app.metrics.refused("access");
    Box::new(denied(d))
}

/// Refuses a report on envelope `id` from a reporter of another namespace. Unknown ids
/// pass (the report itself answers 404, or creates a child under its known parent); with
/// authentication off there is nothing to check, and no read.
async fn check_report(s: &Server, who: &Principal, id: &str) -> Result<(), Box<Response>> {
    if !matches!(who, Principal::Reporter { .. }) {
        return access::may_report(who, id, None).map_err(|d| refuse(s, &d));
    }
    match s.app.store.get(id).await {
        Ok(Some(r)) => {
            access::may_report(who, id, r.namespace.as_deref()).map_err(|d| refuse(s, &d))
        }
        Ok(None) => Ok(()),
        Err(e) => Err(Box::new(store_error(&e))),
    }
}

async fn report_progress(
    State(s): State<Arc<Server>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    body: Body,
) -> Response {
    let p: Progress = match json_body(body, s.guard.max_body_bytes).await {
        Ok(p) => p,
        Err(r) => return *r,
    };
    if p.phase().is_none() {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            format!(
                "phase: {:?}: must be received, processing or completed",
                p.phase
            ),
            None,
        );
    }
    if let Err(r) = check_report(&s, &who, &id).await {
        return *r;
    }
    s.app.metrics.report("progress");
    match s.app.store.progress(&id, &p).await {
        Ok(Some(r)) => return Json(r).into_response(),
        Ok(None) => {}
        Err(e) => return store_error(&e),
    }
    // A fan-out child's progress can overtake the report of its creation (they come from
    // different sidecars): create it from the parent now.
    let Some(parent_id) = p.parent_id.clone() else {
        return not_found(&id);
    };
    if let Err(r) = create_child(&s, &who, &id, &parent_id, Vec::new()).await {
        return *r;
    }
    match s.app.store.progress(&id, &p).await {
        Ok(Some(r)) => Json(r).into_response(),
        Ok(None) => not_found(&id),
        Err(e) => store_error(&e),
    }
}

async fn report_final(
    State(s): State<Arc<Server>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    body: Body,
) -> Response {
    let f: FinalReport = match json_body(body, s.guard.max_body_bytes).await {
        Ok(f) => f,
        Err(r) => return *r,
    };
    let Some(outcome) = f.outcome() else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            format!("status: {:?}: must be succeeded or failed", f.status),
            None,
        );
    };
    if let Err(r) = check_report(&s, &who, &id).await {
        return *r;
    }
    s.app.metrics.report("final");
    match s
        .app
        .finish(
            &id,
            Status::from(outcome),
            f.actor.as_deref(),
            f.result,
            f.error,
        )
        .await
    {
        Ok(Some(r)) => Json(r).into_response(),
        Ok(None) => not_found(&id),
        Err(e) => store_error(&e),
    }
}
