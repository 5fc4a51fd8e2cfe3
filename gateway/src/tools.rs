//! Tools: an actor pipeline offered as an MCP tool and at `POST /tools/call`. Read from YAML
//! (`routes.tools`, the shape of seed 001's gateway-values.yaml), validated as a whole so every
//! mistake is reported at once, each naming the tool, the field, the value and the rule.

use std::collections::BTreeMap;
use std::path::Path;

use asya_api::validate::is_dns_label;
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// Parameter types a tool may declare (JSON Schema's primitive types).
pub const TYPES: &[&str] = &["string", "integer", "number", "boolean", "object", "array"];

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Parameter {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub required: bool,
    #[serde(default)]
    pub default: Option<Value>,
    /// Allowed values, when the parameter is a choice.
    #[serde(default, rename = "enum")]
    pub choices: Option<Vec<Value>>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: BTreeMap<String, Parameter>,
    /// The actors the envelope visits, in order.
    pub route: Vec<String>,
    /// Namespace of the actors (default: the gateway's `--namespace`).
    #[serde(default)]
    pub namespace: Option<String>,
    /// Transport of the first actor (default: the cluster configuration's default).
    #[serde(default)]
    pub transport: Option<String>,
    /// Seconds a call waits for the final status before answering with the envelope id to
    /// poll instead (default 300).
    #[serde(default)]
    pub timeout: Option<u64>,
    /// Any object is accepted as the arguments: a flow that declares no parameters
    /// (`crate::flows`); never set from a tools file.
    #[serde(skip)]
    pub open: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct Routes {
    #[serde(default)]
    tools: Vec<Tool>,
}

/// The file: `routes.tools` (Helm values shape) or a top-level `tools` list.
#[derive(Debug, Clone, Default, Deserialize)]
struct ToolsFile {
    #[serde(default)]
    routes: Option<Routes>,
    #[serde(default)]
    tools: Option<Vec<Tool>>,
}

/// One rejected tool field: which tool, which field, the value found and the rule it breaks.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("tool {tool:?}: {field}: {value}: {rule}")]
pub struct ToolError {
    pub tool: String,
    pub field: String,
    pub value: String,
    pub rule: String,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not a tools file: {message}")]
    Parse { path: String, message: String },
    #[error("{path}: {} invalid tool field(s):\n  {}", .errors.len(), .errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n  "))]
    Invalid {
        path: String,
        errors: Vec<ToolError>,
    },
}

/// Validated tools, by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tools {
    pub tools: BTreeMap<String, Tool>,
}

fn is_tool_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

fn show(v: &Value) -> String {
    v.to_string()
}

/// Whether `v` has JSON Schema type `kind`.
pub fn has_type(v: &Value, kind: &str) -> bool {
    match kind {
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        _ => false,
    }
}

