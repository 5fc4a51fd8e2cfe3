//! Sidecar injection (DESIGN §5) as a pure function: `(pod, actor settings, cluster config)
//! -> injected pod`. The admission path and `asya-webhook inject` both call [`inject_pod`].

use std::collections::BTreeMap;

use asya_api::config::{ClusterConfig, TRANSPORT_RABBITMQ, TRANSPORT_SQS, Transport};
use asya_api::labels;
use asya_api::resolved::ResolvedActor;
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, PodSpec, Probe, ResourceRequirements, SecretKeySelector, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Where the runtime file is installed in the runtime container.
pub const RUNTIME_DIR: &str = "/opt/asya";
pub const RUNTIME_FILE: &str = "/opt/asya/asya_runtime.py";
pub const SOCKET_DIR: &str = "/var/run/asya";
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
    #[error("transport {0:?} has unknown type {1:?}")]
    UnknownTransportType(String, String),
}

/// Whether a pod carries the injection marker.
pub fn is_injected(meta: &ObjectMeta) -> bool {
    meta.annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(INJECTED))
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

fn env_secret(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                optional: None,
            }),
            ..Default::default()
        }),
    }
}

/// Percent-encode a URL component (userinfo, vhost): keeps unreserved characters only.
fn pct(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Transport env for the sidecar, credentials as `secretKeyRef` (never inline).
fn transport_env(name: &str, t: &Transport) -> Result<Vec<EnvVar>, InjectError> {
    let c = &t.config;
    let mut out = vec![env("ASYA_TRANSPORT", t.kind.clone())];
    match t.kind.as_str() {
        TRANSPORT_RABBITMQ => {
            let scheme = if t.rabbitmq_tls() { "amqps" } else { "amqp" };
            let host = c.host.clone().unwrap_or_else(|| "rabbitmq".into());
            let port = c
                .port
                .unwrap_or(if scheme == "amqps" { 5671 } else { 5672 });
            let vhost = pct(c.vhost.as_deref().unwrap_or("/"));
            let user = pct(c.username.as_deref().unwrap_or("guest"));
            // The password stays in its Secret: Kubernetes expands $(VAR) from an earlier env
            // entry, so the URL is assembled in the pod, not in the pod spec.
            let userinfo = match &c.password_secret_ref {
                Some(s) => {
                    out.push(env_secret("ASYA_RABBITMQ_PASSWORD", &s.name, &s.key));
                    format!("{user}:$(ASYA_RABBITMQ_PASSWORD)")
                }
                None => user,
            };
            out.push(env(
                "ASYA_RABBITMQ_URL",
                format!("{scheme}://{userinfo}@{host}:{port}/{vhost}"),
            ));
        }
        TRANSPORT_SQS => {
            if let Some(r) = &c.region {
                out.push(env("ASYA_SQS_REGION", r.clone()));
            }
            if let Some(e) = &c.endpoint {
                out.push(env("ASYA_SQS_ENDPOINT", e.clone()));
            }
            if let Some(s) = &c.credentials_secret_ref {
                out.push(env_secret(
                    "AWS_ACCESS_KEY_ID",
                    &s.name,
                    &s.access_key_id_key,
                ));
                out.push(env_secret(
                    "AWS_SECRET_ACCESS_KEY",
                    &s.name,
                    &s.secret_access_key_key,
                ));
            }
        }
        other => {
            return Err(InjectError::UnknownTransportType(name.into(), other.into()));
        }
    }
    Ok(out)
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

fn ensure_empty_dir(spec: &mut PodSpec, name: &str) {
    let vols = spec.volumes.get_or_insert_with(Vec::new);
    if !vols.iter().any(|v| v.name == name) {
        vols.push(Volume {
            name: name.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        });
    }
}

fn http_probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("metrics".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

/// The sidecar container (its `restartPolicy` is set by the caller for native sidecars).
fn sidecar_container(a: &ActorSettings, cfg: &ClusterConfig) -> Result<Container, InjectError> {
    let t = cfg.transport(&a.transport).ok_or_else(|| {
        InjectError::UnknownTransport(a.transport.clone(), cfg.transport_names().join(", "))
    })?;
    let port = cfg.sidecar.metrics_port;
    let mut env_list = vec![
        env("ASYA_ACTOR_NAME", a.actor.clone()),
        EnvVar {
            name: "ASYA_NAMESPACE".into(),
            value: None,
            // The pod's own namespace, right even when the request object leaves it empty.
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.namespace".into(),
                    api_version: None,
                }),
                ..Default::default()
            }),
        },
    ];
    env_list.extend(transport_env(&a.transport, t)?);
    env_list.extend([
        env("ASYA_SOCKET_DIR", SOCKET_DIR),
        env("ASYA_RUNTIME_TIMEOUT", format!("{}s", a.actor_timeout_secs)),
        env("ASYA_RESILIENCY", a.resiliency_json.clone()),
        env("ASYA_HANDLER_MODE", a.handler_mode.clone()),
        env("ASYA_METRICS_ADDR", format!("0.0.0.0:{port}")),
    ]);
    if let Some(url) = &cfg.gateway.url {
        env_list.push(env("ASYA_GATEWAY_URL", url.clone()));
        if let Some(s) = &cfg.gateway.token_secret_ref {
            env_list.push(env_secret("ASYA_GATEWAY_TOKEN", &s.name, &s.key));
        }
    }
    let mut env_opt = Some(env_list);
    // Per-actor overrides win over the injected defaults.
    for e in &a.sidecar_env {
        upsert_env(&mut env_opt, e.clone());
    }
    let mut c = Container {
        name: labels::SIDECAR_CONTAINER.into(),
        image: Some(
            a.sidecar_image
                .clone()
                .unwrap_or_else(|| cfg.sidecar.image.clone()),
        ),
        image_pull_policy: Some(
            a.sidecar_pull_policy
                .clone()
                .unwrap_or_else(|| cfg.sidecar.image_pull_policy.clone()),
        ),
        args: Some(vec!["run".into()]),
        env: env_opt,
        ports: Some(vec![ContainerPort {
            name: Some("metrics".into()),
            container_port: i32::from(port),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        readiness_probe: Some(http_probe("/readyz", 5, 3)),
        liveness_probe: Some(http_probe("/healthz", 10, 6)),
        resources: Some(
            a.sidecar_resources
                .clone()
                .unwrap_or_else(|| cfg.sidecar.resources.clone()),
        ),
        ..Default::default()
    };
    ensure_mount(&mut c, SOCKET_VOLUME, SOCKET_DIR, false);
    Ok(c)
}

/// The containers we add never call the Kubernetes API, so they do not get the pod's token:
/// a mount at the token's path makes the ServiceAccount admission plugin leave them alone.
/// That is least privilege, and it keeps the plugin from changing the pod after our patch,
/// which would make the API server call this webhook a second time (`reinvocationPolicy:
/// IfNeeded`) for nothing.
fn without_api_token(c: &mut Container) {
    ensure_mount(c, NO_API_TOKEN_VOLUME, API_TOKEN_PATH, true);
}

/// Inject into a pod's metadata and spec. A pod already carrying [`INJECTED`] is left as is.
/// `native` chooses a native sidecar (init container, `restartPolicy: Always`, Kubernetes
/// 1.29+) over a regular container.
pub fn inject_pod(
    meta: &mut ObjectMeta,
    spec: &mut PodSpec,
    a: &ActorSettings,
    cfg: &ClusterConfig,
    native: bool,
) -> Result<(), InjectError> {
    if is_injected(meta) {
        return Ok(());
    }
    // A sidecar left in the containers (a copied spec, or a change from regular to native
    // sidecars) goes first, so the runtime container's index is taken on what remains.
    spec.containers
        .retain(|c| c.name != labels::SIDECAR_CONTAINER);
    let idx = match spec.containers.len() {
        0 => return Err(InjectError::NoContainers),
        n => match spec
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

    ensure_empty_dir(spec, SOCKET_VOLUME);
    ensure_empty_dir(spec, RUNTIME_VOLUME);
    ensure_empty_dir(spec, NO_API_TOKEN_VOLUME);
    without_api_token(&mut sidecar);

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
    let inits = spec.init_containers.get_or_insert_with(Vec::new);
    inits.retain(|c| c.name != INSTALL_CONTAINER && c.name != labels::SIDECAR_CONTAINER);
    inits.insert(0, install);
    if native {
        sidecar.restart_policy = Some("Always".into());
        // After the installer, before the user's init containers: it is up for all of them.
        inits.insert(1, sidecar);
    } else {
        spec.containers.push(sidecar);
    }

    let rt = &mut spec.containers[idx];
    rt.command = Some(vec![a.python_executable.clone(), RUNTIME_FILE.into()]);
    // Arguments would go to the runtime script, which takes none.
    rt.args = None;
    if let Some(h) = &a.handler {
        upsert_env(&mut rt.env, env(labels::ENV_HANDLER, h.clone()));
    }
    upsert_env(
        &mut rt.env,
        env("ASYA_HANDLER_MODE", a.handler_mode.clone()),
    );
    upsert_env(&mut rt.env, env("ASYA_SOCKET_DIR", SOCKET_DIR));
    ensure_mount(rt, SOCKET_VOLUME, SOCKET_DIR, false);
    ensure_mount(rt, RUNTIME_VOLUME, RUNTIME_DIR, true);

    let ann = meta.annotations.get_or_insert_with(BTreeMap::new);
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    /// The settings of a plain actor `echo` (also used by the patch tests).
    pub(crate) fn settings() -> ActorSettings {
        ActorSettings {
            actor: "echo".into(),
            transport: "rabbitmq".into(),
            handler: Some("echo.handle".into()),
            handler_mode: "payload".into(),
            python_executable: "python3".into(),
            actor_timeout_secs: 300,
            resiliency_json: r#"{"actorTimeout":"5m"}"#.into(),
            sidecar_image: None,
            sidecar_pull_policy: None,
            sidecar_resources: None,
            sidecar_env: vec![],
        }
    }

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"asya.sh/inject": "true", "asya.sh/actor": "echo"}},
            "spec": {"containers": [{"name": "main", "image": "python:3.13", "args": ["x"],
                                     "env": [{"name": "ASYA_HANDLER", "value": "old.value"}]}],
                     "initContainers": [{"name": "user-init", "image": "busybox"}]}
        }))
        .unwrap()
    }

    fn run(
        p: &mut Pod,
        a: &ActorSettings,
        cfg: &ClusterConfig,
        native: bool,
    ) -> Result<(), InjectError> {
        let spec = p.spec.as_mut().unwrap();
        inject_pod(&mut p.metadata, spec, a, cfg, native)
    }

    fn env_of<'a>(c: &'a Container, name: &str) -> Option<&'a EnvVar> {
        c.env.as_ref()?.iter().find(|e| e.name == name)
    }

    #[test]
    fn a_stale_sidecar_before_the_runtime_is_replaced_and_the_runtime_is_still_the_one_set_up() {
        for native in [false, true] {
            let mut p: Pod = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "labels": {"asya.sh/inject": "true"}},
                "spec": {"containers": [
                    {"name": "asya-sidecar", "image": "old-sidecar:0"},
                    {"name": "asya-runtime", "image": "python:3.13"},
                    {"name": "metrics", "image": "exporter:1"}]}
            }))
            .unwrap();
            run(&mut p, &settings(), &ClusterConfig::default(), native).unwrap();
            let s = p.spec.as_ref().unwrap();
            let by_name = |n: &str| s.containers.iter().find(|c| c.name == n).unwrap();
            assert_eq!(
                by_name("asya-runtime").command.as_deref(),
                Some(&["python3".to_string(), RUNTIME_FILE.to_string()][..]),
                "native={native}"
            );
            assert!(by_name("metrics").command.is_none(), "native={native}");
            let sidecars = s
                .containers
                .iter()
                .chain(s.init_containers.iter().flatten())
                .filter(|c| c.name == "asya-sidecar")
                .collect::<Vec<_>>();
            assert_eq!(sidecars.len(), 1, "native={native}");
            assert_ne!(sidecars[0].image.as_deref(), Some("old-sidecar:0"));
        }
    }

    #[test]
    fn native_injection_has_everything_and_is_idempotent() {
        let cfg = ClusterConfig::default();
        let mut p = pod();
        run(&mut p, &settings(), &cfg, true).unwrap();
        let s = p.spec.as_ref().unwrap();
        let inits: Vec<_> = s
            .init_containers
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(inits, ["asya-install-runtime", "asya-sidecar", "user-init"]);
        let sc = &s.init_containers.as_ref().unwrap()[1];
        assert_eq!(sc.restart_policy.as_deref(), Some("Always"));
        assert_eq!(sc.image.as_deref(), Some(cfg.sidecar.image.as_str()));
        assert_eq!(
            env_of(sc, "ASYA_ACTOR_NAME").unwrap().value.as_deref(),
            Some("echo")
        );
        assert_eq!(
            env_of(sc, "ASYA_TRANSPORT").unwrap().value.as_deref(),
            Some("rabbitmq")
        );
        let pw = env_of(sc, "ASYA_RABBITMQ_PASSWORD").unwrap();
        assert_eq!(pw.value, None, "credentials never inline");
        let sk = pw
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!(
            (sk.name.as_str(), sk.key.as_str()),
            ("rabbitmq-secret", "password")
        );
        assert_eq!(
            env_of(sc, "ASYA_RABBITMQ_URL").unwrap().value.as_deref(),
            Some("amqp://guest:$(ASYA_RABBITMQ_PASSWORD)@rabbitmq:5672/%2F")
        );
        // The password var must come before the URL that references it.
        let names: Vec<_> = sc
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        let pos = |n| names.iter().position(|x| *x == n).unwrap();
        assert!(pos("ASYA_RABBITMQ_PASSWORD") < pos("ASYA_RABBITMQ_URL"));
        assert_eq!(
            env_of(sc, "ASYA_RUNTIME_TIMEOUT").unwrap().value.as_deref(),
            Some("300s")
        );
        assert_eq!(
            env_of(sc, "ASYA_SOCKET_DIR").unwrap().value.as_deref(),
            Some("/var/run/asya")
        );
        assert!(
            env_of(sc, "ASYA_NAMESPACE")
                .unwrap()
                .value_from
                .as_ref()
                .unwrap()
                .field_ref
                .is_some()
        );
        assert_eq!(
            sc.ports.as_ref().unwrap()[0].name.as_deref(),
            Some("metrics")
        );
        assert_eq!(sc.ports.as_ref().unwrap()[0].container_port, 8080);
        assert!(sc.readiness_probe.is_some() && sc.liveness_probe.is_some());
        assert!(sc.resources.is_some());

        let rt = &s.containers[0];
        assert_eq!(s.containers.len(), 1);
        assert_eq!(
            rt.command.as_ref().unwrap(),
            &["python3", "/opt/asya/asya_runtime.py"]
        );
        assert_eq!(rt.args, None);
        assert_eq!(
            env_of(rt, "ASYA_HANDLER").unwrap().value.as_deref(),
            Some("echo.handle")
        );
        assert_eq!(
            rt.env
                .as_ref()
                .unwrap()
                .iter()
                .filter(|e| e.name == "ASYA_HANDLER")
                .count(),
            1
        );
        let mounts: Vec<_> = rt
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| m.mount_path.as_str())
            .collect();
        assert_eq!(mounts, ["/var/run/asya", "/opt/asya"]);
        let vols: Vec<_> = s
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(
            vols,
            ["asya-socket", "asya-runtime-file", "asya-no-api-token"]
        );
        // Our containers carry no API token; the user's keep theirs.
        for c in &s.init_containers.as_ref().unwrap()[..2] {
            let m = c
                .volume_mounts
                .as_ref()
                .unwrap()
                .iter()
                .find(|m| m.mount_path == API_TOKEN_PATH)
                .unwrap_or_else(|| panic!("{} has no mount over the token path", c.name));
            assert_eq!(
                (m.name.as_str(), m.read_only),
                (NO_API_TOKEN_VOLUME, Some(true))
            );
        }
        assert!(!mounts.contains(&API_TOKEN_PATH));
        assert!(is_injected(&p.metadata));

        let once = p.clone();
        run(&mut p, &settings(), &cfg, true).unwrap();
        assert_eq!(p, once, "second pass changes nothing");
    }

    #[test]
    fn regular_container_mode_and_overrides() {
        let cfg = ClusterConfig::default();
        let mut a = settings();
        a.transport = "sqs".into();
        a.sidecar_image = Some("reg.example/asya-sidecar:dev".into());
        a.sidecar_env = vec![env("ASYA_SOCKET_DIR", "/should/win")];
        let mut p = pod();
        run(&mut p, &a, &cfg, false).unwrap();
        let s = p.spec.unwrap();
        assert_eq!(s.containers.len(), 2);
        let sc = &s.containers[1];
        assert_eq!(sc.name, "asya-sidecar");
        assert_eq!(sc.restart_policy, None);
        assert_eq!(sc.image.as_deref(), Some("reg.example/asya-sidecar:dev"));
        assert_eq!(
            env_of(sc, "ASYA_SQS_REGION").unwrap().value.as_deref(),
            Some("us-east-1")
        );
        assert_eq!(
            env_of(sc, "ASYA_SOCKET_DIR").unwrap().value.as_deref(),
            Some("/should/win")
        );
        assert!(env_of(sc, "ASYA_RABBITMQ_URL").is_none());
        assert_eq!(
            p.metadata
                .annotations
                .unwrap()
                .get(INJECTED)
                .map(String::as_str),
            Some("reg.example/asya-sidecar:dev")
        );
        let inits = s.init_containers.unwrap();
        assert_eq!(
            inits[0].image.as_deref(),
            Some("reg.example/asya-sidecar:dev")
        );
    }

    /// The injected sidecar, a native one (init container) or a regular one.
    fn sidecar_of(p: &Pod) -> &Container {
        let s = p.spec.as_ref().unwrap();
        s.init_containers
            .iter()
            .flatten()
            .chain(&s.containers)
            .find(|c| c.name == labels::SIDECAR_CONTAINER)
            .expect("an injected sidecar")
    }

    #[test]
    fn gateway_url_and_token_are_injected_only_when_the_configuration_names_a_gateway() {
        let url = "http://asya-gateway.asya-system.svc:8080";
        for native in [true, false] {
            // No gateway in the configuration: the sidecar reports nowhere.
            let cfg = ClusterConfig::default();
            assert!(cfg.gateway.is_off());
            let mut p = pod();
            run(&mut p, &settings(), &cfg, native).unwrap();
            let sc = sidecar_of(&p);
            assert!(env_of(sc, "ASYA_GATEWAY_URL").is_none(), "native={native}");
            assert!(
                env_of(sc, "ASYA_GATEWAY_TOKEN").is_none(),
                "native={native}"
            );

            // A URL alone (auth off on the gateway): the URL, no token.
            let mut cfg = ClusterConfig::default();
            cfg.gateway.url = Some(url.into());
            let mut p = pod();
            run(&mut p, &settings(), &cfg, native).unwrap();
            let sc = sidecar_of(&p);
            assert_eq!(
                env_of(sc, "ASYA_GATEWAY_URL").unwrap(),
                &env("ASYA_GATEWAY_URL", url),
                "native={native}"
            );
            assert!(
                env_of(sc, "ASYA_GATEWAY_TOKEN").is_none(),
                "native={native}"
            );
            // Only the sidecar reports: the runtime container gets neither.
            let rt = p
                .spec
                .as_ref()
                .unwrap()
                .containers
                .iter()
                .find(|c| c.name == "main")
                .unwrap();
            assert!(env_of(rt, "ASYA_GATEWAY_URL").is_none(), "native={native}");

            // With the sidecars' token: from the Secret, never inline.
            cfg.gateway.token_secret_ref = Some(asya_api::config::SecretKeySelector {
                name: "gw-sidecar".into(),
                key: "token".into(),
            });
            let mut p = pod();
            run(&mut p, &settings(), &cfg, native).unwrap();
            let sc = sidecar_of(&p);
            assert_eq!(
                env_of(sc, "ASYA_GATEWAY_URL").unwrap().value.as_deref(),
                Some(url)
            );
            let token = env_of(sc, "ASYA_GATEWAY_TOKEN").unwrap();
            assert_eq!(token.value, None, "credentials never inline");
            let sk = token
                .value_from
                .as_ref()
                .and_then(|v| v.secret_key_ref.as_ref())
                .unwrap();
            assert_eq!((sk.name.as_str(), sk.key.as_str()), ("gw-sidecar", "token"));
        }
    }

    #[test]
    fn container_choice_errors() {
        let cfg = ClusterConfig::default();
        let mut p = pod();
        p.spec.as_mut().unwrap().containers.push(Container {
            name: "other".into(),
            ..Default::default()
        });
        assert_eq!(
            run(&mut p, &settings(), &cfg, true),
            Err(InjectError::NoRuntimeContainer(2))
        );
        p.spec.as_mut().unwrap().containers[1].name = "asya-runtime".into();
        run(&mut p, &settings(), &cfg, true).unwrap();
        let s = p.spec.unwrap();
        assert_eq!(
            s.containers[0].command, None,
            "only the runtime container is changed"
        );
        assert!(s.containers[1].command.is_some());
        let mut empty = pod();
        empty.spec.as_mut().unwrap().containers.clear();
        assert_eq!(
            run(&mut empty, &settings(), &cfg, true),
            Err(InjectError::NoContainers)
        );
        let mut a = settings();
        a.transport = "kafka".into();
        assert!(matches!(
            run(&mut pod(), &a, &cfg, true),
            Err(InjectError::UnknownTransport(..))
        ));
    }

    #[test]
    fn url_components_are_escaped() {
        assert_eq!(pct("/"), "%2F");
        assert_eq!(pct("a b@c"), "a%20b%40c");
        assert_eq!(pct("prod-1"), "prod-1");
    }
}
