//! The kube-rs Controller on AsyncActor: the I/O edge around the pure `render` and `status`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use asya_api::config::{ClusterConfig, TRANSPORT_RABBITMQ};
use asya_api::flavor::{FlavorCatalog, FlavorDef};
use asya_api::{AsyncActor, AsyncActorStatus, Flavor, ResolvedActor, labels, naming};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{PredicateConfig, WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use tracing::{Instrument, info, info_span, warn};

use crate::health::{Health, Unsynced};
use crate::metrics::{ErrorLabel, Metrics, ResultLabel};
use crate::queue::{QueueError, QueueOps, QueueSpec};
use crate::render::{self, keda, workload};
use crate::status::{self, Observed, TransportObs, WorkloadObs};
use crate::transports::Transports;
use crate::work::{self, Applied, ApplyDecision, Live};

pub const MANAGER: &str = "asya-queue-provisioner";
pub const FINALIZER: &str = "asya.sh/queue-provisioner";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("transport: {0}")]
    Queue(#[from] QueueError),
    #[error("finalizer {FINALIZER}: {0}")]
    Finalizer(String),
    #[error("object has no namespace")]
    NoNamespace,
    /// A cache's watch ended (the process is shutting down).
    #[error("the {0} cache stopped")]
    Cache(&'static str),
}

impl Error {
    fn kind(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Queue(_) => "transport",
            Error::Finalizer(_) => "finalizer",
            Error::NoNamespace => "invalid",
            Error::Cache(_) => "cache",
        }
    }
}

pub struct Ctx {
    pub client: Client,
    pub config: Arc<ClusterConfig>,
    pub transports: Arc<Transports>,
    /// Namespaces whose actors were cleaned up: their end queues are looked after.
    pub end_queues: crate::end_queues::Candidates,
    pub recorder: Recorder,
    pub metrics: Metrics,
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
    /// KEDA's API, when its CRDs are installed.
    pub keda: Option<(ApiResource, ApiResource)>,
    /// Consecutive failures per actor, for exponential backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// Queues ensured or checked recently (transport/queue → when, spec, info): within
    /// [`RECHECK`] a reconcile trusts them without asking the broker.
    ensured: Mutex<HashMap<String, (Instant, QueueSpec, crate::queue::QueueInfo)>>,
    /// What was applied last per object (kind/namespace/name), to skip applies that would
    /// not change anything.
    applied: Mutex<HashMap<String, Applied>>,
}

/// How long a queue's existence is trusted: checked once per interval, not per reconcile.
/// Below [`PERIOD`], so each periodic reconcile checks.
const RECHECK: Duration = Duration::from_secs(55);
/// The periodic reconcile (queue check, queue depth), spread over [`PERIOD`] + up to
/// [`SPREAD`] by actor so that actors applied together do not come back together.
const PERIOD: Duration = Duration::from_secs(60);
const SPREAD: Duration = Duration::from_secs(15);
/// An actor with messages queued or in process is looked at this often instead (+ up to
/// [`BUSY_SPREAD`]), so that QUEUED and PROCESSING follow its queue as it drains rather than
/// show the last busy sample for a minute. Idle actors, the many, stay at [`PERIOD`].
const BUSY_PERIOD: Duration = Duration::from_secs(15);
const BUSY_SPREAD: Duration = Duration::from_secs(5);
/// Reconciles at once. Each is mostly waiting on the API server and the broker; more than
/// this only queues up in them on a 2-core machine (see docs/benchmarks.md).
pub const CONCURRENCY: u16 = 16;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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

async fn crd_exists(client: &Client, ar: &ApiResource) -> bool {
    let gvk = GroupVersionKind::gvk(&ar.group, &ar.version, &ar.kind);
    kube::discovery::oneshot::pinned_kind(client, &gvk)
        .await
        .is_ok()
}

impl Ctx {
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

    fn backoff(&self, key: &str, failed: bool) -> Duration {
        let mut m = lock(&self.failures);
        if !failed {
            m.remove(key);
            return Duration::ZERO;
        }
        let n = m.entry(key.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        // 2 s, 4 s, … capped at 5 minutes.
        Duration::from_secs((1u64 << (*n).min(8)).min(300)).max(Duration::from_secs(2))
    }

    async fn event(&self, actor: &AsyncActor, warning: bool, reason: &str, note: String) {
        let ev = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &actor.object_ref(&())).await {
            warn!(error = %e, "publishing event failed");
        }
    }
}

fn apply_params() -> PatchParams {
    PatchParams::apply(MANAGER).force()
}

async fn apply<K>(api: &Api<K>, name: &str, obj: &K) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    api.patch(name, &apply_params(), &Patch::Apply(obj)).await
}

/// Field manager that keeps `spec.replicas` while KEDA's HPA takes it over.
const HANDOFF_MANAGER: &str = "asya-queue-provisioner-handoff";

/// Switching from fixed replicas to KEDA: our apply stops setting `spec.replicas`, and a field
/// no manager owns any more is reset to its default (1), scaling a busy actor in. A handoff
/// manager first claims the current value (the SSA ownership-transfer pattern), so the count
/// stays until the HPA changes it.
async fn hand_replicas_over<K>(api: &Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let Some(current) = api.get_opt(name).await? else {
        return Ok(());
    };
    let v = serde_json::to_value(&current).map_err(kube::Error::SerdeError)?;
    let Some(replicas) = v
        .pointer("/spec/replicas")
        .and_then(|r| r.as_i64())
        .and_then(|r| i32::try_from(r).ok())
    else {
        return Ok(());
    };
    claim_replicas::<K>(api, name, replicas).await
}

/// The handoff manager takes `spec.replicas` at `replicas`.
async fn claim_replicas<K>(api: &Api<K>, name: &str, replicas: i32) -> Result<(), kube::Error>
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

async fn delete_ignore_missing<K>(api: &Api<K>, name: &str) -> Result<bool, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

fn actor_key(a: &AsyncActor) -> String {
    format!("{}/{}", a.namespace().unwrap_or_default(), a.name_any())
}

fn queue_spec(ns: &str, actor: &str, timeout: Duration) -> QueueSpec {
    QueueSpec {
        name: naming::actor_queue(ns, actor),
        namespace: ns.into(),
        actor: actor.into(),
        visibility_timeout: timeout,
    }
}

