//! Each actor namespace's gateway report token (docs/DESIGN.md §9, "Gateway tokens"): with
//! `gateway.reportKeySecretRef` and `gateway.tokenSecretRef` in the cluster configuration,
//! the provisioner reads the report key in its own namespace and applies, in every namespace
//! that has actors, the Secret `tokenSecretRef` names with that namespace's token
//! ([`asya_api::report_token`], the gateway's own derivation), bound to the namespace's
//! `metadata.uid` and labelled managed-by. The Secret goes with the namespace's last actor.
//!
//! A Secret of that name the provisioner did not create is never overwritten nor deleted: a
//! Warning event says so instead. The key and the tokens are never logged nor put in an
//! event. Sidecars read the token at start, so the token's fingerprint is set on the pod
//! template of every workload of the namespace ([`VERSION_ANNOTATION`], as the broker
//! credential's version is): a new token (a new key within [`RECHECK`] plus a periodic
//! reconcile, the upgrade from the first token format) rolls the pods onto it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use asya_api::AsyncActor;
use asya_api::config::SecretKeySelector;
use asya_api::report_token::{KeyError, ReportKey};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tracing::{info, warn};

use super::memory::{ObjectKey, RECHECK};
use super::ownership::Write;
use super::plan::{EventSpec, Reason};
use super::{Cluster, Object, Reconciler, actor_key};
use crate::apply_skip::{Applied, REASSERT, desired_hash};
use crate::model::ObjectKind;
use crate::render::workload::MANAGED_BY;

/// Says what the Secret is, for whoever lists a namespace's Secrets.
pub const COMPONENT: (&str, &str) = ("app.kubernetes.io/component", "gateway-report-token");

/// On the pod template of the namespace's workloads: the fingerprint of the report token
/// its sidecars read ([`asya_api::report_token::fingerprint`]); a new token rolls the pods.
pub const VERSION_ANNOTATION: &str = "asya.sh/gateway-report-token-version";

/// What the workloads' pod templates carry of the namespace's report token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Issued {
    /// The fingerprint of the token in the namespace's Secret: set as [`VERSION_ANNOTATION`].
    Version(String),
    /// No token of ours (not configured, no usable key, a foreign Secret, or not issued yet
    /// by this process after a failure): no annotation.
    Nothing,
}

impl Issued {
    pub fn version(&self) -> Option<&str> {
        match self {
            Issued::Version(v) => Some(v),
            Issued::Nothing => None,
        }
    }
}

/// The namespace's token Secret: `at.name`, the token under `at.key`, labelled managed-by
/// (the only proof, checked before any later write or delete, that it is ours).
pub fn render(namespace: &str, at: &SecretKeySelector, token: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(at.name.clone()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([
                (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
                (COMPONENT.0.to_string(), COMPONENT.1.to_string()),
            ])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            at.key.clone(),
            ByteString(token.as_bytes().to_vec()),
        )])),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

/// Whether the provisioner made this Secret (it carries our managed-by label).
pub fn is_ours(secret: &Secret) -> bool {
    crate::reconcile::ownership::managed_by_us(&secret.metadata)
}

/// What to do about the namespace's token Secret while it has actors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Issue {
    Apply,
    /// A same-named Secret someone else made: left as it is.
    Foreign,
}

pub fn issue_step(existing: Option<&Secret>) -> Issue {
    match existing {
        Some(s) if !is_ours(s) => Issue::Foreign,
        _ => Issue::Apply,
    }
}

/// What to do about it once an actor of the namespace is cleaned up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Other actors of the namespace still report with it.
    Keep,
    Delete,
    /// Not there, or not ours: nothing to do.
    Leave,
}

pub fn release_step(others_live: bool, existing: Option<&Secret>) -> Release {
    match existing {
        _ if others_live => Release::Keep,
        Some(s) if is_ours(s) => Release::Delete,
        _ => Release::Leave,
    }
}

/// Why the report key could not be used; names the Secret and the key, never their content.
#[derive(Debug, thiserror::Error)]
pub enum KeyReadError {
    #[error("reading Secret {namespace}/{name} (gateway.reportKeySecretRef): {error}")]
    Read {
        namespace: String,
        name: String,
        error: String,
    },
    #[error("Secret {namespace}/{name} (gateway.reportKeySecretRef) does not exist")]
    Missing { namespace: String, name: String },
    #[error("Secret {namespace}/{name} (gateway.reportKeySecretRef) has no key {key:?}")]
    NoKey {
        namespace: String,
        name: String,
        key: String,
    },
    #[error("Secret {namespace}/{name} key {key:?} (gateway.reportKeySecretRef): {error}")]
    Invalid {
        namespace: String,
        name: String,
        key: String,
        error: KeyError,
    },
}

