//! Flows as tools (docs/flows.md): a compiled flow's entry is one AsyncActor, labelled
//! `asya.sh/flow: NAME` and `asya.sh/flow-role: entry`; its sidecar starts the flow for any
//! envelope sent to its queue. The gateway lists each as the tool `{namespace}.{flow}` (the
//! namespace in the name, so one team's flow never hides another's of the same name), whose
//! route is the entry actor alone, in the actor's namespace and transport: the same tenancy
//! rules as any tool follow from the namespace. Its description is the annotation
//! `asya.sh/flow-description` (the flow function's docstring, written by `asya flow compile`);
//! its parameters, when the flow declares them, the annotation `asya.sh/flow-parameters` (a
//! JSON object in the tools file's `parameters` shape); without them any object is accepted.
//!
//! [`tools_of`] is pure; [`watch`] keeps the App's flow tools in step with a watch of the
//! entry AsyncActors (`--flows=kube`).

use std::collections::BTreeMap;
use std::sync::Arc;

use asya_api::types::AsyncActor;
use futures::StreamExt;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector;
use kube::runtime::watcher;

use crate::app::App;
use crate::tools::{Parameter, Tool, Tools};

pub use asya_api::labels::{
    ANNOTATION_FLOW_DESCRIPTION as DESCRIPTION_ANNOTATION,
    ANNOTATION_FLOW_PARAMETERS as PARAMETERS_ANNOTATION, FLOW as FLOW_LABEL,
    FLOW_ROLE as ROLE_LABEL,
};
/// The entry's role: the one actor whose queue starts the flow.
pub const ENTRY: &str = "entry";

/// The flow tools of these AsyncActors (entries only; others are ignored), and a warning for
/// each entry that cannot be a tool, naming the actor, the field and the rule.
pub fn tools_of(actors: &[Arc<AsyncActor>]) -> (Tools, Vec<String>) {
    let mut warnings = Vec::new();
    let mut list = Vec::new();
    for a in actors {
        let meta = &a.metadata;
        let labels = meta.labels.clone().unwrap_or_default();
        if labels.get(ROLE_LABEL).map(String::as_str) != Some(ENTRY) {
            continue;
        }
        let (Some(name), Some(ns), Some(flow)) =
            (&meta.name, &meta.namespace, labels.get(FLOW_LABEL))
        else {
            continue;
        };
        let at = format!("AsyncActor {ns}/{name}");
        let notes = meta.annotations.clone().unwrap_or_default();
        let parameters: BTreeMap<String, Parameter> = match notes.get(PARAMETERS_ANNOTATION) {
            None => BTreeMap::new(),
            Some(text) => match serde_json::from_str(text) {
                Ok(p) => p,
                Err(e) => {
                    warnings.push(format!(
                        "{at}: annotation {PARAMETERS_ANNOTATION}: not a parameters object \
                         ({e}); flow {flow} is not offered as a tool"
                    ));
                    continue;
                }
            },
        };
        let actor = a.spec.actor.clone().unwrap_or_else(|| name.clone());
        list.push((
            at,
            Tool {
                name: format!("{ns}.{flow}"),
                description: Some(
                    notes
                        .get(DESCRIPTION_ANNOTATION)
                        .cloned()
                        .unwrap_or_else(|| format!("Flow {flow} (entry actor {actor})")),
                ),
                open: parameters.is_empty(),
                parameters,
                route: vec![actor],
                namespace: Some(ns.clone()),
                transport: a.spec.transport.clone(),
                timeout: None,
            },
        ));
    }
    // Validated one by one, so one bad entry keeps only itself out.
    let mut tools = Tools::default();
    for (at, t) in list {
        match Tools::from_list(vec![t.clone()]) {
            Ok(_) if tools.tools.contains_key(&t.name) => warnings.push(format!(
                "{at}: flow tool {:?} is already offered by another entry actor of that flow; \
                 only the first is",
                t.name
            )),
            Ok(_) => {
                tools.tools.insert(t.name.clone(), t);
            }
            Err(errors) => warnings.push(format!(
                "{at}: not offered as a tool: {}",
                errors
                    .iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; ")
            )),
        }
    }
    (tools, warnings)
}

