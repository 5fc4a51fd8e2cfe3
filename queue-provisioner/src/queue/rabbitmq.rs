//! RabbitMQ queues through lapin: durable queues bound to the durable direct exchange `asya`
//! with the queue's own name as routing key, declared by the
//! sidecar's own `declare_bound_queue`, so both sides share one rule.
//!
//! One connection per transport, reconnected on demand. Every operation opens its own
//! channel: a passive declare of a missing queue closes the channel (404), which must not
//! break the other reconciles sharing the connection.
//!
//! A connection opens at most `channel_max` channels in its life, then the next operation
//! starts a new one (the old closes when its last channel is done). lapin (4.12) keeps the
//! error of a channel the broker closed recorded against its *id*, and the id sequence wraps
//! at `channel_max`: a new channel that reuses such an id fails at open with the old
//! channel's error (another actor's `NOT_FOUND - no queue …`) and is never released, so the
//! connection runs out of channels. Never reusing an id avoids both.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use asya_api::types::Resiliency;
use asya_transport::rabbitmq::RabbitTransport;
use asya_transport::resiliency::{Plan, backoff_delay};
use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties};
use tokio::sync::{Mutex, Semaphore};

use super::counts_cache::{self, CountsCache, Step};
use super::owner::{self, QueueRecord};
use super::{QueueDepth, QueueError, QueueInfo, QueueOps, QueueSpec};

pub struct RabbitQueues {
    url: String,
    /// The URL without credentials, for status and logs.
    display: String,
    exchange: String,
    /// Scoped identity (docs/DESIGN.md §9): every queue is also bound to its namespace's
    /// exchange `asya.{ns}`, where that namespace's sidecars publish.
    tenant_exchanges: bool,
    connection: Mutex<Option<Shared>>,
    /// Bounds the operations (so channels) in flight on the connection.
    in_flight: Semaphore,
    management: Option<Arc<Management>>,
    /// The management API with the platform identity, for the namespaces' broker users.
    admin: Option<super::rabbitmq_admin::BrokerAdmin>,
}

/// The connection and how many channels it has opened so far.
struct Shared {
    connection: Connection,
    opened: u32,
    /// Channels it may open before the id sequence would wrap.
    limit: u32,
}

/// Operations in flight at once; more wait for a slot (a burst of reconciles must not open
/// channels faster than the broker closes them).
pub const MAX_IN_FLIGHT: usize = 32;

/// How many channels one connection may open in its life: every channel id of the
/// negotiated `channel_max` once (0 means no limit: the whole u16 range).
pub fn channels_per_connection(channel_max: u16) -> u32 {
    u32::from(if channel_max == 0 {
        u16::MAX
    } else {
        channel_max
    })
}

type HttpClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    http_body_util::Empty<hyper::body::Bytes>,
>;

/// RabbitMQ's management API, for the counts AMQP does not tell (unacknowledged messages).
struct Management {
    base: String,
    vhost: String,
    authorization: String,
    client: HttpClient,
    /// Whether this outage was logged already (depth is asked on every reconcile).
    warned: AtomicBool,
    /// Counts of every queue of the vhost ([`counts_cache`]: when to list, when to wait).
    cache: Arc<CountsCache>,
}

/// Queues per listing page.
const PAGE_SIZE: usize = 500;

impl Management {
    fn new(
        base: &str,
        vhost: &str,
        user: &str,
        password: &str,
    ) -> Result<Management, std::io::Error> {
        use base64::Engine;
        let client = asya_transport::http_client::client()?;
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        Ok(Management {
            base: base.trim_end_matches('/').to_string(),
            vhost: vhost.to_string(),
            authorization: format!("Basic {token}"),
            client,
            warned: AtomicBool::new(false),
            cache: Arc::default(),
        })
    }

