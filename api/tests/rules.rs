//! Every rule of docs/DESIGN.md §2 and §3: one object that passes and one that fails, asserting
//! the exact message.

use asya_api::config::{ClusterConfig, Policy};
use asya_api::flavor::{FlavorCatalog, FlavorDef, FlavorSource};
use asya_api::review::{ReviewRequest, review_actor};
use serde_json::{Value, json};

fn catalog() -> FlavorCatalog {
    let mut c = FlavorCatalog::new();
    for (name, data) in [
        (
            "gpu-a100",
            json!({"scaling": {"minReplicaCount": 1, "maxReplicaCount": 4}, "nodeSelector": {"accelerator": "a100"}}),
        ),
        ("flavor-a", json!({"scaling": {"minReplicaCount": 1}})),
        ("flavor-b", json!({"scaling": {"minReplicaCount": 5}})),
        ("big-max", json!({"scaling": {"maxReplicaCount": 500}})),
    ] {
        c.insert(FlavorDef::from_data(name, FlavorSource::Flavor, &data));
    }
    c
}

fn actor(spec: Value) -> Value {
    json!({"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor", "metadata": {"name": "my-actor", "namespace": "prod"}, "spec": spec})
}

fn flat(extra: Value) -> Value {
    let mut spec = json!({"image": "ghcr.io/org/img:1", "handler": "mod.fn"});
    if let (Some(s), Value::Object(e)) = (spec.as_object_mut(), extra) {
        s.extend(e);
    }
    actor(spec)
}

fn errors_with(obj: &Value, config: &ClusterConfig) -> Vec<String> {
    let cat = catalog();
    let r = review_actor(&ReviewRequest {
        object: obj,
        old_object: None,
        namespace: None,
        catalog: &cat,
        config,
    });
    r.errors.iter().map(ToString::to_string).collect()
}

fn errors(obj: &Value) -> Vec<String> {
    errors_with(obj, &ClusterConfig::default())
}

#[track_caller]
fn ok(obj: Value) {
    assert_eq!(errors(&obj), Vec::<String>::new(), "{obj}");
}

#[track_caller]
fn rejects(obj: Value, expected: &str) {
    let errs = errors(&obj);
    assert!(
        errs.iter().any(|e| e == expected),
        "expected {expected:?} among {errs:#?}"
    );
}

#[test]
fn actor_is_a_dns_label() {
    ok(flat(json!({"actor": "image-enhancer"})));
    ok(flat(json!({"actor": "a".repeat(63)})));
    rejects(
        flat(json!({"actor": "Image_Enhancer"})),
        r#"spec.actor: Invalid value: "Image_Enhancer": must be a DNS label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit"#,
    );
    rejects(
        flat(json!({"actor": "a".repeat(64)})),
        &format!(
            r#"spec.actor: Invalid value: "{}": must be a DNS label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit"#,
            "a".repeat(64)
        ),
    );
    rejects(
        flat(json!({"actor": "-a"})),
        r#"spec.actor: Invalid value: "-a": must be a DNS label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit"#,
    );
}

#[test]
fn actor_defaults_to_metadata_name() {
    let cat = catalog();
    let cfg = ClusterConfig::default();
    let obj = flat(json!({}));
    let r = review_actor(&ReviewRequest {
        object: &obj,
        old_object: None,
        namespace: None,
        catalog: &cat,
        config: &cfg,
    });
    assert_eq!(
        r.mutated.as_ref().and_then(|m| m.pointer("/spec/actor")),
        Some(&json!("my-actor"))
    );
    assert_eq!(
        r.mutated
            .as_ref()
            .and_then(|m| m.pointer("/spec/transport")),
        Some(&json!("rabbitmq"))
    );
    let resolved = r.resolved.expect("valid");
    assert_eq!(resolved.queue, "asya-prod-my-actor");
    assert_eq!(resolved.actor_timeout, std::time::Duration::from_secs(300));
}

