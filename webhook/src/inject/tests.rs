//! Injection, checked on whole pods.

use super::*;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

/// The settings of a plain actor `echo` (also used by the patch tests).
pub(crate) fn settings() -> ActorSettings {
    ActorSettings {
        actor: "echo".into(),
        transport: "rabbitmq".into(),
        handler: Some("echo.handle".into()),
        handler_mode: "payload".into(),
        python_executable: "python3".into(),
        actor_timeout_secs: 300,
        resiliency_json: r#"{"actorTimeout":"5m"}"#.into(),
        sidecar_image: None,
        sidecar_pull_policy: None,
        sidecar_resources: None,
        sidecar_env: vec![],
        state_proxy: vec![],
    }
}

/// A pod with no security settings of its own (also used by the restricted tests).
pub(crate) fn pod() -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"asya.sh/inject": "true", "asya.sh/actor": "echo"}},
        "spec": {"containers": [{"name": "main", "image": "python:3.13", "args": ["x"],
                                 "env": [{"name": "ASYA_HANDLER", "value": "old.value"}]}],
                 "initContainers": [{"name": "user-init", "image": "busybox"}]}
    }))
    .unwrap()
}

fn run(
    p: &mut Pod,
    a: &ActorSettings,
    cfg: &ClusterConfig,
    native: bool,
) -> Result<(), InjectError> {
    let mut parts = InjectedPod::take(p).unwrap();
    let result = inject(&mut parts, a, cfg, native);
    parts.put_back(p);
    result
}

fn env_of<'a>(c: &'a Container, name: &str) -> Option<&'a EnvVar> {
    c.env.as_ref()?.iter().find(|e| e.name == name)
}

#[test]
fn a_stale_sidecar_before_the_runtime_is_replaced_and_the_runtime_is_still_the_one_set_up() {
    for native in [false, true] {
        let mut p: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"asya.sh/inject": "true"}},
            "spec": {"containers": [
                {"name": "asya-sidecar", "image": "old-sidecar:0"},
                {"name": "asya-runtime", "image": "python:3.13"},
                {"name": "metrics", "image": "exporter:1"}]}
        }))
        .unwrap();
        run(&mut p, &settings(), &ClusterConfig::default(), native).unwrap();
        let s = p.spec.as_ref().unwrap();
        let by_name = |n: &str| s.containers.iter().find(|c| c.name == n).unwrap();
        assert_eq!(
            by_name("asya-runtime").command.as_deref(),
            Some(&["python3".to_string(), RUNTIME_FILE.to_string()][..]),
            "native={native}"
        );
        assert!(by_name("metrics").command.is_none(), "native={native}");
        let sidecars = s
            .containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .filter(|c| c.name == "asya-sidecar")
            .collect::<Vec<_>>();
        assert_eq!(sidecars.len(), 1, "native={native}");
        assert_ne!(sidecars[0].image.as_deref(), Some("old-sidecar:0"));
    }
}

