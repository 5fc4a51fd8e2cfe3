//! The layers in front of the guarded routers, in this order: bearer-token auth (which also
//! names the caller, a [`Principal`] in the request's extensions), the token kind the
//! router's audience takes (`crate::access`: client tokens for callers, report tokens for
//! reports), a per-caller rate limit (callers only, not reports), a body size limit.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::Response;

use super::Server;
use super::reply::{denied, error, too_large};
use crate::access::{self, Credentials, Principal, Unauthenticated};

/// Who may call, how often, how much.
pub struct Guard {
    /// `None`: authentication explicitly disabled (`--no-auth`).
    pub tokens: Option<Credentials>,
    /// Requests per second per client, with a burst of `burst`; 0 disables the limit.
    pub rate: f64,
    pub burst: f64,
    pub max_body_bytes: usize,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl Guard {
    pub fn new(tokens: Option<Credentials>, rate: f64, burst: f64, max_body_bytes: usize) -> Guard {
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

/// REST and MCP callers: auth, client tokens only, then rate limit, then size limit.
pub fn for_callers(s: &Arc<Server>, r: Router) -> Router {
    // The last layer added runs first.
    r.layer(from_fn_with_state(s.clone(), limit_body))
        .layer(from_fn_with_state(s.clone(), rate_limit))
        .layer(from_fn_with_state(s.clone(), clients_only))
        .layer(from_fn_with_state(s.clone(), authenticate))
}

/// Sidecar reports: auth, report tokens only, then size limit; never rate limited, as
/// dropping a report would lose status.
pub fn for_reporters(s: &Arc<Server>, r: Router) -> Router {
    r.layer(from_fn_with_state(s.clone(), limit_body))
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

/// Who is calling, for the rate limit: a token's fingerprint, or the peer's address when
/// authentication is off. Set by [`authenticate`].
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
                    let code = match e {
                        Unauthenticated::NoReportKey => "report_tokens_not_configured",
                        Unauthenticated::NotAccepted => "unauthorized",
                    };
                    return error(StatusCode::UNAUTHORIZED, code, e.to_string(), None);
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

async fn rate_limit(State(s): State<Arc<Server>>, req: Request, next: Next) -> Response {
    let g = &s.guard;
    let caller = req
        .extensions()
        .get::<Caller>()
        .map_or("anonymous", |c| c.0.as_str());
    if let Err(wait) = g.take(caller) {
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
    next.run(req).await
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

/// A non-reversible short name for a token, for rate-limit buckets (tokens are never logged).
fn fingerprint(t: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    t.hash(&mut h);
    format!("{:016x}", h.finish())
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
