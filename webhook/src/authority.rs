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
/// How long a SubjectAccessReview's answer is reused for the same question: a bulk apply of
/// one author's actors asks once, and a role granted or revoked applies within this.
pub const ACCESS_TTL: Duration = Duration::from_secs(10);
/// Answers remembered at most (one per user, namespace and resource asked within the TTL);
/// past it the expired ones go, and if none has, the memo starts over.
pub const ACCESS_MAX: usize = 4096;

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

/// Everything a SubjectAccessReview of [`create_review`] asks: two questions with the same
/// key are the same question, whatever else differs in the admission requests.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct AccessKey {
    user: Option<String>,
    uid: Option<String>,
    groups: Option<Vec<String>>,
    extra: Option<std::collections::BTreeMap<String, Vec<String>>>,
    namespace: String,
    verb: &'static str,
    group: &'static str,
    resource: String,
}

impl AccessKey {
    fn new(user: &UserInfo, namespace: &str, resource: &str) -> Self {
        Self {
            user: user.username.clone(),
            uid: user.uid.clone(),
            groups: user.groups.clone(),
            extra: user.extra.clone(),
            namespace: namespace.to_string(),
            verb: "create",
            group: "apps",
            resource: resource.to_string(),
        }
    }
}

/// The clock the memo reads (a test's own, to step past the TTL without waiting).
pub type Clock = Box<dyn Fn() -> Instant + Send + Sync>;

/// An [`Authority`] whose SubjectAccessReview answers, allowed and denied alike, are kept
/// for [`ACCESS_TTL`] per [`AccessKey`]; failures are not kept (the next request asks
/// again). Namespace levels pass through (the inner authority keeps those itself).
pub struct RememberedAccess<A> {
    inner: A,
    clock: Clock,
    answers: Mutex<HashMap<AccessKey, (Access, Instant)>>,
}

impl<A: Authority> RememberedAccess<A> {
    pub fn new(inner: A) -> Self {
        Self::with_clock(inner, Box::new(Instant::now))
    }

    pub fn with_clock(inner: A, clock: Clock) -> Self {
        Self {
            inner,
            clock,
            answers: Mutex::new(HashMap::new()),
        }
    }

    fn remembered(&self, key: &AccessKey, now: Instant) -> Option<Access> {
        let m = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        m.get(key)
            .filter(|(_, at)| now.saturating_duration_since(*at) < ACCESS_TTL)
            .map(|(a, _)| a.clone())
    }

    fn remember(&self, key: AccessKey, access: Access, now: Instant) {
        let mut m = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() >= ACCESS_MAX {
            m.retain(|_, (_, at)| now.saturating_duration_since(*at) < ACCESS_TTL);
            if m.len() >= ACCESS_MAX {
                m.clear();
            }
        }
        m.insert(key, (access, now));
    }

    async fn ask(
        &self,
        user: &UserInfo,
        namespace: &str,
        resource: &str,
    ) -> Result<Access, AuthorityError> {
        let key = AccessKey::new(user, namespace, resource);
        if let Some(a) = self.remembered(&key, (self.clock)()) {
            return Ok(a);
        }
        let access = self.inner.may_create(user, namespace, resource).await?;
        // Stamped when the answer came: it is that old, not as old as the question.
        self.remember(key, access.clone(), (self.clock)());
        Ok(access)
    }

    /// Answers kept (expired ones included until they are dropped).
    pub fn len(&self) -> usize {
        self.answers.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<A: Authority> Authority for RememberedAccess<A> {
    fn level<'a>(
        &'a self,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Option<Level>, AuthorityError>> {
        self.inner.level(namespace)
    }

    fn may_create<'a>(
        &'a self,
        user: &'a UserInfo,
        namespace: &'a str,
        resource: &'a str,
    ) -> BoxFuture<'a, Result<Access, AuthorityError>> {
        Box::pin(self.ask(user, namespace, resource))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Answers each SubjectAccessReview from `answer` and counts them.
    struct Counting {
        asked: Arc<AtomicUsize>,
        answer: Result<Access, String>,
    }

