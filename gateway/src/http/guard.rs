//! The layers in front of the guarded routers, in this order: bearer-token auth (which also
//! names the caller, a [`Principal`] in the request's extensions), the token kind the
//! router's audience takes (`crate::access`: client tokens for callers, report tokens for
//! reports), a rate limit and a bound on requests in flight per caller (each audience its
//! own: per client token, per report namespace), a body size limit.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::Response;
use serde_json::json;

use super::Server;
use super::limits::{InFlight, RateLimiter};
use super::reply::{denied, error, too_large};
use crate::access::{self, Credentials, Principal, Unauthenticated};

/// The guard's bounds (`asya-gateway serve` flags; 0 turns a bound off).
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Requests per second per client token (or address), with a burst.
    pub rate: f64,
    pub burst: f64,
    /// Reports per second per report namespace (all its sidecars together), with a burst.
    pub report_rate: f64,
    pub report_burst: f64,
    /// Requests in flight per client token; an open stream counts until it ends.
    pub client_in_flight: usize,
    /// Reports in flight per report namespace.
    pub report_in_flight: usize,
    pub max_body_bytes: usize,
}

impl Default for Limits {
    /// The defaults of `asya-gateway serve`.
    fn default() -> Limits {
        Limits {
            rate: 50.0,
            burst: 100.0,
            report_rate: 1000.0,
            report_burst: 2000.0,
            client_in_flight: 64,
            report_in_flight: 256,
            max_body_bytes: 1_048_576,
        }
    }
}

/// Who may call, how often, how much.
pub struct Guard {
    /// `None`: authentication explicitly disabled (`--no-auth`).
    pub tokens: Option<Credentials>,
    pub limits: Limits,
    pub max_body_bytes: usize,
    callers: RateLimiter,
    reporters: RateLimiter,
    callers_in_flight: InFlight,
    reporters_in_flight: InFlight,
}

/// Which router a layer stands in front of: each has its own limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Audience {
    Callers,
    Reporters,
}

impl Guard {
    pub fn new(tokens: Option<Credentials>, limits: Limits) -> Guard {
        Guard {
            tokens,
            max_body_bytes: limits.max_body_bytes,
            callers: RateLimiter::new(limits.rate, limits.burst),
            reporters: RateLimiter::new(limits.report_rate, limits.report_burst),
            callers_in_flight: InFlight::new(limits.client_in_flight),
            reporters_in_flight: InFlight::new(limits.report_in_flight),
            limits,
        }
    }

    fn rate(&self, a: Audience) -> &RateLimiter {
        match a {
            Audience::Callers => &self.callers,
            Audience::Reporters => &self.reporters,
        }
    }

    fn in_flight(&self, a: Audience) -> &InFlight {
        match a {
            Audience::Callers => &self.callers_in_flight,
            Audience::Reporters => &self.reporters_in_flight,
        }
    }

    /// Requests of a client token in flight now (tests, and what a stream holds).
    pub fn client_in_flight(&self, token: &str) -> usize {
        self.callers_in_flight
            .count(&format!("token:{}", fingerprint(token)))
    }
}

/// REST and MCP callers: auth, client tokens only, then the rate limit and the bound in
/// flight per client token, then the size limit.
pub fn for_callers(s: &Arc<Server>, r: Router) -> Router {
    // The last layer added runs first.
    r.layer(from_fn_with_state(s.clone(), limit_body))
        .layer(from_fn_with_state(s.clone(), callers_in_flight))
        .layer(from_fn_with_state(s.clone(), rate_limit_callers))
        .layer(from_fn_with_state(s.clone(), clients_only))
        .layer(from_fn_with_state(s.clone(), authenticate))
}

/// Sidecar reports: auth, report tokens only, then the rate limit and the bound in flight
/// per report namespace (its sidecars together: one namespace cannot take the gateway from
/// the others; a sidecar retries a 429 a few times, then drops the report), then the size limit.
pub fn for_reporters(s: &Arc<Server>, r: Router) -> Router {
    r.layer(from_fn_with_state(s.clone(), limit_body))
        .layer(from_fn_with_state(s.clone(), reporters_in_flight))
        .layer(from_fn_with_state(s.clone(), rate_limit_reporters))
        .layer(from_fn_with_state(s.clone(), reporters_only))
        .layer(from_fn_with_state(s.clone(), authenticate))
}

