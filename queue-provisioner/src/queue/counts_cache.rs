//! The listing of every queue's message counts that the RabbitMQ management API gives, shared
//! by all reconciles (one listing serves every actor: a filtered listing per reconcile would
//! make the broker scan all its queues each time).
//!
//! A reconcile waits for a listing only when there is none or it is older than
//! [`MAX_STALE`]; between [`TTL`] and that, it is served the listing it finds while one
//! refresh runs in the background. A queue missing from the listing (created since) is not
//! waited for either: the caller asks AMQP (ready messages, exact) and a refresh is started.
//! Why: a listing pages through every queue of the vhost, 3.5 s with 4,500 queues on the
//! test machine, and when each reconcile of a new actor waited for one (the queue is never in
//! the listing yet), 1,000 actors applied at once took 148-223 s to converge.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::QueueDepth;

/// Served without a refresh while younger than this.
pub const TTL: Duration = Duration::from_secs(5);
/// Served at all while younger than this (a refresh runs meanwhile); older, a reconcile
/// waits for a new one. Bounds how old a count in an actor's status can be: an actor with
/// messages is reconciled every 15-20 s, so its next status after a change is at most this
/// plus one period behind.
pub const MAX_STALE: Duration = Duration::from_secs(10);
/// A queue missing from the listing starts a refresh at most this often.
pub const MIN_AGE: Duration = Duration::from_secs(1);

/// What one read of a queue's counts does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Answer from the listing; `refresh`: start one in the background.
    Serve { refresh: bool },
    /// The queue is not in the listing: the caller asks AMQP; `refresh` as above.
    Missing { refresh: bool },
    /// No listing young enough to serve: list now (one listing for every waiter).
    Wait,
}

/// Decides a read from the listing's age (`None`: no listing yet) and whether it holds the
/// queue. Pure.
pub fn step(age: Option<Duration>, listed: bool) -> Step {
    match age {
        None => Step::Wait,
        Some(a) if a >= MAX_STALE => Step::Wait,
        Some(a) if listed => Step::Serve { refresh: a >= TTL },
        Some(a) => Step::Missing {
            refresh: a >= MIN_AGE,
        },
    }
}

struct Listing {
    /// When the listing started: the counts are at least this old.
    at: Instant,
    /// When it was complete.
    done: Instant,
    counts: HashMap<String, QueueDepth>,
}

