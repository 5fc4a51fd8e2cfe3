//! Injection meets Pod Security "restricted" (docs/DESIGN.md §5): a pod whose own containers
//! meet it still does once injected, in both sidecar forms, and its own settings are kept.

use asya_api::restricted::restricted_violations;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::tests::settings;
use super::*;

/// A user's pod that meets restricted on its own: pod-level non-root and seccomp, its
/// containers' own settings (one with an explicit uid and a writable root filesystem).
fn restricted_pod() -> Pod {
    let own = json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
                     "runAsUser": 1000, "readOnlyRootFilesystem": false});
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"asya.sh/inject": "true", "asya.sh/actor": "echo"}},
        "spec": {
            "securityContext": {"runAsNonRoot": true, "runAsUser": 2000,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "asya-runtime", "image": "py:3.13", "securityContext": own}],
            "initContainers": [{"name": "user-init", "image": "busybox", "securityContext": own}]
        }
    }))
    .unwrap()
}

fn injected(native: bool) -> Pod {
    let mut p = restricted_pod();
    let mut parts = InjectedPod::take(&mut p).unwrap();
    inject(&mut parts, &settings(), &ClusterConfig::default(), native).unwrap();
    parts.put_back(&mut p);
    p
}

#[test]
fn injected_containers_meet_restricted_in_both_forms_and_a_second_pass_changes_nothing() {
    for native in [true, false] {
        let mut p = injected(native);
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(
            restricted_violations(spec),
            Vec::<String>::new(),
            "native={native}"
        );
        let ours = spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .filter(|c| c.name == INSTALL_CONTAINER || c.name == labels::SIDECAR_CONTAINER);
        let mut n = 0;
        for c in ours {
            n += 1;
            let sc = c.security_context.as_ref().unwrap();
            assert_eq!(sc.read_only_root_filesystem, Some(true), "{}", c.name);
            assert_eq!(sc.run_as_non_root, Some(true), "{}", c.name);
            // The image's own numeric user, or the pod's: injection chooses no uid.
            assert_eq!(sc.run_as_user, None, "{}", c.name);
        }
        assert_eq!(n, 2, "native={native}");
        let once = p.clone();
        let mut parts = InjectedPod::take(&mut p).unwrap();
        inject(&mut parts, &settings(), &ClusterConfig::default(), native).unwrap();
        parts.put_back(&mut p);
        assert_eq!(p, once, "second pass changes nothing (native={native})");
    }
}

#[test]
fn injected_containers_alone_meet_restricted_without_pod_level_settings() {
    // A bare pod: only the containers we add are checked.
    let mut p = super::tests::pod();
    let mut parts = InjectedPod::take(&mut p).unwrap();
    inject(&mut parts, &settings(), &ClusterConfig::default(), true).unwrap();
    let ours: Vec<_> = parts
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.name == INSTALL_CONTAINER || c.name == labels::SIDECAR_CONTAINER)
        .cloned()
        .collect();
    let only_ours = k8s_openapi::api::core::v1::PodSpec {
        containers: ours,
        ..Default::default()
    };
    assert_eq!(restricted_violations(&only_ours), Vec::<String>::new());
}

#[test]
fn the_users_own_security_settings_are_kept() {
    let before = restricted_pod();
    let after = injected(true);
    let (b, a) = (before.spec.unwrap(), after.spec.unwrap());
    assert_eq!(a.security_context, b.security_context);
    assert_eq!(
        a.containers[0].security_context,
        b.containers[0].security_context
    );
    let user_init = a
        .init_containers
        .unwrap()
        .into_iter()
        .find(|c| c.name == "user-init")
        .unwrap();
    assert_eq!(
        user_init.security_context,
        b.init_containers.unwrap()[0].security_context
    );
}

