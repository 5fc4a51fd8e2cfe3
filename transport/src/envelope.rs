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

/// Header a sidecar stamps on each envelope it sends: when it sent it (unix milliseconds).
/// The next sidecar measures the queue wait from it (`asya_actor_queue_wait_seconds`).
/// Platform-owned like `x-asya-error`: whatever a handler put there is overwritten.
pub const SENT_AT_HEADER: &str = "x-asya-sent-at";

/// The envelope borrowed with its own headers replaced: serialises exactly like
/// [`Envelope`] without cloning the payload.
#[derive(Serialize)]
struct Stamped<'a> {
    id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    parent_id: Option<&'a str>,
    route: &'a Route,
    headers: &'a Map<String, Value>,
    payload: &'a Value,
    #[serde(flatten)]
    extra: &'a Map<String, Value>,
}

/// The trace context an outgoing envelope carries: the producer span of its send and the
/// hop's `tracestate` (crate::trace_context).
pub type SendTrace<'a> = (&'a crate::trace_context::TraceParent, Option<&'a str>);

/// The message body of `env` as sent at `sent_at_ms` (see [`SENT_AT_HEADER`]), its trace
/// headers set to `trace` when given, whatever the envelope held (the chain is the
/// platform's, docs/DESIGN.md §4 "Traces").
pub fn to_body_stamped(env: &Envelope, sent_at_ms: u64, trace: Option<SendTrace<'_>>) -> Vec<u8> {
    let mut headers = env.headers.clone();
    headers.insert(SENT_AT_HEADER.into(), Value::from(sent_at_ms));
    if let Some((span, tracestate)) = trace {
        crate::trace_context::set_headers(&mut headers, span, tracestate);
    }
    let stamped = Stamped {
        id: &env.id,
        parent_id: env.parent_id.as_deref(),
        route: &env.route,
        headers: &headers,
        payload: &env.payload,
        extra: &env.extra,
    };
    // Serialising Value-backed data into a Vec cannot fail.
    serde_json::to_vec(&stamped).unwrap_or_default()
}

/// How long an envelope waited between its sender and `now_ms`; `None` without a usable
/// stamp (an envelope from outside the platform) or when the clocks disagree so much that
/// it would be negative.
pub fn queue_wait(env: &Envelope, now_ms: u64) -> Option<std::time::Duration> {
    let sent = env.headers.get(SENT_AT_HEADER)?.as_u64()?;
    now_ms
        .checked_sub(sent)
        .map(std::time::Duration::from_millis)
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
    fn the_stamped_body_is_the_envelope_plus_its_sent_time() {
        let b = body(serde_json::json!({
            "id": "e1", "parent_id": "p", "route": {"actors": ["a"], "current": 0},
            "headers": {"k": 1, "x-asya-sent-at": "forged"}, "payload": [1, 2], "custom": true
        }));
        let env = parse(&b, Some("a")).unwrap();
        let stamped = parse(&to_body_stamped(&env, 1_000, None), Some("a")).unwrap();
        assert_eq!(stamped.headers[SENT_AT_HEADER], 1_000);
        let mut expected = env.clone();
        expected
            .headers
            .insert(SENT_AT_HEADER.into(), Value::from(1_000));
        assert_eq!(stamped, expected);
        assert_eq!(
            queue_wait(&stamped, 1_250),
            Some(std::time::Duration::from_millis(250))
        );
        // The sender's clock ahead of ours: no observation rather than a negative wait.
        assert_eq!(queue_wait(&stamped, 999), None);
        // A forged or missing stamp is no observation either.
        assert_eq!(queue_wait(&env, 1_250), None);
    }

    #[test]
    fn the_sent_body_carries_the_platforms_trace_context() {
        let b = body(serde_json::json!({
            "id": "e1", "route": {"actors": ["a"], "current": 0},
            "headers": {"traceparent": "forged", "tracestate": "forged=1"}, "payload": 1
        }));
        let env = parse(&b, Some("a")).unwrap();
        let span = crate::trace_context::parse_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .unwrap();
        let sent = parse(&to_body_stamped(&env, 1, Some((&span, None))), Some("a")).unwrap();
        assert_eq!(sent.headers["traceparent"], span.format());
        assert!(!sent.headers.contains_key("tracestate"));
        // Without a trace the headers go as they are.
        let plain = parse(&to_body_stamped(&env, 1, None), Some("a")).unwrap();
        assert_eq!(plain.headers["traceparent"], "forged");
    }

    #[test]
    fn salvage_keeps_what_it_can() {
        assert_eq!(salvage(b"\xffabc").0, None);
        let (id, v) = salvage(b"{\"id\":\"z\",\"route\":3}");
        assert_eq!(id.as_deref(), Some("z"));
        assert_eq!(v["route"], 3);
    }
}
