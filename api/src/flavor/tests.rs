//! Flavor sources, merge, overlay and resolution.

use super::catalog::*;
use super::definition::*;
use super::merge::*;
use super::resolve::*;
use super::*;
use crate::config::Policy;
use crate::types::AsyncActorSpec;
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::{Map, Value, json};

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

fn cluster(name: &str, data: Value) -> FlavorDef {
    FlavorDef::from_data(name, FlavorSource::Flavor, &data)
}

fn spec(v: Value) -> AsyncActorSpec {
    serde_json::from_value(v).unwrap()
}

#[test]
fn seed_conflict_message() {
    let a = obj(json!({"scaling": {"minReplicaCount": 1}}));
    let b = obj(json!({"scaling": {"minReplicaCount": 5}}));
    let err = merge_flavors(&[("flavor-a", &a), ("flavor-b", &b)]).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"flavor merge conflict: flavors "flavor-a" and "flavor-b" conflict on scaling.minReplicaCount"#
    );
}

#[test]
fn distinct_leaves_merge_and_lists_append() {
    let a = obj(json!({"resources": {"limits": {"cpu": "2"}}, "tolerations": [{"key": "gpu"}]}));
    let b =
        obj(json!({"resources": {"limits": {"memory": "4Gi"}}, "tolerations": [{"key": "spot"}]}));
    let (m, origins) = merge_flavors(&[("cpu", &a), ("mem", &b)]).unwrap();
    assert_eq!(
        Value::Object(m),
        json!({"resources": {"limits": {"cpu": "2", "memory": "4Gi"}}, "tolerations": [{"key": "gpu"}, {"key": "spot"}]})
    );
    assert_eq!(
        origins.flavor_of("spec.resources.limits.memory"),
        Some("mem")
    );
    assert_eq!(origins.flavor_of("resources.limits.cpu"), Some("cpu"));
}

#[test]
fn same_named_env_from_two_flavors_conflicts() {
    let a = obj(json!({"env": [{"name": "X", "value": "1"}]}));
    let b = obj(json!({"env": [{"name": "Y", "value": "2"}, {"name": "X", "value": "3"}]}));
    let err = merge_flavors(&[("aaa", &a), ("bbb", &b)]).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"flavor merge conflict: flavors "aaa" and "bbb" conflict on env[X]"#
    );
}

#[test]
fn scalar_against_map_conflicts() {
    let a = obj(json!({"scaling": {"enabled": true}}));
    let b = obj(json!({"scaling": 3}));
    assert!(merge_flavors(&[("aaa", &a), ("bbb", &b)]).is_err());
}

#[test]
fn inline_wins_and_clears_origin() {
    let mut cat = FlavorCatalog::new();
    cat.insert(cluster("gpu", json!({"scaling": {"minReplicaCount": 1, "maxReplicaCount": 4}, "env": [{"name": "A", "value": "f"}]})));
    let s = spec(
        json!({"flavors": ["gpu"], "scaling": {"minReplicaCount": 0}, "env": [{"name": "A", "value": "inline"}, {"name": "B", "value": "b"}]}),
    );
    let r = resolve(&s, "ns", &cat, &Policy::default()).unwrap();
    let sc = r.spec.scaling.clone().unwrap();
    assert_eq!(sc.min_replica_count, Some(0));
    assert_eq!(sc.max_replica_count, Some(4));
    assert_eq!(r.origins.flavor_of("spec.scaling.minReplicaCount"), None);
    assert_eq!(
        r.origins.flavor_of("spec.scaling.maxReplicaCount"),
        Some("gpu")
    );
    let env: Vec<_> = r
        .spec
        .env
        .iter()
        .map(|e| (e.name.as_str(), e.value.clone().unwrap_or_default()))
        .collect();
    assert_eq!(
        env,
        vec![("A", "inline".to_string()), ("B", "b".to_string())]
    );
    assert_eq!(r.spec.flavors, vec!["gpu".to_string()]);
}

#[test]
fn missing_and_deprecated_flavors_warn() {
    let mut cat = FlavorCatalog::new();
    let mut old = cluster("gpu-t4", json!({"nodeSelector": {"a": "b"}}));
    old.deprecated = Some("Use gpu-a100 instead".into());
    cat.insert(old);
    let s = spec(json!({"flavors": ["gpu-t4", "nope-flavor"]}));
    let r = resolve(&s, "ns", &cat, &Policy::default()).unwrap();
    assert_eq!(r.missing, vec!["nope-flavor".to_string()]);
    assert_eq!(
        r.warnings,
        vec![
            r#"flavor "gpu-t4" is deprecated: Use gpu-a100 instead"#.to_string(),
            r#"flavor "nope-flavor" not found: the actor waits in phase Waiting until it exists"#
                .to_string()
        ]
    );
}

#[test]
fn flavor_may_not_set_actor_only_fields() {
    let mut cat = FlavorCatalog::new();
    let def = cluster("sneaky", json!({"transport": "sqs", "replicas": 2}));
    assert_eq!(
        def.validate().to_string(),
        "spec.transport: Forbidden: transport cannot come from a flavor; only the actor may set it"
    );
    cat.insert(def);
    let err = resolve(
        &spec(json!({"flavors": ["sneaky"]})),
        "ns",
        &cat,
        &Policy::default(),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"spec.flavors[0]: Invalid value: "sneaky": flavor sets transport, which only the actor may set"#
    );
}

