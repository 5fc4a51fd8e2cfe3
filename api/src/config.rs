//! The cluster configuration (docs/DESIGN.md §7): transports, the sidecar, and platform policy.
//! Rendered by the Helm chart into the `asya-config` ConfigMap (key `config.yaml`) and read
//! by the webhook and the provisioner; the CLI uses [`ClusterConfig::default`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::{Deserialize, Serialize};

use crate::error::{FieldError, FieldErrors};
use crate::telemetry::{MonitoringConfig, TracingConfig};

pub const TRANSPORT_RABBITMQ: &str = "rabbitmq";
pub const TRANSPORT_SQS: &str = "sqs";
/// RabbitMQ's AMQP-over-TLS port: TLS is the default there (`Transport::rabbitmq_tls`).
pub const AMQPS_PORT: u16 = 5671;
/// The sidecar image the chart ships when none is configured: the release of this very
/// build (`make images` builds it as `localhost/asya-rs/asya-sidecar`, docs/images.md).
pub const DEFAULT_SIDECAR_IMAGE: &str =
    concat!("ghcr.io/asya-rs/asya-sidecar:", env!("CARGO_PKG_VERSION"));

/// The state proxy connector image a flavor gets when it names just `asya-state-proxy`
/// (docs/DESIGN.md §10): the release of this build, like the sidecar's.
pub const DEFAULT_STATE_PROXY_IMAGE: &str = concat!(
    "ghcr.io/asya-rs/asya-state-proxy:",
    env!("CARGO_PKG_VERSION")
);

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cluster configuration is not valid YAML: {0}")]
    Parse(String),
    #[error("cluster configuration is invalid: {0}")]
    Invalid(FieldErrors),
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterConfig {
    /// Transport of actors that name none.
    #[serde(default = "default_transport")]
    pub default_transport: String,
    /// Transports by name. The name is what `spec.transport` refers to.
    #[serde(default = "default_transports")]
    pub transports: BTreeMap<String, Transport>,
    #[serde(default)]
    pub sidecar: SidecarConfig,
    #[serde(default)]
    pub policy: Policy,
    /// ServiceAccount settings for actors (IRSA role annotation).
    #[serde(default)]
    pub service_account: ServiceAccountConfig,
    /// How long the provisioner keeps a namespace's non-empty end queue (`x-sink`,
    /// `x-sump`: unread results are data) after the namespace is gone; empty ones go at once.
    #[serde(default = "default_end_queue_retention")]
    pub end_queue_retention: crate::duration::DurationSpec,
    /// Where sidecars report progress and final statuses (the gateway); off when unset.
    #[serde(default, skip_serializing_if = "GatewayConfig::is_off")]
    pub gateway: GatewayConfig,
    /// How much of the namespaced flavor ConfigMaps the webhook and the provisioner read:
    /// any namespace can label a ConfigMap, so what they cache must be bounded (§9).
    #[serde(default)]
    pub flavor_limits: FlavorLimits,
    /// Namespaces the admission webhook is not called for (the chart's `kube-system`, the
    /// release namespace and `webhook.excludeNamespaces`). Actors there were never admitted,
    /// so the provisioner reconciles none of them (§9).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excluded_namespaces: Vec<String>,
    /// Where injected sidecars send spans (`OTEL_*` variables; docs/observability.md).
    #[serde(default, skip_serializing_if = "TracingConfig::is_default")]
    pub tracing: TracingConfig,
    /// What the webhook adds to injected pods for monitoring (`prometheus.io/*`).
    #[serde(default, skip_serializing_if = "MonitoringConfig::is_default")]
    pub monitoring: MonitoringConfig,
    /// Our state proxy connector image (the chart's `stateProxy.image`, under its registry).
    #[serde(default)]
    pub state_proxy: StateProxyConfig,
    /// Route-aware wake-up (docs/DESIGN.md §6.1): each scaled actor's wake queue and the
    /// ScaledObject's second trigger on it.
    #[serde(default, skip_serializing_if = "WakeConfig::is_default")]
    pub wake: WakeConfig,
}

/// Route-aware wake-up (docs/DESIGN.md §6.1). On by default; off, the provisioner declares
/// no wake queue and renders no wake trigger (wake messages then find no queue: dropped).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WakeConfig {
    #[serde(default = "yes")]
    pub enabled: bool,
}

impl Default for WakeConfig {
    fn default() -> Self {
        WakeConfig { enabled: true }
    }
}

