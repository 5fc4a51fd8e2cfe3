//! `asya trace`: which source tells an envelope's hops, and the hops from each. Pure.
//!
//! Sources, best first: the gateway's store (when the release has a gateway: every
//! sidecar reports each hop there), the trace backend (`tracing.queryUrl`: the sidecars'
//! spans, `trace_backend`), and what the queues still hold (where each envelope of the
//! family is now).

use serde::Serialize;
use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// The gateway's REST API (`GET /envelopes/{id}`), at this URL.
    Gateway(String),
    /// The trace backend's query API (Jaeger's, `tracing.queryUrl`), at this URL.
    TraceBackend(String),
    /// The namespace's queues: x-sink, x-sump and the actors' queues.
    Queues,
}

/// The sources to ask, best first: the gateway (every hop of an envelope it knows), the
/// trace backend (every sampled hop), then the queues (where each envelope is now). The
/// next is asked only when one knows nothing of the envelope: the gateway knows only what
/// went through it, the backend only sampled traces.
pub fn sources(gateway_url: Option<&str>, trace_backend: Option<&str>) -> Vec<Source> {
    let mut out = Vec::new();
    if let Some(g) = gateway_url.filter(|g| !g.is_empty()) {
        out.push(Source::Gateway(g.trim_end_matches('/').to_string()));
    }
    if let Some(t) = trace_backend.filter(|t| !t.is_empty()) {
        out.push(Source::TraceBackend(t.trim_end_matches('/').to_string()));
    }
    out.push(Source::Queues);
    out
}

/// Whether a source that could not answer (out of reach, or refusing this caller) is passed
/// over for the next, the reason noted: the gateway and the trace backend are. The
/// configuration names them at their in-cluster addresses, which `asya` run outside the
/// cluster does not reach, and reading the gateway takes a client token; the queues, asked
/// last, answer or the command fails with their error.
pub fn passed_over(source: &Source, could_not_answer: bool) -> bool {
    could_not_answer && !matches!(source, Source::Queues)
}

/// How the output names a source.
pub fn described(source: &Source) -> String {
    match source {
        Source::Gateway(url) => format!("the gateway's store at {url}"),
        Source::TraceBackend(url) => format!("the trace backend at {url}"),
        Source::Queues => "the namespace's queues (where each envelope is now)".to_string(),
    }
}

/// One hop of one envelope.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hop {
    pub envelope: String,
    pub actor: String,
    /// ms since the epoch of the first report of this hop.
    pub at_ms: Option<i64>,
    pub duration_ms: Option<i64>,
    /// The last phase reported for the hop (`received`, `processing`, `completed`, `failed`,
    /// …), or where the queues hold it (`waiting`, `finished`, `failed`).
    pub outcome: String,
}

/// Hops from the gateway's record of one envelope (`{id, history: [{actor, phase, at_ms}],
/// children: [...]}`): consecutive events of the same actor are one hop.
pub fn hops_from_gateway(record: &Value) -> Vec<Hop> {
    let id = record.get("id").and_then(Value::as_str).unwrap_or_default();
    let mut hops: Vec<Hop> = Vec::new();
    // Per hop: the flow decisions its sidecar reported (the `completed` report's message).
    let mut decided: Vec<Option<String>> = Vec::new();
    let history = record
        .get("history")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for ev in &history {
        let actor = ev
            .get("actor")
            .and_then(Value::as_str)
            .unwrap_or("-")
            .to_string();
        let phase = ev
            .get("phase")
            .and_then(Value::as_str)
            .unwrap_or("-")
            .to_string();
        let at = ev.get("at_ms").and_then(Value::as_i64);
        let decisions = ev
            .get("message")
            .and_then(Value::as_str)
            .and_then(asya_flow::trace::decisions_of)
            .map(str::to_string);
        match hops.last_mut() {
            // A flow may call an actor twice in a row (a retry loop): a new `received` after
            // `completed` is the next hop.
            Some(h) if h.actor == actor && !(h.outcome == "completed" && phase == "received") => {
                if let (Some(start), Some(t)) = (h.at_ms, at) {
                    h.duration_ms = Some(t - start);
                }
                h.outcome = phase;
            }
            _ => {
                hops.push(Hop {
                    envelope: id.to_string(),
                    actor,
                    at_ms: at,
                    duration_ms: None,
                    outcome: phase,
                });
                decided.push(None);
            }
        }
        if let (Some(d), Some(slot)) = (decisions, decided.last_mut()) {
            *slot = Some(d);
        }
    }
    for (h, d) in hops.iter_mut().zip(decided) {
        h.outcome =
            crate::trace_backend::with_decisions(std::mem::take(&mut h.outcome), d.as_deref());
    }
    hops
}

