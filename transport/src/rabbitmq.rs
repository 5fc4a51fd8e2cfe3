//! RabbitMQ through lapin. Queues are durable and bound to a direct exchange (the namespace's
//! `asya.{ns}`, or the platform's `asya`) with their own name as routing key; publishes go
//! through that exchange only, and are persistent, mandatory (an unroutable message is an
//! error, not a silent drop) and confirmed. Retries wait in per-delay queues, bound to the
//! same exchange, whose messages expire and dead-letter back to the actor's queue through it,
//! so the consumer never sleeps and the sidecar needs no access to the default exchange.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use lapin::Acker;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::uri::AMQPUri;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, Consumer, ExchangeKind};
use tokio::sync::Mutex;

use crate::rabbitmq_ack::Acks;
use crate::rabbitmq_publish::{check_confirm, envelope_properties};
use crate::{Outgoing, Received, Transport, TransportError};

/// AMQP header where the sidecar counts unfinished deliveries of a message (classic queues
/// only say "redelivered", not how often).
pub const REDELIVERIES_HEADER: &str = "x-asya-redeliveries";

/// The largest AMQP frame the sidecar proposes (a `frame_max` in the URL wins). lapin keeps
/// 32 frames of this size per direction in memory: RabbitMQ's default of 128 KiB costs 8 MiB
/// of RSS, 16 KiB costs 1 MiB. Larger messages are split into more frames, nothing else.
pub const FRAME_MAX: u32 = 16 * 1024;

#[derive(Debug, Clone)]
pub struct RabbitSettings {
    pub url: String,
    /// Where `url` came from (e.g. `ASYA_RABBITMQ_URL`), named when the broker refuses it.
    pub url_source: &'static str,
    pub exchange: String,
    pub queue: String,
    pub prefetch: u16,
    pub auto_create: bool,
    pub max_redeliveries: u32,
    /// Only publish (the `send` command): never consume `queue`.
    pub publish_only: bool,
}

struct Link {
    connection: Connection,
    consume: Channel,
    publish: Channel,
    generation: u64,
    /// The consume channel's deliveries handed out and not yet settled.
    acks: Acks,
}

pub struct RabbitHandle {
    acker: Acker,
    /// The delivery's tag on `link`'s consume channel.
    tag: u64,
    link: Arc<Link>,
    generation: u64,
    /// The delivery's properties, for a copy given back (moved, not cloned).
    properties: BasicProperties,
}

pub struct RabbitTransport {
    s: RabbitSettings,
    link: Mutex<Option<Arc<Link>>>,
    consumer: Mutex<Option<Consumer>>,
    /// Kept apart from `consumer`, whose lock `receive` holds while it waits.
    consumer_tag: std::sync::Mutex<Option<ShortString>>,
    declared: std::sync::Mutex<HashSet<String>>,
    generation: AtomicU64,
    up: AtomicBool,
    stopping: AtomicBool,
    /// Called on every (re)connect, for the reconnect metric.
    on_connect: Box<dyn Fn() + Send + Sync>,
}

fn unavailable(e: impl std::fmt::Display) -> TransportError {
    TransportError::Unavailable(e.to_string())
}

/// The vhost an AMQP URL names (its path, percent-decoded; none or `/` is the default `/`).
fn vhost_of(url: &str) -> String {
    url.parse::<AMQPUri>()
        .map(|u| u.vhost)
        .unwrap_or_else(|_| "/".into())
}

/// Whether a failed connect is the broker refusing the vhost (it does not exist, or the user
/// may not use it): RabbitMQ closes the connection with NOT_ALLOWED naming the vhost.
fn refuses_vhost(e: &TransportError) -> bool {
    match e {
        TransportError::Unavailable(m) => m.contains("NOT_ALLOWED") && m.contains("vhost"),
        _ => false,
    }
}

fn int(v: i64) -> AMQPValue {
    AMQPValue::LongLongInt(v)
}

impl RabbitTransport {
    pub fn new(s: RabbitSettings, on_connect: Box<dyn Fn() + Send + Sync>) -> Self {
        RabbitTransport {
            s,
            link: Mutex::new(None),
            consumer: Mutex::new(None),
            consumer_tag: std::sync::Mutex::new(None),
            declared: std::sync::Mutex::new(HashSet::new()),
            generation: AtomicU64::new(0),
            up: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            on_connect,
        }
    }

