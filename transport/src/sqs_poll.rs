//! Long polls of the actor's SQS queue, each in a task of its own. The server cannot be told
//! to stop a poll: had the request been dropped with the `receive` that made it (at
//! shutdown), what the poll still took would stay invisible, for no pod, until the visibility
//! timeout. Instead, what nobody is left to take is given back at once (SQS counts the
//! receive all the same), and `stop_consuming` waits for that (`Polls::idle`).
//!
//! What a poll brings is held (kept invisible by the extender) from the moment it arrives,
//! also while it waits for the processor to read it: with several pollers, a batch may wait
//! behind another. At shutdown nothing is given back while another poll is still open on the
//! server: it would take the message at once, and each such receive counts towards
//! `ASYA_MAX_REDELIVERIES`.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::operation::receive_message::ReceiveMessageOutput;
use aws_sdk_sqs::types::{ChangeMessageVisibilityBatchRequestEntry, MessageSystemAttributeName};
use tokio::sync::{oneshot, watch};

use crate::TransportError;
use crate::sqs_batch::MAX_ENTRIES;

/// Receipt handles whose messages are kept invisible (see `SqsTransport::spawn_extender`).
pub(crate) type Held = Arc<Mutex<HashSet<String>>>;

/// One poll's answer, to await; dropped unread, what it brought is given back.
pub(crate) type Poll =
    Pin<Box<dyn Future<Output = Result<ReceiveMessageOutput, TransportError>> + Send>>;

/// Counters shared by the polls of one transport.
#[derive(Clone)]
pub(crate) struct Counters {
    /// Polls and give-backs under way (`stop_consuming` waits for none).
    pub running: Arc<watch::Sender<usize>>,
    /// Receive requests still open on the server.
    pub open: Arc<watch::Sender<usize>>,
}

impl Counters {
    pub fn new() -> Self {
        Counters {
            running: Arc::new(watch::Sender::new(0)),
            open: Arc::new(watch::Sender::new(0)),
        }
    }
}

/// Starts one long poll of `url` (up to 10 messages, `wait_seconds` at most).
pub(crate) fn start(
    client: &Client,
    url: String,
    wait_seconds: i32,
    counters: &Counters,
    held: &Held,
) -> Poll {
    let running = PollRunning::start(&counters.running);
    let request = client
        .receive_message()
        .queue_url(&url)
        .max_number_of_messages(MAX_ENTRIES as i32)
        .wait_time_seconds(wait_seconds)
        .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount);
    let giver = GiveBack {
        client: client.clone(),
        url,
        counters: counters.clone(),
        held: held.clone(),
        wait_seconds,
    };
    let (tx, rx) = oneshot::channel();
    let unclaimed = giver.clone();
    let held = held.clone();
    let open = PollRunning::start(&counters.open);
    tokio::spawn(async move {
        let _running = running;
        let out = request
            .send()
            .await
            .map_err(|e| TransportError::Unavailable(format!("{e:?}")));
        drop(open);
        if let (Ok(out), Ok(mut h)) = (&out, held.lock()) {
            h.extend(receipts(out));
        }
        if let Err(Ok(out)) = tx.send(out) {
            unclaimed.give_back(out).await;
        }
    });
    let mut answer = Answer { rx, giver };
    Box::pin(async move {
        (&mut answer.rx)
            .await
            .unwrap_or_else(|_| Err(TransportError::Unavailable("long poll task ended".into())))
    })
}

fn receipts(out: &ReceiveMessageOutput) -> impl Iterator<Item = String> + '_ {
    out.messages()
        .iter()
        .filter_map(|m| m.receipt_handle.clone())
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
    counters: Counters,
    held: Held,
    wait_seconds: i32,
}

impl GiveBack {
    async fn give_back(&self, out: ReceiveMessageOutput) {
        let receipts: Vec<String> = receipts(&out).collect();
        if receipts.is_empty() {
            return;
        }
        // Another poll still open would take them again at once (one more receive counted).
        let limit = Duration::from_secs(self.wait_seconds.max(0) as u64 + 5);
        let mut open = self.counters.open.subscribe();
        let _ = tokio::time::timeout(limit, open.wait_for(|n| *n == 0)).await;
        if let Ok(mut h) = self.held.lock() {
            for r in &receipts {
                h.remove(r);
            }
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

/// The answer to one poll. Dropped before it arrived (the `receive` was), the poll's task
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
            let running = PollRunning::start(&self.giver.counters.running);
            let giver = self.giver.clone();
            rt.spawn(async move {
                let _running = running;
                giver.give_back(out).await;
            });
        }
    }
}
