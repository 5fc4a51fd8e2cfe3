//! The broker identity step (docs/DESIGN.md §9): after the queues (declared and bound to the
//! namespace's exchange) and before the workload, the namespace's broker user gets its
//! password and permissions that include this actor's queue, so a new actor's pods never
//! start refused. [`plan`] and [`permissions`] decide; this module reads and writes.
//!
//! Within [`RECHECK`] of the last set, with the same permissions, nothing is read or
//! written; after that the Secret is read (by name: the provisioner may not list Secrets).

use std::collections::BTreeSet;
use std::time::Instant;

use asya_api::{AsyncActor, ResolvedActor, naming};
use kube::ResourceExt;

use crate::broker_identity::permissions;
use crate::broker_identity::plan::{self as id, PasswordStep, SecretView};
use crate::model::ObjectKind;
use crate::queue::QueueError;

use super::memory::{IdentitySet, RECHECK};
use super::ownership::Write;
use super::ownership::managed_by_us;
use super::plan::{EventSpec, Reason};
use super::{Cluster, Object, Reconciler};

/// The actor names of namespace `ns` that hold queues: those not being deleted, plus
/// `also` (the actor being reconciled, which the cache may not show yet).
pub fn live_actors<C: Cluster>(c: &C, ns: &str, also: Option<&str>) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = c
        .actors_in(ns)
        .iter()
        .filter(|a| a.metadata.deletion_timestamp.is_none())
        .map(|a| a.actor_name())
        .collect();
    out.extend(also.map(String::from));
    out
}

/// Whether namespace `ns` keeps a live actor once `leaving` goes: one not being deleted and
/// not `leaving` itself. The one rule for what goes with a namespace's last actor (its broker
/// identity, its Redis user, its gateway report token). By object name: while `leaving`
/// holds its finalizer no other object can have that name, and the cache may still show
/// `leaving` without its deletion mark.
pub fn others_live<C: Cluster>(c: &C, ns: &str, leaving: &AsyncActor) -> bool {
    let me = leaving.name_any();
    c.actors_in(ns)
        .iter()
        .any(|a| a.metadata.deletion_timestamp.is_none() && a.name_any() != me)
}

fn kube_err(what: &str, e: kube::Error) -> QueueError {
    QueueError::Unavailable(format!("{what}: {e}"))
}

/// Whether the identity set before can be trusted without a look at the Secret: set within
/// [`RECHECK`] with permissions that cover `actor`'s queues. So a rotation request, a deleted
/// Secret or a user removed behind our back is acted on by the first reconcile of one of the
/// namespace's actors after that: within a periodic requeue (`plan::PERIOD` +
/// `plan::SPREAD`, 75 s).
///
/// Coverage, not equality with what this reconcile would write: when many actors of one
/// namespace arrive at once, the first write (made under the namespace's lock with every
/// actor the cache holds by then) covers those queued behind it, instead of each rewriting
/// the user's permissions in turn. Permissions never stay wider than the live actors for
/// longer than [`RECHECK`]: a deleted actor's cleanup forgets the set ([`release`]), so the
/// next reconcile writes them exactly.
fn still_set(last: &IdentitySet, actor: &str) -> bool {
    last.actors.contains(actor) && last.at.elapsed() < RECHECK
}

