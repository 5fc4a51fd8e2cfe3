//! What the reconcile reads from and writes to the world, as one port per role: the watch
//! caches ([`Caches`]), the brokers and Redis ([`Brokers`]), the API server ([`Writes`]);
//! [`Cluster`] is all three. The background loops use [`Writes`] and [`Platform`]. The production implementation is
//! [`crate::kube_cluster::KubeCluster`]; the tests run every reconcile scenario against an
//! in-memory one, and the write contract against both (`conformance.rs`).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use asya_api::flavor::FlavorCatalog;
use asya_api::types::Resiliency;
use asya_api::{AsyncActor, AsyncActorStatus};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::DynamicObject;

use crate::apply_skip::Live;
use crate::broker_identity::permissions::Permissions;
use crate::model::{ObjectKind, WorkloadKind};
use crate::queue::owner::QueueRecord;
use crate::queue::{QueueDepth, QueueError, QueueInfo, QueueSpec};
use crate::render::TransportCredentials;
use crate::state_identity::StateError;
use crate::status::WorkloadObs;
use asya_api::queue_claim::{QueueClaim, QueueClaimSpec};

use super::Error;
use super::ownership::Write;
use super::plan::EventSpec;

/// What a watch cache says of an object's metadata.
#[derive(Clone, Debug, PartialEq)]
pub enum Cached {
    /// No cache watches that kind (Secrets, pods; KEDA's kinds without KEDA).
    NotCached,
    /// The cache does not hold it: absent, or present without our label (the caches watch
    /// only objects that carry it).
    Missing,
    Present(Box<ObjectMeta>),
}

impl Cached {
    /// The cached object as [`crate::apply_skip::decide_apply`] compares it.
    pub fn live(&self) -> Live {
        match self {
            Cached::NotCached => Live::NotCached,
            Cached::Missing => Live::Missing,
            Cached::Present(m) => Live::Present {
                generation: m.generation,
                applied: crate::apply_skip::applied_hash(&m.annotations),
            },
        }
    }
}

/// An object the controller applies (server-side apply, its field manager; forced only
/// over an object that is ours, see [`super::ownership`]).
#[derive(Clone, Debug)]
pub enum Object {
    Secret(Secret),
    ServiceAccount(ServiceAccount),
    Deployment(Deployment),
    StatefulSet(StatefulSet),
    ScaledObject(DynamicObject),
    TriggerAuthentication(DynamicObject),
}

impl Object {
    pub fn kind(&self) -> ObjectKind {
        match self {
            Object::Secret(_) => ObjectKind::Secret,
            Object::ServiceAccount(_) => ObjectKind::ServiceAccount,
            Object::Deployment(_) => ObjectKind::Deployment,
            Object::StatefulSet(_) => ObjectKind::StatefulSet,
            Object::ScaledObject(_) => ObjectKind::ScaledObject,
            Object::TriggerAuthentication(_) => ObjectKind::TriggerAuthentication,
        }
    }

    pub fn meta(&self) -> &ObjectMeta {
        match self {
            Object::Secret(o) => &o.metadata,
            Object::ServiceAccount(o) => &o.metadata,
            Object::Deployment(o) => &o.metadata,
            Object::StatefulSet(o) => &o.metadata,
            Object::ScaledObject(o) | Object::TriggerAuthentication(o) => &o.metadata,
        }
    }

    pub fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Object::Secret(o) => &mut o.metadata,
            Object::ServiceAccount(o) => &mut o.metadata,
            Object::Deployment(o) => &mut o.metadata,
            Object::StatefulSet(o) => &mut o.metadata,
            Object::ScaledObject(o) | Object::TriggerAuthentication(o) => &mut o.metadata,
        }
    }

    pub fn name(&self) -> String {
        self.meta().name.clone().unwrap_or_default()
    }

    /// Hash of what would be sent (see [`crate::apply_skip::desired_hash`]).
    pub fn hash(&self) -> u64 {
        use crate::apply_skip::desired_hash;
        match self {
            Object::Secret(o) => desired_hash(o),
            Object::ServiceAccount(o) => desired_hash(o),
            Object::Deployment(o) => desired_hash(o),
            Object::StatefulSet(o) => desired_hash(o),
            Object::ScaledObject(o) | Object::TriggerAuthentication(o) => desired_hash(o),
        }
    }

    /// Sets `spec.replicas` of a workload; other kinds have none.
    pub fn set_replicas(&mut self, n: i32) {
        match self {
            Object::Deployment(d) => d.spec.get_or_insert_default().replicas = Some(n),
            Object::StatefulSet(s) => s.spec.get_or_insert_default().replicas = Some(n),
            _ => {}
        }
    }
}

