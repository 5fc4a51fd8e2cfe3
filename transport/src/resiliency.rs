//! Retry decisions (docs/DESIGN.md §4, seed 000): pure functions over the actor's `resiliency`.

use std::collections::BTreeMap;
use std::time::Duration;

use asya_api::types::Resiliency;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backoff {
    Constant,
    Linear,
    #[default]
    Exponential,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub name: String,
    pub max_attempts: u32,
    pub backoff: Backoff,
    pub initial: Duration,
    pub max: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RuleAction {
    Fail,
    Policy(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub pattern: String,
    pub action: RuleAction,
}

/// Validated, ready-to-use resiliency settings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub actor_timeout: Option<Duration>,
    pub policies: BTreeMap<String, Policy>,
    pub rules: Vec<Rule>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    #[error("not valid JSON for resiliency: {0}")]
    Json(String),
    #[error("{field}: {message}")]
    Field { field: String, message: String },
}

fn field_err(field: impl Into<String>, message: impl Into<String>) -> PlanError {
    PlanError::Field {
        field: field.into(),
        message: message.into(),
    }
}

/// `300s`, `5m`, `1h30m`, `500ms`, or a plain integer (seconds): the shared API's rule.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    asya_api::duration::parse_duration(s).map_err(|e| format!("{s:?}: {e}"))
}

impl Plan {
    pub fn from_json(json: &str) -> Result<Plan, PlanError> {
        let spec: Resiliency =
            serde_json::from_str(json).map_err(|e| PlanError::Json(e.to_string()))?;
        Plan::from_spec(&spec)
    }

    pub fn from_spec(spec: &Resiliency) -> Result<Plan, PlanError> {
        let actor_timeout = spec
            .actor_timeout
            .as_ref()
            .map(|s| parse_duration(s.as_str()).map_err(|e| field_err("actorTimeout", e)))
            .transpose()?;
        let mut policies = BTreeMap::new();
        for (name, p) in &spec.policies {
            let at = |f: &str| format!("policies.{name}.{f}");
            let max_attempts = p.max_attempts.unwrap_or(3);
            let max_attempts = u32::try_from(max_attempts)
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| field_err(at("maxAttempts"), "must be at least 1"))?;
            let backoff = match p.backoff.as_deref() {
                None | Some("exponential") => Backoff::Exponential,
                Some("linear") => Backoff::Linear,
                Some("constant") => Backoff::Constant,
                Some(other) => {
                    return Err(field_err(
                        at("backoff"),
                        format!("{other:?} is not constant, linear or exponential"),
                    ));
                }
            };
            // initialDelay is the older spelling; the webhook normally rewrites it.
            let initial = match p.initial_interval.as_ref().or(p.initial_delay.as_ref()) {
                Some(s) => {
                    parse_duration(s.as_str()).map_err(|e| field_err(at("initialInterval"), e))?
                }
                None => Duration::from_secs(1),
            };
            let max = match &p.max_interval {
                Some(s) => {
                    parse_duration(s.as_str()).map_err(|e| field_err(at("maxInterval"), e))?
                }
                None => Duration::from_secs(60).max(initial),
            };
            if initial > max {
                return Err(field_err(
                    at("initialInterval"),
                    "must not be greater than maxInterval",
                ));
            }
            policies.insert(
                name.clone(),
                Policy {
                    name: name.clone(),
                    max_attempts,
                    backoff,
                    initial,
                    max,
                },
            );
        }
        let mut rules = Vec::new();
        for (i, r) in spec.rules.iter().enumerate() {
            let action = match (r.action.as_deref(), &r.policy) {
                (Some("fail"), _) => RuleAction::Fail,
                (Some(other), _) if other != "retry" => {
                    return Err(field_err(
                        format!("rules[{i}].action"),
                        format!("unknown action {other:?} (expected fail)"),
                    ));
                }
                (_, Some(p)) if policies.contains_key(p) => RuleAction::Policy(p.clone()),
                (_, Some(p)) => {
                    return Err(field_err(
                        format!("rules[{i}].policy"),
                        format!("names policy {p:?}, which is not defined"),
                    ));
                }
                (_, None) => RuleAction::Policy("default".into()),
            };
            let patterns: Vec<String> = r.match_.iter().chain(r.errors.iter()).cloned().collect();
            if patterns.is_empty() {
                return Err(field_err(format!("rules[{i}].match"), "is required"));
            }
            for pattern in patterns {
                rules.push(Rule {
                    pattern,
                    action: action.clone(),
                });
            }
        }
        Ok(Plan {
            actor_timeout,
            policies,
            rules,
        })
    }
}

