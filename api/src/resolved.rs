//! Defaults (docs/DESIGN.md §2) and the effective view of an actor that the provisioner renders and
//! the webhook injects from.
//!
//! Defaults are applied after the flavor merge, never written into the stored spec: a
//! defaulted inline `minReplicaCount: 0` would otherwise shadow every flavor's value.

use std::time::Duration;

use k8s_openapi::api::core::v1::Container;

use crate::config::ClusterConfig;
use crate::duration::DurationSpec;
use crate::labels;
use crate::naming;
use crate::types::{AsyncActorSpec, Resiliency, RetryPolicy, Scaling};

pub const DEFAULT_MIN_REPLICAS: i32 = 0;
pub const DEFAULT_MAX_REPLICAS: i32 = 10;
pub const DEFAULT_QUEUE_LENGTH: i32 = 5;
pub const DEFAULT_POLLING_INTERVAL: i32 = 30;
pub const DEFAULT_COOLDOWN_PERIOD: i32 = 300;
pub const DEFAULT_ACTOR_TIMEOUT: &str = "5m";
pub const DEFAULT_PYTHON: &str = "python3";
pub const DEFAULT_PULL_POLICY: &str = "IfNotPresent";
pub const DEFAULT_HANDLER_MODE: &str = "payload";
pub const DEFAULT_WORKLOAD_KIND: &str = "Deployment";
pub const DEFAULT_MAX_ATTEMPTS: i32 = 3;
pub const DEFAULT_BACKOFF: &str = "exponential";
pub const DEFAULT_INITIAL_INTERVAL: &str = "1s";
pub const DEFAULT_MAX_INTERVAL: &str = "60s";

/// Fills every unset field that has a default. Idempotent.
pub fn apply_defaults(spec: &mut AsyncActorSpec) {
    let s = spec.scaling.get_or_insert_with(Scaling::default);
    s.enabled.get_or_insert(true);
    s.min_replica_count.get_or_insert(DEFAULT_MIN_REPLICAS);
    s.max_replica_count.get_or_insert(DEFAULT_MAX_REPLICAS);
    s.queue_length.get_or_insert(DEFAULT_QUEUE_LENGTH);
    s.polling_interval.get_or_insert(DEFAULT_POLLING_INTERVAL);
    s.cooldown_period.get_or_insert(DEFAULT_COOLDOWN_PERIOD);
    s.wake.get_or_insert(true);
    let r = spec.resiliency.get_or_insert_with(Resiliency::default);
    r.actor_timeout
        .get_or_insert_with(|| DurationSpec::new(DEFAULT_ACTOR_TIMEOUT));
    for p in r.policies.values_mut() {
        default_policy(p);
    }
    if spec.workload.is_none() {
        spec.image_pull_policy
            .get_or_insert_with(|| DEFAULT_PULL_POLICY.into());
    }
    spec.python_executable
        .get_or_insert_with(|| DEFAULT_PYTHON.into());
    spec.handler_mode
        .get_or_insert_with(|| DEFAULT_HANDLER_MODE.into());
    if let Some(w) = spec.workload.as_mut() {
        w.kind.get_or_insert_with(|| DEFAULT_WORKLOAD_KIND.into());
    }
}

fn default_policy(p: &mut RetryPolicy) {
    p.max_attempts.get_or_insert(DEFAULT_MAX_ATTEMPTS);
    p.backoff.get_or_insert_with(|| DEFAULT_BACKOFF.into());
    p.initial_interval
        .get_or_insert_with(|| DurationSpec::new(DEFAULT_INITIAL_INTERVAL));
    p.max_interval
        .get_or_insert_with(|| DurationSpec::new(DEFAULT_MAX_INTERVAL));
}

/// The runtime container of a workload template: the one named `asya-runtime`.
pub fn runtime_container(spec: &AsyncActorSpec) -> Option<&Container> {
    spec.workload
        .as_ref()?
        .template
        .as_ref()?
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == labels::RUNTIME_CONTAINER)
}

/// The handler: `spec.handler`, else the runtime container's `ASYA_HANDLER` value.
pub fn handler_of(spec: &AsyncActorSpec) -> Option<String> {
    spec.handler.clone().or_else(|| {
        runtime_container(spec)?
            .env
            .as_ref()?
            .iter()
            .find(|e| e.name == labels::ENV_HANDLER)?
            .value
            .clone()
    })
}

