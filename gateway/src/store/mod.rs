//! Envelope status: PostgreSQL ([`postgres`], migrations embedded, applied at start) or,
//! only when no database URL is given, [`memory`]. Both are a [`Backend`], held to the same
//! rules by one conformance suite. [`Store`] wraps the backend and publishes every change on
//! a broadcast channel so streams (SSE, MCP progress) follow it without polling.

use std::future::Future;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::broadcast;

pub mod memory;
mod model;
pub mod postgres;
pub mod retention;

#[cfg(test)]
pub(crate) mod conformance;

pub use model::{Event, Final, JoinRefused, Progress, Record, Status, StoreError, now_ms, percent};

use asya_transport::fanin::{BranchReport, JoinAnswer};

use memory::Memory;
use postgres::Postgres;

/// Where envelopes are kept. Every backend keeps the rules of `model.rs`: a create of an
/// existing id returns the stored record unchanged, progress never goes back, and the first
/// final status wins.
pub trait Backend: Send + Sync {
    fn kind(&self) -> &'static str;

    /// Reachable right now.
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Stores a new envelope; an existing id is left as it is and returned.
    fn create(&self, r: &Record) -> impl Future<Output = Result<Record, StoreError>> + Send;

    fn get(&self, id: &str) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;

    /// The ids of `id`'s fan-out children, sorted.
    fn children(&self, id: &str) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;

    /// `id`'s history, oldest first.
    fn events(&self, id: &str) -> impl Future<Output = Result<Vec<Event>, StoreError>> + Send;

