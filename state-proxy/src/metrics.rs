//! Prometheus metrics, served on `ASYA_METRICS_ADDR` at `/metrics` as the sidecar does.
//! Names are `asya_state_proxy_*` with a `connector` label.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    pub connector: String,
    pub op: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DurationLabel {
    pub connector: String,
    pub op: String,
}

type Durations = Family<DurationLabel, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    // 0.1 ms .. ~10 min: a small key on loopback to a large passthrough upload.
    Histogram::new(exponential_buckets(0.0001, 3.0, 16))
}

pub struct Metrics {
    connector: String,
    registry: Registry,
    requests: Family<OpLabel, Counter>,
    durations: Durations,
}

impl Metrics {
    pub fn new(connector: &str) -> Metrics {
        let mut registry = Registry::with_prefix("asya_state_proxy");
        let requests = Family::<OpLabel, Counter>::default();
        let durations: Durations = Family::new_with_constructor(duration_histogram);
        registry.register(
            "requests",
            "Requests answered, by operation and HTTP status",
            requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time to answer a request (a streamed GET: to its headers)",
            durations.clone(),
        );
        Metrics {
            connector: connector.to_string(),
            registry,
            requests,
            durations,
        }
    }

    pub fn observe(&self, op: &str, status: u16, took: Duration) {
        self.requests
            .get_or_create(&OpLabel {
                connector: self.connector.clone(),
                op: op.to_string(),
                status,
            })
            .inc();
        self.durations
            .get_or_create(&DurationLabel {
                connector: self.connector.clone(),
                op: op.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Serves `/metrics` on `addr` until the process ends.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let m = metrics.clone();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    m.encode(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_by_op_and_status() {
        let m = Metrics::new("s3-passthrough");
        m.observe("put", 200, Duration::from_millis(3));
        m.observe("put", 409, Duration::from_millis(1));
        let text = m.encode();
        assert!(text.contains(
            r#"asya_state_proxy_requests_total{connector="s3-passthrough",op="put",status="409"} 1"#
        ));
        assert!(text.contains("asya_state_proxy_request_duration_seconds"));
    }
}
