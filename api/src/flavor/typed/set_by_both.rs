//! A field both the flavors and the inline spec set, overlaid typed the way `overlay_map`
//! overlays its JSON: objects and maps merge key by key, keyed list items (env by name)
//! replace, unkeyed items append unless already there, leaves replace; origins are moved
//! down and cleared at the same paths. Only for types whose JSON presence and equality
//! follow their typed values, and only where the flavors' typed value serialises to their
//! merged JSON (checked once per memo entry).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, ResourceClaim, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::super::merge::{Origins, clear_origins_under, join, push_down};
use super::Present;
use crate::duration::DurationSpec;
use crate::types::{Resiliency, ResiliencyRule, RetryPolicy, Scaling};

/// A value present on both sides at `path`.
pub(super) trait Overlay {
    fn overlay(&mut self, inline: &Self, path: &str, origins: &mut Origins);
}

/// A member of an object as JSON sees it: `Option` (present when `Some`), or a list or map
/// (present when not empty).
pub(super) trait Member: Present + Clone {
    fn overlay_present(&mut self, inline: &Self, path: &str, origins: &mut Origins);
}

impl<T: Overlay + Clone> Member for Option<T> {
    fn overlay_present(&mut self, inline: &Self, path: &str, origins: &mut Origins) {
        if let (Some(base), Some(inline)) = (self.as_mut(), inline) {
            base.overlay(inline, path, origins);
        }
    }
}

impl<T: Clone> Member for Vec<T>
where
    Vec<T>: Overlay,
{
    fn overlay_present(&mut self, inline: &Self, path: &str, origins: &mut Origins) {
        self.overlay(inline, path, origins);
    }
}

impl<V: Overlay + Clone> Member for BTreeMap<String, V> {
    fn overlay_present(&mut self, inline: &Self, path: &str, origins: &mut Origins) {
        self.overlay(inline, path, origins);
    }
}

/// Member `key` of the object at `parent`: left alone when the inline spec does not set
/// it, overlaid when both do, taken from the inline spec (whatever was attributed there
/// forgotten) otherwise. The path is only built when the inline spec sets the member.
fn member<T: Member>(base: &mut T, inline: &T, parent: &str, key: &str, origins: &mut Origins) {
    if !inline.present() {
        return;
    }
    let path = join(parent, key);
    if base.present() {
        base.overlay_present(inline, &path, origins);
    } else {
        clear_origins_under(origins, &path);
        base.clone_from(inline);
    }
}

/// JSON leaves: the inline value replaces the flavors' one.
macro_rules! leaves {
    ($($t:ty),* $(,)?) => {$(
        impl Overlay for $t {
            fn overlay(&mut self, inline: &Self, path: &str, origins: &mut Origins) {
                clear_origins_under(origins, path);
                self.clone_from(inline);
            }
        }
    )*};
}

leaves!(String, bool, i32, DurationSpec, Quantity);

/// JSON objects with a fixed set of members.
macro_rules! objects {
    ($($t:ident { $($field:ident: $key:literal),* $(,)? })*) => {$(
        impl Overlay for $t {
            fn overlay(&mut self, inline: &Self, path: &str, origins: &mut Origins) {
                // Exhaustive on purpose: a new field does not compile until it is listed.
                let $t { $($field: _),* } = self;
                let present = [$(($key, self.$field.present())),*];
                push_down(
                    origins,
                    path,
                    present.iter().filter(|(_, p)| *p).map(|(k, _)| join(path, k)),
                );
                $(member(&mut self.$field, &inline.$field, path, $key, origins);)*
            }
        }
    )*};
}

objects! {
    Scaling {
        enabled: "enabled",
        min_replica_count: "minReplicaCount",
        max_replica_count: "maxReplicaCount",
        queue_length: "queueLength",
        polling_interval: "pollingInterval",
        cooldown_period: "cooldownPeriod",
        wake: "wake",
        min_replicas: "minReplicas",
        max_replicas: "maxReplicas",
    }
    Resiliency {
        actor_timeout: "actorTimeout",
        policies: "policies",
        rules: "rules",
    }
    RetryPolicy {
        max_attempts: "maxAttempts",
        backoff: "backoff",
        initial_interval: "initialInterval",
        max_interval: "maxInterval",
        initial_delay: "initialDelay",
    }
    ResourceRequirements {
        claims: "claims",
        limits: "limits",
        requests: "requests",
    }
}

impl<V: Overlay + Clone> Overlay for BTreeMap<String, V> {
    fn overlay(&mut self, inline: &Self, path: &str, origins: &mut Origins) {
        push_down(origins, path, self.keys().map(|k| join(path, k)));
        for (k, v) in inline {
            let at = join(path, k);
            match self.get_mut(k) {
                Some(base) => base.overlay(v, &at, origins),
                None => {
                    clear_origins_under(origins, &at);
                    self.insert(k.clone(), v.clone());
                }
            }
        }
    }
}

/// `env` items are keyed by name: an inline item replaces the flavors' item of that name.
impl Overlay for Vec<EnvVar> {
    fn overlay(&mut self, inline: &Self, path: &str, origins: &mut Origins) {
        push_down(
            origins,
            path,
            self.iter().map(|e| format!("{path}[{}]", e.name)),
        );
        for item in inline {
            origins.0.remove(&format!("{path}[{}]", item.name));
            match self.iter_mut().find(|e| e.name == item.name) {
                Some(slot) => slot.clone_from(item),
                None => self.push(item.clone()),
            }
        }
    }
}

/// Unkeyed lists: inline items the flavors do not already have are appended.
macro_rules! unkeyed_lists {
    ($($t:ty),* $(,)?) => {$(
        impl Overlay for Vec<$t> {
            fn overlay(&mut self, inline: &Self, path: &str, origins: &mut Origins) {
                push_down(origins, path, std::iter::empty());
                for item in inline {
                    if !self.contains(item) {
                        self.push(item.clone());
                    }
                }
            }
        }
    )*};
}

unkeyed_lists!(Toleration, ResiliencyRule, ResourceClaim);
