//! Envelopes through real queues (RabbitMQ and the SQS server from tests/services), the real
//! sidecar binary and the real Python runtime. Each scenario runs on both transports.

#[macro_use]
mod common;

use std::time::Duration;

use common::{Actor, ActorSpec, Client, Kind, envelope, ids, queue, unique_ns};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
const QUIET: Duration = Duration::from_secs(2);

both!(
    linear_pipeline,
    fan_out,
    empty_result,
    handler_exception_to_sump_with_traceback,
    retry_then_success,
    retries_exhausted,
    action_fail,
    handler_timeout,
    runtime_killed_mid_message,
    runtime_stopped_by_its_pod_mid_message,
    sidecar_sigkilled_mid_message,
    malformed_messages,
    large_payload,
    envelope_mode_dynamic_routing,
    sigterm_finishes_in_flight_and_exits_zero,
    sigterm_gives_back_what_it_has_not_started,
    poison_message_to_sump,
    runtime_killed_with_calls_queued,
    handler_timeout_spares_queued_calls,
    original_runtime_contract,
    wakes_the_later_hops_once,
    send_wakes_the_whole_route,
);

struct Ends {
    sink: Client,
    sump: Client,
    input: Client,
}

async fn ends(kind: Kind, ns: &str) -> Ends {
    Ends {
        sink: Client::new(kind, &queue(ns, "x-sink")).await,
        sump: Client::new(kind, &queue(ns, "x-sump")).await,
        input: Client::new(kind, &queue(ns, "x-test-input")).await,
    }
}

fn start(kind: Kind, ns: &str, name: &str, env: &[(&str, &str)]) -> Actor {
    Actor::start(
        kind,
        ns,
        name,
        ActorSpec {
            env,
            ..Default::default()
        },
    )
}

const RETRY3: &str = r#"{"policies":{"default":{"maxAttempts":3,"backoff":"constant","initialInterval":"1s","maxInterval":"1s"}},
    "rules":[{"match":"ContentPolicyViolation","action":"fail"}]}"#;

async fn linear_pipeline(kind: Kind) {
    let ns = unique_ns("lin");
    let e = ends(kind, &ns).await;
    let a = start(kind, &ns, "a", &[]);
    let _b = start(kind, &ns, "b", &[]);
    e.input
        .send(
            &a.queue(),
            &envelope("e1", &["a", "b"], json!({"do": "double", "value": 3})),
        )
        .await;
    let got = e.sink.take(1, WAIT).await;
    assert_eq!(got.len(), 1, "nothing reached x-sink");
    assert_eq!(got[0]["payload"]["value"], 12);
    assert_eq!(got[0]["id"], "e1");
    assert_eq!(got[0]["route"]["current"], 2);
    assert_eq!(
        got[0]["headers"]["trace_id"], "trace-e1",
        "headers travel on every hop"
    );
    let metrics = a.metrics();
    assert!(
        metrics.contains("asya_actor_messages_processed_total{queue=\"asya-")
            && metrics.contains("status=\"success\"} 1"),
        "{metrics}"
    );
    e.sump.expect_nothing(QUIET).await;
}

async fn original_runtime_contract(kind: Kind) {
    // A runtime of the original contract (one connection per envelope, closed after the
    // answer, no keep-alive bit: tests/fixtures/original_runtime.py) behind our sidecar,
    // with calls pipelined: every envelope arrives, in x-sink, processed once.
    let ns = unique_ns("orig");
    let e = ends(kind, &ns).await;
    let a = Actor::start(
        kind,
        &ns,
        "a",
        ActorSpec {
            runtime: "sidecar/tests/fixtures/original_runtime.py",
            ..Default::default()
        },
    );
    let n = 30;
    for i in 0..n {
        e.input
            .send(
                &a.queue(),
                &envelope(
                    &format!("o{i}"),
                    &["a"],
                    json!({"do": "double", "value": i}),
                ),
            )
            .await;
    }
    let got = e.sink.take(n, WAIT).await;
    let mut values: Vec<i64> = got
        .iter()
        .filter_map(|m| m["payload"]["value"].as_i64())
        .collect();
    values.sort_unstable();
    assert_eq!(values, (0..n as i64).map(|i| i * 2).collect::<Vec<_>>());
    e.sump.expect_nothing(QUIET).await;
}

