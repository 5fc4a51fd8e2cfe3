//! Traces across hops against the real trace backend (Jaeger v2 from tests/services): an
//! envelope sent with a known `traceparent` through two real sidecars and runtimes on each
//! transport comes out as one trace whose consumer, runtime-call and producer spans are linked
//! parent to child hop by hop, with an ERROR span for a handler that failed.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{Actor, ActorSpec, Client, Kind, queue, unique_ns};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

macro_rules! both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn rabbitmq() {
                if !super::have_jaeger(super::Kind::Rabbit) {
                    return;
                }
                super::$name(super::Kind::Rabbit).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqs() {
                if !super::have_jaeger(super::Kind::Sqs) {
                    return;
                }
                super::$name(super::Kind::Sqs).await
            }
        }
    )*};
}

both!(fan_out_then_failure_is_one_linked_trace);

fn have_jaeger(kind: Kind) -> bool {
    common::have(kind)
        && common::have_var(
            "Jaeger (tests/services/jaeger)",
            "ASYA_TEST_JAEGER_QUERY_URL",
        )
        && common::have_var(
            "Jaeger (tests/services/jaeger)",
            "ASYA_TEST_JAEGER_OTLP_ENDPOINT",
        )
}

/// A trace id of this run only (the backend keeps earlier runs' traces).
fn fresh_trace_id(kind: Kind) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{:032x}", nanos ^ ((kind as u128 + 1) << 100))
}

fn traced_actor(kind: Kind, ns: &str, name: &str) -> Actor {
    let otlp = std::env::var("ASYA_TEST_JAEGER_OTLP_ENDPOINT").unwrap();
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.as_str()),
        ("OTEL_SERVICE_NAME", name),
        ("OTEL_TRACES_SAMPLER_ARG", "1"),
        // Export within a fraction of a second instead of the SDK's 5 s default.
        ("OTEL_BSP_SCHEDULE_DELAY", "200"),
    ];
    Actor::start(
        kind,
        ns,
        name,
        ActorSpec {
            env: &env,
            ..Default::default()
        },
    )
}

