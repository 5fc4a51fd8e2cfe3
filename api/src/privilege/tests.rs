//! What makes an actor's pod privileged (`privilege.rs`), in the flat and the workload shape:
//! hostPath, host namespaces, privileged containers, capabilities, another ServiceAccount,
//! the rest of baseline; a privilege from a flavor names the flavor; the namespace's level.

use serde_json::{Value, json};

use super::*;
use crate::config::ClusterConfig;
use crate::flavor::{FlavorCatalog, FlavorDef, FlavorSource};
use crate::review::{ReviewRequest, review_actor_decision};

/// The rendered pod and flavor origins of an actor in namespace `team`, through the whole
/// admission review (flavors merged, defaults applied).
fn render_with(spec: Value, flavors: &[(&str, Value)]) -> (RenderedPod, Origins) {
    let mut catalog = FlavorCatalog::new();
    for (name, data) in flavors {
        catalog.insert(FlavorDef::from_data(name, FlavorSource::Flavor, data));
    }
    let config = ClusterConfig::default();
    let object = json!({"metadata": {"name": "a", "namespace": "team"}, "spec": spec});
    let review = review_actor_decision(&ReviewRequest {
        object: &object,
        old_object: None,
        namespace: None,
        catalog: &catalog,
        config: &config,
    });
    assert!(review.allowed(), "{:?}", review.errors);
    let actor = review.resolved.expect("resolved");
    (RenderedPod::of(&actor), review.origins)
}

fn render(spec: Value) -> (RenderedPod, Origins) {
    render_with(spec, &[])
}

/// A workload actor whose template's pod spec is `pod`.
fn workload(pod: Value) -> Value {
    let mut pod = pod;
    let containers = pod
        .as_object_mut()
        .unwrap()
        .entry("containers")
        .or_insert(json!([]));
    containers.as_array_mut().unwrap().insert(
        0,
        json!({"name": "asya-runtime", "image": "i", "env": [{"name": "ASYA_HANDLER", "value": "m.f"}]}),
    );
    json!({"workload": {"template": {"spec": pod}}})
}

fn privileges(spec: Value) -> Vec<(String, Value, Rule)> {
    let (pod, origins) = render(spec);
    pod.privileges(&origins)
        .into_iter()
        .map(|f| (f.path, f.value, f.rule))
        .collect()
}

#[test]
fn plain_actors_have_no_privilege_in_either_shape() {
    assert_eq!(privileges(json!({"image": "i", "handler": "m.f"})), vec![]);
    assert_eq!(privileges(workload(json!({}))), vec![]);
    // The actor's own ServiceAccount, written out, is no privilege.
    assert_eq!(
        privileges(workload(json!({"serviceAccountName": "asya-a"}))),
        vec![]
    );
    // Ordinary volumes neither.
    let flat = json!({"image": "i", "handler": "m.f", "volumes": [{"name": "d", "emptyDir": {}}]});
    assert_eq!(privileges(flat), vec![]);
}

#[test]
fn a_host_path_is_a_privilege_in_the_flat_and_the_workload_shape() {
    let flat = json!({"image": "i", "handler": "m.f", "volumes": [
        {"name": "ok", "emptyDir": {}}, {"name": "root", "hostPath": {"path": "/"}}]});
    assert_eq!(
        privileges(flat),
        vec![(
            "spec.volumes[1].hostPath.path".into(),
            json!("/"),
            Rule::HostPath
        )]
    );
    let w = workload(json!({"volumes": [{"name": "root", "hostPath": {"path": "/var/run"}}]}));
    assert_eq!(
        privileges(w),
        vec![(
            "spec.workload.template.spec.volumes[0].hostPath.path".into(),
            json!("/var/run"),
            Rule::HostPath
        )]
    );
}