#[test]
fn native_injection_has_everything_and_is_idempotent() {
    let cfg = ClusterConfig::default();
    let mut p = pod();
    run(&mut p, &settings(), &cfg, true).unwrap();
    let s = p.spec.as_ref().unwrap();
    let inits: Vec<_> = s
        .init_containers
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(inits, ["asya-install-runtime", "asya-sidecar", "user-init"]);
    let sc = &s.init_containers.as_ref().unwrap()[1];
    assert_eq!(sc.restart_policy.as_deref(), Some("Always"));
    assert_eq!(sc.image.as_deref(), Some(cfg.sidecar.image.as_str()));
    assert_eq!(
        env_of(sc, "ASYA_ACTOR_NAME").unwrap().value.as_deref(),
        Some("echo")
    );
    assert_eq!(
        env_of(sc, "ASYA_TRANSPORT").unwrap().value.as_deref(),
        Some("rabbitmq")
    );
    let pw = env_of(sc, "ASYA_RABBITMQ_PASSWORD").unwrap();
    assert_eq!(pw.value, None, "credentials never inline");
    let sk = pw
        .value_from
        .as_ref()
        .unwrap()
        .secret_key_ref
        .as_ref()
        .unwrap();
    // The namespace's own broker identity (docs/DESIGN.md §9), never the platform's.
    assert_eq!(
        (sk.name.as_str(), sk.key.as_str()),
        ("asya-broker-rabbitmq", "password")
    );
    let user = env_of(sc, "ASYA_RABBITMQ_USERNAME").unwrap();
    let uk = user.value_from.as_ref().unwrap().secret_key_ref.as_ref();
    assert_eq!(
        uk.map(|k| (k.name.as_str(), k.key.as_str())),
        Some(("asya-broker-rabbitmq", "username"))
    );
    assert_eq!(
        env_of(sc, "ASYA_RABBITMQ_URL").unwrap().value.as_deref(),
        Some("amqp://$(ASYA_RABBITMQ_USERNAME):$(ASYA_RABBITMQ_PASSWORD)@rabbitmq:5672/%2F")
    );
    assert_eq!(
        env_of(sc, "ASYA_RABBITMQ_EXCHANGE")
            .unwrap()
            .value
            .as_deref(),
        Some("asya.$(ASYA_NAMESPACE)")
    );
    // The password var must come before the URL that references it.
    let names: Vec<_> = sc
        .env
        .as_ref()
        .unwrap()
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    let pos = |n| names.iter().position(|x| *x == n).unwrap();
    assert!(pos("ASYA_RABBITMQ_PASSWORD") < pos("ASYA_RABBITMQ_URL"));
    assert!(pos("ASYA_RABBITMQ_USERNAME") < pos("ASYA_RABBITMQ_URL"));
    assert!(pos("ASYA_NAMESPACE") < pos("ASYA_RABBITMQ_EXCHANGE"));
    assert_eq!(
        env_of(sc, "ASYA_RUNTIME_TIMEOUT").unwrap().value.as_deref(),
        Some("300s")
    );
    assert_eq!(
        env_of(sc, "ASYA_SOCKET_DIR").unwrap().value.as_deref(),
        Some("/var/run/asya")
    );
    assert!(
        env_of(sc, "ASYA_NAMESPACE")
            .unwrap()
            .value_from
            .as_ref()
            .unwrap()
            .field_ref
            .is_some()
    );
    assert_eq!(
        sc.ports.as_ref().unwrap()[0].name.as_deref(),
        Some("metrics")
    );
    assert_eq!(sc.ports.as_ref().unwrap()[0].container_port, 8080);
    assert!(sc.readiness_probe.is_some() && sc.liveness_probe.is_some());
    assert!(sc.resources.is_some());

    let rt = &s.containers[0];
    assert_eq!(s.containers.len(), 1);
    assert_eq!(
        rt.command.as_ref().unwrap(),
        &["python3", "/opt/asya/asya_runtime.py"]
    );
    assert_eq!(rt.args, None);
    assert_eq!(
        env_of(rt, "ASYA_HANDLER").unwrap().value.as_deref(),
        Some("echo.handle")
    );
    assert_eq!(
        rt.env
            .as_ref()
            .unwrap()
            .iter()
            .filter(|e| e.name == "ASYA_HANDLER")
            .count(),
        1
    );
    let mounts: Vec<_> = rt
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert_eq!(mounts, ["/var/run/asya", "/opt/asya"]);
    let vols: Vec<_> = s
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .map(|v| v.name.as_str())
        .collect();
    assert_eq!(
        vols,
        ["asya-socket", "asya-runtime-file", "asya-no-api-token"]
    );
    // Our containers carry no API token; the user's keep theirs.
    for c in &s.init_containers.as_ref().unwrap()[..2] {
        let m = c
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.mount_path == API_TOKEN_PATH)
            .unwrap_or_else(|| panic!("{} has no mount over the token path", c.name));
        assert_eq!(
            (m.name.as_str(), m.read_only),
            (NO_API_TOKEN_VOLUME, Some(true))
        );
    }
    assert!(!mounts.contains(&API_TOKEN_PATH));
    assert!(is_injected(&p.metadata));

    let once = p.clone();
    run(&mut p, &settings(), &cfg, true).unwrap();
    assert_eq!(p, once, "second pass changes nothing");
}

