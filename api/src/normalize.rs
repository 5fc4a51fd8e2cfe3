//! Alias normalisation (docs/DESIGN.md §2): older field names are rewritten to the canonical ones,
//! and each rewrite is reported as a warning for the user. Setting an alias and its canonical
//! field to different values is an error, since either choice would silently drop one.

use crate::error::{FieldError, FieldErrors};
use crate::types::{AsyncActorSpec, ResiliencyRule};

/// What normalisation did and found.
#[derive(Debug, Default, PartialEq)]
pub struct Normalized {
    pub warnings: Vec<String>,
    pub errors: FieldErrors,
}

/// Moves `alias` into `canonical`, with a warning; conflicting values are an error.
fn fold<T: PartialEq + Clone + std::fmt::Debug + serde::Serialize>(
    out: &mut Normalized,
    prefix: &str,
    alias_name: &str,
    canonical_name: &str,
    alias: &mut Option<T>,
    canonical: &mut Option<T>,
) {
    let Some(value) = alias.take() else { return };
    match canonical {
        Some(existing) if *existing != value => out.errors.push(FieldError::invalid(
            format!("{prefix}{alias_name}"),
            serde_json::to_value(&value).unwrap_or_default(),
            format!(
                "is an alias of {prefix}{canonical_name}, which is set to {}; set only {prefix}{canonical_name}",
                serde_json::to_value(existing).unwrap_or_default()
            ),
        )),
        _ => {
            out.warnings.push(format!(
                "{prefix}{alias_name} is deprecated: rewritten to {prefix}{canonical_name}"
            ));
            *canonical = Some(value);
        }
    }
}

