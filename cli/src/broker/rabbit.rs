//! RabbitMQ with the namespace's own user. Browsing takes every message with `basic.get`
//! unacknowledged (the user has read on its end queues; a passive declare needs no
//! permission) and gives each back with a requeueing nack — or, if this process dies, the
//! broker requeues them when the connection drops: a browse never loses a message. A redrive
//! publishes the resend on a confirm channel (`asya_transport::rabbitmq_publish`, the
//! sidecar's rule) and acks the x-sump copy only after the broker confirmed it.

use std::time::Duration;

use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicNackOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties};

use crate::error::{CliError, Result};

use super::{Counts, Handle, Held};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

pub struct Rabbit {
    conn: Connection,
    /// Holds browsed deliveries unacknowledged until they are acked or given back.
    browse: Channel,
    /// Confirm mode: every publish waits for the broker's ack.
    publish: Channel,
    pub exchange: String,
    pub user: String,
    /// `host:port/vhost`, for messages (never the password).
    pub place: String,
}

impl Rabbit {
    pub async fn connect(url: &str, user: &str, exchange: &str, place: String) -> Result<Rabbit> {
        let props = ConnectionProperties::default().with_connection_name("asya cli".into());
        let conn = tokio::time::timeout(CONNECT_TIMEOUT, Connection::connect(url, props))
            .await
            .map_err(|_| CliError::Unavailable {
                what: format!("RabbitMQ at {place}"),
                why: format!("no connection within {}s", CONNECT_TIMEOUT.as_secs()),
            })?
            .map_err(|e| {
                let why = e.to_string();
                if why.contains("ACCESS_REFUSED") || why.contains("403") {
                    CliError::BrokerRefused {
                        action: "login",
                        target: place.clone(),
                        user: user.to_string(),
                        why,
                    }
                } else {
                    CliError::Unavailable {
                        what: format!("RabbitMQ at {place}"),
                        why,
                    }
                }
            })?;
        let chan_err = |e: lapin::Error| CliError::from_amqp("open a channel", &place, user, e);
        let browse = conn.create_channel().await.map_err(chan_err)?;
        let publish = conn.create_channel().await.map_err(chan_err)?;
        publish
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(chan_err)?;
        Ok(Rabbit {
            conn,
            browse,
            publish,
            exchange: exchange.to_string(),
            user: user.to_string(),
            place,
        })
    }

    /// Messages ready and consumers of `queue`, by passive declare (a missing queue is a
    /// 404 that closes the channel, so it runs on a channel of its own).
    pub async fn counts(&self, queue: &str) -> Result<Counts> {
        let ch = self
            .conn
            .create_channel()
            .await
            .map_err(|e| CliError::from_amqp("open a channel", queue, &self.user, e))?;
        let q = ch
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| CliError::from_amqp("inspect", queue, &self.user, e))?;
        let _ = ch.close(200, "done".into()).await;
        Ok(Counts {
            ready: Some(u64::from(q.message_count())),
            // Unacknowledged counts need the management API, which a namespace user has not.
            in_flight: None,
            consumers: Some(u64::from(q.consumer_count())),
        })
    }

    /// Takes up to `max` messages of `queue`, each held unacknowledged.
    pub async fn browse(&self, queue: &str, max: usize) -> Result<(Vec<Held>, bool)> {
        // A missing queue would close the browse channel, and with it the messages held on
        // it: find out on a channel of its own first.
        self.counts(queue).await?;
        let mut out = Vec::new();
        while out.len() < max {
            let got = self
                .browse
                .basic_get(queue.into(), BasicGetOptions { no_ack: false })
                .await
                .map_err(|e| CliError::from_amqp("read (basic.get)", queue, &self.user, e))?;
            let Some(m) = got else {
                return Ok((out, false));
            };
            let d = m.delivery;
            // The AMQP timestamp is in seconds, when a publisher sets it.
            let broker_time_ms = (*d.properties.timestamp()).map(|s| s.saturating_mul(1000));
            out.push(Held {
                body: d.data,
                broker_time_ms,
                handle: Handle::Rabbit(d.acker),
            });
        }
        Ok((out, true))
    }

    /// Publishes `body` to each wake queue through the namespace's exchange, without waiting
    /// for the confirmations (docs/DESIGN.md §6.1). Returns how many could not be sent.
    pub async fn wake(&self, queues: &[String], body: &[u8]) -> usize {
        let mut failed = 0;
        for q in queues {
            let sent = self
                .publish
                .basic_publish(
                    self.exchange.as_str().into(),
                    q.as_str().into(),
                    Default::default(),
                    body,
                    Default::default(),
                )
                .await;
            failed += usize::from(sent.is_err());
        }
        failed
    }

    /// Publishes `body` to `queue` through the namespace's exchange; returns once confirmed.
    pub async fn publish(&self, queue: &str, body: &[u8]) -> Result<()> {
        asya_transport::rabbitmq_publish::publish_confirmed(
            &self.publish,
            &self.exchange,
            queue,
            body,
        )
        .await
        .map_err(|e| match e {
            asya_transport::TransportError::NoSuchQueue(q) => CliError::NotFound {
                what: format!("queue {q:?}"),
                why: format!(
                    "the broker could not route to it through exchange {:?}",
                    self.exchange
                ),
            },
            other => CliError::from_amqp("publish", queue, &self.user, other),
        })
    }

    pub async fn ack(&self, acker: &lapin::Acker) -> Result<()> {
        acker
            .ack(BasicAckOptions::default())
            .await
            .map(|_| ())
            .map_err(|e| CliError::from_amqp("ack", &self.place, &self.user, e))
    }

    pub async fn requeue(&self, acker: &lapin::Acker) -> Result<()> {
        acker
            .nack(BasicNackOptions {
                requeue: true,
                ..Default::default()
            })
            .await
            .map(|_| ())
            .map_err(|e| CliError::from_amqp("give back (nack)", &self.place, &self.user, e))
    }

    pub async fn close(&self) {
        let _ = self.conn.close(200, "done".into()).await;
    }
}
