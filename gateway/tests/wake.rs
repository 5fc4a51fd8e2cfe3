//! The gateway is a sender of route-aware wake-up (docs/DESIGN.md §6.1): a tool call's route
//! is woken, every actor of it once, end actors aside, on both real brokers of tests/services.

use std::sync::Arc;
use std::time::{Duration, Instant};

use asya_gateway::send::{SendConfig, Senders};
use asya_transport::Transport;
use asya_transport::rabbitmq::{RabbitSettings, RabbitTransport};
use asya_transport::sqs::{SqsSettings, SqsTransport};

#[path = "../../tests/services/require.rs"]
mod require;

fn unique_ns() -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() % 1_000_000_000_000)
        .unwrap_or_default();
    format!("gw{n}")
}

/// Counts the ready messages of `queue`, created (empty) if missing; never takes one.
enum Observer {
    Rabbit(Arc<RabbitTransport>),
    Sqs(Arc<SqsTransport>),
}

impl Observer {
    async fn new(rabbit: bool, queue: &str) -> Observer {
        if rabbit {
            let t = RabbitTransport::new(
                RabbitSettings {
                    url: std::env::var("ASYA_TEST_RABBITMQ_URL").unwrap(),
                    url_source: "ASYA_TEST_RABBITMQ_URL",
                    exchange: "asya".into(),
                    queue: queue.into(),
                    prefetch: 1,
                    auto_create: true,
                    max_redeliveries: 1,
                    publish_only: true,
                },
                Box::new(|| {}),
            );
            t.ensure_connected().await;
            Observer::Rabbit(Arc::new(t))
        } else {
            Observer::Sqs(Arc::new(
                SqsTransport::new(SqsSettings {
                    region: "us-east-1".into(),
                    endpoint: std::env::var("ASYA_TEST_SQS_ENDPOINT").ok(),
                    queue: queue.into(),
                    wait_seconds: 0,
                    visibility_timeout: Duration::from_secs(30),
                    auto_create: true,
                    max_message_bytes: 1_048_576,
                    pollers: 1,
                })
                .await,
            ))
        }
    }

    async fn ready(&self) -> Option<u64> {
        match self {
            Observer::Rabbit(t) => t.queue_depth().await,
            Observer::Sqs(t) => t.queue_depth().await,
        }
    }
}

async fn wakes_the_route(rabbit: bool) {
    let ns = unique_ns();
    let wake = |a: &str| asya_api::wake::wake_queue(&ns, a).unwrap();
    let (wa, wb, wsink) = (
        Observer::new(rabbit, &wake("a")).await,
        Observer::new(rabbit, &wake("b")).await,
        Observer::new(rabbit, &wake("x-sink")).await,
    );
    for o in [&wa, &wb, &wsink] {
        assert_eq!(o.ready().await, Some(0), "created empty");
    }
    let senders = Senders::new(&SendConfig {
        default_transport: if rabbit { "rabbitmq" } else { "sqs" }.into(),
        rabbitmq_url: std::env::var("ASYA_TEST_RABBITMQ_URL").ok(),
        exchange: "asya".into(),
        sqs_region: Some("us-east-1".into()),
        sqs_endpoint: std::env::var("ASYA_TEST_SQS_ENDPOINT").ok(),
        deadline: Duration::from_secs(10),
    })
    .await;
    let route: Vec<String> = ["a", "b", "a", "x-sink"].map(String::from).to_vec();
    assert_eq!(senders.wake(None, &ns, &route).await, 0, "all handed over");
    let deadline = Instant::now() + Duration::from_secs(30);
    for o in [&wa, &wb] {
        while o.ready().await != Some(1) {
            assert!(
                Instant::now() < deadline,
                "a route actor was not woken once"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert_eq!(wsink.ready().await, Some(0), "end actors are not woken");
    // A transport the gateway lacks wakes nobody and says so.
    assert_eq!(senders.wake(Some("kafka"), &ns, &route).await, 2);
}

#[tokio::test]
async fn a_tool_calls_route_is_woken_rabbitmq() {
    if require::services(
        "RabbitMQ",
        "source tests/services/env",
        &["ASYA_TEST_RABBITMQ_URL"],
    ) {
        wakes_the_route(true).await
    }
}

#[tokio::test]
async fn a_tool_calls_route_is_woken_sqs() {
    if require::services(
        "the SQS server",
        "source tests/services/env",
        &["ASYA_TEST_SQS_ENDPOINT", "AWS_ACCESS_KEY_ID"],
    ) {
        wakes_the_route(false).await
    }
}
