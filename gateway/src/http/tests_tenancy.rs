//! Issue 26, the gateway: a report token only reports, and only on its own namespace's
//! envelopes; client tokens limited to tools and namespaces; a tenant reads only its own
//! envelopes. Over HTTP against the whole router, on the memory store and, when
//! `ASYA_TEST_POSTGRES_URL` names a server, on PostgreSQL.

use std::net::SocketAddr;
use std::sync::Arc;

use serde_json::{Value, json};

use super::tests::{Reply, Setup, TOKEN, report_token, request, serve_with};
use crate::app::App;
use crate::store::{Record, Status, Store, now_ms};

/// Every tool, namespace `team-a` only.
const NS_ONLY: &str = "ns-only-token-0123456789";
/// Tool `t-a` only (in `team-a`).
const ONE_TOOL: &str = "one-tool-token-0123456789";

const TOOLS: &str = r#"
tools:
- {name: t-team, route: [a], namespace: team}
- {name: t-a, route: [a], namespace: team-a}
- {name: t-default, route: [a]}
"#;

const PROGRESS: &str = r#"{"actor":"a","phase":"received","current":0,"total":1}"#;

fn record(id: &str, namespace: Option<&str>) -> Record {
    let now = now_ms();
    Record {
        id: id.into(),
        parent_id: None,
        tool: Some("t".into()),
        status: Status::Pending,
        progress: 0.0,
        actor: None,
        route: vec!["a".into()],
        result: None,
        error: None,
        created_ms: now,
        updated_ms: now,
        namespace: namespace.map(str::to_string),
    }
}

/// A gateway with the three kinds of client token and envelopes `e-team` (namespace
/// `team`), `e-a` (`team-a`) and `e-legacy` (stored before namespaces were).
async fn gateway(store: Store) -> (SocketAddr, Arc<App>) {
    let setup = Setup {
        tokens: format!("{TOKEN}\n{NS_ONLY} namespaces=team-a\n{ONE_TOOL} tools=t-a\n"),
        tools: TOOLS,
        store,
        ..Setup::default()
    };
    let (gw, app) = serve_with(setup).await;
    for (id, ns) in [
        ("e-team", Some("team")),
        ("e-a", Some("team-a")),
        ("e-legacy", None),
    ] {
        app.store.create(&record(id, ns)).await.unwrap();
    }
    (gw, app)
}

fn refused(r: &Reply, status: u16, code: &str) {
    assert_eq!(
        (r.status, r.body["error"].as_str()),
        (status, Some(code)),
        "{}",
        r.body
    );
}

async fn status_of(app: &App, id: &str) -> Option<Status> {
    app.store.get(id).await.unwrap().map(|r| r.status)
}

/// The whole suite on one store.
async fn suite(store: Store) {
    let (gw, app) = gateway(store).await;
    report_token_only_reports(gw).await;
    client_tokens_never_report(gw).await;
    report_token_keeps_to_its_namespace(gw, &app).await;
    limited_clients(gw).await;
    fan_ins_are_kept_per_namespace(gw).await;
}

