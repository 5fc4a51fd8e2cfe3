//! The cleanup of a deleted actor, then the removal of its finalizer: status `Terminating`,
//! the queue and its retry delay queues, the objects it owns, what this process remembered
//! of them. It always ends: `asya.sh/skip-cleanup: "true"` releases the actor at once, and a
//! broker that stays unreachable is given up on after [`plan::CLEANUP_GIVE_UP_AFTER`], with a
//! Warning event and a condition naming the queue left behind (docs/DESIGN.md §9).

use std::time::Duration;

use asya_api::{AsyncActor, naming};
use kube::ResourceExt;
use tracing::{info, warn};

use crate::model::ObjectKind;
use crate::queue::QueueError;
use crate::queue::owner::{self, Claimant};
use crate::status::{self, TransportObs};

use super::memory::QueueKey;
use super::ownership::Us;
use super::plan::{self, AfterQueue, Next, QueueDeletion};
use super::write::{now, write_status};
use super::{Cluster, Error, Reconciler, actor_key, identity};

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

/// The actor's queue: on the transport it was admitted with, resolved without flavors
/// (actor and transport cannot come from a flavor, and the flavors may not resolve now).
struct Target {
    ns: String,
    name: String,
    transport: String,
    queue: String,
    /// Who the queue must be recorded as before it is deleted.
    who: Claimant,
}

impl Target {
    fn of<C>(rec: &Reconciler<C>, actor: &AsyncActor) -> Result<Self, Error> {
        let ns = actor.namespace().ok_or(Error::NoNamespace)?;
        let name = actor.name_any();
        let actor_name = actor.spec.actor_or(&name);
        let transport = actor.spec.transport_or(&rec.config.default_transport);
        let queue = naming::actor_queue(&ns, &actor_name);
        let adopt = owner::adopt_annotation(actor.metadata.annotations.as_ref());
        Ok(Target {
            who: Claimant::new(&ns, &actor_name, adopt),
            ns,
            name,
            transport,
            queue,
        })
    }
}

/// Cleans up (or skips, or gives up), then removes the finalizer; or keeps it and says when
/// to try again.
pub async fn run<C: Cluster>(rec: &Reconciler<C>, actor: &AsyncActor) -> Result<Next, Error> {
    let c = &rec.cluster;
    let t = Target::of(rec, actor)?;
    if plan::skip_cleanup(actor) {
        forget(rec, &t);
        super::gateway_report::release(rec, actor, &t.ns).await;
        c.event(
            actor,
            plan::cleanup_skipped_event(&t.name, &t.queue, &t.transport),
        )
        .await;
        c.remove_finalizer(actor).await?;
        info!(namespace = %t.ns, name = %t.name, queue = %t.queue, "actor released without cleanup");
        return Ok(Next::AwaitChange);
    }

    let mut o = plan::base_observed(actor);
    o.transport = TransportObs::NotAttempted;
    let prev = actor.status.clone().unwrap_or_default();
    let terminating = status::derive(&prev, &o, now());
    let _ = write_status(c, actor, terminating.clone(), vec![]).await;

    let res = delete_queue(rec, actor, &t).await;
    let (error, backoff) = match &res {
        Err(QueueError::NotOurs(e)) => {
            warn!(namespace = %t.ns, name = %t.name, queue = %t.queue, error = %e, "queue not deleted: not this actor's");
            (e.to_string(), Duration::ZERO)
        }
        Err(e) => (e.to_string(), rec.memory.backoff(&actor_key(actor), true)),
        Ok(_) => (String::new(), Duration::ZERO),
    };
    let deletion = match &res {
        Ok(delay_queues) => QueueDeletion::Deleted(delay_queues),
        Err(QueueError::NotOurs(_)) => QueueDeletion::NotOurs(&error),
        Err(_) => QueueDeletion::Failed {
            error: &error,
            backoff,
        },
    };
    let since = plan::since_deletion(actor, &now());
    let step = plan::after_queue(
        deletion,
        &t.name,
        &t.queue,
        &t.transport,
        since,
        actor.metadata.generation,
        now(),
    );
    let closing = match step {
        AfterQueue::Retry { wait, event } => {
            c.event(actor, event).await;
            return Ok(Next::After(wait));
        }
        AfterQueue::Release { condition, closing } => {
            if let Some(condition) = condition {
                if matches!(deletion, QueueDeletion::Failed { .. }) {
                    warn!(namespace = %t.ns, name = %t.name, queue = %t.queue, error = %error, "cleanup gave up on the queue");
                }
                // The last status the actor shows, for whoever watches it go; written as it
                // is (the phase, Terminating, was announced above).
                let mut st = terminating;
                st.conditions.push(condition);
                let _ = c.patch_status(actor, &st).await;
            }
            closing
        }
    };

    // Only what is the actor's (docs/DESIGN.md §9): an object of another holder with one of
    // these names stays, and an event says so.
    let keda = c.keda_installed();
    let uid = actor.uid().unwrap_or_default();
    let us = Us {
        uid: &uid,
        name: &t.name,
    };
    for (kind, n) in owned(&t.name, keda) {
        if let Err(kept) = super::write::delete_if_ours(c, us, kind, &t.ns, &n).await? {
            c.event(actor, plan::not_ours_event(&kept)).await;
        }
    }
    // The namespace's gateway report token goes with its last actor.
    super::gateway_report::release(rec, actor, &t.ns).await;
    // The namespace's broker identity goes with its last actor.
    identity::release(rec, &t.ns, &t.transport, actor).await;
    // And its Redis user (state proxies); the state itself stays the namespace's.
    super::state_identity::release(rec, &t.ns, actor).await;
    let actor_name = actor.spec.actor_or(&t.name);
    rec.gauges.remove(&t.ns, &actor_name);
    forget(rec, &t);
    c.event(actor, closing).await;
    c.remove_finalizer(actor).await?;
    info!(namespace = %t.ns, name = %t.name, queue = %t.queue, "actor cleaned up");
    Ok(Next::AwaitChange)
}

