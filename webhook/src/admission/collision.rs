//! Refusal of an AsyncActor whose queue another (namespace, actor) already owns
//! (docs/DESIGN.md §9). `asya-{namespace}-{actor}` is not injective once names contain '-':
//! namespace `team` actor `a-x-sink` and namespace `team-a`'s end queue `x-sink` are both
//! `asya-team-a-x-sink`. Admission refuses the second of two such actors, in either order.
//!
//! Two records decide, both read from the webhook's caches (no API call):
//! - the `QueueClaim`s (`asya_api::queue_claim`), the provisioner's record of each queue's
//!   owner, kept as long as the queue exists: after its actor is deleted
//!   (`asya.sh/skip-cleanup`, a cleanup that gave up) or its namespace (end queues kept for
//!   their messages), so a leftover queue stays its namespace's ([`find_claim_collision`]);
//! - the AsyncActors of a few namespaces ([`namespaces_to_read`], [`find_collision`]), for
//!   the window before the provisioner has claimed a new actor's queues.
//!
//! The caches lag the API server by a watch event: two colliding actors created within that
//! window both pass here, and the provisioner's claim (creating it is the atomic "first
//! wins": `queue-provisioner/src/reconcile/claims.rs`) is the second line.

use std::collections::BTreeSet;

use asya_api::error::FieldError;
use asya_api::naming;
use asya_api::queue_claim::{QueueClaimSpec, held_by_another, owner_text};
use asya_api::review::ActorReview;

use super::ActorLookup;

pub use asya_api::naming::splits;

/// An existing AsyncActor as the collision check needs it: where it is and the actor its
/// queue is named after (`spec.actor`, defaulting to `metadata.name`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub namespace: String,
    pub name: String,
    pub actor: String,
}

/// Who owns a queue name the new actor needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    /// An AsyncActor's own queue.
    Actor {
        namespace: String,
        name: String,
        actor: String,
    },
    /// A namespace's end queue (`x-sink` or `x-sump`), which exists while it has actors.
    EndQueue { namespace: String, end: String },
    /// The owner a `QueueClaim` records (its actor, or its namespace, may be gone: the queue
    /// is kept, and stays theirs).
    Claim(QueueClaimSpec),
}

/// A queue name wanted by the new actor and already owned by someone else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collision {
    pub queue: String,
    /// Which queue of the new actor: its own (`None`) or its namespace's end queue.
    pub ours_end: Option<String>,
    pub other: Owner,
}

/// The namespaces whose AsyncActors decide whether `(ns, actor)` collides: its own, and every
/// namespace that a split of its queue name or of its end queues' names could name. At most
/// one per '-' in those names, so the read is bounded by the name, not by the cluster.
pub fn namespaces_to_read(ns: &str, actor: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::from([ns.to_string()]);
    let own = format!("{ns}-{actor}");
    let sink = format!("{ns}-{}", naming::SINK_ACTOR);
    let sump = format!("{ns}-{}", naming::SUMP_ACTOR);
    for joined in [&own, &sink, &sump] {
        out.extend(splits(joined).into_iter().map(|(n, _)| n.to_string()));
    }
    out
}

/// The first queue that creating AsyncActor `name` (actor `actor`) in `ns` would share with
/// another owner, given the AsyncActors of [`namespaces_to_read`] (`holders`; others are
/// ignored). Checked in order: another AsyncActor with the same queue; another namespace's
/// end queue (that namespace has actors); and, when this is the namespace's first actor, its
/// end queues against other namespaces' actor queues.
pub fn find_collision(ns: &str, name: &str, actor: &str, holders: &[Holder]) -> Option<Collision> {
    let own = naming::actor_queue(ns, actor);
    let others = || {
        holders
            .iter()
            .filter(move |h| !(h.namespace == ns && h.name == name))
    };
    let as_owner = |h: &Holder| Owner::Actor {
        namespace: h.namespace.clone(),
        name: h.name.clone(),
        actor: h.actor.clone(),
    };
    if let Some(h) = others().find(|h| naming::actor_queue(&h.namespace, &h.actor) == own) {
        return Some(Collision {
            queue: own,
            ours_end: None,
            other: as_owner(h),
        });
    }
    for (other_ns, end) in splits(&format!("{ns}-{actor}")) {
        if other_ns != ns && naming::is_end_actor(end) && others().any(|h| h.namespace == other_ns)
        {
            return Some(Collision {
                queue: own,
                ours_end: None,
                other: Owner::EndQueue {
                    namespace: other_ns.to_string(),
                    end: end.to_string(),
                },
            });
        }
    }
    // The end queues are made with the namespace's first actor; later actors reuse them.
    if others().any(|h| h.namespace == ns) {
        return None;
    }
    for end in [naming::SINK_ACTOR, naming::SUMP_ACTOR] {
        let queue = naming::actor_queue(ns, end);
        if let Some(h) = others()
            .find(|h| h.namespace != ns && naming::actor_queue(&h.namespace, &h.actor) == queue)
        {
            return Some(Collision {
                queue,
                ours_end: Some(end.to_string()),
                other: as_owner(h),
            });
        }
    }
    None
}