#[test]
fn regular_container_mode_and_overrides() {
    let cfg = ClusterConfig::default();
    let mut a = settings();
    a.transport = "sqs".into();
    a.sidecar_image = Some("reg.example/asya-sidecar:dev".into());
    a.sidecar_env = vec![env("ASYA_SOCKET_DIR", "/should/win")];
    let mut p = pod();
    run(&mut p, &a, &cfg, false).unwrap();
    let s = p.spec.unwrap();
    assert_eq!(s.containers.len(), 2);
    let sc = &s.containers[1];
    assert_eq!(sc.name, "asya-sidecar");
    assert_eq!(sc.restart_policy, None);
    assert_eq!(sc.image.as_deref(), Some("reg.example/asya-sidecar:dev"));
    assert_eq!(
        env_of(sc, "ASYA_SQS_REGION").unwrap().value.as_deref(),
        Some("us-east-1")
    );
    assert_eq!(
        env_of(sc, "ASYA_SOCKET_DIR").unwrap().value.as_deref(),
        Some("/should/win")
    );
    assert!(env_of(sc, "ASYA_RABBITMQ_URL").is_none());
    assert_eq!(
        p.metadata
            .annotations
            .unwrap()
            .get(INJECTED)
            .map(String::as_str),
        Some("reg.example/asya-sidecar:dev")
    );
    let inits = s.init_containers.unwrap();
    assert_eq!(
        inits[0].image.as_deref(),
        Some("reg.example/asya-sidecar:dev")
    );
}

/// The injected sidecar, a native one (init container) or a regular one.
fn sidecar_of(p: &Pod) -> &Container {
    let s = p.spec.as_ref().unwrap();
    s.init_containers
        .iter()
        .flatten()
        .chain(&s.containers)
        .find(|c| c.name == labels::SIDECAR_CONTAINER)
        .expect("an injected sidecar")
}

#[test]
fn gateway_url_and_token_are_injected_only_when_the_configuration_names_a_gateway() {
    let url = "http://asya-gateway.asya-system.svc:8080";
    for native in [true, false] {
        // No gateway in the configuration: the sidecar reports nowhere.
        let cfg = ClusterConfig::default();
        assert!(cfg.gateway.is_off());
        let mut p = pod();
        run(&mut p, &settings(), &cfg, native).unwrap();
        let sc = sidecar_of(&p);
        assert!(env_of(sc, "ASYA_GATEWAY_URL").is_none(), "native={native}");
        assert!(
            env_of(sc, "ASYA_GATEWAY_TOKEN").is_none(),
            "native={native}"
        );

        // A URL alone (auth off on the gateway): the URL, no token.
        let mut cfg = ClusterConfig::default();
        cfg.gateway.url = Some(url.into());
        let mut p = pod();
        run(&mut p, &settings(), &cfg, native).unwrap();
        let sc = sidecar_of(&p);
        assert_eq!(
            env_of(sc, "ASYA_GATEWAY_URL").unwrap(),
            &env("ASYA_GATEWAY_URL", url),
            "native={native}"
        );
        assert!(
            env_of(sc, "ASYA_GATEWAY_TOKEN").is_none(),
            "native={native}"
        );
        // Only the sidecar reports: the runtime container gets neither.
        let rt = p
            .spec
            .as_ref()
            .unwrap()
            .containers
            .iter()
            .find(|c| c.name == "main")
            .unwrap();
        assert!(env_of(rt, "ASYA_GATEWAY_URL").is_none(), "native={native}");

        // With the sidecars' token: from the Secret, never inline.
        cfg.gateway.token_secret_ref = Some(asya_api::config::SecretKeySelector {
            name: "gw-sidecar".into(),
            key: "token".into(),
        });
        let mut p = pod();
        run(&mut p, &settings(), &cfg, native).unwrap();
        let sc = sidecar_of(&p);
        assert_eq!(
            env_of(sc, "ASYA_GATEWAY_URL").unwrap().value.as_deref(),
            Some(url)
        );
        let token = env_of(sc, "ASYA_GATEWAY_TOKEN").unwrap();
        assert_eq!(token.value, None, "credentials never inline");
        let sk = token
            .value_from
            .as_ref()
            .and_then(|v| v.secret_key_ref.as_ref())
            .unwrap();
        assert_eq!((sk.name.as_str(), sk.key.as_str()), ("gw-sidecar", "token"));
        assert_eq!(
            sk.optional,
            Some(true),
            "a pod starts without its report token"
        );
    }
}

