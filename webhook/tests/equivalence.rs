//! The text parse of the common requests (a pod to inject; an AsyncActor to validate)
//! answers exactly as the general parse (kube's `AdmissionReview`, the object as a JSON
//! `Value`), and the hand-written response encoding gives the bytes of a serde encoding
//! (a test-only reference, below): same response bytes, same outcome, same errors, over
//! varied corpora (the examples among them) and over fuzzed bodies.

mod common;

use std::collections::HashMap;

use asya_api::config::ClusterConfig;
use asya_api::flavor::{FlavorCatalog, FlavorDef, FlavorSource};
use asya_webhook::admission::{
    ActorLookup, Ctx, Endpoint, SettingsMemo, encode_review, handle, handle_actor_fast,
    handle_general, handle_pod_create,
};
use kube::core::DynamicObject;
use kube::core::admission::AdmissionReview;
use serde_json::{Value, json};

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct WireResponse<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<&'a kube::core::Status>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    warnings: Option<&'a Vec<String>>,
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    audit_annotations: &'a HashMap<String, String>,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct WireReview<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: WireResponse<'a>,
}

/// [`encode_review`] through serde: the reference its hand-written bytes are tested against.
fn encode_review_reference(
    review: &AdmissionReview<DynamicObject>,
) -> Result<Vec<u8>, serde_json::Error> {
    use base64::Engine;
    let Some(r) = review.response.as_ref() else {
        return serde_json::to_vec(review);
    };
    let patch = r
        .patch
        .as_ref()
        .map(|p| base64::engine::general_purpose::STANDARD.encode(p));
    let wire = WireReview {
        api_version: "admission.k8s.io/v1",
        kind: "AdmissionReview",
        response: WireResponse {
            uid: &r.uid,
            allowed: r.allowed,
            status: (!r.allowed).then_some(&r.result),
            patch_type: patch.as_ref().map(|_| "JSONPatch"),
            patch,
            warnings: r.warnings.as_ref(),
            audit_annotations: &r.audit_annotations,
        },
    };
    serde_json::to_vec(&wire)
}

struct Env {
    config: ClusterConfig,
    catalog: FlavorCatalog,
    actors: HashMap<(String, String), Value>,
    versioned: Versioned,
    memo: SettingsMemo,
}

/// A store that knows resourceVersions, so the memo is used.
struct Versioned(HashMap<(String, String), Value>);

impl ActorLookup for Versioned {
    fn get(&self, namespace: &str, name: &str) -> Option<Value> {
        self.0
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }
    fn get_versioned(&self, namespace: &str, name: &str) -> Option<(Value, Option<String>)> {
        self.get(namespace, name).map(|v| (v, Some("7".into())))
    }
    fn version(&self, namespace: &str, name: &str) -> Option<String> {
        self.get(namespace, name).map(|_| "7".into())
    }
}

fn actor(ns: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
           "metadata": {"name": name, "namespace": ns, "resourceVersion": "7"}, "spec": spec})
}

impl Env {
    fn new() -> Self {
        Self::with_catalog(FlavorCatalog::new())
    }

    /// `catalog` and the flavor the crafted actors use.
    fn with_catalog(mut catalog: FlavorCatalog) -> Self {
        catalog.insert(FlavorDef::from_data(
            "gpu-small",
            FlavorSource::Flavor,
            &json!({"nodeSelector": {"gpu": "t4"}}),
        ));
        let mut actors = HashMap::new();
        for (ns, name, spec) in [
            (
                "team-a",
                "echo",
                json!({"image": "python:3.13", "handler": "pkg.mod.Cls.run", "handlerMode": "envelope",
                       "pythonExecutable": "/usr/bin/python3.12", "resiliency": {"actorTimeout": "90s"},
                       "sidecar": {"image": "registry.local/asya-sidecar:dev",
                                   "env": [{"name": "ASYA_SOCKET_DIR", "value": "/x"}]}}),
            ),
            (
                "team-a",
                "sqs-actor",
                json!({"image": "i", "handler": "a.b", "transport": "sqs", "flavors": ["gpu-small"]}),
            ),
            (
                "team-a",
                "bad",
                json!({"image": "i", "handler": "bad handler"}),
            ),
            (
                "team-a",
                "waiting",
                json!({"image": "i", "flavors": ["not-there"]}),
            ),
            ("default", "echo", json!({"image": "i", "handler": "d.e"})),
        ] {
            actors.insert((ns.to_string(), name.to_string()), actor(ns, name, spec));
        }
        Self {
            config: ClusterConfig::default(),
            catalog,
            versioned: Versioned(actors.clone()),
            actors,
            memo: SettingsMemo::default(),
        }
    }

    /// Every context the server or the CLI may use.
    fn contexts(&self) -> Vec<Ctx<'_>> {
        let mut out = Vec::new();
        for native_sidecar in [true, false] {
            out.push(Ctx {
                config: &self.config,
                catalog: &self.catalog,
                actors: &self.actors,
                native_sidecar,
                memo: None,
            });
            out.push(Ctx {
                config: &self.config,
                catalog: &self.catalog,
                actors: &self.versioned,
                native_sidecar,
                memo: Some(&self.memo),
            });
        }
        out
    }
}

/// The response body, the review as kube serializes it, the operation and the result.
type Answer = (Vec<u8>, Vec<u8>, &'static str, &'static str);

