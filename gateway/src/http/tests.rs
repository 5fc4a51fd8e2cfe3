//! Which layers stand in front of which audience: the whole router on a local port, spoken
//! to in plain HTTP/1.1.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Guard, Server, router};
use crate::app::App;
use crate::send::{SendConfig, Senders};
use crate::store::Store;
use crate::tools::Tools;

const TOKEN: &str = "test-token-0123456789";

/// A gateway with one token, a burst of one request and a body limit of 64 bytes.
async fn serve() -> SocketAddr {
    let senders = Senders::new(&SendConfig::default()).await;
    let app = Arc::new(App::new(
        Tools::from_yaml("").unwrap(),
        Store::memory(),
        senders,
        "default".into(),
    ));
    let tokens = HashSet::from([TOKEN.to_string()]);
    let guard = Arc::new(Guard::new(Some(tokens), 0.001, 1.0, 64));
    let mcp = crate::mcp::router(app.clone(), Vec::new(), 64);
    let server = Arc::new(Server { app, guard });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let svc = router(server, mcp).into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, svc).await });
    addr
}

struct Reply {
    status: u16,
    head: String,
    body: Value,
}

async fn call(addr: SocketAddr, method: &str, path: &str, token: bool, body: &str) -> Reply {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = if token {
        format!("Authorization: Bearer {TOKEN}\r\n")
    } else {
        String::new()
    };
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{auth}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
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
    Reply {
        status,
        head: head.to_ascii_lowercase(),
        body: serde_json::from_str(body).unwrap_or(Value::Null),
    }
}

#[tokio::test]
async fn each_audience_has_its_own_layers() {
    let gw = serve().await;
    // Probes: open.
    assert_eq!(call(gw, "GET", "/health", false, "").await.status, 200);
    assert_eq!(call(gw, "GET", "/metrics", false, "").await.status, 200);
    // Callers: a token, then the rate limit (a burst of one).
    let r = call(gw, "GET", "/tools", false, "").await;
    assert_eq!((r.status, &r.body["error"]), (401, &json!("unauthorized")));
    assert_eq!(call(gw, "POST", "/mcp", false, "{}").await.status, 401);
    assert_eq!(
        call(gw, "GET", "/nope", false, "").await.status,
        401,
        "unknown paths too"
    );
    assert_eq!(call(gw, "GET", "/tools", true, "").await.status, 200);
    let r = call(gw, "GET", "/tools", true, "").await;
    assert_eq!((r.status, &r.body["error"]), (429, &json!("rate_limited")));
    assert!(r.head.contains("retry-after:"), "{}", r.head);
    // Reports: a token, never the rate limit, the body limit.
    let progress = r#"{"actor":"a","phase":"received","current":0,"total":1}"#;
    let r = call(gw, "POST", "/envelopes/e/progress", false, progress).await;
    assert_eq!(r.status, 401);
    for _ in 0..3 {
        let r = call(gw, "POST", "/envelopes/e/progress", true, progress).await;
        assert_eq!(
            (r.status, &r.body["error"]),
            (404, &json!("unknown_envelope"))
        );
    }
    let r = call(
        gw,
        "POST",
        "/envelopes",
        true,
        r#"{"id":"c","parent_id":"p"}"#,
    )
    .await;
    assert_eq!((r.status, &r.body["status"]), (201, &json!("running")));
    let r = call(
        gw,
        "POST",
        "/envelopes/c/final",
        true,
        r#"{"status":"done"}"#,
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.body["message"],
        "status: \"done\": must be succeeded or failed"
    );
    let r = call(gw, "POST", "/envelopes/c/progress", true, &"x".repeat(65)).await;
    assert_eq!((r.status, &r.body["error"]), (413, &json!("too_large")));
    let r = call(
        gw,
        "POST",
        "/envelopes/c/final",
        true,
        r#"{"status":"failed"}"#,
    )
    .await;
    assert_eq!((r.status, &r.body["status"]), (200, &json!("failed")));
}
