//! `asya trace` from the trace backend (Jaeger's query API, `tracing.queryUrl`): the spans of
//! the sidecars' hops (docs/observability.md#tracing), parsed into a tree and into hops. Pure;
//! the HTTP calls are in `cmd::trace`.
//!
//! Jaeger's `/api/traces` answer is `{data: [{traceID, spans: [{spanID, operationName,
//! references: [{refType, spanID}], startTime µs, duration µs, tags: [{key, value}],
//! processID}], processes: {pID: {serviceName, tags}}}]}`. A sidecar's CONSUMER span
//! `process {queue}` is one hop (service = the actor); its children are the runtime call
//! and one PRODUCER `send {queue}` per outgoing envelope, whose child is the next hop.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use serde_json::Value;

use crate::trace::Hop;

/// The attribute that holds the envelope id on every hop's spans.
pub const MESSAGE_ID: &str = "messaging.message.id";
/// The resource attribute the webhook sets from the pod's namespace.
pub const NAMESPACE: &str = "k8s.namespace.name";

/// One span, as the tree and the JSON output show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Span {
    pub span_id: String,
    pub parent: Option<String>,
    pub name: String,
    /// `server`, `consumer`, `internal`, `producer`, …
    pub kind: String,
    pub service: String,
    pub namespace: Option<String>,
    pub start_us: i64,
    pub duration_us: i64,
    pub envelope: Option<String>,
    /// `error.type` and the status description, when the span ended in ERROR.
    pub error: Option<String>,
    /// A hop in a flow: the decisions its sidecar took after the handler
    /// (`37:except PaymentDeclined, 38:else`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decisions: Option<String>,
}

/// The trace ids of a search answer.
pub fn trace_ids(answer: &Value) -> Vec<String> {
    answer["data"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["traceID"].as_str().map(str::to_string))
        .collect()
}

fn tag<'a>(tags: &'a Value, key: &str) -> Option<&'a Value> {
    tags.as_array()?
        .iter()
        .find(|t| t["key"] == key)
        .map(|t| &t["value"])
}

fn tag_str(tags: &Value, key: &str) -> Option<String> {
    tag(tags, key).and_then(|v| v.as_str().map(str::to_string))
}