/// The key from the Secret as read (pure: the read is the caller's).
pub fn key_from(
    namespace: &str,
    at: &SecretKeySelector,
    secret: Option<&Secret>,
) -> Result<ReportKey, KeyReadError> {
    let (namespace, name) = (namespace.to_string(), at.name.clone());
    let Some(secret) = secret else {
        return Err(KeyReadError::Missing { namespace, name });
    };
    let Some(bytes) = secret.data.as_ref().and_then(|d| d.get(&at.key)) else {
        return Err(KeyReadError::NoKey {
            namespace,
            name,
            key: at.key.clone(),
        });
    };
    ReportKey::new(&bytes.0).map_err(|error| KeyReadError::Invalid {
        namespace,
        name,
        key: at.key.clone(),
        error,
    })
}

pub fn foreign_note(namespace: &str, name: &str) -> String {
    format!(
        "Secret {namespace}/{name} (gateway.tokenSecretRef) exists without the label {}={}: \
         the provisioner did not create it and leaves it as it is, so the gateway report \
         token of namespace {namespace} is not issued; delete or rename that Secret to let \
         the provisioner manage it",
        MANAGED_BY.0, MANAGED_BY.1
    )
}

/// What the pod templates carry while this process cannot issue: the last token it issued
/// in the namespace, if any.
fn issued(last: Option<String>) -> Issued {
    last.map_or(Issued::Nothing, Issued::Version)
}

/// The key of an announcement in [`super::Memory`]'s once-until-resolved set.
fn once_key(what: &str, actor: &AsyncActor) -> String {
    format!("gateway-report/{what}/{}", actor_key(actor))
}

async fn report_key<C: Cluster>(
    rec: &Reconciler<C>,
    at: &SecretKeySelector,
) -> Result<Arc<ReportKey>, KeyReadError> {
    let mem = &rec.memory.gateway_report;
    if let Some(k) = mem.fresh_key() {
        return Ok(k);
    }
    let ns = rec.cluster.platform_namespace().to_string();
    let secret = rec
        .cluster
        .read_secret(&ns, &at.name)
        .await
        .map_err(|e| KeyReadError::Read {
            namespace: ns.clone(),
            name: at.name.clone(),
            error: e.to_string(),
        })?;
    let key = Arc::new(key_from(&ns, at, secret.as_ref())?);
    mem.set_key(key.clone());
    Ok(key)
}

/// Announces a problem with a Warning event on `actor`, once until it is resolved.
async fn announce<C: Cluster>(rec: &Reconciler<C>, actor: &AsyncActor, what: &str, note: String) {
    if rec.memory.first_time(&once_key(what, actor)) {
        warn!(actor = %actor_key(actor), "{note}");
        let ev = EventSpec::warning(Reason::GatewayReportToken, note);
        rec.cluster.event(actor, ev).await;
    }
}

