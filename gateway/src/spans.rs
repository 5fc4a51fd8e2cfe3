//! The gateway's traces (docs/observability.md § Tracing): a tool call is a SERVER span,
//! continuing the request's `traceparent` (or a new root sampled by `OTEL_TRACES_SAMPLER_ARG`),
//! with a PRODUCER `send` child whose context is the one the envelope carries to the first
//! actor, so the first sidecar's `process` span hangs under the call. Ids are decided by
//! asya_api::trace_context whether or not spans are recorded.

use std::time::SystemTime;

use asya_api::trace_context::TraceParent;
use asya_telemetry::{KeyValue, SpanKind, SpanRecord};

/// One tool call's trace: what the handler knows once the envelope is sent (or not).
#[derive(Debug, Clone)]
pub struct CallTrace {
    pub tool: String,
    pub envelope_id: String,
    /// The first actor's queue and its transport (`rabbitmq`, `aws_sqs`).
    pub queue: String,
    pub system: &'static str,
    /// The SERVER span and the incoming context it continues.
    pub server: TraceParent,
    pub parent: Option<TraceParent>,
    /// The PRODUCER span, whose context the envelope carries.
    pub send: TraceParent,
    pub start: SystemTime,
    pub end: SystemTime,
    /// `accepted`, or why not (`unavailable`, the store or the broker failed).
    pub outcome: &'static str,
    pub error: Option<String>,
}

/// The SERVER span of the call and, when an envelope was sent or tried, its PRODUCER span.
pub fn call_spans(c: &CallTrace) -> Vec<SpanRecord> {
    let server = SpanRecord {
        name: format!("call {}", c.tool),
        kind: SpanKind::Server,
        span: c.server,
        parent: c.parent,
        remote_parent: true,
        start: c.start,
        end: c.end,
        attributes: vec![
            KeyValue::new("asya.tool", c.tool.clone()),
            KeyValue::new("asya.envelope.id", c.envelope_id.clone()),
            KeyValue::new("asya.call.outcome", c.outcome),
        ],
        error: c.error.clone(),
    };
    let send = SpanRecord {
        name: format!("send {}", c.queue),
        kind: SpanKind::Producer,
        span: c.send,
        parent: Some(c.server),
        remote_parent: false,
        start: c.start,
        end: c.end,
        attributes: vec![
            KeyValue::new("messaging.system", c.system),
            KeyValue::new("messaging.destination.name", c.queue.clone()),
            KeyValue::new("messaging.operation.type", "send"),
            KeyValue::new("messaging.message.id", c.envelope_id.clone()),
        ],
        error: c.error.clone(),
    };
    vec![server, send]
}

/// OTel's `messaging.system` of a tool's transport (`rabbitmq` when none is named).
pub fn messaging_system(transport: Option<&str>) -> &'static str {
    match transport {
        Some("sqs") => "aws_sqs",
        _ => "rabbitmq",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use asya_api::trace_context::{IdSource, hop_span, incoming_from};

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_call_is_a_server_span_under_the_caller_with_the_envelopes_producer_under_it() {
        let ids = IdSource::new();
        let incoming = incoming_from(Some(TP), None);
        let server = hop_span(&incoming, &ids, 1.0);
        let send = server.child(ids.span_id());
        let now = SystemTime::now();
        let spans = call_spans(&CallTrace {
            tool: "resize".into(),
            envelope_id: "e1".into(),
            queue: "asya-ml-resize".into(),
            system: messaging_system(Some("sqs")),
            server,
            parent: incoming.parent,
            send,
            start: now,
            end: now,
            outcome: "accepted",
            error: None,
        });
        let (s, p) = (&spans[0], &spans[1]);
        assert_eq!(
            (s.name.as_str(), s.kind.clone()),
            ("call resize", SpanKind::Server)
        );
        assert_eq!(s.parent, incoming.parent);
        assert_eq!(s.span.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert!(s.remote_parent);
        assert_eq!(p.kind, SpanKind::Producer);
        assert_eq!(p.parent, Some(server));
        assert_eq!(p.span, send);
        assert!(!p.remote_parent);
        assert!(
            p.attributes
                .contains(&KeyValue::new("messaging.system", "aws_sqs"))
        );
        assert!(p.attributes.contains(&KeyValue::new(
            "messaging.destination.name",
            "asya-ml-resize"
        )));
    }

    #[test]
    fn a_failed_send_is_an_error_on_both_spans() {
        let ids = IdSource::new();
        let server = hop_span(&Default::default(), &ids, 1.0);
        let now = SystemTime::now();
        let spans = call_spans(&CallTrace {
            tool: "t".into(),
            envelope_id: "e".into(),
            queue: "q".into(),
            system: messaging_system(None),
            server,
            parent: None,
            send: server.child(ids.span_id()),
            start: now,
            end: now,
            outcome: "unavailable",
            error: Some("broker unreachable".into()),
        });
        assert!(
            spans
                .iter()
                .all(|s| s.error.as_deref() == Some("broker unreachable"))
        );
        assert!(spans[0].parent.is_none());
        assert!(
            spans[0]
                .attributes
                .contains(&KeyValue::new("asya.call.outcome", "unavailable"))
        );
    }
}
