//! Prometheus metrics: reconciles, errors, duration, queue operations, per-actor gauges
//! ([`ActorGauges`]), build info, and seed 001's controller-runtime names
//! (`controller_runtime_reconcile_total{controller="asyncactor"}`, `…_errors_total`).

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::actor_gauges::ActorGauges;

/// The `controller` label of the controller-runtime metrics (seed 001).
pub const CONTROLLER: &str = "asyncactor";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabel {
    pub controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerResultLabel {
    pub controller: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabel {
    pub version: String,
}

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
    /// Times this replica stood down after losing the leader lease (and campaigned again).
    pub leader_stand_downs: Counter,
    /// Requests sent to the Kubernetes API server (a watch counts once per connection).
    pub api_requests: Counter,
    /// End queues of deleted namespaces kept for their messages (endQueueRetention).
    pub end_queues_retained: Gauge,
    pub end_queues_deleted: Family<EndQueueLabel, Counter>,
    /// Queued / processing / ready per actor, also while it has no pod.
    pub actors: ActorGauges,
    pub controller_reconciles: Family<ControllerResultLabel, Counter>,
    pub controller_errors: Family<ControllerLabel, Counter>,
    pub registry: Arc<Registry>,
}

impl Default for Metrics {
    fn default() -> Self {
        // The controller-runtime names have no prefix; ours live under asya_provisioner.
        let mut root = Registry::default();
        let controller_reconciles = Family::<ControllerResultLabel, Counter>::default();
        let controller_errors = Family::<ControllerLabel, Counter>::default();
        root.register(
            "controller_runtime_reconcile",
            "Reconciles per controller and result (success, error), as controller-runtime names them",
            controller_reconciles.clone(),
        );
        root.register(
            "controller_runtime_reconcile_errors",
            "Failed reconciles per controller, as controller-runtime names them",
            controller_errors.clone(),
        );
        // Both at 0 from the start: an alert on their rate needs the series to exist.
        for result in ["success", "error"] {
            controller_reconciles
                .get_or_create(&ControllerResultLabel {
                    controller: CONTROLLER.into(),
                    result: result.into(),
                })
                .inc_by(0);
        }
        controller_errors
            .get_or_create(&ControllerLabel {
                controller: CONTROLLER.into(),
            })
            .inc_by(0);
        let r = root.sub_registry_with_prefix("asya_provisioner");
        let actors = ActorGauges::default();
        actors.register(r);
        let build_info = Family::<VersionLabel, Gauge>::default();
        r.register(
            "build_info",
            "1, labelled with the provisioner's version",
            build_info.clone(),
        );
        build_info
            .get_or_create(&VersionLabel {
                version: env!("CARGO_PKG_VERSION").into(),
            })
            .set(1);
        let reconciles = Family::<ResultLabel, Counter>::default();
        let errors = Family::<ErrorLabel, Counter>::default();
        let duration = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        let queue_ops = Family::<QueueOpLabel, Counter>::default();
        let leader = Gauge::default();
        let leader_stand_downs = Counter::default();
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
            "leader_stand_downs",
            "Times this replica stood down after losing the leader lease (then campaigned again)",
            leader_stand_downs.clone(),
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
            leader_stand_downs,
            api_requests,
            end_queues_retained,
            end_queues_deleted,
            actors,
            controller_reconciles,
            controller_errors,
            registry: Arc::new(root),
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

    /// One reconcile's outcome in the controller-runtime metrics.
    pub fn controller_reconciled(&self, ok: bool) {
        self.controller_reconciles
            .get_or_create(&ControllerResultLabel {
                controller: CONTROLLER.into(),
                result: if ok { "success" } else { "error" }.into(),
            })
            .inc();
        if !ok {
            self.controller_errors
                .get_or_create(&ControllerLabel {
                    controller: CONTROLLER.into(),
                })
                .inc();
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_controller_runtime_names_and_build_info_are_exported() {
        let m = Metrics::default();
        let before = m.encode();
        assert!(
            before
                .contains("controller_runtime_reconcile_errors_total{controller=\"asyncactor\"} 0"),
            "{before}"
        );
        m.controller_reconciled(true);
        m.controller_reconciled(false);
        let text = m.encode();
        for line in [
            "controller_runtime_reconcile_total{controller=\"asyncactor\",result=\"success\"} 1",
            "controller_runtime_reconcile_total{controller=\"asyncactor\",result=\"error\"} 1",
            "controller_runtime_reconcile_errors_total{controller=\"asyncactor\"} 1",
            concat!(
                "asya_provisioner_build_info{version=\"",
                env!("CARGO_PKG_VERSION"),
                "\"} 1"
            ),
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    /// Every family this component registers, for tests/monitoring (ASYA_METRICS_DUMP_DIR).
    #[test]
    fn metrics_dump() {
        // A family is exported once it has a series: record one of each.
        let m = Metrics::default();
        m.reconciles
            .get_or_create(&ResultLabel {
                result: "ok".into(),
            })
            .inc();
        m.errors
            .get_or_create(&ErrorLabel {
                kind: "kube".into(),
            })
            .inc();
        m.duration.observe(0.1);
        m.queue_op("rabbitmq", "ensure", true);
        m.end_queue_deleted("rabbitmq", "empty");
        m.actors.set(
            "n",
            "a",
            crate::actor_gauges::ActorValues {
                queued: Some(1),
                processing: Some(0),
                ready: Some(0),
            },
        );
        m.controller_reconciled(false);
        let text = m.encode();
        for family in [
            "reconciles",
            "reconcile_errors",
            "queue_operations",
            "end_queues_deleted",
            "actor_messages_queued",
        ] {
            assert!(
                text.contains(&format!("# TYPE asya_provisioner_{family} ")),
                "{family}: {text}"
            );
        }
        asya_api::metrics_dump::write("asya-queue-provisioner", &text).unwrap();
    }
}
