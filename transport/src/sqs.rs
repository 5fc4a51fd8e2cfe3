//! Amazon SQS (or a compatible server) through aws-sdk-sqs: long polling, batch receive,
//! delete only after routing, visibility extended while a handler runs, queue URLs cached.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};

use crate::{Outgoing, Received, Transport, TransportError};

/// SQS refuses a larger DelaySeconds.
const MAX_DELAY_SECS: u64 = 900;

#[derive(Debug, Clone)]
pub struct SqsSettings {
    pub region: String,
    pub endpoint: Option<String>,
    pub queue: String,
    pub wait_seconds: i32,
    pub visibility_timeout: Duration,
    pub auto_create: bool,
    pub max_message_bytes: usize,
}

pub struct SqsHandle {
    receipt: String,
}

pub struct SqsTransport {
    s: SqsSettings,
    client: Client,
    urls: Mutex<HashMap<String, String>>,
    /// Receipt handles whose handler is running or waiting in the batch.
    held: Mutex<HashSet<String>>,
    /// The actor queue's visibility timeout as the server reports it.
    visibility: Mutex<Duration>,
    up: AtomicBool,
    stopping: AtomicBool,
}

fn unavailable(e: impl std::fmt::Debug) -> TransportError {
    TransportError::Unavailable(format!("{e:?}"))
}

impl SqsTransport {
    pub async fn new(s: SqsSettings) -> Self {
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let shared = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new(s.region.clone()))
            .http_client(http)
            .load()
            .await;
        let mut b = aws_sdk_sqs::config::Builder::from(&shared);
        if let Some(ep) = &s.endpoint {
            b = b.endpoint_url(ep);
        }
        let client = Client::from_conf(b.build());
        SqsTransport {
            visibility: Mutex::new(s.visibility_timeout),
            s,
            client,
            urls: Mutex::new(HashMap::new()),
            held: Mutex::new(HashSet::new()),
            up: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Resolves a queue URL once and caches it; creates the queue when auto-create is on.
    pub async fn queue_url(&self, name: &str) -> Result<String, TransportError> {
        if let Some(u) = self.urls.lock().ok().and_then(|m| m.get(name).cloned()) {
            return Ok(u);
        }
        let url = match self.client.get_queue_url().queue_name(name).send().await {
            Ok(out) => out.queue_url().unwrap_or_default().to_string(),
            Err(e) => {
                let missing = e
                    .as_service_error()
                    .map(|se| se.is_queue_does_not_exist())
                    .unwrap_or(false);
                if !missing {
                    return Err(unavailable(e));
                }
                if !self.s.auto_create {
                    return Err(TransportError::NoSuchQueue(name.to_string()));
                }
                let secs = self
                    .s
                    .visibility_timeout
                    .as_secs()
                    .clamp(1, 43_200)
                    .to_string();
                self.client
                    .create_queue()
                    .queue_name(name)
                    .attributes(QueueAttributeName::VisibilityTimeout, secs)
                    .send()
                    .await
                    .map_err(|e| TransportError::Rejected(format!("create {name}: {e:?}")))?
                    .queue_url()
                    .unwrap_or_default()
                    .to_string()
            }
        };
        if let Ok(mut m) = self.urls.lock() {
            m.insert(name.to_string(), url.clone());
        }
        Ok(url)
    }

    async fn own_url(&self) -> Result<String, TransportError> {
        let first = self
            .urls
            .lock()
            .map(|m| !m.contains_key(&self.s.queue))
            .unwrap_or(true);
        let url = self.queue_url(&self.s.queue).await?;
        if first {
            // Learn the real visibility timeout: it sets how often running handlers extend.
            if let Ok(out) = self
                .client
                .get_queue_attributes()
                .queue_url(&url)
                .attribute_names(QueueAttributeName::VisibilityTimeout)
                .send()
                .await
                && let Some(secs) = out
                    .attributes()
                    .and_then(|a| a.get(&QueueAttributeName::VisibilityTimeout))
                    .and_then(|v| v.parse::<u64>().ok())
                && let Ok(mut v) = self.visibility.lock()
            {
                *v = Duration::from_secs(secs.max(1));
            }
        }
        Ok(url)
    }

    /// Keeps every held message invisible while it waits or its handler runs: runs until
    /// the transport is dropped.
    pub fn spawn_extender(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let period = match weak.upgrade() {
                    Some(t) => t.visibility.lock().map(|v| *v / 3).unwrap_or_default(),
                    None => return,
                }
                .max(Duration::from_millis(500));
                tokio::time::sleep(period).await;
                let Some(t) = weak.upgrade() else { return };
                t.extend_held().await;
            }
        });
    }

    async fn extend_held(&self) {
        let receipts: Vec<String> = self
            .held
            .lock()
            .map(|h| h.iter().cloned().collect())
            .unwrap_or_default();
        if receipts.is_empty() {
            return;
        }
        let Ok(url) = self.own_url().await else {
            return;
        };
        let secs = self
            .visibility
            .lock()
            .map(|v| v.as_secs())
            .unwrap_or(30)
            .clamp(1, 43_200) as i32;
        for r in receipts {
            if let Err(e) = self
                .client
                .change_message_visibility()
                .queue_url(&url)
                .receipt_handle(&r)
                .visibility_timeout(secs)
                .send()
                .await
            {
                tracing::warn!(error = ?e, "could not extend message visibility");
            }
        }
    }
}

