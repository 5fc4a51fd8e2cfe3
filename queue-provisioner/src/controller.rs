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
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use tracing::{Instrument, info, info_span, warn};

use crate::health::{Health, Unsynced};
use crate::metrics::{ErrorLabel, Metrics, ResultLabel};
use crate::queue::{QueueError, QueueOps, QueueSpec};
use crate::render::{self, keda, workload};
use crate::status::{self, Observed, TransportObs};
use crate::transports::Transports;

pub const MANAGER: &str = "asya-queue-provisioner";
pub const FINALIZER: &str = "asya.sh/queue-provisioner";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("transport: {0}")]
    Queue(#[from] QueueError),
    #[error("finalizer: {0}")]
    Finalizer(String),
    #[error("object has no namespace")]
    NoNamespace,
}

impl Error {
    fn kind(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Queue(_) => "transport",
            Error::Finalizer(_) => "finalizer",
            Error::NoNamespace => "invalid",
        }
    }
}

pub struct Ctx {
    pub client: Client,
    pub config: Arc<ClusterConfig>,
    pub transports: Transports,
    pub recorder: Recorder,
    pub metrics: Metrics,
    pub flavors: Store<Flavor>,
    pub flavor_maps: Store<ConfigMap>,
    pub env_configs: Option<Store<DynamicObject>>,
    /// KEDA's API, when its CRDs are installed.
    pub keda: Option<(ApiResource, ApiResource)>,
    /// Consecutive failures per actor, for exponential backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// Queues ensured recently (transport/queue → when, spec, info): within [`RECHECK`] a
    /// reconcile only checks the queue still exists instead of declaring it again.
    ensured: Mutex<HashMap<String, (Instant, QueueSpec, crate::queue::QueueInfo)>>,
    /// Transport secrets applied recently per namespace/transport.
    secrets_applied: Mutex<HashMap<String, Instant>>,
}

/// How long an ensured queue or applied secret is trusted before the full step runs again.
const RECHECK: Duration = Duration::from_secs(60);

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

async fn apply_typed<K>(api: &Api<K>, name: &str, obj: &K) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    // SSA needs apiVersion/kind in the body; k8s-openapi types serialize them.
    let mut v = serde_json::to_value(obj).map_err(kube::Error::SerdeError)?;
    v["apiVersion"] = json!(K::api_version(&()));
    v["kind"] = json!(K::kind(&()));
    api.patch(name, &apply_params(), &Patch::Apply(&v)).await
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
    let Some(replicas) = v.pointer("/spec/replicas").cloned() else {
        return Ok(());
    };
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