impl WakeConfig {
    pub fn is_default(&self) -> bool {
        *self == WakeConfig::default()
    }
}

/// State proxies (docs/DESIGN.md §9, §10): where our connector image comes from, the
/// platform's Redis whose per-namespace users the provisioner keeps, and whether connectors
/// may hold static AWS keys.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StateProxyConfig {
    /// A `stateProxy` entry whose image is just `asya-state-proxy[:TAG]` takes this
    /// reference (its tag unless the entry gives one), so flavors need not name the
    /// platform's registry.
    #[serde(default = "default_state_proxy_image")]
    pub image: String,
    /// The platform's Redis for `redis-*` connectors. Each namespace gets its own ACL user
    /// there (keys `{namespace}/*` only), its password only in that namespace's Secret;
    /// without it, a Redis connector must name its own `REDIS_URL`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<PlatformRedis>,
    /// Static AWS keys (`AWS_ACCESS_KEY_ID`, ...) in a connector's env: refused unless true,
    /// and then a Warning on every actor that has them. Keys given to several namespaces
    /// are one S3 identity, so S3 would not keep their state apart; the documented way is a
    /// role per namespace (`serviceAccount.actorRoleArn` with `{namespace}`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_static_credentials: bool,
}

impl Default for StateProxyConfig {
    fn default() -> Self {
        Self {
            image: default_state_proxy_image(),
            redis: None,
            allow_static_credentials: false,
        }
    }
}

fn default_state_proxy_image() -> String {
    DEFAULT_STATE_PROXY_IMAGE.into()
}

/// The platform's Redis (`stateProxy.redis`). The URL carries no credentials: a connector
/// authenticates as its namespace's user, which the provisioner makes with the admin
/// identity below (kept in the release namespace).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlatformRedis {
    /// `redis://host[:port][/db]` or `rediss://…` (TLS), as pods reach it.
    pub url: String,
    /// The user the provisioner manages ACL users as (needs `+acl` and `+client`).
    #[serde(default = "default_redis_admin_username")]
    pub admin_username: String,
    /// The admin's password, a Secret in the release namespace.
    pub admin_password_secret_ref: SecretKeySelector,
}

fn default_redis_admin_username() -> String {
    "default".into()
}

/// Bounds on the namespaced flavor ConfigMaps kept in memory. The worst case is
/// `maxTotal` × `maxBytes` of flavor text (8 MiB at the defaults); the ConfigMaps past a
/// count bound are kept as their identity only, so an actor using one is told why.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FlavorLimits {
    /// Largest `flavor.yaml` read, in bytes; a larger one is not parsed.
    #[serde(default = "default_flavor_max_bytes")]
    pub max_bytes: usize,
    /// Flavor ConfigMaps read per namespace.
    #[serde(default = "default_flavor_max_per_namespace")]
    pub max_per_namespace: usize,
    /// Flavor ConfigMaps read in the whole cluster.
    #[serde(default = "default_flavor_max_total")]
    pub max_total: usize,
}

pub const DEFAULT_FLAVOR_MAX_BYTES: usize = 16 * 1024;
pub const DEFAULT_FLAVOR_MAX_PER_NAMESPACE: usize = 16;
pub const DEFAULT_FLAVOR_MAX_TOTAL: usize = 512;

fn default_flavor_max_bytes() -> usize {
    DEFAULT_FLAVOR_MAX_BYTES
}
fn default_flavor_max_per_namespace() -> usize {
    DEFAULT_FLAVOR_MAX_PER_NAMESPACE
}
fn default_flavor_max_total() -> usize {
    DEFAULT_FLAVOR_MAX_TOTAL
}

impl Default for FlavorLimits {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_FLAVOR_MAX_BYTES,
            max_per_namespace: DEFAULT_FLAVOR_MAX_PER_NAMESPACE,
            max_total: DEFAULT_FLAVOR_MAX_TOTAL,
        }
    }
}

/// The default of [`ClusterConfig::end_queue_retention`]: a week to fetch unread results.
pub const DEFAULT_END_QUEUE_RETENTION: &str = "168h";

fn default_end_queue_retention() -> crate::duration::DurationSpec {
    crate::duration::DurationSpec::new(DEFAULT_END_QUEUE_RETENTION)
}