#[test]
fn container_choice_errors() {
    let cfg = ClusterConfig::default();
    let mut p = pod();
    p.spec.as_mut().unwrap().containers.push(Container {
        name: "other".into(),
        ..Default::default()
    });
    assert_eq!(
        run(&mut p, &settings(), &cfg, true),
        Err(InjectError::NoRuntimeContainer(2))
    );
    p.spec.as_mut().unwrap().containers[1].name = "asya-runtime".into();
    run(&mut p, &settings(), &cfg, true).unwrap();
    let s = p.spec.unwrap();
    assert_eq!(
        s.containers[0].command, None,
        "only the runtime container is changed"
    );
    assert!(s.containers[1].command.is_some());
    let mut empty = pod();
    empty.spec.as_mut().unwrap().containers.clear();
    assert_eq!(
        run(&mut empty, &settings(), &cfg, true),
        Err(InjectError::NoContainers)
    );
    let mut a = settings();
    a.transport = "kafka".into();
    assert!(matches!(
        run(&mut pod(), &a, &cfg, true),
        Err(InjectError::UnknownTransport(..))
    ));
}

/// The sidecar container's environment, as the kubelet resolves it, parses back into the
/// settings the sidecar reads: the injected values arrive under the contract's names.
#[test]
fn the_injected_env_parses_back_as_the_sidecars_settings() {
    use asya_api::sidecar_settings::{SidecarSettings, Sourced, TransportSettings};
    for native in [true, false] {
        let mut p = pod();
        run(&mut p, &settings(), &ClusterConfig::default(), native).unwrap();
        let env = sidecar_of(&p).env.clone().unwrap_or_default();
        let get = |name: &str| {
            let e = env.iter().find(|e| e.name == name)?;
            match (&e.value, &e.value_from) {
                (Some(v), _) => Some(v.clone()),
                // The pod's namespace, or a Secret's key.
                (None, Some(src)) if src.field_ref.is_some() => Some("team-a".into()),
                (None, Some(_)) => Some("from-a-secret".into()),
                (None, None) => None,
            }
        };
        let s = SidecarSettings::from_vars(&get).unwrap();
        assert_eq!(s.actor, "echo");
        assert_eq!(s.namespace, Sourced::Value("team-a".into()));
        // `$(ASYA_NAMESPACE)` is what the kubelet expands; the sidecar reads the result.
        assert!(matches!(
            &s.transport,
            TransportSettings::RabbitMq { exchange: Some(x), .. } if x == "asya.$(ASYA_NAMESPACE)"
        ));
        assert_eq!(s.socket_dir, SOCKET_DIR);
        assert_eq!(s.runtime_timeout.as_deref(), Some("300s"));
        assert_eq!(
            s.resiliency_json.as_deref(),
            Some(r#"{"actorTimeout":"5m"}"#)
        );
        assert_eq!(s.handler_mode.as_deref(), Some("payload"));
        assert_eq!(s.metrics_addr.as_deref(), Some("0.0.0.0:8080"));
        assert_eq!(s.gateway, None);
    }
}

#[test]
fn the_sidecar_gets_the_platforms_sqs_keys_only_when_they_are_shared() {
    let text = |share: bool| {
        format!(
            "defaultTransport: sqs\ntransports:\n  sqs:\n    type: sqs\n    config: {{region: us-east-1, credentialsSecretRef: {{name: sqs-credentials}}, shareStaticCredentials: {share}}}\n"
        )
    };
    let mut a = settings();
    a.transport = "sqs".into();
    for share in [false, true] {
        let cfg = ClusterConfig::from_yaml(&text(share)).unwrap();
        let mut p = pod();
        run(&mut p, &a, &cfg, true).unwrap();
        let s = p.spec.unwrap();
        let sc = s
            .init_containers
            .iter()
            .flatten()
            .find(|c| c.name == "asya-sidecar")
            .expect("native sidecar");
        let key = env_of(sc, "AWS_ACCESS_KEY_ID");
        if share {
            let r = key.and_then(|e| e.value_from.as_ref()?.secret_key_ref.as_ref());
            assert_eq!(r.map(|r| r.name.as_str()), Some("sqs-credentials"));
        } else {
            // IRSA: the pod's ServiceAccount identity, no static keys.
            assert!(key.is_none(), "{key:?}");
            assert!(env_of(sc, "AWS_SECRET_ACCESS_KEY").is_none());
        }
    }
}

/// `shareAdminCredentials: true` keeps the pre-tenancy env: the platform's password from the
/// copied Secret, the platform exchange (the sidecar's default).
#[test]
fn shared_admin_credentials_keep_the_platform_identity() {
    let mut cfg = ClusterConfig::default();
    let t = cfg.transports.get_mut("rabbitmq").unwrap();
    t.config.share_admin_credentials = true;
    let mut p = pod();
    run(&mut p, &settings(), &cfg, true).unwrap();
    let sc = sidecar_of(&p);
    let pw = env_of(sc, "ASYA_RABBITMQ_PASSWORD").unwrap();
    let sk = pw
        .value_from
        .as_ref()
        .unwrap()
        .secret_key_ref
        .as_ref()
        .unwrap();
    assert_eq!(
        (sk.name.as_str(), sk.key.as_str()),
        ("rabbitmq-secret", "password")
    );
    assert_eq!(
        env_of(sc, "ASYA_RABBITMQ_URL").unwrap().value.as_deref(),
        Some("amqp://guest:$(ASYA_RABBITMQ_PASSWORD)@rabbitmq:5672/%2F")
    );
    assert!(env_of(sc, "ASYA_RABBITMQ_EXCHANGE").is_none());
    assert!(env_of(sc, "ASYA_RABBITMQ_USERNAME").is_none());
}

/// The settings of `echo` with two state proxies: our connector image (buffered) and a
/// foreign one (passthrough).
pub(crate) fn settings_with_state() -> ActorSettings {
    let mut a = settings();
    a.state_proxy = serde_json::from_value(json!([
        {"name": "checkpoints", "mount": {"path": "/state/checkpoints"},
         "connector": {"image": "ghcr.io/asya-rs/asya-state-proxy:0.1.0", "imagePullPolicy": "Never",
                       "env": [{"name": "ASYA_CONNECTOR", "value": "s3-buffered-lww"},
                               {"name": "STATE_BUCKET", "value": "ckpt"}],
                       "resources": {"requests": {"cpu": "50m"}}}},
        {"name": "media", "mount": {"path": "/state/media"}, "writeMode": "passthrough",
         "connector": {"image": "ghcr.io/deliveryhero/asya-state-proxy-s3-passthrough:v1.0.0"}}
    ]))
    .unwrap();
    a
}

fn names(cs: &[Container]) -> Vec<&str> {
    cs.iter().map(|c| c.name.as_str()).collect()
}

#[test]
fn state_proxies_are_native_sidecars_after_the_asya_sidecar_and_the_runtime_points_at_them() {
    let cfg = ClusterConfig::default();
    let mut p = pod();
    run(&mut p, &settings_with_state(), &cfg, true).unwrap();
    let s = p.spec.as_ref().unwrap();
    let inits = s.init_containers.as_ref().unwrap();
    assert_eq!(
        names(inits),
        [
            "asya-install-runtime",
            "asya-sidecar",
            "asya-state-proxy-checkpoints",
            "asya-state-proxy-media",
            "user-init"
        ]
    );
    let ck = &inits[2];
    assert_eq!(ck.restart_policy.as_deref(), Some("Always"));
    assert_eq!(
        ck.image.as_deref(),
        Some("ghcr.io/asya-rs/asya-state-proxy:0.1.0")
    );
    assert_eq!(ck.image_pull_policy.as_deref(), Some("Never"));
    let env_names: Vec<_> = ck
        .env
        .as_ref()
        .unwrap()
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(
        env_names,
        [
            "ASYA_CONNECTOR",
            "STATE_BUCKET",
            "CONNECTOR_SOCKET",
            "ASYA_NAMESPACE"
        ]
    );
    // The pod's own namespace, which the connector confines every key to.
    assert_eq!(
        env_of(ck, "ASYA_NAMESPACE")
            .and_then(|e| e.value_from.as_ref())
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str()),
        Some("metadata.namespace")
    );
    assert_eq!(
        env_of(ck, "CONNECTOR_SOCKET").unwrap().value.as_deref(),
        Some("/var/run/asya/state/checkpoints.sock")
    );
    assert_eq!(
        ck.resources.as_ref().unwrap().requests.as_ref().unwrap()["cpu"].0,
        "50m"
    );
    let mounts: Vec<_> = ck
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| (m.name.as_str(), m.mount_path.as_str()))
        .collect();
    assert_eq!(
        mounts,
        [
            ("state-sockets", "/var/run/asya/state"),
            (NO_API_TOKEN_VOLUME, API_TOKEN_PATH)
        ]
    );
    // Our image: probes run its healthcheck; the startup probe holds the runtime back.
    let cmd = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        p.as_ref()
            .unwrap()
            .exec
            .as_ref()
            .unwrap()
            .command
            .clone()
            .unwrap()
    };
    assert_eq!(cmd(&ck.startup_probe), HEALTHCHECK);
    assert_eq!(cmd(&ck.readiness_probe), HEALTHCHECK);
    assert!(
        ck.liveness_probe.is_none(),
        "a probe must not kill an upload in flight"
    );
    // A foreign image: no probe (its binary is unknown); the runtime waits for /healthz.
    let media = &inits[3];
    assert!(media.startup_probe.is_none() && media.readiness_probe.is_none());
    assert_eq!(media.image_pull_policy, None);

    let rt = &s.containers[0];
    assert_eq!(s.containers.len(), 1);
    assert_eq!(
        env_of(rt, "ASYA_STATE_PROXY_MOUNTS")
            .unwrap()
            .value
            .as_deref(),
        Some("checkpoints:/state/checkpoints:write=buffered;media:/state/media:write=passthrough")
    );
    let rt_mounts: Vec<_> = rt
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert_eq!(
        rt_mounts,
        ["/var/run/asya", "/opt/asya", "/var/run/asya/state"]
    );
    let vols = s.volumes.as_ref().unwrap();
    let state_vol: Vec<_> = vols.iter().filter(|v| v.name == "state-sockets").collect();
    assert_eq!(state_vol.len(), 1);
    assert!(state_vol[0].empty_dir.is_some());

    let once = p.clone();
    run(&mut p, &settings_with_state(), &cfg, true).unwrap();
    assert_eq!(p, once, "second pass changes nothing");
}

