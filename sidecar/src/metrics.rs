//! Prometheus metrics. Names follow seed 001 (`asya_actor_*` with a `queue` label), plus
//! runtime, queue and broker health, queue wait, timeouts and build info. No label carries
//! an envelope id, and `error_type` is bounded ([`bounded_error_type`]).

use std::collections::BTreeSet;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabel {
    pub queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    pub queue: String,
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub queue: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorTypeLabel {
    pub queue: String,
    pub error_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub queue: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReportLabel {
    pub queue: String,
    pub kind: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabel {
    pub queue: String,
    pub version: String,
}

/// Distinct `error_type` values one sidecar exports before the rest count as `other`: the
/// handler's exception class names are the user's, and a label must stay bounded.
pub const MAX_ERROR_TYPES: usize = 32;
/// The platform's own error type for a runtime call past `actorTimeout`.
pub const TIMEOUT_ERROR_TYPE: &str = "ActorTimeout";

/// The label value for a runtime error type: the name itself while it looks like a class
/// name (letters, digits, `_`, `.`, up to 64) and fewer than [`MAX_ERROR_TYPES`] distinct
/// names were seen (`seen` remembers them), else `other`.
pub fn bounded_error_type(raw: &str, seen: &mut BTreeSet<String>) -> String {
    let looks_like_a_name = !raw.is_empty()
        && raw.len() <= 64
        && raw
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
    if !looks_like_a_name {
        return "other".into();
    }
    if seen.contains(raw) || seen.len() < MAX_ERROR_TYPES {
        seen.insert(raw.to_string());
        return raw.to_string();
    }
    "other".into()
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DestinationLabel {
    pub queue: String,
    pub destination: String,
}

type HistogramFamily = Family<QueueLabel, Histogram, fn() -> Histogram>;

/// An exemplar's labels: the trace of a sampled hop, so a slow bucket leads to a trace.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TraceLabel {
    pub trace_id: String,
}

type ExemplarFamily = Family<
    QueueLabel,
    HistogramWithExemplars<TraceLabel>,
    fn() -> HistogramWithExemplars<TraceLabel>,
>;

fn latency_histogram_with_exemplars() -> HistogramWithExemplars<TraceLabel> {
    HistogramWithExemplars::new(exponential_buckets(0.0005, 2.5, 20))
}

fn latency_histogram() -> Histogram {
    // 0.5 ms .. ~4.5 h: handlers range from trivial to long model calls.
    Histogram::new(exponential_buckets(0.0005, 2.5, 20))
}

pub struct Metrics {
    registry: Registry,
    queue: QueueLabel,
    processing: ExemplarFamily,
    runtime: HistogramFamily,
    processed: Family<StatusLabel, Counter>,
    failed: Family<ReasonLabel, Counter>,
    runtime_errors: Family<ErrorTypeLabel, Counter>,
    received: Family<QueueLabel, Counter>,
    sent: Family<DestinationLabel, Counter>,
    transport_up: Family<QueueLabel, Gauge>,
    runtime_up: Family<QueueLabel, Gauge>,
    reconnects: Family<QueueLabel, Counter>,
    queue_depth: Family<QueueLabel, Gauge>,
    in_flight: Family<QueueLabel, Gauge>,
    gateway_reports: Family<ReportLabel, Counter>,
    queue_wait: ExemplarFamily,
    timeouts: Family<QueueLabel, Counter>,
    wakes: Family<OutcomeLabel, Counter>,
    build_info: Family<BuildLabel, Gauge>,
    error_types: Mutex<BTreeSet<String>>,
}

impl Metrics {
    pub fn new(queue: &str) -> Metrics {
        let mut registry = Registry::with_prefix("asya_actor");
        let m = Metrics {
            queue: QueueLabel {
                queue: queue.to_string(),
            },
            processing: Family::new_with_constructor(latency_histogram_with_exemplars),
            runtime: Family::new_with_constructor(latency_histogram),
            processed: Family::default(),
            failed: Family::default(),
            runtime_errors: Family::default(),
            received: Family::default(),
            sent: Family::default(),
            transport_up: Family::default(),
            runtime_up: Family::default(),
            reconnects: Family::default(),
            queue_depth: Family::default(),
            in_flight: Family::default(),
            gateway_reports: Family::default(),
            queue_wait: Family::new_with_constructor(latency_histogram_with_exemplars),
            timeouts: Family::default(),
            wakes: Family::default(),
            build_info: Family::default(),
            error_types: Mutex::new(BTreeSet::new()),
            registry: Registry::default(),
        };
        registry.register(
            "processing_duration_seconds",
            "Time from taking a message to acknowledging it",
            m.processing.clone(),
        );
        registry.register(
            "runtime_duration_seconds",
            "Time the runtime (the handler) took per call",
            m.runtime.clone(),
        );
        registry.register(
            "messages_processed",
            "Messages finished, by outcome",
            m.processed.clone(),
        );
        registry.register(
            "messages_failed",
            "Messages sent to x-sump, by reason",
            m.failed.clone(),
        );
        registry.register(
            "runtime_errors",
            "Failed runtime calls, by error type",
            m.runtime_errors.clone(),
        );
        registry.register(
            "messages_received",
            "Messages taken from the queue",
            m.received.clone(),
        );
        registry.register(
            "messages_sent",
            "Messages sent, by destination queue",
            m.sent.clone(),
        );
        registry.register(
            "transport_up",
            "1 when connected to the broker",
            m.transport_up.clone(),
        );
        registry.register(
            "runtime_up",
            "1 when the runtime accepts connections",
            m.runtime_up.clone(),
        );
        registry.register(
            "transport_reconnects",
            "Broker (re)connections",
            m.reconnects.clone(),
        );
        registry.register(
            "queue_messages",
            "Messages waiting in the actor's queue",
            m.queue_depth.clone(),
        );
        registry.register(
            "messages_in_flight",
            "Messages taken but not yet acknowledged",
            m.in_flight.clone(),
        );
        registry.register(
            "gateway_reports",
            "Reports to the gateway by kind (progress, child, final) and outcome (sent, dropped_failed, dropped_queue_full)",
            m.gateway_reports.clone(),
        );
        registry.register(
            "queue_wait_seconds",
            "Time an envelope waited between the sidecar that sent it and this one taking it",
            m.queue_wait.clone(),
        );
        registry.register(
            "timeouts",
            "Runtime calls that ran past actorTimeout",
            m.timeouts.clone(),
        );
        registry.register(
            "wakes",
            "Wake messages to later hops' wake queues (docs/DESIGN.md §6.1), by outcome (sent, failed)",
            m.wakes.clone(),
        );
        registry.register(
            "build_info",
            "1, labelled with the sidecar's version",
            m.build_info.clone(),
        );
        m.build_info
            .get_or_create(&BuildLabel {
                queue: queue.to_string(),
                version: env!("CARGO_PKG_VERSION").to_string(),
            })
            .set(1);
        // Exported at 0 from the start, so rate() and "no timeouts" have a series to see.
        m.timeouts.get_or_create(&m.queue).inc_by(0);
        Metrics { registry, ..m }
    }

    /// `trace`: the exemplar of a sampled, recorded hop (OpenMetrics text only).
    pub fn queue_wait(&self, seconds: f64, trace: Option<TraceLabel>) {
        self.queue_wait
            .get_or_create(&self.queue)
            .observe(seconds, trace, None);
    }

    fn q(&self) -> String {
        self.queue.queue.clone()
    }

    pub fn received(&self) {
        self.received.get_or_create(&self.queue).inc();
        self.in_flight.get_or_create(&self.queue).inc();
    }

    pub fn finished(&self, status: &str, seconds: f64, trace: Option<TraceLabel>) {
        self.in_flight.get_or_create(&self.queue).dec();
        self.processing
            .get_or_create(&self.queue)
            .observe(seconds, trace, None);
        self.processed
            .get_or_create(&StatusLabel {
                queue: self.q(),
                status: status.to_string(),
            })
            .inc();
    }

    /// A message that was received but will come back (not acknowledged).
    pub fn abandoned(&self) {
        self.in_flight.get_or_create(&self.queue).dec();
    }

    pub fn failed(&self, reason: &str) {
        self.failed
            .get_or_create(&ReasonLabel {
                queue: self.q(),
                reason: reason.to_string(),
            })
            .inc();
    }

    pub fn runtime_call(&self, seconds: f64) {
        self.runtime.get_or_create(&self.queue).observe(seconds);
    }

    pub fn runtime_error(&self, error_type: &str) {
        if error_type == TIMEOUT_ERROR_TYPE {
            self.timeouts.get_or_create(&self.queue).inc();
        }
        let label = {
            let mut seen = self.error_types.lock().unwrap_or_else(|e| e.into_inner());
            bounded_error_type(error_type, &mut seen)
        };
        self.runtime_errors
            .get_or_create(&ErrorTypeLabel {
                queue: self.q(),
                error_type: label,
            })
            .inc();
    }

    pub fn sent(&self, destination: &str) {
        self.sent
            .get_or_create(&DestinationLabel {
                queue: self.q(),
                destination: destination.to_string(),
            })
            .inc();
    }

    pub fn set_transport_up(&self, up: bool) {
        self.transport_up
            .get_or_create(&self.queue)
            .set(i64::from(up));
    }

    pub fn set_runtime_up(&self, up: bool) {
        self.runtime_up
            .get_or_create(&self.queue)
            .set(i64::from(up));
    }

    pub fn reconnected(&self) {
        self.reconnects.get_or_create(&self.queue).inc();
    }

    pub fn set_queue_depth(&self, n: u64) {
        self.queue_depth
            .get_or_create(&self.queue)
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Wake messages handed to the broker (`sent`) and not (`failed`).
    pub fn wakes(&self, sent: usize, failed: usize) {
        for (outcome, n) in [("sent", sent), ("failed", failed)] {
            if n > 0 {
                self.wakes
                    .get_or_create(&OutcomeLabel {
                        queue: self.q(),
                        outcome: outcome.to_string(),
                    })
                    .inc_by(n as u64);
            }
        }
    }

    pub fn gateway_report(&self, kind: &str, outcome: &str) {
        self.gateway_reports
            .get_or_create(&ReportLabel {
                queue: self.q(),
                kind: kind.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sampled_hop_leaves_its_trace_id_as_an_exemplar_of_both_histograms() {
        let m = Metrics::new("asya-default-a");
        let trace = || {
            Some(TraceLabel {
                trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            })
        };
        m.received();
        m.queue_wait(0.3, trace());
        m.finished("success", 0.01, trace());
        m.received();
        m.finished("success", 0.02, None);
        let text = m.encode();
        let exemplars: Vec<&str> = text.lines().filter(|l| l.contains(" # {")).collect();
        assert_eq!(exemplars.len(), 2, "{text}");
        assert!(
            exemplars.iter().any(|l| l.starts_with(
                "asya_actor_queue_wait_seconds_bucket{le=\"0.30517578125\",queue=\"asya-default-a\"} 1 # {trace_id=\"4bf92f3577b34da6a3ce929d0e0e4736\"} 0.3"
            )),
            "{text}"
        );
        assert!(
            exemplars.iter().any(|l| l
                .starts_with("asya_actor_processing_duration_seconds_bucket{")
                && l.ends_with("# {trace_id=\"4bf92f3577b34da6a3ce929d0e0e4736\"} 0.01")),
            "{text}"
        );
    }

    #[test]
    fn seed_metric_names_are_exported() {
        let m = Metrics::new("asya-default-a");
        m.received();
        m.finished("success", 0.01, None);
        m.failed("timeout");
        m.runtime_error("ActorTimeout");
        m.runtime_call(0.002);
        let text = m.encode();
        for name in [
            "asya_actor_processing_duration_seconds_bucket",
            "asya_actor_messages_processed_total{queue=\"asya-default-a\",status=\"success\"} 1",
            "asya_actor_messages_failed_total{queue=\"asya-default-a\",reason=\"timeout\"} 1",
            "asya_actor_runtime_errors_total{queue=\"asya-default-a\",error_type=\"ActorTimeout\"} 1",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }

    #[test]
    fn queue_wait_timeouts_and_build_info_are_exported() {
        let m = Metrics::new("asya-default-a");
        let before = m.encode();
        assert!(
            before.contains("asya_actor_timeouts_total{queue=\"asya-default-a\"} 0"),
            "{before}"
        );
        m.queue_wait(0.3, None);
        m.runtime_error(TIMEOUT_ERROR_TYPE);
        let text = m.encode();
        for name in [
            "asya_actor_queue_wait_seconds_count{queue=\"asya-default-a\"} 1",
            "asya_actor_timeouts_total{queue=\"asya-default-a\"} 1",
            concat!(
                "asya_actor_build_info{queue=\"asya-default-a\",version=\"",
                env!("CARGO_PKG_VERSION"),
                "\"} 1"
            ),
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }

    #[test]
    fn error_types_are_bounded() {
        let mut seen = BTreeSet::new();
        assert_eq!(bounded_error_type("ValueError", &mut seen), "ValueError");
        assert_eq!(
            bounded_error_type("my.mod.Err_2", &mut seen),
            "my.mod.Err_2"
        );
        assert_eq!(bounded_error_type("not a class: 42", &mut seen), "other");
        assert_eq!(bounded_error_type("", &mut seen), "other");
        assert_eq!(bounded_error_type(&"E".repeat(65), &mut seen), "other");
        for i in 0..MAX_ERROR_TYPES {
            bounded_error_type(&format!("E{i}"), &mut seen);
        }
        assert_eq!(seen.len(), MAX_ERROR_TYPES);
        assert_eq!(bounded_error_type("Brand_new", &mut seen), "other");
        // Names seen before the bound keep their label.
        assert_eq!(bounded_error_type("ValueError", &mut seen), "ValueError");
    }

    /// Every family this component registers, for tests/monitoring (ASYA_METRICS_DUMP_DIR).
    #[test]
    fn metrics_dump() {
        // A family is exported once it has a series: record one of each.
        let m = Metrics::new("asya-default-a");
        m.received();
        m.finished("success", 0.01, None);
        m.failed("poison");
        m.runtime_call(0.01);
        m.runtime_error("ValueError");
        m.sent("asya-default-x-sink");
        m.set_transport_up(true);
        m.set_runtime_up(true);
        m.reconnected();
        m.set_queue_depth(1);
        m.gateway_report("final", "sent");
        m.queue_wait(0.1, None);
        let text = m.encode();
        let families = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
        assert_eq!(families, 16, "a family without a series here: {text}");
        asya_api::metrics_dump::write("asya-sidecar", &text).unwrap();
    }
}
