//! The HTTP/1.1 contract over the Unix socket: routes, headers and status codes. Keys are
//! taken from the raw path (decoded and checked by `keys`), not from axum's extractors, so
//! that what is decoded and refused is decided in one place.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};

use crate::error::ProxyError;
use crate::keys;
use crate::metrics::Metrics;
use crate::scope::Scope;
use crate::store::Store;

pub struct App {
    pub store: Store,
    /// Checks keys here, before the store; the store puts them under the same scope.
    pub scope: Scope,
    pub metrics: Arc<Metrics>,
}

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/keys/", get(list))
        .route("/keys/{*key}", any(keys_op))
        .route("/meta/{*key}", any(meta_op))
        .with_state(app)
}

async fn healthz() -> Response {
    axum::Json(serde_json::json!({"status": "ready"})).into_response()
}

/// The decoded, checked (mount-relative) key of `/keys/{key}` or `/meta/{key}`.
fn key_of(uri: &Uri, route: &str, scope: &Scope) -> Result<String, ProxyError> {
    let raw = uri.path().strip_prefix(route).unwrap_or_default();
    let key = keys::percent_decode("key", raw)?;
    scope.key(&key)?;
    Ok(key)
}

fn answer(app: &App, op: &str, started: Instant, r: Result<Response, ProxyError>) -> Response {
    let response = r.unwrap_or_else(|e| {
        if e.status().is_server_error() {
            tracing::warn!(op, error = %e, "request failed");
        }
        e.into_response()
    });
    app.metrics
        .observe(op, response.status().as_u16(), started.elapsed());
    response
}

async fn list(State(app): State<Arc<App>>, uri: Uri) -> Response {
    let started = Instant::now();
    let r = async {
        let q = keys::parse_list_query(uri.query())?;
        app.scope.list_prefix(&q.prefix)?;
        let listing = app.store.list(&q.prefix, q.delimiter.as_deref()).await?;
        Ok(axum::Json(listing).into_response())
    }
    .await;
    answer(&app, "list", started, r)
}

async fn keys_op(
    State(app): State<Arc<App>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let op = match method {
        Method::GET => "get",
        Method::PUT => "put",
        Method::HEAD => "head",
        Method::DELETE => "delete",
        _ => return StatusCode::METHOD_NOT_ALLOWED.into_response(),
    };
    let r = async {
        let key = key_of(&uri, "/keys/", &app.scope)?;
        match method {
            Method::GET => {
                let object = app.store.get(&key).await?;
                Ok((
                    [
                        (header::CONTENT_LENGTH, object.size.to_string()),
                        (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                    ],
                    object.body,
                )
                    .into_response())
            }
            Method::PUT => {
                let exclusive = headers
                    .get(header::IF_NONE_MATCH)
                    .is_some_and(|v| v.as_bytes() == b"*");
                let length = headers
                    .get(header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok());
                app.store.put(&key, body, exclusive, length).await?;
                Ok(axum::Json(serde_json::json!({"key": key})).into_response())
            }
            Method::HEAD => {
                let head = app.store.head(&key).await?;
                let mut resp = (
                    [
                        (header::CONTENT_LENGTH, head.size.to_string()),
                        (
                            header::HeaderName::from_static("x-is-file"),
                            head.is_file.to_string(),
                        ),
                    ],
                    Body::empty(),
                )
                    .into_response();
                if let Some(t) = head.modified
                    && let Ok(v) = header::HeaderValue::from_str(&httpdate::fmt_http_date(t))
                {
                    resp.headers_mut().insert(header::LAST_MODIFIED, v);
                }
                Ok(resp)
            }
            _ => {
                app.store.delete(&key).await?;
                Ok(StatusCode::NO_CONTENT.into_response())
            }
        }
    }
    .await;
    answer(&app, op, started, r)
}

async fn meta_op(State(app): State<Arc<App>>, method: Method, uri: Uri, body: Body) -> Response {
    let started = Instant::now();
    let op = match method {
        Method::GET => "meta_get",
        Method::PUT => "meta_put",
        _ => return StatusCode::METHOD_NOT_ALLOWED.into_response(),
    };
    let r = async {
        let key = key_of(&uri, "/meta/", &app.scope)?;
        let attr = keys::parse_attr(uri.query())?;
        if method == Method::GET {
            let meta = app.store.meta_get(&key, attr.as_deref()).await?;
            return Ok(axum::Json(meta).into_response());
        }
        let attr = attr.ok_or(ProxyError::BadRequest {
            field: "attr",
            value: String::new(),
            rule: "PUT /meta/{key} needs ?attr=NAME",
        })?;
        // An attribute value is small: 64 KiB, like a filesystem's xattr limit.
        let raw = crate::store::read_bounded(body, 64 * 1024, &key).await?;
        // The body is the value itself (docs/DESIGN.md §10, what the runtime's setxattr sends);
        // S3 metadata and Redis fields hold text.
        let value = String::from_utf8(raw.to_vec()).map_err(|e| ProxyError::BadRequest {
            field: "body",
            value: String::from_utf8_lossy(e.as_bytes())
                .chars()
                .take(80)
                .collect(),
            rule: "an attribute value must be UTF-8 text",
        })?;
        app.store.meta_put(&key, &attr, &value).await?;
        Ok(axum::Json(serde_json::json!({"key": key, "attr": attr})).into_response())
    }
    .await;
    answer(&app, op, started, r)
}