/// The error a handler call ended with, as the sidecar sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub code: String,
    pub error_type: String,
    pub message: String,
    pub traceback: Option<String>,
    /// The exception's class names, most derived first (the runtime's `details.mro`): a
    /// flow's `except` matches by them. Empty for failures of the sidecar's own.
    pub mro: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Try again after `delay`; `attempt` is the number of the attempt that just failed.
    Retry {
        delay: Duration,
        attempt: u32,
        policy: String,
    },
    /// Give up: to x-sump.
    Fail { reason: FailReason },
}

/// Why the rules gave up on a message. Its text (`Display`) travels in the x-sump envelope's
/// `x-asya-error.reason` and the gateway's final report, so it is part of the contract; the
/// sidecar labels its failure metric by the variant, never by the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailReason {
    /// A rule with `action: fail` matched the error.
    ActionFail { pattern: String },
    /// No rule named a policy and there is no `default` one.
    NoPolicy,
    /// The policy's attempts are used up.
    RetriesExhausted {
        attempt: u32,
        max_attempts: u32,
        policy: String,
    },
}

impl std::fmt::Display for FailReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FailReason::ActionFail { pattern } => {
                write!(f, "action fail: rule {pattern:?} matched")
            }
            FailReason::NoPolicy => f.write_str("no retry policy applies"),
            FailReason::RetriesExhausted {
                attempt,
                max_attempts,
                policy,
            } => write!(
                f,
                "retries exhausted: {attempt} of {max_attempts} attempts failed (policy {policy})"
            ),
        }
    }
}

/// Backoff before the attempt after `attempt` (1-based) failed.
pub fn backoff_delay(policy: &Policy, attempt: u32) -> Duration {
    let n = attempt.max(1);
    let d = match policy.backoff {
        Backoff::Constant => policy.initial,
        Backoff::Linear => policy.initial.saturating_mul(n),
        Backoff::Exponential => {
            let factor = 2u32.checked_pow(n - 1).unwrap_or(u32::MAX);
            policy.initial.saturating_mul(factor)
        }
    };
    d.min(policy.max)
}

