//! The sidecar's side of the runtime socket: one connection per envelope, each frame a
//! 4-byte big-endian length then JSON (docs/DESIGN.md §4).
//!
//! Calls are pipelined: several connections may wait in the runtime's accept queue while it
//! serves one, so the runtime never waits for the sidecar between envelopes. The runtime
//! accepts them in connection order and serves one at a time, which gives two rules:
//! - a call's handler starts when the call connected just before it finished, so its
//!   timeout counts from there, not from the connect;
//! - when the runtime dies (crash, or exit after an abandoned call), the call it was
//!   serving is the earliest unfinished one. Only that call is blamed; the calls queued
//!   behind it never reached the handler and are made again on the restarted runtime.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::oneshot;

/// Refuse absurd answers instead of allocating whatever a broken peer claims.
pub const MAX_FRAME: usize = 256 * 1024 * 1024;

/// How often one call is made again because the runtime it was queued on went away.
const MAX_REQUEUES: u32 = 3;
/// Left beside the socket by a runtime told to stop; removed by the next one.
pub const STOPPING_NAME: &str = "asya-runtime.stopping";

#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("runtime unreachable at {path}: {source}")]
    Unreachable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("runtime closed the connection before answering (crashed or restarted)")]
    Crashed,
    #[error("handler did not answer within {0:?}")]
    Timeout(Duration),
    #[error("runtime protocol error: {0}")]
    Protocol(String),
    #[error("runtime I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl CallError {
    /// (code, error type) as the resiliency rules see them.
    pub fn kind(&self) -> (&'static str, &'static str) {
        match self {
            CallError::Unreachable { .. } => ("runtime_unreachable", "RuntimeUnreachable"),
            CallError::Crashed | CallError::Io(_) => ("runtime_crashed", "RuntimeCrashed"),
            CallError::Timeout(_) => ("timeout", "ActorTimeout"),
            CallError::Protocol(_) => ("runtime_protocol", "RuntimeProtocolError"),
        }
    }

    /// The runtime went away (or is being made to) while this call was open.
    fn runtime_gone(&self) -> bool {
        matches!(self, CallError::Crashed | CallError::Io(_))
    }

    /// The call ended without an answer because there was no runtime to give one: it died
    /// while serving or before it could be reached. Not a timeout: that is the handler's.
    pub fn no_runtime(&self) -> bool {
        self.runtime_gone() || matches!(self, CallError::Unreachable { .. })
    }
}

/// Order and blame bookkeeping shared by the clones of one client.
#[derive(Default)]
struct Pipeline {
    /// Completion of the last call connected; held while connecting, so connection order
    /// and this chain agree.
    last: tokio::sync::Mutex<Option<oneshot::Receiver<()>>>,
    deaths: std::sync::Mutex<Deaths>,
}

struct Deaths {
    /// Sequence number of the next connection.
    next: u64,
    /// Connections numbered below this were open when a call was blamed for the runtime's
    /// death (or timed out, which makes the runtime exit): they never reached the handler.
    doomed_below: u64,
    /// Open from a blamed death until there is proof of a live runtime (an answer) or of
    /// the old one being gone (a doomed call saw it close): connections made meanwhile may
    /// still have reached the dying runtime.
    window: bool,
}

impl Default for Deaths {
    /// The window starts open: a sidecar that was just (re)started may find the runtime its
    /// predecessor abandoned mid-call still running, about to exit (it notices within tens
    /// of milliseconds; a restarted sidecar can be faster). Its first calls must not be
    /// charged with that exit.
    fn default() -> Self {
        Deaths {
            next: 0,
            doomed_below: 0,
            window: true,
        }
    }
}

#[derive(Clone)]
pub struct RuntimeClient {
    path: PathBuf,
    pipe: Arc<Pipeline>,
}

impl std::fmt::Debug for RuntimeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeClient")
            .field("path", &self.path)
            .finish()
    }
}

