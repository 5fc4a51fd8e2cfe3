//! `asya-state-proxy --probe`: GET /healthz on CONNECTOR_SOCKET, exit 0 if it answers 200.
//! Kubernetes probes speak HTTP over TCP only and the image has no shell, so a startup or
//! readiness probe of a connector is this exec probe.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// True for an HTTP/1.x status line of 200.
pub fn is_ok_status_line(head: &[u8]) -> bool {
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let mut parts = line.split(|b| *b == b' ');
    matches!(
        (parts.next(), parts.next()),
        (Some(b"HTTP/1.1" | b"HTTP/1.0"), Some(b"200"))
    )
}

/// One request, bounded by `timeout`: Ok(()) when the connector answers 200.
pub async fn probe(socket: &Path, timeout: Duration) -> Result<(), String> {
    let ask = async {
        let mut s = tokio::net::UnixStream::connect(socket)
            .await
            .map_err(|e| format!("connecting to {}: {e}", socket.display()))?;
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .map_err(|e| e.to_string())?;
        let mut head = [0u8; 64];
        let n = s.read(&mut head).await.map_err(|e| e.to_string())?;
        if is_ok_status_line(&head[..n]) {
            Ok(())
        } else {
            Err(format!(
                "answered {:?}",
                String::from_utf8_lossy(&head[..n])
            ))
        }
    };
    tokio::time::timeout(timeout, ask)
        .await
        .map_err(|_| format!("no answer within {} s", timeout.as_secs()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert!(is_ok_status_line(b"HTTP/1.1 200 OK\r\ncontent-length: 2"));
        assert!(!is_ok_status_line(b"HTTP/1.1 503 Service Unavailable\r\n"));
        assert!(!is_ok_status_line(b""));
        assert!(!is_ok_status_line(b"SSH-2.0"));
    }
}
