//! "An AsyncActor grants nothing its author does not have" (docs/DESIGN.md §9): the half of
//! AsyncActor validation that needs the API server's answers.
//!
//! The pure review ([`super::actor`]) admits an actor and leaves a [`PendingPrivilege`]: its
//! rendered pod and the requesting user. [`settle`] then asks an [`Authority`] two things:
//! the Pod Security level of the namespace (its `enforce` label, else `baseline`), which the
//! rendered pod must meet whoever writes it; and, when the pod has any privilege (hostPath,
//! privileged, host namespaces, added capabilities, another ServiceAccount, …), whether the
//! user may create the workload the provisioner will create for them (a SubjectAccessReview).
//! A user who may create Deployments keeps exactly that power; one who may only create
//! AsyncActors gets a plain pod. Every refusal names the field, the value and the missing
//! permission or level; when the Authority cannot answer, the actor is refused (fail closed).

use asya_api::ActorReview;
use asya_api::flavor::Origins;
use asya_api::privilege::{Finding, Level, RenderedPod};
use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::UserInfo;
use kube::core::admission::AdmissionResponse;
use kube::core::response::StatusCause;

use super::Handled;
use super::response::{deny, handled};

/// What the API server must still answer about an actor the pure review admitted.
#[derive(Debug)]
pub struct PendingPrivilege {
    pub namespace: String,
    pub name: String,
    pub user: UserInfo,
    /// The apps/v1 resource the provisioner creates for the actor (`deployments` or
    /// `statefulsets`): creating the actor creates one of these for the user.
    pub resource: &'static str,
    pub pod: RenderedPod,
    pub origins: Origins,
    /// The level of a namespace without the `enforce` label (`policy.defaultPodSecurityLevel`).
    pub default_level: Level,
}

impl PendingPrivilege {
    /// The question an admitted review leaves, `None` when it was refused (or resolved nothing).
    pub(super) fn of(
        review: &ActorReview,
        user: &UserInfo,
        default_level: Level,
    ) -> Option<Box<PendingPrivilege>> {
        if !review.allowed() {
            return None;
        }
        let actor = review.resolved.as_ref()?;
        let resource = match actor.workload_kind() {
            "StatefulSet" => "statefulsets",
            _ => "deployments",
        };
        Some(Box::new(PendingPrivilege {
            namespace: actor.namespace.clone(),
            name: actor.name.clone(),
            user: user.clone(),
            resource,
            pod: RenderedPod::of(actor),
            origins: review.origins.clone(),
            default_level,
        }))
    }
}

/// The SubjectAccessReview's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Access {
    Allowed,
    /// Denied (or no opinion), with the authorizer's reason when it gave one.
    Denied(Option<String>),
}

/// Why the API server could not answer.
#[derive(Debug, thiserror::Error)]
pub enum AuthorityError {
    #[error("cannot read namespace {namespace}: {reason}")]
    Namespace { namespace: String, reason: String },
    #[error("SubjectAccessReview failed: {0}")]
    Review(String),
}

/// The API server's answers that admission needs (crate::authority has the kube client's).
pub trait Authority: Send + Sync {
    /// The Pod Security level the namespace's `enforce` label sets (`None`: no label).
    fn level<'a>(
        &'a self,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Option<Level>, AuthorityError>>;

    /// Whether `user` may `create` `resource` (group `apps`) in `namespace`.
    fn may_create<'a>(
        &'a self,
        user: &'a UserInfo,
        namespace: &'a str,
        resource: &'a str,
    ) -> BoxFuture<'a, Result<Access, AuthorityError>>;
}

/// The final answer for an actor the pure review admitted: `h` as it is, or refused.
pub async fn settle(h: Handled, p: PendingPrivilege, auth: &dyn Authority) -> Handled {
    let level = match auth.level(&p.namespace).await {
        Ok(level) => level.unwrap_or(p.default_level),
        Err(e) => return refuse(h, unavailable(&p, &e)),
    };
    let violations = p.pod.level_violations(level, &p.origins);
    if !violations.is_empty() {
        return refuse(h, level_refusal(&p, level, &violations));
    }
    let privileges = p.pod.privileges(&p.origins);
    if privileges.is_empty() {
        return h;
    }
    match auth.may_create(&p.user, &p.namespace, p.resource).await {
        Ok(Access::Allowed) => h,
        Ok(Access::Denied(reason)) => refuse(h, access_refusal(&p, &privileges, reason)),
        Err(e) => refuse(h, unavailable(&p, &e)),
    }
}