/// The whole answer as the server would send it, or the bad-request text.
fn answer(
    f: impl Fn() -> Result<asya_webhook::admission::Handled, asya_webhook::admission::BadRequest>,
) -> Result<Answer, String> {
    match f() {
        Ok(h) => Ok((
            {
                let body = encode_review(&h.review).expect("encodes");
                let want = encode_review_reference(&h.review).expect("encodes");
                assert_eq!(
                    String::from_utf8_lossy(&body),
                    String::from_utf8_lossy(&want)
                );
                body
            },
            serde_json::to_vec(&h.review).expect("serializes"),
            h.operation,
            h.result,
        )),
        Err(e) => Err(e.0),
    }
}

/// Which path answered a body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Took {
    Reference,
    Pod,
    Actor,
}

/// Checks one body on every endpoint and context; which path took it.
fn same(env: &Env, body: &[u8]) -> Took {
    let mut took = Took::Reference;
    for ctx in env.contexts() {
        for ep in [
            Endpoint::MutatePods,
            Endpoint::ValidateActors,
            Endpoint::MutateActors,
        ] {
            let got = answer(|| handle(ep, body, &ctx));
            let want = answer(|| handle_general(ep, body, &ctx));
            assert_eq!(
                got,
                want,
                "{ep:?} native={} memo={}: {}",
                ctx.native_sidecar,
                ctx.memo.is_some(),
                String::from_utf8_lossy(body)
            );
        }
        let actor_fast = handle_actor_fast(Endpoint::ValidateActors, body, &ctx).is_some();
        // Both actor endpoints take the same bodies the fast way (the chart registers only
        // the mutating one: there the fast path is what an AsyncActor costs).
        assert_eq!(
            handle_actor_fast(Endpoint::MutateActors, body, &ctx).is_some(),
            actor_fast,
            "{}",
            String::from_utf8_lossy(body)
        );
        match (handle_pod_create(body, &ctx).is_some(), actor_fast) {
            (true, true) => panic!("both fast paths took a body"),
            (true, false) => took = Took::Pod,
            (false, true) => took = Took::Actor,
            (false, false) => {}
        }
    }
    took
}

fn review(kind: Value, op: &str, ns: Option<&str>, object: Value, old: Option<Value>) -> Value {
    let mut r = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "0b6e4c3a-1111-2222-3333-444455556666",
            "kind": kind,
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "",
            "operation": op,
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                         "groups": ["system:serviceaccounts"]},
            "object": object,
            "oldObject": old,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    });
    if let Some(ns) = ns {
        r["request"]["namespace"] = json!(ns);
    }
    r
}

fn pod_kind() -> Value {
    json!({"group": "", "version": "v1", "kind": "Pod"})
}

fn labels(actor: &str) -> Value {
    json!({"asya.sh/inject": "true", "asya.sh/actor": actor, "app": "x"})
}