/// The ids of an envelope's fan-out children in the gateway's record.
pub fn children(record: &Value) -> Vec<String> {
    record
        .get("children")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|c| {
                    c.as_str()
                        .map(str::to_string)
                        .or_else(|| c.get("id").and_then(Value::as_str).map(str::to_string))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The path of an envelope in a flow (docs/flows.md): the actors it visited and the flow's
/// decisions by source line (`14:else`, `37:except PaymentDeclined`); `None` outside a flow.
pub fn flow_path(e: &asya_transport::envelope::Envelope) -> Option<String> {
    let flow = e.extra.get(asya_flow::ENVELOPE_FIELD)?;
    let name = flow
        .pointer("/program/flow")
        .and_then(Value::as_str)
        .unwrap_or("?");
    let decisions: Vec<&str> = flow
        .get("trail")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let upto = (e.route.current + 1).min(e.route.actors.len());
    Some(format!(
        "flow {name}: {}; decisions: {}",
        e.route.actors[..upto].join(" → "),
        if decisions.is_empty() {
            "none".to_string()
        } else {
            decisions.join(", ")
        }
    ))
}

/// Whether `candidate` is `id` or one of its fan-out descendants (`{id}-{i}`, §4).
pub fn in_family(id: &str, candidate: &str) -> bool {
    candidate == id
        || candidate
            .strip_prefix(id)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|rest| {
                rest.split('-')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_gateway_first_then_the_backend_then_the_queues() {
        assert_eq!(
            sources(Some("http://g/"), Some("http://j:16686/")),
            vec![
                Source::Gateway("http://g".into()),
                Source::TraceBackend("http://j:16686".into()),
                Source::Queues
            ]
        );
        assert_eq!(
            sources(None, Some("http://j")),
            vec![Source::TraceBackend("http://j".into()), Source::Queues]
        );
        assert_eq!(sources(Some(""), Some("")), vec![Source::Queues]);
    }

    #[test]
    fn a_source_that_cannot_answer_is_passed_over_but_the_queues() {
        let g = Source::Gateway("http://asya-gateway.asya-system.svc:8080".into());
        let t = Source::TraceBackend("http://j".into());
        assert!(passed_over(&g, true));
        assert!(passed_over(&t, true));
        assert!(!passed_over(&Source::Queues, true));
        // A source that answered wrongly (not JSON, a bad URL) stops the command.
        assert!(!passed_over(&g, false));
        assert_eq!(
            described(&g),
            "the gateway's store at http://asya-gateway.asya-system.svc:8080"
        );
    }

    #[test]
    fn a_flow_hop_shows_the_decisions_its_sidecar_reported() {
        let rec = json!({"id": "once", "history": [
            {"actor": "validate", "phase": "received", "at_ms": 100},
            {"actor": "validate", "phase": "completed", "message": "flow review_order", "at_ms": 110},
            {"actor": "charge", "phase": "received", "at_ms": 120},
            {"actor": "charge", "phase": "processing", "at_ms": 121},
            {"actor": "charge", "phase": "completed", "at_ms": 130,
             "message": "flow review_order: 37:except PaymentDeclined, 38:else"},
            {"actor": "charge", "phase": "received", "at_ms": 140},
            {"actor": "charge", "phase": "completed", "at_ms": 150,
             "message": "flow review_order: 14:else, 17:if"}
        ]});
        let outcomes: Vec<(String, String)> = hops_from_gateway(&rec)
            .into_iter()
            .map(|h| (h.actor, h.outcome))
            .collect();
        let want = [
            ("validate", "completed"),
            (
                "charge",
                "completed (decisions: 37:except PaymentDeclined, 38:else)",
            ),
            ("charge", "completed (decisions: 14:else, 17:if)"),
        ];
        assert_eq!(outcomes, want.map(|(a, o)| (a.to_string(), o.to_string())));
    }

    #[test]
    fn consecutive_events_of_an_actor_are_one_hop() {
        let rec = json!({"id": "e1", "children": ["e1-1", {"id": "e1-2"}], "history": [
            {"actor": "a", "phase": "received", "at_ms": 100},
            {"actor": "a", "phase": "completed", "at_ms": 160},
            {"actor": "b", "phase": "received", "at_ms": 170},
            {"actor": "b", "phase": "failed", "at_ms": 200}
        ]});
        let hops = hops_from_gateway(&rec);
        assert_eq!(hops.len(), 2);
        assert_eq!(
            (
                hops[0].actor.as_str(),
                hops[0].duration_ms,
                hops[0].outcome.as_str()
            ),
            ("a", Some(60), "completed")
        );
        assert_eq!(
            (
                hops[1].actor.as_str(),
                hops[1].at_ms,
                hops[1].outcome.as_str()
            ),
            ("b", Some(170), "failed")
        );
        assert_eq!(children(&rec), vec!["e1-1", "e1-2"]);
    }

    #[test]
    fn a_flow_envelope_tells_its_path_and_decisions() {
        let e: asya_transport::envelope::Envelope = serde_json::from_value(json!({
            "id": "o1", "route": {"actors": ["validate", "charge", "charge", "notify"], "current": 4},
            "payload": {}, "flow": {"program": {"flow": "review_order"}, "pc": 3,
                                    "trail": ["37:except PaymentDeclined", "14:else"]}
        }))
        .unwrap();
        assert_eq!(
            flow_path(&e).unwrap(),
            "flow review_order: validate → charge → charge → notify; decisions: 37:except PaymentDeclined, 14:else"
        );
        let mut plain = e.clone();
        plain.extra.clear();
        assert_eq!(flow_path(&plain), None);
    }

    #[test]
    fn family_is_the_id_and_its_numbered_children() {
        assert!(in_family("e1", "e1"));
        assert!(in_family("e1", "e1-2"));
        assert!(in_family("e1", "e1-2-1"));
        assert!(!in_family("e1", "e10"));
        assert!(!in_family("e1", "e1-x"));
        assert!(!in_family("e1", "e1-"));
    }
}
