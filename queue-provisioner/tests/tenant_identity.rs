//! A namespace's broker identity on the real RabbitMQ of tests/services (docs/DESIGN.md §9):
//! the provisioner creates the user with the permissions `broker_identity::permissions`
//! computes, and the sidecar's own transport, connected as that user, does all it does
//! (consume, publish through the namespace's exchange, retry through a delay queue) while
//! the default exchange and other queues stay refused. Run `tests/services/up` and `source
//! tests/services/env` first; without them the test skips (`make unit` fails instead).

use std::collections::BTreeSet;
use std::time::Duration;

use asya_queue_provisioner::broker_identity::permissions;
use asya_queue_provisioner::queue::rabbitmq::RabbitQueues;
use asya_queue_provisioner::queue::{QueueOps, QueueSpec};
use asya_transport::rabbitmq::{RabbitSettings, RabbitTransport};
use asya_transport::{Outgoing, Transport};

#[path = "../../tests/services/require.rs"]
mod require;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

fn spec(ns: &str, actor: &str) -> QueueSpec {
    QueueSpec {
        name: asya_api::naming::actor_queue(ns, actor),
        namespace: ns.into(),
        actor: actor.into(),
        visibility_timeout: Duration::from_secs(60),
        adopt_untagged: false,
        wake_ttl: None,
    }
}

/// The channel-closing error of one operation as a tenant: its text.
async fn refusal<T>(op: impl Future<Output = Result<T, lapin::Error>>) -> String {
    match op.await {
        Ok(_) => panic!("the broker allowed it"),
        Err(e) => e.to_string(),
    }
}

/// Publishes `{}` (confirmed) and returns the broker's refusal: a refused publish closes the
/// channel, which the confirmation or the next call on the channel reports.
async fn publish_refusal(conn: &lapin::Connection, exchange: &str, key: &str) -> String {
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(Default::default()).await.unwrap();
    let sent = ch
        .basic_publish(
            exchange.into(),
            key.into(),
            Default::default(),
            b"{}",
            Default::default(),
        )
        .await;
    let confirmed = match sent {
        Ok(c) => c.await.map(|_| ()),
        Err(e) => Err(e),
    };
    if let Err(e) = confirmed {
        return e.to_string();
    }
    let passive = lapin::options::QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    refusal(ch.queue_declare(key.into(), passive, Default::default())).await
}

/// A fresh namespace name with `prefix`, the provisioner's queues with tenant identities on
/// the test RabbitMQ, and that namespace's broker user created with `password`. `None`
/// without the servers (skipped, or failed under ASYA_REQUIRE_SERVICES).
async fn tenant(prefix: &str, password: &str) -> Option<(String, RabbitQueues, String)> {
    if !require::servers(
        "RabbitMQ",
        &[
            "ASYA_TEST_RABBITMQ_URL",
            "ASYA_TEST_RABBITMQ_MANAGEMENT_URL",
        ],
    ) {
        return None;
    }
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() % 1_000_000_000)
        .unwrap_or_default();
    let ns = format!("{prefix}{n}");
    let q = RabbitQueues::new(env("ASYA_TEST_RABBITMQ_URL"), "asya")
        .with_tenant_identities(
            &env("ASYA_TEST_RABBITMQ_MANAGEMENT_URL"),
            "/",
            "guest",
            "guest",
        )
        .unwrap();
    let user = asya_api::naming::tenant_broker_user(&ns);
    q.admin().unwrap().put_user(&user, password).await.unwrap();
    Some((ns, q, user))
}

