//! AdmissionReview fixtures through `admission::handle`, one test per path.

mod common;

use std::collections::HashMap;

use asya_api::config::ClusterConfig;
use asya_api::flavor::{FlavorCatalog, FlavorDef, FlavorSource};
use asya_webhook::admission::{BadRequest, Ctx, Endpoint, encode_review, handle, handle_general};
use serde_json::{Value, json};

struct Env {
    config: ClusterConfig,
    catalog: FlavorCatalog,
    actors: HashMap<(String, String), Value>,
}

impl Env {
    fn new() -> Self {
        let mut catalog = FlavorCatalog::new();
        catalog.insert(FlavorDef::from_data(
            "gpu-small",
            FlavorSource::Flavor,
            &json!({"nodeSelector": {"gpu": "t4"}}),
        ));
        catalog.insert(FlavorDef::from_data(
            "fast-scale",
            FlavorSource::Flavor,
            &json!({"scaling": {"minReplicaCount": 1}}),
        ));
        catalog.insert(FlavorDef::from_data(
            "slow-scale",
            FlavorSource::Flavor,
            &json!({"scaling": {"minReplicaCount": 2}}),
        ));
        Self {
            config: ClusterConfig::default(),
            catalog,
            actors: HashMap::new(),
        }
    }
    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            config: &self.config,
            catalog: &self.catalog,
            actors: &self.actors,
            native_sidecar: true,
            memo: None,
        }
    }
    fn run(&self, ep: Endpoint, review: &Value) -> Value {
        let h = handle(ep, &serde_json::to_vec(review).unwrap(), &self.ctx()).unwrap();
        let wire: Value = serde_json::from_slice(&encode_review(&h.review).unwrap()).unwrap();
        assert_eq!(wire["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(wire["kind"], "AdmissionReview");
        wire["response"].clone()
    }
}

fn actor(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
           "metadata": {"name": name, "namespace": "team-a"}, "spec": spec})
}

fn review(kind: Value, op: &str, object: Option<Value>, old: Option<Value>) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "0b6e4c3a-1111-2222-3333-444455556666",
            "kind": kind,
            "resource": {"group": "", "version": "v1", "resource": "x"},
            "name": object.as_ref().and_then(|o| o.pointer("/metadata/name")).cloned().unwrap_or(json!("x")),
            "namespace": "team-a",
            "operation": op,
            "userInfo": {"username": "alice"},
            "object": object,
            "oldObject": old,
            "dryRun": false
        }
    })
}

fn actor_kind() -> Value {
    json!({"group": "asya.sh", "version": "v1alpha1", "kind": "AsyncActor"})
}

fn pod_kind() -> Value {
    json!({"group": "", "version": "v1", "kind": "Pod"})
}

fn apply(obj: &Value, resp: &Value) -> Value {
    let patch_b64 = resp["patch"].as_str().expect("a patch");
    use base64_decode::decode;
    let ops: json_patch::Patch = serde_json::from_slice(&decode(patch_b64)).unwrap();
    let mut out = obj.clone();
    json_patch::patch(&mut out, &ops).unwrap();
    out
}

/// Tiny base64 decoder so the test does not depend on a crate for one call.
mod base64_decode {
    pub fn decode(s: &str) -> Vec<u8> {
        let table = |c: u8| -> u32 {
            match c {
                b'A'..=b'Z' => (c - b'A') as u32,
                b'a'..=b'z' => (c - b'a' + 26) as u32,
                b'0'..=b'9' => (c - b'0' + 52) as u32,
                b'+' => 62,
                b'/' => 63,
                _ => panic!("bad base64 {c}"),
            }
        };
        let bytes: Vec<u8> = s.bytes().filter(|&c| c != b'=').collect();
        let mut out = Vec::new();
        for chunk in bytes.chunks(4) {
            let mut n = 0u32;
            for (i, &c) in chunk.iter().enumerate() {
                n |= table(c) << (18 - 6 * i);
            }
            out.push((n >> 16) as u8);
            if chunk.len() > 2 {
                out.push((n >> 8) as u8);
            }
            if chunk.len() > 3 {
                out.push(n as u8);
            }
        }
        out
    }
}

fn patch_ops(resp: &Value) -> Vec<Value> {
    serde_json::from_slice(&base64_decode::decode(resp["patch"].as_str().unwrap())).unwrap()
}

#[test]
fn valid_actor_is_allowed_and_uid_echoed() {
    let env = Env::new();
    let a = actor(
        "echo",
        json!({"image": "python:3.13", "handler": "echo.handle", "flavors": ["gpu-small", "fast-scale"]}),
    );
    let r = env.run(
        Endpoint::ValidateActors,
        &review(actor_kind(), "CREATE", Some(a), None),
    );
    assert_eq!(r["uid"], "0b6e4c3a-1111-2222-3333-444455556666");
    assert_eq!(r["allowed"], true);
    assert!(r.get("patch").is_none());
    assert!(r.get("warnings").is_none(), "{r}");
}

