//! Laying the inline spec over the merged flavors field by field, without the JSON round
//! trip of the whole spec: a top-level field only one side sets is taken as it is. A field
//! both set is overlaid typed where [`set_by_both`] mirrors the JSON overlay for its type (scaling,
//! resiliency, resources, nodeSelector, env, tolerations: what flavors typically share with
//! actors), otherwise it alone goes through JSON; either way with the same result and
//! origins as the whole-spec path in [`super::overlay_json`]. Where that cannot be exact (a
//! field does not convert), [`overlay`] answers `None` and the caller takes the whole-spec
//! path, errors included.

use std::collections::BTreeMap;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::merge::{Origins, overlay_map};
use super::resolve::MergedFlavors;
use crate::types::AsyncActorSpec;

mod set_by_both;
use set_by_both::Member;

/// Whether a top-level field appears in the spec's JSON: mirrors the `skip_serializing_if`
/// attributes of [`AsyncActorSpec`] (`None`, empty list, empty map are left out).
trait Present {
    fn present(&self) -> bool;
}

impl<T> Present for Option<T> {
    fn present(&self) -> bool {
        self.is_some()
    }
}

impl<T> Present for Vec<T> {
    fn present(&self) -> bool {
        !self.is_empty()
    }
}

impl<K, V> Present for BTreeMap<K, V> {
    fn present(&self) -> bool {
        !self.is_empty()
    }
}

/// How the inline value of a field no flavor sets is carried over.
#[derive(Clone, Copy)]
enum Carry {
    /// A clone: for the field's type a JSON round trip gives back the same value.
    Clone,
    /// Through JSON as the whole-spec path does: the type holds an `ObjectMeta`, whose
    /// timestamps lose their fraction of a second in JSON.
    Json,
}

/// The effective spec and origins, or `None` where only the whole-spec path is exact.
pub(super) fn overlay(
    spec: &AsyncActorSpec,
    merged: &MergedFlavors,
) -> Option<(AsyncActorSpec, Origins)> {
    let flavors = merged.typed.as_ref()?;
    let mut origins = merged.origins.clone();
    let mut fields = Fields {
        data: &merged.data,
        exact: &merged.exact,
        origins: &mut origins,
    };
    let effective = overlay_fields(spec, flavors, &mut fields)?;
    Some((effective, origins))
}

/// One field at a time. Origins are recorded per path under a top-level key and no key is
/// a path prefix of another, so overlaying the keys one by one edits them exactly as the
/// whole-spec overlay does. A key only the inline spec sets has no origins to clear: every
/// origin lies under a key of the merged data.
struct Fields<'a> {
    data: &'a Map<String, Value>,
    /// Keys whose typed flavor value serialises to `data`'s (see [`exact_keys`]).
    exact: &'a [&'static str],
    origins: &'a mut Origins,
}

impl Fields<'_> {
    fn field<T>(&mut self, key: &str, inline: &T, flavors: &T, carry: Carry) -> Option<T>
    where
        T: Present + Clone + Default + Serialize + DeserializeOwned,
    {
        match (inline.present(), self.data.get(key)) {
            (false, None) => Some(T::default()),
            (false, Some(_)) => Some(flavors.clone()),
            (true, None) => match carry {
                Carry::Clone => Some(inline.clone()),
                Carry::Json => serde_json::from_value(serde_json::to_value(inline).ok()?).ok(),
            },
            (true, Some(base)) => self.both(key, base, inline),
        }
    }

    /// [`Self::field`], but a field both set is overlaid typed (see [`set_by_both`]) where the
    /// flavors' typed value is exactly their JSON.
    fn typed_field<T>(&mut self, key: &str, inline: &T, flavors: &T, carry: Carry) -> Option<T>
    where
        T: Member + Default + Serialize + DeserializeOwned,
    {
        if inline.present() && self.data.contains_key(key) && self.exact.contains(&key) {
            let mut value = flavors.clone();
            value.overlay_present(inline, key, self.origins);
            return Some(value);
        }
        self.field(key, inline, flavors, carry)
    }

    /// Both sides set `key`: today's JSON overlay and parse, on this one field.
    fn both<T>(&mut self, key: &str, base: &Value, inline: &T) -> Option<T>
    where
        T: Serialize + DeserializeOwned,
    {
        let mut merged = Map::new();
        merged.insert(key.to_string(), base.clone());
        let mut over = Map::new();
        over.insert(key.to_string(), serde_json::to_value(inline).ok()?);
        overlay_map(&mut merged, &over, "", self.origins);
        serde_json::from_value(merged.remove(key)?).ok()
    }
}

