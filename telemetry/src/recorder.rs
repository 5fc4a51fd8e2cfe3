//! A part's span recorder: the SDK's tracer provider with the JSON exporter behind its batch
//! processor, built when the `OTEL_*` variables ask for it and a no-op otherwise. Span ids
//! are decided by asya_api::trace_context (the same rules everywhere, tracing on or off);
//! the SDK only records and batches spans whose ids are given.

use std::time::{Duration, SystemTime};

use asya_api::trace_context::{self, IdSource, Incoming, TraceParent, TraceSettings};
use opentelemetry::trace::{
    Link, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

use crate::export::{ExportError, JsonExporter};

/// One finished span, as a part knows it.
#[derive(Debug, Clone)]
pub struct SpanRecord {
    pub name: String,
    pub kind: SpanKind,
    /// This span's trace id, span id and sampled flag.
    pub span: TraceParent,
    /// The parent's context (`None`: a root span).
    pub parent: Option<TraceParent>,
    /// Whether the parent came from another process (a header), which also links to it.
    pub remote_parent: bool,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<KeyValue>,
    /// An error's description: the span's status is ERROR.
    pub error: Option<String>,
}

pub struct Recorder {
    provider: Option<SdkTracerProvider>,
    tracer: Option<SdkTracer>,
    ids: IdSource,
    ratio: f64,
}

impl Recorder {
    pub fn off() -> Recorder {
        Recorder {
            provider: None,
            tracer: None,
            ids: IdSource::new(),
            ratio: 1.0,
        }
    }

    /// Records for `scope` (the part's name: `asya-sidecar`) when `settings` record, else
    /// off. The resource is OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, as the webhook
    /// and the chart set them. Must run inside the tokio runtime that posts the exports.
    pub fn new(settings: &TraceSettings, scope: &'static str) -> Result<Recorder, ExportError> {
        let Some(endpoint) = settings.endpoint.as_deref().filter(|_| settings.recording) else {
            return Ok(Recorder::off());
        };
        let exporter = JsonExporter::new(endpoint)?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(Resource::builder().build())
            .build();
        let tracer = provider.tracer(scope);
        Ok(Recorder {
            provider: Some(provider),
            tracer: Some(tracer),
            ids: IdSource::new(),
            ratio: settings.ratio,
        })
    }

    /// A span continuing `incoming` (or a new root sampled by the ratio), by the same rule
    /// as every hop (asya_api::trace_context::hop_span).
    pub fn span_for(&self, incoming: &Incoming) -> TraceParent {
        trace_context::hop_span(incoming, &self.ids, self.ratio)
    }

    pub fn enabled(&self) -> bool {
        self.tracer.is_some()
    }

    /// Records `span` when it is sampled; the batch processor exports it later.
    pub fn record(&self, span: &SpanRecord) {
        let Some(tracer) = &self.tracer else { return };
        if !span.span.sampled() {
            return;
        }
        let trace_id = TraceId::from(span.span.trace_id);
        let parent_cx = span.parent.map_or_else(Context::new, |p| {
            Context::new().with_remote_span_context(context(
                trace_id,
                p.span_id,
                span.remote_parent,
            ))
        });
        let links = match (span.parent, span.remote_parent) {
            (Some(p), true) => vec![Link::with_context(context(trace_id, p.span_id, true))],
            _ => Vec::new(),
        };
        let builder = tracer
            .span_builder(span.name.clone())
            .with_kind(span.kind.clone())
            .with_trace_id(trace_id)
            .with_span_id(SpanId::from(span.span.span_id))
            .with_start_time(span.start)
            .with_end_time(span.end)
            .with_links(links)
            .with_attributes(span.attributes.clone())
            .with_status(match &span.error {
                Some(e) => Status::error(e.clone()),
                None => Status::Unset,
            });
        drop(tracer.build_with_context(builder, &parent_cx));
    }

    /// Exports what is buffered, waiting at most `timeout` (at shutdown).
    pub fn shutdown(&self, timeout: Duration) {
        if let Some(p) = &self.provider
            && let Err(e) = p.shutdown_with_timeout(timeout)
        {
            tracing::warn!(error = %e, "spans not all exported at shutdown");
        }
    }
}

fn context(trace_id: TraceId, span_id: u64, remote: bool) -> SpanContext {
    SpanContext::new(
        trace_id,
        SpanId::from(span_id),
        TraceFlags::SAMPLED,
        remote,
        TraceState::default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_records_nothing_and_needs_no_runtime() {
        let r = Recorder::new(&TraceSettings::off(), "t").unwrap();
        assert!(!r.enabled());
        // Recording while off is a no-op, not a panic.
        let tp = asya_api::trace_context::parse_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .unwrap();
        r.record(&SpanRecord {
            name: "x".into(),
            kind: SpanKind::Server,
            span: tp,
            parent: None,
            remote_parent: false,
            start: SystemTime::now(),
            end: SystemTime::now(),
            attributes: Vec::new(),
            error: None,
        });
    }
}
