//! [`Cluster`] on a real cluster: reads from the controller's caches, writes through the
//! Kubernetes API (server-side apply, field manager [`MANAGER`]) and the transports' brokers.

use std::collections::BTreeMap;
use std::sync::Arc;

use asya_api::config::ClusterConfig;
use asya_api::flavor::{FlavorCatalog, FlavorDef};
use asya_api::types::Resiliency;
use asya_api::{AsyncActor, AsyncActorStatus, Flavor, labels};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use tracing::warn;

use crate::broker_identity::permissions::Permissions;
use crate::metrics::Metrics;
use crate::model::{ObjectKind, WorkloadKind};
use crate::queue::Backend;
use crate::queue::owner::QueueRecord;
use crate::queue::{QueueDepth, QueueError, QueueInfo, QueueOps, QueueSpec};
use crate::reconcile::ownership::Write;
use crate::reconcile::plan::EventSpec;
use crate::reconcile::{
    Answer, Brokers, Cached, Caches, Error, FINALIZER, HANDOFF_MANAGER, MANAGER, NamespaceNow,
    Object, Platform, Writes,
};
use crate::render::TransportCredentials;
use crate::state_identity::StateError;
use crate::status::{self, WorkloadObs};
use crate::transports::Transports;
use crate::watch;
use asya_api::queue_claim::{QueueClaim, QueueClaimSpec};
use k8s_openapi::api::core::v1::Namespace;

/// The label KEDA puts on the HPA it makes for a ScaledObject: the ScaledObject's name.
pub const KEDA_HPA_LABEL: &str = "scaledobject.keda.sh/name";

fn keda_hpa_name(scaled_object: &str) -> String {
    format!("keda-hpa-{scaled_object}")
}

fn gvk_resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

pub fn scaled_object_resource() -> ApiResource {
    gvk_resource("keda.sh", "v1alpha1", "ScaledObject", "scaledobjects")
}
pub fn trigger_auth_resource() -> ApiResource {
    gvk_resource(
        "keda.sh",
        "v1alpha1",
        "TriggerAuthentication",
        "triggerauthentications",
    )
}

pub struct KubeCluster {
    pub client: Client,
    pub config: Arc<ClusterConfig>,
    pub transports: Arc<Transports>,
    /// Namespaces whose actors were cleaned up: their end queues are looked after.
    pub end_queues: crate::end_queues::Candidates,
    pub recorder: Recorder,
    pub metrics: Metrics,
    /// A span per reconcile, when the `OTEL_*` variables ask for it.
    pub spans: Arc<asya_telemetry::Recorder>,
    pub flavors: Store<Flavor>,
    pub flavor_maps: Store<ConfigMap>,
    pub env_configs: Option<Store<DynamicObject>>,
    /// Caches of what the reconcile reads, fed by the same watches that trigger it: a
    /// reconcile lists nothing (a list per reconcile costs the API server a scan of the
    /// namespace, so work grows with the square of the actors).
    pub pods: Store<Pod>,
    pub deployments: Store<Deployment>,
    pub stateful_sets: Store<StatefulSet>,
    pub scaled_objects: Option<Store<DynamicObject>>,
    /// Metadata of the ServiceAccounts and TriggerAuthentications it applies (whether they
    /// are as it would render them).
    pub service_accounts: Store<PartialObjectMeta<ServiceAccount>>,
    pub trigger_auths: Option<Store<PartialObjectMeta<DynamicObject>>>,
    /// The HPAs KEDA makes for the ScaledObjects (desired replicas).
    pub hpas: Store<HorizontalPodAutoscaler>,
    /// The controller's own store of actors (a namespace's actors name its permissions).
    pub actors: Store<AsyncActor>,
    /// The provisioner's namespace (the platform's credentials are never removed there).
    pub own_namespace: String,
    /// KEDA's API (ScaledObject, TriggerAuthentication), when its CRDs are installed.
    pub keda: Option<(ApiResource, ApiResource)>,
    /// What the KEDA identity loop last found, by transport.
    pub keda_identity: crate::keda_identity::IdentityState,
    /// The platform's Redis (`stateProxy.redis`), for the namespaces' state identities.
    pub state_redis: Option<Arc<crate::state_identity::redis_admin::PlatformRedisAdmin>>,
    /// Platform passwords found copied into actor namespaces (`crate::exposure`).
    pub exposure: Option<Arc<crate::exposure::Ledger>>,
    /// Namespaces' names, uids and deletion marks (metadata only).
    pub namespaces: Store<PartialObjectMeta<Namespace>>,
    /// The QueueClaims (name and spec): whose each queue name is, for the namespaces'
    /// permissions. The claim step itself reads the API server.
    pub claims: Store<QueueClaim>,
}