#[test]
fn invalid_actor_lists_every_reason() {
    let env = Env::new();
    let a = actor(
        "Bad_Name",
        json!({
            "handler": "not a handler",
            "imagePullPolicy": "Sometimes",
            "scaling": {"minReplicaCount": 5, "maxReplicaCount": 2}
        }),
    );
    let r = env.run(
        Endpoint::ValidateActors,
        &review(actor_kind(), "CREATE", Some(a), None),
    );
    assert_eq!(r["allowed"], false);
    assert_eq!(r["status"]["code"], 422);
    assert_eq!(r["status"]["reason"], "Invalid");
    let msg = r["status"]["message"].as_str().unwrap();
    for needle in [
        "spec.actor",
        "spec.image",
        "spec.handler",
        "spec.imagePullPolicy",
        "minReplicaCount",
    ] {
        assert!(msg.contains(needle), "{needle} missing from: {msg}");
    }
    let causes = r["status"]["details"]["causes"].as_array().unwrap();
    assert!(causes.len() >= 5, "{causes:?}");
    // kubectl prints `* FIELD: MESSAGE`: the message must not name the field again.
    let handler = causes
        .iter()
        .find(|c| c["field"] == "spec.handler")
        .unwrap_or_else(|| panic!("no spec.handler cause: {causes:?}"));
    let m = handler["message"].as_str().unwrap();
    assert!(m.starts_with("Invalid value: \"not a handler\": "), "{m}");
}

#[test]
fn flavor_conflict_is_rejected_naming_both() {
    let env = Env::new();
    let a = actor(
        "echo",
        json!({"image": "i", "handler": "m.f", "flavors": ["fast-scale", "slow-scale"]}),
    );
    let r = env.run(
        Endpoint::ValidateActors,
        &review(actor_kind(), "CREATE", Some(a), None),
    );
    assert_eq!(r["allowed"], false);
    let msg = r["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("fast-scale")
            && msg.contains("slow-scale")
            && msg.contains("scaling.minReplicaCount"),
        "{msg}"
    );
}

#[test]
fn missing_flavor_is_a_warning() {
    let env = Env::new();
    let a = actor(
        "echo",
        json!({"image": "i", "handler": "m.f", "flavors": ["not-there"]}),
    );
    // From either endpoint: the mutating one is the only one the chart registers, and it
    // warns even when it has nothing to rewrite.
    for ep in [Endpoint::ValidateActors, Endpoint::MutateActors] {
        let r = env.run(ep, &review(actor_kind(), "CREATE", Some(a.clone()), None));
        assert_eq!(r["allowed"], true);
        let w = r["warnings"].as_array().unwrap();
        assert!(
            w.iter().any(|w| w.as_str().unwrap().contains("not-there")),
            "{ep:?}: {w:?}"
        );
    }
}

