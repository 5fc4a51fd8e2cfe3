//! The sidecar's settings, as one contract between the webhook, which renders them into the
//! sidecar container's environment ([`SidecarSettings::to_env`]), and the sidecar, which
//! parses them back ([`SidecarSettings::from_vars`]). Every variable name lives in [`env`],
//! once; the e2e tests and images depend on the names and meanings, so they never change.
//!
//! Values the pod supplies at start (a Secret's key, the pod's namespace) are [`Sourced`]:
//! rendered as `valueFrom`, read back as the plain value the kubelet put there.

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, SecretKeySelector};

use crate::amqp;
use crate::basics::is_dns_label;
use crate::config::{TRANSPORT_RABBITMQ, TRANSPORT_SQS, Transport};
use crate::naming::{self, BROKER_SECRET_PASSWORD, BROKER_SECRET_USERNAME};

/// The variable names of the sidecar's environment.
pub mod env {
    /// The actor this sidecar serves (a DNS label).
    pub const ACTOR_NAME: &str = "ASYA_ACTOR_NAME";
    /// The pod's namespace (default `default`).
    pub const NAMESPACE: &str = "ASYA_NAMESPACE";
    /// `rabbitmq` or `sqs`.
    pub const TRANSPORT: &str = "ASYA_TRANSPORT";
    /// `amqp[s]://user[:password]@host:port/vhost`.
    pub const RABBITMQ_URL: &str = "ASYA_RABBITMQ_URL";
    /// The broker password from its Secret, expanded into [`RABBITMQ_URL`] by Kubernetes.
    pub const RABBITMQ_PASSWORD: &str = "ASYA_RABBITMQ_PASSWORD";
    /// The broker user from the namespace's identity Secret, expanded into [`RABBITMQ_URL`].
    pub const RABBITMQ_USERNAME: &str = "ASYA_RABBITMQ_USERNAME";
    /// The exchange the sidecar publishes to (the namespace's `asya.{ns}`; `asya` when unset).
    pub const RABBITMQ_EXCHANGE: &str = "ASYA_RABBITMQ_EXCHANGE";
    pub const RABBITMQ_PREFETCH: &str = "ASYA_RABBITMQ_PREFETCH";
    pub const SQS_REGION: &str = "ASYA_SQS_REGION";
    /// Read when [`SQS_REGION`] is unset, as the AWS SDKs do.
    pub const AWS_REGION: &str = "AWS_REGION";
    pub const AWS_DEFAULT_REGION: &str = "AWS_DEFAULT_REGION";
    pub const SQS_ENDPOINT: &str = "ASYA_SQS_ENDPOINT";
    pub const AWS_ACCESS_KEY_ID: &str = "AWS_ACCESS_KEY_ID";
    pub const AWS_SECRET_ACCESS_KEY: &str = "AWS_SECRET_ACCESS_KEY";
    pub const SQS_WAIT_SECONDS: &str = "ASYA_SQS_WAIT_SECONDS";
    pub const SQS_VISIBILITY_TIMEOUT: &str = "ASYA_SQS_VISIBILITY_TIMEOUT";
    pub const SQS_MAX_MESSAGE_BYTES: &str = "ASYA_SQS_MAX_MESSAGE_BYTES";
    /// Long polls of the actor's queue kept under way at once (1..=10, 10 messages each).
    pub const SQS_POLLERS: &str = "ASYA_SQS_POLLERS";
    /// The directory of the runtime's socket, shared with the runtime container.
    pub const SOCKET_DIR: &str = "ASYA_SOCKET_DIR";
    /// A duration (`300s`); unset, the resiliency's `actorTimeout`.
    pub const RUNTIME_TIMEOUT: &str = "ASYA_RUNTIME_TIMEOUT";
    /// The resiliency settings as JSON.
    pub const RESILIENCY: &str = "ASYA_RESILIENCY";
    /// `payload` or `envelope` (the runtime container reads it too).
    pub const HANDLER_MODE: &str = "ASYA_HANDLER_MODE";
    /// `host:port` of the metrics and health endpoints.
    pub const METRICS_ADDR: &str = "ASYA_METRICS_ADDR";
    pub const GATEWAY_URL: &str = "ASYA_GATEWAY_URL";
    pub const GATEWAY_TOKEN: &str = "ASYA_GATEWAY_TOKEN";
    pub const GATEWAY_TIMEOUT: &str = "ASYA_GATEWAY_TIMEOUT";
    pub const GATEWAY_ATTEMPTS: &str = "ASYA_GATEWAY_ATTEMPTS";
    pub const GATEWAY_QUEUE: &str = "ASYA_GATEWAY_QUEUE";
    pub const IS_END_ACTOR: &str = "ASYA_IS_END_ACTOR";
    pub const RUNTIME_WAIT: &str = "ASYA_RUNTIME_WAIT";
    pub const RUNTIME_PIPELINE: &str = "ASYA_RUNTIME_PIPELINE";
    pub const QUEUE_AUTO_CREATE: &str = "ASYA_QUEUE_AUTO_CREATE";
    pub const MAX_REDELIVERIES: &str = "ASYA_MAX_REDELIVERIES";
    pub const SHUTDOWN_TIMEOUT: &str = "ASYA_SHUTDOWN_TIMEOUT";
    pub const TRANSPORT_STARTUP_TIMEOUT: &str = "ASYA_TRANSPORT_STARTUP_TIMEOUT";
    pub const LOG_FORMAT: &str = "ASYA_LOG_FORMAT";
}

