//! What a hop's flow evaluation decided, for `asya trace` (docs/flows.md): the decisions
//! taken after this actor's handler (`37:except PaymentDeclined`, `38:else`), shown as the
//! `process` span's attributes and as the message of the hop's `completed` report to the
//! gateway. Pure: read from the envelope the hop routes on.

use crate::flow_routing::{self, FlowStep};

pub use asya_flow::trace::{DECISIONS_ATTRIBUTE, FLOW_ATTRIBUTE};

/// The flow and the decisions of one hop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    pub flow: String,
    pub decisions: Vec<String>,
}

impl Decided {
    /// `flow review_order: 37:except PaymentDeclined, 38:else` (`flow review_order` alone
    /// when the hop decided nothing).
    pub fn message(&self) -> String {
        asya_flow::trace::message(&self.flow, &self.decisions)
    }
}

/// The decisions of a hop whose envelope arrived with `before` decisions in its trail (0 when
/// the flow starts here) and leaves by `step`: the routed envelope's trail past them. The
/// trail keeps the last `asya_flow::MAX_TRAIL` decisions, so past that many this hop's can
/// no longer be told from earlier ones and only the flow is named. `None` for x-sump (its
/// reason says what happened) and outside a flow.
pub fn decided(before: usize, step: &FlowStep) -> Option<Decided> {
    let (FlowStep::Routed(sends) | FlowStep::Branches(sends)) = step else {
        return None;
    };
    let c = sends
        .iter()
        .find_map(|(_, e)| flow_routing::carried(e).and_then(Result::ok))?;
    let decisions = if c.trail.len() >= asya_flow::MAX_TRAIL && before >= asya_flow::MAX_TRAIL {
        Vec::new()
    } else {
        c.trail[before.min(c.trail.len())..].to_vec()
    };
    Some(Decided {
        flow: c.program.flow,
        decisions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use asya_flow::{Carried, Program};
    use asya_transport::envelope::Envelope;
    use serde_json::json;

    fn routed(trail: &[&str]) -> FlowStep {
        let program: Program = serde_json::from_value(json!({
            "ir": asya_flow::ir::IR_VERSION, "flow": "review_order", "version": "v1",
            "max_iterations": 100, "step_budget": 10000, "code": [{"return": {"line": 3}}]
        }))
        .unwrap();
        let mut c = Carried::new(program);
        c.trail = trail.iter().map(|s| s.to_string()).collect();
        let mut e: Envelope = serde_json::from_value(json!({
            "id": "e1", "route": {"actors": ["charge"], "current": 0}, "payload": {}
        }))
        .unwrap();
        e.extra.insert(
            asya_flow::ENVELOPE_FIELD.into(),
            serde_json::to_value(&c).unwrap(),
        );
        FlowStep::Routed(vec![("asya-ns-charge".into(), e)])
    }

    #[test]
    fn a_hop_decided_what_its_trail_gained() {
        let step = routed(&["14:else", "37:except PaymentDeclined", "38:else"]);
        let d = decided(1, &step).unwrap();
        assert_eq!(d.decisions, ["37:except PaymentDeclined", "38:else"]);
        assert_eq!(
            d.message(),
            "flow review_order: 37:except PaymentDeclined, 38:else"
        );
        // The flow started here: every decision is this hop's.
        assert_eq!(decided(0, &step).unwrap().decisions.len(), 3);
        // Nothing new: the flow is named, no decision.
        let none = decided(3, &step).unwrap();
        assert_eq!(none.message(), "flow review_order");
    }

    #[test]
    fn x_sump_and_a_full_trail_tell_no_decisions() {
        let sump = FlowStep::Sump {
            reason: "unhandled".into(),
            failure: None,
            metric: "flow_unhandled",
            instead: None,
        };
        assert_eq!(decided(0, &sump), None);
        let full: Vec<String> = (0..asya_flow::MAX_TRAIL)
            .map(|i| format!("{i}:if"))
            .collect();
        let full: Vec<&str> = full.iter().map(String::as_str).collect();
        let d = decided(asya_flow::MAX_TRAIL, &routed(&full)).unwrap();
        assert!(d.decisions.is_empty(), "{d:?}");
    }
}
