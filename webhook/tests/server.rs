//! The server over real TLS on loopback: HTTP/1.1 and h2, health, limits, metrics.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use asya_api::config::ClusterConfig;
use asya_api::flavor::FlavorCatalog;
use asya_certs::{ReloadingResolver, ServingSpec, generate_ca, issue_serving};
use asya_webhook::client::Conn;
use asya_webhook::server::{
    DEFAULT_DRAIN, DEFAULT_MAX_BODY, Limits, Shared, metrics_router, router, serve_tls,
    serve_tls_from,
};
use asya_webhook::sources::{Allowlist, SourceGate};
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tower::ServiceExt;

const DAY: Duration = Duration::from_secs(86_400);

struct Running {
    addr: std::net::SocketAddr,
    ca: String,
    shared: Arc<Shared>,
    /// Sent (or dropped, with the rest) to shut the server down.
    stop: tokio::sync::oneshot::Sender<()>,
    /// The server's task: done once it has drained.
    served: tokio::task::JoinHandle<anyhow::Result<()>>,
}

async fn start() -> Running {
    start_with(Limits::default(), None).await
}

/// A server with `limits`, and connections only from `allowed` (any when `None`).
async fn start_with(limits: Limits, allowed: Option<&[&str]>) -> Running {
    start_draining(limits, allowed, DEFAULT_DRAIN).await
}

/// [`start_with`], draining for at most `drain` once stopped.
async fn start_draining(limits: Limits, allowed: Option<&[&str]>, drain: Duration) -> Running {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let now = SystemTime::now();
    let ca = generate_ca("ca", now, DAY).unwrap();
    let srv = issue_serving(
        &ca,
        &ServingSpec::new(["localhost".to_string()], []),
        now,
        DAY,
    )
    .unwrap();
    let resolver = Arc::new(ReloadingResolver::new());
    resolver.set_pem(&srv.cert_pem, &srv.key_pem).unwrap();
    let actors: Arc<HashMap<(String, String), Value>> = Arc::new(HashMap::new());
    let mut shared = Shared::fixed(
        ClusterConfig::default(),
        FlavorCatalog::new(),
        actors,
        resolver.clone(),
    );
    shared.limits = limits;
    let shared = Arc::new(shared);
    shared.synced.store(false, Ordering::Release);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let stopped = async move {
        let _ = stopped.await;
    };
    let served = match (allowed, drain == DEFAULT_DRAIN) {
        (None, true) => tokio::spawn(serve_tls(
            listener,
            router(shared.clone()),
            resolver,
            stopped,
        )),
        (cidrs, _) => {
            let gate = match cidrs {
                Some(cidrs) => SourceGate::new(
                    Allowlist::parse(cidrs).unwrap(),
                    shared.metrics.refused_connections.clone(),
                ),
                None => SourceGate::open(),
            };
            tokio::spawn(serve_tls_from(
                listener,
                router(shared.clone()),
                resolver,
                Arc::new(gate),
                stopped,
                drain,
            ))
        }
    };
    Running {
        addr,
        ca: ca.cert_pem,
        shared,
        stop,
        served,
    }
}

fn review_body() -> Bytes {
    let rv = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-1", "kind": {"group": "asya.sh", "version": "v1alpha1", "kind": "AsyncActor"},
            "resource": {"group": "asya.sh", "version": "v1alpha1", "resource": "asyncactors"},
            "name": "echo", "namespace": "default", "operation": "CREATE", "userInfo": {},
            "object": {"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
                       "metadata": {"name": "echo", "namespace": "default"},
                       "spec": {"image": "i", "handler": "m.f", "scaling": {"maxReplicas": 3}}}
        }
    });
    Bytes::from(serde_json::to_vec(&rv).unwrap())
}

