use super::*;
use serde_json::json;

fn entries(v: serde_json::Value) -> Vec<StateProxy> {
    serde_json::from_value(v).unwrap()
}

fn one(name: &str, path: &str) -> serde_json::Value {
    json!({"name": name, "mount": {"path": path}, "connector": {"image": "ghcr.io/asya-rs/asya-state-proxy:1"}})
}

fn messages(v: serde_json::Value) -> Vec<String> {
    validate(&entries(v))
        .iter()
        .map(ToString::to_string)
        .collect()
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
