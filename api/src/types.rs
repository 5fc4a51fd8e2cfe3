//! The `AsyncActor` and `Flavor` resources (docs/DESIGN.md §2, §3).
//!
//! Enum-like fields are plain strings on purpose: an unknown value then reaches validation,
//! which names the field, the value and the allowed set, instead of failing to deserialize.
//! Alias fields (`minReplicas`, `workload.type`, …) exist so the API server does not prune
//! them before the mutating webhook rewrites them to their canonical names.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EnvVar, PersistentVolumeClaim, PodTemplateSpec, ResourceRequirements, Toleration, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::DurationSpec;

/// An actor: a Python handler deployed behind a message queue, scaled by KEDA.
///
/// Two shapes are accepted: the flat shape (`image`, `handler`, …) and the workload shape
/// (`workload.template` with an `asya-runtime` container).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "asya.sh",
    version = "v1alpha1",
    kind = "AsyncActor",
    namespaced,
    status = "AsyncActorStatus",
    shortname = "asya",
    shortname = "asyas",
    category = "asya",
    derive = "Default",
    derive = "PartialEq",
    doc = "An Asya actor: a Python handler behind a message queue, scaled from zero by KEDA and chained into pipelines by envelopes.",
    printcolumn = r#"{"name": "STATUS", "type": "string", "jsonPath": ".status.phase", "description": "Overall actor state"}"#,
    printcolumn = r#"{"name": "RUNNING", "type": "integer", "jsonPath": ".status.readyReplicas", "description": "Pods ready and running"}"#,
    printcolumn = r#"{"name": "PENDING", "type": "integer", "jsonPath": ".status.pendingReplicas", "description": "Pods created but not ready yet"}"#,
    printcolumn = r#"{"name": "FAILING", "type": "integer", "jsonPath": ".status.failingReplicas", "description": "Pods in an error state that Kubernetes keeps retrying"}"#,
    printcolumn = r#"{"name": "MIN", "type": "integer", "jsonPath": ".status.minReplicas", "description": "Autoscaling lower bound"}"#,
    printcolumn = r#"{"name": "MAX", "type": "integer", "jsonPath": ".status.maxReplicas", "description": "Autoscaling upper bound"}"#,
    printcolumn = r#"{"name": "LAST-SCALE", "type": "string", "jsonPath": ".status.lastScale", "description": "Time and direction of the last scaling event"}"#,
    printcolumn = r#"{"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name": "DESIRED", "type": "integer", "jsonPath": ".status.desiredReplicas", "description": "Target replicas from KEDA's HPA", "priority": 1}"#,
    printcolumn = r#"{"name": "WORKLOAD", "type": "string", "jsonPath": ".status.workloadKind", "description": "Deployment or StatefulSet", "priority": 1}"#,
    printcolumn = r#"{"name": "TRANSPORT", "type": "string", "jsonPath": ".status.transportStatus", "description": "Transport readiness", "priority": 1}"#,
    printcolumn = r#"{"name": "SCALING", "type": "string", "jsonPath": ".status.scalingMode", "description": "KEDA or Manual", "priority": 1}"#,
    printcolumn = r#"{"name": "QUEUED", "type": "integer", "jsonPath": ".status.queuedMessages", "description": "Messages waiting in the queue when the provisioner last looked (each reconcile, at least every 60-75 s)", "priority": 1}"#,
    printcolumn = r#"{"name": "PROCESSING", "type": "integer", "jsonPath": ".status.processingMessages", "description": "Messages being processed", "priority": 1}"#
)]
#[serde(rename_all = "camelCase")]
pub struct AsyncActorSpec {
    /// Actor name, used for the queue name `asya-{namespace}-{actor}`. Defaults to metadata.name. A DNS label; cannot change after creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    /// Transport (as configured by the cluster admin, e.g. rabbitmq or sqs). Defaults to the cluster's default transport; cannot change after creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
    /// Container image with Python and the handler code (flat shape).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Handler path: module.function or module.Class.method (flat shape).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler: Option<String>,
    /// Flavors (named partial specs set up by the platform team) to merge into this spec, in order. At most 8; the inline spec wins over every flavor.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flavors: Vec<String>,
    /// Image pull policy of the runtime container: Always, IfNotPresent (default) or Never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// Python interpreter in the image that runs the Asya runtime. Default: python3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_executable: Option<String>,
    /// payload (default): the handler gets and returns the payload. envelope: the handler gets the whole envelope and may rewrite headers and the route after the current actor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler_mode: Option<String>,
    /// Queue-based autoscaling with KEDA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling: Option<Scaling>,
    /// Fixed replica count, used when scaling.enabled is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Retries, backoff and the per-message timeout, applied by the sidecar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resiliency: Option<Resiliency>,
    /// Environment variables of the runtime container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Secrets whose keys become environment variables of the runtime container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_refs: Vec<SecretRef>,
    /// Resource requests and limits of the runtime container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Node selector of the actor's pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of the actor's pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Pod volumes (any Kubernetes volume source).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::preserve_unknown_list")]
    pub volumes: Vec<Volume>,
    /// Volume mounts of the runtime container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMount>,
    /// Overrides for the injected sidecar container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sidecar: Option<SidecarSpec>,
    /// State proxy mounts (connector containers that persist a directory).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub state_proxy: Vec<StateProxy>,
    /// Workload shape: a pod template with an asya-runtime container, as Deployment or StatefulSet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<Workload>,
    /// Unix socket between sidecar and runtime (workload shape).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<SocketSpec>,
    /// Timeouts (workload shape). timeout.processing is an alias of resiliency.actorTimeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<TimeoutSpec>,
}

