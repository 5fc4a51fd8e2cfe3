//! Sidecar injection (docs/DESIGN.md §5) as a pure function: `(pod, actor settings, cluster config)
//! -> injected pod`. The admission path and `asya-webhook inject` both call [`inject`], on
//! an [`InjectedPod`]: the parts of a pod it may change, and no others.

use std::collections::BTreeMap;

use asya_api::config::ClusterConfig;
use asya_api::labels;
use asya_api::resolved::ResolvedActor;
use asya_api::restricted;
use asya_api::sidecar_settings::{self, env as sidecar_env};
use asya_api::types::StateProxy;
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, ResourceRequirements, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

mod injected_pod;
mod sidecar;
mod state_proxy;
use sidecar::sidecar_container;
pub use state_proxy::HEALTHCHECK;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tests_restricted;

pub use injected_pod::InjectedPod;

/// Where the runtime file is installed in the runtime container.
pub const RUNTIME_DIR: &str = "/opt/asya";
pub const RUNTIME_FILE: &str = "/opt/asya/asya_runtime.py";
pub const SOCKET_DIR: &str = sidecar_settings::DEFAULT_SOCKET_DIR;
pub const SOCKET_VOLUME: &str = "asya-socket";
pub const RUNTIME_VOLUME: &str = "asya-runtime-file";
pub const INSTALL_CONTAINER: &str = "asya-install-runtime";
/// Where the ServiceAccount admission plugin mounts the API token into every container.
pub const API_TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// An empty volume mounted over [`API_TOKEN_PATH`] in the containers we add.
pub const NO_API_TOKEN_VOLUME: &str = "asya-no-api-token";
/// Records the sidecar image injected; its presence makes injection a no-op.
pub const INJECTED: &str = labels::INJECTED;

/// Everything injection needs to know about the actor (from its AsyncActor or annotations).
#[derive(Debug, Clone, PartialEq)]
pub struct ActorSettings {
    pub actor: String,
    /// The transport's name in the cluster configuration.
    pub transport: String,
    /// None when the image sets ASYA_HANDLER itself (workload shape); then it is left alone.
    pub handler: Option<String>,
    pub handler_mode: String,
    pub python_executable: String,
    pub actor_timeout_secs: u64,
    pub resiliency_json: String,
    pub sidecar_image: Option<String>,
    pub sidecar_pull_policy: Option<String>,
    pub sidecar_resources: Option<ResourceRequirements>,
    pub sidecar_env: Vec<EnvVar>,
    /// The actor's `stateProxy` entries (validated): one connector container each.
    pub state_proxy: Vec<StateProxy>,
}

impl ActorSettings {
    pub fn from_resolved(r: &ResolvedActor) -> Self {
        let sc = r.spec.sidecar.as_ref();
        Self {
            actor: r.actor.clone(),
            transport: r.transport.clone(),
            handler: r.handler.clone(),
            handler_mode: r.handler_mode().to_string(),
            python_executable: r.python_executable().to_string(),
            actor_timeout_secs: r.actor_timeout.as_secs().max(1),
            resiliency_json: r.resiliency_json(),
            sidecar_image: sc.and_then(|s| s.image.clone()),
            sidecar_pull_policy: sc.and_then(|s| s.image_pull_policy.clone()),
            sidecar_resources: sc.and_then(|s| s.resources.clone()),
            sidecar_env: sc.map(|s| s.env.clone()).unwrap_or_default(),
            state_proxy: r.spec.state_proxy.clone(),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InjectError {
    #[error("the pod has no containers")]
    NoContainers,
    #[error(
        "the pod has {0} containers and none is named asya-runtime: name the container that runs the handler \"asya-runtime\""
    )]
    NoRuntimeContainer(usize),
    #[error("transport {0:?} is not configured in the cluster configuration (configured: {1})")]
    UnknownTransport(String, String),
    #[error(transparent)]
    UnknownTransportType(#[from] sidecar_settings::UnknownTransportType),
}

/// Whether a pod carries the injection marker.
pub fn is_injected(meta: &ObjectMeta) -> bool {
    has_marker(meta.annotations.as_ref())
}

fn has_marker(annotations: Option<&BTreeMap<String, String>>) -> bool {
    annotations.is_some_and(|a| a.contains_key(INJECTED))
}

/// Whether the pod asks for injection (label `asya.sh/inject: "true"`).
pub fn wants_injection(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(labels::INJECT))
        .is_some_and(|v| v == "true")
}

fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    }
}

fn upsert_env(list: &mut Option<Vec<EnvVar>>, var: EnvVar) {
    let l = list.get_or_insert_with(Vec::new);
    match l.iter_mut().find(|e| e.name == var.name) {
        Some(e) => *e = var,
        None => l.push(var),
    }
}

fn ensure_mount(c: &mut Container, name: &str, path: &str, read_only: bool) {
    let mounts = c.volume_mounts.get_or_insert_with(Vec::new);
    if !mounts.iter().any(|m| m.mount_path == path) {
        mounts.push(VolumeMount {
            name: name.into(),
            mount_path: path.into(),
            read_only: read_only.then_some(true),
            ..Default::default()
        });
    }
}

fn ensure_empty_dir(volumes: &mut Option<Vec<Volume>>, name: &str) {
    let vols = volumes.get_or_insert_with(Vec::new);
    if !vols.iter().any(|v| v.name == name) {
        vols.push(Volume {
            name: name.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        });
    }
}

