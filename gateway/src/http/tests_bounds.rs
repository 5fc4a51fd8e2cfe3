//! Issue 34, the gateway's own surface bounded: a rate limit and a bound in flight per report
//! namespace, a bound in flight per client token (an open stream counting), streams that end
//! with their client, and report tokens refused once their namespace is gone. Over HTTP
//! against the whole router.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::tests::{
    KEY, Reply, Setup, TOKEN, UID, app_store_put, report_token, request, serve_guarded, serve_with,
};
use crate::access::NamespaceUids;
use crate::access::namespaces::Watched;

const PROGRESS: &str = r#"{"actor":"a","phase":"received","current":0,"total":1}"#;
const OTHER: &str = "other-client-token-0123456789";

fn refused(r: &Reply, status: u16, code: &str) {
    assert_eq!(
        (r.status, r.body["error"].as_str()),
        (status, Some(code)),
        "{}",
        r.text
    );
}

/// A request whose headers are sent and whose body is not: in flight until the socket
/// closes.
async fn hold_report(gw: SocketAddr, token: &str) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(gw).await.unwrap();
    let req = format!(
        "POST /envelopes/e/progress HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    s
}

/// Opens the event stream of `id` and reads up to its first event: the stream is open.
async fn open_stream(gw: SocketAddr, id: &str, token: &str) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(gw).await.unwrap();
    let req = format!(
        "GET /envelopes/{id}/stream HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(15).any(|w| w == b"event: progress") {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("the stream's first event within 10 s")
            .unwrap();
        assert!(n > 0, "closed before its first event");
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    s
}

/// Retries `f` until it returns `Some`, for at most 10 s: a bounded poll on a condition.
async fn within_10s<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what} within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_report_namespace_is_rate_limited_on_its_own() {
    let mut setup = Setup::default();
    setup.limits.report_rate = 0.001;
    setup.limits.report_burst = 2.0;
    let (gw, app) = serve_with(setup).await;
    let team = report_token("team");
    for _ in 0..2 {
        let r = request(gw, "POST", "/envelopes/e/progress", Some(&team), PROGRESS).await;
        refused(&r, 404, "unknown_envelope");
    }
    let r = request(gw, "POST", "/envelopes/e/progress", Some(&team), PROGRESS).await;
    refused(&r, 429, "rate_limited");
    assert_eq!(
        r.body["message"],
        "report namespace \"team\": more than 0.001 reports per second (burst 2; \
         --report-rate-limit, --report-rate-burst)"
    );
    assert_eq!(
        r.body["details"],
        json!({"namespace": "team", "rate": 0.001, "burst": 2.0})
    );
    assert!(r.head.contains("retry-after:"), "{}", r.head);
    // Child and final reports share the bucket.
    let r = request(
        gw,
        "POST",
        "/envelopes",
        Some(&team),
        r#"{"id":"c","parent_id":"p"}"#,
    )
    .await;
    refused(&r, 429, "rate_limited");
    // Another namespace has its own bucket; clients are not counted in it.
    let other = report_token("team-a");
    let r = request(gw, "POST", "/envelopes/e/progress", Some(&other), PROGRESS).await;
    refused(&r, 404, "unknown_envelope");
    assert_eq!(
        request(gw, "GET", "/tools", Some(TOKEN), "").await.status,
        200
    );
    let metrics = app.metrics.encode();
    assert!(
        metrics.contains("asya_gateway_requests_refused_total{kind=\"report_rate_limit\"} 2"),
        "{metrics}"
    );
}

#[tokio::test]
async fn reports_in_flight_are_bounded_per_namespace() {
    let mut setup = Setup::default();
    setup.limits.report_in_flight = 1;
    let (gw, _app) = serve_with(setup).await;
    let team = report_token("team");
    let held = hold_report(gw, &team).await;
    let r = within_10s("the held report counted", || async {
        let r = request(gw, "POST", "/envelopes/e/progress", Some(&team), PROGRESS).await;
        (r.status == 429).then_some(r)
    })
    .await;
    refused(&r, 429, "too_many_concurrent");
    assert_eq!(
        r.body["message"],
        "report namespace \"team\": 1 reports are in flight already (the limit per report \
         namespace, --max-in-flight-per-report-namespace)"
    );
    assert_eq!(r.body["details"], json!({"limit": 1, "namespace": "team"}));
    let other = report_token("team-a");
    let r = request(gw, "POST", "/envelopes/e/progress", Some(&other), PROGRESS).await;
    refused(&r, 404, "unknown_envelope");
    drop(held);
    within_10s("the held report's slot freed", || async {
        let r = request(gw, "POST", "/envelopes/e/progress", Some(&team), PROGRESS).await;
        (r.status == 404).then_some(())
    })
    .await;
}

/// "SSE streams count while open": a token with one stream open may open nothing else; a
/// client gone frees its slot, its stream and its subscription.
#[tokio::test]
async fn a_client_tokens_requests_in_flight_are_bounded_and_a_stream_counts_while_open() {
    let mut setup = Setup {
        tokens: format!("{TOKEN}\n{OTHER}\n"),
        ..Setup::default()
    };
    setup.limits.client_in_flight = 1;
    let (gw, app, guard) = serve_guarded(setup).await;
    app_store_put(&app, "e").await;
    let stream = open_stream(gw, "e", TOKEN).await;
    assert_eq!(guard.client_in_flight(TOKEN), 1);
    let r = request(gw, "GET", "/tools", Some(TOKEN), "").await;
    refused(&r, 429, "too_many_concurrent");
    assert_eq!(
        r.body["message"],
        "1 requests of this caller are in flight already (the limit per token, \
         --max-in-flight-per-token); an open stream counts until it ends"
    );
    assert!(r.head.contains("retry-after: 1"), "{}", r.head);
    assert_eq!(
        request(gw, "GET", "/tools", Some(OTHER), "").await.status,
        200
    );
    drop(stream);
    within_10s("the stream's slot freed", || async {
        let r = request(gw, "GET", "/tools", Some(TOKEN), "").await;
        (r.status == 200).then_some(())
    })
    .await;
    assert_eq!(guard.client_in_flight(TOKEN), 0);
}

