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
        tokio::spawn(send_loop(client.clone(), max_bytes, send_rx));
        tokio::spawn(delete_loop(client, delete_rx));
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

fn by_url<J>(jobs: Vec<J>, url: impl Fn(&J) -> &str) -> HashMap<String, Vec<J>> {
    let mut groups: HashMap<String, Vec<J>> = HashMap::new();
    for j in jobs {
        groups.entry(url(&j).to_string()).or_default().push(j);
    }
    groups
}

async fn send_loop(client: Client, max_bytes: usize, mut rx: mpsc::UnboundedReceiver<SendJob>) {
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
            let runs = by_url(jobs, |j| &j.url)
                .into_iter()
                .flat_map(|(url, jobs)| {
                    let sizes: Vec<usize> = jobs.iter().map(|j| j.body.len()).collect();
                    let mut jobs = jobs.into_iter();
                    sqs_batch::split(&sizes, MAX_ENTRIES, max_bytes)
                        .into_iter()
                        .map(|r| (url.clone(), jobs.by_ref().take(r.len()).collect::<Vec<_>>()))
                        .collect::<Vec<_>>()
                });
            let requests = runs.map(|(url, run)| send_run(&client, url, run));
            futures::future::join_all(requests).await;
        });
    }
}

async fn delete_loop(client: Client, mut rx: mpsc::UnboundedReceiver<DeleteJob>) {
    let slots = Arc::new(Semaphore::new(REQUESTS_IN_FLIGHT));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(jobs) = drain(&mut rx, MAX_ENTRIES * REQUESTS_IN_FLIGHT).await else {
            return;
        };
        let client = client.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let runs = by_url(jobs, |j| &j.url)
                .into_iter()
                .flat_map(|(url, jobs)| {
                    let mut jobs = jobs.into_iter().peekable();
                    let mut runs = Vec::new();
                    while jobs.peek().is_some() {
                        runs.push((
                            url.clone(),
                            jobs.by_ref().take(MAX_ENTRIES).collect::<Vec<_>>(),
                        ));
                    }
                    runs
                });
            let requests = runs.map(|(url, run)| delete_run(&client, url, run));
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
async fn send_run(client: &Client, url: String, jobs: Vec<SendJob>) {
    let mut pending: Vec<Option<SendJob>> = jobs.into_iter().map(Some).collect();
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
        let entries = open.iter().filter_map(|&i| {
            let j = pending[i].as_ref()?;
            SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(&j.body)
                .set_delay_seconds(j.delay_seconds)
                .build()
                .ok()
        });
        let answer = client
            .send_message_batch()
            .queue_url(&url)
            .set_entries(Some(entries.collect()))
            .send()
            .await;
        let out = match answer {
            Ok(out) => out,
            Err(e) => {
                if sqs_batch::is_no_such_queue(e.as_service_error().and_then(|s| s.code())) {
                    for j in pending.iter_mut().filter_map(Option::take) {
                        let _ = j.reply.send(Err(TransportError::NoSuchQueue(j.queue)));
                    }
                    return;
                }
                last = format!("{e:?}");
                continue;
            }
        };
        let o = outcome(out.successful.iter().map(|s| s.id.as_str()), &out.failed);
        for i in o.succeeded {
            if let Some(j) = pending.get_mut(i).and_then(Option::take) {
                let _ = j.reply.send(Ok(()));
            }
        }
        for (i, verdict, why) in o.failed {
            let Some(slot) = pending.get_mut(i) else {
                continue;
            };
            let queue = slot.as_ref().map(|j| j.queue.clone()).unwrap_or_default();
            tracing::warn!(queue = %queue, entry = i, attempt, reason = %why, ?verdict, "SQS refused a message of a batch");
            if verdict == EntryVerdict::Permanent
                && let Some(j) = slot.take()
            {
                let _ = j.reply.send(Err(TransportError::Rejected(format!(
                    "SendMessageBatch to {queue}: {why}"
                ))));
            }
            last = why;
        }
    }
    for j in pending.into_iter().flatten() {
        let _ = j.reply.send(Err(TransportError::Unavailable(format!(
            "SendMessageBatch to {} not confirmed after {ENTRY_ATTEMPTS} attempts: {last}",
            j.queue
        ))));
    }
}

/// Deletes one run (at most 10 receipts, one queue), retrying the entries worth it; answers
/// every job.
async fn delete_run(client: &Client, url: String, jobs: Vec<DeleteJob>) {
    let mut pending: Vec<Option<DeleteJob>> = jobs.into_iter().map(Some).collect();
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
        let entries = open.iter().filter_map(|&i| {
            DeleteMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(&pending[i].as_ref()?.receipt)
                .build()
                .ok()
        });
        let answer = client
            .delete_message_batch()
            .queue_url(&url)
            .set_entries(Some(entries.collect()))
            .send()
            .await;
        let out = match answer {
            Ok(out) => out,
            Err(e) => {
                last = format!("{e:?}");
                continue;
            }
        };
        let o = outcome(out.successful.iter().map(|s| s.id.as_str()), &out.failed);
        for i in o.succeeded {
            if let Some(j) = pending.get_mut(i).and_then(Option::take) {
                let _ = j.reply.send(Ok(()));
            }
        }
        for (i, verdict, why) in o.failed {
            let Some(slot) = pending.get_mut(i) else {
                continue;
            };
            tracing::warn!(queue_url = %url, entry = i, attempt, reason = %why, ?verdict, "SQS did not delete a message of a batch");
            if verdict == EntryVerdict::Permanent
                && let Some(j) = slot.take()
            {
                let _ = j.reply.send(Err(TransportError::Rejected(format!(
                    "DeleteMessageBatch on {url}: {why}"
                ))));
            }
            last = why;
        }
    }
    for j in pending.into_iter().flatten() {
        let _ = j.reply.send(Err(TransportError::Unavailable(format!(
            "DeleteMessageBatch on {url} not confirmed after {ENTRY_ATTEMPTS} attempts: {last}"
        ))));
    }
}
