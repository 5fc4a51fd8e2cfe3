//! The lifecycle of a namespace's end queues (`asya-{ns}-x-sink`, `asya-{ns}-x-sump`): they
//! outlive each actor but not their namespace. Once the namespace is gone an empty one is
//! deleted; a non-empty one (unread results are data) is kept for the configured
//! `endQueueRetention`, said in a log line and the `end_queues_retained` metric, then deleted.
//!
//! Only namespaces whose actors this provisioner cleaned up are looked at (or whose successor
//! of the same name met them, `reconcile/claims.rs`), so a broker shared with another
//! cluster keeps that cluster's queues. Retained queues are remembered in the ConfigMap
//! [`RETAINED_CONFIGMAP`] of the provisioner's namespace, so a restart neither loses them nor
//! restarts their clock.
//!
//! The queue's `QueueClaim` (docs/DESIGN.md §9) says whose it is: the namespace it names is
//! the one judged, by uid, so a namespace deleted and created again under the same name does
//! not keep (nor take over) its predecessor's end queues; a claim of another owner leaves
//! the queue alone. The claim is deleted after the queue, once the name exists on no
//! transport: a queue kept for its messages keeps its claim, and so stays its namespace's.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use asya_api::naming;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tracing::{info, warn};

use crate::kube_cluster::KubeCluster;
use crate::metrics::Metrics;
use crate::queue::owner::Claimant;
use crate::queue::{QueueError, QueueOps};
use crate::reconcile::{Platform, Writes};
use crate::transports::Transports;
use asya_api::queue_claim::QueueClaim;

/// The ConfigMap (in the provisioner's namespace) of end queues kept after their namespace.
pub const RETAINED_CONFIGMAP: &str = "asya-end-queues";
/// How often the sweep runs.
pub const SWEEP: Duration = Duration::from_secs(15);
const MANAGER: &str = "asya-queue-provisioner-end-queues";

/// What to do with one end queue of a namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fate {
    /// The namespace exists (again): the queue is in use.
    InUse,
    /// The namespace is still being deleted: look again later.
    Wait,
    Delete {
        reason: &'static str,
    },
    /// Keep it until `until` (messages in it).
    Retain {
        until: Timestamp,
    },
}

/// The namespace as the API server tells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NamespaceState {
    Active,
    Terminating,
    Gone,
}

/// The state of the namespace an end queue belongs to: `found` is the namespace of that name
/// now (its uid, and whether it is being deleted), `claim_uid` the namespace uid its claim
/// records (`None`: no claim, a queue from before the claims, judged by the name). A
/// namespace of that name with another uid is a later one: the queue's own is gone.
pub fn namespace_state(found: Option<(&str, bool)>, claim_uid: Option<&str>) -> NamespaceState {
    match found {
        None => NamespaceState::Gone,
        Some((uid, _)) if claim_uid.is_some_and(|c| c != uid) => NamespaceState::Gone,
        Some((_, true)) => NamespaceState::Terminating,
        Some((_, false)) => NamespaceState::Active,
    }
}

/// Decides one end queue's fate: `messages` in it now, `since` when it was first found with
/// messages after its namespace went (None: not before).
pub fn decide(
    ns: NamespaceState,
    messages: i64,
    since: Option<Timestamp>,
    now: Timestamp,
    retention: Duration,
) -> Fate {
    match ns {
        NamespaceState::Active => return Fate::InUse,
        NamespaceState::Terminating => return Fate::Wait,
        NamespaceState::Gone => {}
    }
    if messages <= 0 {
        return Fate::Delete { reason: "empty" };
    }
    let since = since.unwrap_or(now);
    let until = since
        .checked_add(SignedDuration::try_from(retention).unwrap_or(SignedDuration::MAX))
        .unwrap_or(Timestamp::MAX);
    if now >= until {
        Fate::Delete {
            reason: "retention",
        }
    } else {
        Fate::Retain { until }
    }
}

/// Key of a retained queue in the ConfigMap: `{transport}.{queue}` (both DNS-safe).
pub fn retained_key(transport: &str, queue: &str) -> String {
    format!("{transport}.{queue}")
}

