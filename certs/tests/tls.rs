//! Real TLS over loopback: a client trusting only the generated CA, and hot rotation.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use asya_certs::{
    FileWatcher, ReloadingResolver, ServingSpec, generate_ca, issue_serving, server_config,
    write_dir,
};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector, client::TlsStream};

const DAY: Duration = Duration::from_secs(86_400);

fn spec() -> ServingSpec {
    ServingSpec::new(["localhost".to_string()], ["127.0.0.1".parse().unwrap()])
}

/// An echo server over TLS: every line is sent back.
async fn start_server(resolver: Arc<ReloadingResolver>) -> std::net::SocketAddr {
    let acceptor = TlsAcceptor::from(Arc::new(server_config(resolver).unwrap()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let (r, mut w) = tokio::io::split(tls);
                let mut lines = BufReader::new(r).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if w.write_all(format!("{line}\n").as_bytes()).await.is_err() {
                        return;
                    }
                    let _ = w.flush().await;
                }
            });
        }
    });
    addr
}

fn connector(ca_pem: &str) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    TlsConnector::from(Arc::new(cfg))
}

async fn connect(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    name: &str,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    connector(ca_pem)
        .connect(ServerName::try_from(name.to_string()).unwrap(), tcp)
        .await
}

async fn echo(s: &mut TlsStream<TcpStream>, msg: &str) -> String {
    s.write_all(format!("{msg}\n").as_bytes()).await.unwrap();
    s.flush().await.unwrap();
    let mut buf = Vec::new();
    loop {
        let mut b = [0u8; 1];
        tokio::io::AsyncReadExt::read_exact(s, &mut b)
            .await
            .unwrap();
        if b[0] == b'\n' {
            break;
        }
        buf.push(b[0]);
    }
    String::from_utf8(buf).unwrap()
}

fn peer_leaf(s: &TlsStream<TcpStream>) -> CertificateDer<'static> {
    s.get_ref().1.peer_certificates().unwrap()[0]
        .clone()
        .into_owned()
}

fn pem_der(pem: &str) -> CertificateDer<'static> {
    rustls_pemfile::certs(&mut pem.as_bytes())
        .next()
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn client_trusting_only_the_ca_connects_and_others_fail() {
    let now = SystemTime::now();
    let ca = generate_ca("test CA", now, 10 * DAY).unwrap();
    let srv = issue_serving(&ca, &spec(), now, DAY).unwrap();
    let resolver = Arc::new(ReloadingResolver::new());
    resolver.set_pem(&srv.cert_pem, &srv.key_pem).unwrap();
    let addr = start_server(resolver).await;

    for name in ["localhost", "127.0.0.1"] {
        let mut s = connect(addr, &ca.cert_pem, name).await.unwrap();
        assert_eq!(echo(&mut s, "hello").await, "hello");
        assert_eq!(peer_leaf(&s), pem_der(&srv.cert_pem));
    }
    // A client trusting another CA refuses the server.
    let other = generate_ca("other", now, DAY).unwrap();
    assert!(connect(addr, &other.cert_pem, "localhost").await.is_err());
    // A name not in the certificate is refused.
    assert!(
        connect(addr, &ca.cert_pem, "not-in-cert.example")
            .await
            .is_err()
    );
}

#[tokio::test]
async fn empty_resolver_fails_handshake_without_panicking() {
    let resolver = Arc::new(ReloadingResolver::new());
    let addr = start_server(resolver.clone()).await;
    let ca = generate_ca("ca", SystemTime::now(), DAY).unwrap();
    assert!(connect(addr, &ca.cert_pem, "localhost").await.is_err());
    assert!(!resolver.is_loaded());
}

#[tokio::test]
async fn files_replaced_new_connections_get_new_cert_open_ones_keep_working() {
    let dir = tempfile::tempdir().unwrap();
    let now = SystemTime::now();
    let ca1 = generate_ca("CA one", now, 10 * DAY).unwrap();
    let srv1 = issue_serving(&ca1, &spec(), now, DAY).unwrap();
    write_dir(dir.path(), &ca1, &srv1).unwrap();

    let resolver = Arc::new(ReloadingResolver::new());
    let mut gen_rx = resolver.subscribe();
    let _watcher = FileWatcher::new(dir.path().join("tls.crt"), dir.path().join("tls.key"))
        .spawn(resolver.clone(), Duration::from_millis(20));
    gen_rx.wait_for(|g| *g >= 1).await.unwrap();
    let addr = start_server(resolver.clone()).await;

    let mut open = connect(addr, &ca1.cert_pem, "localhost").await.unwrap();
    assert_eq!(echo(&mut open, "before").await, "before");
    assert_eq!(peer_leaf(&open), pem_der(&srv1.cert_pem));

    // Rotate to a different CA entirely (the hardest case for clients).
    let ca2 = generate_ca("CA two", now, 10 * DAY).unwrap();
    let srv2 = issue_serving(&ca2, &spec(), now, DAY).unwrap();
    write_dir(dir.path(), &ca2, &srv2).unwrap();
    tokio::time::timeout(Duration::from_secs(10), gen_rx.wait_for(|g| *g >= 2))
        .await
        .expect("watcher did not pick up the new files")
        .unwrap();

    let mut fresh = connect(addr, &ca2.cert_pem, "localhost").await.unwrap();
    assert_eq!(peer_leaf(&fresh), pem_der(&srv2.cert_pem));
    assert_eq!(echo(&mut fresh, "new").await, "new");
    // The old CA no longer validates new connections...
    assert!(connect(addr, &ca1.cert_pem, "localhost").await.is_err());
    // ...but the connection opened before the rotation keeps working.
    assert_eq!(echo(&mut open, "after").await, "after");

    // A broken pair (key from another cert) is rejected and the current cert kept.
    let srv3 = issue_serving(&ca2, &spec(), now, DAY).unwrap();
    std::fs::write(dir.path().join("tls.key"), &srv3.key_pem).unwrap();
    let mut w = FileWatcher::new(dir.path().join("tls.crt"), dir.path().join("tls.key"));
    assert!(!w.poll(&resolver));
    let mut again = connect(addr, &ca2.cert_pem, "localhost").await.unwrap();
    assert_eq!(peer_leaf(&again), pem_der(&srv2.cert_pem));
    assert_eq!(echo(&mut again, "still").await, "still");
}
