//! What can go wrong, each naming what was asked, of whom, and what to do; and the exit code
//! of each kind (documented in cli/README.md, so scripts can branch on them).

use std::process::ExitCode;

/// Exit codes. 1 is "the command ran and some of it failed" (a redrive with refusals, a
/// `send --wait` that ended in x-sump), so scripts can tell it from a usage error or an
/// unreachable cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Ok = 0,
    Failed = 1,
    Usage = 2,
    NotFound = 3,
    Forbidden = 4,
    Unavailable = 5,
    Timeout = 6,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e as u8)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    /// The API server refused a read: which verb on which resource where, and who to ask.
    #[error(
        "forbidden: you may not {verb} {resource} {name:?} in namespace {namespace:?} ({why}); ask your cluster admin for a Role with `{verb}` on `{resource}` there{hint}"
    )]
    Forbidden {
        verb: &'static str,
        resource: &'static str,
        name: String,
        namespace: String,
        why: String,
        hint: &'static str,
    },
    #[error("{what} not found: {why}")]
    NotFound { what: String, why: String },
    #[error("the broker refused {action} on {target:?} as {user:?}: {why}")]
    BrokerRefused {
        action: &'static str,
        target: String,
        user: String,
        why: String,
    },
    #[error("{what} is unreachable: {why}")]
    Unavailable { what: String, why: String },
    #[error("timed out after {secs}s waiting for {what}")]
    Timeout { secs: u64, what: String },
    #[error("{0}")]
    Failed(String),
}

impl CliError {
    pub fn exit(&self) -> Exit {
        match self {
            CliError::Usage(_) => Exit::Usage,
            CliError::Forbidden { .. } | CliError::BrokerRefused { .. } => Exit::Forbidden,
            CliError::NotFound { .. } => Exit::NotFound,
            CliError::Unavailable { .. } => Exit::Unavailable,
            CliError::Timeout { .. } => Exit::Timeout,
            CliError::Failed(_) => Exit::Failed,
        }
    }

    /// An AMQP error as the CLI says it: RabbitMQ's 403 ACCESS_REFUSED is a permission the
    /// namespace's user lacks (docs/DESIGN.md §9), 404 a queue that does not exist, anything
    /// else the broker being away.
    pub fn from_amqp(
        action: &'static str,
        target: &str,
        user: &str,
        e: impl std::fmt::Display,
    ) -> CliError {
        let why = e.to_string();
        if why.contains("ACCESS_REFUSED") || why.contains("403") {
            CliError::BrokerRefused {
                action,
                target: target.to_string(),
                user: user.to_string(),
                why,
            }
        } else if why.contains("NOT_FOUND") || why.contains("404") {
            CliError::NotFound {
                what: format!("queue {target:?}"),
                why,
            }
        } else {
            CliError::Unavailable {
                what: "RabbitMQ".into(),
                why: format!("{action} on {target:?}: {why}"),
            }
        }
    }
}

pub type Result<T> = std::result::Result<T, CliError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_code() {
        assert_eq!(CliError::Usage("x".into()).exit(), Exit::Usage);
        assert_eq!(
            CliError::from_amqp(
                "consume",
                "q",
                "u",
                "ACCESS_REFUSED - access to queue denied"
            )
            .exit(),
            Exit::Forbidden
        );
        assert_eq!(
            CliError::from_amqp("consume", "q", "u", "NOT_FOUND - no queue 'q'").exit(),
            Exit::NotFound
        );
        assert_eq!(
            CliError::from_amqp("consume", "q", "u", "connection reset").exit(),
            Exit::Unavailable
        );
        assert_eq!(ExitCode::from(Exit::Timeout), ExitCode::from(6));
    }

    #[test]
    fn a_forbidden_read_names_verb_resource_and_namespace() {
        let e = CliError::Forbidden {
            verb: "get",
            resource: "secrets",
            name: "asya-broker-rabbitmq".into(),
            namespace: "team".into(),
            why: "User \"bob\" cannot get resource \"secrets\"".into(),
            hint: "",
        };
        let m = e.to_string();
        assert!(
            m.starts_with(
                "forbidden: you may not get secrets \"asya-broker-rabbitmq\" in namespace \"team\""
            ),
            "{m}"
        );
    }
}
