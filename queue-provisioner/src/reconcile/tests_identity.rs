//! The broker identity step against the in-memory [`Fake`] (docs/DESIGN.md §9): order in a
//! reconcile, the Secret, rotation, removal with the last actor, `shareAdminCredentials`, and
//! the upgrade's removal of the platform's copied password.

use std::sync::Arc;

use asya_api::AsyncActor;
use asya_api::config::ClusterConfig;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use super::fake::{Fake, Stored, key};
use super::plan;
use super::{FINALIZER, Reconciler};
use crate::broker_identity::plan::{ROTATE_ANNOTATION, SecretView, VERSION_ANNOTATION};
use crate::model::ObjectKind;

fn actor(name: &str) -> AsyncActor {
    serde_json::from_value(json!({
        "apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
        "metadata": {"name": name, "namespace": "n", "uid": format!("uid-{name}"), "generation": 1},
        "spec": {"image": "py:3.12", "handler": "m.f"}
    }))
    .expect("actor fixture")
}

pub(super) fn reconciler(cfg: ClusterConfig) -> Reconciler<Fake> {
    Reconciler::new(Fake::default(), Arc::new(cfg))
}

/// One reconcile of an actor the cache holds, as the API server hands it to the next.
pub(super) async fn step(r: &Reconciler<Fake>, a: &mut AsyncActor) {
    {
        let mut w = r.cluster.world();
        let name = a.metadata.name.clone();
        w.actors.retain(|x| x.metadata.name != name);
        w.actors.push(Arc::new(a.clone()));
    }
    r.reconcile(a).await.expect("reconcile");
    let w = r.cluster.world();
    if !plan::has_finalizer(a) {
        a.metadata
            .finalizers
            .get_or_insert_default()
            .push(FINALIZER.into());
    }
    a.status = w.status.clone();
}

