//! Admission's privilege check (`admission/privilege.rs`) against a fake authority: a plain
//! actor asks nothing, a privilege needs the author's right to create the workload (asked by
//! SubjectAccessReview), the namespace's level binds everybody, no answer refuses.

use std::collections::HashMap;
use std::sync::Mutex;

use asya_api::config::ClusterConfig;
use asya_api::flavor::{FlavorCatalog, FlavorDef, FlavorSource};
use futures::executor::block_on;
use serde_json::{Value, json};

use super::*;
use crate::admission::{Ctx, Endpoint, handle, handle_general};

/// An Authority with fixed answers that records the SubjectAccessReviews asked.
struct Fake {
    level: Result<Option<Level>, String>,
    access: Result<Access, String>,
    asked: Mutex<Vec<(UserInfo, String, String)>>,
}

impl Fake {
    fn new(level: Level, access: Access) -> Self {
        Fake {
            level: Ok(Some(level)),
            access: Ok(access),
            asked: Mutex::new(Vec::new()),
        }
    }
    /// A namespace without the `enforce` label.
    fn unlabelled(access: Access) -> Self {
        Fake {
            level: Ok(None),
            access: Ok(access),
            asked: Mutex::new(Vec::new()),
        }
    }
    fn asked(&self) -> Vec<(UserInfo, String, String)> {
        self.asked.lock().unwrap().clone()
    }
}

impl Authority for Fake {
    fn level<'a>(
        &'a self,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Option<Level>, AuthorityError>> {
        let r = self
            .level
            .clone()
            .map_err(|reason| AuthorityError::Namespace {
                namespace: namespace.into(),
                reason,
            });
        Box::pin(async move { r })
    }

    fn may_create<'a>(
        &'a self,
        user: &'a UserInfo,
        namespace: &'a str,
        resource: &'a str,
    ) -> BoxFuture<'a, Result<Access, AuthorityError>> {
        self.asked
            .lock()
            .unwrap()
            .push((user.clone(), namespace.into(), resource.into()));
        let r = self.access.clone().map_err(AuthorityError::Review);
        Box::pin(async move { r })
    }
}

fn body(op: &str, spec: Value, old_spec: Option<Value>) -> Vec<u8> {
    let obj = |spec: Value| {
        json!({"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
               "metadata": {"name": "a", "namespace": "team"}, "spec": spec})
    };
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u", "kind": {"group": "asya.sh", "version": "v1alpha1", "kind": "AsyncActor"},
            "resource": {"group": "asya.sh", "version": "v1alpha1", "resource": "asyncactors"},
            "name": "a", "namespace": "team", "operation": op,
            "userInfo": {"username": "alice", "uid": "42", "groups": ["team-devs", "system:authenticated"],
                         "extra": {"scopes": ["s"]}},
            "object": obj(spec),
            "oldObject": old_spec.map(obj),
        }
    }))
    .unwrap()
}

/// The validating endpoint's final answer for `body`: (allowed, code, message).
fn decide_with(
    body: &[u8],
    catalog: &FlavorCatalog,
    auth: &Fake,
    general: bool,
) -> (bool, u16, String) {
    decide_in(&ClusterConfig::default(), body, catalog, auth, general)
}

fn decide_in(
    config: &ClusterConfig,
    body: &[u8],
    catalog: &FlavorCatalog,
    auth: &Fake,
    general: bool,
) -> (bool, u16, String) {
    let actors: HashMap<(String, String), Value> = HashMap::new();
    let ctx = Ctx {
        config,
        catalog,
        actors: &actors,
        native_sidecar: true,
        memo: None,
    };
    let mut h = if general {
        handle_general(Endpoint::ValidateActors, body, &ctx)
    } else {
        handle(Endpoint::ValidateActors, body, &ctx)
    }
    .unwrap();
    if let Some(p) = h.privilege.take() {
        h = block_on(settle(h, *p, auth));
    }
    let r = h.review.response.unwrap();
    (r.allowed, r.result.code, r.result.message)
}

fn decide(spec: Value, auth: &Fake) -> (bool, u16, String) {
    let b = body("CREATE", spec, None);
    let fast = decide_with(&b, &FlavorCatalog::new(), auth, false);
    let general = decide_with(&b, &FlavorCatalog::new(), auth, true);
    assert_eq!(fast, general, "both parses settle alike");
    fast
}

fn host_path() -> Value {
    json!({"image": "i", "handler": "m.f", "volumes": [{"name": "root", "hostPath": {"path": "/"}}]})
}

fn workload(pod: Value) -> Value {
    let mut pod = pod;
    let c = pod
        .as_object_mut()
        .unwrap()
        .entry("containers")
        .or_insert(json!([]));
    c.as_array_mut().unwrap().insert(
        0,
        json!({"name": "asya-runtime", "image": "i", "env": [{"name": "ASYA_HANDLER", "value": "m.f"}]}),
    );
    json!({"workload": {"template": {"spec": pod}}})
}

