//! Flavors (docs/DESIGN.md §3, seed 002): where they come from, how they merge, and how an actor's
//! list of flavors resolves into one effective spec.
//!
//! Merge rules: lists append across flavors in flavor order; maps merge recursively; the same
//! leaf (or the same named list item, e.g. two `env` entries called `X`) set by two flavors is
//! a conflict naming both flavors and the key path; the actor's inline spec wins over every
//! flavor. The merge works on JSON so it is one rule for every field, present and future.

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

pub mod bounds;
mod catalog;
mod definition;
mod merge;
mod resolve;
mod typed;

pub use bounds::{FlavorMapGate, NotRead};
pub use catalog::FlavorCatalog;
pub use definition::{FlavorDef, FlavorSource};
pub use merge::{Origins, merge_flavors, overlay_inline};
pub use resolve::{Resolution, ResolvedFlavor, resolve};

#[cfg(test)]
mod equivalence;
#[cfg(test)]
mod tests;