/// The management API client of a transport with scoped identity.
fn tenant_admin<'a>(
    backend: &'a Backend,
    transport: &str,
) -> Result<&'a crate::queue::rabbitmq_admin::BrokerAdmin, QueueError> {
    match backend {
        Backend::Rabbit(q) => q.admin(),
        Backend::Sqs(_) => None,
    }
    .ok_or_else(|| {
        QueueError::Rejected(format!(
            "transport {transport}: per-namespace broker users need the management API \
             (transports.{transport}.config.managementPort)"
        ))
    })
}

/// Forced only over our own objects ([`crate::reconcile::ownership`]).
fn apply_params(force: bool) -> PatchParams {
    let p = PatchParams::apply(MANAGER);
    if force { p.force() } else { p }
}

/// The `metadata.resourceVersion` a creation is applied with. An apply that names a
/// resourceVersion is refused (409 Conflict) unless the stored object has that version, and
/// no stored object has this one (etcd's revisions of written keys start above 1); with no
/// object the apply creates it, the version ignored. So a creation never lands on an object
/// someone made under the name, without a read before it.
pub const CREATE_ONLY_VERSION: &str = "1";

/// `obj` with the condition `write` puts on its apply, and whether the apply is forced.
fn conditioned<K: Resource + Clone>(obj: &K, write: &Write) -> (K, bool) {
    let mut obj = obj.clone();
    let force = match write {
        Write::Create => {
            obj.meta_mut().resource_version = Some(CREATE_ONLY_VERSION.into());
            false
        }
        // An apply naming a uid is refused unless the stored object has it.
        Write::Update { uid } => {
            obj.meta_mut().uid = uid.clone();
            true
        }
    };
    (obj, force)
}

async fn apply_typed<K>(api: Api<K>, obj: &K, write: &Write) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    let (obj, force) = conditioned(obj, write);
    api.patch(&name, &apply_params(force), &Patch::Apply(&obj))
        .await
}

/// Deletes `name`; with `uid`, only that object (a precondition), never a same-named one
/// created since. `false`: absent, or replaced since it was read (409). The one delete of
/// the provisioner's adapters.
pub(crate) async fn delete_exact<K>(
    api: &Api<K>,
    name: &str,
    uid: Option<&str>,
) -> Result<bool, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut dp = DeleteParams::background();
    if let Some(uid) = uid {
        dp = dp.preconditions(kube::api::Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        });
    }
    match api.delete(name, &dp).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 || (s.code == 409 && uid.is_some()) => Ok(false),
        Err(e) => Err(e),
    }
}

async fn metadata_of<K>(api: Api<K>, name: &str) -> Result<Option<ObjectMeta>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    Ok(api.get_metadata_opt(name).await?.map(|m| m.metadata))
}

async fn replicas_of<K>(api: Api<K>, name: &str) -> Result<Option<i32>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let Some(current) = api.get_opt(name).await? else {
        return Ok(None);
    };
    let v = serde_json::to_value(&current).map_err(kube::Error::SerdeError)?;
    Ok(v.pointer("/spec/replicas")
        .and_then(|r| r.as_i64())
        .and_then(|r| i32::try_from(r).ok()))
}

