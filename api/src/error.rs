//! Field errors in the API server's own words (`spec.scaling.maxReplicaCount: Invalid value:
//! 0: must be >= 1`), so a rejection from the webhook reads like one from Kubernetes.

use std::fmt;

use serde_json::Value;

/// What is wrong with a field. The wording of `Display` follows apimachinery's field errors.
#[derive(Clone, Debug, PartialEq)]
pub enum ErrorKind {
    /// `Invalid value: <value>: <rule>`
    Invalid { value: Value, rule: String },
    /// `Required value: <rule>`
    Required { rule: String },
    /// `Unsupported value: <value>: supported values: "a", "b"`
    Unsupported {
        value: Value,
        supported: Vec<String>,
    },
    /// `Duplicate value: <value>`
    Duplicate { value: Value },
    /// `Forbidden: <rule>`
    Forbidden { rule: String },
    /// `Too many: <count>: must have at most <max> items`
    TooMany { count: usize, max: usize },
    /// `Too long: <rule>` (apimachinery's `TooLong` names a length in bytes the same way)
    TooLong { rule: String },
    /// A flavor merge conflict, reported in seed 002's exact words.
    FlavorConflict {
        first: String,
        second: String,
        key: String,
    },
}

/// One rejection reason: the field path, and what is wrong with its value.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldError {
    pub path: String,
    pub kind: ErrorKind,
    /// Set when the offending value came from a flavor rather than the actor's inline spec.
    pub origin: Option<String>,
}

impl FieldError {
    /// The reason without its leading field path: a `StatusCause` message, which the API
    /// server's clients print after the cause's own `field` (`* spec.x: Invalid value: …`).
    pub fn detail(&self) -> String {
        let s = self.to_string();
        match s
            .strip_prefix(self.path.as_str())
            .and_then(|r| r.strip_prefix(": "))
        {
            Some(rest) => rest.to_string(),
            None => s,
        }
    }

    pub fn invalid(
        path: impl Into<String>,
        value: impl Into<Value>,
        rule: impl Into<String>,
    ) -> Self {
        Self::new(
            path,
            ErrorKind::Invalid {
                value: value.into(),
                rule: rule.into(),
            },
        )
    }
    pub fn required(path: impl Into<String>, rule: impl Into<String>) -> Self {
        Self::new(path, ErrorKind::Required { rule: rule.into() })
    }
    pub fn unsupported(
        path: impl Into<String>,
        value: impl Into<Value>,
        supported: &[&str],
    ) -> Self {
        Self::new(
            path,
            ErrorKind::Unsupported {
                value: value.into(),
                supported: supported.iter().map(|s| s.to_string()).collect(),
            },
        )
    }
    pub fn duplicate(path: impl Into<String>, value: impl Into<Value>) -> Self {
        Self::new(
            path,
            ErrorKind::Duplicate {
                value: value.into(),
            },
        )
    }
    pub fn forbidden(path: impl Into<String>, rule: impl Into<String>) -> Self {
        Self::new(path, ErrorKind::Forbidden { rule: rule.into() })
    }
    pub fn too_many(path: impl Into<String>, count: usize, max: usize) -> Self {
        Self::new(path, ErrorKind::TooMany { count, max })
    }
    pub fn too_long(path: impl Into<String>, rule: impl Into<String>) -> Self {
        Self::new(path, ErrorKind::TooLong { rule: rule.into() })
    }
    pub fn flavor_conflict(first: &str, second: &str, key: &str) -> Self {
        Self::new(
            "spec.flavors",
            ErrorKind::FlavorConflict {
                first: first.to_string(),
                second: second.to_string(),
                key: key.to_string(),
            },
        )
    }
    fn new(path: impl Into<String>, kind: ErrorKind) -> Self {
        Self {
            path: path.into(),
            kind,
            origin: None,
        }
    }
    /// Records that the value came from flavor `flavor`.
    pub fn from_flavor(mut self, flavor: Option<&str>) -> Self {
        self.origin = flavor.map(str::to_string);
        self
    }
}

