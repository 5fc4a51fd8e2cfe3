//! kube-rs reflector caches for what admission reads: AsyncActors, Flavors, flavor
//! ConfigMaps, and Crossplane EnvironmentConfigs when that CRD exists. Admission reads only
//! these; it never calls the API server.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use asya_api::flavor::{FlavorCatalog, FlavorDef, FlavorSource};
use asya_api::labels;
use asya_api::types::Flavor;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;
use tokio::sync::Notify;

use crate::admission::ActorLookup;
use crate::server::Shared;

fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

pub fn actor_resource() -> ApiResource {
    ar("asya.sh", "v1alpha1", "AsyncActor", "asyncactors")
}
pub fn flavor_resource() -> ApiResource {
    ar("asya.sh", "v1alpha1", "Flavor", "flavors")
}
pub fn environment_config_resource() -> ApiResource {
    ar(
        "apiextensions.crossplane.io",
        "v1beta1",
        "EnvironmentConfig",
        "environmentconfigs",
    )
}

/// AsyncActors from the reflector store.
pub struct ActorStore(pub Store<DynamicObject>);

impl ActorLookup for ActorStore {
    fn get(&self, namespace: &str, name: &str) -> Option<Value> {
        let r = ObjectRef::new_with(name, actor_resource()).within(namespace);
        self.0
            .get(&r)
            .and_then(|o| serde_json::to_value(o.as_ref()).ok())
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

/// Handles to the running caches.
pub struct Caches {
    pub actors: Store<DynamicObject>,
    pub flavors: Store<DynamicObject>,
    pub config_maps: Store<ConfigMap>,
    pub env_configs: Option<Store<DynamicObject>>,
}

impl Caches {
    pub fn sizes(&self) -> Vec<(&'static str, i64)> {
        let mut v = vec![
            ("AsyncActor", self.actors.state().len() as i64),
            ("Flavor", self.flavors.state().len() as i64),
            ("ConfigMap", self.config_maps.state().len() as i64),
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
    K::DynamicType: Clone + Eq + std::hash::Hash + Default,
{
    tokio::spawn(async move {
        let stream = reflector::reflector(writer, watcher(api, cfg))
            .default_backoff()
            .applied_objects();
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
    tokio::spawn(async move {
        let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
            .default_backoff()
            .touched_objects();
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
    let actors = spawn_dynamic(&client, actor_resource(), None, "AsyncActor");
    let flavors = spawn_dynamic(&client, flavor_resource(), Some(changed.clone()), "Flavor");
    let (cm_reader, cm_writer) = reflector::store::<ConfigMap>();
    spawn_reflector(
        Api::<ConfigMap>::all(client.clone()),
        watcher::Config::default().labels(labels::FLAVOR),
        cm_writer,
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
        flavors,
        config_maps: cm_reader,
        env_configs,
    };
    let rebuild = Caches {
        actors: caches.actors.clone(),
        flavors: caches.flavors.clone(),
        config_maps: caches.config_maps.clone(),
        env_configs: caches.env_configs.clone(),
    };
    tokio::spawn(async move {
        let waits = async {
            let _ = rebuild.actors.wait_until_ready().await;
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
