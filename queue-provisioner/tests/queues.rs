//! Queue operations against the real RabbitMQ and SQS (ElasticMQ) servers of tests/services.
//! Run `tests/services/up` and `source tests/services/env` first; without the variables the
//! tests that need a server skip and say so (`make unit` makes them fail instead).

use std::time::Duration;

use asya_queue_provisioner::queue::owner::{Claimant, OwnershipError};
use asya_queue_provisioner::queue::rabbitmq::RabbitQueues;
use asya_queue_provisioner::queue::sqs::{SqsQueues, StaticCredentials};
use asya_queue_provisioner::queue::{Backend, QueueDepth, QueueError, QueueOps, QueueSpec};

#[path = "../../tests/services/require.rs"]
mod require;

fn rabbitmq_up() -> bool {
    require::servers(
        "RabbitMQ",
        &[
            "ASYA_TEST_RABBITMQ_URL",
            "ASYA_TEST_RABBITMQ_MANAGEMENT_URL",
        ],
    )
}

fn sqs_up() -> bool {
    require::servers(
        "the SQS server",
        &[
            "ASYA_TEST_SQS_ENDPOINT",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
        ],
    )
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run tests/services/up and `source tests/services/env`")
    })
}

fn unique(prefix: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{prefix}{}", n % 1_000_000_000_000)
}

fn spec(ns: &str, actor: &str) -> QueueSpec {
    QueueSpec {
        name: asya_api::naming::actor_queue(ns, actor),
        namespace: ns.into(),
        actor: actor.into(),
        visibility_timeout: Duration::from_secs(120),
        adopt_untagged: false,
        wake_ttl: None,
    }
}

