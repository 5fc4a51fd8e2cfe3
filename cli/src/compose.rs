//! A new envelope for `asya send` (docs/DESIGN.md §4), and where one ended up. Pure.

use asya_transport::envelope::{Envelope, Route};
use serde_json::{Map, Value, json};

/// Why an envelope cannot be made from the command line's words.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum ComposeError {
    #[error("--payload: not JSON: {0}")]
    Payload(String),
    #[error("{flag} {value:?}: {rule}")]
    Actor {
        flag: &'static str,
        value: String,
        rule: &'static str,
    },
}

fn check_actor(flag: &'static str, a: &str) -> Result<(), ComposeError> {
    let rule = if a.is_empty() {
        Some("an actor name cannot be empty")
    } else if asya_api::naming::is_end_actor(a) {
        Some("x-sink and x-sump are end queues, not actors to route through")
    } else if !a
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        Some("an actor name is lowercase letters, digits and '-'")
    } else {
        None
    };
    match rule {
        Some(rule) => Err(ComposeError::Actor {
            flag,
            value: a.to_string(),
            rule,
        }),
        None => Ok(()),
    }
}

/// The envelope `id` for `actor` then `then`, carrying `payload` (JSON text).
pub fn envelope(
    id: String,
    actor: &str,
    then: &[String],
    payload: &str,
    trace_id: String,
) -> Result<Envelope, ComposeError> {
    check_actor("ACTOR", actor)?;
    for a in then {
        check_actor("--route", a)?;
    }
    let payload: Value =
        serde_json::from_str(payload).map_err(|e| ComposeError::Payload(e.to_string()))?;
    let mut actors = vec![actor.to_string()];
    actors.extend(then.iter().cloned());
    let mut headers = Map::new();
    headers.insert("trace_id".into(), json!(trace_id));
    Ok(Envelope {
        id,
        parent_id: None,
        route: Route {
            actors,
            current: 0,
            extra: Map::new(),
        },
        headers,
        payload,
        extra: Map::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_the_route_from_actor_and_then() {
        let e = envelope(
            "e1".into(),
            "validate",
            &["split".into(), "shout".into()],
            "{\"x\": 1}",
            "t".into(),
        )
        .unwrap();
        assert_eq!(e.route.actors, vec!["validate", "split", "shout"]);
        assert_eq!(e.route.current, 0);
        assert_eq!(e.payload, json!({"x": 1}));
        assert_eq!(e.headers["trace_id"], "t");
        // What the sidecar of `validate` accepts.
        let body = serde_json::to_vec(&e).unwrap();
        assert!(asya_transport::envelope::parse(&body, Some("validate")).is_ok());
    }

    #[test]
    fn refusals_name_the_flag_value_and_rule() {
        let e = envelope("e".into(), "a", &["x-sink".into()], "1", "t".into()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--route \"x-sink\": x-sink and x-sump are end queues, not actors to route through"
        );
        let e = envelope("e".into(), "A_b", &[], "1", "t".into()).unwrap_err();
        assert!(e.to_string().starts_with("ACTOR \"A_b\":"));
        assert!(matches!(
            envelope("e".into(), "a", &[], "{", "t".into()),
            Err(ComposeError::Payload(_))
        ));
    }
}
