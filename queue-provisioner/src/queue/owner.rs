//! Whether an existing queue is this actor's (docs/DESIGN.md §9, issue 26 finding 2, issue 34
//! item 2). `asya-{namespace}-{actor}` is not injective, so a queue's name does not prove
//! whose it is. The record is the queue's `QueueClaim` (`asya_api::queue_claim`, the claim
//! step in `reconcile/claims.rs`); what the broker records of a queue's owner
//! ([`QueueRecord`], asked through [`owns`]) decides only for a queue that exists without a
//! claim: one from before the claims (the upgrade), or made by hand. Pure; the reads are
//! `owner_record` of [`super::sqs`] and [`super::rabbitmq`].
//!
//! - **SQS**: the tags `asya.sh/namespace` and `asya.sh/actor` (seed 003), set when the
//!   provisioner creates a queue (every version has). Other tags: not ours. No tags: a queue
//!   someone else created, adopted only when the AsyncActor says so with the annotation
//!   [`ADOPT_QUEUE`]`: "true"` (then tagged and claimed).
//! - **RabbitMQ**: the queue's bindings to the namespaces' exchanges `asya.{ns}` (the shared
//!   tenancy contract binds each queue of namespace N to `asya.N` under its own name while N
//!   has actors; an argument such as `x-asya-owner` cannot be added to an existing queue).
//!   Bound to the claimant's namespace's exchange only: ours (the upgrade from the release
//!   before the claims). Bound to another namespace's: not ours. Bound to none: a queue whose
//!   namespace has no actors left (its exchange went with the last one: its end queues, a
//!   `skip-cleanup` leftover) or made by hand; nothing proves whose, so, as an untagged SQS
//!   queue, adopted only with [`ADOPT_QUEUE`]. Without tenant exchanges (the transport
//!   shares the platform's credentials, or has no management API) the bindings prove nothing
//!   and the broker's record is [`QueueRecord::Unknown`]: adopted as before (every tenant
//!   of such a transport already reads every queue).
//!
//! The annotation never adopts a queue whose name also reads as another namespace's end
//! queue ([`adoption_refused`]): end queues outlive their namespace, so that is the one
//! leftover a tenant could otherwise claim by naming an actor after it.

use std::collections::{BTreeMap, BTreeSet};

/// SQS tag naming the queue's namespace.
pub const TAG_NAMESPACE: &str = "asya.sh/namespace";
/// SQS tag naming the queue's actor (or end pseudo-actor).
pub const TAG_ACTOR: &str = "asya.sh/actor";
/// AsyncActor annotation: `"true"` adopts an existing SQS queue of the actor's name that
/// carries no owner tags (one created by hand or by another tool).
pub const ADOPT_QUEUE: &str = "asya.sh/adopt-queue";
/// Prefix of a namespace's RabbitMQ exchange (`asya.{ns}`, the tenancy contract).
pub const TENANT_EXCHANGE_PREFIX: &str = "asya.";

/// What the broker records of a queue's owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QueueRecord {
    /// SQS: the queue's tags.
    Tags(BTreeMap<String, String>),
    /// RabbitMQ: the namespaces whose exchange `asya.{ns}` binds the queue under its name.
    TenantBindings(BTreeSet<String>),
    /// The broker cannot tell (RabbitMQ without the management API).
    Unknown,
}

/// Who wants the queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claimant {
    pub namespace: String,
    pub actor: String,
    /// The actor's [`ADOPT_QUEUE`] annotation.
    pub adopt_untagged: bool,
}