    /// Ready and unacknowledged counts; `None` for a missing queue.
    ///
    /// From a listing of the vhost's queues with `disable_stats=true&enable_queue_totals=true`,
    /// which reads each queue's own counters instead of the management statistics database:
    /// the per-queue endpoint asked about a queue created a moment before (no statistics yet)
    /// crashed RabbitMQ 3.10's statistics database worker (badkey), after which every
    /// management request answered 500 until the node restarted.
    /// `Ok(None)`: not in the listing (missing, or created since it was made).
    async fn counts(self: &Arc<Self>, name: &str) -> Result<Option<QueueDepth>, String> {
        let (step, found) = self.cache.read(name);
        match step {
            Step::Serve { refresh } | Step::Missing { refresh } => {
                if refresh {
                    let m = self.clone();
                    counts_cache::refresh_in_background(
                        self.cache.clone(),
                        async move { m.list_counts().await },
                        // A reconcile that finds no listing young enough lists itself and
                        // reports an outage once (`depth`).
                        |e| tracing::debug!(error = %e, "background listing of queue counts failed"),
                    );
                }
                Ok(found)
            }
            Step::Wait => {
                self.cache.refresh(self.list_counts()).await?;
                Ok(self.cache.read(name).1)
            }
        }
    }

    /// Counts of every queue of the vhost, page by page.
    async fn list_counts(&self) -> Result<HashMap<String, QueueDepth>, String> {
        let mut out = HashMap::new();
        let mut page = 1;
        loop {
            let uri = format!(
                "{}/api/queues/{}?disable_stats=true&enable_queue_totals=true&columns=name,messages_ready,messages_unacknowledged&page={page}&page_size={PAGE_SIZE}",
                self.base,
                asya_api::percent::encode(&self.vhost),
            );
            let v = self.get_json(&uri).await?;
            out.extend(depths_from_listing(&v));
            let pages = v.get("page_count").and_then(|n| n.as_u64()).unwrap_or(1);
            if page >= pages {
                return Ok(out);
            }
            page += 1;
        }
    }

    async fn get_json(&self, uri: &str) -> Result<serde_json::Value, String> {
        use http_body_util::BodyExt;
        let req = hyper::Request::get(uri)
            .header(hyper::header::AUTHORIZATION, &self.authorization)
            .body(http_body_util::Empty::new())
            .map_err(|e| e.to_string())?;
        let resp = tokio::time::timeout(Duration::from_secs(5), self.client.request(req))
            .await
            .map_err(|_| format!("GET {uri}: no answer in 5s"))?
            .map_err(|e| format!("GET {uri}: {e}"))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(format!("GET {uri}: {status}"));
        }
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("GET {uri}: {e}"))?
            .to_bytes();
        serde_json::from_slice(&body).map_err(|e| format!("GET {uri}: {e}"))
    }
}

impl Management {
    /// The queue's bindings (`GET /api/queues/{vhost}/{queue}/bindings`).
    async fn bindings(&self, queue: &str) -> Result<serde_json::Value, String> {
        let uri = format!(
            "{}/api/queues/{}/{}/bindings",
            self.base,
            asya_api::percent::encode(&self.vhost),
            asya_api::percent::encode(queue),
        );
        self.get_json(&uri).await
    }
}

impl RabbitQueues {
    /// The record of the queue's owner: the namespaces whose exchange `asya.{ns}` binds it
    /// ([`owner`]); [`QueueRecord::Unknown`] without the management API or without tenant
    /// exchanges (`shareAdminCredentials`: no queue is bound to one, so the bindings prove
    /// nothing). `None`: no such queue.
    pub async fn owner_record(&self, name: &str) -> Result<Option<QueueRecord>, QueueError> {
        if !self.exists(name).await? {
            return Ok(None);
        }
        let Some(m) = self.management.as_ref().filter(|_| self.tenant_exchanges) else {
            return Ok(Some(QueueRecord::Unknown));
        };
        let b = m.bindings(name).await.map_err(QueueError::Unavailable)?;
        Ok(Some(QueueRecord::TenantBindings(owner::tenant_bindings(
            name, &b,
        ))))
    }
}

