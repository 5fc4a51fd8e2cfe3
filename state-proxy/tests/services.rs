//! The connectors against real servers: the S3-compatible server of tests/services (moto)
//! and Debian's redis-server. Each test starts the connector binary on a Unix socket of its
//! own, with a STATE_PREFIX (or a namespace) of its own, and speaks the contract over it with
//! hyper. The tenancy tests run two namespaces side by side, Redis under the ACL users of
//! `asya_api::state_proxy::redis_acl`, and play a tenant that tries to reach the other.
//! Skips without the servers (`source tests/services/env`).

#[path = "../../tests/services/require.rs"]
mod require;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::Frame;
use hyper::{HeaderMap, Request};
use hyper_util::rt::TokioIo;

const BUCKET: &str = "asya-state-proxy-test";
/// The namespace of the tests that are not about namespaces.
const NS: &str = "state-proxy-test";

fn s3() -> bool {
    require::servers("the S3-compatible server", &["ASYA_TEST_S3_ENDPOINT"])
}

fn redis() -> bool {
    require::servers("Redis", &["ASYA_TEST_REDIS_URL"])
}

fn unique(name: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("t/{name}-{}-{n}", std::process::id())
}

/// A connector process; killed when dropped.
struct Connector {
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Connector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Connector {
    /// The connector's command: namespace [`NS`] and the test servers unless `extra` says
    /// otherwise (later variables win).
    fn command(connector: &str, socket: &Path, prefix: &str, extra: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_asya-state-proxy"));
        cmd.arg(connector)
            .env("CONNECTOR_SOCKET", socket)
            .env("ASYA_NAMESPACE", NS)
            .env("STATE_BUCKET", BUCKET)
            .env("STATE_PREFIX", prefix)
            .env("ASYA_LOG_FORMAT", "text")
            .env("ASYA_LOG_LEVEL", "warn")
            .env_remove("REDIS_USERNAME")
            .env_remove("REDIS_PASSWORD")
            .stdout(Stdio::null());
        if let Ok(ep) = std::env::var("ASYA_TEST_S3_ENDPOINT") {
            cmd.env("AWS_ENDPOINT_URL", ep);
        }
        if let Ok(url) = std::env::var("ASYA_TEST_REDIS_URL") {
            cmd.env("REDIS_URL", url);
        }
        for (k, v) in extra {
            cmd.env(k, v);
        }
        cmd
    }

    async fn start(connector: &str, prefix: &str, extra: &[(&str, &str)]) -> Connector {
        Connector::start_logging(connector, prefix, extra, Stdio::inherit()).await
    }

    async fn start_logging(
        connector: &str,
        prefix: &str,
        extra: &[(&str, &str)],
        stderr: Stdio,
    ) -> Connector {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("c.sock");
        let child = Connector::command(connector, &socket, prefix, extra)
            .stderr(stderr)
            .spawn()
            .expect("start the connector");
        let c = Connector {
            child,
            socket,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if c.socket.exists()
                && let Ok((200, _, _)) = c.try_call("GET", "/healthz", &[], Bytes::new()).await
            {
                return c;
            }
            assert!(Instant::now() < deadline, "connector not ready in 20 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    async fn try_call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<(u16, HeaderMap, Bytes), String> {
        let body = Full::new(body).map_err(|never| match never {}).boxed();
        send(&self.socket, method, path, headers, body).await
    }

    async fn call(&self, method: &str, path: &str, body: &[u8]) -> (u16, HeaderMap, Bytes) {
        self.try_call(method, path, &[], Bytes::copy_from_slice(body))
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }
}

type TestBody = BoxBody<Bytes, std::io::Error>;

async fn send(
    socket: &Path,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: TestBody,
) -> Result<(u16, HeaderMap, Bytes), String> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(body).map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, headers, bytes))
}

fn json(b: &Bytes) -> serde_json::Value {
    serde_json::from_slice(b).unwrap_or_else(|e| panic!("not JSON ({e}): {b:?}"))
}

async fn s3_client() -> aws_sdk_s3::Client {
    // The workspace's aws-config has no default HTTP client: rustls on ring, as the connector.
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
            aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https();
    let shared = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(http)
        .load()
        .await;
    let ep = std::env::var("ASYA_TEST_S3_ENDPOINT").unwrap_or_default();
    let conf = aws_sdk_s3::config::Builder::from(&shared)
        .endpoint_url(ep)
        .force_path_style(true)
        .build();
    let client = aws_sdk_s3::Client::from_conf(conf);
    // Already there is fine: every test shares the bucket, each under its own prefix.
    let _ = client.create_bucket().bucket(BUCKET).send().await;
    client
}

/// CRUD, exclusive create, HEAD of files and directories, listing, attributes: what every
/// connector answers alike.
async fn contract(connector: &str) {
    contract_with(connector, &[]).await;
}

