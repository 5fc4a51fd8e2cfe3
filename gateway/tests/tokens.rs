//! Issues 26 and 34 against the real binary over HTTP: `asya-gateway report-token` makes a
//! namespace's report token (bound to the namespace's uid), and `asya-gateway serve` refuses
//! it a tool call, an envelope read and another namespace's envelope, refuses client tokens
//! the report routes, and records a fan-out child only under a known parent. No broker,
//! database or cluster is needed: status is kept in memory, no call gets as far as a send
//! that must succeed, and namespace uids are not watched (`--namespace-uids=off`).

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BIN: &str = env!("CARGO_BIN_EXE_asya-gateway");
const CLIENT: &str = "client-token-0123456789";
const KEY: &str = "integration-report-key-0123456789abcdef";
const UID: &str = "3c1d0a52-0000-4000-8000-000000000001";

struct Gateway {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn report_token(key_file: &Path, namespace: &str) -> String {
    let out = Command::new(BIN)
        .args(["report-token", "--namespace", namespace])
        .args(["--namespace-uid", UID, "--key-file"])
        .arg(key_file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: &str,
    body: &str,
) -> (u16, Value) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Authorization: Bearer {token}\r\nContent-Type: application/json\r\n\
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
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

async fn start(dir: &Path) -> Gateway {
    std::fs::write(
        dir.join("tools.yaml"),
        "tools:\n- {name: t, route: [a], namespace: team}\n",
    )
    .unwrap();
    std::fs::write(dir.join("tokens"), format!("{CLIENT}\n")).unwrap();
    let port = free_port();
    let child = Command::new(BIN)
        .args(["serve", "--addr", &format!("127.0.0.1:{port}")])
        .arg("--tools")
        .arg(dir.join("tools.yaml"))
        .arg("--auth-tokens")
        .arg(dir.join("tokens"))
        .arg("--report-key-file")
        .arg(dir.join("key"))
        .args(["--namespace-uids", "off"])
        // A transport is required at start; nothing is sent to it here.
        .args([
            "--sqs-region",
            "us-east-1",
            "--sqs-endpoint",
            "http://127.0.0.1:9",
        ])
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let gw = Gateway { child, addr };
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the gateway did not listen within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gw
}

#[tokio::test]
async fn the_report_token_is_refused_a_tool_call_and_another_namespaces_envelope() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("key"), KEY).unwrap();
    let team = report_token(&dir.path().join("key"), "team");
    let other = report_token(&dir.path().join("key"), "team-a");
    assert!(
        team.starts_with(&format!("asya-report.team.{UID}.")),
        "{team}"
    );
    let gw = start(dir.path()).await;

