//! Settings from the environment: what the webhook injected, parsed by the contract both
//! share (`asya_api::sidecar_settings`), and the sidecar's own tunables. Every bad or
//! missing setting stops the sidecar at start with a message naming the variable.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::gateway_client::GatewayConfig;
use crate::routing::HandlerMode;
use asya_api::sidecar_settings::{
    DEFAULT_NAMESPACE, SettingsError, SidecarSettings, Sourced, TransportSettings, env,
};
use asya_transport::resiliency::{Plan, parse_duration};

#[derive(Debug, Clone, PartialEq)]
pub enum TransportConfig {
    RabbitMq {
        url: String,
        exchange: String,
        prefetch: u16,
    },
    Sqs {
        region: String,
        endpoint: Option<String>,
        wait_seconds: i32,
        /// Visibility timeout for queues this sidecar creates (auto-create).
        visibility_timeout: Duration,
        max_message_bytes: usize,
        /// Long polls under way at once; envelopes in flight are 10 per poller.
        pollers: usize,
    },
}

#[derive(Debug, Clone)]
pub struct Config {
    pub actor: String,
    pub namespace: String,
    pub transport: TransportConfig,
    pub socket_path: PathBuf,
    pub runtime_timeout: Duration,
    /// How long a message waits for an unreachable runtime before it counts as a failure.
    pub runtime_wait: Duration,
    /// Runtime calls open at once, queued on the runtime's socket (1: one at a time).
    pub runtime_pipeline: usize,
    pub handler_mode: HandlerMode,
    pub resiliency: Plan,
    pub is_end_actor: bool,
    pub queue_auto_create: bool,
    pub metrics_addr: SocketAddr,
    pub max_redeliveries: u32,
    pub shutdown_timeout: Duration,
    /// How long the sidecar may go without ever reaching its broker, counted from when the
    /// runtime first answers, before it exits so that the kubelet restarts it and the actor's
    /// status says `SidecarError` (a wrong host, port or endpoint never heals by waiting).
    /// `None` (`0`): wait forever. A broker lost after the first connection is always waited for.
    pub transport_startup_timeout: Option<Duration>,
    pub log_json: bool,
    /// Where to report progress and final statuses (`ASYA_GATEWAY_URL`); off when unset.
    pub gateway: Option<GatewayConfig>,
    /// Trace context and span export from the standard `OTEL_*` variables (off: context is
    /// still carried from hop to hop).
    pub trace: asya_transport::trace_context::TraceSettings,
    /// The flow this actor is the entry of (`ASYA_FLOW_PROGRAM`, written by `asya flow
    /// compile`): an envelope that arrives without a flow starts it (docs/DESIGN.md §12).
    pub flow_entry: Option<std::sync::Arc<asya_flow::Program>>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{var}: {message}")]
pub struct ConfigError {
    pub var: &'static str,
    pub message: String,
}

fn err(var: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        var,
        message: message.into(),
    }
}

/// Reads settings from a variable lookup (the process env in production, a map in tests).
pub struct Vars<'a>(pub &'a dyn Fn(&str) -> Option<String>);

impl Vars<'_> {
    fn get(&self, var: &str) -> Option<String> {
        (self.0)(var)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }
    fn duration(&self, var: &'static str, default: Duration) -> Result<Duration, ConfigError> {
        match self.get(var) {
            None => Ok(default),
            Some(v) => parse_duration(&v).map_err(|e| err(var, e)),
        }
    }
    fn boolean(&self, var: &'static str, default: bool) -> Result<bool, ConfigError> {
        match self.get(var).map(|v| v.to_ascii_lowercase()) {
            None => Ok(default),
            Some(v) => match v.as_str() {
                "1" | "true" | "yes" | "on" => Ok(true),
                "0" | "false" | "no" | "off" => Ok(false),
                _ => Err(err(var, format!("{v:?} is not a boolean (true or false)"))),
            },
        }
    }
    fn number<T>(&self, var: &'static str, default: T, min: T, max: T) -> Result<T, ConfigError>
    where
        T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
    {
        match self.get(var) {
            None => Ok(default),
            Some(v) => {
                let n: T = v
                    .parse()
                    .map_err(|_| err(var, format!("{v:?} is not a number")))?;
                if n < min || n > max {
                    return Err(err(var, format!("{n} is outside {min}..={max}")));
                }
                Ok(n)
            }
        }
    }
}

impl Config {
    pub fn from_env() -> Result<Config, ConfigError> {
        let lookup = |k: &str| std::env::var(k).ok();
        Config::from_vars(&Vars(&lookup))
    }

