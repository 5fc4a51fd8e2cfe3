//! Span export shared by the sidecar, the gateway, the webhook and the queue provisioner
//! (docs/observability.md § Tracing): OTLP over HTTP with a JSON body. Our own encoder of the
//! SDK's span data, because opentelemetry-otlp's HTTP exporter builds on
//! opentelemetry-proto's generated messages, which bring tonic and prost with them even
//! without gRPC; the JSON mapping is small, stable and every OTLP collector accepts it.

pub mod export;
pub mod otlp_json;
pub mod recorder;

pub use export::{ExportError, JsonExporter};
pub use opentelemetry::trace::SpanKind;
pub use opentelemetry::{KeyValue, Value};
pub use recorder::{Recorder, SpanRecord};
