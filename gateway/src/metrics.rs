//! Prometheus metrics of the gateway (`asya_gateway_*`): tool calls by tool and outcome, time
//! from call to final status, sidecar reports, rejected requests.

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
            "Requests refused before reaching a handler, by reason (auth, rate_limit, too_large)",
            m.refused.clone(),
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
        let text = m.encode();
        assert!(text.contains("asya_gateway_build_info{version="), "{text}");
        assert!(
            text.contains("# TYPE asya_gateway_requests_refused counter"),
            "{text}"
        );
        asya_api::metrics_dump::write("asya-gateway", &text).unwrap();
    }
}
