//! Pod Security "restricted" (Kubernetes' Pod Security Standards, level `restricted`,
//! version `latest`): the defaults we give the containers we add or render
//! ([`harden_container`], [`harden_pod`]) and a pure checker of a pod spec against the level
//! ([`restricted_violations`]). docs/DESIGN.md §5 and §9 say which containers get what.
//!
//! Defaults are merged: a field the user's spec already sets is kept, so whatever an actor or
//! a pod says explicitly wins, and applying them twice changes nothing.

use k8s_openapi::api::core::v1::{
    Capabilities, Container, PodSecurityContext, PodSpec, SeccompProfile, SecurityContext,
};

/// The uid and gid of distroless' `nonroot`, the user of every image this project builds
/// (deploy/images): a root image run under it reads its world-readable files and runs.
pub const NONROOT_ID: i64 = 65532;
pub const RUNTIME_DEFAULT: &str = "RuntimeDefault";
const ALL: &str = "ALL";
/// The only capability `restricted` lets a container add back.
const NET_BIND_SERVICE: &str = "NET_BIND_SERVICE";
/// The volume types `restricted` allows.
const ALLOWED_VOLUMES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// Container settings that cannot break a process that does not need root: no privilege
/// escalation, every capability dropped, the runtime's default seccomp profile, and
/// `runAsNonRoot` (the kubelet then refuses to start an image whose user is root, unless
/// `runAsUser` says otherwise). Fields already set are kept.
pub fn harden_container(sc: &mut Option<SecurityContext>) {
    let sc = sc.get_or_insert_with(SecurityContext::default);
    sc.allow_privilege_escalation.get_or_insert(false);
    sc.run_as_non_root.get_or_insert(true);
    sc.seccomp_profile.get_or_insert_with(runtime_default);
    let caps = sc.capabilities.get_or_insert_with(Capabilities::default);
    caps.drop.get_or_insert_with(|| vec![ALL.into()]);
}

/// [`harden_container`] and a read-only root filesystem: for processes that write only to
/// their volumes (the sidecar and the runtime installer).
pub fn harden_read_only(sc: &mut Option<SecurityContext>) {
    harden_container(sc);
    if let Some(sc) = sc.as_mut() {
        sc.read_only_root_filesystem.get_or_insert(true);
    }
}

/// Pod-level defaults for a pod whose every container we render: non-root as [`NONROOT_ID`]
/// (so an image whose user is root still starts), `fsGroup` so its volumes are writable by
/// that user, RuntimeDefault seccomp. Fields already set are kept.
pub fn harden_pod(sc: &mut Option<PodSecurityContext>) {
    let sc = sc.get_or_insert_with(PodSecurityContext::default);
    sc.run_as_non_root.get_or_insert(true);
    sc.run_as_user.get_or_insert(NONROOT_ID);
    sc.run_as_group.get_or_insert(NONROOT_ID);
    sc.fs_group.get_or_insert(NONROOT_ID);
    // Changing the ownership of a large volume on every start is slow; once is enough.
    sc.fs_group_change_policy
        .get_or_insert_with(|| "OnRootMismatch".into());
    sc.seccomp_profile.get_or_insert_with(runtime_default);
}

fn runtime_default() -> SeccompProfile {
    SeccompProfile {
        type_: RUNTIME_DEFAULT.into(),
        localhost_profile: None,
    }
}

/// Every way `spec` fails Pod Security "restricted" (the rules the API server's PodSecurity
/// admission checks, baseline's included), each naming the field, its value and the rule.
/// Empty when the pod would be admitted in a namespace enforcing `restricted`.
pub fn restricted_violations(spec: &PodSpec) -> Vec<String> {
    let mut v = Vec::new();
    let pod = spec.security_context.as_ref();
    for (flag, field) in [
        (spec.host_network, "hostNetwork"),
        (spec.host_pid, "hostPID"),
        (spec.host_ipc, "hostIPC"),
    ] {
        if flag == Some(true) {
            v.push(format!(
                "spec.{field}=true: host namespaces are not allowed"
            ));
        }
    }
    for vol in spec.volumes.iter().flatten() {
        let ty = volume_type(vol);
        if !ALLOWED_VOLUMES.contains(&ty) {
            v.push(format!(
                "spec.volumes[{}] is a {ty} volume: restricted allows only {}",
                vol.name,
                ALLOWED_VOLUMES.join(", ")
            ));
        }
    }
    let pod_non_root = pod.and_then(|p| p.run_as_non_root);
    if pod_non_root == Some(false) {
        v.push("spec.securityContext.runAsNonRoot=false: must be true".into());
    }
    if pod.and_then(|p| p.run_as_user) == Some(0) {
        v.push("spec.securityContext.runAsUser=0: must not be root".into());
    }
    let pod_seccomp = pod.and_then(|p| p.seccomp_profile.as_ref());
    if let Some(p) = pod_seccomp
        && !seccomp_ok(p)
    {
        v.push(format!(
            "spec.securityContext.seccompProfile.type={}: must be RuntimeDefault or Localhost",
            p.type_
        ));
    }
    let all = [
        (
            "initContainers",
            spec.init_containers.as_deref().unwrap_or_default(),
        ),
        ("containers", spec.containers.as_slice()),
    ];
    for (list, containers) in all {
        for c in containers {
            container_violations(
                &format!("spec.{list}[{}]", c.name),
                c,
                pod_non_root == Some(true),
                pod_seccomp.is_some(),
                &mut v,
            );
        }
    }
    v
}