fn config_map(ns: &str, flavor: &str, yaml: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": format!("cm-{flavor}"), "namespace": ns, "labels": {"asya.sh/flavor": flavor}},
        "data": {"flavor.yaml": yaml}
    }))
    .unwrap()
}

#[test]
fn namespaced_flavor_shadows_cluster_flavor_in_its_namespace_only() {
    let mut cat = FlavorCatalog::new();
    cat.insert(cluster(
        "team",
        json!({"env": [{"name": "WHO", "value": "cluster"}]}),
    ));
    cat.insert(
        FlavorDef::from_config_map(&config_map("ml", "team", "env: [{name: WHO, value: ns}]"))
            .unwrap(),
    );
    let s = spec(json!({"flavors": ["team"]}));
    let in_ml = resolve(&s, "ml", &cat, &Policy::default()).unwrap();
    assert_eq!(in_ml.spec.env[0].value.as_deref(), Some("ns"));
    let elsewhere = resolve(&s, "other", &cat, &Policy::default()).unwrap();
    assert_eq!(elsewhere.spec.env[0].value.as_deref(), Some("cluster"));
}

#[test]
fn namespaced_flavor_restrictions() {
    let mut cat = FlavorCatalog::new();
    cat.insert(
        FlavorDef::from_config_map(&config_map(
            "ml",
            "bad",
            "image: evil:1\nsidecar: {image: x}\nsecretRefs: [{name: s, namespace: kube-system}]",
        ))
        .unwrap(),
    );
    let err = resolve(
        &spec(json!({"flavors": ["bad"]})),
        "ml",
        &cat,
        &Policy::default(),
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("namespaced flavors may not set image"),
        "{text}"
    );
    assert!(
        text.contains(
            "namespaced flavor sets sidecar, which policy namespacedFlavorFields does not allow"
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"references a secret in namespace "kube-system""#),
        "{text}"
    );
}

#[test]
fn broken_configmap_flavor_is_reported() {
    let def = FlavorDef::from_config_map(&config_map("ml", "broken", "scaling: [1, 2")).unwrap();
    assert!(
        def.problem
            .as_deref()
            .unwrap_or("")
            .contains("flavor.yaml is not valid YAML")
    );
    let def = FlavorDef::from_config_map(&config_map("ml", "typed", "replicas: many")).unwrap();
    assert!(
        def.problem
            .as_deref()
            .unwrap_or("")
            .contains("does not parse"),
        "{:?}",
        def.problem
    );
}

#[test]
fn environment_config_and_flavor_precedence() {
    let ec = json!({"apiVersion": "apiextensions.crossplane.io/v1beta1", "kind": "EnvironmentConfig",
        "metadata": {"name": "gpu", "labels": {"asya.sh/flavor": "gpu", "asya.sh/deprecated": "true"}},
        "data": {"nodeSelector": {"from": "crossplane"}}});
    let ec = FlavorDef::from_environment_config(&ec).unwrap();
    assert_eq!(ec.deprecated.as_deref(), Some(""));
    let native = cluster("gpu", json!({"nodeSelector": {"from": "native"}}));
    let mut cat = FlavorCatalog::new();
    cat.insert(native.clone());
    cat.insert(ec.clone());
    assert_eq!(cat.get("x", "gpu").unwrap().source, FlavorSource::Flavor);
    let mut cat = FlavorCatalog::new();
    cat.insert(ec);
    cat.insert(native);
    assert_eq!(cat.get("x", "gpu").unwrap().source, FlavorSource::Flavor);
}

#[test]
fn flavor_aliases_are_normalised() {
    let def = cluster(
        "aggressive-retries",
        json!({"resiliency": {"policies": {"transient": {"initialDelay": "1s"}}, "rules": [{"errors": ["A", "B"], "policy": "transient"}]}}),
    );
    assert!(def.problem.is_none());
    assert_eq!(
        Value::Object(def.data.clone()),
        json!({"resiliency": {"policies": {"transient": {"initialInterval": "1s"}}, "rules": [{"match": "A", "policy": "transient"}, {"match": "B", "policy": "transient"}]}})
    );
    assert_eq!(def.warnings.len(), 2);
}

/// Lists validation refuses are resolved but not remembered: admission resolves before
/// it validates, so remembering them would let any client fill the memo with names.
#[test]
fn refused_lists_are_not_memoised() {
    let cat = FlavorCatalog::new();
    let policy = Policy::default();
    let too_many: Vec<String> = (0..=MAX_FLAVORS).map(|i| format!("flavor-{i}")).collect();
    let too_long = vec!["x".repeat(MEMO_NAME_MAX + 1)];
    for names in [too_many, too_long] {
        let s = spec(json!({"flavors": names}));
        let first = resolve(&s, "ns", &cat, &policy);
        assert!(cat.memo.lock().is_empty(), "{names:?} was memoised");
        assert_eq!(resolve(&s, "ns", &cat, &policy), first);
    }
    let ok = spec(json!({"flavors": ["flavor-a", "flavor-b"]}));
    let _ = resolve(&ok, "ns", &cat, &policy);
    assert_eq!(cat.memo.lock().len(), 1);
}