/// Pods of every shape injection meets.
fn pods() -> Vec<Value> {
    let rt = |extra: Value| {
        let mut c = json!({"name": "asya-runtime", "image": "python:3.13"});
        if let (Some(c), Some(e)) = (c.as_object_mut(), extra.as_object()) {
            c.extend(e.clone());
        }
        c
    };
    let mut out = Vec::new();
    for actor in [
        "echo",
        "sqs-actor",
        "bad",
        "waiting",
        "missing",
        "annotated",
    ] {
        let ann = if actor == "annotated" || actor == "missing" {
            json!({"asya.sh/handler": "echo.handle", "asya.sh/transport": "sqs", "a~b/c": "keep",
                   "asya.sh/handler-mode": "envelope", "asya.sh/python": "python3.11"})
        } else {
            json!({"keep": "me"})
        };
        out.push(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "x-", "namespace": "team-a", "labels": labels(actor), "annotations": ann},
            "spec": {"containers": [rt(json!({}))]}}));
        out.push(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "x-", "labels": labels(actor)},
            "spec": {"containers": [
                        {"name": "first", "image": "a", "args": ["x"]},
                        rt(json!({"args": ["a", "b"], "command": ["old"],
                                  "env": [{"name": "ASYA_HANDLER", "value": "old"},
                                          {"name": "ASYA_HANDLER_MODE", "valueFrom": {"fieldRef": {"fieldPath": "x"}}},
                                          {"name": "K", "value": "v"}],
                                  "volumeMounts": [{"name": "m", "mountPath": "/m"},
                                                   {"name": "asya-socket", "mountPath": "/var/run/asya"}],
                                  "resources": {"limits": {"cpu": "1"}}})),
                        {"name": "last", "image": "b"}],
                     "initContainers": [{"name": "setup", "image": "s"}, {"name": "asya-install-runtime", "image": "old"}],
                     "volumes": [{"name": "m", "emptyDir": {}}, {"name": "asya-socket", "emptyDir": {"medium": "Memory"}}]}}));
    }
    // The benchmark's Deployment pod.
    out.push(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "echo-7d9c6b5f4-", "namespace": "team-a",
            "labels": {"asya.sh/inject": "true", "asya.sh/actor": "echo", "pod-template-hash": "7d9c6b5f4"},
            "annotations": {"asya.sh/sidecar-version": "0.1.0"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "echo-7d9c6b5f4",
                                 "uid": "a1b2", "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"serviceAccountName": "echo", "nodeSelector": {"k": "v"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "asya-runtime", "image": "img", "imagePullPolicy": "IfNotPresent",
                "env": [{"name": "MODEL_PATH", "value": "/models/v2"},
                        {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "api", "key": "key"}}}],
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
                "volumeMounts": [{"name": "models", "mountPath": "/models"},
                                 {"name": "kube-api-access-abcde", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}],
                "ports": [{"containerPort": 8000, "name": "http"}],
                "readinessProbe": {"httpGet": {"path": "/", "port": 8000}},
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}],
            "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "models"}},
                        {"name": "kube-api-access-abcde", "projected": {"sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]}}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "enableServiceLinks": true, "priority": 0},
        "status": {"phase": "Pending"}}));
    // Stale sidecars, as a copied spec or a change of sidecar mode leaves them.
    out.push(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": labels("echo"), "annotations": {}},
        "spec": {"containers": [{"name": "asya-sidecar", "image": "old"}, rt(json!({}))],
                 "initContainers": [{"name": "asya-install-runtime", "image": "old"}, {"name": "asya-sidecar", "image": "old"},
                                    {"name": "a", "image": "a"}, {"name": "b", "image": "b"}],
                 "volumes": [{"name": "asya-socket", "emptyDir": {}}, {"name": "asya-runtime-file", "emptyDir": {}}]}}));
    // Already injected; not asking; asking without an actor label; label not "true".
    out.push(
        json!({"metadata": {"labels": labels("echo"), "annotations": {"asya.sh/injected": "img"}},
        "spec": {"containers": [rt(json!({}))]}}),
    );
    out.push(
        json!({"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [rt(json!({}))]}}),
    );
    out.push(json!({"metadata": {"labels": {"asya.sh/inject": "true"}}, "spec": {"containers": [rt(json!({}))]}}));
    out.push(
        json!({"metadata": {"labels": {"asya.sh/inject": "false", "asya.sh/actor": "echo"}},
        "spec": {"containers": [rt(json!({}))]}}),
    );
    // No runtime container to choose; none at all; no spec; single unnamed container.
    out.push(json!({"metadata": {"labels": labels("echo")},
        "spec": {"containers": [{"name": "a", "image": "a"}, {"name": "b", "image": "b"}]}}));
    out.push(json!({"metadata": {"labels": labels("echo")}, "spec": {"containers": []}}));
    out.push(json!({"metadata": {"labels": labels("echo")}}));
    out.push(
        json!({"metadata": {"labels": labels("echo")}, "spec": {"containers": [{"name": "main"}]}}),
    );
    // Unknown fields at every level, and odd but valid values.
    out.push(json!({"apiVersion": "v1", "kind": "Pod", "extra": {"deep": [1, 2.5, -3, "\u{e9}", null, true]},
        "metadata": {"labels": labels("echo"), "unknownMeta": 1, "namespace": "team-a"},
        "spec": {"unknownSpec": [], "containers": [rt(json!({"unknownContainer": {"x": [[]]}}))]},
        "status": {"unknownStatus": "x"}}));
    // The object's namespace when the request has none, and neither.
    out.push(
        json!({"metadata": {"labels": labels("echo"), "namespace": "default"},
        "spec": {"containers": [rt(json!({}))]}}),
    );
    out
}

#[test]
fn fast_and_reference_paths_answer_alike() {
    let env = Env::new();
    let mut fast = 0;
    let mut total = 0;
    for pod in pods() {
        for ns in [Some("team-a"), None, Some("default")] {
            for op in ["CREATE", "UPDATE", "DELETE"] {
                for old in [None, Some(pod.clone())] {
                    for dry in [false, true] {
                        let mut r = review(pod_kind(), op, ns, pod.clone(), old.clone());
                        r["request"]["dryRun"] = json!(dry);
                        let body = serde_json::to_vec(&r).unwrap();
                        total += 1;
                        if same(&env, &body) == Took::Pod {
                            fast += 1;
                            assert!(op == "CREATE" && old.is_none());
                        }
                    }
                }
            }
        }
    }
    // Every plain CREATE goes the fast way.
    assert_eq!(fast, pods().len() * 3 * 2, "{fast} of {total}");
}

fn actor_kind() -> Value {
    json!({"group": "asya.sh", "version": "v1alpha1", "kind": "AsyncActor"})
}

/// The seed examples (deploy/examples) and the bad examples (tests/fixtures/invalid): their
/// flavors in a catalog, and every AsyncActor.
fn examples() -> (FlavorCatalog, Vec<Value>) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the webhook crate lives in the workspace")
        .to_path_buf();
    let docs = asya_webhook::cmd::validate::read_documents(&[
        root.join("deploy/examples"),
        root.join("tests/fixtures/invalid"),
    ])
    .expect("the examples read");
    let mut catalog = FlavorCatalog::new();
    let mut actors = Vec::new();
    for d in docs {
        let v = d.value;
        match v["kind"].as_str() {
            Some("Flavor") => catalog.insert(FlavorDef::from_flavor(
                &serde_json::from_value(v).expect("a Flavor"),
            )),
            Some("EnvironmentConfig") => {
                if let Some(f) = FlavorDef::from_environment_config(&v) {
                    catalog.insert(f);
                }
            }
            Some("AsyncActor") => actors.push(v),
            _ => {}
        }
    }
    assert!(actors.len() >= 60, "{} AsyncActors", actors.len());
    (catalog, actors)
}

