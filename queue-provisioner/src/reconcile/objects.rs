//! The Kubernetes objects step: transport Secrets, ServiceAccount, workload and KEDA objects,
//! as [`plan::workload`] and [`plan::scaling`] decide, each applied only when it changed, and
//! only over (or deleting) an object that is the actor's ([`ownership`]).

use std::collections::BTreeMap;
use std::time::Instant;

use asya_api::config::{TRANSPORT_RABBITMQ, Transport};
use asya_api::{AsyncActor, ResolvedActor, naming};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::DynamicObject;

use crate::apply_skip::{self, Applied, ApplyDecision};
use crate::broker_identity::plan::VERSION_ANNOTATION;
use crate::model::{ObjectKind, WorkloadKind};
use crate::render::{self, keda, workload};
use crate::status::{Observed, WorkloadObs};

use super::memory::ObjectKey;
use super::ownership::{self, Claim, Us, Write, WriteStep};
use super::plan::{self, EventSpec, ObjectsSeen, Reason, ScalingPlan, WorkloadPlan};
use super::write::{delete_if_ours, holder_meta};
use super::{Answer, Cached, Cluster, Object, Reconciler, keda_auth};

/// Why an object step did not write.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// The name is held by an object that is not the actor's: left untouched (the message
    /// names its kind, name and holder).
    #[error("{0}")]
    NotOurs(String),
}

/// Applies `obj` only over what is the actor's ([`ownership::write_step`]), asking the
/// caches who holds the name (a kind without a cache: a read). A creation the API server
/// refuses because the name is held after all reads the holder and decides again, once.
async fn write_if_ours<C: Cluster>(
    c: &C,
    us: Us<'_>,
    ns: &str,
    obj: &Object,
    cached: Cached,
) -> Result<Answer, ApplyError> {
    let (kind, name) = (obj.kind(), obj.name());
    let seen = match cached {
        Cached::Present(m) => Some(*m),
        Cached::Missing => None,
        Cached::NotCached => c.metadata(kind, ns, &name).await?,
    };
    let write = match ownership::write_step(kind, ns, &name, seen.as_ref(), us) {
        WriteStep::Write(w) => w,
        WriteStep::Keep { message } => return Err(ApplyError::NotOurs(message)),
    };
    match c.apply(ns, obj, &write).await {
        Err(kube::Error::Api(s)) if s.code == 409 && write == Write::Create => {
            let meta = c.metadata(kind, ns, &name).await?;
            match ownership::write_step(kind, ns, &name, meta.as_ref(), us) {
                WriteStep::Write(w @ Write::Update { .. }) => Ok(c.apply(ns, obj, &w).await?),
                // Gone again since: the next reconcile creates it.
                WriteStep::Write(Write::Create) => Err(kube::Error::Api(s).into()),
                WriteStep::Keep { message } => Err(ApplyError::NotOurs(message)),
            }
        }
        res => Ok(res?),
    }
}

/// The event of an object left untouched because another holds its name.
pub fn not_ours_event(message: &str) -> EventSpec {
    EventSpec::warning(Reason::NameConflict, message.to_string())
}

