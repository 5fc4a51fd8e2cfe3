//! Acknowledgements in runs (`multiple`) against the real RabbitMQ of tests/services: acks
//! and nacks of one consumer in any order, with a delivery left open at the front, settle
//! exactly what they name — the nacked ones come back, the acked ones never, and no frame
//! names a tag the broker no longer knows (which would close the channel and bring back
//! every unacknowledged delivery).

#[path = "../../tests/services/require.rs"]
mod require;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use asya_transport::rabbitmq::{RabbitHandle, RabbitSettings, RabbitTransport};
use asya_transport::{Outgoing, Received, Transport};

fn have_rabbit() -> bool {
    require::servers("RabbitMQ", &["ASYA_TEST_RABBITMQ_URL"])
}

fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

/// A consumer of `queue` (or a publisher only); redelivered messages are handed out at once
/// (`max_redeliveries` 0), not copied to the back, so what comes back keeps its place.
fn transport(queue: &str, publish_only: bool, connects: Arc<AtomicUsize>) -> RabbitTransport {
    RabbitTransport::new(
        RabbitSettings {
            url: std::env::var("ASYA_TEST_RABBITMQ_URL").unwrap_or_default(),
            url_source: "ASYA_TEST_RABBITMQ_URL",
            exchange: "asya".into(),
            queue: queue.into(),
            prefetch: 64,
            auto_create: true,
            max_redeliveries: 0,
            publish_only,
        },
        Box::new(move || {
            connects.fetch_add(1, Ordering::SeqCst);
        }),
    )
}

async fn publish(queue: &str, bodies: &[String]) {
    let p = transport(queue, true, Arc::default());
    p.ensure_connected().await;
    let msgs: Vec<Outgoing> = bodies
        .iter()
        .map(|b| Outgoing {
            queue: queue.into(),
            body: b.clone().into_bytes(),
            delay: None,
        })
        .collect();
    p.send(&msgs).await.expect("publish");
    p.close().await;
}

async fn take(t: &RabbitTransport, n: usize) -> Vec<Received<RabbitHandle>> {
    let mut got = Vec::new();
    while got.len() < n {
        let batch = tokio::time::timeout(Duration::from_secs(30), t.receive())
            .await
            .expect("deliveries within 30 s")
            .expect("receive");
        got.extend(batch);
    }
    got
}

/// The bodies that came back to `queue`: everything a fresh consumer gets before `sentinel`,
/// published after the consumer under test closed (its unsettled deliveries were requeued
/// at their old place, ahead of the sentinel).
async fn returned(queue: &str, sentinel: &str) -> BTreeSet<String> {
    publish(queue, &[sentinel.to_string()]).await;
    let c = transport(queue, false, Arc::default());
    let mut back = BTreeSet::new();
    loop {
        let m = take(&c, 1).await.pop().expect("one delivery");
        let body = String::from_utf8_lossy(&m.body).into_owned();
        c.ack(&m.handle).await.expect("ack");
        if body == sentinel {
            break;
        }
        back.insert(body);
    }
    c.close().await;
    back
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_and_nacks_in_any_order_settle_exactly_what_they_name() {
    settle_scrambled(true).await;
}

/// Without an open delivery at the front, runs form while nacks are still being written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_never_cover_a_delivery_being_given_back() {
    settle_scrambled(false).await;
}

/// Settles 40 deliveries at once in a scrambled order, every seventh nacked; with
/// `first_open`, the first stays open until the others are settled.
async fn settle_scrambled(first_open: bool) {
    if !have_rabbit() {
        return;
    }
    let queue = unique("asya-acks-test");
    let bodies: Vec<String> = (0..40).map(|i| format!("m{i}")).collect();
    publish(&queue, &bodies).await;
    let connects = Arc::new(AtomicUsize::new(0));
    let c = Arc::new(transport(&queue, false, connects.clone()));
    let got = take(&c, bodies.len()).await;
    assert_eq!(got.len(), bodies.len());
    let released: BTreeSet<String> = bodies
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 7 == 3)
        .map(|(_, b)| b.clone())
        .collect();
    let got: Vec<Arc<Received<RabbitHandle>>> = got.into_iter().map(Arc::new).collect();
    // The first delivery stays open while the rest settle: every run behind it is split.
    let first = got[0].clone();
    assert_eq!(first.body, b"m0");
    // All at once, in a scrambled order: runs, singles and nacks interleave.
    let settles = (0..got.len()).map(|k| got[(k * 17) % got.len()].clone());
    let settles = settles.filter(|m| !first_open || m.body != b"m0").map(|m| {
        let c = c.clone();
        let release = released.contains(&*String::from_utf8_lossy(&m.body));
        tokio::spawn(async move {
            if release {
                c.release(&m.handle).await
            } else {
                c.ack(&m.handle).await
            }
        })
    });
    for r in futures::future::join_all(settles.collect::<Vec<_>>()).await {
        r.expect("task").expect("ack or release");
    }
    if first_open {
        c.ack(&first.handle).await.expect("ack of the first");
    }
    assert!(
        c.ack(&got[1].handle).await.is_err(),
        "a delivery acknowledged twice is refused, not sent"
    );
    assert!(c.healthy());
    assert_eq!(
        connects.load(Ordering::SeqCst),
        1,
        "the channel never failed"
    );
    c.close().await;
    assert_eq!(returned(&queue, "sentinel").await, released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_delivery_does_not_hold_back_those_finished_after_it() {
    if !have_rabbit() {
        return;
    }
    let queue = unique("asya-acks-open");
    let bodies: Vec<String> = (0..5).map(|i| format!("o{i}")).collect();
    publish(&queue, &bodies).await;
    let c = transport(&queue, false, Arc::default());
    let got = take(&c, bodies.len()).await;
    for m in &got[1..] {
        c.ack(&m.handle).await.expect("ack");
    }
    // o0 is never finished: closing returns it, and only it.
    c.close().await;
    let back = returned(&queue, "sentinel").await;
    assert_eq!(back, BTreeSet::from(["o0".to_string()]));
}