#[tokio::test]
async fn http1_and_h2_admission_over_tls() {
    let s = start().await;
    for h2 in [false, true] {
        let mut c = Conn::connect(s.addr, "localhost", &s.ca, h2).await.unwrap();
        assert_eq!(
            c.alpn.as_deref(),
            Some(if h2 { &b"h2"[..] } else { &b"http/1.1"[..] })
        );
        // Several requests on one keep-alive connection.
        for _ in 0..3 {
            let (status, body) = c
                .request("POST", "/mutate/asyncactors", review_body())
                .await
                .unwrap();
            assert_eq!(status, 200);
            let v: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["response"]["uid"], "u-1");
            assert_eq!(v["response"]["allowed"], true);
            assert_eq!(v["response"]["patchType"], "JSONPatch");
            assert!(v["response"]["patch"].is_string());
        }
        let (status, body) = c
            .request("POST", "/validate/asyncactors", review_body())
            .await
            .unwrap();
        assert_eq!(status, 200);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert!(v["response"].get("patch").is_none());
    }
}

#[tokio::test]
async fn readiness_follows_cache_sync_and_health_is_always_up() {
    let s = start().await;
    let mut c = Conn::connect(s.addr, "localhost", &s.ca, false)
        .await
        .unwrap();
    assert_eq!(
        c.request("GET", "/healthz", Bytes::new()).await.unwrap().0,
        200
    );
    let (status, body) = c.request("GET", "/readyz", Bytes::new()).await.unwrap();
    assert_eq!(status, 503);
    assert_eq!(&body[..], b"caches not synced\n");
    s.shared.synced.store(true, Ordering::Release);
    assert_eq!(
        c.request("GET", "/readyz", Bytes::new()).await.unwrap().0,
        200
    );
}

#[tokio::test]
async fn bad_bodies_get_clean_http_errors_and_the_connection_survives() {
    let s = start().await;
    let mut c = Conn::connect(s.addr, "localhost", &s.ca, false)
        .await
        .unwrap();
    let (status, body) = c
        .request(
            "POST",
            "/validate/asyncactors",
            Bytes::from_static(b"not json"),
        )
        .await
        .unwrap();
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("not an AdmissionReview"));
    let big = Bytes::from(vec![b' '; DEFAULT_MAX_BODY + 1]);
    let (status, body) = c.request("POST", "/mutate/pods", big).await.unwrap();
    assert_eq!(status, 413);
    assert_eq!(
        &body[..],
        format!("AdmissionReview larger than {DEFAULT_MAX_BODY} bytes (--max-body-bytes)\n")
            .as_bytes()
    );
    // Unknown path and wrong method.
    let mut c = Conn::connect(s.addr, "localhost", &s.ca, false)
        .await
        .unwrap();
    assert_eq!(
        c.request("POST", "/nope", Bytes::new()).await.unwrap().0,
        404
    );
    assert_eq!(
        c.request("GET", "/mutate/pods", Bytes::new())
            .await
            .unwrap()
            .0,
        405
    );
    let (status, _) = c
        .request("POST", "/mutate/asyncactors", review_body())
        .await
        .unwrap();
    assert_eq!(status, 200);
}

