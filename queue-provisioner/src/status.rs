//! The actor's status derived from what the reconcile observed. Pure:
//! the controller gathers the observations, this decides phase, counts and conditions.

use asya_api::AsyncActorStatus;
use asya_api::labels;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::model::{Phase, ScalingMode, WorkloadKind};
use crate::queue::{QueueDepth, QueueInfo};

pub const COND_TRANSPORT: &str = "TransportReady";
pub const COND_WORKLOAD: &str = "WorkloadReady";
pub const COND_SCALING: &str = "ScalingReady";
pub const COND_FLAVORS: &str = "FlavorsResolved";
/// False only with reason `NamespaceExcluded`: the provisioner does not reconcile the actor.
pub const COND_RECONCILED: &str = "Reconciled";
/// Present while an object with a name the actor needs is someone else's.
pub const COND_NAME_CONFLICT: &str = "NameConflict";

/// Container waiting reasons Kubernetes keeps retrying with backoff (a failing pod).
const FAILING_REASONS: [&str; 8] = [
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "CreateContainerError",
    "CreateContainerConfigError",
    "RunContainerError",
    "InvalidImageName",
    "ErrImageNeverPull",
];
const IMAGE_REASONS: [&str; 4] = [
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "ErrImageNeverPull",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailKind {
    ImagePull,
    Sidecar,
    Runtime,
}

impl FailKind {
    fn phase(self) -> Phase {
        match self {
            FailKind::ImagePull => Phase::ImagePullError,
            FailKind::Sidecar => Phase::SidecarError,
            FailKind::Runtime => Phase::RuntimeError,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodState {
    Ready,
    Pending,
    /// In a retried error state; names the container and the reason.
    Failing {
        kind: FailKind,
        container: String,
        reason: String,
    },
    /// Finished, failed for good, or being deleted: not counted.
    Gone,
}

fn failing_in(statuses: Option<&Vec<ContainerStatus>>) -> Option<(String, String)> {
    statuses?.iter().find_map(|s| {
        let state = s.state.as_ref()?;
        if let Some(reason) = state.waiting.as_ref().and_then(|w| w.reason.clone()) {
            return FAILING_REASONS
                .contains(&reason.as_str())
                .then(|| (s.name.clone(), reason));
        }
        crashed_and_not_ready(s).map(|reason| (s.name.clone(), reason))
    })
}

/// A crash loop between its back-offs: a container that just exited with an error (not yet
/// waiting in `CrashLoopBackOff`), or one running again after such an exit and not ready yet
/// (a sidecar that never reaches its broker runs a while before each exit). The actor stays
/// failing through the loop instead of flapping to `Creating` on every try.
fn crashed_and_not_ready(s: &ContainerStatus) -> Option<String> {
    let state = s.state.as_ref()?;
    if let Some(t) = &state.terminated {
        return failed_exit(t);
    }
    state.running.as_ref()?;
    if s.ready || s.restart_count == 0 {
        return None;
    }
    failed_exit(s.last_state.as_ref()?.terminated.as_ref()?)
        .map(|why| format!("restarted after {why}"))
}

/// `Error (exit code 1)` for an exit with an error; nothing for a clean one.
fn failed_exit(t: &ContainerStateTerminated) -> Option<String> {
    (t.exit_code != 0).then(|| {
        let why = t.reason.as_deref().unwrap_or("Error");
        format!("{why} (exit code {})", t.exit_code)
    })
}

pub fn classify_pod(pod: &Pod) -> PodState {
    if pod.metadata.deletion_timestamp.is_some() {
        return PodState::Gone;
    }
    let Some(st) = pod.status.as_ref() else {
        return PodState::Pending;
    };
    if matches!(st.phase.as_deref(), Some("Failed" | "Succeeded")) {
        return PodState::Gone;
    }
    let failing = failing_in(st.init_container_statuses.as_ref())
        .or_else(|| failing_in(st.container_statuses.as_ref()));
    if let Some((container, reason)) = failing {
        let kind = if IMAGE_REASONS.contains(&reason.as_str()) {
            FailKind::ImagePull
        } else if container == labels::SIDECAR_CONTAINER || container.starts_with("asya-sidecar") {
            FailKind::Sidecar
        } else {
            FailKind::Runtime
        };
        return PodState::Failing {
            kind,
            container,
            reason,
        };
    }
    let ready = st
        .conditions
        .as_ref()
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if ready {
        PodState::Ready
    } else {
        PodState::Pending
    }
}

/// A pod labelled for injection that carries no sidecar: created while the webhook was down.
pub fn needs_replacing(pod: &Pod) -> bool {
    let m = &pod.metadata;
    if m.deletion_timestamp.is_some() {
        return false;
    }
    let labelled = m
        .labels
        .as_ref()
        .is_some_and(|l| l.get(labels::INJECT).map(String::as_str) == Some("true"));
    let injected = m
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(labels::INJECTED));
    let has_sidecar = pod.spec.as_ref().is_some_and(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .any(|c| c.name == labels::SIDECAR_CONTAINER)
    });
    labelled && !injected && !has_sidecar
}

/// A pod whose sidecar cannot start because it reads a broker credential from a Secret the
/// current configuration does not name: injected under another identity mode (a webhook
/// replica still serving the previous release during `helm upgrade` switching
/// `shareAdminCredentials`), so its Secret may never exist. `current`: the variables and
/// Secrets injection gives today ([`asya_api::sidecar_settings::TransportSettings::credential_secrets`]);
/// `overridden`: variables the actor's own `sidecar.env` sets, which are the author's to
/// keep. Answers the variable and the Secret it reads. Only a pod stuck in
/// `CreateContainerConfigError` counts: a running one works, and replacing it is the
/// rollout's business.
pub fn stale_credentials(
    pod: &Pod,
    current: &[(&str, &str)],
    overridden: &[&str],
) -> Option<(String, String)> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let st = pod.status.as_ref()?;
    let stuck = st
        .container_statuses
        .iter()
        .flatten()
        .chain(st.init_container_statuses.iter().flatten())
        .filter(|c| c.name == labels::SIDECAR_CONTAINER)
        .filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.as_deref())
        .any(|r| r == "CreateContainerConfigError");
    if !stuck {
        return None;
    }
    let spec = pod.spec.as_ref()?;
    let sidecar = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == labels::SIDECAR_CONTAINER)?;
    sidecar.env.iter().flatten().find_map(|e| {
        let var = e.name.as_str();
        if !asya_api::sidecar_settings::CREDENTIAL_VARS.contains(&var) || overridden.contains(&var)
        {
            return None;
        }
        let secret = e
            .value_from
            .as_ref()?
            .secret_key_ref
            .as_ref()?
            .name
            .as_str();
        let expected = current.iter().find(|(v, _)| *v == var).map(|(_, s)| *s);
        (expected != Some(secret)).then(|| (var.to_string(), secret.to_string()))
    })
}