/// The queue names creating actor `actor` in `ns` needs: its own, and its namespace's end
/// queues, each with the (namespace, actor) that would own it.
pub fn wanted_queues(ns: &str, actor: &str) -> [(String, String); 3] {
    [
        (naming::actor_queue(ns, actor), actor.to_string()),
        (naming::sink_queue(ns), naming::SINK_ACTOR.to_string()),
        (naming::sump_queue(ns), naming::SUMP_ACTOR.to_string()),
    ]
}

/// The first queue creating actor `actor` in `ns` needs that a `QueueClaim` records as
/// another (namespace, actor)'s. `claims`: the claims of [`wanted_queues`] that exist, by
/// queue name. Judged by the names only: a claim of an earlier namespace of the same name
/// (another uid) is admitted here and refused by the provisioner, which reads the
/// namespace's uid (admission has only the name).
pub fn find_claim_collision(
    ns: &str,
    actor: &str,
    claims: &[(String, QueueClaimSpec)],
) -> Option<Collision> {
    for (queue, owner) in wanted_queues(ns, actor) {
        let Some((_, c)) = claims.iter().find(|(q, _)| *q == queue) else {
            continue;
        };
        if held_by_another(c, ns, &owner) {
            let ours_end = naming::is_end_actor(&owner)
                .then(|| owner.clone())
                .filter(|_| owner != actor);
            return Some(Collision {
                queue,
                ours_end,
                other: Owner::Claim(c.clone()),
            });
        }
    }
    None
}

/// The refusal: field `metadata.name`, its value, the rule, and both owners.
pub fn refusal(ns: &str, name: &str, actor: &str, c: &Collision) -> FieldError {
    let ours = match (&c.ours_end, &c.other) {
        (None, _) => format!(
            "the queue {:?} of AsyncActor {ns}/{name} (actor {actor:?})",
            c.queue
        ),
        // A claim holds the name whether or not the namespace has actors now.
        (Some(end), Owner::Claim(_)) => format!(
            "the end queue {:?} ({end}) of namespace {ns:?}, which AsyncActor {ns}/{name} needs,",
            c.queue
        ),
        (Some(end), _) => format!(
            "the end queue {:?} ({end}) that namespace {ns:?} gets with its first actor, AsyncActor {ns}/{name},",
            c.queue
        ),
    };
    let theirs = match &c.other {
        Owner::Actor {
            namespace,
            name,
            actor,
        } => format!("the queue of AsyncActor {namespace}/{name} (actor {actor:?})"),
        Owner::EndQueue { namespace, end } => {
            format!("the end queue {end} of namespace {namespace:?}, which has actors")
        }
        Owner::Claim(claim) => format!(
            "{} (QueueClaim {}: a queue keeps its owner while it exists, after its actor or namespace is deleted)",
            owner_text(claim),
            asya_api::queue_claim::claim_name(&c.queue)
        ),
    };
    FieldError::invalid(
        "metadata.name",
        name,
        format!(
            "{ours} is already {theirs}: queue names asya-{{namespace}}-{{actor}} must not be shared by two (namespace, actor) pairs; choose another name or spec.actor"
        ),
    )
}

