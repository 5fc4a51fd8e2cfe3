//! Observability settings of the cluster configuration (`tracing`, `monitoring`; chart values
//! of the same names, docs/observability.md) and the pure rules that turn them into what the
//! webhook puts in an injected pod: the standard `OTEL_*` variables for the sidecar and the
//! `prometheus.io/*` annotations for plain Prometheus.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{FieldError, FieldErrors};

/// The standard OpenTelemetry SDK variables the sidecar reads (OpenTelemetry's
/// "Environment Variable Specification"), so any collector setup that works for other
/// workloads works here.
pub mod otel_env {
    pub const SDK_DISABLED: &str = "OTEL_SDK_DISABLED";
    pub const SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
    pub const RESOURCE_ATTRIBUTES: &str = "OTEL_RESOURCE_ATTRIBUTES";
    pub const TRACES_EXPORTER: &str = "OTEL_TRACES_EXPORTER";
    pub const EXPORTER_OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
    pub const EXPORTER_OTLP_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
    pub const TRACES_SAMPLER: &str = "OTEL_TRACES_SAMPLER";
    pub const TRACES_SAMPLER_ARG: &str = "OTEL_TRACES_SAMPLER_ARG";
    pub const PROPAGATORS: &str = "OTEL_PROPAGATORS";
}

/// `tracing`: where injected sidecars send spans. Off by default; the webhook then adds no
/// variable at all, and trace context still travels in the envelope's headers.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TracingConfig {
    #[serde(default)]
    pub enabled: bool,
    /// An OTLP-over-HTTP collector's base URL (`http://collector:4318`); the SDK appends
    /// `/v1/traces`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub otlp_endpoint: String,
    /// The share of new traces recorded (0..=1); a sampled parent is always followed.
    #[serde(default = "one")]
    pub sampling_ratio: f64,
    /// Extra resource attributes of every span (`deployment.environment: prod`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resource_attributes: BTreeMap<String, String>,
    /// The trace backend's query API (Jaeger's, `http://jaeger-query:16686`), where
    /// `asya trace` reads an envelope's spans. No component sends anything there.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub query_url: String,
}

fn one() -> f64 {
    1.0
}

impl Default for TracingConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            otlp_endpoint: String::new(),
            sampling_ratio: 1.0,
            resource_attributes: BTreeMap::new(),
            query_url: String::new(),
        }
    }
}

impl TracingConfig {
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    pub fn validate(&self, errs: &mut FieldErrors) {
        if !(0.0..=1.0).contains(&self.sampling_ratio) {
            errs.push(FieldError::invalid(
                "tracing.samplingRatio",
                self.sampling_ratio,
                "must be between 0 and 1",
            ));
        }
        if self.enabled
            && !(self.otlp_endpoint.starts_with("http://")
                || self.otlp_endpoint.starts_with("https://"))
        {
            errs.push(FieldError::invalid(
                "tracing.otlpEndpoint",
                self.otlp_endpoint.clone(),
                "must be an http:// or https:// URL of an OTLP-over-HTTP collector when tracing.enabled is true",
            ));
        }
        if !(self.query_url.is_empty()
            || self.query_url.starts_with("http://")
            || self.query_url.starts_with("https://"))
        {
            errs.push(FieldError::invalid(
                "tracing.queryUrl",
                self.query_url.clone(),
                "must be empty or an http:// or https:// URL of the trace backend's query API",
            ));
        }
        for key in self.resource_attributes.keys() {
            // The list format is `k=v,k=v`: a key cannot carry either separator.
            if key.is_empty() || key.contains([',', '=', ' ']) {
                errs.push(FieldError::invalid(
                    format!("tracing.resourceAttributes.{key}"),
                    key.clone(),
                    "an attribute key must be non-empty and have no ',', '=' or space",
                ));
            }
        }
    }

