//! Envelope status: PostgreSQL (migrations embedded, applied at start) or, only when no
//! database URL is given, memory. Every change is also published on a broadcast channel so
//! streams (SSE, MCP progress) follow it without polling.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::broadcast;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pending,
    Running,
    Succeeded,
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Running => "running",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
        }
    }
    pub fn parse(s: &str) -> Option<Status> {
        match s {
            "pending" => Some(Status::Pending),
            "running" => Some(Status::Running),
            "succeeded" => Some(Status::Succeeded),
            "failed" => Some(Status::Failed),
            _ => None,
        }
    }
    pub fn is_final(self) -> bool {
        matches!(self, Status::Succeeded | Status::Failed)
    }
}

/// One envelope as the gateway knows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Record {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    pub status: Status,
    /// 0..=100; 100 only at the final status.
    pub progress: f64,
    /// The actor it is at (last reported).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    pub route: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
    pub created_ms: i64,
    pub updated_ms: i64,
}

/// A progress report from a sidecar.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub actor: String,
    /// received | processing | completed
    pub phase: String,
    /// The actor's index in the route.
    pub current: usize,
    /// Actors in the route.
    pub total: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// For a fan-out child whose own report about it has not arrived yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
}

impl Progress {
    /// The envelope's progress in percent after this report: the hop's share of the route,
    /// below 100 until the final status.
    pub fn percent(&self) -> f64 {
        let total = self.total.max(1) as f64;
        let within = match self.phase.as_str() {
            "received" => 0.1,
            "processing" => 0.5,
            _ => 1.0,
        };
        (((self.current as f64 + within) / total) * 100.0).clamp(0.0, 99.0)
    }
}

/// One stored progress event (history).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    pub actor: Option<String>,
    pub phase: String,
    pub progress: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub at_ms: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached or failed: callers answer 503, never accept-and-lose.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    #[error("storage rejected the operation: {0}")]
    Rejected(String),
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The record after `p`: running, at `p.actor`, progress never going back.
fn apply_progress(mut r: Record, p: &Progress) -> Record {
    if r.status.is_final() {
        return r;
    }
    r.status = Status::Running;
    r.actor = Some(p.actor.clone());
    r.progress = r.progress.max(p.percent());
    r.updated_ms = now_ms();
    r
}

/// A change, for streams.
#[derive(Debug, Clone)]
pub struct Update {
    pub record: Record,
    pub event: Option<Event>,
}

pub enum Backend {
    Memory(Memory),
    Postgres(crate::pg::Postgres),
}

pub struct Store {
    backend: Backend,
    updates: broadcast::Sender<Update>,
}

#[derive(Default)]
pub struct Memory {
    records: Mutex<HashMap<String, Record>>,
    events: Mutex<HashMap<String, Vec<Event>>>,
}

fn poisoned<T>(_: T) -> StoreError {
    StoreError::Unavailable("memory store lock poisoned".into())
}

impl Store {
    pub fn memory() -> Store {
        Store::new(Backend::Memory(Memory::default()))
    }

    pub fn new(backend: Backend) -> Store {
        let (updates, _) = broadcast::channel(4096);
        Store { backend, updates }
    }

