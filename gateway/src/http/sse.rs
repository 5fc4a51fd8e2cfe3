//! `GET /envelopes/{id}/stream`: server-sent events, the current state, then each change,
//! ending with the final status.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Extension, Path, State};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;

use super::Server;
use crate::access::Principal;
use crate::store::Record;

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

pub async fn stream(
    State(s): State<Arc<Server>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Response {
    // Subscribe first, then read: no change can fall between the two.
    let mut rx = s.app.store.subscribe();
    // An envelope never changes namespace, so one check covers the whole stream.
    let first = match super::clients::readable(&s, &who, &id).await {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let app = s.app.clone();
    let events = async_stream(move |tx| async move {
        let done = first.status.is_final();
        if tx.send(sse_event(kind(&first), &first)).await.is_err() || done {
            return;
        }
        loop {
            match rx.recv().await {
                Ok(u) if u.record.id == id => {
                    let done = u.record.status.is_final();
                    if tx
                        .send(sse_event(kind(&u.record), &u.record))
                        .await
                        .is_err()
                        || done
                    {
                        return;
                    }
                }
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    if let Ok(Some(r)) = app.store.get(&id).await {
                        let done = r.status.is_final();
                        if tx.send(sse_event(kind(&r), &r)).await.is_err() || done {
                            return;
                        }
                    }
                }
                Err(_) => return,
            }
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// A stream fed by a task: `f` gets a sender and runs until it returns or the client leaves.
fn async_stream<F, Fut>(f: F) -> impl Stream<Item = Result<SseEvent, Infallible>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<SseEvent>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(f(tx));
    futures::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|e| (Ok(e), rx)) },
    )
}