/// The counts of every queue in a management listing page; a queue without counters is left
/// out.
fn depths_from_listing(v: &serde_json::Value) -> HashMap<String, QueueDepth> {
    let items = v.get("items").and_then(|i| i.as_array());
    items
        .into_iter()
        .flatten()
        .filter_map(|q| {
            let name = q.get("name")?.as_str()?;
            let ready = q.get("messages_ready")?.as_i64()?;
            let unacked = q.get("messages_unacknowledged")?.as_i64()?;
            Some((
                name.to_string(),
                QueueDepth {
                    queued: Some(ready),
                    processing: Some(unacked),
                },
            ))
        })
        .collect()
}

fn unavailable(e: impl std::fmt::Display) -> QueueError {
    QueueError::Unavailable(e.to_string())
}

/// 404 NOT_FOUND from a passive declare means "no such queue", not a broker failure.
fn is_not_found(e: &lapin::Error) -> bool {
    let s = e.to_string();
    s.contains("NOT_FOUND") || s.contains("404")
}

/// The URL with the password removed.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{}@{}", &url[..s + 3], user, &url[at + 1..])
        }
        _ => url.to_string(),
    }
}

/// How long connecting (and opening a channel) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one queue operation, connecting included, may take.
const OP_TIMEOUT: Duration = Duration::from_secs(20);

/// Attempts per policy looked at; a policy with more distinct delays than this leaves the
/// rest to the broker (the sidecar declares delay queues with `x-expires`).
const MAX_DELAYS_PER_POLICY: u32 = 1000;

/// The delay queues the sidecar may declare for retries into `queue`: one per distinct backoff
/// of the actor's retry policies, named by the sidecar's own rule. An invalid policy (the
/// sidecar would not start) has none.
pub fn delay_queues(queue: &str, resiliency: Option<&Resiliency>) -> BTreeSet<String> {
    let Some(plan) = resiliency.and_then(|r| Plan::from_spec(r).ok()) else {
        return BTreeSet::new();
    };
    let mut out = BTreeSet::new();
    for p in plan.policies.values() {
        // Attempt n failed and n < maxAttempts: the retry waits backoff_delay(n).
        for attempt in 1..p.max_attempts.min(MAX_DELAYS_PER_POLICY + 1) {
            let d = backoff_delay(p, attempt);
            if !d.is_zero() {
                out.insert(RabbitTransport::delay_queue(queue, d));
            }
            if d >= p.max {
                break;
            }
        }
    }
    out
}

impl RabbitQueues {
    /// Deletes the actor's queue and the delay queues its retry policies use (messages waiting
    /// there would only dead-letter into the deleted queue). Returns the delay queues deleted.
    pub async fn delete_with_delay_queues(
        &self,
        queue: &str,
        resiliency: Option<&Resiliency>,
    ) -> Result<Vec<String>, QueueError> {
        self.delete(queue).await?;
        let mut deleted = Vec::new();
        for q in delay_queues(queue, resiliency) {
            self.delete(&q).await?;
            deleted.push(q);
        }
        Ok(deleted)
    }

    pub fn new(url: String, exchange: &str) -> Self {
        RabbitQueues {
            display: redact(&url),
            url,
            exchange: exchange.to_string(),
            tenant_exchanges: false,
            connection: Mutex::new(None),
            in_flight: Semaphore::new(MAX_IN_FLIGHT),
            management: None,
            admin: None,
        }
    }

    /// Binds every queue to its namespace's exchange too, and manages the namespaces'
    /// broker users through the management API at `base`.
    pub fn with_tenant_identities(
        mut self,
        base: &str,
        vhost: &str,
        user: &str,
        password: &str,
    ) -> Result<Self, std::io::Error> {
        self.tenant_exchanges = true;
        self.admin = Some(super::rabbitmq_admin::BrokerAdmin::new(
            base, vhost, user, password,
        )?);
        Ok(self)
    }

    /// The management API client of the namespaces' users, when scoped identity is on.
    pub fn admin(&self) -> Option<&super::rabbitmq_admin::BrokerAdmin> {
        self.admin.as_ref()
    }