impl RuntimeClient {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        RuntimeClient {
            path: path.into(),
            pipe: Arc::default(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The runtime was told to stop (SIGTERM: its pod is going away) and a fresh one has not
    /// started since: it leaves `asya-runtime.stopping` beside its socket (asya_runtime.py).
    pub fn stopping(&self) -> bool {
        self.path.with_file_name(STOPPING_NAME).exists()
    }

    /// True when the runtime accepts connections (readiness). The probe connection is
    /// closed without a frame, which the runtime ignores.
    pub async fn reachable(&self) -> bool {
        UnixStream::connect(&self.path).await.is_ok()
    }

    /// Connects, waiting up to `wait` for a runtime that is (re)starting.
    async fn connect(&self, wait: Duration) -> Result<UnixStream, CallError> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut pause = Duration::from_millis(20);
        loop {
            match UnixStream::connect(&self.path).await {
                Ok(s) => return Ok(s),
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    return Err(CallError::Unreachable {
                        path: self.path.clone(),
                        source: e,
                    });
                }
                Err(_) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
        }
    }

    /// Sends one request and reads the answer; `timeout` bounds the handler, counted from
    /// when the runtime gets to this call. On timeout the connection is dropped, which tells
    /// the runtime to exit so its supervisor restarts it (see asya_runtime.py). Calls may
    /// run concurrently: they are pipelined on the runtime in the order they connect.
    pub async fn call(
        &self,
        request: &[u8],
        timeout: Duration,
        wait: Duration,
    ) -> Result<Value, CallError> {
        let mut requeues = 0;
        loop {
            let (mut stream, seq, in_window, before, done) = {
                let mut last = self.pipe.last.lock().await;
                let stream = self.connect(wait).await?;
                let (done, rx) = oneshot::channel::<()>();
                let before = last.replace(rx);
                let mut d = self.deaths();
                let seq = d.next;
                d.next += 1;
                (stream, seq, d.window, before, done)
            };
            let result = exchange(&mut stream, request, timeout, before).await;
            drop(stream);
            // Every call before this one has finished and been judged (exchange waited for
            // them on failure), so the bookkeeping below is read in connection order.
            let mut d = self.deaths();
            match result {
                Ok(v) => {
                    d.window = false;
                    drop(d);
                    drop(done);
                    return Ok(v);
                }
                Err(e)
                    if e.runtime_gone()
                        && (in_window || seq < d.doomed_below)
                        && requeues < MAX_REQUEUES =>
                {
                    // Queued on a runtime that died serving an earlier call: not this
                    // envelope's fault. That runtime is gone now; call the next one.
                    d.window = false;
                    drop(d);
                    drop(done);
                    requeues += 1;
                    tracing::debug!(
                        requeues,
                        "runtime went away before serving this call; calling again"
                    );
                }
                Err(e) => {
                    if e.runtime_gone() || matches!(e, CallError::Timeout(_)) {
                        d.doomed_below = d.next;
                        d.window = true;
                    }
                    drop(d);
                    drop(done);
                    return Err(e);
                }
            }
        }
    }

