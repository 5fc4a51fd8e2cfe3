//! The fast pod path answers exactly as the reference path (kube's `AdmissionReview` parse,
//! whole-pod clone and diff, serde-encoded response): same response bytes, same outcome,
//! same errors, over a varied corpus and over fuzzed bodies.

mod common;

use std::collections::HashMap;

use asya_api::config::ClusterConfig;
use asya_api::flavor::{FlavorCatalog, FlavorDef, FlavorSource};
use asya_webhook::admission::{
    ActorLookup, Ctx, Endpoint, SettingsMemo, encode_review, encode_review_reference, handle,
    handle_pod_create, handle_reference,
};
use serde_json::{Value, json};

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
        let mut catalog = FlavorCatalog::new();
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

/// Checks one body on every endpoint and context; true when the fast path took it.
fn same(env: &Env, body: &[u8]) -> bool {
    let mut fast = false;
    for ctx in env.contexts() {
        for ep in [
            Endpoint::MutatePods,
            Endpoint::ValidateActors,
            Endpoint::MutateActors,
        ] {
            let got = answer(|| handle(ep, body, &ctx));
            let want = answer(|| handle_reference(ep, body, &ctx));
            assert_eq!(
                got,
                want,
                "{ep:?} native={} memo={}: {}",
                ctx.native_sidecar,
                ctx.memo.is_some(),
                String::from_utf8_lossy(body)
            );
        }
        fast |= handle_pod_create(body, &ctx).is_some();
    }
    fast
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
                        if same(&env, &body) {
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

/// Actor reviews: denials with causes, warnings, patches (only the encoding is new here).
#[test]
fn actor_reviews_answer_alike() {
    let env = Env::new();
    let kind = json!({"group": "asya.sh", "version": "v1alpha1", "kind": "AsyncActor"});
    for spec in [
        json!({"image": "i", "handler": "m.f", "flavors": ["gpu-small"]}),
        json!({"image": "i", "handler": "m.f", "flavors": ["not-there"]}),
        json!({"image": "i", "handler": "m.f", "scaling": {"minReplicas": 1, "maxReplicas": 4}}),
        json!({"handler": "not a handler", "imagePullPolicy": "Sometimes",
               "scaling": {"minReplicaCount": 5, "maxReplicaCount": 2}}),
    ] {
        for op in ["CREATE", "UPDATE", "DELETE"] {
            let a = actor("team-a", "echo", spec.clone());
            let body = serde_json::to_vec(&review(
                kind.clone(),
                op,
                Some("team-a"),
                a.clone(),
                Some(a),
            ))
            .unwrap();
            assert!(!same(&env, &body));
        }
    }
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
            prop_assert!(same(&env, &body));
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

        /// Arbitrary bytes: the same answer (and never a panic).
        #[test]
        fn arbitrary_bytes(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let env = Env::new();
            same(&env, &body);
        }
    }
}
