//! What the watches keep and pass on: a watch event is worth a reconcile only when it changes
//! something the reconcile reads (the fingerprints), and a cache keeps of each object only
//! what the reconcile reads (the slim forms). Also how the reconcile reads a cached
//! workload's counts. Pure; the watches themselves are wired in `controller`.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use asya_api::AsyncActor;
use asya_api::flavor::FlavorMapGate;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Container, ContainerStatus, Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::DynamicObject;
use kube::runtime::watcher;

use crate::status::{classify_pod, needs_replacing};

pub(crate) fn hash_of(v: &impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

/// What of an actor the reconcile renders from: spec (generation), labels (propagated),
/// annotations (a user's `kubectl annotate` asks for a fresh status), deletion. Not status
/// and not finalizers: those are the controller's own writes.
pub fn actor_fingerprint(a: &AsyncActor) -> Option<u64> {
    let m = &a.metadata;
    Some(hash_of(&(
        m.generation,
        &m.labels,
        &m.annotations,
        m.deletion_timestamp.is_some(),
    )))
}

/// (spec.replicas, status.readyReplicas): what the status reads of a workload.
pub fn deployment_counts(d: &Deployment) -> (Option<i32>, Option<i32>) {
    let replicas = d.spec.as_ref().and_then(|s| s.replicas);
    (replicas, d.status.as_ref().and_then(|s| s.ready_replicas))
}

pub fn stateful_set_counts(s: &StatefulSet) -> (Option<i32>, Option<i32>) {
    let replicas = s.spec.as_ref().and_then(|s| s.replicas);
    (replicas, s.status.as_ref().and_then(|s| s.ready_replicas))
}

/// Why the Deployment's pods cannot be created, while they cannot: its `ReplicaFailure`
/// condition, which the controller manager copies from the ReplicaSet whose pod creates the
/// API server refuses (an admission webhook down or refusing, a quota, pod security).
pub fn deployment_failure(d: &Deployment) -> Option<String> {
    d.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "ReplicaFailure" && c.status == "True")
        .map(|c| match c.message.as_deref() {
            Some(m) if !m.is_empty() => m.to_string(),
            _ => c.reason.clone().unwrap_or_else(|| "ReplicaFailure".into()),
        })
}

/// What of a workload matters: its spec (generation: also a foreign edit to undo), the
/// counts the status reads, deletion. Not the controller manager's other status writes.
pub fn workload_fingerprint(
    meta: &ObjectMeta,
    counts: (Option<i32>, Option<i32>),
    failure: Option<String>,
) -> Option<u64> {
    Some(hash_of(&(
        meta.generation,
        counts,
        meta.deletion_timestamp.is_some(),
        failure,
    )))
}

pub fn deployment_fingerprint(d: &Deployment) -> Option<u64> {
    workload_fingerprint(&d.metadata, deployment_counts(d), deployment_failure(d))
}

pub fn stateful_set_fingerprint(s: &StatefulSet) -> Option<u64> {
    workload_fingerprint(&s.metadata, stateful_set_counts(s), None)
}

/// A ScaledObject matters when its spec changes (someone else's edit) or it goes.
pub fn scaled_object_fingerprint(o: &DynamicObject) -> Option<u64> {
    Some(hash_of(&(
        o.metadata.generation,
        o.metadata.deletion_timestamp.is_some(),
    )))
}

/// A pod matters to its actor through what the status counts (ready, pending, failing and
/// why, gone) and whether it lacks the sidecar.
pub fn pod_fingerprint(p: &Pod) -> Option<u64> {
    Some(hash_of(&(
        format!("{:?}", classify_pod(p)),
        needs_replacing(p),
    )))
}

/// An HPA matters through the replica count it wants.
pub fn hpa_fingerprint(h: &HorizontalPodAutoscaler) -> Option<u64> {
    Some(hash_of(&h.status.as_ref().map(|s| s.desired_replicas)))
}

// What the caches keep. A cache holds every managed object of its kind in the cluster, and
// the reconcile reads only metadata (the applied hash, generation), the replica counts and
// the HPA's desired count: the rest (a Deployment's pod template is most of its size) is
// dropped as it arrives. At 1,000 actors that is the provisioner's memory (107 MiB before).

/// An AsyncActor as the cache keeps it: all the reconcile reads (spec, status, labels,
/// annotations, finalizers, deletion), without managed fields and kubectl's last-applied
/// copy of the spec, which made most of a cached actor.
pub fn slim_actor(a: &mut AsyncActor) {
    asya_api::labels::drop_bookkeeping(&mut a.metadata);
}

