//! Validation of an actor's effective spec (docs/DESIGN.md §2): every error at once, each naming
//! the field, the value and the rule.

use std::collections::BTreeSet;
use std::fmt::Display;
use std::sync::LazyLock;

use regex::Regex;
use serde_json::json;

// Leaf rules (`basics`), also named here for the crates that import them from `validate`.
pub use crate::basics::{PULL_POLICIES, is_dns_label};
use crate::config::ClusterConfig;
use crate::duration::DurationSpec;
use crate::error::{FieldError, FieldErrors};
use crate::flavor::{MAX_FLAVORS, MIN_FLAVOR_NAME_LEN};
use crate::labels;
use crate::naming;
use crate::resolved;
use crate::types::{AsyncActorSpec, Resiliency};

static HANDLER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$").expect("static regex")
});

pub const HANDLER_MODES: [&str; 2] = ["payload", "envelope"];
pub const BACKOFFS: [&str; 3] = ["constant", "linear", "exponential"];
pub const WORKLOAD_KINDS: [&str; 2] = ["Deployment", "StatefulSet"];
pub const RULE_ACTIONS: [&str; 1] = ["fail"];

/// What the validator needs besides the spec.
pub struct Context<'a> {
    /// metadata.namespace of the actor.
    pub namespace: &'a str,
    pub config: &'a ClusterConfig,
}

pub fn is_handler(s: &str) -> bool {
    HANDLER.is_match(s)
}

/// Validates a merged spec with defaults applied. `actor` and `transport` must already be
/// defaulted (the review pipeline does so).
pub fn validate_spec(spec: &AsyncActorSpec, ctx: &Context<'_>) -> FieldErrors {
    let mut e = FieldErrors::default();
    validate_identity(spec, ctx, &mut e);
    validate_flavor_list(&spec.flavors, &mut e);
    validate_shape(spec, &mut e);
    validate_enums(spec, &mut e);
    validate_scaling(spec, &mut e);
    if let Some(r) = &spec.resiliency {
        validate_resiliency(r, &mut e);
    }
    validate_lists(spec, ctx, &mut e);
    e
}

fn validate_identity(spec: &AsyncActorSpec, ctx: &Context<'_>, e: &mut FieldErrors) {
    let actor = spec.actor.as_deref().unwrap_or_default();
    if !is_dns_label(actor) {
        e.push(FieldError::invalid(
            "spec.actor",
            actor,
            "must be a DNS label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit",
        ));
    }
    let transport = spec.transport.as_deref().unwrap_or_default();
    match ctx.config.transports.get(transport) {
        Some(t) if t.enabled => {
            let queue = naming::actor_queue(ctx.namespace, actor);
            if t.is_sqs() && !naming::is_sqs_queue_name(&queue) {
                e.push(FieldError::invalid(
                    "spec.actor",
                    actor,
                    format!(
                        "queue name {queue:?} does not fit SQS: at most {} characters of [A-Za-z0-9_-] (namespace and actor together)",
                        naming::SQS_QUEUE_NAME_MAX
                    ),
                ));
            } else if t.is_rabbitmq() && queue.len() > naming::RABBITMQ_QUEUE_NAME_MAX {
                e.push(FieldError::invalid(
                    "spec.actor",
                    actor,
                    format!("queue name {queue:?} is longer than RabbitMQ's 255 bytes"),
                ));
            }
        }
        Some(_) => e.push(FieldError::invalid(
            "spec.transport",
            transport,
            format!(
                "transport is not enabled in this cluster (enabled: {})",
                ctx.config.enabled_transports().join(", ")
            ),
        )),
        None => e.push(FieldError::unsupported(
            "spec.transport",
            transport,
            &ctx.config.enabled_transports(),
        )),
    }
}

/// The checks on `spec.flavors` as a list, which need no flavor contents.
pub(crate) fn flavor_list_errors(flavors: &[String]) -> FieldErrors {
    let mut e = FieldErrors::default();
    validate_flavor_list(flavors, &mut e);
    e
}

