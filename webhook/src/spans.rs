//! The webhook's traces (docs/observability.md § Tracing): one SERVER span per
//! AdmissionReview, continuing the API server's `traceparent` when it sends one (its
//! APIServerTracing feature) and otherwise a new root sampled by `OTEL_TRACES_SAMPLER_ARG`.
//! The subject (kind, namespace, name) is read from the body only while tracing records, so
//! the admission fast paths cost the same with tracing off.

use std::time::SystemTime;

use std::time::Duration;

use asya_api::trace_context::{
    self, TRACEPARENT_HEADER, TRACESTATE_HEADER, TraceParent, TraceSettings,
};
use asya_telemetry::{ExportError, KeyValue, Recorder, SpanKind, SpanRecord};
use axum::http::HeaderMap;
use kube::core::DynamicObject;
use kube::core::admission::AdmissionReview;
use serde::Deserialize;

/// The webhook's span recorder; a no-op when off.
pub struct Traces {
    recorder: Recorder,
}

impl Traces {
    pub fn off() -> Traces {
        Traces {
            recorder: Recorder::off(),
        }
    }

    /// Records when `settings` (the `OTEL_*` variables) ask for it. Inside the runtime.
    pub fn new(settings: &TraceSettings) -> Result<Traces, ExportError> {
        Ok(Traces {
            recorder: Recorder::new(settings, "asya-webhook")?,
        })
    }

    pub fn enabled(&self) -> bool {
        self.recorder.enabled()
    }

    /// Records the span of one answered review (when sampled).
    pub fn record(
        &self,
        endpoint: &str,
        headers: &HeaderMap,
        body: &[u8],
        outcome: &Outcome,
        start: SystemTime,
    ) {
        if !self.enabled() {
            return;
        }
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let incoming =
            trace_context::incoming_from(header(TRACEPARENT_HEADER), header(TRACESTATE_HEADER));
        let span = self.recorder.span_for(&incoming);
        if !span.sampled() {
            return;
        }
        self.recorder.record(&admission_span(
            endpoint,
            &Subject::of_body(body),
            outcome,
            span,
            incoming.parent,
            start,
            SystemTime::now(),
        ));
    }

    pub fn shutdown(&self, timeout: Duration) {
        self.recorder.shutdown(timeout);
    }
}

/// What an AdmissionReview is about.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Subject {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

#[derive(Deserialize)]
struct Review<'a> {
    #[serde(borrow)]
    request: Option<Request<'a>>,
}

#[derive(Deserialize)]
struct Request<'a> {
    #[serde(borrow, default)]
    kind: Option<Gvk<'a>>,
    #[serde(borrow, default)]
    namespace: Option<&'a str>,
    #[serde(borrow, default)]
    name: Option<&'a str>,
}

#[derive(Deserialize)]
struct Gvk<'a> {
    #[serde(borrow, default)]
    kind: Option<&'a str>,
}

impl Subject {
    /// The subject of a review body; what cannot be read stays empty (the answer to a
    /// malformed body says why, this only labels the span).
    pub fn of_body(body: &[u8]) -> Subject {
        let Ok(Review { request: Some(r) }) = serde_json::from_slice::<Review<'_>>(body) else {
            return Subject::default();
        };
        Subject {
            kind: r.kind.and_then(|k| k.kind).unwrap_or_default().to_string(),
            namespace: r.namespace.unwrap_or_default().to_string(),
            name: r.name.unwrap_or_default().to_string(),
        }
    }
}

/// How one review ended, as the span records it.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub operation: &'static str,
    /// `allowed`, `patched`, `denied`, `bad_request` or `error`.
    pub result: &'static str,
    /// Why it was refused (the denial's message or the bad request's error).
    pub refusal: Option<String>,
}

impl Outcome {
    /// The refusal of a review answered `allowed: false`.
    pub fn refusal_of(review: &AdmissionReview<DynamicObject>) -> Option<String> {
        review
            .response
            .as_ref()
            .filter(|r| !r.allowed)
            .map(|r| r.result.message.clone())
    }
}

