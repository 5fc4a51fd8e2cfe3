//! Span export (docs/DESIGN.md §4 "Traces"): one hop's CONSUMER `process`, INTERNAL
//! `runtime call` and PRODUCER `send` spans, recorded with the ids the envelope headers
//! already carry (asya_transport::trace_context decides them) and exported by asya-telemetry
//! (OTLP over HTTP, JSON). Off unless the `OTEL_*` variables ask for it; only sampled hops
//! are recorded.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use asya_telemetry::{KeyValue, Recorder, SpanKind, SpanRecord};

use crate::flow_trace::{DECISIONS_ATTRIBUTE, Decided, FLOW_ATTRIBUTE};
use asya_transport::trace_context::{Incoming, TraceParent, TraceSettings};

pub use asya_telemetry::ExportError;

/// The log span of one envelope's hop: every line logged within it carries the hop's
/// `trace_id` and `span_id` (the `process` span's, as the trace backend shows it), so a log
/// line leads to its trace and back. The ids exist whether or not the hop is sampled: they
/// still tie one envelope's lines together across hops.
pub fn log_span(actor: &str, id: &str, span: Option<&TraceParent>) -> tracing::Span {
    let (trace_id, span_id) = span
        .map(|s| (s.trace_id_hex(), s.span_id_hex()))
        .unwrap_or_default();
    tracing::info_span!("envelope", actor, id, trace_id, span_id)
}

/// A histogram exemplar for a hop: only when its spans are recorded and sampled, since
/// another trace id would lead to no trace.
pub fn exemplar(recording: bool, span: Option<&TraceParent>) -> Option<crate::metrics::TraceLabel> {
    span.filter(|s| recording && s.sampled())
        .map(|s| crate::metrics::TraceLabel {
            trace_id: s.trace_id_hex(),
        })
}

/// One hop's trace context: the CONSUMER span processing the envelope (child of the
/// incoming context, or a new root) and the `tracestate` carried on. Each send is a
/// PRODUCER child of `span` whose context goes into the sent envelope. The runtime call is
/// noted here as it happens; the sends and flow decisions come from the hop's disposition
/// when it is recorded, once its sends are confirmed.
#[derive(Debug)]
pub struct Hop {
    pub span: TraceParent,
    pub tracestate: Option<String>,
    pub parent: Option<TraceParent>,
    pub start: SystemTime,
    runtime: Mutex<Option<RuntimeCall>>,
}

impl Hop {
    /// The hop whose span is `span`, continuing `incoming`, starting now.
    pub fn new(span: TraceParent, incoming: Incoming) -> Hop {
        Hop {
            span,
            tracestate: incoming.tracestate,
            parent: incoming.parent,
            start: SystemTime::now(),
            runtime: Mutex::new(None),
        }
    }

    pub fn note_runtime(&self, call: RuntimeCall) {
        if let Ok(mut r) = self.runtime.lock() {
            *r = Some(call);
        }
    }

    /// The spans of this hop, ended now: its sends (PRODUCER span id, queue) and its flow
    /// decisions as its disposition decided them.
    pub fn record(
        &self,
        envelope_id: &str,
        sends: Vec<(u64, String)>,
        flow: Option<Decided>,
        send_error: Option<String>,
    ) -> HopRecord {
        HopRecord {
            parent: self.parent,
            span: self.span,
            envelope_id: envelope_id.to_string(),
            start: self.start,
            runtime: self.runtime.lock().map(|r| r.clone()).unwrap_or_default(),
            sends,
            flow,
            end: SystemTime::now(),
            send_error,
        }
    }
}

