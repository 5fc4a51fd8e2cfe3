//! State proxy connectors (docs/DESIGN.md §10): one container per `stateProxy` entry beside
//! the runtime, serving the original Asya's HTTP contract on a Unix socket in the shared
//! `state-sockets` volume, and the runtime's `ASYA_STATE_PROXY_MOUNTS`.

use asya_api::config::StateProxyConfig;
use asya_api::naming::{BROKER_SECRET_PASSWORD, BROKER_SECRET_USERNAME};
use asya_api::restricted;
use asya_api::sidecar_settings::Sourced;
use asya_api::state_proxy::{
    self as sp, CONTAINER_PREFIX, ENV_CONNECTOR_SOCKET, ENV_MOUNTS, ENV_NAMESPACE,
    ENV_REDIS_PASSWORD, ENV_REDIS_URL, ENV_REDIS_USERNAME, SOCKET_DIR, SOCKET_VOLUME,
    TENANT_REDIS_SECRET,
};
use asya_api::types::StateProxy;
use k8s_openapi::api::core::v1::{Container, ExecAction, Probe};

use super::{
    InjectedPod, as_nonroot_user, ensure_empty_dir, ensure_mount, env, upsert_env,
    without_api_token,
};

/// The command the probes run in our connector image: it asks `GET /healthz` on
/// `$CONNECTOR_SOCKET` and exits 0 on a 200 (state-proxy/src/main.rs, `--probe`).
pub const HEALTHCHECK: [&str; 2] = ["/usr/local/bin/asya-state-proxy", "--probe"];
fn exec_probe(period: i32, failures: i32) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(HEALTHCHECK.iter().map(|s| s.to_string()).collect()),
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(2),
        ..Default::default()
    }
}

/// One connector container, hardened like our other containers.
pub(super) fn connector_container(
    entry: &StateProxy,
    state: &StateProxyConfig,
    pod_runs_as_root: bool,
) -> Container {
    let conn = entry.connector.clone().unwrap_or_default();
    let mut env_list = Some(conn.env);
    // What injection sets wins over anything in the entry (validation refuses it there).
    upsert_env(
        &mut env_list,
        env(ENV_CONNECTOR_SOCKET, sp::socket_path(&entry.name)),
    );
    // The pod's own namespace, which no entry can name otherwise: the connector keeps every
    // key under it (docs/DESIGN.md §9).
    upsert_env(
        &mut env_list,
        Sourced::PodField("metadata.namespace".into()).env(ENV_NAMESPACE),
    );
    if sp::uses_platform_redis(entry, state)
        && let Some(platform) = state.redis.as_ref()
    {
        let has_url = env_list
            .as_ref()
            .is_some_and(|l| l.iter().any(|e| e.name == ENV_REDIS_URL));
        if !has_url {
            upsert_env(&mut env_list, env(ENV_REDIS_URL, platform.url.clone()));
        }
        // The namespace's own Redis user, which the provisioner keeps in this Secret before
        // it creates the workload.
        for (name, key) in [
            (ENV_REDIS_USERNAME, BROKER_SECRET_USERNAME),
            (ENV_REDIS_PASSWORD, BROKER_SECRET_PASSWORD),
        ] {
            let from = Sourced::Secret {
                name: TENANT_REDIS_SECRET.into(),
                key: key.into(),
            };
            upsert_env(&mut env_list, from.env(name));
        }
    }
    let ours = sp::is_our_image(&conn.image);
    let mut c = Container {
        name: sp::container_name(&entry.name),
        image: Some(conn.image),
        image_pull_policy: conn.image_pull_policy,
        env: env_list,
        resources: conn.resources,
        // A native sidecar's startup probe holds back the containers after it: the runtime
        // starts once the socket answers (1 s period, a minute to come up).
        startup_probe: ours.then(|| exec_probe(1, 60)),
        readiness_probe: ours.then(|| exec_probe(10, 3)),
        ..Default::default()
    };
    ensure_mount(&mut c, SOCKET_VOLUME, SOCKET_DIR, false);
    without_api_token(&mut c);
    restricted::harden_read_only(&mut c.security_context);
    if pod_runs_as_root {
        as_nonroot_user(&mut c);
    }
    c
}

fn is_connector(c: &Container) -> bool {
    c.name.starts_with(CONTAINER_PREFIX)
}

/// Adds the connectors of `entries` (none: only stale connectors are removed) and points the
/// runtime container (`containers[rt]`) at them. Native connectors go right after the asya
/// sidecar among the init containers, so they are up before the runtime and the user's init
/// containers; otherwise they are regular containers.
pub(super) fn inject_state_proxies(
    pod: &mut InjectedPod,
    rt: usize,
    entries: &[StateProxy],
    state: &StateProxyConfig,
    native: bool,
) {
    // Connectors left in a copied spec are ours by name; the current list replaces them.
    let rt_name = pod.containers[rt].name.clone();
    pod.containers
        .retain(|c| !is_connector(c) || c.name == rt_name);
    let rt = pod
        .containers
        .iter()
        .position(|c| c.name == rt_name)
        .unwrap_or_default();
    if let Some(inits) = pod.init_containers.as_mut() {
        inits.retain(|c| !is_connector(c));
    }
    if entries.is_empty() {
        return;
    }
    ensure_empty_dir(&mut pod.volumes, SOCKET_VOLUME);
    let connectors = entries
        .iter()
        .map(|e| connector_container(e, state, pod.pod_runs_as_root));
    if native {
        let inits = pod.init_containers.get_or_insert_with(Vec::new);
        let at = inits
            .iter()
            .position(|c| c.name == asya_api::labels::SIDECAR_CONTAINER)
            .map_or(0, |i| i + 1);
        let native_connectors = connectors.map(|mut c| {
            c.restart_policy = Some("Always".into());
            c
        });
        inits.splice(at..at, native_connectors);
    } else {
        pod.containers.extend(connectors);
    }
    let runtime = &mut pod.containers[rt];
    ensure_mount(runtime, SOCKET_VOLUME, SOCKET_DIR, false);
    upsert_env(&mut runtime.env, env(ENV_MOUNTS, sp::mounts_env(entries)));
}
