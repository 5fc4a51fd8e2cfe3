//! `asya-webhook validate -f FILE…`: the admission decision, offline. Reads multi-document
//! YAML (files or directories), resolves flavors from the `Flavor`, `EnvironmentConfig` and
//! flavor `ConfigMap` objects among them, and prints per object `accepted`, its warnings, or
//! every rejection reason. Exit 0: all accepted; 1: something rejected; 2: unreadable input.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use asya_api::flavor::{FlavorCatalog, FlavorDef};
use asya_api::review::{ReviewRequest, review_actor};
use asya_api::{ClusterConfig, Flavor};
use k8s_openapi::api::core::v1::ConfigMap;
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, clap::Args)]
pub struct ValidateArgs {
    /// Files or directories of YAML documents to check.
    #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
    pub files: Vec<PathBuf>,
    /// Cluster configuration YAML (docs/DESIGN.md §7); the built-in default when absent.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// A document that could not be read; the command exits 2.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: document {index}: not valid YAML: {message}")]
    Yaml {
        path: String,
        index: usize,
        message: String,
    },
    #[error("{path}: {message}")]
    Config { path: String, message: String },
}

/// One YAML document and where it came from.
pub struct Document {
    pub origin: String,
    pub value: Value,
}

/// The verdict on one object.
#[derive(Debug, PartialEq)]
pub struct ObjectReport {
    /// `Kind namespace/name` or `Kind name` for cluster-scoped objects.
    pub object: String,
    pub origin: String,
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
}

impl ObjectReport {
    pub fn accepted(&self) -> bool {
        self.errors.is_empty()
    }
}

fn yaml_files(path: &Path, out: &mut Vec<PathBuf>) -> Result<(), InputError> {
    let io = |source| InputError::Io {
        path: path.display().to_string(),
        source,
    };
    if path.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(io)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() || p.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                yaml_files(&p, out)?;
            }
        }
    } else {
        std::fs::metadata(path).map_err(io)?;
        out.push(path.to_path_buf());
    }
    Ok(())
}

/// Reads every document of every file (directories recursively, `*.yaml`/`*.yml`).
pub fn read_documents(paths: &[PathBuf]) -> Result<Vec<Document>, InputError> {
    let mut files = Vec::new();
    for p in paths {
        yaml_files(p, &mut files)?;
    }
    let mut docs = Vec::new();
    for file in files {
        let origin = file.display().to_string();
        let text = std::fs::read_to_string(&file).map_err(|source| InputError::Io {
            path: origin.clone(),
            source,
        })?;
        docs.extend(parse_documents(&origin, &text)?);
    }
    Ok(docs)
}

/// Splits multi-document YAML; empty documents are skipped.
pub fn parse_documents(origin: &str, text: &str) -> Result<Vec<Document>, InputError> {
    let mut docs = Vec::new();
    for (index, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(de).map_err(|e| InputError::Yaml {
            path: origin.into(),
            index: index + 1,
            message: e.to_string(),
        })?;
        if !value.is_null() {
            docs.push(Document {
                origin: format!("{origin}#{}", index + 1),
                value,
            });
        }
    }
    Ok(docs)
}

fn kind(v: &Value) -> &str {
    v.get("kind").and_then(Value::as_str).unwrap_or("")
}

fn api_group(v: &Value) -> &str {
    let api = v.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    api.rsplit_once('/').map_or("", |(g, _)| g)
}

fn display_name(v: &Value, namespaced: bool) -> String {
    let name = v
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("<unnamed>");
    if namespaced {
        let ns = v
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default");
        format!("{} {ns}/{name}", kind(v))
    } else {
        format!("{} {name}", kind(v))
    }
}

fn is_flavor_config_map(v: &Value) -> bool {
    kind(v) == "ConfigMap"
        && v.pointer(&format!(
            "/metadata/labels/{}",
            asya_api::labels::FLAVOR.replace('/', "~1")
        ))
        .is_some()
}

