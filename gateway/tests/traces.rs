//! The gateway's span parenting against the real servers of tests/services (RabbitMQ, and
//! Jaeger v2 as the trace backend): a tool call sent with a known `traceparent` is one SERVER
//! span under it, with a PRODUCER `send` child whose context is exactly what the envelope in
//! the first actor's queue carries.

#[path = "../../tests/services/require.rs"]
mod require;

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use asya_transport::Transport;
use asya_transport::rabbitmq::{RabbitSettings, RabbitTransport};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BIN: &str = env!("CARGO_BIN_EXE_asya-gateway");
const WAIT: Duration = Duration::from_secs(60);

struct Gateway(Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn have_servers() -> bool {
    require::services(
        "RabbitMQ and Jaeger (tests/services)",
        "source tests/services/env",
        &[
            "ASYA_TEST_RABBITMQ_URL",
            "ASYA_TEST_JAEGER_QUERY_URL",
            "ASYA_TEST_JAEGER_OTLP_ENDPOINT",
        ],
    )
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` on 127.0.0.1:`port`: status and body.
async fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    // Jaeger answers chunked: the JSON is between the first size line and the last chunk.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Some((status, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

async fn post_call(addr: SocketAddr, traceparent: &str, body: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /tools/call HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         traceparent: {traceparent}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, body.to_string())
}

/// The spans of `trace_id` once Jaeger has at least `n`.
async fn spans_of(trace_id: &str, n: usize) -> Vec<Value> {
    let url = var("ASYA_TEST_JAEGER_QUERY_URL");
    let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    let deadline = Instant::now() + WAIT;
    let mut last = String::new();
    loop {
        if let Some((200, body)) = get(port, &format!("/api/traces/{trace_id}")).await
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
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn references(span: &Value) -> Vec<(String, String)> {
    span["references"]
        .as_array()
        .map(|refs| {
            refs.iter()
                .map(|r| {
                    (
                        r["refType"].as_str().unwrap_or_default().to_string(),
                        r["spanID"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_a_server_span_under_the_callers_context_and_the_envelope_carries_its_send() {
    if !have_servers() {
        return;
    }
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let ns = format!("gwtrc{}", nanos % 1_000_000_000);
    let queue = format!("asya-{ns}-a");
    // The first actor's queue, declared and bound before the call (as the provisioner would).
    let actor = Arc::new(RabbitTransport::new(
        RabbitSettings {
            url: var("ASYA_TEST_RABBITMQ_URL"),
            url_source: "ASYA_TEST_RABBITMQ_URL",
            exchange: "asya".into(),
            queue: queue.clone(),
            prefetch: 10,
            auto_create: true,
            max_redeliveries: 10,
            publish_only: false,
        },
        Box::new(|| {}),
    ));
    actor.ensure_connected().await;

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("tools.yaml"),
        // timeout 1: the call answers with the envelope id instead of waiting for a result.
        format!("tools:\n- {{name: t, route: [a], namespace: {ns}, timeout: 1}}\n"),
    )
    .unwrap();
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let _gw = Gateway(
        Command::new(BIN)
            .args(["serve", "--no-auth", "--addr", &addr.to_string()])
            .arg("--tools")
            .arg(dir.path().join("tools.yaml"))
            .args(["--rabbitmq-url", &var("ASYA_TEST_RABBITMQ_URL")])
            .env("OTEL_SERVICE_NAME", "asya-gateway-test")
            .env(
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                var("ASYA_TEST_JAEGER_OTLP_ENDPOINT"),
            )
            // Exported within a second rather than OTel's default five.
            .env("OTEL_BSP_SCHEDULE_DELAY", "200")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the gateway did not listen in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let trace_id = format!("{:032x}", nanos ^ (0x6777 << 100));
    let caller = "00f067aa0ba902b7";
    let (status, body) = post_call(
        addr,
        &format!("00-{trace_id}-{caller}-01"),
        r#"{"name":"t","arguments":{}}"#,
    )
    .await;
    assert!((200..300).contains(&status), "{status} {body}");

    // The envelope in the first actor's queue carries the PRODUCER span's context.
    let deadline = Instant::now() + WAIT;
    let envelope: Value = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no envelope in {queue} in {WAIT:?}");
        if let Ok(Ok(batch)) = tokio::time::timeout(left, actor.receive()).await
            && let Some(m) = batch.into_iter().next()
        {
            let _ = actor.ack(&m.handle).await;
            break serde_json::from_slice(&m.body).unwrap();
        }
    };
    let carried = envelope["headers"]["traceparent"]
        .as_str()
        .unwrap()
        .to_string();
    let parts: Vec<&str> = carried.split('-').collect();
    assert_eq!((parts[1], parts[3]), (trace_id.as_str(), "01"), "{carried}");
    let send_id = parts[2].to_string();

    let spans = spans_of(&trace_id, 2).await;
    let by_name = |n: &str| {
        spans
            .iter()
            .find(|s| s["operationName"] == n)
            .unwrap_or_else(|| panic!("no span {n:?} in {spans:?}"))
    };
    let server = by_name("call t");
    let send = by_name(&format!("send {queue}"));
    let server_id = server["spanID"].as_str().unwrap();
    // The call continues the caller's context (Jaeger shows a parent that is also linked
    // as one FOLLOWS_FROM reference), and the send is the call's child with the carried id.
    assert_eq!(
        references(server)
            .into_iter()
            .map(|(_, id)| id)
            .collect::<Vec<_>>(),
        vec![caller.to_string()],
        "{server}"
    );
    assert_eq!(send["spanID"].as_str(), Some(send_id.as_str()), "{send}");
    assert_eq!(
        references(send),
        vec![("CHILD_OF".to_string(), server_id.to_string())],
        "{send}"
    );
    let kind_of = |s: &Value| {
        s["tags"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["key"] == "span.kind"))
            .and_then(|t| t["value"].as_str())
            .map(str::to_string)
    };
    assert_eq!(kind_of(server).as_deref(), Some("server"));
    assert_eq!(kind_of(send).as_deref(), Some("producer"));
}