impl Claimant {
    pub fn new(namespace: &str, actor: &str, adopt_untagged: bool) -> Self {
        Claimant {
            namespace: namespace.into(),
            actor: actor.into(),
            adopt_untagged,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OwnershipError {
    #[error(
        "queue {queue} belongs to {owner}, not to actor {namespace}/{actor}: not adopted, purged or deleted"
    )]
    Foreign {
        queue: String,
        namespace: String,
        actor: String,
        owner: String,
    },
    #[error(
        "queue {queue} exists without the tags {TAG_NAMESPACE} and {TAG_ACTOR}: nothing proves it is actor {namespace}/{actor}'s, so it is not adopted or deleted; annotate the AsyncActor {ADOPT_QUEUE}: \"true\" to adopt it"
    )]
    Untagged {
        queue: String,
        namespace: String,
        actor: String,
    },
    #[error(
        "queue {queue} exists bound to no namespace's exchange {TENANT_EXCHANGE_PREFIX}{{namespace}} and has no QueueClaim: nothing proves it is actor {namespace}/{actor}'s (it may be the queue of a namespace whose actors are gone, or made by hand), so it is not adopted or deleted; annotate the AsyncActor {ADOPT_QUEUE}: \"true\" to adopt it (once: it is claimed from then on)"
    )]
    Unbound {
        queue: String,
        namespace: String,
        actor: String,
    },
    #[error(
        "queue {queue} is also the name of the end queue {end} of namespace {other}, which outlives that namespace's actors and the namespace itself: {ADOPT_QUEUE} does not adopt it for actor {namespace}/{actor}; the platform team gives it to this actor by creating QueueClaim {queue} with spec.namespace {namespace}, spec.namespaceUid (kubectl get namespace {namespace} -o jsonpath='{{.metadata.uid}}') and spec.actor {actor}"
    )]
    AmbiguousAdoption {
        queue: String,
        namespace: String,
        actor: String,
        other: String,
        end: String,
    },
    /// The queue's `QueueClaim` names another owner (the message says who and how the
    /// platform team releases it: [`super::claim::refusal`]).
    #[error("{message}")]
    Claimed { queue: String, message: String },
}

/// Why the adoption annotation cannot adopt `queue` for `who`: its name also reads as the
/// end queue of another namespace (see the module's documentation). `None`: it may.
pub fn adoption_refused(queue: &str, who: &Claimant) -> Option<OwnershipError> {
    let (other, end) = asya_api::naming::readings(queue)
        .into_iter()
        .find(|(ns, a)| *ns != who.namespace && asya_api::naming::is_end_actor(a))?;
    Some(OwnershipError::AmbiguousAdoption {
        queue: queue.into(),
        namespace: who.namespace.clone(),
        actor: who.actor.clone(),
        other: other.into(),
        end: end.into(),
    })
}

/// Whether `record` proves the queue `queue`, which has no claim, is `who`'s (or may
/// become it, with the adoption annotation).
pub fn owns(queue: &str, record: &QueueRecord, who: &Claimant) -> Result<(), OwnershipError> {
    let foreign = |owner: String| OwnershipError::Foreign {
        queue: queue.into(),
        namespace: who.namespace.clone(),
        actor: who.actor.clone(),
        owner,
    };
    // An adoption the annotation asks for, if it may.
    let adopt = || match adoption_refused(queue, who) {
        Some(e) => Err(e),
        None => Ok(()),
    };
    match record {
        QueueRecord::Unknown => Ok(()),
        QueueRecord::Tags(tags) => {
            let ns = tags.get(TAG_NAMESPACE);
            let actor = tags.get(TAG_ACTOR);
            match (ns, actor) {
                (Some(n), Some(a)) if *n == who.namespace && *a == who.actor => Ok(()),
                (None, None) if who.adopt_untagged => adopt(),
                (None, None) => Err(OwnershipError::Untagged {
                    queue: queue.into(),
                    namespace: who.namespace.clone(),
                    actor: who.actor.clone(),
                }),
                (n, a) => Err(foreign(format!(
                    "actor {}/{} (its tags {TAG_NAMESPACE}={:?}, {TAG_ACTOR}={:?})",
                    n.map_or("?", String::as_str),
                    a.map_or("?", String::as_str),
                    n.map_or("", String::as_str),
                    a.map_or("", String::as_str),
                ))),
            }
        }
        QueueRecord::TenantBindings(namespaces) => {
            let others: Vec<&str> = namespaces
                .iter()
                .map(String::as_str)
                .filter(|n| *n != who.namespace)
                .collect();
            if others.is_empty() {
                return match (namespaces.is_empty(), who.adopt_untagged) {
                    // Bound to the claimant's namespace's exchange (and no other's).
                    (false, _) => Ok(()),
                    (true, true) => adopt(),
                    (true, false) => Err(OwnershipError::Unbound {
                        queue: queue.into(),
                        namespace: who.namespace.clone(),
                        actor: who.actor.clone(),
                    }),
                };
            }
            let exchanges: Vec<String> = others
                .iter()
                .map(|n| format!("{TENANT_EXCHANGE_PREFIX}{n}"))
                .collect();
            Err(foreign(format!(
                "namespace {} (bound to exchange {})",
                others.join(", "),
                exchanges.join(", ")
            )))
        }
    }
}