/// Specs that take the other branches: aliases, `command`, unknown fields, odd values.
fn crafted_actors() -> Vec<Value> {
    let mut out = Vec::new();
    for spec in [
        json!({"image": "i", "handler": "m.f", "flavors": ["gpu-small"]}),
        json!({"image": "i", "handler": "m.f", "flavors": ["not-there"]}),
        json!({"image": "i", "handler": "m.f", "scaling": {"minReplicas": 1, "maxReplicas": 4}}),
        json!({"handler": "not a handler", "imagePullPolicy": "Sometimes",
               "scaling": {"minReplicaCount": 5, "maxReplicaCount": 2}}),
        json!({"image": "i", "handler": "m.f", "command": ["python"]}),
        json!({"image": "i", "handler": "m.f", "unknown": 1, "scaling": {"alsoUnknown": true}}),
        json!({"image": "i", "handler": "m.f", "replicas": 1.5}),
        json!({"image": "i", "handler": "m.f", "replicas": -0}),
        json!({"image": "i", "handler": "m.f", "replicas": 9007199254740993_u64}),
        json!({"image": "i\u{e9}\u{1f600}", "handler": "m.f", "env": [{"name": "A", "value": "\"\\/"}]}),
        json!({"image": "i", "handler": "m.f", "timeout": {"processing": "30s"}}),
        json!({"image": "i", "handler": "m.f", "actor": "Bad_Name", "transport": "nope"}),
        json!({"image": "i", "handler": "m.f", "resources": {"limits": {"cpu": 2}}}),
        json!({"image": "i", "handler": "m.f", "volumes": [{"name": "v", "emptyDir": {"sizeLimit": "1Gi"}, "unknownField": 1}]}),
        json!({"image": "i", "handler": "m.f", "workload": {"kind": "Deployment",
               "template": {"metadata": {"creationTimestamp": "2026-01-01T00:00:00.5Z"},
                            "spec": {"containers": [{"name": "asya-runtime", "image": "i"}]}}}}),
        json!({}),
        json!(null),
        json!([]),
        json!("spec"),
    ] {
        out.push(actor("team-a", "echo", spec));
    }
    // A CREATE with generateName (refused: no identity is taken from it), with the
    // generated name beside it (as the validating webhook sees it); identity from the
    // request's namespace, or from neither.
    out.push(
        json!({"metadata": {"generateName": "gen-"}, "spec": {"image": "i", "handler": "m.f"}}),
    );
    out.push(
        json!({"metadata": {"generateName": "gen-", "name": "gen-x7k2p"},
                    "spec": {"image": "i", "handler": "m.f"}}),
    );
    // Being deleted: the UPDATEs against every stored object below change its spec or not.
    let mut deleting = actor("team-a", "echo", json!({"image": "i", "handler": "m.f"}));
    deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    out.push(deleting);
    out.push(json!({"spec": {"image": "i", "handler": "m.f"}}));
    out.push(json!({"metadata": null, "spec": {"image": "i", "handler": "m.f"}}));
    out.push(json!({"metadata": {"name": 1}, "spec": {"image": "i", "handler": "m.f"}}));
    out.push(json!({"metadata": {"name": "echo"}}));
    out
}

/// What an UPDATE may carry as the stored object.
fn olds(a: &Value) -> Vec<Value> {
    let mut out = vec![a.clone()];
    let mut set = |ptr: &str, v: Value| {
        let mut o = a.clone();
        if let Some(spec) = o.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert(ptr.into(), v);
        }
        out.push(o);
    };
    set("actor", json!("renamed"));
    set("transport", json!("sqs"));
    set("unknownOld", json!(1));
    set("replicas", json!("not a number"));
    let mut o = a.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("spec");
    }
    out.push(o.clone());
    o["spec"] = Value::Null;
    out.push(o);
    let mut o = a.clone();
    o["metadata"] = json!({"name": "old-name"});
    out.push(o);
    out.push(json!({"spec": {"actor": "x"}}));
    out.push(json!([1]));
    out
}

/// Every example, bad example and crafted actor, on CREATE, UPDATE (against every kind of
/// stored object) and DELETE: the same answer both ways, and the fast path takes what it
/// is for.
#[test]
fn actor_reviews_answer_alike() {
    let (catalog, mut actors) = examples();
    let env = Env::with_catalog(catalog);
    actors.extend(crafted_actors());
    let (mut fast, mut total, mut fast_patches) = (0, 0, 0);
    for a in &actors {
        // Whether the spec parses, with no field its type does not know.
        let plain = serde_json::from_value::<asya_api::types::AsyncActorSpec>(a["spec"].clone())
            .is_ok()
            && a["spec"].is_object()
            && !serde_json::to_string(&a["spec"])
                .unwrap()
                .contains("nknown")
            && a["spec"].get("command").is_none();
        for ns in [Some("team-a"), None] {
            let mut bodies = vec![("CREATE", None), ("DELETE", Some(a.clone()))];
            // Every kind of stored object once: the namespace does not bear on them.
            if ns.is_some() {
                bodies.extend(olds(a).into_iter().map(|o| ("UPDATE", Some(o))));
            } else {
                bodies.push(("UPDATE", Some(a.clone())));
            }
            for (op, old) in bodies {
                let body =
                    serde_json::to_vec(&review(actor_kind(), op, ns, a.clone(), old.clone()))
                        .unwrap();
                let took = same(&env, &body);
                total += 1;
                if took == Took::Actor {
                    fast += 1;
                    assert!(op != "DELETE", "{a}");
                    let ctx = &env.contexts()[0];
                    let h = handle_actor_fast(Endpoint::MutateActors, &body, ctx).unwrap();
                    if h.review
                        .response
                        .as_ref()
                        .is_some_and(|r| r.patch.is_some())
                    {
                        fast_patches += 1;
                    }
                }
                // The plain CREATEs of well-formed actors go the fast way.
                if op == "CREATE"
                    && plain
                    && a["metadata"].is_object()
                    && a.get("metadata")
                        .and_then(|m| m.get("name"))
                        .is_none_or(Value::is_string)
                {
                    assert_eq!(took, Took::Actor, "{a}");
                }
            }
        }
    }
    assert!(fast * 2 > total, "{fast} of {total} went the fast way");
    // The corpus exercises the fast path's patches (aliases and defaults rewritten), which
    // `same` compared byte for byte with the general path's.
    assert!(fast_patches > 0, "no fast mutating answer carried a patch");
}

