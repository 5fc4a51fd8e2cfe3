//! The JSONPatch of an injection, computed from the injected parts of the pod before and
//! after ([`InjectedPod`]).
//!
//! The result has the ops of `json_patch::diff` of the two pods serialized whole (the tests
//! check it op for op, and that it turns the one pod into the other), since nothing outside
//! an [`InjectedPod`] can change. Only those parts are serialized and compared:
//! `metadata.annotations`, `spec.volumes`, `spec.initContainers` and `spec.containers`,
//! element by element, changed items as JSON text ([`raw_ops`]). Diffing typed-before
//! against typed-after means fields this k8s-openapi does not know are neither touched nor
//! removed. Values go straight from the typed objects to JSON text (no `Value` tree in
//! between), and the patch is returned as the bytes of the response's `patch`.

use std::collections::BTreeMap;

use json_patch::PatchOperation;
use json_patch::jsonptr::PointerBuf;
use k8s_openapi::api::core::v1::{Container, Volume};
use serde::Serialize;
use serde_json::Value;
use serde_json::value::{RawValue, to_raw_value};

use crate::inject::InjectedPod;

/// One JSONPatch operation, its value already JSON text.
#[derive(Serialize)]
struct Op {
    op: &'static str,
    path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<Box<RawValue>>,
}

impl Op {
    fn add(path: &PointerBuf, value: &impl Serialize) -> Result<Self, serde_json::Error> {
        Ok(Op {
            op: "add",
            path: path.to_string(),
            value: Some(to_raw_value(value)?),
        })
    }

    fn add_raw(path: &PointerBuf, value: Box<RawValue>) -> Self {
        Op {
            op: "add",
            path: path.to_string(),
            value: Some(value),
        }
    }

    fn replace(path: &PointerBuf, value: &impl Serialize) -> Result<Self, serde_json::Error> {
        Ok(Op {
            op: "replace",
            path: path.to_string(),
            value: Some(to_raw_value(value)?),
        })
    }

    fn remove(path: &PointerBuf) -> Self {
        Op {
            op: "remove",
            path: path.to_string(),
            value: None,
        }
    }
}