/// A workload as the cache keeps it: no pod template, and of the status conditions only a
/// `ReplicaFailure` that holds (rare, and what the actor's status reports).
pub fn slim_deployment(d: &mut Deployment) {
    d.metadata.managed_fields = None;
    if let Some(spec) = d.spec.as_mut() {
        spec.template = Default::default();
    }
    if let Some(st) = d.status.as_mut() {
        st.conditions = st
            .conditions
            .take()
            .map(|cs| {
                cs.into_iter()
                    .filter(|c| c.type_ == "ReplicaFailure" && c.status == "True")
                    .collect::<Vec<_>>()
            })
            .filter(|cs| !cs.is_empty());
    }
}

pub fn slim_stateful_set(s: &mut StatefulSet) {
    s.metadata.managed_fields = None;
    if let Some(spec) = s.spec.as_mut() {
        spec.template = Default::default();
        spec.volume_claim_templates = None;
    }
    if let Some(st) = s.status.as_mut() {
        st.conditions = None;
    }
}

/// A pod as the cache keeps it: what [`classify_pod`] and [`needs_replacing`] read. The cache
/// holds every labelled pod in the cluster, and an injected pod's spec (the sidecar's env,
/// probes, volumes) is most of its size: of it only the containers' names stay. A pod
/// without the sidecar keeps its spec and annotations, which the injection probe copies.
pub fn slim_pod(p: &mut Pod) {
    p.metadata.managed_fields = None;
    if !needs_replacing(p) {
        p.metadata.annotations = p.metadata.annotations.take().map(|a| {
            a.into_iter()
                .filter(|(k, _)| k.starts_with("asya.sh/"))
                .collect()
        });
        if let Some(spec) = p.spec.as_mut() {
            let names = |cs: &[Container]| -> Vec<Container> {
                cs.iter()
                    .map(|c| Container {
                        name: c.name.clone(),
                        ..Default::default()
                    })
                    .collect()
            };
            *spec = PodSpec {
                containers: names(&spec.containers),
                init_containers: spec.init_containers.as_deref().map(names),
                ..Default::default()
            };
        }
    }
    if let Some(st) = p.status.as_mut() {
        let states = |cs: Option<Vec<ContainerStatus>>| {
            cs.map(|cs| {
                cs.into_iter()
                    .map(|c| ContainerStatus {
                        name: c.name,
                        ready: c.ready,
                        restart_count: c.restart_count,
                        started: c.started,
                        state: c.state,
                        last_state: c.last_state,
                        ..Default::default()
                    })
                    .collect()
            })
        };
        *st = PodStatus {
            phase: st.phase.take(),
            conditions: st
                .conditions
                .take()
                .map(|cs| cs.into_iter().filter(|c| c.type_ == "Ready").collect()),
            container_statuses: states(st.container_statuses.take()),
            init_container_statuses: states(st.init_container_statuses.take()),
            ..Default::default()
        };
    }
}

/// KEDA's HPA as the cache keeps it: labels (which actor) and the desired count.
pub fn slim_hpa(h: &mut HorizontalPodAutoscaler) {
    h.metadata.managed_fields = None;
    h.spec = None;
    if let Some(st) = h.status.as_mut() {
        st.conditions = None;
        st.current_metrics = None;
    }
}

/// A ScaledObject as the cache keeps it: metadata only (what we applied is in its hash).
pub fn slim_scaled_object(o: &mut DynamicObject) {
    o.metadata.managed_fields = None;
    o.data = serde_json::Value::Null;
}

/// Passes a flavor ConfigMap watch event through the gate, which slims the object and drops
/// a flavor over the bounds (a fresh list frees every place; asya_api::flavor::bounds).
pub fn bound_flavor_map(
    gate: &mut FlavorMapGate,
    ev: watcher::Event<ConfigMap>,
) -> watcher::Event<ConfigMap> {
    use watcher::Event;
    match ev {
        Event::Init => {
            gate.restart();
            Event::Init
        }
        Event::InitApply(mut cm) => {
            gate.applied(&mut cm);
            Event::InitApply(cm)
        }
        Event::Apply(mut cm) => {
            gate.applied(&mut cm);
            Event::Apply(cm)
        }
        Event::Delete(mut cm) => {
            gate.deleted(&mut cm);
            Event::Delete(cm)
        }
        Event::InitDone => Event::InitDone,
    }
}