#[derive(Default)]
pub struct CountsCache {
    listing: Mutex<Option<Listing>>,
    /// Held while listing: one listing at a time, the others wait for its result.
    listing_now: tokio::sync::Mutex<()>,
    /// A background refresh is under way (at most one).
    background: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl CountsCache {
    /// What to do for `name`, and its counts in the listing as it is.
    pub fn read(&self, name: &str) -> (Step, Option<QueueDepth>) {
        let l = lock(&self.listing);
        let found = l.as_ref().and_then(|l| l.counts.get(name).copied());
        let age = l.as_ref().map(|l| l.at.elapsed());
        (step(age, found.is_some()), found)
    }

    /// Lists with `list` and keeps the result, unless a listing completed after this call was
    /// made is there by the time its turn comes: every caller that queued behind one listing
    /// shares it, however long it took (one that started before the call is at most one
    /// listing's duration older than one started after it).
    pub async fn refresh<F>(&self, list: F) -> Result<(), String>
    where
        F: Future<Output = Result<HashMap<String, QueueDepth>, String>>,
    {
        let asked = Instant::now();
        let _turn = self.listing_now.lock().await;
        if lock(&self.listing)
            .as_ref()
            .is_some_and(|l| l.done >= asked)
        {
            return Ok(());
        }
        let at = Instant::now();
        let counts = list.await?;
        *lock(&self.listing) = Some(Listing {
            at,
            done: Instant::now(),
            counts,
        });
        Ok(())
    }

    /// Claims the one background refresh; `false` when one is under way.
    pub fn begin_background(&self) -> bool {
        !self.background.swap(true, Ordering::AcqRel)
    }

    pub fn end_background(&self) {
        self.background.store(false, Ordering::Release);
    }

    /// Drops a deleted queue, which the listing would otherwise count a while longer.
    pub fn forget(&self, name: &str) {
        if let Some(l) = lock(&self.listing).as_mut() {
            l.counts.remove(name);
        }
    }
}

/// Starts a background refresh of `cache` with `list` unless one is under way; its failure
/// is reported through `failed` (the caller logs it once per outage).
pub fn refresh_in_background<F>(
    cache: Arc<CountsCache>,
    list: F,
    failed: impl FnOnce(String) + Send + 'static,
) where
    F: Future<Output = Result<HashMap<String, QueueDepth>, String>> + Send + 'static,
{
    if !cache.begin_background() {
        return;
    }
    tokio::spawn(async move {
        let res = cache.refresh(list).await;
        cache.end_background();
        if let Err(e) = res {
            failed(e);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Option<Duration> = |s| Some(Duration::from_millis(s));

    #[test]
    fn no_listing_or_a_too_old_one_is_waited_for() {
        assert_eq!(step(None, false), Step::Wait);
        assert_eq!(step(S(MAX_STALE.as_millis() as u64), true), Step::Wait);
        assert_eq!(step(S(60_000), false), Step::Wait);
    }

    #[test]
    fn a_young_listing_serves_without_a_refresh() {
        assert_eq!(step(S(0), true), Step::Serve { refresh: false });
        assert_eq!(step(S(4_999), true), Step::Serve { refresh: false });
    }

    #[test]
    fn an_aging_listing_serves_while_one_refresh_runs() {
        assert_eq!(step(S(5_000), true), Step::Serve { refresh: true });
        assert_eq!(step(S(9_999), true), Step::Serve { refresh: true });
    }

    #[test]
    fn a_queue_not_yet_listed_goes_to_amqp_and_refreshes_at_most_every_second() {
        assert_eq!(step(S(500), false), Step::Missing { refresh: false });
        assert_eq!(step(S(1_000), false), Step::Missing { refresh: true });
        assert_eq!(step(S(9_000), false), Step::Missing { refresh: true });
    }

    fn depth(n: i64) -> QueueDepth {
        QueueDepth {
            queued: Some(n),
            processing: Some(0),
        }
    }

    #[tokio::test]
    async fn waiters_of_one_listing_share_it() {
        let cache = Arc::new(CountsCache::default());
        let lists = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let list = |lists: Arc<std::sync::atomic::AtomicUsize>| async move {
            lists.fetch_add(1, Ordering::SeqCst);
            tokio::task::yield_now().await;
            Ok(HashMap::from([("q".to_string(), depth(3))]))
        };
        let (a, b, c) = tokio::join!(
            cache.refresh(list(lists.clone())),
            cache.refresh(list(lists.clone())),
            cache.refresh(list(lists.clone())),
        );
        assert!(a.is_ok() && b.is_ok() && c.is_ok());
        assert_eq!(lists.load(Ordering::SeqCst), 1);
        assert_eq!(
            cache.read("q"),
            (Step::Serve { refresh: false }, Some(depth(3)))
        );
        assert_eq!(cache.read("new"), (Step::Missing { refresh: false }, None));
    }

    /// A listing slower than [`MIN_AGE`] (3.5 s with 4,500 queues) still serves every caller
    /// that asked before it started, instead of each listing in turn.
    #[tokio::test]
    async fn callers_waiting_on_a_slow_listing_share_it() {
        let cache = Arc::new(CountsCache::default());
        let lists = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let list = |lists: Arc<std::sync::atomic::AtomicUsize>| async move {
            lists.fetch_add(1, Ordering::SeqCst);
            // The listing's own duration, not a wait for a condition.
            tokio::time::sleep(MIN_AGE + Duration::from_millis(100)).await;
            Ok(HashMap::from([("q".to_string(), depth(1))]))
        };
        let results =
            futures::future::join_all((0..4).map(|_| cache.refresh(list(lists.clone())))).await;
        assert!(results.iter().all(|r| r.is_ok()));
        assert_eq!(lists.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_failed_listing_keeps_none_and_is_reported() {
        let cache = CountsCache::default();
        let err = cache.refresh(async { Err("GET …: 503".to_string()) }).await;
        assert_eq!(err, Err("GET …: 503".to_string()));
        assert_eq!(cache.read("q"), (Step::Wait, None));
    }

    #[tokio::test]
    async fn only_one_background_refresh_at_a_time() {
        let cache = Arc::new(CountsCache::default());
        assert!(cache.begin_background());
        assert!(!cache.begin_background());
        cache.end_background();
        let (tx, rx) = tokio::sync::oneshot::channel();
        refresh_in_background(
            cache.clone(),
            async { Ok(HashMap::from([("q".to_string(), depth(1))])) },
            |_| {},
        );
        // The spawned refresh releases the claim when it is done.
        tokio::spawn({
            let cache = cache.clone();
            async move {
                while cache.background.load(Ordering::Acquire) || cache.read("q").1.is_none() {
                    tokio::task::yield_now().await;
                }
                let _ = tx.send(cache.read("q").1);
            }
        });
        assert_eq!(rx.await.ok().flatten(), Some(depth(1)));
    }

    #[test]
    fn a_deleted_queue_is_forgotten() {
        let cache = CountsCache::default();
        *lock(&cache.listing) = Some(Listing {
            at: Instant::now(),
            done: Instant::now(),
            counts: HashMap::from([("q".to_string(), depth(2))]),
        });
        cache.forget("q");
        assert_eq!(cache.read("q"), (Step::Missing { refresh: false }, None));
    }
}