#[test]
fn mutate_rewrites_aliases_with_a_minimal_patch_and_warns() {
    let env = Env::new();
    let a = actor(
        "echo",
        json!({"image": "i", "handler": "m.f", "scaling": {"minReplicas": 1, "maxReplicas": 4}}),
    );
    let r = env.run(
        Endpoint::MutateActors,
        &review(actor_kind(), "CREATE", Some(a.clone()), None),
    );
    assert_eq!(r["allowed"], true);
    assert_eq!(r["patchType"], "JSONPatch");
    let patched = apply(&a, &r);
    assert_eq!(
        patched["spec"]["scaling"],
        json!({"minReplicaCount": 1, "maxReplicaCount": 4})
    );
    assert_eq!(patched["spec"]["actor"], "echo");
    assert_eq!(patched["spec"]["transport"], "rabbitmq");
    // Only the changed leaves, never a whole-object replace.
    for op in patch_ops(&r) {
        assert_ne!(op["path"], "/spec", "{op}");
        assert_ne!(op["path"], "", "{op}");
    }
    let w: Vec<&str> = r["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert!(w.iter().any(|w| w.contains("minReplicas")), "{w:?}");
    // The rewritten object passes validation without repeating the alias warnings.
    let v = env.run(
        Endpoint::ValidateActors,
        &review(actor_kind(), "CREATE", Some(patched.clone()), None),
    );
    assert_eq!(v["allowed"], true);
    assert!(v.get("warnings").is_none(), "{v}");
    // Mutating the rewritten object again changes nothing.
    let again = env.run(
        Endpoint::MutateActors,
        &review(actor_kind(), "CREATE", Some(patched), None),
    );
    assert!(again.get("patch").is_none(), "{again}");
}

#[test]
fn update_may_not_change_actor_or_transport() {
    let env = Env::new();
    let old = actor(
        "echo",
        json!({"actor": "echo", "transport": "rabbitmq", "image": "i", "handler": "m.f"}),
    );
    let new = actor(
        "echo",
        json!({"actor": "echo2", "transport": "sqs", "image": "i", "handler": "m.f"}),
    );
    let r = env.run(
        Endpoint::ValidateActors,
        &review(actor_kind(), "UPDATE", Some(new), Some(old.clone())),
    );
    assert_eq!(r["allowed"], false);
    let msg = r["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("spec.actor") && msg.contains("spec.transport") && msg.contains("immutable"),
        "{msg}"
    );
    assert!(
        msg.contains("asya-team-a-echo"),
        "says which queue depends on it: {msg}"
    );
    // Other changes are fine.
    let ok = actor(
        "echo",
        json!({"actor": "echo", "transport": "rabbitmq", "image": "i2", "handler": "m.g"}),
    );
    let r = env.run(
        Endpoint::ValidateActors,
        &review(actor_kind(), "UPDATE", Some(ok), Some(old)),
    );
    assert_eq!(r["allowed"], true, "{r}");
}

/// An UPDATE answered by both parses (the text parse of the validating endpoint and the
/// general one), on both actor endpoints.
fn run_update_everywhere(env: &Env, new: &Value, old: &Value) -> Vec<Value> {
    let body = review(actor_kind(), "UPDATE", Some(new.clone()), Some(old.clone()));
    let mut out = vec![];
    for ep in [Endpoint::ValidateActors, Endpoint::MutateActors] {
        out.push(env.run(ep, &body));
        let bytes = serde_json::to_vec(&body).unwrap();
        let h = handle_general(ep, &bytes, &env.ctx()).unwrap();
        let wire: Value = serde_json::from_slice(&encode_review(&h.review).unwrap()).unwrap();
        out.push(wire["response"].clone());
    }
    out
}

fn admitted_as_is(r: &Value) {
    assert_eq!(r["allowed"], true, "{r}");
    assert!(r.get("patch").is_none(), "no patch: {r}");
    assert!(r.get("warnings").is_none(), "no warnings: {r}");
}

#[test]
fn an_actor_being_deleted_passes_whatever_its_spec_says_now() {
    // Its flavors conflict now (edited after admission): the finalizer removal must pass.
    let env = Env::new();
    let spec = json!({"image": "i", "handler": "m.f", "flavors": ["fast-scale", "slow-scale"],
                      "scaling": {"minReplicas": 1}});
    let mut old = actor("echo", spec.clone());
    old["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    old["metadata"]["finalizers"] = json!(["asya.sh/queue-provisioner"]);
    let mut new = old.clone();
    new["metadata"]["finalizers"] = json!([]);
    for r in run_update_everywhere(&env, &new, &old) {
        admitted_as_is(&r);
    }
    // A spec edit of an actor being deleted is refused on both endpoints, both parses: it
    // would apply to nothing, and passing it unreviewed would let anything through.
    new["spec"]["image"] = json!("i2");
    for r in run_update_everywhere(&env, &new, &old) {
        assert_eq!(r["allowed"], false, "{r}");
        assert_eq!(r["status"]["code"], 422, "{r}");
        let msg = r["status"]["message"].as_str().unwrap();
        assert!(
            msg.starts_with("AsyncActor \"echo\" is invalid (1 error): spec: Forbidden: the AsyncActor is being deleted (metadata.deletionTimestamp is set)"),
            "{msg}"
        );
        assert_eq!(r["status"]["details"]["causes"][0]["field"], "spec", "{r}");
        assert!(r.get("warnings").is_none(), "{r}");
    }
}

#[test]
fn generate_name_is_refused_on_both_endpoints_before_any_identity_is_borrowed() {
    // `generateName: worker` with a template naming worker's own ServiceAccount: counted as
    // "its own" before (no SubjectAccessReview), with spec.actor defaulted to `worker`.
    let env = Env::new();
    let spec = json!({"workload": {"kind": "Deployment", "template": {"spec": {
        "serviceAccountName": "asya-worker",
        "containers": [{"name": "asya-runtime", "image": "i",
                        "env": [{"name": "ASYA_HANDLER", "value": "m.f"}]}]}}}});
    let mut obj = actor("x", spec);
    let meta = obj["metadata"].as_object_mut().unwrap();
    meta.remove("name");
    meta.insert("generateName".into(), json!("worker"));
    // The mutating webhook sees no name; the validating one sees the generated name.
    let mut named = obj.clone();
    named["metadata"]["name"] = json!("workerq7x2c");
    for (ep, o) in [
        (Endpoint::MutateActors, &obj),
        (Endpoint::ValidateActors, &named),
        (Endpoint::MutateActors, &named),
        (Endpoint::ValidateActors, &obj),
    ] {
        let rv = review(actor_kind(), "CREATE", Some(o.clone()), None);
        let bytes = serde_json::to_vec(&rv).unwrap();
        let fast = handle(ep, &bytes, &env.ctx()).unwrap();
        let general = handle_general(ep, &bytes, &env.ctx()).unwrap();
        for h in [fast, general] {
            assert!(
                h.privilege.is_none(),
                "nothing left to ask of the API server"
            );
            let wire: Value = serde_json::from_slice(&encode_review(&h.review).unwrap()).unwrap();
            let r = &wire["response"];
            assert_eq!(r["allowed"], false, "{r}");
            assert!(r.get("patch").is_none(), "{r}");
            let causes = r["status"]["details"]["causes"].as_array().unwrap();
            let gen_cause = causes
                .iter()
                .find(|c| c["field"] == "metadata.generateName")
                .unwrap_or_else(|| panic!("{r}"));
            assert!(
                gen_cause["message"].as_str().unwrap().starts_with(
                    "Invalid value: \"worker\": an AsyncActor is created with metadata.name"
                ),
                "{r}"
            );
        }
    }
}

#[test]
fn a_metadata_only_update_passes_without_review_warning_or_patch() {
    let env = Env::new();
    // Conflicting flavors, a missing flavor and an alias: each would deny, warn or patch.
    for spec in [
        json!({"image": "i", "handler": "m.f", "flavors": ["fast-scale", "slow-scale"]}),
        json!({"image": "i", "handler": "m.f", "flavors": ["not-there"]}),
        json!({"image": "i", "handler": "m.f", "scaling": {"minReplicas": 1}}),
    ] {
        let old = actor("echo", spec);
        let mut new = old.clone();
        new["metadata"]["labels"] = json!({"team": "a"});
        new["metadata"]["finalizers"] = json!(["asya.sh/queue-provisioner"]);
        for r in run_update_everywhere(&env, &new, &old) {
            admitted_as_is(&r);
        }
    }
}

#[test]
fn a_spec_change_is_still_reviewed() {
    let env = Env::new();
    let old = actor("echo", json!({"image": "i", "handler": "m.f"}));
    let new = actor(
        "echo",
        json!({"image": "i", "handler": "m.f", "flavors": ["fast-scale", "slow-scale"]}),
    );
    for r in run_update_everywhere(&env, &new, &old).iter().step_by(2) {
        assert_eq!(r["allowed"], false, "{r}");
    }
}

#[test]
fn delete_passes() {
    let env = Env::new();
    let old = actor("echo", json!({"image": "i", "handler": "m.f"}));
    for ep in [Endpoint::ValidateActors, Endpoint::MutateActors] {
        let r = env.run(ep, &review(actor_kind(), "DELETE", None, Some(old.clone())));
        assert_eq!(r["allowed"], true);
    }
}

#[test]
fn dry_run_gets_the_same_answer() {
    let env = Env::new();
    let a = actor(
        "echo",
        json!({"image": "i", "handler": "m.f", "scaling": {"minReplicas": 1}}),
    );
    let mut rv = review(actor_kind(), "CREATE", Some(a), None);
    let wet = env.run(Endpoint::MutateActors, &rv);
    rv["request"]["dryRun"] = json!(true);
    let dry = env.run(Endpoint::MutateActors, &rv);
    assert_eq!(wet, dry);
}

#[test]
fn wrong_kind_on_endpoint_is_denied_with_reason() {
    let env = Env::new();
    let p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}});
    let r = env.run(
        Endpoint::ValidateActors,
        &review(pod_kind(), "CREATE", Some(p), None),
    );
    assert_eq!(r["allowed"], false);
    assert_eq!(r["status"]["code"], 400);
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("AsyncActor")
    );
    let a = actor("echo", json!({"image": "i", "handler": "m.f"}));
    let r = env.run(
        Endpoint::MutatePods,
        &review(actor_kind(), "CREATE", Some(a), None),
    );
    assert_eq!(r["allowed"], false);
}

