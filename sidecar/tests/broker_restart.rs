//! The RabbitMQ broker restarted under load: every envelope still reaches x-sink (at least
//! once), none missing. Its own test binary so no other test's broker traffic is cut off
//! (cargo runs test binaries one after another).

mod common;

use std::collections::HashSet;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Actor, ActorSpec, Client, Kind, envelope, queue, unique_ns};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_restart_under_load_loses_nothing() {
    if !common::have(Kind::Rabbit) || !common::have_var("RabbitMQ", "ASYA_TEST_RABBITMQ_CTL") {
        return;
    }
    let ctl = std::env::var("ASYA_TEST_RABBITMQ_CTL").unwrap_or_else(|_| {
        panic!("ASYA_TEST_RABBITMQ_CTL is not set: run tests/services/up and `source tests/services/env`")
    });
    let ns = unique_ns("brk");
    let sink = Client::new(Kind::Rabbit, &queue(&ns, "x-sink")).await;
    let input = Client::new(Kind::Rabbit, &queue(&ns, "x-test-input")).await;
    let a = Actor::start(Kind::Rabbit, &ns, "a", ActorSpec::default());
    let n = 400;
    for i in 0..n {
        input
            .send(
                &a.queue(),
                &envelope(&format!("m{i}"), &["a"], json!({"do": "echo", "i": i})),
            )
            .await;
    }
    let mut seen = HashSet::new();
    let mut total = 0usize;
    // Restart while the sidecar is mid-stream.
    for m in sink.take(50, Duration::from_secs(60)).await {
        seen.insert(m["id"].as_str().unwrap().to_string());
        total += 1;
    }
    assert!(
        !seen.is_empty(),
        "nothing processed before the restart:\n{}",
        a.logs()
    );
    let status = Command::new(&ctl)
        .arg("restart")
        .status()
        .expect("broker control script runs");
    assert!(status.success(), "broker restart failed");
    let deadline = Instant::now() + Duration::from_secs(180);
    while seen.len() < n && Instant::now() < deadline {
        for m in sink.take(n, Duration::from_secs(5)).await {
            seen.insert(m["id"].as_str().unwrap().to_string());
            total += 1;
        }
    }
    let missing: Vec<usize> = (0..n)
        .filter(|i| !seen.contains(&format!("m{i}")))
        .collect();
    assert!(
        missing.is_empty(),
        "missing after broker restart: {missing:?}\n{}",
        a.logs()
    );
    eprintln!(
        "{n} envelopes, {total} deliveries to x-sink ({} duplicates)",
        total - n
    );
    assert!(
        a.metrics()
            .contains("asya_actor_transport_reconnects_total")
    );
}
