//! KEDA `ScaledObject` and `TriggerAuthentication` (keda.sh/v1alpha1) for an actor, as JSON
//! for server-side apply (no KEDA crate types: the CRD schema in the cluster is the judge).

use std::collections::BTreeMap;

use asya_api::ResolvedActor;
use asya_api::config::{ClusterConfig, TRANSPORT_RABBITMQ, Transport};
use asya_api::naming;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::{Value, json};

use super::workload::owned_labels;

pub const KEDA_API_VERSION: &str = "keda.sh/v1alpha1";
pub const CLUSTER_TRIGGER_AUTHENTICATION: &str = "ClusterTriggerAuthentication";
/// Key of the AMQP URL (with password) in the transport secret, as KEDA's rabbitmq `host`.
pub const SECRET_KEY_HOST: &str = "host";
pub const SECRET_KEY_AWS_ACCESS: &str = "awsAccessKeyID";
pub const SECRET_KEY_AWS_SECRET: &str = "awsSecretAccessKey";

/// Scale up fast (double or +4 pods every 15 s, no stabilisation), scale down gradually
/// (half every minute, after 5 minutes of lower demand).
pub fn behavior() -> Value {
    json!({
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "selectPolicy": "Max",
            "policies": [
                {"type": "Percent", "value": 100, "periodSeconds": 15},
                {"type": "Pods", "value": 4, "periodSeconds": 15}
            ]
        },
        "scaleDown": {
            "stabilizationWindowSeconds": 300,
            "selectPolicy": "Min",
            "policies": [{"type": "Percent", "value": 50, "periodSeconds": 60}]
        }
    })
}

/// The trigger's `authenticationRef`. RabbitMQ: the transport's ClusterTriggerAuthentication
/// (its Secret, with the monitor user's URL, lives in KEDA's namespace: no tenant holds it,
/// see [`crate::keda_identity`]). SQS: the actor's own TriggerAuthentication.
pub fn authentication_ref(actor: &ResolvedActor, transport: &Transport) -> Value {
    if transport.kind == TRANSPORT_RABBITMQ {
        json!({
            "name": naming::cluster_trigger_authentication_name(&actor.transport),
            "kind": CLUSTER_TRIGGER_AUTHENTICATION,
        })
    } else {
        json!({"name": naming::trigger_authentication_name(&actor.name)})
    }
}

/// The target per replica of a wake trigger (docs/DESIGN.md §6.1): far above any depth, so
/// the HPA never scales out on it (the envelope queue's trigger does); with activation at 0
/// one wake message activates the actor at KEDA's next poll.
pub const WAKE_TARGET: &str = "1000000";

/// One queue's trigger: `target` messages per replica, activating above `activation`
/// (`None`: KEDA's default, 0).
fn queue_trigger(
    actor: &ResolvedActor,
    transport: &Transport,
    (queue, queue_url): (&str, Option<&str>),
    target: &str,
    activation: Option<&str>,
) -> Value {
    let auth = authentication_ref(actor, transport);
    if transport.kind == TRANSPORT_RABBITMQ {
        // The protocol of the `host` the monitor Secret holds (super::keda_rabbitmq_host).
        let protocol = super::keda_rabbitmq_protocol(&transport.config);
        let mut md = json!({"protocol": protocol, "queueName": queue, "mode": "QueueLength", "value": target});
        if let Some(a) = activation {
            md["activationValue"] = json!(a);
        }
        json!({"type": "rabbitmq", "metadata": md, "authenticationRef": auth})
    } else {
        let c = &transport.config;
        let mut md = json!({
            "queueURL": queue_url.unwrap_or_default(),
            "queueLength": target,
            "awsRegion": c.region.clone().unwrap_or_default(),
        });
        if let Some(ep) = &c.endpoint {
            md["awsEndpoint"] = json!(ep);
        }
        if let Some(a) = activation {
            md["activationQueueLength"] = json!(a);
        }
        // Count in-flight messages too: a busy actor must not scale in mid-work.
        md["scaleOnInFlight"] = json!("true");
        json!({"type": "aws-sqs-queue", "metadata": md, "authenticationRef": auth})
    }
}

/// The URL of the queue `name` beside the queue at `url` (same account and endpoint: an SQS
/// URL ends with the queue's name). `None` when `url` does not end with `queue`.
pub fn sibling_queue_url(url: &str, queue: &str, name: &str) -> Option<String> {
    let base = url.strip_suffix(queue)?;
    base.ends_with('/').then(|| format!("{base}{name}"))
}

