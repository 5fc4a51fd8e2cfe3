//! Route-aware wake-up (docs/DESIGN.md §6.1): which actors an envelope's route will reach,
//! and the queue whose one message activates an actor at zero replicas. Pure; one rule for
//! the senders (gateway, `asya-sidecar send`) and the sidecar.

use crate::naming;

/// Suffix of an actor's wake queue. `_` is in no namespace or actor name (both DNS labels), so
/// a wake queue never carries an actor queue's name, and SQS accepts it.
pub const WAKE_SUFFIX: &str = "_wake";

/// The wake queue of `actor` in `namespace`: `asya-{namespace}-{actor}_wake`. `None` when the
/// name would exceed SQS's 80 characters (one limit for both transports, so an actor's
/// wake-up does not depend on its transport): such an actor wakes on its own queue only.
pub fn wake_queue(namespace: &str, actor: &str) -> Option<String> {
    wake_queue_of(&naming::actor_queue(namespace, actor))
}

/// The wake queue beside the actor queue `queue` (same rule as [`wake_queue`]).
pub fn wake_queue_of(queue: &str) -> Option<String> {
    let q = format!("{queue}{WAKE_SUFFIX}");
    naming::is_sqs_queue_name(&q).then_some(q)
}

/// The wake message's body: its content does not matter (KEDA counts messages; nobody
/// consumes them), it names the waker for whoever looks at the queue.
pub fn wake_body(waker: &str) -> String {
    format!(
        "{{\"wake\":true,\"from\":{}}}",
        serde_json::Value::from(waker)
    )
}

/// The actors to wake for an envelope routed through `actors` from position `from`: those
/// at `from` and after, in route order, each once, without the end actors (x-sink, x-sump:
/// not woken by routes) and without `except` (the actor already running: a sidecar passes
/// its own name, a sender passes `None`).
pub fn wake_targets<'a>(actors: &'a [String], from: usize, except: Option<&str>) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for a in actors.iter().skip(from).map(String::as_str) {
        if naming::is_end_actor(a) || Some(a) == except || out.contains(&a) {
            continue;
        }
        out.push(a);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_sender_wakes_the_whole_route_and_a_sidecar_what_comes_after_it() {
        let r = route(&["validate", "split", "shout"]);
        assert_eq!(wake_targets(&r, 0, None), ["validate", "split", "shout"]);
        assert_eq!(wake_targets(&r, 1, Some("validate")), ["split", "shout"]);
        assert_eq!(wake_targets(&r, 3, Some("shout")), Vec::<&str>::new());
        assert_eq!(wake_targets(&r, 9, None), Vec::<&str>::new());
    }

    #[test]
    fn each_actor_once_and_never_the_end_actors_or_the_running_one() {
        let r = route(&["a", "b", "a", "x-sink", "c", "b", "x-sump"]);
        assert_eq!(wake_targets(&r, 0, None), ["a", "b", "c"]);
        assert_eq!(wake_targets(&r, 1, Some("a")), ["b", "c"]);
    }

    #[test]
    fn the_wake_queue_never_has_an_actor_queue_name() {
        assert_eq!(
            wake_queue("prod", "split").as_deref(),
            Some("asya-prod-split_wake")
        );
        // Every reading of a wake queue's name fails the actor-name rule (no `_` in a label).
        let q = wake_queue("prod", "split").unwrap();
        assert!(
            naming::readings(&q)
                .iter()
                .all(|(_, actor)| !crate::validate::is_dns_label(actor))
        );
        let long = "a".repeat(63);
        assert_eq!(
            wake_queue("namespace-of-twenty1", &long),
            None,
            "over SQS's 80 characters"
        );
    }
}
