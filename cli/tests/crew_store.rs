//! `asya sump` over the crew's S3 store (seed 001's error-end actor), against the real S3 of
//! tests/services (moto) and RabbitMQ: the listing reads every stored envelope and changes
//! nothing; a redrive publishes the selected to the failed actor's queue with the broker's
//! confirmation, then moves each stored object to `redriven/`; one abandoned after its
//! resend stays in the store and a rerun sends it again. Own bucket, queues and exchange,
//! deleted after.

#[path = "../../tests/services/require.rs"]
mod require;

use asya_api::naming;
use asya_cli::broker::s3::CrewStore;
use asya_cli::broker::{Broker, rabbit::Rabbit};
use asya_cli::cmd::send::{Place, wait_at};
use asya_cli::crew::Store;
use asya_cli::error::CliError;
use asya_cli::select::Selector;
use asya_cli::sump::{self, Flow, Request};
use lapin::options::{BasicGetOptions, ExchangeDeleteOptions, QueueDeleteOptions};
use lapin::{Connection, ConnectionProperties};
use serde_json::{Value, json};
use std::time::Duration;

fn failed(id: &str, ty: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": id, "route": {"actors": ["a", "b"], "current": 1},
        "headers": {"x-asya-error": {"actor": "b", "reason": "retries exhausted", "type": ty, "message": "boom"}},
        "payload": {"n": id}
    }))
    .unwrap()
}

fn req<'a>(ns: &'a str, sel: &'a Selector) -> Request<'a> {
    Request {
        namespace: ns,
        sel,
        max: 100,
        dry_run: false,
        now: "t",
        now_ms: 1,
    }
}

