//! The HTTP side: axum routes over rustls (HTTP/1.1 and h2), and the metrics endpoint.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime};

use asya_api::config::ClusterConfig;
use asya_api::flavor::FlavorCatalog;
use asya_certs::ReloadingResolver;
use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::admission::privilege::{Authority, Offline, settle};
use crate::admission::{ActorLookup, Ctx, Endpoint, SettingsMemo, handle};
use crate::sources::SourceGate;
use crate::spans::Outcome;

/// Largest AdmissionReview accepted by default (`--max-body-bytes`): 1 MiB. An AsyncActor
/// UPDATE carries the object and the stored one, each a spec of at most
/// `policy.maxSpecBytes` (64 KiB) with about as much again in its last-applied annotation,
/// managed fields and status: ~0.5 MiB at the worst, with the envelope. A labelled pod's
/// CREATE is one object rendered from such a spec (its template) plus the controller's
/// metadata: well under that. The API server's own limit on an object (1.5 MiB) is for any
/// kind; a body past this one is refused with 413 before it is parsed.
pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;
/// Reviews handled at once by default (`--max-in-flight`); past it a request is shed at once
/// with 429. A review takes well under a millisecond of CPU (docs/benchmarks.md) unless it
/// waits for the API server (a SubjectAccessReview, at most 3 s), so this is reached only
/// when those answers are slow or the webhook is flooded; it bounds the memory of bodies
/// being read and parsed (at most this many × the body limit).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 32;
/// A client has this long to send a whole request; the API server's own timeout is 10 s.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the reviews under way may take to finish once shutdown begins, by default
/// (`--drain-timeout`): the API server's own timeout for a call (chart `webhook.timeoutSeconds`).
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(10);
/// At shutdown, how long HTTP/1.1 clients are given to send one more request on a kept-alive
/// connection, answered with `Connection: close`, before idle ones are closed (within the
/// drain bound). The API server calls webhooks over HTTP/1.1 and does not retry a POST
/// written to a connection the server has just closed: closing an idle connection under it
/// fails a review with EOF; one answered with `Connection: close` it simply dials again, to a
/// replica that is still in the Service.
pub const LAME_DUCK: Duration = Duration::from_secs(2);

