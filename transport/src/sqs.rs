//! Amazon SQS (or a compatible server) through aws-sdk-sqs: long polling, batch receive,
//! sends and deletes coalesced into batch requests (`sqs_batcher`), delete only after every
//! successor is accepted, visibility extended in batches while a handler runs, queue URLs
//! cached.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::ProvideErrorMetadata;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, MessageSystemAttributeName, QueueAttributeName,
};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::oneshot;

use crate::sqs_batch::{self, MAX_ENTRIES};
use crate::sqs_batcher::{Batcher, DeleteJob, SendJob};
use crate::sqs_poll::{self, Counters, Held, Poll};
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
    /// Long polls kept under way at once (1..=`MAX_POLLERS`): while the processor works on
    /// one batch, the next ones are already being fetched. Each may bring 10 messages, held
    /// (kept invisible) until read, so this bounds what a pod holds beyond its work.
    pub pollers: usize,
}

/// The most long polls one transport keeps under way.
pub const MAX_POLLERS: usize = 10;

pub struct SqsHandle {
    receipt: String,
}

pub struct SqsTransport {
    s: SqsSettings,
    client: Client,
    urls: Mutex<HashMap<String, String>>,
    /// Receipt handles whose handler is running or waiting in the batch.
    held: Held,
    /// The actor queue's visibility timeout as the server reports it.
    visibility: Mutex<Duration>,
    up: AtomicBool,
    stopping: AtomicBool,
    /// Long polls under way, each in a task of its own (see `sqs_poll`), and the give-backs
    /// of what they brought.
    polls: Counters,
    /// The polls `receive` keeps going; outlives a cancelled `receive`, emptied at stop.
    pollers: tokio::sync::Mutex<FuturesUnordered<Poll>>,
    batcher: Batcher,
}

fn unavailable(e: impl std::fmt::Debug) -> TransportError {
    TransportError::Unavailable(format!("{e:?}"))
}

impl SqsTransport {
    pub async fn new(s: SqsSettings) -> Self {
        Self::with_credentials(s, None).await
    }

    /// As [`Self::new`], with static keys (`(access key id, secret key)`) instead of the
    /// default AWS chain: for tools acting with a namespace's copied keys (the `asya` command).
    pub async fn with_credentials(s: SqsSettings, keys: Option<(String, String)>) -> Self {
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
        if let Some((id, secret)) = keys {
            b = b.credentials_provider(aws_sdk_sqs::config::Credentials::new(
                id,
                secret,
                None,
                None,
                "asya-namespace-secret",
            ));
        }
        let client = Client::from_conf(b.build());
        SqsTransport {
            batcher: Batcher::start(client.clone(), s.max_message_bytes),
            visibility: Mutex::new(s.visibility_timeout),
            s,
            client,
            urls: Mutex::new(HashMap::new()),
            held: Arc::new(Mutex::new(HashSet::new())),
            up: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            polls: Counters::new(),
            pollers: tokio::sync::Mutex::new(FuturesUnordered::new()),
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
                let missing = e.as_service_error().is_some_and(|se| {
                    se.is_queue_does_not_exist() || sqs_batch::is_no_such_queue(se.code())
                });
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
                let created = self
                    .client
                    .create_queue()
                    .queue_name(name)
                    .attributes(QueueAttributeName::VisibilityTimeout, secs)
                    .send()
                    .await;
                match created {
                    Ok(out) => out.queue_url().unwrap_or_default().to_string(),
                    // Two hops sending to a new queue at once: the other created it.
                    Err(e)
                        if sqs_batch::is_queue_name_exists(
                            e.as_service_error().and_then(|se| se.code()),
                        ) =>
                    {
                        self.client
                            .get_queue_url()
                            .queue_name(name)
                            .send()
                            .await
                            .map_err(unavailable)?
                            .queue_url()
                            .unwrap_or_default()
                            .to_string()
                    }
                    Err(e) => {
                        return Err(TransportError::Rejected(format!("create {name}: {e:?}")));
                    }
                }
            }
        };
        if let Ok(mut m) = self.urls.lock() {
            m.insert(name.to_string(), url.clone());
        }
        Ok(url)
    }

    /// The URL of an existing queue (cached like [`Self::queue_url`]); `None` when it does
    /// not exist or cannot be looked up.
    async fn existing_url(&self, name: &str) -> Option<String> {
        if let Some(u) = self.urls.lock().ok().and_then(|m| m.get(name).cloned()) {
            return Some(u);
        }
        let out = self
            .client
            .get_queue_url()
            .queue_name(name)
            .send()
            .await
            .ok()?;
        let url = out.queue_url()?.to_string();
        if let Ok(mut m) = self.urls.lock() {
            m.insert(name.to_string(), url.clone());
        }
        Some(url)
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
                    Some(t) => t
                        .visibility
                        .lock()
                        .map(|v| sqs_batch::extension_period(*v))
                        .unwrap_or(Duration::from_secs(10)),
                    None => return,
                };
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
            .map(|v| sqs_batch::extension_seconds(*v))
            .unwrap_or(30);
        let requests = receipts.chunks(MAX_ENTRIES).map(|chunk| {
            let entries = chunk.iter().enumerate().filter_map(|(i, r)| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(r)
                    .visibility_timeout(secs)
                    .build()
                    .ok()
            });
            self.client
                .change_message_visibility_batch()
                .queue_url(&url)
                .set_entries(Some(entries.collect()))
                .send()
        });
        for answer in futures::future::join_all(requests).await {
            match answer {
                // A failed entry is most often a message deleted meanwhile (its receipt is
                // no longer valid); the next round tries the others again anyway.
                Ok(out) if !out.failed.is_empty() => tracing::debug!(
                    queue = %self.s.queue,
                    failed = out.failed.len(),
                    first = ?out.failed.first().map(|f| &f.code),
                    "some held messages were not extended"
                ),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(queue = %self.s.queue, error = ?e, "could not extend message visibility")
                }
            }
        }
    }
}

