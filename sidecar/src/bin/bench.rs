//! Sidecar benchmark against the real brokers of tests/services (see docs/benchmarks.md).
//!
//! For each transport: a trivial Python handler (`pipeline.echo`) behind the release sidecar;
//! the actor's queue is filled first, then drained into x-sink. Reports envelopes/s, the
//! sidecar's CPU per 1,000 envelopes, its context switches per envelope and its RSS idle and
//! under load, end-to-end latency of one envelope at a time, and the same figures for a
//! ceiling: the same broker loop (consume, publish with confirm, ack) in-process, without
//! the runtime hop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use asya_sidecar::runtime_client::RuntimeClient;
use asya_transport::rabbitmq::{RabbitSettings, RabbitTransport};
use asya_transport::sqs::{SqsSettings, SqsTransport};
use asya_transport::{Outgoing, Transport};
use clap::Parser;
use serde_json::json;

#[derive(Parser)]
#[command(about = "Benchmark the asya sidecar against real RabbitMQ and SQS servers")]
struct Args {
    /// rabbitmq, sqs or both
    #[arg(long, default_value = "both")]
    transport: String,
    /// Envelopes for the RabbitMQ throughput run
    #[arg(long, default_value_t = 20_000)]
    rabbit_count: usize,
    /// Envelopes for the SQS throughput run (the local SQS server is much slower)
    #[arg(long, default_value_t = 2_000)]
    sqs_count: usize,
    /// Sequential envelopes for the latency run
    #[arg(long, default_value_t = 300)]
    latency_samples: usize,
    /// Payload size in bytes
    #[arg(long, default_value_t = 256)]
    payload_bytes: usize,
    /// Span export of the sidecar: off, on (every hop sampled, to the OTLP endpoint in
    /// ASYA_TEST_JAEGER_OTLP_ENDPOINT, default http://127.0.0.1:4318) or both, off first
    #[arg(long, default_value = "off")]
    tracing: String,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Rabbit,
    Sqs,
}

impl Kind {
    /// The broker, as the report names it.
    fn broker(self) -> &'static str {
        match self {
            Kind::Rabbit => "RabbitMQ",
            Kind::Sqs => "SQS (ElasticMQ)",
        }
    }
}

/// Messages per second between the first and the last arrival.
fn arrival_rate(arrivals: &[Instant]) -> f64 {
    match (arrivals.first(), arrivals.last()) {
        (Some(a), Some(b)) if arrivals.len() > 1 => {
            (arrivals.len() - 1) as f64 / (*b - *a).as_secs_f64()
        }
        _ => 0.0,
    }
}

fn env_or(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_string())
}

enum Client {
    Rabbit(Arc<RabbitTransport>),
    Sqs(Arc<SqsTransport>),
}

impl Client {
    async fn new(kind: Kind, queue: &str, publish_only: bool) -> Client {
        match kind {
            Kind::Rabbit => {
                let t = Arc::new(RabbitTransport::new(
                    RabbitSettings {
                        url: env_or(
                            "ASYA_TEST_RABBITMQ_URL",
                            "amqp://guest:guest@127.0.0.1:5672/%2f",
                        ),
                        url_source: "ASYA_TEST_RABBITMQ_URL",
                        exchange: "asya".into(),
                        queue: queue.into(),
                        prefetch: 500,
                        auto_create: true,
                        max_redeliveries: 1000,
                        publish_only,
                    },
                    Box::new(|| {}),
                ));
                t.ensure_connected().await;
                Client::Rabbit(t)
            }
            Kind::Sqs => Client::Sqs(Arc::new(
                SqsTransport::new(SqsSettings {
                    region: "us-east-1".into(),
                    endpoint: Some(env_or("ASYA_TEST_SQS_ENDPOINT", "http://127.0.0.1:9324")),
                    queue: queue.into(),
                    wait_seconds: 1,
                    visibility_timeout: Duration::from_secs(60),
                    auto_create: true,
                    max_message_bytes: 1_048_576,
                    // As the bench's sidecar polls (it inherits ASYA_SQS_POLLERS; default 2).
                    pollers: env_or("ASYA_SQS_POLLERS", "2").parse().unwrap_or(2),
                })
                .await,
            )),
        }
    }

