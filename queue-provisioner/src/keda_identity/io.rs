//! The I/O edge of [`super`]: the monitor user over RabbitMQ's management API (with the
//! platform's admin identity, which only the provisioner holds), the Secret in KEDA's
//! namespace and the ClusterTriggerAuthentication, ensured at start and then periodically
//! (a broker reset forgets the user; a deleted Secret comes back).

use std::sync::Arc;
use std::time::Duration;

use asya_api::config::{ClusterConfig, TransportSettings};
use asya_api::{naming, percent};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use kube::Client;
use kube::core::ApiResource;
use tracing::{info, warn};

use super::{
    IdentityState, KedaIdentityError, MonitorPlan, existing_password, generate_password, plan,
};
use crate::kube_cluster::KubeCluster;
use crate::reconcile::ownership::Write;
use crate::reconcile::{Object, Platform, Writes};
use crate::render::management_url;
use crate::transports::Transports;

/// How often the identity is ensured again once it is in place.
pub const PERIOD: Duration = Duration::from_secs(300);
/// How soon after a failure.
pub const RETRY: Duration = Duration::from_secs(30);
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum EnsureError {
    #[error(transparent)]
    Plan(#[from] KedaIdentityError),
    #[error("RabbitMQ management API: {0}")]
    Broker(String),
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("transport: {0}")]
    Transport(#[from] crate::queue::QueueError),
}

pub fn cluster_trigger_auth_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk(
            "keda.sh",
            "v1alpha1",
            super::keda::CLUSTER_TRIGGER_AUTHENTICATION,
        ),
        "clustertriggerauthentications",
    )
}

type Http = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
>;

/// `PUT {base}{path}` with a JSON body and the admin's basic authorization.
async fn put(
    client: &Http,
    base: &str,
    auth: &str,
    path: &str,
    body: &serde_json::Value,
) -> Result<(), String> {
    let uri = format!("{}{path}", base.trim_end_matches('/'));
    let req = hyper::Request::put(&uri)
        .header(hyper::header::AUTHORIZATION, auth)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(HTTP_TIMEOUT, client.request(req))
        .await
        .map_err(|_| format!("PUT {path}: no answer in {}s", HTTP_TIMEOUT.as_secs()))?
        .map_err(|e| format!("PUT {path}: {e}"))?;
    let status = resp.status();
    if status.is_success() {
        return Ok(());
    }
    let text = resp
        .into_body()
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .unwrap_or_default();
    Err(format!("PUT {path}: {status}: {text}"))
}

/// The user (tag `monitoring`, the plan's password) and its `^$` permissions on the vhost.
async fn ensure_user(
    c: &TransportSettings,
    admin_password: &str,
    p: &MonitorPlan,
) -> Result<(), EnsureError> {
    use base64::Engine;
    let base =
        management_url(c).ok_or_else(|| KedaIdentityError::NoManagementApi(p.transport.clone()))?;
    let admin = c.username.as_deref().unwrap_or("guest");
    let auth = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{admin}:{admin_password}"))
    );
    let client = asya_transport::http_client::client::<Full<Bytes>>()
        .map_err(|e| EnsureError::Broker(e.to_string()))?;
    let user = percent::encode(naming::KEDA_MONITOR_USER);
    put(
        &client,
        &base,
        &auth,
        &format!("/api/users/{user}"),
        &p.user,
    )
    .await
    .map_err(EnsureError::Broker)?;
    let vhost = percent::encode(&p.vhost);
    put(
        &client,
        &base,
        &auth,
        &format!("/api/permissions/{vhost}/{user}"),
        &p.permissions,
    )
    .await
    .map_err(EnsureError::Broker)
}

/// Ensures transport `name`'s monitor identity through the ports; the Secret first read to
/// keep its password, then written only as the object read (created when there was none).
pub async fn ensure<C: Writes + Platform>(
    c: &C,
    config: &ClusterConfig,
    transports: &Transports,
    keda_namespace: &str,
    name: &str,
) -> Result<(), EnsureError> {
    let Some(t) = config.transport(name) else {
        return Ok(());
    };
    if !t.is_rabbitmq() {
        return Ok(());
    }
    let secret_name = naming::keda_secret_name(name);
    let current = c.read_secret(keda_namespace, &secret_name).await?;
    let password = match existing_password(current.as_ref(), keda_namespace, &secret_name)? {
        Some(p) => p,
        None => generate_password()?,
    };
    let Some(p) = plan(name, t, keda_namespace, &password)? else {
        return Ok(());
    };
    let (_, creds) = transports.get(name).await?;
    // The broker first: the Secret never names a password the broker does not know.
    ensure_user(&t.config, creds.password.as_deref().unwrap_or_default(), &p).await?;
    let write = match &current {
        None => Write::Create,
        Some(s) => Write::Update {
            uid: s.metadata.uid.clone(),
        },
    };
    c.apply(keda_namespace, &Object::Secret(p.secret), &write)
        .await?;
    c.cluster_trigger_authentication_apply(&p.cluster_trigger_authentication)
        .await?;
    Ok(())
}

/// Ensures every enabled RabbitMQ transport's monitor identity, now and every [`PERIOD`]
/// ([`RETRY`] after a failure, which is logged with what to fix).
pub async fn run(
    client: Client,
    config: Arc<ClusterConfig>,
    transports: Arc<Transports>,
    keda_namespace: String,
    state: IdentityState,
) {
    let names: Vec<String> = config
        .enabled_transports()
        .into_iter()
        .filter(|n| config.transport(n).is_some_and(|t| t.is_rabbitmq()))
        .map(String::from)
        .collect();
    if names.is_empty() {
        return;
    }
    let own_namespace = transports.namespace().to_string();
    let c = KubeCluster::api_only(client, transports.clone(), &own_namespace);
    let mut ok_before = vec![false; names.len()];
    loop {
        let mut all_ok = true;
        for (i, name) in names.iter().enumerate() {
            let outcome = ensure(&c, &config, &transports, &keda_namespace, name).await;
            state.record(
                name,
                outcome.as_ref().map(|_| ()).map_err(|e| e.to_string()),
            );
            match outcome {
                Ok(()) => {
                    if !ok_before[i] {
                        info!(transport = %name, namespace = %keda_namespace, user = naming::KEDA_MONITOR_USER,
                              "KEDA's monitor identity is in place (ClusterTriggerAuthentication {})",
                              naming::cluster_trigger_authentication_name(name));
                    }
                    ok_before[i] = true;
                }
                Err(e) => {
                    all_ok = false;
                    ok_before[i] = false;
                    warn!(transport = %name, namespace = %keda_namespace, error = %e,
                          "KEDA's monitor identity could not be ensured: KEDA cannot read this transport's queue depth until it is");
                }
            }
        }
        tokio::time::sleep(if all_ok { PERIOD } else { RETRY }).await;
    }
}
