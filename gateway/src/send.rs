//! Sends new envelopes to the first actor's queue through the shared transports (the same
//! publisher confirms and queue naming as the sidecar). A send that is not confirmed within
//! the deadline is an error the caller reports; nothing is accepted and then lost.

use std::time::Duration;

use asya_transport::rabbitmq::{RabbitSettings, RabbitTransport};
use asya_transport::sqs::{SqsSettings, SqsTransport};
use asya_transport::{Outgoing, Transport, TransportError};

/// Transport settings the gateway was started with.
#[derive(Debug, Clone, Default)]
pub struct SendConfig {
    pub default_transport: String,
    pub rabbitmq_url: Option<String>,
    pub exchange: String,
    pub sqs_region: Option<String>,
    pub sqs_endpoint: Option<String>,
    pub deadline: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("transport {0:?} is not configured for this gateway")]
    NotConfigured(String),
    #[error("sending to {queue} was not confirmed within {deadline:?}")]
    Timeout { queue: String, deadline: Duration },
    #[error(transparent)]
    Transport(#[from] TransportError),
}

impl SendError {
    /// The destination itself is wrong (missing queue, too large): not worth retrying.
    pub fn is_permanent(&self) -> bool {
        match self {
            SendError::NotConfigured(_) => true,
            SendError::Timeout { .. } => false,
            SendError::Transport(e) => e.is_permanent(),
        }
    }
}

pub struct Senders {
    default: String,
    rabbit: Option<RabbitTransport>,
    sqs: Option<SqsTransport>,
    deadline: Duration,
}

impl Senders {
    pub async fn new(c: &SendConfig) -> Senders {
        let rabbit = c.rabbitmq_url.as_ref().map(|url| {
            RabbitTransport::new(
                RabbitSettings {
                    url: url.clone(),
                    url_source: "ASYA_RABBITMQ_URL",
                    exchange: c.exchange.clone(),
                    queue: "asya-gateway".into(),
                    prefetch: 1,
                    auto_create: false,
                    max_redeliveries: 0,
                    publish_only: true,
                },
                Box::new(|| {}),
            )
        });
        let sqs = match &c.sqs_region {
            Some(region) => Some(
                SqsTransport::new(SqsSettings {
                    region: region.clone(),
                    endpoint: c.sqs_endpoint.clone(),
                    queue: "asya-gateway".into(),
                    wait_seconds: 0,
                    visibility_timeout: Duration::from_secs(30),
                    auto_create: false,
                    max_message_bytes: 1_048_576,
                    pollers: 1,
                })
                .await,
            ),
            None => None,
        };
        Senders {
            default: c.default_transport.clone(),
            rabbit,
            sqs,
            deadline: c.deadline,
        }
    }

    pub fn default_transport(&self) -> &str {
        &self.default
    }

    /// Which transports are configured (for `/health`).
    pub fn configured(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.rabbit.is_some() {
            v.push("rabbitmq");
        }
        if self.sqs.is_some() {
            v.push("sqs");
        }
        v
    }

    /// Wakes every actor of `route` in namespace `ns` (docs/DESIGN.md §6.1: the sender's
    /// wake starts all of a pipeline's pods at once), best effort within the deadline.
    /// Returns how many wake messages could not be handed to the broker.
    pub async fn wake(&self, transport: Option<&str>, ns: &str, route: &[String]) -> usize {
        let queues: Vec<String> = asya_api::wake::wake_targets(route, 0, None)
            .into_iter()
            .filter_map(|a| asya_api::wake::wake_queue(ns, a))
            .collect();
        if queues.is_empty() {
            return 0;
        }
        let body = asya_api::wake::wake_body("gateway").into_bytes();
        let work = async {
            match transport.unwrap_or(&self.default) {
                "rabbitmq" => match &self.rabbit {
                    Some(t) => {
                        t.ensure_connected().await;
                        t.wake(&queues, &body).await
                    }
                    None => queues.len(),
                },
                "sqs" => match &self.sqs {
                    Some(t) => t.wake(&queues, &body).await,
                    None => queues.len(),
                },
                _ => queues.len(),
            }
        };
        tokio::time::timeout(self.deadline, work)
            .await
            .unwrap_or(queues.len())
    }

    /// Sends one envelope body to `queue`, confirmed, within the deadline.
    pub async fn send(
        &self,
        transport: Option<&str>,
        queue: &str,
        body: Vec<u8>,
    ) -> Result<(), SendError> {
        let name = transport.unwrap_or(&self.default);
        let out = [Outgoing {
            queue: queue.to_string(),
            body,
            delay: None,
        }];
        let work = async {
            match name {
                "rabbitmq" => {
                    let t = self
                        .rabbit
                        .as_ref()
                        .ok_or_else(|| SendError::NotConfigured(name.into()))?;
                    t.ensure_connected().await;
                    Ok(t.send(&out).await?)
                }
                "sqs" => {
                    let t = self
                        .sqs
                        .as_ref()
                        .ok_or_else(|| SendError::NotConfigured(name.into()))?;
                    Ok(t.send(&out).await?)
                }
                other => Err(SendError::NotConfigured(other.into())),
            }
        };
        tokio::time::timeout(self.deadline, work)
            .await
            .map_err(|_| SendError::Timeout {
                queue: queue.to_string(),
                deadline: self.deadline,
            })?
    }
}