    pub fn from_map(map: &HashMap<&str, &str>) -> Result<Config, ConfigError> {
        let lookup = |k: &str| map.get(k).map(|v| v.to_string());
        Config::from_vars(&Vars(&lookup))
    }

    pub fn from_vars(v: &Vars) -> Result<Config, ConfigError> {
        // What the webhook injected ([`SidecarSettings`]); the rest are the sidecar's tunables.
        let get = |k: &str| v.get(k);
        let settings = SidecarSettings::from_vars(&get)?;
        let resiliency = match &settings.resiliency_json {
            None => Plan::default(),
            Some(json) => Plan::from_json(json).map_err(|e| err(env::RESILIENCY, e.to_string()))?,
        };
        // An explicit ASYA_RUNTIME_TIMEOUT wins; else the resiliency's actorTimeout; else 5m.
        let runtime_timeout = match &settings.runtime_timeout {
            Some(_) => v.duration(env::RUNTIME_TIMEOUT, Duration::from_secs(300))?,
            None => resiliency.actor_timeout.unwrap_or(Duration::from_secs(300)),
        };
        if runtime_timeout.is_zero() {
            return Err(err(env::RUNTIME_TIMEOUT, "must be greater than zero"));
        }
        let transport = match settings.transport {
            TransportSettings::RabbitMq { url, exchange, .. } => TransportConfig::RabbitMq {
                url: asya_api::amqp::normalize_url(&url).into_owned(),
                exchange: exchange.unwrap_or_else(|| asya_api::naming::RABBITMQ_EXCHANGE.into()),
                prefetch: v.number(env::RABBITMQ_PREFETCH, 64u16, 1, 10_000)?,
            },
            TransportSettings::Sqs {
                region, endpoint, ..
            } => TransportConfig::Sqs {
                // Present: the settings require one.
                region: region.unwrap_or_default(),
                endpoint,
                wait_seconds: v.number(env::SQS_WAIT_SECONDS, 20i32, 0, 20)?,
                visibility_timeout: v.duration(
                    env::SQS_VISIBILITY_TIMEOUT,
                    runtime_timeout + Duration::from_secs(30),
                )?,
                // SQS's limit since 2025 (and moto's); older deployments may need 262144.
                max_message_bytes: v.number(
                    env::SQS_MAX_MESSAGE_BYTES,
                    1_048_576usize,
                    1024,
                    1_048_576,
                )?,
                pollers: v.number(
                    env::SQS_POLLERS,
                    2usize,
                    1,
                    asya_transport::sqs::MAX_POLLERS,
                )?,
            },
        };
        let handler_mode = match settings.handler_mode.as_deref() {
            None | Some("payload") => HandlerMode::Payload,
            Some("envelope") => HandlerMode::Envelope,
            Some(other) => {
                return Err(err(
                    env::HANDLER_MODE,
                    format!("{other:?} is not payload or envelope"),
                ));
            }
        };
        let metrics_addr = settings
            .metrics_addr
            .unwrap_or_else(|| "0.0.0.0:8080".into());
        let metrics_addr: SocketAddr = metrics_addr.parse().map_err(|_| {
            err(
                env::METRICS_ADDR,
                format!("{metrics_addr:?} is not host:port"),
            )
        })?;
        let log_json = match v.get(env::LOG_FORMAT).as_deref() {
            None | Some("json") => true,
            Some("text") => false,
            Some(other) => {
                return Err(err(
                    env::LOG_FORMAT,
                    format!("{other:?} is not json or text"),
                ));
            }
        };
        let gateway = match settings.gateway {
            None => None,
            Some(g) => Some(GatewayConfig {
                url: g.url,
                token: g.token.and_then(Sourced::into_value),
                timeout: v.duration(env::GATEWAY_TIMEOUT, Duration::from_secs(2))?,
                attempts: v.number(env::GATEWAY_ATTEMPTS, 4u32, 1, 10)?,
                queue: v.number(env::GATEWAY_QUEUE, 1024usize, 1, 1_000_000)?,
            }),
        };
        let actor = settings.actor;
        let namespace = settings
            .namespace
            .into_value()
            .unwrap_or_else(|| DEFAULT_NAMESPACE.into());
        Ok(Config {
            gateway,
            is_end_actor: v.boolean(env::IS_END_ACTOR, asya_api::naming::is_end_actor(&actor))?,
            actor,
            namespace,
            transport,
            socket_path: PathBuf::from(settings.socket_dir).join("asya-runtime.sock"),
            runtime_timeout,
            runtime_wait: v.duration(env::RUNTIME_WAIT, Duration::from_secs(30))?,
            runtime_pipeline: v.number(env::RUNTIME_PIPELINE, 4usize, 1, 64)?,
            handler_mode,
            resiliency,
            queue_auto_create: v.boolean(env::QUEUE_AUTO_CREATE, false)?,
            metrics_addr,
            max_redeliveries: v.number(env::MAX_REDELIVERIES, 5u32, 0, 1_000)?,
            shutdown_timeout: v.duration(env::SHUTDOWN_TIMEOUT, Duration::from_secs(25))?,
            transport_startup_timeout: Some(
                v.duration(env::TRANSPORT_STARTUP_TIMEOUT, Duration::from_secs(60))?,
            )
            .filter(|d| !d.is_zero()),
            log_json,
            trace: asya_transport::trace_context::TraceSettings::from_lookup(&|k| v.get(k)),
            flow_entry: flow_program(v)?,
        })
    }
}

