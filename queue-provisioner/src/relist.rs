//! kube-runtime's watcher, started afresh when the API server refuses to resume a watch.
//!
//! After an API server restart, kube-runtime 5's watcher resumes from the resource version
//! of its last list, and the new API server may answer that watch request itself with 410
//! Gone ("too old resource version"). kube-runtime lists again on a 410 *event* in a watch,
//! but on a 410 *answer* to the watch request it stays listed and asks again with the same
//! version, forever: its cache never sees an object made since. Found by
//! tests/e2e/test_restarts.py: AsyncActors applied after an API server restart were never
//! reconciled by a provisioner that lived through it. [`relisting`] replaces such a watcher
//! with a new one, which lists (its cache swaps in the whole list) and watches from there.
//!
//! [`isolated`]: kube-runtime's Controller puts one backoff over all its trigger streams
//! together, so a watch that fails at every attempt keeps every other one asleep (see there).

use futures::stream::{self, BoxStream, Stream, StreamExt};
use kube::Resource;
use kube::api::Api;
use kube::runtime::watcher as w;
use serde::de::DeserializeOwned;

type Events<K> = BoxStream<'static, Result<w::Event<K>, w::Error>>;

/// Whether `e` is the API server refusing to resume a watch from a resource version it no
/// longer has: only a new list can go on.
pub fn resume_refused(e: &w::Error) -> bool {
    matches!(e, w::Error::WatchStartFailed(kube::Error::Api(s)) if s.code == 410)
}

/// The events of the watchers `start` makes: the first until it reports [`resume_refused`]
/// (that error is passed on, for the caller's backoff and logs), then the next one's.
pub fn relisting<K, S, F>(start: F) -> impl Stream<Item = Result<w::Event<K>, w::Error>> + Send
where
    K: Send + 'static,
    S: Stream<Item = Result<w::Event<K>, w::Error>> + Send + 'static,
    F: Fn() -> S + Send + Sync + 'static,
{
    stream::unfold((start, None::<Events<K>>), |(start, current)| async move {
        let mut events = current.unwrap_or_else(|| start().boxed());
        let item = events.next().await?;
        let next = match &item {
            Err(e) if resume_refused(e) => {
                tracing::warn!(error = %e, "the API server no longer has the watch's resource version; listing again");
                None
            }
            _ => Some(events),
        };
        Some((item, (start, next)))
    })
}

/// `watch`'s events with its errors logged (named by `name`) and dropped.
///
/// The Controller's trigger streams (its own watch, the owned and watched kinds, and through
/// them the caches they feed) are polled as one stream behind one backoff: any error from
/// any of them puts all of them to sleep, for 0.8 s doubling up to 30 s while errors keep
/// coming. After an API server crash, one watch refused at every attempt (410, before
/// [`relisting`] covered every watch) was enough to keep the others asleep nearly all the
/// time: the AsyncActor cache froze, actors made since were never reconciled, and the
/// earlier ones were reconciled from their frozen copies (a finalizer patch testing the
/// stale list: 422). Each watch backs off on its own (`default_backoff` before this), so
/// dropping its errors here holds back that watch alone, and the Controller's backoff never
/// fires. The errors were dropped unseen before; now each is logged.
pub fn isolated<T: Send, S>(
    name: &'static str,
    watch: S,
) -> impl Stream<Item = Result<T, w::Error>> + Send
where
    S: Stream<Item = Result<T, w::Error>> + Send,
{
    watch.filter_map(move |item| {
        futures::future::ready(match item {
            Ok(v) => Some(Ok(v)),
            Err(e) => {
                tracing::warn!(watch = name, error = %e, "watch failed; it retries on its own");
                None
            }
        })
    })
}

/// [`kube::runtime::watcher()`] of `api` with `config`, [`relisting`].
pub fn watcher<K>(
    api: Api<K>,
    config: w::Config,
) -> impl Stream<Item = Result<w::Event<K>, w::Error>> + Send
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    relisting(move || w::watcher(api.clone(), config.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn gone() -> w::Error {
        w::Error::WatchStartFailed(kube::Error::Api(Box::new(
            kube::core::Status::failure("too old resource version: 603 (624)", "Expired")
                .with_code(410),
        )))
    }

    fn other() -> w::Error {
        w::Error::WatchStartFailed(kube::Error::Api(Box::new(
            kube::core::Status::failure("etcdserver: leader changed", "InternalError")
                .with_code(500),
        )))
    }

    /// The first watcher: one object, a refused resume, then what it would go on with (never
    /// read); the second: a new list. Another error keeps the watcher.
    #[tokio::test]
    async fn a_refused_resume_starts_a_new_watcher_and_nothing_else_does() {
        let made = Arc::new(AtomicUsize::new(0));
        let m = made.clone();
        let events = relisting(move || {
            let n = m.fetch_add(1, Ordering::SeqCst);
            let items: Vec<Result<w::Event<String>, w::Error>> = match n {
                0 => vec![
                    Ok(w::Event::Apply("a".into())),
                    Err(other()),
                    Ok(w::Event::Apply("b".into())),
                    Err(gone()),
                    Ok(w::Event::Apply("stale".into())),
                ],
                _ => vec![
                    Ok(w::Event::Init),
                    Ok(w::Event::InitApply("c".into())),
                    Ok(w::Event::InitDone),
                ],
            };
            stream::iter(items)
        });
        let got: Vec<String> = events
            .map(|e| match e {
                Ok(w::Event::Apply(o)) => o,
                Ok(w::Event::InitApply(o)) => format!("init {o}"),
                Ok(w::Event::Init) => "init".into(),
                Ok(w::Event::InitDone) => "listed".into(),
                Ok(w::Event::Delete(o)) => format!("delete {o}"),
                Err(e) if resume_refused(&e) => "refused".into(),
                Err(_) => "error".into(),
            })
            .collect()
            .await;
        assert_eq!(
            got,
            ["a", "error", "b", "refused", "init", "init c", "listed"]
        );
        assert_eq!(made.load(Ordering::SeqCst), 2);
    }

    /// Errors are dropped, the events around them kept in order, and the stream goes on past
    /// them (the Controller's own backoff sees no error).
    #[tokio::test]
    async fn isolated_drops_errors_and_keeps_going() {
        let items: Vec<Result<&str, w::Error>> = vec![
            Ok("a"),
            Err(gone()),
            Err(other()),
            Ok("b"),
            Err(other()),
            Ok("c"),
        ];
        let got: Vec<&str> = isolated("test", stream::iter(items))
            .map(|r| r.expect("no error gets through"))
            .collect()
            .await;
        assert_eq!(got, ["a", "b", "c"]);
    }
}
