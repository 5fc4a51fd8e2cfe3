//! Clients of the configured transports, built on first use with the credentials from the
//! secrets the cluster configuration names (read in the provisioner's own namespace).

use std::collections::HashMap;
use std::sync::Arc;

use asya_api::config::{ClusterConfig, TRANSPORT_RABBITMQ};
use asya_api::naming::RABBITMQ_EXCHANGE;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use tokio::sync::Mutex;

use crate::queue::rabbitmq::RabbitQueues;
use crate::queue::sqs::{SqsQueues, StaticCredentials};
use crate::queue::{Backend, QueueError};
use crate::render::{TransportCredentials, amqp_url, management_url};

pub struct Transports {
    config: Arc<ClusterConfig>,
    secrets: Api<Secret>,
    built: Mutex<HashMap<String, (Arc<Backend>, TransportCredentials)>>,
}

async fn secret_key(api: &Api<Secret>, name: &str, key: &str) -> Result<String, QueueError> {
    let s = api
        .get_opt(name)
        .await
        .map_err(|e| QueueError::Unavailable(format!("reading secret {name}: {e}")))?;
    let s = s.ok_or_else(|| {
        QueueError::Rejected(format!(
            "secret {name} (named by the cluster configuration) does not exist in the provisioner's namespace"
        ))
    })?;
    s.data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .ok_or_else(|| QueueError::Rejected(format!("secret {name} has no key {key}")))
}

impl Transports {
    pub fn new(config: Arc<ClusterConfig>, secrets: Api<Secret>) -> Self {
        Transports {
            config,
            secrets,
            built: Mutex::new(HashMap::new()),
        }
    }

    /// The cluster configuration the transports come from.
    pub fn config(&self) -> Arc<ClusterConfig> {
        self.config.clone()
    }

    /// The provisioner's namespace, where the transports' Secrets are read.
    pub fn namespace(&self) -> &str {
        self.secrets.namespace().unwrap_or_default()
    }

    /// The enabled transports' names.
    pub fn enabled(&self) -> Vec<String> {
        self.config
            .enabled_transports()
            .into_iter()
            .map(String::from)
            .collect()
    }

    /// The client and credentials of transport `name`.
    pub async fn get(
        &self,
        name: &str,
    ) -> Result<(Arc<Backend>, TransportCredentials), QueueError> {
        if let Some(b) = self.built.lock().await.get(name) {
            return Ok(b.clone());
        }
        let t = self
            .config
            .transports
            .get(name)
            .filter(|t| t.enabled)
            .ok_or_else(|| {
                QueueError::Rejected(format!(
                    "transport {name} is not enabled in the cluster configuration"
                ))
            })?;
        let c = &t.config;
        let mut creds = TransportCredentials::default();
        let backend = if t.kind == TRANSPORT_RABBITMQ {
            if let Some(r) = &c.password_secret_ref {
                creds.password = Some(secret_key(&self.secrets, &r.name, &r.key).await?);
            }
            let mut q =
                RabbitQueues::new(amqp_url(c, creds.password.as_deref()), RABBITMQ_EXCHANGE);
            if let Some(base) = management_url(c) {
                let vhost = c.vhost.as_deref().unwrap_or("/");
                let user = c.username.as_deref().unwrap_or("guest");
                let password = creds.password.as_deref().unwrap_or_default();
                q = q.with_management(&base, vhost, user, password);
                if t.scoped_broker_identity() {
                    q = q
                        .with_tenant_identities(&base, vhost, user, password)
                        .map_err(|e| {
                            QueueError::Unavailable(format!("management API client: {e}"))
                        })?;
                }
            }
            Backend::Rabbit(Box::new(q))
        } else {
            let keys = match &c.credentials_secret_ref {
                Some(r) => Some(StaticCredentials {
                    access_key_id: secret_key(&self.secrets, &r.name, &r.access_key_id_key).await?,
                    secret_access_key: secret_key(&self.secrets, &r.name, &r.secret_access_key_key)
                        .await?,
                }),
                None => None,
            };
            creds.aws = keys
                .as_ref()
                .map(|k| (k.access_key_id.clone(), k.secret_access_key.clone()));
            Backend::Sqs(
                SqsQueues::new(
                    c.region.as_deref().unwrap_or("us-east-1"),
                    c.endpoint.as_deref(),
                    keys,
                )
                .await,
            )
        };
        let entry = (Arc::new(backend), creds);
        self.built
            .lock()
            .await
            .insert(name.to_string(), entry.clone());
        Ok(entry)
    }
}
