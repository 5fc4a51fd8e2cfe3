//! [`resolve`] against a reference that takes neither shortcut: the flavor part worked out
//! afresh (never from the catalog's memo) and the inline spec laid over the merge as JSON
//! and the whole result parsed ([`overlay_json`], not the typed overlay). A property test
//! checks that the two agree exactly on varied catalogs and inline specs (Ok and Err,
//! origins, warnings, error order), also when the memo answers.

use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::catalog::*;
use super::definition::*;
use super::resolve::*;
use crate::config::Policy;
use crate::error::FieldErrors;
use crate::types::AsyncActorSpec;
use k8s_openapi::api::core::v1::ConfigMap;

/// [`resolve`] the slow way: no memo, no typed overlay.
fn resolve_reference(
    spec: &AsyncActorSpec,
    namespace: &str,
    catalog: &FlavorCatalog,
    policy: &Policy,
) -> Result<Resolution, FieldErrors> {
    let part = flavor_part(&spec.flavors, namespace, catalog, policy);
    let merged = part.merged.as_ref().map_err(Clone::clone)?;
    let (effective, origins) = overlay_json(merged, spec)?;
    Ok(part.resolution(effective, origins))
}

/// Flavor names listed by actors; `omega` never exists, `zz` is too short but still resolves.
const NAMES: [&str; 6] = ["alpha", "beta", "gamma", "delta", "omega", "zz"];
const NAMESPACES: [&str; 2] = ["ml", "web"];

fn pick<T: Clone + std::fmt::Debug + 'static>(items: &[T]) -> impl Strategy<Value = T> + use<T> {
    prop::sample::select(items.to_vec())
}

/// `Some(v)` a quarter of the time, so flavors overlap on some fields but not all.
fn sometimes<S: Strategy>(s: S) -> impl Strategy<Value = Option<S::Value>> {
    prop::option::weighted(0.25, s)
}

