//! Errors as a flow sees them: Python exceptions matched by type and bases, as `except` does.

use serde::{Deserialize, Serialize};

/// An exception raised by a handler (reported by the runtime with its MRO), by an expression
/// of the flow (`KeyError` on a missing key) or by `raise`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowError {
    #[serde(rename = "type")]
    pub error_type: String,
    /// The class names of the exception's MRO, most derived first (`type(e).__mro__`).
    #[serde(default)]
    pub mro: Vec<String>,
    #[serde(default)]
    pub message: String,
    /// The flow line that raised it (0: a handler).
    #[serde(default)]
    pub line: u32,
}

impl FlowError {
    /// An exception of a builtin (or unknown) type raised by the flow itself.
    pub fn raised(error_type: &str, message: impl Into<String>, line: u32) -> FlowError {
        FlowError {
            error_type: error_type.to_string(),
            mro: builtin_mro(error_type),
            message: message.into(),
            line,
        }
    }

    /// Whether an `except` clause naming `types` catches it: one of them is the exception's
    /// type or one of its bases. Without an MRO (an old runtime) the type alone counts, plus
    /// `Exception`/`BaseException`, which every handler error derives from.
    pub fn matches(&self, types: &[String]) -> bool {
        types.iter().any(|t| {
            t == &self.error_type
                || self.mro.iter().any(|m| m == t)
                || (self.mro.is_empty() && (t == "Exception" || t == "BaseException"))
        })
    }
}

/// The MRO of a builtin exception by its name (the ones a flow's own expressions raise and
/// the common ones a flow raises); an unknown name is taken as a direct `Exception` subclass,
/// as a class the flow file would define.
pub fn builtin_mro(name: &str) -> Vec<String> {
    const PARENTS: &[(&str, &str)] = &[
        ("Exception", "BaseException"),
        ("ArithmeticError", "Exception"),
        ("ZeroDivisionError", "ArithmeticError"),
        ("OverflowError", "ArithmeticError"),
        ("LookupError", "Exception"),
        ("KeyError", "LookupError"),
        ("IndexError", "LookupError"),
        ("TypeError", "Exception"),
        ("ValueError", "Exception"),
        ("RuntimeError", "Exception"),
        ("NotImplementedError", "RuntimeError"),
        ("AssertionError", "Exception"),
        ("OSError", "Exception"),
        ("ConnectionError", "OSError"),
        ("TimeoutError", "OSError"),
        ("PermissionError", "OSError"),
        ("FileNotFoundError", "OSError"),
    ];
    let mut out = vec![name.to_string()];
    let mut at = name;
    while at != "BaseException" {
        match PARENTS.iter().find(|(c, _)| *c == at) {
            Some((_, parent)) => {
                out.push(parent.to_string());
                at = parent;
            }
            None => {
                out.extend(["Exception".to_string(), "BaseException".to_string()]);
                break;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn builtin_hierarchy_and_unknown_classes() {
        assert_eq!(
            builtin_mro("KeyError"),
            names(&["KeyError", "LookupError", "Exception", "BaseException"])
        );
        assert_eq!(
            builtin_mro("PaymentDeclined"),
            names(&["PaymentDeclined", "Exception", "BaseException"])
        );
        assert_eq!(builtin_mro("BaseException"), names(&["BaseException"]));
    }

    #[test]
    fn except_matches_by_type_and_bases() {
        // A handler's own class: the runtime sends its MRO.
        let e = FlowError {
            error_type: "CardExpired".into(),
            mro: names(&[
                "CardExpired",
                "PaymentError",
                "ValueError",
                "Exception",
                "BaseException",
            ]),
            message: "m".into(),
            line: 0,
        };
        assert!(e.matches(&names(&["PaymentError"])));
        assert!(e.matches(&names(&["KeyError", "ValueError"])));
        assert!(e.matches(&names(&["Exception"])));
        assert!(!e.matches(&names(&["KeyError"])));
        assert!(!e.matches(&names(&["ConnectionError"])));
        // No MRO (a sidecar-side failure such as ActorTimeout): its type, or Exception.
        let t = FlowError {
            error_type: "ActorTimeout".into(),
            mro: vec![],
            message: String::new(),
            line: 0,
        };
        assert!(t.matches(&names(&["ActorTimeout"])));
        assert!(t.matches(&names(&["Exception"])));
        assert!(!t.matches(&names(&["TimeoutError"])));
    }
}