/// Ensures the namespace's broker identity for `r`'s transport. `Ok(None)`: the transport
/// has none (SQS, or `shareAdminCredentials`, announced once per actor with a Warning).
/// `Ok(Some(v))`: the credential's version, for the workloads' pod templates.
pub async fn ensure<C: Cluster>(
    rec: &Reconciler<C>,
    actor: &AsyncActor,
    r: &ResolvedActor,
) -> Result<Option<u64>, QueueError> {
    let c = &rec.cluster;
    let Some(t) = rec.config.transport(&r.transport) else {
        return Ok(None);
    };
    if t.shares_admin_credentials() {
        if rec.memory.first_time(&super::actor_key(actor)) {
            let note = format!(
                "transport {} shares the platform's broker credentials with namespace {} \
                 (transports.{}.config.shareAdminCredentials: true): its pods can read, purge \
                 and delete every namespace's queues",
                r.transport, r.namespace, r.transport
            );
            c.event(
                actor,
                EventSpec::warning(Reason::SharedAdminCredentials, note),
            )
            .await;
        }
        return Ok(None);
    }
    if !t.scoped_broker_identity() {
        return Ok(None);
    }
    let ns = &r.namespace;
    announce_unrotated(rec, actor, &r.transport).await;
    let lock = rec.memory.identity_lock(&r.transport, ns);
    let _one_at_a_time = lock.lock().await;
    if let Some(last) = rec.memory.identity(&r.transport, ns)
        && still_set(&last, &r.actor)
    {
        return Ok(Some(last.version));
    }
    // Read under the lock: the actors that arrived while this reconcile waited are covered
    // by the same write. Only those holding their queue's claim (this one's was just
    // settled by the queue step): an actor refused its queue (another's, or an earlier
    // namespace's of this name) must not get read access to it by its name.
    let uid = c
        .namespace_uid(ns)
        .await
        .map_err(|e| kube_err(&format!("reading namespace {ns}"), e))?
        .unwrap_or_default();
    let mut actors = live_actors(c, ns, Some(&r.actor));
    actors.retain(|a| *a == r.actor || super::claims::holds(c, ns, &uid, a));
    let perms = permissions::for_namespace(ns, &actors);
    permissions::check_size(ns, actors.len(), &perms).map_err(QueueError::Rejected)?;
    let secret_name = naming::tenant_broker_secret(&r.transport);
    let current = c
        .read_secret(ns, &secret_name)
        .await
        .map_err(|e| kube_err(&format!("reading Secret {ns}/{secret_name}"), e))?;
    // A Secret of that name we did not write is someone else's: never taken over.
    if current
        .as_ref()
        .is_some_and(|s| !managed_by_us(&s.metadata))
    {
        return Err(QueueError::Rejected(format!(
            "Secret {ns}/{secret_name} exists and was not created by the provisioner (no label \
             {}={}): the namespace's broker identity is not written over it; rename or delete it",
            crate::render::workload::MANAGED_BY.0,
            crate::render::workload::MANAGED_BY.1
        )));
    }
    let current_uid = current.as_ref().and_then(|s| s.metadata.uid.clone());
    let view = current.as_ref().map(SecretView::of);
    // Above any version this process set: a Secret deleted within the second it was made
    // still gets a new version, so the workloads roll.
    let floor = rec
        .memory
        .identity(&r.transport, ns)
        .map_or(0, |l| l.version.saturating_add(1));
    let now = (k8s_openapi::jiff::Timestamp::now().as_second().max(0) as u64).max(floor);
    let user = naming::tenant_broker_user(ns);
    let version = match id::password_step(ns, view.as_ref(), now) {
        PasswordStep::Keep { password, version } => {
            c.broker_user_put(&r.transport, &user, &password, &perms)
                .await?;
            version
        }
        PasswordStep::Generate { version, replace } => {
            let password = id::generate_password()
                .map_err(|e| QueueError::Unavailable(format!("generating a password: {e}")))?;
            // The broker first: a Secret naming a password the broker does not know yet
            // would start pods that are refused. Existing connections are not dropped.
            c.broker_user_put(&r.transport, &user, &password, &perms)
                .await?;
            if replace {
                // Replaced whole: apply keeps annotations other managers set (the request).
                c.delete(ObjectKind::Secret, ns, &secret_name, current_uid.as_deref())
                    .await
                    .map_err(|e| kube_err(&format!("replacing Secret {ns}/{secret_name}"), e))?;
            }
            let s = id::identity_secret(ns, &r.transport, &password, version);
            // A create (never forced): a Secret made meanwhile by someone else is not taken.
            c.apply(ns, &Object::Secret(s), &Write::Create)
                .await
                .map_err(|e| kube_err(&format!("writing Secret {ns}/{secret_name}"), e))?;
            let note = format!(
                "broker user {user} of namespace {ns} has a new password (version {version}) in \
                 Secret {secret_name}; the namespace's workloads roll onto it"
            );
            c.event(
                actor,
                EventSpec::normal(Reason::BrokerCredentialIssued, note),
            )
            .await;
            version
        }
    };
    let set = IdentitySet {
        actors,
        version,
        at: Instant::now(),
    };
    rec.memory.record_identity(&r.transport, ns, set);
    Ok(Some(version))
}

