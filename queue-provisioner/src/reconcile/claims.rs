//! The claim step (docs/DESIGN.md §9, "Queue names have one owner"): before the provisioner
//! declares or adopts a queue, and before it deletes one, the queue's `QueueClaim` says whose
//! it is; the claim is made before the queue and deleted after it. Decisions are pure
//! (`asya_api::queue_claim::holder`, [`crate::queue::claim`], [`crate::queue::owner`]); this
//! module reads and writes, one queue name at a time in the process.
//!
//! - Claim ours (namespace, namespace uid, actor): the queue is ensured.
//! - No claim: an existing queue is adopted only if the broker's record says so
//!   ([`owner::owns`]: the upgrade from the release before the claims, or the actor's
//!   one-time `asya.sh/adopt-queue`); then the claim is created. Its creation is the atomic
//!   "first wins": a claim made meanwhile is read again and decides.
//! - Claim another's (another namespace or actor, or an earlier namespace of this name):
//!   refused ([`QueueError::NotOurs`]) unless stale ([`claim::stale`]: its queue exists on no
//!   transport and its owner is gone), then replaced.

use asya_api::naming;
use asya_api::queue_claim::{self, ClaimOwner, Holder, QueueClaim};
use asya_api::types::Resiliency;
use kube::ResourceExt;
use tracing::{info, warn};

use crate::queue::claim;
use crate::queue::owner::{self, Claimant};
use crate::queue::{QueueError, QueueInfo, QueueSpec};

use super::{Cluster, Reconciler};

fn kube_err(what: &str, e: kube::Error) -> QueueError {
    QueueError::Unavailable(format!("{what}: {e}"))
}

/// The claim of `name`, read from the API server.
async fn read<C: Cluster>(c: &C, name: &str) -> Result<Option<QueueClaim>, QueueError> {
    c.claim_get(name).await.map_err(|e| {
        kube_err(
            &format!(
                "reading QueueClaim {name} (is its CRD installed? kubectl apply -f deploy/crds)"
            ),
            e,
        )
    })
}

/// The uid of namespace `ns` now (`""` when it does not exist: no claim matches it).
async fn uid_of<C: Cluster>(c: &C, ns: &str) -> Result<String, QueueError> {
    Ok(c.namespace_uid(ns)
        .await
        .map_err(|e| kube_err(&format!("reading namespace {ns}"), e))?
        .unwrap_or_default())
}

fn enabled<C>(rec: &Reconciler<C>) -> Vec<String> {
    rec.config
        .enabled_transports()
        .into_iter()
        .map(String::from)
        .collect()
}

/// Whether namespace `ns` has an AsyncActor (being deleted or not) whose queue actor is
/// `actor`, in the controller's cache.
fn has_actor<C: Cluster>(c: &C, ns: &str, actor: &str) -> bool {
    c.actors_in(ns).iter().any(|a| a.actor_name() == actor)
}

