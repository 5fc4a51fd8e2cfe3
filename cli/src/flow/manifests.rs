//! What `asya flow compile` writes: one AsyncActor per actor the flow calls (labelled with the
//! flow and the actor's role), the ConfigMap holding the program (read by the entry actor's
//! sidecar), and the graphs. `kubectl apply -f DIR`. No kustomization.yaml: `apply -f` would
//! take it for an object of an unknown kind and fail.

use serde_json::{Value, json};

use super::compile::{Compiled, dns_label};
use super::graph;

pub use asya_api::labels::{
    ANNOTATION_FLOW_DESCRIPTION as DESCRIPTION_ANNOTATION, FLOW as FLOW_LABEL,
    FLOW_ROLE as ROLE_LABEL, FLOW_VERSION as VERSION_LABEL,
};

#[derive(Debug, Clone)]
pub struct Deploy {
    /// The handlers' image.
    pub image: String,
}

/// One file to write: its name in the output directory and its text.
#[derive(Debug, Clone, PartialEq)]
pub struct File {
    pub name: String,
    pub text: String,
}

/// The ConfigMap of a flow: `flow-{name}`.
pub fn config_map_name(flow: &str) -> String {
    format!("flow-{}", dns_label(flow).unwrap_or_else(|| "flow".into()))
}

/// A label value from a flow name (at most 63 of `[A-Za-z0-9_.-]`, alphanumeric at the ends).
fn label_value(s: &str) -> String {
    let v: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    v.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// Every file of a compiled flow.
pub fn files(c: &Compiled, d: &Deploy) -> Vec<File> {
    let p = &c.program;
    let flow = label_value(&p.flow);
    let cm = config_map_name(&p.flow);
    let entry = p.entry().map(|(a, _)| a);
    let branches = fan_out_actors(p);
    let mut out = Vec::new();
    let program = serde_json::to_string(p).unwrap_or_default();
    out.push(File {
        name: "flow-program.yaml".into(),
        text: yaml(&json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": cm,
                "labels": {FLOW_LABEL: flow, VERSION_LABEL: p.version},
            },
            "data": {"program.json": program},
        })),
    });
    for a in &c.actors {
        let role = if entry.as_deref() == Some(a.actor.as_str()) {
            "entry"
        } else if branches.contains(&a.actor) {
            "fan-out-branch"
        } else {
            "step"
        };
        let mut labels = json!({FLOW_LABEL: flow, ROLE_LABEL: role});
        let mut spec = json!({
            "actor": a.actor,
            "image": d.image,
            "handler": a.handler,
        });
        if role == "entry" {
            labels[VERSION_LABEL] = json!(p.version);
            spec["sidecar"] = json!({"env": [{
                "name": asya_flow::PROGRAM_ENV,
                "valueFrom": {"configMapKeyRef": {"name": cm, "key": "program.json"}},
            }]});
        }
        let mut metadata = json!({"name": a.actor, "labels": labels});
        if let (true, Some(d)) = (role == "entry", &c.description) {
            metadata["annotations"] = json!({DESCRIPTION_ANNOTATION: d});
        }
        out.push(File {
            name: format!("actor-{}.yaml", a.actor),
            text: yaml(&json!({
                "apiVersion": "asya.sh/v1alpha1",
                "kind": "AsyncActor",
                "metadata": metadata,
                "spec": spec,
            })),
        });
    }
    out.push(File {
        name: "flow.mmd".into(),
        text: graph::mermaid(p),
    });
    out.push(File {
        name: "flow.dot".into(),
        text: graph::dot(p),
    });
    out
}

fn fan_out_actors(p: &asya_flow::Program) -> Vec<String> {
    use asya_flow::ir::{FanOutBranches, Instr};
    let mut out = Vec::new();
    for i in &p.code {
        if let Instr::FanOut { branches, .. } = i {
            match branches {
                FanOutBranches::Calls(cs) => out.extend(cs.iter().map(|c| c.actor.clone())),
                FanOutBranches::Each { actor, .. } => out.push(actor.clone()),
            }
        }
    }
    out
}

fn yaml(v: &Value) -> String {
    serde_yaml::to_string(v).unwrap_or_default()
}
