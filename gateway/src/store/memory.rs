//! Envelope status in memory: only when no database URL is given (said loudly at start), and
//! in tests. Lost on restart.

use std::collections::{BTreeMap, HashMap};

use asya_transport::fanin::{BranchReport, JoinAnswer};
use serde_json::Value;
use std::sync::{Mutex, MutexGuard};

use super::Backend;
use super::model::{
    Done, Event, Final, JoinRefused, JoinReply, JoinView, Progress, Record, StoreError,
    after_branch, after_final, after_progress,
};

#[derive(Default)]
pub struct Memory {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    records: HashMap<String, Record>,
    events: HashMap<String, Vec<Event>>,
    /// Fan-ins by (namespace, join id).
    joins: HashMap<(String, String), Join>,
}

struct Join {
    total: u32,
    /// Index → (result, error).
    branches: BTreeMap<u32, (Option<Value>, Option<Value>)>,
    done: Option<Done>,
    created_ms: i64,
    finished_ms: Option<i64>,
}

impl Memory {
    fn state(&self) -> Result<MutexGuard<'_, State>, StoreError> {
        self.state
            .lock()
            .map_err(|_| StoreError::Unavailable("memory store lock poisoned".into()))
    }
}

impl Backend for Memory {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn create(&self, r: &Record) -> Result<Record, StoreError> {
        let mut st = self.state()?;
        Ok(st
            .records
            .entry(r.id.clone())
            .or_insert_with(|| r.clone())
            .clone())
    }

    async fn get(&self, id: &str) -> Result<Option<Record>, StoreError> {
        Ok(self.state()?.records.get(id).cloned())
    }

    async fn children(&self, id: &str) -> Result<Vec<String>, StoreError> {
        let st = self.state()?;
        let mut ids: Vec<String> = st
            .records
            .values()
            .filter(|r| r.parent_id.as_deref() == Some(id))
            .map(|r| r.id.clone())
            .collect();
        ids.sort();
        Ok(ids)
    }

    async fn events(&self, id: &str) -> Result<Vec<Event>, StoreError> {
        Ok(self.state()?.events.get(id).cloned().unwrap_or_default())
    }

    async fn progress(
        &self,
        id: &str,
        p: &Progress,
        event: &Event,
    ) -> Result<Option<Record>, StoreError> {
        let mut st = self.state()?;
        let Some(r) = st.records.get(id).cloned() else {
            return Ok(None);
        };
        let r = after_progress(r, p);
        st.records.insert(id.to_string(), r.clone());
        st.events
            .entry(id.to_string())
            .or_default()
            .push(event.clone());
        Ok(Some(r))
    }

    async fn finish(
        &self,
        id: &str,
        f: &Final,
        event: &Event,
    ) -> Result<Option<(Record, bool)>, StoreError> {
        let mut st = self.state()?;
        let Some(r) = st.records.get(id).cloned() else {
            return Ok(None);
        };
        let Some(r) = after_final(r.clone(), f) else {
            // Already final: the first final status stays.
            return Ok(Some((r, false)));
        };
        st.records.insert(id.to_string(), r.clone());
        st.events
            .entry(id.to_string())
            .or_default()
            .push(event.clone());
        Ok(Some((r, true)))
    }

    /// A final record is never changed again, so its `updated_ms` is when it finished.
    async fn expire(
        &self,
        finished_before_ms: Option<i64>,
        unfinished_before_ms: Option<i64>,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let mut st = self.state()?;
        let oldest = |pick: &dyn Fn(&Record) -> Option<i64>| -> Vec<String> {
            let mut due: Vec<(i64, String)> = st
                .records
                .values()
                .filter_map(|r| pick(r).map(|at| (at, r.id.clone())))
                .collect();
            due.sort();
            due.into_iter()
                .take(limit as usize)
                .map(|(_, id)| id)
                .collect()
        };
        let finished = oldest(&|r: &Record| {
            let before = finished_before_ms?;
            (r.status.is_final() && r.updated_ms < before).then_some(r.updated_ms)
        });
        let unfinished = oldest(&|r: &Record| {
            let before = unfinished_before_ms?;
            (!r.status.is_final() && r.created_ms < before).then_some(r.created_ms)
        });
        let mut n = 0;
        for id in finished.iter().chain(&unfinished) {
            if st.records.remove(id).is_some() {
                n += 1;
            }
            st.events.remove(id);
        }
        Ok(n)
    }

    async fn oldest_ms(&self) -> Result<Option<i64>, StoreError> {
        Ok(self.state()?.records.values().map(|r| r.created_ms).min())
    }

    async fn branch(
        &self,
        namespace: &str,
        join: &str,
        index: u32,
        report: &BranchReport,
    ) -> Result<Result<JoinAnswer, JoinRefused>, StoreError> {
        let mut st = self.state()?;
        let j = st
            .joins
            .entry((namespace.to_string(), join.to_string()))
            .or_insert_with(|| Join {
                total: report.total,
                branches: BTreeMap::new(),
                done: None,
                created_ms: super::now_ms(),
                finished_ms: None,
            });
        let view = JoinView {
            total: j.total,
            stored: j.branches.keys().copied().collect(),
            done: j.done,
        };
        let step = match after_branch(join, &view, index, report.total, report.error.is_some()) {
            Ok(s) => s,
            Err(r) => return Ok(Err(r)),
        };
        if step.insert {
            j.branches
                .insert(index, (report.result.clone(), report.error.clone()));
        }
        if step.fire.is_some() {
            j.done = step.fire;
            j.finished_ms = Some(super::now_ms());
        }
        Ok(Ok(match step.reply {
            JoinReply::Waiting { stored, total } => JoinAnswer::Waiting { stored, total },
            JoinReply::Joined => JoinAnswer::Joined,
            JoinReply::Complete => JoinAnswer::Complete {
                results: j
                    .branches
                    .values()
                    .map(|(r, _)| r.clone().unwrap_or(Value::Null))
                    .collect(),
            },
            JoinReply::Failed { index } => JoinAnswer::Failed {
                index,
                error: j
                    .branches
                    .get(&index)
                    .and_then(|(_, e)| e.clone())
                    .unwrap_or(Value::Null),
            },
        }))
    }

    async fn expire_joins(
        &self,
        finished_before_ms: Option<i64>,
        unfinished_before_ms: Option<i64>,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let mut st = self.state()?;
        let oldest = |pick: &dyn Fn(&Join) -> Option<i64>| -> Vec<(String, String)> {
            let mut due: Vec<(i64, (String, String))> = st
                .joins
                .iter()
                .filter_map(|(k, j)| pick(j).map(|at| (at, k.clone())))
                .collect();
            due.sort();
            due.into_iter()
                .take(limit as usize)
                .map(|(_, k)| k)
                .collect()
        };
        let done = oldest(&|j: &Join| {
            let (before, at) = (finished_before_ms?, j.finished_ms?);
            (at < before).then_some(at)
        });
        let open = oldest(&|j: &Join| {
            let before = unfinished_before_ms?;
            (j.finished_ms.is_none() && j.created_ms < before).then_some(j.created_ms)
        });
        let mut n = 0;
        for k in done.iter().chain(&open) {
            if st.joins.remove(k).is_some() {
                n += 1;
            }
        }
        Ok(n)
    }
}