pub async fn reconcile(actor: Arc<AsyncActor>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = actor.namespace().ok_or(Error::NoNamespace)?;
    let span = info_span!("reconcile", namespace = %ns, name = %actor.name_any());
    let started = Instant::now();
    let api: Api<AsyncActor> = Api::namespaced(ctx.client.clone(), &ns);
    let res = finalizer(&api, FINALIZER, actor.clone(), |ev| async {
        match ev {
            Finalizer::Apply(a) => apply_actor(a, ctx.clone()).await,
            Finalizer::Cleanup(a) => cleanup(a, ctx.clone()).await,
        }
    })
    .instrument(span)
    .await
    .or_else(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => Err(e),
        // The object is already gone (a stale event after our own finalizer removal).
        kube::runtime::finalizer::Error::RemoveFinalizer(kube::Error::Api(s)) if s.code == 404 => {
            Ok(Action::await_change())
        }
        other => Err(Error::Finalizer(other.to_string())),
    });
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
    let lp = ListParams::default().labels(&format!("{}={}", labels::ACTOR, resolved.name));
    let pods = pods_api.list(&lp).await?;
    let bare: Vec<&Pod> = pods
        .items
        .iter()
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
        .items
        .iter()
        .filter(|p| !status::needs_replacing(p))
        .map(status::classify_pod)
        .collect();

    // 4. KEDA's HPA target.
    if o.scaling_enabled {
        let hpa: Api<HorizontalPodAutoscaler> =
            Api::namespaced(ctx.client.clone(), &resolved.namespace);
        if let Ok(Some(h)) = hpa.get_opt(&format!("keda-hpa-{}", resolved.name)).await {
            o.hpa_desired = h.status.map(|s| s.desired_replicas);
        }
    }

    let new = status::derive(&prev, &o, now());
    let settled = matches!(
        new.phase.as_deref(),
        Some(status::PHASE_RUNNING | status::PHASE_NAPPING)
    );
    let failed = o.workload_error.is_some() || o.scaling_error.is_some();
    write_status(&ctx, &actor, new).await?;
    let backoff = ctx.backoff(&key, failed);
    // The periodic requeue is also the check that the queue still exists.
    Ok(Action::requeue(if failed {
        backoff
    } else if injection_down {
        Duration::from_secs(10)
    } else if settled {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(20)
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

/// Ensures one queue, or within [`RECHECK`] of the last ensure with the same spec only checks
/// that it still exists (a vanished queue is then recreated at once).
async fn ensure_cached(
    ctx: &Ctx,
    backend: &crate::queue::Backend,
    transport: &str,
    spec: QueueSpec,
) -> Result<crate::queue::QueueInfo, QueueError> {
    let key = format!("{transport}/{}", spec.name);
    let cached = lock(&ctx.ensured)
        .get(&key)
        .filter(|(at, s, _)| at.elapsed() < RECHECK && *s == spec)
        .map(|(_, _, info)| info.clone());
    if let Some(mut info) = cached {
        let res = backend.exists(&spec.name).await;
        ctx.metrics.queue_op(backend.kind(), "exists", res.is_ok());
        if res? {
            info.created = false;
            return Ok(info);
        }
    }
    let res = backend.ensure(&spec).await;
    ctx.metrics.queue_op(backend.kind(), "ensure", res.is_ok());
    let info = res?;
    lock(&ctx.ensured).insert(key, (Instant::now(), spec, info.clone()));
    Ok(info)
}

async fn ensure_queues(
    ctx: &Ctx,
    actor: &AsyncActor,
    r: &ResolvedActor,
) -> Result<TransportObs, QueueError> {
    let (backend, _) = ctx.transports.get(&r.transport).await?;
    let kind = backend.kind();
    for end in [naming::SINK_ACTOR, naming::SUMP_ACTOR] {
        let spec = queue_spec(&r.namespace, end, r.actor_timeout);
        ensure_cached(ctx, &backend, &r.transport, spec).await?;
    }
    let spec = queue_spec(&r.namespace, &r.actor, r.actor_timeout);
    let info = ensure_cached(ctx, &backend, &r.transport, spec).await?;
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
    let depth = backend.depth(&r.queue).await;
    ctx.metrics.queue_op(kind, "depth", depth.is_ok());
    Ok(TransportObs::Ready(info, depth.ok()))
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

    // Transport credentials in the actor's namespace.
    let skey = format!("{ns}/{}", r.transport);
    let fresh = lock(&ctx.secrets_applied)
        .get(&skey)
        .is_some_and(|at| at.elapsed() < RECHECK);
    if !fresh && let (Some(t), Ok((_, creds))) = (transport, ctx.transports.get(&r.transport).await)
    {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
        for s in render::transport_secrets(ns, &r.transport, t, &creds) {
            let name = s.metadata.name.clone().unwrap_or_default();
            apply_typed(&secrets, &name, &s).await?;
        }
        lock(&ctx.secrets_applied).insert(skey, Instant::now());
    }
    let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let sa_obj = render::service_account(r, labels, owner, &ctx.config);
    apply_typed(&sa, &naming::service_account_name(&r.name), &sa_obj).await?;

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
    let res = if r.workload_kind() == "StatefulSet" {
        if before.as_deref() == Some("Deployment") {
            delete_ignore_missing(&deps, &name).await?;
        }
        apply_typed(
            &sts,
            &name,
            &workload::stateful_set(r, labels, owner, &ctx.config),
        )
        .await
        .map(|s| {
            let st = s.status.unwrap_or_default();
            (
                s.spec.and_then(|x| x.replicas),
                st.ready_replicas.unwrap_or(0),
            )
        })
    } else {
        if before.as_deref() == Some("StatefulSet") {
            delete_ignore_missing(&sts, &name).await?;
        }
        apply_typed(
            &deps,
            &name,
            &workload::deployment(r, labels, owner, &ctx.config),
        )
        .await
        .map(|d| {
            let st = d.status.unwrap_or_default();
            (
                d.spec.and_then(|x| x.replicas),
                st.ready_replicas.unwrap_or(0),
            )
        })
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
        let removed = delete_ignore_missing(&so, &so_name).await?;
        delete_ignore_missing(&ta, &ta_name).await?;
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
        apply(&ta, &ta_name, &ta_obj).await?;
        apply(&so, &so_name, &so_obj).await
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
        lock(&ctx.ensured).remove(&format!("{transport}/{queue}"));
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
    let mut controller = Controller::new(actors, watcher::Config::default().any_semantic())
        // Debounce: one actor's create fans out into a burst of watch events (finalizer,
        // status, Deployment, pods); coalesce them into one reconcile.
        .with_config(
            kube::runtime::controller::Config::default()
                .concurrency(16)
                .debounce(Duration::from_millis(500)),
        )
        .owns(
            Api::<Deployment>::all(client.clone()),
            watcher::Config::default().labels(&format!(
                "{}={}",
                workload::MANAGED_BY.0,
                workload::MANAGED_BY.1
            )),
        )
        .owns(
            Api::<StatefulSet>::all(client.clone()),
            watcher::Config::default().labels(&format!(
                "{}={}",
                workload::MANAGED_BY.0,
                workload::MANAGED_BY.1
            )),
        )
        .watches(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().labels(&format!("{}=true", labels::INJECT)),
            |pod: Pod| {
                let ns = pod.namespace();
                pod.labels()
                    .get(labels::ACTOR)
                    .map(|a| ObjectRef::new(a).within(ns.as_deref().unwrap_or_default()))
            },
        );
    if let Some((so_ar, _)) = &keda {
        controller = controller.owns_with(
            Api::<DynamicObject>::all_with(client.clone(), so_ar),
            so_ar.clone(),
            watcher::Config::default(),
        );
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

    let ctx = Arc::new(Ctx {
        client: client.clone(),
        transports: Transports::new(
            config.clone(),
            Api::namespaced(client.clone(), &own_namespace),
        ),
        config,
        recorder: Recorder::new(client.clone(), reporter),
        metrics,
        flavors,
        flavor_maps: maps,
        env_configs,
        keda,
        failures: Mutex::new(HashMap::new()),
        ensured: Mutex::new(HashMap::new()),
        secrets_applied: Mutex::new(HashMap::new()),
    });
    info!("controller starting");
    controller
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
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