fn small_map(
    keys: &[&'static str],
    values: &[&'static str],
) -> impl Strategy<Value = Value> + use<> {
    prop::collection::btree_map(pick(keys), pick(values), 1..3).prop_map(|m| json!(m))
}

fn scaling() -> impl Strategy<Value = Value> {
    let keys = [
        "enabled",
        "minReplicaCount",
        "maxReplicaCount",
        "queueLength",
        "pollingInterval",
        "cooldownPeriod",
        "minReplicas",
    ];
    prop::collection::btree_map(pick(&keys), 0..30i32, 1..4).prop_map(|m| {
        let o: Map<String, Value> = m
            .into_iter()
            .map(|(k, v)| {
                let v = if k == "enabled" {
                    json!(v % 2 == 0)
                } else {
                    json!(v)
                };
                (k.to_string(), v)
            })
            .collect();
        Value::Object(o)
    })
}

fn resiliency() -> impl Strategy<Value = Value> {
    let policy = (
        sometimes(1..6i32),
        sometimes(pick(&["constant", "exponential"])),
        sometimes(pick(&["1s", "2s"])),
        sometimes(pick(&["30s", "1m"])),
    )
        .prop_map(|(a, b, i, m)| {
            let mut o = Map::new();
            a.map(|v| o.insert("maxAttempts".into(), json!(v)));
            b.map(|v| o.insert("backoff".into(), json!(v)));
            i.map(|v| o.insert("initialInterval".into(), json!(v)));
            m.map(|v| o.insert("maxInterval".into(), json!(v)));
            Value::Object(o)
        });
    let rule = (pick(&["TimeoutError", "ValueError"]), prop::bool::ANY).prop_map(|(m, fail)| {
        if fail {
            json!({"match": m, "action": "fail"})
        } else {
            json!({"match": m, "policy": "default"})
        }
    });
    (
        sometimes(prop_oneof![
            pick(&["30s", "5m"]).prop_map(Value::from),
            Just(json!(300))
        ]),
        sometimes(prop::collection::btree_map(
            pick(&["default", "slow"]),
            policy,
            1..3,
        )),
        sometimes(prop::collection::vec(rule, 1..3)),
    )
        .prop_map(|(t, p, r)| {
            let mut o = Map::new();
            t.map(|v| o.insert("actorTimeout".into(), v));
            p.map(|v| o.insert("policies".into(), json!(v)));
            r.map(|v| o.insert("rules".into(), json!(v)));
            Value::Object(o)
        })
}

fn env() -> impl Strategy<Value = Value> {
    let var = (
        pick(&["A", "B", "C"]),
        pick(&["1", "2"]),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(n, v, secret)| {
            if secret {
                json!({"name": n, "valueFrom": {"secretKeyRef": {"name": "s", "key": v}}})
            } else {
                json!({"name": n, "value": v})
            }
        });
    prop::collection::vec(var, 1..3).prop_map(Value::from)
}

fn secret_refs() -> impl Strategy<Value = Value> {
    let r = (
        pick(&["s1", "s2"]),
        sometimes(pick(&["ml", "web", "kube-system"])),
    )
        .prop_map(|(n, ns)| match ns {
            Some(ns) => json!({"name": n, "namespace": ns}),
            None => json!({"name": n, "keys": [{"key": "k", "envVar": "K"}]}),
        });
    prop::collection::vec(r, 1..3).prop_map(Value::from)
}

fn resources() -> impl Strategy<Value = Value> {
    let q = || small_map(&["cpu", "memory", "nvidia.com/gpu"], &["1", "2", "4Gi"]);
    (sometimes(q()), sometimes(q())).prop_map(|(l, r)| {
        let mut o = Map::new();
        l.map(|v| o.insert("limits".into(), v));
        r.map(|v| o.insert("requests".into(), v));
        Value::Object(o)
    })
}

fn tolerations() -> impl Strategy<Value = Value> {
    let t = (pick(&["gpu", "spot"]), prop::bool::ANY).prop_map(|(k, exists)| {
        if exists {
            json!({"key": k, "operator": "Exists", "effect": "NoSchedule"})
        } else {
            json!({"key": k, "tolerationSeconds": 30})
        }
    });
    prop::collection::vec(t, 1..3).prop_map(Value::from)
}

/// Volumes, among them one with an ObjectMeta: its timestamp has sub-second precision,
/// which a JSON round trip drops.
fn volumes() -> impl Strategy<Value = Value> {
    let v = (pick(&["data", "cache"]), 0..3u8).prop_map(|(n, kind)| match kind {
        0 => json!({"name": n, "emptyDir": {}}),
        1 => json!({"name": n, "configMap": {"name": "cfg"}}),
        _ => json!({"name": n, "ephemeral": {"volumeClaimTemplate": {
            "metadata": {"labels": {"a": "b"}, "creationTimestamp": "2024-01-01T00:00:00.5Z"},
            "spec": {"accessModes": ["ReadWriteOnce"]}}}}),
    });
    prop::collection::vec(v, 1..3).prop_map(Value::from)
}

fn volume_mounts() -> impl Strategy<Value = Value> {
    let m = (pick(&["data", "cache"]), pick(&["/data", "/cache"]))
        .prop_map(|(n, p)| json!({"name": n, "mountPath": p}));
    prop::collection::vec(m, 1..3).prop_map(Value::from)
}

fn sidecar() -> impl Strategy<Value = Value> {
    (
        sometimes(pick(&["side:1", "side:2"])),
        sometimes(env()),
        sometimes(resources()),
    )
        .prop_map(|(i, e, r)| {
            let mut o = Map::new();
            i.map(|v| o.insert("image".into(), json!(v)));
            e.map(|v| o.insert("env".into(), v));
            r.map(|v| o.insert("resources".into(), v));
            Value::Object(o)
        })
}

fn state_proxy() -> impl Strategy<Value = Value> {
    let s = (pick(&["st1", "st2"]), pick(&["/s", "/t"])).prop_map(|(n, p)| {
        json!({"name": n, "mount": {"path": p}, "connector": {"image": "c:1", "env": [{"name": "A", "value": "1"}]}})
    });
    prop::collection::vec(s, 1..3).prop_map(Value::from)
}

fn workload() -> impl Strategy<Value = Value> {
    (sometimes(pick(&["Deployment", "StatefulSet"])), sometimes(1..3i32), prop::bool::ANY)
        .prop_map(|(k, r, t)| {
            let mut o = Map::new();
            k.map(|v| o.insert("kind".into(), json!(v)));
            r.map(|v| o.insert("replicas".into(), json!(v)));
            if t {
                o.insert("template".into(), json!({
                    "metadata": {"labels": {"app": "x"}, "creationTimestamp": "2024-01-01T00:00:00.25Z"},
                    "spec": {"containers": [{"name": "asya-runtime", "image": "x:1"}]}}));
            }
            Value::Object(o)
        })
}

fn socket_and_timeout() -> impl Strategy<Value = (Option<Value>, Option<Value>)> {
    let socket = (
        sometimes(pick(&["/run/a.sock"])),
        sometimes(prop_oneof![Just(json!(1024)), Just(json!("8Mi"))]),
    )
        .prop_map(|(p, m)| {
            let mut o = Map::new();
            p.map(|v| o.insert("path".into(), json!(v)));
            m.map(|v| o.insert("maxSize".into(), v));
            Value::Object(o)
        });
    let timeout =
        (sometimes(pick(&["30s", "1m"])), sometimes(pick(&["10s"]))).prop_map(|(p, g)| {
            let mut o = Map::new();
            p.map(|v| o.insert("processing".into(), json!(v)));
            g.map(|v| o.insert("gracefulShutdown".into(), json!(v)));
            Value::Object(o)
        });
    (sometimes(socket), sometimes(timeout))
}

/// A partial spec over every top-level field, each present a quarter of the time.
fn partial_spec() -> impl Strategy<Value = Map<String, Value>> {
    let scalars = (
        sometimes(pick(&["img:1", "img:2"])),
        sometimes(pick(&["mod.fn", "mod.Cls.run"])),
        sometimes(pick(&["Always", "Never"])),
        sometimes(pick(&["python3", "python3.12"])),
        sometimes(pick(&["payload", "envelope"])),
        sometimes(1..4i32),
    );
    let structs = (
        sometimes(scaling()),
        sometimes(resiliency()),
        sometimes(resources()),
        sometimes(small_map(&["zone", "gpu", "pool"], &["a", "b"])),
        sometimes(sidecar()),
        sometimes(workload()),
        socket_and_timeout(),
    );
    let lists = (
        sometimes(env()),
        sometimes(secret_refs()),
        sometimes(tolerations()),
        sometimes(volumes()),
        sometimes(volume_mounts()),
        sometimes(state_proxy()),
    );
    (scalars, structs, lists).prop_map(|(s, t, l)| {
        let mut o = Map::new();
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                o.insert(k.to_string(), v);
            }
        };
        put("image", s.0.map(Value::from));
        put("handler", s.1.map(Value::from));
        put("imagePullPolicy", s.2.map(Value::from));
        put("pythonExecutable", s.3.map(Value::from));
        put("handlerMode", s.4.map(Value::from));
        put("replicas", s.5.map(Value::from));
        put("scaling", t.0);
        put("resiliency", t.1);
        put("resources", t.2);
        put("nodeSelector", t.3);
        put("sidecar", t.4);
        put("workload", t.5);
        put("socket", t.6.0);
        put("timeout", t.6.1);
        put("env", l.0);
        put("secretRefs", l.1);
        put("tolerations", l.2);
        put("volumes", l.3);
        put("volumeMounts", l.4);
        put("stateProxy", l.5);
        o
    })
}

