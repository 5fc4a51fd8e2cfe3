//! Refusal of an AsyncActor whose queue another (namespace, actor) already owns
//! (docs/DESIGN.md §9). `asya-{namespace}-{actor}` is not injective once names contain '-':
//! namespace `team` actor `a-x-sink` and namespace `team-a`'s end queue `x-sink` are both
//! `asya-team-a-x-sink`. Admission refuses the second of two such actors, in either order.
//!
//! Pure decisions ([`namespaces_to_read`], [`find_collision`]) over the AsyncActors of a few
//! namespaces, which the caller reads from the webhook's AsyncActor cache ([`Holder`]). The
//! cache lags the API server by a watch event: two colliding actors created within that
//! window both pass here, and the provisioner's ownership record of each queue
//! (`queue-provisioner/src/queue/owner.rs`) is the second line.

use std::collections::BTreeSet;

use asya_api::error::FieldError;
use asya_api::naming;
use asya_api::review::ActorReview;

use super::ActorLookup;

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
}

/// A queue name wanted by the new actor and already owned by someone else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collision {
    pub queue: String,
    /// Which queue of the new actor: its own (`None`) or its namespace's end queue.
    pub ours_end: Option<String>,
    pub other: Owner,
}

/// Every `(namespace, actor)` whose queue name is `asya-{joined}`: each split of `joined` at
/// a '-' whose left side is a valid namespace name and whose right side starts with a
/// letter or digit (what a DNS label allows).
pub fn splits(joined: &str) -> Vec<(&str, &str)> {
    joined
        .match_indices('-')
        .map(|(i, _)| (&joined[..i], &joined[i + 1..]))
        .filter(|(ns, actor)| {
            is_namespace(ns)
                && actor
                    .bytes()
                    .next()
                    .is_some_and(|b| b.is_ascii_alphanumeric())
        })
        .collect()
}

fn is_namespace(s: &str) -> bool {
    asya_api::validate::is_dns_label(s)
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

/// The refusal: field `metadata.name`, its value, the rule, and both owners.
pub fn refusal(ns: &str, name: &str, actor: &str, c: &Collision) -> FieldError {
    let ours = match &c.ours_end {
        None => format!(
            "the queue {:?} of AsyncActor {ns}/{name} (actor {actor:?})",
            c.queue
        ),
        Some(end) => format!(
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
    if let Some(c) = find_collision(&r.namespace, &r.name, &r.actor, &holders) {
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
}