/// The contract with `extra` settings (a namespace, a Redis user).
async fn contract_with(connector: &str, extra: &[(&str, &str)]) {
    if connector.starts_with("s3") {
        s3_client().await;
    }
    let prefix = unique(connector);
    let c = Connector::start(connector, &prefix, extra).await;

    let (s, _, b) = c.call("GET", "/keys/runs/missing.json", b"").await;
    assert_eq!(s, 404, "{b:?}");
    assert_eq!(json(&b)["error"], "not_found");

    let (s, _, b) = c
        .call("PUT", "/keys/runs/r1/a.json", b"{\"step\": 1}")
        .await;
    assert_eq!(s, 200, "{b:?}");
    let (s, h, b) = c.call("GET", "/keys/runs/r1/a.json", b"").await;
    assert_eq!((s, &b[..]), (200, &b"{\"step\": 1}"[..]));
    assert_eq!(h["content-length"], "11");

    // Overwrite (no read in between is needed in any mode here: this connector read it).
    let (s, _, _) = c
        .call("PUT", "/keys/runs/r1/a.json", b"{\"step\": 2}")
        .await;
    assert_eq!(s, 200);
    let (_, _, b) = c.call("GET", "/keys/runs/r1/a.json", b"").await;
    assert_eq!(&b[..], b"{\"step\": 2}");

    // Exclusive create: the first wins, the second is 412.
    let excl = [("if-none-match", "*")];
    let (s, _, _) = c
        .try_call(
            "PUT",
            "/keys/runs/r1/lock",
            &excl,
            Bytes::from_static(b"me"),
        )
        .await
        .expect("put");
    assert_eq!(s, 200);
    let (s, _, b) = c
        .try_call(
            "PUT",
            "/keys/runs/r1/lock",
            &excl,
            Bytes::from_static(b"you"),
        )
        .await
        .expect("put");
    assert_eq!(s, 412, "{b:?}");
    assert_eq!(json(&b)["error"], "exists");

    // HEAD: a file has its size; a key with keys below it is a directory.
    let (s, h, _) = c.call("HEAD", "/keys/runs/r1/a.json", b"").await;
    assert_eq!(
        (
            s,
            h["content-length"].to_str().ok(),
            h["x-is-file"].to_str().ok()
        ),
        (200, Some("11"), Some("true"))
    );
    // Its Last-Modified is the write's time (the runtime's st_mtime), within the last hour.
    let modified = h
        .get("last-modified")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| httpdate::parse_http_date(v).ok())
        .expect("HEAD of a file answers an HTTP-date Last-Modified");
    let age = std::time::SystemTime::now()
        .duration_since(modified)
        .unwrap_or_default();
    assert!(
        age.as_secs() < 3600,
        "Last-Modified {modified:?} is not recent"
    );
    let (s, h, _) = c.call("HEAD", "/keys/runs/r1", b"").await;
    assert_eq!((s, h["x-is-file"].to_str().ok()), (200, Some("false")));
    let (s, _, _) = c.call("HEAD", "/keys/runs/none", b"").await;
    assert_eq!(s, 404);

    // Listing one level, with "directories" as prefixes.
    c.call("PUT", "/keys/runs/r2/b.json", b"2").await;
    c.call("PUT", "/keys/runs/top.txt", b"t").await;
    let (s, _, b) = c.call("GET", "/keys/?prefix=runs/&delimiter=/", b"").await;
    assert_eq!(s, 200, "{b:?}");
    let l = json(&b);
    assert_eq!(l["keys"], serde_json::json!(["runs/top.txt"]));
    assert_eq!(l["prefixes"], serde_json::json!(["runs/r1/", "runs/r2/"]));
    let (_, _, b) = c.call("GET", "/keys/?prefix=&delimiter=/", b"").await;
    assert_eq!(json(&b)["prefixes"], serde_json::json!(["runs/"]));
    let (_, _, b) = c.call("GET", "/keys/?prefix=runs/r1/", b"").await;
    assert_eq!(
        json(&b)["keys"],
        serde_json::json!(["runs/r1/a.json", "runs/r1/lock"])
    );

    // Attributes: user ones round-trip, the backend's own are read-only.
    let (s, _, b) = c
        .call("PUT", "/meta/runs/r1/a.json?attr=owner", b"ann")
        .await;
    assert_eq!(s, 200, "{b:?}");
    let (_, _, b) = c.call("GET", "/meta/runs/r1/a.json?attr=owner", b"").await;
    assert_eq!(json(&b)["value"], "ann");
    let (_, _, b) = c.call("GET", "/meta/runs/r1/a.json", b"").await;
    let attrs = json(&b)["attrs"].clone();
    assert!(
        attrs
            .as_array()
            .is_some_and(|a| a.contains(&"owner".into()) && a.contains(&"size".into())),
        "{attrs}"
    );
    let (s, _, _) = c.call("PUT", "/meta/runs/r1/a.json?attr=size", b"1").await;
    assert_eq!(s, 403);
    let (s, _, _) = c.call("GET", "/meta/runs/r1/a.json?attr=nope", b"").await;
    assert_eq!(s, 400);
    // The content survived the attribute write.
    let (_, _, b) = c.call("GET", "/keys/runs/r1/a.json", b"").await;
    assert_eq!(&b[..], b"{\"step\": 2}");

    // Delete, then it is gone; deleting again is 404.
    let (s, _, _) = c.call("DELETE", "/keys/runs/r1/a.json", b"").await;
    assert_eq!(s, 204);
    let (s, _, _) = c.call("GET", "/keys/runs/r1/a.json", b"").await;
    assert_eq!(s, 404);
    let (s, _, _) = c.call("DELETE", "/keys/runs/r1/a.json", b"").await;
    assert_eq!(s, 404);

    // Keys are checked before any backend call, and the refusal names key and rule.
    let (s, _, b) = c.call("GET", "/keys/runs/../etc", b"").await;
    assert_eq!(s, 400, "{b:?}");
    assert!(
        json(&b)["message"]
            .as_str()
            .is_some_and(|m| m.contains(".."))
    );
    let (s, _, _) = c.call("GET", "/keys/a%20b", b"").await;
    assert_eq!(s, 404, "a URL-encoded key is decoded");

    // A buffered connector refuses bodies over its bound.
    if connector != "s3-passthrough" {
        let mut small: Vec<(&str, &str)> = extra.to_vec();
        small.push(("ASYA_STATE_MAX_BUFFER_BYTES", "1024"));
        let big = Connector::start(connector, &prefix, &small).await;
        let (s, _, b) = big.call("PUT", "/keys/big", &[7u8; 2048]).await;
        assert_eq!(s, 413, "{b:?}");
    }
}

#[tokio::test]
async fn s3_buffered_lww_contract() {
    if s3() {
        contract("s3-buffered-lww").await;
    }
}

#[tokio::test]
async fn s3_buffered_cas_contract() {
    if s3() {
        contract("s3-buffered-cas").await;
    }
}

#[tokio::test]
async fn s3_passthrough_contract() {
    if s3() {
        contract("s3-passthrough").await;
    }
}

#[tokio::test]
async fn redis_buffered_cas_contract() {
    if redis() {
        contract("redis-buffered-cas").await;
    }
}

