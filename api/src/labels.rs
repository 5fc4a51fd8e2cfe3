//! Label and annotation keys of the `asya.sh` contract (docs/DESIGN.md §3, §5).

/// Pods with this label set to `"true"` get the sidecar injected.
pub const INJECT: &str = "asya.sh/inject";
/// The actor a pod belongs to.
pub const ACTOR: &str = "asya.sh/actor";
/// Set by the webhook on an injected pod; its value records what was injected.
pub const INJECTED: &str = "asya.sh/injected";
/// Marks a ConfigMap or EnvironmentConfig as a flavor; the value is the flavor name.
pub const FLAVOR: &str = "asya.sh/flavor";
/// A flavor labelled `"true"` is deprecated; actors using it are admitted with a warning.
pub const DEPRECATED: &str = "asya.sh/deprecated";
/// The message shown with a deprecated flavor's warning.
pub const DEPRECATION_MESSAGE: &str = "asya.sh/deprecation-message";
/// Pod annotations that configure injection when no AsyncActor exists (docs/DESIGN.md §5).
pub const ANNOTATION_HANDLER: &str = "asya.sh/handler";
pub const ANNOTATION_TRANSPORT: &str = "asya.sh/transport";
pub const ANNOTATION_HANDLER_MODE: &str = "asya.sh/handler-mode";
pub const ANNOTATION_PYTHON: &str = "asya.sh/python-executable";
/// Key of the partial spec inside a flavor ConfigMap.
pub const FLAVOR_CONFIGMAP_KEY: &str = "flavor.yaml";
/// The name of the runtime container in workload templates and injected pods.
pub const RUNTIME_CONTAINER: &str = "asya-runtime";
/// The name of the injected sidecar container.
pub const SIDECAR_CONTAINER: &str = "asya-sidecar";
/// The runtime's handler variable, also read from workload templates.
pub const ENV_HANDLER: &str = "ASYA_HANDLER";
/// An AsyncActor annotated with this set to `"true"` is released at once when deleted: the
/// provisioner leaves its queue on the broker and removes its finalizer (docs/DESIGN.md §9).
pub const SKIP_CLEANUP: &str = "asya.sh/skip-cleanup";
/// kubectl's copy of an object as last applied: as large as its spec, and read by nothing of
/// ours, so the caches drop it ([`drop_bookkeeping`]).
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what the API server and kubectl keep about an object's writes — managed fields and
/// the last-applied annotation, which together often outweigh the rest of it — from a copy a
/// cache keeps. Labels, other annotations, finalizers and the rest stay.
pub fn drop_bookkeeping(meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove(LAST_APPLIED);
        if a.is_empty() {
            meta.annotations = None;
        }
    }
}

/// Flows (docs/flows.md): what `asya flow compile` writes and the gateway reads to offer a
/// flow as a tool. The flow an actor serves.
pub const FLOW: &str = "asya.sh/flow";
/// The actor's role in its flow: `entry`, `step` or `fan-out-branch`.
pub const FLOW_ROLE: &str = "asya.sh/flow-role";
/// The program's version (on the ConfigMap and the entry actor).
pub const FLOW_VERSION: &str = "asya.sh/flow-version";
/// Annotation of the entry actor: the flow's docstring (the tool's description).
pub const ANNOTATION_FLOW_DESCRIPTION: &str = "asya.sh/flow-description";
/// Annotation of the entry actor a user may add: the tool's parameters (JSON, the gateway
/// tools file's `parameters` shape).
pub const ANNOTATION_FLOW_PARAMETERS: &str = "asya.sh/flow-parameters";
