//! The write port's contract, one suite run on the in-memory fake (which every reconcile
//! test relies on) and on [`crate::kube_cluster::KubeCluster`] against the test cluster's API
//! server: a promise the fake makes that the API server does not keep fails here, not in
//! production. As `gateway/src/store/conformance.rs` does for the gateway's two backends.
//!
//! What the reconcile relies on: a creation never lands on a held name (409, which the
//! reconcile answers by reading the holder); an update names the object it means (uid) and
//! is refused over another (422 Invalid, "metadata.uid: field is immutable": a failed
//! reconcile, retried with fresh caches); a delete with a uid never
//! removes a same-named successor and says "not deleted" for it; only our labelled Secrets
//! are deleted by `delete_owned_secret`; a QueueClaim is created once and deleted only by
//! the uid that was read. What the background loops rely on ([`Platform`]): a namespace is
//! read as it is now, the provisioner's ConfigMap holds exactly the data last applied, and a
//! ClusterTriggerAuthentication is applied and read back.

use std::collections::BTreeMap;

use asya_api::queue_claim::{QueueClaim, QueueClaimSpec};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::ownership::Write;
use super::{Object, Platform, Writes};
use crate::model::ObjectKind;
use crate::render::workload::MANAGED_BY;

fn secret(ns: &str, name: &str, value: &str, ours: bool) -> Object {
    let labels = ours.then(|| BTreeMap::from([(MANAGED_BY.0.into(), MANAGED_BY.1.into())]));
    Object::Secret(Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels,
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "k".to_string(),
            ByteString(value.as_bytes().to_vec()),
        )])),
        ..Default::default()
    })
}

fn is_conflict(r: &Result<impl std::fmt::Debug, kube::Error>) -> bool {
    matches!(r, Err(kube::Error::Api(s)) if s.code == 409)
}

async fn value_of<C: Writes>(c: &C, ns: &str, name: &str) -> Option<String> {
    let s = c.read_secret(ns, name).await.expect("read Secret")?;
    let v = s.data?.get("k")?.0.clone();
    Some(String::from_utf8(v).expect("utf-8 value"))
}

/// The suite. `ns`: an existing namespace of its own; `suffix` keeps the cluster-scoped
/// QueueClaim's name apart from other runs'.
pub async fn run<C: Writes>(c: &C, ns: &str, suffix: &str) {
    // A creation lands on an absent name only.
    let s = secret(ns, "conformance", "one", true);
    c.apply(ns, &s, &Write::Create).await.expect("create");
    let meta = c
        .metadata(ObjectKind::Secret, ns, "conformance")
        .await
        .expect("metadata")
        .expect("created");
    let uid = meta.uid.clone().expect("a uid");
    assert!(super::ownership::managed_by_us(&meta), "{meta:?}");
    let again = c.apply(ns, &s, &Write::Create).await;
    assert!(is_conflict(&again), "a second creation: {again:?}");
    assert_eq!(value_of(c, ns, "conformance").await.as_deref(), Some("one"));

    // An update names its object.
    let two = secret(ns, "conformance", "two", true);
    let wrong = Write::Update {
        uid: Some("00000000-0000-0000-0000-000000000000".into()),
    };
    let refused = c.apply(ns, &two, &wrong).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 422),
        "an update over another uid: {refused:?}"
    );
    assert_eq!(value_of(c, ns, "conformance").await.as_deref(), Some("one"));
    let right = Write::Update {
        uid: Some(uid.clone()),
    };
    c.apply(ns, &two, &right).await.expect("update");
    assert_eq!(value_of(c, ns, "conformance").await.as_deref(), Some("two"));

    // A delete with a uid removes that object only.
    let other = "00000000-0000-0000-0000-000000000001";
    let kept = c
        .delete(ObjectKind::Secret, ns, "conformance", Some(other))
        .await;
    assert!(!kept.expect("delete of a replaced object"));
    assert_eq!(value_of(c, ns, "conformance").await.as_deref(), Some("two"));
    let gone = c
        .delete(ObjectKind::Secret, ns, "conformance", Some(&uid))
        .await;
    assert!(gone.expect("delete"));
    let absent = c
        .delete(ObjectKind::Secret, ns, "conformance", Some(&uid))
        .await;
    assert!(!absent.expect("delete of an absent object"));
    assert_eq!(value_of(c, ns, "conformance").await, None);

    // Only our Secrets go by delete_owned_secret.
    let foreign = secret(ns, "not-ours", "x", false);
    c.apply(ns, &foreign, &Write::Create).await.expect("create");
    assert!(!c.delete_owned_secret(ns, "not-ours").await.expect("delete"));
    assert_eq!(value_of(c, ns, "not-ours").await.as_deref(), Some("x"));
    let ours = secret(ns, "ours", "y", true);
    c.apply(ns, &ours, &Write::Create).await.expect("create");
    assert!(c.delete_owned_secret(ns, "ours").await.expect("delete"));
    assert_eq!(value_of(c, ns, "ours").await, None);
    assert!(!c.delete_owned_secret(ns, "ours").await.expect("absent"));

    // A QueueClaim: created once, deleted only by the uid read.
    let name = format!("asya-{ns}-conformance-{suffix}");
    let claim = QueueClaim::new(
        &name,
        QueueClaimSpec {
            namespace: ns.into(),
            namespace_uid: c.namespace_uid(ns).await.expect("uid").unwrap_or_default(),
            actor: "conformance".into(),
            transport: Some("rabbitmq".into()),
        },
    );
    assert!(
        claim.spec.namespace_uid.len() > 1,
        "the namespace has a uid"
    );
    assert!(c.claim_create(&claim).await.expect("create claim"));
    assert!(!c.claim_create(&claim).await.expect("second create"));
    let held = c.claim_get(&name).await.expect("get").expect("held");
    assert_eq!(held.spec, claim.spec);
    let held_uid = held.metadata.uid.clone().expect("a uid");
    assert!(
        !c.claim_delete(&name, other)
            .await
            .expect("delete by another uid")
    );
    assert!(c.claim_get(&name).await.expect("get").is_some());
    assert!(c.claim_delete(&name, &held_uid).await.expect("delete"));
    assert!(c.claim_get(&name).await.expect("get").is_none());
}