#[test]
fn bodies_that_are_not_reviews_are_bad_requests() {
    let env = Env::new();
    let ctx = env.ctx();
    let bad = |b: &[u8]| handle(Endpoint::ValidateActors, b, &ctx).unwrap_err();
    assert!(bad(b"").0.contains("not an AdmissionReview"));
    assert!(bad(b"\xff\xfe").0.contains("not an AdmissionReview"));
    assert!(
        bad(b"{\"kind\":\"Pod\",\"apiVersion\":\"v1\"}")
            .0
            .contains("AdmissionReview")
    );
    let no_req = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"});
    assert_eq!(
        bad(&serde_json::to_vec(&no_req).unwrap()),
        BadRequest("AdmissionReview has no request".into())
    );
    let v1beta1 =
        json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}});
    assert!(
        bad(&serde_json::to_vec(&v1beta1).unwrap())
            .0
            .contains("AdmissionReview")
    );
    let v1beta1 = json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"});
    assert!(
        bad(&serde_json::to_vec(&v1beta1).unwrap())
            .0
            .contains("expected apiVersion admission.k8s.io/v1")
    );
}

fn pod(labels: Value, annotations: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"generateName": "echo-", "namespace": "team-a", "labels": labels, "annotations": annotations},
           "spec": {"containers": [{"name": "asya-runtime", "image": "python:3.13"}]}})
}

#[test]
fn unlabelled_pod_is_untouched() {
    let env = Env::new();
    let r = env.run(
        Endpoint::MutatePods,
        &review(
            pod_kind(),
            "CREATE",
            Some(pod(json!({"app": "x"}), json!({}))),
            None,
        ),
    );
    assert_eq!(r["allowed"], true);
    assert!(r.get("patch").is_none());
}

#[test]
fn labelled_pod_without_configuration_is_rejected_saying_what_to_add() {
    let env = Env::new();
    let p = pod(
        json!({"asya.sh/inject": "true", "asya.sh/actor": "echo"}),
        json!({}),
    );
    let r = env.run(
        Endpoint::MutatePods,
        &review(pod_kind(), "CREATE", Some(p), None),
    );
    assert_eq!(r["allowed"], false);
    let msg = r["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("AsyncActor \"echo\"") && msg.contains("asya.sh/handler"),
        "{msg}"
    );
    let p = pod(json!({"asya.sh/inject": "true"}), json!({}));
    let r = env.run(
        Endpoint::MutatePods,
        &review(pod_kind(), "CREATE", Some(p), None),
    );
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("asya.sh/actor")
    );
}

