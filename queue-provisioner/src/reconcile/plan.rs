//! The reconcile's decisions, pure: from the actor, its resolved spec and what was observed,
//! what to create, update, delete and hand over, which events to publish, what status to
//! write and when to look again. The driver ([`super::actor`], [`super::cleanup`]) gathers
//! the observations, asks these functions, and carries out the answers through
//! [`super::Cluster`].

use std::time::Duration;

use asya_api::review::ActorReview;
use asya_api::{AsyncActor, AsyncActorStatus, ResolvedActor, labels};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::apply_skip::desired_hash;
use crate::model::{Phase, WorkloadKind};
use crate::queue::QueueError;
use crate::status::{Observed, TransportObs};

use super::FINALIZER;

/// The periodic reconcile (queue check, queue depth), spread over [`PERIOD`] + up to
/// [`SPREAD`] by actor so that actors applied together do not come back together.
pub const PERIOD: Duration = Duration::from_secs(60);
pub const SPREAD: Duration = Duration::from_secs(15);
/// An actor with messages queued or in process is looked at this often instead (+ up to
/// [`BUSY_SPREAD`]), so that QUEUED and PROCESSING follow its queue as it drains rather than
/// show the last busy sample for a minute. Idle actors, the many, stay at [`PERIOD`].
pub const BUSY_PERIOD: Duration = Duration::from_secs(15);
pub const BUSY_SPREAD: Duration = Duration::from_secs(5);
/// An actor waiting for its flavors: flavor watches re-trigger too, but may run before the
/// catalog cache has the flavor.
pub const UNRESOLVED_RETRY: Duration = Duration::from_secs(10);
/// Pods without the sidecar while injection still fails: looked at again this soon.
pub const INJECTION_RETRY: Duration = Duration::from_secs(10);

/// When to reconcile the actor again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    After(Duration),
    /// Only on a change of the actor or what it owns.
    AwaitChange,
}

/// The reason an event is published with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    QueueCreated,
    QueueRecreated,
    QueueDeleted,
    QueueDeleteFailed,
    WorkloadCreated,
    WorkloadFailed,
    ScaledObjectCreated,
    ScaledObjectDeleted,
    ScaledObjectFailed,
    PodWithoutSidecar,
    PodWithoutSidecarReplaced,
    /// A pod stuck on a credential Secret that the current configuration does not name
    /// (injected under another identity mode) was deleted, to be recreated as injected now.
    PodWithStaleCredentialsReplaced,
    /// The platform's static SQS keys were copied into the actor's namespace (opt-in).
    SharedStaticCredentials,
    /// The namespace's gateway report token could not be issued (key unreadable, or a
    /// Secret of that name the provisioner did not create).
    GatewayReportToken,
    /// A deleted actor annotated `asya.sh/skip-cleanup: "true"` released without cleanup.
    CleanupSkipped,
    /// A deleted actor released after cleanup gave up on its queue.
    CleanupIncomplete,
    /// The actor is in a namespace the admission webhook skips: nothing is created for it.
    NamespaceExcluded,
    /// An object with a name the actor needs is someone else's: left untouched.
    NameConflict,
    /// The queue of the actor's name is recorded as another actor's: left untouched.
    QueueNotOurs,
    /// `shareAdminCredentials`: the namespace holds the platform's broker password.
    SharedAdminCredentials,
    /// The namespace's broker identity got a (new) password.
    BrokerCredentialIssued,
    /// The platform's broker password was found copied into actor namespaces and has not
    /// been changed since.
    UnrotatedPlatformCredentials,
    /// The namespace's Redis user (state proxies) got a (new) password.
    StateCredentialIssued,
    /// The namespace's Redis user could not be ensured (its state is an earlier namespace's,
    /// the Redis refused or is not reachable).
    StateIdentity,
    /// The platform's Redis still lets anyone in as `default` without a password.
    SharedStateCredentials,
    /// What one reconcile made (queue, workload, ScaledObject) and the phase it led to, in
    /// one event ([`announcement`]).
    Provisioned,
    /// The actor entered this phase.
    Phase(Phase),
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::QueueCreated => "QueueCreated",
            Reason::QueueRecreated => "QueueRecreated",
            Reason::QueueDeleted => "QueueDeleted",
            Reason::QueueDeleteFailed => "QueueDeleteFailed",
            Reason::WorkloadCreated => "WorkloadCreated",
            Reason::WorkloadFailed => "WorkloadFailed",
            Reason::ScaledObjectCreated => "ScaledObjectCreated",
            Reason::ScaledObjectDeleted => "ScaledObjectDeleted",
            Reason::ScaledObjectFailed => "ScaledObjectFailed",
            Reason::PodWithoutSidecar => "PodWithoutSidecar",
            Reason::PodWithoutSidecarReplaced => "PodWithoutSidecarReplaced",
            Reason::PodWithStaleCredentialsReplaced => "PodWithStaleCredentialsReplaced",
            Reason::SharedStaticCredentials => "SharedStaticCredentials",
            Reason::GatewayReportToken => "GatewayReportToken",
            Reason::CleanupSkipped => "CleanupSkipped",
            Reason::CleanupIncomplete => "CleanupIncomplete",
            Reason::NamespaceExcluded => "NamespaceExcluded",
            Reason::NameConflict => "NameConflict",
            Reason::QueueNotOurs => "QueueNotOurs",
            Reason::SharedAdminCredentials => "SharedAdminCredentials",
            Reason::BrokerCredentialIssued => "BrokerCredentialIssued",
            Reason::UnrotatedPlatformCredentials => "UnrotatedPlatformCredentials",
            Reason::StateCredentialIssued => "StateCredentialIssued",
            Reason::StateIdentity => "StateIdentity",
            Reason::SharedStateCredentials => "SharedStateCredentials",
            Reason::Provisioned => "Provisioned",
            Reason::Phase(p) => p.as_str(),
        }
    }
}