/// Deletes the queue and its retry delay queues (named by the retry policies: the resolved
/// ones while the flavors still resolve, else the actor's own, so that a flavor edited into
/// a conflict cannot stop the cleanup); returns the delay queues deleted.
async fn delete_queue<C: Cluster>(
    rec: &Reconciler<C>,
    actor: &AsyncActor,
    t: &Target,
) -> Result<Vec<String>, QueueError> {
    let c = &rec.cluster;
    if !rec
        .config
        .transports
        .get(&t.transport)
        .is_some_and(|tr| tr.enabled)
    {
        return Ok(vec![]);
    }
    c.transport(&t.transport).await?;
    // The namespace's end queues go with the namespace, once it is gone.
    c.end_queues_candidate(&t.transport, &t.ns);
    let resolved = asya_api::review::review_typed(actor, &c.catalog(), &rec.config).resolved;
    let resiliency = match &resolved {
        Some(r) => r.spec.resiliency.as_ref(),
        None => actor.spec.resiliency.as_ref(),
    };
    super::claims::delete_actor_queue(rec, &t.transport, &t.queue, resiliency, &t.who).await
}

/// Forgets what this process remembered of the actor's queues and objects.
fn forget<C>(rec: &Reconciler<C>, t: &Target) {
    // Checked again by the next reconcile: the sweep may delete the end queues.
    for q in [
        t.queue.clone(),
        naming::sink_queue(&t.ns),
        naming::sump_queue(&t.ns),
    ] {
        rec.memory.forget_queue(&QueueKey::new(&t.transport, &q));
    }
    for (kind, n) in owned(&t.name, true) {
        rec.memory.forget_applied(kind, &t.ns, &n);
    }
    rec.memory.forget_applied(
        ObjectKind::ServiceAccount,
        &t.ns,
        &naming::service_account_name(&t.name),
    );
    // The namespace's transport Secrets are not watched: an actor deleted with its namespace
    // must not leave them counted as applied, or a namespace recreated under the same name
    // within the reassert interval gets actors without credentials. One extra apply for the
    // namespace's other actors, if any.
    rec.memory.forget_kind_in(ObjectKind::Secret, &t.ns);
}