/// How one catalog entry is defined.
#[derive(Clone, Debug)]
enum Kind {
    Cluster,
    /// Crossplane, deprecated with or without a message.
    Environment(Option<&'static str>),
    ConfigMap(&'static str),
    /// Data that does not parse: the flavor carries a problem.
    Broken,
    /// Sets an actor-only field.
    ActorOnly,
    /// Built by hand, bypassing the normalisation of `from_data`: data the typed path
    /// cannot take (a null, an unknown key, a wrong type), so the JSON fallback must match.
    Raw(u8),
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        6 => Just(Kind::Cluster),
        1 => pick(&[None, Some("use alpha")]).prop_map(Kind::Environment),
        2 => pick(&NAMESPACES).prop_map(Kind::ConfigMap),
        1 => Just(Kind::Broken),
        1 => Just(Kind::ActorOnly),
        1 => (0..6u8).prop_map(Kind::Raw),
    ]
}

fn raw_data(variant: u8) -> Map<String, Value> {
    let v = match variant {
        0 => json!({"replicas": "many"}),
        1 => json!({"image": null, "bogus": 1, "nodeSelector": {"raw": "r"}}),
        2 => json!({"env": [], "scaling": {"minReplicaCount": "x"}}),
        3 => json!({"scaling": {"maxReplicaCount": 7}, "tolerations": [{"key": "raw"}]}),
        // Top-level nulls: they parse to the absent value, which is not the same as unset.
        5 => {
            json!({"scaling": null, "resources": null, "resiliency": null, "nodeSelector": {"n": "r"}})
        }
        // Parses, but does not serialise back the same: the typed overlay must not be used.
        _ => json!({"scaling": {"maxReplicaCount": 7, "bogus": 1}, "resources": {"limits": null},
            "env": [{"name": "A", "value": "r", "extra": true}], "tolerations": [{"key": "raw", "x": 1}]}),
    };
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn flavor_def(name: &str, kind: &Kind, data: Map<String, Value>) -> FlavorDef {
    let data = Value::Object(data);
    match kind {
        Kind::Cluster => FlavorDef::from_data(name, FlavorSource::Flavor, &data),
        Kind::Environment(msg) => {
            let mut labels = json!({"asya.sh/flavor": name, "asya.sh/deprecated": "true"});
            if msg.is_none() {
                labels = json!({"asya.sh/flavor": name});
            }
            let ec = json!({"metadata": {"name": name, "labels": labels,
                "annotations": {"asya.sh/deprecation-message": msg.unwrap_or("")}}, "data": data});
            FlavorDef::from_environment_config(&ec).unwrap_or_else(|| panic!("{ec}"))
        }
        Kind::ConfigMap(ns) => {
            let yaml = serde_yaml::to_string(&data).unwrap_or_default();
            let cm: ConfigMap = serde_json::from_value(json!({
                "metadata": {"name": format!("cm-{name}"), "namespace": ns, "labels": {"asya.sh/flavor": name}},
                "data": {"flavor.yaml": yaml}
            }))
            .unwrap_or_default();
            FlavorDef::from_config_map(&cm).unwrap_or_else(|| panic!("{cm:?}"))
        }
        Kind::Broken => {
            FlavorDef::from_data(name, FlavorSource::Flavor, &json!({"replicas": "many"}))
        }
        Kind::ActorOnly => {
            let mut d = data;
            d["transport"] = json!("sqs");
            FlavorDef::from_data(name, FlavorSource::Flavor, &d)
        }
        Kind::Raw(v) => FlavorDef {
            name: name.to_string(),
            source: FlavorSource::Flavor,
            data: raw_data(*v),
            deprecated: None,
            problem: None,
            warnings: vec![],
        },
    }
}

/// Every listed name but `omega` defined once, then a few more definitions that shadow
/// (ConfigMaps), lose to (EnvironmentConfig after Flavor) or replace earlier ones.
fn catalog() -> impl Strategy<Value = FlavorCatalog> {
    let defined: Vec<&'static str> = NAMES.iter().copied().filter(|n| *n != "omega").collect();
    let base = prop::collection::vec((kind(), partial_spec()), defined.len());
    let extra = prop::collection::vec((pick(&defined), kind(), partial_spec()), 0..4);
    (base, extra).prop_map(move |(base, extra)| {
        let mut cat = FlavorCatalog::new();
        for (name, (kind, data)) in defined.iter().zip(base) {
            cat.insert(flavor_def(name, &kind, data));
        }
        for (name, kind, data) in extra {
            cat.insert(flavor_def(name, &kind, data));
        }
        cat
    })
}

fn inline_spec() -> impl Strategy<Value = (AsyncActorSpec, &'static str)> {
    (
        partial_spec(),
        prop_oneof![
            1 => Just(Vec::new()),
            6 => prop::collection::vec(pick(&NAMES), 1..5),
        ],
        sometimes(pick(&["sqs", "rabbitmq"])),
        pick(&NAMESPACES),
    )
        .prop_map(|(mut o, flavors, transport, ns)| {
            o.insert("actor".into(), json!("act"));
            if !flavors.is_empty() {
                o.insert("flavors".into(), json!(flavors));
            }
            if let Some(t) = transport {
                o.insert("transport".into(), json!(t));
            }
            let spec = serde_json::from_value(Value::Object(o.clone()))
                .unwrap_or_else(|e| panic!("generated spec does not parse: {e}: {o:?}"));
            (spec, ns)
        })
}

fn policies() -> [Policy; 2] {
    let narrow = Policy {
        namespaced_flavor_fields: ["env", "scaling", "image", "secretRefs"]
            .map(String::from)
            .to_vec(),
        ..Policy::default()
    };
    [Policy::default(), narrow]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    /// Several actors over one catalog, each resolved twice (the second answer may come
    /// from the memo) under two policies and again under the first, and once more on a
    /// clone of the catalog: every answer equals the reference.
    #[test]
    fn resolve_equals_reference(cat in catalog(), actors in prop::collection::vec(inline_spec(), 1..4)) {
        let [open, narrow] = policies();
        let copy = cat.clone();
        for (spec, ns) in &actors {
            for policy in [&open, &narrow, &open] {
                let want = resolve_reference(spec, ns, &cat, policy);
                prop_assert_eq!(&resolve(spec, ns, &cat, policy), &want);
                prop_assert_eq!(&resolve(spec, ns, &cat, policy), &want);
                prop_assert_eq!(&resolve(spec, ns, &copy, policy), &want);
            }
        }
    }
}

/// Found by review: a flavor whose data has `"scaling": null` made the typed overlay drop
/// the actor's inline `scaling`.
#[test]
fn null_top_level_flavor_field_keeps_the_inline_value() {
    let mut cat = FlavorCatalog::new();
    let mut data = Map::new();
    data.insert("scaling".into(), Value::Null);
    cat.insert(FlavorDef {
        name: "nul".into(),
        source: FlavorSource::Flavor,
        data,
        deprecated: None,
        problem: None,
        warnings: vec![],
    });
    let spec: AsyncActorSpec =
        serde_json::from_value(json!({"flavors": ["nul"], "scaling": {"minReplicaCount": 2}}))
            .unwrap();
    let got = resolve(&spec, "ns", &cat, &Policy::default());
    assert_eq!(
        got,
        resolve_reference(&spec, "ns", &cat, &Policy::default())
    );
    let spec_scaling = got.unwrap().spec.scaling.unwrap();
    assert_eq!(spec_scaling.min_replica_count, Some(2));
}