fn ptr(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

/// The patch of an injection: from the parts before ([`InjectedPod::cloned`]) to the parts
/// injected. `cache`: where added containers are rendered once.
pub fn injection_patch(
    before: &InjectedPod,
    after: &InjectedPod,
    cache: Option<&RenderCache>,
) -> Result<Vec<u8>, serde_json::Error> {
    let mut ops = Vec::new();
    map_ops(
        ptr(&["metadata", "annotations"]),
        before.annotations.as_ref(),
        after.annotations.as_ref(),
        &mut ops,
    )?;
    // In the order `json_patch::diff` visits them (object keys sorted).
    list_ops(
        ptr(&["spec", "containers"]),
        Some(&before.containers),
        Some(&after.containers),
        cache,
        &mut ops,
    )?;
    list_ops(
        ptr(&["spec", "initContainers"]),
        before.init_containers.as_ref(),
        after.init_containers.as_ref(),
        cache,
        &mut ops,
    )?;
    list_ops(
        ptr(&["spec", "volumes"]),
        before.volumes.as_ref(),
        after.volumes.as_ref(),
        cache,
        &mut ops,
    )?;
    serde_json::to_vec(&ops)
}

/// Containers injection adds, as JSON text, looked up by value: the installer and the
/// sidecar are the same for every pod of an actor, so rendering them once pays. Keyed by
/// the whole typed value, a hit is the same text by construction.
#[derive(Default)]
pub struct RenderCache(std::sync::Mutex<Vec<Rendered>>);

/// Whether a list (else its only item) was rendered, what, and its text.
type Rendered = (bool, Vec<Container>, Box<RawValue>);

/// Bound on kept renderings (a few per actor and sidecar mode); past it the oldest goes.
const RENDER_CACHE_MAX: usize = 64;

impl RenderCache {
    /// `list`: the text of the list `v`, else of its only item.
    fn get_or(
        &self,
        list: bool,
        v: &[Container],
        render: impl FnOnce() -> Result<Box<RawValue>, serde_json::Error>,
    ) -> Result<Box<RawValue>, serde_json::Error> {
        let hit = {
            let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
            m.iter()
                .find(|(l, k, _)| *l == list && k.as_slice() == v)
                .map(|(_, _, r)| r.clone())
        };
        if let Some(r) = hit {
            return Ok(r);
        }
        let r = render()?;
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() >= RENDER_CACHE_MAX {
            m.remove(0);
        }
        m.push((list, v.to_vec(), r.clone()));
        Ok(r)
    }
}

/// The text of values the patch adds whole: containers through the cache.
trait Render: Serialize + PartialEq + Sized {
    fn render_list(
        v: &Vec<Self>,
        _cache: Option<&RenderCache>,
    ) -> Result<Box<RawValue>, serde_json::Error> {
        to_raw_value(v)
    }
    fn render_item(
        &self,
        _cache: Option<&RenderCache>,
    ) -> Result<Box<RawValue>, serde_json::Error> {
        to_raw_value(self)
    }
}

impl Render for Volume {}

impl Render for Container {
    fn render_list(
        v: &Vec<Self>,
        cache: Option<&RenderCache>,
    ) -> Result<Box<RawValue>, serde_json::Error> {
        match cache {
            Some(c) => c.get_or(true, v, || to_raw_value(v)),
            None => to_raw_value(v),
        }
    }
    fn render_item(&self, cache: Option<&RenderCache>) -> Result<Box<RawValue>, serde_json::Error> {
        match cache {
            Some(c) => c.get_or(false, std::slice::from_ref(self), || to_raw_value(self)),
            None => to_raw_value(self),
        }
    }
}

/// A field absent before and present after (or the reverse) as one op, as the diff does.
/// True when that settles it (or both are equal).
fn whole<T: Serialize + PartialEq>(
    path: &PointerBuf,
    before: Option<&T>,
    after: Option<&T>,
    ops: &mut Vec<Op>,
) -> Result<bool, serde_json::Error> {
    match (before, after) {
        (None, None) => Ok(true),
        (None, Some(a)) => {
            ops.push(Op::add(path, a)?);
            Ok(true)
        }
        (Some(_), None) => {
            ops.push(Op::remove(path));
            Ok(true)
        }
        (Some(b), Some(a)) => Ok(b == a),
    }
}

fn map_ops(
    path: PointerBuf,
    before: Option<&BTreeMap<String, String>>,
    after: Option<&BTreeMap<String, String>>,
    ops: &mut Vec<Op>,
) -> Result<(), serde_json::Error> {
    if whole(&path, before, after, ops)? {
        return Ok(());
    }
    let (Some(b), Some(a)) = (before, after) else {
        return Ok(());
    };
    for (k, v) in a {
        let p = path.with_trailing_token(k.as_str());
        match b.get(k) {
            None => ops.push(Op::add(&p, v)?),
            Some(old) if old != v => ops.push(Op::replace(&p, v)?),
            Some(_) => {}
        }
    }
    for k in b.keys().filter(|k| !a.contains_key(*k)) {
        ops.push(Op::remove(&path.with_trailing_token(k.as_str())));
    }
    Ok(())
}

/// Index by index, like `json_patch::diff` on arrays: changed items diffed in place,
/// extra items added at their index, missing ones removed.
fn list_ops<T: Render>(
    path: PointerBuf,
    before: Option<&Vec<T>>,
    after: Option<&Vec<T>>,
    cache: Option<&RenderCache>,
    ops: &mut Vec<Op>,
) -> Result<(), serde_json::Error> {
    if let (None, Some(a)) = (before, after) {
        ops.push(Op::add_raw(&path, T::render_list(a, cache)?));
        return Ok(());
    }
    if whole(&path, before, after, ops)? {
        return Ok(());
    }
    let (Some(b), Some(a)) = (before, after) else {
        return Ok(());
    };
    for i in 0..b.len().max(a.len()) {
        match (b.get(i), a.get(i)) {
            (Some(x), Some(y)) if x != y => item_ops(&path.with_trailing_token(i), x, y, ops)?,
            (Some(_), Some(_)) => {}
            (None, Some(y)) => ops.push(Op::add_raw(
                &path.with_trailing_token(i),
                y.render_item(cache)?,
            )),
            // Removing shifts what follows: every removal is at the first index past `after`.
            (Some(_), None) => ops.push(Op::remove(&path.with_trailing_token(a.len()))),
            (None, None) => {}
        }
    }
    Ok(())
}

/// The ops of `json_patch::diff` of the two items as `Value`s, at `item`, without making
/// `Value`s of what did not change: both items are serialized to text once and diffed as
/// text ([`raw_ops`]).
fn item_ops<T: Serialize>(
    item: &PointerBuf,
    x: &T,
    y: &T,
    ops: &mut Vec<Op>,
) -> Result<(), serde_json::Error> {
    raw_ops(item, &to_raw_value(x)?, &to_raw_value(y)?, ops)
}

/// `json_patch::diff` (its `diff_impl`) on JSON text: equal text needs no op; two objects
/// are diffed key by key in key order (each key of `y`, added when `x` lacks it, then the
/// removal of each key only `x` has); two arrays index by index (removals all at the
/// first index past `y`); anything else is parsed and diffed as `Value`s. Added values are
/// `Value`s too, so their keys come out sorted as the diff's do.
fn raw_ops(
    p: &PointerBuf,
    x: &RawValue,
    y: &RawValue,
    ops: &mut Vec<Op>,
) -> Result<(), serde_json::Error> {
    let (xs, ys) = (x.get(), y.get());
    if xs == ys {
        return Ok(());
    }
    let value = |s: &str| serde_json::from_str::<Value>(s);
    match (xs.as_bytes().first(), ys.as_bytes().first()) {
        (Some(b'{'), Some(b'{')) => {
            // Keys with escapes do not borrow: then the `Value` diff below.
            if let (Some(xm), Some(ym)) = (fields(xs), fields(ys)) {
                for (k, yv) in &ym {
                    let kp = p.with_trailing_token(*k);
                    match xm.get(k) {
                        None => ops.push(Op::add(&kp, &value(yv.get())?)?),
                        Some(xv) => raw_ops(&kp, xv, yv, ops)?,
                    }
                }
                for k in xm.keys().filter(|k| !ym.contains_key(*k)) {
                    ops.push(Op::remove(&p.with_trailing_token(*k)));
                }
                return Ok(());
            }
        }
        (Some(b'['), Some(b'[')) => {
            let xa: Vec<&RawValue> = serde_json::from_str(xs)?;
            let ya: Vec<&RawValue> = serde_json::from_str(ys)?;
            for i in 0..xa.len().max(ya.len()) {
                match (xa.get(i), ya.get(i)) {
                    (Some(xv), Some(yv)) => raw_ops(&p.with_trailing_token(i), xv, yv, ops)?,
                    (None, Some(yv)) => {
                        ops.push(Op::add(&p.with_trailing_token(i), &value(yv.get())?)?)
                    }
                    (Some(_), None) => ops.push(Op::remove(&p.with_trailing_token(ya.len()))),
                    (None, None) => {}
                }
            }
            return Ok(());
        }
        _ => {}
    }
    for op in json_patch::diff(&value(xs)?, &value(ys)?).0 {
        ops.push(prefixed(p, op)?);
    }
    Ok(())
}

/// The top-level fields of a JSON object, as text.
fn fields(s: &str) -> Option<BTreeMap<&str, &RawValue>> {
    serde_json::from_str(s).ok()
}

/// An op of an item's diff, at the item's path. `diff` emits only add, remove and replace.
fn prefixed(prefix: &PointerBuf, op: PatchOperation) -> Result<Op, serde_json::Error> {
    match op {
        PatchOperation::Add(o) => Op::add(&prefix.concat(&o.path), &o.value),
        PatchOperation::Replace(o) => Op::replace(&prefix.concat(&o.path), &o.value),
        PatchOperation::Remove(o) => Ok(Op::remove(&prefix.concat(&o.path))),
        other => Err(serde::ser::Error::custom(format!(
            "unexpected diff operation {}",
            serde_json::to_string(&other)?
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inject::ActorSettings;
    use crate::inject::inject;
    use crate::inject::tests::{settings, settings_with_state};
    use asya_api::config::ClusterConfig;
    use json_patch::Patch;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::{Value, json};

    fn parsed(bytes: &[u8]) -> Patch {
        serde_json::from_slice(bytes).unwrap()
    }

    /// The oracle: `json_patch::diff` of the whole pods as `Value`s.
    fn full_diff(before: &Pod, after: &Pod) -> Patch {
        json_patch::diff(
            &serde_json::to_value(before).unwrap(),
            &serde_json::to_value(after).unwrap(),
        )
    }

    /// The pod injected, its parts before and after, and the patch between them.
    fn injected(
        v: Value,
        a: &ActorSettings,
        native: bool,
        cache: Option<&RenderCache>,
    ) -> (Pod, Pod, Vec<u8>) {
        let before: Pod = serde_json::from_value(v).unwrap();
        let parts = InjectedPod::cloned(&before).unwrap();
        let mut after = before.clone();
        let mut injected = InjectedPod::take(&mut after).unwrap();
        inject(&mut injected, a, &ClusterConfig::default(), native).unwrap();
        let patch = injection_patch(&parts, &injected, cache).unwrap();
        injected.put_back(&mut after);
        (before, after, patch)
    }

    fn pods() -> Vec<Value> {
        vec![
            json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "app", "image": "i"}]}}),
            json!({"metadata": {"name": "p", "annotations": {"a~b/c": "keep"}, "labels": {"x": "y"}},
                   "spec": {"containers": [{"name": "asya-runtime", "image": "i", "args": ["x"],
                                            "env": [{"name": "ASYA_HANDLER", "value": "old"}, {"name": "K", "value": "v"}],
                                            "volumeMounts": [{"name": "m", "mountPath": "/m"}]},
                                           {"name": "other", "image": "o"}],
                            "initContainers": [{"name": "setup", "image": "s"}],
                            "volumes": [{"name": "m", "emptyDir": {}}]}}),
            json!({"metadata": {"name": "p", "annotations": {}},
                   "spec": {"containers": [{"name": "asya-sidecar", "image": "old"}, {"name": "asya-runtime", "image": "i"}],
                            "initContainers": [{"name": "asya-install-runtime", "image": "old"}, {"name": "a", "image": "a"}, {"name": "b", "image": "b"}],
                            "volumes": [{"name": "asya-socket", "emptyDir": {}}]}}),
        ]
    }

    #[test]
    fn same_ops_as_the_whole_pod_diff() {
        let cache = RenderCache::default();
        // Twice with the cache: renderings made, then reused.
        for (native, cache) in [
            (true, None),
            (false, None),
            (true, Some(&cache)),
            (false, Some(&cache)),
            (true, Some(&cache)),
            (false, Some(&cache)),
        ] {
            // With state proxies too: their connectors and volume are in the patch.
            for (v, a) in pods()
                .into_iter()
                .flat_map(|v| [(v.clone(), settings()), (v, settings_with_state())])
            {
                let (before, after, bytes) = injected(v.clone(), &a, native, cache);
                let got = parsed(&bytes);
                assert_eq!(
                    serde_json::to_value(&got).unwrap(),
                    serde_json::to_value(full_diff(&before, &after)).unwrap()
                );
                let mut applied = serde_json::to_value(&before).unwrap();
                json_patch::patch(&mut applied, &got).unwrap();
                assert_eq!(applied, serde_json::to_value(&after).unwrap());
                // The cache changes nothing in the bytes.
                assert_eq!(
                    String::from_utf8(bytes).unwrap(),
                    String::from_utf8(injected(v, &a, native, None).2).unwrap()
                );
            }
        }
    }

    fn arb_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            (-2i32..3).prop_map(Value::from),
            prop::sample::select(vec![-0.0, 0.0, 1.5]).prop_map(Value::from),
            "[ab~/]{0,2}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::btree_map("[ab~/\\\\]{0,2}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        /// The text diff gives the bytes of the `Value` diff, for any two documents.
        #[test]
        fn raw_ops_is_the_value_diff(x in arb_json(), y in arb_json()) {
            let root = ptr(&["spec", "containers", "0"]);
            let mut want = Vec::new();
            for op in json_patch::diff(&x, &y).0 {
                want.push(prefixed(&root, op).unwrap());
            }
            let mut got = Vec::new();
            raw_ops(&root, &to_raw_value(&x).unwrap(), &to_raw_value(&y).unwrap(), &mut got).unwrap();
            proptest::prop_assert_eq!(
                serde_json::to_string(&got).unwrap(),
                serde_json::to_string(&want).unwrap()
            );
        }
    }
}
