//! The namespace's gateway report token Secret (`gateway_report`): its content and labels, a
//! new key or namespace uid changing it, a foreign Secret never written nor deleted, key
//! errors that never show the key.

use asya_api::config::SecretKeySelector;
use asya_api::report_token::ReportKey;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use serde_json::json;

use super::*;

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
const UID: &str = "6f1c2d3e-0000-4000-8000-00000000000a";

fn at() -> SecretKeySelector {
    SecretKeySelector {
        name: "asya-gateway-report".into(),
        key: "token".into(),
    }
}

fn secret(labels: serde_json::Value) -> Secret {
    serde_json::from_value(json!({
        "metadata": {"name": "asya-gateway-report", "namespace": "team", "labels": labels},
        "data": {"token": "c2VjcmV0"}
    }))
    .unwrap()
}

#[test]
fn the_secret_holds_the_namespace_token_under_the_configured_key_and_is_labelled_ours() {
    let token = ReportKey::new(KEY).unwrap().token("team", UID).unwrap();
    let s = render("team", &at(), &token);
    assert_eq!(s.metadata.name.as_deref(), Some("asya-gateway-report"));
    assert_eq!(s.metadata.namespace.as_deref(), Some("team"));
    let data = s.data.as_ref().unwrap();
    assert_eq!(data.len(), 1);
    // The gateway's pinned form: the provisioner issues what the gateway verifies.
    assert_eq!(
        data["token"],
        ByteString(
            b"asya-report.team.6f1c2d3e-0000-4000-8000-00000000000a.\
              6b1787da0ae60378cb4eeede15fde29952a44f86caf5282e4f466e228efeac11"
                .to_vec()
        )
    );
    let claim = ReportKey::new(KEY)
        .unwrap()
        .verify(std::str::from_utf8(&data["token"].0).unwrap())
        .unwrap();
    assert_eq!(
        (claim.namespace.as_str(), claim.uid.as_str()),
        ("team", UID)
    );
    let labels = s.metadata.labels.as_ref().unwrap();
    assert_eq!(
        labels["app.kubernetes.io/managed-by"],
        "asya-queue-provisioner"
    );
    assert_eq!(
        labels["app.kubernetes.io/component"],
        "gateway-report-token"
    );
    assert!(is_ours(&s));
    assert!(
        s.metadata.owner_references.is_none(),
        "shared by the namespace's actors"
    );
}

#[test]
fn a_new_key_or_a_new_namespace_uid_changes_what_is_applied() {
    let a = ReportKey::new(KEY).unwrap().token("team", UID).unwrap();
    let b = ReportKey::new(b"another key of at least 32 bytes!!")
        .unwrap()
        .token("team", UID)
        .unwrap();
    let c = ReportKey::new(KEY)
        .unwrap()
        .token("team", "6f1c2d3e-0000-4000-8000-00000000000b")
        .unwrap();
    let hash = |t: &str| desired_hash(&render("team", &at(), t));
    assert_ne!(hash(&a), hash(&b));
    assert_ne!(hash(&a), hash(&c));
}

#[test]
fn a_secret_we_did_not_create_is_never_written_nor_deleted() {
    let ours = secret(json!({"app.kubernetes.io/managed-by": "asya-queue-provisioner"}));
    let theirs = secret(json!({"app.kubernetes.io/managed-by": "helm"}));
    let bare = secret(json!(null));
    assert_eq!(issue_step(None), Issue::Apply);
    assert_eq!(issue_step(Some(&ours)), Issue::Apply);
    assert_eq!(issue_step(Some(&theirs)), Issue::Foreign);
    assert_eq!(issue_step(Some(&bare)), Issue::Foreign);

    assert_eq!(release_step(true, Some(&ours)), Release::Keep);
    assert_eq!(release_step(false, Some(&ours)), Release::Delete);
    assert_eq!(release_step(false, Some(&theirs)), Release::Leave);
    assert_eq!(release_step(false, None), Release::Leave);

    let note = foreign_note("team", "asya-gateway-report");
    assert!(
        note.starts_with(
            "Secret team/asya-gateway-report (gateway.tokenSecretRef) exists without the label \
             app.kubernetes.io/managed-by=asya-queue-provisioner"
        ),
        "{note}"
    );
}

#[test]
fn key_errors_name_the_secret_and_key_but_never_the_content() {
    let key_at = SecretKeySelector {
        name: "asya-gateway-report-key".into(),
        key: "key".into(),
    };
    let with = |data: serde_json::Value| -> Secret {
        serde_json::from_value(
            json!({"metadata": {"name": "asya-gateway-report-key"}, "data": data}),
        )
        .unwrap()
    };
    let e = key_from("asya-system", &key_at, None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Secret asya-system/asya-gateway-report-key (gateway.reportKeySecretRef) does not exist"
    );
    let e = key_from(
        "asya-system",
        &key_at,
        Some(&with(json!({"other": "eA=="}))),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "Secret asya-system/asya-gateway-report-key (gateway.reportKeySecretRef) has no key \"key\""
    );
    // "short-secret" in base64.
    let e = key_from(
        "asya-system",
        &key_at,
        Some(&with(json!({"key": "c2hvcnQtc2VjcmV0"}))),
    )
    .unwrap_err();
    let text = e.to_string();
    assert_eq!(
        text,
        "Secret asya-system/asya-gateway-report-key key \"key\" (gateway.reportKeySecretRef): \
         the report key has 12 bytes; at least 32 are required"
    );
    assert!(!text.contains("short-secret"));
    let good = serde_json::to_value(ByteString(KEY.to_vec())).unwrap();
    let k = key_from("asya-system", &key_at, Some(&with(json!({"key": good})))).unwrap();
    assert_eq!(
        k.token("team", UID).unwrap(),
        ReportKey::new(KEY).unwrap().token("team", UID).unwrap()
    );
}
