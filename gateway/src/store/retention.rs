//! The retention policy of stored envelopes: each is deleted, with its history, a configured
//! time after its final status (`--retention-finished`, default 7 days), or after it was
//! created when it never gets one (`--retention-unfinished`, default 30 days; a sidecar
//! that died, an envelope lost on its way). A periodic pass deletes in bounded batches
//! ([`super::Backend::expire`]), so a large backlog never holds the store for long, and
//! counts what it deleted and the age of the oldest envelope left.

use std::time::Duration;

use super::{Store, StoreError, now_ms};
use crate::metrics::Metrics;

/// What the pass deletes and how.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// After the final status; `None`: kept.
    pub finished: Option<Duration>,
    /// After creation, for envelopes without a final status; `None`: kept.
    pub unfinished: Option<Duration>,
    /// Between passes.
    pub every: Duration,
    /// Envelopes of each kind per statement.
    pub batch: u32,
}

/// Batches one pass makes at most; the next pass goes on where it stopped.
pub const MAX_BATCHES: u32 = 100;

/// A pause between two batches of one pass, so the store serves others in between.
const BETWEEN_BATCHES: Duration = Duration::from_millis(50);

impl Default for Policy {
    /// The defaults of `asya-gateway serve`.
    fn default() -> Policy {
        Policy {
            finished: Some(Duration::from_secs(7 * 24 * 3600)),
            unfinished: Some(Duration::from_secs(30 * 24 * 3600)),
            every: Duration::from_secs(300),
            batch: 1000,
        }
    }
}

impl Policy {
    /// Nothing is ever deleted.
    pub fn is_off(&self) -> bool {
        self.finished.is_none() && self.unfinished.is_none()
    }

    /// The cut-offs at `now_ms`: what finished before the first, or was created before the
    /// second without finishing, goes.
    pub fn cutoffs(&self, now_ms: i64) -> (Option<i64>, Option<i64>) {
        let before = |d: Option<Duration>| {
            d.map(|d| now_ms.saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)))
        };
        (before(self.finished), before(self.unfinished))
    }

    /// A duration flag's value: `0` turns that kind of deletion off.
    pub fn duration(d: Duration) -> Option<Duration> {
        (!d.is_zero()).then_some(d)
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    pub deleted: u64,
    /// Whether it stopped at [`MAX_BATCHES`] with more to delete.
    pub more: bool,
}

/// One pass: batches until one deletes fewer than a full batch, at most [`MAX_BATCHES`].
pub async fn pass(store: &Store, policy: &Policy) -> Result<Pass, StoreError> {
    let (finished, unfinished) = policy.cutoffs(now_ms());
    let mut deleted = 0;
    for i in 0..MAX_BATCHES {
        if i > 0 {
            tokio::time::sleep(BETWEEN_BATCHES).await;
        }
        // Fan-ins age as envelopes do; counted with them.
        let n = store.expire(finished, unfinished, policy.batch).await?
            + store
                .expire_joins(finished, unfinished, policy.batch)
                .await?;
        deleted += n;
        if n < u64::from(policy.batch) {
            return Ok(Pass {
                deleted,
                more: false,
            });
        }
    }
    Ok(Pass {
        deleted,
        more: true,
    })
}

/// Runs a pass every `policy.every`, the first right away; a failure is logged and the next
/// pass tries again.
pub fn spawn(
    app: std::sync::Arc<crate::app::App>,
    policy: Policy,
) -> Option<tokio::task::JoinHandle<()>> {
    if policy.is_off() {
        tracing::warn!("retention off: stored envelopes are never deleted");
        return None;
    }
    tracing::info!(
        finished = ?policy.finished,
        unfinished = ?policy.unfinished,
        every = ?policy.every,
        batch = policy.batch,
        "retention: stored envelopes are deleted after these times"
    );
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(policy.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            run_once(&app.store, &app.metrics, &policy).await;
        }
    }))
}

/// One pass with its metrics and log line.
pub async fn run_once(store: &Store, metrics: &Metrics, policy: &Policy) {
    let done = match pass(store, policy).await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "retention pass failed; retrying at the next");
            return;
        }
    };
    let age = match store.oldest_ms().await {
        Ok(Some(at)) => (now_ms() - at).max(0) as f64 / 1000.0,
        Ok(None) => 0.0,
        Err(e) => {
            tracing::warn!(error = %e, "could not read the oldest stored envelope");
            0.0
        }
    };
    metrics.retention(done.deleted, age);
    if done.deleted > 0 {
        tracing::info!(
            deleted = done.deleted,
            more = done.more,
            "retention: deleted stored envelopes past their time"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Record, Status};

    const DAY: u64 = 24 * 3600;

    #[test]
    fn cutoffs_follow_the_policy_and_zero_turns_a_kind_off() {
        let p = Policy::default();
        let now = 100 * DAY as i64 * 1000;
        assert_eq!(
            p.cutoffs(now),
            (
                Some(now - 7 * DAY as i64 * 1000),
                Some(now - 30 * DAY as i64 * 1000)
            )
        );
        let off = Policy {
            finished: Policy::duration(Duration::ZERO),
            unfinished: None,
            ..Policy::default()
        };
        assert!(off.is_off());
        assert_eq!(off.cutoffs(now), (None, None));
        assert_eq!(
            Policy::duration(Duration::from_secs(1)),
            Some(Duration::from_secs(1))
        );
    }

    fn rec(id: &str, status: Status, at_ms: i64) -> Record {
        Record {
            id: id.into(),
            parent_id: None,
            tool: None,
            status,
            progress: 0.0,
            actor: None,
            route: vec![],
            result: None,
            error: None,
            created_ms: at_ms,
            updated_ms: at_ms,
            namespace: None,
        }
    }

    /// A pass goes on batch after batch until the backlog is gone, and counts it all.
    #[tokio::test]
    async fn a_pass_deletes_a_backlog_in_bounded_batches() {
        let store = Store::memory();
        let long_ago = now_ms() - 40 * DAY as i64 * 1000;
        for i in 0..25 {
            store
                .create(&rec(&format!("old-{i}"), Status::Succeeded, long_ago))
                .await
                .unwrap();
        }
        store
            .create(&rec("new", Status::Succeeded, now_ms()))
            .await
            .unwrap();
        let policy = Policy {
            batch: 10,
            ..Policy::default()
        };
        let metrics = Metrics::new();
        run_once(&store, &metrics, &policy).await;
        assert_eq!(store.get("old-0").await.unwrap(), None);
        assert!(store.get("new").await.unwrap().is_some());
        let text = metrics.encode();
        assert!(
            text.contains("asya_gateway_retention_deleted_envelopes_total 25"),
            "{text}"
        );
        let again = pass(&store, &policy).await.unwrap();
        assert_eq!(
            again,
            Pass {
                deleted: 0,
                more: false
            }
        );
    }
}
