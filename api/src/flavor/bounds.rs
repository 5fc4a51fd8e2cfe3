//! What of a flavor ConfigMap the webhook's and the provisioner's caches keep. Any namespace
//! can label a ConfigMap `asya.sh/flavor`, so both caches bound what they hold (§9): of each
//! ConfigMap only its identity, the flavor and deprecation labels, the deprecation message
//! and the key `flavor.yaml` (no other keys, no `binaryData`, no managedFields); a
//! `flavor.yaml` over `flavorLimits.maxBytes` is dropped unread; past
//! `flavorLimits.maxPerNamespace` in its namespace or `flavorLimits.maxTotal` in all, a
//! ConfigMap is kept as its identity only. What was dropped is recorded on the kept object
//! ([`NOT_READ`]) so that an actor using that flavor is told why, at admission and in its
//! status. Pure: the watches feed every event through a [`FlavorMapGate`].

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::config::FlavorLimits;
use crate::labels;

/// Annotation the caches set (never read from the API server: [`slim`] drops every other
/// annotation first) on a flavor ConfigMap whose flavor was not read, with the reason.
pub const NOT_READ: &str = "asya.sh/flavor-not-read";

/// Why a flavor ConfigMap is not read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotRead {
    #[error(
        "{key} is {size} bytes, over the limit of {limit} (flavorLimits.maxBytes in the cluster configuration)",
        key = labels::FLAVOR_CONFIGMAP_KEY
    )]
    TooLarge { size: usize, limit: usize },
    #[error(
        "namespace {namespace} already has {limit} flavor ConfigMaps, the limit (flavorLimits.maxPerNamespace in the cluster configuration); this one is not read"
    )]
    NamespaceFull { namespace: String, limit: usize },
    #[error(
        "the cluster already has {limit} flavor ConfigMaps, the limit (flavorLimits.maxTotal in the cluster configuration); this one is not read"
    )]
    ClusterFull { limit: usize },
}

/// Whether a `flavor.yaml` of this many bytes is read (a pure rule: the size bound).
pub fn check_size(size: usize, limits: &FlavorLimits) -> Result<(), NotRead> {
    if size > limits.max_bytes {
        return Err(NotRead::TooLarge {
            size,
            limit: limits.max_bytes,
        });
    }
    Ok(())
}

/// Keeps of `cm` only what the flavor catalog reads: identity, the flavor and deprecation
/// labels, the deprecation message, and `flavor.yaml` when `keep_flavor`.
pub fn slim(cm: &mut ConfigMap, keep_flavor: bool) {
    let m = std::mem::take(&mut cm.metadata);
    let pick = |map: Option<BTreeMap<String, String>>, keys: &[&str]| {
        map.map(|mut all| {
            keys.iter()
                .filter_map(|k| all.remove_entry(*k))
                .collect::<BTreeMap<_, _>>()
        })
        .filter(|kept| !kept.is_empty())
    };
    cm.metadata = ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        labels: pick(m.labels, &[labels::FLAVOR, labels::DEPRECATED]),
        annotations: pick(m.annotations, &[labels::DEPRECATION_MESSAGE]),
        ..Default::default()
    };
    cm.binary_data = None;
    cm.immutable = None;
    let flavor = cm
        .data
        .take()
        .and_then(|mut d| d.remove_entry(labels::FLAVOR_CONFIGMAP_KEY))
        .filter(|_| keep_flavor);
    cm.data = flavor.map(|(k, v)| BTreeMap::from([(k, v)]));
}

/// Records on a slim ConfigMap why its flavor was not read.
fn mark(cm: &mut ConfigMap, why: &NotRead) {
    cm.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(NOT_READ.into(), why.to_string());
}

/// Why the flavor of a cached ConfigMap was not read, when it was not.
pub fn not_read(cm: &ConfigMap) -> Option<&str> {
    cm.metadata
        .annotations
        .as_ref()?
        .get(NOT_READ)
        .map(String::as_str)
}

/// The count bounds over one watch of flavor ConfigMaps: which ConfigMaps currently hold a
/// place. A ConfigMap keeps its place until it is deleted (or loses its label) or the watch
/// lists afresh; the first to arrive get the places (a fresh list arrives in name order).
#[derive(Debug)]
pub struct FlavorMapGate {
    limits: FlavorLimits,
    admitted: BTreeMap<String, BTreeSet<String>>,
    total: usize,
}

