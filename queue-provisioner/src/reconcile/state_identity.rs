//! The state identity step (docs/DESIGN.md §9): for an actor whose state proxies use the
//! platform's Redis, the namespace's own Redis user — keys `{ns}/*` only — with its password
//! in the namespace's Secret `asya-state-redis`, before the workload (its connectors read the
//! Secret at start). Kept, rotated and removed as the broker identity is
//! ([`super::identity`]); [`crate::state_identity::plan`] decides.

use std::time::Instant;

use asya_api::state_proxy::{self as sp, TENANT_REDIS_SECRET};
use asya_api::{AsyncActor, ResolvedActor};

use crate::broker_identity::plan::{self as id, PasswordStep, SecretView};
use crate::model::ObjectKind;
use crate::state_identity::StateError;
use crate::state_identity::plan::{self as state, Owner};

use super::identity::{live_actors, others_live};
use super::memory::{IdentitySet, RECHECK};
use super::ownership::Write;
use super::ownership::managed_by_us;
use super::plan::{EventSpec, Reason};
use super::{Cluster, Object, Reconciler};

/// The identity memory's key for the state identity (transport names, the broker identity's
/// keys, never contain '/').
pub const MEMORY_KEY: &str = "state/redis";

fn kube_err(what: &str, e: kube::Error) -> StateError {
    StateError::Unavailable(format!("{what}: {e}"))
}

/// Ensures the namespace's Redis user when `r`'s state proxies use the platform's Redis.
/// `Ok(None)`: they do not. `Ok(Some(v))`: the credential's version, for the pod template.
pub async fn ensure<C: Cluster>(
    rec: &Reconciler<C>,
    actor: &AsyncActor,
    r: &ResolvedActor,
) -> Result<Option<u64>, StateError> {
    if !sp::needs_platform_redis(&r.spec.state_proxy, &rec.config.state_proxy) {
        return Ok(None);
    }
    let c = &rec.cluster;
    let ns = &r.namespace;
    let lock = rec.memory.identity_lock(MEMORY_KEY, ns);
    let _one_at_a_time = lock.lock().await;
    if let Some(last) = rec.memory.identity(MEMORY_KEY, ns)
        && last.actors.contains(&r.actor)
        && last.at.elapsed() < RECHECK
    {
        return Ok(Some(last.version));
    }
    announce_shared_access(rec, actor).await;
    // The state under `{ns}/` is this namespace's only if the mark says so: a namespace
    // deleted and made again (by another team) does not inherit it.
    let uid = c
        .namespace_uid(ns)
        .await
        .map_err(|e| kube_err(&format!("reading namespace {ns}"), e))?
        .ok_or_else(|| StateError::Unavailable(format!("namespace {ns} is not there")))?;
    let previous = c.state_owner_claim(ns, &uid).await?;
    if let Owner::Earlier(owner) = state::owner(previous.as_deref(), &uid) {
        return Err(StateError::NotOurs {
            namespace: ns.clone(),
            owner,
            uid,
        });
    }
    let actors = live_actors(c, ns, Some(&r.actor));
    let current = c
        .read_secret(ns, TENANT_REDIS_SECRET)
        .await
        .map_err(|e| kube_err(&format!("reading Secret {ns}/{TENANT_REDIS_SECRET}"), e))?;
    if current
        .as_ref()
        .is_some_and(|s| !managed_by_us(&s.metadata))
    {
        return Err(StateError::Rejected(format!(
            "Secret {ns}/{TENANT_REDIS_SECRET} exists and was not created by the provisioner (no \
             label {}={}): the namespace's Redis user is not written over it; rename or delete it",
            crate::render::workload::MANAGED_BY.0,
            crate::render::workload::MANAGED_BY.1
        )));
    }
    let current_uid = current.as_ref().and_then(|s| s.metadata.uid.clone());
    let view = current
        .as_ref()
        .map(|s| SecretView::read(s, state::VERSION_ANNOTATION));
    let floor = rec
        .memory
        .identity(MEMORY_KEY, ns)
        .map_or(0, |l| l.version.saturating_add(1));
    let now = (k8s_openapi::jiff::Timestamp::now().as_second().max(0) as u64).max(floor);
    let user = state::user(ns);
    let version = match id::password_step(ns, view.as_ref(), now) {
        PasswordStep::Keep { password, version } => {
            // Re-asserted at every look: a Redis restarted without its ACL file has
            // forgotten the user.
            c.state_user_put(ns, &password).await?;
            version
        }
        PasswordStep::Generate { version, replace } => {
            let password = id::generate_password()
                .map_err(|e| StateError::Unavailable(format!("generating a password: {e}")))?;
            // Redis first: a Secret naming a password Redis does not know would start
            // connectors that are refused.
            c.state_user_put(ns, &password).await?;
            if replace {
                c.delete(
                    ObjectKind::Secret,
                    ns,
                    TENANT_REDIS_SECRET,
                    current_uid.as_deref(),
                )
                .await
                .map_err(|e| {
                    kube_err(&format!("replacing Secret {ns}/{TENANT_REDIS_SECRET}"), e)
                })?;
            }
            let s = id::credential_secret(
                ns,
                TENANT_REDIS_SECRET,
                state::VERSION_ANNOTATION,
                &password,
                version,
            );
            c.apply(ns, &Object::Secret(s), &Write::Create)
                .await
                .map_err(|e| kube_err(&format!("writing Secret {ns}/{TENANT_REDIS_SECRET}"), e))?;
            let note = format!(
                "Redis user {user} of namespace {ns} (keys {ns}/* only) has a new password \
                 (version {version}) in Secret {TENANT_REDIS_SECRET}; the namespace's workloads \
                 with state proxies roll onto it"
            );
            c.event(
                actor,
                EventSpec::normal(Reason::StateCredentialIssued, note),
            )
            .await;
            version
        }
    };
    rec.memory.record_identity(
        MEMORY_KEY,
        ns,
        IdentitySet {
            actors,
            version,
            at: Instant::now(),
        },
    );
    Ok(Some(version))
}