/// Specs around `policy.maxSpecBytes`, some written with escapes the text parse keeps
/// longer than the `Value` the reference measures: the same answer either way, the small
/// ones the fast way, and those over the limit refused.
#[test]
fn specs_around_the_size_limit_answer_alike() {
    let mut env = Env::new();
    env.config.policy.max_spec_bytes = 400;
    let (mut fast, mut refused) = (0, 0);
    for n in (0..500).step_by(25) {
        for escaped in [false, true] {
            let a = actor(
                "team-a",
                "echo",
                json!({"image": "i", "handler": "m.f",
                "env": [{"name": "A", "value": "x".repeat(n)}]}),
            );
            let mut text =
                serde_json::to_string(&review(actor_kind(), "CREATE", Some("team-a"), a, None))
                    .unwrap();
            if escaped {
                // The API server may write `é` as `\u00e9`: six bytes of text, two in the Value.
                text = text.replace(&"x".repeat(n), &"\\u00e9".repeat(n / 3));
            }
            if same(&env, text.as_bytes()) == Took::Actor {
                fast += 1;
            }
            let h = handle(Endpoint::MutateActors, text.as_bytes(), &env.contexts()[0]).unwrap();
            let r = h.review.response.unwrap();
            if !r.allowed {
                refused += 1;
                assert!(
                    r.result.message.contains("spec: Too long: "),
                    "{}",
                    r.result.message
                );
                assert!(
                    r.result.message.contains(
                        ", over the limit of 400 (policy.maxSpecBytes in the cluster configuration)"
                    ),
                    "{}",
                    r.result.message
                );
            }
        }
    }
    assert!(fast > 0 && refused > 0, "{fast} fast, {refused} refused");
}

