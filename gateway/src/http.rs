//! The HTTP surface: MCP at `/mcp`, REST with the original gateway's paths, the sidecar
//! report endpoints, `/health` and `/metrics`. Bearer-token auth, a per-client rate limit and
//! a body size limit sit in front of everything but `/health` and `/metrics`. Every refusal is
//! JSON naming what was wrong.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::Stream;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::app::{App, CallError};
use crate::store::{Progress, Record, Status, StoreError, now_ms};

/// Who may call, how often, how much.
pub struct Guard {
    /// `None`: authentication explicitly disabled (`--no-auth`).
    pub tokens: Option<HashSet<String>>,
    /// Requests per second per client, with a burst of `burst`; 0 disables the limit.
    pub rate: f64,
    pub burst: f64,
    pub max_body_bytes: usize,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl Guard {
    pub fn new(
        tokens: Option<HashSet<String>>,
        rate: f64,
        burst: f64,
        max_body_bytes: usize,
    ) -> Guard {
        Guard {
            tokens,
            rate,
            burst: burst.max(1.0),
            max_body_bytes,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one request from `client`'s bucket; `Err(wait)` when it is empty.
    fn take(&self, client: &str) -> Result<(), Duration> {
        if self.rate <= 0.0 {
            return Ok(());
        }
        let Ok(mut buckets) = self.buckets.lock() else {
            return Ok(());
        };
        let now = Instant::now();
        if buckets.len() > 100_000 {
            // Forget idle clients rather than grow without bound.
            buckets.retain(|_, (_, at)| now.duration_since(*at) < Duration::from_secs(60));
        }
        let (tokens, at) = buckets
            .entry(client.to_string())
            .or_insert((self.burst, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * self.rate).min(self.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - *tokens) / self.rate))
        }
    }
}

pub struct Server {
    pub app: Arc<App>,
    pub guard: Arc<Guard>,
}

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

fn store_error(e: &StoreError) -> Response {
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

/// Parses a JSON body into `T`; a bad body is a 400 that names the field and the problem.
fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, Box<Response>> {
    serde_json::from_slice(body).map_err(|e| {
        Box::new(error(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            format!("request body: {e}"),
            None,
        ))
    })
}

pub fn router(server: Arc<Server>, mcp: Router) -> Router {
    let guarded = Router::new()
        .route("/tools/call", post(tools_call))
        .route("/tools", get(tools_list))
        .route("/envelopes", post(report_child))
        .route("/envelopes/{id}", get(envelope))
        .route("/envelopes/{id}/stream", get(stream))
        .route("/envelopes/{id}/progress", post(report_progress))
        .route("/envelopes/{id}/final", post(report_final))
        .with_state(server.clone())
        .merge(mcp)
        .layer(middleware::from_fn_with_state(server.clone(), guard));
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(server)
        .merge(guarded)
}

fn bearer(req: &Request) -> Option<&str> {
    req.headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

/// Auth, then rate limit, then size limit. Sidecar reports are not rate limited: dropping
/// them would lose status.
async fn guard(State(s): State<Arc<Server>>, req: Request, next: Next) -> Response {
    let g = &s.guard;
    let client = match &g.tokens {
        Some(tokens) => match bearer(&req) {
            None => {
                s.app.metrics.refused("auth");
                return error(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "missing bearer token: send Authorization: Bearer <token>",
                    None,
                );
            }
            Some(t) if !tokens.contains(t) => {
                s.app.metrics.refused("auth");
                return error(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "bearer token not accepted",
                    None,
                );
            }
            Some(t) => format!("token:{}", fingerprint(t)),
        },
        None => req
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| format!("ip:{}", c.0.ip()))
            .unwrap_or_else(|| "anonymous".into()),
    };
    let path = req.uri().path();
    let is_report = req.method() == axum::http::Method::POST
        && (path == "/envelopes" || path.ends_with("/progress") || path.ends_with("/final"));
    if !is_report && let Err(wait) = g.take(&client) {
        s.app.metrics.refused("rate_limit");
        let mut r = error(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!(
                "more than {} requests per second (burst {}) from this client",
                g.rate, g.burst
            ),
            None,
        );
        if let Ok(v) = HeaderValue::from_str(&wait.as_secs().max(1).to_string()) {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return r;
    }
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if let Some(n) = declared
        && n > g.max_body_bytes
    {
        s.app.metrics.refused("too_large");
        return too_large(n, g.max_body_bytes);
    }
    // Bodies without a length are cut at the limit while they are read.
    let (parts, body) = req.into_parts();
    let limited = Body::new(http_body_util::Limited::new(body, g.max_body_bytes));
    next.run(Request::from_parts(parts, limited)).await
}

fn too_large(n: usize, max: usize) -> Response {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        format!("request body of {n} bytes exceeds the limit of {max} bytes (--max-body-bytes)"),
        None,
    )
}

/// A non-reversible short name for a token, for rate-limit buckets (tokens are never logged).
fn fingerprint(t: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    t.hash(&mut h);
    format!("{:016x}", h.finish())
}

/// Reads the body, turning the size limit into a 413.
async fn read_body(body: Body, max: usize) -> Result<Bytes, Box<Response>> {
    axum::body::to_bytes(body, max)
        .await
        .map_err(|_| Box::new(too_large(max + 1, max)))
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

async fn tools_list(State(s): State<Arc<Server>>) -> Response {
    let tools: Vec<Value> = s
        .app
        .tools()
        .tools
        .values()
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

async fn tools_call(State(s): State<Arc<Server>>, body: Body) -> Response {
    let bytes = match read_body(body, s.guard.max_body_bytes).await {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let call: CallBody = match parse(&bytes) {
        Ok(c) => c,
        Err(r) => return *r,
    };
    match s.app.start_call(&call.name, call.arguments.as_ref()).await {
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

fn not_found(id: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "unknown_envelope",
        format!("no envelope with id {id:?}"),
        None,
    )
}

async fn envelope(State(s): State<Arc<Server>>, Path(id): Path<String>) -> Response {
    let rec = match s.app.store.get(&id).await {
        Ok(Some(r)) => r,
        Ok(None) => return not_found(&id),
        Err(e) => return store_error(&e),
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

fn sse_event(kind: &str, r: &Record) -> SseEvent {
    SseEvent::default()
        .event(kind)
        .data(serde_json::to_string(r).unwrap_or_default())
}

/// Server-sent events: the current state, then each change, ending with the final status.
async fn stream(State(s): State<Arc<Server>>, Path(id): Path<String>) -> Response {
    let mut rx = s.app.store.subscribe();
    let first = match s.app.store.get(&id).await {
        Ok(Some(r)) => r,
        Ok(None) => return not_found(&id),
        Err(e) => return store_error(&e),
    };
    let app = s.app.clone();
    let events = async_stream(move |tx| async move {
        let kind = |r: &Record| {
            if r.status.is_final() {
                "final"
            } else {
                "progress"
            }
        };
        let done = first.status.is_final();
        if tx.send(sse_event(kind(&first), &first)).await.is_err() || done {
            return;
        }
        loop {
            match rx.recv().await {
                Ok(u) if u.record.id == id => {
                    let done = u.record.status.is_final();
                    if tx
                        .send(sse_event(kind(&u.record), &u.record))
                        .await
                        .is_err()
                        || done
                    {
                        return;
                    }
                }
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    if let Ok(Some(r)) = app.store.get(&id).await {
                        let done = r.status.is_final();
                        if tx.send(sse_event(kind(&r), &r)).await.is_err() || done {
                            return;
                        }
                    }
                }
                Err(_) => return,
            }
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// A stream fed by a task: `f` gets a sender and runs until it returns or the client leaves.
fn async_stream<F, Fut>(f: F) -> impl Stream<Item = Result<SseEvent, Infallible>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<SseEvent>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(f(tx));
    futures::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|e| (Ok(e), rx)) },
    )
}

#[derive(Deserialize)]
struct ChildBody {
    id: String,
    parent_id: String,
    #[serde(default)]
    route: Option<asya_transport::envelope::Route>,
}

/// A sidecar tells of a fan-out child; idempotent.
async fn report_child(State(s): State<Arc<Server>>, body: Body) -> Response {
    let bytes = match read_body(body, s.guard.max_body_bytes).await {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let c: ChildBody = match parse(&bytes) {
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
    match create_child(&s, &c.id, &c.parent_id, route).await {
        Ok(r) => (StatusCode::CREATED, Json(r)).into_response(),
        Err(r) => *r,
    }
}

/// Stores a fan-out child (idempotent), with its parent's tool.
async fn create_child(
    s: &Server,
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
    };
    s.app
        .store
        .create(&rec)
        .await
        .map_err(|e| Box::new(store_error(&e)))
}

async fn report_progress(
    State(s): State<Arc<Server>>,
    Path(id): Path<String>,
    body: Body,
) -> Response {
    let bytes = match read_body(body, s.guard.max_body_bytes).await {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let p: Progress = match parse(&bytes) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    if !matches!(p.phase.as_str(), "received" | "processing" | "completed") {
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
    if let Err(r) = create_child(&s, &id, &parent_id, Vec::new()).await {
        return *r;
    }
    match s.app.store.progress(&id, &p).await {
        Ok(Some(r)) => Json(r).into_response(),
        Ok(None) => not_found(&id),
        Err(e) => store_error(&e),
    }
}

#[derive(Deserialize)]
struct FinalBody {
    status: String,
    #[serde(default)]
    actor: Option<String>,
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
}

async fn report_final(
    State(s): State<Arc<Server>>,
    Path(id): Path<String>,
    body: Body,
) -> Response {
    let bytes = match read_body(body, s.guard.max_body_bytes).await {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let f: FinalBody = match parse(&bytes) {
        Ok(f) => f,
        Err(r) => return *r,
    };
    let status = match Status::parse(&f.status) {
        Some(st) if st.is_final() => st,
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_body",
                format!("status: {:?}: must be succeeded or failed", f.status),
                None,
            );
        }
    };
    s.app.metrics.report("final");
    match s
        .app
        .finish(&id, status, f.actor.as_deref(), f.result, f.error)
        .await
    {
        Ok(Some(r)) => Json(r).into_response(),
        Ok(None) => not_found(&id),
        Err(e) => store_error(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limit_refills() {
        let g = Guard::new(None, 1000.0, 2.0, 10);
        assert!(g.take("a").is_ok());
        assert!(g.take("a").is_ok());
        assert!(g.take("a").is_err(), "burst of 2 used up");
        assert!(g.take("b").is_ok(), "per client");
        let off = Guard::new(None, 0.0, 1.0, 10);
        assert!((0..100).all(|_| off.take("a").is_ok()));
    }
}
