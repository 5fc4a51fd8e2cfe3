//! For REST callers: the tools, starting a call, and following an envelope (as JSON or as a
//! server-sent event stream, [`super::sse`]).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::Server;
use super::reply::{call_error, denied, json_body, not_found, store_error};
use crate::access::{self, Principal};

pub fn router(server: Arc<Server>) -> Router {
    Router::new()
        .route("/tools/call", post(tools_call))
        .route("/tools", get(tools_list))
        .route("/envelopes/{id}", get(envelope))
        .route("/envelopes/{id}/stream", get(super::sse::stream))
        .with_state(server)
}

/// The tools this token may call.
async fn tools_list(
    State(s): State<Arc<Server>>,
    Extension(who): Extension<Principal>,
) -> Response {
    let tools: Vec<Value> = s
        .app
        .tools_for(&who)
        .iter()
        .map(|t| json!({"name": t.name, "description": t.description, "inputSchema": t.input_schema(), "route": t.route}))
        .collect();
    Json(json!({"tools": tools})).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CallBody {
    name: String,
    #[serde(default)]
    arguments: Option<Value>,
}

async fn tools_call(
    State(s): State<Arc<Server>>,
    Extension(who): Extension<Principal>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Response {
    let call: CallBody = match json_body(body, s.guard.max_body_bytes).await {
        Ok(c) => c,
        Err(r) => return *r,
    };
    let trace = crate::http::incoming_trace(&headers);
    match s
        .app
        .start_call(&who, &call.name, call.arguments.as_ref(), &trace)
        .await
    {
        Ok(started) => {
            let id = &started.record.id;
            (
                StatusCode::ACCEPTED,
                Json(json!({
                    "envelope_id": id,
                    "status": started.record.status,
                    "status_url": format!("/envelopes/{id}"),
                    "stream_url": format!("/envelopes/{id}/stream"),
                })),
            )
                .into_response()
        }
        Err(e) => call_error(&e),
    }
}

/// The envelope `id` if `who` may read it; else the same refusal as for an unknown id.
pub(super) async fn readable(
    s: &Server,
    who: &Principal,
    id: &str,
) -> Result<crate::store::Record, Box<Response>> {
    let unknown = || match access::may_read(who, id, None) {
        Err(d) if d.is_hidden() => denied(&d),
        _ => not_found(id),
    };
    let rec = match s.app.store.get(id).await {
        Ok(Some(r)) => r,
        Ok(None) => return Err(Box::new(unknown())),
        Err(e) => return Err(Box::new(store_error(&e))),
    };
    match access::may_read(who, id, rec.namespace.as_deref()) {
        Ok(()) => Ok(rec),
        Err(d) => {
            s.app.metrics.refused("access");
            Err(Box::new(denied(&d)))
        }
    }
}

/// The envelope with its fan-out children and its history.
async fn envelope(
    State(s): State<Arc<Server>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Response {
    let rec = match readable(&s, &who, &id).await {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let children = match s.app.store.children(&id).await {
        Ok(c) => c,
        Err(e) => return store_error(&e),
    };
    let history = match s.app.store.events(&id).await {
        Ok(h) => h,
        Err(e) => return store_error(&e),
    };
    let mut v = serde_json::to_value(&rec).unwrap_or(Value::Null);
    if let Some(o) = v.as_object_mut() {
        o.insert("children".into(), json!(children));
        o.insert("history".into(), json!(history));
    }
    Json(v).into_response()
}