/// The transport and queue of a ConfigMap key, with the namespace the queue belongs to.
pub fn parse_retained_key(key: &str) -> Option<(String, String, String)> {
    let (transport, queue) = key.split_once('.')?;
    let rest = queue.strip_prefix("asya-")?;
    let ns = [naming::SINK_ACTOR, naming::SUMP_ACTOR]
        .iter()
        .find_map(|end| rest.strip_suffix(&format!("-{end}")))?;
    (!ns.is_empty()).then(|| (transport.to_string(), queue.to_string(), ns.to_string()))
}

/// Namespaces (transport, namespace) whose actors were cleaned up and whose end queues are
/// to be looked after.
#[derive(Default, Clone)]
pub struct Candidates(Arc<Mutex<BTreeSet<(String, String)>>>);

impl Candidates {
    pub fn add(&self, transport: &str, ns: &str) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((transport.into(), ns.into()));
    }
    fn take(&self) -> BTreeSet<(String, String)> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Runs the sweep every [`SWEEP`] until the process ends.
pub async fn run(
    client: kube::Client,
    own_namespace: String,
    transports: Arc<Transports>,
    candidates: Candidates,
    retention: Duration,
    metrics: Metrics,
) {
    let sweeper = Sweeper {
        c: KubeCluster::api_only(client, transports.clone(), &own_namespace),
        transports,
        retention,
        metrics,
    };
    let mut tick = tokio::time::interval(SWEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let mut pending = candidates.take();
        if let Err(e) = sweeper.sweep(&mut pending).await {
            warn!(error = %e, "end queue sweep failed; retrying");
        }
        // What could not be decided yet (namespace terminating, broker down) comes back.
        for (t, ns) in pending {
            candidates.add(&t, &ns);
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum SweepError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("transport: {0}")]
    Queue(#[from] QueueError),
}

/// The sweep, over the API server's ports ([`Writes`]: the claims; [`Platform`]: the
/// namespaces and the ConfigMap of retained queues).
struct Sweeper<C> {
    c: C,
    transports: Arc<Transports>,
    retention: Duration,
    metrics: Metrics,
}

impl<C: Writes + Platform> Sweeper<C> {
    /// [`namespace_state`] of `ns` for a queue whose claim records `claim_uid`.
    async fn namespace(
        &self,
        ns: &str,
        claim_uid: Option<&str>,
    ) -> Result<NamespaceState, kube::Error> {
        let n = self.c.namespace_now(ns).await?;
        let found = n.as_ref().map(|n| (n.uid.as_str(), n.terminating));
        Ok(namespace_state(found, claim_uid))
    }

    /// Whether `queue` exists on any enabled transport.
    async fn exists_anywhere(&self, queue: &str) -> Result<bool, QueueError> {
        for t in self.transports.enabled() {
            let (backend, _) = self.transports.get(&t).await?;
            if backend.exists(queue).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// After the end queue was deleted: its claim, once the name exists on no transport (a
    /// copy kept elsewhere keeps it), and only the claim just read (uid precondition).
    async fn release(&self, queue: &str, claim: &QueueClaim) {
        match self.exists_anywhere(queue).await {
            Ok(false) => {}
            Ok(true) => return,
            Err(e) => {
                warn!(queue = %queue, error = %e, "cannot tell whether the end queue is kept on another transport; its QueueClaim stays");
                return;
            }
        }
        let uid = claim.metadata.uid.as_deref().unwrap_or_default();
        match self.c.claim_delete(queue, uid).await {
            Ok(_) => {}
            Err(e) => {
                warn!(queue = %queue, error = %e, "could not delete the QueueClaim of a deleted end queue; it stays until replaced")
            }
        }
    }

    /// Looks after the end queues of `pending` namespaces and of the retained ones; leaves in
    /// `pending` the namespaces to look at again.
    async fn sweep(&self, pending: &mut BTreeSet<(String, String)>) -> Result<(), SweepError> {
        let retained: BTreeMap<String, String> = self
            .c
            .own_config_map(RETAINED_CONFIGMAP)
            .await?
            .unwrap_or_default();
        let mut work: Vec<(String, String, String, Option<Timestamp>)> = Vec::new();
        for (key, since) in &retained {
            if let Some((t, q, ns)) = parse_retained_key(key) {
                work.push((t, q, ns, since.parse().ok()));
            }
        }
        for (t, ns) in pending.iter() {
            for q in [naming::sink_queue(ns), naming::sump_queue(ns)] {
                if !retained.contains_key(&retained_key(t, &q)) {
                    work.push((t.clone(), q, ns.clone(), None));
                }
            }
        }
        let mut changes: BTreeMap<String, Option<String>> = BTreeMap::new();
        let mut still = BTreeSet::new();
        let now = Timestamp::now();
        for (t, q, ns, since) in work {
            let end = if q == naming::sink_queue(&ns) {
                naming::SINK_ACTOR
            } else {
                naming::SUMP_ACTOR
            };
            let key = retained_key(&t, &q);
            let claim = self.c.claim_get(&q).await?;
            // Claimed by another owner: not this namespace's end queue (docs/DESIGN.md §9).
            if let Some(c) = claim
                .as_ref()
                .filter(|c| c.spec.namespace != ns || c.spec.actor != end)
            {
                warn!(queue = %q, namespace = %ns, transport = %t, owner_namespace = %c.spec.namespace, owner_actor = %c.spec.actor,
                    "end queue of a deleted namespace not deleted: claimed by another owner");
                if since.is_some() {
                    changes.insert(key, None);
                }
                continue;
            }
            let claim_uid = claim.as_ref().map(|c| c.spec.namespace_uid.as_str());
            let state = self.namespace(&ns, claim_uid).await?;
            let (backend, _) = self.transports.get(&t).await?;
            let messages = if state == NamespaceState::Gone {
                let Some(d) = backend.counted_depth(&self.metrics, &q).await? else {
                    // Not on this transport (a claim holds the name on all of them): only
                    // its claim may be left to release.
                    if let Some(c) = &claim {
                        self.release(&q, c).await;
                    }
                    if since.is_some() {
                        changes.insert(key, None);
                    }
                    continue;
                };
                d.queued.unwrap_or(0) + d.processing.unwrap_or(0)
            } else {
                0
            };
            match decide(state, messages, since, now, self.retention) {
                Fate::InUse => {
                    if since.is_some() {
                        changes.insert(key, None);
                    }
                }
                Fate::Wait => {
                    still.insert((t, ns));
                }
                Fate::Retain { until } => {
                    if since.is_none() {
                        info!(queue = %q, namespace = %ns, transport = %t, messages, until = %until,
                            "end queue of a deleted namespace holds messages: kept until the retention (endQueueRetention) ends, then deleted");
                        changes.insert(key, Some(now.to_string()));
                    }
                }
                Fate::Delete { reason } => {
                    // Only the namespace's own end queue: claimed by it (above), or without a
                    // claim (from before the claims) recorded by the broker as its own; a
                    // queue of that name recorded as another actor's is left.
                    let res = match &claim {
                        Some(_) => backend.delete(&q).await,
                        None => {
                            backend
                                .delete_owned(&q, &Claimant::new(&ns, end, false))
                                .await
                        }
                    };
                    self.metrics.queue_op(backend.kind(), "delete", res.is_ok());
                    if let Err(QueueError::NotOurs(e)) = &res {
                        warn!(queue = %q, namespace = %ns, transport = %t, error = %e,
                            "end queue of a deleted namespace not deleted: not its own");
                        if since.is_some() {
                            changes.insert(key, None);
                        }
                        continue;
                    }
                    res?;
                    if let Some(c) = &claim {
                        self.release(&q, c).await;
                    }
                    info!(queue = %q, namespace = %ns, transport = %t, reason, messages,
                        "end queue of a deleted namespace deleted");
                    self.metrics.end_queue_deleted(&t, reason);
                    if since.is_some() {
                        changes.insert(key, None);
                    }
                }
            }
        }
        *pending = still;
        let kept = retained_after(&retained, &changes);
        if !changes.is_empty() {
            // The whole map: an apply leaves out what it no longer names.
            self.c
                .own_config_map_apply(RETAINED_CONFIGMAP, MANAGER, &kept)
                .await?;
        }
        let kept = kept.len() as i64;
        self.metrics.end_queues_retained.set(kept.max(0));
        Ok(())
    }
}

/// The retained queues after `changes` (`None`: no longer retained).
fn retained_after(
    retained: &BTreeMap<String, String>,
    changes: &BTreeMap<String, Option<String>>,
) -> BTreeMap<String, String> {
    let mut out = retained.clone();
    for (k, v) in changes {
        match v {
            Some(v) => out.insert(k.clone(), v.clone()),
            None => out.remove(k),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn the_retained_map_keeps_what_no_change_names() {
        let m = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let retained = m(&[("a", "t1"), ("b", "t2")]);
        let changes = BTreeMap::from([
            ("a".to_string(), None),
            ("c".to_string(), Some("t3".to_string())),
        ]);
        // Applied whole: the server-side apply of only `changes` would drop `b`.
        assert_eq!(
            retained_after(&retained, &changes),
            m(&[("b", "t2"), ("c", "t3")])
        );
        assert_eq!(retained_after(&retained, &BTreeMap::new()), retained);
    }

    #[test]
    fn a_living_namespace_keeps_its_end_queues() {
        let now = t("2026-01-01T00:00:00Z");
        assert_eq!(
            decide(NamespaceState::Active, 5, None, now, WEEK),
            Fate::InUse
        );
        assert_eq!(
            decide(NamespaceState::Terminating, 0, None, now, WEEK),
            Fate::Wait
        );
    }

    #[test]
    fn after_the_namespace_empty_goes_now_and_messages_wait_for_the_retention() {
        let now = t("2026-01-01T00:00:00Z");
        assert_eq!(
            decide(NamespaceState::Gone, 0, None, now, WEEK),
            Fate::Delete { reason: "empty" }
        );
        assert_eq!(
            decide(NamespaceState::Gone, 3, None, now, WEEK),
            Fate::Retain {
                until: t("2026-01-08T00:00:00Z")
            }
        );
        let since = Some(t("2026-01-01T00:00:00Z"));
        assert_eq!(
            decide(
                NamespaceState::Gone,
                3,
                since,
                t("2026-01-07T23:59:59Z"),
                WEEK
            ),
            Fate::Retain {
                until: t("2026-01-08T00:00:00Z")
            }
        );
        assert_eq!(
            decide(
                NamespaceState::Gone,
                3,
                since,
                t("2026-01-08T00:00:00Z"),
                WEEK
            ),
            Fate::Delete {
                reason: "retention"
            }
        );
        // Read meanwhile: deleted at once.
        assert_eq!(
            decide(
                NamespaceState::Gone,
                0,
                since,
                t("2026-01-02T00:00:00Z"),
                WEEK
            ),
            Fate::Delete { reason: "empty" }
        );
    }

    #[test]
    fn a_namespace_of_the_same_name_but_another_uid_is_a_later_one() {
        use NamespaceState::*;
        // No claim (from before the claims): by the name, as before.
        assert_eq!(namespace_state(Some(("u2", false)), None), Active);
        assert_eq!(namespace_state(Some(("u2", true)), None), Terminating);
        assert_eq!(namespace_state(None, None), Gone);
        // Claimed by uid u1: its namespace is the one judged.
        assert_eq!(namespace_state(Some(("u1", false)), Some("u1")), Active);
        assert_eq!(namespace_state(Some(("u1", true)), Some("u1")), Terminating);
        // Deleted and created again: the queue's own namespace is gone, so the queue is
        // deleted (empty) or kept for the retention, not handed to the new one.
        assert_eq!(namespace_state(Some(("u2", false)), Some("u1")), Gone);
        assert_eq!(namespace_state(None, Some("u1")), Gone);
    }

    #[test]
    fn retained_keys_name_transport_queue_and_namespace() {
        let k = retained_key("rabbitmq", "asya-team-a-x-sink");
        assert_eq!(
            parse_retained_key(&k),
            Some((
                "rabbitmq".into(),
                "asya-team-a-x-sink".into(),
                "team-a".into()
            ))
        );
        assert_eq!(
            parse_retained_key("sqs.asya-ns-x-sump").map(|p| p.2),
            Some("ns".into())
        );
        assert_eq!(parse_retained_key("rabbitmq.asya-ns-actor"), None);
        assert_eq!(parse_retained_key("rabbitmq.asya--x-sink"), None);
        assert_eq!(parse_retained_key("nodot"), None);
    }
}
