//! Test harness: real brokers (from tests/services), the real sidecar binary and the real
//! Python runtime as child processes. Every wait is a bounded poll on a condition.

#![allow(dead_code)]

/// One test per transport: `both!(f, g)` makes `f::rabbitmq` and `f::sqs`, each skipped when
/// its server is not configured. The caller has `Kind` in scope.
#[allow(unused_macros)] // not every test file runs on both transports
macro_rules! both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn rabbitmq() {
                if !super::common::have(super::Kind::Rabbit) {
                    return;
                }
                super::$name(super::Kind::Rabbit).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqs() {
                if !super::common::have(super::Kind::Sqs) {
                    return;
                }
                super::$name(super::Kind::Sqs).await
            }
        }
    )*};
}

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use asya_transport::rabbitmq::{RabbitSettings, RabbitTransport};
use asya_transport::sqs::{SqsSettings, SqsTransport};
use asya_transport::{Outgoing, Transport};
use serde_json::{Value, json};

/// The sidecar binary under test: cargo's, or `ASYA_TEST_SIDECAR_BIN` (a copy taken right
/// after the build, where several checkouts share one target directory).
pub fn sidecar_bin() -> PathBuf {
    std::env::var_os("ASYA_TEST_SIDECAR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_asya-sidecar")))
}

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[path = "../../../tests/services/require.rs"]
mod require;

fn need(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: these tests need the real servers. Run tests/services/up, then \
             `source tests/services/env` (make unit does both)"
        )
    })
}

/// Whether the servers `kind` needs are configured; a test returns early when not (see
/// tests/services/require.rs: under `make unit` it fails instead).
pub fn have(kind: Kind) -> bool {
    match kind {
        Kind::Rabbit => require::servers("RabbitMQ", &["ASYA_TEST_RABBITMQ_URL"]),
        Kind::Sqs => require::servers("the SQS server", &["ASYA_TEST_SQS_ENDPOINT"]),
    }
}

