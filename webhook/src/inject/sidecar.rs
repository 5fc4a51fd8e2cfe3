//! The sidecar container: its image, probes, and its environment rendered from the
//! settings contract the sidecar parses back ([`asya_api::sidecar_settings`]).

use asya_api::config::ClusterConfig;
use asya_api::labels;
use asya_api::sidecar_settings::{
    GatewaySettings, SidecarSettings, Sourced, TransportSettings, env as sidecar_env,
};
use k8s_openapi::api::core::v1::{Container, ContainerPort, HTTPGetAction, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{ActorSettings, InjectError, SOCKET_DIR, SOCKET_VOLUME, ensure_mount, upsert_env};

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
pub(super) fn sidecar_container(
    a: &ActorSettings,
    cfg: &ClusterConfig,
) -> Result<Container, InjectError> {
    let t = cfg.transport(&a.transport).ok_or_else(|| {
        InjectError::UnknownTransport(a.transport.clone(), cfg.transport_names().join(", "))
    })?;
    let port = cfg.sidecar.metrics_port;
    let settings = SidecarSettings {
        actor: a.actor.clone(),
        // The pod's own namespace, right even when the request object leaves it empty.
        namespace: Sourced::PodField("metadata.namespace".into()),
        transport: TransportSettings::for_transport(&a.transport, t)?,
        socket_dir: SOCKET_DIR.into(),
        runtime_timeout: Some(format!("{}s", a.actor_timeout_secs)),
        resiliency_json: Some(a.resiliency_json.clone()),
        handler_mode: Some(a.handler_mode.clone()),
        metrics_addr: Some(format!("0.0.0.0:{port}")),
        gateway: cfg.gateway.url.as_ref().map(|url| GatewaySettings {
            url: url.clone(),
            token: cfg
                .gateway
                .token_secret_ref
                .as_ref()
                .map(|s| Sourced::Secret {
                    name: s.name.clone(),
                    key: s.key.clone(),
                }),
        }),
    };
    let mut env_opt = Some(settings.to_env());
    // After the settings: OTEL_RESOURCE_ATTRIBUTES refers to the namespace variable.
    let namespace_ref = format!("$({})", sidecar_env::NAMESPACE);
    for (name, value) in cfg.tracing.sidecar_env(&a.actor, &namespace_ref) {
        upsert_env(&mut env_opt, super::env(&name, value));
    }
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