/// The gateway the sidecars report to (`ASYA_GATEWAY_URL`, `ASYA_GATEWAY_TOKEN`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewayConfig {
    /// Base URL, e.g. `http://asya-gateway.asya-system.svc:8080`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A Secret in each actor namespace holding a bearer token the gateway accepts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret_ref: Option<SecretKeySelector>,
    /// The gateway's report key, in the release namespace. With `tokenSecretRef` set, the
    /// provisioner issues each actor namespace's report token into that Secret there
    /// (docs/DESIGN.md §9, "Gateway tokens").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_key_secret_ref: Option<SecretKeySelector>,
}

impl GatewayConfig {
    pub fn is_off(&self) -> bool {
        self.url.is_none()
            && self.token_secret_ref.is_none()
            && self.report_key_secret_ref.is_none()
    }

    /// Where the provisioner reads the report key and where it writes each namespace's
    /// report token (`(key, token)`), when it issues them: both must be configured.
    pub fn report_tokens(&self) -> Option<(&SecretKeySelector, &SecretKeySelector)> {
        Some((
            self.report_key_secret_ref.as_ref()?,
            self.token_secret_ref.as_ref()?,
        ))
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Transport {
    #[serde(default = "yes")]
    pub enabled: bool,
    /// `rabbitmq` or `sqs`.
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub config: TransportSettings,
}

/// Settings of either transport type; which apply depends on `type` (seed 001's values).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TransportSettings {
    // RabbitMQ
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret_ref: Option<SecretKeySelector>,
    /// AMQPS. On by default for any host but loopback (security by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<bool>,
    /// Port of the management API: queue depth in status, and the per-namespace broker
    /// users (required unless `shareAdminCredentials`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub management_port: Option<u16>,
    /// The pre-tenancy behaviour, as an explicit opt-in: the platform's own password is
    /// copied into every actor namespace and sidecars publish to `asya`. Off: each namespace
    /// gets its own broker user and exchange (docs/DESIGN.md §9).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub share_admin_credentials: bool,
    // SQS
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Endpoint override for local SQS-compatible servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "accountId")]
    pub account_id: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "queueBaseURL"
    )]
    pub queue_base_url: Option<String>,
    /// Static credentials (local emulators); IRSA is used when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<CredentialsSecretRef>,
    /// Copy the static keys of `credentialsSecretRef` into every actor namespace (the sidecar
    /// and KEDA authenticate with them). Off by default: a tenant holding the platform's keys
    /// reaches every namespace's queues; actors use IRSA (`serviceAccount.actorRoleArn`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub share_static_credentials: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeySelector {
    pub name: String,
    pub key: String,
}

/// A secret with AWS access keys (keys `accessKeyId` / `secretAccessKey` unless renamed).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CredentialsSecretRef {
    pub name: String,
    #[serde(default = "access_key_key")]
    pub access_key_id_key: String,
    #[serde(default = "secret_key_key")]
    pub secret_access_key_key: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SidecarConfig {
    #[serde(default = "default_sidecar_image")]
    pub image: String,
    #[serde(default = "default_pull_policy")]
    pub image_pull_policy: String,
    #[serde(default = "default_sidecar_resources")]
    pub resources: ResourceRequirements,
    #[serde(default = "default_metrics_port")]
    pub metrics_port: u16,
    /// Inject as a native sidecar (init container with restartPolicy Always) when the API
    /// server supports it (1.29+). The webhook checks the server version at start.
    #[serde(default = "yes")]
    pub native: bool,
}

/// What [`ServiceAccountConfig::actor_role_arn`] must contain (substituted per namespace).
pub const NAMESPACE_PLACEHOLDER: &str = "{namespace}";

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceAccountConfig {
    /// IAM role ARN for actors' ServiceAccounts; `{namespace}` (required) and `{actor}` are
    /// substituted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor_role_arn: Option<String>,
}

