//! x-sump browse and redrive against the real RabbitMQ and SQS server of tests/services:
//! a browse leaves every message in place; a redrive sends the selected envelopes to the
//! failed actor's queue with counters reset and removes only those from x-sump; a redrive
//! abandoned between a confirmed resend and the removal (as a kill would) and then rerun
//! loses nothing. Each test makes its own uniquely named queues and deletes them.

#[path = "../../tests/services/require.rs"]
mod require;

use std::sync::atomic::{AtomicU32, Ordering};

use asya_cli::broker::{Broker, rabbit::Rabbit, sqs::Sqs};
use asya_cli::select::Selector;
use asya_cli::sump::{self, Flow, Outcome, Request};
use asya_cli::sump_source::SumpQueue;
use lapin::options::{BasicGetOptions, ExchangeDeleteOptions, QueueDeleteOptions};
use lapin::{Connection, ConnectionProperties};
use serde_json::{Value, json};

static COUNTER: AtomicU32 = AtomicU32::new(0);

fn unique_ns(tag: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        % 1_000_000_000;
    format!("tcli{tag}-{t}-{}-{n}", std::process::id() % 100_000)
}

/// A failed envelope at actor `b` of route a -> b -> c, as the sidecar writes it.
fn failed(id: &str, error_type: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": id,
        "route": {"actors": ["a", "b", "c"], "current": 1},
        "headers": {
            "trace_id": "t",
            "x-asya-attempts": [{"actor": "b", "hop": 1, "attempt": 1, "error": "processing_error",
                                  "type": error_type, "message": "boom", "at_ms": 1}],
            "x-asya-error": {"actor": "b", "reason": "retries exhausted", "error": "processing_error",
                              "type": error_type, "message": "boom", "traceback": "Traceback (most recent call last): ..."}
        },
        "payload": {"n": id}
    }))
    .unwrap()
}

fn select(error: &str) -> Selector {
    Selector::parse(vec![], None, Some(error), None, false, true).unwrap()
}