/// Labels of a cached object, for lookups by actor.
pub fn label<'a>(labels: &'a Option<BTreeMap<String, String>>, key: &str) -> Option<&'a str> {
    labels.as_ref()?.get(key).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An injected pod as the API server stores it (abridged only in repeated env).
    fn injected_pod(ready: bool, runtime_state: serde_json::Value) -> Pod {
        let env: Vec<_> = (0..12)
            .map(|i| serde_json::json!({"name": format!("ASYA_SETTING_{i}"), "value": "x".repeat(40)}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a-1", "namespace": "n",
                         "labels": {"asya.sh/inject": "true", "asya.sh/actor": "a", "pod-template-hash": "5d"},
                         "annotations": {"asya.sh/injected": "img", "kubectl.kubernetes.io/restartedAt": "t"},
                         "managedFields": [{"manager": "kubelet"}]},
            "spec": {"initContainers": [
                        {"name": "asya-install-runtime", "image": "s", "args": ["install-runtime", "/opt/asya"]},
                        {"name": "asya-sidecar", "image": "s", "restartPolicy": "Always", "env": env,
                         "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}}}],
                     "containers": [{"name": "asya-runtime", "image": "h", "env": env,
                                     "command": ["python3", "/opt/asya/asya_runtime.py"]}],
                     "volumes": [{"name": "asya-socket", "emptyDir": {}}],
                     "nodeName": "node", "tolerations": [{"key": "k", "operator": "Exists"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1", "qosClass": "Burstable",
                       "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}},
                                      {"type": "PodScheduled", "status": "True"}],
                       "initContainerStatuses": [
                           {"name": "asya-sidecar", "ready": ready, "restartCount": 0, "image": "s", "imageID": "sha256:1",
                            "containerID": "containerd://1", "started": true, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}],
                       "containerStatuses": [
                           {"name": "asya-runtime", "ready": ready, "restartCount": 3, "image": "h", "imageID": "sha256:2",
                            "state": runtime_state,
                            "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}
        }))
        .unwrap()
    }

    #[test]
    fn the_slim_pod_classifies_as_the_whole_one_at_a_fraction_of_its_size() {
        let running = serde_json::json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}});
        let crash = serde_json::json!({"waiting": {"reason": "CrashLoopBackOff"}});
        let mut bare = injected_pod(true, running.clone());
        bare.metadata.annotations = None;
        let spec = bare.spec.as_mut().unwrap();
        spec.init_containers = None;
        for p in [
            injected_pod(true, running.clone()),
            injected_pod(false, running),
            injected_pod(false, crash),
            bare.clone(),
        ] {
            let mut slim = p.clone();
            slim_pod(&mut slim);
            assert_eq!(classify_pod(&slim), classify_pod(&p));
            assert_eq!(needs_replacing(&slim), needs_replacing(&p));
            assert_eq!(pod_fingerprint(&slim), pod_fingerprint(&p));
            assert_eq!(slim.metadata.labels, p.metadata.labels);
            assert!(slim.metadata.managed_fields.is_none());
        }
        let full = injected_pod(true, serde_json::json!({"running": {}}));
        let mut slim = full.clone();
        slim_pod(&mut slim);
        let size = |p: &Pod| serde_json::to_vec(p).unwrap().len();
        assert!(
            size(&slim) * 4 < size(&full),
            "{} of {} bytes",
            size(&slim),
            size(&full)
        );
        // A pod the probe may copy keeps what it copies.
        let mut kept = bare.clone();
        slim_pod(&mut kept);
        assert!(needs_replacing(&bare));
        assert_eq!(kept.spec, bare.spec);
        assert_eq!(kept.metadata.annotations, bare.metadata.annotations);
    }

    #[test]
    fn the_cached_actor_has_no_managed_fields_nor_last_applied_copy() {
        let spec = serde_json::json!({"image": "i", "handler": "m.f", "env": [{"name": "A", "value": "x".repeat(2000)}]});
        let mut a: AsyncActor = serde_json::from_value(serde_json::json!({
            "apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
            "metadata": {"name": "echo", "namespace": "ns", "uid": "u", "generation": 3,
                         "labels": {"team": "a"},
                         "annotations": {"asya.sh/skip-cleanup": "true",
                                         "kubectl.kubernetes.io/last-applied-configuration": serde_json::to_string(&spec).unwrap()},
                         "finalizers": ["asya.sh/queue-provisioner"],
                         "deletionTimestamp": "2026-01-01T00:00:00Z",
                         "managedFields": [{"manager": "kubectl", "operation": "Apply",
                                            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:env": {}}}}]},
            "spec": spec,
            "status": {"phase": "Running"}
        }))
        .unwrap();
        let full = a.clone();
        slim_actor(&mut a);
        assert!(a.metadata.managed_fields.is_none());
        let annotations = a.metadata.annotations.clone().unwrap();
        assert!(!annotations.contains_key(asya_api::labels::LAST_APPLIED));
        // What the reconcile reads stays.
        assert_eq!(
            annotations.get("asya.sh/skip-cleanup").map(String::as_str),
            Some("true")
        );
        assert_eq!(a.metadata.labels, full.metadata.labels);
        assert_eq!(a.metadata.finalizers, full.metadata.finalizers);
        assert_eq!(
            a.metadata.deletion_timestamp,
            full.metadata.deletion_timestamp
        );
        assert_eq!(
            (&a.metadata.uid, a.metadata.generation),
            (&full.metadata.uid, full.metadata.generation)
        );
        assert_eq!(
            serde_json::to_value(&a.spec).unwrap(),
            serde_json::to_value(&full.spec).unwrap()
        );
        assert_eq!(
            serde_json::to_value(&a.status).unwrap(),
            serde_json::to_value(&full.status).unwrap()
        );
        let size = |a: &AsyncActor| serde_json::to_vec(a).unwrap().len();
        assert!(
            size(&a) * 3 < size(&full) * 2,
            "{} of {} bytes",
            size(&a),
            size(&full)
        );
        // An actor whose only annotation was the copy keeps none.
        let mut b = full.clone();
        b.metadata.annotations =
            Some([(asya_api::labels::LAST_APPLIED.to_string(), "{}".to_string())].into());
        slim_actor(&mut b);
        assert!(b.metadata.annotations.is_none());
    }

    #[test]
    fn slim_caches_keep_what_the_reconcile_reads() {
        let d: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "generation": 3, "annotations": {"asya.sh/applied-hash": "7"},
                         "managedFields": [{"manager": "x"}]},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"a": "b"}},
                     "template": {"spec": {"containers": [{"name": "asya-runtime", "image": "i"}]}}},
            "status": {"readyReplicas": 1, "conditions": [{"type": "Available", "status": "True"}]}
        }))
        .unwrap();
        let (counts, fp) = (deployment_counts(&d), deployment_fingerprint(&d));
        let mut slim = d.clone();
        slim_deployment(&mut slim);
        assert_eq!(deployment_counts(&slim), counts);
        assert_eq!(deployment_fingerprint(&slim), fp);
        assert_eq!(slim.metadata.annotations, d.metadata.annotations);
        assert_eq!(slim.metadata.generation, Some(3));
        assert!(slim.metadata.managed_fields.is_none());
        assert!(slim.spec.as_ref().unwrap().template.spec.is_none());

        let h: HorizontalPodAutoscaler = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "keda-hpa-a", "labels": {"scaledobject.keda.sh/name": "a"}},
            "spec": {"maxReplicas": 3, "scaleTargetRef": {"kind": "Deployment", "name": "a"}},
            "status": {"desiredReplicas": 2, "currentReplicas": 1,
                       "conditions": [{"type": "AbleToScale", "status": "True"}]}
        }))
        .unwrap();
        let fp = hpa_fingerprint(&h);
        let mut slim = h.clone();
        slim_hpa(&mut slim);
        assert_eq!(hpa_fingerprint(&slim), fp);
        assert_eq!(slim.metadata.labels, h.metadata.labels);
        assert!(slim.spec.is_none());

        let mut o: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": {"name": "a", "generation": 4}, "spec": {"maxReplicaCount": 3}
        }))
        .unwrap();
        let fp = scaled_object_fingerprint(&o);
        slim_scaled_object(&mut o);
        assert_eq!(scaled_object_fingerprint(&o), fp);
        assert_eq!(o.data, serde_json::Value::Null);
    }
    #[test]
    fn the_flavor_map_cache_keeps_only_the_flavor_key_within_the_bounds() {
        let cm = |name: &str, flavor: &str| -> ConfigMap {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "n", "labels": {"asya.sh/flavor": name},
                             "managedFields": [{"manager": "kubectl"}]},
                "data": {"flavor.yaml": flavor, "other": "x".repeat(50_000)}
            }))
            .unwrap()
        };
        let mut gate = FlavorMapGate::new(asya_api::config::FlavorLimits {
            max_bytes: 16,
            max_per_namespace: 1,
            max_total: 1,
        });
        let mut w = kube::runtime::reflector::store::Writer::<ConfigMap>::new(());
        for ev in [
            watcher::Event::Init,
            watcher::Event::InitApply(cm("a", "env: []")),
            watcher::Event::InitApply(cm("b", "env: []")),
            watcher::Event::InitApply(cm("c", &"y".repeat(17))),
            watcher::Event::InitDone,
        ] {
            w.apply_watcher_event(&bound_flavor_map(&mut gate, ev));
        }
        let kept: Vec<_> = w
            .as_reader()
            .state()
            .iter()
            .map(|c| {
                let keys: Vec<String> = c.data.iter().flat_map(|d| d.keys().cloned()).collect();
                (c.metadata.name.clone().unwrap(), keys)
            })
            .collect::<std::collections::BTreeMap<_, _>>()
            .into_iter()
            .collect();
        assert_eq!(
            kept,
            [
                ("a".to_string(), vec!["flavor.yaml".to_string()]),
                ("b".to_string(), vec![]),
                ("c".to_string(), vec![]),
            ]
        );
        for c in w.as_reader().state() {
            assert!(c.metadata.managed_fields.is_none());
        }
    }

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn actor() -> AsyncActor {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
            "metadata": {"name": "a", "namespace": "n", "generation": 1, "labels": {"team": "x"}},
            "spec": {"image": "i", "handler": "m.f"}
        }))
        .unwrap()
    }

    #[test]
    fn own_writes_to_an_actor_do_not_change_its_fingerprint() {
        let a = actor();
        let mut b = a.clone();
        b.status = Some(asya_api::AsyncActorStatus {
            phase: Some("Running".into()),
            ..Default::default()
        });
        b.metadata.finalizers = Some(vec!["asya.sh/queue-provisioner".into()]);
        b.metadata.resource_version = Some("42".into());
        assert_eq!(actor_fingerprint(&a), actor_fingerprint(&b));
    }

    #[test]
    fn spec_labels_annotations_and_deletion_change_an_actors_fingerprint() {
        let a = actor();
        let mut spec = a.clone();
        spec.metadata.generation = Some(2);
        let mut labels = a.clone();
        labels.metadata.labels = Some([("team".into(), "y".into())].into());
        let mut ann = a.clone();
        ann.metadata.annotations = Some([("poke".into(), "1".into())].into());
        let mut del = a.clone();
        del.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        for other in [spec, labels, ann, del] {
            assert_ne!(actor_fingerprint(&a), actor_fingerprint(&other));
        }
    }

    #[test]
    fn a_workloads_fingerprint_follows_replicas_readiness_and_a_failure_to_create_only() {
        let meta = |generation| ObjectMeta {
            generation: Some(generation),
            resource_version: Some("1".into()),
            ..Default::default()
        };
        let base = workload_fingerprint(&meta(1), (Some(1), None), None);
        let mut other_rv = meta(1);
        other_rv.resource_version = Some("2".into());
        assert_eq!(base, workload_fingerprint(&other_rv, (Some(1), None), None));
        assert_ne!(
            base,
            workload_fingerprint(&meta(1), (Some(1), Some(1)), None)
        );
        assert_ne!(base, workload_fingerprint(&meta(1), (Some(3), None), None));
        assert_ne!(base, workload_fingerprint(&meta(2), (Some(1), None), None));
        let refused = Some("webhook down".to_string());
        assert_ne!(
            base,
            workload_fingerprint(&meta(1), (Some(1), None), refused)
        );
        let mut deleting = meta(1);
        deleting.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        assert_ne!(base, workload_fingerprint(&deleting, (Some(1), None), None));
    }

    #[test]
    fn the_slim_deployment_keeps_a_replica_failure_and_no_other_condition() {
        let mut d: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a"},
            "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}},
            "status": {"readyReplicas": 1, "conditions": [
                {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
                {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                 "message": "admission webhook \"pods.inject.asya.sh\" denied the request"}]}
        }))
        .unwrap();
        slim_deployment(&mut d);
        assert_eq!(
            deployment_failure(&d).as_deref(),
            Some("admission webhook \"pods.inject.asya.sh\" denied the request")
        );
        assert_eq!(
            d.status
                .as_ref()
                .unwrap()
                .conditions
                .as_ref()
                .unwrap()
                .len(),
            1
        );
        assert_eq!(deployment_counts(&d), (None, Some(1)));
        // A cleared failure (status False) is dropped with the rest.
        let conds = d.status.as_mut().unwrap().conditions.as_mut().unwrap();
        conds[0].status = "False".into();
        slim_deployment(&mut d);
        assert_eq!(deployment_failure(&d), None);
        assert_eq!(d.status.as_ref().unwrap().conditions, None);
    }
}
