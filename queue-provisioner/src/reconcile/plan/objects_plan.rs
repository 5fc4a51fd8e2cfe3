//! The objects step's decisions (the workload and KEDA's objects) as data: which writes to
//! make and in which order ([`Action`]), and what their outcomes make of the status and the
//! events ([`Effects`]). [`super::super::objects`] renders the objects, carries the actions
//! out in a loop against the ports and merges the effects; it decides nothing itself.

use asya_api::config::{TRANSPORT_RABBITMQ, Transport};
use asya_api::{AsyncActorStatus, ResolvedActor, naming};

use crate::apply_skip::{self, Live};
use crate::model::{ObjectKind, ScalingMode, WorkloadKind};
use crate::status::Observed;

use super::{EventSpec, Reason};

/// What the objects step looks at before it writes anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectsSeen {
    /// KEDA's CRDs are installed.
    pub keda: bool,
    /// The cache holds the actor's ScaledObject.
    pub so_cached: bool,
    /// The cluster configuration has the actor's transport.
    pub transport_known: bool,
    /// The workload of the kind the actor wants, as its cache has it.
    pub workload_live: Live,
    /// This process applied that workload before.
    pub workload_applied_before: bool,
}

/// What to do with the actor's workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadPlan {
    pub kind: WorkloadKind,
    /// Switching from fixed replicas to KEDA: hand `spec.replicas` to the handoff manager
    /// before our apply stops setting it (see [`super::objects`]).
    pub hand_over: bool,
    /// The actor switched kinds: the workload of the kind it had goes.
    pub remove: Option<WorkloadKind>,
    /// Create it at this many replicas and hand them to the handoff manager at once
    /// ([`apply_skip::initial_replicas`]): a KEDA-scaled workload being created.
    pub initial: Option<i32>,
    /// Announce `WorkloadCreated` when the apply succeeds: the status never named a kind.
    pub announce: bool,
}

impl WorkloadPlan {
    /// The replicas to hand to the handoff manager once the workload's apply was `sent`: those
    /// a new workload was created with, so our later applies (which leave replicas to the
    /// HPA) do not reset them. `None` when it was not created now (a skipped apply sent none).
    pub fn handoff_after_apply(&self, sent: bool) -> Option<i32> {
        self.initial.filter(|_| sent)
    }
}

/// The objects step: the workload and KEDA's objects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectsPlan {
    pub workload: WorkloadPlan,
    pub scaling: ScalingPlan,
}

pub fn objects(
    prev: Option<&AsyncActorStatus>,
    r: &ResolvedActor,
    o: &Observed,
    seen: &ObjectsSeen,
) -> ObjectsPlan {
    let kind = WorkloadKind::of(r.workload_kind());
    let mut workload = workload(prev, kind, o.scaling_enabled);
    workload.initial = apply_skip::initial_replicas(
        o.scaling_enabled,
        o.min_replicas,
        &seen.workload_live,
        seen.workload_applied_before,
    );
    ObjectsPlan {
        workload,
        scaling: scaling(
            prev,
            r,
            o.scaling_enabled,
            seen.keda,
            seen.so_cached,
            seen.transport_known,
        ),
    }
}

/// The workload's handoff, kind switch and announcement (its initial replicas: [`objects`]).
pub fn workload(
    prev: Option<&AsyncActorStatus>,
    kind: WorkloadKind,
    scaling_enabled: bool,
) -> WorkloadPlan {
    let before = prev.and_then(|s| s.workload_kind.as_deref());
    let was = prev
        .and_then(|s| s.scaling_mode.as_deref())
        .and_then(ScalingMode::parse);
    WorkloadPlan {
        kind,
        hand_over: scaling_enabled && was == Some(ScalingMode::Manual),
        remove: (before == Some(kind.other().as_str())).then_some(kind.other()),
        initial: None,
        announce: before.is_none(),
    }
}

/// What to do with the actor's KEDA objects (ScaledObject and TriggerAuthentication).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScalingPlan {
    /// Scaling is on but KEDA is not installed: the status says so.
    Unavailable(String),
    /// Nothing to apply or remove.
    Nothing,
    /// Scaling is off: remove them, announcing the removal with this note if there was one.
    Remove { note: String },
    /// Apply them; announce `ScaledObjectCreated` when the status did not say KEDA before.
    Apply { announce: bool },
}