    impl Authority for Counting {
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
            self.asked.fetch_add(1, Ordering::SeqCst);
            let r = self.answer.clone().map_err(AuthorityError::Review);
            Box::pin(async move { r })
        }
    }

    /// A memo over a counting authority, on a clock the test moves.
    fn memo(
        answer: Result<Access, String>,
    ) -> (
        RememberedAccess<Counting>,
        Arc<AtomicUsize>,
        Arc<Mutex<Instant>>,
    ) {
        let asked = Arc::new(AtomicUsize::new(0));
        let now = Arc::new(Mutex::new(Instant::now()));
        let clock = now.clone();
        let m = RememberedAccess::with_clock(
            Counting {
                asked: asked.clone(),
                answer,
            },
            Box::new(move || *clock.lock().unwrap()),
        );
        (m, asked, now)
    }

    fn alice() -> UserInfo {
        UserInfo {
            username: Some("alice".into()),
            uid: Some("42".into()),
            groups: Some(vec!["devs".into()]),
            extra: Some(BTreeMap::from([("scopes".into(), vec!["s".into()])])),
        }
    }

    #[test]
    fn the_same_question_within_the_ttl_asks_nothing_and_after_it_asks_again() {
        for answer in [Access::Allowed, Access::Denied(Some("no".into()))] {
            let (m, asked, now) = memo(Ok(answer.clone()));
            let ask = || futures::executor::block_on(m.may_create(&alice(), "team", "deployments"));
            assert_eq!(ask().unwrap(), answer);
            assert_eq!(asked.load(Ordering::SeqCst), 1);
            *now.lock().unwrap() += ACCESS_TTL - Duration::from_millis(1);
            assert_eq!(ask().unwrap(), answer);
            assert_eq!(asked.load(Ordering::SeqCst), 1, "within the TTL: not asked");
            *now.lock().unwrap() += Duration::from_millis(1);
            assert_eq!(ask().unwrap(), answer);
            assert_eq!(asked.load(Ordering::SeqCst), 2, "expired: asked again");
        }
    }

    #[test]
    fn every_part_of_the_question_is_part_of_the_key_and_failures_are_not_kept() {
        let (m, asked, _) = memo(Ok(Access::Allowed));
        let ask = |u: &UserInfo, ns: &str, res: &str| {
            futures::executor::block_on(m.may_create(u, ns, res)).unwrap();
        };
        ask(&alice(), "team", "deployments");
        let mut n = 1;
        let variants: [fn(&mut UserInfo); 4] = [
            (|u| u.username = Some("mallory".into())),
            (|u| u.uid = Some("43".into())),
            (|u| u.groups = Some(vec!["devs".into(), "admins".into()])),
            (|u| u.extra = None),
        ];
        for change in variants {
            let mut u = alice();
            change(&mut u);
            ask(&u, "team", "deployments");
            n += 1;
            assert_eq!(asked.load(Ordering::SeqCst), n, "{u:?}");
        }
        ask(&alice(), "other", "deployments");
        ask(&alice(), "team", "statefulsets");
        assert_eq!(asked.load(Ordering::SeqCst), n + 2);
        // And the first question once more: still remembered.
        ask(&alice(), "team", "deployments");
        assert_eq!(asked.load(Ordering::SeqCst), n + 2);

        let (m, asked, _) = memo(Err("connection refused".into()));
        for _ in 0..2 {
            assert!(
                futures::executor::block_on(m.may_create(&alice(), "team", "deployments")).is_err()
            );
        }
        assert_eq!(asked.load(Ordering::SeqCst), 2);
        assert!(m.is_empty());
    }

    #[test]
    fn the_memo_stays_bounded_dropping_expired_answers_first() {
        let (m, asked, now) = memo(Ok(Access::Allowed));
        let user = |i: usize| UserInfo {
            username: Some(format!("user-{i}")),
            ..alice()
        };
        let ask = |i: usize| {
            futures::executor::block_on(m.may_create(&user(i), "team", "deployments")).unwrap();
        };
        let half = ACCESS_MAX / 2;
        (0..half).for_each(ask);
        *now.lock().unwrap() += Duration::from_secs(6);
        (half..ACCESS_MAX).for_each(ask);
        assert_eq!(m.len(), ACCESS_MAX);
        // The first half has expired, the second not: one more question drops only the first.
        *now.lock().unwrap() += Duration::from_secs(5);
        ask(ACCESS_MAX);
        assert_eq!(m.len(), ACCESS_MAX - half + 1);
        let before = asked.load(Ordering::SeqCst);
        ask(ACCESS_MAX - 1);
        assert_eq!(
            asked.load(Ordering::SeqCst),
            before,
            "a live answer was kept"
        );
        // Full of live answers: it starts over rather than grow.
        (ACCESS_MAX + 1..2 * ACCESS_MAX).for_each(ask);
        assert!(m.len() <= ACCESS_MAX, "{}", m.len());
    }

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