async fn keys(store: &CrewStore, prefix: &str) -> Vec<String> {
    let out = store
        .client()
        .list_objects_v2()
        .bucket(&store.bucket)
        .prefix(prefix)
        .send()
        .await
        .unwrap();
    let mut v: Vec<String> = out
        .contents()
        .iter()
        .filter_map(|o| o.key().map(str::to_string))
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn the_crew_store_is_listed_then_redriven_publish_first() {
    if !require::servers(
        "S3 and RabbitMQ",
        &["ASYA_TEST_S3_ENDPOINT", "ASYA_TEST_RABBITMQ_URL"],
    ) {
        return;
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        % 1_000_000_000;
    let ns = format!("tclicrew-{t}-{}", std::process::id() % 100_000);
    let store = CrewStore::connect(
        &Store {
            actor: "error-end".into(),
            bucket: ns.clone(),
            prefix: "errors/".into(),
            endpoint: std::env::var("ASYA_TEST_S3_ENDPOINT").ok(),
            region: Some("us-east-1".into()),
            keys: None,
        },
        None,
    )
    .await;
    store
        .client()
        .create_bucket()
        .bucket(&ns)
        .send()
        .await
        .unwrap();
    for (id, ty) in [
        ("e1", "ValueError"),
        ("e2", "KeyError"),
        ("e3", "ValueError"),
    ] {
        store
            .client()
            .put_object()
            .bucket(&ns)
            .key(format!("errors/2026-11-26/b/{id}.json"))
            .body(failed(id, ty).into())
            .send()
            .await
            .unwrap();
    }

    let url = std::env::var("ASYA_TEST_RABBITMQ_URL").unwrap();
    let ex = naming::tenant_exchange(&ns);
    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let queue = naming::actor_queue(&ns, "b");
    asya_transport::rabbitmq::declare_bound_queue(&ch, &ex, &queue)
        .await
        .unwrap();
    let broker = Broker::Rabbit(Box::new(
        Rabbit::connect(&url, "guest", &ex, "test broker".into())
            .await
            .unwrap(),
    ));

    let all = Selector::default();
    let l = sump::browse(&store, &all, 100, 0).await.unwrap();
    assert_eq!(l.envelopes.len(), 3);
    assert!(
        l.source.contains(&format!("s3://{ns}/errors/")),
        "{}",
        l.source
    );
    assert_eq!(keys(&store, "errors/").await.len(), 3);

    let sel = Selector::parse(vec![], None, Some("ValueError"), None, false, true).unwrap();
    // Abandoned after the first confirmed resend: nothing moved yet.
    let r = sump::redrive(&store, &broker, &req(&ns, &sel), &mut |_| Flow::Abandon)
        .await
        .unwrap();
    assert_eq!(r.outcomes.len(), 1);
    assert_eq!(keys(&store, "errors/").await.len(), 3);
    // The rerun sends both selected (the first again: at least once) and moves them.
    let r = sump::redrive(&store, &broker, &req(&ns, &sel), &mut |_| Flow::Continue)
        .await
        .unwrap();
    assert_eq!(
        r.outcomes.iter().filter(|o| o.result == "redriven").count(),
        2,
        "{:?}",
        r.outcomes
    );
    assert_eq!(
        keys(&store, "errors/").await,
        ["errors/2026-11-26/b/e2.json"]
    );
    assert_eq!(
        keys(&store, "redriven/").await,
        [
            "redriven/errors/2026-11-26/b/e1.json",
            "redriven/errors/2026-11-26/b/e3.json"
        ]
    );

    let mut got = Vec::new();
    while let Some(m) = ch
        .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        let v: Value = serde_json::from_slice(&m.delivery.data).unwrap();
        assert_eq!(v["headers"]["x-asya-redriven"]["count"], 1);
        assert!(v["headers"].get("x-asya-error").is_none());
        got.push(v["id"].as_str().unwrap().to_string());
    }
    got.sort();
    assert_eq!(got, ["e1", "e1", "e3"]);

    broker.close().await;
    ch.queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    ch.exchange_delete(ex.as_str().into(), ExchangeDeleteOptions::default())
        .await
        .unwrap();
    let _ = conn.close(200, "done".into()).await;
    for k in keys(&store, "").await {
        store
            .client()
            .delete_object()
            .bucket(&ns)
            .key(k)
            .send()
            .await
            .unwrap();
    }
    store
        .client()
        .delete_bucket()
        .bucket(&ns)
        .send()
        .await
        .unwrap();
}

/// `send --wait` where the crew's end actors consume x-sink and x-sump: the envelope is found
/// in the store the happy-end actor wrote (`results/{date}/{actor}/{id}.json`), once it is
/// there; an id the store does not hold times out.
#[tokio::test]
async fn send_wait_finds_what_the_crew_stored() {
    if !require::servers(
        "S3 and RabbitMQ",
        &["ASYA_TEST_S3_ENDPOINT", "ASYA_TEST_RABBITMQ_URL"],
    ) {
        return;
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        % 1_000_000_000;
    let ns = format!("tcliwait-{t}-{}", std::process::id() % 100_000);
    let store_at = |prefix: &str| Store {
        actor: "end".into(),
        bucket: ns.clone(),
        prefix: prefix.into(),
        endpoint: std::env::var("ASYA_TEST_S3_ENDPOINT").ok(),
        region: Some("us-east-1".into()),
        keys: None,
    };
    let results = CrewStore::connect(&store_at("results/"), None).await;
    let errors = CrewStore::connect(&store_at("errors/"), None).await;
    results
        .client()
        .create_bucket()
        .bucket(&ns)
        .send()
        .await
        .unwrap();
    let url = std::env::var("ASYA_TEST_RABBITMQ_URL").unwrap();
    let broker = Broker::Rabbit(Box::new(
        Rabbit::connect(&url, "guest", &format!("asya.{ns}"), "test broker".into())
            .await
            .unwrap(),
    ));
    let places = [
        ("x-sink", Place::Store(&results)),
        ("x-sump", Place::Store(&errors)),
    ];
    // Nothing stored yet: a short wait times out and says what it waited for.
    match wait_at(&broker, &ns, &places, "w-1", Duration::from_millis(300)).await {
        Err(CliError::Timeout { what, .. }) => assert!(what.contains("w-1"), "{what}"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    let body = serde_json::to_vec(&json!({
        "id": "w-1", "route": {"actors": ["a", "b"], "current": 2}, "payload": {"done": true}
    }))
    .unwrap();
    results
        .client()
        .put_object()
        .bucket(&ns)
        .key("results/2026-11-26/b/w-1.json")
        .body(body.into())
        .send()
        .await
        .unwrap();
    let (end, found) = wait_at(&broker, &ns, &places, "w-1", Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!((end, found.id.as_str()), ("x-sink", "w-1"));
    // Another id whose name only ends the same is not it.
    match wait_at(&broker, &ns, &places, "1", Duration::from_millis(300)).await {
        Err(CliError::Timeout { .. }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }

    broker.close().await;
    for k in keys(&results, "").await {
        results
            .client()
            .delete_object()
            .bucket(&ns)
            .key(k)
            .send()
            .await
            .unwrap();
    }
    results
        .client()
        .delete_bucket()
        .bucket(&ns)
        .send()
        .await
        .unwrap();
}