async fn fan_out(kind: Kind) {
    let ns = unique_ns("fan");
    let e = ends(kind, &ns).await;
    let a = start(kind, &ns, "a", &[]);
    let _b = start(kind, &ns, "b", &[]);
    e.input
        .send(
            &a.queue(),
            &envelope("f", &["a", "b"], json!({"do": "fanout", "n": 3})),
        )
        .await;
    let got = e.sink.take(3, WAIT).await;
    assert_eq!(ids(&got), ["f", "f-1", "f-2"]);
    for m in &got {
        let expect_parent = if m["id"] == "f" {
            Value::Null
        } else {
            json!("f")
        };
        assert_eq!(
            m.get("parent_id").cloned().unwrap_or(Value::Null),
            expect_parent
        );
    }
    let mut parts: Vec<i64> = got
        .iter()
        .map(|m| m["payload"]["part"].as_i64().unwrap())
        .collect();
    parts.sort();
    assert_eq!(parts, [0, 1, 2]);
    e.sink.expect_nothing(QUIET).await;
}

async fn empty_result(kind: Kind) {
    let ns = unique_ns("emp");
    let e = ends(kind, &ns).await;
    let a = start(kind, &ns, "a", &[]);
    e.input
        .send(
            &a.queue(),
            &envelope("z", &["a", "b"], json!({"do": "empty"})),
        )
        .await;
    let got = e.sink.take(1, WAIT).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["payload"], Value::Null);
}

async fn handler_exception_to_sump_with_traceback(kind: Kind) {
    let ns = unique_ns("exc");
    let e = ends(kind, &ns).await;
    let a = start(kind, &ns, "a", &[]);
    e.input
        .send(
            &a.queue(),
            &envelope("x", &["a"], json!({"do": "raise", "key": "k1"})),
        )
        .await;
    let got = e.sump.take(1, WAIT).await;
    assert_eq!(got.len(), 1);
    let err = &got[0]["headers"]["x-asya-error"];
    assert_eq!(err["type"], "ValueError");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("handler failed on purpose: k1")
    );
    assert!(
        err["traceback"].as_str().unwrap().contains("Traceback"),
        "{err}"
    );
    assert_eq!(
        got[0]["payload"]["do"], "raise",
        "the input is kept for replay"
    );
    assert_eq!(got[0]["route"]["current"], 0);
    e.sink.expect_nothing(QUIET).await;
}

async fn retry_then_success(kind: Kind) {
    let ns = unique_ns("rts");
    let e = ends(kind, &ns).await;
    let a = start(kind, &ns, "a", &[("ASYA_RESILIENCY", RETRY3)]);
    e.input
        .send(
            &a.queue(),
            &envelope("r", &["a"], json!({"do": "flaky", "key": "r", "fails": 1})),
        )
        .await;
    let got = e.sink.take(1, WAIT).await;
    assert_eq!(got.len(), 1, "the retry did not succeed");
    assert_eq!(got[0]["payload"]["attempts"], 2);
    let history = got[0]["headers"]["x-asya-attempts"].as_array().unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0]["type"], "RateLimitError");
    e.sump.expect_nothing(QUIET).await;
}

