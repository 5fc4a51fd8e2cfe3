//! How a hop's flow decisions are told to the trace backend and the gateway, and read back by
//! `asya trace`: the sidecar writes them, the command line reads them; neither imports the
//! other, so the names and the message form live here.

/// Span attribute of a sidecar's `process` span: the flow the envelope is in.
pub const FLOW_ATTRIBUTE: &str = "asya.flow.name";
/// Span attribute of a sidecar's `process` span: the hop's decisions, joined by ", ".
pub const DECISIONS_ATTRIBUTE: &str = "asya.flow.decisions";

/// The message of a hop's `completed` progress report: `flow review_order: 37:except
/// PaymentDeclined, 38:else`, or `flow review_order` when the hop decided nothing.
pub fn message(flow: &str, decisions: &[String]) -> String {
    if decisions.is_empty() {
        format!("flow {flow}")
    } else {
        format!("flow {flow}: {}", decisions.join(", "))
    }
}

/// The decisions of a [`message`] (joined by ", "): `None` for another message or none taken.
pub fn decisions_of(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("flow ")?;
    let (_, decisions) = rest.split_once(": ")?;
    (!decisions.is_empty()).then_some(decisions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_gives_back_its_decisions() {
        let d = vec![
            "37:except PaymentDeclined".to_string(),
            "38:else".to_string(),
        ];
        let m = message("review_order", &d);
        assert_eq!(m, "flow review_order: 37:except PaymentDeclined, 38:else");
        assert_eq!(decisions_of(&m), Some("37:except PaymentDeclined, 38:else"));
        assert_eq!(message("review_order", &[]), "flow review_order");
        assert_eq!(decisions_of("flow review_order"), None);
        assert_eq!(decisions_of("at charge: 2 of 3"), None);
    }
}
