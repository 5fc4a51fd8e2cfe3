//! Which identity the command acts with on a transport: always the namespace's own, never the
//! platform's (docs/DESIGN.md §9). Pure: says which Secret and keys to read and which
//! exchange to publish through; `broker` does the reading and connecting.

use asya_api::config::{ClusterConfig, Transport};
use asya_api::naming;

use crate::error::CliError;

/// The Secret (in the caller's namespace) holding the identity, and its keys.
#[derive(Debug, Clone, PartialEq)]
pub enum Identity {
    /// RabbitMQ: user and password from the Secret; publishes through `exchange`.
    Rabbit {
        secret: String,
        /// Key of the user name, or the configured user name itself (shared credentials).
        user: UserFrom,
        password_key: String,
        exchange: String,
    },
    /// SQS with the platform's static keys copied into the namespace
    /// (`shareStaticCredentials`).
    SqsStatic {
        secret: String,
        access_key_id_key: String,
        secret_access_key_key: String,
    },
    /// SQS without copied keys: the caller's own AWS identity (environment, profile, SSO),
    /// which must be allowed on the namespace's queues.
    SqsAmbient,
}

#[derive(Debug, Clone, PartialEq)]
pub enum UserFrom {
    Key(String),
    Fixed(String),
}

/// The transport to use: `--transport`, else the configuration's default; refused when it is
/// not configured or disabled, naming the ones that are.
pub fn transport<'a>(
    config: &'a ClusterConfig,
    asked: Option<&str>,
) -> Result<(&'a str, &'a Transport), CliError> {
    let name = asked.unwrap_or(&config.default_transport);
    match config.transports.get_key_value(name) {
        Some((n, t)) if t.enabled => Ok((n.as_str(), t)),
        found => Err(CliError::Usage(format!(
            "--transport {name:?}: {} in the release's configuration (enabled: {})",
            if found.is_some() {
                "disabled"
            } else {
                "not configured"
            },
            config.enabled_transports().join(", ")
        ))),
    }
}

/// The identity for `namespace` on `transport` (named `name`).
pub fn identity(name: &str, transport: &Transport, namespace: &str) -> Result<Identity, CliError> {
    let c = &transport.config;
    if transport.is_rabbitmq() {
        if transport.shares_admin_credentials() {
            let r = c.password_secret_ref.as_ref().ok_or_else(|| {
                CliError::Usage(format!(
                    "transport {name:?} shares admin credentials but names no passwordSecretRef"
                ))
            })?;
            return Ok(Identity::Rabbit {
                secret: r.name.clone(),
                user: UserFrom::Fixed(c.username.clone().unwrap_or_else(|| "guest".into())),
                password_key: r.key.clone(),
                exchange: naming::RABBITMQ_EXCHANGE.to_string(),
            });
        }
        return Ok(Identity::Rabbit {
            secret: naming::tenant_broker_secret(name),
            user: UserFrom::Key(naming::BROKER_SECRET_USERNAME.into()),
            password_key: naming::BROKER_SECRET_PASSWORD.into(),
            exchange: naming::tenant_exchange(namespace),
        });
    }
    match (
        &c.credentials_secret_ref,
        transport.shares_static_credentials(),
    ) {
        (Some(r), true) => Ok(Identity::SqsStatic {
            secret: r.name.clone(),
            access_key_id_key: r.access_key_id_key.clone(),
            secret_access_key_key: r.secret_access_key_key.clone(),
        }),
        _ => Ok(Identity::SqsAmbient),
    }
}

/// Why the namespace's identity Secret is missing, in words an on-call engineer can act on.
pub fn missing_secret(secret: &str, namespace: &str) -> CliError {
    CliError::NotFound {
        what: format!("Secret {secret:?} in namespace {namespace:?}"),
        why: "the provisioner keeps the namespace's broker identity there once the namespace has an AsyncActor; \
              create an actor first, or check that the provisioner reconciles this namespace (`asya status`)"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> ClusterConfig {
        ClusterConfig::from_yaml(yaml).unwrap()
    }

    #[test]
    fn rabbitmq_uses_the_namespace_identity_and_exchange() {
        let c = ClusterConfig::default();
        let (name, t) = transport(&c, None).unwrap();
        assert_eq!(
            identity(name, t, "team").unwrap(),
            Identity::Rabbit {
                secret: "asya-broker-rabbitmq".into(),
                user: UserFrom::Key("username".into()),
                password_key: "password".into(),
                exchange: "asya.team".into(),
            }
        );
    }

    #[test]
    fn shared_credentials_use_the_copied_secret_and_the_platform_exchange() {
        let c = config(
            "transports:\n  rabbitmq:\n    type: rabbitmq\n    config:\n      host: mq\n      username: admin\n      shareAdminCredentials: true\n      passwordSecretRef: {name: mq-pw, key: pw}\n",
        );
        let (name, t) = transport(&c, Some("rabbitmq")).unwrap();
        assert_eq!(
            identity(name, t, "team").unwrap(),
            Identity::Rabbit {
                secret: "mq-pw".into(),
                user: UserFrom::Fixed("admin".into()),
                password_key: "pw".into(),
                exchange: "asya".into(),
            }
        );
    }

    #[test]
    fn sqs_uses_copied_keys_only_when_shared() {
        let shared = config(
            "defaultTransport: sqs\ntransports:\n  sqs:\n    type: sqs\n    config:\n      region: us-east-1\n      shareStaticCredentials: true\n      credentialsSecretRef: {name: aws}\n",
        );
        let (name, t) = transport(&shared, None).unwrap();
        assert!(
            matches!(identity(name, t, "n").unwrap(), Identity::SqsStatic { secret, .. } if secret == "aws")
        );
        let own = config(
            "defaultTransport: sqs\ntransports:\n  sqs:\n    type: sqs\n    config:\n      region: us-east-1\n",
        );
        let (name, t) = transport(&own, None).unwrap();
        assert_eq!(identity(name, t, "n").unwrap(), Identity::SqsAmbient);
    }

    #[test]
    fn an_unknown_transport_names_the_enabled_ones() {
        let c = ClusterConfig::default();
        let e = transport(&c, Some("kafka")).unwrap_err().to_string();
        assert!(
            e.starts_with("--transport \"kafka\": not configured"),
            "{e}"
        );
    }
}