/// `keda`: KEDA's CRDs are installed; `so_cached`: the cache holds the actor's ScaledObject;
/// `transport_known`: the cluster configuration has the actor's transport.
pub fn scaling(
    prev: Option<&AsyncActorStatus>,
    r: &ResolvedActor,
    scaling_enabled: bool,
    keda: bool,
    so_cached: bool,
    transport_known: bool,
) -> ScalingPlan {
    let was = prev.and_then(|s| s.scaling_mode.as_deref());
    if !keda {
        return if scaling_enabled {
            ScalingPlan::Unavailable("KEDA's CRDs are not installed in the cluster".into())
        } else {
            ScalingPlan::Nothing
        };
    }
    if !scaling_enabled {
        // Only when there is something to remove: not two DELETEs on every reconcile.
        let was_keda = was != Some(ScalingMode::Manual.as_str());
        if !so_cached && !was_keda {
            return ScalingPlan::Nothing;
        }
        return ScalingPlan::Remove {
            note: format!(
                "scaling disabled: ScaledObject removed, {} fixed replica(s)",
                r.fixed_replicas()
            ),
        };
    }
    if !transport_known {
        return ScalingPlan::Nothing;
    }
    ScalingPlan::Apply {
        announce: was != Some(ScalingMode::Keda.as_str()),
    }
}

/// An object the step renders and applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rendered {
    /// The actor's Deployment or StatefulSet; `initial`: created at this many replicas
    /// ([`WorkloadPlan::initial`]).
    Workload {
        initial: Option<i32>,
    },
    /// The actor's TriggerAuthentication (SQS).
    TriggerAuthentication,
    ScaledObject,
}

/// One write of the objects step, carried out in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Hand the workload's `spec.replicas` to the handoff manager, if the workload is the
    /// actor's.
    HandReplicasOver { kind: WorkloadKind, name: String },
    /// Delete the object if it is the actor's and forget its last apply; one that is
    /// someone else's is kept and named in `Observed::foreign`.
    DeleteIfOurs { kind: ObjectKind, name: String },
    /// Apply the object if it changed, only over the actor's.
    Apply(Rendered),
}

/// The workload's writes, in order: the replica handoff, the removal of the other kind, the
/// apply. `name`: the workload's.
pub fn workload_actions(wp: &WorkloadPlan, name: &str) -> Vec<Action> {
    let mut out = Vec::new();
    if wp.hand_over {
        out.push(Action::HandReplicasOver {
            kind: wp.kind,
            name: name.into(),
        });
    }
    if let Some(other) = wp.remove {
        out.push(Action::DeleteIfOurs {
            kind: other.object(),
            name: name.into(),
        });
    }
    out.push(Action::Apply(Rendered::Workload {
        initial: wp.initial,
    }));
    out
}

/// How an apply ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// The name is held by an object that is not the actor's (the message names it).
    NotOurs(String),
    Failed(String),
}

/// What an outcome makes of the status and the events.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// Events to publish now, in order.
    pub events: Vec<EventSpec>,
    /// Events of what was created, announced with the status ([`super::announcement`]).
    pub made: Vec<EventSpec>,
    /// Names held by others, kept (`Observed::foreign`).
    pub foreign: Vec<String>,
    /// The step's error for the status (`Observed::workload_error` or `scaling_error`).
    pub error: Option<String>,
}

/// The event of an object left untouched because another holds its name.
pub fn not_ours_event(message: &str) -> EventSpec {
    EventSpec::warning(Reason::NameConflict, message.to_string())
}

/// A write refused or failed: the event (`NameConflict` over someone else's object, else
/// `failed`), the name kept, the error.
fn refused(outcome: &Outcome, failed: Reason) -> Effects {
    match outcome {
        Outcome::Done => Effects::default(),
        Outcome::NotOurs(m) => Effects {
            events: vec![not_ours_event(m)],
            foreign: vec![m.clone()],
            error: Some(m.clone()),
            ..Default::default()
        },
        Outcome::Failed(e) => Effects {
            events: vec![EventSpec::warning(failed, e.clone())],
            error: Some(e.clone()),
            ..Default::default()
        },
    }
}

/// The workload's apply `outcome`: its creation announced as the plan says, or the refusal.
pub fn workload_effects(wp: &WorkloadPlan, name: &str, outcome: &Outcome) -> Effects {
    match outcome {
        Outcome::Done if wp.announce => Effects {
            made: vec![EventSpec::normal(
                Reason::WorkloadCreated,
                format!("{} {name} created", wp.kind),
            )],
            ..Default::default()
        },
        o => refused(o, Reason::WorkloadFailed),
    }
}

/// What to do once KEDA's objects were applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AfterKeda {
    /// RabbitMQ: the status says when the transport's ClusterTriggerAuthentication is not
    /// in place ([`identity_problem_message`]).
    pub check_identity: bool,
    /// RabbitMQ: remove what the older per-namespace layout left.
    pub remove_legacy: bool,
    /// Published when the TriggerAuthentication was sent: the namespace holds the
    /// platform's static keys (`shareStaticCredentials`).
    pub shared: Option<EventSpec>,
    /// Announced with the status: the ScaledObject was created.
    pub announce: Option<EventSpec>,
}

/// KEDA's writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KedaSteps {
    /// Nothing to write; the status's scaling error, if any.
    Nothing { error: Option<String> },
    /// Delete these; when the ScaledObject went, publish `note` as `ScaledObjectDeleted`.
    Remove { actions: Vec<Action>, note: String },
    /// Apply these, then `after`. `queue_url`: the ScaledObject's trigger names the queue's
    /// URL (SQS's scaler reads the queue by URL; RabbitMQ's by name).
    Apply {
        actions: Vec<Action>,
        queue_url: bool,
        after: AfterKeda,
    },
}

