//! Coalesces the sends and deletes of concurrent envelopes into SQS batch requests
//! (`SendMessageBatch`, `DeleteMessageBatch`): one request carries up to 10 entries, so a
//! sidecar busy with many envelopes makes a tenth of the requests. Nothing waits for a batch
//! to fill: a round of requests leaves as soon as one of the few slots is free, with whatever
//! arrived meanwhile (rounds in flight are what lets entries gather).
//!
//! Each caller learns the fate of its own entries: `Ok` only once the server reported that
//! entry successful; failed entries the server may accept later are retried
//! (`sqs_batch::entry_verdict`), the others fail at once. An entry the answer does not name
//! is never taken for done.

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::ProvideErrorMetadata;
use aws_sdk_sqs::types::{
    BatchResultErrorEntry, DeleteMessageBatchRequestEntry, SendMessageBatchRequestEntry,
};
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::TransportError;
use crate::sqs_batch::{self, ENTRY_ATTEMPTS, EntryVerdict, MAX_ENTRIES};

/// Rounds of one kind (sends, deletes) in flight at once; a round takes up to 10 entries
/// per slot that gathered, as one request per 10 entries and queue.
const REQUESTS_IN_FLIGHT: usize = 4;

type Reply = oneshot::Sender<Result<(), TransportError>>;

/// One message to send in a batch.
pub(crate) struct SendJob {
    pub url: String,
    pub queue: String,
    pub body: String,
    pub delay_seconds: Option<i32>,
    pub reply: Reply,
}

/// One received message to delete in a batch.
pub(crate) struct DeleteJob {
    pub url: String,
    pub receipt: String,
    pub reply: Reply,
}

/// The two coalescing loops; they end when the `Batcher` is dropped.
pub(crate) struct Batcher {
    sends: mpsc::UnboundedSender<SendJob>,
    deletes: mpsc::UnboundedSender<DeleteJob>,
}

impl Batcher {
    /// Starts the loops on the current runtime. `max_bytes`: the largest total of bodies in
    /// one `SendMessageBatch` (SQS's largest message).
    pub fn start(client: Client, max_bytes: usize) -> Self {
        let (sends, send_rx) = mpsc::unbounded_channel();
        let (deletes, delete_rx) = mpsc::unbounded_channel();
        tokio::spawn(batch_loop::<SendJob>(client.clone(), max_bytes, send_rx));
        tokio::spawn(batch_loop::<DeleteJob>(client, 0, delete_rx));
        Batcher { sends, deletes }
    }

    pub fn send(&self, job: SendJob) {
        if let Err(mpsc::error::SendError(job)) = self.sends.send(job) {
            let _ = job.reply.send(Err(ended()));
        }
    }

    pub fn delete(&self, job: DeleteJob) {
        if let Err(mpsc::error::SendError(job)) = self.deletes.send(job) {
            let _ = job.reply.send(Err(ended()));
        }
    }
}

fn ended() -> TransportError {
    TransportError::Unavailable("the SQS batch loop has ended".into())
}

/// What differs between the two batch requests; the loop, the grouping and the retries are
/// shared ([`batch_loop`], [`run`]).
trait Kind: Sized + Send + 'static {
    /// The request's name, for messages.
    const OP: &'static str;
    fn url(&self) -> &str;
    /// What a message names the entry by (its queue, or the queue's URL).
    fn target(&self) -> &str;
    fn reply(self, r: Result<(), TransportError>);
    /// One queue's jobs in request-sized runs, in order.
    fn runs(jobs: Vec<Self>, max_bytes: usize) -> Vec<Vec<Self>>;
    /// One request of the `open` entries of `pending` (entry ids are their indexes).
    fn request(
        client: &Client,
        url: &str,
        pending: &[Option<Self>],
        open: &[usize],
    ) -> impl std::future::Future<Output = Result<Outcome, Refused>> + Send;
}