#[tokio::test]
async fn metrics_count_requests_and_report_cert_expiry() {
    let s = start().await;
    let mut c = Conn::connect(s.addr, "localhost", &s.ca, false)
        .await
        .unwrap();
    c.request("POST", "/validate/asyncactors", review_body())
        .await
        .unwrap();
    c.request("POST", "/validate/asyncactors", Bytes::from_static(b"{"))
        .await
        .unwrap();
    let resp = metrics_router(s.shared.clone())
        .oneshot(
            axum::http::Request::get("/metrics")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = String::from_utf8(
        axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap()
            .to_vec(),
    )
    .unwrap();
    assert!(
        text.contains(r#"asya_webhook_requests_total{endpoint="validate_asyncactors",operation="CREATE",result="allowed"} 1"#),
        "{text}"
    );
    assert!(text.contains(r#"result="bad_request"} 1"#), "{text}");
    assert!(
        text.contains("asya_webhook_request_duration_seconds_bucket"),
        "{text}"
    );
    let expiry = text
        .lines()
        .find(|l| l.starts_with("asya_webhook_certificate_expiry_seconds "))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap();
    assert!((86_000..=86_400).contains(&expiry), "{expiry}");
}

/// Polls `cond` until it holds, failing after 5 s.
async fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn metrics_text(shared: &Arc<Shared>) -> String {
    let resp = metrics_router(shared.clone())
        .oneshot(
            axum::http::Request::get("/metrics")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    String::from_utf8(body.to_vec()).unwrap()
}

#[tokio::test]
async fn past_the_in_flight_limit_a_request_is_shed_at_once_with_a_status() {
    let s = start_with(Limits::new(1, DEFAULT_MAX_BODY), None).await;
    // A request whose body never comes holds the only place (until its client goes).
    let tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let mut stalled = asya_webhook::client::connector(&s.ca, &[b"http/1.1"])
        .unwrap()
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap();
    stalled
        .write_all(b"POST /validate/asyncactors HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{")
        .await
        .unwrap();
    stalled.flush().await.unwrap();
    until("the stalled review holds the place", || {
        s.shared.limits.in_flight() == 1
    })
    .await;

    let mut c = Conn::connect(s.addr, "localhost", &s.ca, false)
        .await
        .unwrap();
    let (status, body) = c
        .request("POST", "/mutate/asyncactors", review_body())
        .await
        .unwrap();
    assert_eq!(status, 429);
    let st: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(st["kind"], "Status");
    assert_eq!(st["status"], "Failure");
    assert_eq!(st["reason"], "TooManyRequests");
    assert_eq!(st["code"], 429);
    assert_eq!(
        st["message"],
        "asya-webhook is at its limit of 1 admission reviews in flight (--max-in-flight, chart webhook.maxInFlight): this request was shed; retry"
    );
    let text = metrics_text(&s.shared).await;
    assert!(
        text.contains(r#"asya_webhook_requests_shed_total{endpoint="mutate_asyncactors"} 1"#),
        "{text}"
    );
    assert!(text.contains("asya_webhook_requests_in_flight 1"), "{text}");

    // The stalled client goes: its place is free again, and the next review is answered.
    drop(stalled);
    until("the place freed", || s.shared.limits.in_flight() == 0).await;
    let (status, _) = c
        .request("POST", "/mutate/asyncactors", review_body())
        .await
        .unwrap();
    assert_eq!(status, 200);
}

#[tokio::test]
async fn the_body_limit_is_configurable() {
    let s = start_with(Limits::new(8, 2048), None).await;
    let mut c = Conn::connect(s.addr, "localhost", &s.ca, false)
        .await
        .unwrap();
    let (status, body) = c
        .request("POST", "/mutate/pods", Bytes::from(vec![b' '; 2049]))
        .await
        .unwrap();
    assert_eq!(status, 413);
    assert_eq!(
        &body[..],
        b"AdmissionReview larger than 2048 bytes (--max-body-bytes)\n"
    );
    // A review within it is answered.
    assert!(review_body().len() <= 2048);
    let (status, _) = c
        .request("POST", "/validate/asyncactors", review_body())
        .await
        .unwrap();
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_peer_outside_the_allowed_sources_gets_no_handshake_and_is_counted() {
    // Loopback is not the API server here: the connection is closed before TLS.
    let s = start_with(Limits::default(), Some(&["10.0.0.0/8", "fd00::/8"])).await;
    let err = Conn::connect(s.addr, "localhost", &s.ca, false).await;
    assert!(err.is_err(), "the handshake must fail");
    until("the refusal counted", || {
        s.shared.metrics.refused_connections.get() == 1
    })
    .await;
    let text = metrics_text(&s.shared).await;
    assert!(
        text.contains("asya_webhook_connections_refused_total 1"),
        "{text}"
    );
    assert!(
        !text.contains("asya_webhook_requests_total{"),
        "nothing was read from it: {text}"
    );

    // Listed, the same client is served.
    let s = start_with(Limits::default(), Some(&["10.0.0.0/8,127.0.0.1/32"])).await;
    let mut c = Conn::connect(s.addr, "localhost", &s.ca, false)
        .await
        .unwrap();
    let (status, _) = c
        .request("POST", "/validate/asyncactors", review_body())
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(s.shared.metrics.refused_connections.get(), 0);
}

/// An h2 connection over TLS with the `h2` crate, which reports what the server's frames said
/// (a GOAWAY) as the API server's Go client sees them.
async fn h2_client(s: &Running) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let tls = asya_webhook::client::connector(&s.ca, &[b"h2"])
        .unwrap()
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap();
    let (client, conn) = h2::client::handshake(tls).await.unwrap();
    tokio::spawn(conn);
    client
}

fn h2_request(method: &str, path: &str) -> axum::http::Request<()> {
    axum::http::Request::builder()
        .method(method)
        .uri(format!("https://localhost{path}"))
        .header("content-type", "application/json")
        .body(())
        .unwrap()
}

/// What the API server needs from a replica being stopped: the review it is sending when
/// the replica gets SIGTERM is answered; its next one is refused by a GOAWAY before it is
/// sent (so its client opens a new connection, to another replica) instead of being lost
/// with a connection closed under it; new connections are refused; the server exits as
/// soon as nothing is in flight.
#[tokio::test]
async fn at_shutdown_reviews_in_flight_finish_and_h2_clients_get_a_goaway() {
    let s = start_draining(Limits::default(), None, Duration::from_secs(30)).await;
    let mut client = h2_client(&s).await;
    // A review in flight: half its body sent.
    let body = review_body();
    let (half, rest) = body.split_at(body.len() / 2);
    let (half, rest) = (Bytes::copy_from_slice(half), Bytes::copy_from_slice(rest));
    client = client.ready().await.unwrap();
    let (response, mut stream) = client
        .send_request(h2_request("POST", "/mutate/asyncactors"), false)
        .unwrap();
    stream.send_data(half, false).unwrap();
    until("the review is in flight", || {
        s.shared.limits.in_flight() == 1
    })
    .await;

    let stopped_at = tokio::time::Instant::now();
    s.stop.send(()).unwrap();
    // The next stream is refused by the server's GOAWAY (NO_ERROR), before it is sent.
    let refused = loop {
        assert!(
            stopped_at.elapsed() < Duration::from_secs(5),
            "no GOAWAY within 5 s of shutdown"
        );
        match client.clone().ready().await {
            Err(e) => break e,
            Ok(mut c) => match c.send_request(h2_request("GET", "/healthz"), true) {
                Err(e) => break e,
                // Sent before the GOAWAY arrived: served as usual, or refused by it when
                // the GOAWAY names an earlier last stream (the client retries elsewhere).
                Ok((r, _)) => match r.await {
                    Ok(resp) => assert_eq!(resp.status(), 200),
                    Err(e) => break e,
                },
            },
        }
    };
    assert!(
        refused.is_go_away() && refused.is_remote(),
        "not a GOAWAY from the server: {refused:?}"
    );
    assert_eq!(refused.reason(), Some(h2::Reason::NO_ERROR), "{refused:?}");
    // New connections are refused.
    assert!(tokio::net::TcpStream::connect(s.addr).await.is_err());
    assert!(!s.served.is_finished(), "exited with a review in flight");

    // The review in flight completes and is answered.
    stream.send_data(rest, true).unwrap();
    let resp = response.await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut bytes = Vec::new();
    while let Some(chunk) = body.data().await {
        bytes.extend_from_slice(&chunk.unwrap());
    }
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["response"]["uid"], "u-1");
    assert_eq!(v["response"]["allowed"], true);
    // Then the server exits at once, far inside its 30 s bound.
    tokio::time::timeout(Duration::from_secs(5), s.served)
        .await
        .expect("the server did not exit once the review was answered")
        .unwrap()
        .unwrap();
}

/// A review that never completes holds the shutdown for at most the drain bound; then its
/// connection is closed and the server exits.
#[tokio::test]
async fn shutdown_waits_at_most_the_drain_bound() {
    let drain = Duration::from_millis(500);
    let s = start_draining(Limits::default(), None, drain).await;
    let client = h2_client(&s).await;
    let mut client = client.ready().await.unwrap();
    let (response, mut stream) = client
        .send_request(h2_request("POST", "/mutate/asyncactors"), false)
        .unwrap();
    stream.send_data(Bytes::from_static(b"{"), false).unwrap();
    until("the review is in flight", || {
        s.shared.limits.in_flight() == 1
    })
    .await;
    let stopped_at = tokio::time::Instant::now();
    s.stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), s.served)
        .await
        .expect("the server outlived its drain bound")
        .unwrap()
        .unwrap();
    let took = stopped_at.elapsed();
    assert!(took >= drain, "exited after {took:?}, before the bound");
    // Its connection went with it: the stalled review gets no answer.
    assert!(response.await.is_err());
    until("the review's place freed", || {
        s.shared.limits.in_flight() == 0
    })
    .await;
}

/// One HTTP/1.1 response read off `io`: status line and headers (lowercased), and the body.
async fn read_h1_response(io: &mut (impl tokio::io::AsyncRead + Unpin)) -> (String, Vec<u8>) {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = io.read(&mut chunk).await.unwrap();
        assert!(n > 0, "connection closed before a response: {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let mut chunk = [0u8; 4096];
        let n = io.read(&mut chunk).await.unwrap();
        assert!(n > 0, "connection closed mid-body");
        body.extend_from_slice(&chunk[..n]);
    }
    (head, body)
}

/// How the API server calls a webhook: HTTP/1.1 over kept-alive connections, and a POST
/// written to a connection the server has just closed fails with EOF (it is not retried).
/// At shutdown a kept-alive connection's next review is answered, with `Connection: close`,
/// and only then is the connection closed; an idle one is closed after the lame-duck time.
#[tokio::test]
async fn at_shutdown_http1_keep_alive_connections_get_connection_close_not_eof() {
    use tokio::io::AsyncReadExt;
    let s = start_draining(Limits::default(), None, Duration::from_secs(30)).await;
    let connect = || async {
        let tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        asya_webhook::client::connector(&s.ca, &[b"http/1.1"])
            .unwrap()
            .connect("localhost".try_into().unwrap(), tcp)
            .await
            .unwrap()
    };
    let body = review_body();
    let request = [
        format!("POST /mutate/asyncactors HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len()).into_bytes(),
        body.to_vec(),
    ]
    .concat();
    let (mut busy, mut idle) = (connect().await, connect().await);
    for c in [&mut busy, &mut idle] {
        c.write_all(&request).await.unwrap();
        let (head, _) = read_h1_response(c).await;
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(!head.contains("connection: close"), "{head}");
    }

    let stopped_at = tokio::time::Instant::now();
    s.stop.send(()).unwrap();
    // Wait until the server is shutting down (it refuses new connections), as the API
    // server's next review would come at any moment after SIGTERM.
    until("new connections refused", || {
        std::net::TcpStream::connect(s.addr).is_err()
    })
    .await;
    busy.write_all(&request).await.unwrap();
    let (head, body) = read_h1_response(&mut busy).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["response"]["uid"], "u-1");
    // Closed by the server once answered.
    let mut rest = Vec::new();
    assert_eq!(busy.read_to_end(&mut rest).await.unwrap_or(0), 0);
    // The idle one is closed after the lame-duck time, and the server exits then.
    let mut rest = Vec::new();
    assert_eq!(idle.read_to_end(&mut rest).await.unwrap_or(0), 0);
    tokio::time::timeout(Duration::from_secs(5), s.served)
        .await
        .expect("the server did not exit after the lame-duck time")
        .unwrap()
        .unwrap();
    let took = stopped_at.elapsed();
    assert!(
        took >= asya_webhook::server::LAME_DUCK,
        "idle connections closed after {took:?}, before the lame-duck time"
    );
}
