//! Where envelopes go after a handler call (docs/DESIGN.md §4). Pure: no I/O here.

use serde_json::{Map, Value, json};

use asya_transport::envelope::{Envelope, Malformed, Route};
use asya_transport::resiliency::Failure;

// The header names are the wire contract: shared with the `asya` command through the transport.
pub use asya_transport::envelope::{ATTEMPTS_HEADER, ERROR_HEADER};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandlerMode {
    Payload,
    Envelope,
}

/// Queue names of one namespace (docs/DESIGN.md §4).
#[derive(Debug, Clone)]
pub struct Queues {
    pub namespace: String,
}

impl Queues {
    pub fn actor(&self, actor: &str) -> String {
        asya_api::naming::actor_queue(&self.namespace, actor)
    }
    pub fn sink(&self) -> String {
        asya_api::naming::sink_queue(&self.namespace)
    }
    pub fn sump(&self) -> String {
        asya_api::naming::sump_queue(&self.namespace)
    }
}

/// What the runtime answered, once decoded.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Results(Vec<Value>),
    Failure(Failure),
}

/// Decodes a runtime answer: an error object, `null`, a list (fan-out) or one result.
pub fn interpret(answer: Value) -> Answer {
    match answer {
        Value::Null => Answer::Results(Vec::new()),
        Value::Array(items) => Answer::Results(items),
        Value::Object(ref obj) if obj.contains_key("error") && obj.contains_key("details") => {
            let details = obj.get("details").cloned().unwrap_or(Value::Null);
            let text = |k: &str| details.get(k).and_then(Value::as_str).map(str::to_string);
            Answer::Failure(Failure {
                code: obj
                    .get("error")
                    .and_then(Value::as_str)
                    .unwrap_or("handler_error")
                    .to_string(),
                error_type: text("type").unwrap_or_else(|| "Error".into()),
                message: text("message").unwrap_or_default(),
                traceback: text("traceback"),
                mro: details
                    .get("mro")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|n| n.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        }
        other => Answer::Results(vec![other]),
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RouteViolation {
    #[error("result {index} is not an envelope: {reason}")]
    NotEnvelope { index: usize, reason: String },
    #[error(
        "result {index} changed route.current from {from} to {to}; the cursor belongs to the platform"
    )]
    CursorChanged {
        index: usize,
        from: usize,
        to: usize,
    },
    #[error("result {index} rewrote the part of route.actors already visited")]
    PastRewritten { index: usize },
}

/// Outgoing envelopes for a successful call: each with the queue it goes to.
pub fn route_results(
    env: &Envelope,
    results: Vec<Value>,
    mode: HandlerMode,
    queues: &Queues,
) -> Result<Vec<(String, Envelope)>, RouteViolation> {
    if results.is_empty() {
        // Nothing to pass on: the pipeline ends here, visibly, in x-sink.
        let mut done = env.clone();
        done.payload = Value::Null;
        done.route.current += 1;
        return Ok(vec![(queues.sink(), done)]);
    }
    let mut out = Vec::with_capacity(results.len());
    for (i, item) in results.into_iter().enumerate() {
        let mut next = match mode {
            HandlerMode::Payload => {
                let mut e = env.clone();
                e.payload = item;
                e
            }
            HandlerMode::Envelope => from_handler_envelope(env, item, i)?,
        };
        if i > 0 {
            next.id = format!("{}-{}", env.id, i);
            next.parent_id = Some(env.id.clone());
        }
        next.route.current = env.route.current + 1;
        let queue = match next.route.actors.get(next.route.current) {
            Some(actor) => queues.actor(actor),
            None => queues.sink(),
        };
        out.push((queue, next));
    }
    Ok(out)
}

/// Takes what an envelope-mode handler may change (headers, payload, the actors after
/// `current`, extra fields) and keeps what it may not (id, parent, cursor, the past).
pub(crate) fn from_handler_envelope(
    orig: &Envelope,
    item: Value,
    index: usize,
) -> Result<Envelope, RouteViolation> {
    let mut obj = match item {
        Value::Object(o) => o,
        other => {
            return Err(RouteViolation::NotEnvelope {
                index,
                reason: format!("expected an object, got {}", type_name(&other)),
            });
        }
    };
    let route: Route = match obj.remove("route") {
        Some(r) => serde_json::from_value(r).map_err(|e| RouteViolation::NotEnvelope {
            index,
            reason: format!("route: {e}"),
        })?,
        None => orig.route.clone(),
    };
    if route.current != orig.route.current {
        return Err(RouteViolation::CursorChanged {
            index,
            from: orig.route.current,
            to: route.current,
        });
    }
    let upto = orig.route.current + 1;
    if route.actors.len() < upto || route.actors[..upto] != orig.route.actors[..upto] {
        return Err(RouteViolation::PastRewritten { index });
    }
    let headers = match obj.remove("headers") {
        Some(Value::Object(h)) => h,
        Some(Value::Null) | None => orig.headers.clone(),
        Some(other) => {
            return Err(RouteViolation::NotEnvelope {
                index,
                reason: format!("headers must be an object, got {}", type_name(&other)),
            });
        }
    };
    let payload = obj.remove("payload").unwrap_or(Value::Null);
    obj.remove("id");
    obj.remove("parent_id");
    let mut extra = orig.extra.clone();
    extra.extend(obj);
    Ok(Envelope {
        id: orig.id.clone(),
        parent_id: orig.parent_id.clone(),
        route,
        headers,
        payload,
        extra,
    })
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn hop_matches(entry: &Value, actor: &str, hop: usize) -> bool {
    entry.get("actor").and_then(Value::as_str) == Some(actor)
        && entry.get("hop").and_then(Value::as_u64) == Some(hop as u64)
}

/// How many attempts at this hop already failed (from the envelope's history).
pub fn failed_attempts(env: &Envelope, actor: &str) -> u32 {
    env.headers
        .get(ATTEMPTS_HEADER)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter(|e| hop_matches(e, actor, env.route.current))
                .count()
        })
        .unwrap_or(0) as u32
}

/// Appends one failed attempt to the envelope's history.
pub fn record_attempt(
    env: &mut Envelope,
    actor: &str,
    attempt: u32,
    failure: &Failure,
    now_ms: u64,
) {
    let entry = json!({
        "actor": actor,
        "hop": env.route.current,
        "attempt": attempt,
        "error": failure.code,
        "type": failure.error_type,
        "message": failure.message,
        "at_ms": now_ms,
    });
    match env.headers.get_mut(ATTEMPTS_HEADER) {
        Some(Value::Array(a)) => a.push(entry),
        _ => {
            env.headers
                .insert(ATTEMPTS_HEADER.into(), Value::Array(vec![entry]));
        }
    }
}

/// The envelope as it goes to x-sump: unchanged route and payload (so it can be replayed),
/// plus the reason and the last error in `x-asya-error`.
pub fn to_sump(env: &Envelope, actor: &str, reason: &str, failure: Option<&Failure>) -> Envelope {
    let mut out = env.clone();
    let mut err = Map::new();
    err.insert("actor".into(), json!(actor));
    err.insert("reason".into(), json!(reason));
    if let Some(f) = failure {
        err.insert("error".into(), json!(f.code));
        err.insert("type".into(), json!(f.error_type));
        err.insert("message".into(), json!(f.message));
        if let Some(tb) = &f.traceback {
            err.insert("traceback".into(), json!(tb));
        }
    }
    out.headers.insert(ERROR_HEADER.into(), Value::Object(err));
    out
}

/// An x-sump envelope for a message that was not a usable envelope at all.
pub fn malformed_to_sump(
    body: &[u8],
    actor: &str,
    why: &Malformed,
    fallback_id: String,
    truncate_at: usize,
) -> Envelope {
    let (id, mut original) = asya_transport::envelope::salvage(body);
    if let Value::String(s) = &mut original
        && s.len() > truncate_at
    {
        // Keep the reason deliverable even when the junk was huge.
        let mut cut = truncate_at;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    let mut headers = Map::new();
    headers.insert(
        ERROR_HEADER.into(),
        json!({"actor": actor, "reason": format!("malformed message: {why}"), "error": why.code()}),
    );
    Envelope {
        id: id.unwrap_or(fallback_id),
        parent_id: None,
        route: Route {
            actors: Vec::new(),
            current: 0,
            extra: Map::new(),
        },
        headers,
        payload: original,
        extra: Map::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q() -> Queues {
        Queues {
            namespace: "ns".into(),
        }
    }

    fn env(actors: &[&str], current: usize) -> Envelope {
        serde_json::from_value(json!({
            "id": "e1",
            "route": {"actors": actors, "current": current},
            "headers": {"trace_id": "t-1"},
            "payload": {"in": 1}
        }))
        .unwrap()
    }

    #[test]
    fn interpret_answers() {
        assert_eq!(interpret(Value::Null), Answer::Results(vec![]));
        assert_eq!(
            interpret(json!([1, 2])),
            Answer::Results(vec![json!(1), json!(2)])
        );
        assert_eq!(
            interpret(json!({"a": 1})),
            Answer::Results(vec![json!({"a": 1})])
        );
        let Answer::Failure(f) = interpret(json!({"error": "handler_error",
            "details": {"message": "m", "type": "ValueError", "traceback": "tb",
                        "mro": ["ValueError", "Exception", "BaseException"]}}))
        else {
            panic!("not a failure")
        };
        assert_eq!(
            (f.code.as_str(), f.error_type.as_str()),
            ("handler_error", "ValueError")
        );
        assert_eq!(f.traceback.as_deref(), Some("tb"));
        assert_eq!(f.mro, ["ValueError", "Exception", "BaseException"]);
    }

    #[test]
    fn linear_next_actor_then_sink() {
        let out = route_results(
            &env(&["a", "b"], 0),
            vec![json!({"x": 2})],
            HandlerMode::Payload,
            &q(),
        )
        .unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, "asya-ns-b");
        assert_eq!(out[0].1.route.current, 1);
        assert_eq!(out[0].1.payload, json!({"x": 2}));
        assert_eq!(out[0].1.headers["trace_id"], "t-1");
        let last = route_results(
            &env(&["a", "b"], 1),
            vec![json!(3)],
            HandlerMode::Payload,
            &q(),
        )
        .unwrap();
        assert_eq!(last[0].0, "asya-ns-x-sink");
        assert_eq!(last[0].1.route.current, 2);
    }

    #[test]
    fn fan_out_ids_and_parent() {
        let out = route_results(
            &env(&["a", "b"], 0),
            vec![json!(1), json!(2), json!(3)],
            HandlerMode::Payload,
            &q(),
        )
        .unwrap();
        let ids: Vec<_> = out.iter().map(|(_, e)| e.id.as_str()).collect();
        assert_eq!(ids, ["e1", "e1-1", "e1-2"]);
        assert_eq!(out[0].1.parent_id, None);
        assert_eq!(out[2].1.parent_id.as_deref(), Some("e1"));
        assert!(out.iter().all(|(q, _)| q == "asya-ns-b"));
    }

    #[test]
    fn empty_result_goes_to_sink() {
        let out = route_results(&env(&["a", "b"], 0), vec![], HandlerMode::Payload, &q()).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, "asya-ns-x-sink");
        assert_eq!(out[0].1.payload, Value::Null);
    }

    #[test]
    fn envelope_mode_dynamic_routing() {
        let e = env(&["a", "b"], 0);
        let item = json!({"id": "forged", "route": {"actors": ["a", "c", "d"], "current": 0},
                          "headers": {"trace_id": "t-1", "k": "v"}, "payload": 9});
        let out = route_results(&e, vec![item], HandlerMode::Envelope, &q()).unwrap();
        assert_eq!(out[0].0, "asya-ns-c");
        assert_eq!(out[0].1.id, "e1");
        assert_eq!(out[0].1.headers["k"], "v");
        assert_eq!(out[0].1.route.actors, ["a", "c", "d"]);
    }

    #[test]
    fn envelope_mode_may_not_move_cursor_or_rewrite_past() {
        let e = env(&["a", "b", "c"], 1);
        let moved = json!({"route": {"actors": ["a", "b", "c"], "current": 2}, "payload": 1});
        assert!(matches!(
            route_results(&e, vec![moved], HandlerMode::Envelope, &q()),
            Err(RouteViolation::CursorChanged { .. })
        ));
        let past = json!({"route": {"actors": ["z", "b", "c"], "current": 1}, "payload": 1});
        assert!(matches!(
            route_results(&e, vec![past], HandlerMode::Envelope, &q()),
            Err(RouteViolation::PastRewritten { .. })
        ));
        assert!(matches!(
            route_results(&e, vec![json!(5)], HandlerMode::Envelope, &q()),
            Err(RouteViolation::NotEnvelope { .. })
        ));
    }

    #[test]
    fn attempts_are_counted_per_actor_and_hop() {
        let mut e = env(&["a", "a"], 0);
        let f = Failure {
            code: "handler_error".into(),
            error_type: "E".into(),
            message: "m".into(),
            traceback: None,
            mro: Vec::new(),
        };
        record_attempt(&mut e, "a", 1, &f, 1);
        record_attempt(&mut e, "a", 2, &f, 2);
        assert_eq!(failed_attempts(&e, "a"), 2);
        e.route.current = 1;
        assert_eq!(failed_attempts(&e, "a"), 0);
        let s = to_sump(&e, "a", "retries exhausted", Some(&f));
        assert_eq!(s.headers[ERROR_HEADER]["reason"], "retries exhausted");
        assert_eq!(s.headers[ATTEMPTS_HEADER].as_array().unwrap().len(), 2);
    }

    #[test]
    fn malformed_keeps_original_and_reason() {
        let why = Malformed::NotJson("x".into());
        let s = malformed_to_sump(b"garbage", "a", &why, "gen-1".into(), 3);
        assert_eq!(s.id, "gen-1");
        assert_eq!(s.payload, json!("gar"));
        assert!(
            s.headers[ERROR_HEADER]["reason"]
                .as_str()
                .unwrap()
                .contains("not JSON")
        );
    }
}