/// What one hop did, collected while it ran and recorded once its sends are confirmed.
#[derive(Debug, Clone)]
pub struct HopRecord {
    /// The incoming context (`None`: this hop started the trace).
    pub parent: Option<TraceParent>,
    pub span: TraceParent,
    pub envelope_id: String,
    pub start: SystemTime,
    /// The runtime call: its span id, start, end and failure (if it failed).
    pub runtime: Option<RuntimeCall>,
    /// Each send: producer span id, destination queue.
    pub sends: Vec<(u64, String)>,
    /// The flow's decisions in this hop, when the envelope is in a flow.
    pub flow: Option<Decided>,
    /// When the sends were confirmed (or failed) and whether they failed.
    pub end: SystemTime,
    pub send_error: Option<String>,
}

#[derive(Debug, Clone)]
pub struct RuntimeCall {
    pub span_id: u64,
    pub start: SystemTime,
    pub end: SystemTime,
    pub failure: Option<CallFailure>,
}

/// Why a runtime call failed, as x-sump's `x-asya-error` says it: the error type (an
/// exception class, or the platform's `ActorTimeout`, `RuntimeCrashed`, ...) and its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallFailure {
    pub error_type: String,
    pub message: String,
}

/// The longest status description a runtime call's span carries: a handler's message may be
/// large (a payload echoed in an exception), the trace backend needs only its start.
pub const MAX_STATUS_DESCRIPTION: usize = 512;

impl CallFailure {
    /// The span's status description: the message, cut at [`MAX_STATUS_DESCRIPTION`] bytes
    /// on a character boundary; the type alone when there is no message. The type itself is
    /// the `error.type` attribute, so the trace shows `ValueError: bad input 3` as x-sump does.
    pub fn status_description(&self) -> String {
        let m = self.message.trim();
        if m.is_empty() {
            return self.error_type.clone();
        }
        if m.len() <= MAX_STATUS_DESCRIPTION {
            return m.to_string();
        }
        let mut end = MAX_STATUS_DESCRIPTION;
        while !m.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &m[..end])
    }
}

/// The sidecar's span recorder: a no-op when tracing is off.
pub struct Spans {
    recorder: Recorder,
    system: &'static str,
    queue: String,
}

impl Spans {
    pub fn off() -> Spans {
        Spans {
            recorder: Recorder::off(),
            system: "",
            queue: String::new(),
        }
    }

    /// Builds the exporter when `settings` record. `system` is `rabbitmq` or `aws_sqs`, `queue`
    /// the actor's own queue. Must run inside the tokio runtime (exports are posted on it).
    pub fn new(
        settings: &TraceSettings,
        system: &'static str,
        queue: String,
    ) -> Result<Spans, ExportError> {
        Ok(Spans {
            recorder: Recorder::new(settings, "asya-sidecar")?,
            system,
            queue,
        })
    }

    pub fn enabled(&self) -> bool {
        self.recorder.enabled()
    }

    /// Records the hop's spans (when sampled); the batch processor exports them later.
    pub fn record(&self, hop: &HopRecord) {
        if !self.enabled() {
            return;
        }
        for span in self.hop_spans(hop) {
            self.recorder.record(&span);
        }
    }

