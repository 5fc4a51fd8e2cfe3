//! Route-aware wake-up from the sidecar (docs/DESIGN.md §6.1): on receipt of an envelope, the
//! actors its route reaches after this one are told, through their wake queues, that work is
//! coming, so KEDA starts them while this hop's handler runs instead of one hop at a time.
//! Which actors is `asya_api::wake`'s rule; this module remembers whom it woke lately, so a
//! busy actor sends at most one wake per target per [`WAKE_EVERY`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use asya_api::wake::{wake_queue, wake_targets};

/// How often one sidecar wakes the same actor at most. A wake message lives the target's
/// cooldown (300 s by default; the sidecar does not know each target's): a stream of
/// envelopes costs one publish per target per interval, and a target the stream reaches
/// stays up on its own queue anyway.
pub const WAKE_EVERY: Duration = Duration::from_secs(30);

/// Targets remembered at most; past that, the ones woken longer than [`WAKE_EVERY`] ago are
/// forgotten (a route of this many distinct actors is already far beyond any pipeline).
const REMEMBERED: usize = 1024;

pub struct Waker {
    namespace: String,
    actor: String,
    every: Duration,
    last: Mutex<HashMap<String, Instant>>,
}

impl Waker {
    pub fn new(namespace: &str, actor: &str, every: Duration) -> Self {
        Waker {
            namespace: namespace.to_string(),
            actor: actor.to_string(),
            every,
            last: Mutex::new(HashMap::new()),
        }
    }

    /// The wake queues to publish to now for an envelope routed through `actors`, received
    /// at position `current`: the later actors (never this one, nor the end actors), each
    /// not woken within the interval; they count as woken from `now`.
    pub fn due(&self, actors: &[String], current: usize, now: Instant) -> Vec<String> {
        let targets = wake_targets(actors, current.saturating_add(1), Some(&self.actor));
        if targets.is_empty() {
            return Vec::new();
        }
        let Ok(mut last) = self.last.lock() else {
            return Vec::new();
        };
        if last.len() >= REMEMBERED {
            last.retain(|_, at| now.duration_since(*at) < self.every);
        }
        let mut out = Vec::new();
        for t in targets {
            if last
                .get(t)
                .is_some_and(|at| now.duration_since(*at) < self.every)
            {
                continue;
            }
            let Some(q) = wake_queue(&self.namespace, t) else {
                continue;
            };
            if last.len() < REMEMBERED {
                last.insert(t.to_string(), now);
            }
            out.push(q);
        }
        out
    }

    /// The wake message's body.
    pub fn body(&self) -> Vec<u8> {
        asya_api::wake::wake_body(&self.actor).into_bytes()
    }
}

/// The wake queues of every actor the envelopes `bodies` are routed to from their current
/// position (a sender's wake: the whole remaining route, end actors aside), each once. A body
/// that is not an envelope wakes nobody.
pub fn route_wake_queues<'a>(ns: &str, bodies: impl IntoIterator<Item = &'a [u8]>) -> Vec<String> {
    let mut out = Vec::new();
    for body in bodies {
        let Ok(env) = serde_json::from_slice::<asya_transport::envelope::Envelope>(body) else {
            continue;
        };
        for a in wake_targets(&env.route.actors, env.route.current, None) {
            if let Some(q) = wake_queue(ns, a).filter(|q| !out.contains(q)) {
                out.push(q);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sender_wakes_every_remaining_actor_of_every_envelope_once() {
        let e1 = br#"{"id":"1","route":{"actors":["a","b","x-sink"],"current":0},"payload":1}"#;
        let e2 = br#"{"id":"2","route":{"actors":["a","b","c"],"current":1},"payload":1}"#;
        let q = route_wake_queues("n", [&e1[..], &e2[..], &b"not json"[..]]);
        assert_eq!(q, ["asya-n-a_wake", "asya-n-b_wake", "asya-n-c_wake"]);
    }

    fn route(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn wakes_the_later_hops_once_per_interval() {
        let w = Waker::new("prod", "validate", Duration::from_secs(30));
        let r = route(&["validate", "split", "shout", "x-sink"]);
        let t0 = Instant::now();
        assert_eq!(
            w.due(&r, 0, t0),
            ["asya-prod-split_wake", "asya-prod-shout_wake"]
        );
        // Within the interval: nothing again, whatever the route.
        assert!(w.due(&r, 0, t0 + Duration::from_secs(29)).is_empty());
        let other = route(&["validate", "shout", "count"]);
        assert_eq!(
            w.due(&other, 0, t0 + Duration::from_secs(1)),
            ["asya-prod-count_wake"]
        );
        // After it: woken again.
        assert_eq!(w.due(&r, 0, t0 + Duration::from_secs(30)).len(), 2);
    }

    #[test]
    fn never_itself_the_earlier_hops_or_the_end_actors() {
        let w = Waker::new("prod", "split", Duration::from_secs(30));
        let r = route(&["validate", "split", "split", "x-sump"]);
        assert!(w.due(&r, 1, Instant::now()).is_empty());
        let r = route(&["validate", "split"]);
        assert!(w.due(&r, 1, Instant::now()).is_empty(), "last hop");
        assert!(w.due(&r, usize::MAX, Instant::now()).is_empty());
    }

    #[test]
    fn the_memory_stays_bounded() {
        let w = Waker::new("n", "a", Duration::from_secs(30));
        let t0 = Instant::now();
        let many: Vec<String> = std::iter::once("a".to_string())
            .chain((0..3000).map(|i| format!("b{i}")))
            .collect();
        assert_eq!(w.due(&many, 0, t0).len(), 3000, "all woken");
        assert!(w.last.lock().unwrap().len() <= REMEMBERED);
        // Once the interval passed, the remembered ones are forgotten to make room.
        let later = t0 + Duration::from_secs(31);
        assert_eq!(w.due(&many[..2], 0, later), ["asya-n-b0_wake"]);
        assert_eq!(w.last.lock().unwrap().len(), 1);
    }
}