/// The platform's Redis still open to anyone as `default` without a password: what every
/// namespace could use before namespace users. A Warning on each actor (once per process)
/// until the platform team closes it (docs/DESIGN.md §9, upgrading).
async fn announce_shared_access<C: Cluster>(rec: &Reconciler<C>, actor: &AsyncActor) {
    let c = &rec.cluster;
    match c.state_default_open().await {
        Ok(true) => {
            tracing::warn!(
                "the platform's Redis lets anyone in as user default without a password: every namespace can read every other's state; disable it (ACL SETUSER default off) or give it a password"
            );
            if rec
                .memory
                .first_time(&format!("shared-state/{}", super::actor_key(actor)))
            {
                let note = "the platform's Redis (stateProxy.redis) still lets anyone in as user \
                            default without a password, so any pod can read and write every \
                            namespace's state: the platform team must disable it (ACL SETUSER \
                            default off) or give it a password"
                    .to_string();
                c.event(
                    actor,
                    EventSpec::warning(Reason::SharedStateCredentials, note),
                )
                .await;
            }
        }
        Ok(false) => {}
        Err(e) => tracing::debug!(error = %e, "could not read Redis's default user"),
    }
}

/// After an actor's cleanup: with no other live actor in the namespace, its Redis user and
/// Secret go (the state stays, and stays the namespace's by its owner mark). Best effort,
/// as for the broker identity: an unreachable Redis leaves the user, never the actor
/// Terminating.
pub async fn release<C: Cluster>(rec: &Reconciler<C>, ns: &str, leaving: &AsyncActor) {
    let c = &rec.cluster;
    rec.memory.forget_identity(MEMORY_KEY, ns);
    if rec.config.state_proxy.redis.is_none() {
        return;
    }
    if others_live(c, ns, leaving) {
        return;
    }
    // The user goes whether or not its Secret is still there: when the namespace itself is
    // deleted, its Secrets may go before its actors' finalizers run.
    let secret = match c.read_secret(ns, TENANT_REDIS_SECRET).await {
        Ok(s) => s.filter(|s| managed_by_us(&s.metadata)),
        Err(e) => {
            tracing::warn!(namespace = %ns, error = %e, "could not read the namespace's Redis Secret");
            None
        }
    };
    let user = state::user(ns);
    match c.state_user_delete(ns).await {
        Ok(()) => {}
        // A namespace that never had a user: nothing was left behind.
        Err(e) if secret.is_none() => {
            tracing::debug!(namespace = %ns, user = %user, error = %e, "no Redis user deleted")
        }
        Err(e) => {
            tracing::warn!(namespace = %ns, user = %user, error = %e, "could not delete the namespace's Redis user; it stays until removed by hand")
        }
    }
    if let Some(secret) = secret
        && let Err(e) = c
            .delete(
                ObjectKind::Secret,
                ns,
                TENANT_REDIS_SECRET,
                secret.metadata.uid.as_deref(),
            )
            .await
    {
        tracing::warn!(namespace = %ns, error = %e, "could not delete the namespace's Redis Secret");
    }
    rec.memory
        .forget_applied(ObjectKind::Secret, ns, TENANT_REDIS_SECRET);
}