/// One event about the actor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventSpec {
    pub warning: bool,
    pub reason: Reason,
    pub note: String,
}

impl EventSpec {
    pub fn normal(reason: Reason, note: String) -> Self {
        EventSpec {
            warning: false,
            reason,
            note,
        }
    }
    pub fn warning(reason: Reason, note: String) -> Self {
        EventSpec {
            warning: true,
            reason,
            note,
        }
    }
}

/// What the finalizer asks of this reconcile.
///
/// Not `kube::runtime::finalizer`: that helper adds the finalizer and ends the reconcile,
/// counting on the patch's watch event for the next one, but the actor watch's predicate
/// ([`crate::watch::actor_fingerprint`]) drops the controller's own finalizer writes, so that
/// event never comes. Here the reconcile goes on with the patched object instead; and
/// cleanup writes the `Terminating` status first, which the helper has no step for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinalizerStep {
    /// Being deleted, and our cleanup is done (or was never ours): nothing to do.
    Done,
    /// Being deleted: clean up, then remove the finalizer.
    CleanUp,
    /// Add the finalizer, then reconcile the patched actor.
    AddThenReconcile,
    Reconcile,
}

pub fn has_finalizer(a: &AsyncActor) -> bool {
    a.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER)
}

pub fn finalizer_step(a: &AsyncActor) -> FinalizerStep {
    match (a.metadata.deletion_timestamp.is_some(), has_finalizer(a)) {
        (true, false) => FinalizerStep::Done,
        (true, true) => FinalizerStep::CleanUp,
        (false, false) => FinalizerStep::AddThenReconcile,
        (false, true) => FinalizerStep::Reconcile,
    }
}

/// Why a live actor is not reconciled at all: its namespace is one the admission webhook is
/// not called for (the cluster configuration's `excludedNamespaces`, from the chart's
/// `kube-system`, release namespace and `webhook.excludeNamespaces`). Such an actor was
/// never defaulted nor checked against the policy, so rendering it would grant what
/// admission exists to refuse. A deleted one is still cleaned up: whatever was created
/// before its namespace was excluded goes with it.
pub fn namespace_excluded(
    actor: &AsyncActor,
    config: &asya_api::config::ClusterConfig,
) -> Option<String> {
    let ns = actor.metadata.namespace.as_deref()?;
    if actor.metadata.deletion_timestamp.is_some() || !config.namespace_excluded(ns) {
        return None;
    }
    Some(format!(
        "namespace {ns} is excluded from admission (excludedNamespaces in the cluster configuration: \
         kube-system, the release namespace and the chart's webhook.excludeNamespaces), so the \
         provisioner creates nothing for this actor; create it in another namespace"
    ))
}

