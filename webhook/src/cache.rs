//! kube-rs reflector caches for what admission reads: AsyncActors, Flavors, flavor
//! ConfigMaps, QueueClaims, and Crossplane EnvironmentConfigs when that CRD exists. Admission
//! reads only these; it never calls the API server.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use asya_api::flavor::{
    FlavorCatalog, FlavorDef, FlavorMapGate, FlavorSource, environment_config_resource,
};
use asya_api::labels;
use asya_api::queue_claim::{QueueClaim, QueueClaimSpec};
use asya_api::types::Flavor;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;
use serde_json::value::RawValue;
use std::borrow::Cow;
use tokio::sync::Notify;

use crate::admission::ActorLookup;
use crate::admission::collision::Holder;
use crate::holders::HolderIndex;
use crate::server::Shared;
use std::collections::BTreeSet;

fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

pub fn actor_resource() -> ApiResource {
    ar("asya.sh", "v1alpha1", "AsyncActor", "asyncactors")
}
pub fn flavor_resource() -> ApiResource {
    ar("asya.sh", "v1alpha1", "Flavor", "flavors")
}

/// An AsyncActor as the cache keeps it: identity and the spec as compact JSON text. A
/// parsed `serde_json::Value` tree costs ~10 KiB per actor; the raw text ~1 KiB, parsed only
/// when a pod of that actor is admitted.
#[derive(Clone, Debug, serde::Deserialize, serde::Serialize)]
pub struct CachedActor {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<Box<RawValue>>,
}

impl kube::Resource for CachedActor {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;
    fn kind(_: &()) -> Cow<'_, str> {
        "AsyncActor".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "asya.sh".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1alpha1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "asyncactors".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl CachedActor {
    /// Keep only what admission reads: managedFields and the last-applied annotation (a
    /// second copy of the spec) dominate a stored object's size.
    pub fn slim(&mut self) {
        let m = &self.metadata;
        self.metadata = ObjectMeta {
            name: m.name.clone(),
            namespace: m.namespace.clone(),
            resource_version: m.resource_version.clone(),
            uid: m.uid.clone(),
            ..Default::default()
        };
    }

    /// The object as `review_actor` reads it.
    pub fn to_value(&self) -> Option<Value> {
        let spec: Value = match &self.spec {
            Some(raw) => serde_json::from_str(raw.get()).ok()?,
            None => Value::Null,
        };
        Some(serde_json::json!({
            "apiVersion": "asya.sh/v1alpha1",
            "kind": "AsyncActor",
            "metadata": {"name": self.metadata.name, "namespace": self.metadata.namespace},
            "spec": spec,
        }))
    }
}

/// AsyncActors from the reflector store, and their queue actors per namespace (fed by the
/// same watch events); the QueueClaims, by queue name.
pub struct ActorStore {
    pub store: Store<CachedActor>,
    pub holders: Arc<HolderIndex>,
    pub claims: Store<QueueClaim>,
}

/// What admission reads of a QueueClaim: its name (the queue's) and its spec (the owner).
/// Labels, annotations and managedFields are dropped.
pub fn slim_claim(c: &mut QueueClaim) {
    c.metadata = ObjectMeta {
        name: c.metadata.name.clone(),
        ..Default::default()
    };
}

/// An empty claim store (a lookup without claims: tests and the benchmark).
pub fn no_claims() -> Store<QueueClaim> {
    reflector::store::Writer::<QueueClaim>::default().as_reader()
}

impl ActorStore {
    fn cached(&self, namespace: &str, name: &str) -> Option<Arc<CachedActor>> {
        self.store
            .get(&ObjectRef::<CachedActor>::new(name).within(namespace))
    }
}

impl ActorLookup for ActorStore {
    fn get(&self, namespace: &str, name: &str) -> Option<Value> {
        self.cached(namespace, name).and_then(|o| o.to_value())
    }

    fn get_versioned(&self, namespace: &str, name: &str) -> Option<(Value, Option<String>)> {
        let o = self.cached(namespace, name)?;
        Some((o.to_value()?, o.metadata.resource_version.clone()))
    }

    fn version(&self, namespace: &str, name: &str) -> Option<String> {
        self.cached(namespace, name)?
            .metadata
            .resource_version
            .clone()
    }

    fn holders_in(&self, namespaces: &BTreeSet<String>) -> Vec<Holder> {
        self.holders.holders_in(namespaces)
    }