#[test]
fn pod_with_handler_annotation_is_injected_with_escaped_paths() {
    let env = Env::new();
    let p = pod(
        json!({"asya.sh/inject": "true", "asya.sh/actor": "echo"}),
        json!({"asya.sh/handler": "echo.handle", "asya.sh/transport": "sqs", "a~b/c": "keep"}),
    );
    let r = env.run(
        Endpoint::MutatePods,
        &review(pod_kind(), "CREATE", Some(p.clone()), None),
    );
    assert_eq!(r["allowed"], true, "{r}");
    let ops = patch_ops(&r);
    // Annotation keys are JSON-pointer escaped: '/' → '~1', '~' → '~0'.
    assert!(
        ops.iter()
            .any(|o| o["path"] == "/metadata/annotations/asya.sh~1injected"),
        "{ops:?}"
    );
    let out = apply(&p, &r);
    assert_eq!(out["metadata"]["annotations"]["a~b/c"], "keep");
    let c = &out["spec"]["containers"][0];
    assert_eq!(
        c["command"],
        json!(["python3", "/opt/asya/asya_runtime.py"])
    );
    assert!(
        c["env"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "ASYA_HANDLER", "value": "echo.handle"}))
    );
    let sc = &out["spec"]["initContainers"][1];
    assert_eq!(sc["name"], "asya-sidecar");
    assert_eq!(sc["restartPolicy"], "Always");
    assert!(
        sc["env"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "ASYA_TRANSPORT", "value": "sqs"}))
    );

    // Injected pod → no second patch; UPDATE → never patched.
    let again = env.run(
        Endpoint::MutatePods,
        &review(pod_kind(), "CREATE", Some(out.clone()), None),
    );
    assert!(again.get("patch").is_none() && again["allowed"] == true);
    let upd = env.run(
        Endpoint::MutatePods,
        &review(pod_kind(), "UPDATE", Some(p.clone()), Some(p)),
    );
    assert!(upd.get("patch").is_none() && upd["allowed"] == true);
}

/// The injected sidecar's environment, by name.
fn sidecar_env(pod: &Value) -> HashMap<String, Value> {
    let sidecar = pod["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .chain(pod["spec"]["containers"].as_array())
        .flatten()
        .find(|c| c["name"] == "asya-sidecar")
        .expect("an injected sidecar");
    sidecar["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_string(), e.clone()))
        .collect()
}

#[test]
fn sidecar_gets_the_gateway_url_only_when_the_cluster_configuration_names_one() {
    let p = pod(
        json!({"asya.sh/inject": "true", "asya.sh/actor": "echo"}),
        json!({"asya.sh/handler": "echo.handle"}),
    );
    let inject = |env: &Env| {
        let r = env.run(
            Endpoint::MutatePods,
            &review(pod_kind(), "CREATE", Some(p.clone()), None),
        );
        assert_eq!(r["allowed"], true, "{r}");
        sidecar_env(&apply(&p, &r))
    };

    // A configuration without `gateway` (the chart's with gateway.enabled=false).
    let mut env = Env::new();
    env.config = ClusterConfig::from_yaml("defaultTransport: rabbitmq\n").unwrap();
    let without = inject(&env);
    assert!(without.contains_key("ASYA_ACTOR_NAME"), "{without:?}");
    assert!(!without.contains_key("ASYA_GATEWAY_URL"), "{without:?}");
    assert!(!without.contains_key("ASYA_GATEWAY_TOKEN"), "{without:?}");

    // The chart's with gateway.enabled=true: the sidecar reports to the gateway's Service.
    env.config = ClusterConfig::from_yaml(
        "defaultTransport: rabbitmq\n\
         gateway:\n  url: http://asya-gateway.asya-system.svc:8080\n",
    )
    .unwrap();
    let with = inject(&env);
    assert_eq!(
        with["ASYA_GATEWAY_URL"],
        json!({"name": "ASYA_GATEWAY_URL", "value": "http://asya-gateway.asya-system.svc:8080"})
    );
    assert!(!with.contains_key("ASYA_GATEWAY_TOKEN"), "{with:?}");

    // With the sidecars' token Secret: the token by reference.
    env.config = ClusterConfig::from_yaml(
        "defaultTransport: rabbitmq\n\
         gateway:\n  url: http://asya-gateway.asya-system.svc:8080\n  \
         tokenSecretRef: {name: gw-sidecar, key: token}\n",
    )
    .unwrap();
    let with = inject(&env);
    assert_eq!(
        with["ASYA_GATEWAY_URL"]["value"],
        "http://asya-gateway.asya-system.svc:8080"
    );
    assert_eq!(
        with["ASYA_GATEWAY_TOKEN"],
        json!({"name": "ASYA_GATEWAY_TOKEN",
               "valueFrom": {"secretKeyRef": {"name": "gw-sidecar", "key": "token", "optional": true}}})
    );
}

#[test]
fn invalid_annotations_are_rejected_by_the_same_rules() {
    let env = Env::new();
    let p = pod(
        json!({"asya.sh/inject": "true", "asya.sh/actor": "echo"}),
        json!({"asya.sh/handler": "no dots here", "asya.sh/transport": "kafka"}),
    );
    let r = env.run(
        Endpoint::MutatePods,
        &review(pod_kind(), "CREATE", Some(p), None),
    );
    assert_eq!(r["allowed"], false);
    let msg = r["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("spec.handler") && msg.contains("spec.transport"),
        "{msg}"
    );
}

#[test]
fn pod_takes_its_configuration_from_the_asyncactor() {
    let mut env = Env::new();
    env.actors.insert(
        ("team-a".into(), "echo".into()),
        actor(
            "echo",
            json!({"image": "python:3.13", "handler": "pkg.mod.Cls.run", "handlerMode": "envelope",
                              "pythonExecutable": "/usr/bin/python3.12",
                              "resiliency": {"actorTimeout": "90s"},
                              "sidecar": {"image": "registry.local/asya-sidecar:dev"}}),
        ),
    );
    let p = pod(
        json!({"asya.sh/inject": "true", "asya.sh/actor": "echo"}),
        json!({"asya.sh/handler": "ignored.because_actor"}),
    );
    let r = env.run(
        Endpoint::MutatePods,
        &review(pod_kind(), "CREATE", Some(p.clone()), None),
    );
    assert_eq!(r["allowed"], true, "{r}");
    let out = apply(&p, &r);
    let c = &out["spec"]["containers"][0];
    assert_eq!(
        c["command"],
        json!(["/usr/bin/python3.12", "/opt/asya/asya_runtime.py"])
    );
    let env_list = c["env"].as_array().unwrap();
    assert!(env_list.contains(&json!({"name": "ASYA_HANDLER", "value": "pkg.mod.Cls.run"})));
    assert!(env_list.contains(&json!({"name": "ASYA_HANDLER_MODE", "value": "envelope"})));
    let sc = &out["spec"]["initContainers"][1];
    assert_eq!(sc["image"], "registry.local/asya-sidecar:dev");
    assert!(
        sc["env"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "ASYA_RUNTIME_TIMEOUT", "value": "90s"}))
    );
}