/// The entry's flow program, checked as the evaluator needs it.
fn flow_program(v: &Vars) -> Result<Option<std::sync::Arc<asya_flow::Program>>, ConfigError> {
    let var = asya_flow::PROGRAM_ENV;
    let Some(text) = v.get(var) else {
        return Ok(None);
    };
    let p: asya_flow::Program = serde_json::from_str(&text).map_err(|e| {
        err(
            var,
            format!("not a flow program (asya flow compile writes it): {e}"),
        )
    })?;
    p.check().map_err(|e| err(var, e))?;
    Ok(Some(std::sync::Arc::new(p)))
}

impl From<SettingsError> for ConfigError {
    fn from(e: SettingsError) -> Self {
        ConfigError {
            var: e.var,
            message: e.message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> HashMap<&'static str, &'static str> {
        HashMap::from([
            ("ASYA_ACTOR_NAME", "doubler"),
            ("ASYA_TRANSPORT", "rabbitmq"),
            ("ASYA_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2f"),
        ])
    }

    #[test]
    fn defaults() {
        let c = Config::from_map(&base()).unwrap();
        assert_eq!(c.namespace, "default");
        assert_eq!(c.runtime_timeout, Duration::from_secs(300));
        assert_eq!(
            c.socket_path,
            PathBuf::from("/var/run/asya/asya-runtime.sock")
        );
        assert!(!c.queue_auto_create && !c.is_end_actor);
        assert_eq!(c.metrics_addr.port(), 8080);
        assert_eq!(c.handler_mode, HandlerMode::Payload);
        assert_eq!(c.transport_startup_timeout, Some(Duration::from_secs(60)));
    }

    #[test]
    fn the_entry_reads_its_flow_program() {
        let mut m = base();
        assert!(Config::from_map(&m).unwrap().flow_entry.is_none());
        let text = include_str!("../../flow/fixtures/order_review.program.json");
        m.insert("ASYA_FLOW_PROGRAM", text);
        let p = Config::from_map(&m).unwrap().flow_entry.unwrap();
        assert_eq!(p.flow, "review_order");
    }

    #[test]
    fn transport_startup_timeout_zero_waits_forever() {
        let mut m = base();
        m.insert("ASYA_TRANSPORT_STARTUP_TIMEOUT", "0");
        assert_eq!(
            Config::from_map(&m).unwrap().transport_startup_timeout,
            None
        );
        m.insert("ASYA_TRANSPORT_STARTUP_TIMEOUT", "3s");
        assert_eq!(
            Config::from_map(&m).unwrap().transport_startup_timeout,
            Some(Duration::from_secs(3))
        );
    }

    #[test]
    fn each_bad_setting_names_its_variable() {
        let cases: &[(&str, &str)] = &[
            ("ASYA_TRANSPORT", "kafka"),
            ("ASYA_RUNTIME_TIMEOUT", "soon"),
            ("ASYA_RESILIENCY", "{not json"),
            ("ASYA_IS_END_ACTOR", "maybe"),
            ("ASYA_QUEUE_AUTO_CREATE", "2"),
            ("ASYA_METRICS_ADDR", "8080"),
            ("ASYA_ACTOR_NAME", "Bad_Name"),
            ("ASYA_NAMESPACE", "-x"),
            ("ASYA_RABBITMQ_PREFETCH", "0"),
            ("ASYA_HANDLER_MODE", "both"),
            ("ASYA_GATEWAY_URL", "gateway:8080"),
            ("ASYA_FLOW_PROGRAM", "{\"code\": []}"),
            (
                "ASYA_FLOW_PROGRAM",
                r#"{"ir": 1, "flow": "f", "version": "v", "max_iterations": 1, "step_budget": 9,
                    "code": [{"jump": {"to": 7}}]}"#,
            ),
        ];
        for (var, value) in cases {
            let mut m = base();
            m.insert(var, value);
            let e = Config::from_map(&m).unwrap_err();
            assert_eq!(e.var, *var, "{e}");
        }
        // The gateway's settings count only with its URL.
        let mut m = base();
        m.insert("ASYA_GATEWAY_URL", "http://gateway:8080");
        m.insert("ASYA_GATEWAY_ATTEMPTS", "0");
        assert_eq!(
            Config::from_map(&m).unwrap_err().var,
            "ASYA_GATEWAY_ATTEMPTS"
        );
        let mut m = base();
        m.remove("ASYA_RABBITMQ_URL");
        assert_eq!(Config::from_map(&m).unwrap_err().var, "ASYA_RABBITMQ_URL");
        let mut m = base();
        m.remove("ASYA_ACTOR_NAME");
        assert_eq!(Config::from_map(&m).unwrap_err().var, "ASYA_ACTOR_NAME");
    }

    #[test]
    fn actor_timeout_from_resiliency_unless_explicit() {
        let mut m = base();
        m.insert("ASYA_RESILIENCY", r#"{"actorTimeout":"90s"}"#);
        assert_eq!(
            Config::from_map(&m).unwrap().runtime_timeout,
            Duration::from_secs(90)
        );
        m.insert("ASYA_RUNTIME_TIMEOUT", "2s");
        assert_eq!(
            Config::from_map(&m).unwrap().runtime_timeout,
            Duration::from_secs(2)
        );
    }

    #[test]
    fn sqs_settings_and_end_actor_by_name() {
        let m = HashMap::from([
            ("ASYA_ACTOR_NAME", "x-sink"),
            ("ASYA_TRANSPORT", "sqs"),
            ("ASYA_SQS_REGION", "us-east-1"),
            ("ASYA_SQS_ENDPOINT", "http://127.0.0.1:4566"),
        ]);
        let c = Config::from_map(&m).unwrap();
        assert!(c.is_end_actor);
        assert!(
            matches!(c.transport, TransportConfig::Sqs { ref endpoint, pollers: 2, .. } if endpoint.is_some())
        );
        // Pollers are bounded: each may hold 10 messages.
        for (value, ok) in [
            ("1", true),
            ("10", true),
            ("0", false),
            ("11", false),
            ("x", false),
        ] {
            let mut m = m.clone();
            m.insert("ASYA_SQS_POLLERS", value);
            match Config::from_map(&m) {
                Ok(c) => assert!(ok, "{value} accepted: {:?}", c.transport),
                Err(e) => {
                    assert!(!ok, "{value} refused: {e}");
                    assert_eq!(e.var, "ASYA_SQS_POLLERS");
                    assert!(e.to_string().contains(value), "{e}");
                }
            }
        }
    }

    /// What the webhook renders (the shared contract) is what this config reads.
    #[test]
    fn injected_settings_are_read_as_rendered() {
        use asya_api::sidecar_settings::{GatewaySettings, SidecarSettings};
        let settings = SidecarSettings {
            actor: "echo".into(),
            namespace: Sourced::Value("team-a".into()),
            transport: TransportSettings::Sqs {
                region: Some("eu-west-1".into()),
                endpoint: Some("http://127.0.0.1:4566".into()),
                credentials: None,
            },
            socket_dir: "/run/x".into(),
            runtime_timeout: Some("90s".into()),
            resiliency_json: Some(r#"{"actorTimeout":"5m"}"#.into()),
            handler_mode: Some("envelope".into()),
            metrics_addr: Some("0.0.0.0:9090".into()),
            gateway: Some(GatewaySettings {
                url: "http://gateway:8080".into(),
                token: Some(Sourced::Value("t".into())),
            }),
        };
        let env: Vec<(String, String)> = settings
            .to_env()
            .into_iter()
            .map(|e| (e.name, e.value.unwrap_or_default()))
            .collect();
        let map: HashMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let c = Config::from_map(&map).unwrap();
        assert_eq!((c.actor.as_str(), c.namespace.as_str()), ("echo", "team-a"));
        assert!(matches!(
            &c.transport,
            TransportConfig::Sqs { region, endpoint: Some(e), .. }
                if region == "eu-west-1" && e == "http://127.0.0.1:4566"
        ));
        assert_eq!(c.socket_path, PathBuf::from("/run/x/asya-runtime.sock"));
        assert_eq!(c.runtime_timeout, Duration::from_secs(90));
        assert_eq!(c.handler_mode, HandlerMode::Envelope);
        assert_eq!(c.metrics_addr.port(), 9090);
        let g = c.gateway.unwrap();
        assert_eq!(
            (g.url.as_str(), g.token.as_deref()),
            ("http://gateway:8080", Some("t"))
        );
    }
}
