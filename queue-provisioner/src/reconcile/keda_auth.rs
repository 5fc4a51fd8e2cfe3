//! How an actor's KEDA trigger authenticates, carried out for the objects step: for RabbitMQ
//! the transport's ClusterTriggerAuthentication (nothing in the actor's namespace; the
//! per-namespace TriggerAuthentication and `asya-transport-{t}` Secret of older releases are
//! removed once the ScaledObject refers to the cluster one); for SQS the actor's
//! TriggerAuthentication (static keys only with `shareStaticCredentials`, announced by a
//! `SharedStaticCredentials` Warning; otherwise the workload's IRSA identity, and copies of
//! the keys left from before are removed).

use asya_api::config::Transport;
use asya_api::{ResolvedActor, naming};

use crate::model::ObjectKind;
use crate::render::keda;
use crate::status::{Observed, TransportObs};

use super::memory::ObjectKey;
use super::{Cluster, Reconciler};

/// The condition reason of an SQS actor without any AWS identity: it names the two settings
/// that would give it one.
pub const NO_SQS_IDENTITY: &str = "NeitherShareStaticCredentialsNorRoleArn";

/// Records in `o` that the actor's pods cannot authenticate to SQS (the transport's condition
/// says why, naming the settings); `true` when so.
pub fn mark_sqs_identity_missing(
    o: &mut Observed,
    transport_name: &str,
    t: &Transport,
    config: &asya_api::config::ClusterConfig,
) -> bool {
    match keda::sqs_identity_missing(transport_name, t, config) {
        Some(message) => {
            o.transport = TransportObs::Failed {
                reason: NO_SQS_IDENTITY.into(),
                message,
            };
            true
        }
        None => false,
    }
}

/// What is left of the older RabbitMQ layout for this actor, deleted now that its ScaledObject
/// refers to the ClusterTriggerAuthentication: its TriggerAuthentication (the cache holds only
/// ours) and the namespace's `asya-transport-{t}` Secret (deleted only if labelled ours).
pub async fn remove_legacy_rabbitmq<C: Cluster>(
    rec: &Reconciler<C>,
    r: &ResolvedActor,
    us: super::ownership::Us<'_>,
) -> Result<(), kube::Error> {
    let c = &rec.cluster;
    let ns = &r.namespace;
    let ta = naming::trigger_authentication_name(&r.name);
    if matches!(
        c.cached(ObjectKind::TriggerAuthentication, ns, &ta),
        super::Cached::Present(_)
    ) {
        // Only the actor's own (owner uid): a same-named one of someone else's stays.
        let _ =
            super::write::delete_if_ours(c, us, ObjectKind::TriggerAuthentication, ns, &ta).await?;
        rec.memory
            .forget_applied(ObjectKind::TriggerAuthentication, ns, &ta);
    }
    let secret = naming::transport_secret_name(&r.transport);
    let key = ObjectKey::new(ObjectKind::Secret, ns, &secret);
    if !rec.memory.legacy_gone(&key) {
        c.delete_owned_secret(ns, &secret).await?;
        rec.memory.record_legacy_gone(key);
    }
    Ok(())
}

/// The copies of the platform's static SQS keys an older release (or a configuration that
/// shared them before) left in the actor's namespace, deleted when they are no longer shared:
/// `asya-transport-{t}` and the configured secret's name, each only if labelled ours, each
/// asked about once per process.
pub async fn remove_unshared_sqs_keys<C: Cluster>(
    rec: &Reconciler<C>,
    r: &ResolvedActor,
    t: &Transport,
) -> Result<(), kube::Error> {
    if !t.is_sqs() || t.shares_static_credentials() {
        return Ok(());
    }
    let ns = &r.namespace;
    let mut names = vec![naming::transport_secret_name(&r.transport)];
    // Not a secret another transport shares into the namespace under the same name.
    let shared_elsewhere = |name: &str| {
        rec.config.transports.values().any(|o| {
            o.enabled
                && o.shares_static_credentials()
                && o.config
                    .credentials_secret_ref
                    .as_ref()
                    .is_some_and(|s| s.name == name)
        })
    };
    names.extend(
        t.config
            .credentials_secret_ref
            .as_ref()
            .map(|s| s.name.clone())
            .filter(|n| !shared_elsewhere(n)),
    );
    for name in names {
        let key = ObjectKey::new(ObjectKind::Secret, ns, &name);
        if !rec.memory.legacy_gone(&key) {
            rec.cluster.delete_owned_secret(ns, &name).await?;
            rec.memory.record_legacy_gone(key);
        }
    }
    Ok(())
}
