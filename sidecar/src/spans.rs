//! Span export (docs/DESIGN.md §4 "Traces"): one hop's CONSUMER `process`, INTERNAL
//! `runtime call` and PRODUCER `send` spans, recorded with the ids the envelope headers
//! already carry (asya_transport::trace_context decides them) and exported by OpenTelemetry's
//! batch processor as OTLP over HTTP (protobuf). Off unless the `OTEL_*` variables ask for
//! it; only sampled hops are recorded.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use std::sync::Mutex;

use asya_transport::trace_context::{Incoming, TraceParent, TraceSettings};
use opentelemetry::trace::{
    Link, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, SpanData, SpanExporter};

/// One export request's limit (OTel's default for OTLP).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
#[error("OTEL_EXPORTER_OTLP_ENDPOINT {endpoint:?}: cannot build the OTLP exporter: {message}")]
pub struct ExportError {
    endpoint: String,
    message: String,
}

/// One hop's trace context: the CONSUMER span processing the envelope (child of the
/// incoming context, or a new root) and the `tracestate` carried on. Each send is a
/// PRODUCER child of `span` whose context goes into the sent envelope. What the hop did is
/// noted here as it happens and recorded as spans once its sends are confirmed.
#[derive(Debug)]
pub struct Hop {
    pub span: TraceParent,
    pub tracestate: Option<String>,
    pub parent: Option<TraceParent>,
    pub start: SystemTime,
    runtime: Mutex<Option<RuntimeCall>>,
    sends: Mutex<Vec<(u64, String)>>,
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
            sends: Mutex::new(Vec::new()),
        }
    }

    /// A send of this hop, as a PRODUCER span `span_id` to `queue`.
    pub fn note_send(&self, span_id: u64, queue: &str) {
        if let Ok(mut sends) = self.sends.lock() {
            sends.push((span_id, queue.to_string()));
        }
    }

    pub fn note_runtime(&self, call: RuntimeCall) {
        if let Ok(mut r) = self.runtime.lock() {
            *r = Some(call);
        }
    }

    pub fn forget_sends(&self) {
        self.forget_sends_except("");
    }

    pub fn forget_sends_except(&self, queue: &str) {
        if let Ok(mut sends) = self.sends.lock() {
            sends.retain(|(_, q)| q == queue);
        }
    }

    /// The spans of this hop, ended at `end`.
    pub fn record(&self, envelope_id: &str, send_error: Option<String>) -> HopRecord {
        HopRecord {
            parent: self.parent,
            span: self.span,
            envelope_id: envelope_id.to_string(),
            start: self.start,
            runtime: self.runtime.lock().map(|r| r.clone()).unwrap_or_default(),
            sends: self.sends.lock().map(|s| s.clone()).unwrap_or_default(),
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
    /// The runtime call: its span id, start, end and error type (if it failed).
    pub runtime: Option<RuntimeCall>,
    /// Each send: producer span id, destination queue.
    pub sends: Vec<(u64, String)>,
    /// When the sends were confirmed (or failed) and whether they failed.
    pub end: SystemTime,
    pub send_error: Option<String>,
}

#[derive(Debug, Clone)]
pub struct RuntimeCall {
    pub span_id: u64,
    pub start: SystemTime,
    pub end: SystemTime,
    pub error_type: Option<String>,
}

/// The sidecar's span recorder: a no-op when tracing is off.
pub struct Spans {
    provider: Option<SdkTracerProvider>,
    tracer: Option<SdkTracer>,
    system: &'static str,
    queue: String,
}

impl Spans {
    pub fn off() -> Spans {
        Spans {
            provider: None,
            tracer: None,
            system: "",
            queue: String::new(),
        }
    }

    /// Builds the exporter when `settings` record. `system` is `rabbitmq` or `aws_sqs`, `queue`
    /// the actor's own queue. Must run inside the tokio runtime (exports are spawned on it).
    pub fn new(
        settings: &TraceSettings,
        system: &'static str,
        queue: String,
    ) -> Result<Spans, ExportError> {
        let Some(endpoint) = settings.endpoint.as_deref().filter(|_| settings.recording) else {
            return Ok(Spans::off());
        };
        let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
        let err = |message: String| ExportError {
            endpoint: endpoint.to_string(),
            message,
        };
        let client = RustlsClient {
            inner: asya_transport::http_client::client().map_err(|e| err(e.to_string()))?,
            timeout: EXPORT_TIMEOUT,
        };
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url)
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| err(e.to_string()))?;
        // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, as the webhook sets them.
        let resource = Resource::builder().build();
        exporter.set_resource(&resource);
        let on_runtime = OnRuntime {
            inner: Arc::new(exporter),
            runtime: tokio::runtime::Handle::current(),
        };
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(on_runtime)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("asya-sidecar");
        Ok(Spans {
            provider: Some(provider),
            tracer: Some(tracer),
            system,
            queue,
        })
    }

    pub fn enabled(&self) -> bool {
        self.tracer.is_some()
    }

    /// Records the hop's spans (when sampled); the batch processor exports them later.
    pub fn record(&self, hop: &HopRecord) {
        let Some(tracer) = &self.tracer else { return };
        if !hop.span.sampled() {
            return;
        }
        let trace_id = TraceId::from(hop.span.trace_id);
        let ctx_of = |span_id: u64, remote: bool| {
            Context::new().with_remote_span_context(SpanContext::new(
                trace_id,
                SpanId::from(span_id),
                TraceFlags::SAMPLED,
                remote,
                TraceState::default(),
            ))
        };
        let parent_cx = hop
            .parent
            .map_or_else(Context::new, |p| ctx_of(p.span_id, true));
        let links = hop
            .parent
            .map(|p| {
                vec![Link::with_context(SpanContext::new(
                    trace_id,
                    SpanId::from(p.span_id),
                    TraceFlags::SAMPLED,
                    true,
                    TraceState::default(),
                ))]
            })
            .unwrap_or_default();
        let messaging = |op: &'static str, dest: &str| {
            vec![
                KeyValue::new("messaging.system", self.system),
                KeyValue::new("messaging.destination.name", dest.to_string()),
                KeyValue::new("messaging.operation.type", op),
                KeyValue::new("messaging.message.id", hop.envelope_id.clone()),
            ]
        };
        let status = |err: &Option<String>| match err {
            Some(e) => Status::error(e.clone()),
            None => Status::Unset,
        };
        let consumer = tracer
            .span_builder(format!("process {}", self.queue))
            .with_kind(SpanKind::Consumer)
            .with_trace_id(trace_id)
            .with_span_id(SpanId::from(hop.span.span_id))
            .with_start_time(hop.start)
            .with_end_time(hop.end)
            .with_links(links)
            .with_attributes(messaging("process", &self.queue))
            .with_status(status(&hop.send_error));
        drop(tracer.build_with_context(consumer, &parent_cx));
        let hop_cx = ctx_of(hop.span.span_id, false);
        if let Some(call) = &hop.runtime {
            let mut attrs = vec![KeyValue::new(
                "messaging.message.id",
                hop.envelope_id.clone(),
            )];
            if let Some(t) = &call.error_type {
                attrs.push(KeyValue::new("error.type", t.clone()));
            }
            let b = tracer
                .span_builder("runtime call")
                .with_kind(SpanKind::Internal)
                .with_span_id(SpanId::from(call.span_id))
                .with_start_time(call.start)
                .with_end_time(call.end)
                .with_attributes(attrs)
                .with_status(status(&call.error_type));
            drop(tracer.build_with_context(b, &hop_cx));
        }
        let send_start = hop.runtime.as_ref().map_or(hop.start, |c| c.end);
        for (span_id, queue) in &hop.sends {
            let b = tracer
                .span_builder(format!("send {queue}"))
                .with_kind(SpanKind::Producer)
                .with_span_id(SpanId::from(*span_id))
                .with_start_time(send_start)
                .with_end_time(hop.end)
                .with_attributes(messaging("send", queue))
                .with_status(status(&hop.send_error));
            drop(tracer.build_with_context(b, &hop_cx));
        }
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

