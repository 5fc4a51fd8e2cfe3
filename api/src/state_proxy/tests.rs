//! Every `stateProxy` rule (`state_proxy.rs`, docs/DESIGN.md §10): names, mount paths and
//! their overlaps, write modes, connector image and env, what injection reserves, the
//! platform's Redis and its URL, static AWS keys.

use super::*;
use serde_json::json;

fn entries(v: serde_json::Value) -> Vec<StateProxy> {
    serde_json::from_value(v).unwrap()
}

fn one(name: &str, path: &str) -> serde_json::Value {
    json!({"name": name, "mount": {"path": path}, "connector": {"image": "ghcr.io/asya-rs/asya-state-proxy:1"}})
}

fn messages(v: serde_json::Value) -> Vec<String> {
    messages_with(v, &StateProxyConfig::default())
}

fn messages_with(v: serde_json::Value, cfg: &StateProxyConfig) -> Vec<String> {
    validate(&entries(v), cfg)
        .iter()
        .map(ToString::to_string)
        .collect()
}

fn with_redis() -> StateProxyConfig {
    StateProxyConfig {
        redis: Some(PlatformRedis {
            url: "redis://redis.asya.svc:6379".into(),
            admin_username: "default".into(),
            admin_password_secret_ref: crate::config::SecretKeySelector {
                name: "redis-admin".into(),
                key: "password".into(),
            },
        }),
        ..StateProxyConfig::default()
    }
}

fn connector(env: serde_json::Value) -> serde_json::Value {
    json!([{"name": "s", "mount": {"path": "/state/s"},
            "connector": {"image": "asya-state-proxy", "env": env}}])
}

#[test]
fn a_complete_list_is_accepted() {
    let v = json!([
        {"name": "checkpoints", "mount": {"path": "/state/checkpoints"}, "writeMode": "passthrough",
         "connector": {"image": "i:1", "imagePullPolicy": "Always",
                       "env": [{"name": "ASYA_CONNECTOR", "value": "s3-passthrough"}],
                       "resources": {"requests": {"cpu": "50m"}}}},
        one("cache", "/state/cache"),
        one("c2", "/state/cache2"),
    ]);
    assert_eq!(messages(v), Vec::<String>::new());
}

#[test]
fn names_are_dns_labels_short_enough_for_the_container_name_and_unique() {
    let long = "a".repeat(MAX_NAME_LEN + 1);
    let ok = "a".repeat(MAX_NAME_LEN);
    assert_eq!(container_name(&ok).len(), 63);
    let m = messages(json!([
        one("Bad_Name", "/a"),
        one(&long, "/b"),
        one(&ok, "/c"),
        one("x", "/d"),
        one("x", "/e")
    ]));
    assert_eq!(m.len(), 3, "{m:#?}");
    assert!(m[0].starts_with("spec.stateProxy[0].name: Invalid value: \"Bad_Name\": must be a DNS label of at most 46"), "{}", m[0]);
    assert!(
        m[1].starts_with(&format!(
            "spec.stateProxy[1].name: Invalid value: \"{long}\""
        )),
        "{}",
        m[1]
    );
    assert_eq!(m[2], "spec.stateProxy[4].name: Duplicate value: \"x\"");
}

#[test]
fn mount_paths_must_be_absolute_and_normalised() {
    for (path, rule) in [
        ("state", "must be an absolute path"),
        ("/", "must not be /"),
        ("/state/", "must be normalised"),
        ("/state//x", "must be normalised"),
        ("/state/./x", "must be normalised"),
        ("/state/../etc", "must be normalised"),
        ("/st:ate", "must not contain ':' or ';'"),
        ("/st;ate", "must not contain ':' or ';'"),
    ] {
        let m = messages(json!([one("s", path)]));
        assert_eq!(m.len(), 1, "{path}: {m:?}");
        let want = format!(
            "spec.stateProxy[0].mount.path: Invalid value: {}: {rule}",
            json!(path)
        );
        assert!(m[0].starts_with(&want), "{path}: {}", m[0]);
    }
    let m = messages(json!([{"name": "s", "connector": {"image": "i"}}]));
    assert_eq!(m.len(), 1);
    assert!(
        m[0].starts_with("spec.stateProxy[0].mount.path: Required value"),
        "{}",
        m[0]
    );
}

