//! Who owns a queue name (docs/DESIGN.md §9, "Queue names have one owner"): the
//! cluster-scoped `QueueClaim`, named after the queue, that the queue provisioner creates
//! before it declares or adopts a queue and deletes only after the queue is gone, and that
//! the admission webhook reads before it admits an AsyncActor.
//!
//! `asya-{namespace}-{actor}` is not injective once names contain `-` (namespace `team`'s
//! actor `a-x-sink` and namespace `team-a`'s end queue `x-sink` are both
//! `asya-team-a-x-sink`), and a queue can outlive its actor (`asya.sh/skip-cleanup`, a
//! cleanup that gave up on the broker) or its namespace (end queues kept for their
//! messages). The claim outlives both with the queue, so the name stays its owner's whatever
//! happens to actors, namespaces or the namespace exchanges. Object names are unique, so
//! creating the claim is the atomic "first wins" between two actors that want one name.
//!
//! Pure: the naming and the rule "is this claim (namespace, namespace uid, actor)'s", shared by
//! the webhook and the provisioner.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::naming;

/// The owner of a queue name: an actor of a namespace, the namespace known by its uid (a
/// namespace deleted and created again under the same name is another owner).
#[derive(
    CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema,
)]
#[kube(
    group = "asya.sh",
    version = "v1alpha1",
    kind = "QueueClaim",
    shortname = "qc",
    derive = "Default",
    derive = "PartialEq",
    doc = "The owner of a queue name asya-{namespace}-{actor}, named after the queue: created by the queue provisioner before it declares or adopts the queue, deleted after the queue is deleted. Tenants have no access to it.",
    printcolumn = r#"{"name": "NAMESPACE", "type": "string", "jsonPath": ".spec.namespace", "description": "Namespace whose queue it is"}"#,
    printcolumn = r#"{"name": "ACTOR", "type": "string", "jsonPath": ".spec.actor", "description": "Actor the queue is named after (x-sink, x-sump: the namespace's end queues)"}"#,
    printcolumn = r#"{"name": "TRANSPORT", "type": "string", "jsonPath": ".spec.transport", "description": "Transport the queue was claimed on"}"#,
    printcolumn = r#"{"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name": "NAMESPACE-UID", "type": "string", "jsonPath": ".spec.namespaceUid", "description": "metadata.uid of the namespace when the queue was claimed", "priority": 1}"#
)]
#[serde(rename_all = "camelCase")]
pub struct QueueClaimSpec {
    /// The namespace whose queue this is.
    pub namespace: String,
    /// metadata.uid of that namespace when the queue was claimed: a namespace deleted and created again under the same name is not this owner.
    pub namespace_uid: String,
    /// The actor the queue is named after: spec.actor of an AsyncActor, or x-sink / x-sump for the namespace's end queues.
    pub actor: String,
    /// The transport the queue was claimed on (shown by kubectl; the claim holds the name on every transport).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
}

/// Who wants a queue: the actor (or end pseudo-actor) of a namespace, with the namespace's uid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimOwner {
    pub namespace: String,
    pub namespace_uid: String,
    pub actor: String,
}

impl ClaimOwner {
    pub fn new(namespace: &str, namespace_uid: &str, actor: &str) -> Self {
        ClaimOwner {
            namespace: namespace.into(),
            namespace_uid: namespace_uid.into(),
            actor: actor.into(),
        }
    }

    /// The queue this owner's claim is for.
    pub fn queue(&self) -> String {
        naming::actor_queue(&self.namespace, &self.actor)
    }
}

/// The claim's object name: the queue's own (`asya-{namespace}-{actor}` of two DNS labels is
/// a valid object name, at most 132 characters).
pub fn claim_name(queue: &str) -> String {
    queue.to_string()
}

/// The claim `owner` makes of its queue on `transport`.
pub fn claim_for(owner: &ClaimOwner, transport: &str) -> QueueClaim {
    let mut c = QueueClaim::new(
        &claim_name(&owner.queue()),
        QueueClaimSpec {
            namespace: owner.namespace.clone(),
            namespace_uid: owner.namespace_uid.clone(),
            actor: owner.actor.clone(),
            transport: Some(transport.to_string()),
        },
    );
    c.metadata.labels = Some(
        [(
            "app.kubernetes.io/managed-by".to_string(),
            "asya-queue-provisioner".to_string(),
        )]
        .into(),
    );
    c
}