    /// Connects once (no retry): declares what auto-create asks for and starts consuming.
    async fn connect(&self) -> Result<(Arc<Link>, Option<Consumer>), TransportError> {
        let props = ConnectionProperties::default()
            .with_connection_name(format!("asya-sidecar {}", self.s.queue).into());
        let connection = match self.s.url.parse::<AMQPUri>() {
            Ok(mut uri) => {
                uri.query.frame_max.get_or_insert(FRAME_MAX);
                Connection::connect_uri(uri, props).await
            }
            // Let lapin report what is wrong with the URL.
            Err(_) => Connection::connect(&self.s.url, props).await,
        }
        .map_err(unavailable)?;
        let consume = connection.create_channel().await.map_err(unavailable)?;
        let publish = connection.create_channel().await.map_err(unavailable)?;
        publish
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(unavailable)?;
        consume
            .basic_qos(self.s.prefetch, BasicQosOptions::default())
            .await
            .map_err(unavailable)?;
        self.declared.lock().map(|mut d| d.clear()).ok();
        if self.s.auto_create {
            declare_queue(&consume, &self.s.exchange, &self.s.queue).await?;
            self.mark_declared(&self.s.queue);
        }
        let consumer = if self.s.publish_only {
            None
        } else {
            Some(self.consume(&consume).await?)
        };
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let link = Arc::new(Link {
            connection,
            consume,
            publish,
            generation,
            acks: Acks::default(),
        });
        Ok((link, consumer))
    }

    async fn consume(&self, consume: &Channel) -> Result<Consumer, TransportError> {
        consume
            .basic_consume(
                self.s.queue.clone().into(),
                ShortString::from(""),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| {
                if e.to_string().contains("NOT_FOUND") || e.to_string().contains("404") {
                    TransportError::NoSuchQueue(self.s.queue.clone())
                } else {
                    unavailable(e)
                }
            })
    }