#[test]
fn mount_paths_stay_off_the_runtimes_own_paths() {
    for path in [
        "/opt/asya",
        "/opt/asya/x",
        "/opt",
        "/var/run/asya/state",
        "/var/run",
        "/var",
        "/tmp",
        "/tmp/x",
    ] {
        let m = messages(json!([one("s", path)]));
        assert_eq!(m.len(), 1, "{path}: {m:?}");
        assert!(
            m[0].contains("must not be on, under or above"),
            "{path}: {}",
            m[0]
        );
    }
    for path in ["/opt/asyax", "/tmpfiles", "/var/lib/state", "/state"] {
        assert_eq!(
            messages(json!([one("s", path)])),
            Vec::<String>::new(),
            "{path}"
        );
    }
}

#[test]
fn mount_paths_are_not_nested_in_one_another() {
    let m = messages(json!([
        one("a", "/state"),
        one("b", "/state/cache"),
        one("c", "/state"),
        one("d", "/statex")
    ]));
    assert_eq!(
        m,
        [
            "spec.stateProxy[1].mount.path: Invalid value: \"/state/cache\": must not be nested with spec.stateProxy[0].mount.path \"/state\": a file would belong to two connectors",
            "spec.stateProxy[2].mount.path: Invalid value: \"/state\": must not be nested with spec.stateProxy[0].mount.path \"/state\": a file would belong to two connectors",
        ]
    );
}

#[test]
fn write_mode_pull_policy_image_and_env_are_checked() {
    let m = messages(json!([
        {"name": "a", "mount": {"path": "/a"}, "writeMode": "async", "connector": {"image": "i", "imagePullPolicy": "Sometimes",
            "env": [{"name": ""}, {"name": "CONNECTOR_SOCKET", "value": "/x"}]}},
        {"name": "b", "mount": {"path": "/b"}},
        {"name": "c", "mount": {"path": "/c"}, "connector": {"image": ""}},
    ]));
    assert_eq!(m.len(), 6, "{m:#?}");
    assert!(
        m[0].starts_with("spec.stateProxy[0].writeMode: Unsupported value: \"async\""),
        "{}",
        m[0]
    );
    assert!(m[0].contains("\"buffered\", \"passthrough\""), "{}", m[0]);
    assert!(
        m[1].starts_with(
            "spec.stateProxy[0].connector.imagePullPolicy: Unsupported value: \"Sometimes\""
        ),
        "{}",
        m[1]
    );
    assert!(
        m[2].starts_with("spec.stateProxy[0].connector.env[0].name: Required value"),
        "{}",
        m[2]
    );
    assert_eq!(
        m[3],
        "spec.stateProxy[0].connector.env[1].name: Forbidden: CONNECTOR_SOCKET is set by injection to /var/run/asya/state/a.sock"
    );
    assert!(
        m[4].starts_with("spec.stateProxy[1].connector.image: Required value"),
        "{}",
        m[4]
    );
    assert!(
        m[5].starts_with("spec.stateProxy[2].connector.image: Required value"),
        "{}",
        m[5]
    );
}

#[test]
fn the_mounts_env_lists_every_entry_with_its_mode() {
    let e = entries(json!([
        one("checkpoints", "/state/checkpoints"),
        {"name": "media", "mount": {"path": "/state/media"}, "writeMode": "passthrough", "connector": {"image": "i"}},
    ]));
    assert_eq!(
        mounts_env(&e),
        "checkpoints:/state/checkpoints:write=buffered;media:/state/media:write=passthrough"
    );
    assert_eq!(socket_path("media"), "/var/run/asya/state/media.sock");
}

#[test]
fn overlap_is_by_whole_segments() {
    assert!(overlaps("/a", "/a"));
    assert!(overlaps("/a/b", "/a"));
    assert!(overlaps("/a", "/a/b"));
    assert!(!overlaps("/ab", "/a"));
    assert!(!overlaps("/a", "/b"));
}

