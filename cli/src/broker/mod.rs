//! The broker edge: one interface over RabbitMQ and SQS for what the commands need — count a
//! queue, hold its messages without losing them (browse), publish confirmed, and remove or
//! give back what was held — connected with the namespace's own identity (`access`).

pub mod rabbit;
pub mod s3;
pub mod sqs;

use std::collections::BTreeMap;

use asya_api::config::Transport;

use crate::access::{Identity, UserFrom};
use crate::error::{CliError, Result};

/// What a queue's figures are, where the identity can get them (`None`: it cannot).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Counts {
    pub ready: Option<u64>,
    pub in_flight: Option<u64>,
    pub consumers: Option<u64>,
}

/// A message taken from a queue and not yet acked or given back.
pub struct Held {
    pub body: Vec<u8>,
    pub broker_time_ms: Option<u64>,
    handle: Handle,
}

enum Handle {
    Rabbit(lapin::Acker),
    Sqs { url: String, receipt: String },
}

pub enum Broker {
    // Boxed: one broker per command, the size difference costs nothing worth a clippy note.
    Rabbit(Box<rabbit::Rabbit>),
    Sqs(Box<sqs::Sqs>),
}

/// Where the broker is, when the caller reaches it by another address than the cluster's
/// (a port-forward): `--broker-host`, `--broker-port`, `--sqs-endpoint`.
#[derive(Debug, Clone, Default)]
pub struct Reach {
    pub host: Option<String>,
    pub port: Option<u16>,
    pub sqs_endpoint: Option<String>,
}

fn key<'a>(data: &'a BTreeMap<String, String>, secret: &str, k: &str, ns: &str) -> Result<&'a str> {
    data.get(k)
        .map(String::as_str)
        .ok_or_else(|| CliError::NotFound {
            what: format!("key {k:?} of Secret {ns}/{secret}"),
            why: "the Secret is not the one the provisioner writes".into(),
        })
}

impl Broker {
    /// Connects with `identity`; `secret` is the identity Secret's data (read by the caller,
    /// so a refusal names the Secret), `None` for the ambient AWS identity.
    pub async fn connect(
        transport: &Transport,
        identity: &Identity,
        secret: Option<&BTreeMap<String, String>>,
        namespace: &str,
        reach: &Reach,
    ) -> Result<Broker> {
        let mut c = transport.config.clone();
        match identity {
            Identity::Rabbit {
                secret: name,
                user,
                password_key,
                exchange,
            } => {
                let data = secret.ok_or_else(|| crate::access::missing_secret(name, namespace))?;
                let user = match user {
                    UserFrom::Key(k) => key(data, name, k, namespace)?.to_string(),
                    UserFrom::Fixed(u) => u.clone(),
                };
                let password = key(data, name, password_key, namespace)?;
                if let Some(h) = &reach.host {
                    c.host = Some(h.clone());
                }
                if let Some(p) = reach.port {
                    c.port = Some(p);
                }
                c.username = Some(user.clone());
                let url = asya_api::amqp::url(&c, asya_api::amqp::Password::Clear(password));
                let place = format!(
                    "{}:{}",
                    asya_api::amqp::host(&c),
                    c.port
                        .map(|p| p.to_string())
                        .unwrap_or_else(|| "default port".into())
                );
                Ok(Broker::Rabbit(Box::new(
                    rabbit::Rabbit::connect(&url, &user, exchange, place).await?,
                )))
            }
            Identity::SqsStatic {
                secret: name,
                access_key_id_key,
                secret_access_key_key,
            } => {
                let data = secret.ok_or_else(|| crate::access::missing_secret(name, namespace))?;
                let keys = (
                    key(data, name, access_key_id_key, namespace)?.to_string(),
                    key(data, name, secret_access_key_key, namespace)?.to_string(),
                );
                Ok(Broker::Sqs(Box::new(
                    sqs_client(&c, reach, Some(keys)).await,
                )))
            }
            Identity::SqsAmbient => Ok(Broker::Sqs(Box::new(sqs_client(&c, reach, None).await))),
        }
    }

    /// Says where messages came from, for the output's `source` line.
    pub fn describe(&self, queue: &str) -> String {
        match self {
            Broker::Rabbit(r) => format!("RabbitMQ queue {queue} at {} (as {})", r.place, r.user),
            Broker::Sqs(s) => format!("SQS queue {queue} at {}", s.place),
        }
    }

    pub async fn counts(&self, queue: &str) -> Result<Counts> {
        match self {
            Broker::Rabbit(r) => r.counts(queue).await,
            Broker::Sqs(s) => s.counts(queue).await,
        }
    }

    /// Holds up to `max` messages of `queue`; `true` when more were left in the queue.
    pub async fn browse(&self, queue: &str, max: usize) -> Result<(Vec<Held>, bool)> {
        match self {
            Broker::Rabbit(r) => r.browse(queue, max).await,
            Broker::Sqs(s) => s.browse(queue, max).await,
        }
    }

    /// Publishes to `queue` and returns once the broker has it.
    pub async fn publish(&self, queue: &str, body: &[u8]) -> Result<()> {
        match self {
            Broker::Rabbit(r) => r.publish(queue, body).await,
            Broker::Sqs(s) => s.publish(queue, body).await,
        }
    }

    /// Puts a wake message into each of the wake queues `queues` (docs/DESIGN.md §6.1), best
    /// effort: unconfirmed, a missing queue no error. Returns how many were not handed over.
    pub async fn wake(&self, queues: &[String]) -> usize {
        let body = asya_api::wake::wake_body("asya send").into_bytes();
        match self {
            Broker::Rabbit(r) => r.wake(queues, &body).await,
            Broker::Sqs(s) => s.wake(queues, &body).await,
        }
    }

    /// Removes a held message from its queue for good.
    pub async fn remove(&self, m: &Held) -> Result<()> {
        match (self, &m.handle) {
            (Broker::Rabbit(r), Handle::Rabbit(a)) => r.ack(a).await,
            (Broker::Sqs(s), Handle::Sqs { url, receipt }) => s.delete(url, receipt).await,
            _ => Err(CliError::Failed("a held message of another broker".into())),
        }
    }

    /// Gives every held message back, unchanged; the first failure is returned after trying
    /// all (a message not given back returns anyway: on connection close, or SQS's timeout).
    pub async fn give_back(&self, held: Vec<Held>) -> Result<()> {
        let mut first = None;
        for m in held {
            let r = match (self, &m.handle) {
                (Broker::Rabbit(r), Handle::Rabbit(a)) => r.requeue(a).await,
                (Broker::Sqs(s), Handle::Sqs { url, receipt }) => {
                    s.make_visible(url, receipt).await
                }
                _ => Ok(()),
            };
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    pub async fn close(&self) {
        if let Broker::Rabbit(r) = self {
            r.close().await;
        }
    }
}

async fn sqs_client(
    c: &asya_api::config::TransportSettings,
    reach: &Reach,
    keys: Option<(String, String)>,
) -> sqs::Sqs {
    let region = c.region.clone().unwrap_or_else(|| "us-east-1".into());
    let endpoint = reach.sqs_endpoint.clone().or_else(|| c.endpoint.clone());
    sqs::Sqs::connect(region, endpoint, keys).await
}
