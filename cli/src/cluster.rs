//! The API server edge: which cluster and namespace (kubectl's rules through kube-rs), the
//! release's configuration (the chart's ConfigMap `asya-config`, read with `asya_api`'s own
//! types as the webhook and the provisioner read it) and the namespace's Secrets. Every
//! refusal names the verb, the resource and the namespace.

use std::collections::BTreeMap;
use std::path::PathBuf;

use asya_api::config::ClusterConfig;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::error::{CliError, Result};

/// The key of the chart's ConfigMap that holds the cluster configuration (docs/DESIGN.md §7).
pub const CONFIG_KEY: &str = "config.yaml";

/// Where to connect, as kubectl's flags say it.
#[derive(Debug, Clone, Default)]
pub struct Where {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub namespace: Option<String>,
}

pub struct Cluster {
    pub client: kube::Client,
    /// `-n`, else the context's namespace, else `default` (kubectl's order).
    pub namespace: String,
}

fn unavailable(e: impl std::fmt::Display) -> CliError {
    CliError::Unavailable {
        what: "the Kubernetes API server".into(),
        why: e.to_string(),
    }
}

/// Connects as kubectl would: `--kubeconfig`, else `KUBECONFIG`/`~/.kube/config`, else the
/// in-cluster ServiceAccount; `--context` picks the context.
pub async fn connect(w: &Where) -> Result<Cluster> {
    let opts = KubeConfigOptions {
        context: w.context.clone(),
        ..Default::default()
    };
    let config = match &w.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| CliError::Usage(format!("--kubeconfig {}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &opts)
                .await
                .map_err(|e| CliError::Usage(format!("--kubeconfig {}: {e}", path.display())))?
        }
        None if w.context.is_some() => kube::Config::from_kubeconfig(&opts)
            .await
            .map_err(|e| CliError::Usage(format!("--context {:?}: {e}", w.context)))?,
        None => kube::Config::infer().await.map_err(|e| {
            CliError::Usage(format!(
                "no cluster configuration: {e} (set KUBECONFIG, pass --kubeconfig, or run in a pod)"
            ))
        })?,
    };
    let namespace = w
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = kube::Client::try_from(config).map_err(unavailable)?;
    Ok(Cluster { client, namespace })
}

/// A kube error for a read of `resource` `name` in `namespace`: 403 and 404 said as such.
pub fn read_error(
    e: kube::Error,
    verb: &'static str,
    resource: &'static str,
    name: &str,
    namespace: &str,
    hint: &'static str,
) -> CliError {
    match e {
        kube::Error::Api(s) if s.code == 403 => CliError::Forbidden {
            verb,
            resource,
            name: name.to_string(),
            namespace: namespace.to_string(),
            why: s.message,
            hint,
        },
        kube::Error::Api(s) if s.code == 404 => CliError::NotFound {
            what: format!("{resource} {name:?} in namespace {namespace:?}"),
            why: s.message,
        },
        other => unavailable(other),
    }
}

/// The release's cluster configuration, from its ConfigMap.
pub async fn release_config(
    client: &kube::Client,
    release_namespace: &str,
    name: &str,
) -> Result<ClusterConfig> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), release_namespace);
    let cm = api.get(name).await.map_err(|e| {
        read_error(
            e,
            "get",
            "configmaps",
            name,
            release_namespace,
            ", or pass --config with the release's config.yaml",
        )
    })?;
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get(CONFIG_KEY))
        .ok_or_else(|| CliError::NotFound {
            what: format!("key {CONFIG_KEY:?} of ConfigMap {release_namespace}/{name}"),
            why: "the ConfigMap is not the chart's (wrong --release-namespace?)".into(),
        })?;
    parse_config(text, &format!("ConfigMap {release_namespace}/{name}"))
}

/// The configuration from YAML text, refused with where it came from.
pub fn parse_config(text: &str, source: &str) -> Result<ClusterConfig> {
    ClusterConfig::from_yaml(text).map_err(|e| CliError::Usage(format!("{source}: {e}")))
}

/// The string data of a Secret, `None` when it does not exist.
pub async fn secret(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, String>>> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let s = match api.get_opt(name).await {
        Ok(s) => s,
        Err(e) => return Err(read_error(e, "get", "secrets", name, namespace, "")),
    };
    Ok(s.map(|s| {
        s.data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect()
    }))
}

/// The AsyncActors of a namespace (`None`: every namespace).
pub async fn actors(
    client: &kube::Client,
    namespace: Option<&str>,
) -> Result<Vec<asya_api::types::AsyncActor>> {
    let api: Api<asya_api::types::AsyncActor> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| {
            read_error(
                e,
                "list",
                "asyncactors.asya.sh",
                "",
                namespace.unwrap_or("(all)"),
                "",
            )
        })
}