/// The transport step's outcome.
#[derive(Clone, Debug, PartialEq)]
pub enum TransportObs {
    Ready(QueueInfo, Option<QueueDepth>),
    Failed { reason: String, message: String },
    NotAttempted,
}

/// The workload as applied and read back.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkloadObs {
    /// spec.replicas
    pub replicas: Option<i32>,
    /// readyReplicas
    pub ready: i32,
    /// Why its pods cannot be created, while they cannot (a Deployment's `ReplicaFailure`).
    pub failure: Option<String>,
}

/// What one reconcile saw.
#[derive(Clone, Debug)]
pub struct Observed {
    pub generation: Option<i64>,
    pub deleting: bool,
    pub flavors: Vec<String>,
    pub missing_flavors: Vec<String>,
    /// Flavors found but unusable (a ConfigMap past the size or count bounds, data that does
    /// not parse): the errors about `spec.flavors`, also part of `invalid`.
    pub unusable_flavors: Option<String>,
    /// The spec is invalid (admitted before a policy or flavor changed): why.
    pub invalid: Option<String>,
    pub transport: TransportObs,
    pub workload_kind: Option<WorkloadKind>,
    /// Workload applied and read back.
    pub workload: Option<WorkloadObs>,
    pub workload_error: Option<String>,
    /// Objects holding a name the actor needs that are not its own (left untouched): what
    /// [`crate::reconcile::ownership::not_ours_message`] says of each.
    pub foreign: Vec<String>,
    pub pods: Vec<PodState>,
    pub scaling_enabled: bool,
    pub scaling_error: Option<String>,
    /// desiredReplicas of KEDA's HPA.
    pub hpa_desired: Option<i32>,
    pub min_replicas: Option<i32>,
    pub max_replicas: Option<i32>,
}

impl Observed {
    /// Messages were queued or in process at the last look at the broker.
    pub fn has_messages(&self) -> bool {
        match &self.transport {
            TransportObs::Ready(_, Some(d)) => {
                d.queued.unwrap_or(0) > 0 || d.processing.unwrap_or(0) > 0
            }
            _ => false,
        }
    }
}

fn condition(
    prev: &[Condition],
    type_: &str,
    ok: Option<bool>,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let status = match ok {
        Some(true) => "True",
        Some(false) => "False",
        None => "Unknown",
    };
    // The transition time moves only when the status does.
    let since = prev
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: since,
    }
}