    /// The spans of one hop: CONSUMER `process` (child of the incoming context and linked to
    /// it), INTERNAL `runtime call` and one PRODUCER `send` per sent envelope, both children
    /// of the `process` span.
    pub fn hop_spans(&self, hop: &HopRecord) -> Vec<SpanRecord> {
        let messaging = |op: &'static str, dest: &str| {
            vec![
                KeyValue::new("messaging.system", self.system),
                KeyValue::new("messaging.destination.name", dest.to_string()),
                KeyValue::new("messaging.operation.type", op),
                KeyValue::new("messaging.message.id", hop.envelope_id.clone()),
            ]
        };
        let mut spans = vec![SpanRecord {
            name: format!("process {}", self.queue),
            kind: SpanKind::Consumer,
            span: hop.span,
            parent: hop.parent,
            remote_parent: true,
            start: hop.start,
            end: hop.end,
            attributes: {
                let mut a = messaging("process", &self.queue);
                if let Some(f) = &hop.flow {
                    a.push(KeyValue::new(FLOW_ATTRIBUTE, f.flow.clone()));
                    if !f.decisions.is_empty() {
                        a.push(KeyValue::new(DECISIONS_ATTRIBUTE, f.decisions.join(", ")));
                    }
                }
                a
            },
            error: hop.send_error.clone(),
        }];
        let child = |span_id: u64| hop.span.child(span_id);
        if let Some(call) = &hop.runtime {
            let mut attributes = vec![KeyValue::new(
                "messaging.message.id",
                hop.envelope_id.clone(),
            )];
            if let Some(f) = &call.failure {
                attributes.push(KeyValue::new("error.type", f.error_type.clone()));
            }
            spans.push(SpanRecord {
                name: "runtime call".into(),
                kind: SpanKind::Internal,
                span: child(call.span_id),
                parent: Some(hop.span),
                remote_parent: false,
                start: call.start,
                end: call.end,
                attributes,
                error: call.failure.as_ref().map(CallFailure::status_description),
            });
        }
        let send_start = hop.runtime.as_ref().map_or(hop.start, |c| c.end);
        for (span_id, queue) in &hop.sends {
            spans.push(SpanRecord {
                name: format!("send {queue}"),
                kind: SpanKind::Producer,
                span: child(*span_id),
                parent: Some(hop.span),
                remote_parent: false,
                start: send_start,
                end: hop.end,
                attributes: messaging("send", queue),
                error: hop.send_error.clone(),
            });
        }
        spans
    }

    /// Exports what is buffered, waiting at most `timeout` (at shutdown).
    pub fn shutdown(&self, timeout: Duration) {
        self.recorder.shutdown(timeout);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use asya_transport::trace_context::parse_traceparent;

    #[test]
    fn a_hop_records_its_context_and_the_sends_it_is_given() {
        let parent =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let incoming = Incoming {
            parent: Some(parent),
            tracestate: Some("k=v".into()),
            refused: None,
        };
        let hop = Hop::new(parent.child(7), incoming);
        let sends = vec![(8, "asya-ns-b".to_string()), (9, "asya-ns-b".to_string())];
        let r = hop.record("e1", sends.clone(), None, None);
        assert_eq!(r.parent, Some(parent));
        assert_eq!(r.span.span_id, 7);
        assert_eq!(r.sends, sends);
        assert!(r.runtime.is_none());
        assert_eq!(hop.tracestate.as_deref(), Some("k=v"));
    }

    #[test]
    fn a_flow_hop_names_its_flow_and_decisions_on_the_process_span() {
        let parent =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let incoming = || Incoming {
            parent: Some(parent),
            tracestate: None,
            refused: None,
        };
        let spans = Spans {
            recorder: Recorder::off(),
            system: "rabbitmq",
            queue: "asya-ns-charge".into(),
        };
        let hop = Hop::new(parent.child(7), incoming());
        let decided = Decided {
            flow: "review_order".into(),
            decisions: vec!["37:except PaymentDeclined".into(), "38:else".into()],
        };
        let process = spans
            .hop_spans(&hop.record("e1", Vec::new(), Some(decided), None))
            .remove(0);
        assert!(
            process
                .attributes
                .contains(&KeyValue::new(FLOW_ATTRIBUTE, "review_order"))
        );
        assert!(process.attributes.contains(&KeyValue::new(
            DECISIONS_ATTRIBUTE,
            "37:except PaymentDeclined, 38:else"
        )));
        // Outside a flow (or nothing decided): no such attributes.
        let plain = spans
            .hop_spans(&Hop::new(parent.child(8), incoming()).record("e2", Vec::new(), None, None))
            .remove(0);
        assert!(
            !plain
                .attributes
                .iter()
                .any(|a| a.key.as_str().starts_with("asya.flow."))
        );
    }

    #[test]
    fn a_hop_records_process_runtime_and_send_spans_with_its_ids() {
        let parent =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let hop = Hop::new(
            parent.child(7),
            Incoming {
                parent: Some(parent),
                tracestate: None,
                refused: None,
            },
        );
        hop.note_runtime(RuntimeCall {
            span_id: 8,
            start: SystemTime::now(),
            end: SystemTime::now(),
            failure: Some(CallFailure {
                error_type: "ValueError".into(),
                message: "bad input 3".into(),
            }),
        });
        let sends = vec![(9, "asya-ns-x-sump".to_string())];
        let spans = Spans {
            recorder: Recorder::off(),
            system: "rabbitmq",
            queue: "asya-ns-a".into(),
        }
        .hop_spans(&hop.record("e1", sends, None, None));
        let names: Vec<_> = spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["process asya-ns-a", "runtime call", "send asya-ns-x-sump"]
        );
        let (process, runtime, send) = (&spans[0], &spans[1], &spans[2]);
        assert_eq!(process.kind, SpanKind::Consumer);
        assert_eq!(process.parent, Some(parent));
        assert!(process.remote_parent && process.error.is_none());
        assert_eq!(runtime.kind, SpanKind::Internal);
        assert_eq!(
            (runtime.span.span_id, runtime.parent),
            (8, Some(parent.child(7)))
        );
        // The message is the status, the type an attribute: not `ValueError` twice.
        assert_eq!(runtime.error.as_deref(), Some("bad input 3"));
        assert!(
            runtime
                .attributes
                .contains(&KeyValue::new("error.type", "ValueError"))
        );
        assert_eq!(send.kind, SpanKind::Producer);
        assert_eq!(send.span.trace_id, parent.trace_id);
        assert_eq!((send.span.span_id, send.remote_parent), (9, false));
        assert!(send.attributes.contains(&KeyValue::new(
            "messaging.destination.name",
            "asya-ns-x-sump"
        )));
    }

    #[test]
    fn a_failures_status_is_its_message_bounded_else_its_type() {
        let f = |m: &str| CallFailure {
            error_type: "ValueError".into(),
            message: m.into(),
        };
        assert_eq!(f(" bad input 3\n").status_description(), "bad input 3");
        assert_eq!(f("").status_description(), "ValueError");
        // Cut on a character boundary: 'é' is two bytes and straddles the limit.
        let long = format!(
            "{}é{}",
            "x".repeat(MAX_STATUS_DESCRIPTION - 1),
            "y".repeat(100)
        );
        let d = f(&long).status_description();
        assert_eq!(d, format!("{}…", "x".repeat(MAX_STATUS_DESCRIPTION - 1)));
    }

    /// A writer into a shared buffer, for the log test.
    #[derive(Clone, Default)]
    struct Buf(std::sync::Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_log_line_within_a_hop_carries_its_trace_and_span_ids() {
        let tp =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let buf = Buf::default();
        let w = buf.clone();
        // As main.rs sets up JSON logs: the current span's fields on each line.
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let _g = log_span("a", "e1", Some(&tp)).entered();
            tracing::info!("runtime answered");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let line: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        let span = &line["span"];
        assert_eq!(
            span["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736",
            "{text}"
        );
        assert_eq!(span["span_id"], "00f067aa0ba902b7", "{text}");
        assert_eq!(
            (span["actor"].as_str(), span["id"].as_str()),
            (Some("a"), Some("e1"))
        );
    }

    #[test]
    fn only_a_recorded_sampled_hop_gives_an_exemplar() {
        let sampled =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let unsampled =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        assert_eq!(
            exemplar(true, Some(&sampled)).map(|l| l.trace_id),
            Some("4bf92f3577b34da6a3ce929d0e0e4736".to_string())
        );
        assert!(exemplar(false, Some(&sampled)).is_none());
        assert!(exemplar(true, Some(&unsampled)).is_none());
        assert!(exemplar(true, None).is_none());
    }

    #[test]
    fn off_records_nothing_and_needs_no_runtime() {
        let spans = Spans::new(&TraceSettings::off(), "rabbitmq", "q".into()).unwrap();
        assert!(!spans.enabled());
    }
}