async fn claim<K>(api: Api<K>, name: &str, replicas: i32) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let body = json!({"apiVersion": K::api_version(&()), "kind": K::kind(&()),
                      "metadata": {"name": name}, "spec": {"replicas": replicas}});
    api.patch(
        name,
        &PatchParams::apply(HANDOFF_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

fn cached_in<K: Resource<DynamicType = ()> + Clone>(
    store: &Store<K>,
    ns: &str,
    name: &str,
) -> Cached {
    cached_meta(store.get(&ObjectRef::new(name).within(ns)).as_deref())
}

fn cached_meta<K: Resource>(obj: Option<&K>) -> Cached {
    obj.map_or(Cached::Missing, |o| {
        Cached::Present(Box::new(o.meta().clone()))
    })
}

fn deployment_obs(d: &Deployment) -> WorkloadObs {
    let (replicas, ready) = watch::deployment_counts(d);
    WorkloadObs {
        replicas,
        ready: ready.unwrap_or(0),
        failure: watch::deployment_failure(d),
    }
}

fn stateful_set_obs(s: &StatefulSet) -> WorkloadObs {
    let (replicas, ready) = watch::stateful_set_counts(s);
    // The StatefulSet controller reports refused pod creates only as events.
    WorkloadObs {
        replicas,
        ready: ready.unwrap_or(0),
        failure: None,
    }
}

impl KubeCluster {
    fn dynamic(&self, ns: &str, ar: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), ns, ar)
    }

    async fn state_admin(
        &self,
    ) -> Result<Arc<crate::state_identity::redis_admin::RedisAdmin>, StateError> {
        match &self.state_redis {
            Some(p) => p.get().await,
            None => Err(StateError::Rejected(
                "the cluster configuration names no platform Redis (stateProxy.redis)".into(),
            )),
        }
    }

    fn state_op<T>(&self, op: &str, res: &Result<T, StateError>) {
        // The Redis of the state identities counts with the brokers' operations.
        self.metrics.queue_op("redis", op, res.is_ok());
    }

    fn backend_op<T>(&self, kind: &str, op: &str, res: &Result<T, QueueError>) {
        self.metrics.queue_op(kind, op, res.is_ok());
    }
}

impl Caches for KubeCluster {
    async fn caches_ready(&self) -> Result<(), Error> {
        let stopped = |what| move |_| Error::Cache(what);
        self.pods.wait_until_ready().await.map_err(stopped("pod"))?;
        self.hpas.wait_until_ready().await.map_err(stopped("HPA"))?;
        self.service_accounts
            .wait_until_ready()
            .await
            .map_err(stopped("ServiceAccount"))?;
        if let Some(s) = &self.trigger_auths {
            s.wait_until_ready()
                .await
                .map_err(stopped("TriggerAuthentication"))?;
        }
        self.deployments
            .wait_until_ready()
            .await
            .map_err(stopped("Deployment"))?;
        self.stateful_sets
            .wait_until_ready()
            .await
            .map_err(stopped("StatefulSet"))?;
        if let Some(s) = &self.scaled_objects {
            s.wait_until_ready()
                .await
                .map_err(stopped("ScaledObject"))?;
        }
        self.claims
            .wait_until_ready()
            .await
            .map_err(stopped("QueueClaim"))?;
        self.namespaces
            .wait_until_ready()
            .await
            .map_err(stopped("Namespace"))?;
        Ok(())
    }

    fn catalog(&self) -> FlavorCatalog {
        let mut c = FlavorCatalog::new();
        for f in self.flavors.state() {
            c.insert(FlavorDef::from_flavor(&f));
        }
        for cm in self.flavor_maps.state() {
            if let Some(d) = FlavorDef::from_config_map(&cm) {
                c.insert(d);
            }
        }
        if let Some(s) = &self.env_configs {
            for e in s.state() {
                if let Some(d) = serde_json::to_value(e.as_ref())
                    .ok()
                    .and_then(|v| FlavorDef::from_environment_config(&v))
                {
                    c.insert(d);
                }
            }
        }
        c
    }

    fn keda_installed(&self) -> bool {
        self.keda.is_some()
    }

    fn keda_identity_problem(&self, transport: &str) -> Option<String> {
        self.keda_identity.problem(transport)
    }

    fn cached(&self, kind: ObjectKind, ns: &str, name: &str) -> Cached {
        match kind {
            ObjectKind::ServiceAccount => cached_in(&self.service_accounts, ns, name),
            ObjectKind::Deployment => cached_in(&self.deployments, ns, name),
            ObjectKind::StatefulSet => cached_in(&self.stateful_sets, ns, name),
            ObjectKind::ScaledObject => match (&self.scaled_objects, &self.keda) {
                (Some(s), Some((so, _))) => cached_meta(
                    s.get(&ObjectRef::new_with(name, so.clone()).within(ns))
                        .as_deref(),
                ),
                _ => Cached::NotCached,
            },
            ObjectKind::TriggerAuthentication => match (&self.trigger_auths, &self.keda) {
                (Some(s), Some((_, ta))) => cached_meta(
                    s.get(&ObjectRef::new_with(name, ta.clone()).within(ns))
                        .as_deref(),
                ),
                _ => Cached::NotCached,
            },
            ObjectKind::Secret | ObjectKind::Pod => Cached::NotCached,
        }
    }

