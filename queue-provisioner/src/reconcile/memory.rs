//! What the controller remembers between reconciles, in this process only: failures per
//! actor (backoff), queues ensured recently, and what it applied last per object. Keys are
//! typed, so a lookup cannot mix up kinds, namespaces and names.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use asya_api::report_token::ReportKey;

use crate::apply_skip::Applied;
use crate::model::ObjectKind;
use crate::queue::{QueueInfo, QueueSpec};

use super::plan;

/// How long a queue's existence is trusted: checked once per interval, not per reconcile.
/// Below [`plan::PERIOD`], so each periodic reconcile checks.
pub const RECHECK: Duration = Duration::from_secs(55);

/// One object the controller applies.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ObjectKey {
    pub kind: ObjectKind,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(kind: ObjectKind, namespace: &str, name: &str) -> Self {
        ObjectKey {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

/// One queue on one transport.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct QueueKey {
    pub transport: String,
    pub queue: String,
}

impl QueueKey {
    pub fn new(transport: &str, queue: &str) -> Self {
        QueueKey {
            transport: transport.into(),
            queue: queue.into(),
        }
    }
}

/// A queue ensured or checked at `at`, with the spec it was ensured with.
#[derive(Clone, Debug)]
struct Ensured {
    at: Instant,
    spec: QueueSpec,
    info: QueueInfo,
}

#[derive(Default)]
pub struct Memory {
    /// Consecutive failures per actor (`namespace/name`), for exponential backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// Within [`RECHECK`] a reconcile trusts these queues without asking the broker.
    ensured: Mutex<HashMap<QueueKey, Ensured>>,
    /// To skip applies that would not change anything.
    applied: Mutex<HashMap<ObjectKey, Applied>>,
    /// Objects of an older layout removed (or found absent) already: not asked about again.
    legacy_gone: Mutex<HashSet<ObjectKey>>,
    /// The gateway report key as last read, and namespaces whose token Secret is foreign.
    pub gateway_report: ReportTokens,
    /// Namespaces' broker identities as last set on the broker, by (transport, namespace).
    identities: Mutex<HashMap<(String, String), IdentitySet>>,
    /// One identity step at a time per (transport, namespace): two actors of a new namespace
    /// reconciled at once must not each issue a password (the broker would keep one, the
    /// Secret the other).
    identity_locks: Mutex<HashMap<(String, String), IdentityLock>>,
    /// Actors already told they share the platform's credentials (one event each).
    announced: Mutex<std::collections::HashSet<String>>,
    /// One claim step at a time per queue name ([`super::claims`]).
    claim_locks: ClaimLocks,
}

/// Locks of the claim step, by queue name: a fixed set of stripes (a name always takes the
/// same one), so they cost the same however many names come and go. Two names sharing a
/// stripe only wait for each other; no step holds two.
pub struct ClaimLocks(Vec<IdentityLock>);

/// Stripes of [`ClaimLocks`].
const CLAIM_STRIPES: usize = 64;

impl Default for ClaimLocks {
    fn default() -> Self {
        ClaimLocks(
            (0..CLAIM_STRIPES)
                .map(|_| IdentityLock::default())
                .collect(),
        )
    }
}

/// Held during one namespace's identity step.
pub type IdentityLock = std::sync::Arc<tokio::sync::Mutex<()>>;

/// A namespace's broker user as last set: the actors whose queues its permissions cover
/// (the permissions are `permissions::for_namespace` of them), and its credential version.
#[derive(Clone, Debug, PartialEq)]
pub struct IdentitySet {
    pub actors: std::collections::BTreeSet<String>,
    pub version: u64,
    pub at: Instant,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Memory {
    /// Whether this legacy object was removed (or found absent) before by this process.
    pub fn legacy_gone(&self, key: &ObjectKey) -> bool {
        lock(&self.legacy_gone).contains(key)
    }

    pub fn record_legacy_gone(&self, key: ObjectKey) {
        lock(&self.legacy_gone).insert(key);
    }

    /// The next wait after a failure of actor `key` (counted), or zero after a success (the
    /// count starts again).
    pub fn backoff(&self, key: &str, failed: bool) -> Duration {
        let mut m = lock(&self.failures);
        if !failed {
            m.remove(key);
            return Duration::ZERO;
        }
        let n = m.entry(key.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        plan::backoff(*n)
    }

    /// A queue ensured with `spec`: its info, and whether it is still within [`RECHECK`].
    pub fn ensured(&self, key: &QueueKey, spec: &QueueSpec) -> Option<(bool, QueueInfo)> {
        lock(&self.ensured)
            .get(key)
            .filter(|e| e.spec == *spec)
            .map(|e| (e.at.elapsed() < RECHECK, e.info.clone()))
    }

    pub fn ensured_now(&self, key: QueueKey, spec: QueueSpec, info: QueueInfo) {
        lock(&self.ensured).insert(
            key,
            Ensured {
                at: Instant::now(),
                spec,
                info,
            },
        );
    }

    pub fn forget_queue(&self, key: &QueueKey) {
        lock(&self.ensured).remove(key);
    }

    pub fn applied(&self, key: &ObjectKey) -> Option<Applied> {
        lock(&self.applied).get(key).cloned()
    }

    pub fn was_applied(&self, key: &ObjectKey) -> bool {
        lock(&self.applied).contains_key(key)
    }

    pub fn record_applied(&self, key: ObjectKey, applied: Applied) {
        lock(&self.applied).insert(key, applied);
    }

    pub fn forget_applied(&self, kind: ObjectKind, ns: &str, name: &str) {
        lock(&self.applied).remove(&ObjectKey::new(kind, ns, name));
    }

    /// The identity last set for the namespace.
    pub fn identity(&self, transport: &str, ns: &str) -> Option<IdentitySet> {
        lock(&self.identities)
            .get(&(transport.to_string(), ns.to_string()))
            .cloned()
    }

    pub fn record_identity(&self, transport: &str, ns: &str, set: IdentitySet) {
        lock(&self.identities).insert((transport.to_string(), ns.to_string()), set);
    }

    /// The lock of the namespace's identity step.
    pub fn identity_lock(&self, transport: &str, ns: &str) -> IdentityLock {
        lock(&self.identity_locks)
            .entry((transport.to_string(), ns.to_string()))
            .or_default()
            .clone()
    }

    /// The lock of queue `name`'s claim step.
    pub fn claim_lock(&self, name: &str) -> IdentityLock {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        name.hash(&mut h);
        let i = (h.finish() % self.claim_locks.0.len() as u64) as usize;
        self.claim_locks.0[i].clone()
    }

    pub fn forget_identity(&self, transport: &str, ns: &str) {
        lock(&self.identities).remove(&(transport.to_string(), ns.to_string()));
    }

    /// Whether [`Self::first_time`] was asked about `key` before.
    pub fn seen(&self, key: &str) -> bool {
        lock(&self.announced).contains(key)
    }

    /// True the first time it is asked about `key` (since it was last [`Self::resolved`]).
    pub fn first_time(&self, key: &str) -> bool {
        lock(&self.announced).insert(key.to_string())
    }

    /// What `key` announced is resolved: announced again the next time it happens.
    pub fn resolved(&self, key: &str) {
        lock(&self.announced).remove(key);
    }

    /// Forgets every object of `kind` in `ns`.
    pub fn forget_kind_in(&self, kind: ObjectKind, ns: &str) {
        lock(&self.applied).retain(|k, _| !(k.kind == kind && k.namespace == ns));
    }
}

/// The gateway report tokens' memory (`gateway_report`): the key as last read (one read per
/// [`RECHECK`] for the whole cluster, not one per namespace) and the fingerprint of the token
/// last issued per namespace.
#[derive(Default)]
pub struct ReportTokens {
    key: Mutex<Option<(Instant, Arc<ReportKey>)>>,
    issued: Mutex<HashMap<String, String>>,
}

impl ReportTokens {
    pub fn fresh_key(&self) -> Option<Arc<ReportKey>> {
        lock(&self.key)
            .as_ref()
            .filter(|(at, _)| at.elapsed() < RECHECK)
            .map(|(_, k)| k.clone())
    }
    pub fn set_key(&self, key: Arc<ReportKey>) {
        *lock(&self.key) = Some((Instant::now(), key));
    }
    /// The fingerprint of the last token this process issued in `ns`.
    pub fn last_issued(&self, ns: &str) -> Option<String> {
        lock(&self.issued).get(ns).cloned()
    }
    pub fn set_issued(&self, ns: &str, version: String) {
        lock(&self.issued).insert(ns.to_string(), version);
    }
    pub fn forget_issued(&self, ns: &str) {
        lock(&self.issued).remove(ns);
    }
    /// As if [`RECHECK`] had passed since the key was read.
    #[cfg(test)]
    pub fn forget_key(&self) {
        *lock(&self.key) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_per_failure_up_to_five_minutes_and_a_success_resets_it() {
        let m = Memory::default();
        let waits: Vec<u64> = (0..10).map(|_| m.backoff("n/a", true).as_secs()).collect();
        assert_eq!(waits, [2, 4, 8, 16, 32, 64, 128, 256, 256, 256]);
        assert_eq!(m.backoff("n/a", false), Duration::ZERO);
        assert_eq!(m.backoff("n/a", true).as_secs(), 2);
        assert_eq!(m.backoff("n/b", true).as_secs(), 2, "per actor");
    }
}