/// The status and event of an actor in an excluded namespace (see [`namespace_excluded`]):
/// the event only when the status changes, so that it is said once.
pub fn excluded_status(
    prev: &AsyncActorStatus,
    message: String,
    generation: Option<i64>,
    now: Time,
) -> Option<(AsyncActorStatus, EventSpec)> {
    let new = crate::status::excluded(prev, message.clone(), generation, now);
    status_write(prev, &new)?;
    Some((new, EventSpec::warning(Reason::NamespaceExcluded, message)))
}

/// What a reconcile knows of an actor before it looks at anything else.
pub fn base_observed(actor: &AsyncActor) -> Observed {
    Observed {
        generation: actor.metadata.generation,
        deleting: actor.metadata.deletion_timestamp.is_some(),
        flavors: vec![],
        missing_flavors: vec![],
        unusable_flavors: None,
        invalid: None,
        transport: TransportObs::NotAttempted,
        workload_kind: None,
        workload: None,
        workload_error: None,
        foreign: vec![],
        pods: vec![],
        scaling_enabled: true,
        scaling_error: None,
        hpa_desired: None,
        min_replicas: None,
        max_replicas: None,
    }
}

/// The review's outcome: the resolved actor with what the status says of its spec, or (flavors
/// missing, spec invalid) only the observations, for a status that says why.
pub fn resolution(
    actor: &AsyncActor,
    review: ActorReview,
) -> Result<(ResolvedActor, Observed), Box<Observed>> {
    let mut o = base_observed(actor);
    o.missing_flavors = review.missing_flavors.clone();
    let resolved = match review.resolved {
        Some(r) if review.errors.is_empty() && r.missing_flavors.is_empty() => r,
        r => {
            if let Some(r) = r {
                o.flavors = r.flavors.clone();
            }
            if !review.errors.is_empty() {
                o.invalid = Some(review.errors.to_string());
                o.unusable_flavors = unusable_flavors(&review.errors);
            }
            if o.missing_flavors.is_empty() && o.invalid.is_none() {
                o.invalid = Some("the spec could not be resolved".into());
            }
            return Err(Box::new(o));
        }
    };
    o.flavors = resolved.flavors.clone();
    o.scaling_enabled = resolved.scaling_enabled();
    o.workload_kind = Some(WorkloadKind::of(resolved.workload_kind()));
    let s = resolved.scaling();
    (o.min_replicas, o.max_replicas) = if o.scaling_enabled {
        (s.min_replica_count, s.max_replica_count)
    } else {
        (
            Some(resolved.fixed_replicas()),
            Some(resolved.fixed_replicas()),
        )
    };
    Ok((resolved, o))
}

/// The errors about the flavor list itself (`spec.flavors[i]`: an unusable flavor), for the
/// FlavorsResolved condition; merge conflicts and flavor-set fields are about the spec.
fn unusable_flavors(errors: &asya_api::error::FieldErrors) -> Option<String> {
    let about: Vec<String> = errors
        .iter()
        .filter(|e| e.path.starts_with("spec.flavors["))
        .map(ToString::to_string)
        .collect();
    (!about.is_empty()).then(|| about.join("; "))
}

/// How to retry after the queue step failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// After exactly this (SQS's recreate cooldown: the backoff is not advanced).
    After(Duration),
    /// After the actor's next backoff, but not sooner than this.
    Backoff { at_least: Duration },
}

