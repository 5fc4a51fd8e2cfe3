//! One reconcile of one AsyncActor, as plan and apply, in one direction: the rules
//! ([`plan`], [`ownership`], pure) → [`memory`] → the ports ([`Cluster`]) → [`write`] (the
//! clock, status, delete-if-ours) → the steps (claims, queues, identities, the gateway report
//! token, KEDA's authentication, objects) → the drivers [`actor`] and [`cleanup`], entered
//! through [`Reconciler`]. The Kubernetes API and the brokers in production, memory in the
//! tests.

pub mod actor;
pub mod claims;
pub mod cleanup;
pub mod cluster;
pub mod gateway_report;
pub mod identity;
pub mod keda_auth;
pub mod memory;
pub mod objects;
pub mod ownership;
pub mod plan;
pub mod queues;
mod reconciler;
pub mod state_identity;
pub mod write;

#[cfg(test)]
mod conformance;
#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_claims;
#[cfg(test)]
mod tests_gateway_report;
#[cfg(test)]
mod tests_identity;
#[cfg(test)]
mod tests_state_identity;

pub use cluster::{
    Answer, Brokers, Cached, Caches, Cluster, NamespaceNow, Object, Platform, Writes,
};
pub use memory::Memory;
pub use plan::{FinalizerStep, Next};
pub use reconciler::{Error, Reconciler, actor_key};

/// The field manager of everything the controller applies, and its event reporter.
pub const MANAGER: &str = "asya-queue-provisioner";
pub const FINALIZER: &str = "asya.sh/queue-provisioner";
/// Field manager that keeps `spec.replicas` while KEDA's HPA takes it over.
pub const HANDOFF_MANAGER: &str = "asya-queue-provisioner-handoff";