    /// Deletes namespace `ns`'s exchange (its last actor is gone); a missing one is fine.
    pub async fn delete_tenant_exchange(&self, ns: &str) -> Result<(), QueueError> {
        let name = asya_api::naming::tenant_exchange(ns);
        self.bounded(&format!("delete exchange {name}"), async {
            let ch = self.channel().await?;
            ch.exchange_delete(
                name.as_str().into(),
                lapin::options::ExchangeDeleteOptions::default(),
            )
            .await
            .map_err(unavailable)?;
            let _ = ch.close(200, "done".into()).await;
            Ok(())
        })
        .await
    }

    /// Also asks the management API at `base` (`http[s]://host:port`) for message counts.
    pub fn with_management(mut self, base: &str, vhost: &str, user: &str, password: &str) -> Self {
        match Management::new(base, vhost, user, password) {
            Ok(m) => self.management = Some(Arc::new(m)),
            Err(e) => {
                tracing::warn!(error = %e, "RabbitMQ management API client not available; queued counts only")
            }
        }
        self
    }

    async fn channel(&self) -> Result<Channel, QueueError> {
        let mut guard = self.connection.lock().await;
        if guard
            .as_ref()
            .is_some_and(|c| !c.connection.status().connected() || c.opened >= c.limit)
        {
            *guard = None;
        }
        let res = tokio::time::timeout(CONNECT_TIMEOUT, async {
            let mut c = match guard.take() {
                Some(c) => c,
                None => {
                    let props = ConnectionProperties::default()
                        .with_connection_name("asya-queue-provisioner".to_string().into());
                    let connection = Connection::connect(&self.url, props).await?;
                    let limit = channels_per_connection(connection.configuration().channel_max());
                    Shared {
                        connection,
                        opened: 0,
                        limit,
                    }
                }
            };
            c.opened += 1;
            let ch = c.connection.create_channel().await;
            *guard = Some(c);
            ch
        })
        .await;
        match res {
            Ok(Ok(ch)) => Ok(ch),
            Ok(Err(e)) => Err(unavailable(e)),
            Err(_) => {
                // A broker that accepted the socket and went silent: start afresh next time.
                *guard = None;
                Err(QueueError::Unavailable(format!(
                    "no answer from the broker within {CONNECT_TIMEOUT:?}"
                )))
            }
        }
    }

    /// Runs one queue operation with a deadline: a broker that stops answering mid-way fails
    /// the reconcile as unavailable (retried with backoff) instead of hanging it, and the
    /// connection is dropped so the next attempt connects again.
    async fn bounded<T>(
        &self,
        what: &str,
        op: impl Future<Output = Result<T, QueueError>>,
    ) -> Result<T, QueueError> {
        // Waiting for a slot counts toward the deadline: a stuck broker fails fast either way.
        let res = tokio::time::timeout(OP_TIMEOUT, async {
            let _slot = self
                .in_flight
                .acquire()
                .await
                .map_err(|e| QueueError::Unavailable(e.to_string()))?;
            op.await
        })
        .await;
        match res {
            Ok(res) => res,
            Err(_) => {
                *self.connection.lock().await = None;
                Err(QueueError::Unavailable(format!(
                    "{what}: no answer from the broker within {OP_TIMEOUT:?}"
                )))
            }
        }
    }

    fn queue_url(&self, name: &str) -> String {
        format!("{}/{}", self.display.trim_end_matches('/'), name)
    }