#[test]
fn image_handler_python_not_empty() {
    rejects(
        actor(json!({"handler": "m.f"})),
        "spec.image: Required value: the container image with the handler code (or use spec.workload.template)",
    );
    rejects(
        actor(json!({"image": "x"})),
        "spec.handler: Required value: module.function or module.Class.method",
    );
    rejects(
        flat(json!({"image": ""})),
        r#"spec.image: Invalid value: "": must not be empty"#,
    );
    rejects(
        flat(json!({"pythonExecutable": " "})),
        r#"spec.pythonExecutable: Invalid value: " ": must not be empty"#,
    );
    ok(flat(json!({"pythonExecutable": "/opt/conda/bin/python"})));
}

#[test]
fn handler_pattern() {
    ok(flat(json!({"handler": "enhancer.SDXLEnhancer.process"})));
    ok(flat(json!({"handler": "_private.fn_2"})));
    for bad in [
        "handler", "mod.", "1mod.fn", "mod..fn", "mod.fn()", "mod-x.fn",
    ] {
        rejects(
            flat(json!({"handler": bad})),
            &format!(
                r#"spec.handler: Invalid value: "{bad}": must be module.function or module.Class.method (Python identifiers joined by dots)"#
            ),
        );
    }
}

#[test]
fn workload_shape_needs_runtime_container() {
    let wl = |containers: Value| {
        actor(
            json!({"workload": {"kind": "Deployment", "template": {"spec": {"containers": containers}}}}),
        )
    };
    ok(wl(
        json!([{"name": "asya-runtime", "image": "x", "env": [{"name": "ASYA_HANDLER", "value": "m.f"}]}]),
    ));
    rejects(
        wl(json!([{"name": "main", "image": "x"}])),
        "spec.workload.template.spec.containers: Required value: a container named asya-runtime (found: main)",
    );
    rejects(
        actor(json!({"workload": {"kind": "Deployment"}})),
        "spec.workload.template.spec: Required value: a pod template with a container named asya-runtime",
    );
    rejects(
        wl(
            json!([{"name": "asya-runtime", "image": "x", "env": [{"name": "ASYA_HANDLER", "value": "nodots"}]}]),
        ),
        r#"spec.workload.template.spec.containers[0].env[ASYA_HANDLER].value: Invalid value: "nodots": must be module.function or module.Class.method (Python identifiers joined by dots)"#,
    );
    rejects(
        wl(json!([{"name": "asya-runtime", "image": "x", "command": ["python", "app.py"]}])),
        r#"spec.workload.template.spec.containers[0].command: Forbidden: ["python","app.py"] is managed by Asya (it starts the Asya runtime); use spec.pythonExecutable to choose the interpreter"#,
    );
    rejects(
        actor(
            json!({"workload": {"kind": "Job", "template": {"spec": {"containers": [{"name": "asya-runtime", "image": "x"}]}}}}),
        ),
        r#"spec.workload.kind: Unsupported value: "Job": supported values: "Deployment", "StatefulSet""#,
    );
    rejects(
        actor(
            json!({"workload": {"volumeClaimTemplates": [{"metadata": {"name": "d"}}], "template": {"spec": {"containers": [{"name": "asya-runtime", "image": "x"}]}}}}),
        ),
        "spec.workload.volumeClaimTemplates: Forbidden: only a StatefulSet workload has volume claim templates; set spec.workload.kind: StatefulSet",
    );
}

#[test]
fn command_is_managed_by_asya() {
    rejects(
        flat(json!({"command": ["python"]})),
        "spec.command: Forbidden: the runtime container's command is managed by Asya; use spec.pythonExecutable to choose the interpreter",
    );
}

#[test]
fn enums() {
    for p in ["Always", "IfNotPresent", "Never"] {
        ok(flat(json!({"imagePullPolicy": p})));
    }
    rejects(
        flat(json!({"imagePullPolicy": "Sometimes"})),
        r#"spec.imagePullPolicy: Unsupported value: "Sometimes": supported values: "Always", "IfNotPresent", "Never""#,
    );
    ok(flat(json!({"handlerMode": "envelope"})));
    rejects(
        flat(json!({"handlerMode": "stream"})),
        r#"spec.handlerMode: Unsupported value: "stream": supported values: "payload", "envelope""#,
    );
}

