//! The cleanup of a deleted actor, before its finalizer goes: status `Terminating`, the queue
//! and its retry delay queues, the objects it owns, what this process remembered of them.

use asya_api::{AsyncActor, naming};
use kube::ResourceExt;
use tracing::info;

use crate::model::ObjectKind;
use crate::status::{self, TransportObs};

use super::actor::{now, write_status};
use super::memory::QueueKey;
use super::plan::{self, EventSpec, Next, Reason};
use super::{Cluster, Error, Reconciler};

/// What the actor owns, by kind and name; deleted now rather than by the garbage collector,
/// which frees the names at once for an actor recreated under the same name.
fn owned(name: &str, keda: bool) -> Vec<(ObjectKind, String)> {
    let mut v = vec![
        (ObjectKind::Deployment, naming::workload_name(name)),
        (ObjectKind::StatefulSet, naming::workload_name(name)),
    ];
    if keda {
        v.push((ObjectKind::ScaledObject, naming::scaled_object_name(name)));
        v.push((
            ObjectKind::TriggerAuthentication,
            naming::trigger_authentication_name(name),
        ));
    }
    v
}

pub async fn run<C: Cluster>(rec: &Reconciler<C>, actor: &AsyncActor) -> Result<Next, Error> {
    let c = &rec.cluster;
    let ns = actor.namespace().ok_or(Error::NoNamespace)?;
    let name = actor.name_any();
    let mut o = plan::base_observed(actor);
    o.transport = TransportObs::NotAttempted;
    let prev = actor.status.clone().unwrap_or_default();
    let _ = write_status(c, actor, status::derive(&prev, &o, now())).await;
    // The queue lives on the transport the actor was admitted with; resolve without flavors
    // (actor and transport cannot come from a flavor).
    let actor_name = actor.spec.actor.clone().unwrap_or_else(|| name.clone());
    let transport = actor
        .spec
        .transport
        .clone()
        .unwrap_or_else(|| rec.config.default_transport.clone());
    let queue = naming::actor_queue(&ns, &actor_name);
    let mut delay_queues = Vec::new();
    if rec
        .config
        .transports
        .get(&transport)
        .is_some_and(|t| t.enabled)
    {
        c.transport(&transport).await?;
        // Checked again by the next reconcile: the sweep may delete the end queues.
        for q in [
            queue.clone(),
            naming::sink_queue(&ns),
            naming::sump_queue(&ns),
        ] {
            rec.memory.forget_queue(&QueueKey::new(&transport, &q));
        }
        // The namespace's end queues go with the namespace, once it is gone.
        c.end_queues_candidate(&transport, &ns);
        // The retry policies (flavors included, when they still resolve) name the delay queues.
        let resolved = asya_api::review::review_typed(actor, &c.catalog(), &rec.config).resolved;
        let resiliency = match &resolved {
            Some(r) => r.spec.resiliency.as_ref(),
            None => actor.spec.resiliency.as_ref(),
        };
        match c.queue_delete(&transport, &queue, resiliency).await {
            Ok(extra) => delay_queues = extra,
            Err(e) => {
                let note = format!("deleting queue {queue}: {e}; retrying");
                c.event(actor, EventSpec::warning(Reason::QueueDeleteFailed, note))
                    .await;
                return Err(e.into());
            }
        }
    }
    let keda = c.keda_installed();
    for (kind, n) in owned(&name, keda) {
        c.delete(kind, &ns, &n).await?;
    }
    for (kind, n) in owned(&name, true) {
        rec.memory.forget_applied(kind, &ns, &n);
    }
    rec.memory.forget_applied(
        ObjectKind::ServiceAccount,
        &ns,
        &naming::service_account_name(&name),
    );
    // The namespace's transport Secrets are not watched: an actor deleted with its namespace
    // must not leave them counted as applied, or a namespace recreated under the same name
    // within the reassert interval gets actors without credentials. One extra apply for the
    // namespace's other actors, if any.
    rec.memory.forget_kind_in(ObjectKind::Secret, &ns);
    c.event(actor, plan::queue_deleted_event(&queue, &delay_queues))
        .await;
    info!(namespace = %ns, name = %name, queue = %queue, "actor cleaned up");
    Ok(Next::AwaitChange)
}
