//! An actor's flavor list resolved into one effective spec: lookups, checks, the merge
//! (memoised per list), and the inline spec laid over it.

use serde_json::{Map, Value};

use super::*;
use crate::config::Policy;
use crate::error::{FieldError, FieldErrors};
use crate::types::AsyncActorSpec;

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
    Ok(part.resolution(effective, origins))
}

/// Everything [`resolve`] derives from the flavor list, the catalog and the policy alone.
#[derive(Debug)]
pub(super) struct FlavorPart {
    pub(super) flavors: Vec<ResolvedFlavor>,
    pub(super) missing: Vec<String>,
    pub(super) warnings: Vec<String>,
    /// The flavors merged, or why the list cannot be used.
    pub(super) merged: Result<MergedFlavors, FieldErrors>,
    /// The policy's `namespacedFlavorFields` when a namespaced flavor was checked against
    /// them: the answer holds only for a policy with the same list.
    pub(super) policy_fields: Option<Vec<String>>,
}

impl FlavorPart {
    /// The resolution of an actor whose effective spec is `spec`.
    pub(super) fn resolution(&self, spec: AsyncActorSpec, origins: Origins) -> Resolution {
        Resolution {
            spec,
            flavors: self.flavors.clone(),
            missing: self.missing.clone(),
            warnings: self.warnings.clone(),
            origins,
        }
    }

    pub(super) fn fits(&self, policy: &Policy) -> bool {
        self.policy_fields
            .as_ref()
            .is_none_or(|f| *f == policy.namespaced_flavor_fields)
    }
}

/// The listed flavors merged in order, without the fields only the actor may set.
#[derive(Debug)]
pub(super) struct MergedFlavors {
    pub(super) data: Map<String, Value>,
    pub(super) origins: Origins,
    /// `data` parsed once, for the fields the inline spec leaves alone; `None` when it
    /// does not parse (then only the whole-spec path can tell what the inline spec makes of it).
    pub(super) typed: Option<AsyncActorSpec>,
    /// The keys whose `typed` value serialises back to exactly `data`'s.
    pub(super) exact: Vec<&'static str>,
}

/// Looks up and checks every listed flavor (a repeated name counts once, at its first
/// position) and merges them.
pub(super) fn flavor_part(
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
pub(super) fn check_listed_flavor(
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

pub(super) fn deprecation_warning(name: &str, msg: &str) -> String {
    let tail = if msg.is_empty() {
        String::new()
    } else {
        format!(": {msg}")
    };
    format!("flavor {name:?} is deprecated{tail}")
}

/// Lays the inline spec over the merged flavors as JSON and parses the result.
pub(super) fn overlay_json(
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
pub(super) fn check_namespaced_flavor(
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