#[test]
fn replicas_and_scaling_bounds() {
    ok(flat(json!({"replicas": 1, "scaling": {"enabled": false}})));
    rejects(
        flat(json!({"replicas": 0})),
        "spec.replicas: Invalid value: 0: must be >= 1",
    );
    ok(flat(
        json!({"scaling": {"minReplicaCount": 0, "maxReplicaCount": 1}}),
    ));
    rejects(
        flat(json!({"scaling": {"minReplicaCount": 20, "maxReplicaCount": 5}})),
        "spec.scaling.minReplicaCount: Invalid value: 20: must be <= maxReplicaCount (5)",
    );
    // The default maximum (10) counts too.
    rejects(
        flat(json!({"scaling": {"minReplicaCount": 11}})),
        "spec.scaling.minReplicaCount: Invalid value: 11: must be <= maxReplicaCount (10)",
    );
    rejects(
        flat(json!({"scaling": {"minReplicaCount": -1}})),
        "spec.scaling.minReplicaCount: Invalid value: -1: must be >= 0",
    );
    rejects(
        flat(json!({"scaling": {"maxReplicaCount": 0}})),
        "spec.scaling.maxReplicaCount: Invalid value: 0: must be >= 1",
    );
    rejects(
        flat(json!({"scaling": {"queueLength": 0}})),
        "spec.scaling.queueLength: Invalid value: 0: must be >= 1",
    );
    rejects(
        flat(json!({"scaling": {"pollingInterval": 0}})),
        "spec.scaling.pollingInterval: Invalid value: 0: must be >= 1",
    );
    rejects(
        flat(json!({"scaling": {"cooldownPeriod": 0}})),
        "spec.scaling.cooldownPeriod: Invalid value: 0: must be >= 1",
    );
}

#[test]
fn type_errors_name_the_field() {
    rejects(
        flat(json!({"scaling": {"maxReplicaCount": "many"}})),
        r#"spec.scaling.maxReplicaCount: Invalid value: "many": invalid type: string "many", expected i32"#,
    );
}

#[test]
fn flavor_list_rules() {
    ok(flat(json!({"flavors": ["gpu-a100"]})));
    let nine: Vec<String> = (0..9).map(|i| format!("flv-{i}")).collect();
    rejects(
        flat(json!({"flavors": nine})),
        "spec.flavors: Too many: 9: must have at most 8 items",
    );
    rejects(
        flat(json!({"flavors": ["ab"]})),
        r#"spec.flavors[0]: Invalid value: "ab": must be at least 3 characters"#,
    );
    rejects(
        flat(json!({"flavors": ["gpu-a100", "gpu-a100"]})),
        r#"spec.flavors[1]: Duplicate value: "gpu-a100""#,
    );
    // The list's own errors are reported even when the flavors it names conflict.
    let mut nine_conflicting = vec!["flavor-a".to_string(), "flavor-b".to_string()];
    nine_conflicting.extend((0..7).map(|i| format!("flv-{i}")));
    let errs = errors(&flat(json!({"flavors": nine_conflicting})));
    assert!(
        errs.iter()
            .any(|e| e == "spec.flavors: Too many: 9: must have at most 8 items")
            && errs.iter().any(|e| e.contains("flavor merge conflict")),
        "{errs:#?}"
    );
}

