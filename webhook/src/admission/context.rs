//! What admission reads besides the request: the configuration, snapshots of the caches,
//! and the memo of injection settings. No API calls.

use std::collections::{BTreeSet, HashMap};

use asya_api::config::ClusterConfig;
use asya_api::flavor::FlavorCatalog;
use asya_api::queue_claim::QueueClaimSpec;
use serde_json::Value;

use super::collision::Holder;
use crate::inject::ActorSettings;

/// AsyncActors by namespace and name, as the injection path needs them.
pub trait ActorLookup: Send + Sync {
    fn get(&self, namespace: &str, name: &str) -> Option<Value>;

    /// The object and its resourceVersion, read together; lookups that know versions
    /// enable [`SettingsMemo`].
    fn get_versioned(&self, namespace: &str, name: &str) -> Option<(Value, Option<String>)> {
        self.get(namespace, name).map(|v| (v, None))
    }

    /// The resourceVersion alone (cheap: nothing parsed), when known.
    fn version(&self, _namespace: &str, _name: &str) -> Option<String> {
        None
    }

    /// The AsyncActors of `namespaces`, each with the actor its queue is named after, for
    /// the queue collision check ([`super::collision`]). A lookup that cannot list answers
    /// none (nothing is refused).
    fn holders_in(&self, _namespaces: &BTreeSet<String>) -> Vec<Holder> {
        Vec::new()
    }

    /// The `QueueClaim`s of these queue names that exist, by queue name, for the same check
    /// ([`super::collision::find_claim_collision`]). A lookup without claims answers none.
    fn claims_of(&self, _queues: &BTreeSet<String>) -> Vec<(String, QueueClaimSpec)> {
        Vec::new()
    }

    /// How many AsyncActors `namespace` holds, for `policy.maxActorsPerNamespace`
    /// ([`super::limits`]). A lookup that cannot list counts none (nothing is refused).
    fn count_in(&self, namespace: &str) -> usize {
        self.holders_in(&BTreeSet::from([namespace.to_string()]))
            .len()
    }
}

impl ActorLookup for HashMap<(String, String), Value> {
    fn get(&self, namespace: &str, name: &str) -> Option<Value> {
        HashMap::get(self, &(namespace.to_string(), name.to_string())).cloned()
    }

    fn holders_in(&self, namespaces: &BTreeSet<String>) -> Vec<Holder> {
        self.iter()
            .filter(|((ns, _), _)| namespaces.contains(ns))
            .map(|((ns, name), v)| Holder {
                namespace: ns.clone(),
                name: name.clone(),
                actor: v
                    .pointer("/spec/actor")
                    .and_then(Value::as_str)
                    .unwrap_or(name)
                    .to_string(),
            })
            .collect()
    }
}

/// What admission reads: configuration and cache snapshots. No API calls.
pub struct Ctx<'a> {
    pub config: &'a ClusterConfig,
    pub catalog: &'a FlavorCatalog,
    pub actors: &'a dyn ActorLookup,
    /// Inject a native sidecar (init container with `restartPolicy: Always`).
    pub native_sidecar: bool,
    /// Injection settings already worked out, when the caller keeps them across requests.
    /// Only valid for one `config` (the server's never changes).
    pub memo: Option<&'a SettingsMemo>,
}

/// What [`super::settings_for_pod`] answers.
pub type PodSettings = Result<(ActorSettings, Vec<String>), (u16, String)>;

/// The answer of [`super::settings_for_pod`] for pods of an AsyncActor, kept per actor version and
/// flavor catalog: every replica and rollout of an actor asks the same question, and the
/// answer changes only with the AsyncActor (its resourceVersion) or the catalog (its id).
#[derive(Default)]
pub struct SettingsMemo {
    settings: std::sync::Mutex<HashMap<(String, String), MemoEntry>>,
    /// The containers injection adds, rendered once (they depend on the settings only).
    pub(super) rendered: crate::patch::RenderCache,
}

struct MemoEntry {
    version: String,
    catalog: u64,
    settings: PodSettings,
}

/// Bound on remembered actors; past it the memo starts over (each entry is ~1 KiB).
const MEMO_MAX: usize = 4096;

impl SettingsMemo {
    pub(super) fn get(
        &self,
        ns: &str,
        name: &str,
        version: &str,
        catalog: u64,
    ) -> Option<PodSettings> {
        let m = self.settings.lock().unwrap_or_else(|e| e.into_inner());
        m.get(&(ns.to_string(), name.to_string()))
            .filter(|e| e.version == version && e.catalog == catalog)
            .map(|e| e.settings.clone())
    }

    pub(super) fn put(
        &self,
        ns: &str,
        name: &str,
        version: String,
        catalog: u64,
        settings: &PodSettings,
    ) {
        let mut m = self.settings.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() >= MEMO_MAX {
            m.clear();
        }
        m.insert(
            (ns.to_string(), name.to_string()),
            MemoEntry {
                version,
                catalog,
                settings: settings.clone(),
            },
        );
    }

    pub fn len(&self) -> usize {
        self.settings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
