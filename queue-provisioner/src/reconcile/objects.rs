//! The Kubernetes objects step: transport Secrets, ServiceAccount, workload and KEDA objects,
//! as [`plan::workload`] and [`plan::scaling`] decide, each applied only when it changed.

use std::collections::BTreeMap;
use std::time::Instant;

use asya_api::config::TRANSPORT_RABBITMQ;
use asya_api::{AsyncActor, ResolvedActor, naming};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::DynamicObject;

use crate::apply_skip::{self, Applied, ApplyDecision, Live};
use crate::broker_identity::plan::VERSION_ANNOTATION;
use crate::model::{ObjectKind, WorkloadKind};
use crate::render::{self, keda, workload};
use crate::status::{Observed, WorkloadObs};

use super::memory::ObjectKey;
use super::plan::{self, EventSpec, ObjectsSeen, Reason, ScalingPlan, WorkloadPlan};
use super::{Answer, Cluster, Object, Reconciler};

/// Applies `desired` (server-side apply, with its hash in [`apply_skip::APPLIED_HASH`])
/// unless the last apply sent the same and the live object (`live`, from a cache) is still
/// the one it produced, or a restarted controller finds it carrying that hash. `initial`:
/// replicas set only when creating, after the hash is taken, so later applies leave them
/// out without it counting as a change. `None` when skipped.
async fn apply_changed<C: Cluster>(
    r: &Reconciler<C>,
    ns: &str,
    mut desired: Object,
    live: Live,
    initial: Option<i32>,
) -> Result<Option<Answer>, kube::Error> {
    let key = ObjectKey::new(desired.kind(), ns, &desired.name());
    let hash = desired.hash();
    let now = Instant::now();
    let last = r.memory.applied(&key);
    let answer = match apply_skip::decide_apply(last.as_ref(), hash, live, now) {
        ApplyDecision::Skip => return Ok(None),
        ApplyDecision::Adopt { generation } => {
            let at = now;
            r.memory.record_applied(
                key,
                Applied {
                    hash,
                    generation,
                    at,
                },
            );
            return Ok(None);
        }
        ApplyDecision::Apply => {
            if let Some(n) = initial {
                desired.set_replicas(n);
            }
            desired
                .meta_mut()
                .annotations
                .get_or_insert_default()
                .insert(apply_skip::APPLIED_HASH.into(), format!("{hash:016x}"));
            r.cluster.apply(ns, &desired).await?
        }
    };
    let applied = Applied {
        hash,
        generation: answer.generation,
        at: Instant::now(),
    };
    r.memory.record_applied(key, applied);
    Ok(Some(answer))
}

/// What the broker steps before tell the objects step.
#[derive(Clone, Debug, Default)]
pub struct FromBroker {
    /// The queue's URL (SQS's KEDA trigger reads it).
    pub queue_url: Option<String>,
    /// The namespace's broker credential version, set on the pod template.
    pub credential_version: Option<u64>,
}

/// Sets an annotation on a workload's pod template: a new value rolls its pods.
fn set_template_annotation(obj: &mut Object, key: &str, value: &str) {
    let template = match obj {
        Object::Deployment(d) => &mut d.spec.get_or_insert_default().template,
        Object::StatefulSet(s) => &mut s.spec.get_or_insert_default().template,
        _ => return,
    };
    template
        .metadata
        .get_or_insert_default()
        .annotations
        .get_or_insert_default()
        .insert(key.to_string(), value.to_string());
}

/// Applies a workload (when it changed) and returns what it says of itself: from the apply's
/// answer, or the cache when the apply was skipped. A workload created at `initial` replicas
/// hands them to the handoff manager at once, so our later applies (which leave replicas to
/// the HPA) do not reset them.
async fn apply_workload<C: Cluster>(
    r: &Reconciler<C>,
    wp: &WorkloadPlan,
    ns: &str,
    desired: Object,
    live: Live,
) -> Result<WorkloadObs, kube::Error> {
    let name = desired.name();
    let sent = apply_changed(r, ns, desired, live, wp.initial).await?;
    if let (Some(n), Some(_)) = (wp.initial, &sent) {
        r.cluster.claim_replicas(wp.kind, ns, &name, n).await?;
    }
    let seen = match sent {
        Some(a) => a.workload,
        None => r.cluster.cached_workload(wp.kind, ns, &name),
    };
    Ok(seen.unwrap_or_default())
}

/// Switching from fixed replicas to KEDA: our apply stops setting `spec.replicas`, and a field
/// no manager owns any more is reset to its default (1), scaling a busy actor in. A handoff
/// manager first claims the current value (the SSA ownership-transfer pattern), so the count
/// stays until the HPA changes it.
async fn hand_replicas_over<C: Cluster>(
    r: &Reconciler<C>,
    kind: WorkloadKind,
    ns: &str,
    name: &str,
) -> Result<(), kube::Error> {
    match r.cluster.replicas(kind, ns, name).await? {
        Some(n) => r.cluster.claim_replicas(kind, ns, name, n).await,
        None => Ok(()),
    }
}

