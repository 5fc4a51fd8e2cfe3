//! The sidecar → gateway report protocol: the bodies a sidecar POSTs to the gateway and what
//! the reply's status means to it. The sidecar serialises these types and the gateway parses
//! them, so the JSON shape is written once (and pinned by the tests below).
//!
//! - `POST /envelopes/{id}/progress`, [`ProgressReport`]: the envelope reached an actor.
//! - `POST /envelopes`, [`ChildReport`]: an actor created a fan-out child.
//! - `POST /envelopes/{id}/final`, [`FinalReport`]: an end actor (x-sink, x-sump) got it.
//!
//! `{id}` is the envelope id percent-encoded as one path segment. The gateway answers with
//! the envelope as it stores it (200; 201 for a new child) or with `{"error", "message"}`;
//! a reporter reads only the status code ([`Verdict`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::envelope::Route;

/// Where [`ChildReport`]s go.
pub const CHILD_PATH: &str = "/envelopes";

/// Where the [`ProgressReport`]s of an envelope go; `id_segment` is already percent-encoded.
pub fn progress_path(id_segment: &str) -> String {
    format!("/envelopes/{id_segment}/progress")
}

/// Where the [`FinalReport`] of an envelope goes; `id_segment` is already percent-encoded.
pub fn final_path(id_segment: &str) -> String {
    format!("/envelopes/{id_segment}/final")
}

/// How far an actor got with an envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Received,
    Processing,
    Completed,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Received => "received",
            Phase::Processing => "processing",
            Phase::Completed => "completed",
        }
    }

    pub fn parse(s: &str) -> Option<Phase> {
        match s {
            "received" => Some(Phase::Received),
            "processing" => Some(Phase::Processing),
            "completed" => Some(Phase::Completed),
            _ => None,
        }
    }
}

/// An envelope reached an actor (`POST /envelopes/{id}/progress`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgressReport {
    pub actor: String,
    /// A [`Phase`] by name. A string on the wire so that the gateway's refusal of a wrong
    /// value can quote it.
    pub phase: String,
    /// The actor's index in the route.
    pub current: usize,
    /// Actors in the route.
    pub total: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// For a fan-out child whose own report about it may not have arrived yet: the gateway
    /// creates the child from its parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
}

impl ProgressReport {
    /// The phase, `None` when the string names none.
    pub fn phase(&self) -> Option<Phase> {
        Phase::parse(&self.phase)
    }
}

/// An actor created a fan-out child (`POST /envelopes`); idempotent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildReport {
    pub id: String,
    pub parent_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<Route>,
}

/// How an envelope ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Outcome> {
        match s {
            "succeeded" => Some(Outcome::Succeeded),
            "failed" => Some(Outcome::Failed),
            _ => None,
        }
    }
}

/// An end actor got the envelope (`POST /envelopes/{id}/final`); the first one wins.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FinalReport {
    /// An [`Outcome`] by name (a string on the wire, as [`ProgressReport::phase`]).
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    /// x-sink: the payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// x-sump: why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
}

impl FinalReport {
    pub fn new(outcome: Outcome, actor: &str, result: Option<Value>, error: Option<Value>) -> Self {
        FinalReport {
            status: outcome.as_str().to_string(),
            actor: Some(actor.to_string()),
            result,
            error,
        }
    }

    /// The outcome, `None` when the string names none.
    pub fn outcome(&self) -> Option<Outcome> {
        Outcome::parse(&self.status)
    }
}

/// What the status code of the gateway's reply means to a reporter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Accepted,
    /// The gateway refused this report for good (4xx but 429): sending it again cannot help.
    Refused,
    /// Rate limited, or the gateway or its database is unavailable: try again.
    Retry,
}

impl Verdict {
    pub fn of(status: u16) -> Verdict {
        match status {
            200..=299 => Verdict::Accepted,
            429 => Verdict::Retry,
            400..=499 => Verdict::Refused,
            _ => Verdict::Retry,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Map, json};

    use super::*;

    /// Serialises to exactly `wire` and parses back to the same value.
    fn pinned<T>(value: &T, wire: Value)
    where
        T: Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
    {
        assert_eq!(serde_json::to_value(value).unwrap(), wire);
        assert_eq!(&serde_json::from_value::<T>(wire).unwrap(), value);
    }

    #[test]
    fn progress_report_wire_shape() {
        let mut p = ProgressReport {
            actor: "a".into(),
            phase: Phase::Received.as_str().into(),
            current: 0,
            total: 3,
            message: None,
            parent_id: None,
        };
        pinned(
            &p,
            json!({"actor": "a", "phase": "received", "current": 0, "total": 3}),
        );
        p.parent_id = Some("e".into());
        p.message = Some("m".into());
        pinned(
            &p,
            json!({"actor": "a", "phase": "received", "current": 0, "total": 3,
                   "parent_id": "e", "message": "m"}),
        );
        assert_eq!(p.phase(), Some(Phase::Received));
    }

    #[test]
    fn child_report_wire_shape() {
        let c = ChildReport {
            id: "e-1".into(),
            parent_id: "e".into(),
            route: Some(Route {
                actors: vec!["a".into(), "b".into()],
                current: 1,
                extra: Map::new(),
            }),
        };
        pinned(
            &c,
            json!({"id": "e-1", "parent_id": "e", "route": {"actors": ["a", "b"], "current": 1}}),
        );
        let bare: ChildReport =
            serde_json::from_value(json!({"id": "c", "parent_id": "p"})).unwrap();
        assert_eq!(bare.route, None, "the route may be left out");
    }

    #[test]
    fn final_report_wire_shape() {
        let f = FinalReport::new(
            Outcome::Failed,
            "x-sump",
            None,
            Some(json!({"reason": "boom"})),
        );
        pinned(
            &f,
            json!({"status": "failed", "actor": "x-sump", "error": {"reason": "boom"}}),
        );
        let s = FinalReport::new(Outcome::Succeeded, "x-sink", Some(json!([1])), None);
        pinned(
            &s,
            json!({"status": "succeeded", "actor": "x-sink", "result": [1]}),
        );
        assert_eq!(s.outcome(), Some(Outcome::Succeeded));
        let odd: FinalReport = serde_json::from_value(json!({"status": "done"})).unwrap();
        assert_eq!(odd.outcome(), None);
    }

    #[test]
    fn names_round_trip() {
        for p in [Phase::Received, Phase::Processing, Phase::Completed] {
            assert_eq!(Phase::parse(p.as_str()), Some(p));
        }
        for o in [Outcome::Succeeded, Outcome::Failed] {
            assert_eq!(Outcome::parse(o.as_str()), Some(o));
        }
        assert_eq!(Phase::parse("done"), None);
    }

    #[test]
    fn verdict_of_status() {
        assert_eq!(Verdict::of(200), Verdict::Accepted);
        assert_eq!(Verdict::of(201), Verdict::Accepted);
        assert_eq!(Verdict::of(400), Verdict::Refused);
        assert_eq!(Verdict::of(404), Verdict::Refused);
        assert_eq!(Verdict::of(429), Verdict::Retry);
        assert_eq!(Verdict::of(503), Verdict::Retry);
        assert_eq!(Verdict::of(500), Verdict::Retry);
    }

    #[test]
    fn paths() {
        assert_eq!(progress_path("e%201"), "/envelopes/e%201/progress");
        assert_eq!(final_path("e"), "/envelopes/e/final");
        assert_eq!(CHILD_PATH, "/envelopes");
    }
}
