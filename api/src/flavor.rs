//! Flavors (DESIGN.md §3, seed 002): where they come from, how they merge, and how an actor's
//! list of flavors resolves into one effective spec.
//!
//! Merge rules: lists append across flavors in flavor order; maps merge recursively; the same
//! leaf (or the same named list item, e.g. two `env` entries called `X`) set by two flavors is
//! a conflict naming both flavors and the key path; the actor's inline spec wins over every
//! flavor. The merge works on JSON so it is one rule for every field, present and future.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::{Map, Value};

use crate::config::Policy;
use crate::error::{FieldError, FieldErrors};
use crate::labels;
use crate::normalize::normalize_spec;
use crate::types::{AsyncActorSpec, Flavor};

mod typed;

/// Fields only the actor itself may set.
pub const ACTOR_ONLY_FIELDS: [&str; 3] = ["actor", "transport", "flavors"];
pub const MAX_FLAVORS: usize = 8;
pub const MIN_FLAVOR_NAME_LEN: usize = 3;

/// Crossplane's EnvironmentConfig API, the cluster-wide flavor source both the webhook and
/// the provisioner watch when its CRD is served.
pub fn environment_config_resource() -> kube::core::ApiResource {
    kube::core::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk(
            "apiextensions.crossplane.io",
            "v1beta1",
            "EnvironmentConfig",
        ),
        "environmentconfigs",
    )
}

/// Where a flavor was defined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FlavorSource {
    /// `Flavor` (asya.sh/v1alpha1), cluster-scoped.
    Flavor,
    /// Crossplane `EnvironmentConfig`, cluster-scoped.
    EnvironmentConfig,
    /// A ConfigMap labelled `asya.sh/flavor` in the actor's namespace.
    ConfigMap { namespace: String, name: String },
}

impl std::fmt::Display for FlavorSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FlavorSource::Flavor => f.write_str("Flavor"),
            FlavorSource::EnvironmentConfig => f.write_str("EnvironmentConfig"),
            FlavorSource::ConfigMap { namespace, name } => {
                write!(f, "ConfigMap {namespace}/{name}")
            }
        }
    }
}

/// One flavor, read into the common form: its partial spec as normalised JSON.
#[derive(Clone, Debug, PartialEq)]
pub struct FlavorDef {
    pub name: String,
    pub source: FlavorSource,
    /// The partial spec, aliases normalised. Empty object when `problem` is set.
    pub data: Map<String, Value>,
    /// The deprecation message, when the flavor is labelled deprecated.
    pub deprecated: Option<String>,
    /// Why the flavor cannot be used (unparseable data); actors using it are rejected with it.
    pub problem: Option<String>,
    /// Notes on the flavor itself (aliases rewritten, unknown fields dropped).
    pub warnings: Vec<String>,
}

impl FlavorDef {
    /// Reads a partial spec from any JSON value; `origin` names it in messages.
    pub fn from_data(name: &str, source: FlavorSource, data: &Value) -> Self {
        let mut def = FlavorDef {
            name: name.to_string(),
            source,
            data: Map::new(),
            deprecated: None,
            problem: None,
            warnings: Vec::new(),
        };
        let obj = match data {
            Value::Object(_) => data.clone(),
            Value::Null => Value::Object(Map::new()),
            other => {
                def.problem = Some(format!("flavor data must be an object, got {other}"));
                return def;
            }
        };
        let mut unknown = Vec::new();
        let parsed: Result<AsyncActorSpec, _> =
            serde_ignored::deserialize(obj, |p| unknown.push(p.to_string()));
        match parsed {
            Ok(mut spec) => {
                for u in unknown {
                    def.warnings
                        .push(format!("flavor {name:?}: unknown field {u} ignored"));
                }
                let n = normalize_spec(&mut spec, "");
                def.warnings.extend(
                    n.warnings
                        .into_iter()
                        .map(|w| format!("flavor {name:?}: {w}")),
                );
                if !n.errors.is_empty() {
                    def.problem = Some(n.errors.to_string());
                    return def;
                }
                // Reading through the typed spec drops nothing known and writes canonical names.
                if let Ok(Value::Object(m)) = serde_json::to_value(&spec) {
                    def.data = m;
                }
                // The typed spec cannot hold these; look at the raw data so they are reported.
                if let Value::Object(raw) = data {
                    for f in ACTOR_ONLY_FIELDS {
                        if raw.contains_key(f) {
                            def.data.insert(f.to_string(), raw[f].clone());
                        }
                    }
                }
            }
            Err(e) => {
                def.problem = Some(format!(
                    "flavor data does not parse as a partial AsyncActor spec: {e}"
                ))
            }
        }
        def
    }