/// Whose a claim is, from the point of view of one claimant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// The claimant's own: same namespace (same uid) and actor.
    Ours,
    /// An earlier namespace of the claimant's namespace's name (deleted since; another uid).
    EarlierNamespace,
    /// Another namespace's or another actor's.
    Another,
}

/// Whose the claim `spec` is, for `who`.
pub fn holder(spec: &QueueClaimSpec, who: &ClaimOwner) -> Holder {
    if spec.namespace != who.namespace || spec.actor != who.actor {
        Holder::Another
    } else if spec.namespace_uid == who.namespace_uid && !who.namespace_uid.is_empty() {
        Holder::Ours
    } else {
        Holder::EarlierNamespace
    }
}

/// Whether the claim is held by another (namespace, actor) than `namespace`/`actor`, judged
/// by the names alone (admission does not know the namespace's uid; a claim of an earlier
/// namespace of the same name is for the provisioner to refuse).
pub fn held_by_another(spec: &QueueClaimSpec, namespace: &str, actor: &str) -> bool {
    spec.namespace != namespace || spec.actor != actor
}

/// The claim's owner in words: `the queue of actor "a" of namespace "team"` or `the end
/// queue x-sink of namespace "team-a"`.
pub fn owner_text(spec: &QueueClaimSpec) -> String {
    if naming::is_end_actor(&spec.actor) {
        format!(
            "the end queue {} of namespace {:?}",
            spec.actor, spec.namespace
        )
    } else {
        format!(
            "the queue of actor {:?} of namespace {:?}",
            spec.actor, spec.namespace
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    fn spec(ns: &str, uid: &str, actor: &str) -> QueueClaimSpec {
        QueueClaimSpec {
            namespace: ns.into(),
            namespace_uid: uid.into(),
            actor: actor.into(),
            transport: Some("rabbitmq".into()),
        }
    }

    #[test]
    fn a_claim_is_named_after_its_queue_and_says_whose() {
        let owner = ClaimOwner::new("team-a", "u1", "x-sink");
        let c = claim_for(&owner, "rabbitmq");
        assert_eq!(c.meta().name.as_deref(), Some("asya-team-a-x-sink"));
        assert_eq!(c.spec, spec("team-a", "u1", "x-sink"));
        // Cluster-scoped: no namespace.
        assert!(c.meta().namespace.is_none());
        // Two DNS labels joined: a valid object name (a DNS subdomain), at most 132 chars.
        let long = ClaimOwner::new(&"n".repeat(63), "u", &"a".repeat(63)).queue();
        assert_eq!(claim_name(&long).len(), 132);
        assert!(crate::basics::is_dns_label(&"n".repeat(63)));
    }

    #[test]
    fn the_claim_is_ours_only_with_namespace_uid_and_actor() {
        let who = ClaimOwner::new("team-a", "u1", "x-sink");
        assert_eq!(holder(&spec("team-a", "u1", "x-sink"), &who), Holder::Ours);
        // Namespace deleted and created again: another owner, named as the earlier one.
        assert_eq!(
            holder(&spec("team-a", "u0", "x-sink"), &who),
            Holder::EarlierNamespace
        );
        // `team`'s actor `a-x-sink` shares the queue name but not the owner.
        assert_eq!(
            holder(&spec("team", "u1", "a-x-sink"), &who),
            Holder::Another
        );
        // A claim without a uid (written by hand) proves nothing.
        let nouid = ClaimOwner::new("team-a", "", "x-sink");
        assert_eq!(
            holder(&spec("team-a", "", "x-sink"), &nouid),
            Holder::EarlierNamespace
        );
    }

    #[test]
    fn admission_judges_by_names() {
        let s = spec("team-a", "u0", "x-sink");
        assert!(held_by_another(&s, "team", "a-x-sink"));
        assert!(!held_by_another(&s, "team-a", "x-sink"));
        assert_eq!(
            owner_text(&s),
            "the end queue x-sink of namespace \"team-a\""
        );
        assert_eq!(
            owner_text(&spec("team", "u", "a-x")),
            "the queue of actor \"a-x\" of namespace \"team\""
        );
    }
}