    async fn send(&self, msgs: &[Outgoing]) {
        let r = match self {
            Client::Rabbit(t) => t.send(msgs).await,
            Client::Sqs(t) => t.send(msgs).await,
        };
        r.expect("bench send");
    }

    /// Takes messages until `n` arrived; returns arrival instants.
    async fn drain(&self, n: usize, within: Duration) -> Vec<Instant> {
        let deadline = Instant::now() + within;
        let mut at = Vec::with_capacity(n);
        while at.len() < n && Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            match self {
                Client::Rabbit(t) => {
                    if let Ok(Ok(batch)) = tokio::time::timeout(left, t.receive()).await {
                        for m in batch {
                            at.push(Instant::now());
                            let _ = t.ack(&m.handle).await;
                        }
                    }
                }
                Client::Sqs(t) => {
                    if let Ok(Ok(batch)) = tokio::time::timeout(left, t.receive()).await {
                        let now = Instant::now();
                        at.extend(batch.iter().map(|_| now));
                        // Together, so the deletes share one DeleteMessageBatch.
                        futures::future::join_all(batch.iter().map(|m| t.ack(&m.handle))).await;
                    }
                }
            }
        }
        at
    }
}

fn envelope(i: usize, payload: &str) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"id": format!("b{i}"), "route": {"actors": ["bench"], "current": 0},
        "headers": {}, "payload": {"i": i, "data": payload}}),
    )
    .unwrap_or_default()
}

fn proc_stat(pid: u32) -> (f64, u64) {
    // (CPU seconds user+system, RSS KiB)
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (ticks / 100.0, rss)
}

/// Context switches of all the process's threads so far: each is a thread going to sleep
/// (voluntary) or being preempted; the crossings between tokio and lapin's I/O thread show here.
fn context_switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("asya-bench-{name}"));
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Procs {
    runtime: Child,
    sidecar: Option<Child>,
}

impl Drop for Procs {
    fn drop(&mut self) {
        if let Some(s) = self.sidecar.as_mut() {
            let _ = s.kill();
            let _ = s.wait();
        }
        let _ = self.runtime.kill();
        let _ = self.runtime.wait();
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn start_runtime(dir: &Path) -> Child {
    let rt = asya_sidecar::install_runtime(dir).expect("write runtime");
    Command::new("python3")
        .arg(rt)
        .current_dir(repo_root().join("deploy/examples/handlers"))
        .env("ASYA_HANDLER", "pipeline.echo")
        .env("ASYA_SOCKET_DIR", dir)
        .stderr(Stdio::null())
        .spawn()
        .expect("python3")
}

fn start_sidecar(kind: Kind, ns: &str, dir: &Path, port: u16, tracing: bool) -> Child {
    let bin = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("asya-sidecar")))
        .expect("sidecar next to the bench");
    let mut c = Command::new(bin);
    c.env("ASYA_ACTOR_NAME", "bench")
        .env("ASYA_NAMESPACE", ns)
        .env("ASYA_SOCKET_DIR", dir)
        .env("ASYA_QUEUE_AUTO_CREATE", "true")
        .env("ASYA_METRICS_ADDR", format!("127.0.0.1:{port}"))
        .env("ASYA_LOG_LEVEL", "warn")
        .envs(otel_env(tracing))
        .stderr(Stdio::null());
    match kind {
        Kind::Rabbit => c.env("ASYA_TRANSPORT", "rabbitmq").env(
            "ASYA_RABBITMQ_URL",
            env_or(
                "ASYA_TEST_RABBITMQ_URL",
                "amqp://guest:guest@127.0.0.1:5672/%2f",
            ),
        ),
        Kind::Sqs => c
            .env("ASYA_TRANSPORT", "sqs")
            .env(
                "ASYA_SQS_ENDPOINT",
                env_or("ASYA_TEST_SQS_ENDPOINT", "http://127.0.0.1:9324"),
            )
            .env("ASYA_SQS_REGION", "us-east-1")
            .env("ASYA_SQS_WAIT_SECONDS", "1")
            .env("AWS_ACCESS_KEY_ID", env_or("AWS_ACCESS_KEY_ID", "test"))
            .env(
                "AWS_SECRET_ACCESS_KEY",
                env_or("AWS_SECRET_ACCESS_KEY", "test"),
            ),
    };
    c.spawn().expect("sidecar")
}