    pub fn from_flavor(f: &Flavor) -> Self {
        let name = f.metadata.name.clone().unwrap_or_default();
        let data = serde_json::to_value(&f.spec).unwrap_or(Value::Null);
        let mut def = Self::from_data(&name, FlavorSource::Flavor, &data);
        def.deprecated = deprecation(f.metadata.labels.as_ref(), f.metadata.annotations.as_ref());
        def
    }

    /// A Crossplane `EnvironmentConfig` (any JSON shape with `metadata` and `data`).
    pub fn from_environment_config(obj: &Value) -> Option<Self> {
        let meta: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta =
            serde_json::from_value(obj.get("metadata")?.clone()).ok()?;
        let name = meta.name.clone()?;
        let mut def = Self::from_data(
            &name,
            FlavorSource::EnvironmentConfig,
            obj.get("data").unwrap_or(&Value::Null),
        );
        def.deprecated = deprecation(meta.labels.as_ref(), meta.annotations.as_ref());
        Some(def)
    }

    /// A ConfigMap labelled `asya.sh/flavor: NAME` with the partial spec under `flavor.yaml`.
    pub fn from_config_map(cm: &ConfigMap) -> Option<Self> {
        let labels_map = cm.metadata.labels.as_ref()?;
        let name = labels_map.get(labels::FLAVOR)?.clone();
        let source = FlavorSource::ConfigMap {
            namespace: cm
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            name: cm.metadata.name.clone().unwrap_or_default(),
        };
        let text = cm
            .data
            .as_ref()
            .and_then(|d| d.get(labels::FLAVOR_CONFIGMAP_KEY));
        let mut def = match text {
            None => {
                let mut d = Self::from_data(&name, source, &Value::Null);
                d.problem = Some(format!(
                    "ConfigMap has no key {:?}",
                    labels::FLAVOR_CONFIGMAP_KEY
                ));
                d
            }
            Some(t) => match serde_yaml::from_str::<Value>(t) {
                Ok(v) => Self::from_data(&name, source, &v),
                Err(e) => {
                    let mut d = Self::from_data(&name, source, &Value::Null);
                    d.problem = Some(format!(
                        "{} is not valid YAML: {e}",
                        labels::FLAVOR_CONFIGMAP_KEY
                    ));
                    d
                }
            },
        };
        def.deprecated = deprecation(Some(labels_map), cm.metadata.annotations.as_ref());
        Some(def)
    }

    /// Problems of the flavor on its own (for `asya-webhook validate` and the flavor's author).
    pub fn validate(&self) -> FieldErrors {
        let mut errs = FieldErrors::default();
        if self.name.len() < MIN_FLAVOR_NAME_LEN {
            errs.push(FieldError::invalid(
                "metadata.name",
                self.name.as_str(),
                "flavor names must be at least 3 characters",
            ));
        }
        if let Some(p) = &self.problem {
            errs.push(FieldError::invalid(
                self.data_path(),
                self.name.as_str(),
                p.clone(),
            ));
        }
        for f in ACTOR_ONLY_FIELDS {
            if self.data.contains_key(f) {
                errs.push(FieldError::forbidden(
                    format!("{}.{f}", self.data_path()),
                    format!("{f} cannot come from a flavor; only the actor may set it"),
                ));
            }
        }
        errs
    }

    fn data_path(&self) -> &'static str {
        match self.source {
            FlavorSource::Flavor => "spec",
            FlavorSource::EnvironmentConfig => "data",
            FlavorSource::ConfigMap { .. } => "data.flavor.yaml",
        }
    }
}

fn deprecation(
    labels_map: Option<&BTreeMap<String, String>>,
    annotations: Option<&BTreeMap<String, String>>,
) -> Option<String> {
    let flagged = labels_map
        .and_then(|l| l.get(labels::DEPRECATED))
        .is_some_and(|v| v == "true");
    flagged.then(|| {
        annotations
            .and_then(|a| a.get(labels::DEPRECATION_MESSAGE))
            .cloned()
            .unwrap_or_default()
    })
}