    fn deaths(&self) -> std::sync::MutexGuard<'_, Deaths> {
        self.pipe
            .deaths
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One call on a connected stream. The timeout starts once `before` (the previous call on
/// the runtime) has finished; a failure is returned only after that, so callers judge
/// failures in connection order.
async fn exchange(
    stream: &mut UnixStream,
    request: &[u8],
    timeout: Duration,
    before: Option<oneshot::Receiver<()>>,
) -> Result<Value, CallError> {
    let io = round_trip(stream, request);
    tokio::pin!(io);
    if let Some(mut before) = before {
        tokio::select! {
            r = &mut io => {
                if r.is_err() {
                    let _ = before.await;
                }
                return r;
            }
            _ = &mut before => {}
        }
    }
    match tokio::time::timeout(timeout, io).await {
        Ok(r) => r,
        Err(_) => Err(CallError::Timeout(timeout)),
    }
}

async fn round_trip(stream: &mut UnixStream, request: &[u8]) -> Result<Value, CallError> {
    let len = u32::try_from(request.len())
        .map_err(|_| CallError::Protocol("request larger than 4 GiB".into()))?;
    let gone = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::UnexpectedEof
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::BrokenPipe => CallError::Crashed,
        _ => CallError::Io(e),
    };
    // One write for small requests: header and body in one system call.
    if request.len() <= 64 * 1024 {
        let mut frame = Vec::with_capacity(4 + request.len());
        frame.extend_from_slice(&len.to_be_bytes());
        frame.extend_from_slice(request);
        stream.write_all(&frame).await.map_err(gone)?;
    } else {
        stream.write_all(&len.to_be_bytes()).await.map_err(gone)?;
        stream.write_all(request).await.map_err(gone)?;
    }
    let mut head = [0u8; 4];
    stream.read_exact(&mut head).await.map_err(gone)?;
    let n = u32::from_be_bytes(head) as usize;
    if n > MAX_FRAME {
        return Err(CallError::Protocol(format!(
            "answer of {n} bytes exceeds {MAX_FRAME}"
        )));
    }
    let mut body = vec![0u8; n];
    stream.read_exact(&mut body).await.map_err(gone)?;
    serde_json::from_slice(&body)
        .map_err(|e| CallError::Protocol(format!("answer is not JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::UnixListener;

    async fn serve_once<F, Fut>(path: PathBuf, f: F)
    where
        F: FnOnce(UnixStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let listener = UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            f(s).await;
        });
    }

    async fn read_req(s: &mut UnixStream) -> Vec<u8> {
        let mut head = [0u8; 4];
        s.read_exact(&mut head).await.unwrap();
        let mut b = vec![0; u32::from_be_bytes(head) as usize];
        s.read_exact(&mut b).await.unwrap();
        b
    }

    #[tokio::test]
    async fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        serve_once(path.clone(), |mut s| async move {
            let req = read_req(&mut s).await;
            assert_eq!(req, b"{\"a\":1}");
            let ans = b"[1,2]";
            s.write_all(&(ans.len() as u32).to_be_bytes())
                .await
                .unwrap();
            s.write_all(ans).await.unwrap();
        })
        .await;
        let c = RuntimeClient::new(&path);
        let v = c
            .call(b"{\"a\":1}", Duration::from_secs(5), Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(v, serde_json::json!([1, 2]));
    }

    #[tokio::test]
    async fn crash_and_timeout_and_unreachable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        // A runtime that answers once (so the client knows it is alive), then dies in the
        // second call's handler.
        let listener = UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let req = read_req(&mut s).await;
            answer(&mut s, &req).await;
            let (mut s, _) = listener.accept().await.unwrap();
            read_req(&mut s).await;
        });
        let c = RuntimeClient::new(&path);
        let ok = c.call(b"1", Duration::from_secs(5), Duration::ZERO).await;
        assert_eq!(ok.unwrap(), serde_json::json!(1));
        let e = c
            .call(b"{}", Duration::from_secs(5), Duration::ZERO)
            .await
            .unwrap_err();
        assert!(matches!(e, CallError::Crashed), "{e}");

        let path2 = dir.path().join("t.sock");
        serve_once(path2.clone(), |mut s| async move {
            read_req(&mut s).await;
            tokio::time::sleep(Duration::from_secs(30)).await;
        })
        .await;
        let e = RuntimeClient::new(&path2)
            .call(b"{}", Duration::from_millis(100), Duration::ZERO)
            .await
            .unwrap_err();
        assert!(matches!(e, CallError::Timeout(_)));

        let e = RuntimeClient::new(dir.path().join("none.sock"))
            .call(b"{}", Duration::from_secs(1), Duration::from_millis(50))
            .await
            .unwrap_err();
        assert_eq!(e.kind().0, "runtime_unreachable");
    }

    async fn answer(s: &mut UnixStream, body: &[u8]) {
        s.write_all(&(body.len() as u32).to_be_bytes())
            .await
            .unwrap();
        s.write_all(body).await.unwrap();
    }