fn container_violations(
    at: &str,
    c: &Container,
    pod_non_root: bool,
    pod_seccomp: bool,
    v: &mut Vec<String>,
) {
    let sc = c.security_context.as_ref();
    let field = |f: &str| format!("{at}.securityContext.{f}");
    if sc.and_then(|s| s.privileged) == Some(true) {
        v.push(format!(
            "{}=true: must not be privileged",
            field("privileged")
        ));
    }
    if sc.and_then(|s| s.allow_privilege_escalation) != Some(false) {
        v.push(format!(
            "{}={}: must be false",
            field("allowPrivilegeEscalation"),
            shown(sc.and_then(|s| s.allow_privilege_escalation))
        ));
    }
    match sc.and_then(|s| s.run_as_non_root) {
        Some(true) => {}
        Some(false) => v.push(format!("{}=false: must be true", field("runAsNonRoot"))),
        None if pod_non_root => {}
        None => v.push(format!(
            "{}=unset (and unset on the pod): must be true",
            field("runAsNonRoot")
        )),
    }
    if sc.and_then(|s| s.run_as_user) == Some(0) {
        v.push(format!("{}=0: must not be root", field("runAsUser")));
    }
    match sc.and_then(|s| s.seccomp_profile.as_ref()) {
        Some(p) if !seccomp_ok(p) => v.push(format!(
            "{}={}: must be RuntimeDefault or Localhost",
            field("seccompProfile.type"),
            p.type_
        )),
        Some(_) => {}
        None if pod_seccomp => {}
        None => v.push(format!(
            "{}=unset (and unset on the pod): must be RuntimeDefault or Localhost",
            field("seccompProfile.type")
        )),
    }
    let caps = sc.and_then(|s| s.capabilities.as_ref());
    let drop = caps.and_then(|c| c.drop.as_deref()).unwrap_or_default();
    if !drop.iter().any(|d| d == ALL) {
        v.push(format!(
            "{}={drop:?}: must include \"ALL\"",
            field("capabilities.drop")
        ));
    }
    for add in caps.and_then(|c| c.add.as_deref()).unwrap_or_default() {
        if add != NET_BIND_SERVICE {
            v.push(format!(
                "{} includes {add:?}: only NET_BIND_SERVICE may be added",
                field("capabilities.add")
            ));
        }
    }
    for p in c.ports.iter().flatten() {
        if p.host_port.is_some_and(|h| h != 0) {
            v.push(format!(
                "{at}.ports[{}].hostPort={}: host ports are not allowed",
                p.container_port,
                p.host_port.unwrap_or_default()
            ));
        }
    }
}

fn seccomp_ok(p: &SeccompProfile) -> bool {
    p.type_ == RUNTIME_DEFAULT || p.type_ == "Localhost"
}

fn shown(b: Option<bool>) -> String {
    b.map_or_else(|| "unset".into(), |b| b.to_string())
}

/// The name of a volume's source, as the Pod Security Standards spell it.
fn volume_type(v: &k8s_openapi::api::core::v1::Volume) -> &'static str {
    match () {
        _ if v.config_map.is_some() => "configMap",
        _ if v.csi.is_some() => "csi",
        _ if v.downward_api.is_some() => "downwardAPI",
        _ if v.empty_dir.is_some() => "emptyDir",
        _ if v.ephemeral.is_some() => "ephemeral",
        _ if v.persistent_volume_claim.is_some() => "persistentVolumeClaim",
        _ if v.projected.is_some() => "projected",
        _ if v.secret.is_some() => "secret",
        _ if v.host_path.is_some() => "hostPath",
        _ if v.nfs.is_some() => "nfs",
        _ if v.iscsi.is_some() => "iscsi",
        _ if v.image.is_some() => "image",
        // An empty source is an emptyDir to the API server's defaulting.
        _ if is_sourceless(v) => "emptyDir",
        _ => "other",
    }
}

fn is_sourceless(v: &k8s_openapi::api::core::v1::Volume) -> bool {
    let bare = k8s_openapi::api::core::v1::Volume {
        name: v.name.clone(),
        ..Default::default()
    };
    *v == bare
}

#[cfg(test)]
mod tests;