/// The status's view of a failed queue step, and when to try again.
pub fn transport_failure(e: &QueueError) -> (TransportObs, Retry) {
    let retry = match e {
        QueueError::RecreateCooldown(_) => Retry::After(e.retry_after()),
        _ => Retry::Backoff {
            at_least: e.retry_after().min(Duration::from_secs(5)),
        },
    };
    let reason = match e {
        QueueError::Unavailable(_) => "Unavailable",
        QueueError::RecreateCooldown(_) => "RecreateCooldown",
        QueueError::Rejected(_) => "Rejected",
        QueueError::NotOurs(_) => "QueueNotOurs",
    };
    let obs = TransportObs::Failed {
        reason: reason.into(),
        message: e.to_string(),
    };
    (obs, retry)
}

/// A step of a live actor's reconcile that failed before the workload.
#[derive(Clone, Copy, Debug)]
pub enum StepFailure<'a> {
    /// The queue step (the claim, the broker).
    Queue(&'a QueueError),
    /// The namespace's broker identity.
    BrokerIdentity(&'a QueueError),
    /// The namespace's Redis user (state proxies).
    StateIdentity(&'a crate::state_identity::StateError),
}

/// What a reconcile does when a step before the workload failed: publish `event`, record
/// `transport` or `workload_error` in the status, write it, and look again as `retry` says.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    pub event: Option<EventSpec>,
    pub transport: Option<TransportObs>,
    pub workload_error: Option<String>,
    pub retry: Retry,
}

pub fn step_failure(f: StepFailure<'_>) -> Failure {
    let soon = |d: Duration| Retry::Backoff {
        at_least: d.min(Duration::from_secs(5)),
    };
    match f {
        StepFailure::Queue(e) => {
            let (obs, retry) = transport_failure(e);
            Failure {
                event: match e {
                    QueueError::NotOurs(not_ours) => Some(queue_not_ours_event(not_ours)),
                    _ => None,
                },
                transport: Some(obs),
                workload_error: None,
                retry,
            }
        }
        // Never a recreate cooldown's fixed wait: the backoff.
        StepFailure::BrokerIdentity(e) => Failure {
            event: None,
            transport: Some(transport_failure(e).0),
            workload_error: None,
            retry: soon(e.retry_after()),
        },
        StepFailure::StateIdentity(e) => {
            let note = format!("state proxies: {e}");
            Failure {
                event: Some(EventSpec::warning(Reason::StateIdentity, note.clone())),
                transport: None,
                workload_error: Some(note),
                retry: soon(e.retry_after()),
            }
        }
    }
}

/// The Warning event of a queue recorded as another actor's (the message names both).
pub fn queue_not_ours_event(e: &crate::queue::owner::OwnershipError) -> EventSpec {
    EventSpec::warning(Reason::QueueNotOurs, e.to_string())
}

/// The event for a queue this reconcile created: a first creation, or (the status already
/// names a queue) the recreation of one that vanished.
pub fn queue_created_event(
    prev: Option<&AsyncActorStatus>,
    queue: &str,
    transport: &str,
) -> EventSpec {
    let again = prev.and_then(|s| s.queue_identifier.as_ref()).is_some();
    if again {
        EventSpec::warning(
            Reason::QueueRecreated,
            format!("queue {queue} had disappeared from {transport}; recreated"),
        )
    } else {
        EventSpec::normal(
            Reason::QueueCreated,
            format!("queue {queue} created on {transport}"),
        )
    }
}

/// What to do with one pod that carries no sidecar.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodStep {
    /// Keep it, and say why (deleting it while injection fails brings another bare pod).
    Keep(EventSpec),
    /// Delete it (its controller recreates it with the sidecar), then say so.
    Replace(EventSpec),
}

pub fn bare_pod(name: &str, injection_down: bool) -> PodStep {
    if injection_down {
        PodStep::Keep(EventSpec::warning(
            Reason::PodWithoutSidecar,
            format!(
                "pod {name} carries no asya-sidecar and injection still fails (the webhook is unavailable); it is replaced once injection works"
            ),
        ))
    } else {
        PodStep::Replace(EventSpec::warning(
            Reason::PodWithoutSidecarReplaced,
            format!(
                "pod {name} carries no asya-sidecar (created while the injection webhook was unavailable); deleted so its controller recreates it with the sidecar"
            ),
        ))
    }
}

