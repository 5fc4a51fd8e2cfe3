//! KEDA's own broker identity for RabbitMQ queue depth, which no tenant holds (docs/DESIGN.md
//! §9). Per RabbitMQ transport `t`: the broker user [`naming::KEDA_MONITOR_USER`] (tag
//! `monitoring`, `^$` permissions on the vhost: statistics, no messages), the Secret
//! `asya-keda-{t}` in KEDA's namespace with the `host` URL KEDA's rabbitmq trigger reads, and
//! the ClusterTriggerAuthentication `asya-{t}` every actor's ScaledObject refers to. KEDA
//! resolves a ClusterTriggerAuthentication's secrets in its cluster object namespace
//! (`KEDA_CLUSTER_OBJECT_NAMESPACE`, by default the operator's own namespace): hence the
//! chart's `keda.namespace`.
//!
//! This module decides (pure); [`io`] talks to the management API and the API server.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use asya_api::config::{TRANSPORT_RABBITMQ, Transport};
use asya_api::naming;
use k8s_openapi::api::core::v1::Secret;
use serde_json::{Value, json};

use crate::render::{self, keda, workload};

pub mod io;

/// The Secret key holding the monitor user's password, so a restarted provisioner keeps it
/// (the broker is told the same password again) instead of rotating it on every start.
pub const SECRET_KEY_PASSWORD: &str = "password";
/// The user's tag: the management API's read-only statistics view.
pub const MONITOR_TAG: &str = "monitoring";
/// Configure, write, read: nothing (the empty name only). The vhost access itself is what
/// lets a `monitoring` user see the vhost's queue statistics.
pub const NO_RESOURCES: &str = "^$";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KedaIdentityError {
    #[error(
        "transports.{0}.config.managementPort is not set: the provisioner creates KEDA's monitor user \
         {user} through RabbitMQ's management API, so KEDA cannot read this transport's queue depth",
        user = naming::KEDA_MONITOR_USER
    )]
    NoManagementApi(String),
    #[error(
        "Secret {namespace}/{name} exists but is not labelled {label}: not ours, left alone \
         (delete it, or label it, to let the provisioner manage KEDA's credential there)",
        label = managed_by_label()
    )]
    NotOurs { namespace: String, name: String },
    #[error("generating the monitor user's password: {0}")]
    Random(String),
}

fn managed_by_label() -> String {
    format!("{}={}", workload::MANAGED_BY.0, workload::MANAGED_BY.1)
}

/// Everything to ensure for one transport.
#[derive(Clone, Debug, PartialEq)]
pub struct MonitorPlan {
    pub transport: String,
    pub vhost: String,
    /// Body of `PUT /api/users/{user}`.
    pub user: Value,
    /// Body of `PUT /api/permissions/{vhost}/{user}`.
    pub permissions: Value,
    /// In KEDA's namespace.
    pub secret: Secret,
    pub cluster_trigger_authentication: Value,
}

/// Whether the existing Secret (if any) may be written by us, and the password it keeps.
pub fn existing_password(
    secret: Option<&Secret>,
    namespace: &str,
    name: &str,
) -> Result<Option<String>, KedaIdentityError> {
    let Some(s) = secret else { return Ok(None) };
    if !crate::reconcile::ownership::managed_by_us(&s.metadata) {
        return Err(KedaIdentityError::NotOurs {
            namespace: namespace.into(),
            name: name.into(),
        });
    }
    Ok(s.data
        .as_ref()
        .and_then(|d| d.get(SECRET_KEY_PASSWORD))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .filter(|p| !p.is_empty()))
}

/// The monitor identity of transport `name`; `Ok(None)` for a transport that is not RabbitMQ
/// (SQS triggers authenticate per actor, [`keda::trigger_authentication`]).
pub fn plan(
    name: &str,
    transport: &Transport,
    keda_namespace: &str,
    password: &str,
) -> Result<Option<MonitorPlan>, KedaIdentityError> {
    if transport.kind != TRANSPORT_RABBITMQ {
        return Ok(None);
    }
    if transport.config.management_port.is_none() {
        return Err(KedaIdentityError::NoManagementApi(name.into()));
    }
    // The same URL rule as before (http(s) per TLS on the management port), as the monitor.
    let mut monitor = transport.config.clone();
    monitor.username = Some(naming::KEDA_MONITOR_USER.into());
    let host = render::keda_rabbitmq_host(&monitor, Some(password));
    let secret_name = naming::keda_secret_name(name);
    let secret = render::secret(
        secret_name.clone(),
        keda_namespace,
        BTreeMap::from([
            (keda::SECRET_KEY_HOST.to_string(), host),
            (SECRET_KEY_PASSWORD.to_string(), password.to_string()),
        ]),
    );
    let cta = json!({
        "apiVersion": keda::KEDA_API_VERSION,
        "kind": keda::CLUSTER_TRIGGER_AUTHENTICATION,
        "metadata": {
            "name": naming::cluster_trigger_authentication_name(name),
            "labels": {workload::MANAGED_BY.0: workload::MANAGED_BY.1},
        },
        "spec": {"secretTargetRef": [
            {"parameter": "host", "name": secret_name, "key": keda::SECRET_KEY_HOST}
        ]},
    });
    Ok(Some(MonitorPlan {
        transport: name.into(),
        vhost: transport.config.vhost.clone().unwrap_or_else(|| "/".into()),
        user: json!({"password": password, "tags": MONITOR_TAG}),
        permissions: json!({"configure": NO_RESOURCES, "write": NO_RESOURCES, "read": NO_RESOURCES}),
        secret,
        cluster_trigger_authentication: cta,
    }))
}

/// What the identity loop last found per transport: the reason KEDA cannot read that
/// transport's depth, for the status of its actors (absent: in place, or not tried yet).
#[derive(Clone, Debug, Default)]
pub struct IdentityState(Arc<RwLock<BTreeMap<String, String>>>);

impl IdentityState {
    pub fn record(&self, transport: &str, outcome: Result<(), String>) {
        let mut m = self.0.write().unwrap_or_else(|p| p.into_inner());
        match outcome {
            Ok(()) => m.remove(transport),
            Err(why) => m.insert(transport.to_string(), why),
        };
    }

    pub fn problem(&self, transport: &str) -> Option<String> {
        let m = self.0.read().unwrap_or_else(|p| p.into_inner());
        m.get(transport).cloned()
    }
}

/// A new password: 32 random bytes from the kernel, URL-safe base64 (no `%`-encoding needed
/// in the `host` URL).
pub fn generate_password() -> Result<String, KedaIdentityError> {
    use base64::Engine;
    use std::io::Read;
    let mut buf = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| KedaIdentityError::Random(e.to_string()))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(buf))
}

#[cfg(test)]
mod tests;
