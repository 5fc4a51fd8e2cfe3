//! Platform policy checks that need no cluster access (docs/DESIGN.md §7). Each rejection names
//! the policy and how to change it.

use k8s_openapi::api::core::v1::ResourceRequirements;

use crate::config::Policy;
use crate::error::{FieldError, FieldErrors};
use crate::resolved::runtime_container;
use crate::types::AsyncActorSpec;

/// Expands Docker Hub short names (`python:3.11` → `docker.io/library/python:3.11`) so registry
/// prefixes compare the way the container runtime resolves them.
pub fn canonical_image(image: &str) -> String {
    let first = image.split('/').next().unwrap_or("");
    let has_registry =
        image.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    if has_registry {
        image.to_string()
    } else if image.contains('/') {
        format!("docker.io/{image}")
    } else {
        format!("docker.io/library/{image}")
    }
}

/// Whether `image` comes from one of `allowed` (`ghcr.io/myorg` allows `ghcr.io/myorg/x:1`,
/// not `ghcr.io/myorgevil/x`). An empty list allows everything.
pub fn image_allowed(image: &str, allowed: &[String]) -> bool {
    if allowed.is_empty() {
        return true;
    }
    let image = canonical_image(image);
    allowed.iter().any(|entry| {
        let entry = entry.trim_end_matches('/');
        image == entry
            || image.strip_prefix(entry).is_some_and(|rest| {
                rest.starts_with('/') || rest.starts_with(':') || rest.starts_with('@')
            })
    })
}

/// Every image the actor would run, with its field path.
fn images(spec: &AsyncActorSpec) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(i) = &spec.image {
        out.push(("spec.image".into(), i.clone()));
    }
    if let Some(i) = spec.sidecar.as_ref().and_then(|s| s.image.as_ref()) {
        out.push(("spec.sidecar.image".into(), i.clone()));
    }
    for (n, p) in spec.state_proxy.iter().enumerate() {
        if let Some(c) = &p.connector {
            out.push((
                format!("spec.stateProxy[{n}].connector.image"),
                c.image.clone(),
            ));
        }
    }
    if let Some(pod) = spec
        .workload
        .as_ref()
        .and_then(|w| w.template.as_ref())
        .and_then(|t| t.spec.as_ref())
    {
        for (n, c) in pod.containers.iter().enumerate() {
            if let Some(i) = &c.image {
                out.push((
                    format!("spec.workload.template.spec.containers[{n}].image"),
                    i.clone(),
                ));
            }
        }
        for (n, c) in pod.init_containers.iter().flatten().enumerate() {
            if let Some(i) = &c.image {
                out.push((
                    format!("spec.workload.template.spec.initContainers[{n}].image"),
                    i.clone(),
                ));
            }
        }
    }
    out
}

fn has_limits(r: Option<&ResourceRequirements>) -> (bool, bool) {
    let limits = r.and_then(|r| r.limits.as_ref());
    (
        limits.is_some_and(|l| l.contains_key("cpu")),
        limits.is_some_and(|l| l.contains_key("memory")),
    )
}