/// What the API server answered to an apply.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Answer {
    /// `metadata.generation` of the object as stored.
    pub generation: Option<i64>,
    /// What a workload says of itself (replicas, ready, why pods cannot be created).
    pub workload: Option<WorkloadObs>,
}

/// What the reconcile reads from the controller's watch caches: no request.
pub trait Caches: Send + Sync {
    /// Waits until every cache the reconcile reads has listed once: a status derived from an
    /// empty pod cache would be false.
    fn caches_ready(&self) -> impl Future<Output = Result<(), Error>> + Send;
    /// The flavors known now.
    fn catalog(&self) -> FlavorCatalog;
    /// Whether KEDA's CRDs are installed.
    fn keda_installed(&self) -> bool;
    /// Why KEDA cannot read the transport's queue depth (its monitor identity could not be
    /// ensured, [`crate::keda_identity`]); `None` when it can or nothing was tried yet.
    fn keda_identity_problem(&self, transport: &str) -> Option<String>;
    /// The cached object's metadata (generation, applied hash, labels, owners).
    fn cached(&self, kind: ObjectKind, ns: &str, name: &str) -> Cached;
    /// What the cached workload says of itself.
    fn cached_workload(&self, kind: WorkloadKind, ns: &str, name: &str) -> Option<WorkloadObs>;
    /// Whether the ScaledObject cache holds this one.
    fn scaled_object_cached(&self, ns: &str, name: &str) -> bool;
    /// The cached pods labelled as the actor's.
    fn pods(&self, ns: &str, actor: &str) -> Vec<Arc<Pod>>;
    /// `status.desiredReplicas` of the HPA KEDA made for the actor's ScaledObject.
    fn hpa_desired(&self, ns: &str, actor: &str) -> Option<i32>;
    /// The claim `name` from the provisioner's QueueClaim cache (a namespace's permissions
    /// read its actors' claims at once).
    fn claim_cached(&self, name: &str) -> Option<QueueClaimSpec>;

    /// The cached actors of namespace `ns`.
    fn actors_in(&self, ns: &str) -> Vec<Arc<AsyncActor>>;
    /// The cached (injected) pods of namespace `ns`, every actor's.
    fn pods_in(&self, ns: &str) -> Vec<Arc<Pod>>;
    /// The provisioner's own namespace, where the platform's credentials live.
    fn platform_namespace(&self) -> &str;
}

/// The brokers and the platform's Redis: queues, their owner records, the namespaces'
/// broker and state identities.
pub trait Brokers: Send + Sync {
    /// The transport's credentials (its client is built on first use): an error when the
    /// transport is not enabled or its secrets are missing.
    fn transport(
        &self,
        transport: &str,
    ) -> impl Future<Output = Result<TransportCredentials, QueueError>> + Send;
    fn queue_exists(
        &self,
        transport: &str,
        queue: &str,
    ) -> impl Future<Output = Result<bool, QueueError>> + Send;
    /// `None`: the queue does not exist.
    fn queue_depth(
        &self,
        transport: &str,
        queue: &str,
    ) -> impl Future<Output = Result<Option<QueueDepth>, QueueError>> + Send;
    /// Ensures a queue (declared, bound, tagged): one the claim step
    /// ([`super::claims`]) settled as the spec's actor's.
    fn queue_ensure(
        &self,
        transport: &str,
        spec: &QueueSpec,
    ) -> impl Future<Output = Result<QueueInfo, QueueError>> + Send;
    /// Deletes an actor's queue and its retry delay queues, which the claim step settled as
    /// the actor's; returns those delay queues.
    fn queue_delete(
        &self,
        transport: &str,
        queue: &str,
        resiliency: Option<&Resiliency>,
    ) -> impl Future<Output = Result<Vec<String>, QueueError>> + Send;
    /// What the broker records of the queue's owner ([`crate::queue::owner`]), asked of a
    /// queue without a claim; `None`: no such queue.
    fn queue_record(
        &self,
        transport: &str,
        queue: &str,
    ) -> impl Future<Output = Result<Option<QueueRecord>, QueueError>> + Send;
    /// The namespace's end queues are to be looked after (its actors were cleaned up).
    fn end_queues_candidate(&self, transport: &str, ns: &str);
    /// Creates or updates a namespace's broker user: password and permissions (scoped
    /// identity, docs/DESIGN.md §9).
    fn broker_user_put(
        &self,
        transport: &str,
        user: &str,
        password: &str,
        permissions: &Permissions,
    ) -> impl Future<Output = Result<(), QueueError>> + Send;
    /// Deletes a namespace's broker user and its exchange (its last actor is gone).
    fn broker_identity_delete(
        &self,
        transport: &str,
        ns: &str,
        user: &str,
    ) -> impl Future<Output = Result<(), QueueError>> + Send;

