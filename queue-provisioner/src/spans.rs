//! The provisioner's traces (docs/observability.md § Tracing): one span per reconcile, a
//! new root sampled by `OTEL_TRACES_SAMPLER_ARG` (a reconcile is triggered by a watch, not
//! by a request with a context to continue), recording the actor and how it ended.

use std::time::SystemTime;

use asya_api::trace_context::TraceParent;
use asya_telemetry::{KeyValue, SpanKind, SpanRecord};

/// How one reconcile ended: `ok`, or an error's kind (`kube`, `transport`, …) and message.
#[derive(Debug, Clone, PartialEq)]
pub struct ReconcileOutcome {
    pub outcome: &'static str,
    pub error: Option<String>,
}

pub fn reconcile_span(
    namespace: &str,
    name: &str,
    outcome: &ReconcileOutcome,
    span: TraceParent,
    start: SystemTime,
    end: SystemTime,
) -> SpanRecord {
    SpanRecord {
        name: "reconcile AsyncActor".into(),
        kind: SpanKind::Internal,
        span,
        parent: None,
        remote_parent: false,
        start,
        end,
        attributes: vec![
            KeyValue::new("asya.actor", name.to_string()),
            KeyValue::new("k8s.namespace.name", namespace.to_string()),
            KeyValue::new("asya.reconcile.outcome", outcome.outcome),
        ],
        error: outcome.error.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use asya_telemetry::Recorder;

    #[test]
    fn a_failed_reconcile_records_the_actor_and_the_error() {
        let span = Recorder::off().span_for(&Default::default());
        assert!(span.sampled(), "a new root at ratio 1 is sampled");
        let now = SystemTime::now();
        let failed = ReconcileOutcome {
            outcome: "transport",
            error: Some("queue asya-ml-resize: declare refused".into()),
        };
        let s = reconcile_span("ml", "resize", &failed, span, now, now);
        assert_eq!(s.kind, SpanKind::Internal);
        assert!(s.parent.is_none());
        assert!(
            s.attributes
                .contains(&KeyValue::new("asya.actor", "resize"))
        );
        assert!(
            s.attributes
                .contains(&KeyValue::new("k8s.namespace.name", "ml"))
        );
        assert!(
            s.attributes
                .contains(&KeyValue::new("asya.reconcile.outcome", "transport"))
        );
        assert_eq!(
            s.error.as_deref(),
            Some("queue asya-ml-resize: declare refused")
        );
        let ok = ReconcileOutcome {
            outcome: "ok",
            error: None,
        };
        assert!(
            reconcile_span("ml", "resize", &ok, span, now, now)
                .error
                .is_none()
        );
    }
}