/// Decides every document. Flavors anywhere in the input take part in every actor's resolution.
pub fn validate_documents(docs: &[Document], config: &ClusterConfig) -> Vec<ObjectReport> {
    let mut catalog = FlavorCatalog::new();
    let mut reports = Vec::new();
    let mut flavor_defs = Vec::new();
    for d in docs {
        let v = &d.value;
        let def = match (api_group(v), kind(v)) {
            ("asya.sh", "Flavor") => match serde_json::from_value::<Flavor>(v.clone()) {
                Ok(f) => Some((FlavorDef::from_flavor(&f), false)),
                Err(e) => {
                    reports.push(ObjectReport {
                        object: display_name(v, false),
                        origin: d.origin.clone(),
                        errors: vec![format!("not a valid Flavor: {e}")],
                        warnings: vec![],
                    });
                    None
                }
            },
            ("apiextensions.crossplane.io", "EnvironmentConfig") => {
                FlavorDef::from_environment_config(v).map(|f| (f, false))
            }
            ("", "ConfigMap") if is_flavor_config_map(v) => {
                let mut cm = v.clone();
                if cm.pointer("/metadata/namespace").is_none()
                    && let Some(meta) = cm.get_mut("metadata").and_then(Value::as_object_mut)
                {
                    meta.insert("namespace".into(), "default".into());
                }
                serde_json::from_value::<ConfigMap>(cm)
                    .ok()
                    .and_then(|cm| FlavorDef::from_config_map(&cm))
                    .map(|f| (f, true))
            }
            _ => None,
        };
        if let Some((def, namespaced)) = def {
            flavor_defs.push((display_name(v, namespaced), d.origin.clone(), def.clone()));
            catalog.insert(def);
        }
    }
    for (object, origin, def) in flavor_defs {
        let errors = def.validate().iter().map(ToString::to_string).collect();
        reports.push(ObjectReport {
            object,
            origin,
            errors,
            warnings: def.warnings.clone(),
        });
    }
    for d in docs {
        let v = &d.value;
        if (api_group(v), kind(v)) != ("asya.sh", "AsyncActor") {
            continue;
        }
        let review = review_actor(&ReviewRequest {
            object: v,
            old_object: None,
            namespace: None,
            catalog: &catalog,
            config,
        });
        let mut warnings = review.warnings.clone();
        warnings.extend(privilege_warnings(&review));
        reports.push(ObjectReport {
            object: display_name(v, true),
            origin: d.origin.clone(),
            errors: review.errors.iter().map(ToString::to_string).collect(),
            warnings,
        });
    }
    reports
}

/// What admission will ask the API server about an accepted actor's pod (docs/DESIGN.md §9),
/// which offline validation cannot: each privilege needs its author to be allowed to create
/// the workload, and baseline's rules hold in every namespace without a laxer label.
fn privilege_warnings(review: &asya_api::ActorReview) -> Vec<String> {
    let Some(actor) = review.resolved.as_ref().filter(|_| review.allowed()) else {
        return Vec::new();
    };
    let resource = match actor.workload_kind() {
        "StatefulSet" => "statefulsets",
        _ => "deployments",
    };
    asya_api::privilege::RenderedPod::of(actor)
        .privileges(&review.origins)
        .into_iter()
        .map(|f| {
            let baseline = if f.rule.baseline() {
                "; Pod Security baseline (the default level) forbids it"
            } else {
                ""
            };
            format!(
                "{f}: {}: admitted only if its author may create {resource}.apps in namespace {}{baseline}",
                f.rule.describe(),
                actor.namespace
            )
        })
        .collect()
}

/// The report as printed: one block per object, a summary line last.
pub fn render(reports: &[ObjectReport]) -> String {
    let mut out = String::new();
    for r in reports {
        let verdict = if r.accepted() { "accepted" } else { "rejected" };
        let _ = writeln!(out, "{} ({}): {verdict}", r.object, r.origin);
        for e in &r.errors {
            let _ = writeln!(out, "  error: {e}");
        }
        for w in &r.warnings {
            let _ = writeln!(out, "  warning: {w}");
        }
    }
    let rejected = reports.iter().filter(|r| !r.accepted()).count();
    let _ = writeln!(
        out,
        "{} objects: {} accepted, {rejected} rejected",
        reports.len(),
        reports.len() - rejected
    );
    out
}

fn load_config(path: Option<&Path>) -> Result<ClusterConfig, InputError> {
    let Some(path) = path else {
        return Ok(ClusterConfig::default());
    };
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| InputError::Io {
        path: origin.clone(),
        source,
    })?;
    // The chart's ConfigMap or the bare config.yaml both work.
    let value: Value = serde_yaml::from_str(&text).map_err(|e| InputError::Config {
        path: origin.clone(),
        message: e.to_string(),
    })?;
    let text = match value.pointer("/data/config.yaml").and_then(Value::as_str) {
        Some(inner) if kind(&value) == "ConfigMap" => inner.to_string(),
        _ => text,
    };
    ClusterConfig::from_yaml(&text).map_err(|e| InputError::Config {
        path: origin,
        message: e.to_string(),
    })
}

