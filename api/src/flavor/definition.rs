//! A flavor read from any of its sources (Flavor, EnvironmentConfig, ConfigMap) into one
//! form: its partial spec as normalised JSON.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::{Map, Value};

use super::*;
use crate::error::{FieldError, FieldErrors};
use crate::labels;
use crate::normalize::normalize_spec;
use crate::types::{AsyncActorSpec, Flavor};

/// Where a flavor was defined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FlavorSource {
    /// `Flavor` (asya.sh/v1alpha1), cluster-scoped.
    Flavor,
    /// Crossplane `EnvironmentConfig`, cluster-scoped.
    EnvironmentConfig,
    /// A ConfigMap labelled `asya.sh/flavor` in the actor's namespace.
    ConfigMap { namespace: String, name: String },
}

impl std::fmt::Display for FlavorSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FlavorSource::Flavor => f.write_str("Flavor"),
            FlavorSource::EnvironmentConfig => f.write_str("EnvironmentConfig"),
            FlavorSource::ConfigMap { namespace, name } => {
                write!(f, "ConfigMap {namespace}/{name}")
            }
        }
    }
}

/// One flavor, read into the common form: its partial spec as normalised JSON.
#[derive(Clone, Debug, PartialEq)]
pub struct FlavorDef {
    pub name: String,
    pub source: FlavorSource,
    /// The partial spec, aliases normalised. Empty object when `problem` is set.
    pub data: Map<String, Value>,
    /// The deprecation message, when the flavor is labelled deprecated.
    pub deprecated: Option<String>,
    /// Why the flavor cannot be used (unparseable data); actors using it are rejected with it.
    pub problem: Option<String>,
    /// Notes on the flavor itself (aliases rewritten, unknown fields dropped).
    pub warnings: Vec<String>,
}

impl FlavorDef {
    /// Reads a partial spec from any JSON value; `origin` names it in messages.
    pub fn from_data(name: &str, source: FlavorSource, data: &Value) -> Self {
        let mut def = FlavorDef {
            name: name.to_string(),
            source,
            data: Map::new(),
            deprecated: None,
            problem: None,
            warnings: Vec::new(),
        };
        let obj = match data {
            Value::Object(_) => data.clone(),
            Value::Null => Value::Object(Map::new()),
            other => {
                def.problem = Some(format!("flavor data must be an object, got {other}"));
                return def;
            }
        };
        let mut unknown = Vec::new();
        let parsed: Result<AsyncActorSpec, _> =
            serde_ignored::deserialize(obj, |p| unknown.push(p.to_string()));
        match parsed {
            Ok(mut spec) => {
                for u in unknown {
                    def.warnings
                        .push(format!("flavor {name:?}: unknown field {u} ignored"));
                }
                let n = normalize_spec(&mut spec, "");
                def.warnings.extend(
                    n.warnings
                        .into_iter()
                        .map(|w| format!("flavor {name:?}: {w}")),
                );
                if !n.errors.is_empty() {
                    def.problem = Some(n.errors.to_string());
                    return def;
                }
                // Reading through the typed spec drops nothing known and writes canonical names.
                if let Ok(Value::Object(m)) = serde_json::to_value(&spec) {
                    def.data = m;
                }
                // The typed spec cannot hold these; look at the raw data so they are reported.
                if let Value::Object(raw) = data {
                    for f in ACTOR_ONLY_FIELDS {
                        if raw.contains_key(f) {
                            def.data.insert(f.to_string(), raw[f].clone());
                        }
                    }
                }
            }
            Err(e) => {
                def.problem = Some(format!(
                    "flavor data does not parse as a partial AsyncActor spec: {e}"
                ))
            }
        }
        def
    }

    pub fn from_flavor(f: &Flavor) -> Self {
        let name = f.metadata.name.clone().unwrap_or_default();
        let data = serde_json::to_value(&f.spec).unwrap_or(Value::Null);
        let mut def = Self::from_data(&name, FlavorSource::Flavor, &data);
        def.deprecated = deprecation(f.metadata.labels.as_ref(), f.metadata.annotations.as_ref());
        def
    }

