//! The queue step: the namespace's end queues and the actor's own queue, ensured through a
//! short-lived memory so that each queue costs the broker one call per interval, not one per
//! reconcile.

use std::time::Duration;

use asya_api::{AsyncActor, ResolvedActor, naming};

use crate::queue::{QueueError, QueueInfo, QueueSpec, owner};
use crate::status::TransportObs;

use super::memory::QueueKey;
use super::{Cluster, Reconciler, plan};

/// Visibility timeout of the end queues: theirs, not the timeout of whichever actor of the
/// namespace ensures them (actors with different timeouts would rewrite it in turn).
pub const END_QUEUE_VISIBILITY: Duration = Duration::from_secs(300);

/// `adopt_untagged`: the actor's [`owner::ADOPT_QUEUE`] annotation (end queues: never, the
/// provisioner always made them).
pub fn queue_spec(ns: &str, actor: &str, timeout: Duration, adopt_untagged: bool) -> QueueSpec {
    QueueSpec {
        name: naming::actor_queue(ns, actor),
        namespace: ns.into(),
        actor: actor.into(),
        visibility_timeout: timeout,
        adopt_untagged,
        wake_ttl: None,
    }
}

/// How long an actor's wake message lives (docs/DESIGN.md §6.1): its cooldown, so a woken
/// actor that no envelope reaches goes back to zero one cooldown after the wake. `None`: no
/// wake queue (wake-up off in the cluster configuration, the actor not scaled by KEDA or
/// opted out with `scaling.wake: false`).
pub fn wake_ttl(wake_enabled: bool, r: &ResolvedActor) -> Option<Duration> {
    if !wake_enabled || !r.wakes_ahead() {
        return None;
    }
    let cooldown = r
        .scaling()
        .cooldown_period
        .unwrap_or(asya_api::resolved::DEFAULT_COOLDOWN_PERIOD);
    Some(Duration::from_secs(
        u64::try_from(cooldown).unwrap_or(0).max(1),
    ))
}

/// Ensures one queue. Within [`super::memory::RECHECK`] of the last ensure or check with the same spec it
/// is trusted without a broker call; after that one existence check (a vanished queue is
/// recreated at once), so a namespace's end queues are checked once for all its actors.
async fn ensure_cached<C: Cluster>(
    r: &Reconciler<C>,
    transport: &str,
    spec: QueueSpec,
) -> Result<QueueInfo, QueueError> {
    let key = QueueKey::new(transport, &spec.name);
    if let Some((fresh, mut info)) = r.memory.ensured(&key, &spec) {
        info.created = false;
        if fresh {
            return Ok(info);
        }
        if r.cluster.queue_exists(transport, &spec.name).await? {
            r.memory.ensured_now(key, spec, info.clone());
            return Ok(info);
        }
    }
    // Declared or adopted only once its claim says it is the actor's.
    let info = super::claims::ensure(r, transport, &spec).await?;
    r.memory.ensured_now(key, spec, info.clone());
    Ok(info)
}

/// The queue step of a reconcile: what the status says of the transport. A queue it created
/// is added to `made`, announced with the status.
pub async fn ensure<C: Cluster>(
    rec: &Reconciler<C>,
    actor: &AsyncActor,
    r: &ResolvedActor,
    made: &mut Vec<plan::EventSpec>,
) -> Result<TransportObs, QueueError> {
    rec.cluster.transport(&r.transport).await?;
    // The two end queues are independent (their own names and claims): ensured together,
    // the first failure in this order reported.
    let end = |actor| {
        let spec = queue_spec(&r.namespace, actor, END_QUEUE_VISIBILITY, false);
        ensure_cached(rec, &r.transport, spec)
    };
    let (sink, sump) = futures::join!(end(naming::SINK_ACTOR), end(naming::SUMP_ACTOR));
    sink?;
    sump?;
    let adopt = owner::adopt_annotation(actor.metadata.annotations.as_ref());
    let mut spec = queue_spec(&r.namespace, &r.actor, r.actor_timeout, adopt);
    spec.wake_ttl = wake_ttl(rec.config.wake.enabled, r);
    let mut info = ensure_cached(rec, &r.transport, spec.clone()).await?;
    let mut depth = rec.cluster.queue_depth(&r.transport, &r.queue).await;
    if !info.created && matches!(depth, Ok(None)) {
        // Gone although ensured before (deleted behind our back): every look at the depth
        // is also a check, so it is back now rather than at the next periodic existence check.
        rec.memory
            .forget_queue(&QueueKey::new(&r.transport, &spec.name));
        info = ensure_cached(rec, &r.transport, spec).await?;
        depth = rec.cluster.queue_depth(&r.transport, &r.queue).await;
    }
    if info.created {
        // Both a first creation and the recreation of a vanished queue land here.
        made.push(plan::queue_created_event(
            actor.status.as_ref(),
            &r.queue,
            &r.transport,
        ));
    }
    Ok(TransportObs::Ready(info, depth.ok().flatten()))
}