/// Where the runtime's socket lives when [`env::SOCKET_DIR`] is unset.
pub const DEFAULT_SOCKET_DIR: &str = "/var/run/asya";
/// The namespace when [`env::NAMESPACE`] is unset.
pub const DEFAULT_NAMESPACE: &str = "default";

/// A value given in the pod spec, or supplied by the pod when it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sourced {
    Value(String),
    /// A key of a Secret in the pod's namespace (credentials are never inline).
    Secret {
        name: String,
        key: String,
    },
    /// A field of the pod (`metadata.namespace`).
    PodField(String),
}

impl Sourced {
    /// The value itself; `None` for one the pod supplies (never so when read back).
    pub fn into_value(self) -> Option<String> {
        match self {
            Sourced::Value(v) => Some(v),
            Sourced::Secret { .. } | Sourced::PodField(_) => None,
        }
    }

    /// The variable `name` with this value or source.
    pub fn env(&self, name: &str) -> EnvVar {
        match self {
            Sourced::Value(v) => literal(name, v.clone()),
            Sourced::Secret { name: secret, key } => EnvVar {
                name: name.into(),
                value: None,
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: secret.clone(),
                        key: key.clone(),
                        optional: None,
                    }),
                    ..Default::default()
                }),
            },
            Sourced::PodField(path) => EnvVar {
                name: name.into(),
                value: None,
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: path.clone(),
                        api_version: None,
                    }),
                    ..Default::default()
                }),
            },
        }
    }
}

fn literal(name: &str, value: String) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value),
        value_from: None,
    }
}

/// The transport the sidecar consumes from and publishes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportSettings {
    RabbitMq {
        /// May hold `$(ASYA_RABBITMQ_USERNAME)` and `$(ASYA_RABBITMQ_PASSWORD)`, which
        /// Kubernetes expands from `username` and `password`.
        url: String,
        /// The namespace's broker user (scoped identity, docs/DESIGN.md §9).
        username: Option<Sourced>,
        password: Option<Sourced>,
        /// The exchange to publish to; may hold `$(ASYA_NAMESPACE)`. `None`: the sidecar's
        /// default, the platform exchange `asya`.
        exchange: Option<String>,
    },
    Sqs {
        region: Option<String>,
        endpoint: Option<String>,
        credentials: Option<SqsCredentials>,
    },
}