/// A refusal: HTTP-like code, reason, message and causes.
#[derive(Debug, PartialEq)]
pub struct Refusal {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub causes: Vec<StatusCause>,
}

fn refuse(h: Handled, r: Refusal) -> Handled {
    let operation = h.operation;
    let mut review = h.review;
    let Some(resp) = review.response.take() else {
        return Handled { review, ..h };
    };
    let warnings = resp.warnings.clone();
    let mut denied: AdmissionResponse = deny(resp, r.code, r.reason, r.message, r.causes);
    denied.warnings = warnings;
    handled(denied, operation)
}

fn who(user: &UserInfo) -> &str {
    user.username.as_deref().unwrap_or("(unknown user)")
}

/// The permission whose absence a refusal names.
fn permission(p: &PendingPrivilege) -> String {
    format!("create {}.apps in namespace {}", p.resource, p.namespace)
}

/// The refusal of a pod with privileges its author may not grant.
pub fn access_refusal(
    p: &PendingPrivilege,
    privileges: &[Finding],
    reason: Option<String>,
) -> Refusal {
    let needs = format!(
        "needs permission to {} (the AsyncActor author cannot run privileged pods otherwise)",
        permission(p)
    );
    let causes: Vec<StatusCause> = privileges
        .iter()
        .map(|f| StatusCause {
            reason: "FieldValueForbidden".into(),
            message: format!("{}: {}: {needs}", f.value, f.rule.describe()),
            field: f.path.clone(),
        })
        .collect();
    let each: Vec<String> = privileges
        .iter()
        .map(|f| format!("{f}: {}: {needs}", f.rule.describe()))
        .collect();
    let why = reason
        .filter(|r| !r.is_empty())
        .map(|r| format!(" (authorizer: {r})"))
        .unwrap_or_default();
    Refusal {
        code: 403,
        reason: "Forbidden",
        message: format!(
            "AsyncActor {:?} is forbidden: user {:?} may not {}{why}, and the actor's pod has privileges only that permission grants: {}",
            p.name,
            who(&p.user),
            permission(p),
            each.join("; ")
        ),
        causes,
    }
}

/// The refusal of a pod that does not meet the namespace's Pod Security level.
pub fn level_refusal(p: &PendingPrivilege, level: Level, violations: &[String]) -> Refusal {
    Refusal {
        code: 403,
        reason: "Forbidden",
        message: format!(
            "AsyncActor {:?} is forbidden: its pod would violate PodSecurity \"{level}:latest\" of namespace {} (label {}, else policy.defaultPodSecurityLevel {}): {}",
            p.name,
            p.namespace,
            asya_api::privilege::ENFORCE_LABEL,
            p.default_level,
            violations.join("; ")
        ),
        causes: violations
            .iter()
            .map(|v| StatusCause {
                reason: "FieldValueForbidden".into(),
                message: v.clone(),
                field: v.split([':', '=', ' ']).next().unwrap_or_default().into(),
            })
            .collect(),
    }
}

/// The refusal when the API server cannot answer: fail closed, saying what to retry.
pub fn unavailable(p: &PendingPrivilege, e: &AuthorityError) -> Refusal {
    Refusal {
        code: 500,
        reason: "InternalError",
        message: format!(
            "AsyncActor {:?} refused: cannot check its pod against the namespace's Pod Security level and whether user {:?} may {} ({e}); retry, or see the webhook's logs",
            p.name,
            who(&p.user),
            permission(p)
        ),
        causes: vec![],
    }
}

/// An Authority for offline use (tests, `Shared::fixed`): namespaces carry no label (so the
/// policy's default level applies) and no SubjectAccessReview can be made (so privileges are
/// refused).
pub struct Offline;

impl Authority for Offline {
    fn level<'a>(
        &'a self,
        _namespace: &'a str,
    ) -> BoxFuture<'a, Result<Option<Level>, AuthorityError>> {
        Box::pin(async { Ok(None) })
    }

    fn may_create<'a>(
        &'a self,
        _user: &'a UserInfo,
        _namespace: &'a str,
        _resource: &'a str,
    ) -> BoxFuture<'a, Result<Access, AuthorityError>> {
        Box::pin(async { Err(AuthorityError::Review("no API server (offline)".into())) })
    }
}

#[cfg(test)]
mod tests;