/// Bodies the raw parse takes but the reference parse refused (or read differently):
/// they must come out the reference way.
#[test]
fn doubtful_bodies_answer_as_before() {
    let env = Env::new();
    let base = review(
        pod_kind(),
        "CREATE",
        Some("team-a"),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"labels": labels("echo")},
               "spec": {"containers": [{"name": "asya-runtime", "image": "i"}]}}),
        None,
    );
    let text = serde_json::to_string(&base).unwrap();
    let with = |from: &str, to: &str| {
        assert!(text.contains(from), "{from}");
        text.replacen(from, to, 1)
    };
    let nest = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
    // The object starts with this (keys sorted), and nothing else does.
    let obj = r#"{"apiVersion":"v1","kind":"Pod","#;
    let in_obj = |to: &str| with(obj, &format!("{{{to},"));
    let mut bodies = vec![
        in_obj(r#""apiVersion":"v1","kind":"Pod","x":1e400"#),
        in_obj(r#""apiVersion":"v1","kind":"Pod","x":1e300"#),
        in_obj(r#""apiVersion":"v1","kind":"Pod","x":123456789012345678901234567890"#),
        in_obj(r#""apiVersion":"v1","kind":"Pod","x":"\ud800""#),
        in_obj(r#""apiVersion":"v1","kind":"Pod","x":"\ud83d\ude00""#),
        in_obj(r#""apiVersion":"v1","kind":"Pod","x":"\u003c""#),
        in_obj(r#""apiVersion":null,"kind":"Pod""#),
        in_obj(r#""apiVersion":"v2","kind":"Pod""#),
        in_obj(r#""kind":"Pod""#),
        in_obj(r#""apiVersion":"v1""#),
        in_obj(r#""apiVersion":"v1","kind":"Deployment""#),
        in_obj(r#""apiVersion":"v1","kind":null"#),
        in_obj(r#""apiVersion":"v1","kind":"Pod","kind":"Pod""#),
        in_obj(r#""apiVersion":"v1","kind":"Pod","metadata":null"#),
        in_obj(r#""apiVersion":"v1","kind":"Pod","metadata":{}"#),
        in_obj(r#""apiVersion":"v1","kind":"Pod","metadata":{"labels":null}"#),
        in_obj(
            r#""apiVersion":"v1","kind":"Pod","metadata":{"labels":{"asya.sh/inject":"true","asya.sh/actor":"echo"}}"#,
        ),
        in_obj(r#""apiVersion":"v1","kind":"Pod","spec":null"#),
        in_obj(r#""apiVersion":"v1","kind":"Pod","status":null"#),
        in_obj(r#""apiVersion":"v1","kind":"Pod","status":{"phase":1}"#),
        with(r#""spec":{"#, r#""spec":{"containers":"x","#),
        with(r#""oldObject":null"#, r#""oldObject":[1]"#),
        with(r#""oldObject":null"#, r#""oldObject":{"metadata":null}"#),
        with(r#""oldObject":null"#, r#""oldObject":{}"#),
        with(r#""uid":"#, r#""x":1,"uid":"#),
        with(r#""uid":"#, r#""uid":1,"x":"#),
        with(r#""dryRun":false"#, r#""dryRun":"no""#),
        with(r#""dryRun":false"#, r#""dryRun":false,"dryRun":true"#),
        with(r#""object":"#, r#""object":null,"object":"#),
        with(r#""userInfo":{"#, r#""userInfo":{"extra":{"k":["v"]},"#),
        with(r#""userInfo":{"#, r#""userInfo":{"groups":null,"#),
        with(
            r#""kind":"Pod","version":"v1""#,
            r#""kind":"Pod","version":"v2""#,
        ),
        with(
            r#""group":"","kind":"Pod""#,
            r#""group":"apps","kind":"Pod""#,
        ),
        with(r#""operation":"CREATE""#, r#""operation":"PATCH""#),
        with(r#""namespace":"team-a""#, r#""namespace":null"#),
        with(r#""namespace":"team-a""#, r#""namespace":"default""#),
        with(
            r#"{"apiVersion":"admission.k8s.io/v1""#,
            r#"{"apiVersion":"admission.k8s.io/v1","response":{}"#,
        ),
        with(
            r#"{"apiVersion":"admission.k8s.io/v1""#,
            r#"{"apiVersion":"admission.k8s.io/v1","response":{"uid":"u","allowed":true}"#,
        ),
        with(
            r#"{"apiVersion":"admission.k8s.io/v1""#,
            r#"{"apiVersion":"admission.k8s.io/v1","other":[1e999]"#,
        ),
        with(
            r#"{"apiVersion":"admission.k8s.io/v1""#,
            r#"{"apiVersion":"admission.k8s.io/v1beta1""#,
        ),
        with(
            r#""kind":"AdmissionReview""#,
            r#""kind":"AdmissionReview","kind":"AdmissionReview""#,
        ),
        with(obj, &format!("[{obj}")).replacen(r#"}]}},"oldObject""#, r#"}]}}],"oldObject""#, 1),
        with(obj, r#""x","y":{"apiVersion":"v1","kind":"Pod","#),
        text.clone(),
    ];
    // Around the reference parse's depth limit.
    for n in [90, 99, 100, 101, 120, 124, 125, 126, 127, 128] {
        bodies.push(in_obj(&format!(
            r#""apiVersion":"v1","kind":"Pod","x":{}"#,
            nest(n)
        )));
    }
    for b in &bodies {
        same(&env, b.as_bytes());
    }
    // Truncations and byte flips of a valid body.
    let bytes = text.as_bytes();
    for i in (0..bytes.len()).step_by(7) {
        same(&env, &bytes[..i]);
        for flip in [b'{', b'"', b'1', b'\\', b'e', 0xff] {
            let mut b = bytes.to_vec();
            b[i] = flip;
            same(&env, &b);
        }
    }
}

/// Actor bodies the raw parse takes but the reference parse refused or read differently.
#[test]
fn doubtful_actor_bodies_answer_as_before() {
    let env = Env::new();
    let a = actor(
        "team-a",
        "echo",
        json!({"image": "i", "handler": "m.f", "flavors": ["gpu-small"], "nodeSelector": {"k": "v"},
               "resources": {"limits": {"cpu": "1"}}, "scaling": {"enabled": true}}),
    );
    let base = review(actor_kind(), "UPDATE", Some("team-a"), a.clone(), Some(a));
    let text = serde_json::to_string(&base).unwrap();
    assert_eq!(same(&env, text.as_bytes()), Took::Actor);
    let with = |from: &str, to: &str| {
        assert!(text.contains(from), "{from}");
        text.replacen(from, to, 1)
    };
    // Both objects start with this (keys sorted); the first is the object, the second the old one.
    let obj = r#"{"apiVersion":"asya.sh/v1alpha1","kind":"AsyncActor","#;
    let spec = r#""spec":{"#;
    let nest = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
    let mut bodies = vec![
        with(spec, r#""spec":{"image":"j","#),
        with(spec, r#""spec":{"handler":"x.y","#),
        with(spec, r#""spec":{"flavors":[],"#),
        with(spec, r#""spec":{"replicas":1e2,"#),
        with(spec, r#""spec":{"replicas":2,"replicas":3,"#),
        with(spec, r#""spec":{"replicas":1.0,"#),
        with(spec, r#""spec":{"replicas":-0,"#),
        with(spec, r#""spec":{"replicas":12345678901234567890123,"#),
        with(spec, r#""spec":{"image":"\ud800","#),
        with(spec, r#""spec":{"image":"\ud83d\ude00","#),
        with(spec, r#""spec":{"image":"\u00e9\n","#),
        with(spec, r#""spec":{"unknown":1,"unknown":2,"#),
        with(spec, r#""spec":{"command":["x"],"#),
        with(spec, r#""spec":{"actor":null,"#),
        with(
            spec,
            r#""spec":{"env":[{"name":"A","name":"B","value":"v"}],"#,
        ),
        with(
            spec,
            r#""spec":{"workload":{"template":{"metadata":{"creationTimestamp":"2026-01-01T00:00:00.123Z"}}},"#,
        ),
        with(
            r#""nodeSelector":{"k":"v"}"#,
            r#""nodeSelector":{"k":"v","k":"w"}"#,
        ),
        with(
            r#""limits":{"cpu":"1"}"#,
            r#""limits":{"cpu":"1"},"limits":{"cpu":"2"}"#,
        ),
        with(r#""spec":{"#, r#""spec":null,"spec":{"#),
        with(r#""spec":{"#, r#""spec":{"image":"k"},"spec":{"#),
        with(obj, &format!(r#"{obj}"metadata":null,"#)),
        with(obj, &format!(r#"{obj}"metadata":{{"name":"a"}},"#)),
        with(obj, &format!(r#"{obj}"spec":null,"#)),
        with(obj, &format!(r#"{obj}"status":{{"phase":1}},"#)),
        with(obj, &format!(r#"{obj}"x":1e400,"#)),
        with(r#""metadata":{"#, r#""metadata":{"name":"other","#),
        with(r#""metadata":{"#, r#""metadata":{"labels":null,"#),
        with(
            r#""metadata":{"#,
            r#""metadata":{"creationTimestamp":"bad","#,
        ),
        with(r#""operation":"UPDATE""#, r#""operation":"CREATE""#),
        with(r#""operation":"UPDATE""#, r#""operation":"DELETE""#),
        with(r#""operation":"UPDATE""#, r#""operation":"CONNECT""#),
        with(
            r#""kind":"AsyncActor","version""#,
            r#""kind":"Flavor","version""#,
        ),
        with(r#""group":"asya.sh""#, r#""group":"other.sh""#),
        with(
            r#""namespace":"team-a","object""#,
            r#""namespace":null,"object""#,
        ),
        with(
            r#""namespace":"team-a","resourceVersion""#,
            r#""resourceVersion""#,
        ),
        with(r#""dryRun":false"#, r#""dryRun":true"#),
        with(r#""uid":"#, r#""uid":1,"x":"#),
        text.replace(r#""actor""#, r#""actor ""#),
    ];
    // The old object, where it differs.
    let second = text.rfind(obj).expect("an old object");
    let (head, tail) = text.split_at(second);
    for (from, to) in [
        (spec, r#""spec":{"actor":"renamed","#),
        (spec, r#""spec":{"transport":"sqs","#),
        (spec, r#""spec":{"replicas":"x","#),
        (spec, r#""spec":{"replicas":2,"replicas":3,"#),
        (spec, r#""spec":{"actor":"echo","actor":"renamed","#),
        (spec, r#""spec":{"unknownOld":1,"#),
        (r#""spec":{"#, r#""spec":null,"x":{"#),
        (r#""metadata":{"#, r#""metadata":{"name":"old","#),
        (r#""metadata":{"#, r#""metadata":{"name":null,"#),
        (obj, r#"{"metadata":null,"#),
    ] {
        bodies.push(format!("{head}{}", tail.replacen(from, to, 1)));
    }
    for n in [90, 99, 100, 101, 120, 124, 125, 126, 127, 128] {
        bodies.push(with(spec, &format!(r#""spec":{{"x":{},"#, nest(n))));
        bodies.push(with(
            spec,
            &format!(
                r#""spec":{{"env":[{{"name":"A","valueFrom":{}}}],"#,
                nest(n)
            ),
        ));
    }
    let mut fast = 0;
    for b in &bodies {
        if same(&env, b.as_bytes()) == Took::Actor {
            fast += 1;
        }
    }
    // Those that change nothing doubtful still go the fast way.
    assert!(fast >= 8, "{fast} of {} went the fast way", bodies.len());
    // Truncations and byte flips of a valid body.
    let bytes = text.as_bytes();
    for i in (0..bytes.len()).step_by(5) {
        same(&env, &bytes[..i]);
        for flip in [b'{', b'"', b'1', b'\\', b'e', b',', 0xff] {
            let mut b = bytes.to_vec();
            b[i] = flip;
            same(&env, &b);
        }
    }
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn arb_json(depth: u32) -> impl Strategy<Value = Value> {
        common::arb_json(
            depth,
            vec![
                "name",
                "image",
                "env",
                "value",
                "valueFrom",
                "args",
                "command",
                "volumeMounts",
                "mountPath",
                "volumes",
                "emptyDir",
                "initContainers",
                "containers",
                "restartPolicy",
                "resources",
                "asya-runtime",
                "asya-sidecar",
                "x~y/z",
            ],
            false,
            24,
            5,
        )
    }

    fn arb_spec_json() -> impl Strategy<Value = Value> {
        common::arb_json(
            3,
            vec![
                "image",
                "handler",
                "flavors",
                "actor",
                "transport",
                "replicas",
                "scaling",
                "enabled",
                "minReplicaCount",
                "maxReplicaCount",
                "resiliency",
                "actorTimeout",
                "env",
                "name",
                "value",
                "nodeSelector",
                "resources",
                "limits",
                "command",
                "unknown",
            ],
            false,
            24,
            5,
        )
    }

    fn arb_container() -> impl Strategy<Value = Value> {
        (
            prop::sample::select(vec![
                "asya-runtime",
                "asya-sidecar",
                "main",
                "asya-install-runtime",
            ]),
            proptest::option::of(proptest::collection::vec(
                ("[A-Z_]{1,4}", "[a-z]{0,3}").prop_map(|(n, v)| json!({"name": n, "value": v})),
                0..3,
            )),
            proptest::option::of(proptest::collection::vec(
                prop::sample::select(vec!["/var/run/asya", "/opt/asya", "/m"])
                    .prop_map(|p| json!({"name": "v", "mountPath": p})),
                0..3,
            )),
            proptest::option::of(proptest::collection::vec("[a-z]{0,3}", 0..3)),
        )
            .prop_map(|(name, env, mounts, args)| {
                let mut c = json!({"name": name, "image": "i"});
                if let Some(e) = env {
                    c["env"] = json!(e);
                }
                if let Some(m) = mounts {
                    c["volumeMounts"] = json!(m);
                }
                if let Some(a) = args {
                    c["args"] = json!(a);
                }
                c
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

        /// Pods of arbitrary container lists, volumes and annotations.
        #[test]
        fn structured_pods(
            containers in proptest::collection::vec(arb_container(), 0..4),
            inits in proptest::option::of(proptest::collection::vec(arb_container(), 0..3)),
            volumes in proptest::option::of(proptest::collection::vec(
                prop::sample::select(vec!["asya-socket", "asya-runtime-file", "m"])
                    .prop_map(|n| json!({"name": n, "emptyDir": {}})), 0..3)),
            annotations in proptest::option::of(proptest::collection::btree_map(
                prop::sample::select(vec!["asya.sh/handler", "a~b/c", "asya.sh/transport", "k"]),
                prop::sample::select(vec!["m.f", "sqs", "rabbitmq", "bad value"]), 0..3)),
            actor in prop::sample::select(vec!["echo", "sqs-actor", "bad", "missing"]),
            ns in proptest::option::of(prop::sample::select(vec!["team-a", "default"])),
        ) {
            let env = Env::new();
            let mut spec = json!({"containers": containers});
            if let Some(i) = inits { spec["initContainers"] = json!(i); }
            if let Some(v) = volumes { spec["volumes"] = json!(v); }
            let mut meta = json!({"generateName": "p-", "labels": labels(actor)});
            if let Some(a) = annotations { meta["annotations"] = json!(a); }
            let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec});
            let body = serde_json::to_vec(&review(pod_kind(), "CREATE", ns, pod, None)).unwrap();
            prop_assert_eq!(same(&env, &body), Took::Pod);
        }

        /// Pods whose spec is arbitrary JSON.
        #[test]
        fn arbitrary_specs(spec in arb_json(3), meta in arb_json(2)) {
            let env = Env::new();
            let pod = json!({"apiVersion": "v1", "kind": "Pod",
                             "metadata": {"labels": labels("echo"), "annotations": {"asya.sh/handler": "m.f"}},
                             "spec": spec});
            same(&env, &serde_json::to_vec(&review(pod_kind(), "CREATE", Some("team-a"), pod, None)).unwrap());
            let pod = json!({"metadata": meta, "spec": {"containers": [{"name": "c"}]}});
            same(&env, &serde_json::to_vec(&review(pod_kind(), "CREATE", None, pod, None)).unwrap());
        }

        /// AsyncActors of known fields, valid and not: all go the fast way, alike.
        #[test]
        fn structured_actors(
            image in proptest::option::of(prop::sample::select(vec!["i", "", "registry/img:1"])),
            handler in proptest::option::of(prop::sample::select(vec!["m.f", "a.B.c", "bad handler", ""])),
            flavors in proptest::collection::vec(prop::sample::select(vec!["gpu-small", "not-there", "X"]), 0..4),
            identity in (
                proptest::option::of(prop::sample::select(vec!["echo", "Bad_Name", "other"])),
                proptest::option::of(prop::sample::select(vec!["rabbitmq", "sqs", "nope"])),
            ),
            replicas in proptest::option::of(-2i32..5),
            scaling in proptest::option::of((proptest::option::of(-1i32..30), proptest::option::of(0i32..30), proptest::option::of(any::<bool>()))),
            timeout in proptest::option::of(prop::sample::select(vec!["30s", "0s", "bad", "2m"])),
            env in proptest::option::of(proptest::collection::vec(("[A-Z_]{0,3}", "[a-z]{0,2}"), 0..3)),
            node_selector in proptest::option::of(proptest::collection::btree_map("[a-z/.]{1,4}", "[a-z]{0,2}", 0..3)),
            old in proptest::option::of(proptest::option::of(prop::sample::select(vec!["echo", "renamed"]))),
            ns in proptest::option::of(prop::sample::select(vec!["team-a", "default"])),
        ) {
            let env_ = Env::new();
            let mut spec = serde_json::Map::new();
            let mut put = |k: &str, v: Option<Value>| { if let Some(v) = v { spec.insert(k.into(), v); } };
            put("image", image.map(Value::from));
            put("handler", handler.map(Value::from));
            put("flavors", (!flavors.is_empty()).then(|| json!(flavors)));
            put("actor", identity.0.map(Value::from));
            put("transport", identity.1.map(Value::from));
            put("replicas", replicas.map(Value::from));
            put("scaling", scaling.map(|(min, max, enabled)| {
                let mut m = serde_json::Map::new();
                if let Some(v) = min { m.insert("minReplicaCount".into(), v.into()); }
                if let Some(v) = max { m.insert("maxReplicaCount".into(), v.into()); }
                if let Some(v) = enabled { m.insert("enabled".into(), v.into()); }
                Value::Object(m)
            }));
            put("resiliency", timeout.map(|t| json!({"actorTimeout": t})));
            put("env", env.map(|e| json!(e.into_iter().map(|(n, v)| json!({"name": n, "value": v})).collect::<Vec<_>>())));
            put("nodeSelector", node_selector.map(|m| json!(m)));
            let a = actor("team-a", "echo", Value::Object(spec));
            let (op, old) = match old {
                None => ("CREATE", None),
                Some(actor_name) => {
                    let mut o = a.clone();
                    match actor_name {
                        Some(n) => o["spec"]["actor"] = json!(n),
                        None => { o.as_object_mut().map(|m| m.remove("spec")); }
                    }
                    ("UPDATE", Some(o))
                }
            };
            let body = serde_json::to_vec(&review(actor_kind(), op, ns, a, old)).unwrap();
            prop_assert_eq!(same(&env_, &body), Took::Actor);
        }

        /// AsyncActors whose spec is arbitrary JSON over the spec's own keys.
        #[test]
        fn arbitrary_actor_specs(spec in arb_spec_json(), old in proptest::option::of(arb_spec_json())) {
            let env = Env::new();
            let a = actor("team-a", "echo", spec);
            let (op, old) = match old {
                None => ("CREATE", None),
                Some(o) => ("UPDATE", Some(actor("team-a", "echo", o))),
            };
            same(&env, &serde_json::to_vec(&review(actor_kind(), op, Some("team-a"), a, old)).unwrap());
        }

        /// Arbitrary bytes: the same answer (and never a panic).
        #[test]
        fn arbitrary_bytes(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let env = Env::new();
            same(&env, &body);
        }
    }
}
