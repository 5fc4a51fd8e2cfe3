//! A rustls certificate resolver whose certificate can be swapped at run time, and a file
//! watcher that swaps it when `tls.crt`/`tls.key` change (cert-manager, kubelet secret
//! projection, or `certs generate`). Open connections keep the certificate they negotiated;
//! only new handshakes see the new one, so a reload never drops a connection.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::CertError;
use crate::generate::{CertInfo, cert_info};

/// Parse a PEM chain and key into a rustls `CertifiedKey` (ring provider), checking that the
/// key belongs to the certificate.
pub fn certified_key_from_pem(
    cert_pem: &str,
    key_pem: &str,
) -> Result<(Arc<CertifiedKey>, CertInfo), CertError> {
    let chain: Vec<_> = rustls_pemfile::certs(&mut cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| CertError::Parse(format!("certificate PEM: {e}")))?;
    if chain.is_empty() {
        return Err(CertError::Parse(
            "no CERTIFICATE block in certificate file".into(),
        ));
    }
    let key = rustls_pemfile::private_key(&mut key_pem.as_bytes())
        .map_err(|e| CertError::Parse(format!("key PEM: {e}")))?
        .ok_or_else(|| CertError::Parse("no PRIVATE KEY block in key file".into()))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| CertError::Parse(format!("private key: {e}")))?;
    let ck = CertifiedKey::new(chain, signing);
    // A mismatched pair would fail every handshake; refuse it and keep the old one.
    ck.keys_match()
        .map_err(|e| CertError::Parse(format!("key does not match certificate: {e}")))?;
    let info = cert_info(cert_pem)?;
    Ok((Arc::new(ck), info))
}

struct Loaded {
    key: Arc<CertifiedKey>,
    info: CertInfo,
}

/// The server's certificate slot. Cheap to read on every handshake.
pub struct ReloadingResolver {
    current: RwLock<Option<Loaded>>,
    generation: watch::Sender<u64>,
}

impl std::fmt::Debug for ReloadingResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingResolver")
            .field("generation", &*self.generation.borrow())
            .field("loaded", &self.is_loaded())
            .finish()
    }
}

impl Default for ReloadingResolver {
    fn default() -> Self {
        Self::new()
    }
}

impl ReloadingResolver {
    /// An empty slot: handshakes fail until a certificate is set.
    pub fn new() -> Self {
        Self {
            current: RwLock::new(None),
            generation: watch::channel(0).0,
        }
    }

    /// Replace the certificate. New handshakes use it from now on.
    pub fn set_pem(&self, cert_pem: &str, key_pem: &str) -> Result<CertInfo, CertError> {
        let (key, info) = certified_key_from_pem(cert_pem, key_pem)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some(Loaded {
            key,
            info: info.clone(),
        });
        self.generation.send_modify(|g| *g += 1);
        tracing::info!(subject = %info.subject, not_after = ?info.not_after, "serving certificate loaded");
        Ok(info)
    }

    /// Load from files (read once each).
    pub fn load_files(&self, cert: &Path, key: &Path) -> Result<CertInfo, CertError> {
        let c = read(cert)?;
        let k = read(key)?;
        self.set_pem(&c, &k)
    }

    pub fn is_loaded(&self) -> bool {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Facts about the loaded certificate (for the expiry metric).
    pub fn info(&self) -> Option<CertInfo> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|l| l.info.clone())
    }

    /// Seconds until the loaded certificate expires (negative once expired).
    pub fn expiry_seconds(&self, now: SystemTime) -> Option<i64> {
        self.info().map(|i| match i.not_after.duration_since(now) {
            Ok(d) => d.as_secs() as i64,
            Err(e) => -(e.duration().as_secs() as i64),
        })
    }

    /// A receiver that changes every time a certificate is loaded: wait on it instead of
    /// sleeping.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    pub fn generation(&self) -> u64 {
        *self.generation.borrow()
    }
}

impl ResolvesServerCert for ReloadingResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|l| l.key.clone())
    }
}

fn read(p: &Path) -> Result<String, CertError> {
    std::fs::read_to_string(p).map_err(|e| CertError::Io(p.display().to_string(), e))
}

/// A rustls server config (ring provider, TLS 1.2 and 1.3, ALPN h2 + http/1.1) using `resolver`.
pub fn server_config(resolver: Arc<ReloadingResolver>) -> Result<rustls::ServerConfig, CertError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| CertError::Parse(format!("TLS config: {e}")))?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

/// Polls `cert` and `key` and reloads `resolver` when their content changes. Polling (rather
/// than inotify) survives the symlink swaps kubelet does for projected Secrets, and costs two
/// small reads per interval.
#[derive(Debug)]
pub struct FileWatcher {
    cert: PathBuf,
    key: PathBuf,
    last: Option<[u8; 32]>,
}

impl FileWatcher {
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        Self {
            cert: cert.into(),
            key: key.into(),
            last: None,
        }
    }

    /// One poll: reload when the pair changed and parses; a broken pair is logged once and the
    /// old certificate kept. Returns whether a new certificate was loaded.
    pub fn poll(&mut self, resolver: &ReloadingResolver) -> bool {
        let (Ok(c), Ok(k)) = (std::fs::read(&self.cert), std::fs::read(&self.key)) else {
            return false;
        };
        let mut h = Sha256::new();
        h.update(&c);
        h.update([0u8]);
        h.update(&k);
        let digest: [u8; 32] = h.finalize().into();
        if self.last == Some(digest) {
            return false;
        }
        // Remember even a bad pair so it is reported once, not every interval.
        self.last = Some(digest);
        let (Ok(c), Ok(k)) = (String::from_utf8(c), String::from_utf8(k)) else {
            tracing::warn!(cert = %self.cert.display(), "certificate files are not UTF-8 PEM; keeping the current certificate");
            return false;
        };
        match resolver.set_pem(&c, &k) {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(error = %e, cert = %self.cert.display(), "new certificate files rejected; keeping the current certificate");
                false
            }
        }
    }

    /// Poll forever on the tokio runtime.
    pub fn spawn(
        mut self,
        resolver: Arc<ReloadingResolver>,
        interval: Duration,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                self.poll(&resolver);
            }
        })
    }
}