/// A transport whose `type` is neither `rabbitmq` nor `sqs`.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("transport {name:?} has unknown type {kind:?}")]
pub struct UnknownTransportType {
    pub name: String,
    pub kind: String,
}

impl TransportSettings {
    /// The name of [`env::TRANSPORT`].
    pub fn kind(&self) -> &'static str {
        match self {
            TransportSettings::RabbitMq { .. } => TRANSPORT_RABBITMQ,
            TransportSettings::Sqs { .. } => TRANSPORT_SQS,
        }
    }

    /// What the sidecar of transport `name` gets under the cluster configuration `t`:
    /// credentials from their Secrets (never inline). One rule for the webhook, which
    /// injects it, and the provisioner, which recognises a pod injected under another one.
    pub fn for_transport(name: &str, t: &Transport) -> Result<Self, UnknownTransportType> {
        let c = &t.config;
        let secret = |name: &str, key: &str| Sourced::Secret {
            name: name.into(),
            key: key.into(),
        };
        match t.kind.as_str() {
            TRANSPORT_RABBITMQ if t.scoped_broker_identity() => {
                // The namespace's own broker identity (docs/DESIGN.md §9): user and password
                // from the Secret the provisioner keeps in the pod's namespace, the
                // namespace's own exchange, all expanded in the pod (`$(VAR)` from earlier
                // entries), so the pod spec holds no credential and the webhook needs no
                // namespace.
                let identity = naming::tenant_broker_secret(name);
                Ok(TransportSettings::RabbitMq {
                    url: amqp::url_with_identity_refs(
                        c,
                        env::RABBITMQ_USERNAME,
                        env::RABBITMQ_PASSWORD,
                    ),
                    username: Some(secret(&identity, BROKER_SECRET_USERNAME)),
                    password: Some(secret(&identity, BROKER_SECRET_PASSWORD)),
                    exchange: Some(format!(
                        "{}$({})",
                        naming::TENANT_EXCHANGE_PREFIX,
                        env::NAMESPACE
                    )),
                })
            }
            TRANSPORT_RABBITMQ => {
                // shareAdminCredentials: the platform's password, copied into the namespace.
                // The password stays in its Secret: Kubernetes expands $(VAR) from an earlier
                // env entry, so the URL is assembled in the pod, not in the pod spec.
                let password = c
                    .password_secret_ref
                    .as_ref()
                    .map(|s| secret(&s.name, &s.key));
                let url_password = match &password {
                    Some(_) => amqp::Password::EnvRef(env::RABBITMQ_PASSWORD),
                    None => amqp::Password::None,
                };
                Ok(TransportSettings::RabbitMq {
                    url: amqp::url(c, url_password),
                    username: None,
                    password,
                    exchange: None,
                })
            }
            TRANSPORT_SQS => Ok(TransportSettings::Sqs {
                region: c.region.clone(),
                endpoint: c.endpoint.clone(),
                // The platform's static keys reach actor namespaces only by explicit opt-in
                // (`shareStaticCredentials`); otherwise the sidecar uses the pod's IRSA
                // identity.
                credentials: c
                    .credentials_secret_ref
                    .as_ref()
                    .filter(|_| t.shares_static_credentials())
                    .map(|s| SqsCredentials {
                        access_key_id: secret(&s.name, &s.access_key_id_key),
                        secret_access_key: secret(&s.name, &s.secret_access_key_key),
                    }),
            }),
            other => Err(UnknownTransportType {
                name: name.into(),
                kind: other.into(),
            }),
        }
    }

    /// The credential variables and the Secret each is read from. A pod whose sidecar reads
    /// one of these variables from another Secret was injected under another configuration.
    pub fn credential_secrets(&self) -> Vec<(&'static str, &str)> {
        fn of<'a>(var: &'static str, s: Option<&'a Sourced>) -> Option<(&'static str, &'a str)> {
            match s {
                Some(Sourced::Secret { name, .. }) => Some((var, name.as_str())),
                _ => None,
            }
        }
        let pairs = match self {
            TransportSettings::RabbitMq {
                username, password, ..
            } => [
                of(env::RABBITMQ_USERNAME, username.as_ref()),
                of(env::RABBITMQ_PASSWORD, password.as_ref()),
            ],
            TransportSettings::Sqs { credentials, .. } => [
                of(
                    env::AWS_ACCESS_KEY_ID,
                    credentials.as_ref().map(|c| &c.access_key_id),
                ),
                of(
                    env::AWS_SECRET_ACCESS_KEY,
                    credentials.as_ref().map(|c| &c.secret_access_key),
                ),
            ],
        };
        pairs.into_iter().flatten().collect()
    }
}

