//! RabbitMQ queues through lapin: durable queues bound to the durable direct exchange `asya`
//! with the queue's own name as routing key (DESIGN.md §4), declared by the
//! sidecar's own `declare_bound_queue`, so both sides share one rule.
//!
//! One connection per transport, reconnected on demand. Every operation opens its own
//! channel: a passive declare of a missing queue closes the channel (404), which must not
//! break the other reconciles sharing the connection.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use asya_api::types::Resiliency;
use asya_transport::rabbitmq::RabbitTransport;
use asya_transport::resiliency::{Plan, backoff_delay};
use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties};
use tokio::sync::Mutex;

use super::{QueueDepth, QueueError, QueueInfo, QueueOps, QueueSpec};

pub struct RabbitQueues {
    url: String,
    /// The URL without credentials, for status and logs.
    display: String,
    exchange: String,
    connection: Mutex<Option<Connection>>,
    management: Option<Management>,
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
}

impl Management {
    fn new(
        base: &str,
        vhost: &str,
        user: &str,
        password: &str,
    ) -> Result<Management, std::io::Error> {
        use base64::Engine;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(provider)?
            .https_or_http()
            .enable_http1()
            .build();
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build(https);
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        Ok(Management {
            base: base.trim_end_matches('/').to_string(),
            vhost: vhost.to_string(),
            authorization: format!("Basic {token}"),
            client,
            warned: AtomicBool::new(false),
        })
    }

    /// Ready and unacknowledged counts; `None` for a missing queue.
    ///
    /// Asked with `disable_stats=true&enable_queue_totals=true` on the queue listing, which
    /// reads each queue's own counters instead of the management statistics database: the
    /// per-queue endpoint asked about a queue created a moment before (no statistics yet)
    /// crashed RabbitMQ 3.10's statistics database worker (badkey), after which every
    /// management request answered 500 until the node restarted. It is cheaper too.
    async fn counts(&self, name: &str) -> Result<Option<QueueDepth>, String> {
        use http_body_util::BodyExt;
        let enc = crate::render::encode;
        let uri = format!(
            "{}/api/queues/{}?disable_stats=true&enable_queue_totals=true&use_regex=true&page=1&page_size=10&name={}",
            self.base,
            enc(&self.vhost),
            enc(&exact_name_regex(name))
        );
        let req = hyper::Request::get(&uri)
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
        let v: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| format!("GET {uri}: {e}"))?;
        Ok(depth_from_listing(&v, name))
    }
}

/// `^name$` with the regex metacharacters escaped, for the listing's `name` filter.
fn exact_name_regex(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('^');
    for c in name.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('$');
    out
}

/// The counts of queue `name` in a management listing page; `None` when it is not there or
/// its counters are missing.
fn depth_from_listing(v: &serde_json::Value, name: &str) -> Option<QueueDepth> {
    let item = v
        .get("items")?
        .as_array()?
        .iter()
        .find(|q| q.get("name").and_then(|n| n.as_str()) == Some(name))?;
    let ready = item.get("messages_ready").and_then(|n| n.as_i64())?;
    let unacked = item
        .get("messages_unacknowledged")
        .and_then(|n| n.as_i64())?;
    Some(QueueDepth {
        queued: Some(ready),
        processing: Some(unacked),
    })
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
            connection: Mutex::new(None),
            management: None,
        }
    }

    /// Also asks the management API at `base` (`http[s]://host:port`) for message counts.
    pub fn with_management(mut self, base: &str, vhost: &str, user: &str, password: &str) -> Self {
        match Management::new(base, vhost, user, password) {
            Ok(m) => self.management = Some(m),
            Err(e) => {
                tracing::warn!(error = %e, "RabbitMQ management API client not available; queued counts only")
            }
        }
        self
    }

    async fn channel(&self) -> Result<Channel, QueueError> {
        let mut guard = self.connection.lock().await;
        let res = tokio::time::timeout(CONNECT_TIMEOUT, async {
            if let Some(c) = guard.as_ref()
                && c.status().connected()
            {
                return c.create_channel().await.map(|ch| (ch, None));
            }
            let props = ConnectionProperties::default()
                .with_connection_name("asya-queue-provisioner".to_string().into());
            let conn = Connection::connect(&self.url, props).await?;
            let ch = conn.create_channel().await?;
            Ok((ch, Some(conn)))
        })
        .await;
        match res {
            Ok(Ok((ch, fresh))) => {
                if let Some(conn) = fresh {
                    *guard = Some(conn);
                }
                Ok(ch)
            }
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
        match tokio::time::timeout(OP_TIMEOUT, op).await {
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

    /// Message count of an existing queue, `None` when it does not exist.
    async fn passive(&self, name: &str) -> Result<Option<u32>, QueueError> {
        let ch = self.channel().await?;
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
            Ok(q) => {
                let _ = ch.close(200, "done".into()).await;
                Ok(Some(q.message_count()))
            }
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(unavailable(e)),
        }
    }
}

impl QueueOps for RabbitQueues {
    async fn ensure(&self, spec: &QueueSpec) -> Result<QueueInfo, QueueError> {
        self.bounded(&format!("declare {}", spec.name), async {
            let existed = self.passive(&spec.name).await?.is_some();
            let ch = self.channel().await?;
            let rejected = |e: lapin::Error| QueueError::Rejected(format!("{}: {e}", spec.name));
            asya_transport::rabbitmq::declare_bound_queue(&ch, &self.exchange, &spec.name)
                .await
                .map_err(rejected)?;
            let _ = ch.close(200, "done".into()).await;
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
            Ok(())
        })
        .await
    }

    async fn depth(&self, name: &str) -> Result<QueueDepth, QueueError> {
        // AMQP tells ready messages only; unacknowledged ones need the management API.
        if let Some(m) = &self.management {
            match m.counts(name).await {
                Ok(Some(d)) => {
                    m.warned.store(false, Ordering::Relaxed);
                    return Ok(d);
                }
                Ok(None) => {}
                Err(e) => {
                    if !m.warned.swap(true, Ordering::Relaxed) {
                        tracing::warn!(error = %e, "RabbitMQ management API unavailable; queued counts from AMQP only");
                    }
                }
            }
        }
        let queued = self
            .bounded(&format!("count {name}"), self.passive(name))
            .await?;
        Ok(QueueDepth {
            queued: queued.map(i64::from),
            processing: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{delay_queues, depth_from_listing, exact_name_regex, redact};
    use crate::queue::QueueDepth;

    #[test]
    fn the_listing_filter_matches_one_queue_exactly() {
        assert_eq!(exact_name_regex("asya-ns-a"), "^asya-ns-a$");
        assert_eq!(
            exact_name_regex("asya-ns-a.delay-100ms"),
            r"^asya-ns-a\.delay-100ms$"
        );
    }

    #[test]
    fn counts_come_from_the_item_with_that_exact_name() {
        let page = serde_json::json!({"items": [
            {"name": "asya-ns-a.delay-100ms", "messages_ready": 9, "messages_unacknowledged": 9},
            {"name": "asya-ns-a", "messages_ready": 2, "messages_unacknowledged": 1},
        ]});
        assert_eq!(
            depth_from_listing(&page, "asya-ns-a"),
            Some(QueueDepth {
                queued: Some(2),
                processing: Some(1)
            })
        );
        assert_eq!(depth_from_listing(&page, "asya-ns-b"), None);
        let no_counters = serde_json::json!({"items": [{"name": "asya-ns-a"}]});
        assert_eq!(depth_from_listing(&no_counters, "asya-ns-a"), None);
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