/// Every known flavor: cluster-scoped ones by name, namespaced ones by namespace and name.
#[derive(Clone)]
pub struct FlavorCatalog {
    cluster: BTreeMap<String, FlavorDef>,
    namespaced: BTreeMap<String, BTreeMap<String, FlavorDef>>,
    /// Changes with every change of content (see [`FlavorCatalog::id`]).
    id: u64,
    /// What [`resolve`] worked out from this content; not part of the catalog's value.
    memo: ResolveMemo,
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
const MEMO_NAME_MAX: usize = 253;

/// Whether `names` may be kept: no longer than validation allows, each name no longer than
/// an object name. Bounds the memo to `MEMO_CAP` × 8 × 253 bytes of names.
fn memoisable(names: &[String]) -> bool {
    names.len() <= MAX_FLAVORS && names.iter().all(|n| n.len() <= MEMO_NAME_MAX)
}

/// The most flavor lists a catalog remembers; past it the memo starts over (a cluster has
/// far fewer distinct lists, so this only bounds memory against odd inputs).
const MEMO_CAP: usize = 1024;

/// Flavor-only parts of [`resolve`] by namespace and flavor list. The catalog's content
/// cannot change while it is shared (`insert` takes `&mut` and empties the memo), so an
/// entry never goes stale. A clone starts empty.
#[derive(Default)]
struct ResolveMemo(std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<FlavorPart>>>);

impl Clone for ResolveMemo {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl ResolveMemo {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, std::sync::Arc<FlavorPart>>>
    {
        // The map is only ever read or replaced whole, so a panic elsewhere cannot leave it torn.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn get(&self, key: &str, policy: &Policy) -> Option<std::sync::Arc<FlavorPart>> {
        self.lock().get(key).filter(|p| p.fits(policy)).cloned()
    }

    fn put(&self, key: String, part: std::sync::Arc<FlavorPart>) {
        let mut map = self.lock();
        if map.len() >= MEMO_CAP && !map.contains_key(&key) {
            map.clear();
        }
        map.insert(key, part);
    }

