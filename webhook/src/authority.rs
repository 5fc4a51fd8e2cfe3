//! The API server's answers for [`crate::admission::privilege`]: a namespace's Pod Security
//! level (its labels, read with a GET and kept briefly) and SubjectAccessReviews. The only
//! API calls admission makes; each bounded in time, failures reported (admission then
//! refuses).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use asya_api::privilege::Level;
use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::PostParams;

use crate::admission::privilege::{Access, Authority, AuthorityError};

/// How long a namespace's level is reused: a label an admin tightens applies within this.
pub const LEVEL_TTL: Duration = Duration::from_secs(10);
/// Namespaces remembered at most; past it the memo starts over.
const LEVEL_MAX: usize = 1024;
/// Each call's bound: the API server gives the whole admission 10 s.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

pub struct KubeAuthority {
    client: kube::Client,
    levels: Mutex<HashMap<String, (Option<Level>, Instant)>>,
}

impl KubeAuthority {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            levels: Mutex::new(HashMap::new()),
        }
    }

    fn remembered(&self, namespace: &str) -> Option<Option<Level>> {
        let m = self.levels.lock().unwrap_or_else(|e| e.into_inner());
        m.get(namespace)
            .filter(|(_, at)| at.elapsed() < LEVEL_TTL)
            .map(|(l, _)| *l)
    }

    fn remember(&self, namespace: &str, level: Option<Level>) {
        let mut m = self.levels.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() >= LEVEL_MAX {
            m.clear();
        }
        m.insert(namespace.to_string(), (level, Instant::now()));
    }

    async fn read_level(&self, namespace: &str) -> Result<Option<Level>, AuthorityError> {
        if let Some(l) = self.remembered(namespace) {
            return Ok(l);
        }
        let err = |reason: String| AuthorityError::Namespace {
            namespace: namespace.to_string(),
            reason,
        };
        let api: Api<Namespace> = Api::all(self.client.clone());
        let ns = tokio::time::timeout(CALL_TIMEOUT, api.get_opt(namespace))
            .await
            .map_err(|_| err(format!("no answer within {CALL_TIMEOUT:?}")))?
            .map_err(|e| err(e.to_string()))?;
        // A namespace not found (yet): no label, so the policy's default level.
        let level = Level::labelled(ns.as_ref().and_then(|n| n.metadata.labels.as_ref()));
        self.remember(namespace, level);
        Ok(level)
    }

    async fn review(
        &self,
        user: &UserInfo,
        namespace: &str,
        resource: &str,
    ) -> Result<Access, AuthorityError> {
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let sar = create_review(user, namespace, resource);
        let answer = tokio::time::timeout(CALL_TIMEOUT, api.create(&PostParams::default(), &sar))
            .await
            .map_err(|_| AuthorityError::Review(format!("no answer within {CALL_TIMEOUT:?}")))?
            .map_err(|e| AuthorityError::Review(e.to_string()))?;
        Ok(access(answer.status.unwrap_or_default()))
    }
}

/// The question: may `user` (as the API server authenticated them: name, uid, groups,
/// extra) `create` `resource` of group `apps` in `namespace`?
pub fn create_review(user: &UserInfo, namespace: &str, resource: &str) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            groups: user.groups.clone(),
            uid: user.uid.clone(),
            extra: user.extra.clone(),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_string()),
                verb: Some("create".into()),
                group: Some("apps".into()),
                resource: Some(resource.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The answer. Not allowed is refused either way; an evaluation error (often a binding to a
/// role that does not exist) is shown as the reason when the authorizers gave none.
pub fn access(status: SubjectAccessReviewStatus) -> Access {
    if status.allowed {
        return Access::Allowed;
    }
    let reason = status
        .reason
        .filter(|r| !r.is_empty())
        .or(status.evaluation_error.filter(|e| !e.is_empty()));
    Access::Denied(reason)
}

impl Authority for KubeAuthority {
    fn level<'a>(
        &'a self,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Option<Level>, AuthorityError>> {
        Box::pin(self.read_level(namespace))
    }

    fn may_create<'a>(
        &'a self,
        user: &'a UserInfo,
        namespace: &'a str,
        resource: &'a str,
    ) -> BoxFuture<'a, Result<Access, AuthorityError>> {
        Box::pin(self.review(user, namespace, resource))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn the_review_asks_for_the_requesting_user_as_authenticated() {
        let user = UserInfo {
            username: Some("alice".into()),
            uid: Some("42".into()),
            groups: Some(vec!["devs".into(), "system:authenticated".into()]),
            extra: Some(BTreeMap::from([("scopes".into(), vec!["s".into()])])),
        };
        let sar = create_review(&user, "team", "statefulsets");
        let spec = &sar.spec;
        assert_eq!(spec.user.as_deref(), Some("alice"));
        assert_eq!(spec.uid.as_deref(), Some("42"));
        assert_eq!(spec.groups, user.groups);
        assert_eq!(spec.extra, user.extra);
        let ra = spec.resource_attributes.as_ref().unwrap();
        assert_eq!(
            (
                ra.namespace.as_deref(),
                ra.verb.as_deref(),
                ra.group.as_deref(),
                ra.resource.as_deref()
            ),
            (
                Some("team"),
                Some("create"),
                Some("apps"),
                Some("statefulsets")
            )
        );
        assert!(ra.name.is_none() && ra.subresource.is_none());
    }

    #[test]
    fn only_allowed_allows() {
        let st = |allowed, reason: Option<&str>, err: Option<&str>| SubjectAccessReviewStatus {
            allowed,
            reason: reason.map(str::to_string),
            evaluation_error: err.map(str::to_string),
            ..Default::default()
        };
        assert_eq!(access(st(true, None, None)), Access::Allowed);
        assert_eq!(access(st(false, None, None)), Access::Denied(None));
        assert_eq!(
            access(st(false, Some(""), Some("role x not found"))),
            Access::Denied(Some("role x not found".into()))
        );
        assert_eq!(
            access(st(false, Some("no"), Some("e"))),
            Access::Denied(Some("no".into()))
        );
    }
}
