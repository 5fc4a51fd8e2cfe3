//! Acknowledgements on one consume channel, following [`crate::ack_runs`]: deliveries whose
//! successors are confirmed are acknowledged in runs (`multiple`), one frame for all the
//! envelopes that finished while the previous frame was being written; a delivery given back
//! on its own blocks any run over it until its frame is written.

use std::future::Future;
use std::sync::Mutex;

use lapin::Channel;
use lapin::options::BasicAckOptions;

use crate::TransportError;
use crate::ack_runs::{AckLedger, AckPlan};

#[derive(Default)]
struct State {
    ledger: AckLedger,
    /// One caller writes the frames at a time; the others leave their tags to it.
    flushing: bool,
}

#[derive(Default)]
pub(crate) struct Acks {
    state: Mutex<State>,
}

/// Clears `flushing` if the flushing caller is dropped mid-way, so acks never stall.
struct FlushGuard<'a>(&'a Acks);

impl Drop for FlushGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut s) = self.0.state.lock() {
            s.flushing = false;
        }
    }
}

impl Acks {
    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        // A poisoned lock only means a panic elsewhere mid-update; the ledger stays usable.
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    /// A delivery handed out by the consumer.
    pub(crate) fn received(&self, tag: u64) {
        self.with(|s| s.ledger.received(tag));
    }

    /// Acknowledges `tag` (its successors are confirmed): in the run this caller writes, or
    /// in the one the caller already writing sends next. Returns the error of a frame this
    /// caller failed to write (its channel is gone: the broker redelivers).
    pub(crate) async fn ack(&self, channel: &Channel, tag: u64) -> Result<(), TransportError> {
        let flusher = self.with(|s| {
            if !s.ledger.finished(tag) {
                return Err(TransportError::Rejected(format!(
                    "delivery tag {tag} is not open on this channel (acknowledged or given back already)"
                )));
            }
            Ok(!std::mem::replace(&mut s.flushing, true))
        })?;
        if !flusher {
            return Ok(());
        }
        let _guard = FlushGuard(self);
        // The tasks woken with this one (confirms arrive together) finish first and join
        // the run: one frame instead of one each.
        tokio::task::yield_now().await;
        let mut result = Ok(());
        loop {
            let plan = self.with(|s| s.ledger.plan());
            if plan.is_empty() {
                break;
            }
            if let Err(e) = write(channel, &plan).await {
                tracing::warn!(error = %e, ?plan, "acknowledgement failed; the broker redelivers these messages");
                result = Err(e);
            }
        }
        result
    }

    /// Runs `give_back` (a nack, or a requeued copy and an ack of the original) for `tag`
    /// on its own: no run covers `tag` until its frame is written.
    pub(crate) async fn alone<F>(&self, tag: u64, give_back: F) -> Result<(), TransportError>
    where
        F: Future<Output = Result<(), TransportError>>,
    {
        if !self.with(|s| s.ledger.settling(tag)) {
            return Err(TransportError::Rejected(format!(
                "delivery tag {tag} is not open on this channel (acknowledged or given back already)"
            )));
        }
        let r = give_back.await;
        self.with(|s| s.ledger.settled(tag));
        r
    }
}

/// Writes a plan's frames, all queued before any is awaited (one write for all).
async fn write(channel: &Channel, plan: &AckPlan) -> Result<(), TransportError> {
    let run = plan
        .run
        .map(|(tag, n)| channel.basic_ack(tag, BasicAckOptions { multiple: n > 1 }));
    let singles = plan
        .singles
        .iter()
        .map(|&tag| channel.basic_ack(tag, BasicAckOptions { multiple: false }));
    let all: Vec<_> = run.into_iter().chain(singles).collect();
    futures::future::try_join_all(all)
        .await
        .map(|_| ())
        .map_err(|e| TransportError::Unavailable(e.to_string()))
}