/// The SERVER span of one admission. A denial is a successful answer, not an error of the
/// webhook: its status stays unset and the reason is an attribute; a request that could
/// not be answered is an ERROR.
#[allow(clippy::too_many_arguments)]
pub fn admission_span(
    endpoint: &str,
    subject: &Subject,
    outcome: &Outcome,
    span: TraceParent,
    parent: Option<TraceParent>,
    start: SystemTime,
    end: SystemTime,
) -> SpanRecord {
    let mut attributes = vec![
        KeyValue::new("http.request.method", "POST"),
        KeyValue::new("asya.webhook.endpoint", endpoint.to_string()),
        KeyValue::new("k8s.admission.operation", outcome.operation),
        KeyValue::new("k8s.admission.kind", subject.kind.clone()),
        KeyValue::new("k8s.namespace.name", subject.namespace.clone()),
        KeyValue::new("k8s.object.name", subject.name.clone()),
        KeyValue::new(
            "k8s.admission.allowed",
            matches!(outcome.result, "allowed" | "patched"),
        ),
        KeyValue::new("k8s.admission.result", outcome.result),
    ];
    if let Some(r) = &outcome.refusal {
        attributes.push(KeyValue::new("k8s.admission.refusal", r.clone()));
    }
    let error = match outcome.result {
        "bad_request" | "error" => Some(
            outcome
                .refusal
                .clone()
                .unwrap_or_else(|| outcome.result.into()),
        ),
        _ => None,
    };
    SpanRecord {
        name: format!("admit {}", subject.kind),
        kind: SpanKind::Server,
        span,
        parent,
        remote_parent: true,
        start,
        end,
        attributes,
        error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use asya_api::trace_context::{Incoming, incoming_from, parse_traceparent};

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_subject_is_read_from_the_review_and_a_bad_body_gives_none() {
        let body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",
            "request":{"uid":"u","kind":{"group":"","version":"v1","kind":"Pod"},
            "namespace":"ml","name":"resize-0","operation":"CREATE","object":{"spec":{}}}}"#;
        assert_eq!(
            Subject::of_body(body),
            Subject {
                kind: "Pod".into(),
                namespace: "ml".into(),
                name: "resize-0".into()
            }
        );
        assert_eq!(Subject::of_body(b"{\"request\": 5"), Subject::default());
        assert_eq!(Subject::of_body(b"[]"), Subject::default());
    }

    fn attr<'a>(s: &'a SpanRecord, key: &str) -> Option<&'a asya_telemetry::Value> {
        s.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| &kv.value)
    }

    #[test]
    fn a_denial_records_the_subject_and_the_reason_without_an_error_status() {
        let parent = parse_traceparent(TP).unwrap();
        let incoming = incoming_from(Some(TP), None);
        // The API server's context is continued (the same rule as every hop).
        let span = Recorder::off().span_for(&incoming);
        assert_eq!(span.trace_id, parent.trace_id);
        let subject = Subject {
            kind: "AsyncActor".into(),
            namespace: "ml".into(),
            name: "resize".into(),
        };
        let outcome = Outcome {
            operation: "CREATE",
            result: "denied",
            refusal: Some("spec.scaling.maxReplicas: -1: must be at least 0".into()),
        };
        let now = SystemTime::now();
        let s = admission_span(
            "validate_asyncactors",
            &subject,
            &outcome,
            span,
            incoming.parent,
            now,
            now,
        );
        assert_eq!(s.name, "admit AsyncActor");
        assert_eq!(s.kind, SpanKind::Server);
        assert_eq!(s.parent, Some(parent));
        assert!(s.error.is_none());
        assert_eq!(attr(&s, "k8s.admission.allowed"), Some(&false.into()));
        assert_eq!(attr(&s, "k8s.namespace.name"), Some(&"ml".into()));
        assert_eq!(attr(&s, "k8s.object.name"), Some(&"resize".into()));
        assert_eq!(attr(&s, "k8s.admission.operation"), Some(&"CREATE".into()));
        assert_eq!(
            attr(&s, "k8s.admission.refusal"),
            Some(&"spec.scaling.maxReplicas: -1: must be at least 0".into())
        );
    }

    #[test]
    fn a_bad_request_is_an_error_and_a_patch_is_allowed() {
        let span = Recorder::off().span_for(&Incoming::default());
        let now = SystemTime::now();
        let bad = Outcome {
            operation: "UNKNOWN",
            result: "bad_request",
            refusal: Some("body is not an AdmissionReview".into()),
        };
        let s = admission_span(
            "mutate_pods",
            &Subject::default(),
            &bad,
            span,
            None,
            now,
            now,
        );
        assert_eq!(s.error.as_deref(), Some("body is not an AdmissionReview"));
        let patched = Outcome {
            operation: "CREATE",
            result: "patched",
            refusal: None,
        };
        let s = admission_span(
            "mutate_pods",
            &Subject::default(),
            &patched,
            span,
            None,
            now,
            now,
        );
        assert!(s.error.is_none());
        assert_eq!(attr(&s, "k8s.admission.allowed"), Some(&true.into()));
        assert!(attr(&s, "k8s.admission.refusal").is_none());
    }
}