/// Everything a component needs to act on one actor, with flavors merged and defaults applied.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedActor {
    /// metadata.name of the AsyncActor.
    pub name: String,
    pub namespace: String,
    /// spec.actor (the queue is named after it).
    pub actor: String,
    pub queue: String,
    /// Transport name as configured in the cluster.
    pub transport: String,
    /// `rabbitmq` or `sqs`.
    pub transport_kind: String,
    /// The handler; `None` only in the workload shape when the image sets ASYA_HANDLER itself.
    pub handler: Option<String>,
    pub actor_timeout: Duration,
    /// Time to finish in-flight work on shutdown (`timeout.gracefulShutdown`), if set.
    pub graceful_shutdown: Option<Duration>,
    /// Names of the flavors merged in, in order.
    pub flavors: Vec<String>,
    /// Listed flavors that do not exist yet.
    pub missing_flavors: Vec<String>,
    /// The merged spec with every default applied; read env, resources, … from here.
    pub spec: AsyncActorSpec,
}

impl ResolvedActor {
    /// Builds the view from a merged, defaulted and validated spec. Returns `None` when the
    /// spec lacks what validation requires (call validation first to learn why).
    pub fn build(
        name: &str,
        namespace: &str,
        spec: AsyncActorSpec,
        config: &ClusterConfig,
        flavors: Vec<String>,
        missing: Vec<String>,
    ) -> Option<Self> {
        let actor = spec.actor_or(name);
        let transport = spec.transport_or(&config.default_transport);
        let transport_kind = config.transports.get(&transport)?.kind.clone();
        let resiliency = spec.resiliency.as_ref()?;
        let actor_timeout = resiliency.actor_timeout.as_ref()?.parse().ok()?;
        let graceful_shutdown = spec
            .timeout
            .as_ref()
            .and_then(|t| t.graceful_shutdown.as_ref())
            .and_then(|d| d.parse().ok());
        Some(Self {
            name: name.to_string(),
            namespace: namespace.to_string(),
            queue: naming::actor_queue(namespace, &actor),
            actor,
            transport,
            transport_kind,
            handler: handler_of(&spec),
            actor_timeout,
            graceful_shutdown,
            flavors,
            missing_flavors: missing,
            spec,
        })
    }

    pub fn scaling(&self) -> &Scaling {
        // apply_defaults always sets scaling; the fallback only guards hand-built values.
        static EMPTY: Scaling = Scaling {
            enabled: None,
            min_replica_count: None,
            max_replica_count: None,
            queue_length: None,
            polling_interval: None,
            cooldown_period: None,
            wake: None,
            min_replicas: None,
            max_replicas: None,
        };
        self.spec.scaling.as_ref().unwrap_or(&EMPTY)
    }

    pub fn scaling_enabled(&self) -> bool {
        self.scaling().enabled.unwrap_or(true)
    }

    /// Woken ahead of its envelopes by the routes that name it (docs/DESIGN.md §6.1): scaled
    /// by KEDA and not opted out (`scaling.wake: false`). The platform's `wake.enabled` is
    /// the other half of the rule; the provisioner asks both.
    pub fn wakes_ahead(&self) -> bool {
        self.scaling_enabled() && self.scaling().wake.unwrap_or(true)
    }

    /// Fixed replicas when scaling is off (`replicas`, else `workload.replicas`, else 1).
    pub fn fixed_replicas(&self) -> i32 {
        self.spec
            .replicas
            .or_else(|| self.spec.workload.as_ref().and_then(|w| w.replicas))
            .unwrap_or(1)
    }

    pub fn is_workload_shape(&self) -> bool {
        self.spec.workload.is_some()
    }

    /// `Deployment` or `StatefulSet`.
    pub fn workload_kind(&self) -> &str {
        self.spec
            .workload
            .as_ref()
            .and_then(|w| w.kind.as_deref())
            .unwrap_or(DEFAULT_WORKLOAD_KIND)
    }

    pub fn handler_mode(&self) -> &str {
        self.spec
            .handler_mode
            .as_deref()
            .unwrap_or(DEFAULT_HANDLER_MODE)
    }

    pub fn python_executable(&self) -> &str {
        self.spec
            .python_executable
            .as_deref()
            .unwrap_or(DEFAULT_PYTHON)
    }

    /// The resiliency settings with defaults, as the sidecar reads them (`ASYA_RESILIENCY`).
    pub fn resiliency_json(&self) -> String {
        serde_json::to_string(&self.spec.resiliency).unwrap_or_else(|_| "{}".into())
    }