#[test]
fn flavor_conflict_and_inline_override() {
    rejects(
        flat(json!({"flavors": ["flavor-a", "flavor-b"]})),
        r#"flavor merge conflict: flavors "flavor-a" and "flavor-b" conflict on scaling.minReplicaCount"#,
    );
    // The actor setting the key inline does not remove the conflict between the flavors.
    rejects(
        flat(json!({"flavors": ["flavor-a", "flavor-b"], "scaling": {"minReplicaCount": 2}})),
        r#"flavor merge conflict: flavors "flavor-a" and "flavor-b" conflict on scaling.minReplicaCount"#,
    );
    // A value from a flavor is attributed to it.
    rejects(
        flat(json!({"flavors": ["big-max"]})),
        r#"spec.scaling.maxReplicaCount: Invalid value: 500: exceeds the replica ceiling 100 of policy maxReplicas; lower it, or ask a cluster admin to raise policy.maxReplicas (set by flavor "big-max")"#,
    );
}

#[test]
fn missing_flavor_is_admitted_with_warning_even_without_image() {
    let cat = catalog();
    let cfg = ClusterConfig::default();
    let obj = actor(json!({"handler": "m.f", "flavors": ["not-yet"]}));
    let r = review_actor(&ReviewRequest {
        object: &obj,
        old_object: None,
        namespace: None,
        catalog: &cat,
        config: &cfg,
    });
    assert!(r.allowed(), "{:?}", r.errors);
    assert_eq!(r.missing_flavors, vec!["not-yet".to_string()]);
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains(r#"flavor "not-yet" not found"#))
    );
}

#[test]
fn resiliency_rules() {
    let res = |r: Value| flat(json!({"resiliency": r}));
    ok(res(
        json!({"actorTimeout": "300s", "policies": {"default": {"maxAttempts": 3, "backoff": "exponential", "initialInterval": "2s", "maxInterval": "60s"}},
        "rules": [{"match": "RateLimitError", "policy": "default"}, {"match": "ContentPolicyViolation", "action": "fail"}]}),
    ));
    ok(res(json!({"actorTimeout": "1h30m"})));
    rejects(
        res(json!({"actorTimeout": "5 minutes"})),
        r#"spec.resiliency.actorTimeout: Invalid value: "5 minutes": must be a duration such as 300s, 5m or 1h30m (units: ms, s, m, h)"#,
    );
    rejects(
        res(json!({"actorTimeout": "0s"})),
        r#"spec.resiliency.actorTimeout: Invalid value: "0s": must be greater than zero"#,
    );
    rejects(
        res(json!({"policies": {"p": {"backoff": "random"}}})),
        r#"spec.resiliency.policies.p.backoff: Unsupported value: "random": supported values: "constant", "linear", "exponential""#,
    );
    rejects(
        res(json!({"policies": {"p": {"maxAttempts": 0}}})),
        "spec.resiliency.policies.p.maxAttempts: Invalid value: 0: must be >= 1",
    );
    rejects(
        res(json!({"policies": {"p": {"initialInterval": "2m", "maxInterval": "60s"}}})),
        r#"spec.resiliency.policies.p.initialInterval: Invalid value: "2m": must be <= maxInterval (60s)"#,
    );
    // The default maxInterval (60s) counts too.
    rejects(
        res(json!({"policies": {"p": {"initialInterval": "2m"}}})),
        r#"spec.resiliency.policies.p.initialInterval: Invalid value: "2m": must be <= maxInterval (60s)"#,
    );
    rejects(
        res(json!({"rules": [{"match": "X", "policy": "nope"}]})),
        r#"spec.resiliency.rules[0].policy: Invalid value: "nope": no such policy in spec.resiliency.policies (defined: none)"#,
    );
    rejects(
        res(json!({"rules": [{"match": "X"}]})),
        "spec.resiliency.rules[0].policy: Required value: a policy name, or action: fail",
    );
    rejects(
        res(json!({"rules": [{"match": "X", "action": "skip"}]})),
        r#"spec.resiliency.rules[0].action: Unsupported value: "skip": supported values: "fail""#,
    );
    rejects(
        res(json!({"rules": [{"action": "fail"}]})),
        "spec.resiliency.rules[0].match: Required value: the error type or message text this rule matches",
    );
}

