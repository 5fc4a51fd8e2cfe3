//! The gateway report token Secret through whole reconciles against the [`Fake`]: issued
//! before the workload, never written over a Secret we did not create, removed with the
//! namespace's last actor only.

use std::sync::Arc;

use asya_api::AsyncActor;
use asya_api::config::{ClusterConfig, SecretKeySelector};
use asya_api::report_token::ReportKey;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use super::fake::{Fake, PLATFORM_NAMESPACE, Stored, key};
use super::{FINALIZER, Reconciler};
use crate::model::ObjectKind;

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
const TOKEN_SECRET: &str = "asya-gateway-report";

fn config() -> ClusterConfig {
    let mut c = ClusterConfig::default();
    c.gateway.url = Some("http://asya-gateway.asya-system.svc:8080".into());
    c.gateway.token_secret_ref = Some(SecretKeySelector {
        name: TOKEN_SECRET.into(),
        key: "token".into(),
    });
    c.gateway.report_key_secret_ref = Some(SecretKeySelector {
        name: "asya-gateway-report-key".into(),
        key: "key".into(),
    });
    c
}

fn stored(body: Value, managed: bool) -> Stored {
    Stored {
        body,
        generation: 1,
        managed,
        ready: 0,
    }
}

/// A reconciler whose platform namespace holds the report key.
fn reconciler() -> Reconciler<Fake> {
    let r = Reconciler::new(Fake::default(), Arc::new(config()));
    let data = serde_json::to_value(k8s_openapi::ByteString(KEY.to_vec())).unwrap();
    r.cluster.world().objects.insert(
        key(
            ObjectKind::Secret,
            PLATFORM_NAMESPACE,
            "asya-gateway-report-key",
        ),
        stored(
            json!({"metadata": {"name": "asya-gateway-report-key"}, "data": {"key": data}}),
            false,
        ),
    );
    r
}

fn actor(name: &str, uid: &str) -> AsyncActor {
    serde_json::from_value(json!({
        "apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
        "metadata": {"name": name, "namespace": "n", "uid": uid, "generation": 1,
                     "finalizers": [FINALIZER]},
        "spec": {"image": "py:3.12", "handler": "m.f"}
    }))
    .unwrap()
}

fn at(log: &[String], line: &str) -> usize {
    log.iter()
        .position(|l| l.starts_with(line))
        .unwrap_or_else(|| panic!("no {line:?} in {log:#?}"))
}

fn token_secret(r: &Reconciler<Fake>) -> Option<Stored> {
    r.cluster
        .world()
        .objects
        .get(&key(ObjectKind::Secret, "n", TOKEN_SECRET))
        .cloned()
}

fn deleting(mut a: AsyncActor) -> AsyncActor {
    a.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    a
}

#[tokio::test]
async fn the_namespace_token_is_issued_before_the_workload() {
    let r = reconciler();
    let a = actor("a", "uid-a");
    r.reconcile(&a).await.unwrap();
    let log = r.cluster.take_log();
    assert!(
        at(&log, "apply Secret n/asya-gateway-report") < at(&log, "apply Deployment n/a"),
        "{log:#?}"
    );
    let s = token_secret(&r).expect("the token Secret");
    assert!(s.managed);
    let token = s.body["data"]["token"].as_str().unwrap().to_string();
    let token: k8s_openapi::ByteString = serde_json::from_value(json!(token)).unwrap();
    let token = String::from_utf8(token.0).unwrap();
    assert_eq!(
        ReportKey::new(KEY).unwrap().verify(&token).as_deref(),
        Some("n")
    );
    for l in &log {
        assert!(!l.contains(&token), "a token leaked into {l}");
    }

    // The next reconcile reads and writes nothing for it.
    r.reconcile(&a).await.unwrap();
    let log = r.cluster.take_log();
    assert!(
        !log.iter()
            .any(|l| l.contains("Secret n/asya-gateway-report")
                || l.contains("asya-gateway-report-key")),
        "{log:#?}"
    );
}

