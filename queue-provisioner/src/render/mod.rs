//! Pure rendering of everything the provisioner applies for one actor. No I/O: the controller
//! brings the resolved actor, the cluster configuration and the credentials it read.

use std::collections::BTreeMap;

use asya_api::ResolvedActor;
use asya_api::amqp;
use asya_api::config::{ClusterConfig, TRANSPORT_RABBITMQ, Transport, TransportSettings};
use asya_api::naming;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

pub mod keda;
pub mod workload;

/// The secrets the transport needs, read from the provisioner's own namespace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TransportCredentials {
    /// RabbitMQ password (`passwordSecretRef`).
    pub password: Option<String>,
    /// SQS static keys (`credentialsSecretRef`).
    pub aws: Option<(String, String)>,
}

pub fn service_account(
    actor: &ResolvedActor,
    actor_labels: &BTreeMap<String, String>,
    owner: &OwnerReference,
    config: &ClusterConfig,
) -> ServiceAccount {
    let annotations = keda::irsa_role(actor, config)
        .map(|arn| BTreeMap::from([("eks.amazonaws.com/role-arn".to_string(), arn)]));
    ServiceAccount {
        metadata: ObjectMeta {
            name: Some(naming::service_account_name(&actor.name)),
            namespace: Some(actor.namespace.clone()),
            labels: Some(workload::owned_labels(actor, actor_labels)),
            annotations,
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The management API's scheme: HTTPS when AMQP uses TLS.
fn management_scheme(c: &TransportSettings) -> &'static str {
    if c.rabbitmq_tls() { "https" } else { "http" }
}

/// The management API's base URL when `managementPort` is configured (HTTPS when AMQP uses TLS).
pub fn management_url(c: &TransportSettings) -> Option<String> {
    let port = c.management_port?;
    Some(format!(
        "{}://{}:{port}",
        management_scheme(c),
        amqp::host(c)
    ))
}

/// The AMQP URL of a RabbitMQ transport: the shared builder, as the webhook renders it for
/// the sidecar but with the password itself.
pub fn amqp_url(c: &TransportSettings, password: Option<&str>) -> String {
    amqp::url(c, password.into())
}

/// How KEDA reads a RabbitMQ queue's depth. Over the management API when one is configured:
/// its count includes unacknowledged messages, and a sidecar holds up to its prefetch
/// unacknowledged, so counting only ready ones (all AMQP can) makes a busy actor look idle:
/// never scaled out, and scaled in mid-work. Over AMQP otherwise.
pub fn keda_rabbitmq_protocol(c: &TransportSettings) -> &'static str {
    if c.management_port.is_some() {
        "http"
    } else {
        "amqp"
    }
}

/// The `host` KEDA's rabbitmq trigger reads the queue at, for [`keda_rabbitmq_protocol`].
pub fn keda_rabbitmq_host(c: &TransportSettings, password: Option<&str>) -> String {
    match c.management_port {
        Some(port) => amqp::url_at(management_scheme(c), port, c, password.into()),
        None => amqp_url(c, password),
    }
}

pub(crate) fn secret(name: String, namespace: &str, data: BTreeMap<String, String>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                workload::MANAGED_BY.0.to_string(),
                workload::MANAGED_BY.1.to_string(),
            )])),
            ..Default::default()
        },
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k, ByteString(v.into_bytes())))
                .collect(),
        ),
        ..Default::default()
    }
}

/// Secrets in the actor's namespace, shared by its actors (so not owned by any one of them).
/// RabbitMQ: with `shareAdminCredentials` only, the configured credential secret under its
/// own name (the webhook then points the sidecar's env at it); otherwise none here (the
/// namespace's own identity is [`crate::reconcile::identity`]'s), and KEDA's credential never
/// (it reads through the transport's ClusterTriggerAuthentication, [`crate::keda_identity`]).
/// SQS: see [`sqs_secrets`].
pub fn transport_secrets(
    namespace: &str,
    transport_name: &str,
    transport: &Transport,
    creds: &TransportCredentials,
) -> Vec<Secret> {
    let c = &transport.config;
    let mut out = Vec::new();
    if transport.kind == TRANSPORT_RABBITMQ {
        if let (Some(r), Some(p)) = (&c.password_secret_ref, &creds.password) {
            // The platform's password reaches a namespace only by the explicit opt-in; the
            // sidecars otherwise use the namespace's own identity (reconcile::identity).
            if transport.shares_admin_credentials() {
                out.push(secret(
                    r.name.clone(),
                    namespace,
                    BTreeMap::from([(r.key.clone(), p.clone())]),
                ));
            }
        }
    } else {
        out.extend(sqs_secrets(namespace, transport_name, transport, creds));
    }
    out
}

/// The platform's static SQS keys, copied into the actor's namespace only with
/// `shareStaticCredentials: true` (announced on each actor by a `SharedStaticCredentials`
/// Warning): under the configured secret's name for the sidecar, and as
/// `asya-transport-{name}` for KEDA's trigger. Otherwise none: actors use IRSA.
pub fn sqs_secrets(
    namespace: &str,
    transport_name: &str,
    transport: &Transport,
    creds: &TransportCredentials,
) -> Vec<Secret> {
    let c = &transport.config;
    let (Some(r), Some((id, key)), true) = (
        &c.credentials_secret_ref,
        &creds.aws,
        transport.shares_static_credentials(),
    ) else {
        return Vec::new();
    };
    vec![
        secret(
            r.name.clone(),
            namespace,
            BTreeMap::from([
                (r.access_key_id_key.clone(), id.clone()),
                (r.secret_access_key_key.clone(), key.clone()),
            ]),
        ),
        secret(
            naming::transport_secret_name(transport_name),
            namespace,
            BTreeMap::from([
                (keda::SECRET_KEY_AWS_ACCESS.to_string(), id.clone()),
                (keda::SECRET_KEY_AWS_SECRET.to_string(), key.clone()),
            ]),
        ),
    ]
}

#[cfg(test)]
mod tests;
