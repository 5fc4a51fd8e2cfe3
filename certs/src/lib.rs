//! asya-certs: the webhook's TLS material.
//!
//! - [`generate`]: a CA and a serving certificate signed by it (`asya-webhook certs generate`);
//! - [`reload`]: a rustls resolver whose certificate is swapped without a restart, fed by a
//!   file watcher (cert-manager / file mode) or by the self-managed cycle;
//! - [`manage`]: self-managed mode — pure rotation decisions plus a small I/O trait;
//! - [`kube_backend`]: that trait on a real cluster (a Secret and the webhook configurations).

pub mod generate;
pub mod kube_backend;
pub mod manage;
pub mod reload;

pub use generate::{
    CertInfo, PemPair, ServingSpec, cert_info, generate_ca, issue_serving, write_dir,
};
pub use manage::{ManagedConfig, Plan, StoredCerts, ensure};
pub use reload::{FileWatcher, ReloadingResolver, server_config};

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("certificate generation: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{0}")]
    Parse(String),
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    #[error("a serving certificate needs at least one DNS name or IP address")]
    NoNames,
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}
