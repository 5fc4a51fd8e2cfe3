//! Where a namespace's failed envelopes are, behind one interface for `asya sump`: x-sump
//! itself (a queue browsed by holding its messages and giving them back), or the store of
//! the crew's error-end actor when that actor consumes x-sump (seed 001: envelopes in S3).
//! `crate::sump` lists and redrives over either.

use std::future::Future;

use crate::broker::s3::{CrewStore, Stored};
use crate::broker::{Broker, Held};
use crate::error::Result;

/// One place of failed envelopes. An item is held from `read` until it is `remove`d (after
/// its resend was confirmed), `release`d (left where it was) or `abandon`ed.
pub trait FailedSource {
    type Item;

    /// For the output's `source` line.
    fn describe(&self) -> String;
    /// How a listing leaves the source, appended to `describe`.
    fn listing_note(&self) -> &'static str;
    /// What a copy left behind is in, for messages ("x-sump", "the store").
    fn place(&self) -> &'static str;
    /// Holds up to `max` items; `true` when more were left unread.
    fn read(&self, max: usize) -> impl Future<Output = Result<(Vec<Self::Item>, bool)>>;
    fn body(item: &Self::Item) -> &[u8];
    /// When the item arrived where it is (broker or store time), ms since the epoch.
    fn time_ms(item: &Self::Item) -> Option<u64>;
    /// Removes a held item for good (the queue's ack, the store's move to `redriven/`).
    fn remove(&self, item: &Self::Item) -> impl Future<Output = Result<()>>;
    /// Leaves the held items where they were.
    fn release(&self, items: Vec<Self::Item>) -> impl Future<Output = Result<()>>;
    /// Stops holding without a word to the source, as a killed process would (tests of
    /// an interrupted redrive): a queue gets its messages back when the connection goes.
    fn abandon(&self, items: Vec<Self::Item>);
    /// What the source cannot show, said once per listing.
    fn note(&self) -> impl Future<Output = Result<Option<String>>>;
}

/// The namespace's x-sump queue.
pub struct SumpQueue<'a> {
    pub broker: &'a Broker,
    pub queue: &'a str,
}

impl FailedSource for SumpQueue<'_> {
    type Item = Held;

    fn describe(&self) -> String {
        self.broker.describe(self.queue)
    }
    fn listing_note(&self) -> &'static str {
        " (browsed: every message left in place)"
    }
    fn place(&self) -> &'static str {
        "x-sump"
    }
    async fn read(&self, max: usize) -> Result<(Vec<Held>, bool)> {
        self.broker.browse(self.queue, max).await
    }
    fn body(item: &Held) -> &[u8] {
        &item.body
    }
    fn time_ms(item: &Held) -> Option<u64> {
        item.broker_time_ms
    }
    async fn remove(&self, item: &Held) -> Result<()> {
        self.broker.remove(item).await
    }
    async fn release(&self, items: Vec<Held>) -> Result<()> {
        self.broker.give_back(items).await
    }
    fn abandon(&self, items: Vec<Held>) {
        // Dropping would not requeue either; forgetting keeps the delivery tags unacked
        // until the connection closes, exactly what a kill leaves.
        std::mem::forget(items);
    }
    async fn note(&self) -> Result<Option<String>> {
        let counts = self.broker.counts(self.queue).await?;
        Ok(consumer_note(counts.consumers))
    }
}

/// Said when x-sump has consumers: the crew's error-end actor takes envelopes to its store.
pub fn consumer_note(consumers: Option<u64>) -> Option<String> {
    match consumers {
        Some(n) if n > 0 => Some(format!(
            "x-sump has {n} consumer(s) (the crew's error-end actor?): envelopes it already took are in its store, not here"
        )),
        _ => None,
    }
}

impl FailedSource for CrewStore {
    type Item = Stored;

    fn describe(&self) -> String {
        CrewStore::describe(self)
    }
    fn listing_note(&self) -> &'static str {
        " (read only)"
    }
    fn place(&self) -> &'static str {
        "the store"
    }
    async fn read(&self, max: usize) -> Result<(Vec<Stored>, bool)> {
        self.list(max).await
    }
    fn body(item: &Stored) -> &[u8] {
        &item.body
    }
    fn time_ms(item: &Stored) -> Option<u64> {
        item.modified_ms
    }
    async fn remove(&self, item: &Stored) -> Result<()> {
        self.mark_redriven(&item.key).await
    }
    async fn release(&self, _items: Vec<Stored>) -> Result<()> {
        // Reading an object holds nothing.
        Ok(())
    }
    fn abandon(&self, _items: Vec<Stored>) {}
    async fn note(&self) -> Result<Option<String>> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_consumed_x_sump_gets_the_note() {
        assert_eq!(consumer_note(None), None);
        assert_eq!(consumer_note(Some(0)), None);
        assert!(consumer_note(Some(2)).unwrap().contains("2 consumer(s)"));
    }
}