#[test]
fn a_bare_connector_name_takes_the_platform_registry() {
    let configured = "registry.example:5000/platform/asya-state-proxy:0.2.0";
    let cases = [
        ("asya-state-proxy", Some(configured.to_string())),
        (
            "asya-state-proxy:dev",
            Some("registry.example:5000/platform/asya-state-proxy:dev".into()),
        ),
        (
            "asya-state-proxy@sha256:abc",
            Some("registry.example:5000/platform/asya-state-proxy@sha256:abc".into()),
        ),
        // Anything with a registry or another name is the author's choice.
        ("ghcr.io/asya-rs/asya-state-proxy:0.1.0", None),
        ("docker.io/library/asya-state-proxy", None),
        ("asya-state-proxy-fork:1", None),
        ("my/asya-state-proxy", None),
        ("asya-state-proxy:x/y", None),
    ];
    for (image, want) in cases {
        assert_eq!(resolve_image(image, configured), want, "{image}");
    }
    // Already the configured reference: nothing to change.
    assert_eq!(resolve_image(configured, configured), None);
    assert_eq!(
        resolve_image("asya-state-proxy", "asya-state-proxy"),
        None,
        "a bare configured name is left alone"
    );
}

#[test]
fn resolving_a_list_rewrites_only_bare_connector_images() {
    let mut list = entries(json!([
        {"name": "a", "mount": {"path": "/state/a"}, "connector": {"image": "asya-state-proxy:1.2"}},
        {"name": "b", "mount": {"path": "/state/b"}, "connector": {"image": "quay.io/x/conn:3"}},
        {"name": "c", "mount": {"path": "/state/c"}},
    ]));
    resolve_images(&mut list, "localhost/asya-rs/asya-state-proxy:dev");
    let images: Vec<_> = list
        .iter()
        .map(|e| e.connector.as_ref().map(|c| c.image.as_str()))
        .collect();
    assert_eq!(
        images,
        [
            Some("localhost/asya-rs/asya-state-proxy:1.2"),
            Some("quay.io/x/conn:3"),
            None
        ]
    );
}

#[test]
fn our_image_is_recognised_under_any_registry_tag_or_digest() {
    for image in [
        "asya-state-proxy",
        "ghcr.io/asya-rs/asya-state-proxy:0.1.0",
        "localhost:5000/asya-state-proxy@sha256:abc",
        "localhost:5000/x/asya-state-proxy@sha256:ab",
    ] {
        assert!(is_our_image(image), "{image}");
    }
    for image in [
        "asya-state-proxy-fork",
        "ghcr.io/x/other:asya-state-proxy",
        "ghcr.io/deliveryhero/asya-state-proxy-s3-buffered-lww:v1.0.0",
        "asya-state-proxy.evil/other:1",
        "my-asya-state-proxy:1",
    ] {
        assert!(!is_our_image(image), "{image}");
    }
}

#[test]
fn what_injection_sets_cannot_be_set_by_an_entry() {
    for name in [
        "ASYA_NAMESPACE",
        "REDIS_USERNAME",
        "REDIS_PASSWORD",
        "CONNECTOR_SOCKET",
    ] {
        let m = messages(connector(json!([{"name": name, "value": "team-b"}])));
        assert_eq!(m.len(), 1, "{name}: {m:#?}");
        assert!(
            m[0].starts_with("spec.stateProxy[0].connector.env[0].name: Forbidden:")
                && m[0].contains(name),
            "{}",
            m[0]
        );
    }
}

#[test]
fn a_redis_url_carries_no_credentials_and_is_not_quoted_with_them() {
    for url in [
        "redis://:s3cret@r:6379",
        "redis://u:s3cret@r",
        "rediss://admin@r/0",
    ] {
        let m = messages(connector(json!([
            {"name": "ASYA_CONNECTOR", "value": "redis-buffered-cas"},
            {"name": "REDIS_URL", "value": url}])));
        assert_eq!(m.len(), 1, "{url}: {m:#?}");
        assert!(
            m[0].starts_with("spec.stateProxy[0].connector.env[1].value: Invalid value:")
                && m[0].contains("must carry no user or password"),
            "{}",
            m[0]
        );
        assert!(
            !m[0].contains("s3cret") && !m[0].contains("admin@"),
            "{}",
            m[0]
        );
    }
    let m = messages(connector(json!([
        {"name": "ASYA_CONNECTOR", "value": "redis-buffered-cas"},
        {"name": "REDIS_URL", "value": "http://r:6379"}])));
    assert!(m[0].contains("must be redis://"), "{m:#?}");
    // On the platform's Redis, the URL may not come from a Secret (it could hold a password).
    let from_secret = connector(json!([
        {"name": "ASYA_CONNECTOR", "value": "redis-buffered-cas"},
        {"name": "REDIS_URL", "valueFrom": {"secretKeyRef": {"name": "x", "key": "url"}}}]));
    let m = messages_with(from_secret, &with_redis());
    assert_eq!(m.len(), 1, "{m:#?}");
    assert!(
        m[0].starts_with("spec.stateProxy[0].connector.env[1].valueFrom: Forbidden"),
        "{}",
        m[0]
    );
}