/// The OTEL_* variables the webhook would set with tracing on at ratio 1 (none when off).
fn otel_env(on: bool) -> Vec<(&'static str, String)> {
    if !on {
        return Vec::new();
    }
    vec![
        ("OTEL_SERVICE_NAME", "asya-sidecar-bench".into()),
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            env_or("ASYA_TEST_JAEGER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
        ),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json".into()),
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio".into()),
        ("OTEL_TRACES_SAMPLER_ARG", "1".into()),
    ]
}

async fn wait_ready(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let _ = s.write_all(b"GET /readyz HTTP/1.0\r\n\r\n").await;
            let mut buf = String::new();
            let _ = s.read_to_string(&mut buf).await;
            if buf.starts_with("HTTP/1.0 200") || buf.starts_with("HTTP/1.1 200") {
                return;
            }
        }
        assert!(Instant::now() < deadline, "sidecar not ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The 1-minute load average (/proc/loadavg), to say how busy the machine was.
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

struct Report {
    name: String,
    /// The 1-minute load average when the run started.
    load: f64,
    rate: f64,
    cpu_per_1000: Option<f64>,
    switches_per_envelope: Option<f64>,
    rss_idle_kib: Option<u64>,
    rss_load_kib: Option<u64>,
    lat: Vec<Duration>,
}

async fn prefill(input: &Client, queue: &str, n: usize, payload: &str) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let msgs: Vec<Outgoing> = chunk
            .iter()
            .map(|i| Outgoing {
                queue: queue.into(),
                body: envelope(*i, payload),
                delay: None,
            })
            .collect();
        input.send(&msgs).await;
    }
}

async fn latency(
    input: &Client,
    sink: &Client,
    queue: &str,
    samples: usize,
    payload: &str,
) -> Vec<Duration> {
    let mut lat = Vec::with_capacity(samples);
    for i in 0..samples {
        let t0 = Instant::now();
        input
            .send(&[Outgoing {
                queue: queue.into(),
                body: envelope(1_000_000 + i, payload),
                delay: None,
            }])
            .await;
        let got = sink.drain(1, Duration::from_secs(30)).await;
        if let Some(t) = got.first() {
            lat.push(*t - t0);
        }
    }
    lat.sort();
    lat
}