    fn clear(&mut self) {
        self.0
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }
}

static NEXT_CATALOG_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_catalog_id() -> u64 {
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
    fn flavor_part(
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

/// Which flavor set each part of a merged spec: path prefix (`scaling.minReplicaCount`,
/// `env[MODEL_PATH]`) → flavor name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Origins(BTreeMap<String, String>);

impl Origins {
    /// The flavor that set `path` (a dotted spec path without the `spec.` prefix), if any.
    pub fn flavor_of(&self, path: &str) -> Option<&str> {
        let path = path.strip_prefix("spec.").unwrap_or(path);
        // The most specific recorded prefix decides; the map is small (one entry per key a flavor introduced).
        self.0
            .iter()
            .filter(|(p, _)| is_prefix_path(p, path))
            .max_by_key(|(p, _)| p.len())
            .map(|(_, f)| f.as_str())
    }
}

fn is_prefix_path(prefix: &str, path: &str) -> bool {
    path == prefix
        || (path.starts_with(prefix)
            && matches!(path.as_bytes().get(prefix.len()), Some(b'.' | b'[')))
}

/// The identity of a list item for merging, if the list is keyed (env by name, volume
/// mounts by mountPath, …). Unkeyed lists (tolerations) simply append.
fn item_key(list_field: &str, item: &Value) -> Option<String> {
    let key_field = match list_field {
        "env" | "volumes" | "stateProxy" | "secretRefs" | "policies" => "name",
        "volumeMounts" => "mountPath",
        _ => return None,
    };
    item.get(key_field)
        .and_then(Value::as_str)
        .map(str::to_string)
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// Merges flavor data in order. Distinct keys at any depth merge; the same leaf from two
/// flavors is a conflict (all conflicts are reported, not only the first).
pub fn merge_flavors(
    layers: &[(&str, &Map<String, Value>)],
) -> Result<(Map<String, Value>, Origins), FieldErrors> {
    let mut acc = Map::new();
    let mut origins = Origins::default();
    let mut errs = FieldErrors::default();
    for (flavor, data) in layers {
        merge_map(&mut acc, data, flavor, "", &mut origins, &mut errs);
    }
    if errs.is_empty() {
        Ok((acc, origins))
    } else {
        Err(errs)
    }
}

fn merge_map(
    acc: &mut Map<String, Value>,
    src: &Map<String, Value>,
    flavor: &str,
    prefix: &str,
    origins: &mut Origins,
    errs: &mut FieldErrors,
) {
    for (key, value) in src {
        let path = join(prefix, key);
        match (acc.get_mut(key), value) {
            (None, _) => {
                acc.insert(key.clone(), value.clone());
                origins.0.insert(path, flavor.to_string());
            }
            (Some(Value::Object(a)), Value::Object(b)) => {
                merge_map(a, b, flavor, &path, origins, errs)
            }
            (Some(Value::Array(a)), Value::Array(b)) => {
                for item in b {
                    let keyed = item_key(key, item);
                    if let Some(k) = &keyed {
                        let item_path = format!("{path}[{k}]");
                        if a.iter().any(|x| item_key(key, x).as_ref() == Some(k)) {
                            let first = origins.flavor_of(&item_path).unwrap_or("?").to_string();
                            errs.push(FieldError::flavor_conflict(&first, flavor, &item_path));
                            continue;
                        }
                        origins.0.insert(item_path, flavor.to_string());
                    }
                    a.push(item.clone());
                }
            }
            (Some(_), _) => {
                let first = origins.flavor_of(&path).unwrap_or("?").to_string();
                errs.push(FieldError::flavor_conflict(&first, flavor, &path));
            }
        }
    }
}

/// Lays the actor's inline spec over the merged flavors: inline leaves win, inline maps merge
/// key by key, inline list items replace flavor items with the same key and append otherwise.
/// Whatever the inline spec sets stops being attributed to a flavor.
pub fn overlay_inline(
    base: &mut Map<String, Value>,
    inline: &Map<String, Value>,
    origins: &mut Origins,
) {
    overlay_map(base, inline, "", origins);
}

fn overlay_map(
    base: &mut Map<String, Value>,
    inline: &Map<String, Value>,
    prefix: &str,
    origins: &mut Origins,
) {
    for (key, value) in inline {
        let path = join(prefix, key);
        match (base.get_mut(key), value) {
            (Some(Value::Object(a)), Value::Object(b)) => {
                push_down(origins, &path, a.keys().map(|k| join(&path, k)));
                overlay_map(a, b, &path, origins);
            }
            (Some(Value::Array(a)), Value::Array(b)) => {
                let keys: Vec<String> = a
                    .iter()
                    .filter_map(|x| item_key(key, x))
                    .map(|k| format!("{path}[{k}]"))
                    .collect();
                push_down(origins, &path, keys.into_iter());
                for item in b {
                    match item_key(key, item) {
                        Some(k) => {
                            origins.0.remove(&format!("{path}[{k}]"));
                            match a.iter_mut().find(|x| item_key(key, x).as_ref() == Some(&k)) {
                                Some(slot) => *slot = item.clone(),
                                None => a.push(item.clone()),
                            }
                        }
                        None if a.contains(item) => {}
                        None => a.push(item.clone()),
                    }
                }
            }
            _ => {
                clear_origins_under(origins, &path);
                base.insert(key.clone(), value.clone());
            }
        }
    }
}

/// Forgets which flavor set `path` or anything under it: the inline spec replaces it.
fn clear_origins_under(origins: &mut Origins, path: &str) {
    let stale: Vec<String> = origins
        .0
        .keys()
        .filter(|p| is_prefix_path(path, p))
        .cloned()
        .collect();
    for p in stale {
        origins.0.remove(&p);
    }
}

/// Moves an origin recorded for a whole subtree down to its children, so that overriding one
/// child inline leaves the others attributed to their flavor.
fn push_down(origins: &mut Origins, path: &str, children: impl Iterator<Item = String>) {
    if let Some(flavor) = origins.0.remove(path) {
        for child in children {
            origins.0.entry(child).or_insert_with(|| flavor.clone());
        }
    }
}

/// A flavor an actor resolved, in the order listed.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedFlavor {
    pub name: String,
    pub source: FlavorSource,
}

/// The outcome of resolving an actor's flavors.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Resolution {
    /// The effective spec: flavors merged in order, inline spec over them. No defaults yet.
    pub spec: AsyncActorSpec,
    pub flavors: Vec<ResolvedFlavor>,
    /// Listed flavors that do not exist (yet): the actor waits for them.
    pub missing: Vec<String>,
    pub warnings: Vec<String>,
    pub origins: Origins,
}

/// Resolves `spec.flavors` for an actor in `namespace`. `spec` is the normalised inline spec.
///
/// What the flavor list alone decides (lookups, checks, warnings, the merge) is worked out
/// once per catalog and list and kept in the catalog (many actors share a list); only the
/// inline spec is laid over it on every call.
pub fn resolve(
    spec: &AsyncActorSpec,
    namespace: &str,
    catalog: &FlavorCatalog,
    policy: &Policy,
) -> Result<Resolution, FieldErrors> {
    let part = catalog.flavor_part(namespace, &spec.flavors, policy);
    let merged = part.merged.as_ref().map_err(Clone::clone)?;
    let (effective, origins) = match typed::overlay(spec, merged) {
        Some(done) => done,
        // A field the typed path cannot take exactly: the whole-spec path, with its error.
        None => overlay_json(merged, spec)?,
    };
    Ok(Resolution {
        spec: effective,
        flavors: part.flavors.clone(),
        missing: part.missing.clone(),
        warnings: part.warnings.clone(),
        origins,
    })
}

/// Everything [`resolve`] derives from the flavor list, the catalog and the policy alone.
#[derive(Debug)]
struct FlavorPart {
    flavors: Vec<ResolvedFlavor>,
    missing: Vec<String>,
    warnings: Vec<String>,
    /// The flavors merged, or why the list cannot be used.
    merged: Result<MergedFlavors, FieldErrors>,
    /// The policy's `namespacedFlavorFields` when a namespaced flavor was checked against
    /// them: the answer holds only for a policy with the same list.
    policy_fields: Option<Vec<String>>,
}

impl FlavorPart {
    fn fits(&self, policy: &Policy) -> bool {
        self.policy_fields
            .as_ref()
            .is_none_or(|f| *f == policy.namespaced_flavor_fields)
    }
}

/// The listed flavors merged in order, without the fields only the actor may set.
#[derive(Debug)]
struct MergedFlavors {
    data: Map<String, Value>,
    origins: Origins,
    /// `data` parsed once, for the fields the inline spec leaves alone; `None` when it
    /// does not parse (then only the whole-spec path can tell what the inline spec makes of it).
    typed: Option<AsyncActorSpec>,
    /// The keys whose `typed` value serialises back to exactly `data`'s.
    exact: Vec<&'static str>,
}

/// Looks up and checks every listed flavor (a repeated name counts once, at its first
/// position) and merges them.
fn flavor_part(
    names: &[String],
    namespace: &str,
    catalog: &FlavorCatalog,
    policy: &Policy,
) -> FlavorPart {
    let mut errs = FieldErrors::default();
    let mut part = FlavorPart {
        flavors: Vec::new(),
        missing: Vec::new(),
        warnings: Vec::new(),
        merged: Err(FieldErrors::default()),
        policy_fields: None,
    };
    let mut layers: Vec<(&str, &Map<String, Value>)> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for (i, name) in names.iter().enumerate() {
        // A repeated name is reported by validation; merging it twice would only add noise.
        if !seen.insert(name) {
            continue;
        }
        let Some(def) = catalog.get(namespace, name) else {
            part.missing.push(name.clone());
            continue;
        };
        let path = format!("spec.flavors[{i}]");
        if let Some(problem) = &def.problem {
            errs.push(FieldError::invalid(
                path,
                name.as_str(),
                format!("flavor from {} is unusable: {problem}", def.source),
            ));
            continue;
        }
        errs.extend(check_listed_flavor(def, &path, namespace, policy));
        if let FlavorSource::ConfigMap { .. } = &def.source {
            part.policy_fields = Some(policy.namespaced_flavor_fields.clone());
        }
        if let Some(msg) = &def.deprecated {
            part.warnings.push(deprecation_warning(name, msg));
        }
        part.warnings.extend(def.warnings.iter().cloned());
        part.flavors.push(ResolvedFlavor {
            name: name.clone(),
            source: def.source.clone(),
        });
        layers.push((name.as_str(), &def.data));
    }
    if !part.missing.is_empty() {
        let list: Vec<String> = part.missing.iter().map(|m| format!("{m:?}")).collect();
        part.warnings.push(format!(
            "flavor {} not found: the actor waits in phase Waiting until it exists",
            list.join(", ")
        ));
    }
    part.merged = if errs.is_empty() {
        merge_flavors(&layers).map(|(mut data, origins)| {
            for f in ACTOR_ONLY_FIELDS {
                data.remove(f);
            }
            let typed: Option<AsyncActorSpec> =
                serde_json::from_value(Value::Object(data.clone())).ok();
            let exact = typed
                .as_ref()
                .map(|t| typed::exact_keys(t, &data))
                .unwrap_or_default();
            MergedFlavors {
                data,
                origins,
                typed,
                exact,
            }
        })
    } else {
        Err(errs)
    };
    part
}

/// What a usable flavor may not do where the actor lists it at `path`.
fn check_listed_flavor(
    def: &FlavorDef,
    path: &str,
    namespace: &str,
    policy: &Policy,
) -> FieldErrors {
    let mut errs = FieldErrors::default();
    for f in ACTOR_ONLY_FIELDS {
        if def.data.contains_key(f) {
            errs.push(FieldError::invalid(
                path,
                def.name.as_str(),
                format!("flavor sets {f}, which only the actor may set"),
            ));
        }
    }
    if let FlavorSource::ConfigMap { .. } = &def.source {
        errs.extend(check_namespaced_flavor(def, path, namespace, policy));
    }
    errs
}

fn deprecation_warning(name: &str, msg: &str) -> String {
    let tail = if msg.is_empty() {
        String::new()
    } else {
        format!(": {msg}")
    };
    format!("flavor {name:?} is deprecated{tail}")
}

/// Lays the inline spec over the merged flavors as JSON and parses the result.
fn overlay_json(
    merged: &MergedFlavors,
    spec: &AsyncActorSpec,
) -> Result<(AsyncActorSpec, Origins), FieldErrors> {
    let mut data = merged.data.clone();
    let mut origins = merged.origins.clone();
    let inline = match serde_json::to_value(spec) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    };
    overlay_inline(&mut data, &inline, &mut origins);
    let effective = serde_json::from_value(Value::Object(data)).map_err(|e| {
        FieldErrors(vec![FieldError::invalid(
            "spec.flavors",
            serde_json::to_value(&spec.flavors).unwrap_or_default(),
            format!("merged spec does not parse: {e}"),
        )])
    })?;
    Ok((effective, origins))
}

/// Namespaced flavors are written by namespace users, so they may only set the fields the
/// cluster policy lets them, never `image`, and never secrets of other namespaces.
fn check_namespaced_flavor(
    def: &FlavorDef,
    path: &str,
    namespace: &str,
    policy: &Policy,
) -> FieldErrors {
    let mut errs = FieldErrors::default();
    let name = def.name.as_str();
    for key in def.data.keys() {
        if ACTOR_ONLY_FIELDS.contains(&key.as_str()) {
            continue;
        }
        if key == "image" {
            errs.push(FieldError::invalid(
                path,
                name,
                "namespaced flavors may not set image (policy: only cluster flavors choose images)",
            ));
        } else if !policy.namespaced_flavor_fields.iter().any(|f| f == key) {
            errs.push(FieldError::invalid(
                path,
                name,
                format!(
                    "namespaced flavor sets {key}, which policy namespacedFlavorFields does not allow (allowed: {}); ask a cluster admin to extend it or use a cluster Flavor",
                    policy.namespaced_flavor_fields.join(", ")
                ),
            ));
        }
    }
    if let Some(Value::Array(refs)) = def.data.get("secretRefs") {
        for r in refs {
            if let Some(ns) = r.get("namespace").and_then(Value::as_str)
                && ns != namespace
            {
                errs.push(FieldError::invalid(path, name, format!("namespaced flavor references a secret in namespace {ns:?}; namespaced flavors may only use secrets of their own namespace")));
            }
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("not an object"),
        }
    }

    fn cluster(name: &str, data: Value) -> FlavorDef {
        FlavorDef::from_data(name, FlavorSource::Flavor, &data)
    }

    fn spec(v: Value) -> AsyncActorSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn seed_conflict_message() {
        let a = obj(json!({"scaling": {"minReplicaCount": 1}}));
        let b = obj(json!({"scaling": {"minReplicaCount": 5}}));
        let err = merge_flavors(&[("flavor-a", &a), ("flavor-b", &b)]).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"flavor merge conflict: flavors "flavor-a" and "flavor-b" conflict on scaling.minReplicaCount"#
        );
    }