    /// Keeps trying to connect with capped exponential backoff (a broker restart is normal).
    async fn reconnect(&self) {
        let mut pause = Duration::from_millis(200);
        // A missing vhost is a configuration error, said once as such; the retries (an admin
        // may still create it) then log quietly.
        let mut vhost_said = false;
        loop {
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            match self.connect().await {
                Ok((link, consumer)) => {
                    tracing::info!(queue = %self.s.queue, generation = link.generation, "connected to RabbitMQ");
                    *self.link.lock().await = Some(link);
                    if let Ok(mut t) = self.consumer_tag.lock() {
                        *t = consumer.as_ref().map(|c| c.tag());
                    }
                    *self.consumer.lock().await = consumer;
                    self.up.store(true, Ordering::SeqCst);
                    (self.on_connect)();
                    return;
                }
                Err(e) if refuses_vhost(&e) => {
                    if !vhost_said {
                        vhost_said = true;
                        tracing::error!(
                            queue = %self.s.queue,
                            vhost = %vhost_of(&self.s.url),
                            variable = self.s.url_source,
                            error = %e,
                            "RabbitMQ refuses the vhost of {}: it does not exist or this user may not use it. \
                             The vhost is the URL's path: `/` or `%2f` (or none) is the default vhost `/`, \
                             `/name` is `name`. Retrying every 5s",
                            self.s.url_source
                        );
                    } else {
                        tracing::debug!(queue = %self.s.queue, error = %e, "RabbitMQ still refuses the vhost");
                    }
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
                Err(e) => {
                    let hint = if matches!(e, TransportError::NoSuchQueue(_)) {
                        " (create it, or set ASYA_QUEUE_AUTO_CREATE=true for local runs)"
                    } else {
                        ""
                    };
                    tracing::warn!(queue = %self.s.queue, error = %e, retry_in = ?pause, "RabbitMQ connect failed{hint}");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    async fn drop_link(&self) {
        self.up.store(false, Ordering::SeqCst);
        *self.consumer.lock().await = None;
        if let Some(link) = self.link.lock().await.take() {
            // Best effort: unacked deliveries return to the queue when the connection goes.
            let _ = link.connection.close(200, "reconnecting".into()).await;
        }
    }

    async fn current_link(&self) -> Result<Arc<Link>, TransportError> {
        match self.link.lock().await.as_ref() {
            Some(l) if l.connection.status().connected() && l.publish.status().connected() => {
                Ok(l.clone())
            }
            _ => Err(TransportError::Unavailable("not connected".into())),
        }
    }

    fn mark_declared(&self, q: &str) {
        if let Ok(mut d) = self.declared.lock() {
            d.insert(q.to_string());
        }
    }

    fn is_declared(&self, q: &str) -> bool {
        self.declared.lock().map(|d| d.contains(q)).unwrap_or(false)
    }

    /// [`Self::requeue_copy`] for a delivery not handed out: a redelivered one with its count
    /// raised (the count survives a crash of this process because it lives in the durable
    /// copy), or a prefetched one given back at shutdown with the count it came with.
    async fn requeue_delivery(
        &self,
        link: &Link,
        delivery: &lapin::message::Delivery,
        count: u32,
    ) -> Result<(), TransportError> {
        self.requeue_copy(
            link,
            &delivery.data,
            &delivery.properties,
            &delivery.acker,
            count,
        )
        .await
    }

    /// Puts a copy of a message at the back of its queue with `count` as its redelivery
    /// count, and acks the original once the broker has confirmed the copy.
    async fn requeue_copy(
        &self,
        link: &Link,
        body: &[u8],
        properties: &BasicProperties,
        acker: &Acker,
        count: u32,
    ) -> Result<(), TransportError> {
        let mut headers = properties.headers().clone().unwrap_or_default();
        headers.insert(REDELIVERIES_HEADER.into(), int(i64::from(count)));
        let props = properties.clone().with_headers(headers);
        self.publish_confirmed(link, &self.s.exchange, &self.s.queue, body, props)
            .await?;
        acker
            .ack(BasicAckOptions::default())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn publish_confirmed(
        &self,
        link: &Link,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        props: BasicProperties,
    ) -> Result<(), TransportError> {
        let confirm = link
            .publish
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                body,
                props,
            )
            .await
            .map_err(unavailable)?;
        check_confirm(routing_key, confirm.await.map_err(unavailable)?)
    }

    async fn ensure_destination(&self, link: &Link, queue: &str) -> Result<(), TransportError> {
        if self.s.auto_create && !self.is_declared(queue) {
            declare_queue(&link.publish, &self.s.exchange, queue).await?;
            self.mark_declared(queue);
        }
        Ok(())
    }

    /// The queue a delayed retry waits in. Dots cannot occur in actor names, so these
    /// names never collide with an actor's queue. Public: the provisioner deletes an actor's
    /// delay queues by this rule.
    pub fn delay_queue(queue: &str, delay: Duration) -> String {
        format!("{queue}.delay-{}ms", delay.as_millis())
    }

    async fn declare_delay_queue(
        &self,
        link: &Link,
        target: &str,
        delay: Duration,
    ) -> Result<String, TransportError> {
        let name = Self::delay_queue(target, delay);
        let ttl = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX).max(1);
        let mut args = FieldTable::default();
        args.insert("x-message-ttl".into(), int(ttl));
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(self.s.exchange.as_str().into()),
        );
        args.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(target.into()),
        );
        // Unused delay queues go away; redeclared on every use, which resets this clock,
        // so a queue never expires while a message still waits in it.
        args.insert("x-expires".into(), int(ttl.saturating_add(60_000)));
        let rejected = |e: lapin::Error| TransportError::Rejected(format!("declare {name}: {e}"));
        link.publish
            .queue_declare(
                name.clone().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                args,
            )
            .await
            .map_err(rejected)?;
        // Reached through the sidecar's own exchange, never the default one: write access
        // to `amq.default` would let a tenant publish into any queue (docs/DESIGN.md §9).
        // Binding needs write on the delay queue and read on the exchange, nothing more.
        link.publish
            .queue_bind(
                name.clone().into(),
                self.s.exchange.clone().into(),
                name.clone().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(rejected)?;
        Ok(name)
    }
}

async fn declare_queue(ch: &Channel, exchange: &str, queue: &str) -> Result<(), TransportError> {
    declare_bound_queue(ch, exchange, queue)
        .await
        .map_err(|e| TransportError::Rejected(format!("declare {queue}: {e}")))
}

/// Declares the durable exchange and the durable queue `queue`, bound with its own name as
/// routing key (docs/DESIGN.md §4). The one topology rule: the provisioner calls this too, so where
/// queues are created and where the sidecar publishes can never disagree.
pub async fn declare_bound_queue(
    ch: &Channel,
    exchange: &str,
    queue: &str,
) -> Result<(), lapin::Error> {
    declare_bound_queue_with(ch, exchange, queue, FieldTable::default()).await
}

/// The arguments of an actor's wake queue (docs/DESIGN.md §6.1): one message at most (a new
/// wake replaces the old: `drop-head`), each living `ttl` (the actor's cooldown), so a woken
/// actor goes back to zero once no wake comes.
pub fn wake_queue_args(ttl: Duration) -> FieldTable {
    let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
    let mut args = FieldTable::default();
    args.insert("x-max-length".into(), AMQPValue::LongLongInt(1));
    args.insert(
        "x-overflow".into(),
        AMQPValue::LongString("drop-head".into()),
    );
    args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(ttl_ms));
    args
}

/// [`declare_bound_queue`] with queue arguments (a wake queue's, [`wake_queue_args`]).
pub async fn declare_bound_queue_with(
    ch: &Channel,
    exchange: &str,
    queue: &str,
    args: FieldTable,
) -> Result<(), lapin::Error> {
    ch.exchange_declare(
        exchange.into(),
        ExchangeKind::Direct,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await?;
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        args,
    )
    .await?;
    ch.queue_bind(
        queue.into(),
        exchange.into(),
        queue.into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await?;
    Ok(())
}

/// The delivery's redelivery count as the consume path counts it: ours (the header of a
/// copy), else the quorum queue's, plus one if the broker flags this delivery as a
/// redelivery (classic queues only flag it).
fn delivery_count(d: &lapin::message::Delivery) -> u32 {
    let count = header_count(&d.properties, REDELIVERIES_HEADER)
        .or_else(|| header_count(&d.properties, "x-delivery-count"))
        .unwrap_or(0);
    count + u32::from(d.redelivered)
}

fn header_count(props: &BasicProperties, name: &str) -> Option<u32> {
    let v = props.headers().as_ref()?.inner().get(name)?;
    let n = match v {
        AMQPValue::LongLongInt(n) => *n,
        AMQPValue::LongInt(n) => i64::from(*n),
        AMQPValue::LongUInt(n) => i64::from(*n),
        AMQPValue::ShortInt(n) => i64::from(*n),
        AMQPValue::ShortUInt(n) => i64::from(*n),
        _ => return None,
    };
    u32::try_from(n.max(0)).ok()
}

impl Transport for RabbitTransport {
    type Handle = RabbitHandle;

    async fn receive(&self) -> Result<Vec<Received<RabbitHandle>>, TransportError> {
        loop {
            if self.stopping.load(Ordering::SeqCst) {
                return Ok(Vec::new());
            }
            if self.link.lock().await.is_none() {
                self.reconnect().await;
                continue;
            }
            let next = {
                let mut guard = self.consumer.lock().await;
                match guard.as_mut() {
                    Some(c) => c.next().await,
                    None => None,
                }
            };
            let delivery = match next {
                Some(Ok(d)) => d,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "RabbitMQ consumer failed; reconnecting");
                    self.drop_link().await;
                    continue;
                }
                None => {
                    if self.stopping.load(Ordering::SeqCst) {
                        return Ok(Vec::new());
                    }
                    tracing::warn!("RabbitMQ consumer ended; reconnecting");
                    self.drop_link().await;
                    continue;
                }
            };
            let Some(link) = self.link.lock().await.clone() else {
                continue;
            };
            let count = delivery_count(&delivery);
            // Classic queues only flag a redelivery: the count goes into a copy, which is
            // what a later pod reads. Past the limit it is handed on, to go to x-sump.
            if delivery.redelivered && count <= self.s.max_redeliveries {
                if let Err(e) = self.requeue_delivery(&link, &delivery, count).await {
                    tracing::warn!(error = %e, "could not record a redelivery; reconnecting");
                    self.drop_link().await;
                }
                continue;
            }
            link.acks.received(delivery.delivery_tag);
            return Ok(vec![Received {
                body: delivery.data,
                redeliveries: count,
                handle: RabbitHandle {
                    acker: delivery.acker,
                    tag: delivery.delivery_tag,
                    generation: link.generation,
                    properties: delivery.properties,
                    link,
                },
            }]);
        }
    }

    /// Publishes through the sidecar's exchange (`asya.{ns}` with scoped identity: a namespace
    /// wakes only its own actors), not mandatory (no wake queue, as with wake-up off: dropped),
    /// and does not wait for the confirmation the channel's confirm mode brings.
    async fn wake(&self, queues: &[String], body: &[u8]) -> usize {
        let Ok(link) = self.current_link().await else {
            return queues.len();
        };
        let mut failed = 0;
        for q in queues {
            let sent = link
                .publish
                .basic_publish(
                    self.s.exchange.as_str().into(),
                    q.as_str().into(),
                    BasicPublishOptions::default(),
                    body,
                    BasicProperties::default(),
                )
                .await;
            if sent.is_err() {
                failed += 1;
            }
        }
        failed
    }

    async fn send(&self, messages: &[Outgoing]) -> Result<(), TransportError> {
        let link = self.current_link().await?;
        let props = envelope_properties();
        // Destinations first, so the publishes below are queued together: one write for
        // all, one wake-up for all the writes, and the broker confirms them together.
        let mut keys = Vec::with_capacity(messages.len());
        for m in messages {
            keys.push(match m.delay {
                // Declaring here also creates the target when auto-create is off: the
                // target is the sidecar's own queue, which exists.
                Some(d) if !d.is_zero() => self.declare_delay_queue(&link, &m.queue, d).await?,
                _ => {
                    self.ensure_destination(&link, &m.queue).await?;
                    m.queue.clone()
                }
            });
        }
        let options = BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        };
        let publishes = messages.iter().zip(&keys).map(|(m, key)| {
            link.publish.basic_publish(
                self.s.exchange.as_str().into(),
                key.as_str().into(),
                options,
                &m.body,
                props.clone(),
            )
        });
        let confirms = futures::future::try_join_all(publishes)
            .await
            .map_err(unavailable)?;
        for (m, confirm) in messages.iter().zip(confirms) {
            check_confirm(&m.queue, confirm.await.map_err(unavailable)?)?;
        }
        Ok(())
    }