/// Key of one object in [`Ctx::applied`].
fn object_key(kind: &str, ns: &str, name: &str) -> String {
    format!("{kind}/{ns}/{name}")
}

/// Applies `desired` (server-side apply, with its hash in [`work::APPLIED_HASH`]) unless the
/// last apply sent the same and the live object (`live`, from a cache) is still the one it
/// produced, or a restarted controller finds it carrying that hash. `None` when skipped.
async fn apply_changed<K>(
    ctx: &Ctx,
    api: &Api<K>,
    kind: &str,
    ns: &str,
    desired: K,
    live: Live,
) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    apply_changed_with(ctx, api, kind, ns, desired, live, |_| ()).await
}

/// [`apply_changed`], with `finish` applied to what is sent after the hash is taken: a field
/// set only when creating, which later applies then leave out without it counting as a change.
async fn apply_changed_with<K>(
    ctx: &Ctx,
    api: &Api<K>,
    kind: &str,
    ns: &str,
    mut desired: K,
    live: Live,
    finish: impl FnOnce(&mut K),
) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let name = desired.meta().name.clone().unwrap_or_default();
    let key = object_key(kind, ns, &name);
    let hash = work::desired_hash(&desired);
    let now = Instant::now();
    let decision = work::decide_apply(lock(&ctx.applied).get(&key), hash, live, now);
    let generation = match decision {
        ApplyDecision::Skip => return Ok(None),
        ApplyDecision::Adopt { generation } => {
            lock(&ctx.applied).insert(
                key,
                Applied {
                    hash,
                    generation,
                    at: now,
                },
            );
            return Ok(None);
        }
        ApplyDecision::Apply => {
            finish(&mut desired);
            desired
                .meta_mut()
                .annotations
                .get_or_insert_default()
                .insert(work::APPLIED_HASH.into(), format!("{hash:016x}"));
            let out = apply(api, &name, &desired).await?;
            (out.meta().generation, out)
        }
    };
    lock(&ctx.applied).insert(
        key,
        Applied {
            hash,
            generation: generation.0,
            at: Instant::now(),
        },
    );
    Ok(Some(generation.1))
}

/// How the reconcile reads and writes one workload kind.
struct WorkloadKind<K> {
    kind: &'static str,
    /// (spec.replicas, readyReplicas).
    counts: fn(&K) -> (Option<i32>, Option<i32>),
    /// Why its pods cannot be created, while they cannot.
    failure: fn(&K) -> Option<String>,
    set_replicas: fn(&mut K, i32),
}

const DEPLOYMENT: WorkloadKind<Deployment> = WorkloadKind {
    kind: "Deployment",
    counts: work::deployment_counts,
    failure: work::deployment_failure,
    set_replicas: |d, n| d.spec.get_or_insert_default().replicas = Some(n),
};

const STATEFUL_SET: WorkloadKind<StatefulSet> = WorkloadKind {
    kind: "StatefulSet",
    counts: work::stateful_set_counts,
    // The StatefulSet controller reports refused pod creates only as events.
    failure: |_| None,
    set_replicas: |s, n| s.spec.get_or_insert_default().replicas = Some(n),
};

/// Applies a workload (when it changed) and returns what it says of itself: from the apply's
/// answer, or the cache when the apply was skipped. A KEDA-scaled workload is created
/// at its minimum ([`work::initial_replicas`]), and the count handed to the handoff manager at
/// once, so our later applies (which leave replicas to the HPA) do not reset it.
async fn apply_workload<K>(
    ctx: &Ctx,
    api: &Api<K>,
    wk: &WorkloadKind<K>,
    ns: &str,
    desired: K,
    store: &Store<K>,
    scaling: (bool, Option<i32>),
) -> Result<WorkloadObs, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let name = desired.meta().name.clone().unwrap_or_default();
    let live = live_in(store, ns, &name);
    let applied_before = lock(&ctx.applied).contains_key(&object_key(wk.kind, ns, &name));
    let initial = work::initial_replicas(scaling.0, scaling.1, &live, applied_before);
    let set = wk.set_replicas;
    let finish = |k: &mut K| {
        if let Some(n) = initial {
            set(k, n)
        }
    };
    let sent = apply_changed_with(ctx, api, wk.kind, ns, desired, live, finish).await?;
    if let (Some(n), Some(_)) = (initial, &sent) {
        claim_replicas::<K>(api, &name, n).await?;
    }
    let read = |k: &K| ((wk.counts)(k), (wk.failure)(k));
    let ((replicas, ready), failure) = match sent {
        Some(sent) => read(&sent),
        None => store
            .get(&ObjectRef::new(&name).within(ns))
            .map(|k| read(&k))
            .unwrap_or_default(),
    };
    Ok(WorkloadObs {
        replicas,
        ready: ready.unwrap_or(0),
        failure,
    })
}

/// The cached object as [`work::decide_apply`] compares it.
fn live_of(meta: Option<&ObjectMeta>) -> Live {
    match meta {
        Some(m) => Live::Present {
            generation: m.generation,
            applied: work::applied_hash(&m.annotations),
        },
        None => Live::Missing,
    }
}

fn live_in<K: Resource<DynamicType = ()> + Clone>(store: &Store<K>, ns: &str, name: &str) -> Live {
    live_of(
        store
            .get(&ObjectRef::new(name).within(ns))
            .as_deref()
            .map(Resource::meta),
    )
}

/// The periodic requeue of a settled actor, spread by actor; sooner while it has messages.
fn periodic(key: &str, busy: bool) -> Duration {
    let (base, spread) = if busy {
        (BUSY_PERIOD, BUSY_SPREAD)
    } else {
        (PERIOD, SPREAD)
    };
    base + Duration::from_millis(work::desired_hash(&key) % spread.as_millis() as u64)
}

/// The label KEDA puts on the HPA it makes for a ScaledObject: the ScaledObject's name.
const KEDA_HPA_LABEL: &str = "scaledobject.keda.sh/name";

fn keda_hpa_name(scaled_object: &str) -> String {
    format!("keda-hpa-{scaled_object}")
}