/// The actor's triggers: its queue's, and with `wake` the wake queue's
/// (docs/DESIGN.md §6.1), read with the same identity.
fn triggers(
    actor: &ResolvedActor,
    transport: &Transport,
    queue_url: Option<&str>,
    wake: bool,
) -> Vec<Value> {
    let s = actor.scaling();
    let queue_length = s.queue_length.unwrap_or(5).to_string();
    let own = (actor.queue.as_str(), queue_url);
    let mut out = vec![queue_trigger(actor, transport, own, &queue_length, None)];
    let Some(wake_queue) = wake
        .then(|| asya_api::wake::wake_queue_of(&actor.queue))
        .flatten()
    else {
        return out;
    };
    let wake_url = match queue_url {
        Some(u) => sibling_queue_url(u, &actor.queue, &wake_queue),
        None => None,
    };
    if transport.kind != TRANSPORT_RABBITMQ && wake_url.is_none() {
        return out;
    }
    let q = (wake_queue.as_str(), wake_url.as_deref());
    out.push(queue_trigger(actor, transport, q, WAKE_TARGET, Some("0")));
    out
}

/// `wake`: route-aware wake-up is on (the cluster configuration's `wake.enabled`).
pub fn scaled_object(
    actor: &ResolvedActor,
    actor_labels: &BTreeMap<String, String>,
    owner: &OwnerReference,
    transport: &Transport,
    queue_url: Option<&str>,
    wake: bool,
) -> Value {
    let s = actor.scaling();
    json!({
        "apiVersion": KEDA_API_VERSION,
        "kind": "ScaledObject",
        "metadata": {
            "name": naming::scaled_object_name(&actor.name),
            "namespace": actor.namespace,
            "labels": owned_labels(actor, actor_labels),
            "ownerReferences": [owner],
        },
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": actor.workload_kind(), "name": naming::workload_name(&actor.name)},
            "minReplicaCount": s.min_replica_count.unwrap_or(0),
            "maxReplicaCount": s.max_replica_count.unwrap_or(10),
            "pollingInterval": s.polling_interval.unwrap_or(30),
            "cooldownPeriod": s.cooldown_period.unwrap_or(300),
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": behavior()}},
            "triggers": triggers(actor, transport, queue_url, wake),
        }
    })
}

/// The actor's TriggerAuthentication, for SQS only (RabbitMQ's triggers use the transport's
/// ClusterTriggerAuthentication, [`authentication_ref`]). The platform's static keys only
/// with `shareStaticCredentials`; otherwise KEDA assumes the workload's own IRSA role
/// (`identityOwner: workload`), so that it reads the queue with the actor's scoped identity.
pub fn trigger_authentication(
    actor: &ResolvedActor,
    actor_labels: &BTreeMap<String, String>,
    owner: &OwnerReference,
    transport: &Transport,
) -> Option<Value> {
    if transport.kind == TRANSPORT_RABBITMQ {
        return None;
    }
    let secret = naming::transport_secret_name(&actor.transport);
    let spec = if transport.shares_static_credentials() {
        json!({"secretTargetRef": [
            {"parameter": "awsAccessKeyID", "name": secret, "key": SECRET_KEY_AWS_ACCESS},
            {"parameter": "awsSecretAccessKey", "name": secret, "key": SECRET_KEY_AWS_SECRET}
        ]})
    } else {
        json!({"podIdentity": {"provider": "aws", "identityOwner": "workload"}})
    };
    Some(json!({
        "apiVersion": KEDA_API_VERSION,
        "kind": "TriggerAuthentication",
        "metadata": {
            "name": naming::trigger_authentication_name(&actor.name),
            "namespace": actor.namespace,
            "labels": owned_labels(actor, actor_labels),
            "ownerReferences": [owner],
        },
        "spec": spec,
    }))
}

/// Why actors on an SQS transport cannot authenticate at all: the platform's keys are not
/// shared and no IRSA role pattern gives their ServiceAccounts an identity. `None` when they
/// can (or the transport is not SQS).
pub fn sqs_identity_missing(
    transport_name: &str,
    transport: &Transport,
    config: &ClusterConfig,
) -> Option<String> {
    if !transport.is_sqs()
        || transport.shares_static_credentials()
        || config.service_account.actor_role_arn.is_some()
    {
        return None;
    }
    Some(format!(
        "actors on sqs transport {transport_name} have no AWS identity: set \
         transports.{transport_name}.config.shareStaticCredentials: true (copies the platform's \
         static keys into the namespace) or actorServiceAccount.roleArn (an IRSA role per actor)"
    ))
}

/// The IRSA role of the actor's ServiceAccount, with `{namespace}` and `{actor}` filled in.
pub fn irsa_role(actor: &ResolvedActor, config: &ClusterConfig) -> Option<String> {
    config.service_account.actor_role_arn.as_ref().map(|r| {
        r.replace("{namespace}", &actor.namespace)
            .replace("{actor}", &actor.actor)
    })
}
