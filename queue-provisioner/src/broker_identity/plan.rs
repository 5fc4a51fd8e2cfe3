//! Pure decisions about a namespace's broker identity (docs/DESIGN.md §9): whether its
//! password is kept or generated anew, the Secret that holds it, when the platform's copied
//! credentials may leave a namespace after an upgrade.

use std::collections::BTreeMap;

use asya_api::naming::{self, BROKER_SECRET_PASSWORD, BROKER_SECRET_USERNAME};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, PodSpec, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::render::workload::MANAGED_BY;

/// Put on the Secret (any value) to ask for a new password:
/// `kubectl -n N annotate secret asya-broker-rabbitmq asya.sh/rotate=now`.
pub const ROTATE_ANNOTATION: &str = "asya.sh/rotate";
/// The credential's version: on the Secret, and on the pod template of every workload of the
/// namespace, so that a new password rolls the pods that hold the old one.
pub const VERSION_ANNOTATION: &str = "asya.sh/broker-credential-version";
/// Generated passwords' length (alphanumeric: ~190 bits).
pub const PASSWORD_LEN: usize = 32;

/// What the namespace's identity Secret says, as read from the API server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SecretView {
    pub username: Option<String>,
    pub password: Option<String>,
    pub version: Option<u64>,
    pub rotate: bool,
}

impl SecretView {
    /// The broker identity's Secret.
    pub fn of(s: &Secret) -> SecretView {
        SecretView::read(s, VERSION_ANNOTATION)
    }

    /// A namespace credential's Secret whose version is under `version_annotation` (the
    /// broker's, or the state identity's).
    pub fn read(s: &Secret, version_annotation: &str) -> SecretView {
        let key = |k: &str| {
            s.data
                .as_ref()
                .and_then(|d| d.get(k))
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                .filter(|v| !v.is_empty())
        };
        let annotations = s.metadata.annotations.as_ref();
        SecretView {
            username: key(BROKER_SECRET_USERNAME),
            password: key(BROKER_SECRET_PASSWORD),
            version: annotations
                .and_then(|a| a.get(version_annotation))
                .and_then(|v| v.parse().ok()),
            rotate: annotations.is_some_and(|a| a.contains_key(ROTATE_ANNOTATION)),
        }
    }
}

/// What to do with the namespace's password.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PasswordStep {
    /// The Secret is whole: (re)assert that password on the broker.
    Keep { password: String, version: u64 },
    /// Generate one and write the Secret at `version`; `replace`: the Secret exists (with a
    /// rotation request or damaged) and is replaced whole, annotations included.
    Generate { version: u64, replace: bool },
}

/// Keeps the Secret's password unless it is missing, damaged, names another user, or a
/// rotation was asked for. A new one gets a version above the last and at least `now` (unix
/// seconds): a Secret deleted and made again never repeats a version, so pods always roll.
pub fn password_step(ns: &str, secret: Option<&SecretView>, now: u64) -> PasswordStep {
    let Some(s) = secret else {
        return PasswordStep::Generate {
            version: now.max(1),
            replace: false,
        };
    };
    let next = s.version.unwrap_or(0).saturating_add(1).max(now);
    let user_ok = s.username.as_deref() == Some(naming::tenant_broker_user(ns).as_str());
    match (&s.password, s.version) {
        (Some(p), Some(v)) if user_ok && !s.rotate => PasswordStep::Keep {
            password: p.clone(),
            version: v,
        },
        _ => PasswordStep::Generate {
            version: next,
            replace: true,
        },
    }
}

/// The identity Secret of namespace `ns` for `transport`. Not owned by any one actor (it is
/// shared); removed with the namespace's last actor.
pub fn identity_secret(ns: &str, transport: &str, password: &str, version: u64) -> Secret {
    credential_secret(
        ns,
        &naming::tenant_broker_secret(transport),
        VERSION_ANNOTATION,
        password,
        version,
    )
}

/// A namespace credential's Secret `name` (user `asya-ns-{ns}`), its version under
/// `version_annotation`: the broker identity's, or the state identity's (Redis).
pub fn credential_secret(
    ns: &str,
    name: &str,
    version_annotation: &str,
    password: &str,
    version: u64,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(ns.to_string()),
            labels: Some(BTreeMap::from([(
                MANAGED_BY.0.to_string(),
                MANAGED_BY.1.to_string(),
            )])),
            annotations: Some(BTreeMap::from([(
                version_annotation.to_string(),
                version.to_string(),
            )])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            (
                BROKER_SECRET_USERNAME.to_string(),
                ByteString(naming::tenant_broker_user(ns).into_bytes()),
            ),
            (
                BROKER_SECRET_PASSWORD.to_string(),
                ByteString(password.as_bytes().to_vec()),
            ),
        ])),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

/// Whether a pod spec reads Secret `name` (env, envFrom, volumes, projected volumes).
pub fn spec_uses_secret(spec: &PodSpec, name: &str) -> bool {
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for c in containers {
        for e in c.env.iter().flatten() {
            let r = e
                .value_from
                .as_ref()
                .and_then(|v| v.secret_key_ref.as_ref());
            if r.is_some_and(|r| r.name == name) {
                return true;
            }
        }
        for f in c.env_from.iter().flatten() {
            if f.secret_ref.as_ref().is_some_and(|r| r.name == name) {
                return true;
            }
        }
    }
    spec.volumes.iter().flatten().any(|v| {
        v.secret
            .as_ref()
            .is_some_and(|s| s.secret_name.as_deref() == Some(name))
            || v.projected.as_ref().is_some_and(|p| {
                p.sources
                    .iter()
                    .flatten()
                    .any(|s| s.secret.as_ref().is_some_and(|r| r.name == name))
            })
    })
}