/// `METHOD /path`, for refusals.
fn route_of(req: &Request) -> String {
    format!("{} {}", req.method(), req.uri().path())
}

/// Applies `rule` (which token kind the router takes) to the caller `authenticate` named. A
/// request without a caller is refused, so a router wired without `authenticate` fails
/// closed.
async fn token_kind(
    s: &Server,
    req: Request,
    next: Next,
    rule: fn(&Principal, &str) -> Result<(), access::Denied>,
) -> Response {
    let Some(who) = req.extensions().get::<Principal>() else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "no caller on the request (the authentication layer did not run)",
            None,
        );
    };
    if let Err(d) = rule(who, &route_of(&req)) {
        s.app.metrics.refused("token_kind");
        return denied(&d);
    }
    next.run(req).await
}

async fn clients_only(State(s): State<Arc<Server>>, req: Request, next: Next) -> Response {
    token_kind(&s, req, next, access::client_route).await
}

async fn reporters_only(State(s): State<Arc<Server>>, req: Request, next: Next) -> Response {
    token_kind(&s, req, next, access::report_route).await
}

/// Who is calling, for the limits: a client token's fingerprint, `report:{namespace}` for a
/// namespace's sidecars, or the peer's address when authentication is off. Set by
/// [`authenticate`].
#[derive(Clone)]
struct Caller(String);

fn bearer(req: &Request) -> Option<&str> {
    req.headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

async fn authenticate(State(s): State<Arc<Server>>, mut req: Request, next: Next) -> Response {
    let (caller, principal) = match &s.guard.tokens {
        Some(creds) => match bearer(&req) {
            None => {
                s.app.metrics.refused("auth");
                return error(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "missing bearer token: send Authorization: Bearer <token>",
                    None,
                );
            }
            Some(t) => match creds.principal(t) {
                Err(e) => {
                    s.app.metrics.refused("auth");
                    return unauthenticated(&e);
                }
                Ok(p) => {
                    // Sidecars of one namespace share a token: named by their namespace.
                    let caller = match &p {
                        Principal::Reporter { namespace } => format!("report:{namespace}"),
                        _ => format!("token:{}", fingerprint(t)),
                    };
                    (caller, p)
                }
            },
        },
        None => (
            req.extensions()
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| format!("ip:{}", c.0.ip()))
                .unwrap_or_else(|| "anonymous".into()),
            Principal::Open,
        ),
    };
    req.extensions_mut().insert(Caller(caller));
    req.extensions_mut().insert(principal);
    next.run(req).await
}