async fn retries_exhausted(kind: Kind) {
    let ns = unique_ns("rex");
    let e = ends(kind, &ns).await;
    let a = start(kind, &ns, "a", &[("ASYA_RESILIENCY", RETRY3)]);
    e.input
        .send(
            &a.queue(),
            &envelope("r", &["a"], json!({"do": "flaky", "key": "r", "fails": 10})),
        )
        .await;
    let got = e.sump.take(1, WAIT).await;
    assert_eq!(got.len(), 1);
    let err = &got[0]["headers"]["x-asya-error"];
    assert!(
        err["reason"]
            .as_str()
            .unwrap()
            .contains("retries exhausted"),
        "{err}"
    );
    let history = got[0]["headers"]["x-asya-attempts"].as_array().unwrap();
    assert_eq!(
        history
            .iter()
            .map(|h| h["attempt"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [1, 2, 3]
    );
    e.sink.expect_nothing(QUIET).await;
}

async fn action_fail(kind: Kind) {
    let ns = unique_ns("af");
    let e = ends(kind, &ns).await;
    let a = start(kind, &ns, "a", &[("ASYA_RESILIENCY", RETRY3)]);
    e.input
        .send(
            &a.queue(),
            &envelope("p", &["a"], json!({"do": "forbidden", "key": "p"})),
        )
        .await;
    let got = e.sump.take(1, WAIT).await;
    assert_eq!(got.len(), 1);
    let err = &got[0]["headers"]["x-asya-error"];
    assert!(
        err["reason"].as_str().unwrap().contains("action fail"),
        "{err}"
    );
    assert_eq!(
        got[0]["headers"]["x-asya-attempts"]
            .as_array()
            .unwrap()
            .len(),
        1,
        "no retries"
    );
}

async fn handler_timeout(kind: Kind) {
    let ns = unique_ns("tmo");
    let e = ends(kind, &ns).await;
    let a = start(kind, &ns, "a", &[("ASYA_RUNTIME_TIMEOUT", "1s")]);
    e.input
        .send(
            &a.queue(),
            &envelope("slow", &["a"], json!({"do": "sleep", "seconds": 30})),
        )
        .await;
    let got = e.sump.take(1, WAIT).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["headers"]["x-asya-error"]["error"], "timeout");
    // The runtime exits when abandoned and is restarted; the next envelope goes through.
    e.input
        .send(&a.queue(), &envelope("next", &["a"], json!({"do": "echo"})))
        .await;
    let got = e.sink.take(1, WAIT).await;
    assert_eq!(ids(&got), ["next"]);
    assert!(
        a.runtime
            .as_ref()
            .unwrap()
            .starts
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 2
    );
}

/// Sends envelope `id` whose handler does `action` (testing.py) the first time only: the first
/// run leaves the returned marker file, which a second run sees.
async fn send_acting_once(e: &Ends, a: &Actor, id: &str, action: &str) -> std::path::PathBuf {
    let marker = a.dir.path().join(format!("{action}-{id}"));
    let payload = json!({"do": action, "marker": marker.display().to_string()});
    e.input
        .send(&a.queue(), &envelope(id, &["a"], payload))
        .await;
    marker
}

async fn runtime_killed_mid_message(kind: Kind) {
    let ns = unique_ns("rk");
    let e = ends(kind, &ns).await;
    let a = start(kind, &ns, "a", &[("ASYA_RESILIENCY", RETRY3)]);
    warm_up(&e, &a).await;
    send_acting_once(&e, &a, "k", "die_once").await;
    let got = e.sink.take(1, WAIT).await;
    assert_eq!(
        ids(&got),
        ["k"],
        "the envelope was lost when the runtime died"
    );
    assert_eq!(
        got[0]["headers"]["x-asya-attempts"][0]["type"],
        "RuntimeCrashed"
    );
}

async fn runtime_stopped_by_its_pod_mid_message(kind: Kind) {
    // SIGTERM, then SIGKILL before the handler is done (a forced pod deletion, or the grace
    // period over): not the envelope's failure, and no retry policy needed. It goes back to
    // the queue and is served again, here by the restarted runtime, with no attempt charged.
    let ns = unique_ns("rs");
    let e = ends(kind, &ns).await;
    let a = start(kind, &ns, "a", &[]);
    warm_up(&e, &a).await;
    let marker = send_acting_once(&e, &a, "st", "stopped_once").await;
    let got = e.sink.take(1, WAIT).await;
    assert_eq!(ids(&got), ["st"], "{}", a.logs());
    assert!(
        marker.exists(),
        "the runtime was never stopped:\n{}",
        a.logs()
    );
    assert!(
        got[0]["headers"].get("x-asya-attempts").is_none(),
        "an attempt was charged: {}\n{}",
        got[0]["headers"],
        a.logs()
    );
    assert!(
        a.logs().contains("returning the message to the queue"),
        "{}",
        a.logs()
    );
    e.sump.expect_nothing(QUIET).await;
}

async fn sidecar_sigkilled_mid_message(kind: Kind) {
    let ns = unique_ns("sk");
    let e = ends(kind, &ns).await;
    let a = start(kind, &ns, "a", &[]);
    let started = a.dir.path().join("started");
    e.input
        .send(
            &a.queue(),
            &envelope(
                "s",
                &["a"],
                json!({"do": "sleep", "seconds": 1, "started": started.display().to_string()}),
            ),
        )
        .await;
    let deadline = std::time::Instant::now() + WAIT;
    while !started.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "handler never started:\n{}",
            a.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.kill9();
    std::fs::remove_file(&started).unwrap();
    a.spawn_sidecar();
    let got = e.sink.take(1, WAIT).await;
    assert_eq!(ids(&got), ["s"], "the envelope was lost with the sidecar");
}

async fn malformed_messages(kind: Kind) {
    let ns = unique_ns("mal");
    let e = ends(kind, &ns).await;
    let a = start(kind, &ns, "a", &[]);
    let q = a.queue();
    e.input.send_raw(&q, b"this is not json".to_vec()).await;
    e.input.send(&q, &json!({"id": "no-route"})).await;
    e.input
        .send(
            &q,
            &json!({"id": "oob", "route": {"actors": ["a"], "current": 4}, "payload": 1}),
        )
        .await;
    e.input
        .send(
            &q,
            &json!({"id": "wrong", "route": {"actors": ["other"], "current": 0}, "payload": 1}),
        )
        .await;
    let got = e.sump.take(4, WAIT).await;
    assert_eq!(got.len(), 4, "{got:?}");
    let mut reasons: Vec<String> = got
        .iter()
        .map(|m| {
            m["headers"]["x-asya-error"]["error"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            "current_out_of_range",
            "not_envelope",
            "not_json",
            "wrong_actor"
        ]
    );
    let junk = got
        .iter()
        .find(|m| m["headers"]["x-asya-error"]["error"] == "not_json")
        .unwrap();
    assert_eq!(junk["payload"], "this is not json");
    // Still alive and consuming.
    e.input
        .send(&q, &envelope("ok", &["a"], json!({"do": "echo"})))
        .await;
    assert_eq!(ids(&e.sink.take(1, WAIT).await), ["ok"]);
}

async fn large_payload(kind: Kind) {
    let ns = unique_ns("big");
    let e = ends(kind, &ns).await;
    let a = start(kind, &ns, "a", &[]);
    let size = 5 * 1024 * 1024;
    match kind {
        Kind::Rabbit => {
            let blob = "y".repeat(size);
            e.input
                .send(
                    &a.queue(),
                    &envelope("big", &["a"], json!({"do": "echo", "blob": blob})),
                )
                .await;
            let got = e.sink.take(1, WAIT).await;
            assert_eq!(got.len(), 1);
            assert_eq!(got[0]["payload"]["blob"].as_str().unwrap().len(), size);
        }
        Kind::Sqs => {
            // SQS carries at most 1 MiB: a 5 MiB result cannot be sent on. It must end in
            // x-sump with the reason instead of looping or vanishing.
            e.input
                .send(
                    &a.queue(),
                    &envelope("big", &["a"], json!({"do": "big", "size": size})),
                )
                .await;
            let got = e.sump.take(1, WAIT).await;
            assert_eq!(got.len(), 1);
            let reason = got[0]["headers"]["x-asya-error"]["reason"]
                .as_str()
                .unwrap();
            assert!(reason.contains("too large"), "{reason}");
        }
    }
}

async fn envelope_mode_dynamic_routing(kind: Kind) {
    let ns = unique_ns("env");
    let e = ends(kind, &ns).await;
    let a = Actor::start(
        kind,
        &ns,
        "a",
        ActorSpec {
            handler: "testing.reroute",
            mode: "envelope",
            ..Default::default()
        },
    );
    let _b = start(kind, &ns, "b", &[]);
    e.input
        .send(
            &a.queue(),
            &envelope("d", &["a"], json!({"do": "echo", "then": ["b"]})),
        )
        .await;
    let got = e.sink.take(1, WAIT).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["route"]["actors"], json!(["a", "b"]));
    assert_eq!(got[0]["headers"]["rerouted"], true);
    // Moving the cursor is the platform's job: refused, to x-sump.
    e.input
        .send(
            &a.queue(),
            &envelope("c", &["a"], json!({"bad_cursor": true})),
        )
        .await;
    let got = e.sump.take(1, WAIT).await;
    assert!(
        got[0]["headers"]["x-asya-error"]["reason"]
            .as_str()
            .unwrap()
            .contains("route.current")
    );
}

async fn sigterm_finishes_in_flight_and_exits_zero(kind: Kind) {
    let ns = unique_ns("term");
    let e = ends(kind, &ns).await;
    let a = start(kind, &ns, "a", &[]);
    let started = a.dir.path().join("started");
    e.input
        .send(
            &a.queue(),
            &envelope(
                "t",
                &["a"],
                json!({"do": "sleep", "seconds": 1, "started": started.display().to_string()}),
            ),
        )
        .await;
    wait_for_file(&started).await;
    let status = a.terminate(Duration::from_secs(30));
    assert!(status.success(), "exit status {status}:\n{}", a.logs());
    assert_eq!(ids(&e.sink.take(1, WAIT).await), ["t"]);
}

async fn sigterm_gives_back_what_it_has_not_started(kind: Kind) {
    // One runtime call at a time: while a slow handler runs, the envelopes behind it are
    // received (prefetched, or in the SQS batch) but not started. On SIGTERM they go back to
    // the queue at once, for another pod, while the one started finishes here.
    let ns = unique_ns("give");
    let e = ends(kind, &ns).await;
    let dir = tempfile::tempdir().unwrap();
    let started = |id: &str| dir.path().join(format!("started-{id}"));
    let all: Vec<String> = (0..6).map(|i| format!("s{i}")).collect();
    // Queued before the sidecar starts, so that it receives them together; all slow, so
    // whichever it starts first (SQS does not promise an order) holds the runtime.
    let input: Vec<Value> = all
        .iter()
        .map(|id| {
            let p =
                json!({"do": "sleep", "seconds": 15, "started": started(id).display().to_string()});
            envelope(id, &["a"], p)
        })
        .collect();
    prefill(&e, &ns, &input).await;
    let a = start(
        kind,
        &ns,
        "a",
        &[
            ("ASYA_RUNTIME_PIPELINE", "1"),
            // Long enough that SQS's own timeout cannot be what brings them back.
            ("ASYA_SQS_VISIBILITY_TIMEOUT", "120s"),
        ],
    );
    let deadline = std::time::Instant::now() + WAIT;
    let first = loop {
        if let Some(id) = all.iter().find(|id| started(id).exists()) {
            break id.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no handler started:\n{}",
            a.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    wait_until_received(&a, &Client::observer(kind, &a.queue()).await).await;
    a.send_sigterm();
    let taker = Client::new(kind, &a.queue()).await;
    let taken = taker.take_counted(5, WAIT).await;
    let mut back = ids(&taken.iter().map(|(v, _)| v.clone()).collect::<Vec<_>>());
    back.sort();
    if kind == Kind::Rabbit {
        // Given back as never delivered: no step towards ASYA_MAX_REDELIVERIES (poison).
        // SQS counts every receive, so there they carry one.
        let counts: Vec<u32> = taken.iter().map(|(_, c)| *c).collect();
        assert_eq!(counts, [0; 5], "{}", a.logs());
    }
    let others: Vec<String> = all.iter().filter(|id| **id != first).cloned().collect();
    assert_eq!(back, others, "{}", a.logs());
    assert!(
        a.sidecar_running(),
        "given back only when the sidecar exited:\n{}",
        a.logs()
    );
    assert!(
        others.iter().all(|id| !started(id).exists()),
        "the sidecar started another envelope after SIGTERM:\n{}",
        a.logs()
    );
    let status = a.wait_exit(WAIT);
    assert!(status.success(), "exit status {status}:\n{}", a.logs());
    assert_eq!(ids(&e.sink.take(1, WAIT).await), [first], "{}", a.logs());
    e.sink.expect_nothing(QUIET).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_sigterm_mid_long_poll_gives_back_what_the_poll_takes() {
    // SQS cannot cancel a long poll: one under way at SIGTERM goes on on the server, and what
    // it takes must go back to the queue at once, not after the visibility timeout.
    let kind = Kind::Sqs;
    if !common::have(kind) {
        return;
    }
    let ns = unique_ns("poll");
    let e = ends(kind, &ns).await;
    let a = start(
        kind,
        &ns,
        "a",
        &[
            ("ASYA_SQS_WAIT_SECONDS", "10"),
            // Far beyond the wait below: the timeout cannot be what brings it back.
            ("ASYA_SQS_VISIBILITY_TIMEOUT", "300s"),
        ],
    );
    // Ready: the endpoint answered for the queue, and the sidecar's first long poll was sent
    // then (the queue is empty, so it waits on the server for 10 s).
    a.send_sigterm();
    e.input
        .send(&a.queue(), &envelope("p", &["a"], json!({})))
        .await;
    let taker = Client::new(kind, &a.queue()).await;
    let taken = taker.take_counted(1, WAIT).await;
    let got: Vec<(String, u32)> = taken
        .iter()
        .map(|(v, c)| (v["id"].as_str().unwrap_or_default().to_string(), *c))
        .collect();
    // Received once by the cut-short poll (SQS counts it), then by the taker.
    assert_eq!(got, [("p".to_string(), 1)], "{}", a.logs());
    let status = a.wait_exit(WAIT);
    assert!(status.success(), "exit status {status}:\n{}", a.logs());
    assert!(
        a.logs().contains("given back"),
        "the sidecar did not say it gave the message back:\n{}",
        a.logs()
    );
    assert!(e.sink.take(1, QUIET).await.is_empty(), "{}", a.logs());
}

/// Waits until the actor's sidecar has received everything sent to its queue (none ready for
/// another consumer); `observer` counts without taking, so it does not race the sidecar.
async fn wait_until_received(a: &Actor, observer: &Client) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        if observer.ready_count().await == Some(0) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the sidecar never took the envelopes:\n{}",
            a.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn poison_message_to_sump(kind: Kind) {
    // A message that keeps taking its sidecar down must stop coming back.
    let ns = unique_ns("poi");
    let e = ends(kind, &ns).await;
    let a = start(kind, &ns, "a", &[("ASYA_MAX_REDELIVERIES", "1")]);
    let started = a.dir.path().join("started");
    e.input
        .send(
            &a.queue(),
            &envelope(
                "p",
                &["a"],
                json!({"do": "sleep", "seconds": 2, "started": started.display().to_string()}),
            ),
        )
        .await;
    for _ in 0..2 {
        let deadline = std::time::Instant::now() + WAIT;
        while !started.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "handler never started:\n{}",
                a.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        a.kill9();
        std::fs::remove_file(&started).unwrap();
        a.spawn_sidecar();
    }
    let got = e.sump.take(1, WAIT).await;
    assert_eq!(ids(&got), ["p"], "{}", a.logs());
    let reason = got[0]["headers"]["x-asya-error"]["reason"]
        .as_str()
        .unwrap();
    assert!(reason.contains("poison"), "{reason}");
    e.sink.expect_nothing(QUIET).await;
}

/// Puts `envelopes` on actor `a`'s queue before its sidecar starts, so that they arrive
/// together and the sidecar queues several of them on the runtime at once.
async fn prefill(e: &Ends, ns: &str, envelopes: &[Value]) {
    for env in envelopes {
        e.input.send(&queue(ns, "a"), env).await;
    }
}

fn attempts(v: &Value) -> usize {
    v["headers"]["x-asya-attempts"]
        .as_array()
        .map_or(0, |a| a.len())
}

async fn runtime_killed_with_calls_queued(kind: Kind) {
    // The runtime dies in one handler while the next calls wait on its socket: only that
    // envelope is charged with the crash; the others are served by the next runtime.
    let ns = unique_ns("rkq");
    let e = ends(kind, &ns).await;
    let a = start(kind, &ns, "a", &[("ASYA_RESILIENCY", RETRY3)]);
    warm_up(&e, &a).await;
    // A busy handler holds the runtime while the crashing envelope and the ones after it
    // arrive and are queued behind it.
    let started = a.dir.path().join("started");
    let busy = json!({"do": "sleep", "seconds": 1, "started": started.display().to_string()});
    e.input
        .send(&a.queue(), &envelope("busy", &["a"], busy))
        .await;
    wait_for_file(&started).await;
    let marker = a.dir.path().join("died").display().to_string();
    let mut input = vec![envelope(
        "k",
        &["a"],
        json!({"do": "die_once", "marker": marker}),
    )];
    for i in 0..5 {
        input.push(envelope(&format!("q{i}"), &["a"], json!({"do": "echo"})));
    }
    for env in &input {
        e.input.send(&a.queue(), env).await;
    }
    let mut got = e.sink.take(7, WAIT).await;
    got.sort_by_key(|v| v["id"].as_str().unwrap_or_default().to_string());
    assert_eq!(
        ids(&got),
        ["busy", "k", "q0", "q1", "q2", "q3", "q4"],
        "{}",
        a.logs()
    );
    assert_eq!(attempts(&got[1]), 1, "{}", got[1]);
    assert_eq!(
        got[1]["headers"]["x-asya-attempts"][0]["type"],
        "RuntimeCrashed"
    );
    for q in got.iter().filter(|v| v["id"] != "k") {
        assert_eq!(
            attempts(q),
            0,
            "an envelope queued behind the crash was blamed: {q}"
        );
    }
    e.sump.expect_nothing(QUIET).await;
}

/// One envelope through actor `a`: its sidecar has then seen the runtime answer (a
/// restarted sidecar does not charge envelopes with runtime exits before that).
async fn warm_up(e: &Ends, a: &Actor) {
    e.input
        .send(&a.queue(), &envelope("warm", &["a"], json!({"do": "echo"})))
        .await;
    assert_eq!(ids(&e.sink.take(1, WAIT).await), ["warm"], "{}", a.logs());
}

async fn handler_timeout_spares_queued_calls(kind: Kind) {
    // The first handler hangs past the timeout; the runtime exits for a restart. The calls
    // queued behind it never reached a handler: they go through, not to x-sump.
    let ns = unique_ns("tmq");
    let e = ends(kind, &ns).await;
    let mut input = vec![envelope(
        "slow",
        &["a"],
        json!({"do": "sleep", "seconds": 30}),
    )];
    for i in 0..4 {
        input.push(envelope(&format!("q{i}"), &["a"], json!({"do": "echo"})));
    }
    prefill(&e, &ns, &input).await;
    let a = start(kind, &ns, "a", &[("ASYA_RUNTIME_TIMEOUT", "2s")]);
    let got = e.sump.take(1, WAIT).await;
    assert_eq!(ids(&got), ["slow"], "{}", a.logs());
    assert_eq!(got[0]["headers"]["x-asya-error"]["error"], "timeout");
    let mut got = e.sink.take(4, WAIT).await;
    got.sort_by_key(|v| v["id"].as_str().unwrap_or_default().to_string());
    assert_eq!(ids(&got), ["q0", "q1", "q2", "q3"], "{}", a.logs());
    for q in &got {
        assert_eq!(attempts(q), 0, "{q}");
    }
}

/// Waits (bounded) until a handler has created `path`: it is running.
async fn wait_for_file(path: &std::path::Path) {
    let deadline = std::time::Instant::now() + WAIT;
    while !path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "handler never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A URL whose vhost the broker lacks: said once, as a configuration error naming the variable
/// and the vhost; the retries go on quietly (an admin may still create it) and the sidecar
/// stays unready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_vhost_is_said_once_naming_the_variable() {
    if !common::have(Kind::Rabbit) {
        return;
    }
    let url = std::env::var("ASYA_TEST_RABBITMQ_URL")
        .expect("ASYA_TEST_RABBITMQ_URL (tests/services/env)");
    let base = url.rsplit_once('/').map(|(b, _)| b).unwrap_or(&url);
    let bad = format!("{base}/asya-no-such-vhost");
    let env = [
        ("ASYA_RABBITMQ_URL", bad.as_str()),
        ("ASYA_LOG_LEVEL", "info,asya_transport=debug"),
    ];
    let spec = ActorSpec {
        env: &env,
        ..ActorSpec::default()
    };
    let a = Actor::spawn(Kind::Rabbit, &unique_ns("vh"), "a", spec);
    let deadline = std::time::Instant::now() + WAIT;
    // Two quiet retries after the first refusal: the error is not repeated.
    while a.logs().matches("still refuses the vhost").count() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "no retries logged:\n{}",
            a.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let logs = a.logs();
    let said: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("RabbitMQ refuses the vhost"))
        .collect();
    assert_eq!(said.len(), 1, "{logs}");
    assert!(
        said[0].contains("ERROR") && said[0].contains("ASYA_RABBITMQ_URL"),
        "{}",
        said[0]
    );
    assert!(said[0].contains("asya-no-such-vhost"), "{}", said[0]);
    assert_eq!(a.ready_status(), Some(503));
}

/// docs/DESIGN.md §6.1: on receipt, a hop puts one message into the wake queue of each later
/// actor of the route (not its own, not the end actors', not an actor outside the route), and
/// within the interval not again for the next envelope.
async fn wakes_the_later_hops_once(kind: Kind) {
    let ns = unique_ns("wake");
    let e = ends(kind, &ns).await;
    let wake = |actor: &str| asya_api::wake::wake_queue(&ns, actor).unwrap();
    let (wake_a, wake_b, wake_c) = (
        Client::observer(kind, &wake("a")).await,
        Client::observer(kind, &wake("b")).await,
        Client::observer(kind, &wake("c")).await,
    );
    for w in [&wake_a, &wake_b, &wake_c] {
        assert_eq!(w.ready_count().await, Some(0), "created empty");
    }
    let a = start(kind, &ns, "a", &[]);
    let _b = start(kind, &ns, "b", &[]);
    for id in ["w1", "w2"] {
        e.input
            .send(
                &a.queue(),
                &envelope(id, &["a", "b"], json!({"do": "double", "value": 1})),
            )
            .await;
    }
    assert_eq!(e.sink.take(2, WAIT).await.len(), 2);
    let deadline = std::time::Instant::now() + WAIT;
    while wake_b.ready_count().await != Some(1) {
        assert!(std::time::Instant::now() < deadline, "b was never woken");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let metrics = a.metrics();
    assert!(
        metrics.contains(&format!(
            "asya_actor_wakes_total{{queue=\"{}\",outcome=\"sent\"}} 1",
            a.queue()
        )),
        "one wake for two envelopes: {metrics}"
    );
    // The last hop wakes nobody; nobody wakes the first hop or an actor off the route.
    assert!(!metrics.contains("outcome=\"failed\""), "{metrics}");
    assert_eq!(wake_a.ready_count().await, Some(0));
    assert_eq!(wake_c.ready_count().await, Some(0));
    assert_eq!(wake_b.ready_count().await, Some(1));
}

/// `asya-sidecar send` is a sender (docs/DESIGN.md §6.1): it wakes every actor of the route,
/// the first included, end actors aside, before the envelope goes out.
async fn send_wakes_the_whole_route(kind: Kind) {
    use std::io::Write;
    let ns = unique_ns("swake");
    let wake = |actor: &str| asya_api::wake::wake_queue(&ns, actor).unwrap();
    let first = Client::observer(kind, &queue(&ns, "a")).await;
    let (wake_a, wake_b, wake_sink) = (
        Client::observer(kind, &wake("a")).await,
        Client::observer(kind, &wake("b")).await,
        Client::observer(kind, &wake("x-sink")).await,
    );
    for c in [&first, &wake_a, &wake_b, &wake_sink] {
        assert_eq!(c.ready_count().await, Some(0), "created empty");
    }
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_asya-sidecar"));
    cmd.arg("send")
        .arg(queue(&ns, "a"))
        .env("ASYA_NAMESPACE", &ns)
        .stdin(std::process::Stdio::piped());
    match kind {
        Kind::Rabbit => cmd.env("ASYA_TRANSPORT", "rabbitmq").env(
            "ASYA_RABBITMQ_URL",
            std::env::var("ASYA_TEST_RABBITMQ_URL").unwrap(),
        ),
        Kind::Sqs => cmd
            .env("ASYA_TRANSPORT", "sqs")
            .env("ASYA_SQS_REGION", "us-east-1")
            .env(
                "ASYA_SQS_ENDPOINT",
                std::env::var("ASYA_TEST_SQS_ENDPOINT").unwrap(),
            ),
    };
    let mut child = cmd.spawn().unwrap();
    let line = envelope("s1", &["a", "b", "x-sink"], json!({"value": 1}));
    writeln!(child.stdin.take().unwrap(), "{line}").unwrap();
    assert!(child.wait().unwrap().success());
    let deadline = std::time::Instant::now() + WAIT;
    for (c, what) in [
        (&first, "the envelope"),
        (&wake_a, "a's wake"),
        (&wake_b, "b's wake"),
    ] {
        while c.ready_count().await != Some(1) {
            assert!(std::time::Instant::now() < deadline, "{what} never arrived");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert_eq!(
        wake_sink.ready_count().await,
        Some(0),
        "end actors are not woken"
    );
}
