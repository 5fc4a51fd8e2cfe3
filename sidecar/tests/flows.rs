//! A flow through real queues (RabbitMQ and the SQS server from tests/services), the real
//! sidecar binary and the real Python runtime: the worked example of docs/flows.md
//! (deploy/examples/flows/order_review.py, compiled in flow/fixtures/order_review.program.json; its
//! handlers in deploy/examples/handlers/orders.py). Branches, the retry loop, the except paths
//! and the early return are evaluated by the sidecars: the only queues an envelope visits are
//! those of the actors it calls.

#[macro_use]
mod common;

use std::time::Duration;

use common::{Actor, ActorSpec, Client, Kind, queue, unique_ns};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
const QUIET: Duration = Duration::from_secs(2);

both!(order_review_flow);

fn program() -> String {
    std::fs::read_to_string(common::root().join("flow/fixtures/order_review.program.json")).unwrap()
}

fn order(id: &str, payload: Value) -> Value {
    // What a user sends to the flow's entry: a plain envelope for its entry actor.
    json!({"id": id, "route": {"actors": ["validate"], "current": 0}, "payload": payload})
}

async fn order_review_flow(kind: Kind) {
    let ns = unique_ns("flow");
    let sink = Client::new(kind, &queue(&ns, "x-sink")).await;
    let sump = Client::new(kind, &queue(&ns, "x-sump")).await;
    let input = Client::new(kind, &queue(&ns, "x-test-input")).await;
    let program = program();
    let entry_env = [(asya_flow::PROGRAM_ENV, program.as_str())];
    let actor =
        |name: &str, handler: &'static str, env: &'static [(&'static str, &'static str)]| {
            Actor::start(
                kind,
                &ns,
                name,
                ActorSpec {
                    handler,
                    mode: "payload",
                    env,
                    ..Default::default()
                },
            )
        };
    // The entry is started with the program; the other actors know nothing of the flow.
    let validate = Actor::start(
        kind,
        &ns,
        "validate",
        ActorSpec {
            handler: "orders.validate",
            mode: "payload",
            env: &entry_env,
            ..Default::default()
        },
    );
    let _charge = actor("charge", "orders.charge", &[]);
    let _express = actor("express-ship", "orders.express_ship", &[]);
    let _standard = actor("standard-ship", "orders.standard_ship", &[]);
    let _notify = actor("notify", "orders.notify", &[]);

    let item = |p: i64| json!({"price": p});
    let cases = [
        ("big", json!({"items": [item(60), item(50)]})),
        (
            "once",
            json!({"items": [item(5)], "card": "declined-once", "country": "US"}),
        ),
        ("pickup", json!({"items": [item(5)], "country": "DE"})),
        ("empty", json!({})),
        ("declined", json!({"items": [item(5)], "card": "declined"})),
    ];
    for (id, payload) in &cases {
        input
            .send(&validate.queue(), &order(id, payload.clone()))
            .await;
    }
    let got = sink.take(4, WAIT).await;
    assert_eq!(got.len(), 4, "x-sink got {got:?}\n{}", validate.logs());
    let by_id = |id: &str| {
        got.iter()
            .find(|e| e["id"] == id)
            .unwrap_or_else(|| panic!("{id} not in x-sink: {got:?}"))
    };
    let route = |e: &Value| e["route"]["actors"].clone();
    let trail = |e: &Value| e["flow"]["trail"].clone();

    let big = by_id("big");
    assert_eq!(
        big["payload"],
        json!({"items": [item(60), item(50)], "status": "done", "attempt": 1, "total": 110,
               "charged": 110, "shipping": "express", "notified": true,
               "trail": ["validate", "charge", "express_ship", "notify"]})
    );
    // The route is the path taken: only the actors called, no router between them.
    assert_eq!(
        route(big),
        json!(["validate", "charge", "express-ship", "notify"])
    );
    assert_eq!(trail(big), json!(["14:if"]));

    let once = by_id("once");
    assert_eq!(once["payload"]["attempt"], 2);
    assert_eq!(once["payload"]["shipping"], "standard");
    assert_eq!(once["payload"]["status"], "done");
    assert_eq!(
        route(once),
        json!(["validate", "charge", "charge", "standard-ship", "notify"])
    );
    assert_eq!(
        trail(once),
        json!(["37:except PaymentDeclined", "38:else", "14:else", "17:if"])
    );
    // The failed attempt is on the record, as any handler error.
    assert_eq!(
        once["headers"]["x-asya-attempts"][0]["type"],
        "PaymentDeclined"
    );

    let pickup = by_id("pickup");
    assert_eq!(pickup["payload"]["shipping"], "pickup");
    assert_eq!(route(pickup), json!(["validate", "charge", "notify"]));

    let empty = by_id("empty");
    assert_eq!(
        empty["payload"],
        json!({"status": "rejected", "attempt": 0})
    );
    assert_eq!(route(empty), json!(["validate"]));
    assert_eq!(trail(empty), json!(["29:except KeyError"]));

    // Three declines: the `raise` in the except path re-raises the handler's own error.
    let failed = sump.take(1, WAIT).await;
    assert_eq!(failed.len(), 1);
    let d = &failed[0];
    assert_eq!(d["id"], "declined");
    let err = &d["headers"]["x-asya-error"];
    assert_eq!(
        err["reason"],
        "unhandled PaymentDeclined in flow review_order"
    );
    assert_eq!(err["type"], "PaymentDeclined");
    assert_eq!(err["actor"], "charge");
    assert!(
        err["traceback"]
            .as_str()
            .unwrap_or("")
            .contains("PaymentDeclined"),
        "{err}"
    );
    assert_eq!(d["payload"]["attempt"], 3);
    assert_eq!(route(d), json!(["validate", "charge", "charge", "charge"]));
    sink.expect_nothing(QUIET).await;
    sump.expect_nothing(QUIET).await;
}

