//! The reconcile of a live actor, step by step: resolve, queues, objects, pods without the
//! sidecar, KEDA's target, status. Each step asks [`plan`] and does what it says.

use std::sync::Arc;

use asya_api::sidecar_settings::TransportSettings;
use asya_api::{AsyncActor, AsyncActorStatus};
use k8s_openapi::api::core::v1::Pod;
use kube::Resource;

use crate::model::ObjectKind;
use crate::status::{self, Observed, TransportObs};

use super::plan::{self, EventSpec, Failure, Next, PodAction, Retry, StepFailure};
use super::write::{now, write_status};
use super::{Cluster, Error, Reconciler, actor_key, identity, objects, queues, state_identity};

/// The reconcile of a live actor. What it made is announced with its status write, or on
/// its own when it fails before that.
pub async fn run<C: Cluster>(rec: &Reconciler<C>, actor: &AsyncActor) -> Result<Next, Error> {
    let mut made = Vec::new();
    let res = reconcile(rec, actor, &mut made).await;
    if res.is_err() {
        for ev in plan::announcement(std::mem::take(&mut made), None) {
            rec.cluster.event(actor, ev).await;
        }
    }
    res
}

async fn reconcile<C: Cluster>(
    rec: &Reconciler<C>,
    actor: &AsyncActor,
    made: &mut Vec<EventSpec>,
) -> Result<Next, Error> {
    let c = &rec.cluster;
    let key = actor_key(actor);
    let prev = actor.status.clone().unwrap_or_default();
    let review = asya_api::review::review_typed(actor, &c.catalog(), &rec.config);
    let (resolved, mut o) = match plan::resolution(actor, review) {
        Ok(r) => r,
        Err(o) => {
            let st = status::derive(&prev, &o, now());
            write_status(c, actor, st, std::mem::take(made)).await?;
            return Ok(Next::After(plan::UNRESOLVED_RETRY));
        }
    };

    // 1. Queues: the namespace's end queues, then the actor's.
    o.transport = match queues::ensure(rec, actor, &resolved, made).await {
        Ok(t) => t,
        Err(e) => {
            let f = plan::step_failure(StepFailure::Queue(&e));
            return failed(rec, actor, &prev, o, made, f).await;
        }
    };

    // 1b. The namespace's broker identity, its permissions naming the queue just ensured:
    // before the workload, so the actor's pods never start refused.
    let credential_version = match identity::ensure(rec, actor, &resolved).await {
        Ok(v) => v,
        Err(e) => {
            let f = plan::step_failure(StepFailure::BrokerIdentity(&e));
            return failed(rec, actor, &prev, o, made, f).await;
        }
    };

    // 1c. The namespace's Redis user, when its state proxies use the platform's Redis:
    // before the workload, whose connectors read its Secret at start.
    let state_credential_version = match state_identity::ensure(rec, actor, &resolved).await {
        Ok(v) => v,
        Err(e) => {
            let f = plan::step_failure(StepFailure::StateIdentity(&e));
            return failed(rec, actor, &prev, o, made, f).await;
        }
    };

    // 2. Kubernetes objects.
    let owner = actor
        .controller_owner_ref(&())
        .ok_or(Error::Finalizer("actor has no uid".into()))?;
    let queue_url = match &o.transport {
        TransportObs::Ready(info, _) => Some(info.url.clone()),
        _ => None,
    };
    let res = objects::apply(
        rec,
        actor,
        &resolved,
        &owner,
        &mut o,
        &objects::FromBroker {
            queue_url,
            credential_version,
            state_credential_version,
        },
        made,
    )
    .await;
    if let Err(e) = res {
        if let objects::ApplyError::NotOurs(m) = &e {
            c.event(actor, plan::not_ours_event(m)).await;
            o.foreign.push(m.clone());
        }
        o.workload_error.get_or_insert_with(|| e.to_string());
    }
    // After an upgrade: the platform's copied password leaves once no pod reads it.
    if let Err(e) = identity::remove_platform_copy(rec, &resolved).await {
        tracing::warn!(actor = %key, error = %e, "could not remove the platform's copied broker credentials");
    }

    // 3. Pods that escaped injection, and pods injected under another identity mode, stuck
    // on a Secret that may never exist.
    let pods: Vec<Arc<Pod>> = c.pods(&resolved.namespace, &resolved.name);
    let pods: Vec<&Pod> = pods.iter().map(Arc::as_ref).collect();
    // Replaced only once injection works again (probed with the first pod without it).
    let injection_down = match plan::bare_pods(&pods).first() {
        Some(p) => !c.injection_works(p).await,
        None => false,
    };
    let current = rec
        .config
        .transport(&resolved.transport)
        .and_then(|t| TransportSettings::for_transport(&resolved.transport, t).ok());
    let expected = current.as_ref().map(|t| t.credential_secrets());
    let overridden: Vec<&str> = resolved
        .spec
        .sidecar
        .iter()
        .flat_map(|s| s.env.iter().map(|e| e.name.as_str()))
        .collect();
    let credentials = expected.as_deref().map(|current| plan::Credentials {
        current,
        overridden: &overridden,
    });
    let step = plan::pods(&pods, injection_down, credentials.as_ref());
    for a in step.actions {
        match a {
            PodAction::Delete { name, uid } => {
                c.delete(ObjectKind::Pod, &resolved.namespace, &name, uid.as_deref())
                    .await?;
            }
            PodAction::Event(ev) => c.event(actor, ev).await,
        }
    }
    o.pods = step.counted.into_iter().map(status::classify_pod).collect();

    // 4. KEDA's HPA target.
    if o.scaling_enabled
        && let Some(d) = c.hpa_desired(&resolved.namespace, &resolved.name)
    {
        o.hpa_desired = Some(d);
    }

    let new = status::derive(&prev, &o, now());
    let failed = o.workload_error.is_some() || o.scaling_error.is_some();
    rec.gauges.set(
        &resolved.namespace,
        &resolved.actor,
        crate::actor_gauges::ActorValues::of_status(&new),
    );
    write_status(c, actor, new, std::mem::take(made)).await?;
    let backoff = rec.memory.backoff(&key, failed);
    Ok(plan::next(
        &key,
        failed,
        backoff,
        injection_down,
        o.has_messages(),
    ))
}

/// Carries out [`plan::step_failure`]'s answer: the event, the status that says why, and
/// when to look again.
async fn failed<C: Cluster>(
    rec: &Reconciler<C>,
    actor: &AsyncActor,
    prev: &AsyncActorStatus,
    mut o: Observed,
    made: &mut Vec<EventSpec>,
    f: Failure,
) -> Result<Next, Error> {
    let c = &rec.cluster;
    if let Some(ev) = f.event {
        c.event(actor, ev).await;
    }
    if let Some(t) = f.transport {
        o.transport = t;
    }
    if let Some(e) = f.workload_error {
        o.workload_error = Some(e);
    }
    let wait = match f.retry {
        Retry::After(d) => d,
        Retry::Backoff { at_least } => rec.memory.backoff(&actor_key(actor), true).max(at_least),
    };
    let st = status::derive(prev, &o, now());
    write_status(c, actor, st, std::mem::take(made)).await?;
    Ok(Next::After(wait))
}