    pub fn kind(&self) -> &'static str {
        match self.backend {
            Backend::Memory(_) => "memory",
            Backend::Postgres(_) => "postgres",
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Update> {
        self.updates.subscribe()
    }

    fn publish(&self, record: &Record, event: Option<Event>) {
        let _ = self.updates.send(Update {
            record: record.clone(),
            event,
        });
    }

    /// Reachable right now (health, and a cheap check before accepting work).
    pub async fn ping(&self) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Memory(_) => Ok(()),
            Backend::Postgres(p) => p.ping().await,
        }
    }

    /// Stores a new envelope; an existing id is left as it is (sidecar retries).
    pub async fn create(&self, r: &Record) -> Result<Record, StoreError> {
        let stored = match &self.backend {
            Backend::Memory(m) => {
                let mut recs = m.records.lock().map_err(poisoned)?;
                recs.entry(r.id.clone())
                    .or_insert_with(|| r.clone())
                    .clone()
            }
            Backend::Postgres(p) => p.create(r).await?,
        };
        self.publish(&stored, None);
        Ok(stored)
    }

    pub async fn get(&self, id: &str) -> Result<Option<Record>, StoreError> {
        match &self.backend {
            Backend::Memory(m) => Ok(m.records.lock().map_err(poisoned)?.get(id).cloned()),
            Backend::Postgres(p) => p.get(id).await,
        }
    }

    pub async fn children(&self, id: &str) -> Result<Vec<String>, StoreError> {
        match &self.backend {
            Backend::Memory(m) => {
                let recs = m.records.lock().map_err(poisoned)?;
                let mut ids: Vec<String> = recs
                    .values()
                    .filter(|r| r.parent_id.as_deref() == Some(id))
                    .map(|r| r.id.clone())
                    .collect();
                ids.sort();
                Ok(ids)
            }
            Backend::Postgres(p) => p.children(id).await,
        }
    }

    pub async fn events(&self, id: &str) -> Result<Vec<Event>, StoreError> {
        match &self.backend {
            Backend::Memory(m) => Ok(m
                .events
                .lock()
                .map_err(poisoned)?
                .get(id)
                .cloned()
                .unwrap_or_default()),
            Backend::Postgres(p) => p.events(id).await,
        }
    }

    /// Records a progress report; `None` when the envelope is unknown.
    pub async fn progress(&self, id: &str, p: &Progress) -> Result<Option<Record>, StoreError> {
        let event = Event {
            actor: Some(p.actor.clone()),
            phase: p.phase.clone(),
            progress: p.percent(),
            message: p.message.clone(),
            at_ms: now_ms(),
        };
        let updated = match &self.backend {
            Backend::Memory(m) => {
                let mut recs = m.records.lock().map_err(poisoned)?;
                let Some(r) = recs.get(id).cloned() else {
                    return Ok(None);
                };
                let r = apply_progress(r, p);
                recs.insert(id.to_string(), r.clone());
                m.events
                    .lock()
                    .map_err(poisoned)?
                    .entry(id.to_string())
                    .or_default()
                    .push(event.clone());
                r
            }
            Backend::Postgres(pg) => match pg.progress(id, p, &event).await? {
                Some(r) => r,
                None => return Ok(None),
            },
        };
        self.publish(&updated, Some(event));
        Ok(Some(updated))
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
        let event = Event {
            actor: actor.map(str::to_string),
            phase: status.as_str().to_string(),
            progress: 100.0,
            message: None,
            at_ms: now_ms(),
        };
        let updated = match &self.backend {
            Backend::Memory(m) => {
                let mut recs = m.records.lock().map_err(poisoned)?;
                let Some(mut r) = recs.get(id).cloned() else {
                    return Ok(None);
                };
                if r.status.is_final() {
                    return Ok(Some(r));
                }
                r.status = status;
                r.progress = 100.0;
                if let Some(a) = actor {
                    r.actor = Some(a.to_string());
                }
                r.result = result;
                r.error = error;
                r.updated_ms = now_ms();
                recs.insert(id.to_string(), r.clone());
                m.events
                    .lock()
                    .map_err(poisoned)?
                    .entry(id.to_string())
                    .or_default()
                    .push(event.clone());
                r
            }
            Backend::Postgres(pg) => {
                match pg
                    .finish(id, status, actor, result.as_ref(), error.as_ref())
                    .await?
                {
                    Some((r, changed)) if changed => r,
                    Some((r, _)) => return Ok(Some(r)),
                    None => return Ok(None),
                }
            }
        };
        self.publish(&updated, Some(event));
        Ok(Some(updated))
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
        Record {
            id: id.into(),
            parent_id: None,
            tool: Some("t".into()),
            status: Status::Pending,
            progress: 0.0,
            actor: None,
            route: vec!["a".into(), "b".into()],
            result: None,
            error: None,
            created_ms: now_ms(),
            updated_ms: now_ms(),
        }
    }

    fn prog(actor: &str, phase: &str, current: usize) -> Progress {
        Progress {
            actor: actor.into(),
            phase: phase.into(),
            current,
            total: 2,
            message: None,
            parent_id: None,
        }
    }

    #[tokio::test]
    async fn progress_is_monotonic_and_final_wins_once() {
        let s = Store::memory();
        s.create(&rec("e")).await.unwrap();
        let r = s
            .progress("e", &prog("b", "completed", 1))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(r.progress, 99.0);
        let r = s
            .progress("e", &prog("a", "received", 0))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(r.progress, 99.0, "never goes back");
        assert_eq!(r.status, Status::Running);
        let r = s
            .finish(
                "e",
                Status::Succeeded,
                Some("x-sink"),
                Some(serde_json::json!(1)),
                None,
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!((r.status, r.progress), (Status::Succeeded, 100.0));
        let r = s
            .finish(
                "e",
                Status::Failed,
                None,
                None,
                Some(serde_json::json!("late")),
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(r.status, Status::Succeeded, "the first final status wins");
        assert_eq!(s.events("e").await.unwrap().len(), 3);
        assert!(
            s.progress("nope", &prog("a", "received", 0))
                .await
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn percent_per_hop() {
        assert_eq!(prog("a", "received", 0).percent(), 5.0);
        assert_eq!(prog("a", "completed", 0).percent(), 50.0);
        assert_eq!(prog("b", "processing", 1).percent(), 75.0);
    }
}