#[test]
fn host_namespaces_are_privileges() {
    let w = workload(json!({"hostNetwork": true, "hostPID": true, "hostIPC": false}));
    assert_eq!(
        privileges(w),
        vec![
            (
                "spec.workload.template.spec.hostNetwork".into(),
                json!(true),
                Rule::HostNamespaces
            ),
            (
                "spec.workload.template.spec.hostPID".into(),
                json!(true),
                Rule::HostNamespaces
            ),
        ]
    );
}

#[test]
fn privileged_escalation_capabilities_and_host_ports_of_any_container() {
    let w = workload(json!({
        "initContainers": [{"name": "init", "image": "i", "securityContext": {"privileged": true}}],
        "containers": [{"name": "side", "image": "i",
            "ports": [{"containerPort": 80}, {"containerPort": 81, "hostPort": 8081}],
            "securityContext": {"allowPrivilegeEscalation": true,
                "capabilities": {"add": ["NET_BIND_SERVICE", "SYS_ADMIN", "CAP_CHOWN"]}}}]
    }));
    let c = "spec.workload.template.spec.containers[1]";
    assert_eq!(
        privileges(w),
        vec![
            (
                "spec.workload.template.spec.initContainers[0].securityContext.privileged".into(),
                json!(true),
                Rule::Privileged
            ),
            (
                format!("{c}.ports[1].hostPort"),
                json!(8081),
                Rule::HostPorts
            ),
            (
                format!("{c}.securityContext.allowPrivilegeEscalation"),
                json!(true),
                Rule::PrivilegeEscalation
            ),
            (
                format!("{c}.securityContext.capabilities.add[0]"),
                json!("NET_BIND_SERVICE"),
                Rule::AddedCapability
            ),
            (
                format!("{c}.securityContext.capabilities.add[1]"),
                json!("SYS_ADMIN"),
                Rule::Capabilities
            ),
            (
                format!("{c}.securityContext.capabilities.add[2]"),
                json!("CAP_CHOWN"),
                Rule::AddedCapability
            ),
        ]
    );
}

#[test]
fn another_service_account_is_a_privilege() {
    assert_eq!(
        privileges(workload(json!({"serviceAccountName": "admin"}))),
        vec![(
            "spec.workload.template.spec.serviceAccountName".into(),
            json!("admin"),
            Rule::ServiceAccount
        )]
    );
    // The deprecated alias too.
    assert_eq!(
        privileges(workload(json!({"serviceAccount": "admin"}))),
        vec![(
            "spec.workload.template.spec.serviceAccount".into(),
            json!("admin"),
            Rule::ServiceAccount
        )]
    );
}

#[test]
fn the_rest_of_baseline_is_a_privilege() {
    let w = workload(json!({
        "securityContext": {
            "windowsOptions": {"hostProcess": true},
            "seccompProfile": {"type": "Unconfined"},
            "appArmorProfile": {"type": "Unconfined"},
            "seLinuxOptions": {"type": "spc_t", "user": "system_u"},
            "sysctls": [{"name": "net.ipv4.tcp_syncookies", "value": "1"}, {"name": "kernel.msgmax", "value": "1"}]
        },
        "containers": [{"name": "c", "image": "i", "securityContext": {
            "procMount": "Unmasked", "seLinuxOptions": {"type": "container_t", "role": "r"}}}]
    }));
    let rules: Vec<(String, Rule)> = privileges(w)
        .into_iter()
        .map(|(p, _, r)| (p.replace("spec.workload.template.spec.", ""), r))
        .collect();
    assert_eq!(
        rules,
        vec![
            (
                "securityContext.windowsOptions.hostProcess".into(),
                Rule::HostProcess
            ),
            (
                "securityContext.appArmorProfile.type".into(),
                Rule::AppArmor
            ),
            ("securityContext.seLinuxOptions.type".into(), Rule::SeLinux),
            ("securityContext.seLinuxOptions.user".into(), Rule::SeLinux),
            ("securityContext.seccompProfile.type".into(), Rule::Seccomp),
            ("securityContext.sysctls[1].name".into(), Rule::Sysctls),
            (
                "containers[1].securityContext.seLinuxOptions.role".into(),
                Rule::SeLinux
            ),
            (
                "containers[1].securityContext.procMount".into(),
                Rule::ProcMount
            ),
        ]
    );
}