/// Publishes `{}` to `queue` through exchange `asya` (mandatory, confirmed).
async fn publish(ch: &lapin::Channel, queue: &str) {
    ch.basic_publish(
        "asya".into(),
        queue.into(),
        lapin::options::BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        },
        b"{}",
        lapin::BasicProperties::default(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
}

fn depth(queued: i64, processing: Option<i64>) -> QueueDepth {
    QueueDepth {
        queued: Some(queued),
        processing,
    }
}

/// Polls the queue's depth until it is `want`.
async fn wait_depth(q: &RabbitQueues, name: &str, want: QueueDepth, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let d = q.depth(name).await.unwrap();
        if d.as_ref() == Some(&want) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "counts {d:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn rabbitmq_create_bind_delete_recreate() {
    if !rabbitmq_up() {
        return;
    }
    let q = RabbitQueues::new(env("ASYA_TEST_RABBITMQ_URL"), "asya");
    let s = spec(&unique("it"), "doubler");
    assert!(!q.exists(&s.name).await.unwrap());
    let info = q.ensure(&s).await.unwrap();
    assert!(info.created);
    assert_eq!(info.identifier, s.name);
    assert!(
        !info.url.contains("guest:guest"),
        "no password in status: {}",
        info.url
    );
    assert!(q.exists(&s.name).await.unwrap());
    // Idempotent.
    assert!(!q.ensure(&s).await.unwrap().created);

    // Bound on exchange `asya` with the queue name as routing key: a publish there lands.
    let conn = lapin::Connection::connect(&env("ASYA_TEST_RABBITMQ_URL"), Default::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(Default::default()).await.unwrap();
    publish(&ch, &s.name).await;
    // AMQP alone tells ready messages, not in-flight ones.
    wait_depth(&q, &s.name, depth(1, None), Duration::from_secs(5)).await;

    q.delete(&s.name).await.unwrap();
    assert!(!q.exists(&s.name).await.unwrap());
    q.delete(&s.name).await.unwrap(); // a missing queue is fine
    // A vanished queue is recreated by the next ensure.
    assert!(q.ensure(&s).await.unwrap().created);
    q.delete(&s.name).await.unwrap();
}

/// Many operations at once on one connection, more channels in all than the connection's
/// `channel_max` (so channel ids would be reused) and many of them closed by the broker (the
/// passive declare of a missing queue): every operation gets its own answer, right, and never
/// another operation's error (lapin keeps a broker-closed channel's error against its id; a
/// reused id used to fail with another actor's `NOT_FOUND - no queue …` and leak).
#[tokio::test]
async fn rabbitmq_concurrent_operations_on_one_connection_never_cross() {
    if !rabbitmq_up() {
        return;
    }
    use futures::StreamExt;
    let q = RabbitQueues::new(env("ASYA_TEST_RABBITMQ_URL"), "asya");
    let ns = unique("cross");
    let present: Vec<QueueSpec> = (0..16).map(|i| spec(&ns, &format!("p{i}"))).collect();
    for s in &present {
        q.ensure(s).await.unwrap();
    }
    // About 5,000 channels: more than RabbitMQ's default channel_max (2047) twice over.
    let ops = 2400;
    let results: Vec<Result<(), String>> = futures::stream::iter(0..ops)
        .map(|i| {
            let (q, ns, present) = (&q, &ns, &present);
            async move {
                let p = &present[i % present.len()];
                let what =
                    |op: &str, name: &str, got: String| format!("op {i}: {op} {name}: {got}");
                match i % 4 {
                    0 => {
                        let missing = asya_api::naming::actor_queue(ns, &format!("m{i}"));
                        match q.exists(&missing).await {
                            Ok(false) => Ok(()),
                            other => Err(what("exists", &missing, format!("{other:?}"))),
                        }
                    }
                    1 => match q.exists(&p.name).await {
                        Ok(true) => Ok(()),
                        other => Err(what("exists", &p.name, format!("{other:?}"))),
                    },
                    2 => match q.ensure(p).await {
                        Ok(info) if !info.created => Ok(()),
                        other => Err(what("ensure", &p.name, format!("{other:?}"))),
                    },
                    _ => {
                        let t = spec(ns, &format!("t{i}"));
                        match q.ensure(&t).await {
                            Ok(info) if info.created => {}
                            other => return Err(what("ensure", &t.name, format!("{other:?}"))),
                        }
                        if let Err(e) = q.delete(&t.name).await {
                            return Err(what("delete", &t.name, e.to_string()));
                        }
                        match q.exists(&t.name).await {
                            Ok(false) => Ok(()),
                            other => {
                                Err(what("exists after delete", &t.name, format!("{other:?}")))
                            }
                        }
                    }
                }
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let mut wrong: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    for s in &present {
        if let Err(e) = q.delete(&s.name).await {
            wrong.push(format!("cleanup: delete {}: {e}", s.name));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {ops} operations went wrong, first ones: {:#?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
}

/// A deleted actor's delay queues go with its queue: the sidecar's own send path declares one
/// for a delayed retry; the provisioner's delete finds it from the retry policy.
#[tokio::test]
async fn rabbitmq_delete_takes_the_sidecars_delay_queues() {
    if !rabbitmq_up() {
        return;
    }
    use asya_transport::Transport;
    use asya_transport::rabbitmq::{RabbitSettings, RabbitTransport};

    let url = env("ASYA_TEST_RABBITMQ_URL");
    let q = RabbitQueues::new(url.clone(), "asya");
    let s = spec(&unique("it"), "retrier");
    q.ensure(&s).await.unwrap();
    let resiliency: asya_api::types::Resiliency = serde_json::from_value(serde_json::json!({
        "policies": {
            "default": {"maxAttempts": 3, "backoff": "exponential", "initialInterval": "2s", "maxInterval": "30s"},
            "never-used": {"maxAttempts": 2, "backoff": "constant", "initialInterval": "9s"}
        }
    }))
    .unwrap();
    let sidecar = RabbitTransport::new(
        RabbitSettings {
            url,
            url_source: "ASYA_TEST_RABBITMQ_URL",
            exchange: "asya".into(),
            queue: s.name.clone(),
            prefetch: 1,
            auto_create: false,
            max_redeliveries: 3,
            publish_only: true,
        },
        Box::new(|| {}),
    );
    sidecar.ensure_connected().await;
    // The first retry of the default policy waits 2 s.
    sidecar
        .send(&[asya_transport::Outgoing {
            queue: s.name.clone(),
            body: b"{}".to_vec(),
            delay: Some(Duration::from_secs(2)),
        }])
        .await
        .unwrap();
    let delay_q = format!("{}.delay-2000ms", s.name);
    assert!(
        q.exists(&delay_q).await.unwrap(),
        "the sidecar declared {delay_q}"
    );

    let deleted = q
        .delete_with_delay_queues(&s.name, Some(&resiliency))
        .await
        .unwrap();
    // 2 s and 4 s for the default policy, 9 s for the other: deleting absent ones is fine.
    assert_eq!(
        deleted,
        [
            delay_q.clone(),
            format!("{}.delay-4000ms", s.name),
            format!("{}.delay-9000ms", s.name)
        ]
    );
    assert!(!q.exists(&s.name).await.unwrap());
    assert!(!q.exists(&delay_q).await.unwrap(), "{delay_q} deleted");
    sidecar.close().await;
}

/// docs/DESIGN.md §6.1: the wake queue is declared with the actor's queue, bound on `asya`,
/// holds one message however many wakes, lets it expire after the TTL, follows a changed
/// cooldown, and goes with the actor's queue.
#[tokio::test]
async fn rabbitmq_wake_queue_holds_one_expiring_message_and_goes_with_the_queue() {
    if !rabbitmq_up() {
        return;
    }
    let b = Backend::Rabbit(Box::new(RabbitQueues::new(
        env("ASYA_TEST_RABBITMQ_URL"),
        "asya",
    )));
    let Backend::Rabbit(q) = &b else {
        unreachable!()
    };
    let s = QueueSpec {
        wake_ttl: Some(Duration::from_secs(2)),
        ..spec(&unique("it"), "hop")
    };
    let wake = s.wake_queue().expect("a short name has a wake queue");
    assert_eq!(wake, format!("{}_wake", s.name));
    assert!(b.ensure(&s).await.unwrap().created);
    assert!(b.exists(&wake).await.unwrap());

    let conn = lapin::Connection::connect(&env("ASYA_TEST_RABBITMQ_URL"), Default::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(Default::default()).await.unwrap();
    for _ in 0..3 {
        publish(&ch, &wake).await;
    }
    wait_depth(q, &wake, depth(1, None), Duration::from_secs(5)).await;
    // Expired after the TTL: nothing keeps the actor up.
    wait_depth(q, &wake, depth(0, None), Duration::from_secs(10)).await;

    // A changed cooldown: the queue is declared again with the new TTL.
    let longer = QueueSpec {
        wake_ttl: Some(Duration::from_secs(30)),
        ..s.clone()
    };
    assert!(!b.ensure(&longer).await.unwrap().created);
    publish(&ch, &wake).await;
    wait_depth(q, &wake, depth(1, None), Duration::from_secs(5)).await;

    b.delete_with_retry_queues(&s.name, None).await.unwrap();
    assert!(!b.exists(&s.name).await.unwrap());
    assert!(
        !b.exists(&wake).await.unwrap(),
        "{wake} deleted with the queue"
    );
    let _ = conn.close(200, "done".into()).await;
}

/// With the management API, status gets unacknowledged (in-flight) messages too.
#[tokio::test]
async fn rabbitmq_management_counts_ready_and_unacknowledged() {
    if !rabbitmq_up() {
        return;
    }
    let url = env("ASYA_TEST_RABBITMQ_URL");
    let q = RabbitQueues::new(url.clone(), "asya").with_management(
        &env("ASYA_TEST_RABBITMQ_MANAGEMENT_URL"),
        "/",
        "guest",
        "guest",
    );
    let s = spec(&unique("it"), "counted");
    q.ensure(&s).await.unwrap();
    let conn = lapin::Connection::connect(&url, Default::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(Default::default()).await.unwrap();
    for _ in 0..3 {
        publish(&ch, &s.name).await;
    }
    // One message taken and not acknowledged: in flight, as with a handler running.
    let held = ch
        .basic_get(s.name.as_str().into(), Default::default())
        .await
        .unwrap()
        .expect("a message");
    // The management API refreshes its counts every second (tests/services/rabbitmq).
    wait_depth(&q, &s.name, depth(2, Some(1)), Duration::from_secs(15)).await;
    held.acker.ack(Default::default()).await.unwrap();
    q.delete(&s.name).await.unwrap();
    // A missing queue says so.
    assert_eq!(q.depth(&s.name).await.unwrap(), None);
}

/// A broker that accepts the connection and never answers (a node shutting down, a network
/// black hole) makes the operation fail as unavailable; it must not hang the reconcile.
#[tokio::test]
async fn rabbitmq_silent_broker_times_out_as_unavailable() {
    let (port, held) = silent_server().await;
    let q = RabbitQueues::new(format!("amqp://guest:guest@127.0.0.1:{port}/%2f"), "asya");
    unavailable_within_30s(q.ensure(&spec("x", "y"))).await;
    held.abort();
}

/// `op` fails as Unavailable within 30 s instead of hanging.
async fn unavailable_within_30s<T: std::fmt::Debug>(
    op: impl Future<Output = Result<T, QueueError>>,
) {
    let started = std::time::Instant::now();
    let res = tokio::time::timeout(Duration::from_secs(60), op)
        .await
        .expect("hung on a silent server");
    assert!(
        matches!(res, Err(QueueError::Unavailable(_))),
        "expected Unavailable, got {res:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}

/// Accepts connections on a local port and never answers; returns the port.
async fn silent_server() -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = listener.accept().await {
            conns.push(c);
        }
    });
    (port, held)
}

#[tokio::test]
async fn sqs_silent_endpoint_times_out_as_unavailable() {
    let (port, held) = silent_server().await;
    let q = SqsQueues::new(
        "us-east-1",
        Some(&format!("http://127.0.0.1:{port}")),
        Some(StaticCredentials {
            access_key_id: "test".into(),
            secret_access_key: "test".into(),
        }),
    )
    .await;
    unavailable_within_30s(q.exists("asya-x-y")).await;
    held.abort();
}

#[tokio::test]
async fn rabbitmq_unreachable_is_unavailable() {
    let q = RabbitQueues::new("amqp://guest:guest@127.0.0.1:1/%2f".into(), "asya");
    match q.ensure(&spec("x", "y")).await {
        Err(QueueError::Unavailable(_)) => {}
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

async fn sqs() -> SqsQueues {
    SqsQueues::new(
        "us-east-1",
        Some(&env("ASYA_TEST_SQS_ENDPOINT")),
        Some(StaticCredentials {
            access_key_id: env("AWS_ACCESS_KEY_ID"),
            secret_access_key: env("AWS_SECRET_ACCESS_KEY"),
        }),
    )
    .await
}

#[tokio::test]
async fn sqs_attributes_tags_delete_recreate() {
    if !sqs_up() {
        return;
    }
    let q = sqs().await;
    let s = spec(&unique("it"), "doubler");
    let info = q.ensure(&s).await.unwrap();
    assert!(info.created);
    assert!(
        info.identifier.starts_with("arn:aws:sqs:"),
        "{}",
        info.identifier
    );
    assert!(info.url.ends_with(&s.name));

    // Read back with a plain client: what seed 003 asks for.
    let c = q.client().clone();
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let attrs = c
        .get_queue_attributes()
        .queue_url(&info.url)
        .attribute_names(A::All)
        .send()
        .await
        .unwrap();
    let a = attrs.attributes().unwrap();
    assert_eq!(a[&A::VisibilityTimeout], "120");
    // ElasticMQ, the test server, keeps no retention period (it accepts the attribute and
    // reports none); SQS does. What is sent is checked in `queue::sqs`'s unit tests.
    if let Some(retention) = a.get(&A::MessageRetentionPeriod) {
        assert_eq!(retention, "345600");
    }
    assert_eq!(a[&A::ReceiveMessageWaitTimeSeconds], "20");
    let tags = c
        .list_queue_tags()
        .queue_url(&info.url)
        .send()
        .await
        .unwrap();
    let t = tags.tags().unwrap();
    assert_eq!(t["asya.sh/namespace"], s.namespace);
    assert_eq!(t["asya.sh/actor"], "doubler");

    // A changed actorTimeout updates the existing queue.
    let s2 = QueueSpec {
        visibility_timeout: Duration::from_secs(45),
        ..s.clone()
    };
    assert!(!q.ensure(&s2).await.unwrap().created);
    let attrs = c
        .get_queue_attributes()
        .queue_url(&info.url)
        .attribute_names(A::VisibilityTimeout)
        .send()
        .await
        .unwrap();
    assert_eq!(attrs.attributes().unwrap()[&A::VisibilityTimeout], "45");

    c.send_message()
        .queue_url(&info.url)
        .message_body("{}")
        .send()
        .await
        .unwrap();
    // SQS's count is approximate: ElasticMQ under load has been seen to answer 0 right after
    // the send. Waited for, within a bound.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let queued = q.depth(&s.name).await.unwrap().unwrap().queued;
        if queued == Some(1) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the sent message never counted: {queued:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    q.delete(&s.name).await.unwrap();
    assert!(!q.exists(&s.name).await.unwrap());
    q.delete(&s.name).await.unwrap();
    // Recreate right after deletion: real SQS answers with the 60 s cooldown error, the
    // test servers (ElasticMQ, moto) recreate at once. Either is handled; never a crash or a silent failure.
    match q.ensure(&s).await {
        Ok(info) => {
            assert!(info.created);
            q.delete(&s.name).await.unwrap();
        }
        Err(QueueError::RecreateCooldown(_)) => {}
        Err(e) => panic!("unexpected error on recreate: {e}"),
    }
}

/// Issue 26 finding 2: an SQS queue tagged for another actor is neither adopted nor deleted;
/// an untagged one only with the actor's `asya.sh/adopt-queue` (then tagged as its own).
/// docs/DESIGN.md §6.1 on SQS: the wake queue beside the actor's, tagged as the actor's, its
/// URL the actor queue's with the wake name (what the KEDA trigger reads), deleted with it.
#[tokio::test]
async fn sqs_wake_queue_beside_the_queue_and_deleted_with_it() {
    if !sqs_up() {
        return;
    }
    let b = Backend::Sqs(sqs().await);
    let Backend::Sqs(q) = &b else { unreachable!() };
    let s = QueueSpec {
        wake_ttl: Some(Duration::from_secs(30)),
        ..spec(&unique("it"), "hop")
    };
    let wake = s.wake_queue().unwrap();
    let info = b.ensure(&s).await.unwrap();
    let c = q.client().clone();
    let url = c
        .get_queue_url()
        .queue_name(&wake)
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_string();
    assert_eq!(
        asya_queue_provisioner::render::keda::sibling_queue_url(&info.url, &s.name, &wake)
            .as_deref(),
        Some(url.as_str())
    );
    let tags = c.list_queue_tags().queue_url(&url).send().await.unwrap();
    let t = tags.tags().unwrap();
    assert_eq!(
        (t["asya.sh/namespace"].as_str(), t["asya.sh/actor"].as_str()),
        (s.namespace.as_str(), "hop")
    );
    // Idempotent.
    assert!(!b.ensure(&s).await.unwrap().created);
    b.delete_with_retry_queues(&s.name, None).await.unwrap();
    assert!(!b.exists(&s.name).await.unwrap());
    assert!(
        !b.exists(&wake).await.unwrap(),
        "{wake} deleted with the queue"
    );
}

#[tokio::test]
async fn sqs_a_queue_tagged_for_another_actor_is_not_adopted_or_deleted() {
    if !sqs_up() {
        return;
    }
    let b = Backend::Sqs(sqs().await);
    let Backend::Sqs(q) = &b else { unreachable!() };
    // `team-a`'s end queue x-sink, and `team`'s actor `a-x-sink` that shares its name.
    let team = unique("tn");
    let theirs = spec(&format!("{team}-a"), "x-sink");
    let ours = spec(&team, "a-x-sink");
    assert_eq!(theirs.name, ours.name);
    b.ensure_owned(&theirs).await.unwrap();
    match b.ensure_owned(&ours).await {
        Err(QueueError::NotOurs(OwnershipError::Foreign { owner, .. })) => {
            assert!(owner.contains(&format!("{team}-a/x-sink")), "{owner}")
        }
        other => panic!("adopted another actor's queue: {other:?}"),
    }
    let who = Claimant::new(&team, "a-x-sink", true);
    assert!(matches!(
        b.delete_actor_queue(&ours.name, None, &who).await,
        Err(QueueError::NotOurs(_))
    ));
    assert!(q.exists(&theirs.name).await.unwrap(), "not deleted");
    let c = q.client();
    let url = c
        .get_queue_url()
        .queue_name(&theirs.name)
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_string();
    let tags = c.list_queue_tags().queue_url(&url).send().await.unwrap();
    assert_eq!(
        tags.tags().unwrap()["asya.sh/actor"],
        "x-sink",
        "not re-tagged"
    );
    b.delete_actor_queue(&theirs.name, None, &theirs.claimant())
        .await
        .unwrap();

    // Untagged (made by hand): refused, then adopted on request and tagged.
    let hand = spec(&unique("tn"), "hand");
    c.create_queue()
        .queue_name(&hand.name)
        .send()
        .await
        .unwrap();
    assert!(matches!(
        b.ensure_owned(&hand).await,
        Err(QueueError::NotOurs(OwnershipError::Untagged { .. }))
    ));
    assert!(matches!(
        b.delete_actor_queue(&hand.name, None, &hand.claimant())
            .await,
        Err(QueueError::NotOurs(_))
    ));
    let adopting = QueueSpec {
        adopt_untagged: true,
        ..hand.clone()
    };
    assert!(!b.ensure_owned(&adopting).await.unwrap().created);
    // Tagged now: owned without the annotation.
    b.ensure_owned(&hand).await.unwrap();
    // The annotation never adopts a queue whose name is another namespace's end queue
    // (`{team}-a`'s results, left untagged, wanted by `{team}`'s actor `a-x-sump`).
    let team = unique("tn");
    let end = spec(&team, "a-x-sump");
    c.create_queue().queue_name(&end.name).send().await.unwrap();
    let adopt_end = QueueSpec {
        adopt_untagged: true,
        ..end.clone()
    };
    assert!(matches!(
        b.ensure_owned(&adopt_end).await,
        Err(QueueError::NotOurs(
            OwnershipError::AmbiguousAdoption { .. }
        ))
    ));
    q.delete(&end.name).await.unwrap();
    b.delete_actor_queue(&hand.name, None, &hand.claimant())
        .await
        .unwrap();
    assert!(!q.exists(&hand.name).await.unwrap());
}

/// The RabbitMQ record of a queue without a claim (docs/DESIGN.md §9): bound to the
/// claimant's namespace's exchange `asya.{ns}` only, adopted (the upgrade from the release
/// before the claims); bound to another namespace's, neither adopted nor deleted; bound to
/// none (the namespace's last actor went, and its exchange with it), adopted only with the
/// annotation, which never adopts another namespace's end queue name. Without tenant
/// exchanges the bindings prove nothing: adopted as before.
#[tokio::test]
async fn rabbitmq_the_broker_record_of_a_queue_without_a_claim() {
    if !rabbitmq_up() {
        return;
    }
    let url = env("ASYA_TEST_RABBITMQ_URL");
    let mgmt = env("ASYA_TEST_RABBITMQ_MANAGEMENT_URL");
    let q = RabbitQueues::new(url.clone(), "asya")
        .with_management(&mgmt, "/", "guest", "guest")
        .with_tenant_identities(&mgmt, "/", "guest", "guest")
        .unwrap();
    let b = Backend::Rabbit(Box::new(q));
    let Backend::Rabbit(rabbit) = &b else {
        unreachable!()
    };
    let team = unique("tn");
    let team_a = format!("{team}-a");
    // team-a's end queue x-sink as the provisioner declares it (bound to asya.{team}-a), and
    // team's actor a-x-sink, which shares its name.
    let theirs = spec(&team_a, "x-sink");
    let ours = spec(&team, "a-x-sink");
    assert_eq!(theirs.name, ours.name);
    b.ensure(&theirs).await.unwrap();
    b.ensure_owned(&theirs).await.unwrap();
    assert!(matches!(
        b.ensure_owned(&ours).await,
        Err(QueueError::NotOurs(OwnershipError::Foreign { .. }))
    ));
    assert!(matches!(
        b.delete_actor_queue(&ours.name, None, &ours.claimant())
            .await,
        Err(QueueError::NotOurs(_))
    ));
    assert!(b.exists(&theirs.name).await.unwrap(), "not deleted");

    // team-a's last actor is gone, and its exchange with it: the results queue stays, bound
    // to `asya` only. Before the claims this adopted it for team/a-x-sink.
    rabbit.delete_tenant_exchange(&team_a).await.unwrap();
    match b.ensure_owned(&ours).await {
        Err(QueueError::NotOurs(OwnershipError::Unbound { queue, .. })) => {
            assert_eq!(queue, ours.name)
        }
        other => panic!("adopted a queue bound to no namespace: {other:?}"),
    }
    // Asking for it does not help: the name is another namespace's end queue.
    let adopting = QueueSpec {
        adopt_untagged: true,
        ..ours.clone()
    };
    match b.ensure_owned(&adopting).await {
        Err(QueueError::NotOurs(OwnershipError::AmbiguousAdoption { other, end, .. })) => {
            assert_eq!((other.as_str(), end.as_str()), (team_a.as_str(), "x-sink"))
        }
        other => panic!("adopted another namespace's end queue: {other:?}"),
    }
    assert!(matches!(
        b.delete_actor_queue(&ours.name, None, &adopting.claimant())
            .await,
        Err(QueueError::NotOurs(_))
    ));
    assert!(b.exists(&theirs.name).await.unwrap(), "not deleted");
    // team-a itself, back with an actor, gets its own end queue once it asks (or by its
    // claim, which the reconcile keeps from its first actor on).
    assert!(matches!(
        b.ensure_owned(&theirs).await,
        Err(QueueError::NotOurs(OwnershipError::Unbound { .. }))
    ));
    let back = QueueSpec {
        adopt_untagged: true,
        ..theirs.clone()
    };
    assert!(!b.ensure_owned(&back).await.unwrap().created);
    // Bound again to asya.{team}-a: owned without the annotation.
    b.ensure_owned(&theirs).await.unwrap();

    // Without tenant exchanges (shareAdminCredentials) the bindings record nothing.
    let shared = Backend::Rabbit(Box::new(
        RabbitQueues::new(url.clone(), "asya").with_management(&mgmt, "/", "guest", "guest"),
    ));
    assert_eq!(
        shared.owner_record(&ours.name).await.unwrap(),
        Some(asya_queue_provisioner::queue::owner::QueueRecord::Unknown)
    );

    b.delete_actor_queue(&theirs.name, None, &theirs.claimant())
        .await
        .unwrap();
    assert!(!b.exists(&theirs.name).await.unwrap());
    rabbit.delete_tenant_exchange(&team_a).await.unwrap();
}