    async fn ack(&self, h: &RabbitHandle) -> Result<(), TransportError> {
        if h.generation != self.generation.load(Ordering::SeqCst) {
            return Err(TransportError::Unavailable(
                "connection was replaced; the broker redelivers this message".into(),
            ));
        }
        h.link.acks.ack(&h.link.consume, h.tag).await
    }

    async fn release(&self, h: &RabbitHandle) -> Result<(), TransportError> {
        let nack = h.acker.nack(BasicNackOptions {
            requeue: true,
            ..Default::default()
        });
        h.link
            .acks
            .alone(h.tag, async { nack.await.map(|_| ()).map_err(unavailable) })
            .await
    }

    async fn give_back(&self, msg: &Received<RabbitHandle>) -> Result<(), TransportError> {
        let h = &msg.handle;
        let link = self.current_link().await?;
        if h.generation != link.generation {
            // Its connection is gone, and with it the delivery: the broker has it back.
            return Ok(());
        }
        // A nack would return it flagged as redelivered, and the next pod would count that.
        let copy = self.requeue_copy(&link, &msg.body, &h.properties, &h.acker, msg.redeliveries);
        link.acks.alone(h.tag, copy).await
    }

    async fn stop_consuming(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let link = self.link.lock().await.clone();
        if let Some(link) = link {
            let tag = self.consumer_tag.lock().ok().and_then(|t| t.clone());
            if let Some(tag) = tag {
                let _ = link
                    .consume
                    .basic_cancel(tag, BasicCancelOptions::default())
                    .await;
            }
        }
        self.give_back_prefetched().await;
    }