/// The objects step. Workload and KEDA failures are recorded in `o` (and announced); an
/// error returned is one of the steps around them, which the caller records as a workload
/// error.
pub async fn apply<C: Cluster>(
    rec: &Reconciler<C>,
    actor: &AsyncActor,
    r: &ResolvedActor,
    labels: &BTreeMap<String, String>,
    owner: &OwnerReference,
    o: &mut Observed,
    broker: &FromBroker,
) -> Result<(), kube::Error> {
    let queue_url = broker.queue_url.as_deref();
    let c = &rec.cluster;
    let config = &rec.config;
    let ns = &r.namespace;
    let transport = config.transports.get(&r.transport);
    let prev = actor.status.as_ref();

    // Transport credentials in the actor's namespace (shared by its actors: one apply).
    if let (Some(t), Ok(creds)) = (transport, c.transport(&r.transport).await) {
        for s in render::transport_secrets(ns, &r.transport, t, &creds) {
            apply_changed(rec, ns, Object::Secret(s), Live::NotCached, None).await?;
        }
    }
    let sa = render::service_account(r, labels, owner, config);
    let sa_live = c.live(
        ObjectKind::ServiceAccount,
        ns,
        &naming::service_account_name(&r.name),
    );
    apply_changed(rec, ns, Object::ServiceAccount(sa), sa_live, None).await?;

    // What to do with the workload and KEDA's objects, from what the caches and this
    // process know before any of it is written.
    let name = naming::workload_name(&r.name);
    let so_name = naming::scaled_object_name(&r.name);
    let ta_name = naming::trigger_authentication_name(&r.name);
    let kind = WorkloadKind::of(r.workload_kind());
    let keda_installed = c.keda_installed();
    let seen = ObjectsSeen {
        keda: keda_installed,
        so_cached: keda_installed && c.scaled_object_cached(ns, &so_name),
        transport_known: transport.is_some(),
        workload_live: c.live(kind.object(), ns, &name),
        workload_applied_before: rec
            .memory
            .was_applied(&ObjectKey::new(kind.object(), ns, &name)),
    };
    let plan = plan::objects(prev, r, o, &seen);
    let wp = &plan.workload;

    // The workload; the other kind goes when the actor switched kinds.
    if wp.hand_over {
        hand_replicas_over(rec, kind, ns, &name).await?;
    }
    if let Some(other) = wp.remove {
        c.delete(other.object(), ns, &name).await?;
        rec.memory.forget_applied(other.object(), ns, &name);
    }
    let mut desired = match kind {
        WorkloadKind::StatefulSet => {
            Object::StatefulSet(workload::stateful_set(r, labels, owner, config))
        }
        WorkloadKind::Deployment => {
            Object::Deployment(workload::deployment(r, labels, owner, config))
        }
    };
    if let Some(v) = broker.credential_version {
        set_template_annotation(&mut desired, VERSION_ANNOTATION, &v.to_string());
    }
    match apply_workload(rec, wp, ns, desired, seen.workload_live).await {
        Ok(w) => {
            if wp.announce {
                let note = format!("{kind} {name} created");
                c.event(actor, EventSpec::normal(Reason::WorkloadCreated, note))
                    .await;
            }
            o.workload = Some(w);
        }
        Err(e) => {
            c.event(
                actor,
                EventSpec::warning(Reason::WorkloadFailed, e.to_string()),
            )
            .await;
            o.workload_error = Some(e.to_string());
        }
    }

    // KEDA objects, or none when scaling is off.
    match plan.scaling {
        ScalingPlan::Unavailable(why) => o.scaling_error = Some(why),
        ScalingPlan::Nothing => {}
        ScalingPlan::Remove { note } => {
            let removed = c.delete(ObjectKind::ScaledObject, ns, &so_name).await?;
            c.delete(ObjectKind::TriggerAuthentication, ns, &ta_name)
                .await?;
            rec.memory
                .forget_applied(ObjectKind::ScaledObject, ns, &so_name);
            rec.memory
                .forget_applied(ObjectKind::TriggerAuthentication, ns, &ta_name);
            if removed {
                c.event(actor, EventSpec::normal(Reason::ScaledObjectDeleted, note))
                    .await;
            }
        }
        ScalingPlan::Apply { announce } => {
            let Some(t) = transport else {
                return Ok(());
            };
            let ta: DynamicObject =
                serde_json::from_value(keda::trigger_authentication(r, labels, owner, t))
                    .map_err(kube::Error::SerdeError)?;
            let url = if t.kind == TRANSPORT_RABBITMQ {
                None
            } else {
                queue_url
            };
            let so: DynamicObject =
                serde_json::from_value(keda::scaled_object(r, labels, owner, t, url))
                    .map_err(kube::Error::SerdeError)?;
            let res = async {
                let ta_live = c.live(ObjectKind::TriggerAuthentication, ns, &ta_name);
                apply_changed(rec, ns, Object::TriggerAuthentication(ta), ta_live, None).await?;
                let so_live = c.live(ObjectKind::ScaledObject, ns, &so_name);
                apply_changed(rec, ns, Object::ScaledObject(so), so_live, None).await
            }
            .await;
            match res {
                Ok(_) if announce => {
                    let note = "KEDA ScaledObject successfully created".to_string();
                    c.event(actor, EventSpec::normal(Reason::ScaledObjectCreated, note))
                        .await;
                }
                Ok(_) => {}
                Err(e) => {
                    let ev = EventSpec::warning(Reason::ScaledObjectFailed, e.to_string());
                    c.event(actor, ev).await;
                    o.scaling_error = Some(e.to_string());
                }
            }
        }
    }
    Ok(())
}