#[test]
fn a_flat_actors_pod_as_the_provisioner_renders_it_meets_restricted_once_injected() {
    use asya_api::restricted::{harden_container, harden_pod};
    // The shape of queue-provisioner's flat template: one runtime container and the pod
    // settings, both from the same defaults.
    let mut runtime = k8s_openapi::api::core::v1::Container {
        name: labels::RUNTIME_CONTAINER.into(),
        image: Some("python:3.12".into()),
        ..Default::default()
    };
    harden_container(&mut runtime.security_context);
    let mut spec = k8s_openapi::api::core::v1::PodSpec {
        containers: vec![runtime],
        ..Default::default()
    };
    harden_pod(&mut spec.security_context);
    for native in [true, false] {
        let mut p = Pod {
            metadata: Default::default(),
            spec: Some(spec.clone()),
            status: None,
        };
        let mut parts = InjectedPod::take(&mut p).unwrap();
        inject(&mut parts, &settings(), &ClusterConfig::default(), native).unwrap();
        parts.put_back(&mut p);
        assert_eq!(
            restricted_violations(p.spec.as_ref().unwrap()),
            Vec::<String>::new(),
            "native={native}"
        );
    }
}

#[test]
fn under_a_pod_that_runs_as_root_our_containers_name_their_non_root_uid() {
    let mut p = super::tests::pod();
    p.spec.as_mut().unwrap().security_context =
        Some(k8s_openapi::api::core::v1::PodSecurityContext {
            run_as_user: Some(0),
            ..Default::default()
        });
    let mut parts = InjectedPod::take(&mut p).unwrap();
    assert!(parts.pod_runs_as_root);
    inject(&mut parts, &settings(), &ClusterConfig::default(), true).unwrap();
    let ours = parts
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.name == INSTALL_CONTAINER || c.name == labels::SIDECAR_CONTAINER);
    for c in ours {
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(
            (sc.run_as_user, sc.run_as_group, sc.run_as_non_root),
            (Some(65532), Some(65532), Some(true)),
            "{}",
            c.name
        );
    }
    parts.put_back(&mut p);
    assert_eq!(
        p.spec.unwrap().security_context.unwrap().run_as_user,
        Some(0),
        "the pod's own setting stays"
    );
}

#[test]
fn state_proxy_connectors_meet_restricted_in_both_forms_and_under_a_root_pod() {
    use super::tests::settings_with_state;
    for (native, root) in [(true, false), (false, false), (true, true), (false, true)] {
        let mut p = restricted_pod();
        if root {
            p.spec
                .as_mut()
                .unwrap()
                .security_context
                .as_mut()
                .unwrap()
                .run_as_user = Some(0);
        }
        let mut parts = InjectedPod::take(&mut p).unwrap();
        inject(
            &mut parts,
            &settings_with_state(),
            &ClusterConfig::default(),
            native,
        )
        .unwrap();
        parts.put_back(&mut p);
        let spec = p.spec.as_ref().unwrap();
        let connectors: Vec<_> = spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .filter(|c| c.name.starts_with("asya-state-proxy-"))
            .cloned()
            .collect();
        assert_eq!(connectors.len(), 2, "native={native} root={root}");
        for c in &connectors {
            let sc = c.security_context.as_ref().unwrap();
            assert_eq!(sc.read_only_root_filesystem, Some(true), "{}", c.name);
            assert_eq!(sc.run_as_non_root, Some(true), "{}", c.name);
            let want = root.then_some(65532);
            assert_eq!(sc.run_as_user, want, "{} root={root}", c.name);
        }
        // The connectors alone, without the pod's own settings, meet restricted.
        let only = k8s_openapi::api::core::v1::PodSpec {
            containers: connectors,
            ..Default::default()
        };
        assert_eq!(
            restricted_violations(&only),
            Vec::<String>::new(),
            "native={native}"
        );
        if !root {
            assert_eq!(
                restricted_violations(spec),
                Vec::<String>::new(),
                "native={native}"
            );
        }
    }
}
