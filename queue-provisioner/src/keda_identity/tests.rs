//! KEDA's RabbitMQ identity (`keda_identity`): the monitor user reads statistics only, its
//! Secret in KEDA's namespace, TLS, the refusal without the management API, SQS without one,
//! a restart keeping the password, a foreign Secret left alone.

use std::collections::BTreeMap;

use asya_api::config::ClusterConfig;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

use super::*;

fn rabbit(config: &str) -> ClusterConfig {
    ClusterConfig::from_yaml(&format!(
        "transports:\n  rabbitmq:\n    type: rabbitmq\n    config: {config}\n"
    ))
    .expect("config parses")
}

fn data(s: &Secret, key: &str) -> String {
    String::from_utf8_lossy(&s.data.as_ref().unwrap()[key].0).into_owned()
}

#[test]
fn the_monitor_reads_statistics_only_and_its_secret_lives_in_kedas_namespace() {
    let cfg = rabbit(
        "{host: 10.0.0.5, port: 5672, managementPort: 15672, vhost: team/a, username: admin}",
    );
    let p = plan("rabbitmq", &cfg.transports["rabbitmq"], "keda", "s3cret")
        .unwrap()
        .expect("a rabbitmq transport has a monitor");
    assert_eq!(p.user, json!({"password": "s3cret", "tags": "monitoring"}));
    assert_eq!(
        p.permissions,
        json!({"configure": "^$", "write": "^$", "read": "^$"})
    );
    assert_eq!(p.vhost, "team/a");
    assert_eq!(
        p.secret.metadata.name.as_deref(),
        Some("asya-keda-rabbitmq")
    );
    assert_eq!(p.secret.metadata.namespace.as_deref(), Some("keda"));
    // The monitor's URL, never the admin's: the management API over http without TLS.
    assert_eq!(
        data(&p.secret, "host"),
        "http://asya-keda-monitor:s3cret@10.0.0.5:15672/team%2Fa"
    );
    assert_eq!(data(&p.secret, "password"), "s3cret");
    let cta = &p.cluster_trigger_authentication;
    assert_eq!(cta["kind"], "ClusterTriggerAuthentication");
    assert_eq!(cta["metadata"]["name"], "asya-rabbitmq");
    assert!(cta["metadata"].get("namespace").is_none(), "cluster-scoped");
    assert_eq!(
        cta["spec"]["secretTargetRef"],
        json!([{"parameter": "host", "name": "asya-keda-rabbitmq", "key": "host"}])
    );
    assert_eq!(
        cta["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "asya-queue-provisioner"
    );
}

#[test]
fn https_when_amqp_uses_tls() {
    let cfg = rabbit("{host: mq.example.com, port: 5671, managementPort: 15671}");
    let p = plan("rabbitmq", &cfg.transports["rabbitmq"], "keda", "pw")
        .unwrap()
        .unwrap();
    assert!(
        data(&p.secret, "host").starts_with("https://asya-keda-monitor:pw@mq.example.com:15671/")
    );
}

#[test]
fn without_the_management_api_the_refusal_names_the_setting() {
    // Only a configuration that shares the admin credentials may lack the management API.
    let cfg = rabbit("{host: h, shareAdminCredentials: true}");
    let err = plan("rabbitmq", &cfg.transports["rabbitmq"], "keda", "pw").unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("transports.rabbitmq.config.managementPort"),
        "{msg}"
    );
    assert!(msg.contains("asya-keda-monitor"), "{msg}");
}

#[test]
fn sqs_has_no_monitor_identity() {
    let cfg = ClusterConfig::default();
    assert_eq!(
        plan("sqs", &cfg.transports["sqs"], "keda", "pw").unwrap(),
        None
    );
}

fn secret(labels: Option<BTreeMap<String, String>>, password: Option<&str>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            labels,
            ..Default::default()
        },
        data: password
            .map(|p| BTreeMap::from([("password".to_string(), ByteString(p.as_bytes().to_vec()))])),
        ..Default::default()
    }
}

fn ours() -> Option<BTreeMap<String, String>> {
    Some(BTreeMap::from([(
        "app.kubernetes.io/managed-by".to_string(),
        "asya-queue-provisioner".to_string(),
    )]))
}

#[test]
fn a_restart_keeps_the_password_and_a_foreign_secret_is_left_alone() {
    assert_eq!(
        existing_password(None, "keda", "asya-keda-rabbitmq"),
        Ok(None)
    );
    let s = secret(ours(), Some("kept"));
    assert_eq!(
        existing_password(Some(&s), "keda", "n"),
        Ok(Some("kept".into()))
    );
    let s = secret(ours(), Some(""));
    assert_eq!(
        existing_password(Some(&s), "keda", "n"),
        Ok(None),
        "empty: a new one"
    );
    let s = secret(None, Some("theirs"));
    let err = existing_password(Some(&s), "keda", "asya-keda-rabbitmq").unwrap_err();
    assert!(err.to_string().contains("keda/asya-keda-rabbitmq"), "{err}");
    assert!(
        err.to_string()
            .contains("app.kubernetes.io/managed-by=asya-queue-provisioner"),
        "{err}"
    );
}

#[test]
fn generated_passwords_are_long_url_safe_and_differ() {
    let a = generate_password().unwrap();
    let b = generate_password().unwrap();
    assert_ne!(a, b);
    assert!(a.len() >= 40);
    assert!(
        a.bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'),
        "{a}"
    );
}

#[test]
fn the_state_remembers_the_last_outcome_per_transport() {
    let s = IdentityState::default();
    assert_eq!(
        s.problem("rabbitmq"),
        None,
        "not tried yet: no problem to report"
    );
    s.record("rabbitmq", Err("401".into()));
    assert_eq!(s.problem("rabbitmq").as_deref(), Some("401"));
    assert_eq!(s.problem("other"), None);
    s.record("rabbitmq", Ok(()));
    assert_eq!(s.problem("rabbitmq"), None);
}
