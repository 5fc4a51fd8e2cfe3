//! Names of queues and of the objects owned by an actor (docs/DESIGN.md §4, §6). One rule for every
//! component, so the sidecar publishes where the provisioner created.

/// The pseudo-actor that receives finished envelopes.
pub const SINK_ACTOR: &str = "x-sink";
/// The pseudo-actor that receives failed envelopes.
pub const SUMP_ACTOR: &str = "x-sump";
/// The durable RabbitMQ exchange every actor queue is bound to.
pub const RABBITMQ_EXCHANGE: &str = "asya";
/// Prefix of a namespace's own exchange, [`tenant_exchange`].
pub const TENANT_EXCHANGE_PREFIX: &str = "asya.";
/// SQS's own limit on queue names.
pub const SQS_QUEUE_NAME_MAX: usize = 80;
/// RabbitMQ's limit on queue names (bytes).
pub const RABBITMQ_QUEUE_NAME_MAX: usize = 255;

/// Queue of actor `actor` in namespace `namespace`: `asya-{namespace}-{actor}`.
pub fn actor_queue(namespace: &str, actor: &str) -> String {
    format!("asya-{namespace}-{actor}")
}

/// The namespace's end queue for finished envelopes.
pub fn sink_queue(namespace: &str) -> String {
    actor_queue(namespace, SINK_ACTOR)
}

/// The namespace's end queue for failed envelopes.
pub fn sump_queue(namespace: &str) -> String {
    actor_queue(namespace, SUMP_ACTOR)
}

/// Whether `actor` is one of the namespace's end pseudo-actors.
pub fn is_end_actor(actor: &str) -> bool {
    actor == SINK_ACTOR || actor == SUMP_ACTOR
}

/// Owned objects (Deployment/StatefulSet, ScaledObject, TriggerAuthentication) share the
/// actor object's name, as the seeds' `kubectl get scaledobject my-actor` expects.
pub fn workload_name(object_name: &str) -> String {
    object_name.to_string()
}

pub fn scaled_object_name(object_name: &str) -> String {
    object_name.to_string()
}

pub fn trigger_authentication_name(object_name: &str) -> String {
    format!("{object_name}-trigger-auth")
}

/// The actor's ServiceAccount (`asya-{actor}`, as seed 001's pod-identity example names it).
pub fn service_account_name(object_name: &str) -> String {
    format!("asya-{object_name}")
}

/// Where the transport credentials the sidecar and KEDA need are copied in the actor's namespace.
pub fn transport_secret_name(transport: &str) -> String {
    format!("asya-transport-{transport}")
}

/// The broker user KEDA reads RabbitMQ queue depth with: tag `monitoring`, `^$` permissions
/// on the vhost (statistics, no messages). Held in KEDA's namespace only, never by a tenant.
pub const KEDA_MONITOR_USER: &str = "asya-keda-monitor";

/// The ClusterTriggerAuthentication KEDA's triggers of a RabbitMQ transport refer to.
pub fn cluster_trigger_authentication_name(transport: &str) -> String {
    format!("asya-{transport}")
}

/// The Secret in KEDA's namespace behind [`cluster_trigger_authentication_name`].
pub fn keda_secret_name(transport: &str) -> String {
    format!("asya-keda-{transport}")
}

/// The direct exchange of namespace `ns`'s tenant traffic: `asya.{ns}` (docs/DESIGN.md §9).
/// Dots never occur in queue names, so it cannot be mistaken for a queue in a permission.
pub fn tenant_exchange(ns: &str) -> String {
    format!("{TENANT_EXCHANGE_PREFIX}{ns}")
}

/// The broker user of namespace `ns`'s sidecars: `asya-ns-{ns}`.
pub fn tenant_broker_user(ns: &str) -> String {
    format!("asya-ns-{ns}")
}

/// The Secret in an actor namespace holding its broker identity (`username`, `password`).
pub fn tenant_broker_secret(transport: &str) -> String {
    format!("asya-broker-{transport}")
}

/// Keys of [`tenant_broker_secret`].
pub const BROKER_SECRET_USERNAME: &str = "username";
pub const BROKER_SECRET_PASSWORD: &str = "password";

/// Every `(namespace, actor)` whose queue name is `asya-{joined}`: each split of `joined` at
/// a '-' whose left side is a valid namespace name (a DNS label) and whose right side starts
/// with a letter or digit. The admission collision check and the provisioner's adoption rule
/// read a queue name the same way.
pub fn splits(joined: &str) -> Vec<(&str, &str)> {
    joined
        .match_indices('-')
        .map(|(i, _)| (&joined[..i], &joined[i + 1..]))
        .filter(|(ns, actor)| {
            crate::basics::is_dns_label(ns)
                && actor
                    .bytes()
                    .next()
                    .is_some_and(|b| b.is_ascii_alphanumeric())
        })
        .collect()
}

/// Every `(namespace, actor)` a queue name `asya-…` can be the queue of ([`splits`]).
pub fn readings(queue: &str) -> Vec<(&str, &str)> {
    queue.strip_prefix("asya-").map(splits).unwrap_or_default()
}

/// Characters SQS allows in a queue name.
pub fn is_sqs_queue_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= SQS_QUEUE_NAME_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_follow_design() {
        assert_eq!(
            actor_queue("prod", "text-analyzer"),
            "asya-prod-text-analyzer"
        );
        assert_eq!(sink_queue("dev"), "asya-dev-x-sink");
        assert_eq!(sump_queue("dev"), "asya-dev-x-sump");
        assert!(is_end_actor("x-sink") && is_end_actor("x-sump") && !is_end_actor("x"));
    }

    #[test]
    fn tenant_identity_names_follow_the_contract() {
        assert_eq!(tenant_exchange("team-a"), "asya.team-a");
        assert_eq!(tenant_broker_user("team-a"), "asya-ns-team-a");
        assert_eq!(tenant_broker_secret("rabbitmq"), "asya-broker-rabbitmq");
        // Never a queue name: actor queues carry no dot.
        assert!(!actor_queue("team", "a").contains('.'));
    }

    #[test]
    fn a_queue_name_reads_as_every_namespace_actor_split() {
        assert_eq!(
            readings("asya-team-a-x-sink"),
            vec![
                ("team", "a-x-sink"),
                ("team-a", "x-sink"),
                ("team-a-x", "sink")
            ]
        );
        assert!(readings("other-a-b").is_empty());
    }

    #[test]
    fn sqs_names() {
        assert!(is_sqs_queue_name("asya-prod-a_b"));
        assert!(!is_sqs_queue_name("asya.prod"));
        assert!(!is_sqs_queue_name(&"a".repeat(81)));
        assert!(is_sqs_queue_name(&"a".repeat(80)));
    }
}