/// Platform policy enforced at admission. Every rejection names the policy and how to change it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Policy {
    /// Image prefixes actors may use (`ghcr.io/myorg/`); empty allows any.
    #[serde(default)]
    pub allowed_registries: Vec<String>,
    /// Let `secretRefs` name secrets in other namespaces. Off by default.
    #[serde(default)]
    pub allow_cross_namespace_secret_refs: bool,
    /// Require cpu and memory limits on the runtime container.
    #[serde(default)]
    pub require_resource_limits: bool,
    /// Ceiling for `maxReplicaCount` and `replicas`.
    #[serde(default = "default_max_replicas")]
    pub max_replicas: i32,
    /// Top-level spec fields that namespaced (ConfigMap) flavors may set.
    #[serde(default = "default_namespaced_flavor_fields")]
    pub namespaced_flavor_fields: Vec<String>,
    /// The Pod Security level an actor's pod must meet in a namespace without the
    /// `pod-security.kubernetes.io/enforce` label (with it, the label's level).
    #[serde(default)]
    pub default_pod_security_level: crate::basics::Level,
    /// Largest `spec` admitted, in bytes of compact JSON, on CREATE and on UPDATEs that change
    /// it: what the webhook's and the provisioner's caches keep of an actor is bounded by it.
    #[serde(default = "default_max_spec_bytes")]
    pub max_spec_bytes: usize,
    /// AsyncActors one namespace may hold; a CREATE past it is refused. Unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_actors_per_namespace: Option<usize>,
}

/// The default of [`Policy::max_spec_bytes`]: 64 KiB. The largest example spec
/// (`deploy/examples/actors/000-image-enhancer-full.yaml`, every field set) is under 2 KiB
/// as JSON, and a workload template with a few containers under 10 KiB; 64 KiB leaves room
/// for long env lists and templates while a namespace's actors cannot make the caches that
/// hold every actor of the cluster grow by more than that each.
pub const DEFAULT_MAX_SPEC_BYTES: usize = 64 * 1024;

fn yes() -> bool {
    true
}
fn default_transport() -> String {
    TRANSPORT_RABBITMQ.into()
}
fn default_sidecar_image() -> String {
    DEFAULT_SIDECAR_IMAGE.into()
}
fn default_pull_policy() -> String {
    "IfNotPresent".into()
}
fn default_metrics_port() -> u16 {
    8080
}
fn default_max_replicas() -> i32 {
    100
}
fn default_max_spec_bytes() -> usize {
    DEFAULT_MAX_SPEC_BYTES
}
fn access_key_key() -> String {
    "accessKeyId".into()
}
fn secret_key_key() -> String {
    "secretAccessKey".into()
}
fn default_namespaced_flavor_fields() -> Vec<String> {
    [
        "env",
        "resources",
        "scaling",
        "resiliency",
        "tolerations",
        "nodeSelector",
        "volumes",
        "volumeMounts",
        "secretRefs",
        "handlerMode",
        "pythonExecutable",
    ]
    .map(String::from)
    .to_vec()
}
fn default_sidecar_resources() -> ResourceRequirements {
    let q = |s: &str| Quantity(s.to_string());
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".into(), q("50m")),
            ("memory".into(), q("32Mi")),
        ])),
        limits: Some(BTreeMap::from([("memory".into(), q("128Mi"))])),
        ..Default::default()
    }
}
fn default_transports() -> BTreeMap<String, Transport> {
    BTreeMap::from([
        (
            TRANSPORT_RABBITMQ.to_string(),
            Transport {
                enabled: true,
                kind: TRANSPORT_RABBITMQ.into(),
                config: TransportSettings {
                    host: Some("rabbitmq".into()),
                    port: Some(5672),
                    management_port: Some(15672),
                    vhost: Some("/".into()),
                    username: Some("guest".into()),
                    password_secret_ref: Some(SecretKeySelector {
                        name: "rabbitmq-secret".into(),
                        key: "password".into(),
                    }),
                    ..Default::default()
                },
            },
        ),
        (
            TRANSPORT_SQS.to_string(),
            Transport {
                enabled: true,
                kind: TRANSPORT_SQS.into(),
                config: TransportSettings {
                    region: Some("us-east-1".into()),
                    ..Default::default()
                },
            },
        ),
    ])
}

impl Default for SidecarConfig {
    fn default() -> Self {
        Self {
            image: default_sidecar_image(),
            image_pull_policy: default_pull_policy(),
            resources: default_sidecar_resources(),
            metrics_port: default_metrics_port(),
            native: true,
        }
    }
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            allowed_registries: Vec::new(),
            allow_cross_namespace_secret_refs: false,
            require_resource_limits: false,
            max_replicas: default_max_replicas(),
            namespaced_flavor_fields: default_namespaced_flavor_fields(),
            default_pod_security_level: crate::basics::Level::Baseline,
            max_spec_bytes: DEFAULT_MAX_SPEC_BYTES,
            max_actors_per_namespace: None,
        }
    }
}