    #[test]
    fn distinct_leaves_merge_and_lists_append() {
        let a =
            obj(json!({"resources": {"limits": {"cpu": "2"}}, "tolerations": [{"key": "gpu"}]}));
        let b = obj(
            json!({"resources": {"limits": {"memory": "4Gi"}}, "tolerations": [{"key": "spot"}]}),
        );
        let (m, origins) = merge_flavors(&[("cpu", &a), ("mem", &b)]).unwrap();
        assert_eq!(
            Value::Object(m),
            json!({"resources": {"limits": {"cpu": "2", "memory": "4Gi"}}, "tolerations": [{"key": "gpu"}, {"key": "spot"}]})
        );
        assert_eq!(
            origins.flavor_of("spec.resources.limits.memory"),
            Some("mem")
        );
        assert_eq!(origins.flavor_of("resources.limits.cpu"), Some("cpu"));
    }

    #[test]
    fn same_named_env_from_two_flavors_conflicts() {
        let a = obj(json!({"env": [{"name": "X", "value": "1"}]}));
        let b = obj(json!({"env": [{"name": "Y", "value": "2"}, {"name": "X", "value": "3"}]}));
        let err = merge_flavors(&[("aaa", &a), ("bbb", &b)]).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"flavor merge conflict: flavors "aaa" and "bbb" conflict on env[X]"#
        );
    }