#[test]
fn a_plain_actor_is_admitted_without_asking() {
    let auth = Fake::new(Level::Baseline, Access::Denied(None));
    let (allowed, _, msg) = decide(json!({"image": "i", "handler": "m.f"}), &auth);
    assert!(allowed, "{msg}");
    assert!(auth.asked().is_empty());
}

#[test]
fn a_host_path_needs_the_right_to_create_deployments_asked_for_the_requesting_user() {
    let auth = Fake::new(Level::Privileged, Access::Denied(None));
    let (allowed, code, msg) = decide(host_path(), &auth);
    assert!(!allowed);
    assert_eq!(code, 403);
    assert!(
        msg.contains(r#"spec.volumes[0].hostPath.path: "/": mounts a directory of the node"#),
        "{msg}"
    );
    assert!(
        msg.contains("needs permission to create deployments.apps in namespace team"),
        "{msg}"
    );
    assert!(msg.contains(r#"user "alice""#), "{msg}");
    let asked = auth.asked();
    // Once per parse (fast and general).
    assert_eq!(asked.len(), 2);
    let (user, ns, resource) = &asked[0];
    assert_eq!(user.username.as_deref(), Some("alice"));
    assert_eq!(user.uid.as_deref(), Some("42"));
    assert_eq!(
        user.groups.as_deref(),
        Some(&["team-devs".to_string(), "system:authenticated".to_string()][..])
    );
    assert_eq!(
        user.extra.as_ref().and_then(|e| e.get("scopes")),
        Some(&vec!["s".to_string()])
    );
    assert_eq!((ns.as_str(), resource.as_str()), ("team", "deployments"));
}

#[test]
fn a_user_who_may_create_deployments_keeps_that_power() {
    let auth = Fake::new(Level::Privileged, Access::Allowed);
    let (allowed, _, msg) = decide(host_path(), &auth);
    assert!(allowed, "{msg}");
    let (allowed, _, msg) = decide(
        workload(json!({"serviceAccountName": "admin", "hostNetwork": true})),
        &auth,
    );
    assert!(allowed, "{msg}");
}

#[test]
fn privileged_containers_and_other_service_accounts_are_each_named() {
    let auth = Fake::new(
        Level::Privileged,
        Access::Denied(Some("no RBAC rule".into())),
    );
    let spec = workload(json!({"serviceAccountName": "admin", "containers": [
        {"name": "x", "image": "i", "securityContext": {"privileged": true}}]}));
    let (allowed, _, msg) = decide(spec, &auth);
    assert!(!allowed);
    for want in [
        r#"spec.workload.template.spec.serviceAccountName: "admin": runs the pods as a ServiceAccount other than the actor's own"#,
        "spec.workload.template.spec.containers[1].securityContext.privileged: true: a privileged container",
        "(authorizer: no RBAC rule)",
    ] {
        assert!(msg.contains(want), "{want} in {msg}");
    }
}

#[test]
fn a_statefulset_actor_asks_for_statefulsets() {
    let auth = Fake::new(Level::Privileged, Access::Denied(None));
    let mut spec = workload(json!({"hostPID": true}));
    spec["workload"]["kind"] = json!("StatefulSet");
    let (_, _, msg) = decide(spec, &auth);
    assert!(
        msg.contains("create statefulsets.apps in namespace team"),
        "{msg}"
    );
    assert_eq!(auth.asked()[0].2, "statefulsets");
}

#[test]
fn a_host_path_from_a_flavor_counts_and_names_the_flavor() {
    let auth = Fake::new(Level::Privileged, Access::Denied(None));
    let mut catalog = FlavorCatalog::new();
    catalog.insert(FlavorDef::from_data(
        "node-logs",
        FlavorSource::Flavor,
        &json!({"volumes": [{"name": "logs", "hostPath": {"path": "/var/log"}}]}),
    ));
    let b = body(
        "CREATE",
        json!({"image": "i", "handler": "m.f", "flavors": ["node-logs"]}),
        None,
    );
    let (allowed, _, msg) = decide_with(&b, &catalog, &auth, false);
    assert!(!allowed);
    assert!(
        msg.contains(r#"spec.volumes[0].hostPath.path: "/var/log" (set by flavor "node-logs")"#),
        "{msg}"
    );
}

#[test]
fn the_level_binds_everybody_and_names_the_level() {
    // Even a user who may create Deployments: the namespace enforces baseline.
    let auth = Fake::new(Level::Baseline, Access::Allowed);
    let spec = workload(json!({"containers": [
        {"name": "x", "image": "i", "securityContext": {"privileged": true}}]}));
    let (allowed, code, msg) = decide(spec, &auth);
    assert!(!allowed);
    assert_eq!(code, 403);
    assert!(
        msg.contains(r#"PodSecurity "baseline:latest" of namespace team"#),
        "{msg}"
    );
    assert!(
        msg.contains("spec.workload.template.spec.containers[1].securityContext.privileged: true"),
        "{msg}"
    );
    assert!(auth.asked().is_empty(), "the level decides first");
    // Without the label the level is baseline: a hostPath is refused for everybody.
    let (allowed, _, msg) = decide(host_path(), &auth);
    assert!(!allowed && msg.contains("baseline"), "{msg}");
}

#[test]
fn flat_actors_meet_restricted() {
    let auth = Fake::new(Level::Restricted, Access::Denied(None));
    let (allowed, _, msg) = decide(json!({"image": "i", "handler": "m.f"}), &auth);
    assert!(allowed, "{msg}");
    // A workload template that does not harden its containers does not.
    let (allowed, _, msg) = decide(workload(json!({})), &auth);
    assert!(!allowed);
    assert!(msg.contains("restricted:latest"), "{msg}");
}

#[test]
fn no_answer_refuses_with_the_reason() {
    let auth = Fake {
        level: Ok(Some(Level::Privileged)),
        access: Err("connection refused".into()),
        asked: Mutex::new(Vec::new()),
    };
    let (allowed, code, msg) = decide(host_path(), &auth);
    assert!(!allowed);
    assert_eq!(code, 500);
    assert!(
        msg.contains("SubjectAccessReview failed: connection refused"),
        "{msg}"
    );
    let auth = Fake {
        level: Err("forbidden".into()),
        access: Ok(Access::Allowed),
        asked: Mutex::new(Vec::new()),
    };
    let (allowed, _, msg) = decide(json!({"image": "i", "handler": "m.f"}), &auth);
    assert!(!allowed);
    assert!(
        msg.contains("cannot read namespace team: forbidden"),
        "{msg}"
    );
}

#[test]
fn settled_updates_and_the_mutating_endpoint_ask_nothing() {
    let config = ClusterConfig::default();
    let catalog = FlavorCatalog::new();
    let actors: HashMap<(String, String), Value> = HashMap::new();
    let ctx = Ctx {
        config: &config,
        catalog: &catalog,
        actors: &actors,
        native_sidecar: true,
        memo: None,
    };
    // The provisioner's finalizer patch: the spec is unchanged.
    let b = body("UPDATE", host_path(), Some(host_path()));
    for general in [false, true] {
        let h = if general {
            handle_general(Endpoint::ValidateActors, &b, &ctx)
        } else {
            handle(Endpoint::ValidateActors, &b, &ctx)
        }
        .unwrap();
        assert!(h.privilege.is_none());
    }
    // A changed spec is the writer's: asked again, whole.
    let b = body(
        "UPDATE",
        host_path(),
        Some(json!({"image": "j", "handler": "m.f"})),
    );
    let h = handle(Endpoint::ValidateActors, &b, &ctx).unwrap();
    assert!(h.privilege.is_some());
    // The mutating endpoint asks the same question: the chart registers only it (one
    // webhook call per AsyncActor).
    let b = body("CREATE", host_path(), None);
    let h = handle(Endpoint::MutateActors, &b, &ctx).unwrap();
    assert!(h.privilege.is_some());
}

#[test]
fn a_refused_review_asks_nothing() {
    let auth = Fake::new(Level::Privileged, Access::Allowed);
    let (allowed, code, _) = decide(
        json!({"image": "i", "volumes": [{"name": "r", "hostPath": {"path": "/"}}]}),
        &auth,
    );
    assert!(!allowed);
    assert_eq!(code, 422, "the review's own refusal (no handler)");
    assert!(auth.asked().is_empty());
}

#[test]
fn an_unlabelled_namespace_meets_the_policys_default_level() {
    let auth = Fake::unlabelled(Access::Allowed);
    // A workload template with no securityContext: baseline allows it, restricted does not.
    let spec = workload(json!({}));
    let (allowed, _, msg) = decide(spec.clone(), &auth);
    assert!(allowed, "baseline by default: {msg}");
    let mut config = ClusterConfig::default();
    config.policy.default_pod_security_level = Level::Restricted;
    let b = body("CREATE", spec, None);
    let (allowed, code, msg) = decide_in(&config, &b, &FlavorCatalog::new(), &auth, false);
    assert!(!allowed && code == 403, "{msg}");
    assert!(
        msg.contains("\"restricted:latest\"")
            && msg.contains("else policy.defaultPodSecurityLevel restricted"),
        "{msg}"
    );
}
