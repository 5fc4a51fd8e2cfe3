//! The SQS transport's batch paths against the real SQS server of tests/services (ElasticMQ,
//! with SQS's strict limits): fan-out through `SendMessageBatch` split by count and bytes,
//! acks through `DeleteMessageBatch` (a refused entry is never reported as done), and held
//! messages kept invisible past the visibility timeout.

#[path = "../../tests/services/require.rs"]
mod require;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use asya_transport::sqs::{SqsHandle, SqsSettings, SqsTransport};
use asya_transport::{Outgoing, Received, Transport, TransportError};
use aws_sdk_sqs::types::QueueAttributeName;

fn have_sqs() -> bool {
    require::servers("the SQS server", &["ASYA_TEST_SQS_ENDPOINT"])
}

fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

async fn transport(queue: &str, visibility: Duration, auto_create: bool) -> SqsTransport {
    SqsTransport::new(SqsSettings {
        region: "us-east-1".into(),
        endpoint: std::env::var("ASYA_TEST_SQS_ENDPOINT").ok(),
        queue: queue.into(),
        wait_seconds: 1,
        visibility_timeout: visibility,
        auto_create,
        max_message_bytes: 262_144,
        pollers: 1,
    })
    .await
}

/// Visible plus in-flight messages of a queue.
async fn depth(t: &SqsTransport, queue: &str) -> (u64, u64) {
    let url = t.queue_url(queue).await.expect("queue url");
    let out = t
        .client()
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .expect("queue attributes");
    let get = |k: QueueAttributeName| {
        out.attributes()
            .and_then(|a| a.get(&k))
            .and_then(|v| v.parse().ok())
            .unwrap_or(u64::MAX)
    };
    (
        get(QueueAttributeName::ApproximateNumberOfMessages),
        get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
    )
}

/// Receives until `n` messages arrived (each receive long-polls 1 s; gives up after 30 s).
async fn take(t: &SqsTransport, n: usize) -> Vec<Received<SqsHandle>> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while got.len() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {n} messages arrived within 30 s",
            got.len()
        );
        got.extend(t.receive().await.expect("receive"));
    }
    got
}

async fn delete_queue(t: &SqsTransport, queue: &str) {
    if let Ok(url) = t.queue_url(queue).await {
        let _ = t.client().delete_queue().queue_url(url).send().await;
    }
}

#[tokio::test]
async fn fan_out_is_split_by_count_and_bytes_and_all_of_it_arrives() {
    if !have_sqs() {
        return;
    }
    let target = unique("h24-fanout");
    let t = transport(&target, Duration::from_secs(30), true).await;
    // 25 messages, seven of 100 KiB: batches must split by entries (10) and by bytes
    // (256 KiB), or the strict server refuses the request.
    let messages: Vec<Outgoing> = (0..25)
        .map(|i| {
            let size = if i % 4 == 0 { 100 * 1024 } else { 64 };
            let mut body = format!("{i:04}-").into_bytes();
            body.resize(size, b'x');
            Outgoing {
                queue: target.clone(),
                body,
                delay: None,
            }
        })
        .collect();
    t.send(&messages).await.expect("fan-out of 25");
    let got = take(&t, 25).await;
    let mut ids: Vec<String> = got
        .iter()
        .map(|m| String::from_utf8_lossy(&m.body[..4]).into_owned())
        .collect();
    ids.sort();
    let want: Vec<String> = (0..25).map(|i| format!("{i:04}")).collect();
    assert_eq!(ids, want);
    delete_queue(&t, &target).await;
}

#[tokio::test]
async fn concurrent_acks_delete_every_message() {
    if !have_sqs() {
        return;
    }
    let queue = unique("h24-acks");
    let t = transport(&queue, Duration::from_secs(30), true).await;
    let messages: Vec<Outgoing> = (0..40)
        .map(|i| Outgoing {
            queue: queue.clone(),
            body: format!("m{i}").into_bytes(),
            delay: None,
        })
        .collect();
    t.send(&messages).await.expect("send 40");
    let got = take(&t, 40).await;
    let acks = got.iter().map(|m| t.ack(&m.handle));
    for r in futures::future::join_all(acks).await {
        r.expect("ack");
    }
    assert_eq!(depth(&t, &queue).await, (0, 0), "acked messages are gone");
    delete_queue(&t, &queue).await;
}