/// The actor a stored spec's queue is named after: `spec.actor`, else the object's name.
/// `spec_json` is the spec's JSON text as the cache keeps it; only `actor` is read.
pub fn spec_actor(name: &str, spec_json: Option<&str>) -> String {
    #[derive(serde::Deserialize)]
    struct ActorOnly {
        actor: Option<String>,
    }
    spec_json
        .and_then(|t| serde_json::from_str::<ActorOnly>(t).ok())
        .and_then(|a| a.actor)
        .unwrap_or_else(|| name.to_string())
}

/// Adds the collision refusal to a CREATE's review that is otherwise valid (an invalid one
/// has no resolved actor, and its author fixes that first). Only CREATE: the queue name is
/// immutable, so an UPDATE claims nothing new, and an actor admitted before this check
/// stays editable.
pub fn check_create(review: &mut ActorReview, actors: &dyn ActorLookup) {
    if !review.errors.is_empty() {
        return;
    }
    let Some(r) = review.resolved.as_ref() else {
        return;
    };
    let holders = actors.holders_in(&namespaces_to_read(&r.namespace, &r.actor));
    let found = find_collision(&r.namespace, &r.name, &r.actor, &holders).or_else(|| {
        let names = wanted_queues(&r.namespace, &r.actor)
            .into_iter()
            .map(|(q, _)| q)
            .collect();
        find_claim_collision(&r.namespace, &r.actor, &actors.claims_of(&names))
    });
    if let Some(c) = found {
        let e = refusal(&r.namespace, &r.name, &r.actor, &c);
        review.errors.push(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(ns: &str, name: &str) -> Holder {
        Holder {
            namespace: ns.into(),
            name: name.into(),
            actor: name.into(),
        }
    }

    #[test]
    fn splits_are_every_valid_namespace_prefix() {
        assert_eq!(
            splits("team-a-x-sink"),
            vec![
                ("team", "a-x-sink"),
                ("team-a", "x-sink"),
                ("team-a-x", "sink")
            ]
        );
        // No empty sides, no namespace ending in '-', no actor starting with '-'.
        assert!(splits("a--b").is_empty());
        assert!(splits("nodash").is_empty());
        assert!(splits("-a").is_empty());
        assert!(splits("a-").is_empty());
        // Namespaces are DNS labels: at most 63 characters.
        let long = format!("{}-b", "a".repeat(64));
        assert!(splits(&long).is_empty());
    }

    #[test]
    fn namespaces_to_read_cover_own_and_end_queues() {
        let got = namespaces_to_read("team-a", "x");
        let want: BTreeSet<String> = ["team", "team-a", "team-a-x"]
            .into_iter()
            .map(String::from)
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn actor_queue_of_another_namespace_is_refused() {
        let holders = [h("team", "a-x")];
        let c = find_collision("team-a", "x", "x", &holders).expect("collision");
        assert_eq!(c.queue, "asya-team-a-x");
        assert_eq!(
            c.other,
            Owner::Actor {
                namespace: "team".into(),
                name: "a-x".into(),
                actor: "a-x".into()
            }
        );
        // And the reverse order.
        let c = find_collision("team", "a-x", "a-x", &[h("team-a", "x")]).expect("collision");
        assert_eq!(c.queue, "asya-team-a-x");
    }

    #[test]
    fn end_queue_of_a_namespace_with_actors_is_refused() {
        let c = find_collision("team", "a-x-sink", "a-x-sink", &[h("team-a", "y")]).expect("c");
        assert_eq!(c.queue, "asya-team-a-x-sink");
        assert_eq!(
            c.other,
            Owner::EndQueue {
                namespace: "team-a".into(),
                end: "x-sink".into()
            }
        );
        // A namespace without actors has no end queues yet.
        assert_eq!(find_collision("team", "a-x-sink", "a-x-sink", &[]), None);
    }

    #[test]
    fn first_actor_of_a_namespace_checks_its_end_queues() {
        let holders = [h("team", "a-x-sump")];
        let c = find_collision("team-a", "y", "y", &holders).expect("collision");
        assert_eq!(c.queue, "asya-team-a-x-sump");
        assert_eq!(c.ours_end.as_deref(), Some("x-sump"));
        // Not the first actor: the end queues exist already; nothing new is claimed.
        let holders = [h("team", "a-x-sump"), h("team-a", "z")];
        assert_eq!(find_collision("team-a", "y", "y", &holders), None);
        // `team-a-x` / `sink` names the same queue as team-a's x-sink.
        let c = find_collision("team-a", "y", "y", &[h("team-a-x", "sink")]).expect("c");
        assert_eq!(c.queue, "asya-team-a-x-sink");
    }

    #[test]
    fn spec_actor_names_the_queue_and_same_namespace_counts() {
        let other = Holder {
            namespace: "team".into(),
            name: "old".into(),
            actor: "shared".into(),
        };
        assert!(find_collision("team", "new", "shared", std::slice::from_ref(&other)).is_some());
        // The actor itself (an UPDATE or a retried CREATE) is no collision.
        assert_eq!(find_collision("team", "old", "shared", &[other]), None);
        // An end actor deployed as an AsyncActor in its own namespace owns its end queue.
        assert_eq!(
            find_collision("team", "x-sink", "x-sink", &[h("team", "a")]),
            None
        );
    }

    #[test]
    fn spec_actor_defaults_to_the_name() {
        assert_eq!(spec_actor("n", Some(r#"{"actor":"a","image":"i"}"#)), "a");
        assert_eq!(spec_actor("n", Some(r#"{"image":"i"}"#)), "n");
        assert_eq!(spec_actor("n", None), "n");
        assert_eq!(spec_actor("n", Some("not json")), "n");
    }

    #[test]
    fn unrelated_names_pass() {
        let holders = [h("team", "b"), h("team-b", "x"), h("other", "a-x")];
        assert_eq!(find_collision("team-a", "x", "x", &holders), None);
    }

    #[test]
    fn refusal_names_field_value_rule_and_both_actors() {
        let c = find_collision("team-a", "x", "x", &[h("team", "a-x")]).expect("c");
        let e = refusal("team-a", "x", "x", &c).to_string();
        assert!(
            e.starts_with("metadata.name: Invalid value: \"x\": "),
            "{e}"
        );
        assert!(e.contains("AsyncActor team-a/x"), "{e}");
        assert!(e.contains("AsyncActor team/a-x"), "{e}");
        assert!(e.contains("\"asya-team-a-x\""), "{e}");
        assert!(e.contains("must not be shared"), "{e}");
        let c = find_collision("team-a", "y", "y", &[h("team", "a-x-sink")]).expect("c");
        let e = refusal("team-a", "y", "y", &c).to_string();
        assert!(e.contains("first actor, AsyncActor team-a/y,"), "{e}");
        assert!(e.contains("the queue of AsyncActor team/a-x-sink"), "{e}");
        let c = find_collision("team", "a-x-sink", "a-x-sink", &[h("team-a", "y")]).expect("c");
        let e = refusal("team", "a-x-sink", "a-x-sink", &c).to_string();
        assert!(e.contains("AsyncActor team/a-x-sink"), "{e}");
        assert!(
            e.contains("end queue x-sink of namespace \"team-a\""),
            "{e}"
        );
    }

    fn claim(ns: &str, actor: &str) -> QueueClaimSpec {
        QueueClaimSpec {
            namespace: ns.into(),
            namespace_uid: format!("uid-{ns}"),
            actor: actor.into(),
            transport: Some("rabbitmq".into()),
        }
    }

    fn claims(list: &[(&str, &str)]) -> Vec<(String, QueueClaimSpec)> {
        list.iter()
            .map(|(ns, actor)| (naming::actor_queue(ns, actor), claim(ns, actor)))
            .collect()
    }

    #[test]
    fn a_claimed_end_queue_of_a_namespace_without_actors_is_refused() {
        // team-a's last actor is gone; its end queue (results) stays, and so does its claim.
        // The AsyncActor check alone lets `team/a-x-sink` through.
        assert_eq!(find_collision("team", "a-x-sink", "a-x-sink", &[]), None);
        let c = find_claim_collision("team", "a-x-sink", &claims(&[("team-a", "x-sink")]))
            .expect("claimed");
        assert_eq!(c.queue, "asya-team-a-x-sink");
        assert_eq!(c.ours_end, None);
        assert_eq!(c.other, Owner::Claim(claim("team-a", "x-sink")));
        let e = refusal("team", "a-x-sink", "a-x-sink", &c).to_string();
        assert!(
            e.starts_with("metadata.name: Invalid value: \"a-x-sink\": "),
            "{e}"
        );
        assert!(
            e.contains(
                "the queue \"asya-team-a-x-sink\" of AsyncActor team/a-x-sink (actor \"a-x-sink\")"
            ),
            "{e}"
        );
        assert!(
            e.contains(
                "the end queue x-sink of namespace \"team-a\" (QueueClaim asya-team-a-x-sink"
            ),
            "{e}"
        );
        assert!(e.contains("must not be shared"), "{e}");
    }

    #[test]
    fn a_claimed_actor_queue_left_after_its_actor_is_refused() {
        // `team/a-x` was deleted with asya.sh/skip-cleanup: its queue and claim stay.
        let c = find_claim_collision("team-a", "x", &claims(&[("team", "a-x")])).expect("c");
        assert_eq!(c.queue, "asya-team-a-x");
        let e = refusal("team-a", "x", "x", &c).to_string();
        assert!(
            e.contains(
                "the queue of actor \"a-x\" of namespace \"team\" (QueueClaim asya-team-a-x"
            ),
            "{e}"
        );
    }

    #[test]
    fn every_actor_of_a_namespace_whose_end_queue_is_claimed_by_another_is_refused() {
        // Not only the first: the claim holds the name whether or not team-a has actors.
        let c =
            find_claim_collision("team-a", "y", &claims(&[("team", "a-x-sump")])).expect("claimed");
        assert_eq!(c.queue, "asya-team-a-x-sump");
        assert_eq!(c.ours_end.as_deref(), Some("x-sump"));
        let e = refusal("team-a", "y", "y", &c).to_string();
        assert!(
            e.contains("the end queue \"asya-team-a-x-sump\" (x-sump) of namespace \"team-a\", which AsyncActor team-a/y needs,"),
            "{e}"
        );
        assert!(
            e.contains("the queue of actor \"a-x-sump\" of namespace \"team\""),
            "{e}"
        );
    }

    #[test]
    fn the_claimants_own_claims_pass_whatever_the_uid() {
        // Its own queue and end queues, claimed by itself (or by an earlier namespace of the
        // same name: the provisioner, which knows the uid, refuses that one).
        let own = claims(&[("team-a", "y"), ("team-a", "x-sink"), ("team-a", "x-sump")]);
        assert_eq!(find_claim_collision("team-a", "y", &own), None);
        // An end actor deployed as an AsyncActor in its own namespace.
        assert_eq!(
            find_claim_collision("team", "x-sink", &claims(&[("team", "x-sink")])),
            None
        );
        // Claims of unrelated names are not looked at.
        assert_eq!(
            find_claim_collision("team", "b", &claims(&[("team", "a")])),
            None
        );
    }

    /// A lookup with claims and no actors.
    struct Claims(Vec<(String, QueueClaimSpec)>);

    impl ActorLookup for Claims {
        fn get(&self, _ns: &str, _name: &str) -> Option<serde_json::Value> {
            None
        }
        fn claims_of(&self, queues: &BTreeSet<String>) -> Vec<(String, QueueClaimSpec)> {
            self.0
                .iter()
                .filter(|(q, _)| queues.contains(q))
                .cloned()
                .collect()
        }
    }

    #[test]
    fn check_create_refuses_by_the_claims() {
        let catalog = asya_api::flavor::FlavorCatalog::new();
        let config = asya_api::ClusterConfig::default();
        let review_of = |ns: &str, name: &str| {
            let obj = serde_json::json!({
                "apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"image": "py:3.12", "handler": "m.f"}
            });
            asya_api::review_actor(&asya_api::ReviewRequest {
                object: &obj,
                old_object: None,
                namespace: Some(ns),
                catalog: &catalog,
                config: &config,
            })
        };
        let lookup = Claims(claims(&[("team-a", "x-sink")]));
        let mut r = review_of("team", "a-x-sink");
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        check_create(&mut r, &lookup);
        assert_eq!(r.errors.0.len(), 1, "{:?}", r.errors);
        let e = r.errors.to_string();
        assert!(e.contains("QueueClaim asya-team-a-x-sink"), "{e}");
        // Without the claim (or by another name), admitted.
        let mut r = review_of("team", "b");
        check_create(&mut r, &lookup);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
    }
}