#[tokio::test]
async fn a_same_named_secret_we_did_not_create_is_left_alone_with_one_warning() {
    let r = reconciler();
    let theirs = json!({"metadata": {"name": TOKEN_SECRET, "namespace": "n",
                         "labels": {"app.kubernetes.io/managed-by": "someone"}},
                        "data": {"token": "dGhlaXJz"}});
    r.cluster.world().objects.insert(
        key(ObjectKind::Secret, "n", TOKEN_SECRET),
        stored(theirs.clone(), false),
    );
    let a = actor("a", "uid-a");
    r.reconcile(&a).await.unwrap();
    r.reconcile(&a).await.unwrap();
    let log = r.cluster.take_log();
    assert!(
        !log.iter()
            .any(|l| l == "apply Secret n/asya-gateway-report"),
        "{log:#?}"
    );
    let warnings: Vec<&String> = log
        .iter()
        .filter(|l| l.starts_with("event Warning GatewayReportToken: Secret n/asya-gateway-report (gateway.tokenSecretRef) exists without the label"))
        .collect();
    assert_eq!(warnings.len(), 1, "once: {log:#?}");
    assert!(
        log.iter().any(|l| l.starts_with("apply Deployment n/a")),
        "the actor still runs"
    );
    assert_eq!(token_secret(&r).unwrap().body, theirs);

    // Its last actor gone, the foreign Secret still stays.
    r.reconcile(&deleting(a)).await.unwrap();
    assert_eq!(token_secret(&r).unwrap().body, theirs);
    assert!(
        !r.cluster
            .take_log()
            .iter()
            .any(|l| l == "delete Secret n/asya-gateway-report")
    );
}

#[tokio::test]
async fn the_token_goes_with_the_namespace_last_actor_only() {
    let r = reconciler();
    let (a, b) = (actor("a", "uid-a"), actor("b", "uid-b"));
    r.reconcile(&a).await.unwrap();
    r.reconcile(&b).await.unwrap();
    r.cluster.world().actors = vec![Arc::new(a.clone()), Arc::new(b.clone())];
    assert!(token_secret(&r).is_some());

    // a goes: b still reports with it.
    let a = deleting(a);
    r.cluster.world().actors = vec![Arc::new(a.clone()), Arc::new(b.clone())];
    r.reconcile(&a).await.unwrap();
    assert!(token_secret(&r).is_some());
    assert!(
        !r.cluster
            .take_log()
            .iter()
            .any(|l| l == "delete Secret n/asya-gateway-report")
    );

    // b, the last: the Secret goes with it.
    let b = deleting(b);
    r.cluster.world().actors = vec![Arc::new(b.clone())];
    r.reconcile(&b).await.unwrap();
    let log = r.cluster.take_log();
    assert!(
        at(&log, "delete Secret n/asya-gateway-report") < at(&log, "remove finalizer"),
        "{log:#?}"
    );
    assert!(token_secret(&r).is_none());
}

#[tokio::test]
async fn without_the_key_the_actor_runs_and_one_warning_names_the_secret() {
    let r = reconciler();
    r.cluster.world().objects.clear();
    let a = actor("a", "uid-a");
    r.reconcile(&a).await.unwrap();
    r.reconcile(&a).await.unwrap();
    let log = r.cluster.take_log();
    let warnings: Vec<&String> = log
        .iter()
        .filter(|l| l.starts_with("event Warning GatewayReportToken:"))
        .collect();
    assert_eq!(
        warnings,
        [
            "event Warning GatewayReportToken: Secret asya-system/asya-gateway-report-key (gateway.reportKeySecretRef) does not exist"
        ],
        "{log:#?}"
    );
    assert!(log.iter().any(|l| l.starts_with("apply Deployment n/a")));
    assert!(token_secret(&r).is_none());
}

#[tokio::test]
async fn without_report_tokens_configured_nothing_is_read_or_written() {
    let mut c = config();
    c.gateway.report_key_secret_ref = None;
    let r = Reconciler::new(Fake::default(), Arc::new(c));
    let a = actor("a", "uid-a");
    r.reconcile(&a).await.unwrap();
    r.reconcile(&deleting(a)).await.unwrap();
    let log = r.cluster.take_log();
    assert!(
        !log.iter().any(|l| l.contains("asya-gateway-report")),
        "{log:#?}"
    );
}