#[test]
fn pod_of_an_invalid_asyncactor_is_rejected() {
    let mut env = Env::new();
    env.actors.insert(
        ("team-a".into(), "echo".into()),
        actor("echo", json!({"image": "i", "handler": "bad handler"})),
    );
    let p = pod(
        json!({"asya.sh/inject": "true", "asya.sh/actor": "echo"}),
        json!({}),
    );
    let r = env.run(
        Endpoint::MutatePods,
        &review(pod_kind(), "CREATE", Some(p), None),
    );
    assert_eq!(r["allowed"], false);
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("AsyncActor team-a/echo is invalid")
    );
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Arbitrary bytes: an answer (400 or a review), never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let env = Env::new();
            for ep in [Endpoint::ValidateActors, Endpoint::MutateActors, Endpoint::MutatePods] {
                let _ = handle(ep, &body, &env.ctx());
            }
        }

        /// Structurally valid reviews with arbitrary specs: always a review with the uid.
        #[test]
        fn arbitrary_specs_get_an_answer(
            spec in arb_json(3),
            op in prop::sample::select(vec!["CREATE", "UPDATE", "DELETE", "CONNECT"]),
        ) {
            let env = Env::new();
            let a = actor("echo", spec.clone());
            let p = json!({"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": "p", "labels": {"asya.sh/inject": "true", "asya.sh/actor": "echo"},
                                        "annotations": {"asya.sh/handler": "m.f"}},
                           "spec": spec});
            for (ep, kind, obj) in [
                (Endpoint::ValidateActors, actor_kind(), a.clone()),
                (Endpoint::MutateActors, actor_kind(), a.clone()),
                (Endpoint::MutatePods, pod_kind(), p),
            ] {
                let rv = review(kind, op, Some(obj.clone()), Some(obj));
                let h = handle(ep, &serde_json::to_vec(&rv).unwrap(), &env.ctx()).unwrap();
                let out = serde_json::to_value(&h.review).unwrap();
                prop_assert_eq!(&out["response"]["uid"], "0b6e4c3a-1111-2222-3333-444455556666");
            }
        }
    }

    fn arb_json(depth: u32) -> impl Strategy<Value = Value> {
        common::arb_json(
            depth,
            vec![
                "image",
                "handler",
                "actor",
                "transport",
                "flavors",
                "scaling",
                "minReplicas",
                "maxReplicaCount",
                "resiliency",
                "policies",
                "rules",
                "workload",
                "template",
                "containers",
                "env",
                "name",
                "value",
                "sidecar",
                "command",
                "replicas",
                "timeout",
                "processing",
                "x~y/z",
            ],
            true,
            32,
            6,
        )
    }
}

/// An actor store that knows resourceVersions, as the reflector store does.
struct Versioned(std::sync::Mutex<(Value, String)>);

