//! What every command starts from: the cluster (kubectl's rules), the release's configuration
//! and the transport, and — for commands that touch queues — the broker, connected with the
//! namespace's own identity.

use asya_api::config::{ClusterConfig, Transport};

use crate::access::{self, Identity};
use crate::args::Global;
use crate::broker::s3::CrewStore;
use crate::broker::{Broker, Reach};
use crate::cluster::{self, Cluster, Where};
use crate::crew;
use crate::error::{CliError, Result};

/// The name of the chart's ConfigMap (`asya.configMap` in the chart's helpers).
pub const CONFIG_MAP: &str = "asya-config";

pub struct Session {
    pub cluster: Cluster,
    pub config: ClusterConfig,
    pub transport_name: String,
    pub transport: Transport,
    pub reach: Reach,
}

pub async fn open(g: &Global) -> Result<Session> {
    let cluster = cluster::connect(&Where {
        kubeconfig: g.kubeconfig.clone(),
        context: g.context.clone(),
        namespace: g.namespace.clone(),
    })
    .await?;
    let config = match &g.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| CliError::Usage(format!("--config {}: {e}", path.display())))?;
            cluster::parse_config(&text, &format!("--config {}", path.display()))?
        }
        None => cluster::release_config(&cluster.client, &g.release_namespace, CONFIG_MAP).await?,
    };
    let (name, transport) = access::transport(&config, g.transport.as_deref())?;
    let (transport_name, transport) = (name.to_string(), transport.clone());
    Ok(Session {
        cluster,
        config,
        transport_name,
        transport,
        reach: Reach {
            host: g.broker_host.clone(),
            port: g.broker_port,
            sqs_endpoint: g.sqs_endpoint.clone(),
        },
    })
}

impl Session {
    /// The broker as `namespace`'s identity.
    pub async fn broker(&self, namespace: &str) -> Result<Broker> {
        let identity = access::identity(&self.transport_name, &self.transport, namespace)?;
        let secret = match &identity {
            Identity::Rabbit { secret, .. } | Identity::SqsStatic { secret, .. } => {
                cluster::secret(&self.cluster.client, namespace, secret).await?
            }
            Identity::SqsAmbient => None,
        };
        Broker::connect(
            &self.transport,
            &identity,
            secret.as_ref(),
            namespace,
            &self.reach,
        )
        .await
    }

    /// The crew's S3 store when the namespace's x-sump is consumed by its error-end actor
    /// (seed 001), else `None` (x-sump is a plain queue). A caller who may not list the actors
    /// gets the queue, as without a crew.
    pub async fn crew_store(&self, ns: &str, end: crew::End) -> Result<Option<CrewStore>> {
        let actors = match cluster::actors(&self.cluster.client, Some(ns)).await {
            Ok(a) => a,
            Err(CliError::Forbidden { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(store) = crew::store_of(&actors, end) else {
            return Ok(None);
        };
        let keys = match &store.keys {
            Some((secret, id_key, key_key)) => {
                let data = cluster::secret(&self.cluster.client, ns, secret)
                    .await?
                    .ok_or_else(|| CliError::NotFound {
                        what: format!("Secret {secret:?} in namespace {ns:?}"),
                        why: format!("the crew actor {} reads its S3 keys from it", store.actor),
                    })?;
                let get = |k: &str| {
                    data.get(k).cloned().ok_or_else(|| CliError::NotFound {
                        what: format!("key {k:?} of Secret {ns}/{secret}"),
                        why: format!("the crew actor {} reads its S3 keys from it", store.actor),
                    })
                };
                Some((get(id_key)?, get(key_key)?))
            }
            None => None,
        };
        Ok(Some(CrewStore::connect(&store, keys).await))
    }
}