// Label values are static strings: recording a request allocates nothing.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub endpoint: &'static str,
    pub operation: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    pub endpoint: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabels {
    pub version: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

pub struct Metrics {
    pub registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub latency: Family<EndpointLabels, Histogram>,
    pub cert_expiry: Gauge,
    pub cache_objects: Family<KindLabels, Gauge>,
    /// Requests answered 429 at once because `--max-in-flight` reviews were under way.
    pub shed: Family<EndpointLabels, Counter>,
    /// Reviews under way, read at scrape time.
    pub in_flight: Gauge,
    /// Connections closed before the TLS handshake: the peer is not in
    /// `--allowed-source-cidrs` ([`crate::sources`]).
    pub refused_connections: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("asya_webhook");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<EndpointLabels, Histogram>::new_with_constructor(|| {
            // 50 µs … ~3 s.
            Histogram::new(exponential_buckets(0.00005, 2.5, 13))
        });
        let cert_expiry = Gauge::default();
        let cache_objects = Family::<KindLabels, Gauge>::default();
        registry.register(
            "requests",
            "Admission requests by endpoint, operation and result",
            requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Admission handling latency",
            latency.clone(),
        );
        registry.register(
            "certificate_expiry_seconds",
            "Seconds until the serving certificate expires",
            cert_expiry.clone(),
        );
        registry.register(
            "cache_objects",
            "Objects in the admission caches, by kind",
            cache_objects.clone(),
        );
        let shed = Family::<EndpointLabels, Counter>::default();
        registry.register(
            "requests_shed",
            "Admission requests answered 429 at once: --max-in-flight reviews were under way",
            shed.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "requests_in_flight",
            "Admission reviews under way (at most --max-in-flight)",
            in_flight.clone(),
        );
        let refused_connections = Counter::default();
        registry.register(
            "connections_refused",
            "Connections to the admission port closed before the TLS handshake: the peer is not in --allowed-source-cidrs",
            refused_connections.clone(),
        );
        let build_info = Family::<VersionLabels, Gauge>::default();
        registry.register(
            "build_info",
            "1, labelled with the webhook's version",
            build_info.clone(),
        );
        build_info
            .get_or_create(&VersionLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        Self {
            registry,
            requests,
            latency,
            cert_expiry,
            cache_objects,
            shed,
            in_flight,
            refused_connections,
        }
    }
}

/// Sizes of the caches, read at scrape time.
pub type CacheSizes = Box<dyn Fn() -> Vec<(&'static str, i64)> + Send + Sync>;

/// Everything the handlers read.
pub struct Shared {
    pub config: Arc<ClusterConfig>,
    pub catalog: RwLock<Arc<FlavorCatalog>>,
    pub actors: Arc<dyn ActorLookup>,
    pub cache_sizes: CacheSizes,
    /// Caches synced (set once by the cache task).
    pub synced: AtomicBool,
    pub native_sidecar: bool,
    pub resolver: Arc<ReloadingResolver>,
    pub metrics: Metrics,
    /// Injection settings per AsyncActor version and flavor catalog (`config` never changes).
    pub settings_memo: SettingsMemo,
    /// Namespace levels and SubjectAccessReviews for admitted AsyncActors.
    pub authority: Arc<dyn Authority>,
    /// A SERVER span per review, when the `OTEL_*` variables ask for it.
    pub traces: crate::spans::Traces,
    /// Bounds on what one request and all of them at once may take.
    pub limits: Limits,
}

/// What the admission endpoints take at most (`--max-in-flight`, `--max-body-bytes`).
pub struct Limits {
    pub max_in_flight: usize,
    pub max_body: usize,
    /// One permit per review under way.
    permits: tokio::sync::Semaphore,
}

impl Limits {
    pub fn new(max_in_flight: usize, max_body: usize) -> Self {
        // (A zero would shed everything: at least one.)
        let max_in_flight = max_in_flight.max(1);
        Self {
            max_in_flight,
            max_body,
            permits: tokio::sync::Semaphore::new(max_in_flight),
        }
    }

    pub fn in_flight(&self) -> usize {
        self.max_in_flight
            .saturating_sub(self.permits.available_permits())
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_BODY)
    }
}

/// The answer to a request past `--max-in-flight`: 429 with a `Status` the API server's
/// client decodes, so the refusal it reports (with failurePolicy Fail) reads `failed calling
/// webhook "…": failed to call webhook: asya-webhook is at its limit of N admission reviews
/// in flight …`. No `Retry-After`: the API server would wait and retry within the same
/// request, holding it; the caller (a controller, kubectl) retries on its own schedule.
fn shed(max: usize) -> Response {
    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!(
            "asya-webhook is at its limit of {max} admission reviews in flight (--max-in-flight, chart webhook.maxInFlight): this request was shed; retry"
        ),
        "reason": "TooManyRequests", "code": 429,
    });
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::CONTENT_TYPE, "application/json")],
        status.to_string(),
    )
        .into_response()
}

impl Shared {
    pub fn catalog(&self) -> Arc<FlavorCatalog> {
        self.catalog
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn set_catalog(&self, c: FlavorCatalog) {
        *self.catalog.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(c);
    }

    /// Ready: caches synced and a certificate loaded. The reason when not.
    pub fn readiness(&self) -> Result<(), &'static str> {
        if !self.resolver.is_loaded() {
            return Err("no serving certificate loaded");
        }
        if !self.synced.load(Ordering::Acquire) {
            return Err("caches not synced");
        }
        Ok(())
    }
}