/// Two pods (two connector processes) read the same key, both write: the second write is
/// refused with 409 (FileExistsError in the runtime), and the first one's bytes stay.
async fn cas_conflict(connector: &str) {
    cas_conflict_with(connector, &[]).await;
}

async fn cas_conflict_with(connector: &str, extra: &[(&str, &str)]) {
    if connector.starts_with("s3") {
        s3_client().await;
    }
    let prefix = unique(connector);
    let a = Connector::start(connector, &prefix, extra).await;
    let b = Connector::start(connector, &prefix, extra).await;
    a.call("PUT", "/keys/counter", b"0").await;
    assert_eq!(a.call("GET", "/keys/counter", b"").await.0, 200);
    assert_eq!(b.call("GET", "/keys/counter", b"").await.0, 200);
    let (s, _, body) = a.call("PUT", "/keys/counter", b"1 from a").await;
    assert_eq!(s, 200, "{body:?}");
    let (s, _, body) = b.call("PUT", "/keys/counter", b"1 from b").await;
    assert_eq!(s, 409, "the stale writer must lose: {body:?}");
    assert_eq!(json(&body)["error"], "conflict");
    assert_eq!(
        &b.call("GET", "/keys/counter", b"").await.2[..],
        b"1 from a"
    );
    // Having read again, b may write.
    assert_eq!(b.call("PUT", "/keys/counter", b"2 from b").await.0, 200);
    // A read that found nothing guards the create: a wrote it meanwhile.
    assert_eq!(b.call("GET", "/keys/fresh", b"").await.0, 404);
    assert_eq!(a.call("PUT", "/keys/fresh", b"a").await.0, 200);
    assert_eq!(b.call("PUT", "/keys/fresh", b"b").await.0, 409);
}

#[tokio::test]
async fn s3_buffered_cas_conflict() {
    if s3() {
        cas_conflict("s3-buffered-cas").await;
    }
}

#[tokio::test]
async fn redis_buffered_cas_conflict() {
    if redis() {
        cas_conflict("redis-buffered-cas").await;
    }
}

/// What a stale writer gets: pod `a` reads the key, pod `b` writes over it, then `a` writes
/// what it made of its (now stale) read. Returns the status of `a`'s write and what the key
/// holds afterwards.
async fn stale_write(a: &Connector, b: &Connector, key: &str) -> (u16, Bytes) {
    let path = format!("/keys/{key}");
    assert_eq!(a.call("PUT", &path, b"0").await.0, 200);
    assert_eq!(&a.call("GET", &path, b"").await.2[..], b"0");
    assert_eq!(b.call("PUT", &path, b"1 from b").await.0, 200);
    let (status, _, _) = a.call("PUT", &path, b"1 from a, read 0").await;
    (status, b.call("GET", &path, b"").await.2)
}

/// The difference between the two buffered S3 connectors (issue 37): under `s3-buffered-lww`
/// the stale writer wins and `b`'s write is lost; under `s3-buffered-cas` it is refused (409)
/// and `b`'s stays. The CAS connector also remembers its own write's version: `a` writing
/// twice with no read in between is refused when `b` wrote in between, and a first write to
/// a key it has never seen is last-writer-wins in both.
#[tokio::test]
async fn s3_a_stale_writer_wins_under_lww_and_loses_under_cas() {
    if !s3() {
        return;
    }
    s3_client().await;
    let prefix = unique("stale");
    let lww = (
        Connector::start("s3-buffered-lww", &prefix, &[]).await,
        Connector::start("s3-buffered-lww", &prefix, &[]).await,
    );
    let cas = (
        Connector::start("s3-buffered-cas", &prefix, &[]).await,
        Connector::start("s3-buffered-cas", &prefix, &[]).await,
    );

    let (status, now) = stale_write(&lww.0, &lww.1, "lww").await;
    assert_eq!(status, 200, "lww sends no condition");
    assert_eq!(&now[..], b"1 from a, read 0", "lww: b's write is lost");

    let (status, now) = stale_write(&cas.0, &cas.1, "cas").await;
    assert_eq!(status, 409, "cas: the stale writer is refused");
    assert_eq!(&now[..], b"1 from b", "cas: b's write stays");

    // Its own write is what a CAS connector last saw: a's second blind write is refused once
    // b wrote in between; under lww it goes through.
    for (pair, expect) in [(&cas, 409), (&lww, 200)] {
        let (a, b) = pair;
        let key = format!("/keys/own-{expect}");
        assert_eq!(a.call("PUT", &key, b"a1").await.0, 200);
        assert_eq!(b.call("PUT", &key, b"b1").await.0, 200);
        assert_eq!(a.call("PUT", &key, b"a2").await.0, expect);
    }
    // A key neither read nor written by this connector: its write is unconditional, also
    // under cas (as in the original), so it overwrites.
    assert_eq!(cas.1.call("PUT", "/keys/blind", b"b").await.0, 200);
    assert_eq!(cas.0.call("PUT", "/keys/blind", b"a").await.0, 200);
    assert_eq!(&cas.1.call("GET", "/keys/blind", b"").await.2[..], b"a");
}