/// Lists every field of the spec with its JSON key, its [`Carry`], and how a value both
/// sides set is overlaid: `field` through JSON, `typed_field` typed.
macro_rules! spec_fields {
    ($($field:ident: $key:literal $carry:ident $both:ident),* $(,)?) => {
        /// The JSON keys listed, to test them against serialisation.
        #[cfg(test)]
        const SPEC_KEYS: &[&str] = &[$($key),*];

        fn overlay_fields(
            spec: &AsyncActorSpec,
            flavors: &AsyncActorSpec,
            fields: &mut Fields<'_>,
        ) -> Option<AsyncActorSpec> {
            // Exhaustive on purpose: a new spec field does not compile until it is listed.
            let AsyncActorSpec { $($field),* } = spec;
            Some(AsyncActorSpec {
                $($field: fields.$both($key, $field, &flavors.$field, Carry::$carry)?,)*
            })
        }

        /// The keys of `data` whose value in `typed` (`data` parsed) serialises back to
        /// exactly `data`'s: only there may a typed overlay stand in for the JSON one.
        pub(super) fn exact_keys(typed: &AsyncActorSpec, data: &Map<String, Value>) -> Vec<&'static str> {
            let mut keys = Vec::new();
            $(
                // A `null` parses to the field's absent value, which the typed overlay
                // treats as unset while the JSON overlay replaces it: not exact.
                if let Some(v) = data.get($key)
                    && !v.is_null()
                    && serde_json::to_value(&typed.$field).ok().as_ref() == Some(v)
                {
                    keys.push($key);
                }
            )*
            keys
        }
    };
}

spec_fields! {
    actor: "actor" Clone field,
    transport: "transport" Clone field,
    image: "image" Clone field,
    handler: "handler" Clone field,
    flavors: "flavors" Clone field,
    image_pull_policy: "imagePullPolicy" Clone field,
    python_executable: "pythonExecutable" Clone field,
    handler_mode: "handlerMode" Clone field,
    scaling: "scaling" Clone typed_field,
    replicas: "replicas" Clone field,
    resiliency: "resiliency" Clone typed_field,
    env: "env" Clone typed_field,
    secret_refs: "secretRefs" Clone field,
    resources: "resources" Clone typed_field,
    node_selector: "nodeSelector" Clone typed_field,
    tolerations: "tolerations" Clone typed_field,
    volumes: "volumes" Json field,
    volume_mounts: "volumeMounts" Clone field,
    sidecar: "sidecar" Clone field,
    state_proxy: "stateProxy" Clone field,
    workload: "workload" Json field,
    socket: "socket" Clone field,
    timeout: "timeout" Clone field,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The keys listed are exactly the keys a spec with every field set serialises to.
    #[test]
    fn listed_keys_are_the_serialised_keys() {
        let full: AsyncActorSpec = serde_json::from_value(json!({
            "actor": "a", "transport": "sqs", "image": "i", "handler": "m.f", "flavors": ["f"],
            "imagePullPolicy": "Always", "pythonExecutable": "python3", "handlerMode": "payload",
            "scaling": {}, "replicas": 1, "resiliency": {}, "env": [{"name": "A"}],
            "secretRefs": [{"name": "s"}], "resources": {}, "nodeSelector": {"a": "b"},
            "tolerations": [{}], "volumes": [{"name": "v"}], "volumeMounts": [{"name": "v", "mountPath": "/v"}],
            "sidecar": {}, "stateProxy": [{"name": "s"}], "workload": {}, "socket": {}, "timeout": {}
        }))
        .unwrap();
        let Value::Object(m) = serde_json::to_value(&full).unwrap() else {
            panic!("a spec serialises to an object")
        };
        let mut serialised: Vec<&str> = m.keys().map(String::as_str).collect();
        let mut listed = SPEC_KEYS.to_vec();
        serialised.sort_unstable();
        listed.sort_unstable();
        assert_eq!(listed, serialised);
    }

    /// A field both set that does not parse once overlaid: no typed answer, so the caller
    /// takes the whole-spec path and reports its error.
    #[test]
    fn unparseable_overlaid_field_declines() {
        let mut data = Map::new();
        data.insert("scaling".into(), json!({"minReplicaCount": "x"}));
        let merged = MergedFlavors {
            data,
            origins: Origins::default(),
            typed: Some(AsyncActorSpec::default()),
            exact: Vec::new(),
        };
        let inline: AsyncActorSpec =
            serde_json::from_value(json!({"scaling": {"maxReplicaCount": 3}})).unwrap();
        assert!(overlay(&inline, &merged).is_none());
        let inline: AsyncActorSpec = serde_json::from_value(json!({"replicas": 2})).unwrap();
        assert!(overlay(&inline, &merged).is_some());
    }
}