    /// Applies a progress report and records `event`; `None` when `id` is unknown.
    fn progress(
        &self,
        id: &str,
        p: &Progress,
        event: &Event,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;

    /// Applies a final status and records `event` unless the envelope already had one.
    /// Returns the record and whether this call set it; `None` when `id` is unknown.
    fn finish(
        &self,
        id: &str,
        f: &Final,
        event: &Event,
    ) -> impl Future<Output = Result<Option<(Record, bool)>, StoreError>> + Send;

    /// Deletes envelopes, with their history: those whose final status came before
    /// `finished_before_ms`, and those never finished created before `unfinished_before_ms`
    /// (`None`: not that kind); oldest first, at most `limit` of each kind, so one call is
    /// a bounded batch. Returns how many went.
    fn expire(
        &self,
        finished_before_ms: Option<i64>,
        unfinished_before_ms: Option<i64>,
        limit: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// When the oldest stored envelope was created; `None` when there is none.
    fn oldest_ms(&self) -> impl Future<Output = Result<Option<i64>, StoreError>> + Send;

    /// Stores branch `index`'s report under the fan-in `join` of `namespace` by the rule
    /// `model::after_branch`, the insert and the join's firing in one transaction, and
    /// answers. The report has passed `model::check_branch`.
    fn branch(
        &self,
        namespace: &str,
        join: &str,
        index: u32,
        report: &BranchReport,
    ) -> impl Future<Output = Result<Result<JoinAnswer, JoinRefused>, StoreError>> + Send;

    /// Deletes fan-ins as [`Backend::expire`] deletes envelopes: those done before
    /// `finished_before_ms`, those never done started before `unfinished_before_ms`; at most
    /// `limit` of each kind. Returns how many went.
    fn expire_joins(
        &self,
        finished_before_ms: Option<i64>,
        unfinished_before_ms: Option<i64>,
        limit: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// The backends a gateway can run on.
enum Any {
    Memory(Memory),
    Postgres(Box<Postgres>),
}

/// Calls the same method on whichever backend it is.
macro_rules! on_backend {
    ($any:expr, $b:ident => $call:expr) => {
        match $any {
            Any::Memory($b) => $call,
            Any::Postgres($b) => $call,
        }
    };
}

/// A change, for streams.
#[derive(Debug, Clone)]
pub struct Update {
    pub record: Record,
    pub event: Option<Event>,
}

pub struct Store {
    backend: Any,
    updates: broadcast::Sender<Update>,
}

impl Store {
    pub fn memory() -> Store {
        Store::new(Any::Memory(Memory::default()))
    }

    pub fn postgres(pg: Postgres) -> Store {
        Store::new(Any::Postgres(Box::new(pg)))
    }

    fn new(backend: Any) -> Store {
        let (updates, _) = broadcast::channel(4096);
        Store { backend, updates }
    }

    pub fn kind(&self) -> &'static str {
        on_backend!(&self.backend, b => b.kind())
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Update> {
        self.updates.subscribe()
    }

    /// Subscriptions open now (each stream and each MCP call following an envelope).
    pub fn subscribers(&self) -> usize {
        self.updates.receiver_count()
    }

    fn publish(&self, record: &Record, event: Option<Event>) {
        let _ = self.updates.send(Update {
            record: record.clone(),
            event,
        });
    }

    /// Reachable right now (health, and a cheap check before accepting work).
    pub async fn ping(&self) -> Result<(), StoreError> {
        on_backend!(&self.backend, b => b.ping().await)
    }

    /// Stores a new envelope; an existing id is left as it is (sidecar retries).
    pub async fn create(&self, r: &Record) -> Result<Record, StoreError> {
        let stored = on_backend!(&self.backend, b => b.create(r).await)?;
        self.publish(&stored, None);
        Ok(stored)
    }

    pub async fn get(&self, id: &str) -> Result<Option<Record>, StoreError> {
        on_backend!(&self.backend, b => b.get(id).await)
    }

    pub async fn children(&self, id: &str) -> Result<Vec<String>, StoreError> {
        on_backend!(&self.backend, b => b.children(id).await)
    }

    pub async fn events(&self, id: &str) -> Result<Vec<Event>, StoreError> {
        on_backend!(&self.backend, b => b.events(id).await)
    }

    /// Records a progress report; `None` when the envelope is unknown.
    pub async fn progress(&self, id: &str, p: &Progress) -> Result<Option<Record>, StoreError> {
        let event = Event::of_progress(p);
        let updated = on_backend!(&self.backend, b => b.progress(id, p, &event).await)?;
        if let Some(r) = &updated {
            self.publish(r, Some(event));
        }
        Ok(updated)
    }

    /// Records the final status; the first final status wins. `None` when unknown.
    pub async fn finish(
        &self,
        id: &str,
        status: Status,
        actor: Option<&str>,
        result: Option<Value>,
        error: Option<Value>,
    ) -> Result<Option<Record>, StoreError> {
        let f = Final {
            status,
            actor: actor.map(str::to_string),
            result,
            error,
        };
        let event = Event::of_final(&f);
        match on_backend!(&self.backend, b => b.finish(id, &f, &event).await)? {
            Some((r, true)) => {
                self.publish(&r, Some(event));
                Ok(Some(r))
            }
            Some((r, false)) => Ok(Some(r)),
            None => Ok(None),
        }
    }
}

impl Store {
    /// One bounded batch of the retention policy ([`Backend::expire`]).
    pub async fn expire(
        &self,
        finished_before_ms: Option<i64>,
        unfinished_before_ms: Option<i64>,
        limit: u32,
    ) -> Result<u64, StoreError> {
        on_backend!(&self.backend, b => b.expire(finished_before_ms, unfinished_before_ms, limit).await)
    }

    pub async fn oldest_ms(&self) -> Result<Option<i64>, StoreError> {
        on_backend!(&self.backend, b => b.oldest_ms().await)
    }

    /// One bounded batch of the retention policy for fan-ins ([`Backend::expire_joins`]).
    pub async fn expire_joins(
        &self,
        finished_before_ms: Option<i64>,
        unfinished_before_ms: Option<i64>,
        limit: u32,
    ) -> Result<u64, StoreError> {
        on_backend!(&self.backend, b => b.expire_joins(finished_before_ms, unfinished_before_ms, limit).await)
    }

    /// A fan-in branch's report ([`Backend::branch`]), checked first.
    pub async fn branch(
        &self,
        namespace: &str,
        join: &str,
        index: u32,
        report: &BranchReport,
    ) -> Result<Result<JoinAnswer, JoinRefused>, StoreError> {
        let has_result = report.result.is_some();
        let has_error = report.error.is_some();
        if let Err(r) = model::check_branch(index, report.total, has_result, has_error) {
            return Ok(Err(r));
        }
        on_backend!(&self.backend, b => b.branch(namespace, join, index, report).await)
    }
}

/// Waits for `id` to reach a final status, calling `on_update` for each change; gives up
/// after `within` with the last known record.
pub async fn follow<F>(
    store: &Store,
    id: &str,
    within: Duration,
    mut on_update: F,
) -> Result<Option<Record>, StoreError>
where
    F: FnMut(&Update),
{
    let mut rx = store.subscribe();
    // Subscribe first, then read: no change can fall between the two.
    let mut last = store.get(id).await?;
    if last.as_ref().is_some_and(|r| r.status.is_final()) {
        return Ok(last);
    }
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Err(_) => return Ok(last),
            Ok(Ok(u)) if u.record.id == id => {
                on_update(&u);
                let done = u.record.status.is_final();
                last = Some(u.record);
                if done {
                    return Ok(last);
                }
            }
            Ok(Ok(_)) => {}
            Ok(Err(broadcast::error::RecvError::Lagged(_))) => {
                // Missed changes: read the current state instead.
                last = store.get(id).await?;
                if last.as_ref().is_some_and(|r| r.status.is_final()) {
                    return Ok(last);
                }
            }
            Ok(Err(broadcast::error::RecvError::Closed)) => return Ok(last),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str) -> Record {
        let now = now_ms();
        Record {
            id: id.into(),
            parent_id: None,
            tool: Some("t".into()),
            status: Status::Pending,
            progress: 0.0,
            actor: None,
            route: vec!["a".into()],
            result: None,
            error: None,
            created_ms: now,
            updated_ms: now,
            namespace: Some("team".into()),
        }
    }

    #[tokio::test]
    async fn changes_are_published_once_and_follow_ends_at_the_final_status() {
        let s = Store::memory();
        s.create(&rec("e")).await.unwrap();
        let mut rx = s.subscribe();
        let p = Progress {
            actor: "a".into(),
            phase: "received".into(),
            current: 0,
            total: 1,
            message: None,
            parent_id: None,
        };
        s.progress("e", &p).await.unwrap();
        s.finish("e", Status::Succeeded, None, None, None)
            .await
            .unwrap();
        s.finish("e", Status::Failed, None, None, None)
            .await
            .unwrap();
        assert!(s.progress("nope", &p).await.unwrap().is_none());
        let first = rx.recv().await.unwrap();
        assert_eq!(first.record.status, Status::Running);
        let second = rx.recv().await.unwrap();
        assert_eq!(second.record.status, Status::Succeeded);
        assert!(
            rx.try_recv().is_err(),
            "a final status that lost is not published"
        );
        let done = follow(&s, "e", Duration::from_millis(10), |_| {})
            .await
            .unwrap();
        assert_eq!(done.map(|r| r.status), Some(Status::Succeeded));
    }
}