/// The variables that carry broker credentials, whichever configuration injected them.
pub const CREDENTIAL_VARS: [&str; 4] = [
    env::RABBITMQ_USERNAME,
    env::RABBITMQ_PASSWORD,
    env::AWS_ACCESS_KEY_ID,
    env::AWS_SECRET_ACCESS_KEY,
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqsCredentials {
    pub access_key_id: Sourced,
    pub secret_access_key: Sourced,
}

/// Where the sidecar reports progress and final statuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewaySettings {
    /// An `http://` or `https://` URL.
    pub url: String,
    pub token: Option<Sourced>,
}

/// What the webhook tells the sidecar about its actor; the sidecar's own tunables
/// (prefetch, timeouts of its gateway client, …) are read by the sidecar alone, by the names
/// in [`env`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidecarSettings {
    pub actor: String,
    pub namespace: Sourced,
    pub transport: TransportSettings,
    pub socket_dir: String,
    /// A duration as the sidecar parses it (`300s`); `None`: the resiliency's timeout.
    pub runtime_timeout: Option<String>,
    /// The resiliency settings as JSON; `None`: the sidecar's defaults.
    pub resiliency_json: Option<String>,
    /// `payload` or `envelope`; `None`: payload.
    pub handler_mode: Option<String>,
    /// `host:port`; `None`: `0.0.0.0:8080`.
    pub metrics_addr: Option<String>,
    pub gateway: Option<GatewaySettings>,
}

/// A variable the sidecar cannot start with.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{var}: {message}")]
pub struct SettingsError {
    pub var: &'static str,
    pub message: String,
}

fn err(var: &'static str, message: impl Into<String>) -> SettingsError {
    SettingsError {
        var,
        message: message.into(),
    }
}

impl SidecarSettings {
    /// The container's environment, in a fixed order: identity, transport, runtime, gateway.
    pub fn to_env(&self) -> Vec<EnvVar> {
        let mut out = vec![
            literal(env::ACTOR_NAME, self.actor.clone()),
            self.namespace.env(env::NAMESPACE),
            literal(env::TRANSPORT, self.transport.kind().into()),
        ];
        match &self.transport {
            TransportSettings::RabbitMq {
                url,
                username,
                password,
                exchange,
            } => {
                // Before the URL: Kubernetes expands `$(VAR)` only from earlier entries.
                if let Some(u) = username {
                    out.push(u.env(env::RABBITMQ_USERNAME));
                }
                if let Some(p) = password {
                    out.push(p.env(env::RABBITMQ_PASSWORD));
                }
                out.push(literal(env::RABBITMQ_URL, url.clone()));
                if let Some(x) = exchange {
                    out.push(literal(env::RABBITMQ_EXCHANGE, x.clone()));
                }
            }
            TransportSettings::Sqs {
                region,
                endpoint,
                credentials,
            } => {
                if let Some(r) = region {
                    out.push(literal(env::SQS_REGION, r.clone()));
                }
                if let Some(e) = endpoint {
                    out.push(literal(env::SQS_ENDPOINT, e.clone()));
                }
                if let Some(c) = credentials {
                    out.push(c.access_key_id.env(env::AWS_ACCESS_KEY_ID));
                    out.push(c.secret_access_key.env(env::AWS_SECRET_ACCESS_KEY));
                }
            }
        }
        out.push(literal(env::SOCKET_DIR, self.socket_dir.clone()));
        for (name, value) in [
            (env::RUNTIME_TIMEOUT, &self.runtime_timeout),
            (env::RESILIENCY, &self.resiliency_json),
            (env::HANDLER_MODE, &self.handler_mode),
            (env::METRICS_ADDR, &self.metrics_addr),
        ] {
            if let Some(v) = value {
                out.push(literal(name, v.clone()));
            }
        }
        if let Some(g) = &self.gateway {
            out.push(literal(env::GATEWAY_URL, g.url.clone()));
            if let Some(t) = &g.token {
                // Optional: without its report token a pod still moves envelopes (its reports
                // are refused, the envelopes' status stays pending) instead of never starting.
                let mut var = t.env(env::GATEWAY_TOKEN);
                if let Some(r) = var
                    .value_from
                    .as_mut()
                    .and_then(|v| v.secret_key_ref.as_mut())
                {
                    r.optional = Some(true);
                }
                out.push(var);
            }
        }
        out
    }

