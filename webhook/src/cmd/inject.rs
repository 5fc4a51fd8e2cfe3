//! `asya-webhook inject -f FILE [--actor FILE] [--config FILE]`: the admission injection,
//! offline, for Pods and the pod templates of Deployment, StatefulSet, ReplicaSet, DaemonSet,
//! Job and CronJob (YAML in, YAML out, like `istioctl kube-inject`).

use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use asya_api::config::ClusterConfig;
use asya_api::flavor::{FlavorCatalog, FlavorDef};
use asya_api::labels;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::Value;

use crate::admission::{Ctx, settings_for_pod};
use crate::inject::{InjectedPod, inject, wants_injection};

#[derive(Debug, clap::Args)]
pub struct InjectArgs {
    /// Workload YAML (one or more documents); `-` reads standard input.
    #[arg(short = 'f', long = "filename")]
    pub file: PathBuf,
    /// AsyncActor (and Flavor) YAML to take the actor's configuration from.
    #[arg(long)]
    pub actor: Option<PathBuf>,
    /// Cluster configuration YAML (docs/DESIGN.md §7); the built-in default when absent.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Inject a regular container instead of a native sidecar (clusters before 1.29).
    #[arg(long)]
    pub no_native_sidecar: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum InjectCmdError {
    #[error("{0}: {1}")]
    Read(String, std::io::Error),
    #[error("{0}: not valid YAML: {1}")]
    Yaml(String, serde_yaml::Error),
    #[error("{0}")]
    Config(String),
    #[error("document {index} ({kind} {name:?}): {message}")]
    Doc {
        index: usize,
        kind: String,
        name: String,
        message: String,
    },
}

fn read(path: &PathBuf) -> Result<String, InjectCmdError> {
    let mut s = String::new();
    if path.as_os_str() == "-" {
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| InjectCmdError::Read("stdin".into(), e))?;
    } else {
        s = std::fs::read_to_string(path)
            .map_err(|e| InjectCmdError::Read(path.display().to_string(), e))?;
    }
    Ok(s)
}

