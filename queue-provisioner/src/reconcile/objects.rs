//! The Kubernetes objects step: transport Secrets, ServiceAccount, workload and KEDA objects.
//! The plan says which writes to make ([`plan::Action`], from [`plan::workload_actions`] and
//! [`plan::keda_steps`]) and what their outcomes mean ([`plan::Effects`]); this module renders
//! the objects and runs the actions in a loop ([`execute`]): each applied only when it
//! changed, and only over (or deleting) an object that is the actor's ([`ownership`]).

use std::collections::BTreeMap;
use std::time::Instant;

use asya_api::config::Transport;
use asya_api::{AsyncActor, ResolvedActor, naming};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;

use crate::apply_skip::{self, Applied, ApplyDecision};
use crate::broker_identity::plan::VERSION_ANNOTATION;
use crate::model::{ObjectKind, WorkloadKind};
use crate::render::{self, keda, workload};
use crate::status::{Observed, WorkloadObs};

use super::memory::ObjectKey;
use super::ownership::{self, Claim, Us, Write, WriteStep};
use super::plan::{
    self, Action, Effects, EventSpec, KedaSteps, ObjectsSeen, Outcome, Rendered, WorkloadPlan,
};
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

/// Hands the replicas of a workload just created to the handoff manager as the plan says
/// ([`WorkloadPlan::handoff_after_apply`]), and returns what the workload says of itself:
/// from the apply's answer (`sent`), or the cache when the apply was skipped.
async fn hand_new_workload_over<C: Cluster>(
    r: &Reconciler<C>,
    wp: &WorkloadPlan,
    ns: &str,
    name: &str,
    sent: Option<Answer>,
) -> Result<WorkloadObs, ApplyError> {
    if let Some(n) = wp.handoff_after_apply(sent.is_some()) {
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
/// steps around them, which the caller records as a workload error. What to write and what
/// the outcomes mean is [`plan`]'s ([`plan::workload_actions`], [`plan::keda_steps`] and
/// their effects); this carries it out.
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
    let ctx = Ctx {
        rec,
        us,
        ns,
        workload: Some((desired, workload_cached)),
        trigger_authentication: None,
        scaled_object: None,
    };
    // The workload: its handoff and the removal of the other kind, then its apply.
    let mut actions = plan::workload_actions(wp, &name);
    let last = actions.pop();
    for a in &actions {
        if let Done::Kept(m) = execute(&ctx, a).await? {
            o.foreign.push(m);
        }
    }
    let sent = match &last {
        Some(a) => execute(&ctx, a).await.map(Done::answer),
        None => Ok(None),
    };
    // The workload's apply decides the rest: a ScaledObject targets the workload by name,
    // and over someone else's Deployment it would hand that one to KEDA. Then the handoff of
    // a new workload's replicas and KEDA's objects wait only for the workload, not for each
    // other (the handoff claims the replicas the workload was created with, KEDA's
    // minimum), so they are sent together; their outcomes are recorded and announced in
    // this order afterwards, as when they ran in turn.
    let workload_foreign = matches!(outcome_of(&sent), Outcome::NotOurs(_));
    let steps = plan::keda_steps(plan.scaling, r, workload_foreign, transport);
    let keda = Keda {
        r,
        us,
        labels,
        owner,
        transport,
        queue_url: broker.queue_url.as_deref(),
    };
    let (workload, scaled) = match sent {
        Ok(sent) => futures::join!(
            hand_new_workload_over(rec, wp, ns, &name, sent),
            scaling(rec, &keda, steps)
        ),
        Err(e) => (Err(e), scaling(rec, &keda, steps).await),
    };
    let outcome = outcome_of(&workload);
    if let Ok(w) = workload {
        o.workload = Some(w);
    }
    let effects = plan::workload_effects(wp, &name, &outcome);
    if let Some(e) = record(c, actor, o, made, effects).await {
        o.workload_error = Some(e);
    }
    if let Some(e) = record(c, actor, o, made, scaled?).await {
        o.scaling_error = Some(e);
    }
    Ok(())
}

/// Publishes `effects`' events now and records the rest in `o` and `made`; the step's
/// error for the status.
async fn record<C: Cluster>(
    c: &C,
    actor: &AsyncActor,
    o: &mut Observed,
    made: &mut Vec<EventSpec>,
    effects: Effects,
) -> Option<String> {
    for ev in effects.events {
        c.event(actor, ev).await;
    }
    o.foreign.extend(effects.foreign);
    made.extend(effects.made);
    effects.error
}

/// How a write ended, for the plan's effects.
fn outcome_of<T>(res: &Result<T, ApplyError>) -> Outcome {
    match res {
        Ok(_) => Outcome::Done,
        Err(ApplyError::NotOurs(m)) => Outcome::NotOurs(m.clone()),
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

/// What the actions apply, rendered: the workload with what its cache held when the plan
/// was made; KEDA's objects, whose caches are read when they are applied.
struct Ctx<'a, C> {
    rec: &'a Reconciler<C>,
    us: Us<'a>,
    ns: &'a str,
    workload: Option<(Object, Cached)>,
    trigger_authentication: Option<Object>,
    scaled_object: Option<Object>,
}

/// What an action did.
enum Done {
    Nothing,
    /// `None`: the apply was skipped (unchanged).
    Applied(Option<Answer>),
    Deleted(bool),
    /// Someone else's: kept (the message names it).
    Kept(String),
}

impl Done {
    fn answer(self) -> Option<Answer> {
        match self {
            Done::Applied(a) => a,
            _ => None,
        }
    }
}

/// Carries out one action of the plan against the ports.
async fn execute<C: Cluster>(x: &Ctx<'_, C>, a: &Action) -> Result<Done, ApplyError> {
    let (rec, us, ns) = (x.rec, x.us, x.ns);
    let c = &rec.cluster;
    match a {
        Action::HandReplicasOver { kind, name } => {
            let holder = holder_meta(c, kind.object(), ns, name).await?;
            if ownership::claim(kind.object(), holder.as_ref(), us) == Claim::Ours {
                hand_replicas_over(rec, *kind, ns, name).await?;
            }
            Ok(Done::Nothing)
        }
        Action::DeleteIfOurs { kind, name } => {
            let res = delete_if_ours(c, us, *kind, ns, name).await?;
            rec.memory.forget_applied(*kind, ns, name);
            Ok(match res {
                Ok(gone) => Done::Deleted(gone),
                Err(kept) => Done::Kept(kept),
            })
        }
        Action::Apply(what) => {
            let (obj, cached, initial) = match what {
                Rendered::Workload { initial } => match &x.workload {
                    Some((obj, cached)) => (obj, cached.clone(), *initial),
                    None => return Ok(Done::Nothing),
                },
                Rendered::TriggerAuthentication | Rendered::ScaledObject => {
                    let obj = match what {
                        Rendered::TriggerAuthentication => &x.trigger_authentication,
                        _ => &x.scaled_object,
                    };
                    let Some(obj) = obj else {
                        return Ok(Done::Nothing);
                    };
                    (obj, c.cached(obj.kind(), ns, &obj.name()), None)
                }
            };
            let sent = apply_changed(rec, us, ns, obj.clone(), cached, initial).await?;
            Ok(Done::Applied(sent))
        }
    }
}

/// What the KEDA step renders from.
struct Keda<'a> {
    r: &'a ResolvedActor,
    us: Us<'a>,
    labels: &'a BTreeMap<String, String>,
    owner: &'a OwnerReference,
    transport: Option<&'a Transport>,
    queue_url: Option<&'a str>,
}

/// KEDA's objects as `steps` say. An error returned is a step around them (a delete's read,
/// a rendering), recorded by the caller as a workload error.
async fn scaling<C: Cluster>(
    rec: &Reconciler<C>,
    k: &Keda<'_>,
    steps: KedaSteps,
) -> Result<Effects, ApplyError> {
    let (r, us, ns) = (k.r, k.us, k.r.namespace.as_str());
    let mut ctx = Ctx {
        rec,
        us,
        ns,
        workload: None,
        trigger_authentication: None,
        scaled_object: None,
    };
    match steps {
        KedaSteps::Nothing { error } => Ok(Effects {
            error,
            ..Default::default()
        }),
        KedaSteps::Remove { actions, note } => {
            let (mut so_deleted, mut foreign) = (false, Vec::new());
            for a in &actions {
                match execute(&ctx, a).await? {
                    Done::Deleted(gone) => {
                        so_deleted |= gone
                            && matches!(a, Action::DeleteIfOurs { kind, .. } if *kind == ObjectKind::ScaledObject);
                    }
                    Done::Kept(m) => foreign.push(m),
                    Done::Nothing | Done::Applied(_) => {}
                }
            }
            Ok(plan::removed_effects(&note, so_deleted, foreign))
        }
        KedaSteps::Apply {
            actions,
            queue_url,
            after,
        } => {
            let Some(t) = k.transport else {
                return Ok(Effects::default());
            };
            ctx.trigger_authentication = keda::trigger_authentication(r, k.labels, k.owner, t)
                .map(serde_json::from_value)
                .transpose()
                .map_err(kube::Error::SerdeError)?
                .map(Object::TriggerAuthentication);
            let url = if queue_url { k.queue_url } else { None };
            let wake = rec.config.wake.enabled && r.wakes_ahead();
            let so = keda::scaled_object(r, k.labels, k.owner, t, url, wake);
            ctx.scaled_object = Some(Object::ScaledObject(
                serde_json::from_value(so).map_err(kube::Error::SerdeError)?,
            ));
            let (mut ta_sent, mut res) = (false, Ok(()));
            for a in &actions {
                match execute(&ctx, a).await {
                    Ok(Done::Applied(Some(_)))
                        if *a == Action::Apply(Rendered::TriggerAuthentication) =>
                    {
                        ta_sent = true;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        res = Err(e);
                        break;
                    }
                }
            }
            let outcome = outcome_of(&res);
            if outcome == Outcome::Done
                && after.remove_legacy
                && let Err(e) = keda_auth::remove_legacy_rabbitmq(rec, r, us).await
            {
                // Tried again on the next reconcile; KEDA no longer reads them.
                tracing::warn!(namespace = %ns, actor = %r.name, error = %e,
                    "removing the per-namespace KEDA credential of an older release");
            }
            let problem = if outcome == Outcome::Done && after.check_identity {
                rec.cluster.keda_identity_problem(&r.transport)
            } else {
                None
            };
            Ok(plan::applied_effects(
                &after,
                &outcome,
                ta_sent,
                problem.as_deref(),
            ))
        }
    }
}