/// A report token writes only its own namespace's fan-ins; the same join id in two
/// namespaces is two joins; client tokens are refused.
async fn fan_ins_are_kept_per_namespace(gw: SocketAddr) {
    let team = report_token("team");
    let other = report_token("team-a");
    let body = |ns: &str, v: i64| format!(r#"{{"total":2,"namespace":"{ns}","result":{v}}}"#);
    let r = request(gw, "POST", "/fanin/p/0", Some(&team), &body("team-a", 1)).await;
    refused(&r, 403, "namespace_of_another_token");
    let r = request(gw, "POST", "/fanin/p/0", Some(TOKEN), &body("team", 1)).await;
    refused(&r, 403, "client_token_not_allowed");
    let r = request(gw, "POST", "/fanin/p/0", Some(&team), &body("team", 1)).await;
    assert_eq!(
        (r.status, &r.body),
        (200, &json!({"join": "waiting", "stored": 1, "total": 2}))
    );
    // team-a's join of the same id is its own: its branch 1 does not complete team's.
    let r = request(gw, "POST", "/fanin/p/1", Some(&other), &body("team-a", 9)).await;
    assert_eq!(r.body, json!({"join": "waiting", "stored": 1, "total": 2}));
    let r = request(gw, "POST", "/fanin/p/1", Some(&team), &body("team", 2)).await;
    assert_eq!(r.body, json!({"join": "complete", "results": [1, 2]}));
    let r = request(gw, "POST", "/fanin/p/2", Some(&team), &body("team", 3)).await;
    refused(&r, 400, "invalid_branch");
    assert_eq!(
        r.body["message"],
        "index: 2: must be below the fan-out's total of 2"
    );
}

/// "with the gateway on, the report token is refused a tool call and another namespace's
/// envelope": every client route, each refusal naming the rule.
async fn report_token_only_reports(gw: SocketAddr) {
    let token = report_token("team");
    let rt = Some(token.as_str());
    let call = r#"{"name":"t-team","arguments":{}}"#;
    let r = request(gw, "POST", "/tools/call", rt, call).await;
    refused(&r, 403, "report_token_not_allowed");
    let message = r.body["message"].as_str().unwrap();
    assert!(
        message
            .starts_with("POST /tools/call: a report token (namespace \"team\") may only report"),
        "{message}"
    );
    assert!(!message.contains(&token), "the token is never told back");
    for (method, path) in [
        ("GET", "/tools"),
        ("GET", "/envelopes/e-team"),
        ("GET", "/envelopes/e-team/stream"),
        ("GET", "/envelopes/e-a"),
    ] {
        let r = request(gw, method, path, rt, "").await;
        refused(&r, 403, "report_token_not_allowed");
    }
    let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    let r = request(gw, "POST", "/mcp", rt, list).await;
    refused(&r, 403, "report_token_not_allowed");
    // A token of the right form that the key did not make.
    let forged = format!("asya-report.team.{}.{}", super::tests::UID, "0".repeat(64));
    let r = request(
        gw,
        "POST",
        "/envelopes/e-team/progress",
        Some(&forged),
        PROGRESS,
    )
    .await;
    refused(&r, 401, "unauthorized");
}

async fn client_tokens_never_report(gw: SocketAddr) {
    for token in [TOKEN, NS_ONLY] {
        let r = request(gw, "POST", "/envelopes/e-a/progress", Some(token), PROGRESS).await;
        refused(&r, 403, "client_token_not_allowed");
        let r = request(
            gw,
            "POST",
            "/envelopes/e-a/final",
            Some(token),
            r#"{"status":"succeeded"}"#,
        )
        .await;
        refused(&r, 403, "client_token_not_allowed");
        let child = r#"{"id":"x","parent_id":"e-a"}"#;
        let r = request(gw, "POST", "/envelopes", Some(token), child).await;
        refused(&r, 403, "client_token_not_allowed");
        assert!(
            r.body["message"]
                .as_str()
                .unwrap()
                .contains("only report tokens may report"),
            "{}",
            r.body
        );
    }
}

async fn report_token_keeps_to_its_namespace(gw: SocketAddr, app: &App) {
    let team = report_token("team");
    let rt = Some(team.as_str());
    // Another namespace's envelope: no progress, no final, no child, nothing changed.
    let r = request(gw, "POST", "/envelopes/e-a/progress", rt, PROGRESS).await;
    refused(&r, 403, "envelope_of_another_namespace");
    assert_eq!(
        r.body["message"],
        "envelope \"e-a\" belongs to namespace \"team-a\": the report token of namespace \
         \"team\" reports only envelopes of its own namespace"
    );
    let fin = r#"{"status":"succeeded","result":{"forged":true}}"#;
    let r = request(gw, "POST", "/envelopes/e-a/final", rt, fin).await;
    refused(&r, 403, "envelope_of_another_namespace");
    assert_eq!(status_of(app, "e-a").await, Some(Status::Pending));
    assert!(app.store.events("e-a").await.unwrap().is_empty());
    // A child under another namespace's envelope: told exactly as under an unknown one.
    let r = request(
        gw,
        "POST",
        "/envelopes",
        rt,
        r#"{"id":"k1","parent_id":"e-a"}"#,
    )
    .await;
    refused(&r, 404, "unknown_parent");
    let unknown = request(
        gw,
        "POST",
        "/envelopes",
        rt,
        r#"{"id":"k1","parent_id":"zz-a"}"#,
    )
    .await;
    refused(&unknown, 404, "unknown_parent");
    assert_eq!(
        Value::from(r.body["message"].as_str().unwrap().replace("e-a", "zz-a")),
        unknown.body["message"],
        "the same words"
    );
    assert_eq!(r.body["details"], json!({"parent_id": "e-a"}));
    assert_eq!(status_of(app, "k1").await, None, "no child was stored");
    // A child report naming another namespace's envelope as the child.
    let r = request(
        gw,
        "POST",
        "/envelopes",
        rt,
        r#"{"id":"e-a","parent_id":"e-team"}"#,
    )
    .await;
    refused(&r, 403, "envelope_of_another_namespace");
    // Progress of an unknown child of another namespace's envelope.
    let p = r#"{"actor":"a","phase":"received","current":0,"total":1,"parent_id":"e-a"}"#;
    let r = request(gw, "POST", "/envelopes/k2/progress", rt, p).await;
    refused(&r, 404, "unknown_parent");
    assert_eq!(status_of(app, "k2").await, None);

    // Its own namespace's envelope: progress, children, the final status.
    let r = request(gw, "POST", "/envelopes/e-team/progress", rt, PROGRESS).await;
    assert_eq!((r.status, &r.body["status"]), (200, &json!("running")));
    let r = request(
        gw,
        "POST",
        "/envelopes",
        rt,
        r#"{"id":"k3","parent_id":"e-team"}"#,
    )
    .await;
    assert_eq!((r.status, &r.body["namespace"]), (201, &json!("team")));
    let p = r#"{"actor":"a","phase":"received","current":0,"total":1,"parent_id":"e-team"}"#;
    let r = request(gw, "POST", "/envelopes/k4/progress", rt, p).await;
    assert_eq!((r.status, &r.body["namespace"]), (200, &json!("team")));
    // No child under a parent the gateway never saw (a forged or foreign id): nothing is
    // stored, so no row can be made under any id.
    let r = request(
        gw,
        "POST",
        "/envelopes",
        rt,
        r#"{"id":"k5","parent_id":"zz"}"#,
    )
    .await;
    refused(&r, 404, "unknown_parent");
    assert_eq!(status_of(app, "k5").await, None);
    let p = r#"{"actor":"a","phase":"received","current":0,"total":1,"parent_id":"zz"}"#;
    let r = request(gw, "POST", "/envelopes/k6/progress", rt, p).await;
    refused(&r, 404, "unknown_parent");
    assert_eq!(status_of(app, "k6").await, None);
    // A child of a child (nested fan-out) is under a known parent.
    let r = request(
        gw,
        "POST",
        "/envelopes",
        rt,
        r#"{"id":"k3-1","parent_id":"k3"}"#,
    )
    .await;
    assert_eq!((r.status, &r.body["namespace"]), (201, &json!("team")));
    let other = report_token("team-a");
    let r = request(gw, "POST", "/envelopes/k3/progress", Some(&other), PROGRESS).await;
    refused(&r, 403, "envelope_of_another_namespace");
    let r = request(gw, "POST", "/envelopes/e-team/final", rt, fin).await;
    assert_eq!((r.status, &r.body["status"]), (200, &json!("succeeded")));
    // Stored before namespaces were recorded: any report token, so it still ends, and its
    // children are the reporter's.
    let r = request(gw, "POST", "/envelopes/e-legacy/progress", rt, PROGRESS).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = request(
        gw,
        "POST",
        "/envelopes",
        rt,
        r#"{"id":"k7","parent_id":"e-legacy"}"#,
    )
    .await;
    assert_eq!((r.status, &r.body["namespace"]), (201, &json!("team")));
    // Unknown ids stay 404.
    let r = request(gw, "POST", "/envelopes/nope/progress", rt, PROGRESS).await;
    refused(&r, 404, "unknown_envelope");
}

fn names(r: &Reply) -> Vec<String> {
    r.body["tools"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .filter_map(|t| t["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

async fn limited_clients(gw: SocketAddr) {
    let all = Some(TOKEN);
    let ns = Some(NS_ONLY);
    let one = Some(ONE_TOOL);
    // Listings: only what the token may call.
    let r = request(gw, "GET", "/tools", all, "").await;
    assert_eq!(names(&r), ["t-a", "t-default", "t-team"]);
    let r = request(gw, "GET", "/tools", ns, "").await;
    assert_eq!(names(&r), ["t-a"]);
    let r = request(gw, "GET", "/tools", one, "").await;
    assert_eq!(names(&r), ["t-a"]);
    // The same over MCP (stateless: one request, no session).
    let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    for (token, shown) in [(ns, vec!["t-a"]), (all, vec!["t-a", "t-default", "t-team"])] {
        let r = request(gw, "POST", "/mcp", token, list).await;
        assert_eq!(r.status, 200, "{}", r.text);
        for t in ["t-a", "t-default", "t-team"] {
            let listed = r.text.contains(&format!("\"name\":\"{t}\""));
            assert_eq!(listed, shown.contains(&t), "{t} in {}", r.text);
        }
    }
    let call = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t-team","arguments":{}}}"#;
    let r = request(gw, "POST", "/mcp", ns, call).await;
    assert!(
        r.text.contains("namespace_not_allowed") && r.text.contains("-32602"),
        "{}",
        r.text
    );

    // Calls: a tool outside the token's tools or namespaces is refused, naming the rule;
    // an allowed one gets past access (here to the send, which has no transport).
    let call = |name: &str| json!({"name": name, "arguments": {}}).to_string();
    let r = request(gw, "POST", "/tools/call", one, &call("t-team")).await;
    refused(&r, 403, "tool_not_allowed");
    assert_eq!(
        r.body["message"],
        "tool \"t-team\": this token may call only the tools t-a"
    );
    let r = request(gw, "POST", "/tools/call", ns, &call("t-team")).await;
    refused(&r, 403, "namespace_not_allowed");
    assert_eq!(
        r.body["message"],
        "tool \"t-team\" runs in namespace \"team\": this token may use only the namespaces team-a"
    );
    let r = request(gw, "POST", "/tools/call", ns, &call("t-default")).await;
    refused(&r, 403, "namespace_not_allowed");
    let r = request(gw, "POST", "/tools/call", one, &call("nope")).await;
    refused(&r, 404, "unknown_tool");
    assert_eq!(
        r.body["message"], "unknown tool \"nope\" (tools: t-a)",
        "only the tools it may call are named"
    );
    for token in [one, ns, all] {
        let r = request(gw, "POST", "/tools/call", token, &call("t-a")).await;
        refused(&r, 502, "send_failed");
    }

    // Reads: another namespace's envelope is told as unknown, in the same words.
    let r = request(gw, "GET", "/envelopes/e-a", ns, "").await;
    assert_eq!((r.status, &r.body["namespace"]), (200, &json!("team-a")));
    let missing = request(gw, "GET", "/envelopes/nope", ns, "").await;
    refused(&missing, 404, "unknown_envelope");
    for id in ["e-team", "e-legacy"] {
        for path in [
            format!("/envelopes/{id}"),
            format!("/envelopes/{id}/stream"),
        ] {
            let r = request(gw, "GET", &path, ns, "").await;
            refused(&r, 404, "unknown_envelope");
            let told = r.body["message"].as_str().unwrap().replace(id, "nope");
            assert_eq!(Value::from(told), missing.body["message"], "{path}");
        }
    }
    // Without a namespace limit, every envelope; the tool limit does not limit reads.
    for token in [all, one] {
        let r = request(gw, "GET", "/envelopes/e-team", token, "").await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let head = stream_head(gw, "/envelopes/e-a/stream", NS_ONLY).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/event-stream"), "{head}");
}

/// The status line and headers of a stream that stays open (its envelope is not final).
async fn stream_head(gw: SocketAddr, path: &str, token: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(gw).await.unwrap();
    let req =
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("the stream's headers within 10 s")
            .unwrap();
        assert!(n > 0, "closed before its headers");
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got)
        .to_ascii_lowercase()
        .replace("http/1.1", "HTTP/1.1")
}

#[tokio::test]
async fn tokens_keep_tenants_apart_on_memory() {
    suite(Store::memory()).await;
}

#[tokio::test]
async fn tokens_keep_tenants_apart_on_postgres() {
    let Ok(base) = std::env::var("ASYA_TEST_POSTGRES_URL") else {
        eprintln!(
            "SKIPPED tokens_keep_tenants_apart_on_postgres: ASYA_TEST_POSTGRES_URL is not set \
             (tests/services/up, then `source tests/services/env`, or `make unit`)."
        );
        return;
    };
    let db = crate::store::conformance::scratch::Database::create(&base).await;
    let pg = crate::store::postgres::Postgres::connect(&db.url)
        .await
        .expect("connect to the scratch database");
    suite(Store::postgres(pg)).await;
    db.drop_now().await;
}
