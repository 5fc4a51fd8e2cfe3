//! The exporter against the real trace backend of tests/services (Jaeger v2): a span posted
//! as OTLP JSON is found by its ids with its kind, attributes, status and parent; a path the
//! collector does not serve is an error naming the URL and the collector's answer.

#[path = "../../tests/services/require.rs"]
mod require;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use asya_telemetry::JsonExporter;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter, SpanLinks};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn have_jaeger() -> bool {
    require::services(
        "Jaeger (tests/services/jaeger)",
        "source tests/services/env",
        &[
            "ASYA_TEST_JAEGER_QUERY_URL",
            "ASYA_TEST_JAEGER_OTLP_ENDPOINT",
        ],
    )
}

fn span(trace: u128, id: u64, parent: u64) -> SpanData {
    let now = SystemTime::now();
    SpanData {
        span_context: SpanContext::new(
            TraceId::from(trace),
            SpanId::from(id),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        ),
        parent_span_id: SpanId::from(parent),
        parent_span_is_remote: true,
        span_kind: SpanKind::Producer,
        name: "send asya-ns-b".into(),
        start_time: now - Duration::from_millis(5),
        end_time: now,
        attributes: vec![
            KeyValue::new("messaging.destination.name", "asya-ns-b"),
            KeyValue::new("retries", 2_i64),
        ],
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: Status::error("broker refused"),
        instrumentation_scope: InstrumentationScope::builder("asya-telemetry-test").build(),
    }
}

/// `GET path` of the query API, the chunked body joined.
async fn get(port: u16, path: &str) -> Option<String> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.ok()?;
    let (head, mut body) = raw.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Some(body.to_string());
    }
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).ok()?;
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    Some(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_posted_span_is_found_in_jaeger_with_what_it_recorded() {
    if !have_jaeger() {
        return;
    }
    let endpoint = std::env::var("ASYA_TEST_JAEGER_OTLP_ENDPOINT").unwrap();
    let query = std::env::var("ASYA_TEST_JAEGER_QUERY_URL").unwrap();
    let port: u16 = query.rsplit(':').next().unwrap().parse().unwrap();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let trace = nanos ^ (0x7e1e << 100);
    let mut exporter = JsonExporter::new(&endpoint).unwrap();
    exporter.set_resource(
        &Resource::builder_empty()
            .with_service_name("asya-telemetry-test")
            .build(),
    );
    exporter
        .export(vec![span(trace, 0x0a0b0c0d0e0f1011, 0x00f067aa0ba902b7)])
        .await
        .unwrap();

    let path = format!("/api/traces/{trace:032x}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let s = loop {
        if let Some(body) = get(port, &path).await
            && let Ok(v) = serde_json::from_str::<Value>(&body)
            && let Some(s) = v["data"][0]["spans"].get(0)
        {
            break s.clone();
        }
        assert!(
            Instant::now() < deadline,
            "trace {trace:032x} not in Jaeger in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let tags: Vec<(String, Value)> = s["tags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["key"].as_str().unwrap().to_string(), t["value"].clone()))
        .collect();
    let tag = |k: &str| {
        tags.iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(s["spanID"], "0a0b0c0d0e0f1011", "{s}");
    assert_eq!(s["operationName"], "send asya-ns-b");
    assert_eq!(s["references"][0]["spanID"], "00f067aa0ba902b7", "{s}");
    assert_eq!(tag("span.kind"), Some("producer".into()), "{s}");
    assert_eq!(tag("messaging.destination.name"), Some("asya-ns-b".into()));
    assert_eq!(
        tag("retries"),
        Some(2.into()),
        "an intValue is an integer: {s}"
    );
    assert_eq!(tag("error"), Some(true.into()), "{s}");
    assert_eq!(
        tag("otel.status_description"),
        Some("broker refused".into()),
        "{s}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_the_collector_does_not_serve_is_an_error_with_its_answer() {
    if !have_jaeger() {
        return;
    }
    let endpoint = std::env::var("ASYA_TEST_JAEGER_OTLP_ENDPOINT").unwrap();
    let exporter = JsonExporter::new(&format!("{endpoint}/not-otlp")).unwrap();
    let err = exporter
        .export(vec![span(1, 2, 3)])
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("/not-otlp/v1/traces") && err.contains("404"),
        "{err}"
    );
}
