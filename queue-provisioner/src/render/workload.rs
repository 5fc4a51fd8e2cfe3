//! The actor's Deployment or StatefulSet, rendered from the flat spec or the workload
//! template. The pod carries the plain runtime container and the labels that make the
//! webhook inject the sidecar at pod creation.

use std::collections::BTreeMap;

use asya_api::ResolvedActor;
use asya_api::config::ClusterConfig;
use asya_api::labels;
use asya_api::naming;
use asya_api::restricted;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{
    Container, EnvFromSource, EnvVar, EnvVarSource, PodSpec, PodTemplateSpec, SecretEnvSource,
    SecretKeySelector,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};

/// Pod template annotation carrying the sidecar image: a new image changes the template, so
/// the workload rolls and the webhook injects the new sidecar.
pub const SIDECAR_IMAGE_ANNOTATION: &str = "asya.sh/sidecar-image";
/// Pod template annotation carrying [`ResolvedActor::injection_digest`]: what the webhook
/// injects from the AsyncActor (handler, timeout, resiliency, sidecar overrides, …) changes
/// the template, so the workload rolls and the new pods are injected with the new settings.
pub const INJECTION_DIGEST_ANNOTATION: &str = "asya.sh/injection-digest";
/// Extra time over `actorTimeout` a pod gets on termination: the sidecar's own shutdown.
pub const GRACE_MARGIN_SECONDS: i64 = 30;
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "asya-queue-provisioner");

/// Labels on every object owned by the actor: the actor's own labels plus ours.
pub fn owned_labels(
    actor: &ResolvedActor,
    actor_labels: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut l = actor_labels.clone();
    l.insert(labels::ACTOR.into(), actor.name.clone());
    l.insert(MANAGED_BY.0.into(), MANAGED_BY.1.into());
    l
}

/// The selector; only `asya.sh/actor`, because selectors are immutable and actor labels are not.
pub fn selector_labels(actor: &ResolvedActor) -> BTreeMap<String, String> {
    BTreeMap::from([(labels::ACTOR.to_string(), actor.name.clone())])
}

pub fn sidecar_image(actor: &ResolvedActor, config: &ClusterConfig) -> String {
    actor
        .spec
        .sidecar
        .as_ref()
        .and_then(|s| s.image.clone())
        .unwrap_or_else(|| config.sidecar.image.clone())
}

/// `terminationGracePeriodSeconds`: above actorTimeout, so a scale-in lets the handler finish.
pub fn grace_period(actor: &ResolvedActor) -> i64 {
    let extra = actor
        .graceful_shutdown
        .map(|d| d.as_secs() as i64)
        .unwrap_or(GRACE_MARGIN_SECONDS)
        .max(GRACE_MARGIN_SECONDS);
    actor.actor_timeout.as_secs() as i64 + extra
}

fn secret_env(actor: &ResolvedActor) -> (Vec<EnvVar>, Vec<EnvFromSource>) {
    let mut env = Vec::new();
    let mut env_from = Vec::new();
    for r in &actor.spec.secret_refs {
        let Some(name) = r.name.clone().or_else(|| r.secret_name.clone()) else {
            continue;
        };
        if r.keys.is_empty() {
            env_from.push(EnvFromSource {
                secret_ref: Some(SecretEnvSource {
                    name: name.clone(),
                    optional: None,
                }),
                ..Default::default()
            });
        }
        for k in &r.keys {
            env.push(EnvVar {
                name: k.env_var.clone().unwrap_or_else(|| k.key.clone()),
                value: None,
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: name.clone(),
                        key: k.key.clone(),
                        optional: None,
                    }),
                    ..Default::default()
                }),
            });
        }
    }
    (env, env_from)
}

/// The pod template: flat fields, or the user's template with our labels and settings laid on.
pub fn pod_template(
    actor: &ResolvedActor,
    actor_labels: &BTreeMap<String, String>,
    config: &ClusterConfig,
) -> PodTemplateSpec {
    let mut t = match actor
        .spec
        .workload
        .as_ref()
        .and_then(|w| w.template.clone())
    {
        Some(t) => t,
        None => flat_template(actor),
    };
    let meta = t.metadata.get_or_insert_with(ObjectMeta::default);
    let l = meta.labels.get_or_insert_with(BTreeMap::new);
    for (k, v) in actor_labels {
        l.entry(k.clone()).or_insert_with(|| v.clone());
    }
    l.insert(labels::INJECT.into(), "true".into());
    l.insert(labels::ACTOR.into(), actor.name.clone());
    let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(
        SIDECAR_IMAGE_ANNOTATION.into(),
        sidecar_image(actor, config),
    );
    annotations.insert(INJECTION_DIGEST_ANNOTATION.into(), actor.injection_digest());
    let spec = t.spec.get_or_insert_with(PodSpec::default);
    let grace = grace_period(actor);
    if spec
        .termination_grace_period_seconds
        .is_none_or(|g| g < grace)
    {
        spec.termination_grace_period_seconds = Some(grace);
    }
    if spec.service_account_name.is_none() {
        spec.service_account_name = Some(naming::service_account_name(&actor.name));
    }
    t
}

