//! Per-actor gauges from what each reconcile saw: messages queued and in process on the
//! broker, and ready replicas. They come from the provisioner, not the actor's pods, so they
//! exist while an actor has no pod at all: "messages wait and nobody takes them" is visible
//! (the ActorStuck alert, docs/observability.md).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use asya_api::AsyncActorStatus;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActorLabel {
    pub namespace: String,
    pub actor: String,
}

/// One actor's values; `None` when the broker was not asked or did not say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ActorValues {
    pub queued: Option<i64>,
    pub processing: Option<i64>,
    pub ready: Option<i64>,
}

impl ActorValues {
    /// What the status a reconcile is about to write says.
    pub fn of_status(s: &AsyncActorStatus) -> Self {
        ActorValues {
            queued: s.queued_messages,
            processing: s.processing_messages,
            ready: s.ready_replicas.map(i64::from),
        }
    }
}

#[derive(Clone, Default)]
pub struct ActorGauges {
    queued: Family<ActorLabel, Gauge>,
    processing: Family<ActorLabel, Gauge>,
    ready: Family<ActorLabel, Gauge>,
}

impl ActorGauges {
    /// Registers the three families (`<prefix>_actor_messages_queued`, …) in `r`.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "actor_messages_queued",
            "Messages waiting in an actor's queue at its last reconcile (also at zero pods)",
            self.queued.clone(),
        );
        r.register(
            "actor_messages_processing",
            "Messages taken from an actor's queue and not yet acknowledged, at its last reconcile",
            self.processing.clone(),
        );
        r.register(
            "actor_replicas_ready",
            "Ready replicas of an actor's workload at its last reconcile",
            self.ready.clone(),
        );
    }

    /// Sets an actor's gauges; a value the broker did not give removes that series rather
    /// than export a stale or invented number.
    pub fn set(&self, namespace: &str, actor: &str, v: ActorValues) {
        let key = ActorLabel {
            namespace: namespace.into(),
            actor: actor.into(),
        };
        for (family, value) in [
            (&self.queued, v.queued),
            (&self.processing, v.processing),
            (&self.ready, v.ready),
        ] {
            match value {
                Some(n) => {
                    family.get_or_create(&key).set(n);
                }
                None => {
                    family.remove(&key);
                }
            }
        }
    }

    /// An actor that is gone leaves no series behind.
    pub fn remove(&self, namespace: &str, actor: &str) {
        self.set(namespace, actor, ActorValues::default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(g: &ActorGauges) -> String {
        let mut r = Registry::with_prefix("asya_provisioner");
        g.register(&mut r);
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, &r).unwrap();
        s
    }

    #[test]
    fn an_actor_with_zero_pods_and_queued_messages_is_exported() {
        let g = ActorGauges::default();
        g.set(
            "team-a",
            "resize",
            ActorValues {
                queued: Some(7),
                processing: Some(0),
                ready: Some(0),
            },
        );
        let t = text(&g);
        for line in [
            "asya_provisioner_actor_messages_queued{namespace=\"team-a\",actor=\"resize\"} 7",
            "asya_provisioner_actor_messages_processing{namespace=\"team-a\",actor=\"resize\"} 0",
            "asya_provisioner_actor_replicas_ready{namespace=\"team-a\",actor=\"resize\"} 0",
        ] {
            assert!(t.contains(line), "missing {line} in\n{t}");
        }
    }

    #[test]
    fn unknown_values_and_removed_actors_leave_no_series() {
        let g = ActorGauges::default();
        let all = ActorValues {
            queued: Some(1),
            processing: Some(2),
            ready: Some(3),
        };
        g.set("n", "a", all);
        g.set(
            "n",
            "a",
            ActorValues {
                queued: None,
                ..all
            },
        );
        let t = text(&g);
        assert!(!t.contains("actor_messages_queued{"), "{t}");
        assert!(
            t.contains("actor_messages_processing{namespace=\"n\",actor=\"a\"} 2"),
            "{t}"
        );
        g.remove("n", "a");
        let t = text(&g);
        assert!(!t.contains("actor=\"a\""), "{t}");
    }

    #[test]
    fn values_come_from_the_status_written() {
        let s = AsyncActorStatus {
            queued_messages: Some(4),
            processing_messages: None,
            ready_replicas: Some(0),
            ..Default::default()
        };
        assert_eq!(
            ActorValues::of_status(&s),
            ActorValues {
                queued: Some(4),
                processing: None,
                ready: Some(0)
            }
        );
    }
}
