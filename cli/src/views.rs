//! The rows of `asya status` and `asya queues`, from AsyncActors and queue counts. Pure.

use asya_api::types::AsyncActor;
use serde::Serialize;

use crate::broker::Counts;
use crate::render::{Table, count};

/// One actor's status: `kubectl get asyas -o wide` plus why it is not Running.
#[derive(Debug, Serialize, PartialEq)]
pub struct StatusRow {
    pub namespace: String,
    pub name: String,
    pub phase: String,
    pub ready: Option<i32>,
    pub pending: Option<i32>,
    pub failing: Option<i32>,
    pub min: Option<i32>,
    pub max: Option<i32>,
    pub last_scale: Option<String>,
    pub transport: Option<String>,
    pub message: Option<String>,
    /// Conditions that are not True, as `Type: Reason: message` (empty when Running).
    pub problems: Vec<String>,
}

pub fn status_row(a: &AsyncActor) -> StatusRow {
    let st = a.status.clone().unwrap_or_default();
    let phase = st.phase.clone().unwrap_or_else(|| "Unknown".into());
    let problems = st
        .conditions
        .iter()
        .filter(|c| c.status != "True")
        .map(|c| format!("{}: {}: {}", c.type_, c.reason, c.message))
        .collect();
    StatusRow {
        namespace: a.metadata.namespace.clone().unwrap_or_default(),
        name: a.metadata.name.clone().unwrap_or_default(),
        phase,
        ready: st.ready_replicas,
        pending: st.pending_replicas,
        failing: st.failing_replicas,
        min: st.min_replicas,
        max: st.max_replicas,
        last_scale: st.last_scale,
        transport: st.transport_status,
        message: st.message,
        problems,
    }
}

pub fn status_table(rows: &[StatusRow]) -> String {
    let mut t = Table::new(&[
        "NAMESPACE",
        "NAME",
        "STATUS",
        "RUNNING",
        "PENDING",
        "FAILING",
        "MIN",
        "MAX",
        "LAST-SCALE",
        "TRANSPORT",
    ]);
    for r in rows {
        t.row(vec![
            r.namespace.clone(),
            r.name.clone(),
            r.phase.clone(),
            count(r.ready),
            count(r.pending),
            count(r.failing),
            count(r.min),
            count(r.max),
            r.last_scale.clone().unwrap_or_default(),
            r.transport.clone().unwrap_or_default(),
        ]);
    }
    let mut out = t.render();
    for r in rows
        .iter()
        .filter(|r| r.phase != "Running" && r.phase != "Napping")
    {
        out.push_str(&format!("\n{}/{} is {}", r.namespace, r.name, r.phase));
        match &r.message {
            Some(m) => out.push_str(&format!(": {m}\n")),
            None => out.push('\n'),
        }
        for p in &r.problems {
            out.push_str(&format!("  {p}\n"));
        }
    }
    out
}

/// One actor's queue figures, each with where it came from.
#[derive(Debug, Serialize, PartialEq)]
pub struct QueueRow {
    pub namespace: String,
    pub actor: String,
    /// Ready messages, asked of the broker now with the namespace's identity.
    pub queued: Option<u64>,
    /// Unacknowledged: SQS says it to anyone; RabbitMQ only through the management API, so
    /// this is the provisioner's last sample in the actor's status.
    pub in_flight: Option<u64>,
    /// The namespace's x-sump, whose envelopes carry the actor they failed at.
    pub sump: Option<u64>,
    /// Why a figure is missing (the queue is gone, the broker refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

pub fn queue_row(
    a: &AsyncActor,
    live: Result<&Counts, String>,
    sump_of_actor: Option<u64>,
) -> QueueRow {
    let st = a.status.clone().unwrap_or_default();
    let (queued, in_flight, error) = match live {
        Ok(c) => (
            c.ready,
            c.in_flight
                .or(st.processing_messages.and_then(|n| u64::try_from(n).ok())),
            None,
        ),
        Err(e) => (
            st.queued_messages.and_then(|n| u64::try_from(n).ok()),
            st.processing_messages.and_then(|n| u64::try_from(n).ok()),
            Some(e),
        ),
    };
    QueueRow {
        namespace: a.metadata.namespace.clone().unwrap_or_default(),
        actor: a
            .spec
            .actor
            .clone()
            .or_else(|| a.metadata.name.clone())
            .unwrap_or_default(),
        queued,
        in_flight,
        sump: sump_of_actor,
        error,
    }
}

pub fn queues_table(rows: &[QueueRow]) -> String {
    let mut t = Table::new(&[
        "NAMESPACE",
        "ACTOR",
        "QUEUED",
        "IN-FLIGHT",
        "X-SUMP",
        "NOTE",
    ]);
    for r in rows {
        t.row(vec![
            r.namespace.clone(),
            r.actor.clone(),
            count(r.queued),
            count(r.in_flight),
            count(r.sump),
            r.error.clone().unwrap_or_default(),
        ]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn actor(status: serde_json::Value) -> AsyncActor {
        serde_json::from_value(json!({
            "apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
            "metadata": {"name": "a", "namespace": "team"},
            "spec": {"actor": "a", "image": "python:3.12", "handler": "h.f"},
            "status": status
        }))
        .unwrap()
    }

    #[test]
    fn a_non_running_actor_shows_its_failing_conditions() {
        let a = actor(json!({"phase": "Degraded", "message": "image missing",
        "conditions": [
            {"type": "WorkloadReady", "status": "False", "reason": "ImagePullBackOff", "message": "no such image", "lastTransitionTime": "2026-11-26T00:00:00Z"},
            {"type": "TransportReady", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": "2026-11-26T00:00:00Z"}
        ]}));
        let r = status_row(&a);
        assert_eq!(
            r.problems,
            vec!["WorkloadReady: ImagePullBackOff: no such image"]
        );
        let text = status_table(&[r]);
        assert!(text.contains("team/a is Degraded: image missing\n  WorkloadReady: ImagePullBackOff: no such image\n"), "{text}");
    }

    #[test]
    fn a_running_actor_is_one_line() {
        let r = status_row(&actor(json!({"phase": "Running", "readyReplicas": 2})));
        let text = status_table(&[r]);
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(
            text.lines()
                .nth(1)
                .unwrap()
                .starts_with("team       a     Running  2")
        );
    }

    #[test]
    fn queue_figures_come_from_the_broker_else_the_status() {
        let a = actor(json!({"phase": "Running", "queuedMessages": 7, "processingMessages": 2}));
        let live = Counts {
            ready: Some(3),
            in_flight: None,
            consumers: Some(1),
        };
        let r = queue_row(&a, Ok(&live), Some(1));
        assert_eq!((r.queued, r.in_flight, r.sump), (Some(3), Some(2), Some(1)));
        let r = queue_row(&a, Err("refused".into()), None);
        assert_eq!((r.queued, r.in_flight), (Some(7), Some(2)));
        assert_eq!(r.error.as_deref(), Some("refused"));
        assert!(queues_table(&[r]).contains("refused"));
    }
}