/// The status of an actor the provisioner does not reconcile because its namespace is
/// excluded from admission: Degraded, with one condition that says why.
pub fn excluded(
    prev: &AsyncActorStatus,
    message: String,
    generation: Option<i64>,
    now: Time,
) -> AsyncActorStatus {
    AsyncActorStatus {
        phase: Some(Phase::Degraded.as_str().into()),
        conditions: vec![condition(
            &prev.conditions,
            COND_RECONCILED,
            Some(false),
            "NamespaceExcluded",
            message.clone(),
            generation,
            &now,
        )],
        message: Some(message),
        ..Default::default()
    }
}

/// The new status and the phase's one-line reason.
pub fn derive(prev: &AsyncActorStatus, o: &Observed, now: Time) -> AsyncActorStatus {
    let ready = o.pods.iter().filter(|p| **p == PodState::Ready).count() as i32;
    let pending = o.pods.iter().filter(|p| **p == PodState::Pending).count() as i32;
    let failing: Vec<_> = o
        .pods
        .iter()
        .filter_map(|p| match p {
            PodState::Failing {
                kind,
                container,
                reason,
            } => Some((*kind, container.as_str(), reason.as_str())),
            _ => None,
        })
        .collect();
    let desired = if o.scaling_enabled {
        o.hpa_desired
            .or(o.workload.as_ref().and_then(|w| w.replicas))
    } else {
        o.workload.as_ref().and_then(|w| w.replicas)
    };

    let cannot_create = o.workload.as_ref().and_then(|w| w.failure.as_deref());
    let (phase, message) = if o.deleting {
        (
            Phase::Terminating,
            "deleting the queue and owned objects".to_string(),
        )
    } else if !o.missing_flavors.is_empty() {
        (
            Phase::Waiting,
            format!("waiting for flavors: {}", o.missing_flavors.join(", ")),
        )
    } else if let Some(why) = &o.invalid {
        (Phase::Degraded, format!("spec is invalid: {why}"))
    } else if let TransportObs::Failed { message, .. } = &o.transport {
        (Phase::TransportError, message.clone())
    } else if let Some(e) = &o.workload_error {
        (Phase::Degraded, format!("workload: {e}"))
    } else if let Some((kind, container, reason)) = failing.first() {
        let msg = format!(
            "{} pod(s) failing: container {container}: {reason}",
            failing.len()
        );
        if ready > 0 {
            (Phase::Degraded, msg)
        } else {
            (kind.phase(), msg)
        }
    } else if let Some(why) = cannot_create {
        // Not a phase of its own: the pods that exist may serve, and the cause is outside the
        // actor (an admission webhook, a quota); the message says which.
        (Phase::Degraded, format!("pods cannot be created: {why}"))
    } else if let Some(e) = &o.scaling_error {
        (Phase::Degraded, format!("scaling: {e}"))
    } else if o.workload.is_none() {
        (Phase::Creating, "creating the workload".to_string())
    } else if desired == Some(0) && ready == 0 && pending == 0 {
        (
            Phase::Napping,
            "scaled to zero; waiting for messages".to_string(),
        )
    } else if ready > 0 && desired.is_none_or(|d| ready >= d) {
        (Phase::Running, format!("{ready} replica(s) ready"))
    } else if ready > 0 {
        (
            Phase::Running,
            format!("{ready} of {} replica(s) ready", desired.unwrap_or(ready)),
        )
    } else {
        (Phase::Creating, format!("{pending} pod(s) starting"))
    };

    let g = o.generation;
    let pc = &prev.conditions;
    let mut conditions = Vec::new();
    conditions.push(if let Some(why) = &o.unusable_flavors {
        condition(
            pc,
            COND_FLAVORS,
            Some(false),
            "FlavorUnusable",
            why.clone(),
            g,
            &now,
        )
    } else if o.missing_flavors.is_empty() {
        condition(
            pc,
            COND_FLAVORS,
            Some(true),
            "FlavorsResolved",
            if o.flavors.is_empty() {
                "no flavors".into()
            } else {
                format!("merged {}", o.flavors.join(", "))
            },
            g,
            &now,
        )
    } else {
        condition(
            pc,
            COND_FLAVORS,
            Some(false),
            "FlavorsMissing",
            format!("not found: {}", o.missing_flavors.join(", ")),
            g,
            &now,
        )
    });
    let (queue_url, queue_identifier, depth) = match &o.transport {
        TransportObs::Ready(info, depth) => {
            conditions.push(condition(
                pc,
                COND_TRANSPORT,
                Some(true),
                "QueueReady",
                format!("queue {} ready", info.identifier),
                g,
                &now,
            ));
            (
                Some(info.url.clone()),
                Some(info.identifier.clone()),
                *depth,
            )
        }
        TransportObs::Failed { reason, message } => {
            conditions.push(condition(
                pc,
                COND_TRANSPORT,
                Some(false),
                reason,
                message.clone(),
                g,
                &now,
            ));
            (prev.queue_url.clone(), prev.queue_identifier.clone(), None)
        }
        TransportObs::NotAttempted => {
            conditions.push(condition(
                pc,
                COND_TRANSPORT,
                None,
                "NotAttempted",
                "transport not reconciled".into(),
                g,
                &now,
            ));
            (prev.queue_url.clone(), prev.queue_identifier.clone(), None)
        }
    };
    let kind = o.workload_kind.unwrap_or(WorkloadKind::Deployment);
    conditions.push(match (&o.workload_error, &o.workload, failing.is_empty()) {
        (Some(e), _, _) => condition(
            pc,
            COND_WORKLOAD,
            Some(false),
            "WorkloadFailed",
            e.clone(),
            g,
            &now,
        ),
        (None, Some(_), false) => condition(
            pc,
            COND_WORKLOAD,
            Some(false),
            "PodsFailing",
            message.clone(),
            g,
            &now,
        ),
        (None, Some(w), true) if w.failure.is_some() => condition(
            pc,
            COND_WORKLOAD,
            Some(false),
            "FailedCreate",
            message.clone(),
            g,
            &now,
        ),
        (None, Some(_), true) => condition(
            pc,
            COND_WORKLOAD,
            Some(true),
            "WorkloadCreated",
            format!("{kind} successfully created; {ready} ready, {pending} pending"),
            g,
            &now,
        ),
        (None, None, _) => condition(
            pc,
            COND_WORKLOAD,
            None,
            "NotCreated",
            format!("{kind} not created yet"),
            g,
            &now,
        ),
    });
    conditions.push(match (&o.scaling_error, o.scaling_enabled) {
        (Some(e), _) => condition(
            pc,
            COND_SCALING,
            Some(false),
            "ScaledObjectFailed",
            e.clone(),
            g,
            &now,
        ),
        (None, true) => condition(
            pc,
            COND_SCALING,
            Some(true),
            "ScaledObjectCreated",
            "KEDA ScaledObject successfully created".into(),
            g,
            &now,
        ),
        (None, false) => condition(
            pc,
            COND_SCALING,
            Some(true),
            "ManualScaling",
            format!(
                "scaling disabled; fixed {} replica(s)",
                desired.unwrap_or(0)
            ),
            g,
            &now,
        ),
    });
    if !o.foreign.is_empty() {
        conditions.push(condition(
            pc,
            COND_NAME_CONFLICT,
            Some(true),
            "ObjectNotOurs",
            o.foreign.join("; "),
            g,
            &now,
        ));
    }

    // A change of the target replica count is a scale event.
    let (last_scale_time, last_scale_direction, last_scale) = match (prev.desired_replicas, desired)
    {
        (Some(a), Some(b)) if a != b => {
            let dir = if b > a { "up" } else { "down" };
            (
                Some(now.clone()),
                Some(dir.to_string()),
                Some(format!("{} ({dir})", now.0)),
            )
        }
        _ => (
            prev.last_scale_time.clone(),
            prev.last_scale_direction.clone(),
            prev.last_scale.clone(),
        ),
    };

    AsyncActorStatus {
        phase: Some(phase.as_str().into()),
        message: Some(message),
        conditions,
        queue_url,
        queue_identifier,
        ready_replicas: Some(ready),
        pending_replicas: Some(pending),
        failing_replicas: Some(failing.len() as i32),
        desired_replicas: desired,
        min_replicas: o.min_replicas,
        max_replicas: o.max_replicas,
        last_scale_time,
        last_scale_direction,
        last_scale,
        queued_messages: depth.and_then(|d| d.queued),
        processing_messages: depth.and_then(|d| d.processing),
        workload_kind: Some(kind.as_str().into()),
        transport_status: Some(match &o.transport {
            TransportObs::Ready(..) => "Ready".into(),
            TransportObs::Failed { reason, .. } => reason.clone(),
            TransportObs::NotAttempted => "Unknown".into(),
        }),
        scaling_mode: Some(ScalingMode::of(o.scaling_enabled).as_str().into()),
        resolved_flavors: o.flavors.clone(),
        observed_generation: o.generation,
    }
}

#[cfg(test)]
mod tests;