    fn claims_of(&self, queues: &BTreeSet<String>) -> Vec<(String, QueueClaimSpec)> {
        queues
            .iter()
            .filter_map(|q| {
                let c = self.claims.get(&ObjectRef::new(q))?;
                Some((q.clone(), c.spec.clone()))
            })
            .collect()
    }
}

/// The flavor catalog from the three sources (pure).
pub fn build_catalog(
    flavors: &[Arc<DynamicObject>],
    config_maps: &[Arc<ConfigMap>],
    env_configs: &[Arc<DynamicObject>],
) -> FlavorCatalog {
    let mut c = FlavorCatalog::new();
    // EnvironmentConfigs first: `insert` lets a native Flavor shadow them either way.
    for e in env_configs {
        if let Some(def) = serde_json::to_value(e.as_ref())
            .ok()
            .and_then(|v| FlavorDef::from_environment_config(&v))
        {
            c.insert(def);
        }
    }
    for f in flavors {
        let name = f.metadata.name.clone().unwrap_or_default();
        let def = match serde_json::to_value(f.as_ref()).and_then(serde_json::from_value::<Flavor>)
        {
            Ok(typed) => FlavorDef::from_flavor(&typed),
            Err(e) => {
                let mut d = FlavorDef::from_data(&name, FlavorSource::Flavor, &Value::Null);
                d.problem = Some(format!("Flavor {name:?} does not parse: {e}"));
                d
            }
        };
        c.insert(def);
    }
    for cm in config_maps {
        if let Some(def) = FlavorDef::from_config_map(cm) {
            c.insert(def);
        }
    }
    c
}

/// Passes a flavor ConfigMap watch event through the gate, which slims the object and drops
/// a flavor over the bounds (a fresh list frees every place).
pub fn bound_flavor_map(
    gate: &mut FlavorMapGate,
    ev: watcher::Event<ConfigMap>,
) -> watcher::Event<ConfigMap> {
    match ev {
        watcher::Event::Init => {
            gate.restart();
            watcher::Event::Init
        }
        watcher::Event::InitApply(mut cm) => {
            gate.applied(&mut cm);
            watcher::Event::InitApply(cm)
        }
        watcher::Event::Apply(mut cm) => {
            gate.applied(&mut cm);
            watcher::Event::Apply(cm)
        }
        watcher::Event::Delete(mut cm) => {
            gate.deleted(&mut cm);
            watcher::Event::Delete(cm)
        }
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// Handles to the running caches.
pub struct Caches {
    pub actors: Store<CachedActor>,
    pub holders: Arc<HolderIndex>,
    pub claims: Store<QueueClaim>,
    pub flavors: Store<DynamicObject>,
    pub config_maps: Store<ConfigMap>,
    pub env_configs: Option<Store<DynamicObject>>,
}

impl Caches {
    /// What admission reads of the AsyncActors.
    pub fn actor_store(&self) -> ActorStore {
        ActorStore {
            store: self.actors.clone(),
            holders: self.holders.clone(),
            claims: self.claims.clone(),
        }
    }

    pub fn sizes(&self) -> Vec<(&'static str, i64)> {
        let mut v = vec![
            ("AsyncActor", self.actors.state().len() as i64),
            ("Flavor", self.flavors.state().len() as i64),
            ("ConfigMap", self.config_maps.state().len() as i64),
            ("QueueClaim", self.claims.state().len() as i64),
        ];
        if let Some(e) = &self.env_configs {
            v.push(("EnvironmentConfig", e.state().len() as i64));
        }
        v
    }

    fn catalog(&self) -> FlavorCatalog {
        let env = self
            .env_configs
            .as_ref()
            .map(|s| s.state())
            .unwrap_or_default();
        build_catalog(&self.flavors.state(), &self.config_maps.state(), &env)
    }
}

fn spawn_reflector<K>(
    api: Api<K>,
    cfg: watcher::Config,
    writer: reflector::store::Writer<K>,
    changed: Option<Arc<Notify>>,
    what: &'static str,
) where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    drive(
        // Flavors and EnvironmentConfigs: kept without managed fields and last-applied copies.
        reflector::reflector(
            writer,
            watcher(api, cfg).modify(|o| asya_api::labels::drop_bookkeeping(o.meta_mut())),
        )
        .default_backoff()
        .touched_objects(),
        changed,
        what,
    );
}

/// Runs a reflector's stream: each change (deletions included, so a deleted flavor leaves
/// the catalog) wakes `changed`; watch errors are logged and retried by the backoff.
fn drive<S, T>(stream: S, changed: Option<Arc<Notify>>, what: &'static str)
where
    S: futures::Stream<Item = Result<T, watcher::Error>> + Send + 'static,
    T: Send,
{
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(_) => {
                    if let Some(n) = &changed {
                        n.notify_one();
                    }
                }
                Err(e) => tracing::warn!(cache = what, error = %e, "watch error (retrying)"),
            }
        }
    });
}