/// A Redis Cluster node (a real redis-server in cluster mode, serving no slot: every key's
/// answer is CLUSTERDOWN, as a node of a real cluster answers MOVED for others' slots): the
/// connector says Redis Cluster is unsupported instead of passing on the bare answer.
#[tokio::test]
async fn redis_cluster_is_named_as_unsupported() {
    if !redis() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut server = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args([
            "--cluster-enabled",
            "yes",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server (Debian's, as tests/services runs)");
    let url = format!("redis://127.0.0.1:{port}");
    let c = Connector::start("redis-buffered-cas", "t/cluster", &[("REDIS_URL", &url)]).await;
    // Waits for the server to listen: the connector answers 503 until then.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (status, body) = loop {
        let (s, _, b) = c.call("PUT", "/keys/a", b"x").await;
        if s != 503 || Instant::now() > deadline {
            break (s, b);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(status, 502, "{body:?}");
    let msg = json(&body)["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        msg.contains("Redis Cluster") && msg.contains("does not support"),
        "{msg}"
    );
}

/// The connector's peak resident memory (VmHWM), in MiB.
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb / 1024)
        .unwrap_or(0)
}

/// The byte at offset `i` of the test object: not constant, so a misplaced part shows.
fn pattern(i: u64) -> u8 {
    (i % 251) as u8
}

/// A body of `total` bytes in 1 MiB chunks, generated as it is sent; `pause_after` chunks
/// in, it waits `pause` (to act on the connector while the upload is under way).
fn streamed(total: u64, pause_after: u64, pause: Duration) -> TestBody {
    const CHUNK: u64 = 1024 * 1024;
    let stream = futures::stream::unfold(0u64, move |sent| async move {
        if sent >= total {
            return None;
        }
        if sent == pause_after * CHUNK && !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        let n = CHUNK.min(total - sent);
        let chunk: Vec<u8> = (sent..sent + n).map(pattern).collect();
        Some((
            Ok::<_, std::io::Error>(Frame::data(Bytes::from(chunk))),
            sent + n,
        ))
    });
    BodyExt::boxed(StreamBody::new(stream))
}

const MIB: u64 = 1024 * 1024;

/// A large object through `s3-passthrough`, up and down, with the connector's peak RSS
/// printed and bounded: memory is the part size times uploads, not the object's size.
#[tokio::test]
async fn s3_passthrough_streams_large_objects_in_bounded_memory() {
    if !s3() {
        return;
    }
    let s3 = s3_client().await;
    let prefix = unique("large");
    let c = Connector::start("s3-passthrough", &prefix, &[]).await;
    let size = std::env::var("ASYA_TEST_STATE_LARGE_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(160)
        * MIB;
    let started = Instant::now();
    let (s, _, b) = send(
        &c.socket,
        "PUT",
        "/keys/big.bin",
        &[],
        streamed(size, 0, Duration::ZERO),
    )
    .await
    .expect("put");
    assert_eq!(s, 200, "{b:?}");
    let up = started.elapsed();
    let head = s3
        .head_object()
        .bucket(BUCKET)
        .key(format!("{NS}/{prefix}/big.bin"))
        .send()
        .await
        .expect("the object is in S3");
    assert_eq!(head.content_length(), Some(size as i64));

    // Read back as a stream, checking every byte without holding the object.
    let started = Instant::now();
    let stream = tokio::net::UnixStream::connect(&c.socket)
        .await
        .expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let req = Request::get("/keys/big.bin")
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = sender.send_request(req).await.expect("get");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut offset = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("frame").into_data() {
            for (i, byte) in data.iter().enumerate() {
                assert_eq!(
                    *byte,
                    pattern(offset + i as u64),
                    "byte {}",
                    offset + i as u64
                );
            }
            offset += data.len() as u64;
        }
    }
    assert_eq!(offset, size);
    let down = started.elapsed();
    let rss = peak_rss_mib(c.pid());
    eprintln!(
        "s3-passthrough: {} MiB up in {:.1}s, down in {:.1}s; connector peak RSS {rss} MiB",
        size / MIB,
        up.as_secs_f64(),
        down.as_secs_f64()
    );
    // 8 MiB parts, one upload: far below the object's size.
    assert!(
        rss > 0 && rss < 100,
        "peak RSS {rss} MiB for a {} MiB object",
        size / MIB
    );
}

/// Killed (SIGKILL) in the middle of a multipart upload: no object, not even a part of one,
/// is visible under the key.
#[tokio::test]
async fn s3_passthrough_killed_mid_upload_leaves_no_object() {
    if !s3() {
        return;
    }
    let s3 = s3_client().await;
    let prefix = unique("killed");
    let c = Connector::start("s3-passthrough", &prefix, &[]).await;
    let socket = c.socket.clone();
    // 20 MiB go (two parts uploaded), then the body stalls while the connector is killed.
    let upload = tokio::spawn(async move {
        send(
            &socket,
            "PUT",
            "/keys/partial.bin",
            &[],
            streamed(40 * MIB, 20, Duration::from_secs(30)),
        )
        .await
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pid = c.pid() as i32;
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
    let r = tokio::time::timeout(Duration::from_secs(40), upload).await;
    assert!(
        !matches!(r, Ok(Ok(Ok((200, _, _))))),
        "the upload must not succeed: {r:?}"
    );
    let listed = s3
        .list_objects_v2()
        .bucket(BUCKET)
        .prefix(format!("{NS}/{prefix}"))
        .send()
        .await
        .expect("list");
    assert_eq!(listed.key_count(), Some(0), "{:?}", listed.contents());
    // It was killed in the middle of a multipart upload (not before one began): the upload
    // is there, incomplete. Aborted here; in a bucket, a lifecycle rule does it.
    let uploads = s3
        .list_multipart_uploads()
        .bucket(BUCKET)
        .prefix(format!("{NS}/{prefix}"))
        .send()
        .await
        .expect("list uploads");
    assert_eq!(uploads.uploads().len(), 1, "{uploads:?}");
    for u in uploads.uploads() {
        let _ = s3
            .abort_multipart_upload()
            .bucket(BUCKET)
            .key(u.key().unwrap_or_default())
            .upload_id(u.upload_id().unwrap_or_default())
            .send()
            .await;
    }
    drop(c);
}

/// SIGTERM during an upload: the connector stops taking requests but finishes the upload
/// in flight, and the object is whole.
#[tokio::test]
async fn s3_passthrough_sigterm_finishes_the_upload_in_flight() {
    if !s3() {
        return;
    }
    let s3 = s3_client().await;
    let prefix = unique("sigterm");
    let mut c = Connector::start("s3-passthrough", &prefix, &[]).await;
    let socket = c.socket.clone();
    let upload = tokio::spawn(async move {
        send(
            &socket,
            "PUT",
            "/keys/whole.bin",
            &[],
            streamed(24 * MIB, 10, Duration::from_secs(2)),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let _ = Command::new("kill")
        .args(["-TERM", &c.pid().to_string()])
        .status();
    let (s, _, b) = upload.await.expect("join").expect("the upload finishes");
    assert_eq!(s, 200, "{b:?}");
    let status = c.child.wait().expect("wait");
    assert!(status.success(), "exit after SIGTERM: {status:?}");
    let head = s3
        .head_object()
        .bucket(BUCKET)
        .key(format!("{NS}/{prefix}/whole.bin"))
        .send()
        .await
        .expect("the object is in S3");
    assert_eq!(head.content_length(), Some((24 * MIB) as i64));
}

/// Without its Redis the connector still starts and answers 503 (ConnectionError).
#[tokio::test]
async fn redis_unreachable_is_503() {
    let c = Connector::start(
        "redis-buffered-cas",
        "t/unreachable",
        &[
            ("REDIS_URL", "redis://127.0.0.1:1"),
            ("ASYA_STATE_BACKEND_TIMEOUT_SECONDS", "3"),
        ],
    )
    .await;
    let (s, _, b) = c.call("GET", "/keys/a", b"").await;
    assert_eq!(s, 503, "{b:?}");
    assert_eq!(json(&b)["error"], "unavailable");
}

/// Requests are checked before any backend call: these answer without a backend at all.
#[tokio::test]
async fn refusals_come_before_the_backend() {
    let c = Connector::start(
        "redis-buffered-cas",
        "t/refusals",
        &[("REDIS_URL", "redis://127.0.0.1:1")],
    )
    .await;
    for (method, path, status, says) in [
        ("GET", "/keys/a/../b", 400, ".."),
        ("GET", "/keys/%2e%2e/other-ns/x", 400, ".."),
        ("GET", "/keys/%2Fother-ns/x", 400, "relative"),
        ("GET", "/keys/?prefix=%2e%2e/", 400, ".."),
        ("PUT", "/keys/a//b", 400, "empty segments"),
        ("GET", "/keys/100%", 400, "%25"),
        ("GET", "/keys/?prefix=runs", 400, "end with /"),
        ("GET", "/keys/?prefix=runs/&max=3", 400, "max"),
        ("GET", "/keys/?prefix=runs/&delimiter=,", 400, "only /"),
        ("GET", "/meta/a?attr=a%20b", 400, "A-Z"),
        ("PUT", "/meta/a", 400, "attr"),
    ] {
        let (s, _, b) = c.call(method, path, b"x").await;
        assert_eq!(s, status, "{method} {path}: {b:?}");
        let msg = json(&b)["message"].as_str().unwrap_or_default().to_string();
        assert!(msg.contains(says), "{method} {path}: {msg}");
    }
    assert_eq!(c.call("POST", "/keys/a", b"").await.0, 405);
    assert_eq!(c.call("GET", "/healthz", b"").await.0, 200);
}

/// `--probe` is the exec probe of a connector container: 0 while it serves, 1 without it.
#[tokio::test]
async fn the_probe_answers_for_the_socket() {
    let c = Connector::start(
        "redis-buffered-cas",
        "t/probe",
        &[("REDIS_URL", "redis://127.0.0.1:1")],
    )
    .await;
    let probe = |socket: &Path| {
        Command::new(env!("CARGO_BIN_EXE_asya-state-proxy"))
            .arg("--probe")
            .env("CONNECTOR_SOCKET", socket)
            .output()
            .expect("run the probe")
    };
    assert!(probe(&c.socket).status.success());
    let missing = c.socket.with_file_name("none.sock");
    let out = probe(&missing);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("none.sock"));
}

/// `ASYA_METRICS_ADDR` serves `/metrics`, counting requests by operation and status.
#[tokio::test]
async fn metrics_count_requests() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let addr = format!("127.0.0.1:{port}");
    let c = Connector::start(
        "redis-buffered-cas",
        "t/metrics",
        &[
            ("REDIS_URL", "redis://127.0.0.1:1"),
            ("ASYA_METRICS_ADDR", addr.as_str()),
        ],
    )
    .await;
    assert_eq!(c.call("GET", "/keys/a/../b", b"").await.0, 400);
    let text = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&addr).expect("connect to metrics");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read");
        out
    })
    .await
    .expect("join");
    assert!(
        text.contains(r#"asya_state_proxy_requests_total{connector="redis-buffered-cas",op="get",status="400"} 1"#),
        "{text}"
    );
}

/// Writes sent at the same moment from two pods that read the same version: Redis runs the
/// compare-and-set atomically, so in every round exactly one wins.
#[tokio::test]
async fn redis_concurrent_writers_exactly_one_wins() {
    if !redis() {
        return;
    }
    let prefix = unique("race");
    let a = Connector::start("redis-buffered-cas", &prefix, &[]).await;
    let b = Connector::start("redis-buffered-cas", &prefix, &[]).await;
    a.call("PUT", "/keys/n", b"0").await;
    for round in 0..20 {
        assert_eq!(a.call("GET", "/keys/n", b"").await.0, 200);
        assert_eq!(b.call("GET", "/keys/n", b"").await.0, 200);
        let (wa, wb) = (format!("a{round}"), format!("b{round}"));
        let (ra, rb) = tokio::join!(
            a.call("PUT", "/keys/n", wa.as_bytes()),
            b.call("PUT", "/keys/n", wb.as_bytes()),
        );
        let mut statuses = [ra.0, rb.0];
        statuses.sort();
        assert_eq!(statuses, [200, 409], "round {round}");
        let winner = if ra.0 == 200 { "a" } else { "b" };
        let (_, _, body) = a.call("GET", "/keys/n", b"").await;
        assert_eq!(body, format!("{winner}{round}").as_bytes(), "round {round}");
    }
}

// ---- Tenancy: one namespace's connector, or its Redis user, cannot reach another's state ----

/// A namespace name of this run (a DNS label), so concurrent runs do not share users or keys.
fn unique_ns(tag: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("sp-{tag}-{}-{n}", std::process::id())
}

/// A password nobody else knows (a per-process random hasher key, mixed with the name).
fn password(ns: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write(ns.as_bytes());
    let a = h.finish();
    h.write_u64(a);
    format!("{a:016x}{:016x}", h.finish())
}

/// The test Redis' URL without its user-info (the admin's password): the shared URL a
/// namespace's connector gets, its own user and password coming apart.
fn redis_url_bare() -> String {
    let url = std::env::var("ASYA_TEST_REDIS_URL").expect("ASYA_TEST_REDIS_URL");
    match (url.split_once("://"), url.rfind('@')) {
        (Some((scheme, _)), Some(at)) => format!("{scheme}://{}", &url[at + 1..]),
        _ => url,
    }
}

async fn redis_admin() -> redis::aio::MultiplexedConnection {
    let url = std::env::var("ASYA_TEST_REDIS_URL").expect("ASYA_TEST_REDIS_URL");
    redis::Client::open(url)
        .expect("the Redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to Redis as its admin (the default user)")
}

/// A namespace's ACL user, made from the api's rule as the provisioner makes it; the user
/// and the namespace's keys are removed when dropped.
struct TenantUser {
    ns: String,
    username: String,
    password: String,
    /// The shared URL, without credentials.
    url: String,
}

impl TenantUser {
    async fn create(tag: &str) -> TenantUser {
        use asya_api::state_proxy::redis_acl;
        let ns = unique_ns(tag);
        let password = password(&ns);
        let args = redis_acl::setuser_args(&ns, &password).expect("a valid namespace");
        let mut admin = redis_admin().await;
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(&args)
            .query_async(&mut admin)
            .await
            .unwrap_or_else(|e| panic!("ACL SETUSER {}: {e}", redis_acl::Redacted(&args)));
        TenantUser {
            username: redis_acl::username(&ns),
            ns,
            password,
            url: redis_url_bare(),
        }
    }

    /// The connector's settings for this namespace and user, as injection gives them.
    fn env(&self) -> Vec<(&str, &str)> {
        vec![
            ("ASYA_NAMESPACE", self.ns.as_str()),
            ("REDIS_URL", self.url.as_str()),
            ("REDIS_USERNAME", self.username.as_str()),
            ("REDIS_PASSWORD", self.password.as_str()),
        ]
    }

    /// A raw connection as this user: what a handler holding the namespace's Secret has.
    async fn raw(&self) -> redis::aio::MultiplexedConnection {
        let url = self.url.replacen(
            "redis://",
            &format!("redis://{}:{}@", self.username, self.password),
            1,
        );
        redis::Client::open(url)
            .expect("the Redis URL")
            .get_multiplexed_async_connection()
            .await
            .expect("connect as the namespace's user")
    }
}

impl Drop for TenantUser {
    fn drop(&mut self) {
        let Ok(url) = std::env::var("ASYA_TEST_REDIS_URL") else {
            return;
        };
        let Ok(mut admin) = redis::Client::open(url).and_then(|c| c.get_connection()) else {
            return;
        };
        let _: redis::RedisResult<()> = redis::cmd("ACL")
            .arg("DELUSER")
            .arg(&self.username)
            .query(&mut admin);
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
            .arg(format!("{}/*", self.ns))
            .query(&mut admin)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query(&mut admin);
        }
    }
}

/// The ACL LOG entries (denials) of `username`: a connector that needed a command or key
/// its user lacks leaves one.
async fn acl_denials(username: &str) -> Vec<String> {
    let mut admin = redis_admin().await;
    let log: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("ACL")
        .arg("LOG")
        .query_async(&mut admin)
        .await
        .expect("ACL LOG");
    log.into_iter()
        .filter(|e| {
            matches!(e.get("username"), Some(redis::Value::BulkString(u)) if u == username.as_bytes())
        })
        .map(|e| format!("{e:?}"))
        .collect()
}

/// The refusal of one raw command: its error code, or "OK" if it ran.
async fn refusal(conn: &mut redis::aio::MultiplexedConnection, cmd: &redis::Cmd) -> String {
    match cmd.query_async::<redis::Value>(conn).await {
        Ok(v) => format!("OK {v:?}"),
        Err(e) => e.code().unwrap_or("no code").to_string(),
    }
}

/// Two namespaces on one Redis, each connector under its namespace's ACL user: the whole
/// contract works for each (so the allowlist holds every command the connector sends, and
/// no denial is logged), and neither the other namespace's connector nor its user with raw
/// commands reaches the first one's keys.
#[tokio::test]
async fn redis_namespaces_are_isolated_under_acl_users() {
    if !redis() {
        return;
    }
    let a = TenantUser::create("a").await;
    let b = TenantUser::create("b").await;
    contract_with("redis-buffered-cas", &a.env()).await;
    cas_conflict_with("redis-buffered-cas", &b.env()).await;
    assert_eq!(acl_denials(&a.username).await, Vec::<String>::new());
    assert_eq!(acl_denials(&b.username).await, Vec::<String>::new());

    // A's data, as A's handler would write it (a prefix of its own: the contract above wrote
    // under other prefixes of the same namespace).
    let ca = Connector::start("redis-buffered-cas", "app", &a.env()).await;
    assert_eq!(
        ca.call("PUT", "/keys/secret/plan.json", b"A's plan")
            .await
            .0,
        200
    );
    ca.call("PUT", "/meta/secret/plan.json?attr=owner", b"a")
        .await;
    let a_key = format!("{}/app/secret/plan.json", a.ns);
    let a_index = format!("{}/\u{1}asya-state-proxy-index", a.ns);
    let a_counter = format!("{}/\u{1}asya-state-proxy-version", a.ns);

    // B's connector: no request names A's keys.
    let cb = Connector::start("redis-buffered-cas", "app", &b.env()).await;
    assert_eq!(cb.call("PUT", "/keys/mine.txt", b"B").await.0, 200);
    let (_, _, l) = cb.call("GET", "/keys/?prefix=&delimiter=/", b"").await;
    assert_eq!(
        json(&l),
        serde_json::json!({"keys": ["mine.txt"], "prefixes": []})
    );
    let (_, _, l) = cb.call("GET", "/keys/?prefix=", b"").await;
    assert_eq!(json(&l)["keys"], serde_json::json!(["mine.txt"]));
    for path in [
        "/keys/secret/plan.json",
        "/meta/secret/plan.json",
        "/keys/secret",
    ] {
        assert_eq!(cb.call("GET", path, b"").await.0, 404, "{path}");
    }
    let up = format!("/keys/../../{}/app/secret/plan.json", a.ns);
    let up_encoded = format!("/keys/%2e%2e/%2E%2E%2F{}%2Fapp%2Fsecret%2Fplan.json", a.ns);
    let rooted = format!("/keys/%2F{}/app/secret/plan.json", a.ns);
    let listing_up = format!("/keys/?prefix=..%2F..%2F{}%2F", a.ns);
    for path in [&up, &up_encoded, &rooted] {
        for method in ["GET", "PUT", "DELETE", "HEAD"] {
            let (s, _, body) = cb.call(method, path, b"B was here").await;
            assert_eq!(s, 400, "{method} {path}: {body:?}");
        }
        let meta = path.replacen("/keys/", "/meta/", 1);
        assert_eq!(cb.call("GET", &meta, b"").await.0, 400, "{meta}");
        let meta_put = format!("{meta}?attr=owner");
        assert_eq!(cb.call("PUT", &meta_put, b"b").await.0, 400, "{meta_put}");
    }
    assert_eq!(cb.call("GET", &listing_up, b"").await.0, 400);
    let (s, _, _) = cb.call("HEAD", "/keys/secret", b"").await;
    assert_eq!(s, 404, "A's directory is not B's");

    // B's user, raw: every command that would touch A's keys, or every key, is NOPERM. (DEBUG
    // is not tried: Redis 7 refuses it before the ACL unless enable-debug-command is set.)
    let mut raw = b.raw().await;
    let mut own = redis::cmd("HGET");
    own.arg(format!("{}/app/mine.txt", b.ns)).arg("d");
    let mine: Option<Vec<u8>> = own
        .query_async(&mut raw)
        .await
        .expect("B's user reads B's key");
    assert_eq!(mine.as_deref(), Some(&b"B"[..]));
    let mut attempts: Vec<redis::Cmd> = Vec::new();
    for (name, args) in [
        ("GET", vec![a_key.as_str()]),
        ("HGET", vec![a_key.as_str(), "d"]),
        ("HMGET", vec![a_key.as_str(), "d", "v"]),
        ("HGETALL", vec![a_key.as_str()]),
        ("HSET", vec![a_key.as_str(), "d", "B's plan"]),
        ("DEL", vec![a_key.as_str()]),
        ("EXISTS", vec![a_key.as_str()]),
        ("WATCH", vec![a_key.as_str()]),
        ("ZRANGEBYLEX", vec![a_index.as_str(), "-", "+"]),
        ("ZREM", vec![a_index.as_str(), a_key.as_str()]),
        ("INCR", vec![a_counter.as_str()]),
        ("SCAN", vec!["0"]),
        ("KEYS", vec!["*"]),
        ("FLUSHALL", vec![]),
        ("FLUSHDB", vec![]),
        ("CONFIG", vec!["GET", "*"]),
        ("ACL", vec!["LIST"]),
        ("ACL", vec!["SETUSER", b.username.as_str(), "~*", "+@all"]),
        (
            "EVAL",
            vec!["return redis.call('GET', KEYS[1])", "1", a_key.as_str()],
        ),
        ("EVAL", vec!["return redis.call('KEYS', '*')", "0"]),
        ("EVAL", vec!["while true do end", "0"]),
        ("FUNCTION", vec!["LIST"]),
        ("RENAME", vec![a_key.as_str(), "x"]),
        ("COPY", vec![a_key.as_str(), "x"]),
        ("SELECT", vec!["1"]),
    ] {
        let mut c = redis::cmd(name);
        for arg in args {
            c.arg(arg);
        }
        attempts.push(c);
    }
    for c in &attempts {
        assert_eq!(
            refusal(&mut raw, c).await,
            "NOPERM",
            "{:?}",
            String::from_utf8_lossy(&c.get_packed_command())
        );
    }
    // A's state is untouched, and A's connector still reads it.
    let (s, _, body) = ca.call("GET", "/keys/secret/plan.json", b"").await;
    assert_eq!((s, &body[..]), (200, &b"A's plan"[..]));
    let (_, _, l) = ca.call("GET", "/keys/?prefix=&delimiter=/", b"").await;
    assert_eq!(
        json(&l),
        serde_json::json!({"keys": [], "prefixes": ["secret/"]})
    );
}

/// The connector runs and fails without ever showing the password: refused settings name the
/// variable, a wrong password is a 502 that does not repeat it.
#[tokio::test]
async fn redis_passwords_never_show() {
    if !redis() {
        return;
    }
    let a = TenantUser::create("pw").await;
    // A URL with a password beside REDIS_USERNAME/PASSWORD: refused at start.
    let with_password = a.url.replacen("redis://", "redis://:url-secret-77@", 1);
    let mut env = a.env();
    env.push(("REDIS_URL", &with_password));
    let out = Connector::command(
        "redis-buffered-cas",
        Path::new("/nonexistent/s.sock"),
        "",
        &env,
    )
    .stderr(Stdio::piped())
    .output()
    .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("REDIS_URL") && err.contains("REDIS_USERNAME"),
        "{err}"
    );
    assert!(
        !err.contains("url-secret-77") && !err.contains(&a.password),
        "{err}"
    );

    // A wrong password: the connector serves, each request is a 502 without the password.
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("stderr");
    let wrong = format!("{}-wrong", a.password);
    let env = [
        ("ASYA_NAMESPACE", a.ns.as_str()),
        ("REDIS_URL", a.url.as_str()),
        ("REDIS_USERNAME", a.username.as_str()),
        ("REDIS_PASSWORD", wrong.as_str()),
        ("ASYA_LOG_LEVEL", "debug"),
    ];
    let stderr = std::fs::File::create(&log).expect("log file");
    let c = Connector::start_logging("redis-buffered-cas", "", &env, stderr.into()).await;
    let (s, _, body) = c.call("GET", "/keys/a", b"").await;
    assert_eq!(s, 502, "{body:?}");
    let (s, _, body2) = c.call("PUT", "/keys/a", b"x").await;
    assert_eq!(s, 502, "{body2:?}");
    drop(c);
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    for text in [
        String::from_utf8_lossy(&body),
        String::from_utf8_lossy(&body2),
        logged.as_str().into(),
    ] {
        assert!(
            !text.contains(&wrong) && !text.contains(&a.password),
            "{text}"
        );
    }
    assert!(
        logged.contains("request failed"),
        "the failure is logged: {logged}"
    );
}

/// STATE_PREFIX nests inside the namespace: `../A` is refused at start; `A` under namespace B
/// stores under `B/A/`, nowhere near A's keys.
#[tokio::test]
async fn redis_state_prefix_stays_inside_the_namespace() {
    if !redis() {
        return;
    }
    let a = TenantUser::create("pa").await;
    let b = TenantUser::create("pb").await;
    for bad in [
        format!("../{}", a.ns),
        format!("/{}", a.ns),
        "x/../..".into(),
    ] {
        let out = Connector::command(
            "redis-buffered-cas",
            Path::new("/nonexistent/s.sock"),
            &bad,
            &b.env(),
        )
        .stderr(Stdio::piped())
        .output()
        .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("STATE_PREFIX") && err.contains(&bad), "{err}");
    }
    let cb = Connector::start("redis-buffered-cas", &a.ns, &b.env()).await;
    assert_eq!(cb.call("PUT", "/keys/x", b"from b").await.0, 200);
    let mut admin = redis_admin().await;
    let stored: Option<Vec<u8>> = redis::cmd("HGET")
        .arg(format!("{}/{}/x", b.ns, a.ns))
        .arg("d")
        .query_async(&mut admin)
        .await
        .expect("HGET");
    assert_eq!(stored.as_deref(), Some(&b"from b"[..]));
    let at_a: bool = redis::cmd("EXISTS")
        .arg(format!("{}/x", a.ns))
        .query_async(&mut admin)
        .await
        .expect("EXISTS");
    assert!(!at_a);
}

