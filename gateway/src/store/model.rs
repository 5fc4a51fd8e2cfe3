//! What the gateway stores about an envelope, and the two rules every backend keeps: progress
//! never goes back, and the first final status wins. The memory backend applies them with
//! the functions below; PostgreSQL in its statements; the conformance suite checks both.

use std::time::{SystemTime, UNIX_EPOCH};

use asya_transport::report::{Outcome, Phase, ProgressReport};
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pending,
    Running,
    Succeeded,
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Running => "running",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
        }
    }
    pub fn parse(s: &str) -> Option<Status> {
        match s {
            "pending" => Some(Status::Pending),
            "running" => Some(Status::Running),
            "succeeded" => Some(Status::Succeeded),
            "failed" => Some(Status::Failed),
            _ => None,
        }
    }
    pub fn is_final(self) -> bool {
        matches!(self, Status::Succeeded | Status::Failed)
    }
}

impl From<Outcome> for Status {
    fn from(o: Outcome) -> Status {
        match o {
            Outcome::Succeeded => Status::Succeeded,
            Outcome::Failed => Status::Failed,
        }
    }
}

/// One envelope as the gateway knows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Record {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    pub status: Status,
    /// 0..=100; 100 only at the final status.
    pub progress: f64,
    /// The actor it is at (last reported).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    pub route: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
    pub created_ms: i64,
    pub updated_ms: i64,
    /// The namespace of the actors it travels: its tool's (calls) or its parent's (fan-out
    /// children). Who may report on it and read it is decided by this (`crate::access`).
    /// `None` for envelopes stored before the gateway recorded it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// A sidecar's progress report (the shared wire type).
pub type Progress = ProgressReport;

/// The envelope's progress in percent after `p`: the hop's share of the route, below 100
/// until the final status.
pub fn percent(p: &Progress) -> f64 {
    let total = p.total.max(1) as f64;
    let within = match p.phase() {
        Some(Phase::Received) => 0.1,
        Some(Phase::Processing) => 0.5,
        Some(Phase::Completed) | None => 1.0,
    };
    (((p.current as f64 + within) / total) * 100.0).clamp(0.0, 99.0)
}

/// A final status as reported.
#[derive(Debug, Clone, PartialEq)]
pub struct Final {
    pub status: Status,
    pub actor: Option<String>,
    pub result: Option<Value>,
    pub error: Option<Value>,
}

/// One stored progress event (history).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    pub actor: Option<String>,
    pub phase: String,
    pub progress: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub at_ms: i64,
}

impl Event {
    /// The history entry of a progress report.
    pub fn of_progress(p: &Progress) -> Event {
        Event {
            actor: Some(p.actor.clone()),
            phase: p.phase.clone(),
            progress: percent(p),
            message: p.message.clone(),
            at_ms: now_ms(),
        }
    }

    /// The history entry of a final status.
    pub fn of_final(f: &Final) -> Event {
        Event {
            actor: f.actor.clone(),
            phase: f.status.as_str().to_string(),
            progress: 100.0,
            message: None,
            at_ms: now_ms(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached or failed: callers answer 503, never accept-and-lose.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    #[error("storage rejected the operation: {0}")]
    Rejected(String),
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The record after `p`: running, at `p.actor`, progress never going back; a final record
/// stays as it is.
pub fn after_progress(mut r: Record, p: &Progress) -> Record {
    if r.status.is_final() {
        return r;
    }
    r.status = Status::Running;
    r.actor = Some(p.actor.clone());
    r.progress = r.progress.max(percent(p));
    r.updated_ms = now_ms();
    r
}

/// The record after `f`, or `None` when it already has a final status (the first wins).
pub fn after_final(mut r: Record, f: &Final) -> Option<Record> {
    if r.status.is_final() {
        return None;
    }
    r.status = f.status;
    r.progress = 100.0;
    if let Some(a) = &f.actor {
        r.actor = Some(a.clone());
    }
    r.result = f.result.clone();
    r.error = f.error.clone();
    r.updated_ms = now_ms();
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prog(phase: &str, current: usize) -> Progress {
        Progress {
            actor: "a".into(),
            phase: phase.into(),
            current,
            total: 2,
            message: None,
            parent_id: None,
        }
    }

    #[test]
    fn percent_per_hop() {
        assert_eq!(percent(&prog("received", 0)), 5.0);
        assert_eq!(percent(&prog("completed", 0)), 50.0);
        assert_eq!(percent(&prog("processing", 1)), 75.0);
    }
}