fn validate_flavor_list(flavors: &[String], e: &mut FieldErrors) {
    if flavors.len() > MAX_FLAVORS {
        e.push(FieldError::too_many(
            "spec.flavors",
            flavors.len(),
            MAX_FLAVORS,
        ));
    }
    let mut seen = BTreeSet::new();
    for (i, f) in flavors.iter().enumerate() {
        if f.len() < MIN_FLAVOR_NAME_LEN {
            e.push(FieldError::invalid(
                format!("spec.flavors[{i}]"),
                f.as_str(),
                "must be at least 3 characters",
            ));
        }
        if !seen.insert(f) {
            e.push(FieldError::duplicate(
                format!("spec.flavors[{i}]"),
                f.as_str(),
            ));
        }
    }
}

fn non_empty(e: &mut FieldErrors, path: &str, value: Option<&str>) {
    if value.is_some_and(|v| v.trim().is_empty()) {
        e.push(FieldError::invalid(
            path,
            value.unwrap_or_default(),
            "must not be empty",
        ));
    }
}

fn check_handler(e: &mut FieldErrors, path: &str, handler: &str) {
    if !is_handler(handler) {
        e.push(FieldError::invalid(
            path,
            handler,
            "must be module.function or module.Class.method (Python identifiers joined by dots)",
        ));
    }
}

fn validate_shape(spec: &AsyncActorSpec, e: &mut FieldErrors) {
    non_empty(e, "spec.image", spec.image.as_deref());
    non_empty(e, "spec.handler", spec.handler.as_deref());
    non_empty(
        e,
        "spec.pythonExecutable",
        spec.python_executable.as_deref(),
    );
    let Some(w) = &spec.workload else {
        // Flat shape.
        if spec.image.is_none() {
            e.push(FieldError::required(
                "spec.image",
                "the container image with the handler code (or use spec.workload.template)",
            ));
        }
        match &spec.handler {
            None => e.push(FieldError::required(
                "spec.handler",
                "module.function or module.Class.method",
            )),
            Some(h) if !h.trim().is_empty() => check_handler(e, "spec.handler", h),
            Some(_) => {}
        }
        return;
    };
    if spec.image.is_some() {
        e.push(FieldError::forbidden("spec.image", "may not be set with spec.workload; set the image of the asya-runtime container in spec.workload.template"));
    }
    if let Some(r) = w.replicas.filter(|r| *r < 1) {
        e.push(FieldError::invalid(
            "spec.workload.replicas",
            r,
            "must be >= 1",
        ));
    }
    let kind = w.kind.as_deref().unwrap_or(resolved::DEFAULT_WORKLOAD_KIND);
    if !w.volume_claim_templates.is_empty() && kind != "StatefulSet" {
        e.push(FieldError::forbidden("spec.workload.volumeClaimTemplates", "only a StatefulSet workload has volume claim templates; set spec.workload.kind: StatefulSet"));
    }
    let tpl = "spec.workload.template";
    let Some(pod) = w.template.as_ref().and_then(|t| t.spec.as_ref()) else {
        e.push(FieldError::required(
            format!("{tpl}.spec"),
            "a pod template with a container named asya-runtime",
        ));
        return;
    };
    let Some((idx, c)) = pod
        .containers
        .iter()
        .enumerate()
        .find(|(_, c)| c.name == labels::RUNTIME_CONTAINER)
    else {
        let names: Vec<&str> = pod.containers.iter().map(|c| c.name.as_str()).collect();
        e.push(FieldError::required(
            format!("{tpl}.spec.containers"),
            format!(
                "a container named asya-runtime (found: {})",
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ),
        ));
        return;
    };
    let cpath = format!("{tpl}.spec.containers[{idx}]");
    match c.image.as_deref() {
        None => e.push(FieldError::required(
            format!("{cpath}.image"),
            "the image of the asya-runtime container",
        )),
        Some(i) => non_empty(e, &format!("{cpath}.image"), Some(i)),
    }
    if let Some(cmd) = &c.command {
        e.push(FieldError::forbidden(
            format!("{cpath}.command"),
            format!("{} is managed by Asya (it starts the Asya runtime); use spec.pythonExecutable to choose the interpreter", json!(cmd)),
        ));
    }
    let env_handler = c
        .env
        .iter()
        .flatten()
        .find(|v| v.name == labels::ENV_HANDLER)
        .and_then(|v| v.value.clone());
    match (&spec.handler, env_handler) {
        (Some(_), Some(_)) => e.push(FieldError::forbidden("spec.handler", "the handler is also set by ASYA_HANDLER in the asya-runtime container; set it in one place")),
        (None, Some(h)) => check_handler(e, &format!("{cpath}.env[ASYA_HANDLER].value"), &h),
        (Some(h), None) if !h.trim().is_empty() => check_handler(e, "spec.handler", h),
        (Some(_), None) => {}
        // The image may set ASYA_HANDLER itself (seed 004's hello-actor); the review warns.
        (None, None) => {}
    }
}

