//! Whether a report token's namespace uid is the namespace's current one (docs/DESIGN.md §9,
//! "Gateway tokens"): a token names the uid of the namespace it was issued for, so one kept
//! after its namespace was deleted (and the name taken again, perhaps by another team) is
//! refused. The uids come from a metadata-only watch of Namespaces (`--namespace-uids=kube`,
//! a kube-rs reflector store); `off` checks signatures only (runs without a cluster).
//!
//! The decision, [`check`], is a pure function of what the watch knows; [`Feed`] applies the
//! watch's events to the store, the same way in production and in tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;

type Meta = PartialObjectMeta<Namespace>;

/// Where the namespaces' uids come from.
#[derive(Clone, Default)]
pub enum NamespaceUids {
    /// Signatures only (`--namespace-uids=off`, said at start).
    #[default]
    Off,
    Watched(Watched),
}

/// The namespaces the watch has seen, and whether it has listed them all once.
#[derive(Clone)]
pub struct Watched {
    store: Store<Meta>,
    listed: Arc<AtomicBool>,
}

/// What the gateway knows of a namespace now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Known {
    Uid(String),
    /// Listed, and not there: deleted (or never made).
    Absent,
    /// The first list has not completed yet (just started).
    NotListedYet,
}

/// Why a report token's uid is refused; names the namespace, never the token.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UidRefused {
    #[error(
        "the report token of namespace {namespace:?} was issued for an earlier namespace of \
         that name, deleted since{}: the provisioner issues the current namespace's token \
         and its actors' pods roll onto it",
        if *.gone { " (and no namespace of that name exists now)" } else { " and made again" }
    )]
    Stale { namespace: String, gone: bool },
    #[error(
        "the gateway has not yet listed the cluster's namespaces, so it cannot tell whether \
         the report token of namespace {namespace:?} is current; retry shortly"
    )]
    NotListedYet { namespace: String },
}

impl UidRefused {
    pub fn code(&self) -> &'static str {
        match self {
            UidRefused::Stale { .. } => "report_token_stale",
            UidRefused::NotListedYet { .. } => "namespace_uids_not_listed",
        }
    }
}

/// Whether a token issued for `namespace` with `token_uid` is current, given what is known.
///
/// A namespace the watch has not listed yet is 503 (retry): the gateway only just started,
/// and a refusal for good would drop reports that are fine. A namespace listed as absent is
/// refused like a re-created one: its sidecars start seconds after the namespace is made, far
/// longer than the watch takes to see it, so "absent" means deleted.
pub fn check(known: Known, namespace: &str, token_uid: &str) -> Result<(), UidRefused> {
    match known {
        Known::Uid(uid) if uid == token_uid => Ok(()),
        Known::Uid(_) => Err(UidRefused::Stale {
            namespace: namespace.to_string(),
            gone: false,
        }),
        Known::Absent => Err(UidRefused::Stale {
            namespace: namespace.to_string(),
            gone: true,
        }),
        Known::NotListedYet => Err(UidRefused::NotListedYet {
            namespace: namespace.to_string(),
        }),
    }
}

impl NamespaceUids {
    /// `Ok` when checks are off, else [`check`] against the watch.
    pub fn check(&self, namespace: &str, token_uid: &str) -> Result<(), UidRefused> {
        match self {
            NamespaceUids::Off => Ok(()),
            NamespaceUids::Watched(w) => check(w.known(namespace), namespace, token_uid),
        }
    }
}

impl Watched {
    /// An empty store and what fills it.
    pub fn new() -> (Watched, Feed) {
        let (store, writer) = reflector::store::<Meta>();
        let listed = Arc::new(AtomicBool::new(false));
        let w = Watched {
            store,
            listed: listed.clone(),
        };
        (w, Feed { writer, listed })
    }

    /// Starts the metadata-only watch of every Namespace (RBAC: get, list, watch on
    /// namespaces); its errors are logged and retried with backoff, the store keeping what
    /// it knew.
    pub fn start(client: kube::Client) -> Watched {
        let (w, mut feed) = Watched::new();
        // Metadata only: `Api<PartialObjectMeta<_>>` asks for nothing else.
        let api = kube::Api::<Meta>::all(client);
        let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(ev) => feed.apply(&ev),
                    Err(e) => {
                        tracing::warn!(error = %e, "namespace watch failed; retrying (report tokens are checked against the namespaces last seen)")
                    }
                }
            }
        });
        w
    }

    pub fn known(&self, namespace: &str) -> Known {
        if !self.listed.load(Ordering::Acquire) {
            return Known::NotListedYet;
        }
        match self.store.get(&ObjectRef::new(namespace)) {
            Some(m) => match &m.metadata.uid {
                Some(uid) => Known::Uid(uid.clone()),
                None => Known::Absent,
            },
            None => Known::Absent,
        }
    }
}

/// Applies the watch's events to the store; marks it listed once the first list is in.
pub struct Feed {
    writer: reflector::store::Writer<Meta>,
    listed: Arc<AtomicBool>,
}

impl Feed {
    pub fn apply(&mut self, ev: &watcher::Event<Meta>) {
        self.writer.apply_watcher_event(ev);
        if matches!(ev, watcher::Event::InitDone) {
            self.listed.store(true, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::core::metadata::PartialObjectMetaExt;

    use super::*;

    pub(crate) fn namespace(name: &str, uid: &str) -> Meta {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.into()),
            uid: Some(uid.into()),
            ..Default::default()
        }
        .into_response_partial::<Namespace>()
    }

    #[test]
    fn only_the_current_uid_passes_and_each_refusal_names_the_namespace() {
        assert_eq!(check(Known::Uid("u1".into()), "team", "u1"), Ok(()));
        let e = check(Known::Uid("u2".into()), "team", "u1").unwrap_err();
        assert_eq!(e.code(), "report_token_stale");
        assert_eq!(
            e.to_string(),
            "the report token of namespace \"team\" was issued for an earlier namespace of \
             that name, deleted since and made again: the provisioner issues the current \
             namespace's token and its actors' pods roll onto it"
        );
        let e = check(Known::Absent, "team", "u1").unwrap_err();
        assert_eq!(e.code(), "report_token_stale");
        assert!(
            e.to_string()
                .contains("(and no namespace of that name exists now)"),
            "{e}"
        );
        let e = check(Known::NotListedYet, "team", "u1").unwrap_err();
        assert_eq!(e.code(), "namespace_uids_not_listed");
        assert!(e.to_string().contains("\"team\""), "{e}");
        assert_eq!(NamespaceUids::Off.check("team", "any"), Ok(()));
    }

    #[test]
    fn the_watch_knows_nothing_until_listed_then_follows_deletes_and_re_creations() {
        let (w, mut feed) = Watched::new();
        assert_eq!(w.known("team"), Known::NotListedYet);
        feed.apply(&watcher::Event::Init);
        feed.apply(&watcher::Event::InitApply(namespace("team", "u1")));
        assert_eq!(w.known("team"), Known::NotListedYet, "the list is not done");
        feed.apply(&watcher::Event::InitDone);
        assert_eq!(w.known("team"), Known::Uid("u1".into()));
        assert_eq!(w.known("other"), Known::Absent);
        feed.apply(&watcher::Event::Delete(namespace("team", "u1")));
        assert_eq!(w.known("team"), Known::Absent);
        feed.apply(&watcher::Event::Apply(namespace("team", "u2")));
        assert_eq!(w.known("team"), Known::Uid("u2".into()));
        let uids = NamespaceUids::Watched(w);
        assert!(uids.check("team", "u1").is_err());
        assert_eq!(uids.check("team", "u2"), Ok(()));
    }
}
