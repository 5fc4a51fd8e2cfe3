//! Pod Security "restricted" (`restricted.rs`): the checker names each field a container or
//! pod breaks, and the hardening of what we add or render meets the level and is idempotent.

use k8s_openapi::api::core::v1::{
    Capabilities, Container, HostPathVolumeSource, PodSecurityContext, PodSpec, SecurityContext,
    Volume,
};

use super::*;

fn container(name: &str, sc: Option<SecurityContext>) -> Container {
    Container {
        name: name.into(),
        image: Some("i".into()),
        security_context: sc,
        ..Default::default()
    }
}

fn hardened(name: &str) -> Container {
    let mut c = container(name, None);
    harden_container(&mut c.security_context);
    c
}

#[test]
fn a_bare_container_fails_every_container_rule_naming_the_field() {
    let spec = PodSpec {
        containers: vec![container("c", None)],
        ..Default::default()
    };
    let v = restricted_violations(&spec);
    for field in [
        "spec.containers[c].securityContext.allowPrivilegeEscalation=unset",
        "spec.containers[c].securityContext.runAsNonRoot=unset",
        "spec.containers[c].securityContext.seccompProfile.type=unset",
        "spec.containers[c].securityContext.capabilities.drop=[]",
    ] {
        assert!(v.iter().any(|m| m.starts_with(field)), "{field} in {v:?}");
    }
    assert_eq!(v.len(), 4, "{v:?}");
}

#[test]
fn hardened_containers_meet_restricted() {
    let spec = PodSpec {
        init_containers: Some(vec![hardened("i")]),
        containers: vec![hardened("c")],
        ..Default::default()
    };
    assert_eq!(restricted_violations(&spec), Vec::<String>::new());
}

#[test]
fn pod_level_non_root_and_seccomp_cover_containers_that_leave_them_unset() {
    let mut c = container("c", None);
    c.security_context = Some(SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        ..Default::default()
    });
    let mut spec = PodSpec {
        containers: vec![c],
        ..Default::default()
    };
    harden_pod(&mut spec.security_context);
    assert_eq!(restricted_violations(&spec), Vec::<String>::new());
}

#[test]
fn hardening_keeps_what_the_spec_sets_and_is_idempotent() {
    let mut sc = Some(SecurityContext {
        run_as_user: Some(1000),
        read_only_root_filesystem: Some(false),
        capabilities: Some(Capabilities {
            add: Some(vec!["NET_BIND_SERVICE".into()]),
            drop: Some(vec!["ALL".into(), "CHOWN".into()]),
        }),
        ..Default::default()
    });
    harden_read_only(&mut sc);
    let once = sc.clone();
    harden_read_only(&mut sc);
    assert_eq!(sc, once);
    let s = sc.unwrap();
    assert_eq!(s.run_as_user, Some(1000));
    assert_eq!(s.read_only_root_filesystem, Some(false));
    let caps = s.capabilities.unwrap();
    assert_eq!(caps.drop.unwrap(), vec!["ALL", "CHOWN"]);
    assert_eq!(caps.add.unwrap(), vec!["NET_BIND_SERVICE"]);
    assert_eq!(s.allow_privilege_escalation, Some(false));

    let mut pod = Some(PodSecurityContext {
        run_as_user: Some(1000),
        ..Default::default()
    });
    harden_pod(&mut pod);
    let p = pod.unwrap();
    assert_eq!(p.run_as_user, Some(1000));
    assert_eq!(p.run_as_group, Some(NONROOT_ID));
    assert_eq!(p.run_as_non_root, Some(true));
}

#[test]
fn explicit_root_privileged_unconfined_added_caps_host_path_are_each_named() {
    let mut c = hardened("c");
    let sc = c.security_context.as_mut().unwrap();
    sc.privileged = Some(true);
    sc.run_as_user = Some(0);
    sc.run_as_non_root = Some(false);
    sc.seccomp_profile = Some(k8s_openapi::api::core::v1::SeccompProfile {
        type_: "Unconfined".into(),
        localhost_profile: None,
    });
    sc.capabilities.as_mut().unwrap().add = Some(vec!["SYS_ADMIN".into()]);
    let mut spec = PodSpec {
        containers: vec![c],
        host_network: Some(true),
        volumes: Some(vec![Volume {
            name: "h".into(),
            host_path: Some(HostPathVolumeSource {
                path: "/".into(),
                type_: None,
            }),
            ..Default::default()
        }]),
        ..Default::default()
    };
    harden_pod(&mut spec.security_context);
    let v = restricted_violations(&spec);
    for needle in [
        "privileged=true",
        "runAsUser=0",
        "runAsNonRoot=false",
        "seccompProfile.type=Unconfined",
        "\"SYS_ADMIN\"",
        "hostNetwork=true",
        "spec.volumes[h] is a hostPath volume",
    ] {
        assert!(v.iter().any(|m| m.contains(needle)), "{needle} in {v:?}");
    }
}

#[test]
fn a_volume_without_a_source_counts_as_empty_dir() {
    let spec = PodSpec {
        containers: vec![hardened("c")],
        volumes: Some(vec![Volume {
            name: "v".into(),
            ..Default::default()
        }]),
        ..Default::default()
    };
    assert_eq!(restricted_violations(&spec), Vec::<String>::new());
}