/// Rewrites every alias in `spec` in place. `prefix` is the path of the spec (`spec.`, or a
/// flavor's location) used in messages.
pub fn normalize_spec(spec: &mut AsyncActorSpec, prefix: &str) -> Normalized {
    let mut out = Normalized::default();

    if let Some(s) = spec.scaling.as_mut() {
        let p = format!("{prefix}scaling.");
        fold(
            &mut out,
            &p,
            "minReplicas",
            "minReplicaCount",
            &mut s.min_replicas,
            &mut s.min_replica_count,
        );
        fold(
            &mut out,
            &p,
            "maxReplicas",
            "maxReplicaCount",
            &mut s.max_replicas,
            &mut s.max_replica_count,
        );
    }

    if let Some(w) = spec.workload.as_mut() {
        fold(
            &mut out,
            &format!("{prefix}workload."),
            "type",
            "kind",
            &mut w.type_,
            &mut w.kind,
        );
    }

    if let Some(t) = spec.timeout.as_mut()
        && t.processing.is_some()
    {
        let res = spec.resiliency.get_or_insert_with(Default::default);
        let mut processing = t.processing.take();
        fold(
            &mut out,
            prefix,
            "timeout.processing",
            "resiliency.actorTimeout",
            &mut processing,
            &mut res.actor_timeout,
        );
        if t.graceful_shutdown.is_none() {
            spec.timeout = None;
        }
    }

    if let Some(res) = spec.resiliency.as_mut() {
        for (name, policy) in res.policies.iter_mut() {
            let p = format!("{prefix}resiliency.policies.{name}.");
            fold(
                &mut out,
                &p,
                "initialDelay",
                "initialInterval",
                &mut policy.initial_delay,
                &mut policy.initial_interval,
            );
        }
        if res.rules.iter().any(|r| !r.errors.is_empty()) {
            let mut rules = Vec::with_capacity(res.rules.len());
            for (i, rule) in std::mem::take(&mut res.rules).into_iter().enumerate() {
                if rule.errors.is_empty() {
                    rules.push(rule);
                    continue;
                }
                let path = format!("{prefix}resiliency.rules[{i}]");
                if rule.match_.is_some() {
                    out.errors.push(FieldError::invalid(
                        format!("{path}.errors"),
                        serde_json::to_value(&rule.errors).unwrap_or_default(),
                        "may not be set together with match; use one rule per match",
                    ));
                    rules.push(rule);
                    continue;
                }
                out.warnings.push(format!(
                    "{path}.errors is deprecated: rewritten to {} rules with one match each",
                    rule.errors.len()
                ));
                for m in &rule.errors {
                    rules.push(ResiliencyRule {
                        match_: Some(m.clone()),
                        errors: Vec::new(),
                        policy: rule.policy.clone(),
                        action: rule.action.clone(),
                    });
                }
            }
            res.rules = rules;
        }
    }

    for (i, r) in spec.secret_refs.iter_mut().enumerate() {
        fold(
            &mut out,
            &format!("{prefix}secretRefs[{i}]."),
            "secretName",
            "name",
            &mut r.secret_name,
            &mut r.name,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> AsyncActorSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn rewrites_every_alias_with_a_warning() {
        let mut s = spec(json!({
            "scaling": {"minReplicas": 0, "maxReplicas": 50},
            "workload": {"type": "StatefulSet"},
            "timeout": {"processing": 600},
            "resiliency": {
                "policies": {"transient": {"initialDelay": "1s"}},
                "rules": [{"errors": ["TimeoutError", "ConnectionError"], "policy": "transient"}]
            },
            "secretRefs": [{"secretName": "openai-creds"}]
        }));
        let n = normalize_spec(&mut s, "spec.");
        assert!(n.errors.is_empty(), "{:?}", n.errors);
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            json!({
                "scaling": {"minReplicaCount": 0, "maxReplicaCount": 50},
                "workload": {"kind": "StatefulSet"},
                "resiliency": {
                    "actorTimeout": "600s",
                    "policies": {"transient": {"initialInterval": "1s"}},
                    "rules": [
                        {"match": "TimeoutError", "policy": "transient"},
                        {"match": "ConnectionError", "policy": "transient"}
                    ]
                },
                "secretRefs": [{"name": "openai-creds"}]
            })
        );
        assert_eq!(n.warnings.len(), 7, "{:?}", n.warnings);
        assert!(n.warnings.contains(&"spec.scaling.minReplicas is deprecated: rewritten to spec.scaling.minReplicaCount".to_string()));
        assert!(n.warnings.contains(
            &"spec.workload.type is deprecated: rewritten to spec.workload.kind".to_string()
        ));
    }

    #[test]
    fn conflicting_alias_is_an_error() {
        let mut s = spec(json!({"scaling": {"minReplicas": 1, "minReplicaCount": 2}}));
        let n = normalize_spec(&mut s, "spec.");
        assert_eq!(
            n.errors.to_string(),
            "spec.scaling.minReplicas: Invalid value: 1: is an alias of spec.scaling.minReplicaCount, which is set to 2; set only spec.scaling.minReplicaCount"
        );
    }

    #[test]
    fn equal_alias_and_canonical_fold_quietly_into_one() {
        let mut s = spec(json!({"scaling": {"maxReplicas": 5, "maxReplicaCount": 5}}));
        let n = normalize_spec(&mut s, "spec.");
        assert!(n.errors.is_empty());
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            json!({"scaling": {"maxReplicaCount": 5}})
        );
    }

    #[test]
    fn errors_list_with_match_is_rejected() {
        let mut s = spec(
            json!({"resiliency": {"rules": [{"match": "A", "errors": ["B"], "action": "fail"}]}}),
        );
        let n = normalize_spec(&mut s, "spec.");
        assert_eq!(
            n.errors.to_string(),
            r#"spec.resiliency.rules[0].errors: Invalid value: ["B"]: may not be set together with match; use one rule per match"#
        );
    }

    #[test]
    fn normalising_twice_changes_nothing() {
        let mut s = spec(
            json!({"scaling": {"minReplicas": 0}, "timeout": {"processing": "5m", "gracefulShutdown": 30}}),
        );
        normalize_spec(&mut s, "spec.");
        let once = s.clone();
        let n = normalize_spec(&mut s, "spec.");
        assert_eq!(s, once);
        assert!(n.warnings.is_empty());
    }
}