/// Whether a variable of tests/services/env is set, with the same skip-or-fail rule.
pub fn have_var(what: &str, var: &str) -> bool {
    require::servers(what, &[var])
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    Rabbit,
    Sqs,
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A namespace no other test (or earlier run) uses, so queues never mix.
pub fn unique_ns(tag: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        % 1_000_000_000;
    format!("t{tag}-{t}-{}-{n}", std::process::id() % 100_000)
}

pub fn queue(ns: &str, actor: &str) -> String {
    format!("asya-{ns}-{actor}")
}

pub fn envelope(id: &str, actors: &[&str], payload: Value) -> Value {
    json!({"id": id, "route": {"actors": actors, "current": 0}, "headers": {"trace_id": format!("trace-{id}")}, "payload": payload})
}

pub enum Client {
    Rabbit(Arc<RabbitTransport>),
    Sqs(Arc<SqsTransport>),
}

impl Client {
    /// A client that consumes `queue` (created if missing) and can send anywhere.
    pub async fn new(kind: Kind, queue: &str) -> Client {
        Client::build(kind, queue, false).await
    }

    /// A client that only counts the messages ready in `queue`: it never takes one.
    pub async fn observer(kind: Kind, queue: &str) -> Client {
        Client::build(kind, queue, true).await
    }

    /// Messages ready in the client's queue (not those a consumer holds), if known.
    pub async fn ready_count(&self) -> Option<u64> {
        match self {
            Client::Rabbit(t) => {
                t.ensure_connected().await;
                t.queue_depth().await
            }
            Client::Sqs(t) => t.queue_depth().await,
        }
    }

    async fn build(kind: Kind, queue: &str, publish_only: bool) -> Client {
        match kind {
            Kind::Rabbit => Client::Rabbit(Arc::new(RabbitTransport::new(
                RabbitSettings {
                    url: need("ASYA_TEST_RABBITMQ_URL"),
                    url_source: "ASYA_TEST_RABBITMQ_URL",
                    exchange: "asya".into(),
                    queue: queue.into(),
                    prefetch: 200,
                    auto_create: true,
                    max_redeliveries: 100,
                    publish_only,
                },
                Box::new(|| {}),
            ))),
            Kind::Sqs => Client::Sqs(Arc::new(
                SqsTransport::new(SqsSettings {
                    region: "us-east-1".into(),
                    endpoint: Some(need("ASYA_TEST_SQS_ENDPOINT")),
                    queue: queue.into(),
                    wait_seconds: 1,
                    visibility_timeout: Duration::from_secs(30),
                    auto_create: true,
                    max_message_bytes: 1_048_576,
                    pollers: 1,
                })
                .await,
            )),
        }
    }

    pub async fn send_raw(&self, queue: &str, body: Vec<u8>) {
        let out = [Outgoing {
            queue: queue.into(),
            body,
            delay: None,
        }];
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = match self {
                Client::Rabbit(t) => {
                    t.ensure_connected().await;
                    t.send(&out).await
                }
                Client::Sqs(t) => t.send(&out).await,
            };
            match r {
                Ok(()) => return,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("send to {queue} failed ({e}); retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("send to {queue}: {e}"),
            }
        }
    }

    pub async fn send(&self, queue: &str, v: &Value) {
        self.send_raw(queue, serde_json::to_vec(v).unwrap()).await
    }

    /// Takes up to `n` messages from the consumed queue, waiting at most `within`.
    pub async fn take(&self, n: usize, within: Duration) -> Vec<Value> {
        self.take_counted(n, within)
            .await
            .into_iter()
            .map(|(v, _)| v)
            .collect()
    }

    /// As `take`, with each message's redelivery count as the transport reads it.
    pub async fn take_counted(&self, n: usize, within: Duration) -> Vec<(Value, u32)> {
        let deadline = tokio::time::Instant::now() + within;
        let mut got = Vec::new();
        while got.len() < n {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            match self {
                Client::Rabbit(t) => match tokio::time::timeout(left, t.receive()).await {
                    Ok(Ok(batch)) => {
                        for m in batch {
                            let v = serde_json::from_slice(&m.body).unwrap_or(Value::Null);
                            got.push((v, m.redeliveries));
                            let _ = t.ack(&m.handle).await;
                        }
                    }
                    _ => break,
                },
                Client::Sqs(t) => match tokio::time::timeout(left, t.receive()).await {
                    Ok(Ok(batch)) => {
                        for m in batch {
                            let v = serde_json::from_slice(&m.body).unwrap_or(Value::Null);
                            got.push((v, m.redeliveries));
                            let _ = t.ack(&m.handle).await;
                        }
                    }
                    _ => break,
                },
            }
        }
        got
    }

    /// Asserts nothing (more) arrives within `quiet`.
    pub async fn expect_nothing(&self, quiet: Duration) {
        let extra = self.take(1, quiet).await;
        assert!(extra.is_empty(), "unexpected message: {extra:?}");
    }
}

/// Runs the Python runtime and restarts it when it exits, as the kubelet would.
pub struct Runtime {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub starts: Arc<AtomicUsize>,
}

impl Runtime {
    pub fn start(
        script: &str,
        socket_dir: &Path,
        handler: &str,
        mode: &str,
        log: &Path,
    ) -> Runtime {
        let stop = Arc::new(AtomicBool::new(false));
        let starts = Arc::new(AtomicUsize::new(0));
        let (s, st) = (stop.clone(), starts.clone());
        let socket_dir = socket_dir.to_path_buf();
        let handler = handler.to_string();
        let mode = mode.to_string();
        let log = log.to_path_buf();
        let script = root().join(script);
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                let logf = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .unwrap();
                let mut child = Command::new("python3")
                    .arg(&script)
                    .current_dir(root().join("deploy/examples/handlers"))
                    .env("ASYA_HANDLER", &handler)
                    .env("ASYA_HANDLER_MODE", &mode)
                    .env("ASYA_SOCKET_DIR", &socket_dir)
                    .stdout(Stdio::null())
                    .stderr(logf)
                    .spawn()
                    .expect("python3 runs the runtime");
                st.fetch_add(1, Ordering::SeqCst);
                loop {
                    if s.load(Ordering::SeqCst) {
                        let _ = child.kill();
                        let _ = child.wait();
                        return;
                    }
                    if let Ok(Some(_)) = child.try_wait() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        });
        Runtime {
            stop,
            thread: Some(thread),
            starts,
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Some((code, body))
}

/// One actor: sidecar + runtime as local processes, the way the injected pod runs them.
pub struct Actor {
    pub kind: Kind,
    pub ns: String,
    pub name: String,
    pub dir: tempfile::TempDir,
    pub port: u16,
    pub env: HashMap<String, String>,
    sidecar: Mutex<Option<Child>>,
    pub runtime: Option<Runtime>,
}

pub struct ActorSpec<'a> {
    /// The runtime's script, from the repository's root.
    pub runtime: &'a str,
    pub handler: &'a str,
    pub mode: &'a str,
    pub env: &'a [(&'a str, &'a str)],
}

impl Default for ActorSpec<'_> {
    fn default() -> Self {
        ActorSpec {
            runtime: "sidecar/runtime/asya_runtime.py",
            handler: "testing.act",
            mode: "payload",
            env: &[],
        }
    }
}

impl Actor {
    pub fn start(kind: Kind, ns: &str, name: &str, spec: ActorSpec) -> Actor {
        let a = Actor::spawn(kind, ns, name, spec);
        a.wait_ready(Duration::from_secs(60));
        a
    }

