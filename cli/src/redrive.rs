//! The envelope a redrive sends back (docs/DESIGN.md §4): same id, payload, route and route
//! position, so it resumes at the actor where it failed; the failure record and the attempt
//! history go (the retry policy counts attempts from `x-asya-attempts`, so removing it resets
//! them); `x-asya-redriven` counts the redrives and says when. Pure.

use asya_transport::envelope::{ATTEMPTS_HEADER, ERROR_HEADER, Envelope, REDRIVEN_HEADER};
use serde_json::{Value, json};

/// Where and what to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Resend {
    pub actor: String,
    pub queue: String,
    pub envelope: Envelope,
}

/// Why an x-sump envelope cannot be sent back.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NotRedrivable {
    #[error(
        "envelope {id}: route.current {current} is past its route of {len} actors: there is no actor to send it back to"
    )]
    NoActor {
        id: String,
        current: usize,
        len: usize,
    },
    #[error(
        "envelope {id}: x-asya-error.actor is {failed:?} but route.actors[{current}] is {route:?}: the envelope does not say where it failed"
    )]
    Disagrees {
        id: String,
        failed: String,
        current: usize,
        route: String,
    },
    #[error("envelope {id}: route actor {actor:?} is an end queue (x-sink/x-sump), not an actor")]
    EndActor { id: String, actor: String },
}

/// The resend of `env` in `namespace` at `now` (RFC 3339 and ms since the epoch).
pub fn plan(
    env: &Envelope,
    namespace: &str,
    now: &str,
    now_ms: u64,
) -> Result<Resend, NotRedrivable> {
    let current = env.route.current;
    let Some(actor) = env.route.actors.get(current).cloned() else {
        return Err(NotRedrivable::NoActor {
            id: env.id.clone(),
            current,
            len: env.route.actors.len(),
        });
    };
    if asya_api::naming::is_end_actor(&actor) {
        return Err(NotRedrivable::EndActor {
            id: env.id.clone(),
            actor,
        });
    }
    let failed_at = env
        .headers
        .get(ERROR_HEADER)
        .and_then(|e| e.get("actor"))
        .and_then(Value::as_str);
    if let Some(failed) = failed_at
        && failed != actor
    {
        return Err(NotRedrivable::Disagrees {
            id: env.id.clone(),
            failed: failed.to_string(),
            current,
            route: actor,
        });
    }
    let mut out = env.clone();
    out.headers.remove(ERROR_HEADER);
    out.headers.remove(ATTEMPTS_HEADER);
    let count = env
        .headers
        .get(REDRIVEN_HEADER)
        .and_then(|r| r.get("count"))
        .and_then(Value::as_u64)
        .unwrap_or(0)
        + 1;
    out.headers.insert(
        REDRIVEN_HEADER.into(),
        json!({"count": count, "at": now, "at_ms": now_ms}),
    );
    Ok(Resend {
        queue: asya_api::naming::actor_queue(namespace, &actor),
        actor,
        envelope: out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(v: Value) -> Envelope {
        serde_json::from_value(v).unwrap()
    }

    fn failed_at_b() -> Envelope {
        env(json!({
            "id": "e1", "parent_id": "p",
            "route": {"actors": ["a", "b", "c"], "current": 1},
            "headers": {"trace_id": "t", "x-asya-attempts": [{"actor": "b"}],
                        "x-asya-error": {"actor": "b", "reason": "retries exhausted"}},
            "payload": {"k": 1}, "custom": true
        }))
    }

    #[test]
    fn resumes_where_it_failed_with_counters_reset() {
        let r = plan(&failed_at_b(), "team", "2026-11-26T15:00:00Z", 7).unwrap();
        assert_eq!(r.actor, "b");
        assert_eq!(r.queue, "asya-team-b");
        let e = &r.envelope;
        assert_eq!(e.id, "e1");
        assert_eq!(e.parent_id.as_deref(), Some("p"));
        assert_eq!(e.route.current, 1);
        assert_eq!(e.route.actors, vec!["a", "b", "c"]);
        assert_eq!(e.payload, json!({"k": 1}));
        assert_eq!(e.extra["custom"], true);
        assert_eq!(e.headers["trace_id"], "t");
        assert!(!e.headers.contains_key(ERROR_HEADER));
        assert!(!e.headers.contains_key(ATTEMPTS_HEADER));
        assert_eq!(
            e.headers[REDRIVEN_HEADER],
            json!({"count": 1, "at": "2026-11-26T15:00:00Z", "at_ms": 7})
        );
    }

    #[test]
    fn a_second_redrive_counts_two() {
        let once = plan(&failed_at_b(), "n", "t1", 1).unwrap().envelope;
        let mut again = once.clone();
        again
            .headers
            .insert(ERROR_HEADER.into(), json!({"actor": "b"}));
        let twice = plan(&again, "n", "t2", 2).unwrap().envelope;
        assert_eq!(twice.headers[REDRIVEN_HEADER]["count"], 2);
        assert_eq!(twice.headers[REDRIVEN_HEADER]["at"], "t2");
    }

    #[test]
    fn refuses_what_has_no_actor_to_go_back_to() {
        let mut past = failed_at_b();
        past.route.current = 3;
        assert!(matches!(
            plan(&past, "n", "t", 0),
            Err(NotRedrivable::NoActor {
                current: 3,
                len: 3,
                ..
            })
        ));
        let malformed = env(json!({"id": "m", "route": {"actors": [], "current": 0},
                                   "headers": {"x-asya-error": {"actor": "a", "reason": "malformed message: x"}}}));
        assert!(matches!(
            plan(&malformed, "n", "t", 0),
            Err(NotRedrivable::NoActor { .. })
        ));
        let mut wrong = failed_at_b();
        wrong.route.current = 0;
        let e = plan(&wrong, "n", "t", 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "envelope e1: x-asya-error.actor is \"b\" but route.actors[0] is \"a\": the envelope does not say where it failed"
        );
        let end = env(json!({"id": "z", "route": {"actors": ["x-sink"], "current": 0}}));
        assert!(matches!(
            plan(&end, "n", "t", 0),
            Err(NotRedrivable::EndActor { .. })
        ));
    }
}