    #[test]
    fn scalar_against_map_conflicts() {
        let a = obj(json!({"scaling": {"enabled": true}}));
        let b = obj(json!({"scaling": 3}));
        assert!(merge_flavors(&[("aaa", &a), ("bbb", &b)]).is_err());
    }

    #[test]
    fn inline_wins_and_clears_origin() {
        let mut cat = FlavorCatalog::new();
        cat.insert(cluster("gpu", json!({"scaling": {"minReplicaCount": 1, "maxReplicaCount": 4}, "env": [{"name": "A", "value": "f"}]})));
        let s = spec(
            json!({"flavors": ["gpu"], "scaling": {"minReplicaCount": 0}, "env": [{"name": "A", "value": "inline"}, {"name": "B", "value": "b"}]}),
        );
        let r = resolve(&s, "ns", &cat, &Policy::default()).unwrap();
        let sc = r.spec.scaling.clone().unwrap();
        assert_eq!(sc.min_replica_count, Some(0));
        assert_eq!(sc.max_replica_count, Some(4));
        assert_eq!(r.origins.flavor_of("spec.scaling.minReplicaCount"), None);
        assert_eq!(
            r.origins.flavor_of("spec.scaling.maxReplicaCount"),
            Some("gpu")
        );
        let env: Vec<_> = r
            .spec
            .env
            .iter()
            .map(|e| (e.name.as_str(), e.value.clone().unwrap_or_default()))
            .collect();
        assert_eq!(
            env,
            vec![("A", "inline".to_string()), ("B", "b".to_string())]
        );
        assert_eq!(r.spec.flavors, vec!["gpu".to_string()]);
    }

