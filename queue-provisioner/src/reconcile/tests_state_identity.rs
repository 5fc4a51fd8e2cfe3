//! The state identity step against the in-memory [`Fake`] (docs/DESIGN.md §9): a namespace's
//! Redis user before the workload, only for actors on the platform's Redis, the owner mark
//! against a namespace made again, rotation, removal with the last actor.

use asya_api::AsyncActor;
use asya_api::config::{ClusterConfig, PlatformRedis, SecretKeySelector};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use super::Reconciler;
use super::fake::{Fake, key};
use super::tests_identity::{at, reconciler, step};
use crate::broker_identity::plan::{ROTATE_ANNOTATION, SecretView};
use crate::model::ObjectKind;
use crate::state_identity::plan::VERSION_ANNOTATION;

fn config() -> ClusterConfig {
    let mut cfg = ClusterConfig::default();
    cfg.state_proxy.redis = Some(PlatformRedis {
        url: "redis://redis.asya:6379".into(),
        admin_username: "default".into(),
        admin_password_secret_ref: SecretKeySelector {
            name: "redis-admin".into(),
            key: "password".into(),
        },
    });
    cfg
}

/// An actor with a Redis state proxy on the platform's Redis (no REDIS_URL), or an S3 one.
fn actor(name: &str, connector: &str) -> AsyncActor {
    serde_json::from_value(json!({
        "apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
        "metadata": {"name": name, "namespace": "n", "uid": format!("uid-{name}"), "generation": 1},
        "spec": {"image": "py:3.12", "handler": "m.f", "stateProxy": [{
            "name": "cache", "mount": {"path": "/state/cache"},
            "connector": {"image": "asya-state-proxy",
                          "env": [{"name": "ASYA_CONNECTOR", "value": connector},
                                  {"name": "STATE_BUCKET", "value": "b"}]}}]}
    }))
    .expect("actor fixture")
}

fn state_secret(r: &Reconciler<Fake>) -> Option<SecretView> {
    let w = r.cluster.world();
    let s = w
        .objects
        .get(&key(ObjectKind::Secret, "n", "asya-state-redis"))?;
    let secret: Secret = serde_json::from_value(s.body.clone()).unwrap();
    Some(SecretView::read(&secret, VERSION_ANNOTATION))
}

fn template_version(r: &Reconciler<Fake>, name: &str) -> Value {
    let w = r.cluster.world();
    w.objects[&key(ObjectKind::Deployment, "n", name)].body["spec"]["template"]["metadata"]
        ["annotations"][VERSION_ANNOTATION]
        .clone()
}

fn recheck_passed(r: &Reconciler<Fake>) {
    let k = super::state_identity::MEMORY_KEY;
    let mut set = r.memory.identity(k, "n").expect("identity set");
    set.at = std::time::Instant::now() - super::memory::RECHECK;
    r.memory.record_identity(k, "n", set);
}

#[tokio::test]
async fn a_redis_actor_gets_its_namespace_user_and_secret_before_its_workload() {
    let r = reconciler(config());
    let mut a = actor("a", "redis-buffered-cas");
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    let order = [
        "mark redis state n as uid-ns-n",
        "put redis user asya-ns-n",
        "apply Secret n/asya-state-redis",
        "apply Deployment n/a",
    ];
    let idx: Vec<usize> = order.iter().map(|p| at(&log, p)).collect();
    assert!(idx.windows(2).all(|w| w[0] < w[1]), "{log:#?}");
    let view = state_secret(&r).expect("the namespace's Redis Secret");
    assert_eq!(view.username.as_deref(), Some("asya-ns-n"));
    let password = view.password.clone().unwrap();
    let users = r.cluster.world().redis_users.clone();
    let (set, rules) = &users["asya-ns-n"];
    assert_eq!(set, &password, "Redis knows the Secret's password");
    assert!(rules.iter().any(|x| x == "~n/*"), "{rules:?}");
    assert_eq!(
        template_version(&r, "a"),
        json!(view.version.unwrap().to_string()),
        "the pod template carries the credential's version"
    );
    // The next reconcile trusts what it set; after RECHECK it asserts the user again with
    // the same password (a Redis restarted without its ACL file forgot it), no new Secret.
    step(&r, &mut a).await;
    assert!(
        !r.cluster
            .take_log()
            .iter()
            .any(|l| l.contains("redis") || l.contains("asya-state-redis")),
    );
    recheck_passed(&r);
    r.cluster.world().redis_users.clear();
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(
        log.iter().any(|l| l == "put redis user asya-ns-n"),
        "{log:#?}"
    );
    assert!(
        !log.iter().any(|l| l == "apply Secret n/asya-state-redis"),
        "{log:#?}"
    );
    assert_eq!(r.cluster.world().redis_users["asya-ns-n"].0, password);
}

#[tokio::test]
async fn actors_without_the_platform_redis_get_no_redis_user() {
    // An S3 connector, and a Redis connector while no platform Redis is configured.
    for (cfg, connector) in [
        (config(), "s3-buffered-lww"),
        (ClusterConfig::default(), "redis-buffered-cas"),
    ] {
        let r = reconciler(cfg);
        let mut a = actor("a", connector);
        step(&r, &mut a).await;
        let log = r.cluster.take_log();
        assert!(
            !log.iter()
                .any(|l| l.contains("redis user") || l.contains("mark redis")),
            "{log:#?}"
        );
        assert!(state_secret(&r).is_none());
    }
}