    /// Creates or resets namespace `ns`'s user on the platform's Redis (state proxies,
    /// docs/DESIGN.md §9): `password`, and exactly the connector's rules.
    fn state_user_put(
        &self,
        ns: &str,
        password: &str,
    ) -> impl Future<Output = Result<(), StateError>> + Send;
    /// Deletes namespace `ns`'s Redis user and closes its connections.
    fn state_user_delete(&self, ns: &str) -> impl Future<Output = Result<(), StateError>> + Send;
    /// Marks namespace `ns`'s state as the namespace `uid`'s unless it is marked: the mark
    /// before (`None`: this call set it).
    fn state_owner_claim(
        &self,
        ns: &str,
        uid: &str,
    ) -> impl Future<Output = Result<Option<String>, StateError>> + Send;
    /// Whether the platform's Redis still lets anyone in as `default` without a password.
    fn state_default_open(&self) -> impl Future<Output = Result<bool, StateError>> + Send;
}

/// The API server: the writes, and the reads a write is decided on (Secrets, which are not
/// cached; who holds a name; the claims as stored). `conformance.rs` runs one suite of this
/// contract on the fake and on `KubeCluster` against the test cluster's API server.
pub trait Writes: Send + Sync {
    /// `metadata.uid` of namespace `ns`, read from the API server (a namespace deleted and
    /// created again has another: its queue claims, state and gateway report token are
    /// bound to it); `None`: no such namespace.
    fn namespace_uid(
        &self,
        ns: &str,
    ) -> impl Future<Output = Result<Option<String>, kube::Error>> + Send;
    /// The QueueClaim `name` as the API server has it now.
    fn claim_get(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<QueueClaim>, kube::Error>> + Send;
    /// Creates a claim; `false`: one of that name exists already (the first wins).
    fn claim_create(
        &self,
        claim: &QueueClaim,
    ) -> impl Future<Output = Result<bool, kube::Error>> + Send;
    /// Deletes claim `name` only if it is still object `uid` (a precondition); `false` when
    /// it was absent or replaced since it was read.
    fn claim_delete(
        &self,
        name: &str,
        uid: &str,
    ) -> impl Future<Output = Result<bool, kube::Error>> + Send;
    /// A Secret as the API server has it now (Secrets are not cached: the provisioner may
    /// not list them).
    fn read_secret(
        &self,
        ns: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Secret>, kube::Error>> + Send;

    /// Records that the platform's password of `transport` was found copied into an actor
    /// namespace ([`crate::exposure`]): it stays exposed until it is changed.
    fn record_exposed(
        &self,
        transport: &str,
        password: &str,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
    /// Whether `password`, the transport's password now, was recorded as exposed.
    fn exposed(
        &self,
        transport: &str,
        password: &str,
    ) -> impl Future<Output = Result<bool, kube::Error>> + Send;

    /// Server-side apply under the condition `write` says ([`super::ownership::Write`]): a
    /// creation fails with 409 Conflict when the name is held after all; an update is forced
    /// and fails when the object is not the one seen.
    fn apply(
        &self,
        ns: &str,
        obj: &Object,
        write: &Write,
    ) -> impl Future<Output = Result<Answer, kube::Error>> + Send;
    /// The live object's metadata, read from the API server (the caches hold only objects
    /// with our label): who holds the name ([`super::ownership::claim`]), when no cache
    /// says.
    fn metadata(
        &self,
        kind: ObjectKind,
        ns: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<ObjectMeta>, kube::Error>> + Send;
    /// The live workload's `spec.replicas` (read from the API server, not the cache).
    fn replicas(
        &self,
        kind: WorkloadKind,
        ns: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<i32>, kube::Error>> + Send;
    /// The replica handoff manager takes `spec.replicas` at `n`.
    fn claim_replicas(
        &self,
        kind: WorkloadKind,
        ns: &str,
        name: &str,
        n: i32,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
    /// Deletes an object; `false` when it was not there. `uid`: only if it is still that
    /// object (a precondition: one replaced since it was read is not deleted).
    fn delete(
        &self,
        kind: ObjectKind,
        ns: &str,
        name: &str,
        uid: Option<&str>,
    ) -> impl Future<Output = Result<bool, kube::Error>> + Send;
    /// Deletes the Secret only if it carries our managed-by label (read first; the delete is
    /// conditional on that read's uid); `false` when it was absent or not ours.
    fn delete_owned_secret(
        &self,
        ns: &str,
        name: &str,
    ) -> impl Future<Output = Result<bool, kube::Error>> + Send;
    /// Whether the injection webhook works now (a dry-run create of a copy of `pod`).
    fn injection_works(&self, pod: &Pod) -> impl Future<Output = bool> + Send;

    /// Publishes an event about the actor (a failure is logged, not returned).
    fn event(&self, actor: &AsyncActor, ev: EventSpec) -> impl Future<Output = ()> + Send;
    fn patch_status(
        &self,
        actor: &AsyncActor,
        status: &AsyncActorStatus,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
    /// Adds our finalizer; the actor as patched.
    fn add_finalizer(
        &self,
        actor: &AsyncActor,
    ) -> impl Future<Output = Result<AsyncActor, Error>> + Send;
    fn remove_finalizer(
        &self,
        actor: &AsyncActor,
    ) -> impl Future<Output = Result<(), Error>> + Send;
}

/// A namespace as the API server has it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceNow {
    pub uid: String,
    /// `metadata.deletionTimestamp` is set: it is being deleted.
    pub terminating: bool,
}

/// What the provisioner's background loops (KEDA's monitor identity,
/// [`crate::keda_identity`]; the end queue sweep, [`crate::end_queues`]) read and write
/// besides [`Writes`]: namespaces as the API server has them now, the provisioner's own
/// ConfigMaps and KEDA's cluster-scoped ClusterTriggerAuthentication. `conformance.rs` runs
/// its contract on the fake and on `KubeCluster`.
pub trait Platform: Send + Sync {
    /// Namespace `ns` read from the API server (no cache: a sweep must see a namespace
    /// deleted a moment ago); `None`: no such namespace.
    fn namespace_now(
        &self,
        ns: &str,
    ) -> impl Future<Output = Result<Option<NamespaceNow>, kube::Error>> + Send;
    /// The data of ConfigMap `name` in the provisioner's namespace; `None`: no such
    /// ConfigMap.
    fn own_config_map(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<BTreeMap<String, String>>, kube::Error>> + Send;
    /// Sets ConfigMap `name`'s data in the provisioner's namespace to exactly `data`
    /// (server-side apply under `manager`: a key it applied before and does not name now
    /// goes), creating it if needed.
    fn own_config_map_apply(
        &self,
        name: &str,
        manager: &str,
        data: &BTreeMap<String, String>,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
    /// Server-side apply (field manager [`super::MANAGER`]) of a ClusterTriggerAuthentication,
    /// cluster-scoped; KEDA's CRDs must be installed.
    fn cluster_trigger_authentication_apply(
        &self,
        cta: &serde_json::Value,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
    /// The ClusterTriggerAuthentication `name` as stored; `None`: absent.
    fn cluster_trigger_authentication(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<serde_json::Value>, kube::Error>> + Send;
}

/// The reconcile's I/O, by role. The production implementation is
/// [`crate::kube_cluster::KubeCluster`]; the tests run every reconcile scenario against an
/// in-memory one.
pub trait Cluster: Caches + Brokers + Writes {}

impl<T: Caches + Brokers + Writes> Cluster for T {}