#[test]
fn state_proxies_are_regular_containers_without_native_sidecars_and_stale_ones_are_replaced() {
    let cfg = ClusterConfig::default();
    let mut p: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"asya.sh/inject": "true"}},
        "spec": {"containers": [
            {"name": "asya-state-proxy-old", "image": "old:0"},
            {"name": "asya-runtime", "image": "python:3.13"}],
            "initContainers": [{"name": "asya-state-proxy-older", "image": "old:0"}]}
    }))
    .unwrap();
    run(&mut p, &settings_with_state(), &cfg, false).unwrap();
    let s = p.spec.as_ref().unwrap();
    assert_eq!(
        names(&s.containers),
        [
            "asya-runtime",
            "asya-sidecar",
            "asya-state-proxy-checkpoints",
            "asya-state-proxy-media"
        ]
    );
    assert_eq!(
        names(s.init_containers.as_ref().unwrap()),
        ["asya-install-runtime"]
    );
    assert!(s.containers[2].restart_policy.is_none());
    assert!(env_of(&s.containers[0], "ASYA_STATE_PROXY_MOUNTS").is_some());
}

#[test]
fn without_state_proxies_nothing_of_them_is_injected() {
    let mut p = pod();
    run(&mut p, &settings(), &ClusterConfig::default(), true).unwrap();
    let s = p.spec.as_ref().unwrap();
    assert!(
        !s.volumes
            .as_ref()
            .unwrap()
            .iter()
            .any(|v| v.name == "state-sockets")
    );
    assert!(env_of(&s.containers[0], "ASYA_STATE_PROXY_MOUNTS").is_none());
}