/// The event for deleting a pod whose sidecar reads `var` from Secret `secret`, which the
/// current configuration does not name ([`crate::status::stale_credentials`]).
pub fn stale_credentials_event(pod: &str, var: &str, secret: &str) -> EventSpec {
    EventSpec::warning(
        Reason::PodWithStaleCredentialsReplaced,
        format!(
            "pod {pod} cannot start: its asya-sidecar reads {var} from Secret {secret}, which the \
             current configuration does not use (the pod was injected under another broker \
             identity mode); deleted so its controller recreates it as injected now"
        ),
    )
}

/// The status to write and the event announcing a phase change; `None`: the status is as
/// it was (writing it anyway would start an endless loop of reconciles).
pub fn status_write(old: &AsyncActorStatus, new: &AsyncActorStatus) -> Option<Option<EventSpec>> {
    if old == new {
        return None;
    }
    if old.phase == new.phase {
        return Some(None);
    }
    // `derive` writes only phases it knows: a phase it does not know is not announced.
    let Some(phase) = new.phase.as_deref().and_then(Phase::parse) else {
        return Some(None);
    };
    let note = format!(
        "phase {} -> {phase}: {}",
        old.phase.as_deref().unwrap_or("none"),
        new.message.as_deref().unwrap_or_default()
    );
    Some(Some(EventSpec {
        warning: phase.is_warning(),
        reason: Reason::Phase(phase),
        note,
    }))
}

/// The most an event's note holds (the API server refuses a longer one).
pub const NOTE_MAX: usize = 1024;

/// The events of a reconcile that wrote the status: what it made (`made`, Normal events such
/// as `QueueCreated`, `WorkloadCreated`, `ScaledObjectCreated`) and the phase change the
/// status write announces. Two or more Normal ones become one `Provisioned` event whose note
/// says each in turn (a new actor: one Event instead of four, and `kubectl describe` still
/// tells what was created and which phase it is in); a Warning phase stays its own event.
pub fn announcement(made: Vec<EventSpec>, phase: Option<EventSpec>) -> Vec<EventSpec> {
    let (warnings, mut normal): (Vec<_>, Vec<_>) =
        made.into_iter().chain(phase).partition(|e| e.warning);
    if normal.len() > 1 {
        let note = normal
            .drain(..)
            .map(|e| e.note)
            .collect::<Vec<_>>()
            .join("; ");
        normal.push(EventSpec::normal(Reason::Provisioned, truncate(note)));
    }
    normal.into_iter().chain(warnings).collect()
}

/// `note` cut to [`NOTE_MAX`] bytes on a character boundary, marked as cut.
fn truncate(mut note: String) -> String {
    if note.len() <= NOTE_MAX {
        return note;
    }
    let mut end = NOTE_MAX - '…'.len_utf8();
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    note.truncate(end);
    note.push('…');
    note
}

/// The periodic requeue of a settled actor, spread by actor; sooner while it has messages.
pub fn periodic(key: &str, busy: bool) -> Duration {
    let (base, spread) = if busy {
        (BUSY_PERIOD, BUSY_SPREAD)
    } else {
        (PERIOD, SPREAD)
    };
    base + Duration::from_millis(desired_hash(&key) % spread.as_millis() as u64)
}

/// When to look at a reconciled actor again. `backoff`: its next backoff when `failed`.
/// The periodic requeue is also the check that the queue still exists. Pods and the
/// workload report through their watches: an unsettled actor needs no faster poll.
pub fn next(key: &str, failed: bool, backoff: Duration, injection_down: bool, busy: bool) -> Next {
    Next::After(if failed {
        backoff
    } else if injection_down {
        INJECTION_RETRY
    } else {
        periodic(key, busy)
    })
}