/// Decides what to do after attempt number `attempt` (1-based) failed with `failure`.
pub fn decide(plan: &Plan, failure: &Failure, attempt: u32) -> Decision {
    let rule = plan
        .rules
        .iter()
        .find(|r| failure.error_type.contains(&r.pattern) || failure.message.contains(&r.pattern));
    let policy_name = match rule {
        Some(Rule {
            action: RuleAction::Fail,
            pattern,
        }) => {
            return Decision::Fail {
                reason: FailReason::ActionFail {
                    pattern: pattern.clone(),
                },
            };
        }
        Some(Rule {
            action: RuleAction::Policy(p),
            ..
        }) => p.as_str(),
        None => "default",
    };
    let Some(policy) = plan.policies.get(policy_name) else {
        return Decision::Fail {
            reason: FailReason::NoPolicy,
        };
    };
    if attempt >= policy.max_attempts {
        return Decision::Fail {
            reason: FailReason::RetriesExhausted {
                attempt,
                max_attempts: policy.max_attempts,
                policy: policy.name.clone(),
            },
        };
    }
    Decision::Retry {
        delay: backoff_delay(policy, attempt),
        attempt,
        policy: policy.name.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(t: &str, m: &str) -> Failure {
        Failure {
            code: "handler_error".into(),
            error_type: t.into(),
            message: m.into(),
            traceback: None,
            mro: Vec::new(),
        }
    }

    fn seed_plan() -> Plan {
        Plan::from_json(
            r#"{"actorTimeout":"120s","policies":{"default":{"maxAttempts":3,"backoff":"exponential","initialInterval":"1s","maxInterval":"60s"},
                "slow":{"maxAttempts":2,"backoff":"constant","initialInterval":"5s","maxInterval":"5s"}},
                "rules":[{"match":"RateLimitError","policy":"slow"},{"match":"ContentPolicyViolation","action":"fail"}]}"#,
        )
        .unwrap()
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("300s"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("42"), Ok(Duration::from_secs(42)));
        assert!(parse_duration("5 minutes").is_err());
    }

    #[test]
    fn plan_parses_seed_example() {
        let p = seed_plan();
        assert_eq!(p.actor_timeout, Some(Duration::from_secs(120)));
        assert_eq!(p.rules.len(), 2);
        assert_eq!(p.policies["default"].max_attempts, 3);
    }

    #[test]
    fn plan_rejections_name_the_field() {
        let e = Plan::from_json(r#"{"rules":[{"match":"X","policy":"nope"}]}"#).unwrap_err();
        assert!(e.to_string().contains("rules[0].policy"), "{e}");
        let e =
            Plan::from_json(r#"{"policies":{"p":{"initialInterval":"10s","maxInterval":"1s"}}}"#)
                .unwrap_err();
        assert!(e.to_string().contains("policies.p.initialInterval"), "{e}");
        let e = Plan::from_json(r#"{"policies":{"p":{"maxAttempts":0}}}"#).unwrap_err();
        assert!(e.to_string().contains("maxAttempts"), "{e}");
        let e = Plan::from_json(r#"{"policies":{"p":{"backoff":"random"}}}"#).unwrap_err();
        assert!(e.to_string().contains("policies.p.backoff"), "{e}");
        let e = Plan::from_json(r#"{"actorTimeout":"soon"}"#).unwrap_err();
        assert!(e.to_string().contains("actorTimeout"), "{e}");
    }

    #[test]
    fn errors_alias_expands_to_one_rule_per_match() {
        let p = Plan::from_json(r#"{"rules":[{"errors":["A","B"],"action":"fail"}]}"#).unwrap();
        assert_eq!(p.rules.len(), 2);
    }

    #[test]
    fn unmatched_error_uses_default_policy_then_exhausts() {
        let p = seed_plan();
        let f = failure("ValueError", "boom");
        assert_eq!(
            decide(&p, &f, 1),
            Decision::Retry {
                delay: Duration::from_secs(1),
                attempt: 1,
                policy: "default".into()
            }
        );
        assert!(
            matches!(decide(&p, &f, 2), Decision::Retry { delay, .. } if delay == Duration::from_secs(2))
        );
        assert!(
            matches!(decide(&p, &f, 3), Decision::Fail { reason } if reason.to_string().contains("retries exhausted"))
        );
        assert_eq!(
            decide(&p, &f, 3),
            Decision::Fail {
                reason: FailReason::RetriesExhausted {
                    attempt: 3,
                    max_attempts: 3,
                    policy: "default".into()
                }
            }
        );
    }

    #[test]
    fn rule_matches_type_or_message_in_order() {
        let p = seed_plan();
        let by_type = decide(&p, &failure("RateLimitError", "x"), 1);
        assert!(matches!(by_type, Decision::Retry { ref policy, .. } if policy == "slow"));
        let by_msg = decide(
            &p,
            &failure("RuntimeError", "ContentPolicyViolation: nsfw"),
            1,
        );
        assert!(
            matches!(by_msg, Decision::Fail { ref reason } if reason.to_string().contains("action fail"))
        );
        assert_eq!(
            by_msg,
            Decision::Fail {
                reason: FailReason::ActionFail {
                    pattern: "ContentPolicyViolation".into()
                }
            }
        );
    }

    #[test]
    fn no_policy_means_no_retry() {
        let d = decide(&Plan::default(), &failure("E", "m"), 1);
        assert!(matches!(d, Decision::Fail { .. }));
        assert_eq!(
            d,
            Decision::Fail {
                reason: FailReason::NoPolicy
            }
        );
    }

    #[test]
    fn fail_reasons_read_as_they_always_have() {
        // The text is in x-sump envelopes and final reports that tests and users match on.
        let exhausted = FailReason::RetriesExhausted {
            attempt: 3,
            max_attempts: 3,
            policy: "default".into(),
        };
        assert_eq!(
            exhausted.to_string(),
            "retries exhausted: 3 of 3 attempts failed (policy default)"
        );
        let rule = FailReason::ActionFail {
            pattern: "Content\"Policy".into(),
        };
        assert_eq!(
            rule.to_string(),
            "action fail: rule \"Content\\\"Policy\" matched"
        );
        assert_eq!(FailReason::NoPolicy.to_string(), "no retry policy applies");
    }

    #[test]
    fn backoff_shapes_and_cap() {
        let mk = |backoff| Policy {
            name: "p".into(),
            max_attempts: 10,
            backoff,
            initial: Duration::from_secs(2),
            max: Duration::from_secs(10),
        };
        let secs = |b, n| backoff_delay(&mk(b), n).as_secs();
        assert_eq!([1, 2, 3].map(|n| secs(Backoff::Constant, n)), [2, 2, 2]);
        assert_eq!(
            [1, 2, 3, 9].map(|n| secs(Backoff::Linear, n)),
            [2, 4, 6, 10]
        );
        assert_eq!(
            [1, 2, 3, 40].map(|n| secs(Backoff::Exponential, n)),
            [2, 4, 8, 10]
        );
    }

    proptest::proptest! {
        #[test]
        fn backoff_never_exceeds_max_and_never_below_initial(
            attempt in 1u32..200, init_ms in 1u64..10_000, extra in 0u64..100_000, kind in 0u8..3
        ) {
            let backoff = [Backoff::Constant, Backoff::Linear, Backoff::Exponential][kind as usize];
            let p = Policy { name: "p".into(), max_attempts: 3, backoff,
                initial: Duration::from_millis(init_ms), max: Duration::from_millis(init_ms + extra) };
            let d = backoff_delay(&p, attempt);
            proptest::prop_assert!(d <= p.max && d >= p.initial);
        }
    }
}