/// Values print as the API server prints them: strings quoted, numbers bare.
fn show(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ErrorKind::FlavorConflict { first, second, key } => {
                return write!(
                    f,
                    "flavor merge conflict: flavors {first:?} and {second:?} conflict on {key}"
                );
            }
            ErrorKind::Invalid { value, rule } => {
                write!(f, "{}: Invalid value: {}: {rule}", self.path, show(value))?
            }
            ErrorKind::Required { rule } => write!(f, "{}: Required value: {rule}", self.path)?,
            ErrorKind::Unsupported { value, supported } => {
                let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
                write!(
                    f,
                    "{}: Unsupported value: {}: supported values: {}",
                    self.path,
                    show(value),
                    list.join(", ")
                )?
            }
            ErrorKind::Duplicate { value } => {
                write!(f, "{}: Duplicate value: {}", self.path, show(value))?
            }
            ErrorKind::Forbidden { rule } => write!(f, "{}: Forbidden: {rule}", self.path)?,
            ErrorKind::TooMany { count, max } => write!(
                f,
                "{}: Too many: {count}: must have at most {max} items",
                self.path
            )?,
            ErrorKind::TooLong { rule } => write!(f, "{}: Too long: {rule}", self.path)?,
        }
        if let Some(flavor) = &self.origin {
            write!(f, " (set by flavor {flavor:?})")?;
        }
        Ok(())
    }
}

/// Every rejection reason for one object, collected rather than stopping at the first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldErrors(pub Vec<FieldError>);

impl FieldErrors {
    pub fn push(&mut self, e: FieldError) {
        self.0.push(e);
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn iter(&self) -> impl Iterator<Item = &FieldError> {
        self.0.iter()
    }
    pub fn extend(&mut self, other: impl IntoIterator<Item = FieldError>) {
        self.0.extend(other);
    }
    pub fn into_result(self) -> Result<(), FieldErrors> {
        if self.0.is_empty() { Ok(()) } else { Err(self) }
    }
}

impl IntoIterator for FieldErrors {
    type Item = FieldError;
    type IntoIter = std::vec::IntoIter<FieldError>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl fmt::Display for FieldErrors {
    /// All reasons on one line, `; `-separated — the form an AdmissionReview message takes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join("; "))
    }
}

impl std::error::Error for FieldErrors {}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn detail_is_the_message_without_its_path() {
        let e = FieldError::invalid("spec.handler", json!("m:f"), "must be module.function");
        assert_eq!(
            e.detail(),
            "Invalid value: \"m:f\": must be module.function"
        );
        assert_eq!(e.to_string(), format!("spec.handler: {}", e.detail()));
        let c = FieldError::new(
            "spec.flavors",
            ErrorKind::FlavorConflict {
                first: "a".into(),
                second: "b".into(),
                key: "scaling.minReplicaCount".into(),
            },
        );
        assert_eq!(c.detail(), c.to_string());
    }

    #[test]
    fn reads_like_the_api_server() {
        let e = FieldError::invalid(
            "spec.scaling.minReplicaCount",
            json!(20),
            "must be <= maxReplicaCount (5)",
        );
        assert_eq!(
            e.to_string(),
            "spec.scaling.minReplicaCount: Invalid value: 20: must be <= maxReplicaCount (5)"
        );
        let e = FieldError::unsupported("spec.imagePullPolicy", "Sometimes", &["Always", "Never"]);
        assert_eq!(
            e.to_string(),
            r#"spec.imagePullPolicy: Unsupported value: "Sometimes": supported values: "Always", "Never""#
        );
        let e = FieldError::flavor_conflict("flavor-a", "flavor-b", "scaling.minReplicaCount");
        assert_eq!(
            e.to_string(),
            r#"flavor merge conflict: flavors "flavor-a" and "flavor-b" conflict on scaling.minReplicaCount"#
        );
        let e =
            FieldError::invalid("spec.replicas", json!(0), "must be >= 1").from_flavor(Some("f"));
        assert_eq!(
            e.to_string(),
            r#"spec.replicas: Invalid value: 0: must be >= 1 (set by flavor "f")"#
        );
    }
}