#[tokio::test]
async fn a_tenant_user_does_what_a_sidecar_does_and_nothing_else() {
    let password = "tenant-password-for-the-test-0123456789";
    let Some((ns, q, user)) = tenant("tid", password).await else {
        return;
    };
    let other = format!("{ns}-x");
    // The actors' queues come with their wake queues (docs/DESIGN.md §6.1).
    let woken = |s: QueueSpec| QueueSpec {
        wake_ttl: Some(Duration::from_secs(60)),
        ..s
    };
    for s in [
        woken(spec(&ns, "a")),
        spec(&ns, "x-sink"),
        woken(spec(&other, "a")),
    ] {
        q.ensure(&s).await.unwrap();
    }
    let admin = q.admin().unwrap();
    let actors = BTreeSet::from(["a".to_string()]);
    admin
        .put_permissions(&user, &permissions::for_namespace(&ns, &actors))
        .await
        .unwrap();

    let url = format!("amqp://{user}:{password}@127.0.0.1:5672/%2f");
    let own = asya_api::naming::actor_queue(&ns, "a");
    let t = RabbitTransport::new(
        RabbitSettings {
            url: url.clone(),
            url_source: "test",
            exchange: asya_api::naming::tenant_exchange(&ns),
            queue: own.clone(),
            prefetch: 4,
            auto_create: false,
            max_redeliveries: 3,
            publish_only: false,
        },
        Box::new(|| {}),
    );
    t.ensure_connected().await;
    // A retry through a delay queue (declared with DLX asya.N, bound to it, published to
    // through it) comes back on the actor's own queue; a result goes to x-sink.
    let sink = asya_api::naming::sink_queue(&ns);
    t.send(&[
        Outgoing {
            queue: own.clone(),
            body: b"{\"retry\":1}".to_vec(),
            delay: Some(Duration::from_millis(200)),
        },
        Outgoing {
            queue: sink.clone(),
            body: b"{}".to_vec(),
            delay: None,
        },
    ])
    .await
    .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(20), t.receive())
        .await
        .expect("the retry came back")
        .unwrap();
    assert_eq!(got[0].body, b"{\"retry\":1}");
    t.ack(&got[0].handle).await.unwrap();
    t.close().await;

    // A namespace wakes its own actors through its exchange, and only those: the other
    // namespace's wake queue is bound to no exchange this user may write to.
    let (own_wake, their_wake) = (
        asya_api::wake::wake_queue(&ns, "a").unwrap(),
        asya_api::wake::wake_queue(&other, "a").unwrap(),
    );
    {
        let conn = lapin::Connection::connect(&url, Default::default())
            .await
            .unwrap();
        let ch = conn.create_channel().await.unwrap();
        ch.confirm_select(Default::default()).await.unwrap();
        for key in [&own_wake, &their_wake] {
            ch.basic_publish(
                asya_api::naming::tenant_exchange(&ns).as_str().into(),
                key.as_str().into(),
                Default::default(),
                b"{}",
                Default::default(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        }
        let e = publish_refusal(&conn, &format!("asya.{other}"), &their_wake).await;
        assert!(e.contains("ACCESS_REFUSED"), "{e}");
        let _ = conn.close(200, "done".into()).await;
    }
    let queued = |name: String| {
        let q = &q;
        async move { q.depth(&name).await.unwrap().and_then(|d| d.queued) }
    };
    assert_eq!(queued(own_wake.clone()).await, Some(1), "woken");
    assert_eq!(queued(their_wake.clone()).await, Some(0), "not woken");

    // What a sidecar never does is refused.
    let conn = lapin::Connection::connect(&url, Default::default())
        .await
        .unwrap();
    let theirs = asya_api::naming::actor_queue(&other, "a");
    // The default exchange into its own queue, the platform's and the other namespace's
    // exchange into the other namespace's queue.
    for (exchange, key) in [
        ("", own.as_str()),
        ("asya", theirs.as_str()),
        ("", theirs.as_str()),
        (&format!("asya.{other}") as &str, theirs.as_str()),
    ] {
        let e = publish_refusal(&conn, exchange, key).await;
        assert!(e.contains("ACCESS_REFUSED"), "{exchange:?} {key}: {e}");
    }
    let ch = conn.create_channel().await.unwrap();
    let e = refusal(ch.basic_get(theirs.as_str().into(), Default::default())).await;
    assert!(e.contains("ACCESS_REFUSED"), "{e}");
    let ch = conn.create_channel().await.unwrap();
    let e = refusal(ch.queue_declare(
        format!("{ns}-new").as_str().into(),
        Default::default(),
        Default::default(),
    ))
    .await;
    assert!(e.contains("ACCESS_REFUSED"), "{e}");
    let _ = conn.close(200, "done".into()).await;

    // Cleaned up as with the namespace's last actor.
    admin.delete_user(&user).await.unwrap();
    admin.delete_user(&user).await.unwrap(); // a missing user is fine
    for s in [spec(&ns, "a"), spec(&ns, "x-sink"), spec(&other, "a")] {
        q.delete(&s.name).await.unwrap();
    }
    for w in [own_wake, their_wake] {
        q.delete(&w).await.unwrap();
    }
    q.delete(&format!("{own}.delay-200ms")).await.unwrap();
    q.delete_tenant_exchange(&ns).await.unwrap();
    q.delete_tenant_exchange(&other).await.unwrap();
}

/// The real RabbitMQ accepts the permissions of a namespace whose regexes are as long as
/// `check_size` lets through: 1,000 actors of the provisioner benchmark's names, and the
/// largest count of 63-character names under `MAX_REGEX_CHARS` (the listed form of the
/// first was refused as `invalid_regexp`).
#[tokio::test]
async fn permissions_up_to_the_size_limit_are_accepted() {
    let Some((ns, q, user)) = tenant("tidsize", "tenant-password-for-the-test-0123456789").await
    else {
        return;
    };
    let admin = q.admin().unwrap();
    let bench: BTreeSet<String> = (0..1000).map(|i| format!("bench-actor-{i:04}")).collect();
    let long = |count: usize| -> BTreeSet<String> {
        (0..count)
            .map(|i| format!("{i:04}-{}", "n".repeat(58)))
            .collect()
    };
    // The most 63-character names the check lets through.
    let most = (1..2000)
        .take_while(|&c| {
            permissions::check_size(&ns, c, &permissions::for_namespace(&ns, &long(c))).is_ok()
        })
        .last()
        .unwrap();
    for actors in [bench, long(most)] {
        let p = permissions::for_namespace(&ns, &actors);
        assert!(permissions::check_size(&ns, actors.len(), &p).is_ok());
        admin.put_permissions(&user, &p).await.unwrap_or_else(|e| {
            panic!("{} actors, {} characters: {e}", actors.len(), p.read.len())
        });
    }
    admin.delete_user(&user).await.unwrap();
}
