//! The envelope (docs/DESIGN.md §4) and its parsing. Parsing never panics: anything that is not
//! a usable envelope comes back as a [`Malformed`] reason that ends up in x-sump.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Envelope header with the history of failed attempts (travels to x-sump): a list of
/// `{actor, hop, attempt, error, type, message, at_ms}`.
pub const ATTEMPTS_HEADER: &str = "x-asya-attempts";
/// Envelope header describing why an envelope landed in x-sump: `{actor, reason, error?,
/// type?, message?, traceback?}`.
pub const ERROR_HEADER: &str = "x-asya-error";
/// Envelope header of an envelope sent back from x-sump (`asya sump redrive`): `{count, at,
/// at_ms}`. The sidecar carries it like any header.
pub const REDRIVEN_HEADER: &str = "x-asya-redriven";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    pub route: Route,
    #[serde(default)]
    pub headers: Map<String, Value>,
    #[serde(default)]
    pub payload: Value,
    /// Fields this version does not know travel on untouched.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Route {
    pub actors: Vec<String>,
    pub current: usize,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Why a message cannot be processed as an envelope.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Malformed {
    #[error("message is not JSON: {0}")]
    NotJson(String),
    #[error("message is not an envelope: {0}")]
    NotEnvelope(String),
    #[error("route.current {current} is out of range for {len} actors")]
    CurrentOutOfRange { current: usize, len: usize },
    #[error("route.actors[{current}] is {found:?} but this sidecar serves actor {expected:?}")]
    WrongActor {
        current: usize,
        found: String,
        expected: String,
    },
    #[error("envelope id is empty")]
    EmptyId,
}

impl Malformed {
    /// Short machine-readable reason for metrics and headers.
    pub fn code(&self) -> &'static str {
        match self {
            Malformed::NotJson(_) => "not_json",
            Malformed::NotEnvelope(_) => "not_envelope",
            Malformed::CurrentOutOfRange { .. } => "current_out_of_range",
            Malformed::WrongActor { .. } => "wrong_actor",
            Malformed::EmptyId => "empty_id",
        }
    }
}

/// Parses a message body. `actor` is checked against `route.actors[current]` unless `None`
/// (end actors receive finished envelopes whose cursor is past the route).
pub fn parse(body: &[u8], actor: Option<&str>) -> Result<Envelope, Malformed> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| Malformed::NotJson(e.to_string()))?;
    let env: Envelope =
        serde_json::from_value(value).map_err(|e| Malformed::NotEnvelope(e.to_string()))?;
    if env.id.is_empty() {
        return Err(Malformed::EmptyId);
    }
    if let Some(actor) = actor {
        let len = env.route.actors.len();
        let current = env.route.current;
        match env.route.actors.get(current) {
            None => return Err(Malformed::CurrentOutOfRange { current, len }),
            Some(found) if found != actor => {
                return Err(Malformed::WrongActor {
                    current,
                    found: found.clone(),
                    expected: actor.to_string(),
                });
            }
            Some(_) => {}
        }
    }
    Ok(env)
}

/// Best-effort view of a body that failed to parse, for the x-sump copy: the JSON value if
/// it was JSON, else the text (lossy), so an operator can see what arrived.
pub fn salvage(body: &[u8]) -> (Option<String>, Value) {
    match serde_json::from_slice::<Value>(body) {
        Ok(v) => {
            let id = v.get("id").and_then(Value::as_str).map(str::to_string);
            (id.filter(|s| !s.is_empty()), v)
        }
        Err(_) => (
            None,
            Value::String(String::from_utf8_lossy(body).into_owned()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: Value) -> Vec<u8> {
        serde_json::to_vec(&v).unwrap()
    }

    #[test]
    fn parses_and_keeps_unknown_fields() {
        let b = body(serde_json::json!({
            "id": "e1", "route": {"actors": ["a", "b"], "current": 0, "x": 1},
            "headers": {"trace_id": "t"}, "payload": {"k": 1}, "custom": true
        }));
        let env = parse(&b, Some("a")).unwrap();
        assert_eq!(env.extra.get("custom"), Some(&Value::Bool(true)));
        assert_eq!(env.route.extra.get("x"), Some(&serde_json::json!(1)));
        let round: Value = serde_json::to_value(&env).unwrap();
        assert_eq!(round["custom"], true);
        assert_eq!(round["route"]["x"], 1);
        assert!(round.get("parent_id").is_none());
    }

    #[test]
    fn rejects_each_malformation() {
        assert!(matches!(parse(b"nope", None), Err(Malformed::NotJson(_))));
        assert!(matches!(
            parse(b"{\"id\":\"x\"}", None),
            Err(Malformed::NotEnvelope(_))
        ));
        let out = body(serde_json::json!({"id": "e", "route": {"actors": ["a"], "current": 1}}));
        assert_eq!(
            parse(&out, Some("a")),
            Err(Malformed::CurrentOutOfRange { current: 1, len: 1 })
        );
        assert!(parse(&out, None).is_ok());
        let wrong = body(serde_json::json!({"id": "e", "route": {"actors": ["b"], "current": 0}}));
        assert!(matches!(
            parse(&wrong, Some("a")),
            Err(Malformed::WrongActor { .. })
        ));
        let empty = body(serde_json::json!({"id": "", "route": {"actors": ["a"], "current": 0}}));
        assert_eq!(parse(&empty, Some("a")), Err(Malformed::EmptyId));
    }

    #[test]
    fn salvage_keeps_what_it_can() {
        assert_eq!(salvage(b"\xffabc").0, None);
        let (id, v) = salvage(b"{\"id\":\"z\",\"route\":3}");
        assert_eq!(id.as_deref(), Some("z"));
        assert_eq!(v["route"], 3);
    }
}
