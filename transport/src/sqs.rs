//! Amazon SQS (or a compatible server) through aws-sdk-sqs: long polling, batch receive,
//! delete only after routing, visibility extended while a handler runs, queue URLs cached.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::operation::receive_message::ReceiveMessageOutput;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, MessageSystemAttributeName, QueueAttributeName,
};
use tokio::sync::{oneshot, watch};

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
    /// Long polls under way, each in a task of its own (see `poll`).
    polls: Arc<watch::Sender<usize>>,
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
            visibility: Mutex::new(s.visibility_timeout),
            s,
            client,
            urls: Mutex::new(HashMap::new()),
            held: Mutex::new(HashSet::new()),
            up: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            polls: Arc::new(watch::Sender::new(0)),
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

    /// One long poll, in a task of its own. The server cannot be told to stop a poll: had
    /// the request been dropped with the `receive` that made it (at shutdown), what the
    /// poll still took would stay invisible, for no pod, until the visibility timeout.
    /// Instead, what nobody is left to take is given back at once (SQS counts the receive
    /// all the same), and `stop_consuming` waits for that.
    async fn poll(&self, url: String) -> Result<ReceiveMessageOutput, TransportError> {
        let running = PollRunning::start(&self.polls);
        let request = self
            .client
            .receive_message()
            .queue_url(&url)
            .max_number_of_messages(10)
            .wait_time_seconds(self.s.wait_seconds)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount);
        let giver = GiveBack {
            client: self.client.clone(),
            url,
            polls: self.polls.clone(),
        };
        let (tx, rx) = oneshot::channel();
        let unclaimed = giver.clone();
        tokio::spawn(async move {
            let _running = running;
            let out = request.send().await.map_err(unavailable);
            if let Err(Ok(out)) = tx.send(out) {
                unclaimed.give_back(out).await;
            }
        });
        let mut answer = Answer { rx, giver };
        (&mut answer.rx)
            .await
            .unwrap_or_else(|_| Err(TransportError::Unavailable("long poll task ended".into())))
    }
}

/// Counts a long poll (or the give-back of what it brought) while it runs.
struct PollRunning(Arc<watch::Sender<usize>>);

impl PollRunning {
    fn start(polls: &Arc<watch::Sender<usize>>) -> Self {
        polls.send_modify(|n| *n += 1);
        PollRunning(polls.clone())
    }
}

impl Drop for PollRunning {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Makes messages a poll took visible again at once.
#[derive(Clone)]
struct GiveBack {
    client: Client,
    url: String,
    polls: Arc<watch::Sender<usize>>,
}

impl GiveBack {
    async fn give_back(&self, out: ReceiveMessageOutput) {
        let receipts: Vec<String> = out
            .messages
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| m.receipt_handle)
            .collect();
        if receipts.is_empty() {
            return;
        }
        let entries = receipts.iter().enumerate().filter_map(|(i, r)| {
            ChangeMessageVisibilityBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(r)
                .visibility_timeout(0)
                .build()
                .ok()
        });
        let given = self
            .client
            .change_message_visibility_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries.collect()))
            .send()
            .await;
        match given {
            Ok(out) if out.failed.is_empty() => {
                tracing::info!(
                    messages = receipts.len(),
                    "a long poll cut short by shutdown took messages; given back"
                );
            }
            Ok(out) => {
                tracing::warn!(
                    messages = receipts.len(),
                    failed = out.failed.len(),
                    "some messages a cut-short long poll took could not be given back; they return after the visibility timeout"
                );
            }
            Err(e) => {
                tracing::warn!(messages = receipts.len(), error = ?e, "could not give back what a cut-short long poll took; it returns after the visibility timeout");
            }
        }
    }
}

/// The answer to one `poll`. Dropped before it arrived (the `receive` was), the poll's task
/// gives the messages back; dropped after it arrived but before it was read, it does so.
struct Answer {
    rx: oneshot::Receiver<Result<ReceiveMessageOutput, TransportError>>,
    giver: GiveBack,
}

impl Drop for Answer {
    fn drop(&mut self) {
        self.rx.close();
        // No runtime left (the process is ending): nothing can be sent any more.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if let Ok(Ok(out)) = self.rx.try_recv() {
            let running = PollRunning::start(&self.giver.polls);
            let giver = self.giver.clone();
            rt.spawn(async move {
                let _running = running;
                giver.give_back(out).await;
            });
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
                self.poll(url).await
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
        // A long poll cut short by the shutdown still runs on the server: wait for what it
        // brings to be given back before the process may exit.
        let limit = Duration::from_secs(self.s.wait_seconds.max(0) as u64 + 10);
        let mut polls = self.polls.subscribe();
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
