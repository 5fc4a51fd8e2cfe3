//! A minimal HTTPS client over one keep-alive connection (HTTP/1.1 or h2), trusting only a
//! given CA: used by the TLS tests and the benchmark to talk to the server as the API server
//! would.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

enum Sender {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

pub struct Conn {
    sender: Sender,
    /// The protocol ALPN chose.
    pub alpn: Option<Vec<u8>>,
    /// DER of the certificate the server presented.
    pub peer_cert: Vec<u8>,
}

pub fn connector(ca_pem: &str, alpn: &[&[u8]]) -> anyhow::Result<TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(c?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(TlsConnector::from(Arc::new(cfg)))
}

impl Conn {
    /// Connect to `addr` as `name`; `h2` chooses HTTP/2 through ALPN.
    pub async fn connect(
        addr: SocketAddr,
        name: &str,
        ca_pem: &str,
        h2: bool,
    ) -> anyhow::Result<Self> {
        let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let tls = connector(ca_pem, alpn)?
            .connect(ServerName::try_from(name.to_string())?, tcp)
            .await?;
        let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
        let peer_cert = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| c.as_ref().to_vec())
            .unwrap_or_default();
        let io = TokioIo::new(tls);
        let sender = if alpn.as_deref() == Some(b"h2") {
            let (s, conn) = http2::handshake(TokioExecutor::new(), io).await?;
            tokio::spawn(conn);
            Sender::H2(s)
        } else {
            let (s, conn) = http1::handshake(io).await?;
            tokio::spawn(conn);
            Sender::H1(s)
        };
        Ok(Self {
            sender,
            alpn,
            peer_cert,
        })
    }

    /// One request; returns status and body.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Bytes,
    ) -> anyhow::Result<(u16, Bytes)> {
        // h2 wants an absolute URI (:scheme, :authority); HTTP/1.1 an origin-form path.
        let uri = match self.sender {
            Sender::H1(_) => path.to_string(),
            Sender::H2(_) => format!("https://localhost{path}"),
        };
        let req = hyper::Request::builder()
            .method(method)
            .uri(uri)
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(body))?;
        let resp = match &mut self.sender {
            Sender::H1(s) => {
                s.ready().await?;
                s.send_request(req).await?
            }
            Sender::H2(s) => {
                s.ready().await?;
                s.send_request(req).await?
            }
        };
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }
}