/// The spans of the first trace in a `/api/traces[/{id}]` answer, ordered by start time.
/// A span whose parent is not in the answer (the sender's span lives in a system that does
/// not export, or was not sampled) becomes a root.
pub fn spans(answer: &Value) -> Vec<Span> {
    let Some(trace) = answer["data"].as_array().and_then(|d| d.first()) else {
        return Vec::new();
    };
    let processes = &trace["processes"];
    let mut out: Vec<Span> = trace["spans"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| {
            let tags = &s["tags"];
            let process = &processes[s["processID"].as_str().unwrap_or_default()];
            let status_error = tag_str(tags, "otel.status_code").as_deref() == Some("ERROR")
                || tag(tags, "error").and_then(Value::as_bool) == Some(true);
            let error = status_error.then(|| {
                match (
                    tag_str(tags, "error.type"),
                    tag_str(tags, "otel.status_description"),
                ) {
                    // Sidecars built before issue 37 put the type in the description too.
                    (Some(t), Some(d)) if !d.is_empty() && d != t => format!("{t}: {d}"),
                    (Some(t), _) => t,
                    (None, Some(d)) => d,
                    (None, None) => "error".to_string(),
                }
            });
            Some(Span {
                span_id: s["spanID"].as_str()?.to_string(),
                parent: parent_of(&s["references"]),
                name: s["operationName"].as_str().unwrap_or_default().to_string(),
                kind: tag_str(tags, "span.kind").unwrap_or_else(|| "internal".into()),
                service: process["serviceName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                namespace: tag_str(&process["tags"], NAMESPACE),
                start_us: s["startTime"].as_i64().unwrap_or_default(),
                duration_us: s["duration"].as_i64().unwrap_or_default(),
                envelope: tag_str(tags, MESSAGE_ID),
                error,
                decisions: tag_str(tags, asya_flow::trace::DECISIONS_ATTRIBUTE),
            })
        })
        .collect();
    let known: std::collections::HashSet<String> = out.iter().map(|s| s.span_id.clone()).collect();
    for s in &mut out {
        if s.parent.as_ref().is_some_and(|p| !known.contains(p)) {
            s.parent = None;
        }
    }
    out.sort_by(|a, b| (a.start_us, &a.span_id).cmp(&(b.start_us, &b.span_id)));
    out
}

/// Keeps the spans of one namespace's services: another tenant's actor may have the same
/// name. Spans without the attribute (a gateway, a collector that drops it) stay.
pub fn of_namespace(spans: Vec<Span>, namespace: &str) -> Vec<Span> {
    spans
        .into_iter()
        .filter(|s| s.namespace.as_deref().is_none_or(|n| n == namespace))
        .collect()
}

/// One hop per CONSUMER span: the actor (its service), when, how long, and the outcome —
/// `failed: …` when the hop or one of its children ended in ERROR.
pub fn hops(spans: &[Span]) -> Vec<Hop> {
    let mut errors_below: HashMap<&str, &str> = HashMap::new();
    for s in spans {
        if let (Some(p), Some(e)) = (&s.parent, &s.error) {
            errors_below.entry(p.as_str()).or_insert(e.as_str());
        }
    }
    spans
        .iter()
        .filter(|s| s.kind == "consumer")
        .map(|s| {
            let error = s
                .error
                .as_deref()
                .or_else(|| errors_below.get(s.span_id.as_str()).copied());
            Hop {
                envelope: s.envelope.clone().unwrap_or_default(),
                actor: s.service.clone(),
                at_ms: Some(s.start_us / 1000),
                duration_ms: Some(s.duration_us / 1000),
                outcome: with_decisions(
                    error.map_or_else(|| "completed".into(), |e| format!("failed: {e}")),
                    s.decisions.as_deref(),
                ),
            }
        })
        .collect()
}

/// A hop's outcome with the flow decisions it took: `completed (decisions: 14:else, 17:if)`.
pub fn with_decisions(outcome: String, decisions: Option<&str>) -> String {
    match decisions {
        Some(d) => format!("{outcome} (decisions: {d})"),
        None => outcome,
    }
}

/// The spans as a tree, one line each: name, service, duration, and ERROR with its reason.
/// Children are in start order; `start_us` of the first root is the trace's time zero.
pub fn render_tree(spans: &[Span]) -> String {
    let mut children: BTreeMap<Option<&str>, Vec<&Span>> = BTreeMap::new();
    for s in spans {
        children.entry(s.parent.as_deref()).or_default().push(s);
    }
    let t0 = spans.iter().map(|s| s.start_us).min().unwrap_or_default();
    let mut out = String::new();
    let roots = children.get(&None).cloned().unwrap_or_default();
    for root in roots {
        walk(root, "", None, &children, t0, &mut out);
    }
    out
}

fn walk(
    s: &Span,
    prefix: &str,
    last: Option<bool>,
    children: &BTreeMap<Option<&str>, Vec<&Span>>,
    t0: i64,
    out: &mut String,
) {
    let branch = match last {
        None => "",
        Some(true) => "└─ ",
        Some(false) => "├─ ",
    };
    let mut line = format!(
        "{prefix}{branch}{} [{}] +{} {}",
        s.name,
        s.service,
        ms(s.start_us - t0),
        ms(s.duration_us)
    );
    if let Some(e) = s.envelope.as_ref().filter(|_| s.kind == "consumer") {
        line.push_str(&format!(" envelope={e}"));
    }
    if let Some(e) = &s.error {
        line.push_str(&format!(" ERROR {e}"));
    }
    if let Some(d) = &s.decisions {
        line.push_str(&format!(" decisions: {d}"));
    }
    out.push_str(&line);
    out.push('\n');
    let below = match last {
        None => prefix.to_string(),
        Some(true) => format!("{prefix}   "),
        Some(false) => format!("{prefix}│  "),
    };
    let kids = children
        .get(&Some(s.span_id.as_str()))
        .cloned()
        .unwrap_or_default();
    for (i, k) in kids.iter().enumerate() {
        walk(k, &below, Some(i + 1 == kids.len()), children, t0, out);
    }
}

/// The span's parent: its CHILD_OF reference, else its FOLLOWS_FROM one. A sidecar's CONSUMER
/// span has the sender's span as parent and as link, which Jaeger's OTLP translator shows as
/// a single FOLLOWS_FROM reference: without it every hop would be a root of its own.
fn parent_of(references: &Value) -> Option<String> {
    let refs = references.as_array()?;
    ["CHILD_OF", "FOLLOWS_FROM"]
        .iter()
        .find_map(|kind| refs.iter().find(|r| r["refType"] == *kind))
        .and_then(|r| r["spanID"].as_str().map(str::to_string))
}

fn ms(us: i64) -> String {
    format!("{:.1}ms", us as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn span(id: &str, parent: Option<&str>, name: &str, kind: &str, start: i64) -> Value {
        let mut tags = vec![json!({"key": "span.kind", "value": kind})];
        if kind == "consumer" {
            tags.push(json!({"key": MESSAGE_ID, "value": format!("e-{id}")}));
        }
        json!({
            "spanID": id, "operationName": name, "startTime": start, "duration": 2000,
            // As Jaeger answers for the sidecar's spans: a consumer's parent (also its link)
            // as FOLLOWS_FROM, the others' as CHILD_OF.
            "references": parent.map(|p| vec![json!({
                "refType": if kind == "consumer" { "FOLLOWS_FROM" } else { "CHILD_OF" }, "spanID": p,
            })]).unwrap_or_default(),
            "tags": tags, "processID": if id.starts_with('b') { "p2" } else { "p1" },
        })
    }

    /// a → (runtime call, send b ×2 fan-out) → two hops of b, the second failing.
    fn answer() -> Value {
        let mut failed_call = span("b2r", Some("b2"), "runtime call", "internal", 1_000_900);
        failed_call["tags"].as_array_mut().unwrap().extend([
            json!({"key": "otel.status_code", "value": "ERROR"}),
            json!({"key": "error.type", "value": "ValueError"}),
            json!({"key": "otel.status_description", "value": "bad input"}),
        ]);
        json!({"data": [{
            "traceID": "t1",
            "spans": [
                span("b2", Some("as2"), "process asya-ns-b", "consumer", 1_000_800),
                span("a1", Some("gone"), "process asya-ns-a", "consumer", 1_000_000),
                span("ar", Some("a1"), "runtime call", "internal", 1_000_100),
                span("as1", Some("a1"), "send asya-ns-b", "producer", 1_000_300),
                span("as2", Some("a1"), "send asya-ns-b", "producer", 1_000_400),
                span("b1", Some("as1"), "process asya-ns-b", "consumer", 1_000_700),
                failed_call,
            ],
            "processes": {
                "p1": {"serviceName": "a", "tags": [{"key": NAMESPACE, "value": "ns"}]},
                "p2": {"serviceName": "b", "tags": [{"key": NAMESPACE, "value": "ns"}]},
            }
        }]})
    }

    #[test]
    fn a_parent_outside_the_answer_makes_a_root_and_spans_are_in_start_order() {
        let s = spans(&answer());
        assert_eq!(s[0].span_id, "a1");
        assert_eq!(s[0].parent, None);
        assert!(s.windows(2).all(|w| w[0].start_us <= w[1].start_us));
        assert_eq!(trace_ids(&answer()), vec!["t1"]);
    }

    #[test]
    fn one_hop_per_consumer_span_failed_when_a_child_erred() {
        let h = hops(&spans(&answer()));
        let got: Vec<(&str, &str, &str)> = h
            .iter()
            .map(|h| (h.envelope.as_str(), h.actor.as_str(), h.outcome.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("e-a1", "a", "completed"),
                ("e-b1", "b", "completed"),
                ("e-b2", "b", "failed: ValueError: bad input"),
            ]
        );
        assert_eq!(h[0].at_ms, Some(1000));
        assert_eq!(h[0].duration_ms, Some(2));
    }

    #[test]
    fn a_flow_hop_shows_its_decisions_in_the_hops_and_the_tree() {
        let mut a = answer();
        let b1 = a["data"][0]["spans"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find(|s| s["spanID"] == "b1")
            .unwrap();
        b1["tags"].as_array_mut().unwrap().push(json!({
            "key": asya_flow::trace::DECISIONS_ATTRIBUTE, "value": "14:else, 17:if"
        }));
        let sp = spans(&a);
        let h = hops(&sp);
        assert_eq!(h[1].outcome, "completed (decisions: 14:else, 17:if)");
        assert_eq!(h[0].outcome, "completed");
        let tree = render_tree(&sp);
        let line = tree.lines().find(|l| l.contains("envelope=e-b1")).unwrap();
        assert!(line.ends_with(" decisions: 14:else, 17:if"), "{tree}");
    }

    #[test]
    fn a_description_repeating_the_type_is_shown_once() {
        let mut a = answer();
        let call = a["data"][0]["spans"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find(|s| s["spanID"] == "b2r")
            .unwrap();
        call["tags"].as_array_mut().unwrap()[3]["value"] = json!("ValueError");
        let h = hops(&spans(&a));
        assert_eq!(h[2].outcome, "failed: ValueError");
    }

    #[test]
    fn the_tree_nests_hops_under_the_sends_that_made_them() {
        let tree = render_tree(&spans(&answer()));
        let expected = "\
process asya-ns-a [a] +0.0ms 2.0ms envelope=e-a1
├─ runtime call [a] +0.1ms 2.0ms
├─ send asya-ns-b [a] +0.3ms 2.0ms
│  └─ process asya-ns-b [b] +0.7ms 2.0ms envelope=e-b1
└─ send asya-ns-b [a] +0.4ms 2.0ms
   └─ process asya-ns-b [b] +0.8ms 2.0ms envelope=e-b2
      └─ runtime call [b] +0.9ms 2.0ms ERROR ValueError: bad input
";
        assert_eq!(tree, expected);
    }

    #[test]
    fn another_namespaces_spans_are_left_out() {
        let mut a = answer();
        a["data"][0]["processes"]["p2"]["tags"][0]["value"] = json!("other");
        let s = of_namespace(spans(&a), "ns");
        assert!(s.iter().all(|s| s.service == "a"), "{s:?}");
    }

    #[test]
    fn an_empty_or_odd_answer_gives_no_spans() {
        assert!(spans(&json!({"data": []})).is_empty());
        assert!(spans(&json!({"errors": [{"msg": "x"}]})).is_empty());
        assert!(spans(&json!({"data": [{"spans": [{"operationName": "no id"}]}]})).is_empty());
        assert_eq!(render_tree(&[]), "");
    }
}
