//! The merge rules on JSON: flavors merged in order, the inline spec laid over them, and
//! which flavor set each part (origins).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::error::{FieldError, FieldErrors};

/// Which flavor set each part of a merged spec: path prefix (`scaling.minReplicaCount`,
/// `env[MODEL_PATH]`) → flavor name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Origins(pub(super) BTreeMap<String, String>);

impl Origins {
    /// The flavor that set `path` (a dotted spec path without the `spec.` prefix), if any.
    pub fn flavor_of(&self, path: &str) -> Option<&str> {
        let path = path.strip_prefix("spec.").unwrap_or(path);
        // The most specific recorded prefix decides; the map is small (one entry per key a flavor introduced).
        self.0
            .iter()
            .filter(|(p, _)| is_prefix_path(p, path))
            .max_by_key(|(p, _)| p.len())
            .map(|(_, f)| f.as_str())
    }
}

pub(super) fn is_prefix_path(prefix: &str, path: &str) -> bool {
    path == prefix
        || (path.starts_with(prefix)
            && matches!(path.as_bytes().get(prefix.len()), Some(b'.' | b'[')))
}

/// The identity of a list item for merging, if the list is keyed (env by name, volume
/// mounts by mountPath, …). Unkeyed lists (tolerations) simply append.
pub(super) fn item_key(list_field: &str, item: &Value) -> Option<String> {
    let key_field = match list_field {
        "env" | "volumes" | "stateProxy" | "secretRefs" | "policies" => "name",
        "volumeMounts" => "mountPath",
        _ => return None,
    };
    item.get(key_field)
        .and_then(Value::as_str)
        .map(str::to_string)
}

pub(super) fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// Merges flavor data in order. Distinct keys at any depth merge; the same leaf from two
/// flavors is a conflict (all conflicts are reported, not only the first).
pub fn merge_flavors(
    layers: &[(&str, &Map<String, Value>)],
) -> Result<(Map<String, Value>, Origins), FieldErrors> {
    let mut acc = Map::new();
    let mut origins = Origins::default();
    let mut errs = FieldErrors::default();
    for (flavor, data) in layers {
        merge_map(&mut acc, data, flavor, "", &mut origins, &mut errs);
    }
    if errs.is_empty() {
        Ok((acc, origins))
    } else {
        Err(errs)
    }
}

pub(super) fn merge_map(
    acc: &mut Map<String, Value>,
    src: &Map<String, Value>,
    flavor: &str,
    prefix: &str,
    origins: &mut Origins,
    errs: &mut FieldErrors,
) {
    for (key, value) in src {
        let path = join(prefix, key);
        match (acc.get_mut(key), value) {
            (None, _) => {
                acc.insert(key.clone(), value.clone());
                origins.0.insert(path, flavor.to_string());
            }
            (Some(Value::Object(a)), Value::Object(b)) => {
                merge_map(a, b, flavor, &path, origins, errs)
            }
            (Some(Value::Array(a)), Value::Array(b)) => {
                for item in b {
                    let keyed = item_key(key, item);
                    if let Some(k) = &keyed {
                        let item_path = format!("{path}[{k}]");
                        if a.iter().any(|x| item_key(key, x).as_ref() == Some(k)) {
                            let first = origins.flavor_of(&item_path).unwrap_or("?").to_string();
                            errs.push(FieldError::flavor_conflict(&first, flavor, &item_path));
                            continue;
                        }
                        origins.0.insert(item_path, flavor.to_string());
                    }
                    a.push(item.clone());
                }
            }
            (Some(_), _) => {
                let first = origins.flavor_of(&path).unwrap_or("?").to_string();
                errs.push(FieldError::flavor_conflict(&first, flavor, &path));
            }
        }
    }
}

/// Lays the actor's inline spec over the merged flavors: inline leaves win, inline maps merge
/// key by key, inline list items replace flavor items with the same key and append otherwise.
/// Whatever the inline spec sets stops being attributed to a flavor.
pub fn overlay_inline(
    base: &mut Map<String, Value>,
    inline: &Map<String, Value>,
    origins: &mut Origins,
) {
    overlay_map(base, inline, "", origins);
}

pub(super) fn overlay_map(
    base: &mut Map<String, Value>,
    inline: &Map<String, Value>,
    prefix: &str,
    origins: &mut Origins,
) {
    for (key, value) in inline {
        let path = join(prefix, key);
        match (base.get_mut(key), value) {
            (Some(Value::Object(a)), Value::Object(b)) => {
                push_down(origins, &path, a.keys().map(|k| join(&path, k)));
                overlay_map(a, b, &path, origins);
            }
            (Some(Value::Array(a)), Value::Array(b)) => {
                let keys: Vec<String> = a
                    .iter()
                    .filter_map(|x| item_key(key, x))
                    .map(|k| format!("{path}[{k}]"))
                    .collect();
                push_down(origins, &path, keys.into_iter());
                for item in b {
                    match item_key(key, item) {
                        Some(k) => {
                            origins.0.remove(&format!("{path}[{k}]"));
                            match a.iter_mut().find(|x| item_key(key, x).as_ref() == Some(&k)) {
                                Some(slot) => *slot = item.clone(),
                                None => a.push(item.clone()),
                            }
                        }
                        None if a.contains(item) => {}
                        None => a.push(item.clone()),
                    }
                }
            }
            _ => {
                clear_origins_under(origins, &path);
                base.insert(key.clone(), value.clone());
            }
        }
    }
}

/// Forgets which flavor set `path` or anything under it: the inline spec replaces it.
pub(super) fn clear_origins_under(origins: &mut Origins, path: &str) {
    let stale: Vec<String> = origins
        .0
        .keys()
        .filter(|p| is_prefix_path(path, p))
        .cloned()
        .collect();
    for p in stale {
        origins.0.remove(&p);
    }
}

/// Moves an origin recorded for a whole subtree down to its children, so that overriding one
/// child inline leaves the others attributed to their flavor.
pub(super) fn push_down(origins: &mut Origins, path: &str, children: impl Iterator<Item = String>) {
    if let Some(flavor) = origins.0.remove(path) {
        for child in children {
            origins.0.entry(child).or_insert_with(|| flavor.clone());
        }
    }
}