fn key(cm: &ConfigMap) -> (String, String) {
    (
        cm.metadata.namespace.clone().unwrap_or_default(),
        cm.metadata.name.clone().unwrap_or_default(),
    )
}

impl FlavorMapGate {
    pub fn new(limits: FlavorLimits) -> Self {
        Self {
            limits,
            admitted: BTreeMap::new(),
            total: 0,
        }
    }

    /// The watch starts a fresh list: every place is free again.
    pub fn restart(&mut self) {
        self.admitted.clear();
        self.total = 0;
    }

    /// Takes a place for (`namespace`, `name`), or says which bound is reached.
    pub fn admit(&mut self, namespace: &str, name: &str) -> Result<(), NotRead> {
        let held = self.admitted.get(namespace);
        if held.is_some_and(|s| s.contains(name)) {
            return Ok(());
        }
        if held.map_or(0, BTreeSet::len) >= self.limits.max_per_namespace {
            return Err(NotRead::NamespaceFull {
                namespace: namespace.into(),
                limit: self.limits.max_per_namespace,
            });
        }
        if self.total >= self.limits.max_total {
            return Err(NotRead::ClusterFull {
                limit: self.limits.max_total,
            });
        }
        self.admitted
            .entry(namespace.into())
            .or_default()
            .insert(name.into());
        self.total += 1;
        Ok(())
    }

    /// Frees the place of (`namespace`, `name`), if it held one.
    pub fn release(&mut self, namespace: &str, name: &str) {
        if let Some(s) = self.admitted.get_mut(namespace)
            && s.remove(name)
        {
            self.total -= 1;
            if s.is_empty() {
                self.admitted.remove(namespace);
            }
        }
    }

    /// A ConfigMap the watch reports as present (listed, created or changed): slimmed, and
    /// its flavor dropped (with the reason) when it is too large or over a count bound.
    pub fn applied(&mut self, cm: &mut ConfigMap) {
        let (ns, name) = key(cm);
        let size = cm
            .data
            .as_ref()
            .and_then(|d| d.get(labels::FLAVOR_CONFIGMAP_KEY))
            .map_or(0, String::len);
        // The size first: an oversized flavor never takes a place.
        let verdict = check_size(size, &self.limits).and_then(|()| self.admit(&ns, &name));
        if matches!(verdict, Err(NotRead::TooLarge { .. })) {
            self.release(&ns, &name);
        }
        slim(cm, verdict.is_ok());
        if let Err(why) = verdict {
            mark(cm, &why);
        }
    }

    /// A ConfigMap the watch reports as gone: its place is freed (the store only needs its
    /// identity to drop it).
    pub fn deleted(&mut self, cm: &mut ConfigMap) {
        let (ns, name) = key(cm);
        self.release(&ns, &name);
        slim(cm, false);
    }