/// Why a whole batch request failed.
enum Refused {
    /// The queue does not exist: every entry fails at once.
    NoSuchQueue,
    /// Anything else: retried.
    Other(String),
}

impl Kind for SendJob {
    const OP: &'static str = "SendMessageBatch";
    fn url(&self) -> &str {
        &self.url
    }
    fn target(&self) -> &str {
        &self.queue
    }
    fn reply(self, r: Result<(), TransportError>) {
        let _ = self.reply.send(r);
    }
    fn runs(jobs: Vec<Self>, max_bytes: usize) -> Vec<Vec<Self>> {
        let sizes: Vec<usize> = jobs.iter().map(|j| j.body.len()).collect();
        let mut jobs = jobs.into_iter();
        sqs_batch::split(&sizes, MAX_ENTRIES, max_bytes)
            .into_iter()
            .map(|r| jobs.by_ref().take(r.len()).collect())
            .collect()
    }
    async fn request(
        client: &Client,
        url: &str,
        pending: &[Option<Self>],
        open: &[usize],
    ) -> Result<Outcome, Refused> {
        let entries = open.iter().filter_map(|&i| {
            let j = pending[i].as_ref()?;
            SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(&j.body)
                .set_delay_seconds(j.delay_seconds)
                .build()
                .ok()
        });
        let out = client
            .send_message_batch()
            .queue_url(url)
            .set_entries(Some(entries.collect()))
            .send()
            .await
            .map_err(|e| {
                if sqs_batch::is_no_such_queue(e.as_service_error().and_then(|s| s.code())) {
                    Refused::NoSuchQueue
                } else {
                    Refused::Other(format!("{e:?}"))
                }
            })?;
        Ok(outcome(
            out.successful.iter().map(|s| s.id.as_str()),
            &out.failed,
        ))
    }
}

impl Kind for DeleteJob {
    const OP: &'static str = "DeleteMessageBatch";
    fn url(&self) -> &str {
        &self.url
    }
    fn target(&self) -> &str {
        &self.url
    }
    fn reply(self, r: Result<(), TransportError>) {
        let _ = self.reply.send(r);
    }
    fn runs(jobs: Vec<Self>, _max_bytes: usize) -> Vec<Vec<Self>> {
        let mut jobs = jobs.into_iter().peekable();
        let mut runs = Vec::new();
        while jobs.peek().is_some() {
            runs.push(jobs.by_ref().take(MAX_ENTRIES).collect());
        }
        runs
    }
    async fn request(
        client: &Client,
        url: &str,
        pending: &[Option<Self>],
        open: &[usize],
    ) -> Result<Outcome, Refused> {
        let entries = open.iter().filter_map(|&i| {
            DeleteMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(&pending[i].as_ref()?.receipt)
                .build()
                .ok()
        });
        let out = client
            .delete_message_batch()
            .queue_url(url)
            .set_entries(Some(entries.collect()))
            .send()
            .await
            .map_err(|e| Refused::Other(format!("{e:?}")))?;
        Ok(outcome(
            out.successful.iter().map(|s| s.id.as_str()),
            &out.failed,
        ))
    }
}

/// Takes what is queued now (the first entry waits), at most `limit` jobs.
async fn drain<J>(rx: &mut mpsc::UnboundedReceiver<J>, limit: usize) -> Option<Vec<J>> {
    let first = rx.recv().await?;
    let mut jobs = vec![first];
    while jobs.len() < limit {
        match rx.try_recv() {
            Ok(j) => jobs.push(j),
            Err(_) => break,
        }
    }
    Some(jobs)
}

/// One queue's jobs together, queues in no particular order (each its own requests).
fn by_url<K: Kind>(jobs: Vec<K>) -> HashMap<String, Vec<K>> {
    let mut groups: HashMap<String, Vec<K>> = HashMap::new();
    for j in jobs {
        groups.entry(j.url().to_string()).or_default().push(j);
    }
    groups
}