/// The event closing a deleted actor's cleanup.
pub fn queue_deleted_event(queue: &str, delay_queues: &[String]) -> EventSpec {
    EventSpec::normal(
        Reason::QueueDeleted,
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
}

/// How long a deleted actor's cleanup keeps trying the broker, counted from its
/// `metadata.deletionTimestamp`, before it gives up on the queue and releases the actor
/// anyway: long enough to ride out a broker restart, short enough that a deletion (and the
/// namespace's) completes within a minute with the broker gone for good.
pub const CLEANUP_GIVE_UP_AFTER: Duration = Duration::from_secs(30);
/// The shortest wait between two cleanup attempts.
const CLEANUP_MIN_RETRY: Duration = Duration::from_secs(1);
/// The condition a released actor's last status carries when something was left behind.
pub const CLEANUP_INCOMPLETE: &str = "CleanupIncomplete";

/// Whether the deleted actor asks to be released without cleanup.
pub fn skip_cleanup(a: &AsyncActor) -> bool {
    a.metadata
        .annotations
        .as_ref()
        .and_then(|m| m.get(labels::SKIP_CLEANUP))
        .is_some_and(|v| v == "true")
}

/// Time since the actor's deletion was requested (zero if not, or if the clocks disagree).
pub fn since_deletion(a: &AsyncActor, now: &Time) -> Duration {
    a.metadata
        .deletion_timestamp
        .as_ref()
        .and_then(|t| Duration::try_from(now.0.duration_since(t.0)).ok())
        .unwrap_or_default()
}

/// What cleanup does after the broker failed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CleanupStep {
    /// Keep the finalizer; try again after this (never past the bound).
    Retry(Duration),
    /// Leave the queue behind, say so, delete the Kubernetes objects, release the actor.
    GiveUp,
}

/// After a failed queue delete, `since` the deletion and with the actor's next `backoff`.
pub fn cleanup_after_failure(since: Duration, backoff: Duration) -> CleanupStep {
    match CLEANUP_GIVE_UP_AFTER.checked_sub(since) {
        Some(left) if !left.is_zero() => {
            CleanupStep::Retry(backoff.min(left).max(CLEANUP_MIN_RETRY))
        }
        _ => CleanupStep::GiveUp,
    }
}

/// The objects a deleted actor's cleanup deletes, named for the events.
fn owned_names(name: &str) -> String {
    use asya_api::naming;
    format!(
        "Deployment/StatefulSet {}, ScaledObject {}, TriggerAuthentication {}",
        naming::workload_name(name),
        naming::scaled_object_name(name),
        naming::trigger_authentication_name(name)
    )
}

/// The event of an actor released at once by `asya.sh/skip-cleanup`.
pub fn cleanup_skipped_event(name: &str, queue: &str, transport: &str) -> EventSpec {
    EventSpec::warning(
        Reason::CleanupSkipped,
        format!(
            "{}=\"true\": released without cleanup; left behind: queue {queue} on {transport} \
             (with its retry delay queues, if any) and, for the garbage collector through their \
             owner references, {}",
            labels::SKIP_CLEANUP,
            owned_names(name)
        ),
    )
}

/// The event of a failed queue delete that will be tried again.
pub fn queue_delete_retry_event(
    queue: &str,
    error: &str,
    retry: Duration,
    since: Duration,
) -> EventSpec {
    let left = CLEANUP_GIVE_UP_AFTER.saturating_sub(since);
    EventSpec::warning(
        Reason::QueueDeleteFailed,
        format!(
            "deleting queue {queue}: {error}; retrying in {}s, giving up on it in {}s",
            retry.as_secs(),
            left.as_secs()
        ),
    )
}

/// What was left behind when cleanup gave up: the event's and the condition's message.
pub fn cleanup_gave_up_message(queue: &str, transport: &str, error: &str) -> String {
    format!(
        "gave up after {}s: queue {queue} on {transport} (with its retry delay queues, if any) \
         left behind, delete it by hand: {error}",
        CLEANUP_GIVE_UP_AFTER.as_secs()
    )
}

/// The event of an actor released after cleanup gave up on its queue.
pub fn cleanup_gave_up_event(name: &str, message: &str) -> EventSpec {
    EventSpec::warning(
        Reason::CleanupIncomplete,
        format!("{message}; deleted {}", owned_names(name)),
    )
}

