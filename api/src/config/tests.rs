//! The cluster configuration's parsing, defaults and checks (`config.rs`), tested.

use super::*;

/// A rabbitmq transport of `yaml` (a flow mapping), with the management port scoped
/// identity needs.
fn rabbit(yaml: &str) -> Transport {
    let inner = yaml.trim().trim_start_matches('{').trim_end_matches('}');
    let text = format!(
        "transports:\n  rabbitmq:\n    type: rabbitmq\n    config: {{managementPort: 15672, {inner}}}\n"
    );
    let c = ClusterConfig::from_yaml(&text).expect("config parses");
    c.transport("rabbitmq").expect("enabled").clone()
}

#[test]
fn amqp_tls_follows_the_setting_then_the_port_never_the_host() {
    // Seed 001's values as written: a cluster-internal host on the plain port.
    let seed = rabbit("{host: rabbitmq.default.svc.cluster.local, port: 5672}");
    assert!(!seed.rabbitmq_tls());
    assert!(!rabbit("{host: rabbitmq.example.com}").rabbitmq_tls());
    assert!(rabbit("{host: rabbitmq.example.com, port: 5671}").rabbitmq_tls());
    assert!(rabbit("{host: rabbitmq.example.com, port: 5672, tls: true}").rabbitmq_tls());
    assert!(!rabbit("{host: 127.0.0.1, port: 5671, tls: false}").rabbitmq_tls());
}

#[test]
fn defaults_enable_both_transports_with_rabbitmq_default() {
    let c = ClusterConfig::default();
    assert_eq!(c.default_transport, "rabbitmq");
    assert_eq!(c.enabled_transports(), vec!["rabbitmq", "sqs"]);
    assert!(c.validate().is_ok());
    assert!(!c.policy.allow_cross_namespace_secret_refs);
    // An empty document means the defaults.
    assert_eq!(ClusterConfig::from_yaml("{}").unwrap(), c);
}

#[test]
fn parses_seed_001_operator_values() {
    let c = ClusterConfig::from_yaml(
        r#"
defaultTransport: sqs
transports:
  rabbitmq:
    enabled: false
    type: rabbitmq
    config: {host: rabbitmq.default.svc.cluster.local, port: 5672, username: guest,
             passwordSecretRef: {name: rabbitmq-secret, key: password}}
  sqs:
    enabled: true
    type: sqs
    config: {region: us-east-1, queueBaseURL: ""}
"#,
    )
    .unwrap();
    assert_eq!(c.enabled_transports(), vec!["sqs"]);
    assert!(c.transport("rabbitmq").is_none());
}

#[test]
fn sharing_static_keys_is_an_sqs_opt_in_that_needs_keys() {
    let base = "defaultTransport: sqs\ntransports:\n  sqs:\n    type: sqs\n    config: ";
    let c = ClusterConfig::from_yaml(&format!(
        "{base}{{region: r, credentialsSecretRef: {{name: k}}}}"
    ))
    .unwrap();
    assert!(!c.transport("sqs").unwrap().shares_static_credentials());
    let c = ClusterConfig::from_yaml(&format!(
        "{base}{{region: r, shareStaticCredentials: true, credentialsSecretRef: {{name: k}}}}"
    ))
    .unwrap();
    assert!(c.transport("sqs").unwrap().shares_static_credentials());
    let err = ClusterConfig::from_yaml(&format!(
        "{base}{{region: r, shareStaticCredentials: true}}"
    ))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("transports.sqs.config.shareStaticCredentials"),
        "{err}"
    );
    assert!(err.contains("credentialsSecretRef"), "{err}");
    let err = ClusterConfig::from_yaml(
            "transports:\n  rabbitmq:\n    type: rabbitmq\n    config: {host: h, shareStaticCredentials: true}",
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("transports.rabbitmq.config.shareStaticCredentials"),
        "{err}"
    );
}

#[test]
fn scoped_identity_needs_the_management_api_unless_credentials_are_shared() {
    let base = "transports:\n  rabbitmq:\n    type: rabbitmq\n    config: {host: r";
    let err = ClusterConfig::from_yaml(&format!("{base}}}\n")).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("transports.rabbitmq.config.managementPort: Required value")
            && msg.contains("shareAdminCredentials: true"),
        "{msg}"
    );
    let shared =
        ClusterConfig::from_yaml(&format!("{base}, shareAdminCredentials: true}}\n")).unwrap();
    assert!(shared.transports["rabbitmq"].shares_admin_credentials());
    let scoped = ClusterConfig::from_yaml(&format!("{base}, managementPort: 15672}}\n")).unwrap();
    assert!(scoped.transports["rabbitmq"].scoped_broker_identity());
    // A disabled transport is not checked; the default is the scoped identity.
    let off = "transports:\n  rabbitmq:\n    type: rabbitmq\n    enabled: false\n    config: {host: r}\n  sqs: {type: sqs, config: {region: r}}\ndefaultTransport: sqs\n";
    assert!(ClusterConfig::from_yaml(off).is_ok());
    assert!(ClusterConfig::default().transports["rabbitmq"].scoped_broker_identity());
}

#[test]
fn rejects_typos_and_bad_defaults() {
    let err = ClusterConfig::from_yaml("policy: {alowedRegistries: []}").unwrap_err();
    assert!(err.to_string().contains("policy"), "{err}");
    assert!(err.to_string().contains("alowedRegistries"), "{err}");
    let err = ClusterConfig::from_yaml("defaultTransport: kafka").unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"cluster configuration is invalid: defaultTransport: Invalid value: "kafka": no such transport; configured: rabbitmq, sqs"#
    );
    let err = ClusterConfig::from_yaml("transports: {x: {type: kafka}}\ndefaultTransport: x")
        .unwrap_err();
    assert!(
        err.to_string()
            .contains(r#"transports.x.type: Unsupported value: "kafka""#),
        "{err}"
    );
}

