//! Prometheus metrics: reconciles, errors, duration, queue operations.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueOpLabel {
    pub transport: String,
    pub op: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndQueueLabel {
    pub transport: String,
    pub reason: String,
}

#[derive(Clone)]
pub struct Metrics {
    pub reconciles: Family<ResultLabel, Counter>,
    pub errors: Family<ErrorLabel, Counter>,
    pub duration: Histogram,
    pub queue_ops: Family<QueueOpLabel, Counter>,
    pub leader: Gauge,
    /// Requests sent to the Kubernetes API server (a watch counts once per connection).
    pub api_requests: Counter,
    /// End queues of deleted namespaces kept for their messages (endQueueRetention).
    pub end_queues_retained: Gauge,
    pub end_queues_deleted: Family<EndQueueLabel, Counter>,
    pub registry: Arc<Registry>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut r = Registry::with_prefix("asya_provisioner");
        let reconciles = Family::<ResultLabel, Counter>::default();
        let errors = Family::<ErrorLabel, Counter>::default();
        let duration = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        let queue_ops = Family::<QueueOpLabel, Counter>::default();
        let leader = Gauge::default();
        let api_requests = Counter::default();
        r.register(
            "api_requests",
            "Requests sent to the Kubernetes API server (a watch once per connection)",
            api_requests.clone(),
        );
        let end_queues_retained = Gauge::default();
        let end_queues_deleted = Family::<EndQueueLabel, Counter>::default();
        r.register("reconciles", "Reconciles by result", reconciles.clone());
        r.register(
            "reconcile_errors",
            "Reconcile errors by kind",
            errors.clone(),
        );
        r.register(
            "reconcile_duration_seconds",
            "Time spent in one reconcile",
            duration.clone(),
        );
        r.register(
            "queue_operations",
            "Queue operations on the transports",
            queue_ops.clone(),
        );
        r.register(
            "leader",
            "1 while this replica holds the leader lease",
            leader.clone(),
        );
        r.register(
            "end_queues_retained",
            "End queues of deleted namespaces kept because they hold messages (endQueueRetention)",
            end_queues_retained.clone(),
        );
        r.register(
            "end_queues_deleted",
            "End queues of deleted namespaces deleted, by reason (empty, retention)",
            end_queues_deleted.clone(),
        );
        Metrics {
            reconciles,
            errors,
            duration,
            queue_ops,
            leader,
            api_requests,
            end_queues_retained,
            end_queues_deleted,
            registry: Arc::new(r),
        }
    }
}

impl Metrics {
    pub fn queue_op(&self, transport: &str, op: &str, ok: bool) {
        self.queue_ops
            .get_or_create(&QueueOpLabel {
                transport: transport.into(),
                op: op.into(),
                result: if ok { "ok" } else { "error" }.into(),
            })
            .inc();
    }

    pub fn end_queue_deleted(&self, transport: &str, reason: &str) {
        self.end_queues_deleted
            .get_or_create(&EndQueueLabel {
                transport: transport.into(),
                reason: reason.into(),
            })
            .inc();
    }

    pub fn encode(&self) -> String {
        let mut s = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
        s
    }
}