// `path` is formatted only for an error: most values are valid, and a path per field
// was a visible part of every validation.
fn one_of(e: &mut FieldErrors, path: impl Display, value: Option<&str>, allowed: &[&str]) {
    if let Some(v) = value
        && !allowed.contains(&v)
    {
        e.push(FieldError::unsupported(path.to_string(), v, allowed));
    }
}

fn validate_enums(spec: &AsyncActorSpec, e: &mut FieldErrors) {
    one_of(
        e,
        "spec.imagePullPolicy",
        spec.image_pull_policy.as_deref(),
        &PULL_POLICIES,
    );
    one_of(
        e,
        "spec.handlerMode",
        spec.handler_mode.as_deref(),
        &HANDLER_MODES,
    );
    one_of(
        e,
        "spec.workload.kind",
        spec.workload.as_ref().and_then(|w| w.kind.as_deref()),
        &WORKLOAD_KINDS,
    );
    one_of(
        e,
        "spec.sidecar.imagePullPolicy",
        spec.sidecar
            .as_ref()
            .and_then(|s| s.image_pull_policy.as_deref()),
        &PULL_POLICIES,
    );
    if let Some(r) = spec.replicas.filter(|r| *r < 1) {
        e.push(FieldError::invalid("spec.replicas", r, "must be >= 1"));
    }
}

fn validate_scaling(spec: &AsyncActorSpec, e: &mut FieldErrors) {
    let Some(s) = &spec.scaling else { return };
    let p = "spec.scaling";
    let min = s
        .min_replica_count
        .unwrap_or(resolved::DEFAULT_MIN_REPLICAS);
    let max = s
        .max_replica_count
        .unwrap_or(resolved::DEFAULT_MAX_REPLICAS);
    if min < 0 {
        e.push(FieldError::invalid(
            format!("{p}.minReplicaCount"),
            min,
            "must be >= 0",
        ));
    }
    if max < 1 {
        e.push(FieldError::invalid(
            format!("{p}.maxReplicaCount"),
            max,
            "must be >= 1",
        ));
    }
    if min > max && max >= 1 {
        e.push(FieldError::invalid(
            format!("{p}.minReplicaCount"),
            min,
            format!("must be <= maxReplicaCount ({max})"),
        ));
    }
    for (name, v) in [
        ("queueLength", s.queue_length),
        ("pollingInterval", s.polling_interval),
        ("cooldownPeriod", s.cooldown_period),
    ] {
        if let Some(v) = v.filter(|v| *v < 1) {
            e.push(FieldError::invalid(
                format!("{p}.{name}"),
                v,
                "must be >= 1",
            ));
        }
    }
}