#[test]
fn flavor_limits_and_excluded_namespaces_as_the_chart_renders_them() {
    let cfg = ClusterConfig::from_yaml(
            "excludedNamespaces: [kube-system, asya-system]\nflavorLimits: {maxBytes: 65536, maxPerNamespace: 4, maxTotal: 100}",
        )
        .unwrap();
    assert!(cfg.namespace_excluded("asya-system") && !cfg.namespace_excluded("team"));
    assert_eq!(
        cfg.flavor_limits,
        FlavorLimits {
            max_bytes: 65536,
            max_per_namespace: 4,
            max_total: 100
        }
    );
    // Unset: the defaults, and no namespace excluded (the offline commands).
    let cfg = ClusterConfig::from_yaml("flavorLimits: {maxTotal: 7}").unwrap();
    assert_eq!(cfg.flavor_limits.max_bytes, DEFAULT_FLAVOR_MAX_BYTES);
    assert_eq!(cfg.flavor_limits.max_total, 7);
    assert!(cfg.excluded_namespaces.is_empty());
    let err = ClusterConfig::from_yaml("flavorLimits: {maxBytes: 0}").unwrap_err();
    assert!(
        err.to_string()
            .contains("flavorLimits.maxBytes: Invalid value: 0: must be >= 1"),
        "{err}"
    );
    let err = ClusterConfig::from_yaml("flavorLimits: {maxByte: 1}").unwrap_err();
    assert!(err.to_string().contains("maxByte"), "{err}");
}

#[test]
fn the_gateway_report_tokens_are_issued_only_with_key_and_token_secret() {
    let cfg = ClusterConfig::from_yaml(
            "gateway:\n  url: http://gw:8080\n  tokenSecretRef: {name: asya-gateway-report, key: token}\n  reportKeySecretRef: {name: asya-gateway-report-key, key: key}\n",
        )
        .unwrap();
    let (key, token) = cfg.gateway.report_tokens().expect("both set");
    assert_eq!(
        (key.name.as_str(), key.key.as_str()),
        ("asya-gateway-report-key", "key")
    );
    assert_eq!(
        (token.name.as_str(), token.key.as_str()),
        ("asya-gateway-report", "token")
    );
    // A token Secret made by hand (no key for the provisioner): not issued.
    let cfg = ClusterConfig::from_yaml(
        "gateway:\n  url: http://gw:8080\n  tokenSecretRef: {name: t, key: token}\n",
    )
    .unwrap();
    assert!(cfg.gateway.report_tokens().is_none());
    assert!(!cfg.gateway.is_off());
    let cfg =
        ClusterConfig::from_yaml("gateway: {reportKeySecretRef: {name: k, key: key}}").unwrap();
    assert!(cfg.gateway.report_tokens().is_none() && !cfg.gateway.is_off());
}

#[test]
fn an_actor_role_pattern_must_name_the_namespace() {
    let sqs = "defaultTransport: sqs\ntransports:\n  sqs: {type: sqs, config: {region: r}}\n";
    // One role per namespace (per actor too, if wanted): accepted.
    for arn in [
        "arn:aws:iam::1:role/asya-{namespace}",
        "arn:aws:iam::1:role/asya-{namespace}-{actor}",
    ] {
        let cfg =
            ClusterConfig::from_yaml(&format!("{sqs}serviceAccount: {{actorRoleArn: '{arn}'}}\n"))
                .unwrap();
        assert_eq!(cfg.service_account.actor_role_arn.as_deref(), Some(arn));
    }
    // One role for every namespace, or one per actor name (the same name in two namespaces
    // is the same role): refused, naming the field, the value and the rule.
    for arn in [
        "arn:aws:iam::1:role/asya-actor-role",
        "arn:aws:iam::1:role/asya-{actor}",
    ] {
        let err =
            ClusterConfig::from_yaml(&format!("{sqs}serviceAccount: {{actorRoleArn: '{arn}'}}\n"))
                .unwrap_err()
                .to_string();
        assert!(
            err.contains(&format!(
                "serviceAccount.actorRoleArn: Invalid value: \"{arn}\": must contain {{namespace}}: one role per namespace"
            )),
            "{err}"
        );
    }
    // Unset: no IRSA, nothing to check.
    assert!(ClusterConfig::from_yaml(sqs).is_ok());
}

#[test]
fn spec_size_and_actor_count_limits() {
    let cfg = ClusterConfig::default();
    assert_eq!(cfg.policy.max_spec_bytes, 64 * 1024);
    assert_eq!(cfg.policy.max_actors_per_namespace, None);
    let cfg = ClusterConfig::from_yaml("policy: {maxSpecBytes: 4096, maxActorsPerNamespace: 20}")
        .unwrap();
    assert_eq!(cfg.policy.max_spec_bytes, 4096);
    assert_eq!(cfg.policy.max_actors_per_namespace, Some(20));
    for (yaml, want) in [
        (
            "policy: {maxSpecBytes: 0}",
            "policy.maxSpecBytes: Invalid value: 0: must be >= 1",
        ),
        (
            "policy: {maxActorsPerNamespace: 0}",
            "policy.maxActorsPerNamespace: Invalid value: 0: must be >= 1 (leave it unset for no limit)",
        ),
    ] {
        let err = ClusterConfig::from_yaml(yaml).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
    }
}
