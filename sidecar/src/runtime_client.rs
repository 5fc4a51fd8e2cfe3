//! The sidecar's side of the runtime socket (docs/DESIGN.md §4): each frame a 4-byte
//! big-endian length then JSON, answered in order on the connection that carried it.
//!
//! **Persistent connections.** A runtime that keeps the connection open for the next request
//! says so in every answer: bit 31 of the answer's length is set (frames are at most
//! [`MAX_FRAME`] bytes, so the bit is free). Once an answer carried it, the client writes
//! the next calls on the newest connection, pipelined (several requests written before the
//! first answer comes back; the runtime reads them in order and serves one at a time). A
//! runtime that answers without the bit (one connection per envelope, the original
//! contract) has each call on a connection of its own, as before: those connections wait
//! in its accept queue and it serves them in connection order. Either way calls reach the
//! handler in the order they were written, which gives two rules:
//! - a call's handler starts when the call written just before it finished, so its timeout
//!   counts from there, not from the write;
//! - when the runtime dies (crash, or exit after an abandoned call), the call it was
//!   serving is the earliest unfinished one. Only that call is blamed; the calls queued
//!   behind it never reached the handler and are made again on the restarted runtime.
//!
//! A connection that is no longer the newest is closed once its last answer is read, so the
//! runtime (which serves one connection at a time) moves on to the next.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::Value;
use tokio::net::UnixStream;
use tokio::sync::oneshot;

/// Refuse absurd answers instead of allocating whatever a broken peer claims.
pub const MAX_FRAME: usize = 256 * 1024 * 1024;
/// Bit 31 of an answer's length: the runtime keeps the connection open for the next request.
pub const KEEP_ALIVE: u32 = 1 << 31;

/// How often one call is made again because the runtime it was queued on went away.
const MAX_REQUEUES: u32 = 3;
/// Left beside the socket by a runtime told to stop; removed by the next one.
pub const STOPPING_NAME: &str = "asya-runtime.stopping";
/// Room kept for a read: answers that arrive together are taken in one system call.
const READ_ROOM: usize = 16 * 1024;
/// A connection's read buffer is given back above this once a large answer is consumed.
const KEEP_BUFFER: usize = 1024 * 1024;

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

fn gone(e: std::io::Error) -> CallError {
    match e.kind() {
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => {
            CallError::Crashed
        }
        _ => CallError::Io(e),
    }
}

/// Which runtime instance listens on the socket: each one binds a new file. The inode
/// alone is not enough: a file system may give the new file the number of the one just
/// removed (seen on ext4, where a requeued call then waited its whole `wait` for a
/// replacement that had already come), so the file's change time is part of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RuntimeInstance {
    dev: u64,
    ino: u64,
    ctime: i64,
    ctime_nsec: i64,
}

/// One connection to the runtime, shared by the calls written on it.
struct Conn {
    stream: UnixStream,
    /// Which runtime it reached: the socket file's identity when it connected. A call
    /// requeued off a dead runtime waits for a new one.
    runtime: Option<RuntimeInstance>,
    /// Bytes read and not consumed yet (answers may arrive together). Only the call whose
    /// turn it is reads (the order chain), so the lock is never contended.
    inbox: tokio::sync::Mutex<Vec<u8>>,
    state: std::sync::Mutex<ConnState>,
}

#[derive(Default)]
struct ConnState {
    /// Calls written on it and not finished.
    outstanding: u32,
    /// No call is written on it any more (a newer connection exists, or it broke).
    retired: bool,
    closed: bool,
}

