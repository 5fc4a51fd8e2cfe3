//! Shared by the webhook's integration tests.

use proptest::prelude::*;
use serde_json::Value;

/// Arbitrary JSON up to `depth` levels whose object keys come from `keys` (names the code
/// under test looks at, so generated objects reach past the first check).
pub fn arb_json(
    depth: u32,
    keys: Vec<&'static str>,
    leaf_i64: bool,
    desired_size: u32,
    branch: u32,
) -> impl Strategy<Value = Value> {
    let keys = prop::sample::select(keys);
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        if leaf_i64 {
            any::<i64>().prop_map(Value::from).boxed()
        } else {
            any::<i32>().prop_map(Value::from).boxed()
        },
        "[a-zA-Z0-9._/~ -]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(depth, desired_size, branch, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            proptest::collection::btree_map(keys.clone(), inner, 0..5).prop_map(|m| {
                Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            }),
        ]
    })
}