#[test]
fn tracing_on_gives_the_sidecar_the_standard_otel_variables_after_its_namespace() {
    let cfg = ClusterConfig {
        tracing: asya_api::telemetry::TracingConfig {
            enabled: true,
            otlp_endpoint: "http://jaeger.default.svc:4318".into(),
            sampling_ratio: 0.5,
            ..Default::default()
        },
        ..ClusterConfig::default()
    };
    let mut p = pod();
    run(&mut p, &settings(), &cfg, true).unwrap();
    let s = p.spec.as_ref().unwrap();
    let sidecar = s
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == labels::SIDECAR_CONTAINER)
        .unwrap();
    let value = |n: &str| env_of(sidecar, n).and_then(|e| e.value.clone());
    assert_eq!(value("OTEL_SERVICE_NAME").as_deref(), Some("echo"));
    assert_eq!(
        value("OTEL_EXPORTER_OTLP_ENDPOINT").as_deref(),
        Some("http://jaeger.default.svc:4318")
    );
    assert_eq!(value("OTEL_TRACES_SAMPLER_ARG").as_deref(), Some("0.5"));
    // Kubernetes expands $(VAR) only from variables listed earlier in the container.
    let names: Vec<&str> = sidecar
        .env
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .collect();
    let ns = names
        .iter()
        .position(|n| *n == sidecar_env::NAMESPACE)
        .unwrap();
    let attrs = names
        .iter()
        .position(|n| *n == "OTEL_RESOURCE_ATTRIBUTES")
        .unwrap();
    assert!(ns < attrs, "{names:?}");
    // The user's container gets none of it: the runtime does not trace.
    let rt = &s.containers[0];
    assert!(env_of(rt, "OTEL_SERVICE_NAME").is_none());
}