/// KEDA's writes as `plan` says, given whether the workload's apply was refused because its
/// name is held by someone else (a ScaledObject targets the workload by name: over someone
/// else's it would hand that workload to KEDA) and the actor's transport (`None`: the cluster
/// configuration lacks it).
pub fn keda_steps(
    plan: ScalingPlan,
    r: &ResolvedActor,
    workload_foreign: bool,
    transport: Option<&Transport>,
) -> KedaSteps {
    let ns = &r.namespace;
    match plan {
        ScalingPlan::Unavailable(why) => KedaSteps::Nothing { error: Some(why) },
        ScalingPlan::Nothing => KedaSteps::Nothing { error: None },
        ScalingPlan::Remove { note } => KedaSteps::Remove {
            actions: vec![
                Action::DeleteIfOurs {
                    kind: ObjectKind::ScaledObject,
                    name: naming::scaled_object_name(&r.name),
                },
                Action::DeleteIfOurs {
                    kind: ObjectKind::TriggerAuthentication,
                    name: naming::trigger_authentication_name(&r.name),
                },
            ],
            note,
        },
        ScalingPlan::Apply { .. } if workload_foreign => {
            let kind = WorkloadKind::of(r.workload_kind());
            let name = naming::workload_name(&r.name);
            KedaSteps::Nothing {
                error: Some(format!(
                    "not applied: {kind} {ns}/{name} is not this actor's"
                )),
            }
        }
        ScalingPlan::Apply { announce } => {
            let Some(t) = transport else {
                return KedaSteps::Nothing { error: None };
            };
            let rabbitmq = t.kind == TRANSPORT_RABBITMQ;
            // RabbitMQ: none (the transport's ClusterTriggerAuthentication); SQS: the actor's.
            let mut actions = Vec::new();
            if !rabbitmq {
                actions.push(Action::Apply(Rendered::TriggerAuthentication));
            }
            actions.push(Action::Apply(Rendered::ScaledObject));
            let so_name = naming::scaled_object_name(&r.name);
            KedaSteps::Apply {
                actions,
                queue_url: !rabbitmq,
                after: AfterKeda {
                    check_identity: t.is_rabbitmq(),
                    remove_legacy: t.is_rabbitmq(),
                    shared: t
                        .shares_static_credentials()
                        .then(|| shared_event(r, t))
                        .flatten(),
                    announce: announce.then(|| {
                        EventSpec::normal(
                            Reason::ScaledObjectCreated,
                            format!("KEDA ScaledObject {so_name} created"),
                        )
                    }),
                },
            }
        }
    }
}

/// The removal's event: only when the ScaledObject was there and went.
pub fn removed_effects(note: &str, so_deleted: bool, foreign: Vec<String>) -> Effects {
    Effects {
        events: so_deleted
            .then(|| EventSpec::normal(Reason::ScaledObjectDeleted, note.to_string()))
            .into_iter()
            .collect(),
        foreign,
        ..Default::default()
    }
}

/// The applies' `outcome` (with whether the TriggerAuthentication was sent, and what KEDA's
/// monitor identity loop found for the transport, asked only when `after.check_identity`).
pub fn applied_effects(
    after: &AfterKeda,
    outcome: &Outcome,
    ta_sent: bool,
    identity_problem: Option<&str>,
) -> Effects {
    if *outcome != Outcome::Done {
        return refused(outcome, Reason::ScaledObjectFailed);
    }
    Effects {
        error: identity_problem
            .filter(|_| after.check_identity)
            .map(identity_problem_message),
        events: after
            .shared
            .clone()
            .filter(|_| ta_sent)
            .into_iter()
            .collect(),
        made: after.announce.clone().into_iter().collect(),
        ..Default::default()
    }
}

/// The Warning on each actor that holds the platform's static keys (opt-in).
pub fn shared_static_credentials_event(transport: &str, secret: &str) -> EventSpec {
    EventSpec::warning(
        Reason::SharedStaticCredentials,
        format!(
            "transports.{transport}.config.shareStaticCredentials is true: the platform's static \
             AWS keys (Secret {secret}) are copied into this namespace; whoever reads Secrets here \
             reaches every queue those keys reach. Use actorServiceAccount.roleArn (IRSA) instead"
        ),
    )
}

/// The actor's [`shared_static_credentials_event`], when the transport names its keys' Secret.
fn shared_event(r: &ResolvedActor, t: &Transport) -> Option<EventSpec> {
    t.config
        .credentials_secret_ref
        .as_ref()
        .map(|s| shared_static_credentials_event(&r.transport, &s.name))
}

/// The status's scaling error when KEDA's monitor identity is not in place.
pub fn identity_problem_message(why: &str) -> String {
    format!(
        "KEDA cannot read the queue depth (its ClusterTriggerAuthentication is not in place): {why}"
    )
}