impl Transport for SqsTransport {
    type Handle = SqsHandle;

    async fn receive(&self) -> Result<Vec<Received<SqsHandle>>, TransportError> {
        let mut pause = Duration::from_millis(200);
        let mut polls = self.pollers.lock().await;
        loop {
            if self.stopping.load(Ordering::SeqCst) {
                return Ok(Vec::new());
            }
            let answer = match self.own_url().await {
                Ok(url) => {
                    // The endpoint answered for our queue: connected, while the long polls
                    // wait (up to ASYA_SQS_WAIT_SECONDS on an empty queue).
                    self.up.store(true, Ordering::SeqCst);
                    let wanted = self.s.pollers.clamp(1, MAX_POLLERS);
                    while polls.len() < wanted {
                        polls.push(sqs_poll::start(
                            &self.client,
                            url.clone(),
                            self.s.wait_seconds,
                            &self.polls,
                            &self.held,
                        ));
                    }
                    // Never None: at least one poll was just pushed.
                    polls.next().await.unwrap_or_else(|| {
                        Err(TransportError::Unavailable("no long poll under way".into()))
                    })
                }
                Err(e) => Err(e),
            };
            match answer {
                Ok(out) => {
                    self.up.store(true, Ordering::SeqCst);
                    let batch: Vec<_> = out
                        .messages
                        .unwrap_or_default()
                        .into_iter()
                        .filter_map(|m| {
                            let receipt = m.receipt_handle?;
                            let count = m
                                .attributes
                                .as_ref()
                                .and_then(|a| {
                                    a.get(&MessageSystemAttributeName::ApproximateReceiveCount)
                                })
                                .and_then(|v| v.parse::<u32>().ok())
                                .unwrap_or(1);
                            Some(Received {
                                body: m.body.unwrap_or_default().into_bytes(),
                                redeliveries: count.saturating_sub(1),
                                handle: SqsHandle { receipt },
                            })
                        })
                        .collect();
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

    /// Through the batch loop (a `SendMessageBatch` per wake queue's URL); a wake queue is
    /// looked up, never created (auto-create or not).
    async fn wake(&self, queues: &[String], body: &[u8]) -> usize {
        let Ok(body) = std::str::from_utf8(body) else {
            return queues.len();
        };
        let mut failed = 0;
        let mut answers = Vec::with_capacity(queues.len());
        for q in queues {
            let Some(url) = self.existing_url(q).await else {
                failed += 1;
                continue;
            };
            let (reply, answer) = oneshot::channel();
            self.batcher.send(SendJob {
                url,
                queue: q.clone(),
                body: body.to_string(),
                delay_seconds: None,
                reply,
            });
            answers.push(answer);
        }
        for r in futures::future::join_all(answers).await {
            if !matches!(r, Ok(Ok(()))) {
                failed += 1;
            }
        }
        failed
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
        // Every message goes into the batch loop before any answer is awaited, so a fan-out
        // travels in as few requests as its sizes allow.
        let mut answers = Vec::with_capacity(messages.len());
        for m in messages {
            let url = self.queue_url(&m.queue).await?;
            let body = String::from_utf8(m.body.clone()).map_err(|e| {
                TransportError::Rejected(format!(
                    "message for {}: SQS bodies must be UTF-8 (invalid at byte {})",
                    m.queue,
                    e.utf8_error().valid_up_to()
                ))
            })?;
            // Round up so a retry never comes early; longer waits are capped by SQS.
            let delay_seconds = m
                .delay
                .map(|d| d.as_millis().div_ceil(1000).min(u128::from(MAX_DELAY_SECS)) as i32);
            let (reply, answer) = oneshot::channel();
            self.batcher.send(SendJob {
                url,
                queue: m.queue.clone(),
                body,
                delay_seconds,
                reply,
            });
            answers.push(answer);
        }
        // All answers are awaited: the caller acks only when every one is Ok.
        let mut first_err = None;
        for r in futures::future::join_all(answers).await {
            let r = r.unwrap_or_else(|_| {
                Err(TransportError::Unavailable(
                    "the SQS batch loop dropped a message".into(),
                ))
            });
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    async fn ack(&self, h: &SqsHandle) -> Result<(), TransportError> {
        self.unhold(h);
        let url = self.own_url().await?;
        let (reply, answer) = oneshot::channel();
        self.batcher.delete(DeleteJob {
            url,
            receipt: h.receipt.clone(),
            reply,
        });
        answer.await.unwrap_or_else(|_| {
            Err(TransportError::Unavailable(
                "the SQS batch loop dropped a delete".into(),
            ))
        })
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
        // Polls no `receive` will read: dropped, each gives back what it brought or brings.
        self.pollers.lock().await.clear();
        // A long poll cut short by the shutdown still runs on the server: wait for what it
        // brings to be given back before the process may exit.
        let limit = Duration::from_secs(self.s.wait_seconds.max(0) as u64 + 10);
        let mut polls = self.polls.running.subscribe();
        if tokio::time::timeout(limit, polls.wait_for(|n| *n == 0))
            .await
            .is_err()
        {
            tracing::warn!(queue = %self.s.queue, waited = ?limit, "a long poll is still under way at exit; what it brings returns after the visibility timeout");
        }
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
