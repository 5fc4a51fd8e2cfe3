//! Every known flavor, and the memo of what each flavor list resolves to.

use std::collections::BTreeMap;

use super::resolve::{FlavorPart, flavor_part};
use super::{FlavorDef, FlavorSource, MAX_FLAVORS};
use crate::config::Policy;

/// Every known flavor: cluster-scoped ones by name, namespaced ones by namespace and name.
#[derive(Clone)]
pub struct FlavorCatalog {
    pub(super) cluster: BTreeMap<String, FlavorDef>,
    pub(super) namespaced: BTreeMap<String, BTreeMap<String, FlavorDef>>,
    /// Changes with every change of content (see [`FlavorCatalog::id`]).
    pub(super) id: u64,
    /// What [`resolve`] worked out from this content; not part of the catalog's value.
    pub(super) memo: ResolveMemo,
}

impl std::fmt::Debug for FlavorCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlavorCatalog")
            .field("cluster", &self.cluster)
            .field("namespaced", &self.namespaced)
            .field("id", &self.id)
            .finish()
    }
}

/// Longest flavor name kept in the memo: a Kubernetes object name (DNS subdomain).
pub(super) const MEMO_NAME_MAX: usize = 253;

/// Whether `names` may be kept: no longer than validation allows, each name no longer than
/// an object name. Bounds the memo to `MEMO_CAP` × 8 × 253 bytes of names.
pub(super) fn memoisable(names: &[String]) -> bool {
    names.len() <= MAX_FLAVORS && names.iter().all(|n| n.len() <= MEMO_NAME_MAX)
}

/// The most flavor lists a catalog remembers; past it the memo starts over (a cluster has
/// far fewer distinct lists, so this only bounds memory against odd inputs).
pub(super) const MEMO_CAP: usize = 1024;

/// Flavor-only parts of [`resolve`] by namespace and flavor list. The catalog's content
/// cannot change while it is shared (`insert` takes `&mut` and empties the memo), so an
/// entry never goes stale. A clone starts empty.
#[derive(Default)]
pub(super) struct ResolveMemo(
    std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<FlavorPart>>>,
);

impl Clone for ResolveMemo {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl ResolveMemo {
    pub(super) fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, std::sync::Arc<FlavorPart>>>
    {
        // The map is only ever read or replaced whole, so a panic elsewhere cannot leave it torn.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn get(&self, key: &str, policy: &Policy) -> Option<std::sync::Arc<FlavorPart>> {
        self.lock().get(key).filter(|p| p.fits(policy)).cloned()
    }

    pub(super) fn put(&self, key: String, part: std::sync::Arc<FlavorPart>) {
        let mut map = self.lock();
        if map.len() >= MEMO_CAP && !map.contains_key(&key) {
            map.clear();
        }
        map.insert(key, part);
    }

    pub(super) fn clear(&mut self) {
        self.0
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }
}

pub(super) static NEXT_CATALOG_ID: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(1);

pub(super) fn next_catalog_id() -> u64 {
    NEXT_CATALOG_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Default for FlavorCatalog {
    fn default() -> Self {
        Self {
            cluster: BTreeMap::new(),
            namespaced: BTreeMap::new(),
            id: next_catalog_id(),
            memo: ResolveMemo::default(),
        }
    }
}

impl FlavorCatalog {
    pub fn new() -> Self {
        Self::default()
    }

    /// Identifies this content: unique among the catalogs of the process, changed by every
    /// [`insert`](Self::insert) (a clone keeps it, having the same content). What was
    /// worked out from a catalog can be kept under its id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Adds a flavor. A native `Flavor` takes precedence over an `EnvironmentConfig` of the
    /// same name, so a team migrating off Crossplane can shadow the old definition.
    pub fn insert(&mut self, def: FlavorDef) {
        self.id = next_catalog_id();
        self.memo.clear();
        match &def.source {
            FlavorSource::ConfigMap { namespace, .. } => {
                self.namespaced
                    .entry(namespace.clone())
                    .or_default()
                    .insert(def.name.clone(), def);
            }
            source => {
                let keep_existing = matches!(self.cluster.get(&def.name), Some(e) if e.source == FlavorSource::Flavor)
                    && *source == FlavorSource::EnvironmentConfig;
                if !keep_existing {
                    self.cluster.insert(def.name.clone(), def);
                }
            }
        }
    }

    /// The flavor `name` as seen from `namespace`: a namespaced flavor shadows a cluster one.
    pub fn get(&self, namespace: &str, name: &str) -> Option<&FlavorDef> {
        self.namespaced
            .get(namespace)
            .and_then(|m| m.get(name))
            .or_else(|| self.cluster.get(name))
    }

    /// The flavor-only part of resolving `names` in `namespace`, from the memo when an
    /// earlier call worked it out under the same policy.
    pub(super) fn flavor_part(
        &self,
        namespace: &str,
        names: &[String],
        policy: &Policy,
    ) -> std::sync::Arc<FlavorPart> {
        // Lists validation refuses anyway are worked out but not kept: the memo holds
        // about three copies of the names, and admission resolves before it validates, so
        // keeping them would let anyone who may create AsyncActors fill memory.
        if !memoisable(names) {
            return std::sync::Arc::new(flavor_part(names, namespace, self, policy));
        }
        let key = self.memo_key(namespace, names);
        if let Some(part) = self.memo.get(&key, policy) {
            return part;
        }
        let part = std::sync::Arc::new(flavor_part(names, namespace, self, policy));
        self.memo.put(key, part.clone());
        part
    }

    /// Names the flavor list unambiguously (each part length-prefixed). The whole list,
    /// repeats included, because error paths carry the position of each name. The
    /// namespace only matters where it has namespaced flavors; elsewhere every namespace
    /// sees the same cluster flavors and shares one entry.
    fn memo_key(&self, namespace: &str, names: &[String]) -> String {
        use std::fmt::Write as _;
        let mut key = String::with_capacity(16 + names.iter().map(|n| n.len() + 4).sum::<usize>());
        if self.namespaced.contains_key(namespace) {
            let _ = write!(key, "N{}:{namespace}", namespace.len());
        } else {
            key.push('A');
        }
        for n in names {
            let _ = write!(key, "{}:{n}", n.len());
        }
        key
    }

    pub fn len(&self) -> usize {
        self.cluster.len() + self.namespaced.values().map(BTreeMap::len).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
