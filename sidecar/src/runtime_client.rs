//! The sidecar's side of the runtime socket: one connection per envelope, each frame a
//! 4-byte big-endian length then JSON (DESIGN.md §4).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// Refuse absurd answers instead of allocating whatever a broken peer claims.
pub const MAX_FRAME: usize = 256 * 1024 * 1024;

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
}

#[derive(Debug, Clone)]
pub struct RuntimeClient {
    path: PathBuf,
}

impl RuntimeClient {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        RuntimeClient { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
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

    /// Sends one request and reads the answer. On timeout the connection is dropped, which
    /// tells the runtime to exit so its supervisor restarts it (see asya_runtime.py).
    pub async fn call(
        &self,
        request: &[u8],
        timeout: Duration,
        wait: Duration,
    ) -> Result<Value, CallError> {
        let mut stream = self.connect(wait).await?;
        let exchange = async {
            let len = u32::try_from(request.len())
                .map_err(|_| CallError::Protocol("request larger than 4 GiB".into()))?;
            stream.write_all(&len.to_be_bytes()).await?;
            stream.write_all(request).await?;
            stream.flush().await?;
            let mut head = [0u8; 4];
            match stream.read_exact(&mut head).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return Err(CallError::Crashed);
                }
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return Err(CallError::Crashed);
                }
                Err(e) => return Err(e.into()),
            }
            let n = u32::from_be_bytes(head) as usize;
            if n > MAX_FRAME {
                return Err(CallError::Protocol(format!(
                    "answer of {n} bytes exceeds {MAX_FRAME}"
                )));
            }
            let mut body = vec![0u8; n];
            stream.read_exact(&mut body).await.map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    CallError::Crashed
                } else {
                    e.into()
                }
            })?;
            serde_json::from_slice(&body)
                .map_err(|e| CallError::Protocol(format!("answer is not JSON: {e}")))
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err(CallError::Timeout(timeout)),
        }
    }
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
        serve_once(path.clone(), |mut s| async move {
            read_req(&mut s).await;
            drop(s);
        })
        .await;
        let c = RuntimeClient::new(&path);
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
}