async fn admit(
    shared: Arc<Shared>,
    endpoint: Endpoint,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Response {
    // Held until the answer is built: reading, parsing and settling (the API server's
    // answers) all count. Shed at once past the limit, before the body is read.
    let Ok(_permit) = shared.limits.permits.try_acquire() else {
        shared
            .metrics
            .shed
            .get_or_create(&EndpointLabels {
                endpoint: endpoint.as_str(),
            })
            .inc();
        return shed(shared.limits.max_in_flight);
    };
    let start = Instant::now();
    let started = SystemTime::now();
    let max_body = shared.limits.max_body;
    let bytes = match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, max_body)).await
    {
        Err(_) => {
            return (
                StatusCode::REQUEST_TIMEOUT,
                "request body not received in time\n",
            )
                .into_response();
        }
        Ok(Err(e)) => {
            // to_bytes fails on the size limit or a broken connection.
            let too_big = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            shared
                .metrics
                .requests
                .get_or_create(&RequestLabels {
                    endpoint: endpoint.as_str(),
                    operation: "UNKNOWN",
                    result: "bad_request",
                })
                .inc();
            return if too_big {
                (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("AdmissionReview larger than {max_body} bytes (--max-body-bytes)\n"),
                )
                    .into_response()
            } else {
                (
                    StatusCode::BAD_REQUEST,
                    format!("cannot read the request body: {e}\n"),
                )
                    .into_response()
            };
        }
        Ok(Ok(b)) => b,
    };
    let catalog = shared.catalog();
    let ctx = Ctx {
        config: &shared.config,
        catalog: &catalog,
        actors: shared.actors.as_ref(),
        native_sidecar: shared.native_sidecar,
        memo: Some(&shared.settings_memo),
    };
    let handled = match handle(endpoint, &bytes, &ctx) {
        Ok(mut h) => match h.privilege.take() {
            // The pure review admitted an AsyncActor: the API server vouches for its pod.
            Some(p) => Ok(settle(h, *p, shared.authority.as_ref()).await),
            None => Ok(h),
        },
        Err(e) => Err(e),
    };
    let (resp, outcome) = match handled {
        Ok(h) => match crate::admission::encode_review(&h.review) {
            Ok(json) => (
                ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
                Outcome {
                    operation: h.operation,
                    result: h.result,
                    refusal: shared
                        .traces
                        .enabled()
                        .then(|| Outcome::refusal_of(&h.review))
                        .flatten(),
                },
            ),
            Err(e) => (
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("cannot encode the response: {e}\n"),
                )
                    .into_response(),
                Outcome {
                    operation: h.operation,
                    result: "error",
                    refusal: Some(format!("cannot encode the response: {e}")),
                },
            ),
        },
        Err(e) => {
            tracing::info!(endpoint = endpoint.as_str(), error = %e, "bad admission request");
            (
                (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
                Outcome {
                    operation: "UNKNOWN",
                    result: "bad_request",
                    refusal: Some(e.to_string()),
                },
            )
        }
    };
    shared
        .traces
        .record(endpoint.as_str(), &headers, &bytes, &outcome, started);
    let Outcome {
        operation, result, ..
    } = outcome;
    shared
        .metrics
        .requests
        .get_or_create(&RequestLabels {
            endpoint: endpoint.as_str(),
            operation,
            result,
        })
        .inc();
    shared
        .metrics
        .latency
        .get_or_create(&EndpointLabels {
            endpoint: endpoint.as_str(),
        })
        .observe(start.elapsed().as_secs_f64());
    resp
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    match shared.readiness() {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    if let Some(s) = shared.resolver.expiry_seconds(SystemTime::now()) {
        shared.metrics.cert_expiry.set(s);
    }
    shared
        .metrics
        .in_flight
        .set(shared.limits.in_flight() as i64);
    for (kind, n) in (shared.cache_sizes)() {
        shared
            .metrics
            .cache_objects
            .get_or_create(&KindLabels { kind })
            .set(n);
    }
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &shared.metrics.registry) {
        return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        out,
    )
        .into_response()
}

/// The admission router (served over TLS).
pub fn router(shared: Arc<Shared>) -> Router {
    let route = |ep: Endpoint| {
        let s = shared.clone();
        post(move |headers: axum::http::HeaderMap, body: Body| admit(s.clone(), ep, headers, body))
    };
    Router::new()
        .route("/validate/asyncactors", route(Endpoint::ValidateActors))
        .route("/mutate/asyncactors", route(Endpoint::MutateActors))
        .route("/mutate/pods", route(Endpoint::MutatePods))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .layer(DefaultBodyLimit::max(shared.limits.max_body))
        .with_state(shared)
}

/// The metrics router (plain HTTP, separate address).
pub fn metrics_router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(shared)
}

/// Serve `router` over TLS on `listener` until `shutdown` resolves, to any peer; then drain
/// for at most [`DEFAULT_DRAIN`] (see [`serve_tls_from`]).
pub async fn serve_tls(
    listener: TcpListener,
    router: Router,
    resolver: Arc<ReloadingResolver>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    serve_tls_from(
        listener,
        router,
        resolver,
        Arc::new(SourceGate::open()),
        shutdown,
        DEFAULT_DRAIN,
    )
    .await
}