    #[test]
    fn missing_and_deprecated_flavors_warn() {
        let mut cat = FlavorCatalog::new();
        let mut old = cluster("gpu-t4", json!({"nodeSelector": {"a": "b"}}));
        old.deprecated = Some("Use gpu-a100 instead".into());
        cat.insert(old);
        let s = spec(json!({"flavors": ["gpu-t4", "nope-flavor"]}));
        let r = resolve(&s, "ns", &cat, &Policy::default()).unwrap();
        assert_eq!(r.missing, vec!["nope-flavor".to_string()]);
        assert_eq!(
            r.warnings,
            vec![
                r#"flavor "gpu-t4" is deprecated: Use gpu-a100 instead"#.to_string(),
                r#"flavor "nope-flavor" not found: the actor waits in phase Waiting until it exists"#.to_string()
            ]
        );
    }

    #[test]
    fn flavor_may_not_set_actor_only_fields() {
        let mut cat = FlavorCatalog::new();
        let def = cluster("sneaky", json!({"transport": "sqs", "replicas": 2}));
        assert_eq!(
            def.validate().to_string(),
            "spec.transport: Forbidden: transport cannot come from a flavor; only the actor may set it"
        );
        cat.insert(def);
        let err = resolve(
            &spec(json!({"flavors": ["sneaky"]})),
            "ns",
            &cat,
            &Policy::default(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"spec.flavors[0]: Invalid value: "sneaky": flavor sets transport, which only the actor may set"#
        );
    }

    fn config_map(ns: &str, flavor: &str, yaml: &str) -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": {"name": format!("cm-{flavor}"), "namespace": ns, "labels": {"asya.sh/flavor": flavor}},
            "data": {"flavor.yaml": yaml}
        }))
        .unwrap()
    }

    #[test]
    fn namespaced_flavor_shadows_cluster_flavor_in_its_namespace_only() {
        let mut cat = FlavorCatalog::new();
        cat.insert(cluster(
            "team",
            json!({"env": [{"name": "WHO", "value": "cluster"}]}),
        ));
        cat.insert(
            FlavorDef::from_config_map(&config_map("ml", "team", "env: [{name: WHO, value: ns}]"))
                .unwrap(),
        );
        let s = spec(json!({"flavors": ["team"]}));
        let in_ml = resolve(&s, "ml", &cat, &Policy::default()).unwrap();
        assert_eq!(in_ml.spec.env[0].value.as_deref(), Some("ns"));
        let elsewhere = resolve(&s, "other", &cat, &Policy::default()).unwrap();
        assert_eq!(elsewhere.spec.env[0].value.as_deref(), Some("cluster"));
    }

    #[test]
    fn namespaced_flavor_restrictions() {
        let mut cat = FlavorCatalog::new();
        cat.insert(FlavorDef::from_config_map(&config_map("ml", "bad", "image: evil:1\nsidecar: {image: x}\nsecretRefs: [{name: s, namespace: kube-system}]")).unwrap());
        let err = resolve(
            &spec(json!({"flavors": ["bad"]})),
            "ml",
            &cat,
            &Policy::default(),
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("namespaced flavors may not set image"),
            "{text}"
        );
        assert!(
            text.contains(
                "namespaced flavor sets sidecar, which policy namespacedFlavorFields does not allow"
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"references a secret in namespace "kube-system""#),
            "{text}"
        );
    }

    #[test]
    fn broken_configmap_flavor_is_reported() {
        let def =
            FlavorDef::from_config_map(&config_map("ml", "broken", "scaling: [1, 2")).unwrap();
        assert!(
            def.problem
                .as_deref()
                .unwrap_or("")
                .contains("flavor.yaml is not valid YAML")
        );
        let def = FlavorDef::from_config_map(&config_map("ml", "typed", "replicas: many")).unwrap();
        assert!(
            def.problem
                .as_deref()
                .unwrap_or("")
                .contains("does not parse"),
            "{:?}",
            def.problem
        );
    }

    #[test]
    fn environment_config_and_flavor_precedence() {
        let ec = json!({"apiVersion": "apiextensions.crossplane.io/v1beta1", "kind": "EnvironmentConfig",
            "metadata": {"name": "gpu", "labels": {"asya.sh/flavor": "gpu", "asya.sh/deprecated": "true"}},
            "data": {"nodeSelector": {"from": "crossplane"}}});
        let ec = FlavorDef::from_environment_config(&ec).unwrap();
        assert_eq!(ec.deprecated.as_deref(), Some(""));
        let native = cluster("gpu", json!({"nodeSelector": {"from": "native"}}));
        let mut cat = FlavorCatalog::new();
        cat.insert(native.clone());
        cat.insert(ec.clone());
        assert_eq!(cat.get("x", "gpu").unwrap().source, FlavorSource::Flavor);
        let mut cat = FlavorCatalog::new();
        cat.insert(ec);
        cat.insert(native);
        assert_eq!(cat.get("x", "gpu").unwrap().source, FlavorSource::Flavor);
    }

    #[test]
    fn flavor_aliases_are_normalised() {
        let def = cluster(
            "aggressive-retries",
            json!({"resiliency": {"policies": {"transient": {"initialDelay": "1s"}}, "rules": [{"errors": ["A", "B"], "policy": "transient"}]}}),
        );
        assert!(def.problem.is_none());
        assert_eq!(
            Value::Object(def.data.clone()),
            json!({"resiliency": {"policies": {"transient": {"initialInterval": "1s"}}, "rules": [{"match": "A", "policy": "transient"}, {"match": "B", "policy": "transient"}]}})
        );
        assert_eq!(def.warnings.len(), 2);
    }

    /// Lists validation refuses are resolved but not remembered: admission resolves before
    /// it validates, so remembering them would let any client fill the memo with names.
    #[test]
    fn refused_lists_are_not_memoised() {
        let cat = FlavorCatalog::new();
        let policy = Policy::default();
        let too_many: Vec<String> = (0..=MAX_FLAVORS).map(|i| format!("flavor-{i}")).collect();
        let too_long = vec!["x".repeat(MEMO_NAME_MAX + 1)];
        for names in [too_many, too_long] {
            let s = spec(json!({"flavors": names}));
            let first = resolve(&s, "ns", &cat, &policy);
            assert!(cat.memo.lock().is_empty(), "{names:?} was memoised");
            assert_eq!(resolve(&s, "ns", &cat, &policy), first);
        }
        let ok = spec(json!({"flavors": ["flavor-a", "flavor-b"]}));
        let _ = resolve(&ok, "ns", &cat, &policy);
        assert_eq!(cat.memo.lock().len(), 1);
    }
}

#[cfg(test)]
mod equivalence;