/// The containers we add never call the Kubernetes API, so they do not get the pod's token:
/// a mount at the token's path makes the ServiceAccount admission plugin leave them alone.
/// That is least privilege, and it keeps the plugin from changing the pod after our patch,
/// which would make the API server call this webhook a second time (`reinvocationPolicy:
/// IfNeeded`) for nothing.
fn without_api_token(c: &mut Container) {
    ensure_mount(c, NO_API_TOKEN_VOLUME, API_TOKEN_PATH, true);
}

/// Our containers under a pod that runs as root: as the sidecar image's own user, which
/// `runAsNonRoot` accepts (the runtime's socket and file are readable by any uid).
fn as_nonroot_user(c: &mut Container) {
    let sc = c.security_context.get_or_insert_with(Default::default);
    sc.run_as_user = Some(restricted::NONROOT_ID);
    sc.run_as_group = Some(restricted::NONROOT_ID);
}

/// Inject into the parts of a pod injection may change (nothing else is in reach). A pod
/// already carrying [`INJECTED`] is left as is. `native` chooses a native sidecar (init
/// container, `restartPolicy: Always`, Kubernetes 1.29+) over a regular container.
pub fn inject(
    pod: &mut InjectedPod,
    a: &ActorSettings,
    cfg: &ClusterConfig,
    native: bool,
) -> Result<(), InjectError> {
    if pod.is_injected() {
        return Ok(());
    }
    // A sidecar left in the containers (a copied spec, or a change from regular to native
    // sidecars) goes first, so the runtime container's index is taken on what remains.
    pod.containers
        .retain(|c| c.name != labels::SIDECAR_CONTAINER);
    let idx = match pod.containers.len() {
        0 => return Err(InjectError::NoContainers),
        n => match pod
            .containers
            .iter()
            .position(|c| c.name == labels::RUNTIME_CONTAINER)
        {
            Some(i) => i,
            None if n == 1 => 0,
            None => return Err(InjectError::NoRuntimeContainer(n)),
        },
    };
    let mut sidecar = sidecar_container(a, cfg)?;
    let image = sidecar.image.clone().unwrap_or_default();

    ensure_empty_dir(&mut pod.volumes, SOCKET_VOLUME);
    ensure_empty_dir(&mut pod.volumes, RUNTIME_VOLUME);
    ensure_empty_dir(&mut pod.volumes, NO_API_TOKEN_VOLUME);
    without_api_token(&mut sidecar);
    // Pod Security "restricted" (docs/DESIGN.md §5): both containers run the sidecar image,
    // whose user is numeric and non-root, and write only to their volumes.
    restricted::harden_read_only(&mut sidecar.security_context);
    if pod.pod_runs_as_root {
        as_nonroot_user(&mut sidecar);
    }

    // The runtime file ships inside the sidecar image; copy it into a shared emptyDir so the
    // user's image needs nothing but Python.
    let mut install = Container {
        name: INSTALL_CONTAINER.into(),
        image: Some(image.clone()),
        image_pull_policy: sidecar.image_pull_policy.clone(),
        args: Some(vec!["install-runtime".into(), RUNTIME_DIR.into()]),
        resources: sidecar.resources.clone(),
        ..Default::default()
    };
    ensure_mount(&mut install, RUNTIME_VOLUME, RUNTIME_DIR, false);
    without_api_token(&mut install);
    restricted::harden_read_only(&mut install.security_context);
    if pod.pod_runs_as_root {
        as_nonroot_user(&mut install);
    }
    let inits = pod.init_containers.get_or_insert_with(Vec::new);
    inits.retain(|c| c.name != INSTALL_CONTAINER && c.name != labels::SIDECAR_CONTAINER);
    inits.insert(0, install);
    if native {
        sidecar.restart_policy = Some("Always".into());
        // After the installer, before the user's init containers: it is up for all of them.
        inits.insert(1, sidecar);
    } else {
        pod.containers.push(sidecar);
    }

    let rt = &mut pod.containers[idx];
    rt.command = Some(vec![a.python_executable.clone(), RUNTIME_FILE.into()]);
    // Arguments would go to the runtime script, which takes none.
    rt.args = None;
    if let Some(h) = &a.handler {
        upsert_env(&mut rt.env, env(labels::ENV_HANDLER, h.clone()));
    }
    upsert_env(
        &mut rt.env,
        env(sidecar_env::HANDLER_MODE, a.handler_mode.clone()),
    );
    upsert_env(&mut rt.env, env(sidecar_env::SOCKET_DIR, SOCKET_DIR));
    ensure_mount(rt, SOCKET_VOLUME, SOCKET_DIR, false);
    ensure_mount(rt, RUNTIME_VOLUME, RUNTIME_DIR, true);
    state_proxy::inject_state_proxies(pod, idx, &a.state_proxy, &cfg.state_proxy, native);

    let ann = pod.annotations.get_or_insert_with(BTreeMap::new);
    for (k, v) in cfg.monitoring.pod_annotations(cfg.sidecar.metrics_port) {
        ann.insert(k.into(), v);
    }
    ann.insert(INJECTED.into(), image);
    ann.insert(
        "asya.sh/injected-mode".into(),
        if native {
            "native-sidecar"
        } else {
            "container"
        }
        .into(),
    );
    Ok(())
}