/// While the transport's password is one that was found copied into actor namespaces
/// ([`crate::exposure`]), a Warning on each of its actors (once per process) and in the log:
/// changing it is the upgrade's last step, and whoever read a copy can use it until then.
/// Looked at once per [`RECHECK`] per transport.
async fn announce_unrotated<C: Cluster>(rec: &Reconciler<C>, actor: &AsyncActor, transport: &str) {
    let c = &rec.cluster;
    // The answer is kept for RECHECK in the identity memory (version 1: unrotated), so the
    // record is not read on every reconcile.
    let slot = format!("unrotated/{transport}");
    let unrotated = match rec.memory.identity(&slot, "") {
        Some(last) if last.at.elapsed() < RECHECK => last.version == 1,
        _ => {
            let Ok(creds) = c.transport(transport).await else {
                return;
            };
            let Some(password) = creds.password else {
                return;
            };
            let unrotated = match c.exposed(transport, &password).await {
                Ok(u) => u,
                Err(e) => {
                    tracing::debug!(transport, error = %e, "could not read the exposure record");
                    return;
                }
            };
            let set = IdentitySet {
                actors: BTreeSet::new(),
                version: u64::from(unrotated),
                at: Instant::now(),
            };
            rec.memory.record_identity(&slot, "", set);
            unrotated
        }
    };
    if !unrotated {
        return;
    }
    let secret = rec
        .config
        .transport(transport)
        .and_then(|t| t.config.password_secret_ref.as_ref())
        .map_or(String::new(), |s| s.name.clone());
    let note = crate::exposure::warning(transport, &secret);
    if rec.memory.first_time(&format!(
        "unrotated/{transport}/{}",
        super::actor_key(actor)
    )) {
        tracing::warn!(transport, "{note}");
        c.event(
            actor,
            EventSpec::warning(Reason::UnrotatedPlatformCredentials, note),
        )
        .await;
    }
}

/// After an upgrade from `shareAdminCredentials`: removes the platform password's copy from
/// the namespace once no pod there reads it any more (all rolled onto the namespace's own
/// identity). Only a copy this provisioner made (labelled managed-by), never in its own
/// namespace, where the original lives.
pub async fn remove_platform_copy<C: Cluster>(
    rec: &Reconciler<C>,
    r: &ResolvedActor,
) -> Result<(), kube::Error> {
    let c = &rec.cluster;
    let Some(t) = rec.config.transport(&r.transport) else {
        return Ok(());
    };
    let Some(copy) = t
        .config
        .password_secret_ref
        .as_ref()
        .map(|s| s.name.clone())
    else {
        return Ok(());
    };
    let ns = &r.namespace;
    if !t.scoped_broker_identity() || ns == c.platform_namespace() {
        return Ok(());
    }
    // Once gone (or never there), not looked for again in this process.
    let done = format!("platform-copy-gone/{}/{ns}", r.transport);
    if rec.memory.seen(&done) {
        return Ok(());
    }
    let Some(secret) = c.read_secret(ns, &copy).await? else {
        rec.memory.first_time(&done);
        return Ok(());
    };
    if !managed_by_us(&secret.metadata) {
        // Not a copy we made: the namespace's own Secret of that name stays.
        rec.memory.first_time(&done);
        return Ok(());
    }
    // A tenant could read this password: it stays exposed until it is changed.
    let key = t
        .config
        .password_secret_ref
        .as_ref()
        .map_or("password", |s| s.key.as_str());
    let copied = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned());
    if let Some(p) = copied.filter(|p| !p.is_empty()) {
        c.record_exposed(&r.transport, &p).await?;
        // Told from the next reconcile on, not after the cached answer's time.
        rec.memory
            .forget_identity(&format!("unrotated/{}", r.transport), "");
    }
    let pods = c.pods_in(ns);
    if id::platform_copy_removable(pods.iter().map(|p| p.as_ref()), &copy) {
        c.delete(
            ObjectKind::Secret,
            ns,
            &copy,
            secret.metadata.uid.as_deref(),
        )
        .await?;
        rec.memory.first_time(&done);
        rec.memory.forget_applied(ObjectKind::Secret, ns, &copy);
        tracing::info!(namespace = %ns, secret = %copy, "removed the platform's copied broker credentials: every pod uses the namespace's own");
    }
    Ok(())
}

/// After an actor's cleanup: with no other live actor in the namespace, its broker user,
/// exchange and Secret go; otherwise the next reconcile narrows the permissions. Best
/// effort: a broker that cannot be reached leaves the user (a warning says so), never the
/// actor Terminating.
pub async fn release<C: Cluster>(
    rec: &Reconciler<C>,
    ns: &str,
    transport: &str,
    leaving: &AsyncActor,
) {
    let c = &rec.cluster;
    rec.memory.forget_identity(transport, ns);
    if !rec
        .config
        .transport(transport)
        .is_some_and(|t| t.scoped_broker_identity())
    {
        return;
    }
    if others_live(c, ns, leaving) {
        return;
    }
    let user = naming::tenant_broker_user(ns);
    if let Err(e) = c.broker_identity_delete(transport, ns, &user).await {
        tracing::warn!(namespace = %ns, user = %user, error = %e, "could not delete the namespace's broker user; it stays until removed by hand");
    }
    let secret = naming::tenant_broker_secret(transport);
    // Only ours (labelled), and the one read (uid precondition).
    if let Err(e) = c.delete_owned_secret(ns, &secret).await {
        tracing::warn!(namespace = %ns, secret = %secret, error = %e, "could not delete the namespace's broker Secret");
    }
    rec.memory.forget_applied(ObjectKind::Secret, ns, &secret);
}