/// Watches the entry AsyncActors of every namespace and keeps `app`'s flow tools in step
/// (each change recomputes them from what the watch holds). Runs until the stream ends.
pub async fn watch(client: kube::Client, app: Arc<App>) {
    let api: kube::Api<AsyncActor> = kube::Api::all(client);
    let (store, writer) = reflector::store();
    let config = watcher::Config::default().labels(&format!("{ROLE_LABEL}={ENTRY}"));
    let stream = reflector::reflector(writer, watcher(api, config)).default_backoff();
    futures::pin_mut!(stream);
    let mut last: Option<Tools> = None;
    while let Some(ev) = stream.next().await {
        match ev {
            Err(e) => {
                tracing::warn!(error = %e, "watching the flows' entry actors (retrying)");
                continue;
            }
            // The store shows a (re)list only once it is whole (InitDone).
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
            Ok(_) => {}
        }
        let (tools, warnings) = tools_of(&store.state());
        for w in warnings {
            tracing::warn!("{w}");
        }
        if last.as_ref() != Some(&tools) {
            tracing::info!(flows = tools.tools.len(), "flow tools updated");
            app.set_flow_tools(tools.clone());
            last = Some(tools);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn entry(ns: &str, name: &str, flow: &str, notes: Value) -> Arc<AsyncActor> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
                "metadata": {"name": name, "namespace": ns, "annotations": notes,
                             "labels": {FLOW_LABEL: flow, ROLE_LABEL: ENTRY}},
                "spec": {"transport": "sqs", "image": "x", "handler": "orders.validate"}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn each_entry_is_a_tool_of_its_namespace_routed_to_the_entry() {
        let mut step = (*entry("shop", "charge", "review_order", json!({}))).clone();
        step.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(ROLE_LABEL.into(), "step".into());
        let actors = vec![
            entry(
                "shop",
                "validate",
                "review_order",
                json!({DESCRIPTION_ANNOTATION: "Reviews an order."}),
            ),
            Arc::new(step),
            entry("bank", "validate", "review_order", json!({})),
        ];
        let (tools, warnings) = tools_of(&actors);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(
            tools.tools.keys().collect::<Vec<_>>(),
            ["bank.review_order", "shop.review_order"]
        );
        let t = tools.get("shop.review_order").unwrap();
        assert_eq!(t.route, ["validate"]);
        assert_eq!(t.namespace.as_deref(), Some("shop"));
        assert_eq!(t.transport.as_deref(), Some("sqs"));
        assert_eq!(t.description.as_deref(), Some("Reviews an order."));
        assert_eq!(
            tools
                .get("bank.review_order")
                .unwrap()
                .description
                .as_deref(),
            Some("Flow review_order (entry actor validate)")
        );
        // No parameters declared: any object is the flow's first state.
        assert!(t.open);
        let schema = Value::Object(t.input_schema());
        assert_eq!(schema, json!({"type": "object"}));
        let args = json!({"items": [{"price": 5}], "country": "US"});
        assert_eq!(Value::Object(t.check_arguments(Some(&args)).unwrap()), args);
    }

    #[test]
    fn declared_parameters_are_the_schema_and_a_bad_declaration_is_named() {
        let declared = json!({PARAMETERS_ANNOTATION:
            r#"{"items": {"type": "array", "required": true}, "country": {"type": "string", "default": "US"}}"#});
        let bad = json!({PARAMETERS_ANNOTATION: r#"{"items": {"type": "list"}}"#});
        let broken = json!({PARAMETERS_ANNOTATION: "items: array"});
        let (tools, warnings) = tools_of(&[
            entry("shop", "validate", "review_order", declared),
            entry("shop", "a", "bad_types", bad),
            entry("shop", "b", "broken", broken),
        ]);
        let t = tools.get("shop.review_order").unwrap();
        assert!(!t.open);
        let schema = Value::Object(t.input_schema());
        assert_eq!(schema["required"], json!(["items"]));
        assert_eq!(schema["additionalProperties"], json!(false));
        let e = t.check_arguments(Some(&json!({}))).unwrap_err();
        assert_eq!(e[0].field, "items");
        assert_eq!(tools.tools.len(), 1, "{warnings:?}");
        assert!(
            warnings.iter().any(
                |w| w.starts_with("AsyncActor shop/a: not offered as a tool:")
                    && w.contains("parameters.items.type: \"list\"")
            ),
            "{warnings:?}"
        );
        assert!(
            warnings.iter().any(|w| w.starts_with(
                "AsyncActor shop/b: annotation asya.sh/flow-parameters: not a parameters object"
            )),
            "{warnings:?}"
        );
    }
}
