//! The parts of a pod that injection may change, taken out of the pod: [`super::inject`]
//! works on this, so it cannot touch anything else, and the admission's JSON patch, which
//! compares two of these ([`crate::patch::injection_patch`]), is the whole pod's diff by
//! construction.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, Volume};

/// `metadata.annotations`, `spec.volumes`, `spec.initContainers` and `spec.containers`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InjectedPod {
    pub annotations: Option<BTreeMap<String, String>>,
    pub volumes: Option<Vec<Volume>>,
    pub init_containers: Option<Vec<Container>>,
    pub containers: Vec<Container>,
    /// Read, never written back: whether the pod's own `securityContext` runs it as root
    /// (`runAsUser: 0`). The containers we add are non-root, so they then name their uid.
    pub pod_runs_as_root: bool,
}

impl InjectedPod {
    /// Copies of the parts; `None` when the pod has no spec (nothing to inject into).
    pub fn cloned(pod: &Pod) -> Option<Self> {
        let spec = pod.spec.as_ref()?;
        Some(InjectedPod {
            annotations: pod.metadata.annotations.clone(),
            volumes: spec.volumes.clone(),
            init_containers: spec.init_containers.clone(),
            containers: spec.containers.clone(),
            pod_runs_as_root: runs_as_root(spec),
        })
    }

    /// Takes the parts out, or `None` (nothing taken) when the pod has no spec.
    pub fn take(pod: &mut Pod) -> Option<Self> {
        let spec = pod.spec.as_mut()?;
        let pod_runs_as_root = runs_as_root(spec);
        Some(InjectedPod {
            annotations: pod.metadata.annotations.take(),
            volumes: spec.volumes.take(),
            init_containers: spec.init_containers.take(),
            containers: std::mem::take(&mut spec.containers),
            pod_runs_as_root,
        })
    }

    /// Puts the parts back into a pod (the one they were taken from).
    pub fn put_back(self, pod: &mut Pod) {
        pod.metadata.annotations = self.annotations;
        let spec = pod.spec.get_or_insert_default();
        spec.volumes = self.volumes;
        spec.init_containers = self.init_containers;
        spec.containers = self.containers;
    }

    /// Whether the pod carries the injection marker.
    pub fn is_injected(&self) -> bool {
        super::has_marker(self.annotations.as_ref())
    }
}

fn runs_as_root(spec: &PodSpec) -> bool {
    spec.security_context.as_ref().and_then(|s| s.run_as_user) == Some(0)
}
