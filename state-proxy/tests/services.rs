//! The connectors against real servers: the S3-compatible server of tests/services (moto)
//! and Debian's redis-server. Each test starts the connector binary on a Unix socket of its
//! own, with a STATE_PREFIX of its own, and speaks the contract over it with hyper.
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
    async fn start(connector: &str, prefix: &str, extra: &[(&str, &str)]) -> Connector {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("c.sock");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_asya-state-proxy"));
        cmd.arg(connector)
            .env("CONNECTOR_SOCKET", &socket)
            .env("STATE_BUCKET", BUCKET)
            .env("STATE_PREFIX", prefix)
            .env("ASYA_LOG_FORMAT", "text")
            .env("ASYA_LOG_LEVEL", "warn")
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
        let child = cmd.spawn().expect("start the connector");
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
    if connector.starts_with("s3") {
        s3_client().await;
    }
    let prefix = unique(connector);
    let c = Connector::start(connector, &prefix, &[]).await;

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
        let big = Connector::start(
            connector,
            &prefix,
            &[("ASYA_STATE_MAX_BUFFER_BYTES", "1024")],
        )
        .await;
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
    if connector.starts_with("s3") {
        s3_client().await;
    }
    let prefix = unique(connector);
    let a = Connector::start(connector, &prefix, &[]).await;
    let b = Connector::start(connector, &prefix, &[]).await;
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
        .key(format!("{prefix}/big.bin"))
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
        .prefix(&prefix)
        .send()
        .await
        .expect("list");
    assert_eq!(listed.key_count(), Some(0), "{:?}", listed.contents());
    // It was killed in the middle of a multipart upload (not before one began): the upload
    // is there, incomplete. Aborted here; in a bucket, a lifecycle rule does it.
    let uploads = s3
        .list_multipart_uploads()
        .bucket(BUCKET)
        .prefix(&prefix)
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
        .key(format!("{prefix}/whole.bin"))
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