    /// A short, stable digest of what the webhook injects into each pod from this actor and
    /// not from the pod template: the handler and its mode, the Python, the timeout and
    /// resiliency, the transport, the sidecar overrides. Put on the pod template, a change to
    /// any of them rolls the pods, which otherwise keep what they were injected with (a
    /// handler fixed in the AsyncActor would never reach a crash-looping pod).
    pub fn injection_digest(&self) -> String {
        let injected = serde_json::json!({
            "actor": self.actor,
            "transport": self.transport,
            "handler": self.handler,
            "handlerMode": self.handler_mode(),
            "pythonExecutable": self.python_executable(),
            "actorTimeoutSeconds": self.actor_timeout.as_secs(),
            "resiliency": self.resiliency_json(),
            "sidecar": self.spec.sidecar,
        });
        // FNV-1a: the same bytes give the same digest in every build and process.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in injected.to_string().bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("{h:016x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_injection_digest_follows_what_the_webhook_injects_only() {
        let cfg = ClusterConfig::default();
        let build = |v: serde_json::Value| {
            let mut s: AsyncActorSpec = serde_json::from_value(v).unwrap();
            apply_defaults(&mut s);
            ResolvedActor::build("a", "ns", s, &cfg, vec![], vec![]).unwrap()
        };
        let base = json!({"image": "i", "handler": "m.f", "scaling": {"maxReplicaCount": 3}});
        let d = build(base.clone()).injection_digest();
        assert_eq!(d.len(), 16);
        assert_eq!(d, build(base.clone()).injection_digest(), "stable");
        // Scaling and the image (already in the template) do not roll the pods through it.
        let mut same = base.clone();
        same["scaling"]["maxReplicaCount"] = json!(5);
        same["image"] = json!("j");
        assert_eq!(build(same).injection_digest(), d);
        for (k, v) in [
            ("handler", json!("m.g")),
            ("handlerMode", json!("envelope")),
            ("pythonExecutable", json!("python3.12")),
            ("resiliency", json!({"actorTimeout": "3s"})),
            ("sidecar", json!({"env": [{"name": "X", "value": "1"}]})),
        ] {
            let mut changed = base.clone();
            changed[k] = v;
            assert_ne!(build(changed).injection_digest(), d, "{k}");
        }
    }

    #[test]
    fn defaults_match_design() {
        let mut s: AsyncActorSpec = serde_json::from_value(
            json!({"image": "i", "handler": "m.f", "resiliency": {"policies": {"default": {}}}}),
        )
        .unwrap();
        apply_defaults(&mut s);
        let once = s.clone();
        apply_defaults(&mut s);
        assert_eq!(s, once, "defaulting is idempotent");
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            json!({
                "image": "i", "handler": "m.f", "imagePullPolicy": "IfNotPresent", "pythonExecutable": "python3", "handlerMode": "payload",
                "scaling": {"enabled": true, "minReplicaCount": 0, "maxReplicaCount": 10, "queueLength": 5, "pollingInterval": 30, "cooldownPeriod": 300, "wake": true},
                "resiliency": {"actorTimeout": "5m", "policies": {"default": {"maxAttempts": 3, "backoff": "exponential", "initialInterval": "1s", "maxInterval": "60s"}}}
            })
        );
    }

    #[test]
    fn woken_ahead_when_scaled_by_keda_and_not_opted_out() {
        let cfg = ClusterConfig::default();
        let wakes = |v: serde_json::Value| {
            let mut s: AsyncActorSpec = serde_json::from_value(v).unwrap();
            apply_defaults(&mut s);
            ResolvedActor::build("a", "ns", s, &cfg, vec![], vec![])
                .unwrap()
                .wakes_ahead()
        };
        assert!(wakes(json!({"image": "i", "handler": "m.f"})));
        assert!(!wakes(
            json!({"image": "i", "handler": "m.f", "scaling": {"wake": false}})
        ));
        assert!(!wakes(
            json!({"image": "i", "handler": "m.f", "scaling": {"enabled": false}})
        ));
    }

    #[test]
    fn handler_comes_from_the_workload_template() {
        let s: AsyncActorSpec = serde_json::from_value(json!({"workload": {"template": {"spec": {"containers": [
            {"name": "other", "image": "x"},
            {"name": "asya-runtime", "image": "y", "env": [{"name": "ASYA_HANDLER", "value": "pkg.mod.fn"}]}
        ]}}}})).unwrap();
        assert_eq!(handler_of(&s).as_deref(), Some("pkg.mod.fn"));
    }
}