#[test]
fn apparmor_annotations_other_than_runtime_default_or_localhost() {
    let mut w = workload(json!({}));
    w["workload"]["template"]["metadata"] = json!({"annotations": {
        "container.apparmor.security.beta.kubernetes.io/asya-runtime": "unconfined",
        "container.apparmor.security.beta.kubernetes.io/x": "runtime/default",
        "container.apparmor.security.beta.kubernetes.io/y": "localhost/p",
    }});
    assert_eq!(
        privileges(w),
        vec![(
            "spec.workload.template.metadata.annotations[container.apparmor.security.beta.kubernetes.io/asya-runtime]".into(),
            json!("unconfined"),
            Rule::AppArmor
        )]
    );
}

#[test]
fn a_privilege_from_a_flavor_names_the_flavor() {
    let (pod, origins) = render_with(
        json!({"image": "i", "handler": "m.f", "flavors": ["node-logs"],
            "volumes": [{"name": "mine", "emptyDir": {}}]}),
        &[(
            "node-logs",
            json!({"volumes": [{"name": "logs", "hostPath": {"path": "/var/log"}}]}),
        )],
    );
    let found = pod.privileges(&origins);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].flavor.as_deref(), Some("node-logs"));
    assert_eq!(found[0].value, json!("/var/log"));
    assert!(
        found[0]
            .to_string()
            .ends_with(": \"/var/log\" (set by flavor \"node-logs\")"),
        "{}",
        found[0]
    );
    // A workload template from a flavor: its privileged container too.
    let (pod, origins) = render_with(
        json!({"flavors": ["gpu-node"], "handler": "m.f"}),
        &[(
            "gpu-node",
            json!({"workload": {"template": {"spec": {"containers": [
                {"name": "asya-runtime", "image": "i", "securityContext": {"privileged": true}}]}}}}),
        )],
    );
    let found = pod.privileges(&origins);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].flavor.as_deref(), Some("gpu-node"));
    assert_eq!(found[0].rule, Rule::Privileged);
}

#[test]
fn the_level_is_the_enforce_label_else_baseline() {
    let labels = |v: &str| BTreeMap::from([(ENFORCE_LABEL.to_string(), v.to_string())]);
    assert_eq!(Level::of_namespace(None, Level::Baseline), Level::Baseline);
    // Without the label the policy's default decides; with it, the label.
    assert_eq!(
        Level::of_namespace(None, Level::Restricted),
        Level::Restricted
    );
    assert_eq!(
        Level::of_namespace(Some(&labels("privileged")), Level::Restricted),
        Level::Privileged
    );
    assert_eq!(
        Level::of_namespace(Some(&BTreeMap::new()), Level::Baseline),
        Level::Baseline
    );
    assert_eq!(
        Level::of_namespace(Some(&labels("privileged")), Level::Baseline),
        Level::Privileged
    );
    assert_eq!(
        Level::of_namespace(Some(&labels("baseline")), Level::Baseline),
        Level::Baseline
    );
    assert_eq!(
        Level::of_namespace(Some(&labels("restricted")), Level::Baseline),
        Level::Restricted
    );
    // Not a level: the API server reads it as restricted, so do we.
    assert_eq!(
        Level::of_namespace(Some(&labels("strict")), Level::Baseline),
        Level::Restricted
    );
}