/// Without ASYA_NAMESPACE, or with one that is no DNS label, no connector starts.
#[tokio::test]
async fn a_connector_without_its_namespace_refuses_to_start() {
    for (connector, ns) in [
        ("s3-buffered-lww", ""),
        ("redis-buffered-cas", ""),
        ("redis-buffered-cas", "team*"),
        ("s3-passthrough", "../team-a"),
    ] {
        let out = Connector::command(
            connector,
            Path::new("/nonexistent/s.sock"),
            "",
            &[("ASYA_NAMESPACE", ns), ("REDIS_URL", "redis://127.0.0.1:1")],
        )
        .stderr(Stdio::piped())
        .output()
        .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{connector} {ns:?}: {err}");
        assert!(
            err.contains("ASYA_NAMESPACE") && err.contains("DNS label"),
            "{connector} {ns:?}: {err}"
        );
    }
}

/// S3: keys land under `{namespace}/{STATE_PREFIX}/`; another namespace's connector on the
/// same bucket, whatever its STATE_PREFIX, sees nothing of them.
#[tokio::test]
async fn s3_namespaces_are_isolated() {
    if !s3() {
        return;
    }
    let s3 = s3_client().await;
    let (a, b) = (unique_ns("s3a"), unique_ns("s3b"));
    let ca = Connector::start("s3-buffered-cas", "ckpt", &[("ASYA_NAMESPACE", &a)]).await;
    assert_eq!(ca.call("PUT", "/keys/runs/r1.json", b"A").await.0, 200);
    s3.head_object()
        .bucket(BUCKET)
        .key(format!("{a}/ckpt/runs/r1.json"))
        .send()
        .await
        .expect("the object is under {namespace}/{STATE_PREFIX}/");

    for prefix in ["", "ckpt", a.as_str()] {
        let cb = Connector::start("s3-buffered-cas", prefix, &[("ASYA_NAMESPACE", &b)]).await;
        for query in [
            "/keys/?prefix=",
            "/keys/?prefix=&delimiter=/",
            "/keys/?prefix=runs/",
        ] {
            let (s, _, l) = cb.call("GET", query, b"").await;
            assert_eq!(s, 200, "{l:?}");
            assert_eq!(
                json(&l),
                serde_json::json!({"keys": [], "prefixes": []}),
                "prefix {prefix:?}, {query}"
            );
        }
        assert_eq!(cb.call("GET", "/keys/runs/r1.json", b"").await.0, 404);
        assert_eq!(cb.call("GET", "/keys/ckpt/runs/r1.json", b"").await.0, 404);
        let up = format!("/keys/%2e%2e/{a}/ckpt/runs/r1.json");
        assert_eq!(cb.call("GET", &up, b"").await.0, 400);
        assert_eq!(cb.call("DELETE", &up, b"").await.0, 400);
    }
    // B's own write lands under B.
    let cb = Connector::start("s3-buffered-lww", "ckpt", &[("ASYA_NAMESPACE", &b)]).await;
    assert_eq!(cb.call("PUT", "/keys/runs/r1.json", b"B").await.0, 200);
    let got = s3
        .get_object()
        .bucket(BUCKET)
        .key(format!("{a}/ckpt/runs/r1.json"))
        .send()
        .await
        .expect("A's object")
        .body
        .collect()
        .await
        .expect("body")
        .into_bytes();
    assert_eq!(&got[..], b"A", "A's object is untouched");
    let (_, _, l) = ca.call("GET", "/keys/?prefix=runs/", b"").await;
    assert_eq!(json(&l)["keys"], serde_json::json!(["runs/r1.json"]));
    for (ns, key) in [(&a, "r1.json"), (&b, "r1.json")] {
        let _ = s3
            .delete_object()
            .bucket(BUCKET)
            .key(format!("{ns}/ckpt/runs/{key}"))
            .send()
            .await;
    }
}