#[tokio::test]
async fn a_refused_delete_is_an_error_not_a_done() {
    if !have_sqs() {
        return;
    }
    let queue = unique("h24-refused");
    let t = transport(&queue, Duration::from_secs(30), true).await;
    t.send(&[Outgoing {
        queue: queue.clone(),
        body: b"keep".to_vec(),
        delay: None,
    }])
    .await
    .expect("send");
    let got = take(&t, 1).await;
    // A receipt the server never issued (or one from a queue since deleted): the delete
    // fails for that entry and the caller must hear so.
    let bogus = transport(&queue, Duration::from_secs(30), true).await;
    let fake = bogus_handle(&bogus, &queue).await;
    let err = t
        .ack(&fake)
        .await
        .expect_err("a bogus receipt is not deleted");
    assert!(
        matches!(err, TransportError::Rejected(ref m) if m.contains("ReceiptHandleIsInvalid")),
        "{err}"
    );
    t.ack(&got[0].handle)
        .await
        .expect("the real receipt deletes");
    delete_queue(&t, &queue).await;
}

/// A handle whose receipt was issued for another queue's message, then made invalid by
/// deleting that queue.
async fn bogus_handle(t: &SqsTransport, queue: &str) -> SqsHandle {
    let other = format!("{queue}-other");
    let o = transport(&other, Duration::from_secs(30), true).await;
    o.send(&[Outgoing {
        queue: other.clone(),
        body: b"elsewhere".to_vec(),
        delay: None,
    }])
    .await
    .expect("send elsewhere");
    let mut got = take(&o, 1).await;
    delete_queue(t, &other).await;
    got.remove(0).handle
}

#[tokio::test]
async fn sending_to_a_missing_queue_names_it() {
    if !have_sqs() {
        return;
    }
    let own = unique("h24-own");
    let t = transport(&own, Duration::from_secs(30), false).await;
    let missing = unique("h24-missing");
    let err = t
        .send(&[Outgoing {
            queue: missing.clone(),
            body: b"x".to_vec(),
            delay: None,
        }])
        .await
        .expect_err("no such queue");
    assert!(
        matches!(err, TransportError::NoSuchQueue(ref q) if *q == missing),
        "{err}"
    );
}

#[tokio::test]
async fn held_messages_stay_invisible_past_the_visibility_timeout() {
    if !have_sqs() {
        return;
    }
    let queue = unique("h24-held");
    let t = std::sync::Arc::new(transport(&queue, Duration::from_secs(2), true).await);
    t.spawn_extender();
    t.send(&[Outgoing {
        queue: queue.clone(),
        body: b"long handler".to_vec(),
        delay: None,
    }])
    .await
    .expect("send");
    let got = take(&t, 1).await;
    t.hold(&got[0].handle);
    // Another consumer long-polls for three visibility timeouts: an extended message never
    // shows to it.
    let other = transport(&queue, Duration::from_secs(2), true).await;
    let url = other.queue_url(&queue).await.expect("url");
    let seen = other
        .client()
        .receive_message()
        .queue_url(&url)
        .wait_time_seconds(6)
        .send()
        .await
        .expect("receive");
    assert!(
        seen.messages().is_empty(),
        "a held message showed again: {seen:?}"
    );
    // Released, it shows at once.
    t.release(&got[0].handle).await.expect("release");
    let again = take(&other, 1).await;
    assert_eq!(again[0].body, b"long handler");
    assert_eq!(again[0].redeliveries, 1);
    delete_queue(&t, &queue).await;
}

/// Hops that send to a new queue at once each create it; whoever loses the race (SQS and
/// ElasticMQ answer `QueueNameExists` when the winner's attributes differ) uses the queue the
/// other made. Twelve transports (twelve URL
/// caches, as twelve sidecars) race for each of ten new names.
#[tokio::test]
async fn concurrent_creates_of_a_new_queue_all_get_its_url() {
    if !have_sqs() {
        return;
    }
    let own = unique("h30-own");
    let mut ts = Vec::new();
    // Each with its own visibility timeout, as sidecars of different actors: a create
    // with other attributes than the winner's is what the server refuses.
    for i in 0..12 {
        ts.push(transport(&own, Duration::from_secs(30 + i), true).await);
    }
    for i in 0..10 {
        let name = unique(&format!("h30-race{i}"));
        let urls = futures::future::join_all(ts.iter().map(|t| t.queue_url(&name))).await;
        let urls: Vec<String> = urls
            .into_iter()
            .map(|u| u.unwrap_or_else(|e| panic!("{name}: {e}")))
            .collect();
        assert!(
            urls.iter().all(|u| u == &urls[0] && !u.is_empty()),
            "{urls:?}"
        );
        delete_queue(&ts[0], &name).await;
    }
}
