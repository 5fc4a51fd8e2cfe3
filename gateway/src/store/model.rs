//! What the gateway stores about an envelope, and the two rules every backend keeps: progress
//! never goes back, and the first final status wins. The memory backend applies them with
//! the functions below; PostgreSQL in its statements; the conformance suite checks both.

use std::collections::BTreeSet;
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

/// A fan-in (docs/DESIGN.md §12): the branches of one fan-out, keyed by (namespace, join id),
/// as the rule below needs to see it. The results themselves stay in the backend.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JoinView {
    pub total: u32,
    /// The branch indexes stored so far.
    pub stored: BTreeSet<u32>,
    pub done: Option<Done>,
}

/// How a join fired: on which branch's report, and whether that branch had failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    pub by: u32,
    pub failed: bool,
}

/// What the backend does with one branch report, and answers.
#[derive(Debug, Clone, PartialEq)]
pub struct JoinStep {
    /// Store this branch's result (a new index of a join not fired yet).
    pub insert: bool,
    /// The join fires now: mark it done, in the same transaction as the insert.
    pub fire: Option<Done>,
    pub reply: JoinReply,
}

/// The answer, for the backend to fill in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinReply {
    Waiting {
        stored: u32,
        total: u32,
    },
    /// Every result, in index order.
    Complete,
    /// The error stored for this branch index.
    Failed {
        index: u32,
    },
    Joined,
}

/// A branch report the join cannot take: the sidecar's fault, answered 400/409.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JoinRefused {
    #[error("total: {total}: a fan-out has 1 to {max} branches")]
    Total { total: u32, max: u32 },
    #[error("index: {index}: must be below the fan-out's total of {total}")]
    Index { index: u32, total: u32 },
    #[error(
        "total: {total}: join {join:?} was started with {stored} branches; every branch of a \
         fan-out reports the same total"
    )]
    Mismatch {
        join: String,
        total: u32,
        stored: u32,
    },
    #[error("a branch report has a result or an error, not both and not neither")]
    Outcome,
}

/// Checks a report on its own, before any storage is touched.
pub fn check_branch(
    index: u32,
    total: u32,
    has_result: bool,
    has_error: bool,
) -> Result<(), JoinRefused> {
    let max = asya_transport::fanin::MAX_BRANCHES;
    if total == 0 || total > max {
        return Err(JoinRefused::Total { total, max });
    }
    if index >= total {
        return Err(JoinRefused::Index { index, total });
    }
    if has_result == has_error {
        return Err(JoinRefused::Outcome);
    }
    Ok(())
}

/// The fan-in rule: a branch index counts once; the join fires once, when the last distinct
/// index is stored or on the first error; the branch that fired it gets the same answer again
/// on a redelivery (its sidecar may have died before sending the flow on), every other
/// report after that gets `Joined`.
pub fn after_branch(
    join_id: &str,
    view: &JoinView,
    index: u32,
    total: u32,
    failed: bool,
) -> Result<JoinStep, JoinRefused> {
    if view.total != total {
        return Err(JoinRefused::Mismatch {
            join: join_id.to_string(),
            total,
            stored: view.total,
        });
    }
    if let Some(done) = view.done {
        let reply = match (done.by == index, done.failed) {
            (true, false) => JoinReply::Complete,
            (true, true) => JoinReply::Failed { index },
            (false, _) => JoinReply::Joined,
        };
        return Ok(JoinStep {
            insert: false,
            fire: None,
            reply,
        });
    }
    let new = !view.stored.contains(&index);
    let stored = view.stored.len() as u32 + u32::from(new);
    let fire = (new && (failed || stored == total)).then_some(Done { by: index, failed });
    let reply = match fire {
        Some(Done { failed: true, .. }) => JoinReply::Failed { index },
        Some(_) => JoinReply::Complete,
        None => JoinReply::Waiting { stored, total },
    };
    Ok(JoinStep {
        insert: new,
        fire,
        reply,
    })
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

    fn view(total: u32, stored: &[u32], done: Option<Done>) -> JoinView {
        JoinView {
            total,
            stored: stored.iter().copied().collect(),
            done,
        }
    }

    #[test]
    fn a_join_fires_once_on_its_last_distinct_index() {
        let v = view(3, &[], None);
        let s = after_branch("j", &v, 1, 3, false).unwrap();
        assert_eq!((s.insert, s.fire), (true, None));
        assert_eq!(
            s.reply,
            JoinReply::Waiting {
                stored: 1,
                total: 3
            }
        );
        // A duplicate of a stored index changes nothing and does not count.
        let s = after_branch("j", &view(3, &[1, 2], None), 1, 3, false).unwrap();
        assert_eq!((s.insert, s.fire), (false, None));
        assert_eq!(
            s.reply,
            JoinReply::Waiting {
                stored: 2,
                total: 3
            }
        );
        // Even a duplicate that failed this time: the first report of an index stands.
        let s = after_branch("j", &view(3, &[1, 2], None), 2, 3, true).unwrap();
        assert_eq!((s.insert, s.fire), (false, None));
        // The last distinct index fires the join.
        let s = after_branch("j", &view(3, &[1, 2], None), 0, 3, false).unwrap();
        assert!(s.insert);
        assert_eq!(
            s.fire,
            Some(Done {
                by: 0,
                failed: false
            })
        );
        assert_eq!(s.reply, JoinReply::Complete);
    }

    #[test]
    fn after_the_join_only_the_branch_that_fired_it_hears_so_again() {
        let done = Some(Done {
            by: 0,
            failed: false,
        });
        let again = after_branch("j", &view(3, &[0, 1, 2], done), 0, 3, false).unwrap();
        assert_eq!((again.insert, again.fire), (false, None));
        assert_eq!(again.reply, JoinReply::Complete);
        let other = after_branch("j", &view(3, &[0, 1, 2], done), 2, 3, false).unwrap();
        assert_eq!(other.reply, JoinReply::Joined);
    }

    #[test]
    fn the_first_error_fails_the_join_once() {
        let s = after_branch("j", &view(3, &[0], None), 2, 3, true).unwrap();
        assert!(s.insert);
        assert_eq!(
            s.fire,
            Some(Done {
                by: 2,
                failed: true
            })
        );
        assert_eq!(s.reply, JoinReply::Failed { index: 2 });
        let failed = Some(Done {
            by: 2,
            failed: true,
        });
        let later = after_branch("j", &view(3, &[0, 2], failed), 1, 3, true).unwrap();
        assert_eq!(
            (later.insert, later.fire, later.reply),
            (false, None, JoinReply::Joined)
        );
        let redelivered = after_branch("j", &view(3, &[0, 2], failed), 2, 3, true).unwrap();
        assert_eq!(redelivered.reply, JoinReply::Failed { index: 2 });
    }

    #[test]
    fn reports_the_join_cannot_take_are_refused_with_the_rule() {
        assert_eq!(
            check_branch(0, 0, true, false).unwrap_err().to_string(),
            "total: 0: a fan-out has 1 to 10000 branches"
        );
        assert_eq!(
            check_branch(3, 3, true, false).unwrap_err().to_string(),
            "index: 3: must be below the fan-out's total of 3"
        );
        assert_eq!(check_branch(0, 1, true, true), Err(JoinRefused::Outcome));
        assert_eq!(check_branch(0, 1, false, false), Err(JoinRefused::Outcome));
        assert!(check_branch(0, 1, false, true).is_ok());
        let e = after_branch("p", &view(3, &[], None), 0, 4, false).unwrap_err();
        assert!(e.to_string().contains("was started with 3 branches"), "{e}");
    }
}