    fn cached_workload(&self, kind: WorkloadKind, ns: &str, name: &str) -> Option<WorkloadObs> {
        match kind {
            WorkloadKind::Deployment => self
                .deployments
                .get(&ObjectRef::new(name).within(ns))
                .map(|d| deployment_obs(&d)),
            WorkloadKind::StatefulSet => self
                .stateful_sets
                .get(&ObjectRef::new(name).within(ns))
                .map(|s| stateful_set_obs(&s)),
        }
    }

    fn scaled_object_cached(&self, ns: &str, name: &str) -> bool {
        match (&self.scaled_objects, &self.keda) {
            (Some(s), Some((so, _))) => s
                .get(&ObjectRef::new_with(name, so.clone()).within(ns))
                .is_some(),
            _ => false,
        }
    }

    fn pods(&self, ns: &str, actor: &str) -> Vec<Arc<Pod>> {
        self.pods
            .state()
            .into_iter()
            .filter(|p| {
                p.metadata.namespace.as_deref() == Some(ns)
                    && watch::label(&p.metadata.labels, labels::ACTOR) == Some(actor)
            })
            .collect()
    }

    fn hpa_desired(&self, ns: &str, actor: &str) -> Option<i32> {
        let hpa = self
            .hpas
            .get(&ObjectRef::new(&keda_hpa_name(actor)).within(ns))?;
        hpa.status.as_ref().map(|s| s.desired_replicas)
    }

    fn claim_cached(&self, name: &str) -> Option<QueueClaimSpec> {
        self.claims
            .get(&ObjectRef::new(name))
            .map(|c| c.spec.clone())
    }

    fn actors_in(&self, ns: &str) -> Vec<Arc<AsyncActor>> {
        self.actors
            .state()
            .into_iter()
            .filter(|a| a.metadata.namespace.as_deref() == Some(ns))
            .collect()
    }

    fn pods_in(&self, ns: &str) -> Vec<Arc<Pod>> {
        self.pods
            .state()
            .into_iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(ns))
            .collect()
    }

    fn platform_namespace(&self) -> &str {
        &self.own_namespace
    }
}

impl Brokers for KubeCluster {
    async fn transport(&self, transport: &str) -> Result<TransportCredentials, QueueError> {
        Ok(self.transports.get(transport).await?.1)
    }

    async fn queue_ensure(
        &self,
        transport: &str,
        spec: &QueueSpec,
    ) -> Result<QueueInfo, QueueError> {
        let (backend, _) = self.transports.get(transport).await?;
        let res = backend.ensure(spec).await;
        self.backend_op(backend.kind(), "ensure", &res);
        res
    }

    async fn queue_exists(&self, transport: &str, queue: &str) -> Result<bool, QueueError> {
        let (backend, _) = self.transports.get(transport).await?;
        let res = backend.exists(queue).await;
        self.backend_op(backend.kind(), "exists", &res);
        res
    }

    async fn queue_depth(
        &self,
        transport: &str,
        queue: &str,
    ) -> Result<Option<QueueDepth>, QueueError> {
        let (backend, _) = self.transports.get(transport).await?;
        backend.counted_depth(&self.metrics, queue).await
    }

    async fn queue_delete(
        &self,
        transport: &str,
        queue: &str,
        resiliency: Option<&Resiliency>,
    ) -> Result<Vec<String>, QueueError> {
        let (backend, _) = self.transports.get(transport).await?;
        let res = backend.delete_with_retry_queues(queue, resiliency).await;
        self.backend_op(backend.kind(), "delete", &res);
        res
    }

    async fn queue_record(
        &self,
        transport: &str,
        queue: &str,
    ) -> Result<Option<QueueRecord>, QueueError> {
        let (backend, _) = self.transports.get(transport).await?;
        let res = backend.owner_record(queue).await;
        self.backend_op(backend.kind(), "owner", &res);
        res
    }

    fn end_queues_candidate(&self, transport: &str, ns: &str) {
        self.end_queues.add(transport, ns);
    }

