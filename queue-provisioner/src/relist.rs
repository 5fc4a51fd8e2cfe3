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
//! together, so the errors of some watches keep every other one asleep (see there).

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
/// any of them puts all of them to sleep, 0.8 s doubling up to 30 s, reset only when an
/// event gets through. An API server crash makes every watch fail at once (refused
/// connections while it is away, then 410 for each resumed watch), so a dozen watches'
/// errors, one after another with no event between them (a sleeping stream yields none),
/// took that shared backoff to its ceiling: the AsyncActor cache froze, actors made since
/// were never reconciled, and the earlier ones were reconciled from frozen copies (the
/// finalizer's JSON patch tests the list it read: 422 `Invalid`). Found by
/// tests/e2e/test_restarts.py (`kill`): failed with the shared backoff, passes without.
/// Each watch backs off on its own (`default_backoff` before this), so dropping its errors
/// here holds back that watch alone and the shared backoff never fires. They were dropped
/// unseen before; now each is logged.
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

    /// kube-runtime's Controller with two trigger streams, as after an API server crash: one
    /// fails 30 times in a row, the other then brings an actor. Isolated, the actor is
    /// reconciled at once; through the Controller's shared backoff (0.8 s doubling to 30 s)
    /// it would take minutes, and this test would fail at its 5 s bound.
    #[tokio::test]
    async fn a_failing_watch_does_not_hold_back_the_controllers_other_watches() {
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::runtime::controller::{Action, Controller};
        use kube::runtime::reflector;
        use std::time::Duration;

        let obj = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("actor".into()),
                namespace: Some("team".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let (reader, mut writer) = reflector::store::<ConfigMap>();
        for ev in [
            w::Event::Init,
            w::Event::InitApply(obj.clone()),
            w::Event::InitDone,
        ] {
            writer.apply_watcher_event(&ev);
        }
        let failing = stream::iter((0..30).map(|_| Err::<ConfigMap, _>(gone())));
        // The actor's trigger comes once the failing watch has said everything.
        let (tx, rx) = futures::channel::oneshot::channel::<ConfigMap>();
        // Watches never end (the Controller would shut down).
        let actor =
            stream::once(async move { Ok(rx.await.expect("sent")) }).chain(stream::pending());
        let failing = failing
            .chain(stream::once(async move {
                let _ = tx.send(obj.clone());
                Err(other())
            }))
            .chain(stream::pending());
        let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
        let controller = Controller::for_stream(isolated("actors", actor), reader)
            .watches_stream(isolated("failing", failing), |_: ConfigMap| {
                Vec::<reflector::ObjectRef<ConfigMap>>::new()
            });
        tokio::spawn(
            controller
                .run(
                    move |o: Arc<ConfigMap>, _| {
                        let _ = seen_tx.send(o.metadata.name.clone());
                        async { Ok::<_, kube::Error>(Action::await_change()) }
                    },
                    |_, _, _| Action::await_change(),
                    Arc::new(()),
                )
                .for_each(|_| async {}),
        );
        let got = tokio::time::timeout(Duration::from_secs(5), seen.recv()).await;
        assert_eq!(got, Ok(Some(Some("actor".to_string()))));
    }
}