/// Before the actor's workload (its sidecars read the token at start): the namespace's
/// token Secret, applied when the key, the namespace's uid or the Secret changed, or after
/// [`REASSERT`]. Never fails the reconcile: a problem is a Warning event on the actor, and
/// the workloads keep the version this process issued last (none after a restart, which
/// rolls the pods once more when issuing works again).
pub async fn ensure<C: Cluster>(rec: &Reconciler<C>, actor: &AsyncActor, ns: &str) -> Issued {
    let Some((key_at, token_at)) = rec.config.gateway.report_tokens() else {
        return Issued::Nothing;
    };
    let mem = &rec.memory.gateway_report;
    let okey = ObjectKey::new(ObjectKind::Secret, ns, &token_at.name);
    let last = rec.memory.applied(&okey);
    if last.as_ref().is_some_and(|l| l.at.elapsed() < RECHECK) {
        return issued(mem.last_issued(ns));
    }
    let key = match report_key(rec, key_at).await {
        Ok(k) => k,
        Err(e) => {
            announce(rec, actor, "key", e.to_string()).await;
            return issued(mem.last_issued(ns));
        }
    };
    rec.memory.resolved(&once_key("key", actor));
    // The token is bound to this namespace's uid: one made again under the same name gets
    // a token of its own, and the gateway refuses the old one.
    let uid = match rec.cluster.namespace_uid(ns).await {
        Ok(Some(uid)) => uid,
        Ok(None) => {
            let note = format!("namespace {ns} does not exist: no gateway report token issued");
            announce(rec, actor, "namespace", note).await;
            return issued(mem.last_issued(ns));
        }
        Err(e) => {
            let note = format!("reading namespace {ns}'s uid for its gateway report token: {e}");
            announce(rec, actor, "namespace", note).await;
            return issued(mem.last_issued(ns));
        }
    };
    rec.memory.resolved(&once_key("namespace", actor));
    let token = match key.token(ns, &uid) {
        Ok(t) => t,
        Err(e) => {
            announce(rec, actor, "token", e.to_string()).await;
            return issued(mem.last_issued(ns));
        }
    };
    let version = asya_api::report_token::fingerprint(&token);
    let desired = render(ns, token_at, &token);
    let hash = desired_hash(&desired);
    if last.is_some_and(|l| l.hash == hash && l.at.elapsed() < REASSERT) {
        mem.set_issued(ns, version.clone());
        return Issued::Version(version);
    }
    let existing = match rec.cluster.read_secret(ns, &token_at.name).await {
        Ok(s) => s,
        Err(e) => {
            let note = format!("reading Secret {ns}/{}: {e}", token_at.name);
            announce(rec, actor, "read", note).await;
            return issued(mem.last_issued(ns));
        }
    };
    if issue_step(existing.as_ref()) == Issue::Foreign {
        announce(rec, actor, "foreign", foreign_note(ns, &token_at.name)).await;
        mem.forget_issued(ns);
        return Issued::Nothing;
    }
    // Forced only over our own Secret (the one read); a create is not, and fails if one was
    // made meanwhile.
    let write = match &existing {
        Some(s) => Write::Update {
            uid: s.metadata.uid.clone(),
        },
        None => Write::Create,
    };
    match rec
        .cluster
        .apply(ns, &Object::Secret(desired), &write)
        .await
    {
        Ok(answer) => {
            for what in ["read", "foreign", "apply"] {
                rec.memory.resolved(&once_key(what, actor));
            }
            let applied = Applied {
                hash,
                generation: answer.generation,
                at: Instant::now(),
            };
            rec.memory.record_applied(okey, applied);
            mem.set_issued(ns, version.clone());
            Issued::Version(version)
        }
        Err(e) => {
            let note = format!("writing Secret {ns}/{}: {e}", token_at.name);
            announce(rec, actor, "apply", note).await;
            issued(mem.last_issued(ns))
        }
    }
}

/// After an actor's cleanup: with no other live actor in the namespace, its token Secret
/// goes (only when ours). Best effort: a failure is logged, never keeps the actor.
pub async fn release<C: Cluster>(rec: &Reconciler<C>, actor: &AsyncActor, ns: &str) {
    let Some((_, token_at)) = rec.config.gateway.report_tokens() else {
        return;
    };
    let c = &rec.cluster;
    if super::identity::others_live(c, ns, actor) {
        return;
    }
    let name = &token_at.name;
    rec.memory.forget_applied(ObjectKind::Secret, ns, name);
    rec.memory.gateway_report.forget_issued(ns);
    let existing = match c.read_secret(ns, name).await {
        Ok(s) => s,
        Err(e) => {
            warn!(namespace = %ns, secret = %name, error = %e, "could not read the namespace's gateway report token Secret; it stays");
            return;
        }
    };
    if release_step(false, existing.as_ref()) != Release::Delete {
        return;
    }
    // The uid precondition: the Secret read (and found ours) is the one deleted.
    let uid = existing.as_ref().and_then(|s| s.metadata.uid.clone());
    match c.delete(ObjectKind::Secret, ns, name, uid.as_deref()).await {
        Ok(_) => {
            info!(namespace = %ns, secret = %name, "gateway report token removed with the namespace's last actor")
        }
        Err(e) => {
            warn!(namespace = %ns, secret = %name, error = %e, "could not delete the namespace's gateway report token Secret")
        }
    }
}

#[cfg(test)]
mod tests;