    /// The `OTEL_*` variables of one actor's sidecar, in a fixed order. `namespace_ref` is a
    /// Kubernetes `$(VAR)` reference to an earlier variable holding the pod's namespace, so
    /// the pod spec needs no namespace at admission time. Empty when tracing is off.
    pub fn sidecar_env(&self, actor: &str, namespace_ref: &str) -> Vec<(String, String)> {
        if !self.enabled {
            return Vec::new();
        }
        let mut attrs = vec![format!("k8s.namespace.name={namespace_ref}")];
        // Values percent-encoded, as the specification's W3C-baggage-like format asks.
        attrs.extend(
            self.resource_attributes
                .iter()
                .map(|(k, v)| format!("{k}={}", crate::percent::encode(v))),
        );
        let ratio = self.sampling_ratio;
        [
            (otel_env::SDK_DISABLED, "false".to_string()),
            (otel_env::SERVICE_NAME, actor.to_string()),
            (otel_env::RESOURCE_ATTRIBUTES, attrs.join(",")),
            (otel_env::TRACES_EXPORTER, "otlp".to_string()),
            (otel_env::EXPORTER_OTLP_ENDPOINT, self.otlp_endpoint.clone()),
            (
                otel_env::EXPORTER_OTLP_PROTOCOL,
                "http/protobuf".to_string(),
            ),
            (
                otel_env::TRACES_SAMPLER,
                "parentbased_traceidratio".to_string(),
            ),
            (otel_env::TRACES_SAMPLER_ARG, format!("{ratio}")),
            (otel_env::PROPAGATORS, "tracecontext".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// `monitoring`: the part of the chart's monitoring values the webhook acts on.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MonitoringConfig {
    /// Annotate injected pods with `prometheus.io/{scrape,port,path}` for a Prometheus that
    /// discovers pods by annotation instead of by the chart's PodMonitor.
    #[serde(default)]
    pub annotations: bool,
}

impl MonitoringConfig {
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The annotations of an injected pod whose sidecar serves metrics on `port`.
    pub fn pod_annotations(&self, port: u16) -> Vec<(&'static str, String)> {
        if !self.annotations {
            return Vec::new();
        }
        vec![
            ("prometheus.io/scrape", "true".into()),
            ("prometheus.io/port", port.to_string()),
            ("prometheus.io/path", "/metrics".into()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on() -> TracingConfig {
        TracingConfig {
            enabled: true,
            otlp_endpoint: "http://jaeger.default.svc:4318".into(),
            sampling_ratio: 0.25,
            resource_attributes: BTreeMap::from([
                ("deployment.environment".into(), "prod, eu".into()),
                ("team".into(), "ml".into()),
            ]),
            query_url: String::new(),
        }
    }

    #[test]
    fn tracing_off_adds_no_variable() {
        assert!(
            TracingConfig::default()
                .sidecar_env("a", "$(NS)")
                .is_empty()
        );
    }

    #[test]
    fn tracing_on_sets_the_standard_variables() {
        let env: BTreeMap<_, _> = on()
            .sidecar_env("resize", "$(ASYA_NAMESPACE)")
            .into_iter()
            .collect();
        assert_eq!(env["OTEL_SERVICE_NAME"], "resize");
        assert_eq!(
            env["OTEL_EXPORTER_OTLP_ENDPOINT"],
            "http://jaeger.default.svc:4318"
        );
        assert_eq!(env["OTEL_EXPORTER_OTLP_PROTOCOL"], "http/protobuf");
        assert_eq!(env["OTEL_TRACES_SAMPLER"], "parentbased_traceidratio");
        assert_eq!(env["OTEL_TRACES_SAMPLER_ARG"], "0.25");
        assert_eq!(env["OTEL_SDK_DISABLED"], "false");
        // The namespace reference stays unencoded for Kubernetes to expand; values are
        // percent-encoded so a ',' cannot split the list.
        assert_eq!(
            env["OTEL_RESOURCE_ATTRIBUTES"],
            "k8s.namespace.name=$(ASYA_NAMESPACE),deployment.environment=prod%2C%20eu,team=ml"
        );
    }

    #[test]
    fn invalid_tracing_settings_name_field_value_and_rule() {
        let mut t = on();
        t.sampling_ratio = 1.5;
        t.otlp_endpoint = "jaeger:4318".into();
        t.resource_attributes.insert("a=b".into(), "x".into());
        let mut errs = FieldErrors::default();
        t.validate(&mut errs);
        let text: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        assert_eq!(text.len(), 3, "{text:?}");
        assert!(
            text[0].contains("tracing.samplingRatio") && text[0].contains("1.5"),
            "{text:?}"
        );
        assert!(
            text[1].contains("tracing.otlpEndpoint") && text[1].contains("jaeger:4318"),
            "{text:?}"
        );
        assert!(
            text[2].contains("tracing.resourceAttributes.a=b"),
            "{text:?}"
        );
    }

    #[test]
    fn a_query_url_is_an_http_url() {
        let mut t = on();
        t.query_url = "jaeger-query:16686".into();
        let mut errs = FieldErrors::default();
        t.validate(&mut errs);
        let text: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        assert_eq!(text.len(), 1, "{text:?}");
        assert!(
            text[0].contains("tracing.queryUrl") && text[0].contains("jaeger-query:16686"),
            "{text:?}"
        );
        t.query_url = "http://jaeger-query:16686".into();
        let mut errs = FieldErrors::default();
        t.validate(&mut errs);
        assert!(errs.is_empty());
    }

    #[test]
    fn disabled_tracing_needs_no_endpoint() {
        let mut errs = FieldErrors::default();
        TracingConfig::default().validate(&mut errs);
        assert!(errs.is_empty());
    }

    #[test]
    fn prometheus_annotations_only_when_asked() {
        assert!(MonitoringConfig::default().pod_annotations(8080).is_empty());
        let a = MonitoringConfig { annotations: true }.pod_annotations(8080);
        assert_eq!(
            a,
            vec![
                ("prometheus.io/scrape", "true".to_string()),
                ("prometheus.io/port", "8080".to_string()),
                ("prometheus.io/path", "/metrics".to_string()),
            ]
        );
    }
}