impl asya_webhook::admission::ActorLookup for Versioned {
    fn get(&self, namespace: &str, name: &str) -> Option<Value> {
        self.get_versioned(namespace, name).map(|(v, _)| v)
    }
    fn get_versioned(&self, namespace: &str, name: &str) -> Option<(Value, Option<String>)> {
        let g = self.0.lock().unwrap();
        (namespace == "team-a" && name == "echo").then(|| (g.0.clone(), Some(g.1.clone())))
    }
    fn version(&self, namespace: &str, name: &str) -> Option<String> {
        self.get_versioned(namespace, name).and_then(|(_, v)| v)
    }
}

#[test]
fn injection_settings_are_kept_per_actor_version_and_catalog() {
    use asya_webhook::admission::{SettingsMemo, settings_for_pod};
    let env = Env::new();
    let store = Versioned(std::sync::Mutex::new((
        actor("echo", json!({"image": "i", "handler": "a.b"})),
        "1".into(),
    )));
    let memo = SettingsMemo::default();
    let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod(
        json!({"asya.sh/inject": "true", "asya.sh/actor": "echo"}),
        json!({}),
    ))
    .unwrap();
    let handler = |catalog: &FlavorCatalog| {
        let ctx = Ctx {
            config: &env.config,
            catalog,
            actors: &store,
            native_sidecar: true,
            memo: Some(&memo),
        };
        settings_for_pod(&p, "team-a", &ctx).unwrap().0.handler
    };
    assert_eq!(handler(&env.catalog).as_deref(), Some("a.b"));
    assert_eq!(memo.len(), 1);
    // Same resourceVersion: the kept answer (a store gives every change a new version).
    store.0.lock().unwrap().0 = actor("echo", json!({"image": "i", "handler": "c.d"}));
    assert_eq!(handler(&env.catalog).as_deref(), Some("a.b"));
    // A new version is reviewed again.
    store.0.lock().unwrap().1 = "2".into();
    assert_eq!(handler(&env.catalog).as_deref(), Some("c.d"));
    // So is anything under a changed flavor catalog.
    store.0.lock().unwrap().0 = actor("echo", json!({"image": "i", "handler": "e.f"}));
    let mut changed = env.catalog.clone();
    changed.insert(FlavorDef::from_data(
        "another",
        FlavorSource::Flavor,
        &json!({"nodeSelector": {"x": "y"}}),
    ));
    assert_ne!(changed.id(), env.catalog.id());
    assert_eq!(handler(&changed).as_deref(), Some("e.f"));
}

/// Finding 2 of issue 26: `team/a-x-sink` and namespace `team-a`'s end queue are one queue.
/// The refusal comes from both parses (the text fast path and `handle_general`), names the
/// field, the value, the rule and both owners, and holds in either order of creation.
#[test]
fn a_queue_name_owned_by_another_namespace_is_refused_naming_both() {
    let spec = json!({"image": "python:3.13", "handler": "echo.handle"});
    let in_ns = |ns: &str, name: &str| {
        let mut a = actor(name, spec.clone());
        a["metadata"]["namespace"] = json!(ns);
        a
    };
    let create = |ns: &str, a: &Value| {
        let mut r = review(actor_kind(), "CREATE", Some(a.clone()), None);
        r["request"]["namespace"] = json!(ns);
        r
    };
    // `team-a` has an actor (so its end queues exist); `team/a-x-sink` would drain them.
    let mut env = Env::new();
    env.actors
        .insert(("team-a".into(), "y".into()), in_ns("team-a", "y"));
    let body = create("team", &in_ns("team", "a-x-sink"));
    for r in [env.run(Endpoint::ValidateActors, &body), {
        let h = handle_general(
            Endpoint::ValidateActors,
            &serde_json::to_vec(&body).unwrap(),
            &env.ctx(),
        )
        .unwrap();
        let wire: Value = serde_json::from_slice(&encode_review(&h.review).unwrap()).unwrap();
        wire["response"].clone()
    }] {
        assert_eq!(r["allowed"], false, "{r}");
        let msg = r["status"]["message"].as_str().unwrap();
        assert!(
            msg.contains("metadata.name: Invalid value: \"a-x-sink\""),
            "{msg}"
        );
        assert!(msg.contains("AsyncActor team/a-x-sink"), "{msg}");
        assert!(
            msg.contains("end queue x-sink of namespace \"team-a\""),
            "{msg}"
        );
        assert_eq!(
            r["status"]["details"]["causes"][0]["field"],
            "metadata.name"
        );
    }
    // The mutating endpoint refuses alike: the chart registers only it (one call per actor).
    let r = env.run(Endpoint::MutateActors, &body);
    assert_eq!(r["allowed"], false, "{r}");
    let msg = r["status"]["message"].as_str().unwrap();
    assert!(msg.contains("AsyncActor team/a-x-sink"), "{msg}");

    // The reverse order: `team/a-x-sink` exists; `team-a`'s first actor would create its
    // end queue `asya-team-a-x-sink`.
    let mut env = Env::new();
    env.actors.insert(
        ("team".into(), "a-x-sink".into()),
        in_ns("team", "a-x-sink"),
    );
    let r = env.run(
        Endpoint::ValidateActors,
        &create("team-a", &in_ns("team-a", "y")),
    );
    assert_eq!(r["allowed"], false, "{r}");
    let msg = r["status"]["message"].as_str().unwrap();
    assert!(msg.contains("AsyncActor team/a-x-sink"), "{msg}");
    assert!(msg.contains("\"asya-team-a-x-sink\""), "{msg}");

    // An UPDATE claims no new queue: an actor admitted before the check stays editable.
    let old = in_ns("team-a", "y");
    let mut new = old.clone();
    new["spec"]["image"] = json!("python:3.12");
    let mut body = review(actor_kind(), "UPDATE", Some(new), Some(old));
    body["request"]["namespace"] = json!("team-a");
    assert_eq!(env.run(Endpoint::ValidateActors, &body)["allowed"], true);
}

