//! `asya send` against the real RabbitMQ and SQS server of tests/services: the composed
//! envelope reaches the actor's queue as the sidecar would parse it, and `--wait` finds it in
//! x-sink or x-sump by browsing (leaving it there), or times out. Each test makes its own
//! uniquely named queues and deletes them.

#[path = "../../tests/services/require.rs"]
mod require;

use std::time::Duration;

use asya_api::naming;
use asya_cli::broker::{Broker, rabbit::Rabbit, sqs::Sqs};
use asya_cli::cmd::send::wait;
use asya_cli::compose;
use asya_cli::error::CliError;
use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
use lapin::{Connection, ConnectionProperties};

fn unique_ns(tag: &str) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        % 1_000_000_000;
    format!("tclis{tag}-{t}-{}", std::process::id() % 100_000)
}

const QUEUES: [&str; 3] = ["a", "x-sink", "x-sump"];

/// Sends a composed envelope to `a`, checks what arrived there, moves it to `end` as an
/// actor would, and waits for it; then waits for an id that never comes.
async fn send_then_wait(broker: &Broker, ns: &str, end: &str) {
    let env =
        compose::envelope("e-1".into(), "a", &["b".into()], "{\"x\": 1}", "t".into()).unwrap();
    let body = serde_json::to_vec(&env).unwrap();
    broker
        .publish(&naming::actor_queue(ns, "a"), &body)
        .await
        .unwrap();
    let (held, _) = broker
        .browse(&naming::actor_queue(ns, "a"), 10)
        .await
        .unwrap();
    assert_eq!(held.len(), 1);
    let got = asya_transport::envelope::parse(&held[0].body, Some("a")).unwrap();
    assert_eq!(got.route.actors, ["a", "b"]);
    broker.remove(&held[0]).await.unwrap();

    broker
        .publish(&naming::actor_queue(ns, end), &body)
        .await
        .unwrap();
    let (where_, f) = wait(broker, ns, "e-1", Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(where_, end);
    assert_eq!(f.id, "e-1");
    // Found by browsing: still there for whoever reads the end queue.
    let (again, _) = broker
        .browse(&naming::actor_queue(ns, end), 10)
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    broker.give_back(again).await.unwrap();

    match wait(broker, ns, "never", Duration::from_millis(300)).await {
        Err(CliError::Timeout { what, .. }) => assert!(what.contains("never"), "{what}"),
        other => panic!("{:?}", other.map(|(w, _)| w)),
    }
}

#[tokio::test]
async fn rabbitmq_send_and_wait() {
    if !require::servers("RabbitMQ", &["ASYA_TEST_RABBITMQ_URL"]) {
        return;
    }
    let url = std::env::var("ASYA_TEST_RABBITMQ_URL").unwrap();
    let ns = unique_ns("r");
    let ex = naming::tenant_exchange(&ns);
    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    for q in QUEUES {
        asya_transport::rabbitmq::declare_bound_queue(&ch, &ex, &naming::actor_queue(&ns, q))
            .await
            .unwrap();
    }
    let broker = Broker::Rabbit(Box::new(
        Rabbit::connect(&url, "guest", &ex, "test broker".into())
            .await
            .unwrap(),
    ));
    send_then_wait(&broker, &ns, "x-sump").await;
    broker.close().await;
    for q in QUEUES {
        let name = naming::actor_queue(&ns, q);
        ch.queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    }
    ch.exchange_delete(ex.as_str().into(), ExchangeDeleteOptions::default())
        .await
        .unwrap();
    let _ = conn.close(200, "done".into()).await;
}

#[tokio::test]
async fn sqs_send_and_wait() {
    if !require::servers("the SQS server", &["ASYA_TEST_SQS_ENDPOINT"]) {
        return;
    }
    let ns = unique_ns("s");
    let sqs = Sqs::connect(
        "us-east-1".into(),
        std::env::var("ASYA_TEST_SQS_ENDPOINT").ok(),
        None,
    )
    .await;
    let mut urls = Vec::new();
    for q in QUEUES {
        let out = sqs
            .client()
            .create_queue()
            .queue_name(naming::actor_queue(&ns, q))
            .send()
            .await
            .unwrap();
        urls.push(out.queue_url().unwrap().to_string());
    }
    let broker = Broker::Sqs(Box::new(sqs));
    send_then_wait(&broker, &ns, "x-sink").await;
    let Broker::Sqs(sqs) = &broker else {
        unreachable!()
    };
    for u in urls {
        sqs.client()
            .delete_queue()
            .queue_url(u)
            .send()
            .await
            .unwrap();
    }
}