/// Whether `queue` exists on any enabled transport: a claim holds the name on all of them.
async fn exists_anywhere<C: Cluster>(rec: &Reconciler<C>, queue: &str) -> Result<bool, QueueError> {
    for t in enabled(rec) {
        if rec.cluster.queue_exists(&t, queue).await? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether a claim another holds is stale ([`claim::stale`]). Anything unreadable: not.
async fn is_stale<C: Cluster>(rec: &Reconciler<C>, c: &QueueClaim) -> bool {
    let spec = &c.spec;
    let now = match rec.cluster.namespace_uid(&spec.namespace).await {
        Ok(u) => u,
        Err(e) => {
            warn!(claim = %c.name_any(), error = %e, "cannot read the claim's namespace; the claim stands");
            return false;
        }
    };
    let present = has_actor(&rec.cluster, &spec.namespace, &spec.actor);
    let alive = claim::owner_alive(spec, now.as_deref(), present);
    if alive {
        return false;
    }
    match exists_anywhere(rec, &c.name_any()).await {
        Ok(exists) => claim::stale(exists, alive),
        Err(e) => {
            warn!(claim = %c.name_any(), error = %e, "cannot tell whether the claim's queue exists; the claim stands");
            false
        }
    }
}

/// An existing queue without a claim may become `spec`'s: the broker's record says so on the
/// actor's transport (an error there fails the step), and on the others, where it may exist
/// under the same name (best effort: an unreachable one is logged, not waited for).
async fn adoptable<C: Cluster>(
    rec: &Reconciler<C>,
    transport: &str,
    spec: &QueueSpec,
) -> Result<(), QueueError> {
    let c = &rec.cluster;
    let who = spec.claimant();
    let others: Vec<String> = enabled(rec)
        .into_iter()
        .filter(|t| t != transport)
        .collect();
    // The reads are independent (one per broker): sent together, judged in the order above.
    let (own, elsewhere) = futures::join!(
        c.queue_record(transport, &spec.name),
        futures::future::join_all(others.iter().map(|t| c.queue_record(t, &spec.name)))
    );
    if let Some(r) = own? {
        owner::owns(&spec.name, &r, &who)?;
    }
    for (t, read) in others.iter().zip(elsewhere) {
        match read {
            Ok(Some(r)) => owner::owns(&spec.name, &r, &who)?,
            Ok(None) => {}
            Err(e) => {
                warn!(queue = %spec.name, transport = %t, error = %e, "cannot read the queue's owner on another transport; claimed on this one's word")
            }
        }
    }
    Ok(())
}

/// Ensures `spec`'s queue on `transport` for its actor, by its claim (the module's rules).
pub async fn ensure<C: Cluster>(
    rec: &Reconciler<C>,
    transport: &str,
    spec: &QueueSpec,
) -> Result<QueueInfo, QueueError> {
    let c = &rec.cluster;
    let lock = rec.memory.claim_lock(&spec.name);
    let _one = lock.lock().await;
    let uid = uid_of(c, &spec.namespace).await?;
    if uid.is_empty() {
        // Never a claim without the owner's uid: it would match nobody.
        return Err(QueueError::Unavailable(format!(
            "namespace {} not found: its queues are not claimed",
            spec.namespace
        )));
    }
    let who = ClaimOwner::new(&spec.namespace, &uid, &spec.actor);
    let name = queue_claim::claim_name(&spec.name);
    // The first look is the claim cache's: ours there is ours (a claim's owner never changes
    // but by a platform team's patch, which the next look after RECHECK sees), and absent
    // there goes straight to the creation, which alone decides who is first. Anything else,
    // and every second look, reads the API server. A claim created (or deleted) by someone
    // else meanwhile is read again, once.
    for attempt in 0..2 {
        let current = if attempt == 0 {
            match c.claim_cached(&name) {
                Some(held) if queue_claim::holder(&held, &who) == Holder::Ours => {
                    return c.queue_ensure(transport, spec).await;
                }
                Some(_) => read(c, &name).await?,
                None => None,
            }
        } else {
            read(c, &name).await?
        };
        match current {
            Some(held) => match queue_claim::holder(&held.spec, &who) {
                Holder::Ours => return c.queue_ensure(transport, spec).await,
                h => {
                    if !is_stale(rec, &held).await {
                        if h == Holder::EarlierNamespace && naming::is_end_actor(&spec.actor) {
                            // Its predecessor's end queue goes once empty or after the
                            // retention, as if its deletion had been seen.
                            for t in enabled(rec) {
                                c.end_queues_candidate(&t, &spec.namespace);
                            }
                        }
                        return Err(claim::refusal(&spec.name, &held.spec, &who).into());
                    }
                    info!(claim = %name, owner_namespace = %held.spec.namespace, owner_actor = %held.spec.actor,
                        "stale QueueClaim (no such queue, owner gone) replaced");
                    let held_uid = held.uid().unwrap_or_default();
                    c.claim_delete(&name, &held_uid)
                        .await
                        .map_err(|e| kube_err(&format!("deleting stale QueueClaim {name}"), e))?;
                }
            },
            None => {
                adoptable(rec, transport, spec).await?;
                let created = c
                    .claim_create(&queue_claim::claim_for(&who, transport))
                    .await
                    .map_err(|e| {
                        kube_err(
                            &format!("creating QueueClaim {name} (is its CRD installed? kubectl apply -f deploy/crds)"),
                            e,
                        )
                    })?;
                if created {
                    return c.queue_ensure(transport, spec).await;
                }
            }
        }
    }
    Err(QueueError::Unavailable(format!(
        "QueueClaim {name} changed while it was read; trying again"
    )))
}

/// After `queue` was deleted: its claim `held` goes too, once the name exists on no enabled
/// transport (a leftover elsewhere keeps it). Best effort: a claim left behind is stale and
/// replaced by the next owner the provisioner serves.
async fn release<C: Cluster>(rec: &Reconciler<C>, queue: &str, held: &QueueClaim) {
    let name = queue_claim::claim_name(queue);
    match exists_anywhere(rec, queue).await {
        Ok(false) => {}
        Ok(true) => return,
        Err(e) => {
            warn!(claim = %name, error = %e, "cannot tell whether the queue is left on another transport; its QueueClaim stays");
            return;
        }
    }
    let uid = held.uid().unwrap_or_default();
    if let Err(e) = rec.cluster.claim_delete(&name, &uid).await {
        warn!(claim = %name, error = %e, "could not delete the QueueClaim of a deleted queue; it stays until replaced");
    }
}

/// Deletes a deleted actor's queue and its retry delay queues, if the queue is `who`'s (its
/// claim, or without one the broker's record), then the claim. Returns the delay queues.
pub async fn delete_actor_queue<C: Cluster>(
    rec: &Reconciler<C>,
    transport: &str,
    queue: &str,
    resiliency: Option<&Resiliency>,
    who: &Claimant,
) -> Result<Vec<String>, QueueError> {
    let c = &rec.cluster;
    let lock = rec.memory.claim_lock(queue);
    let _one = lock.lock().await;
    let name = queue_claim::claim_name(queue);
    let held = read(c, &name).await?;
    match &held {
        Some(h) => {
            let uid = uid_of(c, &who.namespace).await?;
            let owner = ClaimOwner::new(&who.namespace, &uid, &who.actor);
            if queue_claim::holder(&h.spec, &owner) != Holder::Ours {
                return Err(claim::refusal(queue, &h.spec, &owner).into());
            }
        }
        None => {
            if let Some(r) = c.queue_record(transport, queue).await? {
                owner::owns(queue, &r, who)?;
            }
        }
    }
    let deleted = c.queue_delete(transport, queue, resiliency).await?;
    if let Some(h) = &held {
        release(rec, queue, h).await;
    }
    Ok(deleted)
}

/// Whether actor `actor` of namespace `ns` (uid `uid`) holds its queue's claim, by the
/// provisioner's cache: a namespace's broker permissions name only such actors' queues.
pub fn holds<C: Cluster>(c: &C, ns: &str, uid: &str, actor: &str) -> bool {
    let name = queue_claim::claim_name(&naming::actor_queue(ns, actor));
    c.claim_cached(&name)
        .is_some_and(|s| queue_claim::holder(&s, &ClaimOwner::new(ns, uid, actor)) == Holder::Ours)
}