#[test]
fn a_namespace_at_its_actor_limit_takes_no_new_actor() {
    let mut env = Env::new();
    env.config.policy.max_actors_per_namespace = Some(2);
    for name in ["one", "two"] {
        env.actors.insert(
            ("team-a".into(), name.into()),
            actor(name, json!({"image": "i", "handler": "m.f"})),
        );
    }
    let new = actor("three", json!({"image": "i", "handler": "m.f"}));
    let create = review(actor_kind(), "CREATE", Some(new.clone()), None);
    let bytes = serde_json::to_vec(&create).unwrap();
    for ep in [Endpoint::MutateActors, Endpoint::ValidateActors] {
        for h in [
            handle(ep, &bytes, &env.ctx()).unwrap(),
            handle_general(ep, &bytes, &env.ctx()).unwrap(),
        ] {
            assert!(h.privilege.is_none());
            let wire: Value = serde_json::from_slice(&encode_review(&h.review).unwrap()).unwrap();
            let r = &wire["response"];
            assert_eq!(r["allowed"], false, "{r}");
            assert_eq!(
                r["status"]["details"]["causes"][0]["field"],
                "metadata.namespace"
            );
            let msg = r["status"]["message"].as_str().unwrap();
            assert!(
                msg.contains("namespace \"team-a\" already holds 2 AsyncActors, at the limit of 2 (policy.maxActorsPerNamespace in the cluster configuration)"),
                "{msg}"
            );
        }
    }
    // An UPDATE of an actor already there is no new actor; another namespace has room.
    let old = env.actors[&("team-a".to_string(), "one".to_string())].clone();
    let mut edited = old.clone();
    edited["spec"]["replicas"] = json!(2);
    let r = env.run(
        Endpoint::MutateActors,
        &review(actor_kind(), "UPDATE", Some(edited), Some(old)),
    );
    assert_eq!(r["allowed"], true, "{r}");
    let mut elsewhere = review(actor_kind(), "CREATE", Some(new), None);
    elsewhere["request"]["namespace"] = json!("team-b");
    elsewhere["request"]["object"]["metadata"]["namespace"] = json!("team-b");
    assert_eq!(env.run(Endpoint::MutateActors, &elsewhere)["allowed"], true);
    // No limit configured: the full namespace takes it.
    env.config.policy.max_actors_per_namespace = None;
    assert_eq!(env.run(Endpoint::MutateActors, &create)["allowed"], true);
}

#[test]
fn an_actor_stored_before_the_spec_limit_was_lowered_still_gets_its_pods_injected() {
    // Admission's own rules (the spec cap, names) are not asked of a stored actor: its pods
    // are injected, on both parses. Only its next spec change meets the new limit.
    let mut env = Env::new();
    env.config.policy.max_spec_bytes = 64;
    let spec = json!({"image": "python:3.13", "handler": "pkg.mod.run",
                      "env": [{"name": "PAD", "value": "x".repeat(200)}]});
    env.actors.insert(
        ("team-a".into(), "echo".into()),
        actor("echo", spec.clone()),
    );
    let p = pod(
        json!({"asya.sh/inject": "true", "asya.sh/actor": "echo"}),
        json!({}),
    );
    let rv = review(pod_kind(), "CREATE", Some(p), None);
    let bytes = serde_json::to_vec(&rv).unwrap();
    for h in [
        handle(Endpoint::MutatePods, &bytes, &env.ctx()).unwrap(),
        handle_general(Endpoint::MutatePods, &bytes, &env.ctx()).unwrap(),
    ] {
        let wire: Value = serde_json::from_slice(&encode_review(&h.review).unwrap()).unwrap();
        assert_eq!(wire["response"]["allowed"], true, "{wire}");
        assert!(wire["response"]["patch"].is_string(), "{wire}");
    }
    let mut edited = actor("echo", spec.clone());
    edited["spec"]["replicas"] = json!(2);
    let r = env.run(
        Endpoint::MutateActors,
        &review(
            actor_kind(),
            "UPDATE",
            Some(edited),
            Some(actor("echo", spec)),
        ),
    );
    assert_eq!(r["allowed"], false, "{r}");
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("(policy.maxSpecBytes in the cluster configuration)"),
        "{r}"
    );
}