fn has_finalizer(a: &AsyncActor) -> bool {
    a.finalizers().iter().any(|f| f == FINALIZER)
}

/// Adds the finalizer and goes on with the patched object in the same reconcile (a JSON
/// patch that tests the list first, so a concurrent writer is not overwritten).
async fn add_finalizer(api: &Api<AsyncActor>, a: &AsyncActor) -> Result<AsyncActor, Error> {
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

async fn remove_finalizer(api: &Api<AsyncActor>, a: &AsyncActor) -> Result<(), Error> {
    let Some(i) = a.finalizers().iter().position(|f| f == FINALIZER) else {
        return Ok(());
    };
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

pub async fn reconcile(actor: Arc<AsyncActor>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = actor.namespace().ok_or(Error::NoNamespace)?;
    let span = info_span!("reconcile", namespace = %ns, name = %actor.name_any());
    let started = Instant::now();
    let res = async {
        // The caches the reconcile reads must have listed once (the controller only waits
        // for its own): a status derived from an empty pod cache would be false.
        let stopped = |what| move |_| Error::Cache(what);
        ctx.pods.wait_until_ready().await.map_err(stopped("pod"))?;
        ctx.hpas.wait_until_ready().await.map_err(stopped("HPA"))?;
        ctx.service_accounts
            .wait_until_ready()
            .await
            .map_err(stopped("ServiceAccount"))?;
        if let Some(s) = &ctx.trigger_auths {
            s.wait_until_ready()
                .await
                .map_err(stopped("TriggerAuthentication"))?;
        }
        ctx.deployments
            .wait_until_ready()
            .await
            .map_err(stopped("Deployment"))?;
        ctx.stateful_sets
            .wait_until_ready()
            .await
            .map_err(stopped("StatefulSet"))?;
        if let Some(s) = &ctx.scaled_objects {
            s.wait_until_ready()
                .await
                .map_err(stopped("ScaledObject"))?;
        }
        let api: Api<AsyncActor> = Api::namespaced(ctx.client.clone(), &ns);
        if actor.metadata.deletion_timestamp.is_some() {
            if !has_finalizer(&actor) {
                return Ok(Action::await_change());
            }
            let action = cleanup(actor.clone(), ctx.clone()).await?;
            remove_finalizer(&api, &actor).await?;
            return Ok(action);
        }
        let actor = if has_finalizer(&actor) {
            actor
        } else {
            Arc::new(add_finalizer(&api, &actor).await?)
        };
        apply_actor(actor, ctx.clone()).await
    }
    .instrument(span)
    .await;
    ctx.metrics
        .duration
        .observe(started.elapsed().as_secs_f64());
    ctx.metrics
        .reconciles
        .get_or_create(&ResultLabel {
            result: if res.is_ok() { "ok" } else { "error" }.into(),
        })
        .inc();
    res
}

pub fn error_policy(actor: Arc<AsyncActor>, err: &Error, ctx: Arc<Ctx>) -> Action {
    ctx.metrics
        .errors
        .get_or_create(&ErrorLabel {
            kind: err.kind().into(),
        })
        .inc();
    let wait = ctx.backoff(&actor_key(&actor), true);
    warn!(namespace = %actor.namespace().unwrap_or_default(), name = %actor.name_any(), error = %err, retry_in = ?wait, "reconcile failed");
    Action::requeue(wait)
}

/// Writes status only when it changed, so a status write does not start an endless loop of
/// reconciles.
async fn write_status(
    ctx: &Ctx,
    actor: &AsyncActor,
    new: AsyncActorStatus,
) -> Result<(), kube::Error> {
    let old = actor.status.clone().unwrap_or_default();
    if old == new {
        return Ok(());
    }
    if old.phase != new.phase {
        let phase = new.phase.clone().unwrap_or_default();
        let warning = matches!(
            phase.as_str(),
            status::PHASE_TRANSPORT_ERROR
                | status::PHASE_RUNTIME_ERROR
                | status::PHASE_SIDECAR_ERROR
                | status::PHASE_IMAGE_PULL_ERROR
                | status::PHASE_DEGRADED
                | status::PHASE_WAITING
        );
        ctx.event(
            actor,
            warning,
            &phase,
            format!(
                "phase {} -> {phase}: {}",
                old.phase.as_deref().unwrap_or("none"),
                new.message.as_deref().unwrap_or_default()
            ),
        )
        .await;
    }
    let api: Api<AsyncActor> =
        Api::namespaced(ctx.client.clone(), &actor.namespace().unwrap_or_default());
    let body = json!({"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor", "status": new});
    api.patch_status(&actor.name_any(), &apply_params(), &Patch::Apply(&body))
        .await?;
    Ok(())
}

fn base_observed(actor: &AsyncActor) -> Observed {
    Observed {
        generation: actor.metadata.generation,
        deleting: actor.metadata.deletion_timestamp.is_some(),
        flavors: vec![],
        missing_flavors: vec![],
        invalid: None,
        transport: TransportObs::NotAttempted,
        workload_kind: None,
        workload: None,
        workload_error: None,
        pods: vec![],
        scaling_enabled: true,
        scaling_error: None,
        hpa_desired: None,
        min_replicas: None,
        max_replicas: None,
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

async fn apply_actor(actor: Arc<AsyncActor>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let key = actor_key(&actor);
    let prev = actor.status.clone().unwrap_or_default();
    let mut o = base_observed(&actor);
    let review = asya_api::review::review_typed(&actor, &ctx.catalog(), &ctx.config);
    o.missing_flavors = review.missing_flavors.clone();
    let resolved = match review.resolved {
        Some(r) if review.errors.is_empty() && r.missing_flavors.is_empty() => r,
        r => {
            if let Some(r) = r {
                o.flavors = r.flavors.clone();
            }
            if !review.errors.is_empty() {
                o.invalid = Some(review.errors.to_string());
            }
            if o.missing_flavors.is_empty() && o.invalid.is_none() {
                o.invalid = Some("the spec could not be resolved".into());
            }
            write_status(&ctx, &actor, status::derive(&prev, &o, now())).await?;
            // Flavor watches re-trigger too, but may run before the catalog cache has the flavor.
            return Ok(Action::requeue(Duration::from_secs(10)));
        }
    };
    o.flavors = resolved.flavors.clone();
    o.scaling_enabled = resolved.scaling_enabled();
    o.workload_kind = Some(resolved.workload_kind().to_string());
    let s = resolved.scaling();
    (o.min_replicas, o.max_replicas) = if o.scaling_enabled {
        (s.min_replica_count, s.max_replica_count)
    } else {
        (
            Some(resolved.fixed_replicas()),
            Some(resolved.fixed_replicas()),
        )
    };

    // 1. Queues: the namespace's end queues, then the actor's.
    let transport = match ensure_queues(&ctx, &actor, &resolved).await {
        Ok(t) => t,
        Err(e) => {
            let wait = match &e {
                QueueError::RecreateCooldown(_) => e.retry_after(),
                _ => ctx
                    .backoff(&key, true)
                    .max(e.retry_after().min(Duration::from_secs(5))),
            };
            let reason = match &e {
                QueueError::Unavailable(_) => "Unavailable",
                QueueError::RecreateCooldown(_) => "RecreateCooldown",
                QueueError::Rejected(_) => "Rejected",
            };
            o.transport = TransportObs::Failed {
                reason: reason.into(),
                message: e.to_string(),
            };
            write_status(&ctx, &actor, status::derive(&prev, &o, now())).await?;
            return Ok(Action::requeue(wait));
        }
    };
    o.transport = transport;

    // 2. Kubernetes objects.
    let labels = actor.labels().clone();
    let owner = actor
        .controller_owner_ref(&())
        .ok_or(Error::Finalizer("actor has no uid".into()))?;
    let queue_url = match &o.transport {
        TransportObs::Ready(info, _) => Some(info.url.clone()),
        _ => None,
    };
    if let Err(e) = apply_objects(
        &ctx,
        &actor,
        &resolved,
        &labels,
        &owner,
        &mut o,
        queue_url.as_deref(),
    )
    .await
    {
        o.workload_error.get_or_insert_with(|| e.to_string());
    }

    // 3. Pods that escaped injection.
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &resolved.namespace);
    let pods: Vec<Arc<Pod>> = ctx
        .pods
        .state()
        .into_iter()
        .filter(|p| {
            p.metadata.namespace.as_deref() == Some(resolved.namespace.as_str())
                && work::label(&p.metadata.labels, labels::ACTOR) == Some(resolved.name.as_str())
        })
        .collect();
    let bare: Vec<&Pod> = pods
        .iter()
        .map(Arc::as_ref)
        .filter(|p| status::needs_replacing(p))
        .collect();
    // Replaced only once injection works again: deleting while the webhook is still down
    // would only bring another pod without the sidecar, in a loop.
    let injection_down = match bare.first() {
        Some(p) => !injection_works(&pods_api, p).await,
        None => false,
    };
    for p in &bare {
        let pn = p.name_any();
        if injection_down {
            ctx.event(&actor, true, "PodWithoutSidecar",
                format!("pod {pn} carries no asya-sidecar and injection still fails (the webhook is unavailable); it is replaced once injection works")).await;
            continue;
        }
        delete_ignore_missing(&pods_api, &pn).await?;
        ctx.event(&actor, true, "PodWithoutSidecarReplaced",
            format!("pod {pn} carries no asya-sidecar (created while the injection webhook was unavailable); deleted so its controller recreates it with the sidecar")).await;
    }
    o.pods = pods
        .iter()
        .filter(|p| !status::needs_replacing(p))
        .map(|p| status::classify_pod(p))
        .collect();

    // 4. KEDA's HPA target.
    if o.scaling_enabled {
        let hpa = ctx
            .hpas
            .get(&ObjectRef::new(&keda_hpa_name(&resolved.name)).within(&resolved.namespace));
        if let Some(h) = hpa {
            o.hpa_desired = h.status.as_ref().map(|s| s.desired_replicas);
        }
    }

    let new = status::derive(&prev, &o, now());
    let failed = o.workload_error.is_some() || o.scaling_error.is_some();
    write_status(&ctx, &actor, new).await?;
    let backoff = ctx.backoff(&key, failed);
    // The periodic requeue is also the check that the queue still exists. Pods and the
    // workload report through their watches: an unsettled actor needs no faster poll.
    Ok(Action::requeue(if failed {
        backoff
    } else if injection_down {
        Duration::from_secs(10)
    } else {
        periodic(&key, o.has_messages())
    }))
}

/// Whether the injection webhook works now: a server-side dry run of creating a copy of
/// `pod` (nothing is stored) comes back with the sidecar. A refusal (webhook down with
/// failurePolicy Fail) counts as not working, and so does a probe it may not make: it needs
/// RBAC `create` on pods (a dry run is authorized like a create).
async fn injection_works(api: &Api<Pod>, pod: &Pod) -> bool {
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

/// Ensures one queue. Within [`RECHECK`] of the last ensure or check with the same spec it
/// is trusted without a broker call; after that one existence check (a vanished queue is
/// recreated at once), so each queue costs the broker one call per interval, not one per
/// reconcile, and a namespace's end queues are checked once for all its actors.
async fn ensure_cached(
    ctx: &Ctx,
    backend: &crate::queue::Backend,
    transport: &str,
    spec: QueueSpec,
) -> Result<crate::queue::QueueInfo, QueueError> {
    let key = ensured_key(transport, &spec.name);
    let known = lock(&ctx.ensured)
        .get(&key)
        .filter(|(_, s, _)| *s == spec)
        .map(|(at, _, info)| (at.elapsed() < RECHECK, info.clone()));
    if let Some((fresh, mut info)) = known {
        info.created = false;
        if fresh {
            return Ok(info);
        }
        let res = backend.exists(&spec.name).await;
        ctx.metrics.queue_op(backend.kind(), "exists", res.is_ok());
        if res? {
            lock(&ctx.ensured).insert(key, (Instant::now(), spec, info.clone()));
            return Ok(info);
        }
    }
    let res = backend.ensure(&spec).await;
    ctx.metrics.queue_op(backend.kind(), "ensure", res.is_ok());
    let info = res?;
    lock(&ctx.ensured).insert(key, (Instant::now(), spec, info.clone()));
    Ok(info)
}

/// The key of a queue in `Ctx::ensured`.
fn ensured_key(transport: &str, queue: &str) -> String {
    format!("{transport}/{queue}")
}

/// Visibility timeout of the end queues: theirs, not the timeout of whichever actor of the
/// namespace ensures them (actors with different timeouts would rewrite it in turn).
const END_QUEUE_VISIBILITY: Duration = Duration::from_secs(300);

async fn ensure_queues(
    ctx: &Ctx,
    actor: &AsyncActor,
    r: &ResolvedActor,
) -> Result<TransportObs, QueueError> {
    let (backend, _) = ctx.transports.get(&r.transport).await?;
    for end in [naming::SINK_ACTOR, naming::SUMP_ACTOR] {
        let spec = queue_spec(&r.namespace, end, END_QUEUE_VISIBILITY);
        ensure_cached(ctx, &backend, &r.transport, spec).await?;
    }
    let spec = queue_spec(&r.namespace, &r.actor, r.actor_timeout);
    let mut info = ensure_cached(ctx, &backend, &r.transport, spec.clone()).await?;
    let mut depth = backend.counted_depth(&ctx.metrics, &r.queue).await;
    if !info.created && matches!(depth, Ok(None)) {
        // Gone although ensured before (deleted behind our back): every look at the depth
        // is also a check, so it is back now rather than at the next periodic existence check.
        lock(&ctx.ensured).remove(&ensured_key(&r.transport, &spec.name));
        info = ensure_cached(ctx, &backend, &r.transport, spec).await?;
        depth = backend.counted_depth(&ctx.metrics, &r.queue).await;
    }
    if info.created {
        // Both a first creation and the recreation of a vanished queue land here.
        let again = actor
            .status
            .as_ref()
            .and_then(|s| s.queue_identifier.as_ref())
            .is_some();
        let (reason, note) = if again {
            (
                "QueueRecreated",
                format!(
                    "queue {} had disappeared from {}; recreated",
                    r.queue, r.transport
                ),
            )
        } else {
            (
                "QueueCreated",
                format!("queue {} created on {}", r.queue, r.transport),
            )
        };
        ctx.event(actor, again, reason, note).await;
    }
    Ok(TransportObs::Ready(info, depth.ok().flatten()))
}

#[allow(clippy::too_many_arguments)]
async fn apply_objects(
    ctx: &Ctx,
    actor: &AsyncActor,
    r: &ResolvedActor,
    labels: &BTreeMap<String, String>,
    owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    o: &mut Observed,
    queue_url: Option<&str>,
) -> Result<(), kube::Error> {
    let client = ctx.client.clone();
    let ns = &r.namespace;
    let transport = ctx.config.transports.get(&r.transport);

    // Transport credentials in the actor's namespace (shared by its actors: one apply).
    if let (Some(t), Ok((_, creds))) = (transport, ctx.transports.get(&r.transport).await) {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
        for s in render::transport_secrets(ns, &r.transport, t, &creds) {
            apply_changed(ctx, &secrets, "Secret", ns, s, Live::NotCached).await?;
        }
    }
    let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let sa_obj = render::service_account(r, labels, owner, &ctx.config);
    let sa_live = live_in(
        &ctx.service_accounts,
        ns,
        &naming::service_account_name(&r.name),
    );
    apply_changed(ctx, &sa, "ServiceAccount", ns, sa_obj, sa_live).await?;

    // The workload; the other kind goes when the actor switched kinds.
    let name = naming::workload_name(&r.name);
    let deps: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let before = actor.status.as_ref().and_then(|s| s.workload_kind.clone());
    let was_manual = actor
        .status
        .as_ref()
        .and_then(|s| s.scaling_mode.as_deref())
        == Some("Manual");
    if o.scaling_enabled && was_manual {
        if r.workload_kind() == "StatefulSet" {
            hand_replicas_over(&sts, &name).await?;
        } else {
            hand_replicas_over(&deps, &name).await?;
        }
    }
    let scaling = (o.scaling_enabled, o.min_replicas);
    let res = if r.workload_kind() == "StatefulSet" {
        if before.as_deref() == Some("Deployment") {
            delete_ignore_missing(&deps, &name).await?;
            forget_applied(ctx, "Deployment", ns, &name);
        }
        let desired = workload::stateful_set(r, labels, owner, &ctx.config);
        apply_workload(
            ctx,
            &sts,
            &STATEFUL_SET,
            ns,
            desired,
            &ctx.stateful_sets,
            scaling,
        )
        .await
    } else {
        if before.as_deref() == Some("StatefulSet") {
            delete_ignore_missing(&sts, &name).await?;
            forget_applied(ctx, "StatefulSet", ns, &name);
        }
        let desired = workload::deployment(r, labels, owner, &ctx.config);
        apply_workload(
            ctx,
            &deps,
            &DEPLOYMENT,
            ns,
            desired,
            &ctx.deployments,
            scaling,
        )
        .await
    };
    match res {
        Ok(w) => {
            if actor
                .status
                .as_ref()
                .and_then(|s| s.workload_kind.as_ref())
                .is_none()
            {
                ctx.event(
                    actor,
                    false,
                    "WorkloadCreated",
                    format!("{} {name} created", r.workload_kind()),
                )
                .await;
            }
            o.workload = Some(w);
        }
        Err(e) => {
            ctx.event(actor, true, "WorkloadFailed", e.to_string())
                .await;
            o.workload_error = Some(e.to_string());
        }
    }

    // KEDA objects, or none when scaling is off.
    let Some((so_ar, ta_ar)) = &ctx.keda else {
        if o.scaling_enabled {
            o.scaling_error = Some("KEDA's CRDs are not installed in the cluster".into());
        }
        return Ok(());
    };
    let so: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, so_ar);
    let ta: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, ta_ar);
    let so_name = naming::scaled_object_name(&r.name);
    let ta_name = naming::trigger_authentication_name(&r.name);
    if !o.scaling_enabled {
        // Only when there is something to remove: not two DELETEs on every reconcile.
        let cached = ctx.scaled_objects.as_ref().is_some_and(|s| {
            s.get(&ObjectRef::new_with(&so_name, so_ar.clone()).within(ns))
                .is_some()
        });
        let was_keda = actor
            .status
            .as_ref()
            .and_then(|s| s.scaling_mode.as_deref())
            != Some("Manual");
        if !cached && !was_keda {
            return Ok(());
        }
        let removed = delete_ignore_missing(&so, &so_name).await?;
        delete_ignore_missing(&ta, &ta_name).await?;
        forget_applied(ctx, "ScaledObject", ns, &so_name);
        forget_applied(ctx, "TriggerAuthentication", ns, &ta_name);
        if removed {
            ctx.event(
                actor,
                false,
                "ScaledObjectDeleted",
                format!(
                    "scaling disabled: ScaledObject removed, {} fixed replica(s)",
                    r.fixed_replicas()
                ),
            )
            .await;
        }
        return Ok(());
    }
    let Some(t) = transport else {
        return Ok(());
    };
    let ta_obj: DynamicObject =
        serde_json::from_value(keda::trigger_authentication(r, labels, owner, t))
            .map_err(kube::Error::SerdeError)?;
    let url = if t.kind == TRANSPORT_RABBITMQ {
        None
    } else {
        queue_url
    };
    let so_obj: DynamicObject =
        serde_json::from_value(keda::scaled_object(r, labels, owner, t, url))
            .map_err(kube::Error::SerdeError)?;
    let existed = actor
        .status
        .as_ref()
        .and_then(|s| s.scaling_mode.as_deref())
        == Some("KEDA");
    let res = async {
        let ta_live = match &ctx.trigger_auths {
            Some(s) => live_of(
                s.get(&ObjectRef::new_with(&ta_name, ta_ar.clone()).within(ns))
                    .as_deref()
                    .map(Resource::meta),
            ),
            None => Live::NotCached,
        };
        apply_changed(ctx, &ta, "TriggerAuthentication", ns, ta_obj, ta_live).await?;
        let so_live = match &ctx.scaled_objects {
            Some(s) => live_of(
                s.get(&ObjectRef::new_with(&so_name, so_ar.clone()).within(ns))
                    .as_deref()
                    .map(Resource::meta),
            ),
            None => Live::NotCached,
        };
        apply_changed(ctx, &so, "ScaledObject", ns, so_obj, so_live).await
    }
    .await;
    match res {
        Ok(_) if !existed => {
            ctx.event(
                actor,
                false,
                "ScaledObjectCreated",
                "KEDA ScaledObject successfully created".into(),
            )
            .await;
        }
        Ok(_) => {}
        Err(e) => {
            ctx.event(actor, true, "ScaledObjectFailed", e.to_string())
                .await;
            o.scaling_error = Some(e.to_string());
        }
    }
    Ok(())
}

fn forget_applied(ctx: &Ctx, kind: &str, ns: &str, name: &str) {
    lock(&ctx.applied).remove(&object_key(kind, ns, name));
}

async fn cleanup(actor: Arc<AsyncActor>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = actor.namespace().ok_or(Error::NoNamespace)?;
    let name = actor.name_any();
    let mut o = base_observed(&actor);
    o.transport = TransportObs::NotAttempted;
    let prev = actor.status.clone().unwrap_or_default();
    let _ = write_status(&ctx, &actor, status::derive(&prev, &o, now())).await;
    // The queue lives on the transport the actor was admitted with; resolve without flavors
    // (actor and transport cannot come from a flavor).
    let actor_name = actor.spec.actor.clone().unwrap_or_else(|| name.clone());
    let transport = actor
        .spec
        .transport
        .clone()
        .unwrap_or_else(|| ctx.config.default_transport.clone());
    let queue = naming::actor_queue(&ns, &actor_name);
    let mut delay_queues = Vec::new();
    if ctx
        .config
        .transports
        .get(&transport)
        .is_some_and(|t| t.enabled)
    {
        let (backend, _) = ctx.transports.get(&transport).await?;
        {
            // Checked again by the next reconcile: the sweep may delete the end queues.
            let mut ensured = lock(&ctx.ensured);
            for q in [
                queue.clone(),
                naming::sink_queue(&ns),
                naming::sump_queue(&ns),
            ] {
                ensured.remove(&ensured_key(&transport, &q));
            }
        }
        // The namespace's end queues go with the namespace, once it is gone.
        ctx.end_queues.add(&transport, &ns);
        // The retry policies (flavors included, when they still resolve) name the delay queues.
        let resolved = asya_api::review::review_typed(&actor, &ctx.catalog(), &ctx.config).resolved;
        let resiliency = match &resolved {
            Some(r) => r.spec.resiliency.as_ref(),
            None => actor.spec.resiliency.as_ref(),
        };
        let res = backend.delete_actor_queue(&queue, resiliency).await;
        ctx.metrics.queue_op(backend.kind(), "delete", res.is_ok());
        match res {
            Ok(extra) => delay_queues = extra,
            Err(e) => {
                ctx.event(
                    &actor,
                    true,
                    "QueueDeleteFailed",
                    format!("deleting queue {queue}: {e}; retrying"),
                )
                .await;
                return Err(e.into());
            }
        }
    }
    // Owner references would let the garbage collector do this; deleting now frees the
    // names at once for an actor recreated under the same name.
    let client = ctx.client.clone();
    delete_ignore_missing(&Api::<Deployment>::namespaced(client.clone(), &ns), &name).await?;
    delete_ignore_missing(&Api::<StatefulSet>::namespaced(client.clone(), &ns), &name).await?;
    if let Some((so, ta)) = &ctx.keda {
        delete_ignore_missing(
            &Api::<DynamicObject>::namespaced_with(client.clone(), &ns, so),
            &naming::scaled_object_name(&name),
        )
        .await?;
        delete_ignore_missing(
            &Api::<DynamicObject>::namespaced_with(client.clone(), &ns, ta),
            &naming::trigger_authentication_name(&name),
        )
        .await?;
    }
    for (kind, n) in [
        ("Deployment", naming::workload_name(&name)),
        ("StatefulSet", naming::workload_name(&name)),
        ("ServiceAccount", naming::service_account_name(&name)),
        ("ScaledObject", naming::scaled_object_name(&name)),
        (
            "TriggerAuthentication",
            naming::trigger_authentication_name(&name),
        ),
    ] {
        forget_applied(&ctx, kind, &ns, &n);
    }
    // The namespace's transport Secrets are not watched: an actor deleted with its namespace
    // must not leave them counted as applied, or a namespace recreated under the same name
    // within the reassert interval gets actors without credentials. One extra apply for the
    // namespace's other actors, if any.
    let prefix = object_key("Secret", &ns, "");
    lock(&ctx.applied).retain(|k, _| !k.starts_with(&prefix));
    ctx.event(
        &actor,
        false,
        "QueueDeleted",
        if delay_queues.is_empty() {
            format!("queue {queue} deleted")
        } else {
            // An event note holds 1 kB: name a few.
            let more = delay_queues.len().saturating_sub(4);
            format!(
                "queue {queue} deleted, with its retry delay queues {}{}",
                delay_queues[..delay_queues.len() - more].join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            )
        },
    )
    .await;
    info!(namespace = %ns, name = %name, queue = %queue, "actor cleaned up");
    Ok(Action::await_change())
}

/// Actors in the store that list flavor `name` (any namespace, or `ns` for ConfigMap flavors).
fn users_of(store: &Store<AsyncActor>, name: &str, ns: Option<&str>) -> Vec<ObjectRef<AsyncActor>> {
    store
        .state()
        .iter()
        .filter(|a| a.spec.flavors.iter().any(|f| f == name))
        .filter(|a| ns.is_none_or(|n| a.namespace().as_deref() == Some(n)))
        .map(|a| ObjectRef::from_obj(a.as_ref()))
        .collect()
}

fn flavor_name_of_labels(l: &BTreeMap<String, String>) -> Option<String> {
    l.get(labels::FLAVOR).cloned()
}

/// Builds and runs the controller until shutdown.
pub async fn run(
    client: Client,
    config: Arc<ClusterConfig>,
    own_namespace: String,
    metrics: Metrics,
    health: Health,
) {
    let actors: Api<AsyncActor> = Api::all(client.clone());
    let so_ar = scaled_object_resource();
    let keda = if crd_exists(&client, &so_ar).await {
        Some((so_ar, trigger_auth_resource()))
    } else {
        warn!(
            "KEDA's ScaledObject CRD is not installed: actors with scaling stay without a ScaledObject"
        );
        None
    };
    let ec_ar = asya_api::flavor::environment_config_resource();
    let has_ec = crd_exists(&client, &ec_ar).await;

    // Caches for the flavor catalog; the controller's own watches (below) trigger the users.
    // Ready once they have listed: before that, a reconcile would see no flavors. (The
    // controller holds its reconciles until its own store has listed.)
    let unsynced = Unsynced::new(2 + usize::from(has_ec), health);
    let (flavors, flavors_w) = reflector::store();
    spawn_reflector(
        unsynced.clone(),
        reflector::reflector(
            flavors_w,
            watcher(
                Api::<Flavor>::all(client.clone()),
                watcher::Config::default(),
            ),
        ),
    );
    let (maps, maps_w) = reflector::store();
    spawn_reflector(
        unsynced.clone(),
        reflector::reflector(
            maps_w,
            watcher(
                Api::<ConfigMap>::all(client.clone()),
                watcher::Config::default().labels(labels::FLAVOR),
            ),
        ),
    );

    let reporter = Reporter {
        controller: MANAGER.into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let mut env_configs = None;
    let managed = format!("{}={}", workload::MANAGED_BY.0, workload::MANAGED_BY.1);
    let pred = PredicateConfig::default;
    // Each watch feeds a cache the reconcile reads and triggers reconciles only for changes
    // that matter to what it renders (`work`'s fingerprints): not for the controller's own
    // status and finalizer writes, not for the controller manager's status bookkeeping.
    let (actor_store, actor_writer) = reflector::store();
    let actor_events = watcher(actors, watcher::Config::default().any_semantic())
        .default_backoff()
        .reflect(actor_writer)
        .applied_objects()
        .predicate_filter(work::actor_fingerprint, pred());
    let (deployments, deployments_w) = reflector::store();
    let deployment_events = watcher(
        Api::<Deployment>::all(client.clone()),
        watcher::Config::default().labels(&managed).any_semantic(),
    )
    .default_backoff()
    .modify(work::slim_deployment)
    .reflect(deployments_w)
    .applied_objects()
    .predicate_filter(work::deployment_fingerprint, pred());
    let (stateful_sets, stateful_sets_w) = reflector::store();
    let stateful_set_events = watcher(
        Api::<StatefulSet>::all(client.clone()),
        watcher::Config::default().labels(&managed).any_semantic(),
    )
    .default_backoff()
    .modify(work::slim_stateful_set)
    .reflect(stateful_sets_w)
    .applied_objects()
    .predicate_filter(work::stateful_set_fingerprint, pred());
    let (pods, pods_w) = reflector::store();
    let pod_events = watcher(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default()
            .labels(&format!("{}=true", labels::INJECT))
            .any_semantic(),
    )
    .default_backoff()
    .modify(work::slim_pod)
    .reflect(pods_w)
    .applied_objects()
    .predicate_filter(work::pod_fingerprint, pred());
    let mut controller = Controller::for_stream(actor_events, actor_store)
        // Debounce: one actor's create still fans out into a few events (its workload, its
        // ScaledObject, its pod); coalesce them into one reconcile.
        .with_config(
            kube::runtime::controller::Config::default()
                .concurrency(CONCURRENCY)
                .debounce(Duration::from_millis(500)),
        )
        .owns_stream(deployment_events)
        .owns_stream(stateful_set_events)
        .watches_stream(pod_events, |pod: Pod| {
            let ns = pod.namespace();
            pod.labels()
                .get(labels::ACTOR)
                .map(|a| ObjectRef::new(a).within(ns.as_deref().unwrap_or_default()))
        });
    // KEDA's HPAs (label set by KEDA), mapped back by the ScaledObject (= actor) name.
    let (hpas, hpas_w) = reflector::store();
    let hpa_events = watcher(
        Api::<HorizontalPodAutoscaler>::all(client.clone()),
        watcher::Config::default()
            .labels(KEDA_HPA_LABEL)
            .any_semantic(),
    )
    .default_backoff()
    .modify(work::slim_hpa)
    .reflect(hpas_w)
    .applied_objects()
    .predicate_filter(work::hpa_fingerprint, pred());
    controller = controller.watches_stream(hpa_events, |h: HorizontalPodAutoscaler| {
        let ns = h.namespace();
        h.labels()
            .get(KEDA_HPA_LABEL)
            .map(|a| ObjectRef::new(a).within(ns.as_deref().unwrap_or_default()))
    });
    // Metadata only (generation, the applied hash) of the kinds it applies but need not watch
    // for changes: enough to skip an apply that would change nothing, after a restart too.
    let (service_accounts, sa_w) = reflector::store();
    drive(
        watcher(
            Api::<PartialObjectMeta<ServiceAccount>>::all(client.clone()),
            watcher::Config::default().labels(&managed).any_semantic(),
        )
        .default_backoff()
        .reflect(sa_w),
    );
    let mut trigger_auths = None;
    let mut scaled_objects = None;
    if let Some((so_ar, ta_ar)) = &keda {
        let w = reflector::store::Writer::<PartialObjectMeta<DynamicObject>>::new(ta_ar.clone());
        trigger_auths = Some(w.as_reader());
        drive(
            watcher(
                Api::<PartialObjectMeta<DynamicObject>>::all_with(client.clone(), ta_ar),
                watcher::Config::default().labels(&managed).any_semantic(),
            )
            .default_backoff()
            .reflect(w),
        );
        let w = reflector::store::Writer::<DynamicObject>::new(so_ar.clone());
        scaled_objects = Some(w.as_reader());
        let events = watcher(
            Api::<DynamicObject>::all_with(client.clone(), so_ar),
            watcher::Config::default().labels(&managed).any_semantic(),
        )
        .default_backoff()
        .modify(work::slim_scaled_object)
        .reflect(w)
        .applied_objects()
        .predicate_filter(work::scaled_object_fingerprint, pred());
        controller = controller.owns_stream_with(events, so_ar.clone());
    }
    let store = controller.store();
    let s1 = store.clone();
    controller = controller.watches(
        Api::<Flavor>::all(client.clone()),
        watcher::Config::default(),
        move |f: Flavor| users_of(&s1, &f.name_any(), None),
    );
    let s2 = store.clone();
    controller = controller.watches(
        Api::<ConfigMap>::all(client.clone()),
        watcher::Config::default().labels(labels::FLAVOR),
        move |cm: ConfigMap| {
            flavor_name_of_labels(cm.labels())
                .map(|n| users_of(&s2, &n, cm.namespace().as_deref()))
                .unwrap_or_default()
        },
    );
    if has_ec {
        let w = reflector::store::Writer::<DynamicObject>::new(ec_ar.clone());
        env_configs = Some(w.as_reader());
        spawn_reflector(
            unsynced,
            reflector::reflector(
                w,
                watcher(
                    Api::<DynamicObject>::all_with(client.clone(), &ec_ar),
                    watcher::Config::default(),
                ),
            ),
        );
        let s3 = store.clone();
        controller = controller.watches_with(
            Api::<DynamicObject>::all_with(client.clone(), &ec_ar),
            ec_ar.clone(),
            watcher::Config::default(),
            move |e: DynamicObject| {
                flavor_name_of_labels(e.labels())
                    .map(|n| users_of(&s3, &n, None))
                    .unwrap_or_default()
            },
        );
    }

    let transports = Arc::new(Transports::new(
        config.clone(),
        Api::namespaced(client.clone(), &own_namespace),
    ));
    let end_queues = crate::end_queues::Candidates::default();
    // Validated when the configuration was read; the default should it not parse.
    let retention = config
        .end_queue_retention
        .parse()
        .unwrap_or_else(|_| Duration::from_secs(7 * 24 * 3600));
    tokio::spawn(crate::end_queues::run(
        client.clone(),
        own_namespace.clone(),
        transports.clone(),
        end_queues.clone(),
        retention,
        metrics.clone(),
    ));
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        transports: transports.clone(),
        end_queues: end_queues.clone(),
        config,
        recorder: Recorder::new(client.clone(), reporter),
        metrics,
        flavors,
        flavor_maps: maps,
        env_configs,
        pods,
        deployments,
        stateful_sets,
        scaled_objects,
        service_accounts,
        trigger_auths,
        hpas,
        keda,
        failures: Mutex::new(HashMap::new()),
        ensured: Mutex::new(HashMap::new()),
        applied: Mutex::new(HashMap::new()),
    });
    info!("controller starting");
    controller
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

/// Drives a cache's watch in the background (its watcher retries with backoff on errors).
fn drive<S, K>(stream: S)
where
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    K: Send + 'static,
{
    tokio::spawn(async move {
        let mut s = std::pin::pin!(stream);
        while let Some(ev) = s.next().await {
            if let Err(e) = ev {
                warn!(error = %e, "cache watch failed; retrying");
            }
        }
    });
}

/// Drives a reflector in the background; its watcher retries with backoff on errors.
fn spawn_reflector<S, K>(unsynced: Unsynced, stream: S)
where
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    K: Send + 'static,
{
    tokio::spawn(async move {
        let mut unsynced = Some(unsynced);
        let mut s = std::pin::pin!(stream.default_backoff());
        while let Some(ev) = s.next().await {
            match ev {
                // The store has swapped in the whole first list.
                Ok(watcher::Event::InitDone) => {
                    if let Some(u) = unsynced.take() {
                        u.listed();
                    }
                }
                Ok(_) => {}
                Err(e) => warn!(error = %e, "flavor watch failed; retrying"),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actors_with_messages_are_looked_at_sooner_and_every_actor_is_spread() {
        let keys = ["ns-a/one", "ns-a/two", "ns-b/one"];
        for k in keys {
            let idle = periodic(k, false);
            assert!(idle >= PERIOD && idle < PERIOD + SPREAD, "{k}: {idle:?}");
            let busy = periodic(k, true);
            assert!(
                busy >= BUSY_PERIOD && busy < BUSY_PERIOD + BUSY_SPREAD,
                "{k}: {busy:?}"
            );
        }
        let idle: std::collections::HashSet<_> = keys.iter().map(|k| periodic(k, false)).collect();
        assert_eq!(
            idle.len(),
            keys.len(),
            "actors come back at different times"
        );
    }
}