/// Checks the effective spec of an actor in `namespace` against the policy.
pub fn check(spec: &AsyncActorSpec, namespace: &str, policy: &Policy) -> FieldErrors {
    let mut errs = FieldErrors::default();

    for (path, image) in images(spec) {
        if !image_allowed(&image, &policy.allowed_registries) {
            errs.push(FieldError::forbidden(
                path,
                format!(
                    "image {image:?} is not from an allowed registry (policy allowedRegistries: {}); use an image from one of them, or ask a cluster admin to add its registry to policy.allowedRegistries",
                    policy.allowed_registries.join(", ")
                ),
            ));
        }
    }

    if !policy.allow_cross_namespace_secret_refs {
        for (i, r) in spec.secret_refs.iter().enumerate() {
            if let Some(ns) = r.namespace.as_deref().filter(|ns| *ns != namespace) {
                errs.push(FieldError::forbidden(
                    format!("spec.secretRefs[{i}].namespace"),
                    format!(
                        "secret in namespace {ns:?} is outside the actor's namespace {namespace:?} (policy allowCrossNamespaceSecretRefs is off); copy the secret into {namespace:?}, or ask a cluster admin to set policy.allowCrossNamespaceSecretRefs"
                    ),
                ));
            }
        }
    }

    if policy.require_resource_limits {
        let (path, resources) = match runtime_container(spec) {
            Some(c) if spec.resources.is_none() => (
                "spec.workload.template.spec.containers[asya-runtime].resources.limits",
                c.resources.as_ref(),
            ),
            _ => ("spec.resources.limits", spec.resources.as_ref()),
        };
        let (cpu, memory) = has_limits(resources);
        let missing: Vec<&str> = [("cpu", cpu), ("memory", memory)]
            .iter()
            .filter(|(_, ok)| !ok)
            .map(|(n, _)| *n)
            .collect();
        if !missing.is_empty() {
            errs.push(FieldError::required(
                path,
                format!(
                    "{} limit required by policy requireResourceLimits; set it inline or through a flavor, or ask a cluster admin to turn policy.requireResourceLimits off",
                    missing.join(" and ")
                ),
            ));
        }
    }

    let ceiling = policy.max_replicas;
    let counts = [
        (
            "spec.scaling.maxReplicaCount",
            spec.scaling.as_ref().and_then(|s| s.max_replica_count),
        ),
        ("spec.replicas", spec.replicas),
        (
            "spec.workload.replicas",
            spec.workload.as_ref().and_then(|w| w.replicas),
        ),
    ];
    for (path, value) in counts {
        if let Some(v) = value.filter(|v| *v > ceiling) {
            errs.push(FieldError::invalid(
                path,
                v,
                format!("exceeds the replica ceiling {ceiling} of policy maxReplicas; lower it, or ask a cluster admin to raise policy.maxReplicas"),
            ));
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn registry_prefixes() {
        let allowed = vec![
            "ghcr.io/myorg".to_string(),
            "docker.io/library/".to_string(),
        ];
        assert!(image_allowed("ghcr.io/myorg/x:1", &allowed));
        assert!(image_allowed("python:3.11", &allowed));
        assert!(!image_allowed("ghcr.io/myorgevil/x:1", &allowed));
        assert!(!image_allowed("quay.io/x/y", &allowed));
        assert!(!image_allowed("someone/image", &allowed));
        assert!(image_allowed("anything", &[]));
        assert_eq!(canonical_image("localhost:5000/a"), "localhost:5000/a");
    }

    fn spec(v: serde_json::Value) -> AsyncActorSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn cross_namespace_secret_is_denied_by_default() {
        let s = spec(
            json!({"secretRefs": [{"name": "a", "namespace": "prod"}, {"name": "b", "namespace": "other"}]}),
        );
        let errs = check(&s, "prod", &Policy::default());
        assert_eq!(errs.len(), 1);
        assert!(errs.to_string().starts_with(r#"spec.secretRefs[1].namespace: Forbidden: secret in namespace "other" is outside the actor's namespace "prod" (policy allowCrossNamespaceSecretRefs is off)"#), "{errs}");
        let open = Policy {
            allow_cross_namespace_secret_refs: true,
            ..Policy::default()
        };
        assert!(check(&s, "prod", &open).is_empty());
    }

    #[test]
    fn registries_limits_and_ceiling() {
        let policy = Policy {
            allowed_registries: vec!["ghcr.io/myorg".into()],
            require_resource_limits: true,
            max_replicas: 20,
            ..Policy::default()
        };
        let s = spec(
            json!({"image": "docker.io/evil/x:1", "resources": {"limits": {"cpu": "1"}}, "scaling": {"maxReplicaCount": 50}}),
        );
        let text = check(&s, "ns", &policy).to_string();
        assert!(text.contains(r#"spec.image: Forbidden: image "docker.io/evil/x:1" is not from an allowed registry (policy allowedRegistries: ghcr.io/myorg)"#), "{text}");
        assert!(text.contains("spec.resources.limits: Required value: memory limit required by policy requireResourceLimits"), "{text}");
        assert!(text.contains("spec.scaling.maxReplicaCount: Invalid value: 50: exceeds the replica ceiling 20 of policy maxReplicas"), "{text}");
        let ok = spec(
            json!({"image": "ghcr.io/myorg/x:1", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}, "scaling": {"maxReplicaCount": 20}}),
        );
        assert!(check(&ok, "ns", &policy).is_empty());
    }
}