#[test]
fn baseline_refuses_its_rules_only_and_names_the_level() {
    let w = workload(json!({
        "serviceAccountName": "other",
        "containers": [{"name": "c", "image": "i", "securityContext": {"privileged": true,
            "allowPrivilegeEscalation": true, "capabilities": {"add": ["CHOWN"]}}}]
    }));
    let (pod, origins) = render(w);
    let v = pod.level_violations(Level::Baseline, &origins);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].starts_with("spec.workload.template.spec.containers[1].securityContext.privileged: true: a privileged container"),
        "{v:?}"
    );
    assert!(v[0].ends_with("(level baseline)"), "{v:?}");
    assert_eq!(
        pod.level_violations(Level::Privileged, &origins),
        Vec::<String>::new()
    );
}

#[test]
fn flat_actors_meet_restricted_unless_their_volumes_do_not() {
    let (pod, origins) = render(json!({"image": "i", "handler": "m.f",
        "volumes": [{"name": "d", "emptyDir": {}}]}));
    assert_eq!(
        pod.level_violations(Level::Restricted, &origins),
        Vec::<String>::new()
    );
    let (pod, origins) = render(json!({"image": "i", "handler": "m.f",
        "volumes": [{"name": "n", "nfs": {"server": "s", "path": "/"}}]}));
    let v = pod.level_violations(Level::Restricted, &origins);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].starts_with("spec.volumes[n] is a nfs volume"), "{v:?}");
    // nfs is not a baseline matter.
    assert_eq!(
        pod.level_violations(Level::Baseline, &origins),
        Vec::<String>::new()
    );
}

#[test]
fn restricted_reports_a_workload_template_once_per_rule_with_actor_paths() {
    let w = workload(
        json!({"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]},
        "hostNetwork": true}),
    );
    let (pod, origins) = render(w);
    let v = pod.level_violations(Level::Restricted, &origins);
    // Baseline's sysctl rule (restricted.rs does not check it) once, host namespaces once
    // (from restricted.rs), and the runtime container's missing restricted settings.
    let count = |needle: &str| v.iter().filter(|m| m.contains(needle)).count();
    assert_eq!(count("sysctls"), 1, "{v:?}");
    assert_eq!(count("hostNetwork"), 1, "{v:?}");
    assert!(
        v.iter().any(|m| m.starts_with(
            "spec.workload.template.spec.containers[asya-runtime].securityContext.allowPrivilegeEscalation"
        )),
        "{v:?}"
    );
    assert!(v.iter().all(|m| m.ends_with("(level restricted)")), "{v:?}");
}

#[test]
fn a_namespaced_flavor_cannot_grant_privileges_to_anybody() {
    let cm = |yaml: &str| -> k8s_openapi::api::core::v1::ConfigMap {
        serde_json::from_value(json!({
            "metadata": {"name": "cm", "namespace": "team", "labels": {"asya.sh/flavor": "mine"}},
            "data": {"flavor.yaml": yaml}
        }))
        .unwrap()
    };
    let review = |yaml: &str| {
        let mut catalog = FlavorCatalog::new();
        catalog.insert(FlavorDef::from_config_map(&cm(yaml)).unwrap());
        let config = ClusterConfig::default();
        let object = json!({"metadata": {"name": "a", "namespace": "team"},
            "spec": {"image": "i", "handler": "m.f", "flavors": ["mine"]}});
        review_actor_decision(&ReviewRequest {
            object: &object,
            old_object: None,
            namespace: None,
            catalog: &catalog,
            config: &config,
        })
    };
    let plain = review("volumes: [{name: d, emptyDir: {}}]");
    assert!(plain.allowed(), "{:?}", plain.errors);
    let host = review("volumes: [{name: d, hostPath: {path: /etc}}]");
    assert_eq!(
        host.errors.to_string(),
        "spec.volumes[0].hostPath.path: Invalid value: \"/etc\": mounts a directory of the node (Pod Security baseline: hostPath volumes): a namespaced flavor (ConfigMap) cannot grant privileges; ask the platform team for a cluster Flavor (set by flavor \"mine\")"
    );
}