/// The ids of a list of bodies, sorted.
fn ids(bodies: &[Value]) -> Vec<String> {
    let mut v: Vec<String> = bodies
        .iter()
        .map(|b| b["id"].as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

// ---------- RabbitMQ ----------

struct RabbitFixture {
    ns: String,
    conn: Connection,
    url: String,
}

impl RabbitFixture {
    async fn new(tag: &str) -> RabbitFixture {
        let url = std::env::var("ASYA_TEST_RABBITMQ_URL").unwrap();
        let ns = unique_ns(tag);
        let conn = Connection::connect(&url, ConnectionProperties::default())
            .await
            .unwrap();
        let ch = conn.create_channel().await.unwrap();
        let ex = asya_api::naming::tenant_exchange(&ns);
        for actor in ["b", "x-sump"] {
            asya_transport::rabbitmq::declare_bound_queue(
                &ch,
                &ex,
                &asya_api::naming::actor_queue(&ns, actor),
            )
            .await
            .unwrap();
        }
        RabbitFixture { ns, conn, url }
    }

    async fn broker(&self) -> Broker {
        let ex = asya_api::naming::tenant_exchange(&self.ns);
        Broker::Rabbit(Box::new(
            Rabbit::connect(&self.url, "guest", &ex, "test broker".into())
                .await
                .unwrap(),
        ))
    }

    async fn put(&self, broker: &Broker, bodies: &[Vec<u8>]) {
        for b in bodies {
            broker
                .publish(&asya_api::naming::sump_queue(&self.ns), b)
                .await
                .unwrap();
        }
    }

    /// Takes every message of the actor's queue `actor` (this test's own queue).
    async fn drain(&self, actor: &str) -> Vec<Value> {
        let ch = self.conn.create_channel().await.unwrap();
        let q = asya_api::naming::actor_queue(&self.ns, actor);
        let mut out = Vec::new();
        while let Some(m) = ch
            .basic_get(q.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            out.push(serde_json::from_slice(&m.delivery.data).unwrap_or(Value::Null));
        }
        out
    }

    async fn cleanup(self) {
        let ch = self.conn.create_channel().await.unwrap();
        for actor in ["b", "x-sump"] {
            let q = asya_api::naming::actor_queue(&self.ns, actor);
            ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await
                .unwrap();
        }
        let ex = asya_api::naming::tenant_exchange(&self.ns);
        ch.exchange_delete(ex.as_str().into(), ExchangeDeleteOptions::default())
            .await
            .unwrap();
        let _ = self.conn.close(200, "done".into()).await;
    }
}

fn rabbit() -> bool {
    require::servers("RabbitMQ", &["ASYA_TEST_RABBITMQ_URL"])
}

#[tokio::test]
async fn rabbitmq_browse_leaves_every_message() {
    if !rabbit() {
        return;
    }
    let f = RabbitFixture::new("br").await;
    let broker = f.broker().await;
    f.put(
        &broker,
        &[
            failed("e1", "ValueError"),
            failed("e2", "KeyError"),
            b"not json".to_vec(),
        ],
    )
    .await;
    browse_leaves_every_message(&broker, &f.ns).await;
    broker.close().await;
    assert_eq!(
        ids(&f
            .drain("x-sump")
            .await
            .into_iter()
            .filter(|v| v.is_object())
            .collect::<Vec<_>>()),
        ["e1", "e2"]
    );
    f.cleanup().await;
}

#[tokio::test]
async fn rabbitmq_redrive_sends_back_then_removes() {
    if !rabbit() {
        return;
    }
    let f = RabbitFixture::new("rd").await;
    let broker = f.broker().await;
    f.put(
        &broker,
        &[
            failed("e1", "ValueError"),
            failed("e2", "KeyError"),
            failed("e3", "ValueError"),
        ],
    )
    .await;
    redrive_selected(&broker, &f.ns).await;
    broker.close().await;
    let resent = f.drain("b").await;
    check_resends(&resent, &["e1", "e3"]);
    assert_eq!(ids(&f.drain("x-sump").await), ["e2"]);
    f.cleanup().await;
}

#[tokio::test]
async fn rabbitmq_redrive_abandoned_after_a_resend_then_rerun_loses_nothing() {
    if !rabbit() {
        return;
    }
    let f = RabbitFixture::new("ab").await;
    let setup = f.broker().await;
    f.put(
        &setup,
        &[
            failed("e1", "ValueError"),
            failed("e2", "ValueError"),
            failed("e3", "ValueError"),
        ],
    )
    .await;
    setup.close().await;
    // First run: stops right after the first confirmed resend, acking nothing, and its
    // connection goes, as when the process is killed there.
    let first = f.broker().await;
    abandon_after_first(&first, &f.ns).await;
    first.close().await;
    let second = f.broker().await;
    let r = run_redrive(&second, &f.ns, &mut |_| Flow::Continue).await;
    assert_eq!(
        r.iter().filter(|o| o.result == "redriven").count(),
        3,
        "{r:?}"
    );
    second.close().await;
    let resent = f.drain("b").await;
    // At least once: the abandoned one may be there twice; none is missing.
    let mut uniq = ids(&resent);
    uniq.dedup();
    assert_eq!(uniq, ["e1", "e2", "e3"]);
    // The abandoned resend of e1 was confirmed but its x-sump copy not removed: twice.
    assert_eq!(resent.len(), 4, "{resent:?}");
    assert!(f.drain("x-sump").await.is_empty());
    f.cleanup().await;
}

// ---------- SQS ----------

struct SqsFixture {
    ns: String,
    /// The same client set-up as the command's (rustls on ring), for this test's own queues.
    admin: Sqs,
    urls: Vec<String>,
}

fn sqs() -> bool {
    require::servers("the SQS server", &["ASYA_TEST_SQS_ENDPOINT"])
}

impl SqsFixture {
    async fn new(tag: &str) -> SqsFixture {
        let ns = unique_ns(tag);
        let admin = Sqs::connect(
            "us-east-1".into(),
            std::env::var("ASYA_TEST_SQS_ENDPOINT").ok(),
            None,
        )
        .await;
        let mut urls = Vec::new();
        for actor in ["b", "x-sump"] {
            let out = admin
                .client()
                .create_queue()
                .queue_name(asya_api::naming::actor_queue(&ns, actor))
                .send()
                .await
                .unwrap();
            urls.push(out.queue_url().unwrap().to_string());
        }
        SqsFixture { ns, admin, urls }
    }

    async fn connect() -> Broker {
        Broker::Sqs(Box::new(
            Sqs::connect(
                "us-east-1".into(),
                std::env::var("ASYA_TEST_SQS_ENDPOINT").ok(),
                None,
            )
            .await,
        ))
    }

    async fn put(&self, broker: &Broker, bodies: &[Vec<u8>]) {
        for b in bodies {
            broker
                .publish(&asya_api::naming::sump_queue(&self.ns), b)
                .await
                .unwrap();
        }
    }

    /// Takes every visible message of this test's queue of `actor`.
    async fn drain(&self, actor: &str) -> Vec<Value> {
        let url = &self.urls[if actor == "b" { 0 } else { 1 }];
        let mut out = Vec::new();
        loop {
            let got = self
                .admin
                .client()
                .receive_message()
                .queue_url(url)
                .max_number_of_messages(10)
                .send()
                .await
                .unwrap();
            let msgs = got.messages.unwrap_or_default();
            if msgs.is_empty() {
                return out;
            }
            for m in msgs {
                out.push(serde_json::from_str(m.body().unwrap()).unwrap_or(Value::Null));
                self.admin
                    .client()
                    .delete_message()
                    .queue_url(url)
                    .receipt_handle(m.receipt_handle().unwrap())
                    .send()
                    .await
                    .unwrap();
            }
        }
    }

    async fn cleanup(self) {
        for url in &self.urls {
            self.admin
                .client()
                .delete_queue()
                .queue_url(url)
                .send()
                .await
                .unwrap();
        }
    }
}

#[tokio::test]
async fn sqs_browse_leaves_every_message() {
    if !sqs() {
        return;
    }
    let f = SqsFixture::new("sbr").await;
    let broker = SqsFixture::connect().await;
    f.put(
        &broker,
        &[
            failed("e1", "ValueError"),
            failed("e2", "KeyError"),
            b"not json".to_vec(),
        ],
    )
    .await;
    browse_leaves_every_message(&broker, &f.ns).await;
    assert_eq!(
        ids(&f
            .drain("x-sump")
            .await
            .into_iter()
            .filter(|v| v.is_object())
            .collect::<Vec<_>>()),
        ["e1", "e2"]
    );
    f.cleanup().await;
}

#[tokio::test]
async fn sqs_redrive_sends_back_then_removes() {
    if !sqs() {
        return;
    }
    let f = SqsFixture::new("srd").await;
    let broker = SqsFixture::connect().await;
    f.put(
        &broker,
        &[
            failed("e1", "ValueError"),
            failed("e2", "KeyError"),
            failed("e3", "ValueError"),
        ],
    )
    .await;
    redrive_selected(&broker, &f.ns).await;
    check_resends(&f.drain("b").await, &["e1", "e3"]);
    assert_eq!(ids(&f.drain("x-sump").await), ["e2"]);
    f.cleanup().await;
}

// ---------- the same checks on both ----------

async fn browse_leaves_every_message(broker: &Broker, ns: &str) {
    let q = asya_api::naming::sump_queue(ns);
    let all = Selector::default();
    let source = SumpQueue { broker, queue: &q };
    for _ in 0..2 {
        let l = sump::browse(&source, &all, 100, 0).await.unwrap();
        assert_eq!(l.envelopes.len(), 2, "{l:?}");
        assert_eq!(l.unreadable, 1);
        assert!(l.source.contains(&q), "{}", l.source);
        let e1 = l.envelopes.iter().find(|e| e.failed.id == "e1").unwrap();
        assert_eq!(e1.failed.actor.as_deref(), Some("b"));
        assert_eq!(e1.failed.attempts, 1);
        assert!(
            e1.failed
                .traceback
                .as_deref()
                .unwrap()
                .starts_with("Traceback")
        );
    }
    let only = sump::browse(&source, &select("KeyError"), 100, 0)
        .await
        .unwrap();
    assert_eq!(only.envelopes.len(), 1);
}

async fn run_redrive(
    broker: &Broker,
    ns: &str,
    sent: &mut dyn FnMut(&Outcome) -> Flow,
) -> Vec<Outcome> {
    let q = asya_api::naming::sump_queue(ns);
    let sel = select("ValueError");
    let req = Request {
        namespace: ns,
        sel: &sel,
        max: 100,
        dry_run: false,
        now: "2026-11-26T00:00:00Z",
        now_ms: 1,
    };
    sump::redrive(&SumpQueue { broker, queue: &q }, broker, &req, sent)
        .await
        .unwrap()
        .outcomes
}

async fn redrive_selected(broker: &Broker, ns: &str) {
    let q = asya_api::naming::sump_queue(ns);
    let sel = select("ValueError");
    let req = Request {
        namespace: ns,
        sel: &sel,
        max: 100,
        dry_run: true,
        now: "t",
        now_ms: 1,
    };
    let dry = sump::redrive(&SumpQueue { broker, queue: &q }, broker, &req, &mut |_| {
        Flow::Continue
    })
    .await
    .unwrap();
    assert_eq!(
        dry.outcomes
            .iter()
            .filter(|o| o.result == "would redrive")
            .count(),
        2
    );
    let mut order = Vec::new();
    let r = run_redrive(broker, ns, &mut |o| {
        order.push(o.id.clone());
        Flow::Continue
    })
    .await;
    assert_eq!(
        r.iter().filter(|o| o.result == "redriven").count(),
        2,
        "{r:?}"
    );
    order.sort();
    assert_eq!(order, ["e1", "e3"]);
}

async fn abandon_after_first(broker: &Broker, ns: &str) {
    let r = run_redrive(broker, ns, &mut |_| Flow::Abandon).await;
    assert_eq!(r.len(), 1);
}

fn check_resends(resent: &[Value], want: &[&str]) {
    assert_eq!(ids(resent), want);
    for e in resent {
        assert_eq!(e["route"], json!({"actors": ["a", "b", "c"], "current": 1}));
        assert_eq!(e["headers"]["trace_id"], "t");
        assert!(e["headers"].get("x-asya-error").is_none(), "{e}");
        assert!(e["headers"].get("x-asya-attempts").is_none(), "{e}");
        assert_eq!(e["headers"]["x-asya-redriven"]["count"], 1);
        assert_eq!(e["payload"]["n"], e["id"]);
    }
}