    fn healthy(&self) -> bool {
        self.up.load(Ordering::SeqCst)
    }

    async fn queue_depth(&self) -> Option<u64> {
        let link = self.current_link().await.ok()?;
        // A passive declare of a missing queue closes its channel: use a throwaway one.
        let ch = link.connection.create_channel().await.ok()?;
        let q = ch
            .queue_declare(
                self.s.queue.clone().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .ok();
        let _ = ch.close(200, "done".into()).await;
        Some(u64::from(q?.message_count()))
    }
}

impl RabbitTransport {
    /// Connects now (with retries) instead of on the first receive, and replaces a lost
    /// connection; for publish-only use (a consumer reconnects in `receive`).
    pub async fn ensure_connected(&self) {
        let alive = self.current_link().await.is_ok();
        if !alive {
            if self.link.lock().await.is_some() {
                self.drop_link().await;
            }
            self.reconnect().await;
        }
    }

    /// Requeues the deliveries the broker pushed before the cancel and nobody took: without
    /// this they would wait, unacked, until the connection closes, i.e. until every message
    /// in flight is finished. After the cancel the consumer yields what it buffered, then
    /// ends; the timeout only guards against a broker that never confirmed the cancel.
    async fn give_back_prefetched(&self) {
        let Some(mut consumer) = self.consumer.lock().await.take() else {
            return;
        };
        let link = self.current_link().await.ok();
        let mut given = 0u32;
        while let Ok(Some(Ok(d))) =
            tokio::time::timeout(Duration::from_secs(2), consumer.next()).await
        {
            // As `give_back`: a copy with the count it came with, not a nack that adds one.
            let copied = match &link {
                Some(l) => self
                    .requeue_delivery(l, &d, delivery_count(&d))
                    .await
                    .is_ok(),
                None => false,
            };
            let requeue = BasicNackOptions {
                requeue: true,
                ..Default::default()
            };
            if copied || d.acker.nack(requeue).await.is_ok() {
                given += 1;
            }
        }
        if given > 0 {
            tracing::info!(
                messages = given,
                "gave prefetched messages back to the queue"
            );
        }
    }

    /// Closes the connection (after shutdown); prefetched, unacked messages return.
    pub async fn close(&self) {
        self.drop_link().await;
    }
}