fn flat_template(actor: &ResolvedActor) -> PodTemplateSpec {
    let s = &actor.spec;
    let (mut env, env_from) = secret_env(actor);
    let mut all_env = s.env.clone();
    all_env.append(&mut env);
    let mut runtime = Container {
        name: labels::RUNTIME_CONTAINER.into(),
        image: s.image.clone(),
        image_pull_policy: s.image_pull_policy.clone(),
        env: (!all_env.is_empty()).then_some(all_env),
        env_from: (!env_from.is_empty()).then_some(env_from),
        resources: s.resources.clone(),
        volume_mounts: (!s.volume_mounts.is_empty()).then(|| s.volume_mounts.clone()),
        ..Default::default()
    };
    // Pod Security "restricted" (docs/DESIGN.md §5, §9). Every container of this pod is ours,
    // so the pod runs as the non-root uid of our images: a root image still starts (as that
    // uid) where `runAsNonRoot` alone would make the kubelet refuse it. The root filesystem
    // stays writable: a handler may write its own files.
    restricted::harden_container(&mut runtime.security_context);
    let mut security_context = None;
    restricted::harden_pod(&mut security_context);
    PodTemplateSpec {
        metadata: Some(ObjectMeta::default()),
        spec: Some(PodSpec {
            containers: vec![runtime],
            node_selector: (!s.node_selector.is_empty()).then(|| s.node_selector.clone()),
            tolerations: (!s.tolerations.is_empty()).then(|| s.tolerations.clone()),
            volumes: (!s.volumes.is_empty()).then(|| s.volumes.clone()),
            security_context,
            ..Default::default()
        }),
    }
}

fn meta(
    actor: &ResolvedActor,
    actor_labels: &BTreeMap<String, String>,
    owner: &OwnerReference,
) -> ObjectMeta {
    ObjectMeta {
        name: Some(naming::workload_name(&actor.name)),
        namespace: Some(actor.namespace.clone()),
        labels: Some(owned_labels(actor, actor_labels)),
        owner_references: Some(vec![owner.clone()]),
        ..Default::default()
    }
}

/// Replicas we own: fixed when scaling is off; left to KEDA's HPA otherwise.
fn replicas(actor: &ResolvedActor) -> Option<i32> {
    (!actor.scaling_enabled()).then(|| actor.fixed_replicas())
}

pub fn deployment(
    actor: &ResolvedActor,
    actor_labels: &BTreeMap<String, String>,
    owner: &OwnerReference,
    config: &ClusterConfig,
) -> Deployment {
    Deployment {
        metadata: meta(actor, actor_labels, owner),
        spec: Some(DeploymentSpec {
            replicas: replicas(actor),
            selector: LabelSelector {
                match_labels: Some(selector_labels(actor)),
                ..Default::default()
            },
            template: pod_template(actor, actor_labels, config),
            ..Default::default()
        }),
        status: None,
    }
}

pub fn stateful_set(
    actor: &ResolvedActor,
    actor_labels: &BTreeMap<String, String>,
    owner: &OwnerReference,
    config: &ClusterConfig,
) -> StatefulSet {
    let claims = actor
        .spec
        .workload
        .as_ref()
        .map(|w| w.volume_claim_templates.clone())
        .unwrap_or_default();
    StatefulSet {
        metadata: meta(actor, actor_labels, owner),
        spec: Some(StatefulSetSpec {
            replicas: replicas(actor),
            service_name: Some(actor.name.clone()),
            // Queue workers have no identity order to respect; start them all at once.
            pod_management_policy: Some("Parallel".into()),
            selector: LabelSelector {
                match_labels: Some(selector_labels(actor)),
                ..Default::default()
            },
            template: pod_template(actor, actor_labels, config),
            volume_claim_templates: (!claims.is_empty()).then_some(claims),
            ..Default::default()
        }),
        status: None,
    }
}