#[test]
fn tracing_off_adds_no_otel_variable() {
    let mut p = pod();
    run(&mut p, &settings(), &ClusterConfig::default(), true).unwrap();
    let s = p.spec.as_ref().unwrap();
    let all = s
        .containers
        .iter()
        .chain(s.init_containers.iter().flatten());
    for c in all {
        for e in c.env.iter().flatten() {
            assert!(!e.name.starts_with("OTEL_"), "{} in {}", e.name, c.name);
        }
    }
}

#[test]
fn prometheus_annotations_name_the_sidecar_metrics_port_when_monitoring_annotations_is_on() {
    let mut cfg = ClusterConfig::default();
    cfg.sidecar.metrics_port = 9464;
    cfg.monitoring.annotations = true;
    let mut p = pod();
    run(&mut p, &settings(), &cfg, true).unwrap();
    let ann = p.metadata.annotations.as_ref().unwrap();
    assert_eq!(
        ann.get("prometheus.io/scrape").map(String::as_str),
        Some("true")
    );
    assert_eq!(
        ann.get("prometheus.io/port").map(String::as_str),
        Some("9464")
    );
    assert_eq!(
        ann.get("prometheus.io/path").map(String::as_str),
        Some("/metrics")
    );

    let mut plain = pod();
    run(&mut plain, &settings(), &ClusterConfig::default(), true).unwrap();
    let ann = plain.metadata.annotations.as_ref().unwrap();
    assert!(!ann.contains_key("prometheus.io/scrape"));
}

