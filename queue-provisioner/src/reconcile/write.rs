//! The reconcile's writes that every step shares: the clock, the status write with its
//! announcement, and delete-if-ours. The steps (`objects`, `keda_auth`, `cleanup`, `actor`)
//! build on this module; it builds only on the rules (`ownership`, `plan`) and the port.

use asya_api::{AsyncActor, AsyncActorStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::model::ObjectKind;

use super::ownership::{self, DeleteStep, Us};
use super::plan::{self, EventSpec};
use super::{Cached, Cluster};

/// Now, as status conditions record it.
pub fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Writes the status only when it changed, with one event for what the reconcile made
/// (`made`) and the phase change ([`plan::announcement`]).
pub async fn write_status<C: Cluster>(
    c: &C,
    actor: &AsyncActor,
    new: AsyncActorStatus,
    made: Vec<EventSpec>,
) -> Result<(), kube::Error> {
    let old = actor.status.clone().unwrap_or_default();
    let write = plan::status_write(&old, &new);
    let phase = write.clone().flatten();
    for ev in plan::announcement(made, phase) {
        c.event(actor, ev).await;
    }
    match write {
        Some(_) => c.patch_status(actor, &new).await,
        None => Ok(()),
    }
}

/// The metadata of whatever holds `kind` `ns/name`: the cache's when it holds the object,
/// else read from the API server (the caches hold only objects with our label, and a delete
/// must not miss one of ours that lost it).
pub async fn holder_meta<C: Cluster>(
    c: &C,
    kind: ObjectKind,
    ns: &str,
    name: &str,
) -> Result<Option<ObjectMeta>, kube::Error> {
    match c.cached(kind, ns, name) {
        Cached::Present(m) => Ok(Some(*m)),
        Cached::Missing | Cached::NotCached => c.metadata(kind, ns, name).await,
    }
}

/// Deletes the object if it is the actor's (and still the object seen). `Ok(Err(message))`:
/// it is someone else's and was kept; `Ok(Ok(deleted))` otherwise.
pub async fn delete_if_ours<C: Cluster>(
    c: &C,
    us: Us<'_>,
    kind: ObjectKind,
    ns: &str,
    name: &str,
) -> Result<Result<bool, String>, kube::Error> {
    let meta = holder_meta(c, kind, ns, name).await?;
    match ownership::delete_step(kind, ns, name, meta.as_ref(), us) {
        DeleteStep::Nothing => Ok(Ok(false)),
        DeleteStep::Delete { uid } => Ok(Ok(c.delete(kind, ns, name, uid.as_deref()).await?)),
        DeleteStep::Keep { message } => Ok(Err(message)),
    }
}