fn docs(text: &str, origin: &str) -> Result<Vec<Value>, InjectCmdError> {
    let mut out = Vec::new();
    for d in serde_yaml::Deserializer::from_str(text) {
        let v = Value::deserialize(d).map_err(|e| InjectCmdError::Yaml(origin.into(), e))?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

/// JSON pointer of the pod template in a workload of `kind`, "" for a Pod itself.
pub fn template_pointer(kind: &str) -> Option<&'static str> {
    match kind {
        "Pod" => Some(""),
        "Deployment" | "StatefulSet" | "ReplicaSet" | "DaemonSet" | "Job" => Some("/spec/template"),
        "CronJob" => Some("/spec/jobTemplate/spec/template"),
        _ => None,
    }
}

/// Inject into every workload document; other documents pass through unchanged.
pub fn inject_documents(
    input: Vec<Value>,
    actors: Vec<Value>,
    catalog: &FlavorCatalog,
    config: &ClusterConfig,
    native: bool,
) -> Result<Vec<Value>, InjectCmdError> {
    // The single --actor names the actor of workloads that do not say.
    let default_actor = actors
        .first()
        .and_then(|a| a.pointer("/metadata/name"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let mut out = Vec::new();
    for (index, mut doc) in input.into_iter().enumerate() {
        let kind = doc
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let Some(ptr) = template_pointer(&kind) else {
            out.push(doc);
            continue;
        };
        let name = doc
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let ns = doc
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string();
        let fail = |message: String| InjectCmdError::Doc {
            index,
            kind: kind.clone(),
            name: name.clone(),
            message,
        };
        let template = doc
            .pointer(ptr)
            .cloned()
            .ok_or_else(|| fail(format!("no pod template at {ptr}")))?;
        let mut meta: ObjectMeta = template
            .get("metadata")
            .map(|m| serde_json::from_value(m.clone()))
            .transpose()
            .map_err(|e| fail(format!("template metadata: {e}")))?
            .unwrap_or_default();
        let spec: PodSpec =
            serde_json::from_value(template.get("spec").cloned().unwrap_or(Value::Null))
                .map_err(|e| fail(format!("pod spec: {e}")))?;
        // Offline injection is explicit: label the pods as the webhook expects them.
        let l = meta.labels.get_or_insert_with(Default::default);
        l.insert(labels::INJECT.into(), "true".into());
        if !l.contains_key(labels::ACTOR) {
            match &default_actor {
                Some(a) => {
                    l.insert(labels::ACTOR.into(), a.clone());
                }
                None => {
                    return Err(fail(format!(
                        "no {} label and no --actor given",
                        labels::ACTOR
                    )));
                }
            }
        }
        debug_assert!(wants_injection(&meta));
        let mut lookup: HashMap<(String, String), Value> = HashMap::new();
        for a in &actors {
            if let Some(n) = a.pointer("/metadata/name").and_then(Value::as_str) {
                let mut a = a.clone();
                let a_ns = a
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or(&ns)
                    .to_string();
                if let Some(m) = a.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.insert("namespace".into(), Value::String(a_ns.clone()));
                }
                lookup.insert((a_ns, n.to_string()), a);
            }
        }
        let ctx = Ctx {
            config,
            catalog,
            actors: &lookup,
            native_sidecar: native,
            memo: None,
        };
        let mut pod = Pod {
            metadata: meta,
            spec: Some(spec),
            status: None,
        };
        let (settings, warnings) = settings_for_pod(&pod, &ns, &ctx).map_err(|(_, m)| fail(m))?;
        for w in warnings {
            eprintln!("Warning: {kind} {name}: {w}");
        }
        let mut parts = InjectedPod::take(&mut pod).ok_or_else(|| fail("no pod spec".into()))?;
        let injected = inject(&mut parts, &settings, config, native);
        parts.put_back(&mut pod);
        injected.map_err(|e| fail(e.to_string()))?;
        let new_meta = serde_json::to_value(&pod.metadata).map_err(|e| fail(e.to_string()))?;
        let new_spec = serde_json::to_value(&pod.spec).map_err(|e| fail(e.to_string()))?;
        let slot = doc
            .pointer_mut(ptr)
            .ok_or_else(|| fail("template vanished".into()))?;
        if let Some(o) = slot.as_object_mut() {
            o.insert("metadata".into(), new_meta);
            o.insert("spec".into(), new_spec);
        }
        out.push(doc);
    }
    Ok(out)
}

fn run_inner(args: &InjectArgs) -> Result<String, InjectCmdError> {
    let config = crate::cmd::serve::load_config(args.config.as_ref())
        .map_err(|e| InjectCmdError::Config(format!("{e:#}")))?;
    let input = docs(&read(&args.file)?, &args.file.display().to_string())?;
    let mut actors = Vec::new();
    let mut catalog = FlavorCatalog::new();
    if let Some(p) = &args.actor {
        for d in docs(&read(p)?, &p.display().to_string())? {
            match d.get("kind").and_then(Value::as_str) {
                Some("AsyncActor") => actors.push(d),
                Some("Flavor") => {
                    if let Ok(f) = serde_json::from_value(d) {
                        catalog.insert(FlavorDef::from_flavor(&f));
                    }
                }
                _ => {}
            }
        }
    }
    let native = config.sidecar.native && !args.no_native_sidecar;
    let out = inject_documents(input, actors, &catalog, &config, native)?;
    let mut text = String::new();
    for (i, d) in out.iter().enumerate() {
        if i > 0 {
            text.push_str("---\n");
        }
        text.push_str(
            &serde_yaml::to_string(d).map_err(|e| InjectCmdError::Yaml("output".into(), e))?,
        );
    }
    Ok(text)
}

pub fn run(args: InjectArgs) -> ExitCode {
    match run_inner(&args) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("asya-webhook inject: {e}");
            ExitCode::FAILURE
        }
    }
}