/// The trace's spans from the query API, once it has at least `n` of them (or panics at
/// `WAIT`).
fn spans_of(trace_id: &str, n: usize) -> Vec<Value> {
    let url = std::env::var("ASYA_TEST_JAEGER_QUERY_URL").unwrap();
    let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    let deadline = Instant::now() + WAIT;
    let mut last = String::new();
    loop {
        if let Some((200, body)) = common::http_get(port, &format!("/api/traces/{trace_id}"))
            && let Ok(v) = serde_json::from_str::<Value>(&body)
        {
            let spans = v["data"][0]["spans"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if spans.len() >= n {
                return spans;
            }
            last = format!("{} spans", spans.len());
        }
        assert!(
            Instant::now() < deadline,
            "trace {trace_id} has not {n} spans in {WAIT:?} (last: {last})"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn tag<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["tags"]
        .as_array()?
        .iter()
        .find(|t| t["key"] == key)
        .map(|t| &t["value"])
}

fn parent(span: &Value) -> Option<String> {
    span["references"]
        .as_array()?
        .iter()
        .find(|r| r["refType"] == "CHILD_OF")
        .and_then(|r| r["spanID"].as_str())
        .map(str::to_string)
}

/// A consumer span's one reference: its parent, which is also its link. Jaeger shows a parent
/// that a link names too as a single FOLLOWS_FROM reference (its OTLP translator's rule).
fn consumed_from(span: &Value) -> Option<String> {
    let refs = span["references"].as_array()?;
    assert_eq!(refs.len(), 1, "parent and link are one reference: {span}");
    refs[0]["spanID"].as_str().map(str::to_string)
}

async fn fan_out_then_failure_is_one_linked_trace(kind: Kind) {
    let ns = unique_ns("trc");
    let sink = Client::new(kind, &queue(&ns, "x-sink")).await;
    let sump = Client::new(kind, &queue(&ns, "x-sump")).await;
    let input = Client::new(kind, &queue(&ns, "x-test-input")).await;
    let a = traced_actor(kind, &ns, "a");
    let _b = traced_actor(kind, &ns, "b");
    let trace_id = fresh_trace_id(kind);
    let caller = "00f067aa0ba902b7";
    let tp = format!("00-{trace_id}-{caller}-01");

    // a fans out to two envelopes, b finishes both: 1 + 2 hops.
    let env = json!({"id": "t1", "route": {"actors": ["a", "b"], "current": 0},
        "headers": {"traceparent": tp, "tracestate": "vendor=1"},
        "payload": {"do": "fanout", "n": 2}});
    input.send(&a.queue(), &env).await;
    let done = sink.take(2, WAIT).await;
    assert_eq!(done.len(), 2, "fan-out did not reach x-sink");
    for m in &done {
        let sent = m["headers"]["traceparent"].as_str().unwrap();
        assert!(sent.starts_with(&format!("00-{trace_id}-")), "{sent}");
        assert_eq!(m["headers"]["tracestate"], "vendor=1");
    }
    assert_ne!(
        done[0]["headers"]["traceparent"],
        done[1]["headers"]["traceparent"]
    );

    // a: process, runtime call, 2 sends; b twice: process, runtime call, send to x-sink.
    let spans = spans_of(&trace_id, 10);
    let by_id: HashMap<String, &Value> = spans
        .iter()
        .map(|s| (s["spanID"].as_str().unwrap().to_string(), s))
        .collect();
    let named = |prefix: &str| -> Vec<&Value> {
        spans
            .iter()
            .filter(|s| s["operationName"].as_str().unwrap().starts_with(prefix))
            .collect()
    };
    let a_queue = a.queue();
    let process_a: Vec<_> = named(&format!("process {a_queue}"));
    assert_eq!(process_a.len(), 1, "{spans:#?}");
    let process_a = process_a[0];
    assert_eq!(consumed_from(process_a).as_deref(), Some(caller));
    assert_eq!(tag(process_a, "span.kind").unwrap(), "consumer");
    assert_eq!(tag(process_a, "messaging.message.id").unwrap(), "t1");
    assert_eq!(
        tag(process_a, "messaging.operation.type").unwrap(),
        "process"
    );
    let a_id = process_a["spanID"].as_str().unwrap();
    let b_queue = queue(&ns, "b");
    let sends_a: Vec<_> = named(&format!("send {b_queue}"));
    assert_eq!(sends_a.len(), 2, "one producer span per fan-out item");
    for s in &sends_a {
        assert_eq!(parent(s).as_deref(), Some(a_id));
        assert_eq!(tag(s, "span.kind").unwrap(), "producer");
    }
    let process_b = named(&format!("process {b_queue}"));
    assert_eq!(process_b.len(), 2);
    for p in &process_b {
        let from = consumed_from(p).unwrap();
        assert_eq!(by_id[&from]["operationName"], format!("send {b_queue}"));
    }
    let calls = named("runtime call");
    assert_eq!(calls.len(), 3);
    for c in &calls {
        let p = parent(c).unwrap();
        assert!(
            by_id[&p]["operationName"]
                .as_str()
                .unwrap()
                .starts_with("process "),
            "{c}"
        );
    }
    assert_eq!(named(&format!("send {}", queue(&ns, "x-sink"))).len(), 2);

    // A handler error: an ERROR runtime-call span and a send to x-sump in the same chain.
    let failing = fresh_trace_id(kind);
    let env = json!({"id": "t2", "route": {"actors": ["a", "b"], "current": 0},
        "headers": {"traceparent": format!("00-{failing}-{caller}-01")},
        "payload": {"do": "raise", "key": "bad input 3"}});
    input.send(&a.queue(), &env).await;
    assert_eq!(sump.take(1, WAIT).await.len(), 1, "nothing reached x-sump");
    let spans = spans_of(&failing, 3);
    let call = spans
        .iter()
        .find(|s| s["operationName"] == "runtime call")
        .expect("a runtime call span");
    assert_eq!(tag(call, "error").unwrap(), true, "{call}");
    assert_eq!(tag(call, "error.type").unwrap(), "ValueError");
    // The handler's message is the status, as x-sump's `x-asya-error` has it (issue 37:
    // `asya trace` showed `ValueError: ValueError`).
    assert_eq!(
        tag(call, "otel.status_description").unwrap(),
        "handler failed on purpose: bad input 3"
    );
    assert!(
        spans
            .iter()
            .any(|s| s["operationName"] == format!("send {}", queue(&ns, "x-sump")))
    );
}