    /// Places held: (in `namespace`, in all).
    pub fn held(&self, namespace: &str) -> (usize, usize) {
        (
            self.admitted.get(namespace).map_or(0, BTreeSet::len),
            self.total,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn limits(max_bytes: usize, per_ns: usize, total: usize) -> FlavorLimits {
        FlavorLimits {
            max_bytes,
            max_per_namespace: per_ns,
            max_total: total,
        }
    }

    fn cm(ns: &str, name: &str, flavor: &str) -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "uid": "u", "resourceVersion": "9",
                         "labels": {"asya.sh/flavor": "f", "asya.sh/deprecated": "true", "team": "x"},
                         "annotations": {"asya.sh/deprecation-message": "use g",
                                         "kubectl.kubernetes.io/last-applied-configuration": "{..}",
                                         "asya.sh/flavor-not-read": "forged"},
                         "managedFields": [{"manager": "kubectl"}]},
            "data": {"flavor.yaml": flavor, "other.txt": "x".repeat(100_000)},
            "binaryData": {"blob": "AAAA"}
        }))
        .unwrap()
    }

    #[test]
    fn the_size_bound_is_inclusive() {
        let l = limits(10, 1, 1);
        assert_eq!(check_size(10, &l), Ok(()));
        assert_eq!(
            check_size(11, &l),
            Err(NotRead::TooLarge {
                size: 11,
                limit: 10
            })
        );
        assert_eq!(
            check_size(11, &l).unwrap_err().to_string(),
            "flavor.yaml is 11 bytes, over the limit of 10 (flavorLimits.maxBytes in the cluster configuration)"
        );
    }

    #[test]
    fn the_cache_keeps_only_the_flavor_key_and_what_the_catalog_reads() {
        let mut gate = FlavorMapGate::new(FlavorLimits::default());
        let mut c = cm("team-a", "f", "scaling:\n  maxReplicaCount: 3\n");
        gate.applied(&mut c);
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "f", "namespace": "team-a", "uid": "u", "resourceVersion": "9",
                             "labels": {"asya.sh/flavor": "f", "asya.sh/deprecated": "true"},
                             "annotations": {"asya.sh/deprecation-message": "use g"}},
                "data": {"flavor.yaml": "scaling:\n  maxReplicaCount: 3\n"}
            })
        );
        assert_eq!(not_read(&c), None);
    }

    #[test]
    fn an_oversized_flavor_is_dropped_unread_and_takes_no_place() {
        let mut gate = FlavorMapGate::new(limits(8, 1, 10));
        let mut big = cm("n", "big", "123456789");
        gate.applied(&mut big);
        assert_eq!(big.data, None);
        assert_eq!(
            not_read(&big),
            Some(
                "flavor.yaml is 9 bytes, over the limit of 8 (flavorLimits.maxBytes in the cluster configuration)"
            )
        );
        assert_eq!(gate.held("n"), (0, 0));
        // The namespace's one place is still free for a flavor that fits.
        let mut ok = cm("n", "ok", "a: 1");
        gate.applied(&mut ok);
        assert!(ok.data.is_some() && not_read(&ok).is_none());
        // A flavor that grows past the bound gives its place back.
        let mut grown = cm("n", "ok", "123456789");
        gate.applied(&mut grown);
        assert_eq!(gate.held("n"), (0, 0));
    }

    #[test]
    fn count_bounds_per_namespace_and_in_total() {
        let mut gate = FlavorMapGate::new(limits(1024, 2, 3));
        for name in ["a", "b"] {
            let mut c = cm("n1", name, "x: 1");
            gate.applied(&mut c);
            assert!(c.data.is_some());
        }
        let mut third = cm("n1", "c", "x: 1");
        gate.applied(&mut third);
        assert_eq!(third.data, None);
        assert!(
            not_read(&third)
                .unwrap()
                .starts_with("namespace n1 already has 2 flavor ConfigMaps")
        );
        // An update of an admitted one keeps its place.
        let mut again = cm("n1", "a", "x: 2");
        gate.applied(&mut again);
        assert!(again.data.is_some());
        let mut other = cm("n2", "a", "x: 1");
        gate.applied(&mut other);
        assert!(other.data.is_some());
        let mut over = cm("n3", "a", "x: 1");
        gate.applied(&mut over);
        assert!(
            not_read(&over)
                .unwrap()
                .starts_with("the cluster already has 3 flavor ConfigMaps")
        );
        assert_eq!(gate.held("n1"), (2, 3));
        // A deletion frees a place for the next change; a fresh list frees all.
        let mut gone = cm("n1", "a", "");
        gate.deleted(&mut gone);
        assert_eq!(gate.held("n1"), (1, 2));
        gate.applied(&mut cm("n1", "c", "x: 1"));
        assert_eq!(gate.held("n1"), (2, 3));
        gate.restart();
        assert_eq!(gate.held("n1"), (0, 0));
    }

    #[test]
    fn a_forged_not_read_annotation_is_dropped() {
        let mut c = cm("n", "f", "x: 1");
        slim(&mut c, true);
        assert_eq!(not_read(&c), None);
    }

    #[test]
    fn an_actor_using_a_flavor_not_read_is_told_why() {
        let mut gate = FlavorMapGate::new(limits(4, 1, 1));
        let mut c = cm("n", "f", "123456");
        gate.applied(&mut c);
        let def = crate::flavor::FlavorDef::from_config_map(&c).unwrap();
        assert_eq!(
            def.problem.as_deref(),
            Some(
                "flavor.yaml is 6 bytes, over the limit of 4 (flavorLimits.maxBytes in the cluster configuration)"
            )
        );
        assert!(def.data.is_empty());
    }
}