/// The OTLP exporter's HTTP client is hyper on tokio, while the SDK's batch processor runs
/// exports on its own thread: each export is spawned on the sidecar's runtime and awaited.
#[derive(Debug)]
struct OnRuntime {
    inner: Arc<opentelemetry_otlp::SpanExporter>,
    runtime: tokio::runtime::Handle,
}

impl SpanExporter for OnRuntime {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let inner = self.inner.clone();
        match self
            .runtime
            .spawn(async move { inner.export(batch).await })
            .await
        {
            Ok(r) => r,
            Err(e) => Err(opentelemetry_sdk::error::OTelSdkError::InternalFailure(
                e.to_string(),
            )),
        }
    }
}

/// The workspace's one HTTP(S) client (asya_transport::http_client: hyper, rustls on ring,
/// system roots) for the OTLP exporter, so an `https://` collector needs no other TLS stack.
#[derive(Debug)]
struct RustlsClient {
    inner: hyper_util::client::legacy::Client<
        hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
        http_body_util::Full<bytes::Bytes>,
    >,
    timeout: Duration,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for RustlsClient {
    async fn send_bytes(
        &self,
        request: opentelemetry_http::Request<bytes::Bytes>,
    ) -> Result<opentelemetry_http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        use http_body_util::BodyExt;
        let request = request.map(http_body_util::Full::new);
        let response = tokio::time::timeout(self.timeout, self.inner.request(request)).await??;
        let (parts, body) = response.into_parts();
        let body = tokio::time::timeout(self.timeout, body.collect())
            .await??
            .to_bytes();
        Ok(opentelemetry_http::Response::from_parts(parts, body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use asya_transport::trace_context::parse_traceparent;

    #[test]
    fn a_hop_records_its_sends_and_forgets_those_that_never_happened() {
        let parent =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let incoming = Incoming {
            parent: Some(parent),
            tracestate: Some("k=v".into()),
            refused: None,
        };
        let hop = Hop::new(parent.child(7), incoming);
        hop.note_send(8, "asya-ns-b");
        hop.note_send(9, "asya-ns-b");
        let r = hop.record("e1", None);
        assert_eq!(r.parent, Some(parent));
        assert_eq!(r.span.span_id, 7);
        assert_eq!(r.sends.len(), 2);
        assert!(r.runtime.is_none());
        // The result could not be delivered: only the x-sump send is the hop's.
        hop.note_send(10, "asya-ns-x-sump");
        hop.forget_sends_except("asya-ns-x-sump");
        assert_eq!(
            hop.record("e1", None).sends,
            vec![(10, "asya-ns-x-sump".into())]
        );
        hop.forget_sends();
        assert!(hop.record("e1", None).sends.is_empty());
    }

    #[test]
    fn off_records_nothing_and_needs_no_runtime() {
        let spans = Spans::new(&TraceSettings::off(), "rabbitmq", "q".into()).unwrap();
        assert!(!spans.enabled());
    }
}