impl Tools {
    pub fn load(path: &Path) -> Result<Tools, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Tools::from_yaml(&text).map_err(|e| match e {
            LoadError::Parse { message, .. } => LoadError::Parse {
                path: path.display().to_string(),
                message,
            },
            LoadError::Invalid { errors, .. } => LoadError::Invalid {
                path: path.display().to_string(),
                errors,
            },
            other => other,
        })
    }

    pub fn from_yaml(text: &str) -> Result<Tools, LoadError> {
        let parse = |message: String| LoadError::Parse {
            path: "<tools>".into(),
            message,
        };
        let file: ToolsFile = if text.trim().is_empty() {
            ToolsFile::default()
        } else {
            serde_yaml::from_str(text).map_err(|e| parse(e.to_string()))?
        };
        let list = match (file.routes.map(|r| r.tools), file.tools) {
            (Some(_), Some(_)) => {
                return Err(parse(
                    "both routes.tools and tools are set; use one".to_string(),
                ));
            }
            (Some(t), None) | (None, Some(t)) => t,
            (None, None) => Vec::new(),
        };
        Tools::from_list(list).map_err(|errors| LoadError::Invalid {
            path: "<tools>".into(),
            errors,
        })
    }

    /// Validates every tool; all errors at once.
    pub fn from_list(list: Vec<Tool>) -> Result<Tools, Vec<ToolError>> {
        let mut errors = Vec::new();
        let mut tools = BTreeMap::new();
        for (i, t) in list.into_iter().enumerate() {
            let label = if t.name.is_empty() {
                format!("#{i}")
            } else {
                t.name.clone()
            };
            let mut err = |field: String, value: String, rule: &str| {
                errors.push(ToolError {
                    tool: label.clone(),
                    field,
                    value,
                    rule: rule.to_string(),
                })
            };
            if !is_tool_name(&t.name) {
                err(
                    "name".into(),
                    format!("{:?}", t.name),
                    "must be 1-64 characters of letters, digits, '-', '_' or '.'",
                );
            }
            if t.route.is_empty() {
                err("route".into(), "[]".into(), "must name at least one actor");
            }
            for (j, a) in t.route.iter().enumerate() {
                if !is_dns_label(a) {
                    err(
                        format!("route[{j}]"),
                        format!("{a:?}"),
                        "must be an actor name (a DNS label: lowercase letters, digits, '-')",
                    );
                } else if asya_api::naming::is_end_actor(a) {
                    err(
                        format!("route[{j}]"),
                        format!("{a:?}"),
                        "end queues are reached by finishing the route, not by naming them",
                    );
                }
            }
            if let Some(ns) = &t.namespace
                && !is_dns_label(ns)
            {
                err("namespace".into(), format!("{ns:?}"), "must be a DNS label");
            }
            if let Some(tr) = &t.transport
                && tr != "rabbitmq"
                && tr != "sqs"
            {
                err(
                    "transport".into(),
                    format!("{tr:?}"),
                    "must be rabbitmq or sqs",
                );
            }
            if t.timeout == Some(0) {
                err("timeout".into(), "0".into(), "must be at least 1 second");
            }
            for (name, p) in &t.parameters {
                let at = |f: &str| format!("parameters.{name}.{f}");
                if !TYPES.contains(&p.kind.as_str()) {
                    err(
                        at("type"),
                        format!("{:?}", p.kind),
                        "must be one of string, integer, number, boolean, object, array",
                    );
                    continue;
                }
                if let Some(d) = &p.default
                    && !has_type(d, &p.kind)
                {
                    err(
                        at("default"),
                        show(d),
                        &format!("must be of the parameter's type {}", p.kind),
                    );
                }
                if let Some(choices) = &p.choices {
                    if choices.is_empty() {
                        err(at("enum"), "[]".into(), "must list at least one value");
                    }
                    for (k, c) in choices.iter().enumerate() {
                        if !has_type(c, &p.kind) {
                            err(
                                format!("parameters.{name}.enum[{k}]"),
                                show(c),
                                &format!("must be of the parameter's type {}", p.kind),
                            );
                        }
                    }
                }
            }
            if tools.contains_key(&t.name) {
                err(
                    "name".into(),
                    format!("{:?}", t.name),
                    "must be unique (another tool has this name)",
                );
            } else {
                tools.insert(t.name.clone(), t);
            }
        }
        if errors.is_empty() {
            Ok(Tools { tools })
        } else {
            Err(errors)
        }
    }

    pub fn get(&self, name: &str) -> Option<&Tool> {
        self.tools.get(name)
    }
}

/// A rejected argument of a call: the field, the value and the rule.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("arguments.{field}: {value}: {rule}")]
pub struct ArgError {
    pub field: String,
    pub value: String,
    pub rule: String,
}

impl Tool {
    /// The JSON Schema of the tool's arguments (`tools/list`'s `inputSchema`).
    pub fn input_schema(&self) -> Map<String, Value> {
        if self.open {
            let mut schema = Map::new();
            schema.insert("type".into(), json!("object"));
            return schema;
        }
        let mut props = Map::new();
        let mut required = Vec::new();
        for (name, p) in &self.parameters {
            let mut s = Map::new();
            s.insert("type".into(), json!(p.kind));
            if let Some(d) = &p.description {
                s.insert("description".into(), json!(d));
            }
            if let Some(d) = &p.default {
                s.insert("default".into(), d.clone());
            }
            if let Some(c) = &p.choices {
                s.insert("enum".into(), Value::Array(c.clone()));
            }
            props.insert(name.clone(), Value::Object(s));
            if p.required {
                required.push(json!(name));
            }
        }
        let mut schema = Map::new();
        schema.insert("type".into(), json!("object"));
        schema.insert("properties".into(), Value::Object(props));
        schema.insert("required".into(), Value::Array(required));
        schema.insert("additionalProperties".into(), json!(false));
        schema
    }