    async fn broker_user_put(
        &self,
        transport: &str,
        user: &str,
        password: &str,
        permissions: &Permissions,
    ) -> Result<(), QueueError> {
        let (backend, _) = self.transports.get(transport).await?;
        let admin = tenant_admin(&backend, transport)?;
        let res = async {
            admin.put_user(user, password).await?;
            admin.put_permissions(user, permissions).await
        }
        .await;
        self.backend_op(backend.kind(), "identity", &res);
        res
    }

    async fn broker_identity_delete(
        &self,
        transport: &str,
        ns: &str,
        user: &str,
    ) -> Result<(), QueueError> {
        let (backend, _) = self.transports.get(transport).await?;
        let res = async {
            tenant_admin(&backend, transport)?.delete_user(user).await?;
            match backend.as_ref() {
                Backend::Rabbit(q) => q.delete_tenant_exchange(ns).await,
                Backend::Sqs(_) => Ok(()),
            }
        }
        .await;
        self.backend_op(backend.kind(), "identity", &res);
        res
    }

    async fn state_user_put(&self, ns: &str, password: &str) -> Result<(), StateError> {
        let res = async { self.state_admin().await?.put_user(ns, password).await }.await;
        self.state_op("identity", &res);
        res
    }

    async fn state_user_delete(&self, ns: &str) -> Result<(), StateError> {
        let user = asya_api::state_proxy::redis_acl::username(ns);
        let res = async { self.state_admin().await?.delete_user(&user).await }.await;
        self.state_op("identity", &res);
        res
    }

    async fn state_owner_claim(&self, ns: &str, uid: &str) -> Result<Option<String>, StateError> {
        let res = async { self.state_admin().await?.claim_owner(ns, uid).await }.await;
        self.state_op("owner", &res);
        res
    }

    async fn state_default_open(&self) -> Result<bool, StateError> {
        self.state_admin().await?.default_user_open().await
    }
}

impl Writes for KubeCluster {
    async fn namespace_uid(&self, ns: &str) -> Result<Option<String>, kube::Error> {
        // From the watch's cache; the API server only for a namespace the cache has not seen
        // (just made) or sees going (its successor may be there already).
        if let Some(n) = self.namespaces.get(&ObjectRef::new(ns))
            && n.metadata.deletion_timestamp.is_none()
            && let Some(uid) = n.metadata.uid.clone()
        {
            return Ok(Some(uid));
        }
        let api: Api<Namespace> = Api::all(self.client.clone());
        Ok(api.get_metadata_opt(ns).await?.and_then(|m| m.metadata.uid))
    }

    async fn claim_get(&self, name: &str) -> Result<Option<QueueClaim>, kube::Error> {
        Api::<QueueClaim>::all(self.client.clone())
            .get_opt(name)
            .await
    }

