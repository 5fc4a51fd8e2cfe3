//! The kube-rs Controller on AsyncActor: the watches and caches that trigger and feed each
//! reconcile, and the bridge from the controller runtime to [`Reconciler::reconcile`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use asya_api::config::ClusterConfig;
use asya_api::{AsyncActor, Flavor, labels};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{PredicateConfig, WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tracing::{Instrument, info, info_span, warn};

use crate::health::{Health, Unsynced};
use crate::kube_cluster::{
    KEDA_HPA_LABEL, KubeCluster, scaled_object_resource, trigger_auth_resource,
};
use crate::metrics::{ErrorLabel, Metrics, ResultLabel};
use crate::reconcile::{Error, MANAGER, Next, Reconciler};
use crate::relist;
use crate::render::workload;
use crate::spans::{ReconcileOutcome, reconcile_span};
use crate::transports::Transports;
use crate::watch;

pub use crate::reconcile::FINALIZER;

/// Reconciles at once. Each is mostly waiting on the API server and the broker: with 16,
/// 1,000 actors applied at once were converged 35 s after the last was admitted (reconciles
/// of 0.3-1.3 s queued 16 at a time), with 48 15 s after (docs/benchmarks.md § Provisioner).
/// Broker operations stay bounded by the transport's own limit (`MAX_IN_FLIGHT`).
pub const CONCURRENCY: u16 = 48;

/// Resolves when the process is to shut down; every clone at once.
pub type Shutdown = futures::future::Shared<futures::future::BoxFuture<'static, ()>>;

/// The controller's context: the reconciler on the real cluster.
pub type Ctx = Reconciler<KubeCluster>;

/// Whether the API server serves `ar`'s kind. Asked again until it answers: a leader
/// elected right after an API server restart must not take "unreachable" for "not installed".
async fn crd_exists(client: &Client, ar: &ApiResource) -> bool {
    let gvk = GroupVersionKind::gvk(&ar.group, &ar.version, &ar.kind);
    loop {
        match kube::discovery::oneshot::pinned_kind(client, &gvk).await {
            Ok(_) => return true,
            Err(kube::Error::Api(s)) if s.code == 404 => return false,
            Err(kube::Error::Discovery(_)) => return false,
            Err(e) => {
                warn!(kind = %ar.kind, error = %e, "API discovery failed; asking again");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
}

fn action(next: Next) -> Action {
    match next {
        Next::After(d) => Action::requeue(d),
        Next::AwaitChange => Action::await_change(),
    }
}

pub async fn reconcile(actor: Arc<AsyncActor>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = actor.namespace().ok_or(Error::NoNamespace)?;
    let metrics = &ctx.cluster.metrics;
    let span = info_span!("reconcile", namespace = %ns, name = %actor.name_any());
    let started = Instant::now();
    let start = std::time::SystemTime::now();
    let res = ctx.reconcile(&actor).instrument(span).await.map(action);
    metrics.duration.observe(started.elapsed().as_secs_f64());
    let spans = &ctx.cluster.spans;
    if spans.enabled() {
        let outcome = match &res {
            Ok(_) => ReconcileOutcome {
                outcome: "ok",
                error: None,
            },
            Err(e) => ReconcileOutcome {
                outcome: e.kind(),
                error: Some(e.to_string()),
            },
        };
        let span = spans.span_for(&Default::default());
        spans.record(&reconcile_span(
            &ns,
            &actor.name_any(),
            &outcome,
            span,
            start,
            std::time::SystemTime::now(),
        ));
    }
    metrics
        .reconciles
        .get_or_create(&ResultLabel {
            result: if res.is_ok() { "ok" } else { "error" }.into(),
        })
        .inc();
    metrics.controller_reconciled(res.is_ok());
    res
}

pub fn error_policy(actor: Arc<AsyncActor>, err: &Error, ctx: Arc<Ctx>) -> Action {
    ctx.cluster
        .metrics
        .errors
        .get_or_create(&ErrorLabel {
            kind: err.kind().into(),
        })
        .inc();
    let wait = ctx.backoff_after_error(&actor);
    warn!(namespace = %actor.namespace().unwrap_or_default(), name = %actor.name_any(), error = %err, retry_in = ?wait, "reconcile failed");
    Action::requeue(wait)
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

/// Builds and runs the controller until `shutdown` resolves and the reconciles in flight
/// have finished. Dropping the future instead (a leader standing down) stops everything it
/// started at once: the reconciles, the watches, the background tasks.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    client: Client,
    config: Arc<ClusterConfig>,
    own_namespace: String,
    keda_namespace: String,
    metrics: Metrics,
    health: Health,
    spans: Arc<asya_telemetry::Recorder>,
    shutdown: Shutdown,
) {
    let qc_ar = ApiResource::erase::<asya_api::queue_claim::QueueClaim>(&());
    let so_ar = scaled_object_resource();
    // RabbitMQ triggers authenticate through a ClusterTriggerAuthentication: KEDA without that
    // CRD counts as no KEDA (as before KEDA 2.x had it).
    let cta_ar = crate::keda_identity::io::cluster_trigger_auth_resource();
    let ec_ar = asya_api::flavor::environment_config_resource();
    // Discovery asks until the API server answers: a shutdown meanwhile ends the run.
    let discovery = async {
        let mut served = [false; 4];
        for (ar, s) in [&qc_ar, &so_ar, &cta_ar, &ec_ar]
            .into_iter()
            .zip(&mut served)
        {
            *s = crd_exists(&client, ar).await;
        }
        served
    };
    let [has_qc, has_so, has_cta, has_ec] = tokio::select! {
        served = discovery => served,
        _ = shutdown.clone() => return,
    };
    // Every task this run starts: aborted when the run ends or is dropped, so a replica that
    // stands down leaves no leader-only work behind.
    let mut tasks = tokio::task::JoinSet::new();
    // The record of each queue's owner (docs/DESIGN.md §9): no queue is declared, adopted or
    // deleted without it, so without its CRD there is nothing to do but say so.
    if !has_qc {
        tracing::error!(
            "the QueueClaim CRD (queueclaims.asya.sh) is not installed: apply deploy/crds/ (kubectl apply --server-side -f deploy/crds/; helm upgrade does not install new CRDs)"
        );
        std::process::exit(2);
    }
    let actors: Api<AsyncActor> = Api::all(client.clone());
    let keda = if !has_so {
        warn!(
            "KEDA's ScaledObject CRD is not installed: actors with scaling stay without a ScaledObject"
        );
        None
    } else if !has_cta {
        warn!(
            "KEDA's ClusterTriggerAuthentication CRD is not installed: actors with scaling stay without a ScaledObject"
        );
        None
    } else {
        Some((so_ar, trigger_auth_resource()))
    };

    // Caches for the flavor catalog; the controller's own watches (below) trigger the users.
    // Ready once they have listed: before that, a reconcile would see no flavors. (The
    // controller holds its reconciles until its own store has listed.)
    let unsynced = Unsynced::new(2 + usize::from(has_ec), health);
    let (flavors, flavors_w) = reflector::store();
    spawn_reflector(
        &mut tasks,
        unsynced.clone(),
        reflector::reflector(
            flavors_w,
            relist::watcher(
                Api::<Flavor>::all(client.clone()),
                watcher::Config::default(),
            )
            .modify(|f| asya_api::labels::drop_bookkeeping(&mut f.metadata)),
        ),
    );
    // Any namespace can label a ConfigMap: the store keeps only the flavor key, within the
    // size and count bounds (asya_api::flavor::bounds).
    let (maps, maps_w) = reflector::store();
    let mut gate = asya_api::flavor::FlavorMapGate::new(config.flavor_limits.clone());
    spawn_reflector(
        &mut tasks,
        unsynced.clone(),
        reflector::reflector(
            maps_w,
            relist::watcher(
                Api::<ConfigMap>::all(client.clone()),
                watcher::Config::default().labels(labels::FLAVOR),
            )
            .map_ok(move |ev| watch::bound_flavor_map(&mut gate, ev)),
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
    // that matter to what it renders (`watch`'s fingerprints): not for the controller's own
    // status and finalizer writes, not for the controller manager's status bookkeeping.
    let (actor_store, actor_writer) = reflector::store();
    // Every trigger stream is `isolated`: one failing watch must not put the others to sleep.
    let actor_events = relist::watcher(actors, watcher::Config::default().any_semantic())
        .default_backoff()
        .modify(watch::slim_actor)
        .reflect(actor_writer)
        .applied_objects()
        .predicate_filter(watch::actor_fingerprint, pred());
    let (deployments, deployments_w) = reflector::store();
    let deployment_events = relist::watcher(
        Api::<Deployment>::all(client.clone()),
        watcher::Config::default().labels(&managed).any_semantic(),
    )
    .default_backoff()
    .modify(watch::slim_deployment)
    .reflect(deployments_w)
    .applied_objects()
    .predicate_filter(watch::deployment_fingerprint, pred());
    let (stateful_sets, stateful_sets_w) = reflector::store();
    let stateful_set_events = relist::watcher(
        Api::<StatefulSet>::all(client.clone()),
        watcher::Config::default().labels(&managed).any_semantic(),
    )
    .default_backoff()
    .modify(watch::slim_stateful_set)
    .reflect(stateful_sets_w)
    .applied_objects()
    .predicate_filter(watch::stateful_set_fingerprint, pred());
    let (pods, pods_w) = reflector::store();
    let pod_events = relist::watcher(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default()
            .labels(&format!("{}=true", labels::INJECT))
            .any_semantic(),
    )
    .default_backoff()
    .modify(watch::slim_pod)
    .reflect(pods_w)
    .applied_objects()
    .predicate_filter(watch::pod_fingerprint, pred());
    let mut controller =
        Controller::for_stream(relist::isolated("asyncactors", actor_events), actor_store)
            // Debounce: one actor's create still fans out into a few events (its workload, its
            // ScaledObject, its pod); coalesce them into one reconcile.
            .with_config(
                kube::runtime::controller::Config::default()
                    .concurrency(CONCURRENCY)
                    .debounce(Duration::from_millis(500)),
            )
            .owns_stream(relist::isolated("deployments", deployment_events))
            .owns_stream(relist::isolated("statefulsets", stateful_set_events))
            .watches_stream(relist::isolated("pods", pod_events), |pod: Pod| {
                let ns = pod.namespace();
                pod.labels()
                    .get(labels::ACTOR)
                    .map(|a| ObjectRef::new(a).within(ns.as_deref().unwrap_or_default()))
            });
    // KEDA's HPAs (label set by KEDA), mapped back by the ScaledObject (= actor) name.
    let (hpas, hpas_w) = reflector::store();
    let hpa_events = relist::watcher(
        Api::<HorizontalPodAutoscaler>::all(client.clone()),
        watcher::Config::default()
            .labels(KEDA_HPA_LABEL)
            .any_semantic(),
    )
    .default_backoff()
    .modify(watch::slim_hpa)
    .reflect(hpas_w)
    .applied_objects()
    .predicate_filter(watch::hpa_fingerprint, pred());
    let hpa_events = relist::isolated("horizontalpodautoscalers", hpa_events);
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
        &mut tasks,
        "serviceaccounts",
        relist::watcher(
            Api::<PartialObjectMeta<ServiceAccount>>::all(client.clone()),
            watcher::Config::default().labels(&managed).any_semantic(),
        )
        .default_backoff()
        .reflect(sa_w),
    );
    // Each namespace's uid (metadata only: a namespace made again under a name has another;
    // queue claims, state and report tokens are bound to it), so a reconcile reads no
    // namespace from the API server.
    let (namespaces, ns_w) = reflector::store();
    drive(
        &mut tasks,
        "namespaces",
        relist::watcher(
            Api::<PartialObjectMeta<k8s_openapi::api::core::v1::Namespace>>::all(client.clone()),
            watcher::Config::default().any_semantic(),
        )
        .default_backoff()
        .modify(|n| {
            n.metadata = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: n.metadata.name.take(),
                uid: n.metadata.uid.take(),
                deletion_timestamp: n.metadata.deletion_timestamp.take(),
                ..Default::default()
            }
        })
        .reflect(ns_w),
    );
    // Whose each queue name is (a namespace's permissions name only its claimed queues):
    // name and spec only.
    let (claims, claims_w) = reflector::store::<asya_api::queue_claim::QueueClaim>();
    drive(
        &mut tasks,
        "queueclaims",
        relist::watcher(
            Api::<asya_api::queue_claim::QueueClaim>::all(client.clone()),
            watcher::Config::default().any_semantic(),
        )
        .default_backoff()
        .modify(|c| {
            c.metadata = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: c.metadata.name.take(),
                ..Default::default()
            }
        })
        .reflect(claims_w),
    );
    let mut trigger_auths = None;
    let mut scaled_objects = None;
    if let Some((so_ar, ta_ar)) = &keda {
        let w = reflector::store::Writer::<PartialObjectMeta<DynamicObject>>::new(ta_ar.clone());
        trigger_auths = Some(w.as_reader());
        drive(
            &mut tasks,
            "triggerauthentications",
            relist::watcher(
                Api::<PartialObjectMeta<DynamicObject>>::all_with(client.clone(), ta_ar),
                watcher::Config::default().labels(&managed).any_semantic(),
            )
            .default_backoff()
            .reflect(w),
        );
        let w = reflector::store::Writer::<DynamicObject>::new(so_ar.clone());
        scaled_objects = Some(w.as_reader());
        let events = relist::watcher(
            Api::<DynamicObject>::all_with(client.clone(), so_ar),
            watcher::Config::default().labels(&managed).any_semantic(),
        )
        .default_backoff()
        .modify(watch::slim_scaled_object)
        .reflect(w)
        .applied_objects()
        .predicate_filter(watch::scaled_object_fingerprint, pred());
        controller =
            controller.owns_stream_with(relist::isolated("scaledobjects", events), so_ar.clone());
    }
    let store = controller.store();
    let s1 = store.clone();
    // Triggers only (the flavor cache above is the reconcile's): relisting like every watch,
    // as kube-runtime's own `watches` does not.
    controller = controller.watches_stream(
        relist::isolated(
            "flavor triggers",
            relist::watcher(
                Api::<Flavor>::all(client.clone()),
                watcher::Config::default(),
            )
            .default_backoff()
            .touched_objects(),
        ),
        move |f: Flavor| users_of(&s1, &f.name_any(), None),
    );
    let s2 = store.clone();
    // Triggers only: the labels name the flavor, so metadata is all this watch reads.
    controller = controller.watches_stream(
        relist::isolated(
            "flavor map triggers",
            relist::watcher(
                Api::<PartialObjectMeta<ConfigMap>>::all(client.clone()),
                watcher::Config::default().labels(labels::FLAVOR),
            )
            .default_backoff()
            .touched_objects(),
        ),
        move |cm: PartialObjectMeta<ConfigMap>| {
            flavor_name_of_labels(cm.labels())
                .map(|n| users_of(&s2, &n, cm.namespace().as_deref()))
                .unwrap_or_default()
        },
    );
    if has_ec {
        let w = reflector::store::Writer::<DynamicObject>::new(ec_ar.clone());
        env_configs = Some(w.as_reader());
        spawn_reflector(
            &mut tasks,
            unsynced,
            reflector::reflector(
                w,
                relist::watcher(
                    Api::<DynamicObject>::all_with(client.clone(), &ec_ar),
                    watcher::Config::default(),
                )
                .modify(|e| asya_api::labels::drop_bookkeeping(&mut e.metadata)),
            ),
        );
        let s3 = store.clone();
        controller = controller.watches_stream_with(
            relist::isolated(
                "environment config triggers",
                relist::watcher(
                    Api::<DynamicObject>::all_with(client.clone(), &ec_ar),
                    watcher::Config::default(),
                )
                .default_backoff()
                .touched_objects(),
            ),
            move |e: DynamicObject| {
                flavor_name_of_labels(e.labels())
                    .map(|n| users_of(&s3, &n, None))
                    .unwrap_or_default()
            },
            ec_ar.clone(),
        );
    }

    let transports = Arc::new(Transports::new(
        config.clone(),
        Api::namespaced(client.clone(), &own_namespace),
    ));
    // Decidable from the configuration alone; each such actor's status says it too.
    for name in config.enabled_transports() {
        if let Some(why) = config
            .transport(name)
            .and_then(|t| crate::render::keda::sqs_identity_missing(name, t, &config))
        {
            warn!("{why}");
        }
    }
    let keda_identity = crate::keda_identity::IdentityState::default();
    if keda.is_some() && keda_namespace.is_empty() {
        warn!(
            "no KEDA namespace (keda.namespace): the provisioner does not manage KEDA's RabbitMQ credential; ScaledObjects refer to ClusterTriggerAuthentication asya-<transport>, which must then be provided by hand"
        );
    } else if keda.is_some() {
        tasks.spawn(crate::keda_identity::io::run(
            client.clone(),
            config.clone(),
            transports.clone(),
            keda_namespace,
            keda_identity.clone(),
        ));
    }
    let end_queues = crate::end_queues::Candidates::default();
    // Validated when the configuration was read; the default should it not parse.
    let retention = config
        .end_queue_retention
        .parse()
        .unwrap_or_else(|_| Duration::from_secs(7 * 24 * 3600));
    tasks.spawn(crate::end_queues::run(
        client.clone(),
        own_namespace.clone(),
        transports.clone(),
        end_queues.clone(),
        retention,
        metrics.clone(),
    ));
    let cluster = KubeCluster {
        client: client.clone(),
        transports: transports.clone(),
        end_queues: end_queues.clone(),
        config: config.clone(),
        recorder: Recorder::new(client.clone(), reporter),
        metrics,
        spans,
        flavors,
        flavor_maps: maps,
        env_configs,
        pods,
        deployments,
        stateful_sets,
        scaled_objects,
        service_accounts,
        namespaces,
        trigger_auths,
        hpas,
        actors: store.clone(),
        own_namespace: own_namespace.clone(),
        keda,
        keda_identity,
        exposure: Some(Arc::new(crate::exposure::Ledger::new(Api::namespaced(
            client.clone(),
            &own_namespace,
        )))),
        state_redis: config.state_proxy.redis.clone().map(|r| {
            Arc::new(crate::state_identity::redis_admin::PlatformRedisAdmin::new(
                r,
                Api::namespaced(client.clone(), &own_namespace),
            ))
        }),
        claims,
    };
    let gauges = cluster.metrics.actors.clone();
    let ctx = Arc::new(Reconciler::new(cluster, config).with_gauges(gauges));
    info!("controller starting");
    controller
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| {
            if let Err(e) = res {
                log_run_error(&e);
            }
            futures::future::ready(())
        })
        .await;
    tasks.abort_all();
}

/// The controller's own errors, unseen before. A failed reconcile is logged by
/// [`error_policy`] already; the trigger streams' errors are logged where [`relist::isolated`]
/// drops them; what is left is a trigger for an actor its cache does not hold (deleted since,
/// or a cache behind) and a scheduler failure.
fn log_run_error<E: std::error::Error, Q: std::error::Error>(
    e: &kube::runtime::controller::Error<E, Q>,
) {
    use kube::runtime::controller::Error as C;
    match e {
        C::ReconcilerFailed(..) => {}
        C::ObjectNotFound(obj) => {
            tracing::debug!(object = %obj, "triggered for an actor the cache does not hold")
        }
        other => warn!(error = %other, "controller error"),
    }
}

/// Drives a cache's watch in `tasks` (its watcher retries with backoff on errors).
fn drive<S, K>(tasks: &mut tokio::task::JoinSet<()>, name: &'static str, stream: S)
where
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    K: Send + 'static,
{
    tasks.spawn(async move {
        let mut s = std::pin::pin!(stream);
        while let Some(ev) = s.next().await {
            if let Err(e) = ev {
                warn!(watch = name, error = %e, "cache watch failed; retrying");
            }
        }
    });
}

/// Drives a reflector in `tasks`; its watcher retries with backoff on errors.
fn spawn_reflector<S, K>(tasks: &mut tokio::task::JoinSet<()>, unsynced: Unsynced, stream: S)
where
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    K: Send + 'static,
{
    tasks.spawn(async move {
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
