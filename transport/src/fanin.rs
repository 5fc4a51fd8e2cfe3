//! The fan-in protocol between a flow's branch sidecars and the gateway (docs/DESIGN.md §12
//! "Fan-out and fan-in"): after a branch's handler, its sidecar POSTs the branch's result
//! (or its error) to `POST /fanin/{join}/{index}` and the gateway answers whether the join is
//! still waiting, complete (the results in index order: the sidecar that completed it sends
//! the flow on), failed (a branch raised: the sidecar routes the flow by its `except`), or
//! already joined by another branch (nothing to do). Written once here, for both sides.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Branches one fan-out may have: a join keeps one row per branch until it fires.
pub const MAX_BRANCHES: u32 = 10_000;

/// Where a branch's result goes; `join_segment` is already percent-encoded.
pub fn branch_path(join_segment: &str, index: u32) -> String {
    format!("/fanin/{join_segment}/{index}")
}

/// A branch's result or error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BranchReport {
    /// How many branches the fan-out has: every report of a join says the same.
    pub total: u32,
    /// The namespace of the flow (the sidecar's). With a report token it must be the token's.
    pub namespace: String,
    /// The handler's answer (one state); absent when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The handler's error (`type`, `mro`, `message`, `traceback`, `code`) when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
}

/// The gateway's answer to a [`BranchReport`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "join", rename_all = "snake_case")]
pub enum JoinAnswer {
    /// Stored (or already stored: a duplicate changes nothing); `stored` of `total` so far.
    Waiting { stored: u32, total: u32 },
    /// This branch's result was the last one: every result, in index (source) order. The
    /// same answer again to a redelivery of this branch, so a sidecar that died before its
    /// send completes it on redelivery.
    Complete { results: Vec<Value> },
    /// This branch's error failed the join (the first error wins): the flow goes on by its
    /// `except`, or to x-sump. The same answer again to a redelivery of this branch.
    Failed { index: u32, error: Value },
    /// The join fired on another branch's report: this one has nothing to do.
    Joined,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn wire_shapes() {
        let r = BranchReport {
            total: 3,
            namespace: "team".into(),
            result: Some(json!({"x": 1})),
            error: None,
        };
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"total": 3, "namespace": "team", "result": {"x": 1}})
        );
        let a = JoinAnswer::Waiting {
            stored: 1,
            total: 3,
        };
        assert_eq!(
            serde_json::to_value(&a).unwrap(),
            json!({"join": "waiting", "stored": 1, "total": 3})
        );
        let c: JoinAnswer =
            serde_json::from_value(json!({"join": "complete", "results": [1, 2]})).unwrap();
        assert_eq!(
            c,
            JoinAnswer::Complete {
                results: vec![json!(1), json!(2)]
            }
        );
        assert_eq!(
            serde_json::to_value(JoinAnswer::Joined).unwrap(),
            json!({"join": "joined"})
        );
        assert_eq!(branch_path("p%201", 2), "/fanin/p%201/2");
    }
}