    async fn claim_create(&self, claim: &QueueClaim) -> Result<bool, kube::Error> {
        let pp = PostParams {
            dry_run: false,
            field_manager: Some(MANAGER.into()),
        };
        match Api::<QueueClaim>::all(self.client.clone())
            .create(&pp, claim)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn claim_delete(&self, name: &str, uid: &str) -> Result<bool, kube::Error> {
        delete_exact(
            &Api::<QueueClaim>::all(self.client.clone()),
            name,
            Some(uid),
        )
        .await
    }

    async fn read_secret(&self, ns: &str, name: &str) -> Result<Option<Secret>, kube::Error> {
        Api::<Secret>::namespaced(self.client.clone(), ns)
            .get_opt(name)
            .await
    }

    async fn record_exposed(&self, transport: &str, password: &str) -> Result<(), kube::Error> {
        match &self.exposure {
            Some(l) => l.record(transport, password).await,
            None => Ok(()),
        }
    }

    async fn exposed(&self, transport: &str, password: &str) -> Result<bool, kube::Error> {
        match &self.exposure {
            Some(l) => l.unrotated(transport, password).await,
            None => Ok(false),
        }
    }

    async fn apply(&self, ns: &str, obj: &Object, write: &Write) -> Result<Answer, kube::Error> {
        let c = || self.client.clone();
        let generation = |m: &ObjectMeta| m.generation;
        Ok(match obj {
            Object::Secret(s) => {
                let out = apply_typed(Api::<Secret>::namespaced(c(), ns), s, write).await?;
                Answer {
                    generation: generation(&out.metadata),
                    workload: None,
                }
            }
            Object::ServiceAccount(s) => {
                let out = apply_typed(Api::<ServiceAccount>::namespaced(c(), ns), s, write).await?;
                Answer {
                    generation: generation(&out.metadata),
                    workload: None,
                }
            }
            Object::Deployment(d) => {
                let out = apply_typed(Api::<Deployment>::namespaced(c(), ns), d, write).await?;
                Answer {
                    generation: generation(&out.metadata),
                    workload: Some(deployment_obs(&out)),
                }
            }
            Object::StatefulSet(s) => {
                let out = apply_typed(Api::<StatefulSet>::namespaced(c(), ns), s, write).await?;
                Answer {
                    generation: generation(&out.metadata),
                    workload: Some(stateful_set_obs(&out)),
                }
            }
            Object::ScaledObject(o) | Object::TriggerAuthentication(o) => {
                let Some((so, ta)) = &self.keda else {
                    // Never planned without KEDA: nothing to apply it to.
                    return Ok(Answer::default());
                };
                let ar = if matches!(obj, Object::ScaledObject(_)) {
                    so
                } else {
                    ta
                };
                let out = apply_typed(self.dynamic(ns, ar), o, write).await?;
                Answer {
                    generation: generation(&out.metadata),
                    workload: None,
                }
            }
        })
    }

    async fn replicas(
        &self,
        kind: WorkloadKind,
        ns: &str,
        name: &str,
    ) -> Result<Option<i32>, kube::Error> {
        let c = self.client.clone();
        match kind {
            WorkloadKind::Deployment => {
                replicas_of(Api::<Deployment>::namespaced(c, ns), name).await
            }
            WorkloadKind::StatefulSet => {
                replicas_of(Api::<StatefulSet>::namespaced(c, ns), name).await
            }
        }
    }

    async fn claim_replicas(
        &self,
        kind: WorkloadKind,
        ns: &str,
        name: &str,
        n: i32,
    ) -> Result<(), kube::Error> {
        let c = self.client.clone();
        match kind {
            WorkloadKind::Deployment => claim(Api::<Deployment>::namespaced(c, ns), name, n).await,
            WorkloadKind::StatefulSet => {
                claim(Api::<StatefulSet>::namespaced(c, ns), name, n).await
            }
        }
    }

    async fn metadata(
        &self,
        kind: ObjectKind,
        ns: &str,
        name: &str,
    ) -> Result<Option<ObjectMeta>, kube::Error> {
        let c = self.client.clone();
        match kind {
            ObjectKind::Secret => metadata_of(Api::<Secret>::namespaced(c, ns), name).await,
            ObjectKind::ServiceAccount => {
                metadata_of(Api::<ServiceAccount>::namespaced(c, ns), name).await
            }
            ObjectKind::Deployment => metadata_of(Api::<Deployment>::namespaced(c, ns), name).await,
            ObjectKind::StatefulSet => {
                metadata_of(Api::<StatefulSet>::namespaced(c, ns), name).await
            }
            ObjectKind::Pod => metadata_of(Api::<Pod>::namespaced(c, ns), name).await,
            ObjectKind::ScaledObject | ObjectKind::TriggerAuthentication => {
                let Some((so, ta)) = &self.keda else {
                    return Ok(None);
                };
                let ar = if kind == ObjectKind::ScaledObject {
                    so
                } else {
                    ta
                };
                metadata_of(self.dynamic(ns, ar), name).await
            }
        }
    }

    async fn delete(
        &self,
        kind: ObjectKind,
        ns: &str,
        name: &str,
        uid: Option<&str>,
    ) -> Result<bool, kube::Error> {
        let c = self.client.clone();
        match kind {
            ObjectKind::Secret => delete_exact(&Api::<Secret>::namespaced(c, ns), name, uid).await,
            ObjectKind::ServiceAccount => {
                delete_exact(&Api::<ServiceAccount>::namespaced(c, ns), name, uid).await
            }
            ObjectKind::Deployment => {
                delete_exact(&Api::<Deployment>::namespaced(c, ns), name, uid).await
            }
            ObjectKind::StatefulSet => {
                delete_exact(&Api::<StatefulSet>::namespaced(c, ns), name, uid).await
            }
            ObjectKind::Pod => delete_exact(&Api::<Pod>::namespaced(c, ns), name, uid).await,
            ObjectKind::ScaledObject | ObjectKind::TriggerAuthentication => {
                let Some((so, ta)) = &self.keda else {
                    return Ok(false);
                };
                let ar = if kind == ObjectKind::ScaledObject {
                    so
                } else {
                    ta
                };
                delete_exact(&self.dynamic(ns, ar), name, uid).await
            }
        }
    }

    async fn delete_owned_secret(&self, ns: &str, name: &str) -> Result<bool, kube::Error> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
        let Some(s) = api.get_opt(name).await? else {
            return Ok(false);
        };
        if !crate::reconcile::ownership::managed_by_us(&s.metadata) {
            return Ok(false);
        }
        // Only the object just read: not a same-named one created since.
        delete_exact(&api, name, s.metadata.uid.as_deref()).await
    }

