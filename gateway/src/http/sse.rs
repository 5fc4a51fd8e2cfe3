//! `GET /envelopes/{id}/stream`: server-sent events, the current state, then each change,
//! ending with the final status.
//!
//! The stream is the whole of it: no task of its own. Everything it holds (its store
//! subscription, its count in `asya_gateway_open_streams`, the caller's permit in flight) is
//! the response body's, so when the client goes away and the server drops the body, all of
//! it ends with it, whether or not the envelope ever changes again.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, Path, State};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use tokio::sync::broadcast::{self, error::RecvError};

use super::Server;
use crate::access::Principal;
use crate::app::App;
use crate::metrics::OpenStream;
use crate::store::{Record, Update};

/// How often an idle stream sends a comment; a write to a client that left ends the stream
/// at the latest then.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

fn sse_event(kind: &str, r: &Record) -> SseEvent {
    SseEvent::default()
        .event(kind)
        .data(serde_json::to_string(r).unwrap_or_default())
}

/// The event name of a record: `final` once it has a final status, else `progress`.
fn kind(r: &Record) -> &'static str {
    if r.status.is_final() {
        "final"
    } else {
        "progress"
    }
}

fn event(r: &Record) -> SseEvent {
    sse_event(kind(r), r)
}

pub async fn stream(
    State(s): State<Arc<Server>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Response {
    // Subscribe first, then read: no change can fall between the two.
    let rx = s.app.store.subscribe();
    // An envelope never changes namespace, so one check covers the whole stream.
    let first = match super::clients::readable(&s, &who, &id).await {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let follow = Follow {
        app: s.app.clone(),
        id,
        rx,
        first: Some(first),
        done: false,
        _open: s.app.metrics.stream_opened(),
    };
    Sse::new(events(follow))
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}

/// One stream's state, dropped with it.
struct Follow {
    app: Arc<App>,
    id: String,
    rx: broadcast::Receiver<Update>,
    /// The state when the stream opened, sent first.
    first: Option<Record>,
    /// The final status was sent: the stream ends.
    done: bool,
    _open: OpenStream,
}

impl Follow {
    /// The next event, or `None` once the final status was sent.
    async fn next(&mut self) -> Option<SseEvent> {
        if self.done {
            return None;
        }
        if let Some(r) = self.first.take() {
            self.done = r.status.is_final();
            return Some(event(&r));
        }
        loop {
            let r = match self.rx.recv().await {
                Ok(u) if u.record.id == self.id => u.record,
                Ok(_) => continue,
                // Missed changes: the current state instead.
                Err(RecvError::Lagged(_)) => match self.app.store.get(&self.id).await {
                    Ok(Some(r)) => r,
                    _ => continue,
                },
                Err(RecvError::Closed) => return None,
            };
            self.done = r.status.is_final();
            return Some(event(&r));
        }
    }
}

fn events(follow: Follow) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    futures::stream::unfold(
        follow,
        |mut f| async move { f.next().await.map(|e| (Ok(e), f)) },
    )
}