pub fn run(args: ValidateArgs) -> ExitCode {
    let input =
        load_config(args.config.as_deref()).and_then(|c| Ok((c, read_documents(&args.files)?)));
    let (config, docs) = match input {
        Ok(v) => v,
        Err(e) => {
            eprintln!("asya-webhook validate: {e}");
            return ExitCode::from(2);
        }
    };
    let reports = validate_documents(&docs, &config);
    print!("{}", render(&reports));
    if reports.iter().all(ObjectReport::accepted) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_on(yaml: &str) -> Vec<ObjectReport> {
        validate_documents(
            &parse_documents("t.yaml", yaml).unwrap(),
            &ClusterConfig::default(),
        )
    }

    #[test]
    fn privileges_are_warned_of() {
        let r = run_on(
            r#"
apiVersion: asya.sh/v1alpha1
kind: AsyncActor
metadata: {name: a, namespace: team}
spec: {image: x, handler: m.f, volumes: [{name: h, hostPath: {path: /}}]}
"#,
        );
        assert!(r[0].accepted());
        assert_eq!(
            r[0].warnings,
            vec![
                "spec.volumes[0].hostPath.path: \"/\": mounts a directory of the node (Pod Security baseline: hostPath volumes): admitted only if its author may create deployments.apps in namespace team; Pod Security baseline (the default level) forbids it"
            ]
        );
    }

    #[test]
    fn flavor_conflict_reads_like_seed_002() {
        let reports = run_on(
            r#"
apiVersion: apiextensions.crossplane.io/v1beta1
kind: EnvironmentConfig
metadata: {name: flavor-a, labels: {asya.sh/flavor: flavor-a}}
data: {scaling: {minReplicaCount: 1}}
---
apiVersion: asya.sh/v1alpha1
kind: Flavor
metadata: {name: flavor-b}
spec: {scaling: {minReplicaCount: 5}}
---
apiVersion: asya.sh/v1alpha1
kind: AsyncActor
metadata: {name: my-actor}
spec: {image: x, handler: m.f, flavors: [flavor-a, flavor-b]}
"#,
        );
        let actor = reports
            .iter()
            .find(|r| r.object == "AsyncActor default/my-actor")
            .unwrap();
        assert_eq!(actor.errors, vec![r#"flavor merge conflict: flavors "flavor-a" and "flavor-b" conflict on scaling.minReplicaCount"#.to_string()]);
        assert!(
            reports
                .iter()
                .filter(|r| r.object != actor.object)
                .all(ObjectReport::accepted)
        );
        let text = render(&reports);
        assert!(
            text.contains(
                "AsyncActor default/my-actor (t.yaml#3): rejected\n  error: flavor merge conflict"
            ),
            "{text}"
        );
        assert!(
            text.ends_with("3 objects: 2 accepted, 1 rejected\n"),
            "{text}"
        );
    }

    #[test]
    fn namespaced_flavor_configmap_takes_part() {
        let reports = run_on(
            r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: team-defaults, namespace: ml, labels: {asya.sh/flavor: team-defaults}}
data:
  flavor.yaml: |
    env: [{name: TEAM, value: ml}]
---
apiVersion: asya.sh/v1alpha1
kind: AsyncActor
metadata: {name: a, namespace: ml}
spec: {image: x, handler: m.f, flavors: [team-defaults]}
---
apiVersion: asya.sh/v1alpha1
kind: AsyncActor
metadata: {name: b, namespace: other}
spec: {image: x, handler: m.f, flavors: [team-defaults]}
"#,
        );
        let a = reports
            .iter()
            .find(|r| r.object == "AsyncActor ml/a")
            .unwrap();
        assert!(a.accepted() && a.warnings.is_empty(), "{a:?}");
        let b = reports
            .iter()
            .find(|r| r.object == "AsyncActor other/b")
            .unwrap();
        assert!(b.accepted());
        assert_eq!(b.warnings, vec![r#"flavor "team-defaults" not found: the actor waits in phase Waiting until it exists"#.to_string()]);
    }

    #[test]
    fn unreadable_yaml_is_an_input_error() {
        let err = parse_documents("bad.yaml", "a: [1,\n").err().unwrap();
        assert!(
            err.to_string()
                .starts_with("bad.yaml: document 1: not valid YAML"),
            "{err}"
        );
    }

    #[test]
    fn config_may_be_the_chart_configmap() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cm.yaml");
        std::fs::write(&p, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: asya-config}\ndata:\n  config.yaml: |\n    defaultTransport: sqs\n").unwrap();
        assert_eq!(load_config(Some(&p)).unwrap().default_transport, "sqs");
        std::fs::write(&p, "defaultTransport: nope\n").unwrap();
        assert!(
            load_config(Some(&p))
                .unwrap_err()
                .to_string()
                .contains("defaultTransport")
        );
    }
}
