//! Flows as tools (`crate::flows`): the entry AsyncActors the watch sees become tools named
//! `{namespace}.{flow}`, listed over REST and MCP and called as any tool, with the same
//! tenancy: a namespace-limited token sees and calls only its own namespace's flows. A call
//! is stored with the entry actor as its route, in the actor's namespace, and sent to the
//! entry's queue (here refused by the unconfigured transport, which names the queue). On
//! the memory store and, when `ASYA_TEST_POSTGRES_URL` names a server, on PostgreSQL.

use std::sync::Arc;

use serde_json::{Value, json};

use super::tests::{Setup, TOKEN, request, serve_with};
use crate::store::Store;

/// Namespace `shop` only.
const SHOP: &str = "shop-only-token-0123456789";

const TOOLS: &str = "tools:\n- {name: t-file, route: [a], namespace: shop}\n";

fn entry(ns: &str, name: &str, flow: &str) -> Arc<asya_api::types::AsyncActor> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
            "metadata": {"name": name, "namespace": ns,
                         "labels": {"asya.sh/flow": flow, "asya.sh/flow-role": "entry"},
                         "annotations": {"asya.sh/flow-description": format!("{flow} in {ns}")}},
            "spec": {"transport": "rabbitmq", "image": "x", "handler": "orders.validate"}
        }))
        .unwrap(),
    )
}

fn names(v: &Value) -> Vec<String> {
    v["tools"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .filter_map(|t| t["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

async fn suite(store: Store) {
    let (gw, app) = serve_with(Setup {
        tokens: format!("{TOKEN}\n{SHOP} namespaces=shop\n"),
        tools: TOOLS,
        store,
        ..Setup::default()
    })
    .await;
    let (tools, warnings) = crate::flows::tools_of(&[
        entry("shop", "validate", "review_order"),
        entry("bank", "validate", "review_order"),
    ]);
    assert!(warnings.is_empty(), "{warnings:?}");
    app.set_flow_tools(tools);
    let (all, shop) = (Some(TOKEN), Some(SHOP));

    let r = request(gw, "GET", "/tools", all, "").await;
    assert_eq!(
        names(&r.body),
        ["bank.review_order", "shop.review_order", "t-file"]
    );
    let r = request(gw, "GET", "/tools", shop, "").await;
    assert_eq!(names(&r.body), ["shop.review_order", "t-file"]);
    let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    let r = request(gw, "POST", "/mcp", shop, list).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(
        r.text.contains(r#""name":"shop.review_order""#),
        "{}",
        r.text
    );
    assert!(
        r.text.contains(r#""description":"review_order in shop""#),
        "{}",
        r.text
    );
    assert!(!r.text.contains("bank.review_order"), "{}", r.text);

    // Another namespace's flow: refused, naming the rule.
    let call =
        |name: &str| json!({"name": name, "arguments": {"items": [{"price": 5}]}}).to_string();
    let r = request(gw, "POST", "/tools/call", shop, &call("bank.review_order")).await;
    assert_eq!(
        (r.status, r.body["error"].as_str()),
        (403, Some("namespace_not_allowed")),
        "{}",
        r.body
    );
    // Its own: stored with the entry as the route, then sent to the entry's queue.
    let r = request(gw, "POST", "/tools/call", shop, &call("shop.review_order")).await;
    assert_eq!(
        (r.status, r.body["error"].as_str()),
        (502, Some("send_failed")),
        "{}",
        r.body
    );
    let message = r.body["message"].as_str().unwrap();
    let id = message
        .strip_prefix("envelope ")
        .and_then(|m| m.split_once(' '))
        .map(|(id, _)| id)
        .unwrap();
    let r = request(gw, "GET", &format!("/envelopes/{id}"), shop, "").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (&r.body["tool"], &r.body["namespace"], &r.body["route"]),
        (
            &json!("shop.review_order"),
            &json!("shop"),
            &json!(["validate"])
        )
    );
    assert_eq!(r.body["error"]["queue"], "asya-shop-validate", "{}", r.body);

    // The entry goes away: so does its tool; the file's stay.
    app.set_flow_tools(crate::flows::tools_of(&[entry("bank", "validate", "review_order")]).0);
    let r = request(gw, "GET", "/tools", shop, "").await;
    assert_eq!(names(&r.body), ["t-file"]);
}

#[tokio::test]
async fn flows_are_tools_of_their_namespace_on_memory() {
    suite(Store::memory()).await;
}

#[tokio::test]
async fn flows_are_tools_of_their_namespace_on_postgres() {
    let Ok(base) = std::env::var("ASYA_TEST_POSTGRES_URL") else {
        eprintln!(
            "SKIPPED flows_are_tools_of_their_namespace_on_postgres: ASYA_TEST_POSTGRES_URL is \
             not set (tests/services/up, then `source tests/services/env`, or `make unit`)."
        );
        return;
    };
    let db = crate::store::conformance::scratch::Database::create(&base).await;
    let pg = crate::store::postgres::Postgres::connect(&db.url)
        .await
        .expect("connect to the scratch database");
    suite(Store::postgres(pg)).await;
    db.drop_now().await;
}