    /// A server-side dry run of creating a copy of `pod` (nothing is stored) comes back with
    /// the sidecar. A refusal (webhook down with failurePolicy Fail) counts as not working,
    /// and so does a probe it may not make: it needs RBAC `create` on pods (a dry run is
    /// authorized like a create).
    async fn injection_works(&self, pod: &Pod) -> bool {
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let mut spec = pod.spec.clone().unwrap_or_default();
        // Set by the scheduler and the priority admission on the original; not for a new pod.
        spec.node_name = None;
        spec.priority = None;
        let probe = Pod {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}-probe-", pod.name_any())),
                labels: pod.metadata.labels.clone(),
                annotations: pod.metadata.annotations.clone(),
                ..Default::default()
            },
            spec: Some(spec),
            status: None,
        };
        let pp = PostParams {
            dry_run: true,
            field_manager: Some(MANAGER.into()),
        };
        match api.create(&pp, &probe).await {
            Ok(created) => !status::needs_replacing(&created),
            // Without RBAC `create` on pods the dry run is refused before admission. Unchecked
            // replacement would loop delete/recreate while the webhook is down, so keep the pod
            // (its PodWithoutSidecar event stays) and say what is missing.
            Err(kube::Error::Api(s)) if s.code == 403 && !s.message.contains("webhook") => {
                warn!(error = %s.message, "no RBAC create on pods for the injection probe (the chart grants it); pods without the sidecar are kept, not replaced");
                false
            }
            Err(e) => {
                warn!(pod = %pod.name_any(), error = %e, "injection probe (dry-run pod create) failed");
                false
            }
        }
    }

    async fn event(&self, actor: &AsyncActor, ev: EventSpec) {
        let ev = Event {
            type_: if ev.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: ev.reason.as_str().into(),
            note: Some(ev.note),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &actor.object_ref(&())).await {
            warn!(error = %e, "publishing event failed");
        }
    }

    async fn patch_status(
        &self,
        actor: &AsyncActor,
        status: &AsyncActorStatus,
    ) -> Result<(), kube::Error> {
        let api: Api<AsyncActor> =
            Api::namespaced(self.client.clone(), &actor.namespace().unwrap_or_default());
        let body =
            json!({"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor", "status": status});
        api.patch_status(&actor.name_any(), &apply_params(true), &Patch::Apply(&body))
            .await?;
        Ok(())
    }

    /// A JSON patch that tests the list first, so a concurrent writer is not overwritten.
    async fn add_finalizer(&self, a: &AsyncActor) -> Result<AsyncActor, Error> {
        let api: Api<AsyncActor> =
            Api::namespaced(self.client.clone(), &a.namespace().unwrap_or_default());
        let ops = match a.metadata.finalizers.as_deref() {
            None | Some([]) => json!([
                {"op": "test", "path": "/metadata/finalizers", "value": a.metadata.finalizers},
                {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}
            ]),
            Some(list) => json!([
                {"op": "test", "path": "/metadata/finalizers", "value": list},
                {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}
            ]),
        };
        let patch = serde_json::from_value(ops).map_err(|e| Error::Finalizer(e.to_string()))?;
        Ok(api
            .patch(
                &a.name_any(),
                &PatchParams::default(),
                &Patch::Json::<()>(patch),
            )
            .await?)
    }

    async fn remove_finalizer(&self, a: &AsyncActor) -> Result<(), Error> {
        let Some(i) = a.finalizers().iter().position(|f| f == FINALIZER) else {
            return Ok(());
        };
        let api: Api<AsyncActor> =
            Api::namespaced(self.client.clone(), &a.namespace().unwrap_or_default());
        let path = format!("/metadata/finalizers/{i}");
        let ops = json!([
            {"op": "test", "path": path, "value": FINALIZER},
            {"op": "remove", "path": path}
        ]);
        let patch = serde_json::from_value(ops).map_err(|e| Error::Finalizer(e.to_string()))?;
        match api
            .patch(
                &a.name_any(),
                &PatchParams::default(),
                &Patch::Json::<()>(patch),
            )
            .await
        {
            Ok(_) => Ok(()),
            // Already gone: the API server removed the object once the last finalizer went.
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

impl Platform for KubeCluster {
    async fn namespace_now(&self, ns: &str) -> Result<Option<NamespaceNow>, kube::Error> {
        let n = Api::<Namespace>::all(self.client.clone())
            .get_metadata_opt(ns)
            .await?;
        Ok(n.map(|n| NamespaceNow {
            uid: n.metadata.uid.unwrap_or_default(),
            terminating: n.metadata.deletion_timestamp.is_some(),
        }))
    }

    async fn own_config_map(
        &self,
        name: &str,
    ) -> Result<Option<BTreeMap<String, String>>, kube::Error> {
        let cm = Api::<ConfigMap>::namespaced(self.client.clone(), &self.own_namespace)
            .get_opt(name)
            .await?;
        Ok(cm.map(|c| c.data.unwrap_or_default()))
    }

    async fn own_config_map_apply(
        &self,
        name: &str,
        manager: &str,
        data: &BTreeMap<String, String>,
    ) -> Result<(), kube::Error> {
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name}, "data": data});
        Api::<ConfigMap>::namespaced(self.client.clone(), &self.own_namespace)
            .patch(name, &PatchParams::apply(manager), &Patch::Apply(&body))
            .await?;
        Ok(())
    }

    async fn cluster_trigger_authentication_apply(
        &self,
        cta: &serde_json::Value,
    ) -> Result<(), kube::Error> {
        let name = cta
            .pointer("/metadata/name")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default();
        cluster_trigger_authentications(&self.client)
            .patch(name, &PatchParams::apply(MANAGER), &Patch::Apply(cta))
            .await?;
        Ok(())
    }

    async fn cluster_trigger_authentication(
        &self,
        name: &str,
    ) -> Result<Option<serde_json::Value>, kube::Error> {
        let cta = cluster_trigger_authentications(&self.client)
            .get_opt(name)
            .await?;
        cta.map(serde_json::to_value)
            .transpose()
            .map_err(kube::Error::SerdeError)
    }
}