/// A dynamic-object reflector (the store's dynamic type is the ApiResource).
fn spawn_dynamic(
    client: &kube::Client,
    resource: ApiResource,
    changed: Option<Arc<Notify>>,
    what: &'static str,
) -> Store<DynamicObject> {
    let writer = reflector::store::Writer::<DynamicObject>::new(resource.clone());
    let reader = writer.as_reader();
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    spawn_reflector(api, watcher::Config::default(), writer, changed, what);
    reader
}

/// Whether the cluster serves a resource (used for the optional EnvironmentConfig CRD).
async fn served(client: &kube::Client, resource: &ApiResource) -> bool {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), resource);
    api.list_metadata(&kube::api::ListParams::default().limit(1))
        .await
        .is_ok()
}

/// Start the caches, keep `shared`'s flavor catalog current, and mark `shared` synced once
/// every cache has its initial list.
pub async fn start(client: kube::Client, shared: Arc<Shared>) -> Caches {
    let changed = Arc::new(Notify::new());
    let client_for_actors = client.clone();
    let (actors, actor_writer) = reflector::store::<CachedActor>();
    let holders = Arc::new(HolderIndex::default());
    let index = holders.clone();
    drive(
        reflector::reflector(
            actor_writer,
            watcher(
                Api::<CachedActor>::all(client_for_actors),
                watcher::Config::default(),
            )
            .modify(CachedActor::slim),
        )
        .inspect_ok(move |ev| index.apply(ev))
        .default_backoff()
        .touched_objects(),
        None,
        "AsyncActor",
    );
    // The provisioner's record of each queue's owner (collision check): name and spec only.
    // Readiness waits for it; without its CRD that is never, and the log says why.
    if !served(&client, &ApiResource::erase::<QueueClaim>(&())).await {
        tracing::error!(
            "the QueueClaim CRD (queueclaims.asya.sh) is not installed: apply deploy/crds/ (kubectl apply --server-side -f deploy/crds/); not ready until it is"
        );
    }
    let (claims, claim_writer) = reflector::store::<QueueClaim>();
    drive(
        reflector::reflector(
            claim_writer,
            watcher(
                Api::<QueueClaim>::all(client.clone()),
                watcher::Config::default(),
            )
            .modify(slim_claim),
        )
        .default_backoff()
        .touched_objects(),
        None,
        "QueueClaim",
    );
    let flavors = spawn_dynamic(&client, flavor_resource(), Some(changed.clone()), "Flavor");
    let (cm_reader, cm_writer) = reflector::store::<ConfigMap>();
    // Any namespace can label a ConfigMap: the store keeps only the flavor key, within the
    // size and count bounds (asya_api::flavor::bounds).
    let mut gate = FlavorMapGate::new(shared.config.flavor_limits.clone());
    drive(
        reflector::reflector(
            cm_writer,
            watcher(
                Api::<ConfigMap>::all(client.clone()),
                watcher::Config::default().labels(labels::FLAVOR),
            )
            .map_ok(move |ev| bound_flavor_map(&mut gate, ev)),
        )
        .default_backoff()
        .touched_objects(),
        Some(changed.clone()),
        "ConfigMap",
    );
    let env_res = environment_config_resource();
    let env_configs = if served(&client, &env_res).await {
        tracing::info!("EnvironmentConfig CRD found: reading Crossplane flavors");
        Some(spawn_dynamic(
            &client,
            env_res,
            Some(changed.clone()),
            "EnvironmentConfig",
        ))
    } else {
        None
    };
    let caches = Caches {
        actors,
        holders,
        claims,
        flavors,
        config_maps: cm_reader,
        env_configs,
    };
    let rebuild = Caches {
        actors: caches.actors.clone(),
        holders: caches.holders.clone(),
        claims: caches.claims.clone(),
        flavors: caches.flavors.clone(),
        config_maps: caches.config_maps.clone(),
        env_configs: caches.env_configs.clone(),
    };
    tokio::spawn(async move {
        let waits = async {
            let _ = rebuild.actors.wait_until_ready().await;
            // Admission refuses by these claims: not ready before they are listed.
            let _ = rebuild.claims.wait_until_ready().await;
            let _ = rebuild.flavors.wait_until_ready().await;
            let _ = rebuild.config_maps.wait_until_ready().await;
            if let Some(e) = &rebuild.env_configs {
                let _ = e.wait_until_ready().await;
            }
        };
        waits.await;
        shared.set_catalog(rebuild.catalog());
        shared.synced.store(true, Ordering::Release);
        tracing::info!(sizes = ?rebuild.sizes(), "caches synced");
        loop {
            changed.notified().await;
            // Rebuilding is cheap (flavors are few); one rebuild per burst of events.
            shared.set_catalog(rebuild.catalog());
        }
    });
    caches
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cached_actor_keeps_identity_and_spec_only() {
        let text = serde_json::to_string(&json!({
            "apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
            "metadata": {"name": "echo", "namespace": "ns", "resourceVersion": "7",
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...big...}"},
                         "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"image": "i", "handler": "m.f", "scaling": {"minReplicaCount": 1}},
            "status": {"phase": "Running"}
        }))
        .unwrap();
        let mut a: CachedActor = serde_json::from_str(&text).unwrap();
        a.slim();
        assert!(a.metadata.managed_fields.is_none() && a.metadata.annotations.is_none());
        assert_eq!(a.metadata.resource_version.as_deref(), Some("7"));
        let v = a.to_value().unwrap();
        assert_eq!(
            v["spec"],
            json!({"image": "i", "handler": "m.f", "scaling": {"minReplicaCount": 1}})
        );
        assert_eq!(v["metadata"], json!({"name": "echo", "namespace": "ns"}));
        assert!(v.get("status").is_none());

        let mut w = reflector::store::Writer::<CachedActor>::new(());
        w.apply_watcher_event(&watcher::Event::Apply(a));
        let store = ActorStore {
            store: w.as_reader(),
            holders: Default::default(),
            claims: no_claims(),
        };
        assert!(store.get("ns", "echo").is_some());
        assert!(store.get("other", "echo").is_none());
    }

    #[test]
    fn the_flavor_map_store_holds_only_the_flavor_key_within_the_bounds() {
        let cm = |name: &str, flavor: &str| -> ConfigMap {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "team-a",
                             "labels": {"asya.sh/flavor": name},
                             "managedFields": [{"manager": "kubectl"}]},
                "data": {"flavor.yaml": flavor, "notes.txt": "x".repeat(50_000)},
                "binaryData": {"blob": "AAAA"}
            }))
            .unwrap()
        };
        let limits = asya_api::config::FlavorLimits {
            max_bytes: 64,
            max_per_namespace: 1,
            max_total: 10,
        };
        let mut gate = FlavorMapGate::new(limits);
        let mut w = reflector::store::Writer::<ConfigMap>::new(());
        for ev in [
            watcher::Event::Init,
            watcher::Event::InitApply(cm("gpu", "nodeSelector:\n  gpu: a100\n")),
            watcher::Event::InitApply(cm("big", &"y".repeat(65))),
            watcher::Event::InitApply(cm("more", "env: []\n")),
            watcher::Event::InitDone,
        ] {
            w.apply_watcher_event(&bound_flavor_map(&mut gate, ev));
        }
        let store = w.as_reader();
        let get = |n: &str| store.get(&ObjectRef::new(n).within("team-a")).unwrap();
        let gpu = get("gpu");
        assert_eq!(
            gpu.data.as_ref().unwrap().keys().collect::<Vec<_>>(),
            ["flavor.yaml"]
        );
        assert!(gpu.binary_data.is_none() && gpu.metadata.managed_fields.is_none());
        for n in ["big", "more"] {
            assert!(get(n).data.is_none(), "{n} keeps no data");
        }
        let c = build_catalog(&[], &store.state(), &[]);
        assert_eq!(
            c.get("team-a", "gpu").unwrap().data["nodeSelector"],
            json!({"gpu": "a100"})
        );
        let problem = |n: &str| c.get("team-a", n).unwrap().problem.clone().unwrap();
        assert!(problem("big").starts_with("flavor.yaml is 65 bytes, over the limit of 64"));
        assert!(problem("more").contains("flavorLimits.maxPerNamespace"));
        // Deleting the admitted one frees its place for the next change of another.
        let gone = watcher::Event::Delete(cm("gpu", ""));
        w.apply_watcher_event(&bound_flavor_map(&mut gate, gone));
        let changed = watcher::Event::Apply(cm("more", "env: []\n"));
        w.apply_watcher_event(&bound_flavor_map(&mut gate, changed));
        assert!(get("more").data.is_some());
    }

    #[test]
    fn holders_are_the_actors_of_the_namespaces_asked_with_their_queue_actor() {
        let mut w = reflector::store::Writer::<CachedActor>::new(());
        let holders = Arc::new(HolderIndex::default());
        for (ns, name, spec) in [
            ("team", "a-x", json!({"image": "i", "handler": "m.f"})),
            ("team", "renamed", json!({"actor": "shared", "image": "i"})),
            ("other", "a-x", json!({"image": "i"})),
        ] {
            let a: CachedActor = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": ns}, "spec": spec
            }))
            .unwrap();
            let ev = watcher::Event::Apply(a);
            w.apply_watcher_event(&ev);
            holders.apply(&ev);
        }
        let store = ActorStore {
            store: w.as_reader(),
            holders,
            claims: no_claims(),
        };
        let mut got = store.holders_in(&BTreeSet::from(["team".to_string(), "none".to_string()]));
        got.sort_by(|a, b| a.name.cmp(&b.name));
        let h = |ns: &str, name: &str, actor: &str| Holder {
            namespace: ns.into(),
            name: name.into(),
            actor: actor.into(),
        };
        assert_eq!(
            got,
            vec![h("team", "a-x", "a-x"), h("team", "renamed", "shared")]
        );
    }

    #[test]
    fn claims_are_kept_as_name_and_owner_and_read_by_queue_name() {
        let mut c: QueueClaim = serde_json::from_value(json!({
            "apiVersion": "asya.sh/v1alpha1", "kind": "QueueClaim",
            "metadata": {"name": "asya-team-a-x-sink", "uid": "u", "resourceVersion": "3",
                         "labels": {"app.kubernetes.io/managed-by": "asya-queue-provisioner"},
                         "managedFields": [{"manager": "asya-queue-provisioner"}]},
            "spec": {"namespace": "team-a", "namespaceUid": "u1", "actor": "x-sink",
                     "transport": "rabbitmq"}
        }))
        .unwrap();
        slim_claim(&mut c);
        assert_eq!(
            serde_json::to_value(&c.metadata).unwrap(),
            json!({"name": "asya-team-a-x-sink"})
        );
        let mut w = reflector::store::Writer::<QueueClaim>::default();
        w.apply_watcher_event(&watcher::Event::Apply(c));
        let store = ActorStore {
            store: reflector::store::Writer::<CachedActor>::new(()).as_reader(),
            holders: Default::default(),
            claims: w.as_reader(),
        };
        let asked = BTreeSet::from([
            "asya-team-a-x-sink".to_string(),
            "asya-team-a-x-sump".to_string(),
        ]);
        let got = store.claims_of(&asked);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, "asya-team-a-x-sink");
        assert_eq!(
            (got[0].1.namespace.as_str(), got[0].1.actor.as_str()),
            ("team-a", "x-sink")
        );
    }

    #[test]
    fn catalog_from_all_sources_with_namespaced_shadowing() {
        let flavor: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "asya.sh/v1alpha1", "kind": "Flavor",
            "metadata": {"name": "gpu-t4"}, "spec": {"nodeSelector": {"gpu": "t4"}}
        }))
        .unwrap();
        let env: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "apiextensions.crossplane.io/v1beta1", "kind": "EnvironmentConfig",
            "metadata": {"name": "legacy-flavor", "labels": {"asya.sh/flavor": "legacy-flavor"}},
            "data": {"scaling": {"maxReplicaCount": 3}}
        }))
        .unwrap();
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "f", "namespace": "team-a", "labels": {"asya.sh/flavor": "gpu-t4"}},
            "data": {"flavor.yaml": "nodeSelector:\n  gpu: a100\n"}
        }))
        .unwrap();
        let c = build_catalog(&[Arc::new(flavor)], &[Arc::new(cm)], &[Arc::new(env)]);
        assert_eq!(c.len(), 3);
        assert_eq!(
            c.get("team-b", "gpu-t4").unwrap().data["nodeSelector"],
            json!({"gpu": "t4"})
        );
        assert_eq!(
            c.get("team-a", "gpu-t4").unwrap().data["nodeSelector"],
            json!({"gpu": "a100"})
        );
        assert!(c.get("x", "legacy-flavor").is_some());
    }
}