/// The namespaces whose exchange binds `queue` under its own name, from the management API's
/// `GET /api/queues/{vhost}/{queue}/bindings` answer.
pub fn tenant_bindings(queue: &str, bindings: &serde_json::Value) -> BTreeSet<String> {
    bindings
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b.get("routing_key").and_then(|k| k.as_str()) == Some(queue))
        .filter_map(|b| b.get("source")?.as_str())
        .filter_map(|s| s.strip_prefix(TENANT_EXCHANGE_PREFIX))
        .filter(|ns| !ns.is_empty())
        .map(str::to_string)
        .collect()
}

/// Whether the actor's annotations ask to adopt an untagged queue.
pub fn adopt_annotation(annotations: Option<&BTreeMap<String, String>>) -> bool {
    annotations
        .and_then(|a| a.get(ADOPT_QUEUE))
        .is_some_and(|v| v == "true")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tags(pairs: &[(&str, &str)]) -> QueueRecord {
        QueueRecord::Tags(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    fn who(ns: &str, actor: &str) -> Claimant {
        Claimant::new(ns, actor, false)
    }

    #[test]
    fn sqs_tags_of_this_actor_own_the_queue() {
        let r = tags(&[
            (TAG_NAMESPACE, "team"),
            (TAG_ACTOR, "a-x-sink"),
            ("cost", "x"),
        ]);
        assert_eq!(
            owns("asya-team-a-x-sink", &r, &who("team", "a-x-sink")),
            Ok(())
        );
    }

    #[test]
    fn sqs_tags_of_another_actor_are_refused_naming_it() {
        // team-a's end queue, wanted by team/a-x-sink.
        let r = tags(&[(TAG_NAMESPACE, "team-a"), (TAG_ACTOR, "x-sink")]);
        let e = owns("asya-team-a-x-sink", &r, &who("team", "a-x-sink")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "queue asya-team-a-x-sink belongs to actor team-a/x-sink (its tags asya.sh/namespace=\"team-a\", asya.sh/actor=\"x-sink\"), not to actor team/a-x-sink: not adopted, purged or deleted"
        );
        // The annotation adopts untagged queues only, never another actor's.
        let adopt = Claimant::new("team", "a-x-sink", true);
        assert!(owns("asya-team-a-x-sink", &r, &adopt).is_err());
        // One tag of ours and one missing is not proof either.
        let half = tags(&[(TAG_NAMESPACE, "team")]);
        assert!(matches!(
            owns("q", &half, &who("team", "a-x-sink")),
            Err(OwnershipError::Foreign { .. })
        ));
    }

    #[test]
    fn an_untagged_sqs_queue_is_adopted_only_on_request() {
        let r = tags(&[("cost", "x")]);
        let e = owns("asya-n-a", &r, &who("n", "a")).unwrap_err();
        assert!(matches!(e, OwnershipError::Untagged { .. }));
        assert!(
            e.to_string().contains("asya.sh/adopt-queue: \"true\""),
            "{e}"
        );
        assert_eq!(owns("asya-n-a", &r, &Claimant::new("n", "a", true)), Ok(()));
    }

    #[test]
    fn rabbitmq_bindings_to_another_namespace_are_refused() {
        let ours = QueueRecord::TenantBindings(BTreeSet::from(["team".to_string()]));
        assert_eq!(
            owns("asya-team-a-x-sink", &ours, &who("team", "a-x-sink")),
            Ok(())
        );
        let theirs = QueueRecord::TenantBindings(BTreeSet::from(["team-a".to_string()]));
        let e = owns("asya-team-a-x-sink", &theirs, &who("team", "a-x-sink")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "queue asya-team-a-x-sink belongs to namespace team-a (bound to exchange asya.team-a), not to actor team/a-x-sink: not adopted, purged or deleted"
        );
        // Both: someone else's too.
        let both =
            QueueRecord::TenantBindings(BTreeSet::from(["team".to_string(), "team-a".to_string()]));
        assert!(owns("asya-team-a-x-sink", &both, &who("team", "a-x-sink")).is_err());
    }

    #[test]
    fn a_rabbitmq_queue_bound_to_no_namespace_is_adopted_only_on_request() {
        // team-a's last actor went, and its exchange asya.team-a with it: its end queue is
        // bound to `asya` only. `team/a-x-sink` must not get it by default.
        let none = QueueRecord::TenantBindings(BTreeSet::new());
        let e = owns("asya-team-a-x-sink", &none, &who("team", "a-x-sink")).unwrap_err();
        assert!(matches!(e, OwnershipError::Unbound { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "queue asya-team-a-x-sink exists bound to no namespace's exchange asya.{namespace} and has no QueueClaim: nothing proves it is actor team/a-x-sink's (it may be the queue of a namespace whose actors are gone, or made by hand), so it is not adopted or deleted; annotate the AsyncActor asya.sh/adopt-queue: \"true\" to adopt it (once: it is claimed from then on)"
        );
        // The namespace's own queue, left unbound (its actors were all gone at the upgrade):
        // adopted once the actor asks.
        assert!(owns("asya-n-a", &none, &who("n", "a")).is_err());
        assert_eq!(
            owns("asya-n-a", &none, &Claimant::new("n", "a", true)),
            Ok(())
        );
        // Without tenant exchanges nothing is recorded: adopted as before.
        assert_eq!(
            owns("asya-n-a", &QueueRecord::Unknown, &who("n", "a")),
            Ok(())
        );
    }

    #[test]
    fn the_annotation_never_adopts_another_namespaces_end_queue_name() {
        let adopting = Claimant::new("team", "a-x-sink", true);
        let none = QueueRecord::TenantBindings(BTreeSet::new());
        let e = owns("asya-team-a-x-sink", &none, &adopting).unwrap_err();
        assert_eq!(
            e.to_string(),
            "queue asya-team-a-x-sink is also the name of the end queue x-sink of namespace team-a, which outlives that namespace's actors and the namespace itself: asya.sh/adopt-queue does not adopt it for actor team/a-x-sink; the platform team gives it to this actor by creating QueueClaim asya-team-a-x-sink with spec.namespace team, spec.namespaceUid (kubectl get namespace team -o jsonpath='{.metadata.uid}') and spec.actor a-x-sink"
        );
        // Untagged SQS queues alike.
        assert!(matches!(
            owns(
                "asya-team-a-x-sump",
                &tags(&[]),
                &Claimant::new("team", "a-x-sump", true)
            ),
            Err(OwnershipError::AmbiguousAdoption { .. })
        ));
        // The namespace's own end queue reads as no other namespace's end queue.
        assert_eq!(
            owns(
                "asya-team-x-sink",
                &none,
                &Claimant::new("team", "x-sink", true)
            ),
            Ok(())
        );
    }

    #[test]
    fn tenant_bindings_are_read_from_the_management_answer() {
        let v = json!([
            {"source": "", "routing_key": "asya-team-a-x-sink", "destination": "asya-team-a-x-sink"},
            {"source": "asya", "routing_key": "asya-team-a-x-sink"},
            {"source": "asya.team-a", "routing_key": "asya-team-a-x-sink"},
            {"source": "asya.other", "routing_key": "some-other-key"},
            {"source": "asya.", "routing_key": "asya-team-a-x-sink"}
        ]);
        assert_eq!(
            tenant_bindings("asya-team-a-x-sink", &v),
            BTreeSet::from(["team-a".to_string()])
        );
        assert!(tenant_bindings("q", &json!({"error": "x"})).is_empty());
    }

    #[test]
    fn adopt_annotation_is_true_only() {
        let m = |v: &str| BTreeMap::from([(ADOPT_QUEUE.to_string(), v.to_string())]);
        assert!(adopt_annotation(Some(&m("true"))));
        assert!(!adopt_annotation(Some(&m("yes"))));
        assert!(!adopt_annotation(None));
    }
}