/// The status condition saying what cleanup left behind (written before the finalizer goes).
pub fn cleanup_incomplete_condition(
    message: String,
    generation: Option<i64>,
    now: Time,
) -> Condition {
    Condition {
        type_: CLEANUP_INCOMPLETE.into(),
        status: "True".into(),
        reason: "QueueLeftBehind".into(),
        message,
        observed_generation: generation,
        last_transition_time: now,
    }
}

/// The condition a deleted actor's last status carries when its queue was left as not its
/// own.
pub fn queue_not_ours_condition(message: String, generation: Option<i64>, now: Time) -> Condition {
    Condition {
        type_: CLEANUP_INCOMPLETE.into(),
        status: "True".into(),
        reason: "QueueNotOurs".into(),
        message,
        observed_generation: generation,
        last_transition_time: now,
    }
}

/// How a deleted actor's queue step ended.
#[derive(Clone, Copy, Debug)]
pub enum QueueDeletion<'a> {
    /// Deleted, with these retry delay queues.
    Deleted(&'a [String]),
    /// Recorded as another actor's: left (the message names both).
    NotOurs(&'a str),
    /// The broker failed it: `backoff` is the actor's next backoff.
    Failed { error: &'a str, backoff: Duration },
}

/// What cleanup does after its queue step.
#[derive(Clone, Debug, PartialEq)]
pub enum AfterQueue {
    /// Keep the finalizer: publish `event`, look again after `wait`.
    Retry { wait: Duration, event: EventSpec },
    /// Go on: write the last status with `condition` first (what was left behind), delete
    /// the Kubernetes objects, release the actor, and close with `closing`.
    Release {
        condition: Option<Condition>,
        closing: EventSpec,
    },
}

/// Cleanup after its queue step, `since` the deletion was requested: `name` the actor's,
/// `queue` on `transport` its queue. A queue recorded as another actor's is left at once (no
/// retry would change the record); a failure is retried within [`CLEANUP_GIVE_UP_AFTER`],
/// then given up on.
pub fn after_queue(
    deletion: QueueDeletion<'_>,
    name: &str,
    queue: &str,
    transport: &str,
    since: Duration,
    generation: Option<i64>,
    now: Time,
) -> AfterQueue {
    match deletion {
        QueueDeletion::Deleted(delay_queues) => AfterQueue::Release {
            condition: None,
            closing: queue_deleted_event(queue, delay_queues),
        },
        QueueDeletion::NotOurs(message) => AfterQueue::Release {
            condition: Some(queue_not_ours_condition(message.into(), generation, now)),
            closing: EventSpec::warning(Reason::QueueNotOurs, message.into()),
        },
        QueueDeletion::Failed { error, backoff } => match cleanup_after_failure(since, backoff) {
            CleanupStep::Retry(wait) => AfterQueue::Retry {
                wait,
                event: queue_delete_retry_event(queue, error, wait, since),
            },
            CleanupStep::GiveUp => {
                let message = cleanup_gave_up_message(queue, transport, error);
                AfterQueue::Release {
                    closing: cleanup_gave_up_event(name, &message),
                    condition: Some(cleanup_incomplete_condition(message, generation, now)),
                }
            }
        },
    }
}

/// Exponential backoff after `failures` consecutive failures: 2 s, 4 s, … capped at 5 minutes.
pub fn backoff(failures: u32) -> Duration {
    Duration::from_secs((1u64 << failures.min(8)).min(300)).max(Duration::from_secs(2))
}

mod objects_plan;
mod pods_plan;
pub use objects_plan::{
    Action, AfterKeda, Effects, KedaSteps, ObjectsPlan, ObjectsSeen, Outcome, Rendered,
    ScalingPlan, WorkloadPlan, applied_effects, identity_problem_message, keda_steps,
    not_ours_event, objects, removed_effects, scaling, shared_static_credentials_event, workload,
    workload_actions, workload_effects,
};
pub use pods_plan::{Credentials, PodAction, PodsPlan, bare_pods, pods};

#[cfg(test)]
mod tests;