    /// The runtime and the sidecar started, not waited for.
    pub fn spawn(kind: Kind, ns: &str, name: &str, spec: ActorSpec) -> Actor {
        let dir = tempfile::tempdir().unwrap();
        let runtime = Runtime::start(
            spec.runtime,
            dir.path(),
            spec.handler,
            spec.mode,
            &dir.path().join("runtime.log"),
        );
        let port = free_port();
        let mut env: HashMap<String, String> = HashMap::new();
        env.insert("ASYA_ACTOR_NAME".into(), name.into());
        env.insert("ASYA_NAMESPACE".into(), ns.into());
        env.insert("ASYA_SOCKET_DIR".into(), dir.path().display().to_string());
        env.insert("ASYA_QUEUE_AUTO_CREATE".into(), "true".into());
        env.insert("ASYA_METRICS_ADDR".into(), format!("127.0.0.1:{port}"));
        env.insert("ASYA_HANDLER_MODE".into(), spec.mode.into());
        env.insert("ASYA_LOG_FORMAT".into(), "text".into());
        env.insert("ASYA_LOG_LEVEL".into(), "info,asya_sidecar=debug".into());
        match kind {
            Kind::Rabbit => {
                env.insert("ASYA_TRANSPORT".into(), "rabbitmq".into());
                env.insert("ASYA_RABBITMQ_URL".into(), need("ASYA_TEST_RABBITMQ_URL"));
            }
            Kind::Sqs => {
                env.insert("ASYA_TRANSPORT".into(), "sqs".into());
                env.insert("ASYA_SQS_ENDPOINT".into(), need("ASYA_TEST_SQS_ENDPOINT"));
                env.insert("ASYA_SQS_REGION".into(), "us-east-1".into());
                env.insert("ASYA_SQS_WAIT_SECONDS".into(), "1".into());
                env.insert("ASYA_SQS_VISIBILITY_TIMEOUT".into(), "5s".into());
            }
        }
        for (k, v) in spec.env {
            env.insert((*k).into(), (*v).into());
        }
        let a = Actor {
            kind,
            ns: ns.into(),
            name: name.into(),
            dir,
            port,
            env,
            sidecar: Mutex::new(None),
            runtime: Some(runtime),
        };
        a.spawn_sidecar();
        a
    }

    /// The sidecar's /readyz status, if it answers.
    pub fn ready_status(&self) -> Option<u16> {
        http_get(self.port, "/readyz").map(|(code, _)| code)
    }

    pub fn spawn_sidecar(&self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("sidecar.log"))
            .unwrap();
        let child = Command::new(sidecar_bin())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .envs(&self.env)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("sidecar binary runs");
        *self.sidecar.lock().unwrap() = Some(child);
    }

    pub fn wait_ready(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if let Some((200, _)) = http_get(self.port, "/readyz") {
                return;
            }
            if let Some(c) = self.sidecar.lock().unwrap().as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!("sidecar exited ({status}) before ready:\n{}", self.logs());
            }
            assert!(
                Instant::now() < deadline,
                "sidecar not ready in {within:?}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn logs(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default();
        format!(
            "--- sidecar.log ---\n{}\n--- runtime.log ---\n{}",
            read("sidecar.log"),
            read("runtime.log")
        )
    }

    pub fn queue(&self) -> String {
        queue(&self.ns, &self.name)
    }

    pub fn kill9(&self) {
        if let Some(mut c) = self.sidecar.lock().unwrap().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM; returns the exit status.
    pub fn terminate(&self, within: Duration) -> std::process::ExitStatus {
        self.send_sigterm();
        self.wait_exit(within)
    }

    /// SIGTERM, not waited for.
    pub fn send_sigterm(&self) {
        let guard = self.sidecar.lock().unwrap();
        let c = guard.as_ref().expect("sidecar running");
        unsafe_kill(c.id(), 15);
    }

    /// Whether the sidecar process is still running.
    pub fn sidecar_running(&self) -> bool {
        match self.sidecar.lock().unwrap().as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Waits for the sidecar to exit; returns its status.
    pub fn wait_exit(&self, within: Duration) -> std::process::ExitStatus {
        let mut c = self
            .sidecar
            .lock()
            .unwrap()
            .take()
            .expect("sidecar running");
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(s)) = c.try_wait() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "sidecar did not exit after SIGTERM:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn metrics(&self) -> String {
        http_get(self.port, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default()
    }
}

fn unsafe_kill(pid: u32, sig: i32) {
    // No libc dependency: the kill(1) binary does the same.
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}

impl Drop for Actor {
    fn drop(&mut self) {
        self.kill9();
        self.runtime.take();
        if std::thread::panicking() {
            eprintln!("=== actor {} logs ===\n{}", self.name, self.logs());
        }
    }
}

pub fn ids(msgs: &[Value]) -> Vec<String> {
    let mut v: Vec<String> = msgs
        .iter()
        .map(|m| m["id"].as_str().unwrap_or("").to_string())
        .collect();
    v.sort();
    v
}