    /// Ready messages and consumers of an existing queue, `None` when it does not exist (the
    /// broker then closes `ch`; otherwise it stays open for the caller).
    async fn passive_on(ch: &Channel, name: &str) -> Result<Option<(u32, u32)>, QueueError> {
        let res = ch
            .queue_declare(
                name.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await;
        match res {
            Ok(q) => Ok(Some((q.message_count(), q.consumer_count()))),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(unavailable(e)),
        }
    }

    /// Ready messages and consumers of an existing queue, `None` when it does not exist.
    async fn passive(&self, name: &str) -> Result<Option<(u32, u32)>, QueueError> {
        let ch = self.channel().await?;
        let res = Self::passive_on(&ch, name).await;
        if matches!(res, Ok(Some(_))) {
            let _ = ch.close(200, "done".into()).await;
        }
        res
    }
}

impl RabbitQueues {
    /// Declares the wake queue `name` (docs/DESIGN.md §6.1) bound like an actor queue. Its
    /// arguments follow the actor's cooldown: when that changed the broker refuses the
    /// declare (PRECONDITION_FAILED), and the queue, which holds at most one disposable wake
    /// message, is deleted and declared again.
    async fn ensure_wake_queue(
        &self,
        ns: &str,
        name: &str,
        ttl: Duration,
    ) -> Result<(), QueueError> {
        use asya_transport::rabbitmq::{declare_bound_queue_with, wake_queue_args};
        let mut exchanges = vec![self.exchange.clone()];
        if self.tenant_exchanges {
            exchanges.push(asya_api::naming::tenant_exchange(ns));
        }
        let declare = |ch: Channel| {
            let exchanges = exchanges.clone();
            async move {
                for x in &exchanges {
                    declare_bound_queue_with(&ch, x, name, wake_queue_args(ttl)).await?;
                }
                let _ = ch.close(200, "done".into()).await;
                Ok::<(), lapin::Error>(())
            }
        };
        match declare(self.channel().await?).await {
            Ok(()) => Ok(()),
            Err(e) if e.to_string().contains("PRECONDITION_FAILED") => {
                let ch = self.channel().await?;
                ch.queue_delete(name.into(), QueueDeleteOptions::default())
                    .await
                    .map_err(unavailable)?;
                let _ = ch.close(200, "done".into()).await;
                declare(self.channel().await?)
                    .await
                    .map_err(|e| QueueError::Rejected(format!("{name}: {e}")))
            }
            Err(e) => Err(QueueError::Rejected(format!("{name}: {e}"))),
        }
    }
}

impl QueueOps for RabbitQueues {
    async fn ensure(&self, spec: &QueueSpec) -> Result<QueueInfo, QueueError> {
        self.bounded(&format!("declare {}", spec.name), async {
            let ch = self.channel().await?;
            // An existing queue leaves the channel open for the declare; a missing one closes it.
            let existed = Self::passive_on(&ch, &spec.name).await?.is_some();
            let ch = if existed { ch } else { self.channel().await? };
            let rejected = |e: lapin::Error| QueueError::Rejected(format!("{}: {e}", spec.name));
            asya_transport::rabbitmq::declare_bound_queue(&ch, &self.exchange, &spec.name)
                .await
                .map_err(rejected)?;
            // The platform exchange keeps its binding (the gateway, and sidecars not yet
            // rolled after an upgrade, publish there); the namespace's own exchange is where
            // its sidecars publish. Same rule, so both sides agree.
            if self.tenant_exchanges {
                let tenant = asya_api::naming::tenant_exchange(&spec.namespace);
                asya_transport::rabbitmq::declare_bound_queue(&ch, &tenant, &spec.name)
                    .await
                    .map_err(rejected)?;
            }
            let _ = ch.close(200, "done".into()).await;
            if let (Some(wake), Some(ttl)) = (spec.wake_queue(), spec.wake_ttl) {
                self.ensure_wake_queue(&spec.namespace, &wake, ttl).await?;
            }
            Ok(QueueInfo {
                url: self.queue_url(&spec.name),
                identifier: spec.name.clone(),
                created: !existed,
            })
        })
        .await
    }

    async fn exists(&self, name: &str) -> Result<bool, QueueError> {
        self.bounded(&format!("check {name}"), async {
            Ok(self.passive(name).await?.is_some())
        })
        .await
    }

    async fn delete(&self, name: &str) -> Result<(), QueueError> {
        self.bounded(&format!("delete {name}"), async {
            let ch = self.channel().await?;
            ch.queue_delete(name.into(), QueueDeleteOptions::default())
                .await
                .map_err(unavailable)?;
            let _ = ch.close(200, "done".into()).await;
            if let Some(m) = &self.management {
                m.cache.forget(name);
            }
            Ok(())
        })
        .await
    }

