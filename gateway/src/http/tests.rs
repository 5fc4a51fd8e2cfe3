//! Which layers stand in front of which audience: the whole router on a local port, spoken
//! to in plain HTTP/1.1.

use std::net::SocketAddr;
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Guard, Limits, Server, router};
use crate::access::{ClientTokens, Credentials, NamespaceUids, ReportKey};
use crate::app::App;
use crate::send::{SendConfig, Senders};
use crate::store::Store;
use crate::tools::Tools;

pub(super) const TOKEN: &str = "test-token-0123456789";
pub(super) const KEY: &[u8] = b"test-report-key-0123456789abcdef";

/// The uid every test namespace has unless a test says otherwise.
pub(super) const UID: &str = "00000000-0000-4000-8000-0000000000aa";

/// The report token of `namespace` (uid [`UID`]) under [`KEY`].
pub(super) fn report_token(namespace: &str) -> String {
    ReportKey::new(KEY).unwrap().token(namespace, UID).unwrap()
}

/// How a test gateway is set up.
pub(super) struct Setup {
    pub tokens: String,
    pub tools: &'static str,
    pub store: Store,
    /// Without limits unless a test sets them.
    pub limits: Limits,
    pub namespaces: NamespaceUids,
}

impl Default for Setup {
    fn default() -> Setup {
        Setup {
            tokens: format!("{TOKEN}\n"),
            tools: "",
            store: Store::memory(),
            limits: Limits {
                rate: 0.0,
                burst: 1.0,
                report_rate: 0.0,
                report_burst: 1.0,
                client_in_flight: 0,
                report_in_flight: 0,
                max_body_bytes: 4096,
            },
            namespaces: NamespaceUids::Off,
        }
    }
}

/// A gateway on a local port with the client tokens, tools and limits of `s`, report tokens
/// from [`KEY`]; its address and state.
pub(super) async fn serve_with(s: Setup) -> (SocketAddr, Arc<App>) {
    let (addr, app, _) = serve_guarded(s).await;
    (addr, app)
}

/// The same, with its guard.
pub(super) async fn serve_guarded(s: Setup) -> (SocketAddr, Arc<App>, Arc<Guard>) {
    let senders = Senders::new(&SendConfig::default()).await;
    let app = Arc::new(App::new(
        Tools::from_yaml(s.tools).unwrap(),
        s.store,
        senders,
        "default".into(),
    ));
    let creds = Credentials {
        clients: ClientTokens::parse(&s.tokens).unwrap(),
        report_key: Some(ReportKey::new(KEY).unwrap()),
        namespaces: s.namespaces,
    };
    let guard = Arc::new(Guard::new(Some(creds), s.limits.clone()));
    let mcp = crate::mcp::router(app.clone(), Vec::new(), s.limits.max_body_bytes);
    let server = Arc::new(Server {
        app: app.clone(),
        guard: guard.clone(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let svc = router(server, mcp).into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, svc).await });
    (addr, app, guard)
}

pub(super) struct Reply {
    pub status: u16,
    pub head: String,
    pub body: Value,
    /// The body as sent (MCP may answer as a server-sent event).
    pub text: String,
}

/// One request with `token` as the bearer token (none: no Authorization header).
pub(super) async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> Reply {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = match token {
        Some(t) => {
            format!("Authorization: Bearer {t}\r\nAccept: application/json, text/event-stream\r\n")
        }
        None => String::new(),
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
        text: body.to_string(),
    }
}

/// With the client token ([`TOKEN`]) or without a token.
async fn call(addr: SocketAddr, method: &str, path: &str, token: bool, body: &str) -> Reply {
    request(addr, method, path, token.then_some(TOKEN), body).await
}

/// Stores envelope `id` of namespace `default` (a call's, as the gateway records it).
pub(super) async fn app_store_put(app: &App, id: &str) {
    let now = crate::store::now_ms();
    let r = crate::store::Record {
        id: id.into(),
        parent_id: None,
        tool: Some("t".into()),
        status: crate::store::Status::Pending,
        progress: 0.0,
        actor: None,
        route: vec!["a".into()],
        result: None,
        error: None,
        created_ms: now,
        updated_ms: now,
        namespace: Some("default".into()),
    };
    app.store.create(&r).await.unwrap();
}

/// One client token, a burst of one request and a body limit of 64 bytes.
#[tokio::test]
async fn each_audience_has_its_own_layers() {
    let mut setup = Setup::default();
    setup.limits.rate = 0.001;
    setup.limits.max_body_bytes = 64;
    let (gw, gw_app) = serve_with(setup).await;
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
    // Reports: a report token, not the callers' rate limit (their own is off here), the
    // body limit.
    let rt = report_token("default");
    let rt = Some(rt.as_str());
    let progress = r#"{"actor":"a","phase":"received","current":0,"total":1}"#;
    let r = call(gw, "POST", "/envelopes/e/progress", false, progress).await;
    assert_eq!(r.status, 401);
    for _ in 0..3 {
        let r = request(gw, "POST", "/envelopes/e/progress", rt, progress).await;
        assert_eq!(
            (r.status, &r.body["error"]),
            (404, &json!("unknown_envelope"))
        );
    }
    let r = request(
        gw,
        "POST",
        "/envelopes",
        rt,
        r#"{"id":"c","parent_id":"p"}"#,
    )
    .await;
    assert_eq!(
        (r.status, &r.body["error"]),
        (404, &json!("unknown_parent")),
        "no child under an unknown parent"
    );
    app_store_put(&gw_app, "p").await;
    let r = request(
        gw,
        "POST",
        "/envelopes",
        rt,
        r#"{"id":"c","parent_id":"p"}"#,
    )
    .await;
    assert_eq!((r.status, &r.body["status"]), (201, &json!("running")));
    let r = request(gw, "POST", "/envelopes/c/final", rt, r#"{"status":"done"}"#).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.body["message"],
        "status: \"done\": must be succeeded or failed"
    );
    let r = request(gw, "POST", "/envelopes/c/progress", rt, &"x".repeat(65)).await;
    assert_eq!((r.status, &r.body["error"]), (413, &json!("too_large")));
    let r = request(
        gw,
        "POST",
        "/envelopes/c/final",
        rt,
        r#"{"status":"failed"}"#,
    )
    .await;
    assert_eq!((r.status, &r.body["status"]), (200, &json!("failed")));
}