/// A client that goes away takes its stream with it: the stream, its store subscription
/// and its count end although the envelope never changes again.
#[tokio::test]
async fn a_stream_ends_with_its_client() {
    let (gw, app) = serve_with(Setup::default()).await;
    app_store_put(&app, "e").await;
    let mut open = app.metrics.open_streams();
    let subscribers = app.store.subscribers();
    let first = open_stream(gw, "e", TOKEN).await;
    let second = open_stream(gw, "e", TOKEN).await;
    assert_eq!(*open.borrow_and_update(), 2);
    assert_eq!(app.store.subscribers(), subscribers + 2);
    drop(first);
    tokio::time::timeout(Duration::from_secs(10), open.wait_for(|n| *n == 1))
        .await
        .expect("the stream ended within 10 s of its client")
        .unwrap();
    // The subscription is dropped before the count (the stream's fields, in order).
    assert_eq!(app.store.subscribers(), subscribers + 1);
    drop(second);
    tokio::time::timeout(Duration::from_secs(10), open.wait_for(|n| *n == 0))
        .await
        .expect("the stream ended within 10 s of its client")
        .unwrap();
    assert_eq!(app.store.subscribers(), subscribers);
    assert!(
        app.metrics.encode().contains("asya_gateway_open_streams 0"),
        "the gauge is back"
    );
}

/// A stream whose envelope ends also ends, and is not counted after.
#[tokio::test]
async fn a_stream_ends_at_the_final_status() {
    let (gw, app) = serve_with(Setup::default()).await;
    app_store_put(&app, "e").await;
    let mut open = app.metrics.open_streams();
    let _stream = open_stream(gw, "e", TOKEN).await;
    app.store
        .finish("e", crate::store::Status::Succeeded, None, None, None)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), open.wait_for(|n| *n == 0))
        .await
        .expect("the stream ended with its envelope")
        .unwrap();
}

/// The namespace deleted and made again: the old namespace's token is refused (403, naming
/// the namespace, never the token); before the first list of namespaces, 503.
#[tokio::test]
async fn a_report_token_outlives_nothing_of_its_namespace() {
    use kube::core::metadata::PartialObjectMetaExt;
    use kube::runtime::watcher::Event;
    let ns = |name: &str, uid: &str| {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.into()),
            uid: Some(uid.into()),
            ..Default::default()
        }
        .into_response_partial::<k8s_openapi::api::core::v1::Namespace>()
    };
    let (watched, mut feed) = Watched::new();
    let setup = Setup {
        namespaces: NamespaceUids::Watched(watched),
        ..Setup::default()
    };
    let (gw, _app) = serve_with(setup).await;
    let old = report_token("team");

    let r = request(gw, "POST", "/envelopes/e/progress", Some(&old), PROGRESS).await;
    refused(&r, 503, "namespace_uids_not_listed");
    assert!(r.head.contains("retry-after: 1"), "{}", r.head);

    feed.apply(&Event::Init);
    feed.apply(&Event::InitApply(ns("team", UID)));
    feed.apply(&Event::InitDone);
    let r = request(gw, "POST", "/envelopes/e/progress", Some(&old), PROGRESS).await;
    refused(&r, 404, "unknown_envelope");

    // Deleted, and made again by someone else under the same name.
    feed.apply(&Event::Delete(ns("team", UID)));
    let r = request(gw, "POST", "/envelopes/e/progress", Some(&old), PROGRESS).await;
    refused(&r, 403, "report_token_stale");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("no namespace of that name")
    );
    let new_uid = "00000000-0000-4000-8000-0000000000bb";
    feed.apply(&Event::Apply(ns("team", new_uid)));
    for (method, path, body) in [
        ("POST", "/envelopes/e/progress", PROGRESS),
        ("POST", "/envelopes", r#"{"id":"c","parent_id":"p"}"#),
        ("POST", "/envelopes/e/final", r#"{"status":"succeeded"}"#),
    ] {
        let r = request(gw, method, path, Some(&old), body).await;
        refused(&r, 403, "report_token_stale");
        assert_eq!(
            r.body["message"],
            "the report token of namespace \"team\" was issued for an earlier namespace of \
             that name, deleted since and made again: the provisioner issues the current \
             namespace's token and its actors' pods roll onto it"
        );
        assert!(!r.text.contains(&old), "the token is never told back");
    }
    let current = crate::access::ReportKey::new(KEY)
        .unwrap()
        .token("team", new_uid)
        .unwrap();
    let r = request(
        gw,
        "POST",
        "/envelopes/e/progress",
        Some(&current),
        PROGRESS,
    )
    .await;
    refused(&r, 404, "unknown_envelope");

    // The first format, though made by the same key: refused, saying why.
    let v1 = "asya-report.team.a47a24a2342dd4329b1647e65982c7465759344300009e979ae61997e9fc0085";
    let r = request(gw, "POST", "/envelopes/e/progress", Some(v1), PROGRESS).await;
    refused(&r, 401, "report_token_outdated");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("no longer accepted")
    );
}
