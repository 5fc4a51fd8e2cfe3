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