#[test]
fn a_connector_on_the_platform_redis_gets_the_namespace_user_and_no_shared_password() {
    let mut cfg = ClusterConfig::default();
    cfg.state_proxy.redis = Some(asya_api::config::PlatformRedis {
        url: "redis://redis.asya.svc:6379".into(),
        admin_username: "default".into(),
        admin_password_secret_ref: asya_api::config::SecretKeySelector {
            name: "redis-admin".into(),
            key: "password".into(),
        },
    });
    let mut a = settings();
    a.state_proxy = serde_json::from_value(json!([
        {"name": "cache", "mount": {"path": "/state/cache"},
         "connector": {"image": "asya-state-proxy",
                       "env": [{"name": "ASYA_CONNECTOR", "value": "redis-buffered-cas"}]}},
        {"name": "own", "mount": {"path": "/state/own"},
         "connector": {"image": "asya-state-proxy",
                       "env": [{"name": "ASYA_CONNECTOR", "value": "redis-buffered-cas"},
                               {"name": "REDIS_URL", "value": "redis://theirs:6379"}]}}
    ]))
    .unwrap();
    let mut p = pod();
    run(&mut p, &a, &cfg, true).unwrap();
    let inits = p.spec.as_ref().unwrap().init_containers.clone().unwrap();
    let cache = inits
        .iter()
        .find(|c| c.name == "asya-state-proxy-cache")
        .unwrap();
    assert_eq!(
        env_of(cache, "REDIS_URL").unwrap().value.as_deref(),
        Some("redis://redis.asya.svc:6379")
    );
    for (var, key) in [
        ("REDIS_USERNAME", "username"),
        ("REDIS_PASSWORD", "password"),
    ] {
        let r = env_of(cache, var)
            .and_then(|e| e.value_from.as_ref())
            .and_then(|v| v.secret_key_ref.as_ref())
            .unwrap_or_else(|| panic!("{var} from a Secret"));
        assert_eq!((r.name.as_str(), r.key.as_str()), ("asya-state-redis", key));
    }
    // The admin's Secret reaches no container.
    let text = serde_json::to_string(&p).unwrap();
    assert!(!text.contains("redis-admin"), "{text}");
    // Another Redis: the entry's URL as written, no namespace user.
    let own = inits
        .iter()
        .find(|c| c.name == "asya-state-proxy-own")
        .unwrap();
    assert_eq!(
        env_of(own, "REDIS_URL").unwrap().value.as_deref(),
        Some("redis://theirs:6379")
    );
    assert!(env_of(own, "REDIS_PASSWORD").is_none());
    assert!(env_of(own, "ASYA_NAMESPACE").is_some());
}