/// The [`Platform`] port's suite: `ns` an existing namespace (and, for `KubeCluster`, the
/// provisioner's namespace whose ConfigMaps it writes).
pub async fn run_platform<C: Writes + Platform>(c: &C, ns: &str, suffix: &str) {
    // A namespace as the API server has it now; an absent one is none.
    let now = c
        .namespace_now(ns)
        .await
        .expect("namespace")
        .expect("exists");
    assert!(!now.terminating, "{now:?}");
    let uid = c.namespace_uid(ns).await.expect("uid").expect("exists");
    assert_eq!(now.uid, uid);
    let absent = format!("conformance-absent-{suffix}");
    assert_eq!(c.namespace_now(&absent).await.expect("absent"), None);

    // The provisioner's ConfigMap holds exactly the data last applied: a key no longer
    // named goes (the end queue sweep relies on it to forget a queue).
    let name = format!("conformance-{suffix}");
    assert_eq!(c.own_config_map(&name).await.expect("read"), None);
    let data = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let manager = "asya-conformance";
    let first = data(&[("a", "1"), ("b", "2")]);
    c.own_config_map_apply(&name, manager, &first)
        .await
        .expect("apply");
    assert_eq!(c.own_config_map(&name).await.expect("read"), Some(first));
    let second = data(&[("b", "2"), ("c", "3")]);
    c.own_config_map_apply(&name, manager, &second)
        .await
        .expect("apply");
    assert_eq!(c.own_config_map(&name).await.expect("read"), Some(second));
    c.own_config_map_apply(&name, manager, &BTreeMap::new())
        .await
        .expect("apply");
    assert_eq!(
        c.own_config_map(&name).await.expect("read"),
        Some(BTreeMap::new())
    );

    // KEDA's ClusterTriggerAuthentication, cluster-scoped, applied and read back.
    let cta_name = format!("asya-conformance-{suffix}");
    assert_eq!(
        c.cluster_trigger_authentication(&cta_name)
            .await
            .expect("read"),
        None
    );
    let cta = |secret: &str| {
        serde_json::json!({
            "apiVersion": "keda.sh/v1alpha1",
            "kind": "ClusterTriggerAuthentication",
            "metadata": {"name": cta_name, "labels": {"asya.sh/test": "conformance"}},
            "spec": {"secretTargetRef": [{"parameter": "host", "name": secret, "key": "host"}]},
        })
    };
    for secret in ["one", "two"] {
        c.cluster_trigger_authentication_apply(&cta(secret))
            .await
            .expect("apply");
        let stored = c
            .cluster_trigger_authentication(&cta_name)
            .await
            .expect("read")
            .expect("stored");
        assert_eq!(
            stored.pointer("/spec/secretTargetRef/0/name"),
            Some(&serde_json::json!(secret)),
            "{stored}"
        );
    }
}