/// After an upgrade from `shareAdminCredentials`: the platform's copied Secret leaves the
/// namespace once no pod there reads it (every pod rolled onto the namespace's identity).
/// A pod still terminating counts: it may still publish.
pub fn platform_copy_removable<'a>(pods: impl IntoIterator<Item = &'a Pod>, copy: &str) -> bool {
    // A pod being deleted starts no container again, so it needs the Secret no more.
    !pods
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.spec.as_ref())
        .any(|s| spec_uses_secret(s, copy))
}

/// A password of [`PASSWORD_LEN`] alphanumerics from the OS's randomness; never logged.
pub fn generate_password() -> Result<String, std::io::Error> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::with_capacity(PASSWORD_LEN);
    let mut buf = [0u8; 64];
    while out.len() < PASSWORD_LEN {
        getrandom::fill(&mut buf).map_err(|e| std::io::Error::other(e.to_string()))?;
        // Rejection sampling: 248 = 4 * 62, so every letter is equally likely.
        for b in buf {
            if b < 248 && out.len() < PASSWORD_LEN {
                out.push(char::from(ALPHABET[usize::from(b) % ALPHABET.len()]));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(user: &str, pw: Option<&str>, version: Option<u64>, rotate: bool) -> SecretView {
        SecretView {
            username: Some(user.into()),
            password: pw.map(String::from),
            version,
            rotate,
        }
    }

    #[test]
    fn a_whole_secret_keeps_its_password_and_anything_else_gets_a_new_version() {
        assert_eq!(
            password_step("n", None, 0),
            PasswordStep::Generate {
                version: 1,
                replace: false
            }
        );
        let whole = view("asya-ns-n", Some("pw"), Some(3), false);
        assert_eq!(
            password_step("n", Some(&whole), 0),
            PasswordStep::Keep {
                password: "pw".into(),
                version: 3
            }
        );
        for damaged in [
            view("asya-ns-n", Some("pw"), Some(3), true),
            view("asya-ns-other", Some("pw"), Some(3), false),
            view("asya-ns-n", None, Some(3), false),
        ] {
            assert_eq!(
                password_step("n", Some(&damaged), 0),
                PasswordStep::Generate {
                    version: 4,
                    replace: true
                },
                "{damaged:?}"
            );
        }
        // Without a version (edited by hand): the first version, replaced.
        assert_eq!(
            password_step("n", Some(&view("asya-ns-n", Some("pw"), None, false)), 0),
            PasswordStep::Generate {
                version: 1,
                replace: true
            }
        );
    }

    #[test]
    fn versions_never_repeat_after_the_secret_was_deleted() {
        assert_eq!(
            password_step("n", None, 1_800_000_000),
            PasswordStep::Generate {
                version: 1_800_000_000,
                replace: false
            }
        );
        let asked = view("asya-ns-n", Some("pw"), Some(1_800_000_000), true);
        assert_eq!(
            password_step("n", Some(&asked), 1_800_000_000),
            PasswordStep::Generate {
                version: 1_800_000_001,
                replace: true
            }
        );
    }

    #[test]
    fn the_secret_reads_back_as_written() {
        let s = identity_secret("n", "rabbitmq", "pw", 7);
        assert_eq!(s.metadata.name.as_deref(), Some("asya-broker-rabbitmq"));
        assert_eq!(
            SecretView::of(&s),
            view("asya-ns-n", Some("pw"), Some(7), false)
        );
        let mut asked = s.clone();
        asked
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(ROTATE_ANNOTATION.into(), "now".into());
        assert!(SecretView::of(&asked).rotate);
    }

    #[test]
    fn passwords_are_long_random_and_alphanumeric() {
        let a = generate_password().unwrap();
        let b = generate_password().unwrap();
        assert_eq!(a.len(), PASSWORD_LEN);
        assert!(a.bytes().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, b);
    }

    #[test]
    fn the_platform_copy_goes_once_no_pod_reads_it() {
        let pod = |secret: &str| -> Pod {
            serde_json::from_value(
                serde_json::json!({"spec": {"containers": [], "initContainers": [
                {"name": "asya-sidecar", "env": [{"name": "ASYA_RABBITMQ_PASSWORD",
                  "valueFrom": {"secretKeyRef": {"name": secret, "key": "password"}}}]}]}}),
            )
            .unwrap()
        };
        let old = pod("rabbitmq-secret");
        let new = pod("asya-broker-rabbitmq");
        assert!(!platform_copy_removable([&old, &new], "rabbitmq-secret"));
        assert!(platform_copy_removable([&new], "rabbitmq-secret"));
        assert!(platform_copy_removable([], "rabbitmq-secret"));
        // An old pod being deleted after the roll holds nothing back.
        let mut going = old.clone();
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(platform_copy_removable([&going, &new], "rabbitmq-secret"));
        let mounted: Pod = serde_json::from_value(serde_json::json!({"spec": {"containers": [],
            "volumes": [{"name": "v", "secret": {"secretName": "rabbitmq-secret"}}]}}))
        .unwrap();
        assert!(!platform_copy_removable([&mounted], "rabbitmq-secret"));
    }
}