fn cluster_trigger_authentications(client: &Client) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &crate::keda_identity::io::cluster_trigger_auth_resource(),
    )
}

impl KubeCluster {
    /// A KubeCluster for the background loops, which use only the API server
    /// ([`Writes`], [`Platform`]) and the brokers: every cache empty and no watch running,
    /// KEDA's namespaced kinds, Redis and the exposure ledger absent. `transports`: the
    /// controller's (and their configuration).
    pub fn api_only(client: Client, transports: Arc<Transports>, own_namespace: &str) -> Self {
        use kube::runtime::events::Reporter;
        use kube::runtime::reflector::store;
        KubeCluster {
            client: client.clone(),
            config: transports.config(),
            own_namespace: own_namespace.into(),
            transports,
            end_queues: crate::end_queues::Candidates::default(),
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: MANAGER.into(),
                    instance: None,
                },
            ),
            metrics: Metrics::default(),
            spans: Arc::new(asya_telemetry::Recorder::off()),
            flavors: store().0,
            flavor_maps: store().0,
            env_configs: None,
            pods: store().0,
            deployments: store().0,
            stateful_sets: store().0,
            scaled_objects: None,
            service_accounts: store().0,
            trigger_auths: None,
            hpas: store().0,
            actors: store().0,
            keda: None,
            keda_identity: crate::keda_identity::IdentityState::default(),
            state_redis: None,
            exposure: None,
            namespaces: store().0,
            claims: store().0,
        }
    }
}

#[cfg(test)]
impl KubeCluster {
    /// A KubeCluster for the write port's conformance suite ([`KubeCluster::api_only`] with
    /// transports of its own). Writes go to the API server as in production.
    pub fn with_empty_caches(
        client: Client,
        config: Arc<ClusterConfig>,
        own_namespace: &str,
    ) -> Self {
        let transports = Arc::new(Transports::new(
            config,
            Api::namespaced(client.clone(), own_namespace),
        ));
        Self::api_only(client, transports, own_namespace)
    }
}