    /// A Crossplane `EnvironmentConfig` (any JSON shape with `metadata` and `data`).
    pub fn from_environment_config(obj: &Value) -> Option<Self> {
        let meta: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta =
            serde_json::from_value(obj.get("metadata")?.clone()).ok()?;
        let name = meta.name.clone()?;
        let mut def = Self::from_data(
            &name,
            FlavorSource::EnvironmentConfig,
            obj.get("data").unwrap_or(&Value::Null),
        );
        def.deprecated = deprecation(meta.labels.as_ref(), meta.annotations.as_ref());
        Some(def)
    }

    /// A ConfigMap labelled `asya.sh/flavor: NAME` with the partial spec under `flavor.yaml`.
    pub fn from_config_map(cm: &ConfigMap) -> Option<Self> {
        let labels_map = cm.metadata.labels.as_ref()?;
        let name = labels_map.get(labels::FLAVOR)?.clone();
        let source = FlavorSource::ConfigMap {
            namespace: cm
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            name: cm.metadata.name.clone().unwrap_or_default(),
        };
        let text = cm
            .data
            .as_ref()
            .and_then(|d| d.get(labels::FLAVOR_CONFIGMAP_KEY));
        let mut def = match (super::bounds::not_read(cm), text) {
            // The cache dropped the flavor unread (a size or count bound).
            (Some(why), _) => {
                let mut d = Self::from_data(&name, source, &Value::Null);
                d.problem = Some(why.to_string());
                d
            }
            (None, None) => {
                let mut d = Self::from_data(&name, source, &Value::Null);
                d.problem = Some(format!(
                    "ConfigMap has no key {:?}",
                    labels::FLAVOR_CONFIGMAP_KEY
                ));
                d
            }
            (None, Some(t)) => match serde_yaml::from_str::<Value>(t) {
                Ok(v) => Self::from_data(&name, source, &v),
                Err(e) => {
                    let mut d = Self::from_data(&name, source, &Value::Null);
                    d.problem = Some(format!(
                        "{} is not valid YAML: {e}",
                        labels::FLAVOR_CONFIGMAP_KEY
                    ));
                    d
                }
            },
        };
        def.deprecated = deprecation(Some(labels_map), cm.metadata.annotations.as_ref());
        Some(def)
    }

    /// Problems of the flavor on its own (for `asya-webhook validate` and the flavor's author).
    pub fn validate(&self) -> FieldErrors {
        let mut errs = FieldErrors::default();
        if self.name.len() < MIN_FLAVOR_NAME_LEN {
            errs.push(FieldError::invalid(
                "metadata.name",
                self.name.as_str(),
                "flavor names must be at least 3 characters",
            ));
        }
        if let Some(p) = &self.problem {
            errs.push(FieldError::invalid(
                self.data_path(),
                self.name.as_str(),
                p.clone(),
            ));
        }
        for f in ACTOR_ONLY_FIELDS {
            if self.data.contains_key(f) {
                errs.push(FieldError::forbidden(
                    format!("{}.{f}", self.data_path()),
                    format!("{f} cannot come from a flavor; only the actor may set it"),
                ));
            }
        }
        errs
    }

    fn data_path(&self) -> &'static str {
        match self.source {
            FlavorSource::Flavor => "spec",
            FlavorSource::EnvironmentConfig => "data",
            FlavorSource::ConfigMap { .. } => "data.flavor.yaml",
        }
    }
}

pub(super) fn deprecation(
    labels_map: Option<&BTreeMap<String, String>>,
    annotations: Option<&BTreeMap<String, String>>,
) -> Option<String> {
    let flagged = labels_map
        .and_then(|l| l.get(labels::DEPRECATED))
        .is_some_and(|v| v == "true");
    flagged.then(|| {
        annotations
            .and_then(|a| a.get(labels::DEPRECATION_MESSAGE))
            .cloned()
            .unwrap_or_default()
    })
}
