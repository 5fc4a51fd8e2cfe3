//! Prometheus metrics of the gateway (`asya_gateway_*`): tool calls by tool and outcome, time
//! from call to final status, sidecar reports, rejected requests, open event streams, and the
//! retention of stored envelopes.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolOutcome {
    pub tool: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Version {
    pub version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Kind {
    pub kind: String,
}

fn final_histogram() -> Histogram {
    // 5 ms .. ~6 h.
    Histogram::new(exponential_buckets(0.005, 2.5, 18))
}

pub struct Metrics {
    registry: Registry,
    calls: Family<ToolOutcome, Counter>,
    to_final: Family<ToolOutcome, Histogram, fn() -> Histogram>,
    reports: Family<Kind, Counter>,
    refused: Family<Kind, Counter>,
    open_streams: Gauge,
    /// The open streams' count, for whoever waits for it to change (tests).
    streams: tokio::sync::watch::Sender<i64>,
    retention_deleted: Counter,
    oldest_age: Gauge<f64, AtomicU64>,
}

/// An open event stream, counted until dropped (with the stream: at its end, or when the
/// client goes away).
pub struct OpenStream {
    gauge: Gauge,
    streams: tokio::sync::watch::Sender<i64>,
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.gauge.dec();
        self.streams.send_modify(|n| *n -= 1);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("asya_gateway");
        let m = Metrics {
            calls: Family::default(),
            to_final: Family::new_with_constructor(final_histogram),
            reports: Family::default(),
            refused: Family::default(),
            open_streams: Gauge::default(),
            streams: tokio::sync::watch::Sender::new(0),
            retention_deleted: Counter::default(),
            oldest_age: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "tool_calls",
            "Tool calls by tool and outcome (accepted, invalid_arguments, unknown_tool, unavailable)",
            m.calls.clone(),
        );
        registry.register(
            "time_to_final_seconds",
            "Seconds from a tool call to its envelope's final status, by tool and status",
            m.to_final.clone(),
        );
        registry.register(
            "reports",
            "Reports received from sidecars, by kind (progress, final, child)",
            m.reports.clone(),
        );
        registry.register(
            "requests_refused",
            "Requests refused, by reason (auth, token_kind, access, rate_limit, \
             report_rate_limit, too_many_concurrent, too_large)",
            m.refused.clone(),
        );
        registry.register(
            "open_streams",
            "Server-sent event streams open now (GET /envelopes/{id}/stream)",
            m.open_streams.clone(),
        );
        registry.register(
            "retention_deleted_envelopes",
            "Stored envelopes deleted by the retention policy (their events go with them)",
            m.retention_deleted.clone(),
        );
        registry.register(
            "oldest_envelope_age_seconds",
            "Age of the oldest stored envelope at the last retention pass (0 when none)",
            m.oldest_age.clone(),
        );
        let build_info = Family::<Version, Gauge>::default();
        registry.register(
            "build_info",
            "1, labelled with the gateway's version",
            build_info.clone(),
        );
        build_info
            .get_or_create(&Version {
                version: env!("CARGO_PKG_VERSION").into(),
            })
            .set(1);
        Metrics { registry, ..m }
    }

    pub fn call(&self, tool: &str, outcome: &str) {
        self.calls
            .get_or_create(&ToolOutcome {
                tool: tool.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    pub fn finished(&self, tool: &str, status: &str, seconds: f64) {
        self.to_final
            .get_or_create(&ToolOutcome {
                tool: tool.to_string(),
                outcome: status.to_string(),
            })
            .observe(seconds);
    }

    pub fn report(&self, kind: &str) {
        self.reports
            .get_or_create(&Kind {
                kind: kind.to_string(),
            })
            .inc();
    }

    pub fn refused(&self, reason: &str) {
        self.refused
            .get_or_create(&Kind {
                kind: reason.to_string(),
            })
            .inc();
    }

    /// Counts a stream as open until the guard is dropped.
    pub fn stream_opened(&self) -> OpenStream {
        self.open_streams.inc();
        // Counted under the channel's lock, so concurrent opens and closes add up.
        self.streams.send_modify(|n| *n += 1);
        OpenStream {
            gauge: self.open_streams.clone(),
            streams: self.streams.clone(),
        }
    }

    /// The number of open streams, as it changes.
    pub fn open_streams(&self) -> tokio::sync::watch::Receiver<i64> {
        self.streams.subscribe()
    }

    pub fn retention(&self, deleted: u64, oldest_age_seconds: f64) {
        self.retention_deleted.inc_by(deleted);
        self.oldest_age.set(oldest_age_seconds);
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every family this component registers, for tests/monitoring (ASYA_METRICS_DUMP_DIR).
    #[test]
    fn metrics_dump() {
        // A family is exported once it has a series: record one of each.
        let m = Metrics::new();
        m.call("t", "accepted");
        m.finished("t", "succeeded", 1.0);
        m.report("final");
        m.refused("auth");
        drop(m.stream_opened());
        m.retention(3, 60.0);
        let text = m.encode();
        assert!(text.contains("asya_gateway_build_info{version="), "{text}");
        assert!(
            text.contains("# TYPE asya_gateway_requests_refused counter"),
            "{text}"
        );
        assert!(text.contains("asya_gateway_open_streams 0"), "{text}");
        assert!(
            text.contains("asya_gateway_retention_deleted_envelopes_total 3"),
            "{text}"
        );
        asya_api::metrics_dump::write("asya-gateway", &text).unwrap();
    }
}