    async fn depth(&self, name: &str) -> Result<Option<QueueDepth>, QueueError> {
        // AMQP tells ready messages only; unacknowledged ones need the management API.
        if let Some(m) = &self.management {
            match m.counts(name).await {
                Ok(Some(d)) => {
                    m.warned.store(false, Ordering::Relaxed);
                    return Ok(Some(d));
                }
                Ok(None) => {}
                Err(e) => {
                    if !m.warned.swap(true, Ordering::Relaxed) {
                        tracing::warn!(error = %e, "RabbitMQ management API unavailable; queued counts from AMQP only");
                    }
                }
            }
        }
        // Not in the listing: AMQP says whether it exists (the listing may be a second old).
        let counts = self
            .bounded(&format!("count {name}"), self.passive(name))
            .await?;
        Ok(
            counts
                .map(|(ready, consumers)| amqp_depth(ready, consumers, self.management.is_some())),
        )
    }
}

/// A queue's depth as AMQP tells it: ready messages, and none in process when it has no
/// consumer (a message is unacknowledged only on a consumer's channel: the sidecars consume,
/// none takes with `basic.get`). With consumers AMQP cannot tell, and without the management
/// API the status never says it (`None`), so a fresh queue does not flip it there.
fn amqp_depth(ready: u32, consumers: u32, management: bool) -> QueueDepth {
    QueueDepth {
        queued: Some(i64::from(ready)),
        processing: (management && consumers == 0).then_some(0),
    }
}

#[cfg(test)]
mod tests {
    use super::{amqp_depth, delay_queues, depths_from_listing, redact};

    #[test]
    fn amqp_tells_nothing_in_process_only_without_consumers_and_where_the_listing_would() {
        assert_eq!(amqp_depth(3, 0, true).processing, Some(0));
        assert_eq!(amqp_depth(3, 0, true).queued, Some(3));
        assert_eq!(amqp_depth(3, 1, true).processing, None);
        assert_eq!(amqp_depth(3, 0, false).processing, None);
    }
    use crate::queue::QueueDepth;

    #[test]
    fn counts_come_from_the_item_with_that_exact_name() {
        let page = serde_json::json!({"items": [
            {"name": "asya-ns-a.delay-100ms", "messages_ready": 9, "messages_unacknowledged": 9},
            {"name": "asya-ns-a", "messages_ready": 2, "messages_unacknowledged": 1},
            {"name": "asya-ns-b"},
        ]});
        let d = depths_from_listing(&page);
        assert_eq!(
            d.get("asya-ns-a"),
            Some(&QueueDepth {
                queued: Some(2),
                processing: Some(1)
            })
        );
        // No counters (or not listed): unknown, not zero.
        assert_eq!(d.get("asya-ns-b"), None);
        assert_eq!(d.get("asya-ns-c"), None);
        assert_eq!(d.len(), 2);
    }

    #[test]
    fn delay_queues_follow_each_policy_backoff_up_to_its_cap() {
        let r: asya_api::types::Resiliency = serde_json::from_value(serde_json::json!({
            "policies": {
                "default": {"maxAttempts": 6, "backoff": "exponential", "initialInterval": "1s", "maxInterval": "5s"},
                "slow": {"maxAttempts": 3, "backoff": "constant", "initialInterval": "500ms"},
                "once": {"maxAttempts": 1, "initialInterval": "7s"}
            }
        }))
        .unwrap();
        let got: Vec<String> = delay_queues("asya-ns-a", Some(&r)).into_iter().collect();
        // default: 1s 2s 4s 5s (capped; attempt 5 would be 5s again); slow: 500ms; once: none.
        assert_eq!(
            got,
            [
                "asya-ns-a.delay-1000ms",
                "asya-ns-a.delay-2000ms",
                "asya-ns-a.delay-4000ms",
                "asya-ns-a.delay-5000ms",
                "asya-ns-a.delay-500ms",
            ]
        );
        assert!(delay_queues("asya-ns-a", None).is_empty());
    }

    #[test]
    fn redacts_password() {
        assert_eq!(
            redact("amqp://guest:secret@rabbit:5672/%2f"),
            "amqp://guest@rabbit:5672/%2f"
        );
        assert_eq!(redact("amqp://rabbit:5672"), "amqp://rabbit:5672");
    }
}