/// Rounds of requests of one kind until the `Batcher` is dropped. `max_bytes`: see
/// [`Batcher::start`] (sends only).
async fn batch_loop<K: Kind>(client: Client, max_bytes: usize, mut rx: mpsc::UnboundedReceiver<K>) {
    let slots = Arc::new(Semaphore::new(REQUESTS_IN_FLIGHT));
    loop {
        // A free slot first: while all are busy, new entries gather in the channel.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(jobs) = drain(&mut rx, MAX_ENTRIES * REQUESTS_IN_FLIGHT).await else {
            return;
        };
        let client = client.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let requests = by_url(jobs).into_iter().flat_map(|(url, jobs)| {
                K::runs(jobs, max_bytes)
                    .into_iter()
                    .map(move |run| (url.clone(), run))
            });
            let requests = requests.map(|(url, run)| self::run(&client, url, run));
            futures::future::join_all(requests).await;
        });
    }
}

/// What one batch answer says of the entries it was sent (ids are their indexes).
struct Outcome {
    succeeded: Vec<usize>,
    failed: Vec<(usize, EntryVerdict, String)>,
}

fn outcome<'a>(
    successful: impl Iterator<Item = &'a str>,
    failed: &[BatchResultErrorEntry],
) -> Outcome {
    Outcome {
        succeeded: successful.filter_map(|id| id.parse().ok()).collect(),
        failed: failed
            .iter()
            .filter_map(|f| {
                let i = f.id.parse().ok()?;
                let why = format!(
                    "{} ({})",
                    f.code,
                    f.message.as_deref().unwrap_or("no message")
                );
                Some((i, sqs_batch::entry_verdict(f.sender_fault, &f.code), why))
            })
            .collect(),
    }
}

/// Sends one run (at most 10 entries, one queue), retrying the entries worth it; answers
/// every job.
async fn run<K: Kind>(client: &Client, url: String, jobs: Vec<K>) {
    let mut pending: Vec<Option<K>> = jobs.into_iter().map(Some).collect();
    let mut last = String::new();
    for attempt in 0..ENTRY_ATTEMPTS {
        let open: Vec<usize> = (0..pending.len())
            .filter(|&i| pending[i].is_some())
            .collect();
        if open.is_empty() {
            return;
        }
        if attempt > 0 {
            tokio::time::sleep(sqs_batch::retry_pause(attempt)).await;
        }
        let o = match K::request(client, &url, &pending, &open).await {
            Ok(o) => o,
            Err(Refused::NoSuchQueue) => {
                for j in pending.iter_mut().filter_map(Option::take) {
                    let queue = j.target().to_string();
                    j.reply(Err(TransportError::NoSuchQueue(queue)));
                }
                return;
            }
            Err(Refused::Other(why)) => {
                last = why;
                continue;
            }
        };
        for i in o.succeeded {
            if let Some(j) = pending.get_mut(i).and_then(Option::take) {
                j.reply(Ok(()));
            }
        }
        for (i, verdict, why) in o.failed {
            let Some(slot) = pending.get_mut(i) else {
                continue;
            };
            let target = slot
                .as_ref()
                .map(|j| j.target().to_string())
                .unwrap_or_default();
            tracing::warn!(op = K::OP, target = %target, entry = i, attempt, reason = %why, ?verdict, "SQS refused an entry of a batch");
            if verdict == EntryVerdict::Permanent
                && let Some(j) = slot.take()
            {
                j.reply(Err(TransportError::Rejected(format!(
                    "{} on {target}: {why}",
                    K::OP
                ))));
            }
            last = why;
        }
    }
    for j in pending.into_iter().flatten() {
        let target = j.target().to_string();
        j.reply(Err(TransportError::Unavailable(format!(
            "{} on {target} not confirmed after {ENTRY_ATTEMPTS} attempts: {last}",
            K::OP
        ))));
    }
}