fn duration(
    e: &mut FieldErrors,
    path: impl Display,
    d: Option<&DurationSpec>,
) -> Option<std::time::Duration> {
    let d = d?;
    match d.parse() {
        Ok(v) if v.is_zero() => {
            e.push(FieldError::invalid(
                path.to_string(),
                d.as_str(),
                "must be greater than zero",
            ));
            None
        }
        Ok(v) => Some(v),
        Err(err) => {
            e.push(FieldError::invalid(
                path.to_string(),
                d.as_str(),
                err.to_string(),
            ));
            None
        }
    }
}

fn validate_resiliency(r: &Resiliency, e: &mut FieldErrors) {
    let p = "spec.resiliency";
    duration(
        e,
        format_args!("{p}.actorTimeout"),
        r.actor_timeout.as_ref(),
    );
    for (name, pol) in &r.policies {
        // The policy's path, formatted only for an error.
        let pp = format_args!("{p}.policies.{name}");
        if let Some(m) = pol.max_attempts.filter(|m| *m < 1) {
            e.push(FieldError::invalid(
                format!("{pp}.maxAttempts"),
                m,
                "must be >= 1",
            ));
        }
        one_of(
            e,
            format_args!("{pp}.backoff"),
            pol.backoff.as_deref(),
            &BACKOFFS,
        );
        let initial = duration(
            e,
            format_args!("{pp}.initialInterval"),
            pol.initial_interval.as_ref(),
        );
        let max = duration(
            e,
            format_args!("{pp}.maxInterval"),
            pol.max_interval.as_ref(),
        );
        if let (Some(i), Some(m)) = (initial, max)
            && i > m
        {
            e.push(FieldError::invalid(
                format!("{pp}.initialInterval"),
                pol.initial_interval
                    .as_ref()
                    .map(DurationSpec::as_str)
                    .unwrap_or_default(),
                format!(
                    "must be <= maxInterval ({})",
                    pol.max_interval
                        .as_ref()
                        .map(DurationSpec::as_str)
                        .unwrap_or_default()
                ),
            ));
        }
    }
    for (i, rule) in r.rules.iter().enumerate() {
        let rp = format_args!("{p}.rules[{i}]");
        match rule.match_.as_deref() {
            None => e.push(FieldError::required(
                format!("{rp}.match"),
                "the error type or message text this rule matches",
            )),
            Some(m) if m.is_empty() => e.push(FieldError::invalid(
                format!("{rp}.match"),
                m,
                "must not be empty",
            )),
            Some(_) => {}
        }
        one_of(
            e,
            format_args!("{rp}.action"),
            rule.action.as_deref(),
            &RULE_ACTIONS,
        );
        match (&rule.policy, &rule.action) {
            (Some(_), Some(_)) => e.push(FieldError::forbidden(
                format!("{rp}.policy"),
                "may not be set with action: fail",
            )),
            (Some(pol), None) if !r.policies.contains_key(pol) => {
                let known: Vec<&str> = r.policies.keys().map(String::as_str).collect();
                e.push(FieldError::invalid(
                    format!("{rp}.policy"),
                    pol.as_str(),
                    format!(
                        "no such policy in spec.resiliency.policies (defined: {})",
                        if known.is_empty() {
                            "none".into()
                        } else {
                            known.join(", ")
                        }
                    ),
                ));
            }
            (None, None) => e.push(FieldError::required(
                format!("{rp}.policy"),
                "a policy name, or action: fail",
            )),
            _ => {}
        }
    }
}

fn validate_lists(spec: &AsyncActorSpec, ctx: &Context<'_>, e: &mut FieldErrors) {
    for (i, r) in spec.secret_refs.iter().enumerate() {
        if r.name.as_deref().is_none_or(str::is_empty) {
            e.push(FieldError::required(
                format!("spec.secretRefs[{i}].name"),
                "the secret's name",
            ));
        }
    }
    e.extend(crate::state_proxy::validate(
        &spec.state_proxy,
        &ctx.config.state_proxy,
    ));
}