/// Applies `desired` (server-side apply, with its hash in [`apply_skip::APPLIED_HASH`])
/// unless the last apply sent the same and the live object (`cached`) is still the one it
/// produced, or a restarted controller finds it carrying that hash. `initial`:
/// replicas set only when creating, after the hash is taken, so later applies leave them
/// out without it counting as a change. `None` when skipped.
async fn apply_changed<C: Cluster>(
    r: &Reconciler<C>,
    us: Us<'_>,
    ns: &str,
    mut desired: Object,
    cached: Cached,
    initial: Option<i32>,
) -> Result<Option<Answer>, ApplyError> {
    let key = ObjectKey::new(desired.kind(), ns, &desired.name());
    let hash = desired.hash();
    let now = Instant::now();
    let last = r.memory.applied(&key);
    let answer = match apply_skip::decide_apply(last.as_ref(), hash, cached.live(), now) {
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
            // A name held by someone else is not taken over; ours is applied with force, a
            // creation without (docs/DESIGN.md §9).
            if let Some(n) = initial {
                desired.set_replicas(n);
            }
            desired
                .meta_mut()
                .annotations
                .get_or_insert_default()
                .insert(apply_skip::APPLIED_HASH.into(), format!("{hash:016x}"));
            write_if_ours(&r.cluster, us, ns, &desired, cached).await?
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
    /// The namespace's Redis credential version (state proxies), set on the pod template.
    pub state_credential_version: Option<u64>,
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

/// Hands a workload just created at `initial` replicas to the handoff manager, so our later
/// applies (which leave replicas to the HPA) do not reset them, and returns what the
/// workload says of itself: from the apply's answer (`sent`), or the cache when the apply
/// was skipped.
async fn hand_new_workload_over<C: Cluster>(
    r: &Reconciler<C>,
    wp: &WorkloadPlan,
    ns: &str,
    name: &str,
    sent: Option<Answer>,
) -> Result<WorkloadObs, ApplyError> {
    if let (Some(n), Some(_)) = (wp.initial, &sent) {
        r.cluster.claim_replicas(wp.kind, ns, name, n).await?;
    }
    let seen = match sent {
        Some(a) => a.workload,
        None => r.cluster.cached_workload(wp.kind, ns, name),
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

/// The objects step. Workload and KEDA failures are recorded in `o` (and announced); what
/// it creates is added to `made`, announced with the status. An error returned is one of the
/// steps around them, which the caller records as a workload error.
pub async fn apply<C: Cluster>(
    rec: &Reconciler<C>,
    actor: &AsyncActor,
    r: &ResolvedActor,
    owner: &OwnerReference,
    o: &mut Observed,
    broker: &FromBroker,
    made: &mut Vec<EventSpec>,
) -> Result<(), ApplyError> {
    let labels: &BTreeMap<String, String> = &actor.labels().clone();
    let queue_url = broker.queue_url.as_deref();
    let c = &rec.cluster;
    let config = &rec.config;
    let ns = &r.namespace;
    let us = Us {
        uid: &owner.uid,
        name: &r.name,
    };
    let transport = config.transports.get(&r.transport);
    let prev = actor.status.as_ref();

    // Transport credentials in the actor's namespace (shared by its actors: one apply).
    if let (Some(t), Ok(creds)) = (transport, c.transport(&r.transport).await) {
        for s in render::transport_secrets(ns, &r.transport, t, &creds) {
            apply_changed(rec, us, ns, Object::Secret(s), Cached::NotCached, None).await?;
        }
    }
    // SQS without shared keys nor an IRSA role: the pods cannot authenticate; say so. Keys
    // no longer shared leave the namespace (a failure is retried on the next reconcile).
    if let Some(t) = transport.filter(|t| t.is_sqs()) {
        keda_auth::mark_sqs_identity_missing(o, &r.transport, t, config);
        if let Err(e) = keda_auth::remove_unshared_sqs_keys(rec, r, t).await {
            tracing::warn!(namespace = %ns, actor = %r.name, error = %e,
                "removing copies of the platform's static SQS keys no longer shared");
        }
    }
    // The namespace's gateway report token, which its sidecars read at start: its version
    // goes on the pod template below, so a new token rolls the pods onto it.
    let report_token = super::gateway_report::ensure(rec, actor, ns).await;
    let sa = render::service_account(r, labels, owner, config);
    let sa_cached = c.cached(
        ObjectKind::ServiceAccount,
        ns,
        &naming::service_account_name(&r.name),
    );
    // A ServiceAccount of that name that is not the actor's stops the step here: its pods
    // would run as someone else's identity.
    apply_changed(rec, us, ns, Object::ServiceAccount(sa), sa_cached, None).await?;

    // What to do with the workload and KEDA's objects, from what the caches and this
    // process know before any of it is written.
    let name = naming::workload_name(&r.name);
    let so_name = naming::scaled_object_name(&r.name);
    let ta_name = naming::trigger_authentication_name(&r.name);
    let kind = WorkloadKind::of(r.workload_kind());
    let keda_installed = c.keda_installed();
    let workload_cached = c.cached(kind.object(), ns, &name);
    let seen = ObjectsSeen {
        keda: keda_installed,
        so_cached: keda_installed && c.scaled_object_cached(ns, &so_name),
        transport_known: transport.is_some(),
        workload_live: workload_cached.live(),
        workload_applied_before: rec
            .memory
            .was_applied(&ObjectKey::new(kind.object(), ns, &name)),
    };
    let plan = plan::objects(prev, r, o, &seen);
    let wp = &plan.workload;

    // The workload; the other kind goes when the actor switched kinds.
    if wp.hand_over
        && ownership::claim(
            kind.object(),
            holder_meta(c, kind.object(), ns, &name).await?.as_ref(),
            us,
        ) == Claim::Ours
    {
        hand_replicas_over(rec, kind, ns, &name).await?;
    }
    if let Some(other) = wp.remove {
        if let Err(kept) = delete_if_ours(c, us, other.object(), ns, &name).await? {
            o.foreign.push(kept);
        }
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
    if let Some(v) = broker.state_credential_version {
        set_template_annotation(
            &mut desired,
            crate::state_identity::plan::VERSION_ANNOTATION,
            &v.to_string(),
        );
    }
    if let Some(v) = report_token.version() {
        set_template_annotation(&mut desired, super::gateway_report::VERSION_ANNOTATION, v);
    }
    // The workload's apply decides the rest: a ScaledObject targets the workload by name,
    // and over someone else's Deployment it would hand that one to KEDA. Then the handoff of
    // a new workload's replicas and KEDA's objects wait only for the workload, not for each
    // other (the handoff claims the replicas the workload was created with, KEDA's
    // minimum), so they are sent together; their outcomes are recorded and announced in
    // this order afterwards, as when they ran in turn.
    let sent = apply_changed(rec, us, ns, desired, workload_cached, wp.initial).await;
    let workload_foreign = matches!(sent, Err(ApplyError::NotOurs(_)));
    let keda = Keda {
        r,
        us,
        labels,
        owner,
        transport,
        queue_url,
        so_name: &so_name,
        ta_name: &ta_name,
    };
    let (workload, scaled) = match sent {
        Ok(sent) => futures::join!(
            hand_new_workload_over(rec, wp, ns, &name, sent),
            scaling(rec, &keda, plan.scaling, workload_foreign)
        ),
        Err(e) => (
            Err(e),
            scaling(rec, &keda, plan.scaling, workload_foreign).await,
        ),
    };
    match workload {
        Ok(w) => {
            if wp.announce {
                let note = format!("{kind} {name} created");
                made.push(EventSpec::normal(Reason::WorkloadCreated, note));
            }
            o.workload = Some(w);
        }
        Err(ApplyError::NotOurs(m)) => {
            c.event(actor, not_ours_event(&m)).await;
            o.foreign.push(m.clone());
            o.workload_error = Some(m);
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
    let scaled = scaled?;
    for ev in scaled.events {
        c.event(actor, ev).await;
    }
    o.foreign.extend(scaled.foreign);
    if let Some(e) = scaled.error {
        o.scaling_error = Some(e);
    }
    made.extend(scaled.made);
    Ok(())
}

/// What the KEDA step renders from.
struct Keda<'a> {
    r: &'a ResolvedActor,
    us: Us<'a>,
    labels: &'a BTreeMap<String, String>,
    owner: &'a OwnerReference,
    transport: Option<&'a Transport>,
    queue_url: Option<&'a str>,
    so_name: &'a str,
    ta_name: &'a str,
}

/// What the KEDA step found, recorded and announced by the caller.
#[derive(Default)]
struct Scaled {
    /// `Observed::scaling_error`, when set.
    error: Option<String>,
    /// Names held by others, kept.
    foreign: Vec<String>,
    /// Events to send now, in order.
    events: Vec<EventSpec>,
    /// What it created, announced with the status.
    made: Vec<EventSpec>,
}

/// KEDA's objects as `plan` says, or none when scaling is off. An error returned is a step
/// around them (a delete's read, a rendering), recorded by the caller as a workload error.
async fn scaling<C: Cluster>(
    rec: &Reconciler<C>,
    k: &Keda<'_>,
    plan: ScalingPlan,
    workload_foreign: bool,
) -> Result<Scaled, ApplyError> {
    let c = &rec.cluster;
    let (r, us, ns) = (k.r, k.us, k.r.namespace.as_str());
    let (so_name, ta_name) = (k.so_name, k.ta_name);
    let mut out = Scaled::default();
    match plan {
        ScalingPlan::Unavailable(why) => out.error = Some(why),
        ScalingPlan::Nothing => {}
        ScalingPlan::Remove { note } => {
            let mut removed = false;
            for (kind, n) in [
                (ObjectKind::ScaledObject, so_name),
                (ObjectKind::TriggerAuthentication, ta_name),
            ] {
                match delete_if_ours(c, us, kind, ns, n).await? {
                    Ok(gone) => removed |= gone && kind == ObjectKind::ScaledObject,
                    Err(kept) => out.foreign.push(kept),
                }
            }
            rec.memory
                .forget_applied(ObjectKind::ScaledObject, ns, so_name);
            rec.memory
                .forget_applied(ObjectKind::TriggerAuthentication, ns, ta_name);
            if removed {
                out.events
                    .push(EventSpec::normal(Reason::ScaledObjectDeleted, note));
            }
        }
        ScalingPlan::Apply { announce } => {
            if workload_foreign {
                let kind = WorkloadKind::of(r.workload_kind());
                let name = naming::workload_name(&r.name);
                out.error = Some(format!(
                    "not applied: {kind} {ns}/{name} is not this actor's"
                ));
                return Ok(out);
            }
            let Some(t) = k.transport else {
                return Ok(out);
            };
            // RabbitMQ: none (the transport's ClusterTriggerAuthentication); SQS: the actor's.
            let ta: Option<DynamicObject> = keda::trigger_authentication(r, k.labels, k.owner, t)
                .map(serde_json::from_value)
                .transpose()
                .map_err(kube::Error::SerdeError)?;
            let url = if t.kind == TRANSPORT_RABBITMQ {
                None
            } else {
                k.queue_url
            };
            let wake = rec.config.wake.enabled;
            let so: DynamicObject =
                serde_json::from_value(keda::scaled_object(r, k.labels, k.owner, t, url, wake))
                    .map_err(kube::Error::SerdeError)?;
            let res = async {
                let mut ta_sent = false;
                if let Some(ta) = ta {
                    let ta_cached = c.cached(ObjectKind::TriggerAuthentication, ns, ta_name);
                    let obj = Object::TriggerAuthentication(ta);
                    ta_sent = apply_changed(rec, us, ns, obj, ta_cached, None)
                        .await?
                        .is_some();
                }
                let so_cached = c.cached(ObjectKind::ScaledObject, ns, so_name);
                apply_changed(rec, us, ns, Object::ScaledObject(so), so_cached, None).await?;
                Ok::<_, ApplyError>(ta_sent)
            }
            .await;
            match res {
                Ok(ta_sent) => {
                    if t.is_rabbitmq()
                        && let Some(why) = c.keda_identity_problem(&r.transport)
                    {
                        out.error = Some(keda_auth::identity_problem_message(&why));
                    }
                    if t.is_rabbitmq()
                        && let Err(e) = keda_auth::remove_legacy_rabbitmq(rec, r, us).await
                    {
                        // Tried again on the next reconcile; KEDA no longer reads them.
                        tracing::warn!(namespace = %ns, actor = %r.name, error = %e,
                            "removing the per-namespace KEDA credential of an older release");
                    }
                    if ta_sent && t.shares_static_credentials() {
                        out.events.extend(keda_auth::shared_event(r, t));
                    }
                    if announce {
                        let note = format!("KEDA ScaledObject {so_name} created");
                        out.made
                            .push(EventSpec::normal(Reason::ScaledObjectCreated, note));
                    }
                }
                Err(ApplyError::NotOurs(m)) => {
                    out.events.push(not_ours_event(&m));
                    out.foreign.push(m.clone());
                    out.error = Some(m);
                }
                Err(e) => {
                    out.events.push(EventSpec::warning(
                        Reason::ScaledObjectFailed,
                        e.to_string(),
                    ));
                    out.error = Some(e.to_string());
                }
            }
        }
    }
    Ok(out)
}