/// The documented defaults: both transports enabled, rabbitmq the default.
impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            default_transport: default_transport(),
            transports: default_transports(),
            sidecar: SidecarConfig::default(),
            policy: Policy::default(),
            service_account: ServiceAccountConfig::default(),
            end_queue_retention: default_end_queue_retention(),
            gateway: GatewayConfig::default(),
            flavor_limits: FlavorLimits::default(),
            excluded_namespaces: Vec::new(),
            state_proxy: StateProxyConfig::default(),
            tracing: TracingConfig::default(),
            monitoring: MonitoringConfig::default(),
            wake: WakeConfig::default(),
        }
    }
}

impl ClusterConfig {
    /// Parses and validates a configuration; unknown keys are errors (a typo must not
    /// silently disable a policy).
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let de = serde_yaml::Deserializer::from_str(text);
        let cfg: ClusterConfig = serde_path_to_error::deserialize(de)
            .map_err(|e| ConfigError::Parse(format!("{}: {}", e.path(), e.inner())))?;
        cfg.validate().map_err(ConfigError::Invalid)?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), FieldErrors> {
        let mut errs = FieldErrors::default();
        for (name, t) in &self.transports {
            let path = format!("transports.{name}");
            match t.kind.as_str() {
                TRANSPORT_RABBITMQ => {
                    if t.config.host.as_deref().is_none_or(str::is_empty) && t.enabled {
                        errs.push(FieldError::required(
                            format!("{path}.config.host"),
                            "a rabbitmq transport needs a host",
                        ));
                    }
                    if t.config.share_static_credentials {
                        errs.push(FieldError::invalid(
                            format!("{path}.config.shareStaticCredentials"),
                            true,
                            "applies to sqs transports only (rabbitmq tenants get their own broker user)",
                        ));
                    }
                    if t.enabled
                        && t.config.management_port.is_none()
                        && !t.config.share_admin_credentials
                    {
                        errs.push(FieldError::required(
                            format!("{path}.config.managementPort"),
                            "a rabbitmq transport needs its management API port to create each \
                             namespace's broker user (or set shareAdminCredentials: true to copy \
                             the platform's credentials into actor namespaces, not recommended)",
                        ));
                    }
                }
                TRANSPORT_SQS => {
                    if t.config.region.as_deref().is_none_or(str::is_empty) && t.enabled {
                        errs.push(FieldError::required(
                            format!("{path}.config.region"),
                            "an sqs transport needs a region",
                        ));
                    }
                    if t.config.share_static_credentials
                        && t.config.credentials_secret_ref.is_none()
                    {
                        errs.push(FieldError::invalid(
                            format!("{path}.config.shareStaticCredentials"),
                            true,
                            "there are no static keys to share: set credentialsSecretRef too",
                        ));
                    }
                }
                other => errs.push(FieldError::unsupported(
                    format!("{path}.type"),
                    other,
                    &[TRANSPORT_RABBITMQ, TRANSPORT_SQS],
                )),
            }
        }
        match self.transports.get(&self.default_transport) {
            Some(t) if t.enabled => {}
            Some(_) => errs.push(FieldError::invalid(
                "defaultTransport",
                self.default_transport.as_str(),
                "names a transport that is not enabled",
            )),
            None => errs.push(FieldError::invalid(
                "defaultTransport",
                self.default_transport.as_str(),
                format!(
                    "no such transport; configured: {}",
                    self.transport_names().join(", ")
                ),
            )),
        }
        if self.sidecar.image.is_empty() {
            errs.push(FieldError::required(
                "sidecar.image",
                "the sidecar image must be set",
            ));
        }
        if let Some(r) = &self.state_proxy.redis {
            if let Err(rule) = crate::basics::redis_endpoint(&r.url) {
                // Never quoted whole: the rule broken may be a password in it.
                let shown = match r.url.split_once('@') {
                    Some((_, after)) => format!("***@{after}"),
                    None => r.url.clone(),
                };
                errs.push(FieldError::invalid("stateProxy.redis.url", shown, rule));
            }
            if r.admin_password_secret_ref.name.is_empty()
                || r.admin_password_secret_ref.key.is_empty()
            {
                errs.push(FieldError::required(
                    "stateProxy.redis.adminPasswordSecretRef",
                    "the name and key of the Secret (in the release namespace) with the password \
                     of the Redis user that manages the namespaces' ACL users",
                ));
            }
        }
        if let Err(e) = self.end_queue_retention.parse() {
            errs.push(FieldError::invalid(
                "endQueueRetention",
                self.end_queue_retention.to_string(),
                format!("not a duration ({e}); e.g. 168h, 30m, 0s"),
            ));
        }
        if self.policy.max_replicas < 1 {
            errs.push(FieldError::invalid(
                "policy.maxReplicas",
                self.policy.max_replicas,
                "must be >= 1",
            ));
        }
        if self.policy.max_spec_bytes == 0 {
            errs.push(FieldError::invalid(
                "policy.maxSpecBytes",
                0,
                "must be >= 1",
            ));
        }
        if self.policy.max_actors_per_namespace == Some(0) {
            errs.push(FieldError::invalid(
                "policy.maxActorsPerNamespace",
                0,
                "must be >= 1 (leave it unset for no limit)",
            ));
        }
        if let Some(arn) = &self.service_account.actor_role_arn
            && !arn.contains(NAMESPACE_PLACEHOLDER)
        {
            errs.push(FieldError::invalid(
                "serviceAccount.actorRoleArn",
                arn.as_str(),
                format!(
                    "must contain {NAMESPACE_PLACEHOLDER}: one role per namespace keeps namespaces' \
                     AWS identities apart (a namespace's queues and its S3 state are guarded by \
                     its role's policy); a role shared by every namespace lets each reach the \
                     others'"
                ),
            ));
        }
        let l = &self.flavor_limits;
        for (field, value) in [
            ("flavorLimits.maxBytes", l.max_bytes),
            ("flavorLimits.maxPerNamespace", l.max_per_namespace),
            ("flavorLimits.maxTotal", l.max_total),
        ] {
            if value == 0 {
                errs.push(FieldError::invalid(field, value, "must be >= 1"));
            }
        }
        self.tracing.validate(&mut errs);
        errs.into_result()
    }

    /// Whether the admission webhook skips `namespace` (then so does the provisioner).
    pub fn namespace_excluded(&self, namespace: &str) -> bool {
        self.excluded_namespaces.iter().any(|n| n == namespace)
    }

    pub fn transport_names(&self) -> Vec<String> {
        self.transports.keys().cloned().collect()
    }

    pub fn enabled_transports(&self) -> Vec<&str> {
        self.transports
            .iter()
            .filter(|(_, t)| t.enabled)
            .map(|(n, _)| n.as_str())
            .collect()
    }

    /// The enabled transport called `name`.
    pub fn transport(&self, name: &str) -> Option<&Transport> {
        self.transports.get(name).filter(|t| t.enabled)
    }
}