    /// The settings from the sidecar's environment. `get` answers a variable's value,
    /// `None` when unset or blank. Checked in the order the sidecar has always reported
    /// them: identity, transport, gateway.
    pub fn from_vars(get: &dyn Fn(&str) -> Option<String>) -> Result<Self, SettingsError> {
        let actor = get(env::ACTOR_NAME).ok_or_else(|| {
            err(
                env::ACTOR_NAME,
                "is required (the actor this sidecar serves)",
            )
        })?;
        if !is_dns_label(&actor) {
            return Err(err(
                env::ACTOR_NAME,
                format!("{actor:?} is not a DNS label (lowercase letters, digits, '-')"),
            ));
        }
        let namespace = get(env::NAMESPACE).unwrap_or_else(|| DEFAULT_NAMESPACE.into());
        if !is_dns_label(&namespace) {
            return Err(err(
                env::NAMESPACE,
                format!("{namespace:?} is not a DNS label"),
            ));
        }
        Ok(SidecarSettings {
            actor,
            namespace: Sourced::Value(namespace),
            transport: Self::transport_from_vars(get)?,
            socket_dir: get(env::SOCKET_DIR).unwrap_or_else(|| DEFAULT_SOCKET_DIR.into()),
            runtime_timeout: get(env::RUNTIME_TIMEOUT),
            resiliency_json: get(env::RESILIENCY),
            handler_mode: get(env::HANDLER_MODE),
            metrics_addr: get(env::METRICS_ADDR),
            gateway: Self::gateway_from_vars(get)?,
        })
    }

    fn transport_from_vars(
        get: &dyn Fn(&str) -> Option<String>,
    ) -> Result<TransportSettings, SettingsError> {
        let kind = get(env::TRANSPORT)
            .ok_or_else(|| err(env::TRANSPORT, "is required (rabbitmq or sqs)"))?;
        match kind.as_str() {
            crate::config::TRANSPORT_RABBITMQ => Ok(TransportSettings::RabbitMq {
                url: get(env::RABBITMQ_URL).ok_or_else(|| {
                    err(
                        env::RABBITMQ_URL,
                        "is required (amqp://user:pass@host:5672/vhost)",
                    )
                })?,
                // Already expanded into the URL by Kubernetes.
                username: get(env::RABBITMQ_USERNAME).map(Sourced::Value),
                password: get(env::RABBITMQ_PASSWORD).map(Sourced::Value),
                exchange: get(env::RABBITMQ_EXCHANGE),
            }),
            crate::config::TRANSPORT_SQS => Ok(TransportSettings::Sqs {
                region: Some(
                    get(env::SQS_REGION)
                        .or_else(|| get(env::AWS_REGION))
                        .or_else(|| get(env::AWS_DEFAULT_REGION))
                        .ok_or_else(|| err(env::SQS_REGION, "is required for the sqs transport"))?,
                ),
                endpoint: get(env::SQS_ENDPOINT),
                credentials: match (get(env::AWS_ACCESS_KEY_ID), get(env::AWS_SECRET_ACCESS_KEY)) {
                    (Some(id), Some(secret)) => Some(SqsCredentials {
                        access_key_id: Sourced::Value(id),
                        secret_access_key: Sourced::Value(secret),
                    }),
                    // The AWS SDK's own chain finds them (or their absence) elsewhere.
                    _ => None,
                },
            }),
            other => Err(err(
                env::TRANSPORT,
                format!("{other:?} is not a transport (rabbitmq or sqs)"),
            )),
        }
    }

