//! `asya trace` from the trace backend, against the real Jaeger of tests/services: spans as
//! a sidecar exports them (OTLP/HTTP JSON: a hop, its runtime call, a fan-out of two sends
//! and the failing hop after one) are found by envelope id, read as one trace, drawn as a
//! tree and turned into hops; the same actor name in another namespace is left out; an
//! unknown id is nothing; a backend that does not answer is a clear error. Service names
//! and ids are this run's only (the backend keeps earlier runs' traces).

#[path = "../../tests/services/require.rs"]
mod require;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use asya_cli::cmd::trace::find_in_backend;
use asya_cli::error::CliError;
use asya_cli::trace_backend;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

fn have_jaeger() -> bool {
    require::servers(
        "Jaeger (tests/services/jaeger)",
        &[
            "ASYA_TEST_JAEGER_QUERY_URL",
            "ASYA_TEST_JAEGER_OTLP_ENDPOINT",
        ],
    )
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn kv(key: &str, value: &str) -> Value {
    json!({"key": key, "value": {"stringValue": value}})
}

/// One span in OTLP JSON: `kind` 5 consumer, 4 producer, 1 internal.
fn span(
    trace: &str,
    id: &str,
    parent: &str,
    name: &str,
    kind: u8,
    at: u128,
    attrs: Vec<Value>,
) -> Value {
    json!({
        "traceId": trace, "spanId": id, "parentSpanId": parent, "name": name, "kind": kind,
        "startTimeUnixNano": at.to_string(), "endTimeUnixNano": (at + 2_000_000).to_string(),
        "attributes": attrs, "status": {}
    })
}

fn resource(service: &str, ns: &str, spans: Vec<Value>) -> Value {
    json!({
        "resource": {"attributes": [kv("service.name", service), kv("k8s.namespace.name", ns)]},
        "scopeSpans": [{"scope": {"name": "asya-sidecar"}, "spans": spans}]
    })
}

async fn export(body: Value) {
    let endpoint = std::env::var("ASYA_TEST_JAEGER_OTLP_ENDPOINT").unwrap();
    let client = asya_transport::http_client::client::<Full<Bytes>>().unwrap();
    let req = hyper::Request::post(format!("{endpoint}/v1/traces"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let status = resp.status();
    let text = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(status.is_success(), "OTLP export: {status} {text:?}");
}

#[tokio::test]
async fn a_fan_out_with_a_failing_hop_is_one_tree() {
    if !have_jaeger() {
        return;
    }
    let base = std::env::var("ASYA_TEST_JAEGER_QUERY_URL").unwrap();
    let run = now_ns();
    // Both halves non-zero: Jaeger's API drops a trace id's leading zeros.
    let trace = format!("{:016x}{:016x}", run as u64 | 1 << 63, run as u64);
    let other_trace = format!("{:016x}{:016x}", run as u64 | 1 << 62, run as u64);
    let (a, b) = (format!("tb-a-{run}"), format!("tb-b-{run}"));
    let id = format!("env-{run}");
    let t = now_ns();
    let mid = |k: &str, v: &str| {
        vec![
            kv("messaging.message.id", v),
            kv("messaging.destination.name", k),
        ]
    };
    let mut failing_call = span(
        &trace,
        "00000000000000b4",
        "00000000000000b3",
        "runtime call",
        1,
        t + 900_000,
        vec![kv("error.type", "ValueError")],
    );
    failing_call["status"] = json!({"code": 2, "message": "bad input"});
    export(json!({"resourceSpans": [
        resource(&a, "ns1", vec![
            span(&trace, "00000000000000a1", "", "process asya-ns1-a", 5, t, mid("asya-ns1-a", &id)),
            span(&trace, "00000000000000a2", "00000000000000a1", "runtime call", 1, t + 100_000, vec![]),
            span(&trace, "00000000000000a3", "00000000000000a1", "send asya-ns1-b", 4, t + 300_000, vec![]),
            span(&trace, "00000000000000a4", "00000000000000a1", "send asya-ns1-b", 4, t + 400_000, vec![]),
        ]),
        resource(&b, "ns1", vec![
            span(&trace, "00000000000000b1", "00000000000000a3", "process asya-ns1-b", 5, t + 700_000, mid("asya-ns1-b", &format!("{id}-0"))),
            span(&trace, "00000000000000b3", "00000000000000a4", "process asya-ns1-b", 5, t + 800_000, mid("asya-ns1-b", &format!("{id}-1"))),
            failing_call,
        ]),
        // Another tenant: an actor of the same name, an envelope of the same id.
        resource(&a, "ns2", vec![
            span(&other_trace, "00000000000000c1", "", "process asya-ns2-a", 5, t, mid("asya-ns2-a", &id)),
        ]),
    ]}))
    .await;

    let actors = vec![a.clone(), b.clone(), "never-traced".to_string()];
    // Jaeger writes spans asynchronously: wait until the whole trace is readable.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (found_trace, spans) = loop {
        if let Some((tid, spans)) = find_in_backend(&base, &actors, "ns1", &id).await.unwrap()
            && spans.len() == 7
        {
            break (tid, spans);
        }
        assert!(
            Instant::now() < deadline,
            "trace of {id} not complete in Jaeger"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(found_trace, trace);
    let tree = trace_backend::render_tree(&spans);
    let shape: Vec<String> = tree
        .lines()
        .map(|l| l.split(" +").next().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        shape,
        vec![
            format!("process asya-ns1-a [{a}]"),
            format!("├─ runtime call [{a}]"),
            format!("├─ send asya-ns1-b [{a}]"),
            format!("│  └─ process asya-ns1-b [{b}]"),
            format!("└─ send asya-ns1-b [{a}]"),
            format!("   └─ process asya-ns1-b [{b}]"),
            format!("      └─ runtime call [{b}]"),
        ],
        "{tree}"
    );
    assert!(
        tree.lines()
            .last()
            .unwrap()
            .ends_with("ERROR ValueError: bad input"),
        "{tree}"
    );
    let hops = trace_backend::hops(&spans);
    let outcomes: Vec<(String, String, String)> = hops
        .iter()
        .map(|h| (h.envelope.clone(), h.actor.clone(), h.outcome.clone()))
        .collect();
    assert_eq!(
        outcomes,
        vec![
            (id.clone(), a.clone(), "completed".into()),
            (format!("{id}-0"), b.clone(), "completed".into()),
            (
                format!("{id}-1"),
                b.clone(),
                "failed: ValueError: bad input".into()
            ),
        ]
    );

    // The other namespace's envelope of the same id is its own trace, and only its own.
    let (tid2, spans2) = find_in_backend(&base, &actors, "ns2", &id)
        .await
        .unwrap()
        .expect("ns2's trace");
    assert_eq!(tid2, other_trace);
    assert_eq!(spans2.len(), 1);

    assert_eq!(
        find_in_backend(&base, &actors, "ns1", &format!("missing-{run}"))
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn a_backend_that_does_not_answer_is_a_clear_error() {
    // A port nothing listens on: bind one, learn it, drop it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = format!("http://127.0.0.1:{port}");
    match find_in_backend(&base, &["a".into()], "ns", "e1").await {
        Err(CliError::Unavailable { what, .. }) => {
            assert!(what.contains(&base), "{what}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}