async fn bench_sidecar(
    kind: Kind,
    n: usize,
    samples: usize,
    payload: &str,
    tracing: bool,
) -> Report {
    let load = load_average();
    let ns = format!("bench-{}-{}", std::process::id(), u8::from(tracing));
    let ns = match kind {
        Kind::Rabbit => format!("{ns}-r"),
        Kind::Sqs => format!("{ns}-s"),
    };
    let queue = format!("asya-{ns}-bench");
    let dir = TempDir::new(&ns);
    let runtime = start_runtime(dir.path());
    let client = RuntimeClient::new(dir.path().join("asya-runtime.sock"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !client.reachable().await {
        assert!(Instant::now() < deadline, "runtime did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let input = Client::new(kind, &format!("asya-{ns}-x-bench-in"), true).await;
    let sink = Client::new(kind, &format!("asya-{ns}-x-sink"), false).await;
    let port = 19000 + (std::process::id() % 1000) as u16 + if kind == Kind::Sqs { 1 } else { 0 };
    let mut procs = Procs {
        runtime,
        sidecar: None,
    };
    procs.sidecar = Some(start_sidecar(kind, &ns, dir.path(), port, tracing));
    let pid = procs.sidecar.as_ref().map(|c| c.id()).unwrap_or(0);
    wait_ready(port).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, rss_idle) = proc_stat(pid);

    // Sequential latency first (queue empty, nothing else in flight).
    let lat = latency(&input, &sink, &queue, samples, payload).await;

    // Throughput: stop nothing; fill while the sidecar consumes, measure from the first
    // sink arrival to the last.
    let (cpu0, _) = proc_stat(pid);
    let switches0 = context_switches(pid);
    let sampler = tokio::spawn(async move {
        let mut max = 0;
        for _ in 0..100_000 {
            let (_, rss) = proc_stat(pid);
            if rss == 0 {
                break;
            }
            max = max.max(rss);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        max
    });
    let fill = {
        let payload = payload.to_string();
        let queue = queue.clone();
        tokio::spawn(async move {
            prefill(&input, &queue, n, &payload).await;
        })
    };
    let arrivals = sink.drain(n, Duration::from_secs(600)).await;
    let (cpu1, _) = proc_stat(pid);
    let switches1 = context_switches(pid);
    let _ = fill.await;
    procs.sidecar.take().map(|mut c| {
        let _ = c.kill();
        c.wait()
    });
    let rss_load = sampler.await.unwrap_or(0);
    let rate = arrival_rate(&arrivals);
    assert_eq!(arrivals.len(), n, "not every envelope arrived");
    drop(procs);
    Report {
        name: format!(
            "{} via sidecar + Python runtime, tracing {}",
            kind.broker(),
            if tracing { "on (ratio 1)" } else { "off" }
        ),
        load,
        rate,
        cpu_per_1000: Some((cpu1 - cpu0) / n as f64 * 1000.0),
        switches_per_envelope: Some(switches1.saturating_sub(switches0) as f64 / n as f64),
        rss_idle_kib: Some(rss_idle),
        rss_load_kib: Some(rss_load),
        lat,
    }
}

/// The ceiling: consume, publish with confirm, ack; pipelined like the sidecar, no runtime.
async fn bench_ceiling(kind: Kind, n: usize, samples: usize, payload: &str) -> Report {
    let load = load_average();
    let ns = format!(
        "ceil-{}-{}",
        std::process::id(),
        if kind == Kind::Rabbit { "r" } else { "s" }
    );
    let queue = format!("asya-{ns}-bench");
    let sink_q = format!("asya-{ns}-x-sink");
    let worker = Arc::new(Client::new(kind, &queue, false).await);
    let input = Client::new(kind, &format!("asya-{ns}-x-bench-in"), true).await;
    let sink = Client::new(kind, &sink_q, false).await;
    let w = worker.clone();
    let sq = sink_q.clone();
    let looper = tokio::spawn(async move {
        let sem = Arc::new(tokio::sync::Semaphore::new(64));
        loop {
            let batch = match &*w {
                Client::Rabbit(t) => t.receive().await.map(|b| {
                    b.into_iter()
                        .map(|m| (m.body, Some(m.handle), None))
                        .collect::<Vec<_>>()
                }),
                Client::Sqs(t) => t.receive().await.map(|b| {
                    b.into_iter()
                        .map(|m| (m.body, None, Some(m.handle)))
                        .collect::<Vec<_>>()
                }),
            };
            let Ok(batch) = batch else { continue };
            for (body, rh, sh) in batch {
                let permit = sem.clone().acquire_owned().await;
                let w = w.clone();
                let sq = sq.clone();
                tokio::spawn(async move {
                    let _p = permit;
                    let out = [Outgoing {
                        queue: sq,
                        body,
                        delay: None,
                    }];
                    match (&*w, rh, sh) {
                        (Client::Rabbit(t), Some(h), _) => match t.send(&out).await {
                            Ok(()) => drop(t.ack(&h).await),
                            Err(e) => eprintln!("ceiling send: {e}"),
                        },
                        (Client::Sqs(t), _, Some(h)) => match t.send(&out).await {
                            Ok(()) => drop(t.ack(&h).await),
                            Err(e) => eprintln!("ceiling send: {e}"),
                        },
                        _ => {}
                    }
                });
            }
        }
    });
    let lat = latency(&input, &sink, &queue, samples, payload).await;
    let fill = {
        let payload = payload.to_string();
        let queue = queue.clone();
        tokio::spawn(async move { prefill(&input, &queue, n, &payload).await })
    };
    let arrivals = sink.drain(n, Duration::from_secs(600)).await;
    let _ = fill.await;
    looper.abort();
    let rate = arrival_rate(&arrivals);
    Report {
        name: format!("{} ceiling: broker loop, no runtime hop", kind.broker()),
        load,
        rate,
        cpu_per_1000: None,
        switches_per_envelope: None,
        rss_idle_kib: None,
        rss_load_kib: None,
        lat,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let payload = "p".repeat(args.payload_bytes);
    let mut kinds = Vec::new();
    if args.transport == "rabbitmq" || args.transport == "both" {
        kinds.push((Kind::Rabbit, args.rabbit_count));
    }
    if args.transport == "sqs" || args.transport == "both" {
        kinds.push((Kind::Sqs, args.sqs_count));
    }
    let modes: &[bool] = match args.tracing.as_str() {
        "on" => &[true],
        "both" => &[false, true],
        _ => &[false],
    };
    // Per transport: the sidecar runs (tracing off, then on), then the ceiling.
    let mut groups = Vec::new();
    for (kind, n) in kinds {
        let mut group = Vec::new();
        for &tracing in modes {
            eprintln!("bench: sidecar run ({n} envelopes, tracing {tracing})");
            group.push(bench_sidecar(kind, n, args.latency_samples, &payload, tracing).await);
        }
        eprintln!("bench: ceiling run ({n} envelopes)");
        group.push(bench_ceiling(kind, n, args.latency_samples, &payload).await);
        groups.push(group);
    }
    let reports: Vec<&Report> = groups.iter().flatten().collect();
    println!(
        "| run | load (1 min) at start | envelopes/s | e2e latency p50 | e2e latency p99 | sidecar CPU per 1,000 envelopes | sidecar context switches per envelope | sidecar RSS idle | sidecar RSS under load |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &reports {
        let kib = |v: Option<u64>| {
            v.map(|k| format!("{:.1} MiB", k as f64 / 1024.0))
                .unwrap_or_else(|| "-".into())
        };
        println!(
            "| {} | {:.2} | {:.0} | {} | {} | {} | {} | {} | {} |",
            r.name,
            r.load,
            r.rate,
            ms(percentile(&r.lat, 0.5)),
            ms(percentile(&r.lat, 0.99)),
            r.cpu_per_1000
                .map(|c| format!("{:.0} ms", c * 1000.0))
                .unwrap_or_else(|| "-".into()),
            r.switches_per_envelope
                .map(|c| format!("{c:.2}"))
                .unwrap_or_else(|| "-".into()),
            kib(r.rss_idle_kib),
            kib(r.rss_load_kib),
        );
    }
    for group in &groups {
        let Some((c, sidecars)) = group.split_last() else {
            continue;
        };
        for s in sidecars {
            println!(
                "\n{}: {:.0}/s is {:.0} % of the ceiling's {:.0}/s in the same run; added latency over the bare broker loop: p50 {}, p99 {}",
                s.name,
                s.rate,
                100.0 * s.rate / c.rate.max(f64::MIN_POSITIVE),
                c.rate,
                ms(percentile(&s.lat, 0.5).saturating_sub(percentile(&c.lat, 0.5))),
                ms(percentile(&s.lat, 0.99).saturating_sub(percentile(&c.lat, 0.99))),
            );
        }
    }
}