/// A refusal of [`Credentials::principal`]: 401 for a token that names no one (or the first
/// report token format), 403 for a report token of a namespace deleted since, 503 while the
/// namespaces are not listed yet. Each names the rule and the namespace, never the token.
fn unauthenticated(e: &Unauthenticated) -> Response {
    let (status, code) = match e {
        Unauthenticated::NoReportKey => (StatusCode::UNAUTHORIZED, "report_tokens_not_configured"),
        Unauthenticated::NotAccepted => (StatusCode::UNAUTHORIZED, "unauthorized"),
        Unauthenticated::FirstFormat(_) => (StatusCode::UNAUTHORIZED, "report_token_outdated"),
        Unauthenticated::Uid(u @ access::UidRefused::Stale { .. }) => {
            (StatusCode::FORBIDDEN, u.code())
        }
        Unauthenticated::Uid(u @ access::UidRefused::NotListedYet { .. }) => {
            let mut r = error(
                StatusCode::SERVICE_UNAVAILABLE,
                u.code(),
                e.to_string(),
                None,
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return r;
        }
    };
    error(status, code, e.to_string(), None)
}

/// The report namespace of a reporter, for refusals.
fn report_namespace(req: &Request) -> Option<String> {
    match req.extensions().get::<Principal>() {
        Some(Principal::Reporter { namespace }) => Some(namespace.clone()),
        _ => None,
    }
}

fn caller_of(req: &Request) -> String {
    req.extensions()
        .get::<Caller>()
        .map_or_else(|| "anonymous".to_string(), |c| c.0.clone())
}

fn retry_after(r: &mut Response, wait: Duration) {
    if let Ok(v) = HeaderValue::from_str(&wait.as_secs().max(1).to_string()) {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
}

async fn rate_limit(s: &Server, a: Audience, req: Request, next: Next) -> Response {
    let limiter = s.guard.rate(a);
    let Err(wait) = limiter.take(&caller_of(&req)) else {
        return next.run(req).await;
    };
    let (rate, burst) = (limiter.rate, limiter.burst);
    let mut r = match (a, report_namespace(&req)) {
        (Audience::Callers, _) => {
            s.app.metrics.refused("rate_limit");
            error(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                format!("more than {rate} requests per second (burst {burst}) from this client"),
                None,
            )
        }
        (Audience::Reporters, ns) => {
            s.app.metrics.refused("report_rate_limit");
            let who = match &ns {
                Some(ns) => format!("report namespace {ns:?}"),
                None => "reports from this client".to_string(),
            };
            error(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                format!(
                    "{who}: more than {rate} reports per second (burst {burst}; \
                     --report-rate-limit, --report-rate-burst)"
                ),
                Some(json!({"namespace": ns, "rate": rate, "burst": burst})),
            )
        }
    };
    retry_after(&mut r, wait);
    r
}

async fn rate_limit_callers(State(s): State<Arc<Server>>, req: Request, next: Next) -> Response {
    rate_limit(&s, Audience::Callers, req, next).await
}

async fn rate_limit_reporters(State(s): State<Arc<Server>>, req: Request, next: Next) -> Response {
    rate_limit(&s, Audience::Reporters, req, next).await
}

/// At most the audience's limit of requests in flight per caller; the permit is held until
/// the response's body ends, so an open stream (SSE, MCP) counts while it is open.
async fn in_flight(s: &Server, a: Audience, req: Request, next: Next) -> Response {
    let set = s.guard.in_flight(a);
    let Some(permit) = set.enter(&caller_of(&req)) else {
        s.app.metrics.refused("too_many_concurrent");
        let limit = set.limit;
        let (message, ns) = match (a, report_namespace(&req)) {
            (Audience::Reporters, Some(ns)) => (
                format!(
                    "report namespace {ns:?}: {limit} reports are in flight already (the \
                     limit per report namespace, --max-in-flight-per-report-namespace)"
                ),
                Some(ns),
            ),
            _ => (
                format!(
                    "{limit} requests of this caller are in flight already (the limit per \
                     token, --max-in-flight-per-token); an open stream counts until it ends"
                ),
                None,
            ),
        };
        let mut r = error(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_concurrent",
            message,
            Some(json!({"limit": limit, "namespace": ns})),
        );
        retry_after(&mut r, Duration::from_secs(1));
        return r;
    };
    let (parts, body) = next.run(req).await.into_parts();
    let body = Held {
        body,
        _permit: permit,
    };
    Response::from_parts(parts, Body::new(body))
}

/// A response body holding its request's permit: released when the body is dropped, at its
/// end or when the client goes away. Otherwise the body as it is (its length included).
struct Held {
    body: Body,
    _permit: super::limits::Permit,
}

impl http_body::Body for Held {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

async fn callers_in_flight(State(s): State<Arc<Server>>, req: Request, next: Next) -> Response {
    in_flight(&s, Audience::Callers, req, next).await
}

async fn reporters_in_flight(State(s): State<Arc<Server>>, req: Request, next: Next) -> Response {
    in_flight(&s, Audience::Reporters, req, next).await
}

async fn limit_body(State(s): State<Arc<Server>>, req: Request, next: Next) -> Response {
    let max = s.guard.max_body_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if let Some(n) = declared
        && n > max
    {
        s.app.metrics.refused("too_large");
        return too_large(n, max);
    }
    // Bodies without a length are cut at the limit while they are read.
    let (parts, body) = req.into_parts();
    let limited = Body::new(http_body_util::Limited::new(body, max));
    next.run(Request::from_parts(parts, limited)).await
}

/// A non-reversible short name for a token, for the limits' keys (tokens are never logged).
fn fingerprint(t: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    t.hash(&mut h);
    format!("{:016x}", h.finish())
}