/// A benchmark, not a test (docs/benchmarks.md § Flows): the worked flow's five-step path with
/// its branch and its loop (a card declined once, shipped in the US: validate, charge, charge,
/// standard-ship, notify) on RabbitMQ. Prints envelopes/s (a burst of `ASYA_FLOW_BENCH_COUNT`,
/// first send to last arrival in x-sink) and p50/p99 end-to-end latency of one envelope at a
/// time. Run: `cargo test --profile ci -p asya-sidecar --test flows -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn bench_five_step_flow() {
    if !common::have(Kind::Rabbit) {
        return;
    }
    let kind = Kind::Rabbit;
    let count: usize = std::env::var("ASYA_FLOW_BENCH_COUNT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let ns = unique_ns("flowbench");
    let sink = Client::new(kind, &queue(&ns, "x-sink")).await;
    let input = Client::new(kind, &queue(&ns, "x-test-input")).await;
    let program = program();
    let entry_env = [(asya_flow::PROGRAM_ENV, program.as_str())];
    let quiet: &'static [(&'static str, &'static str)] = &[("ASYA_LOG_LEVEL", "warn")];
    let validate = Actor::start(
        kind,
        &ns,
        "validate",
        ActorSpec {
            handler: "orders.validate",
            mode: "payload",
            env: &[entry_env[0], ("ASYA_LOG_LEVEL", "warn")],
            ..Default::default()
        },
    );
    let _others: Vec<Actor> = [
        ("charge", "orders.charge"),
        ("standard-ship", "orders.standard_ship"),
        ("notify", "orders.notify"),
        ("express-ship", "orders.express_ship"),
    ]
    .into_iter()
    .map(|(n, h)| {
        Actor::start(
            kind,
            &ns,
            n,
            ActorSpec {
                handler: h,
                mode: "payload",
                env: quiet,
                ..Default::default()
            },
        )
    })
    .collect();
    let payload = json!({"items": [{"price": 5}], "card": "declined-once", "country": "US"});
    // Latency first, one at a time.
    let mut lat = Vec::new();
    for i in 0..100 {
        let t = std::time::Instant::now();
        input
            .send(&validate.queue(), &order(&format!("l{i}"), payload.clone()))
            .await;
        let got = sink.take(1, WAIT).await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0]["route"]["actors"].as_array().map(Vec::len), Some(5));
        lat.push(t.elapsed().as_secs_f64() * 1e3);
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    let t = std::time::Instant::now();
    for i in 0..count {
        input
            .send(&validate.queue(), &order(&format!("b{i}"), payload.clone()))
            .await;
    }
    let got = sink.take(count, Duration::from_secs(600)).await;
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(got.len(), count);
    assert!(got.iter().all(|e| e["payload"]["shipping"] == "standard"));
    println!(
        "five-step flow (5 handler hops, branch + loop + except), RabbitMQ: {count} envelopes in {secs:.1} s = {:.0} envelopes/s ({:.0} handler hops/s); latency p50 {:.1} ms, p99 {:.1} ms",
        count as f64 / secs,
        5.0 * count as f64 / secs,
        lat[49],
        lat[98]
    );
}
