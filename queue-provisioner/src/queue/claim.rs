//! The provisioner's decisions on a queue's `QueueClaim` (docs/DESIGN.md §9, "Queue names
//! have one owner"): when a claim another holds is stale, and the refusal's words. Whose a
//! claim is (`asya_api::queue_claim::holder`) is the rule the webhook shares. Pure; the claim
//! step (`reconcile/claims.rs`) and the end queue sweep (`end_queues.rs`) read and write.

use asya_api::naming;
use asya_api::queue_claim::{ClaimOwner, Holder, QueueClaimSpec, holder, owner_text};

use super::owner::OwnershipError;

/// Whether the owner a claim names still exists: its namespace, by uid
/// (`namespace_uid_now`: the uid of the namespace of that name now; `None`: there is none),
/// and, for an actor's queue, an AsyncActor of that namespace whose queue it is
/// (`actor_present`; one being deleted counts: it holds its queue until its cleanup has
/// deleted it). A namespace keeps its end queue names as long as it exists.
pub fn owner_alive(
    spec: &QueueClaimSpec,
    namespace_uid_now: Option<&str>,
    actor_present: bool,
) -> bool {
    namespace_uid_now == Some(spec.namespace_uid.as_str())
        && (naming::is_end_actor(&spec.actor) || actor_present)
}

/// A claim someone else holds may be deleted and replaced only when its queue exists on no
/// transport (`queue_exists`) and its owner is gone: then nothing of the owner's is left to
/// protect (a claim made by an owner whose queue creation failed, or a queue deleted by
/// hand without its claim). An owner still alive, or a queue still there, keeps the claim.
///
/// No creation can be in flight for an owner that is gone: an AsyncActor keeps the
/// provisioner's finalizer until its cleanup, which deletes the queue before the claim, and
/// a namespace is deleted only after its AsyncActors. The claim step also runs one at a
/// time per queue name in the process (the leader), and the delete carries the claim's uid
/// as a precondition, so a claim replaced meanwhile is not deleted.
pub fn stale(queue_exists: bool, owner_alive: bool) -> bool {
    !queue_exists && !owner_alive
}

/// The refusal of queue `queue`, claimed by `spec`, to `who` (whose claim it is not).
pub fn refusal(queue: &str, spec: &QueueClaimSpec, who: &ClaimOwner) -> OwnershipError {
    let release = format!(
        "releases it by deleting the queue on the broker and then the QueueClaim (kubectl delete queueclaim {queue})"
    );
    let message = match holder(spec, who) {
        Holder::EarlierNamespace => {
            let end = if naming::is_end_actor(&spec.actor) {
                " (an end queue of a deleted namespace is deleted once empty, or after endQueueRetention)"
            } else {
                ""
            };
            format!(
                "queue {queue} belongs to an earlier namespace {ns} (uid {old}), deleted since; this namespace {ns} is uid {new}: the leftover queue keeps its owner (QueueClaim {queue}) and is not adopted, purged or deleted{end}. The platform team {release}, or gives it to this namespace: kubectl patch queueclaim {queue} --type merge -p '{{\"spec\":{{\"namespaceUid\":\"{new}\"}}}}'",
                ns = spec.namespace,
                old = spec.namespace_uid,
                new = who.namespace_uid,
            )
        }
        Holder::Another | Holder::Ours => format!(
            "queue {queue} is claimed by {owner} (namespace uid {uid}; QueueClaim {queue}), not by actor {ns}/{actor}: not adopted, purged or deleted. A queue keeps its owner while it exists, after its actor or namespace is deleted; the platform team {release}",
            owner = owner_text(spec),
            uid = spec.namespace_uid,
            ns = who.namespace,
            actor = who.actor,
        ),
    };
    OwnershipError::Claimed {
        queue: queue.into(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(ns: &str, uid: &str, actor: &str) -> QueueClaimSpec {
        QueueClaimSpec {
            namespace: ns.into(),
            namespace_uid: uid.into(),
            actor: actor.into(),
            transport: None,
        }
    }

    #[test]
    fn an_owner_is_alive_while_its_namespace_and_for_an_actor_queue_its_actor_are() {
        let end = spec("team-a", "u1", "x-sink");
        // The namespace with no actors left keeps its end queue names.
        assert!(owner_alive(&end, Some("u1"), false));
        // Deleted, or deleted and created again (another uid): gone.
        assert!(!owner_alive(&end, None, false));
        assert!(!owner_alive(&end, Some("u2"), true));
        let actor = spec("team", "u1", "a-x");
        assert!(owner_alive(&actor, Some("u1"), true));
        assert!(!owner_alive(&actor, Some("u1"), false), "its actor is gone");
    }

    #[test]
    fn a_claim_is_stale_only_without_queue_and_owner() {
        assert!(stale(false, false));
        assert!(!stale(true, false), "a leftover queue keeps its owner");
        assert!(!stale(false, true), "a live owner keeps its name");
        assert!(!stale(true, true));
    }

    #[test]
    fn the_refusal_names_queue_owner_and_the_release() {
        let who = ClaimOwner::new("team", "u9", "a-x-sink");
        let e = refusal("asya-team-a-x-sink", &spec("team-a", "u1", "x-sink"), &who);
        assert_eq!(
            e.to_string(),
            "queue asya-team-a-x-sink is claimed by the end queue x-sink of namespace \"team-a\" (namespace uid u1; QueueClaim asya-team-a-x-sink), not by actor team/a-x-sink: not adopted, purged or deleted. A queue keeps its owner while it exists, after its actor or namespace is deleted; the platform team releases it by deleting the queue on the broker and then the QueueClaim (kubectl delete queueclaim asya-team-a-x-sink)"
        );
    }

    #[test]
    fn a_recreated_namespace_is_told_the_queue_is_its_predecessors() {
        let who = ClaimOwner::new("team-a", "u2", "x-sink");
        let e = refusal("asya-team-a-x-sink", &spec("team-a", "u1", "x-sink"), &who);
        assert_eq!(
            e.to_string(),
            "queue asya-team-a-x-sink belongs to an earlier namespace team-a (uid u1), deleted since; this namespace team-a is uid u2: the leftover queue keeps its owner (QueueClaim asya-team-a-x-sink) and is not adopted, purged or deleted (an end queue of a deleted namespace is deleted once empty, or after endQueueRetention). The platform team releases it by deleting the queue on the broker and then the QueueClaim (kubectl delete queueclaim asya-team-a-x-sink), or gives it to this namespace: kubectl patch queueclaim asya-team-a-x-sink --type merge -p '{\"spec\":{\"namespaceUid\":\"u2\"}}'"
        );
        // An actor's queue left by `skip-cleanup`: no word of the end queue sweep.
        let who = ClaimOwner::new("team-a", "u2", "a");
        let e = refusal("asya-team-a-a", &spec("team-a", "u1", "a"), &who).to_string();
        assert!(!e.contains("endQueueRetention"), "{e}");
        assert!(e.contains("earlier namespace team-a (uid u1)"), "{e}");
    }
}
