//! A flow's fan-out and fan-in through real queues (RabbitMQ and the SQS server from
//! tests/services), real sidecars and Python runtimes, and the real gateway on the test
//! PostgreSQL (its fan-in endpoint): flow/fixtures/fan_out.py, compiled in
//! flow/fixtures/fan_out.program.json, handlers in deploy/examples/handlers/fanout.py.
//! Five branches gathered in order, then a second fan-out; a branch result delivered three
//! times (before, during and after its join) counts once and the flow goes on once; a branch
//! that raises takes the flow's `except` once; one nothing catches ends in x-sump once.
//!
//! The gateway binary is the workspace's: `cargo build -p asya-gateway` first (`make unit`
//! and `cargo test --workspace` build it).

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use asya_sidecar::flow_routing::{self, FlowStep, Start};
use asya_sidecar::routing::{HandlerMode, Queues};
use asya_transport::envelope::Envelope;
use common::{Actor, ActorSpec, Client, Kind, queue, unique_ns};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
const QUIET: Duration = Duration::from_secs(2);

both!(fan_out_joins_once);

struct Gateway {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The workspace's gateway binary beside the sidecar's, or `ASYA_TEST_GATEWAY_BIN`.
fn gateway_bin() -> PathBuf {
    let bin = std::env::var_os("ASYA_TEST_GATEWAY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_BIN_EXE_asya-sidecar")).with_file_name("asya-gateway")
        });
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p asya-gateway` (same profile)",
        bin.display()
    );
    bin
}

/// The real gateway, without authentication, on the test PostgreSQL.
fn gateway(db: &str) -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tools.yaml"), "tools: []\n").unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = std::fs::File::create(dir.path().join("gateway.log")).unwrap();
    let child = Command::new(gateway_bin())
        .args(["serve", "--no-auth", "--addr", &format!("127.0.0.1:{port}")])
        .arg("--tools")
        .arg(dir.path().join("tools.yaml"))
        .args(["--database-url", db, "--namespace-uids", "off"])
        // A transport is required at start; the gateway sends nothing here.
        .args([
            "--sqs-region",
            "us-east-1",
            "--sqs-endpoint",
            "http://127.0.0.1:9",
        ])
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("ASYA_LOG_FORMAT", "text")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("the gateway binary runs");
    let gw = Gateway {
        child,
        port,
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while common::http_get(port, "/health").map(|(c, _)| c) != Some(200) {
        assert!(
            Instant::now() < deadline,
            "the gateway is not healthy in 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    gw
}

fn program() -> String {
    std::fs::read_to_string(common::root().join("flow/fixtures/fan_out.program.json")).unwrap()
}

fn input(id: &str, items: Value) -> Value {
    json!({"id": id, "route": {"actors": ["split"], "current": 0}, "payload": {"items": items}})
}

/// Branch `index` of `id`'s first fan-out, exactly as split's sidecar makes it: the pure
/// routing functions on the state split answers.
fn first_branch(ns: &str, id: &str, items: Value, index: usize) -> Value {
    let p: asya_flow::Program = serde_json::from_str(&program()).unwrap();
    let env: Envelope = serde_json::from_value(input(id, items.clone())).unwrap();
    let q = Queues {
        namespace: ns.into(),
    };
    let Start::Handle(e) = flow_routing::start(&env, &p, "split", &q) else {
        panic!("split is the flow's first call")
    };
    let c = flow_routing::carried(&e).unwrap().unwrap();
    let n = items.as_array().unwrap().len();
    let state = json!({"items": items, "first": items[0], "last": items[n - 1]});
    match flow_routing::after_results(&e, c, vec![state], HandlerMode::Payload, &q) {
        FlowStep::Branches(b) => serde_json::to_value(&b[index].1).unwrap(),
        other => panic!("not a fan-out: {other:?}"),
    }
}

/// Messages `actor`'s sidecar finished (every status).
fn processed(a: &Actor) -> u64 {
    a.metrics()
        .lines()
        .filter(|l| l.starts_with("asya_actor_messages_processed_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn wait_processed(a: &Actor, n: u64) {
    let deadline = Instant::now() + WAIT;
    while processed(a) < n {
        assert!(
            Instant::now() < deadline,
            "{} processed {} of {n}:\n{}",
            a.name,
            processed(a),
            a.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

async fn fan_out_joins_once(kind: Kind) {
    if !common::have_var("PostgreSQL", "ASYA_TEST_POSTGRES_URL") {
        return;
    }
    let gw = gateway(&std::env::var("ASYA_TEST_POSTGRES_URL").unwrap());
    let url = format!("http://127.0.0.1:{}", gw.port);
    let ns = unique_ns("fan");
    let sink = Client::new(kind, &queue(&ns, "x-sink")).await;
    let sump = Client::new(kind, &queue(&ns, "x-sump")).await;
    let test = Client::new(kind, &queue(&ns, "x-test-input")).await;
    let program = program();
    let split_env = [
        (asya_flow::PROGRAM_ENV, program.as_str()),
        ("ASYA_GATEWAY_URL", url.as_str()),
    ];
    let split = Actor::start(
        kind,
        &ns,
        "split",
        ActorSpec {
            handler: "fanout.split",
            env: &split_env,
            ..Default::default()
        },
    );
    let double_env = [("ASYA_GATEWAY_URL", url.as_str())];
    let double = Actor::start(
        kind,
        &ns,
        "double",
        ActorSpec {
            handler: "fanout.double",
            env: &double_env,
            ..Default::default()
        },
    );

    // Branch 1 of "ok" arrives before the fan-out itself (a duplicate ahead of its original):
    // stored, the join waits.
    let dup = first_branch(&ns, "ok", json!([1, 2, 3, 4, 5]), 1);
    assert_eq!(dup["id"], "ok-1");
    test.send(&double.queue(), &dup).await;
    wait_processed(&double, 1);
    test.send(&split.queue(), &input("ok", json!([1, 2, 3, 4, 5])))
        .await;
    let got = sink.take(1, WAIT).await;
    assert_eq!(
        got.len(),
        1,
        "x-sink: {got:?}\n{}\n{}",
        split.logs(),
        double.logs()
    );
    let ok = &got[0];
    assert_eq!(ok["id"], "ok");
    assert_eq!(
        ok["payload"],
        json!({"items": [1, 2, 3, 4, 5], "first": 1, "last": 5,
               "doubled": [2, 4, 6, 8, 10], "pairs": [2, 10], "total": 12})
    );
    assert_eq!(ok["route"]["actors"], json!(["split"]));
    assert!(ok.get("fanin").is_none(), "{ok}");
    // Both fan-outs ran: the first's 5 branches (and the early copy), the second's 2.
    wait_processed(&double, 1 + 5 + 2);
    // The same branch once more, after its join fired: nothing happens.
    test.send(&double.queue(), &dup).await;
    wait_processed(&double, 1 + 5 + 2 + 1);
    sink.expect_nothing(QUIET).await;

    // A branch raises ValueError: the flow's except, once, as the fanning envelope.
    test.send(&split.queue(), &input("neg", json!([1, -2, 3])))
        .await;
    // A branch raises KeyError, which nothing catches: x-sump, once, with the handler's error.
    test.send(&split.queue(), &input("bad", json!([13, 2])))
        .await;
    let got = sink.take(1, WAIT).await;
    assert_eq!(got.len(), 1, "x-sink: {got:?}\n{}", double.logs());
    assert_eq!(got[0]["id"], "neg");
    assert_eq!(
        got[0]["payload"],
        json!({"items": [1, -2, 3], "first": 1, "last": 3, "failed": true})
    );
    assert_eq!(got[0]["flow"]["trail"], json!(["14:except ValueError"]));
    let failed = sump.take(1, WAIT).await;
    assert_eq!(failed.len(), 1, "x-sump: {failed:?}\n{}", double.logs());
    let bad = &failed[0];
    assert_eq!(bad["id"], "bad");
    let error = &bad["headers"]["x-asya-error"];
    assert_eq!(error["reason"], "unhandled KeyError in flow fan", "{bad}");
    assert_eq!(
        (error["type"].as_str(), error["actor"].as_str()),
        (Some("KeyError"), Some("double"))
    );
    assert_eq!(
        bad["payload"],
        json!({"items": [13, 2], "first": 13, "last": 2})
    );
    wait_processed(&double, 9 + 3 + 2);
    sink.expect_nothing(QUIET).await;
    sump.expect_nothing(QUIET).await;
}

/// A benchmark, not a test (docs/benchmarks.md § Flows): the fan-out flow with `N` items
/// (`ASYA_FANOUT_BENCH_N`, default 10) on RabbitMQ and the gateway on PostgreSQL: split, N
/// branches joined, 2 more joined, x-sink. Prints p50/p99 end-to-end latency of one envelope
/// at a time and envelopes/s (branches/s) of a burst of `ASYA_FANOUT_BENCH_COUNT` (200). Run:
/// `cargo test --profile ci -p asya-sidecar -p asya-gateway --no-run`, then the test binary
/// with `--ignored --nocapture bench` (ASYA_TEST_GATEWAY_BIN: the ci gateway).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn bench_fan_out() {
    if !common::have(Kind::Rabbit) || !common::have_var("PostgreSQL", "ASYA_TEST_POSTGRES_URL") {
        return;
    }
    let var = |k: &str, d: usize| -> usize {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (n, count) = (
        var("ASYA_FANOUT_BENCH_N", 10),
        var("ASYA_FANOUT_BENCH_COUNT", 200),
    );
    let kind = Kind::Rabbit;
    let gw = gateway(&std::env::var("ASYA_TEST_POSTGRES_URL").unwrap());
    let url = format!("http://127.0.0.1:{}", gw.port);
    let ns = unique_ns("fanbench");
    let sink = Client::new(kind, &queue(&ns, "x-sink")).await;
    let test = Client::new(kind, &queue(&ns, "x-test-input")).await;
    let program = program();
    let split_env = [
        (asya_flow::PROGRAM_ENV, program.as_str()),
        ("ASYA_GATEWAY_URL", url.as_str()),
        ("ASYA_LOG_LEVEL", "warn"),
    ];
    let split = Actor::start(
        kind,
        &ns,
        "split",
        ActorSpec {
            handler: "fanout.split",
            env: &split_env,
            ..Default::default()
        },
    );
    let double_env = [
        ("ASYA_GATEWAY_URL", url.as_str()),
        ("ASYA_LOG_LEVEL", "warn"),
    ];
    let _double = Actor::start(
        kind,
        &ns,
        "double",
        ActorSpec {
            handler: "fanout.double",
            env: &double_env,
            ..Default::default()
        },
    );
    // From 100: no 13 (which double refuses) and no negative.
    let items: Vec<i64> = (100..100 + n as i64).collect();
    let want: Vec<i64> = items.iter().map(|x| x * 2).collect();
    let mut lat = Vec::new();
    for i in 0..100 {
        let t = Instant::now();
        test.send(&split.queue(), &input(&format!("l{i}"), json!(items)))
            .await;
        let got = sink.take(1, WAIT).await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0]["payload"]["doubled"], json!(want));
        lat.push(t.elapsed().as_secs_f64() * 1e3);
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    let t = Instant::now();
    for i in 0..count {
        test.send(&split.queue(), &input(&format!("b{i}"), json!(items)))
            .await;
    }
    let got = sink.take(count, Duration::from_secs(600)).await;
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(got.len(), count);
    assert!(got.iter().all(|e| e["payload"]["doubled"] == json!(want)));
    println!(
        "fan-out of {n} (+ a fan-out of 2), RabbitMQ + gateway on PostgreSQL: {count} envelopes in {secs:.1} s = {:.1} envelopes/s ({:.0} branches/s); latency p50 {:.1} ms, p99 {:.1} ms",
        count as f64 / secs,
        ((n + 2) * count) as f64 / secs,
        lat[49],
        lat[98]
    );
}
