//! Each actor namespace's own state identity (docs/DESIGN.md §9, §10): on the platform's
//! Redis (`stateProxy.redis`), a user `asya-ns-{ns}` with a generated password, allowed only
//! the keys `{ns}/*` and the commands the connector needs, its password only in the
//! namespace's Secret `asya-state-redis`. Kept and rotated like the broker identity; an owner
//! mark outside every namespace's keys (`asya:owner:{ns}`, the namespace's uid) keeps a
//! namespace deleted and made again by another team from inheriting the state under `{ns}/`.
//! [`plan`] decides (pure), [`redis_admin`] talks to Redis, `reconcile::state_identity` does it.

pub mod plan;
pub mod redis_admin;

/// Why the namespace's state identity could not be ensured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// Redis unreachable, or a call failed in a way a retry may fix.
    #[error("the platform's Redis is unavailable: {0}")]
    Unavailable(String),
    /// A refusal no retry fixes by itself (configuration, a Secret not ours, Redis refusing).
    #[error("{0}")]
    Rejected(String),
    /// The state under `{ns}/` belongs to an earlier namespace of the same name.
    #[error(
        "the state under {namespace}/ in the platform's Redis belongs to an earlier namespace \
         {namespace} (uid {owner}), which was deleted; this namespace (uid {uid}) gets no Redis \
         user until the platform team releases it: delete the key asya:owner:{namespace} (and, \
         to discard the old state, the keys {namespace}/*)"
    )]
    NotOurs {
        namespace: String,
        owner: String,
        uid: String,
    },
}

impl StateError {
    /// How long to wait before the next attempt.
    pub fn retry_after(&self) -> std::time::Duration {
        match self {
            StateError::Unavailable(_) => std::time::Duration::from_secs(5),
            StateError::Rejected(_) | StateError::NotOurs { .. } => {
                std::time::Duration::from_secs(60)
            }
        }
    }
}
