//! Properties of the flavor merge (seed 002 semantics).

use asya_api::config::Policy;
use asya_api::flavor::{
    FlavorCatalog, FlavorDef, FlavorSource, Origins, merge_flavors, overlay_inline,
};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// Small partial specs over a few overlapping keys, so conflicts and merges both happen.
fn partial_spec() -> impl Strategy<Value = Map<String, Value>> {
    let scaling = prop::collection::btree_map(
        prop::sample::select(vec![
            "minReplicaCount",
            "maxReplicaCount",
            "queueLength",
            "pollingInterval",
        ]),
        1..50i32,
        0..3,
    );
    let selector = prop::collection::btree_map(
        prop::sample::select(vec!["zone", "gpu", "pool"]),
        "[a-z]{1,4}",
        0..3,
    );
    let tolerations = prop::collection::vec("[a-z]{1,5}", 0..3);
    (scaling, selector, tolerations).prop_map(|(s, n, t)| {
        let mut m = Map::new();
        if !s.is_empty() {
            m.insert("scaling".into(), json!(s));
        }
        if !n.is_empty() {
            m.insert("nodeSelector".into(), json!(n));
        }
        if !t.is_empty() {
            m.insert(
                "tolerations".into(),
                Value::Array(t.into_iter().map(|k| json!({"key": k})).collect()),
            );
        }
        m
    })
}

fn leaves(prefix: &str, v: &Value, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                leaves(
                    &if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    },
                    x,
                    out,
                );
            }
        }
        other => out.push((prefix.to_string(), other.clone())),
    }
}

fn at<'v>(v: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

proptest! {
    /// Whatever the flavors say, every leaf the actor sets inline is the merged value.
    #[test]
    fn inline_always_wins(a in partial_spec(), b in partial_spec(), inline in partial_spec()) {
        if let Ok((mut merged, mut origins)) = merge_flavors(&[("fla", &a), ("flb", &b)]) {
            overlay_inline(&mut merged, &inline, &mut origins);
            let merged = Value::Object(merged);
            let mut inline_leaves = Vec::new();
            leaves("", &Value::Object(inline.clone()), &mut inline_leaves);
            for (path, value) in inline_leaves {
                if value.is_array() { continue; }
                prop_assert_eq!(at(&merged, &path), Some(&value), "path {}", path);
                prop_assert_eq!(origins.flavor_of(&path), None);
            }
        }
    }

    /// Lists append in flavor order: a's items, then b's.
    #[test]
    fn list_order_follows_flavor_order(a in partial_spec(), b in partial_spec()) {
        if let Ok((merged, _)) = merge_flavors(&[("fla", &a), ("flb", &b)]) {
            let items = |m: &Map<String, Value>| m.get("tolerations").and_then(Value::as_array).cloned().unwrap_or_default();
            let mut expected = items(&a);
            expected.extend(items(&b));
            prop_assert_eq!(items(&merged), expected);
        }
    }

    /// A conflict does not depend on the order of the flavors, and names both.
    #[test]
    fn conflict_is_symmetric(a in partial_spec(), b in partial_spec()) {
        let ab = merge_flavors(&[("fla", &a), ("flb", &b)]);
        let ba = merge_flavors(&[("flb", &b), ("fla", &a)]);
        prop_assert_eq!(ab.is_err(), ba.is_err());
        if let (Err(x), Err(y)) = (ab, ba) {
            prop_assert_eq!(x.len(), y.len());
            for e in x.iter().chain(y.iter()) {
                let t = e.to_string();
                prop_assert!(t.contains(r#""fla""#) && t.contains(r#""flb""#), "{}", t);
            }
        }
    }

    /// Distinct leaves never conflict; the merge keeps every leaf of every flavor.
    #[test]
    fn merge_keeps_every_leaf(a in partial_spec(), b in partial_spec()) {
        if let Ok((merged, origins)) = merge_flavors(&[("fla", &a), ("flb", &b)]) {
            let merged = Value::Object(merged);
            for (name, src) in [("fla", &a), ("flb", &b)] {
                let mut ls = Vec::new();
                leaves("", &Value::Object(src.clone()), &mut ls);
                for (path, value) in ls {
                    if value.is_array() { continue; }
                    prop_assert_eq!(at(&merged, &path), Some(&value));
                    prop_assert_eq!(origins.flavor_of(&path), Some(name));
                }
            }
        }
    }

    /// Resolution through the catalog agrees with the raw merge.
    #[test]
    fn resolve_matches_merge(a in partial_spec(), b in partial_spec()) {
        let mut cat = FlavorCatalog::new();
        cat.insert(FlavorDef::from_data("fla", FlavorSource::Flavor, &Value::Object(a.clone())));
        cat.insert(FlavorDef::from_data("flb", FlavorSource::Flavor, &Value::Object(b.clone())));
        let spec = serde_json::from_value(json!({"flavors": ["fla", "flb"]})).unwrap();
        let resolved = asya_api::flavor::resolve(&spec, "ns", &cat, &Policy::default());
        let merged = merge_flavors(&[("fla", &a), ("flb", &b)]);
        prop_assert_eq!(resolved.is_ok(), merged.is_ok());
        let _ = Origins::default();
    }
}