#[tokio::test]
async fn the_fake_keeps_the_write_contract() {
    let fake = super::fake::Fake::default();
    // The fake's namespaces all exist unless marked gone; the API server has none by that name.
    fake.world()
        .namespaces
        .insert("conformance-absent-fake".into(), None);
    run(&fake, "n", "fake").await;
    run_platform(&fake, "n", "fake").await;
}

#[path = "../../../tests/services/require.rs"]
#[allow(dead_code, clippy::all)]
mod require;

/// The QueueClaim CRD, as the chart installs it, when the API server lacks it (`make unit`
/// runs before the chart is installed); waits until it is served.
async fn ensure_claim_crd(client: &kube::Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::CustomResourceExt;
    use kube::api::{Api, PostParams};
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = QueueClaim::crd();
    let name = crd.metadata.name.clone().unwrap_or_default();
    if crds.get_opt(&name).await.expect("read CRD").is_none() {
        match crds.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            // Another test binary made it meanwhile.
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("creating CRD {name}: {e}"),
        }
    }
    let established = |c: &CustomResourceDefinition| {
        c.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            })
    };
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let c = crds.get(&name).await.expect("read CRD");
        if established(&c) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "CRD {name} not established after 30 s: {:?}",
            c.status
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The same suite on the test cluster's API server, in a namespace of its own (labelled, so
/// one a failed run left is removed by the next).
#[tokio::test]
async fn kube_cluster_keeps_the_write_contract() {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::Api;
    use kube::api::{DeleteParams, ListParams, PostParams};
    const LABEL: &str = "asya.sh/test";
    if !require::cluster() {
        return;
    }
    let path = std::env::var("ASYA_TEST_KUBECONFIG").expect("checked above");
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("kubeconfig usable");
    let client = kube::Client::try_from(config).expect("client");
    ensure_claim_crd(&client).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let selector = ListParams::default().labels(&format!("{LABEL}=conformance"));
    for old in namespaces.list(&selector).await.expect("list namespaces") {
        let _ = namespaces
            .delete(
                &old.metadata.name.unwrap_or_default(),
                &DeleteParams::default(),
            )
            .await;
    }
    let ctas: Api<kube::api::DynamicObject> = Api::all_with(
        client.clone(),
        &crate::keda_identity::io::cluster_trigger_auth_resource(),
    );
    for old in ctas
        .list(&selector)
        .await
        .expect("list ClusterTriggerAuthentications")
    {
        let _ = ctas
            .delete(
                &old.metadata.name.unwrap_or_default(),
                &DeleteParams::default(),
            )
            .await;
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let suffix = format!("{:x}{:x}", std::process::id(), nanos);
    let ns = format!("conformance-{suffix}");
    let n = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.clone()),
            labels: Some(BTreeMap::from([(LABEL.into(), "conformance".into())])),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces
        .create(&PostParams::default(), &n)
        .await
        .expect("namespace");
    // The test's namespace stands for the provisioner's (its ConfigMaps go with it).
    let cluster = crate::kube_cluster::KubeCluster::with_empty_caches(
        client,
        std::sync::Arc::new(asya_api::config::ClusterConfig::default()),
        &ns,
    );
    run(&cluster, &ns, &suffix).await;
    run_platform(&cluster, &ns, &suffix).await;
    ctas.delete(
        &format!("asya-conformance-{suffix}"),
        &DeleteParams::default(),
    )
    .await
    .expect("ClusterTriggerAuthentication deleted");
    namespaces
        .delete(&ns, &DeleteParams::default())
        .await
        .expect("namespace deleted");
}