impl TransportSettings {
    /// Whether AMQP uses TLS: the explicit `tls`, else on exactly for AMQPS's port 5671
    /// (the one rule the webhook, the provisioner and the gateway share).
    pub fn rabbitmq_tls(&self) -> bool {
        self.tls.unwrap_or(self.port == Some(AMQPS_PORT))
    }
}

impl Transport {
    /// Whether actor namespaces get the platform's own RabbitMQ credentials (the opt-in
    /// `shareAdminCredentials`) instead of their own broker identity.
    pub fn shares_admin_credentials(&self) -> bool {
        self.is_rabbitmq() && self.config.share_admin_credentials
    }
    /// Whether actor namespaces get their own broker user and exchange (§9).
    pub fn scoped_broker_identity(&self) -> bool {
        self.is_rabbitmq() && !self.config.share_admin_credentials
    }
    pub fn is_sqs(&self) -> bool {
        self.kind == TRANSPORT_SQS
    }
    pub fn is_rabbitmq(&self) -> bool {
        self.kind == TRANSPORT_RABBITMQ
    }
    /// Whether actor namespaces get the platform's static SQS keys (explicit opt-in).
    pub fn shares_static_credentials(&self) -> bool {
        self.is_sqs()
            && self.config.share_static_credentials
            && self.config.credentials_secret_ref.is_some()
    }
    /// Whether AMQP uses TLS: the explicit `tls` setting, else on exactly when the port is
    /// AMQPS's 5671. A stock RabbitMQ serves plain AMQP on 5672, and seed 001's values name
    /// that port without `tls`: deciding by host made every sidecar speak TLS to it.
    pub fn rabbitmq_tls(&self) -> bool {
        self.config.rabbitmq_tls()
    }
}

#[cfg(test)]
mod tests;