    /// Waits (no sleep) until `n` connections of `c` are made.
    async fn connected(c: &RuntimeClient, n: u64) {
        while c.deaths().next < n {
            tokio::task::yield_now().await;
        }
    }

    /// One call in its own task; `limit` is both the timeout and the wait for the runtime.
    fn spawn_call(
        c: &RuntimeClient,
        body: &'static [u8],
        limit: Duration,
    ) -> tokio::task::JoinHandle<Result<Value, CallError>> {
        let c = c.clone();
        tokio::spawn(async move { c.call(body, limit, limit).await })
    }

    #[tokio::test]
    async fn a_runtime_death_blames_only_the_call_it_served() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let first = UnixListener::bind(&path).unwrap();
        let c = RuntimeClient::new(&path);
        let call = |body| spawn_call(&c, body, Duration::from_secs(10));
        // One answered call first: the client knows this runtime is alive.
        let w = call(b"\"w\"");
        let (mut s, _) = first.accept().await.unwrap();
        let req = read_req(&mut s).await;
        answer(&mut s, &req).await;
        assert_eq!(w.await.unwrap().unwrap(), serde_json::json!("w"));
        let a = call(b"\"a\"");
        connected(&c, 2).await;
        let b = call(b"\"b\"");
        connected(&c, 3).await;
        let d = call(b"\"d\"");
        connected(&c, 4).await;
        // The runtime takes the first call and dies in its handler: b and d were queued.
        let (mut served, _) = first.accept().await.unwrap();
        assert_eq!(read_req(&mut served).await, b"\"a\"");
        drop(served);
        drop(first);
        std::fs::remove_file(&path).unwrap();
        // The restarted runtime gets b and d again, in order, and answers them.
        let second = UnixListener::bind(&path).unwrap();
        for want in [&b"\"b\""[..], b"\"d\""] {
            let (mut s, _) = second.accept().await.unwrap();
            let req = read_req(&mut s).await;
            assert_eq!(req, want);
            answer(&mut s, &req).await;
        }
        assert!(matches!(a.await.unwrap(), Err(CallError::Crashed)));
        assert_eq!(b.await.unwrap().unwrap(), serde_json::json!("b"));
        assert_eq!(d.await.unwrap().unwrap(), serde_json::json!("d"));
    }

    #[tokio::test]
    async fn a_fresh_client_is_not_charged_with_the_exit_of_a_runtime_it_found_dying() {
        // A restarted sidecar's first call reaches the runtime its predecessor abandoned,
        // which exits instead of answering; the call goes to the next runtime.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let dying = UnixListener::bind(&path).unwrap();
        let c = RuntimeClient::new(&path);
        let x = spawn_call(&c, b"\"x\"", Duration::from_secs(10));
        connected(&c, 1).await;
        drop(dying);
        std::fs::remove_file(&path).unwrap();
        let next = UnixListener::bind(&path).unwrap();
        let (mut s, _) = next.accept().await.unwrap();
        let req = read_req(&mut s).await;
        answer(&mut s, &req).await;
        assert_eq!(x.await.unwrap().unwrap(), serde_json::json!("x"));
    }

    #[tokio::test]
    async fn the_timeout_counts_from_the_calls_turn() {
        // Each handler takes 0.6 s against a 1 s timeout; the second call waits 0.6 s for
        // the first one and must not be cut off for that.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let req = read_req(&mut s).await;
                tokio::time::sleep(Duration::from_millis(600)).await;
                answer(&mut s, &req).await;
            }
        });
        let c = RuntimeClient::new(&path);
        let call = |body| spawn_call(&c, body, Duration::from_secs(1));
        let a = call(b"1");
        connected(&c, 1).await;
        let b = call(b"2");
        assert_eq!(a.await.unwrap().unwrap(), serde_json::json!(1));
        assert_eq!(b.await.unwrap().unwrap(), serde_json::json!(2));
    }
}