impl Conn {
    fn new(stream: UnixStream, runtime: Option<RuntimeInstance>) -> Arc<Self> {
        Arc::new(Conn {
            stream,
            runtime,
            inbox: tokio::sync::Mutex::new(Vec::new()),
            state: std::sync::Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ConnState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// May the next call be written on it? An idle connection the runtime hung up (it was
    /// restarted, or stopped) is retired here, so no call is charged with that.
    fn reusable(&self) -> bool {
        let mut s = self.lock();
        if s.retired || s.closed {
            return false;
        }
        if s.outstanding == 0 && self.hung_up() {
            s.retired = true;
            self.close(&mut s);
            return false;
        }
        true
    }

    /// Nothing is owed on this connection: anything readable is the runtime's hang-up.
    fn hung_up(&self) -> bool {
        let mut b = [std::mem::MaybeUninit::<u8>::uninit(); 1];
        // The descriptor is non-blocking (tokio's): WouldBlock means open and quiet.
        !matches!(socket2::SockRef::from(&self.stream).peek(&mut b), Err(e) if e.kind() == ErrorKind::WouldBlock)
    }

    fn begin(&self) {
        self.lock().outstanding += 1;
    }

    /// No more calls go on it: closed once the calls on it are answered, so the runtime
    /// (serving one connection at a time) moves on to the next.
    fn retire(&self) {
        let mut s = self.lock();
        s.retired = true;
        if s.outstanding == 0 {
            self.close(&mut s);
        }
    }

    /// A call on it finished. `usable` is false when the connection can carry nothing more
    /// (the runtime closes it after this answer, or it broke): it is closed now, and calls
    /// still queued on it see it closed.
    fn end(&self, usable: bool) {
        let mut s = self.lock();
        s.outstanding = s.outstanding.saturating_sub(1);
        if !usable {
            s.retired = true;
        }
        if !usable || (s.retired && s.outstanding == 0) {
            self.close(&mut s);
        }
    }

    fn close(&self, s: &mut ConnState) {
        if !s.closed {
            s.closed = true;
            // Both ways: a runtime still running this connection's handler sees the hang-up
            // (its abandonment watch) and exits.
            let _ = socket2::SockRef::from(&self.stream).shutdown(std::net::Shutdown::Both);
        }
    }

    async fn write_frame(&self, request: &[u8]) -> Result<(), CallError> {
        let len = u32::try_from(request.len())
            .ok()
            .filter(|n| *n as usize <= MAX_FRAME)
            .ok_or_else(|| {
                CallError::Protocol(format!(
                    "request of {} bytes exceeds {MAX_FRAME}",
                    request.len()
                ))
            })?;
        // One write for small requests: header and body in one system call.
        let written = if request.len() <= 64 * 1024 {
            let mut frame = Vec::with_capacity(4 + request.len());
            frame.extend_from_slice(&len.to_be_bytes());
            frame.extend_from_slice(request);
            write_all(&self.stream, &frame).await
        } else {
            match write_all(&self.stream, &len.to_be_bytes()).await {
                Ok(()) => write_all(&self.stream, request).await,
                Err(e) => Err(e),
            }
        };
        written.map_err(gone)
    }

    /// The next answer on this connection: (the answer, whether the runtime keeps the
    /// connection). The outer error is a broken connection; an answer that is not JSON
    /// leaves the frames in step.
    async fn read_answer(&self) -> Result<(Result<Value, CallError>, bool), CallError> {
        let mut buf = self.inbox.lock().await;
        loop {
            let mut want = READ_ROOM;
            if let [a, b, c, d, ..] = buf[..] {
                let head = u32::from_be_bytes([a, b, c, d]);
                let n = (head & !KEEP_ALIVE) as usize;
                if n > MAX_FRAME {
                    return Err(CallError::Protocol(format!(
                        "answer of {n} bytes exceeds {MAX_FRAME}"
                    )));
                }
                if buf.len() >= 4 + n {
                    let answer = serde_json::from_slice(&buf[4..4 + n])
                        .map_err(|e| CallError::Protocol(format!("answer is not JSON: {e}")));
                    buf.drain(..4 + n);
                    if buf.capacity() > KEEP_BUFFER && buf.len() < READ_ROOM {
                        buf.shrink_to(READ_ROOM);
                    }
                    return Ok((answer, head & KEEP_ALIVE != 0));
                }
                want = want.max(4 + n - buf.len());
            }
            buf.reserve(want);
            self.stream.readable().await.map_err(gone)?;
            match self.stream.try_read_buf(&mut *buf) {
                Ok(0) => return Err(CallError::Crashed),
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(gone(e)),
            }
        }
    }
}

async fn write_all(stream: &UnixStream, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        match stream.try_write(buf) {
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == ErrorKind::WouldBlock => stream.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What the calls are written in: held while a call picks its connection and writes, so
/// the order of the writes and the chain agree.
#[derive(Default)]
struct Order {
    /// Completion of the last call written.
    last: Option<oneshot::Receiver<()>>,
    /// The newest connection: the next call goes on it when the runtime keeps connections.
    tail: Option<Arc<Conn>>,
}

/// Order and blame bookkeeping shared by the clones of one client.
#[derive(Default)]
struct Pipeline {
    order: tokio::sync::Mutex<Order>,
    deaths: std::sync::Mutex<Deaths>,
    /// An answer said the runtime keeps connections open. Kept across its restarts: the
    /// kubelet restarts the same runtime file (a different one means a new pod).
    keeps_alive: AtomicBool,
}

struct Deaths {
    /// Sequence number of the next call written.
    next: u64,
    /// Calls numbered below this were written when a call was blamed for the runtime's
    /// death (or timed out, which makes the runtime exit): they never reached the handler.
    doomed_below: u64,
    /// Open from a blamed death until there is proof of a live runtime (an answer) or of
    /// the old one being gone (a doomed call saw it close): calls written meanwhile may
    /// still have reached the dying runtime.
    window: bool,
    /// The runtime instance whose death (or abandoned call) was last blamed on a call. A
    /// runtime dies once: a later call that reached the same instance and saw it go was
    /// written to it after the death was judged (e.g. on the kept-alive connection, once a
    /// requeued call had closed the window) and never reached its handler.
    blamed: Option<RuntimeInstance>,
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
            blamed: None,
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

/// How a written call ended.
enum Outcome {
    Answered(Result<Value, CallError>),
    /// The request could not be written: the runtime had hung up before it, so it never
    /// reached a handler.
    NotWritten(CallError),
    Failed(CallError),
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

    /// Which runtime instance listens there now (the socket file's identity).
    fn runtime_id(&self) -> Option<RuntimeInstance> {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&self.path).ok().map(|m| RuntimeInstance {
            dev: m.dev(),
            ino: m.ino(),
            ctime: m.ctime(),
            ctime_nsec: m.ctime_nsec(),
        })
    }

    /// Waits (up to `wait`) until the runtime at `dead` has been replaced: the socket file
    /// is another one, or gone. A call requeued because that runtime went away would
    /// otherwise reach it again while it exits (accepted, then closed unanswered) and be
    /// charged with a crash it had no part in.
    async fn replaced(&self, dead: Option<RuntimeInstance>, wait: Duration) {
        let Some(dead) = dead else { return };
        let deadline = tokio::time::Instant::now() + wait;
        while self.runtime_id() == Some(dead) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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

    /// The connection the next call goes on: the newest one while the runtime keeps
    /// connections, else a new one (the one it replaces is closed once answered).
    async fn connection(&self, order: &mut Order, wait: Duration) -> Result<Arc<Conn>, CallError> {
        if self.pipe.keeps_alive.load(Ordering::Relaxed)
            && let Some(c) = order.tail.as_ref().filter(|c| c.reusable())
        {
            return Ok(c.clone());
        }
        // Read before connecting: a runtime replaced in between is recorded as the old one,
        // which at worst makes a requeued call wait for a runtime it already has.
        let runtime = self.runtime_id();
        let c = Conn::new(self.connect(wait).await?, runtime);
        if let Some(old) = order.tail.replace(c.clone()) {
            old.retire();
        }
        Ok(c)
    }

    /// Sends one request and reads the answer; `timeout` bounds the handler, counted from
    /// when the runtime gets to this call. On timeout the connection is closed, which tells
    /// the runtime to exit so its supervisor restarts it (see asya_runtime.py). Calls may
    /// run concurrently: they are pipelined on the runtime in the order they are written.
    pub async fn call(
        &self,
        request: &[u8],
        timeout: Duration,
        wait: Duration,
    ) -> Result<Value, CallError> {
        let mut requeues = 0;
        // The runtime a requeued call was on: the next attempt waits for its successor.
        let mut requeued_off: Option<Option<RuntimeInstance>> = None;
        loop {
            if let Some(dead) = requeued_off.take() {
                self.replaced(dead, wait).await;
            }
            let (conn, written, seq, in_window, before, done) = {
                let mut order = self.pipe.order.lock().await;
                let conn = self.connection(&mut order, wait).await?;
                conn.begin();
                let written = conn.write_frame(request).await;
                let (done, rx) = oneshot::channel::<()>();
                let before = order.last.replace(rx);
                let mut d = self.deaths();
                let seq = d.next;
                d.next += 1;
                (conn, written, seq, d.window, before, done)
            };
            let outcome = self.exchange(&conn, written, timeout, before).await;
            let reached = conn.runtime;
            drop(conn);
            // Every call before this one has finished and been judged (exchange waited for
            // them), so the bookkeeping below is read in the order of the writes.
            let mut d = self.deaths();
            let result = match outcome {
                Outcome::NotWritten(e) if requeues < MAX_REQUEUES => {
                    drop(d);
                    drop(done);
                    requeues += 1;
                    tracing::debug!(error = %e, requeues, "runtime hung up before this call was written; calling again");
                    continue;
                }
                Outcome::NotWritten(e) | Outcome::Failed(e) => Err(e),
                Outcome::Answered(r) => r,
            };
            match result {
                Ok(v) => {
                    d.window = false;
                    drop(d);
                    drop(done);
                    return Ok(v);
                }
                Err(e)
                    if e.runtime_gone()
                        && (in_window
                            || seq < d.doomed_below
                            || (reached.is_some() && reached == d.blamed))
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
                    requeued_off = Some(reached);
                }
                Err(e) => {
                    if e.runtime_gone() || matches!(e, CallError::Timeout(_)) {
                        d.doomed_below = d.next;
                        d.window = true;
                        d.blamed = reached;
                    }
                    drop(d);
                    drop(done);
                    return Err(e);
                }
            }
        }
    }

    /// One call written on `conn`. It reads once `before` (the call written before it)
    /// has finished, and its timeout starts then; a failure is returned only after that,
    /// so callers judge failures in the order of the writes.
    async fn exchange(
        &self,
        conn: &Conn,
        written: Result<(), CallError>,
        timeout: Duration,
        before: Option<oneshot::Receiver<()>>,
    ) -> Outcome {
        if let Some(before) = before {
            let _ = before.await;
        }
        if let Err(e) = written {
            conn.end(false);
            return if e.runtime_gone() {
                Outcome::NotWritten(e)
            } else {
                Outcome::Failed(e)
            };
        }
        match tokio::time::timeout(timeout, conn.read_answer()).await {
            Ok(Ok((answer, keep))) => {
                if keep {
                    self.pipe.keeps_alive.store(true, Ordering::Relaxed);
                }
                conn.end(keep);
                Outcome::Answered(answer)
            }
            Ok(Err(e)) => {
                conn.end(false);
                Outcome::Failed(e)
            }
            Err(_) => {
                conn.end(false);
                Outcome::Failed(CallError::Timeout(timeout))
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
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

    /// One answered call on `runtime`: the client knows this runtime is alive.
    async fn alive(c: &RuntimeClient, runtime: &UnixListener) {
        let w = spawn_call(c, b"\"w\"", Duration::from_secs(10));
        let (mut s, _) = runtime.accept().await.unwrap();
        let req = read_req(&mut s).await;
        answer(&mut s, &req).await;
        assert_eq!(w.await.unwrap().unwrap(), serde_json::json!("w"));
    }

    #[tokio::test]
    async fn a_runtime_death_blames_only_the_call_it_served() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let first = UnixListener::bind(&path).unwrap();
        let c = RuntimeClient::new(&path);
        let call = |body| spawn_call(&c, body, Duration::from_secs(10));
        alive(&c, &first).await;
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

    /// Waits (no sleep) until the client has judged a death and a call queued on the dead
    /// runtime has since seen it close (the window is shut again).
    async fn death_judged_and_window_shut(c: &RuntimeClient) {
        loop {
            {
                let d = c.deaths();
                if d.blamed.is_some() && !d.window {
                    return;
                }
            }
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_call_reaching_the_dying_runtime_after_its_death_was_judged_is_not_blamed() {
        // CI saw it: the runtime dies in a's handler; b, queued behind a, is requeued (which
        // shuts the window); c arrives only then and reaches the dying process's listener
        // before it is gone. c never reached a handler: it goes to the next runtime.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let first = UnixListener::bind(&path).unwrap();
        let client = RuntimeClient::new(&path);
        let call = |body| spawn_call(&client, body, Duration::from_secs(10));
        alive(&client, &first).await;
        let a = call(b"\"a\"");
        connected(&client, 2).await;
        let b = call(b"\"b\"");
        connected(&client, 3).await;
        let (mut served, _) = first.accept().await.unwrap();
        assert_eq!(read_req(&mut served).await, b"\"a\"");
        drop(served);
        let (queued, _) = first.accept().await.unwrap();
        drop(queued);
        death_judged_and_window_shut(&client).await;
        // The dying runtime still holds its listener for a moment: c connects to it.
        let c = call(b"\"c\"");
        let (late, _) = first.accept().await.unwrap();
        connected(&client, 4).await;
        drop(late);
        drop(first);
        std::fs::remove_file(&path).unwrap();
        let second = UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = second.accept().await {
                let req = read_req(&mut s).await;
                answer(&mut s, &req).await;
            }
        });
        assert!(matches!(a.await.unwrap(), Err(CallError::Crashed)));
        assert_eq!(b.await.unwrap().unwrap(), serde_json::json!("b"));
        assert_eq!(c.await.unwrap().unwrap(), serde_json::json!("c"));
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

    /// A runtime that keeps connections: answers every frame on its connection (with the
    /// keep-alive bit) until the sidecar closes it, then takes the next; counts connections.
    fn keeping_runtime(
        listener: UnixListener,
        hold: Option<&'static [u8]>,
    ) -> Arc<std::sync::atomic::AtomicUsize> {
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                loop {
                    let mut head = [0u8; 4];
                    if s.read_exact(&mut head).await.is_err() {
                        break;
                    }
                    let mut b = vec![0; u32::from_be_bytes(head) as usize];
                    s.read_exact(&mut b).await.unwrap();
                    if Some(&b[..]) == hold {
                        // A handler that never returns: waits for the sidecar to hang up
                        // (requests written behind this one stay unread).
                        let _ = s.read_to_end(&mut Vec::new()).await;
                        break;
                    }
                    let mut frame = ((b.len() as u32) | KEEP_ALIVE).to_be_bytes().to_vec();
                    frame.extend_from_slice(&b);
                    if s.write_all(&frame).await.is_err() {
                        break;
                    }
                }
            }
        });
        accepted
    }

    #[tokio::test]
    async fn a_runtime_that_keeps_connections_gets_every_call_on_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let accepted = keeping_runtime(UnixListener::bind(&path).unwrap(), None);
        let c = RuntimeClient::new(&path);
        let first = c.call(b"0", Duration::from_secs(5), Duration::ZERO).await;
        assert_eq!(first.unwrap(), serde_json::json!(0));
        // Pipelined: twenty calls at once, each answered with its own request.
        let calls: Vec<_> = (1..=20)
            .map(|i: u32| {
                let c = c.clone();
                tokio::spawn(async move {
                    let body = i.to_string();
                    let v = c
                        .call(body.as_bytes(), Duration::from_secs(5), Duration::ZERO)
                        .await;
                    (i, v)
                })
            })
            .collect();
        for call in calls {
            let (i, v) = call.await.unwrap();
            assert_eq!(v.unwrap(), serde_json::json!(i));
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one connection for all calls"
        );
    }

    #[tokio::test]
    async fn an_idle_connection_the_runtime_closed_is_replaced_without_a_charge() {
        // The runtime restarted (or stopped) between two calls: its side of the kept
        // connection is closed. The next call goes on a new connection and succeeds.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let c = RuntimeClient::new(&path);
        let first = spawn_call(&c, b"1", Duration::from_secs(5));
        let (mut s, _) = listener.accept().await.unwrap();
        let req = read_req(&mut s).await;
        let mut frame = ((req.len() as u32) | KEEP_ALIVE).to_be_bytes().to_vec();
        frame.extend_from_slice(&req);
        s.write_all(&frame).await.unwrap();
        assert_eq!(first.await.unwrap().unwrap(), serde_json::json!(1));
        drop(s);
        let accepted = keeping_runtime(listener, None);
        let v = c.call(b"2", Duration::from_secs(5), Duration::ZERO).await;
        assert_eq!(v.unwrap(), serde_json::json!(2));
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_timeout_on_a_kept_connection_spares_the_calls_behind_it() {
        // Calls a, b, d are written on one kept connection; a's handler hangs past the
        // timeout. The connection is closed (the runtime would exit); b and d never reached
        // a handler and are made again on a new connection.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let accepted = keeping_runtime(UnixListener::bind(&path).unwrap(), Some(b"\"a\""));
        let c = RuntimeClient::new(&path);
        let w = c
            .call(b"\"w\"", Duration::from_secs(5), Duration::ZERO)
            .await;
        assert_eq!(w.unwrap(), serde_json::json!("w"));
        let a = spawn_call(&c, b"\"a\"", Duration::from_millis(300));
        connected(&c, 2).await;
        let b = spawn_call(&c, b"\"b\"", Duration::from_secs(5));
        connected(&c, 3).await;
        let d = spawn_call(&c, b"\"d\"", Duration::from_secs(5));
        let a = a.await.unwrap();
        assert!(matches!(a, Err(CallError::Timeout(_))), "{a:?}");
        assert_eq!(b.await.unwrap().unwrap(), serde_json::json!("b"));
        assert_eq!(d.await.unwrap().unwrap(), serde_json::json!("d"));
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_runtime_that_closes_after_each_answer_gets_a_connection_per_call() {
        // The original contract: one connection per envelope, the answer's length without
        // the keep-alive bit. Pipelined calls each get their own connection, in order.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                let req = read_req(&mut s).await;
                answer(&mut s, &req).await;
            }
        });
        let c = RuntimeClient::new(&path);
        let calls: Vec<_> = (0..10u32)
            .map(|i| {
                let c = c.clone();
                tokio::spawn(async move {
                    let body = i.to_string();
                    c.call(body.as_bytes(), Duration::from_secs(5), Duration::ZERO)
                        .await
                        .map(|v| (i, v))
                })
            })
            .collect();
        for call in calls {
            let (i, v) = call.await.unwrap().unwrap();
            assert_eq!(v, serde_json::json!(i));
        }
        let again = c.call(b"10", Duration::from_secs(5), Duration::ZERO).await;
        assert_eq!(again.unwrap(), serde_json::json!(10));
        assert_eq!(accepted.load(Ordering::SeqCst), 11);
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