    /// Checks the arguments against the schema and fills in defaults: the payload of the
    /// envelope. Every problem is reported, each naming field, value and rule.
    pub fn check_arguments(
        &self,
        args: Option<&Value>,
    ) -> Result<Map<String, Value>, Vec<ArgError>> {
        let empty = Map::new();
        let mut errors = Vec::new();
        let given = match args {
            None | Some(Value::Null) => &empty,
            Some(Value::Object(m)) => m,
            Some(other) => {
                return Err(vec![ArgError {
                    field: "(all)".into(),
                    value: other.to_string(),
                    rule: "arguments must be an object".into(),
                }]);
            }
        };
        if self.open {
            return Ok(given.clone());
        }
        let mut out = Map::new();
        for (name, v) in given {
            let Some(p) = self.parameters.get(name) else {
                errors.push(ArgError {
                    field: name.clone(),
                    value: clip(&v.to_string()),
                    rule: format!(
                        "unknown parameter (tool {:?} takes: {})",
                        self.name,
                        self.parameters
                            .keys()
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                });
                continue;
            };
            if !has_type(v, &p.kind) {
                errors.push(ArgError {
                    field: name.clone(),
                    value: clip(&v.to_string()),
                    rule: format!("must be of type {}", p.kind),
                });
                continue;
            }
            if let Some(c) = &p.choices
                && !c.contains(v)
            {
                errors.push(ArgError {
                    field: name.clone(),
                    value: clip(&v.to_string()),
                    rule: format!(
                        "must be one of {}",
                        c.iter()
                            .map(Value::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                });
                continue;
            }
            out.insert(name.clone(), v.clone());
        }
        for (name, p) in &self.parameters {
            if out.contains_key(name) || given.contains_key(name) {
                continue;
            }
            if let Some(d) = &p.default {
                out.insert(name.clone(), d.clone());
            } else if p.required {
                errors.push(ArgError {
                    field: name.clone(),
                    value: "(missing)".into(),
                    rule: format!("is required (type {})", p.kind),
                });
            }
        }
        if errors.is_empty() {
            Ok(out)
        } else {
            Err(errors)
        }
    }
}

/// Values in error messages stay short (a huge argument must not flood a log or a reply).
fn clip(s: &str) -> String {
    const MAX: usize = 120;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut cut = MAX;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &s[..cut])
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &str = r#"
routes:
  tools:
  - name: text-processor
    description: Process text with ML model
    parameters:
      text:
        type: string
        required: true
      model:
        type: string
        default: "default"
    route: [text-preprocess, text-infer, text-postprocess]
"#;

    #[test]
    fn seed_shape_loads_with_schema() {
        let t = Tools::from_yaml(SEED).unwrap();
        let tool = t.get("text-processor").unwrap();
        assert_eq!(tool.route.len(), 3);
        let s = Value::Object(tool.input_schema());
        assert_eq!(s["properties"]["text"]["type"], "string");
        assert_eq!(s["properties"]["model"]["default"], "default");
        assert_eq!(s["required"], json!(["text"]));
    }

    #[test]
    fn arguments_checked_and_defaulted() {
        let t = Tools::from_yaml(SEED).unwrap();
        let tool = t.get("text-processor").unwrap();
        let ok = tool.check_arguments(Some(&json!({"text": "hi"}))).unwrap();
        assert_eq!(Value::Object(ok), json!({"text": "hi", "model": "default"}));
        let e = tool.check_arguments(Some(&json!({}))).unwrap_err();
        assert_eq!(e[0].field, "text");
        assert!(e[0].rule.contains("required"), "{}", e[0]);
        let e = tool.check_arguments(Some(&json!({"text": 5}))).unwrap_err();
        assert_eq!(
            e[0].to_string(),
            "arguments.text: 5: must be of type string"
        );
        let e = tool
            .check_arguments(Some(&json!({"text": "x", "temp": 1})))
            .unwrap_err();
        assert_eq!(e[0].field, "temp");
        assert!(e[0].rule.contains("unknown parameter"), "{}", e[0]);
        assert!(tool.check_arguments(Some(&json!([1]))).is_err());
    }

    #[test]
    fn every_rejection_names_tool_field_value_rule() {
        let bad = r#"
tools:
- name: empty
  route: []
- name: typo
  parameters:
    n: {type: int}
    d: {type: integer, default: "x"}
  route: [a, Bad_Actor, x-sink]
- name: typo
  route: [a]
"#;
        let LoadError::Invalid { errors, .. } = Tools::from_yaml(bad).unwrap_err() else {
            panic!("not invalid")
        };
        let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        let has = |needle: &str| text.iter().any(|t| t.contains(needle));
        assert!(
            has(r#"tool "empty": route: []: must name at least one actor"#),
            "{text:#?}"
        );
        assert!(has(
            r#"tool "typo": parameters.n.type: "int": must be one of"#
        ));
        assert!(has(
            r#"parameters.d.default: "x": must be of the parameter's type integer"#
        ));
        assert!(has(r#"route[1]: "Bad_Actor""#));
        assert!(has(r#"route[2]: "x-sink""#));
        assert!(has("must be unique"));
    }

    #[test]
    fn unknown_fields_and_bad_yaml_are_errors() {
        let e = Tools::from_yaml("tools:\n- name: a\n  rout: [x]\n").unwrap_err();
        assert!(e.to_string().contains("rout"), "{e}");
        assert!(Tools::from_yaml("tools: {").is_err());
        assert!(Tools::from_yaml("").unwrap().tools.is_empty());
    }
}