impl AsyncActorSpec {
    /// The actor's name (its queue's `asya-{namespace}-{actor}`): `spec.actor`, else the
    /// object's name. The one place this default is taken.
    pub fn actor_or(&self, object_name: &str) -> String {
        self.actor
            .clone()
            .unwrap_or_else(|| object_name.to_string())
    }

    /// The actor's transport: `spec.transport`, else the cluster's `defaultTransport`.
    pub fn transport_or(&self, default_transport: &str) -> String {
        self.transport
            .clone()
            .unwrap_or_else(|| default_transport.to_string())
    }
}

impl AsyncActor {
    /// [`AsyncActorSpec::actor_or`] with this object's name.
    pub fn actor_name(&self) -> String {
        self.spec
            .actor_or(self.metadata.name.as_deref().unwrap_or_default())
    }
}

/// KEDA autoscaling on queue depth.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Scaling {
    /// Scale with KEDA (default true). When false, spec.replicas pods run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Minimum replicas; 0 scales to zero when the queue is empty. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_replica_count: Option<i32>,
    /// Maximum replicas. Default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_replica_count: Option<i32>,
    /// Target messages per replica. Default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_length: Option<i32>,
    /// Seconds between queue-depth checks. Default 30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub polling_interval: Option<i32>,
    /// Seconds to wait after the last activity before scaling to zero. Default 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cooldown_period: Option<i32>,
    /// Started ahead of its envelopes when a route names it (route-aware wake-up, on where
    /// the platform turns it on). Default true. False for an actor whose start is costly
    /// and whose routes often end before reaching it: it starts only when an envelope
    /// reaches its queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake: Option<bool>,
    /// Deprecated alias of minReplicaCount; rewritten by the admission webhook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_replicas: Option<i32>,
    /// Deprecated alias of maxReplicaCount; rewritten by the admission webhook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_replicas: Option<i32>,
}

/// Retries and timeouts, applied by the sidecar (seed 000).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Resiliency {
    /// Maximum processing time of one message (e.g. 300s, 5m). Default 5m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor_timeout: Option<DurationSpec>,
    /// Named retry policies. Errors no rule matches use the policy named default.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub policies: BTreeMap<String, RetryPolicy>,
    /// Rules matched in order against the error's type and message; the first match decides.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<ResiliencyRule>,
}

/// How often and how fast to retry.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetryPolicy {
    /// Total attempts including the first. Default 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<i32>,
    /// constant, linear or exponential (default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<String>,
    /// Delay before the first retry. Default 1s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_interval: Option<DurationSpec>,
    /// Upper bound of the delay. Default 60s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_interval: Option<DurationSpec>,
    /// Deprecated alias of initialInterval; rewritten by the admission webhook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_delay: Option<DurationSpec>,
}

/// Maps errors to a policy, or fails them at once.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResiliencyRule {
    /// Substring looked for in the error's type and message.
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub match_: Option<String>,
    /// Deprecated list form of match (one rule per entry); rewritten by the admission webhook.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// Name of the policy in resiliency.policies that handles a matching error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// fail: send a matching envelope to x-sump without retrying.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
}

/// A secret exposed to the runtime as environment variables.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// Secret name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Deprecated alias of name (seed 002's form); rewritten by the admission webhook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// Namespace of the secret; defaults to the actor's. Other namespaces are denied unless the cluster policy allows them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Only these keys, under these variable names; all keys when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<SecretKeyRef>,
}