    // A report token calls no tool and reads no envelope.
    let (status, body) = request(gw.addr, "POST", "/tools/call", &team, r#"{"name":"t"}"#).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("report_token_not_allowed")),
        "{body}"
    );
    // A fan-out child under an envelope the gateway does not know is not recorded.
    let child = r#"{"id":"k","parent_id":"p"}"#;
    let (status, body) = request(gw.addr, "POST", "/envelopes", &team, child).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("unknown_parent")),
        "{body}"
    );
    // A call of team's tool stores its envelope before the send, which fails here (no
    // broker); team's sidecars record a child under it.
    let (status, body) = request(gw.addr, "POST", "/tools/call", CLIENT, r#"{"name":"t"}"#).await;
    assert_eq!(
        body["error"].as_str(),
        Some("send_failed"),
        "{status} {body}"
    );
    let message = body["message"].as_str().unwrap_or_default();
    let parent = message
        .strip_prefix("envelope ")
        .and_then(|m| m.split_once(' '))
        .map(|(id, _)| id)
        .unwrap_or_else(|| panic!("no envelope id in {message:?}"));
    let child = format!(r#"{{"id":"k","parent_id":"{parent}"}}"#);
    let (status, body) = request(gw.addr, "POST", "/envelopes", &team, &child).await;
    assert_eq!(
        (status, body["namespace"].as_str()),
        (201, Some("team")),
        "{body}"
    );
    // Another namespace's sidecars are told of it as of an unknown parent.
    let (status, body) = request(gw.addr, "POST", "/envelopes", &other, &child).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("unknown_parent")),
        "{body}"
    );
    let (status, body) = request(gw.addr, "GET", "/envelopes/k", &team, "").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("report_token_not_allowed")),
        "{body}"
    );
    // Another namespace's report token: neither progress nor a final status on it.
    let progress = r#"{"actor":"a","phase":"received","current":0,"total":1}"#;
    let (status, body) = request(gw.addr, "POST", "/envelopes/k/progress", &other, progress).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("envelope_of_another_namespace")),
        "{body}"
    );
    let fin = r#"{"status":"succeeded","result":1}"#;
    let (status, _) = request(gw.addr, "POST", "/envelopes/k/final", &other, fin).await;
    assert_eq!(status, 403);
    // A client token reads it, unchanged, and may not report.
    let (status, body) = request(gw.addr, "GET", "/envelopes/k", CLIENT, "").await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("running")),
        "{body}"
    );
    let (status, body) = request(gw.addr, "POST", "/envelopes/k/final", CLIENT, fin).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("client_token_not_allowed")),
        "{body}"
    );
    // Its own namespace's token ends it.
    let (status, body) = request(gw.addr, "POST", "/envelopes/k/final", &team, fin).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("succeeded")),
        "{body}"
    );
    // A key other than the gateway's makes tokens it does not accept.
    std::fs::write(
        dir.path().join("other-key"),
        "another-key-of-at-least-32-bytes!!",
    )
    .unwrap();
    let forged = report_token(&dir.path().join("other-key"), "team");
    let (status, _) = request(gw.addr, "POST", "/envelopes/k/progress", &forged, progress).await;
    assert_eq!(status, 401);
}

/// Without a cluster, `report-token` needs the uid given and `serve` with report tokens needs
/// `--namespace-uids=off` said explicitly: each refuses to guess, saying what to pass.
#[test]
fn without_a_cluster_the_uid_must_be_given_and_the_check_turned_off_explicitly() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, KEY).unwrap();
    let no_cluster = |c: &mut Command| {
        c.env("KUBECONFIG", dir.path().join("no-kubeconfig"))
            .env("HOME", dir.path())
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT");
    };
    let mut c = Command::new(BIN);
    c.args(["report-token", "--namespace", "team", "--key-file"])
        .arg(&key);
    no_cluster(&mut c);
    let out = c.output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no cluster to read namespace team's uid from")
            && err.contains("--namespace-uid"),
        "{err}"
    );
    let out = Command::new(BIN)
        .args([
            "report-token",
            "--namespace",
            "team",
            "--namespace-uid",
            "A.B",
            "--key-file",
        ])
        .arg(&key)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("namespace uid \"A.B\""));

    std::fs::write(dir.path().join("tools.yaml"), "tools: []\n").unwrap();
    std::fs::write(dir.path().join("tokens"), format!("{CLIENT}\n")).unwrap();
    let mut c = Command::new(BIN);
    c.args([
        "serve",
        "--addr",
        "127.0.0.1:0",
        "--sqs-region",
        "us-east-1",
    ])
    .arg("--tools")
    .arg(dir.path().join("tools.yaml"))
    .arg("--auth-tokens")
    .arg(dir.path().join("tokens"))
    .arg("--report-key-file")
    .arg(&key)
    .env("ASYA_LOG_FORMAT", "text");
    no_cluster(&mut c);
    let out = c.output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--namespace-uids=kube: no Kubernetes API to watch namespaces in")
            && err.contains("--namespace-uids=off"),
        "{err}"
    );
}

#[test]
fn report_token_refuses_a_short_key_and_a_bad_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short");
    std::fs::write(&short, "too short").unwrap();
    let out = Command::new(BIN)
        .args([
            "report-token",
            "--namespace",
            "team",
            "--namespace-uid",
            UID,
        ])
        .arg("--key-file")
        .arg(&short)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("at least 32 are required"), "{err}");
    let key = dir.path().join("key");
    std::fs::write(&key, KEY).unwrap();
    let out = Command::new(BIN)
        .args([
            "report-token",
            "--namespace",
            "Team_A",
            "--namespace-uid",
            UID,
        ])
        .arg("--key-file")
        .arg(&key)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("must be a DNS label"));
}