pub(super) fn at(log: &[String], prefix: &str) -> usize {
    log.iter()
        .position(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} in {log:#?}"))
}

fn identity(r: &Reconciler<Fake>) -> (SecretView, Stored) {
    let w = r.cluster.world();
    let s = w.objects[&key(ObjectKind::Secret, "n", "asya-broker-rabbitmq")].clone();
    let secret: Secret = serde_json::from_value(s.body.clone()).unwrap();
    (SecretView::of(&secret), s)
}

/// As if [`super::memory::RECHECK`] had passed since the identity was set.
fn recheck_passed(r: &Reconciler<Fake>) {
    let mut set = r.memory.identity("rabbitmq", "n").expect("identity set");
    set.at = std::time::Instant::now() - super::memory::RECHECK;
    r.memory.record_identity("rabbitmq", "n", set);
}

fn template_version(r: &Reconciler<Fake>, name: &str) -> Value {
    let w = r.cluster.world();
    w.objects[&key(ObjectKind::Deployment, "n", name)].body["spec"]["template"]["metadata"]
        ["annotations"][VERSION_ANNOTATION]
        .clone()
}

#[tokio::test]
async fn a_new_actor_gets_queue_then_broker_user_then_secret_then_workload() {
    let r = reconciler(ClusterConfig::default());
    let mut a = actor("a");
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    let order = [
        "create queue asya-n-a",
        "put broker user asya-ns-n",
        "apply Secret n/asya-broker-rabbitmq",
        "apply Deployment n/a",
    ];
    let idx: Vec<usize> = order.iter().map(|p| at(&log, p)).collect();
    assert!(idx.windows(2).all(|w| w[0] < w[1]), "{log:#?}");
    // The platform's password is not copied into the namespace.
    assert!(
        !log.iter().any(|l| l == "apply Secret n/rabbitmq-secret"),
        "{log:#?}"
    );

    let (view, stored) = identity(&r);
    assert!(stored.managed);
    assert_eq!(view.username.as_deref(), Some("asya-ns-n"));
    let password = view.password.clone().unwrap();
    assert!(password.len() >= 32 && password != "pw");
    let users = r.cluster.world().users.clone();
    let (set, perms) = &users["asya-ns-n"];
    assert_eq!(set, &password, "the broker knows the Secret's password");
    let matches = |re: &str, name: &str| regex::Regex::new(re).unwrap().is_match(name);
    assert!(
        matches(&perms.read, "asya-n-a") && matches(&perms.configure, "asya-n-a.delay-100ms"),
        "{perms:?}"
    );
    assert_eq!(
        template_version(&r, "a"),
        json!(view.version.unwrap().to_string()),
        "the pod template carries the credential's version"
    );

    // The next reconcile trusts what it set: no write.
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(
        !log.iter()
            .any(|l| l.contains("broker user") || l.contains("Secret n/asya-broker")),
        "{log:#?}"
    );
}

#[tokio::test]
async fn a_second_actor_widens_the_permissions_and_keeps_the_password() {
    let r = reconciler(ClusterConfig::default());
    let mut a = actor("a");
    step(&r, &mut a).await;
    let (first, _) = identity(&r);
    let mut b = actor("b");
    step(&r, &mut b).await;
    let (second, _) = identity(&r);
    assert_eq!(first, second);
    let perms = r.cluster.world().users["asya-ns-n"].1.clone();
    let read = regex::Regex::new(&perms.read).unwrap();
    assert!(
        read.is_match("asya-n-a") && read.is_match("asya-n-b") && !read.is_match("asya-n-c"),
        "{perms:?}"
    );
}

#[tokio::test]
async fn rotation_issues_a_new_password_and_rolls_the_workload() {
    let r = reconciler(ClusterConfig::default());
    let mut a = actor("a");
    step(&r, &mut a).await;
    let (before, _) = identity(&r);
    {
        let mut w = r.cluster.world();
        let s = w
            .objects
            .get_mut(&key(ObjectKind::Secret, "n", "asya-broker-rabbitmq"))
            .unwrap();
        s.body["metadata"]["annotations"][ROTATE_ANNOTATION] = json!("now");
    }
    // Within RECHECK the identity is trusted as set; the periodic reconcile after it looks.
    step(&r, &mut a).await;
    assert_eq!(identity(&r).0.password, before.password);
    recheck_passed(&r);
    r.cluster.take_log();
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    let (after, _) = identity(&r);
    assert_ne!(after.password, before.password);
    assert!(after.version > before.version && !after.rotate);
    assert!(at(&log, "put broker user") < at(&log, "delete Secret n/asya-broker-rabbitmq"));
    assert!(
        at(&log, "delete Secret n/asya-broker-rabbitmq")
            < at(&log, "apply Secret n/asya-broker-rabbitmq")
    );
    assert!(
        at(&log, "apply Secret n/asya-broker-rabbitmq") < at(&log, "apply Deployment n/a"),
        "{log:#?}"
    );
    assert_eq!(
        r.cluster.world().users["asya-ns-n"].0,
        after.password.clone().unwrap()
    );
    assert_eq!(
        template_version(&r, "a"),
        json!(after.version.unwrap().to_string())
    );
    assert!(
        log.iter()
            .any(|l| l.starts_with("event Normal BrokerCredentialIssued"))
    );
}

/// Puts `names` in the cache, as a `kubectl apply` of several actors does before the first
/// of them is reconciled.
fn cached(r: &Reconciler<Fake>, names: &[&str]) -> Vec<AsyncActor> {
    let actors: Vec<AsyncActor> = names.iter().map(|n| actor(n)).collect();
    r.cluster
        .world()
        .actors
        .extend(actors.iter().cloned().map(Arc::new));
    actors
}

fn broker_user_writes(log: &[String]) -> usize {
    log.iter()
        .filter(|l| l.starts_with("put broker user"))
        .count()
}

#[tokio::test]
async fn actors_arriving_together_share_one_write_of_the_permissions() {
    let r = reconciler(ClusterConfig::default());
    let mut actors = cached(&r, &["a", "b", "c"]);
    // Those waiting for the namespace's identity step have passed their queue step: their
    // queues are claimed (only actors holding their claim are named, docs/DESIGN.md §9).
    for name in ["b", "c"] {
        let q = format!("asya-n-{name}");
        let claim =
            super::fake::stored_claim(&q, "n", &super::fake::default_namespace_uid("n"), name);
        r.cluster.world().claims.insert(q, claim);
    }
    for a in &mut actors {
        step(&r, a).await;
    }
    let log = r.cluster.take_log();
    assert_eq!(broker_user_writes(&log), 1, "{log:#?}");
    let perms = r.cluster.world().users["asya-ns-n"].1.clone();
    let read = regex::Regex::new(&perms.read).unwrap();
    assert!(
        ["asya-n-a", "asya-n-b", "asya-n-c"]
            .iter()
            .all(|q| read.is_match(q))
            && !read.is_match("asya-n-d"),
        "{perms:?}"
    );
    // One that arrives later is not covered: its reconcile widens them.
    let mut d = actor("d");
    step(&r, &mut d).await;
    let log = r.cluster.take_log();
    assert_eq!(broker_user_writes(&log), 1, "{log:#?}");
    let perms = r.cluster.world().users["asya-ns-n"].1.clone();
    assert!(regex::Regex::new(&perms.read).unwrap().is_match("asya-n-d"));
    // While others wait for their first reconcile, an actor already covered writes nothing
    // (it would have, comparing with what it would write: its view holds the new ones).
    cached(&r, &["e"]);
    step(&r, &mut actors[0]).await;
    let log = r.cluster.take_log();
    assert_eq!(broker_user_writes(&log), 0, "{log:#?}");
}

#[tokio::test]
async fn a_deleted_actor_leaves_the_permissions_at_the_next_write() {
    let r = reconciler(ClusterConfig::default());
    let mut actors = cached(&r, &["a", "b"]);
    for a in &mut actors {
        step(&r, a).await;
    }
    let (mut a, mut b) = (actors.remove(0), actors.remove(0));
    a.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    step(&r, &mut a).await;
    r.cluster
        .world()
        .actors
        .retain(|x| x.metadata.name.as_deref() != Some("a"));
    r.cluster.take_log();
    // b is covered by what was set, but the cleanup forgot it: b's reconcile writes anew.
    step(&r, &mut b).await;
    let log = r.cluster.take_log();
    assert_eq!(broker_user_writes(&log), 1, "{log:#?}");
    let perms = r.cluster.world().users["asya-ns-n"].1.clone();
    let read = regex::Regex::new(&perms.read).unwrap();
    assert!(
        read.is_match("asya-n-b") && !read.is_match("asya-n-a"),
        "{perms:?}"
    );
}

#[tokio::test]
async fn the_last_actor_takes_the_user_the_exchange_and_the_secret_with_it() {
    let r = reconciler(ClusterConfig::default());
    let mut a = actor("a");
    let mut b = actor("b");
    step(&r, &mut a).await;
    step(&r, &mut b).await;
    r.cluster.take_log();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    a.metadata.deletion_timestamp = Some(now.clone());
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(
        !log.iter().any(|l| l.starts_with("delete broker user")),
        "b remains: {log:#?}"
    );
    r.cluster
        .world()
        .actors
        .retain(|x| x.metadata.name.as_deref() != Some("a"));
    b.metadata.deletion_timestamp = Some(now);
    step(&r, &mut b).await;
    let log = r.cluster.take_log();
    assert!(
        log.iter()
            .any(|l| l == "delete broker user asya-ns-n and exchange asya.n"),
        "{log:#?}"
    );
    assert!(
        log.iter()
            .any(|l| l == "delete Secret n/asya-broker-rabbitmq"),
        "{log:#?}"
    );
    assert!(r.cluster.world().users.is_empty());
}

fn shared() -> ClusterConfig {
    let mut cfg = ClusterConfig::default();
    cfg.transports
        .get_mut("rabbitmq")
        .unwrap()
        .config
        .share_admin_credentials = true;
    cfg
}

#[tokio::test]
async fn shared_admin_credentials_are_copied_and_announced_once_per_actor() {
    let r = reconciler(shared());
    let mut a = actor("a");
    step(&r, &mut a).await;
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    let warnings = log
        .iter()
        .filter(|l| l.starts_with("event Warning SharedAdminCredentials"))
        .count();
    assert_eq!(warnings, 1, "{log:#?}");
    assert!(log.iter().any(|l| l == "apply Secret n/rabbitmq-secret"));
    assert!(!log.iter().any(|l| l.contains("broker user")));
    assert!(template_version(&r, "a").is_null());
}

fn pod_reading(secret: &str) -> Arc<Pod> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": format!("p-{secret}"), "namespace": "n",
                         "labels": {"asya.sh/inject": "true", "asya.sh/actor": "other"}},
            "spec": {"containers": [{"name": "asya-runtime", "image": "i", "env": [
                {"name": "ASYA_RABBITMQ_PASSWORD",
                 "valueFrom": {"secretKeyRef": {"name": secret, "key": "password"}}}]}]}
        }))
        .unwrap(),
    )
}