#[tokio::test]
async fn a_namespace_made_again_does_not_inherit_its_predecessors_state() {
    let r = reconciler(config());
    // The state under n/ is marked as an earlier namespace n's.
    r.cluster
        .world()
        .redis_owners
        .insert("n".into(), "uid-of-the-old-n".into());
    let mut a = actor("a", "redis-buffered-cas");
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(
        !log.iter().any(|l| l.starts_with("put redis user")),
        "{log:#?}"
    );
    assert!(
        !log.iter().any(|l| l.starts_with("apply Deployment")),
        "{log:#?}"
    );
    assert!(state_secret(&r).is_none());
    let warning = log
        .iter()
        .find(|l| l.starts_with("event Warning StateIdentity"))
        .unwrap_or_else(|| panic!("{log:#?}"));
    assert!(
        warning.contains("earlier namespace n (uid uid-of-the-old-n)")
            && warning.contains("asya:owner:n"),
        "{warning}"
    );
    let status = a.status.clone().unwrap();
    assert!(
        status.conditions.iter().any(|c| c.type_ == "WorkloadReady"
            && c.status == "False"
            && c.message.contains("earlier namespace")),
        "{status:?}"
    );
}

#[tokio::test]
async fn rotation_issues_a_new_password_and_rolls_the_pods() {
    let r = reconciler(config());
    let mut a = actor("a", "redis-buffered-cas");
    step(&r, &mut a).await;
    let before = state_secret(&r).unwrap();
    {
        let mut w = r.cluster.world();
        let k = key(ObjectKind::Secret, "n", "asya-state-redis");
        let s = w.objects.get_mut(&k).unwrap();
        s.body["metadata"]["annotations"][ROTATE_ANNOTATION] = json!("now");
    }
    recheck_passed(&r);
    r.cluster.take_log();
    step(&r, &mut a).await;
    let after = state_secret(&r).unwrap();
    assert_ne!(after.password, before.password);
    assert!(after.version > before.version);
    assert!(!after.rotate);
    assert_eq!(
        r.cluster.world().redis_users["asya-ns-n"].0,
        after.password.clone().unwrap()
    );
    assert_eq!(
        template_version(&r, "a"),
        json!(after.version.unwrap().to_string())
    );
    let log = r.cluster.take_log();
    assert!(
        log.iter()
            .any(|l| l.starts_with("event Normal StateCredentialIssued")),
        "{log:#?}"
    );
}

#[tokio::test]
async fn the_last_actor_takes_the_redis_user_and_secret_with_it() {
    let r = reconciler(config());
    let mut a = actor("a", "redis-buffered-cas");
    let mut b = actor("b", "s3-buffered-lww");
    step(&r, &mut a).await;
    step(&r, &mut b).await;
    r.cluster.take_log();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    a.metadata.deletion_timestamp = Some(now.clone());
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(
        !log.iter().any(|l| l.starts_with("delete redis user")),
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
        log.iter().any(|l| l == "delete redis user asya-ns-n"),
        "{log:#?}"
    );
    assert!(
        log.iter().any(|l| l == "delete Secret n/asya-state-redis"),
        "{log:#?}"
    );
    assert!(r.cluster.world().redis_users.is_empty());
    // The state stays marked as this namespace's.
    assert_eq!(r.cluster.world().redis_owners["n"], "uid-ns-n");
}

#[tokio::test]
async fn an_open_default_user_is_announced_on_the_actor() {
    let r = reconciler(config());
    r.cluster.world().redis_default_open = true;
    let mut a = actor("a", "redis-buffered-cas");
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(
        log.iter()
            .any(|l| l.starts_with("event Warning SharedStateCredentials")),
        "{log:#?}"
    );
}

#[tokio::test]
async fn an_unreachable_redis_holds_the_workload_and_says_why() {
    let r = reconciler(config());
    r.cluster.world().redis_up = false;
    let mut a = actor("a", "redis-buffered-cas");
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(
        !log.iter().any(|l| l.starts_with("apply Deployment")),
        "{log:#?}"
    );
    assert!(
        log.iter()
            .any(|l| l.starts_with("event Warning StateIdentity") && l.contains("unavailable")),
        "{log:#?}"
    );
    r.cluster.world().redis_up = true;
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(
        log.iter().any(|l| l.starts_with("apply Deployment n/a")),
        "{log:#?}"
    );
}

#[tokio::test]
async fn the_user_goes_even_when_the_namespace_deletion_took_its_secret_first() {
    let r = reconciler(config());
    let mut a = actor("a", "redis-buffered-cas");
    step(&r, &mut a).await;
    // The namespace is being deleted: its Secrets may go before the actors' finalizers run.
    r.cluster
        .world()
        .objects
        .remove(&key(ObjectKind::Secret, "n", "asya-state-redis"));
    r.cluster.take_log();
    a.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(
        log.iter().any(|l| l == "delete redis user asya-ns-n"),
        "{log:#?}"
    );
    assert!(r.cluster.world().redis_users.is_empty());
}