/// Serve `router` over TLS on `listener` until `shutdown` resolves. A connection from a peer
/// `gate` refuses is closed before anything is read from it (no TLS handshake: nothing of the
/// webhook is exposed to it). Each other connection speaks HTTP/1.1 or h2 (ALPN); a stalled
/// handshake or header is cut off, never left hanging.
///
/// When `shutdown` resolves the listener is closed (new connections are refused) and every
/// HTTP/1.1 response, the ones under way included, says `Connection: close`: a client's next
/// request on a kept-alive connection is answered and the connection closed after it, so
/// the client dials again (to a replica still in the Service) instead of writing to a
/// connection closed under it. After [`LAME_DUCK`] the connections left are shut down
/// gracefully: an idle HTTP/1.1 one closed, an h2 one sent a GOAWAY (its client opens its next
/// stream elsewhere), reviews under way finish. The call returns once every connection is
/// closed, or after `drain`, whichever comes first.
pub async fn serve_tls_from(
    listener: TcpListener,
    router: Router,
    resolver: Arc<ReloadingResolver>,
    gate: Arc<SourceGate>,
    shutdown: impl std::future::Future<Output = ()>,
    drain: Duration,
) -> anyhow::Result<()> {
    let acceptor = TlsAcceptor::from(Arc::new(asya_certs::server_config(resolver)?));
    let closing = Arc::new(AtomicBool::new(false));
    let service = TowerToHyperService::new(router.layer(axum::middleware::from_fn({
        let closing = closing.clone();
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            let closing = closing.clone();
            async move {
                // (h2 has no Connection header: its connections get a GOAWAY instead.)
                let h1 = req.version() < axum::http::Version::HTTP_2;
                let mut resp = next.run(req).await;
                if h1 && closing.load(Ordering::Acquire) {
                    resp.headers_mut().insert(
                        header::CONNECTION,
                        header::HeaderValue::from_static("close"),
                    );
                }
                resp
            }
        }
    })));
    let graceful = GracefulShutdown::new();
    // The connections' tasks: dropped (aborted) at the drain bound, not left running.
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if !gate.admit(peer.ip()) {
            drop(tcp);
            continue;
        }
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let service = service.clone();
        // Taken before the task starts: a connection still in its handshake when shutdown
        // begins is shut down as soon as it is served.
        let watcher = graceful.watcher();
        conns.spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(HANDSHAKE_TIMEOUT);
            builder.http2().timer(TokioTimer::new());
            let conn = builder.serve_connection(TokioIo::new(tls), service);
            if let Err(e) = watcher.watch(conn).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    closing.store(true, Ordering::Release);
    let deadline = tokio::time::Instant::now() + drain;
    tracing::info!(
        connections = conns.len(),
        drain_seconds = drain.as_secs_f64(),
        "stopped accepting; HTTP/1.1 connections close after their next response"
    );
    let lame_duck = tokio::time::Instant::now() + LAME_DUCK.min(drain);
    let _ = tokio::time::timeout_at(lame_duck, async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    tracing::info!(
        connections = conns.len(),
        "closing the connections left (GOAWAY on h2) once their reviews finish"
    );
    if tokio::time::timeout_at(deadline, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            drain_seconds = drain.as_secs_f64(),
            open = conns.len(),
            "connections still open at the drain bound; closing them"
        );
    }
    conns.shutdown().await;
    Ok(())
}

/// Serve the metrics router over plain HTTP.
pub async fn serve_metrics(addr: SocketAddr, shared: Arc<Shared>) -> anyhow::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    axum::serve(listener, metrics_router(shared)).await?;
    Ok(())
}

impl Shared {
    /// A snapshot that never changes: for `inject`-style offline use, tests and the benchmark.
    pub fn fixed(
        config: ClusterConfig,
        catalog: FlavorCatalog,
        actors: Arc<dyn ActorLookup>,
        resolver: Arc<ReloadingResolver>,
    ) -> Self {
        Self {
            config: Arc::new(config),
            catalog: RwLock::new(Arc::new(catalog)),
            actors,
            cache_sizes: Box::new(Vec::new),
            synced: AtomicBool::new(true),
            native_sidecar: true,
            resolver,
            metrics: Metrics::new(),
            settings_memo: SettingsMemo::default(),
            authority: Arc::new(Offline),
            traces: crate::spans::Traces::off(),
            limits: Limits::default(),
        }
    }
}

#[cfg(test)]
mod metrics_tests {
    use super::*;

    /// Every family this component registers, for tests/monitoring (ASYA_METRICS_DUMP_DIR).
    #[test]
    fn metrics_dump() {
        // A family is exported once it has a series: record one of each.
        let m = Metrics::new();
        m.requests
            .get_or_create(&RequestLabels {
                endpoint: "mutate",
                operation: "CREATE",
                result: "allowed",
            })
            .inc();
        m.latency
            .get_or_create(&EndpointLabels { endpoint: "mutate" })
            .observe(0.001);
        m.cache_objects
            .get_or_create(&KindLabels { kind: "Flavor" })
            .set(1);
        m.cert_expiry.set(3600);
        m.shed
            .get_or_create(&EndpointLabels { endpoint: "mutate" })
            .inc();
        m.in_flight.set(1);
        m.refused_connections.inc();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &m.registry).unwrap();
        assert!(text.contains("asya_webhook_build_info{version="), "{text}");
        assert!(
            text.contains("# TYPE asya_webhook_certificate_expiry_seconds gauge"),
            "{text}"
        );
        asya_api::metrics_dump::write("asya-webhook", &text).unwrap();
    }
}