/// One key of a secret and the variable it becomes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Key in the secret.
    pub key: String,
    /// Environment variable name; defaults to the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_var: Option<String>,
}

/// Overrides for the injected sidecar.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SidecarSpec {
    /// Sidecar image; defaults to the cluster's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Sidecar image pull policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// Sidecar resources; default from the cluster configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Extra sidecar environment variables.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
}

/// A state proxy: a connector container that persists a mounted directory.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StateProxy {
    /// Name of the state mount.
    pub name: String,
    /// Where the runtime sees the state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount: Option<StateMount>,
    /// How the runtime sends writes: `buffered` (default: the whole file on close) or
    /// `passthrough` (streamed while the handler writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_mode: Option<String>,
    /// The connector container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connector: Option<StateConnector>,
}

/// Mount point of a state proxy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StateMount {
    /// Path inside the runtime container.
    pub path: String,
}

/// Connector container of a state proxy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StateConnector {
    /// Connector image.
    pub image: String,
    /// Connector image pull policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// Connector environment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Connector resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

/// The workload shape of seeds 001 and 004.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Workload {
    /// Deployment (default) or StatefulSet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Deprecated alias of kind; rewritten by the admission webhook.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// Initial replicas; ignored when scaling is enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Pod template with a container named asya-runtime whose ASYA_HANDLER env names the handler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::preserve_unknown_object")]
    pub template: Option<PodTemplateSpec>,
    /// Volume claim templates (StatefulSet).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::preserve_unknown_list")]
    pub volume_claim_templates: Vec<PersistentVolumeClaim>,
}

/// Unix socket settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SocketSpec {
    /// Socket path; its directory is shared by sidecar and runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Largest frame in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_size: Option<k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>,
}

/// Timeouts of the workload shape.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TimeoutSpec {
    /// Deprecated alias of resiliency.actorTimeout; rewritten by the admission webhook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processing: Option<DurationSpec>,
    /// Time the sidecar gets to finish in-flight work on shutdown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graceful_shutdown: Option<DurationSpec>,
}

/// Observed state, written by the queue provisioner.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AsyncActorStatus {
    /// Creating, Running, Napping, Degraded, Waiting, RuntimeError, SidecarError, ImagePullError, TransportError or Terminating.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Human-readable reason for the phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// TransportReady, WorkloadReady, ScalingReady and FlavorsResolved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// URL of the actor's queue (SQS) or its address (RabbitMQ).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_url: Option<String>,
    /// Queue identifier (SQS ARN or RabbitMQ queue name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_identifier: Option<String>,
    /// Pods ready and running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Pods created but not ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_replicas: Option<i32>,
    /// Pods in CrashLoopBackOff, ImagePullBackOff and similar states.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_replicas: Option<i32>,
    /// Target replicas (KEDA's HPA, or spec.replicas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_replicas: Option<i32>,
    /// Effective autoscaling lower bound (after flavors and defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_replicas: Option<i32>,
    /// Effective autoscaling upper bound (after flavors and defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_replicas: Option<i32>,
    /// When the workload last scaled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<Time>,
    /// up or down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_direction: Option<String>,
    /// Last scale for display, e.g. "2026-11-22T10:00:00Z (up)".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale: Option<String>,
    /// Messages waiting in the queue, where the transport can tell: a sample taken at each
    /// reconcile, so at least every 60-75 s (KEDA reads the queue itself to scale).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_messages: Option<i64>,
    /// Messages delivered but not yet acknowledged, where the transport can tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processing_messages: Option<i64>,
    /// Deployment or StatefulSet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_kind: Option<String>,
    /// Transport readiness for display (Ready or the error reason).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport_status: Option<String>,
    /// KEDA or Manual.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling_mode: Option<String>,
    /// Flavors merged into the effective spec, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resolved_flavors: Vec<String>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// A cluster-scoped flavor: a named partial AsyncActor spec (docs/DESIGN.md §3).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "asya.sh",
    version = "v1alpha1",
    kind = "Flavor",
    shortname = "flv",
    // Not in category `asya`: kubectl expands a category before a short name, so a second
    // member would make `kubectl get asya NAME` look the name up as a Flavor too.
    derive = "Default",
    derive = "PartialEq",
    doc = "A named partial AsyncActor spec that actors merge in by listing it in spec.flavors.",
    printcolumn = r#"{"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
pub struct FlavorSpec {
    /// The partial spec. actor, transport and flavors cannot come from a flavor.
    #[serde(flatten)]
    pub fields: AsyncActorSpec,
}