#[tokio::test]
async fn after_an_upgrade_the_platform_copy_goes_once_no_pod_reads_it() {
    // Installed with shareAdminCredentials: the copy is there, a pod reads it.
    let r = reconciler(shared());
    let mut a = actor("a");
    step(&r, &mut a).await;
    assert!(r.cluster.world().objects.contains_key(&key(
        ObjectKind::Secret,
        "n",
        "rabbitmq-secret"
    )));
    // Upgraded to the scoped default (a restarted provisioner: its memory is new).
    let up = reconciler(ClusterConfig::default());
    {
        let mut w = up.cluster.world();
        w.objects = r.cluster.world().objects.clone();
        w.queues = r.cluster.world().queues.clone();
        w.pods = vec![pod_reading("rabbitmq-secret")];
    }
    step(&up, &mut a).await;
    let log = up.cluster.take_log();
    assert!(
        log.iter()
            .any(|l| l == "apply Secret n/asya-broker-rabbitmq")
    );
    assert!(!template_version(&up, "a").is_null(), "the workload rolls");
    assert!(
        !log.iter().any(|l| l == "delete Secret n/rabbitmq-secret"),
        "still read: {log:#?}"
    );
    // The copy was there: the platform's password is recorded as exposed (its fingerprint,
    // in the real cluster), and each actor is told until it is changed.
    assert!(
        log.iter()
            .any(|l| l == "record exposed password of rabbitmq"),
        "{log:#?}"
    );
    // Rolled: only pods of the namespace's own identity are left.
    up.cluster.world().pods = vec![pod_reading("asya-broker-rabbitmq")];
    step(&up, &mut a).await;
    let log = up.cluster.take_log();
    assert!(
        log.iter().any(|l| l == "delete Secret n/rabbitmq-secret"),
        "{log:#?}"
    );
    let warned = |log: &[String]| {
        log.iter()
            .any(|l| l.starts_with("event Warning UnrotatedPlatformCredentials"))
    };
    assert!(warned(&log), "{log:#?}");
    // A second actor is told too; once the password is changed, nobody is.
    let mut b = actor("b");
    step(&up, &mut b).await;
    assert!(warned(&up.cluster.take_log()));
    up.cluster.world().platform_password = "rotated".into();
    up.memory.forget_identity("unrotated/rabbitmq", "");
    let mut c = actor("c");
    step(&up, &mut c).await;
    assert!(!warned(&up.cluster.take_log()));
}

#[tokio::test]
async fn a_deleted_secret_is_issued_again_at_a_higher_version() {
    let r = reconciler(ClusterConfig::default());
    let mut a = actor("a");
    step(&r, &mut a).await;
    let (before, _) = identity(&r);
    r.cluster
        .world()
        .objects
        .remove(&key(ObjectKind::Secret, "n", "asya-broker-rabbitmq"));
    recheck_passed(&r);
    step(&r, &mut a).await;
    let (after, _) = identity(&r);
    assert_ne!(after.password, before.password);
    assert!(after.version >= before.version);
    assert_eq!(
        r.cluster.world().users["asya-ns-n"].0,
        after.password.unwrap()
    );
}