    fn gateway_from_vars(
        get: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<GatewaySettings>, SettingsError> {
        let Some(url) = get(env::GATEWAY_URL) else {
            return Ok(None);
        };
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(err(
                env::GATEWAY_URL,
                format!("{url:?} is not an http:// or https:// URL"),
            ));
        }
        Ok(Some(GatewaySettings {
            url,
            token: get(env::GATEWAY_TOKEN).map(Sourced::Value),
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// What the sidecar sees: the rendered env with each `valueFrom` resolved as the kubelet
    /// does (the pod's namespace, the Secret's key) and `$(VAR)` expanded from earlier entries.
    fn started(
        env: &[EnvVar],
        secrets: &HashMap<(&str, &str), &str>,
        ns: &str,
    ) -> HashMap<String, String> {
        let mut out: HashMap<String, String> = HashMap::new();
        for e in env {
            let value = match (&e.value, &e.value_from) {
                (Some(v), None) => {
                    let mut v = v.clone();
                    for (name, earlier) in &out {
                        v = v.replace(&format!("$({name})"), earlier);
                    }
                    v
                }
                (None, Some(src)) => match (&src.secret_key_ref, &src.field_ref) {
                    (Some(s), None) => secrets[&(s.name.as_str(), s.key.as_str())].to_string(),
                    (None, Some(f)) => {
                        assert_eq!(f.field_path, "metadata.namespace");
                        ns.to_string()
                    }
                    other => panic!("unexpected source {other:?}"),
                },
                other => panic!("unexpected entry {other:?}"),
            };
            assert!(
                out.insert(e.name.clone(), value).is_none(),
                "{} twice",
                e.name
            );
        }
        out
    }

    fn parse(vars: &HashMap<String, String>) -> Result<SidecarSettings, SettingsError> {
        SidecarSettings::from_vars(&|k| vars.get(k).cloned().filter(|v| !v.is_empty()))
    }

    fn rabbit() -> SidecarSettings {
        SidecarSettings {
            actor: "echo".into(),
            namespace: Sourced::PodField("metadata.namespace".into()),
            transport: TransportSettings::RabbitMq {
                url: "amqp://$(ASYA_RABBITMQ_USERNAME):$(ASYA_RABBITMQ_PASSWORD)@rabbitmq:5672/%2F"
                    .into(),
                username: Some(Sourced::Secret {
                    name: "rmq".into(),
                    key: "username".into(),
                }),
                password: Some(Sourced::Secret {
                    name: "rmq".into(),
                    key: "password".into(),
                }),
                exchange: Some("asya.$(ASYA_NAMESPACE)".into()),
            },
            socket_dir: DEFAULT_SOCKET_DIR.into(),
            runtime_timeout: Some("300s".into()),
            resiliency_json: Some(r#"{"actorTimeout":"5m"}"#.into()),
            handler_mode: Some("payload".into()),
            metrics_addr: Some("0.0.0.0:8080".into()),
            gateway: Some(GatewaySettings {
                url: "http://gateway:8080".into(),
                token: Some(Sourced::Secret {
                    name: "gw".into(),
                    key: "token".into(),
                }),
            }),
        }
    }

    #[test]
    fn rendered_settings_parse_back() {
        let secrets = HashMap::from([
            (("rmq", "username"), "asya-ns-team-a"),
            (("rmq", "password"), "p@ss"),
            (("gw", "token"), "t0k"),
        ]);
        let s = rabbit();
        let back = parse(&started(&s.to_env(), &secrets, "team-a")).unwrap();
        let want = SidecarSettings {
            namespace: Sourced::Value("team-a".into()),
            transport: TransportSettings::RabbitMq {
                url: "amqp://asya-ns-team-a:p@ss@rabbitmq:5672/%2F".into(),
                username: Some(Sourced::Value("asya-ns-team-a".into())),
                password: Some(Sourced::Value("p@ss".into())),
                // The namespace's own exchange, expanded from the pod's namespace.
                exchange: Some("asya.team-a".into()),
            },
            gateway: Some(GatewaySettings {
                url: "http://gateway:8080".into(),
                token: Some(Sourced::Value("t0k".into())),
            }),
            ..s
        };
        assert_eq!(back, want);

        // Values given inline come back as they went.
        let sqs = SidecarSettings {
            namespace: Sourced::Value("team-b".into()),
            transport: TransportSettings::Sqs {
                region: Some("eu-west-1".into()),
                endpoint: Some("http://127.0.0.1:4566".into()),
                credentials: Some(SqsCredentials {
                    access_key_id: Sourced::Value("id".into()),
                    secret_access_key: Sourced::Value("secret".into()),
                }),
            },
            runtime_timeout: None,
            resiliency_json: None,
            handler_mode: None,
            metrics_addr: None,
            gateway: None,
            ..rabbit()
        };
        let back = parse(&started(&sqs.to_env(), &HashMap::new(), "unused")).unwrap();
        assert_eq!(back, sqs);
    }

    #[test]
    fn names_and_order_of_the_rendered_env() {
        let names: Vec<String> = rabbit().to_env().into_iter().map(|e| e.name).collect();
        assert_eq!(
            names,
            [
                "ASYA_ACTOR_NAME",
                "ASYA_NAMESPACE",
                "ASYA_TRANSPORT",
                "ASYA_RABBITMQ_USERNAME",
                "ASYA_RABBITMQ_PASSWORD",
                "ASYA_RABBITMQ_URL",
                "ASYA_RABBITMQ_EXCHANGE",
                "ASYA_SOCKET_DIR",
                "ASYA_RUNTIME_TIMEOUT",
                "ASYA_RESILIENCY",
                "ASYA_HANDLER_MODE",
                "ASYA_METRICS_ADDR",
                "ASYA_GATEWAY_URL",
                "ASYA_GATEWAY_TOKEN",
            ]
        );
    }

    #[test]
    fn each_bad_setting_names_its_variable() {
        let base = started(
            &rabbit().to_env(),
            &HashMap::from([
                (("rmq", "username"), "u"),
                (("rmq", "password"), "p"),
                (("gw", "token"), "t"),
            ]),
            "ns",
        );
        for (var, value) in [
            (env::ACTOR_NAME, "Bad_Name"),
            (env::ACTOR_NAME, ""),
            (env::NAMESPACE, "-x"),
            (env::TRANSPORT, "kafka"),
            (env::TRANSPORT, ""),
            (env::RABBITMQ_URL, ""),
            (env::GATEWAY_URL, "gateway:8080"),
        ] {
            let mut m = base.clone();
            m.insert(var.to_string(), value.to_string());
            assert_eq!(parse(&m).unwrap_err().var, var, "{var}={value:?}");
        }
        let mut m = base.clone();
        m.insert(env::TRANSPORT.into(), "sqs".into());
        assert_eq!(parse(&m).unwrap_err().var, env::SQS_REGION);
        m.insert(env::AWS_DEFAULT_REGION.into(), "us-east-1".into());
        assert!(matches!(
            parse(&m).unwrap().transport,
            TransportSettings::Sqs { region: Some(r), .. } if r == "us-east-1"
        ));
    }
}
