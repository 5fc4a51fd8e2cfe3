//! The gateway report token Secret through whole reconciles against the [`Fake`]: issued
//! before the workload, never written over a Secret we did not create, removed with the
//! namespace's last actor only.

use std::sync::Arc;

use asya_api::AsyncActor;
use asya_api::config::{ClusterConfig, SecretKeySelector};
use asya_api::report_token::ReportKey;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use super::fake::{Fake, PLATFORM_NAMESPACE, Stored, default_namespace_uid, key};
use super::gateway_report::VERSION_ANNOTATION;
use super::memory::{ObjectKey, RECHECK};
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

/// Puts `k` in the platform namespace as the report key.
fn set_key(r: &Reconciler<Fake>, k: &[u8]) {
    let data = serde_json::to_value(k8s_openapi::ByteString(k.to_vec())).unwrap();
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
}

/// A reconciler whose platform namespace holds the report key.
fn reconciler() -> Reconciler<Fake> {
    let r = Reconciler::new(Fake::default(), Arc::new(config()));
    set_key(&r, KEY);
    r
}

/// As if [`RECHECK`] had passed since the token and the key were last looked at.
fn recheck_passed(r: &Reconciler<Fake>) {
    let k = ObjectKey::new(ObjectKind::Secret, "n", TOKEN_SECRET);
    let mut applied = r.memory.applied(&k).expect("issued before");
    applied.at = std::time::Instant::now() - RECHECK;
    r.memory.record_applied(k, applied);
    r.memory.gateway_report.forget_key();
}

/// The token in namespace n's Secret.
fn issued_token(r: &Reconciler<Fake>) -> String {
    let s = token_secret(r).expect("the token Secret");
    let token: k8s_openapi::ByteString =
        serde_json::from_value(s.body["data"]["token"].clone()).unwrap();
    String::from_utf8(token.0).unwrap()
}

/// The report token version on the pod template of actor `name`'s Deployment.
fn template_version(r: &Reconciler<Fake>, name: &str) -> Value {
    let w = r.cluster.world();
    w.objects[&key(ObjectKind::Deployment, "n", name)].body["spec"]["template"]["metadata"]
        ["annotations"][VERSION_ANNOTATION]
        .clone()
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
    let token = issued_token(&r);
    // Bound to the namespace's uid, which the gateway checks.
    let claim = ReportKey::new(KEY).unwrap().verify(&token).unwrap();
    assert_eq!(
        (claim.namespace, claim.uid),
        ("n".to_string(), default_namespace_uid("n"))
    );
    assert_eq!(
        template_version(&r, "a"),
        json!(asya_api::report_token::fingerprint(&token)),
        "its version is on the pod template"
    );
    for l in &log {
        assert!(!l.contains(&token), "a token leaked into {l}");
    }

    // The next reconcile reads and writes nothing for it, and the workload is not applied
    // again (its version is remembered).
    r.reconcile(&a).await.unwrap();
    let log = r.cluster.take_log();
    assert!(
        !log.iter()
            .any(|l| l.contains("Secret n/asya-gateway-report")
                || l.contains("asya-gateway-report-key")
                || l.contains("Namespace n")
                || l.contains("Deployment n/a")),
        "{log:#?}"
    );
}

/// "When the token Secret's content changes, the actor workloads' pods must roll onto it":
/// a new key, or the namespace's uid changed, is a new token and a new version on every
/// workload's pod template of the namespace, the Secret written first.
#[tokio::test]
async fn a_new_token_rolls_the_namespaces_workloads_onto_it() {
    let r = reconciler();
    let (a, b) = (actor("a", "uid-a"), actor("b", "uid-b"));
    r.reconcile(&a).await.unwrap();
    r.reconcile(&b).await.unwrap();
    let first = issued_token(&r);
    let v1 = template_version(&r, "a");
    assert_eq!(template_version(&r, "b"), v1, "one token per namespace");
    r.cluster.take_log();

    // A new key.
    let other_key = b"another key of at least 32 bytes!!";
    set_key(&r, other_key);
    recheck_passed(&r);
    r.reconcile(&a).await.unwrap();
    let log = r.cluster.take_log();
    assert!(
        at(&log, "apply Secret n/asya-gateway-report") < at(&log, "apply Deployment n/a"),
        "{log:#?}"
    );
    let second = issued_token(&r);
    assert_ne!(second, first);
    assert!(ReportKey::new(other_key).unwrap().verify(&second).is_ok());
    let v2 = template_version(&r, "a");
    assert_eq!(v2, json!(asya_api::report_token::fingerprint(&second)));
    assert_ne!(v2, v1, "a new version rolls a's pods");
    // b's next reconcile rolls b without issuing again.
    r.reconcile(&b).await.unwrap();
    assert_eq!(template_version(&r, "b"), v2);
    assert!(
        !r.cluster
            .take_log()
            .iter()
            .any(|l| l == "apply Secret n/asya-gateway-report")
    );

    // The namespace's uid is not the one the token was issued for.
    r.cluster
        .world()
        .namespaces
        .insert("n".into(), Some("uid-ns-n-again".into()));
    recheck_passed(&r);
    r.reconcile(&a).await.unwrap();
    let third = issued_token(&r);
    let claim = ReportKey::new(other_key).unwrap().verify(&third).unwrap();
    assert_eq!(claim.uid, "uid-ns-n-again");
    assert_ne!(template_version(&r, "a"), v2);
}

/// While no token can be issued (here: the namespace cannot be read), the workloads keep the
/// version issued last: a passing failure rolls no pod, and one Warning says why.
#[tokio::test]
async fn a_failure_to_issue_keeps_the_last_version_and_rolls_nothing() {
    let r = reconciler();
    let a = actor("a", "uid-a");
    r.reconcile(&a).await.unwrap();
    let v1 = template_version(&r, "a");
    r.cluster.world().namespaces.insert("n".into(), None);
    recheck_passed(&r);
    r.reconcile(&a).await.unwrap();
    let log = r.cluster.take_log();
    assert!(
        log.iter().any(|l| l
            == "event Warning GatewayReportToken: namespace n does not exist: no gateway report token issued"),
        "{log:#?}"
    );
    assert_eq!(template_version(&r, "a"), v1);
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