#[test]
fn aliases_are_rewritten_with_warnings() {
    let cat = catalog();
    let cfg = ClusterConfig::default();
    let obj = flat(
        json!({"scaling": {"minReplicas": 0, "maxReplicas": 50}, "resiliency": {"policies": {"t": {"initialDelay": "1s"}}, "rules": [{"errors": ["A", "B"], "policy": "t"}]}}),
    );
    let r = review_actor(&ReviewRequest {
        object: &obj,
        old_object: None,
        namespace: None,
        catalog: &cat,
        config: &cfg,
    });
    assert!(r.allowed(), "{:?}", r.errors);
    let m = r.mutated.unwrap();
    assert_eq!(
        m.pointer("/spec/scaling"),
        Some(&json!({"minReplicaCount": 0, "maxReplicaCount": 50}))
    );
    assert_eq!(
        m.pointer("/spec/resiliency/rules/1"),
        Some(&json!({"match": "B", "policy": "t"}))
    );
    assert_eq!(r.warnings.len(), 4, "{:?}", r.warnings);
    rejects(
        flat(json!({"scaling": {"minReplicas": 1, "minReplicaCount": 2}})),
        "spec.scaling.minReplicas: Invalid value: 1: is an alias of spec.scaling.minReplicaCount, which is set to 2; set only spec.scaling.minReplicaCount",
    );
}