#[test]
fn a_redis_connector_needs_a_redis() {
    let bare = connector(json!([{"name": "ASYA_CONNECTOR", "value": "redis-buffered-cas"}]));
    let m = messages(bare.clone());
    assert_eq!(m.len(), 1, "{m:#?}");
    assert!(
        m[0].starts_with("spec.stateProxy[0].connector.env: Required value: REDIS_URL")
            && m[0].contains("stateProxy.redis"),
        "{}",
        m[0]
    );
    assert_eq!(messages_with(bare, &with_redis()), Vec::<String>::new());
}

#[test]
fn which_entries_use_the_platform_redis() {
    let cfg = with_redis();
    let entry = |env: serde_json::Value| entries(connector(env)).remove(0);
    let redis = json!({"name": "ASYA_CONNECTOR", "value": "redis-buffered-cas"});
    assert!(uses_platform_redis(&entry(json!([redis])), &cfg));
    assert!(uses_platform_redis(
        &entry(json!([redis, {"name": "REDIS_URL", "value": "redis://REDIS.asya.svc:6379/2"}])),
        &cfg
    ));
    // Another server, another connector, or no platform Redis: the entry's own business.
    assert!(!uses_platform_redis(
        &entry(json!([redis, {"name": "REDIS_URL", "value": "redis://other:6379"}])),
        &cfg
    ));
    assert!(!uses_platform_redis(
        &entry(json!([redis, {"name": "REDIS_URL", "value": "redis://redis.asya.svc:6380"}])),
        &cfg
    ));
    assert!(!uses_platform_redis(
        &entry(json!([{"name": "ASYA_CONNECTOR", "value": "s3-buffered-lww"}])),
        &cfg
    ));
    assert!(!uses_platform_redis(
        &entry(json!([redis])),
        &StateProxyConfig::default()
    ));
}

#[test]
fn static_aws_keys_are_refused_unless_the_platform_allows_them_with_a_warning() {
    let keyed = connector(json!([
        {"name": "ASYA_CONNECTOR", "value": "s3-buffered-lww"},
        {"name": "AWS_ACCESS_KEY_ID", "value": "AKIA..."},
        {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "k", "key": "s"}}}]));
    let m = messages(keyed.clone());
    assert_eq!(m.len(), 2, "{m:#?}");
    assert!(
        m[0].starts_with("spec.stateProxy[0].connector.env[1].name: Forbidden: AWS_ACCESS_KEY_ID is a static AWS credential")
            && m[0].contains("stateProxy.allowStaticCredentials"),
        "{}",
        m[0]
    );
    assert!(warnings(&entries(keyed.clone()), &StateProxyConfig::default()).is_empty());
    let allowed = StateProxyConfig {
        allow_static_credentials: true,
        ..StateProxyConfig::default()
    };
    assert_eq!(messages_with(keyed.clone(), &allowed), Vec::<String>::new());
    let w = warnings(&entries(keyed), &allowed);
    assert_eq!(w.len(), 1, "{w:#?}");
    assert!(
        w[0].contains("AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY")
            && w[0].contains("role per namespace"),
        "{}",
        w[0]
    );
}

#[test]
fn redis_endpoints_parse_and_compare_by_server() {
    assert_eq!(
        redis_endpoint("redis://Host:6380/1"),
        Ok(RedisEndpoint {
            tls: false,
            host: "host".into(),
            port: 6380
        })
    );
    assert_eq!(
        redis_endpoint("rediss://h"),
        Ok(RedisEndpoint {
            tls: true,
            host: "h".into(),
            port: 6379
        })
    );
    assert_eq!(
        redis_endpoint("redis://[::1]:7000").map(|e| e.port),
        Ok(7000)
    );
    assert!(redis_endpoint("redis://h:x").is_err());
    assert!(redis_endpoint("redis:///0").is_err());
    assert!(redis_endpoint("h:6379").is_err());
}