impl Transport for SqsTransport {
    type Handle = SqsHandle;

    async fn receive(&self) -> Result<Vec<Received<SqsHandle>>, TransportError> {
        let mut pause = Duration::from_millis(200);
        loop {
            if self.stopping.load(Ordering::SeqCst) {
                return Ok(Vec::new());
            }
            let attempt = async {
                let url = self.own_url().await?;
                // The endpoint answered for our queue: connected, while the long poll waits
                // (up to ASYA_SQS_WAIT_SECONDS on an empty queue) for the first answer.
                self.up.store(true, Ordering::SeqCst);
                self.client
                    .receive_message()
                    .queue_url(url)
                    .max_number_of_messages(10)
                    .wait_time_seconds(self.s.wait_seconds)
                    .message_system_attribute_names(
                        MessageSystemAttributeName::ApproximateReceiveCount,
                    )
                    .send()
                    .await
                    .map_err(unavailable)
            };
            match attempt.await {
                Ok(out) => {
                    self.up.store(true, Ordering::SeqCst);
                    let mut batch = Vec::new();
                    for m in out.messages.unwrap_or_default() {
                        let Some(receipt) = m.receipt_handle else {
                            continue;
                        };
                        let count = m
                            .attributes
                            .as_ref()
                            .and_then(|a| {
                                a.get(&MessageSystemAttributeName::ApproximateReceiveCount)
                            })
                            .and_then(|v| v.parse::<u32>().ok())
                            .unwrap_or(1);
                        if let Ok(mut h) = self.held.lock() {
                            h.insert(receipt.clone());
                        }
                        batch.push(Received {
                            body: m.body.unwrap_or_default().into_bytes(),
                            redeliveries: count.saturating_sub(1),
                            handle: SqsHandle { receipt },
                        });
                    }
                    if !batch.is_empty() {
                        return Ok(batch);
                    }
                    pause = Duration::from_millis(200);
                }
                Err(e) => {
                    self.up.store(false, Ordering::SeqCst);
                    tracing::warn!(queue = %self.s.queue, error = %e, retry_in = ?pause, "SQS receive failed");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    async fn send(&self, messages: &[Outgoing]) -> Result<(), TransportError> {
        for m in messages {
            if m.body.len() > self.s.max_message_bytes {
                return Err(TransportError::TooLarge {
                    queue: m.queue.clone(),
                    size: m.body.len(),
                    limit: self.s.max_message_bytes,
                });
            }
        }
        let sends = messages.iter().map(|m| async move {
            let url = self.queue_url(&m.queue).await?;
            let body = String::from_utf8(m.body.clone())
                .map_err(|_| TransportError::Rejected("SQS bodies must be UTF-8".into()))?;
            let mut req = self.client.send_message().queue_url(url).message_body(body);
            if let Some(d) = m.delay {
                // Round up so a retry never comes early; longer waits are capped by SQS.
                let secs = d.as_millis().div_ceil(1000).min(u128::from(MAX_DELAY_SECS)) as i32;
                req = req.delay_seconds(secs);
            }
            req.send().await.map_err(|e| {
                let se = e.as_service_error();
                if se.map(|s| s.is_queue_does_not_exist()).unwrap_or(false) {
                    TransportError::NoSuchQueue(m.queue.clone())
                } else {
                    unavailable(e)
                }
            })?;
            Ok::<(), TransportError>(())
        });
        for r in futures::future::join_all(sends).await {
            r?;
        }
        Ok(())
    }

    async fn ack(&self, h: &SqsHandle) -> Result<(), TransportError> {
        self.unhold(h);
        let url = self.own_url().await?;
        self.client
            .delete_message()
            .queue_url(url)
            .receipt_handle(&h.receipt)
            .send()
            .await
            .map(|_| ())
            .map_err(unavailable)
    }

    async fn release(&self, h: &SqsHandle) -> Result<(), TransportError> {
        self.unhold(h);
        let url = self.own_url().await?;
        self.client
            .change_message_visibility()
            .queue_url(url)
            .receipt_handle(&h.receipt)
            .visibility_timeout(0)
            .send()
            .await
            .map(|_| ())
            .map_err(unavailable)
    }

    fn hold(&self, h: &SqsHandle) {
        if let Ok(mut held) = self.held.lock() {
            held.insert(h.receipt.clone());
        }
    }

    fn unhold(&self, h: &SqsHandle) {
        if let Ok(mut held) = self.held.lock() {
            held.remove(&h.receipt);
        }
    }

    async fn stop_consuming(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    fn healthy(&self) -> bool {
        self.up.load(Ordering::SeqCst)
    }

    fn max_message_bytes(&self) -> Option<usize> {
        Some(self.s.max_message_bytes)
    }

    async fn queue_depth(&self) -> Option<u64> {
        let url = self.own_url().await.ok()?;
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .send()
            .await
            .ok()?;
        out.attributes()?
            .get(&QueueAttributeName::ApproximateNumberOfMessages)?
            .parse()
            .ok()
    }
}