#[test]
fn transport_must_be_enabled_and_queue_must_fit() {
    ok(flat(json!({"transport": "sqs"})));
    rejects(
        flat(json!({"transport": "kafka"})),
        r#"spec.transport: Unsupported value: "kafka": supported values: "rabbitmq", "sqs""#,
    );
    let mut cfg = ClusterConfig::default();
    cfg.transports.get_mut("sqs").unwrap().enabled = false;
    let errs = errors_with(&flat(json!({"transport": "sqs"})), &cfg);
    assert_eq!(errs, vec![r#"spec.transport: Invalid value: "sqs": transport is not enabled in this cluster (enabled: rabbitmq)"#.to_string()]);
    let long = "a".repeat(63);
    // asya-prod-{63 chars} is 73 characters: fits.
    ok(flat(json!({"transport": "sqs", "actor": long})));
    let mut far = flat(json!({"transport": "sqs", "actor": long}));
    far["metadata"]["namespace"] = json!("team-namespace-x");
    rejects(
        far.clone(),
        &format!(
            r#"spec.actor: Invalid value: "{long}": queue name "asya-team-namespace-x-{long}" does not fit SQS: at most 80 characters of [A-Za-z0-9_-] (namespace and actor together)"#
        ),
    );
    far["spec"]["transport"] = json!("rabbitmq");
    ok(far);
}

#[test]
fn actor_and_transport_are_immutable() {
    let cat = catalog();
    let cfg = ClusterConfig::default();
    let old = flat(json!({"actor": "one"}));
    let new = flat(json!({"actor": "two", "transport": "sqs"}));
    let r = review_actor(&ReviewRequest {
        object: &new,
        old_object: Some(&old),
        namespace: None,
        catalog: &cat,
        config: &cfg,
    });
    let errs: Vec<String> = r.errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        errs,
        vec![
            r#"spec.actor: Invalid value: "two": field is immutable (was "one"): the actor's queue asya-prod-one lives on it; create a new AsyncActor instead"#.to_string(),
            r#"spec.transport: Invalid value: "sqs": field is immutable (was "rabbitmq"): the actor's queue asya-prod-one lives on it; create a new AsyncActor instead"#.to_string(),
        ]
    );
    // Spelling out the defaults is not a change.
    let same = flat(json!({"actor": "my-actor", "transport": "rabbitmq", "replicas": 2}));
    let r = review_actor(&ReviewRequest {
        object: &same,
        old_object: Some(&flat(json!({}))),
        namespace: None,
        catalog: &cat,
        config: &cfg,
    });
    assert!(r.allowed(), "{:?}", r.errors);
}

#[test]
fn policy_rules() {
    let cfg = ClusterConfig {
        policy: Policy {
            allowed_registries: vec!["ghcr.io/org".into()],
            require_resource_limits: true,
            max_replicas: 20,
            ..Policy::default()
        },
        ..ClusterConfig::default()
    };
    let good = flat(json!({"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}));
    assert_eq!(errors_with(&good, &cfg), Vec::<String>::new());
    let bad = actor(
        json!({"image": "docker.io/x/y", "handler": "m.f", "scaling": {"maxReplicaCount": 30}, "secretRefs": [{"name": "s", "namespace": "other"}]}),
    );
    let errs = errors_with(&bad, &cfg);
    assert_eq!(errs.len(), 4, "{errs:#?}");
    assert!(errs[0].starts_with(r#"spec.image: Forbidden: image "docker.io/x/y" is not from an allowed registry (policy allowedRegistries: ghcr.io/org)"#), "{errs:#?}");
    assert!(errs.iter().any(|e| {
        e.starts_with(r#"spec.secretRefs[0].namespace: Forbidden: secret in namespace "other""#)
    }));
    assert!(errs.iter().any(|e| e.starts_with("spec.resources.limits: Required value: cpu and memory limit required by policy requireResourceLimits")));
    assert!(errs.iter().any(|e| e.starts_with("spec.scaling.maxReplicaCount: Invalid value: 30: exceeds the replica ceiling 20 of policy maxReplicas")));
}

#[test]
fn every_error_at_once() {
    let errs = errors(&actor(
        json!({"actor": "Bad", "image": "", "handler": "x", "replicas": 0, "imagePullPolicy": "x", "scaling": {"queueLength": 0}}),
    ));
    assert_eq!(errs.len(), 6, "{errs:#?}");
}

/// An accepted object, serialised back as the webhook stores it, reviews to the same result:
/// same effective actor, nothing left to rewrite.
#[test]
fn accepted_objects_round_trip() {
    let cat = catalog();
    let cfg = ClusterConfig::default();
    let objects = [
        flat(
            json!({"flavors": ["gpu-a100"], "scaling": {"minReplicas": 0}, "resiliency": {"policies": {"default": {"initialDelay": "1s"}}, "rules": [{"errors": ["E1"], "policy": "default"}]}}),
        ),
        actor(
            json!({"transport": "sqs", "timeout": {"processing": 600}, "workload": {"type": "StatefulSet", "template": {"spec": {"containers": [{"name": "asya-runtime", "image": "x", "env": [{"name": "ASYA_HANDLER", "value": "a.b"}]}]}}}}),
        ),
        flat(
            json!({"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}], "tolerations": [{"key": "k", "operator": "Exists"}], "resources": {"limits": {"nvidia.com/gpu": 1}}}),
        ),
    ];
    for obj in objects {
        let first = review_actor(&ReviewRequest {
            object: &obj,
            old_object: None,
            namespace: None,
            catalog: &cat,
            config: &cfg,
        });
        assert!(first.allowed(), "{:?}", first.errors);
        let stored = first.mutated.clone().unwrap();
        let text = serde_json::to_string(&stored).unwrap();
        let reread: Value = serde_json::from_str(&text).unwrap();
        let second = review_actor(&ReviewRequest {
            object: &reread,
            old_object: Some(&stored),
            namespace: None,
            catalog: &cat,
            config: &cfg,
        });
        assert!(second.allowed(), "{:?}", second.errors);
        assert_eq!(
            second.mutated.as_ref(),
            Some(&stored),
            "mutation is idempotent"
        );
        assert_eq!(second.resolved, first.resolved);
        assert!(
            second
                .warnings
                .iter()
                .all(|w| !w.contains("deprecated: rewritten")),
            "{:?}",
            second.warnings
        );
    }
}

#[test]
fn state_proxy_entries_are_complete_and_stay_off_the_runtimes_paths() {
    let sp = |name: &str, path: &str| {
        json!({"name": name, "mount": {"path": path}, "writeMode": "passthrough",
               "connector": {"image": "ghcr.io/asya-rs/asya-state-proxy:0.1.0"}})
    };
    ok(flat(
        json!({"stateProxy": [sp("checkpoints", "/state/checkpoints"), sp("cache", "/state/cache")]}),
    ));
    rejects(
        flat(json!({"stateProxy": [sp("checkpoints", "/state"), sp("cache", "/state/cache")]})),
        r#"spec.stateProxy[1].mount.path: Invalid value: "/state/cache": must not be nested with spec.stateProxy[0].mount.path "/state": a file would belong to two connectors"#,
    );
    rejects(
        flat(json!({"stateProxy": [sp("sockets", "/var/run/asya/state")]})),
        r#"spec.stateProxy[0].mount.path: Invalid value: "/var/run/asya/state": must not be on, under or above /var/run/asya, which the Asya runtime uses itself"#,
    );
    rejects(
        flat(
            json!({"stateProxy": [{"name": "c", "mount": {"path": "/c"}, "writeMode": "async",
                                    "connector": {"image": "i:1"}}]}),
        ),
        r#"spec.stateProxy[0].writeMode: Unsupported value: "async": supported values: "buffered", "passthrough""#,
    );
}

#[test]
fn a_bare_connector_image_is_the_platforms_and_policy_checks_that_one() {
    let cfg = ClusterConfig {
        policy: Policy {
            allowed_registries: vec!["ghcr.io/org".into(), "registry.example/asya".into()],
            ..Policy::default()
        },
        state_proxy: asya_api::config::StateProxyConfig {
            image: "registry.example/asya/asya-state-proxy:0.9.0".into(),
            ..Default::default()
        },
        ..ClusterConfig::default()
    };
    let with_image = |image: &str| {
        flat(
            json!({"stateProxy": [{"name": "ckpt", "mount": {"path": "/state/ckpt"},
                                    "connector": {"image": image}}]}),
        )
    };
    let cat = catalog();
    let review = |obj: &Value| {
        review_actor(&ReviewRequest {
            object: obj,
            old_object: None,
            namespace: None,
            catalog: &cat,
            config: &cfg,
        })
    };
    for (written, runs) in [
        (
            "asya-state-proxy",
            "registry.example/asya/asya-state-proxy:0.9.0",
        ),
        (
            "asya-state-proxy:1.0.0",
            "registry.example/asya/asya-state-proxy:1.0.0",
        ),
    ] {
        let obj = with_image(written);
        let r = review(&obj);
        assert!(r.allowed(), "{written}: {:?}", r.errors);
        let resolved = r.resolved.expect("a resolved actor");
        let conn = resolved.spec.state_proxy[0].connector.as_ref().unwrap();
        assert_eq!(conn.image, runs, "{written}");
    }
    // A full reference is the author's and meets the registry policy as written.
    let errs = errors_with(&with_image("docker.io/someone/asya-state-proxy:1"), &cfg);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(
        errs[0].starts_with(r#"spec.stateProxy[0].connector.image: Forbidden: image "docker.io/someone/asya-state-proxy:1" is not from an allowed registry"#),
        "{errs:#?}"
    );
}

/// `generateName: worker`, as the mutating webhook sees it (no name yet) and as the
/// validating one does (the generated name beside it).
fn generated(name: Option<&str>) -> Value {
    let mut a = flat(json!({}));
    let meta = a["metadata"].as_object_mut().unwrap();
    meta.remove("name");
    meta.insert("generateName".into(), json!("worker"));
    if let Some(n) = name {
        meta.insert("name".into(), json!(n));
    }
    a
}

#[test]
fn a_create_with_generate_name_is_refused_and_borrows_no_identity() {
    let cat = catalog();
    let cfg = ClusterConfig::default();
    let rule = r#"metadata.generateName: Invalid value: "worker": an AsyncActor is created with metadata.name: its queue, ServiceAccount and workload are named after it, and admission checks them (identity, privilege, queue collisions) under that name, which a generated name is not known as before the object is stored; set metadata.name instead"#;
    for obj in [generated(None), generated(Some("workerx7k2p"))] {
        let r = review_actor(&ReviewRequest {
            object: &obj,
            old_object: None,
            namespace: None,
            catalog: &cat,
            config: &cfg,
        });
        let errs: Vec<String> = r.errors.iter().map(ToString::to_string).collect();
        assert!(errs.iter().any(|e| e == rule), "{errs:#?}");
        assert!(r.resolved.is_none());
        // The mutation defaults `spec.actor` from the name alone: never from the prefix.
        let actor = r.mutated.as_ref().and_then(|m| m.pointer("/spec/actor"));
        assert_ne!(actor, Some(&json!("worker")), "{obj}");
    }
    // No name at all: refused for that.
    let mut nameless = flat(json!({}));
    nameless["metadata"].as_object_mut().unwrap().remove("name");
    rejects(
        nameless,
        "metadata.name: Required value: an AsyncActor needs a name: its queue, ServiceAccount and workload are named after it",
    );
    // An actor created with generateName before this rule is stored with both: an UPDATE of
    // it, and the provisioner's review of it, go by its name.
    let stored = generated(Some("workerx7k2p"));
    let mut edited = stored.clone();
    edited["spec"]["replicas"] = json!(2);
    let r = review_actor(&ReviewRequest {
        object: &edited,
        old_object: Some(&stored),
        namespace: None,
        catalog: &cat,
        config: &cfg,
    });
    assert!(r.allowed(), "{:?}", r.errors);
    assert_eq!(r.resolved.unwrap().actor, "workerx7k2p");
    let typed: asya_api::types::AsyncActor = serde_json::from_value(stored).unwrap();
    let r = asya_api::review::review_typed(&typed, &cat, &cfg);
    assert!(r.allowed(), "{:?}", r.errors);
    assert_eq!(r.resolved.unwrap().actor, "workerx7k2p");
}

#[test]
fn a_spec_over_max_spec_bytes_is_refused_at_admission_only() {
    let cat = catalog();
    let cfg = ClusterConfig {
        policy: Policy {
            max_spec_bytes: 200,
            ..Policy::default()
        },
        ..ClusterConfig::default()
    };
    let small = flat(json!({"env": [{"name": "A", "value": "x"}]}));
    assert_eq!(errors_with(&small, &cfg), Vec::<String>::new());
    let big = flat(json!({"env": [{"name": "A", "value": "x".repeat(200)}]}));
    let bytes = serde_json::to_string(&big["spec"]).unwrap().len();
    let want = format!(
        "spec: Too long: {bytes} bytes, over the limit of 200 (policy.maxSpecBytes in the cluster configuration)"
    );
    assert_eq!(errors_with(&big, &cfg), vec![want.clone()]);
    // An UPDATE that changes the spec is a write like a CREATE.
    let r = review_actor(&ReviewRequest {
        object: &big,
        old_object: Some(&small),
        namespace: None,
        catalog: &cat,
        config: &cfg,
    });
    let errs: Vec<String> = r.errors.iter().map(ToString::to_string).collect();
    assert_eq!(errs, vec![want]);
    // A stored actor (admitted before the limit was lowered) is not refused for it: the
    // provisioner keeps reconciling it.
    let typed: asya_api::types::AsyncActor = serde_json::from_value(big).unwrap();
    let r = asya_api::review::review_typed(&typed, &cat, &cfg);
    assert!(r.allowed(), "{:?}", r.errors);
    // The default leaves room for the largest example spec many times over.
    let default = ClusterConfig::default();
    let mut long_env = Vec::new();
    for i in 0..200 {
        long_env.push(json!({"name": format!("VAR_{i}"), "value": "v".repeat(100)}));
    }
    assert_eq!(
        errors_with(&flat(json!({"env": long_env})), &default),
        Vec::<String>::new()
    );
}
