//! What an x-sump envelope says about its failure, read from the headers the sidecar writes
//! (`transport::envelope::{ERROR_HEADER, ATTEMPTS_HEADER, REDRIVEN_HEADER}`, docs/DESIGN.md §4).
//! Pure: a view over a parsed envelope, never an error for odd headers (an operator must
//! still see an envelope whose headers a handler mangled).

use asya_transport::envelope::{ATTEMPTS_HEADER, ERROR_HEADER, Envelope, REDRIVEN_HEADER};
use serde::Serialize;
use serde_json::Value;

/// One failed envelope as `sump list/show` print it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Failed {
    pub id: String,
    /// The actor it failed at: `x-asya-error.actor`, else the route's current actor.
    pub actor: Option<String>,
    /// Why it went to x-sump (`retries exhausted`, `malformed message: …`, …).
    pub reason: Option<String>,
    /// The error code (`processing_error`, `timeout`, `not_json`, …).
    pub error: Option<String>,
    #[serde(rename = "type")]
    pub error_type: Option<String>,
    pub message: Option<String>,
    pub traceback: Option<String>,
    /// Failed attempts recorded in `x-asya-attempts`.
    pub attempts: usize,
    /// `route.current` and the route, e.g. 1 of `[a, b, c]`: where a redrive sends it.
    pub route_position: usize,
    pub route: Vec<String>,
    /// When it failed (ms since the epoch): the broker's time of the x-sump message, else the
    /// last recorded attempt; unknown for envelopes that failed without an attempt record.
    pub failed_at_ms: Option<u64>,
    /// Times it was redriven before (`x-asya-redriven.count`).
    pub redriven: u64,
}

fn text(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str).map(str::to_string)
}

impl Failed {
    /// The view of `env`; `broker_time_ms` is when the broker took the x-sump message, if it
    /// says (SQS `SentTimestamp`, the AMQP `timestamp` property).
    pub fn of(env: &Envelope, broker_time_ms: Option<u64>) -> Failed {
        let err = env.headers.get(ERROR_HEADER).and_then(Value::as_object);
        let field = |k: &str| text(err.and_then(|e| e.get(k)));
        let attempts = env.headers.get(ATTEMPTS_HEADER).and_then(Value::as_array);
        let last_attempt_ms = attempts
            .and_then(|a| a.last())
            .and_then(|a| a.get("at_ms"))
            .and_then(Value::as_u64);
        let redriven = env
            .headers
            .get(REDRIVEN_HEADER)
            .and_then(|r| r.get("count"))
            .and_then(Value::as_u64)
            .unwrap_or(0);
        Failed {
            id: env.id.clone(),
            actor: field("actor").or_else(|| env.route.actors.get(env.route.current).cloned()),
            reason: field("reason"),
            error: field("error"),
            error_type: field("type"),
            message: field("message"),
            traceback: field("traceback"),
            attempts: attempts.map_or(0, Vec::len),
            route_position: env.route.current,
            route: env.route.actors.clone(),
            failed_at_ms: broker_time_ms.or(last_attempt_ms),
            redriven,
        }
    }

    /// The text `--error REGEX` is matched against: reason, code, type and message, so a
    /// pattern may name any of them (`ValueError`, `timeout`, `retries exhausted`).
    pub fn error_text(&self) -> String {
        [&self.reason, &self.error, &self.error_type, &self.message]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(" | ")
    }

    /// One line for tables: `type: message`, else the reason.
    pub fn summary(&self) -> String {
        match (&self.error_type, &self.message) {
            (Some(t), Some(m)) => format!("{t}: {m}"),
            (None, Some(m)) => m.clone(),
            _ => self.reason.clone().unwrap_or_default(),
        }
    }

    /// `1/3 b`: the position (1-based) in the route and the actor there.
    pub fn position_label(&self) -> String {
        match self.route.get(self.route_position) {
            Some(a) => format!("{}/{} {a}", self.route_position + 1, self.route.len()),
            None => format!("{}/{} -", self.route_position + 1, self.route.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn sumped() -> Envelope {
        serde_json::from_value(json!({
            "id": "e1",
            "route": {"actors": ["a", "b", "c"], "current": 1},
            "headers": {
                "x-asya-attempts": [
                    {"actor": "b", "hop": 1, "attempt": 1, "error": "processing_error", "type": "ValueError", "message": "bad", "at_ms": 1000},
                    {"actor": "b", "hop": 1, "attempt": 2, "error": "processing_error", "type": "ValueError", "message": "bad", "at_ms": 2000}
                ],
                "x-asya-error": {"actor": "b", "reason": "retries exhausted", "error": "processing_error",
                                  "type": "ValueError", "message": "bad", "traceback": "Traceback ..."}
            },
            "payload": {"k": 1}
        }))
        .unwrap()
    }

    #[test]
    fn reads_what_the_sidecar_writes() {
        let f = Failed::of(&sumped(), None);
        assert_eq!(f.actor.as_deref(), Some("b"));
        assert_eq!(f.reason.as_deref(), Some("retries exhausted"));
        assert_eq!(f.error_type.as_deref(), Some("ValueError"));
        assert_eq!(f.traceback.as_deref(), Some("Traceback ..."));
        assert_eq!(f.attempts, 2);
        assert_eq!(f.failed_at_ms, Some(2000));
        assert_eq!(f.position_label(), "2/3 b");
        assert_eq!(f.summary(), "ValueError: bad");
        assert_eq!(f.redriven, 0);
    }

    #[test]
    fn broker_time_wins_over_the_last_attempt() {
        assert_eq!(Failed::of(&sumped(), Some(5)).failed_at_ms, Some(5));
    }

    #[test]
    fn odd_headers_give_an_empty_view_not_an_error() {
        let env: Envelope = serde_json::from_value(json!({
            "id": "m", "route": {"actors": [], "current": 0},
            "headers": {"x-asya-error": "not an object", "x-asya-attempts": 3, "x-asya-redriven": {"count": 2}}
        }))
        .unwrap();
        let f = Failed::of(&env, None);
        assert_eq!(f.actor, None);
        assert_eq!(f.attempts, 0);
        assert_eq!(f.failed_at_ms, None);
        assert_eq!(f.redriven, 2);
        assert_eq!(f.position_label(), "1/0 -");
        assert_eq!(f.summary(), "");
    }
}
