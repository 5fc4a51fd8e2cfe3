//! `asya-webhook serve`: wiring of configuration, certificates, caches and the servers.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use asya_api::config::ClusterConfig;
use asya_api::flavor::FlavorCatalog;
use asya_certs::kube_backend::KubeBackend;
use asya_certs::{FileWatcher, ManagedConfig, ReloadingResolver, ServingSpec};

use crate::authority::{KubeAuthority, RememberedAccess};
use crate::cache;
use crate::server::{self, Metrics, Shared};
use crate::sources::{Allowlist, SourceGate};

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// TLS listen address of the admission endpoints.
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub addr: SocketAddr,
    /// Serving certificate (file mode; reloaded when the file changes).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Plain-HTTP address of /metrics.
    #[arg(long, default_value = "0.0.0.0:9090")]
    pub metrics_addr: SocketAddr,
    /// Cluster configuration YAML (docs/DESIGN.md §7); the built-in default when absent.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Kubeconfig; in-cluster configuration when absent.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Self-managed certificates: keep them in this Secret (NAMESPACE/NAME), publish caBundle,
    /// rotate before expiry. Used instead of --tls-cert/--tls-key.
    #[arg(long, conflicts_with = "tls_cert")]
    pub self_managed_secret: Option<String>,
    /// DNS names of the serving certificate in self-managed mode (the Service's names).
    #[arg(long = "service-dns")]
    pub service_dns: Vec<String>,
    /// MutatingWebhookConfigurations whose caBundle is managed (repeatable).
    #[arg(long = "mutating-webhook-config")]
    pub mutating_webhook_configs: Vec<String>,
    /// ValidatingWebhookConfigurations whose caBundle is managed (repeatable).
    #[arg(long = "validating-webhook-config")]
    pub validating_webhook_configs: Vec<String>,
    /// Native sidecars: auto (by API server version, 1.29+), always or never.
    #[arg(long, default_value = "auto", value_parser = ["auto", "always", "never"])]
    pub native_sidecar: String,
    /// How often certificate files are checked for changes.
    #[arg(long, default_value = "5s", value_parser = parse_secs)]
    pub cert_poll_interval: Duration,
    /// Self-managed mode: how often the Secret and both caBundles are checked (three GETs).
    #[arg(long, default_value = "60s", value_parser = parse_secs)]
    pub self_managed_check_interval: Duration,
    /// Admission reviews handled at once; past it a request is answered 429 at once (shed).
    #[arg(long, default_value_t = server::DEFAULT_MAX_IN_FLIGHT, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_in_flight: usize,
    /// Largest AdmissionReview body read, in bytes; a larger one is answered 413.
    #[arg(long, default_value_t = server::DEFAULT_MAX_BODY, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_body_bytes: usize,
    /// Peers allowed to connect to the admission port: the API server's addresses (CIDRs or
    /// addresses; repeatable, or comma-separated). Others are closed before the TLS
    /// handshake and counted. Empty: any peer (probes use the metrics port either way).
    #[arg(long = "allowed-source-cidrs", value_delimiter = ',')]
    pub allowed_source_cidrs: Vec<String>,
    /// At SIGTERM: stop accepting, send GOAWAY on every HTTP/2 connection, and let the
    /// reviews under way finish for at most this long before exiting.
    #[arg(long, default_value = "10s", value_parser = parse_secs)]
    pub drain_timeout: Duration,
}

fn parse_secs(s: &str) -> Result<Duration, String> {
    asya_api::duration::parse_duration(s).map_err(|e| e.to_string())
}

pub fn load_config(path: Option<&PathBuf>) -> anyhow::Result<ClusterConfig> {
    let Some(p) = path else {
        return Ok(ClusterConfig::default());
    };
    let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    let cfg = ClusterConfig::from_yaml(&text).with_context(|| format!("in {}", p.display()))?;
    Ok(cfg)
}

async fn client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<kube::Client> {
    let cfg = match kubeconfig {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p)?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    Ok(kube::Client::try_from(cfg)?)
}

/// Native sidecars need Kubernetes 1.29 (SidecarContainers on by default).
pub fn supports_native_sidecar(major: &str, minor: &str) -> bool {
    let num = |s: &str| s.trim_end_matches('+').parse::<u32>().unwrap_or(0);
    let (ma, mi) = (num(major), num(minor));
    ma > 1 || (ma == 1 && mi >= 29)
}

async fn self_managed(
    client: kube::Client,
    spec: &str,
    args: &ServeArgs,
    resolver: Arc<ReloadingResolver>,
) -> anyhow::Result<()> {
    let (ns, name) = spec
        .split_once('/')
        .context("--self-managed-secret must be NAMESPACE/NAME")?;
    anyhow::ensure!(
        !args.service_dns.is_empty(),
        "--service-dns is required in self-managed mode"
    );
    let backend = KubeBackend::new(
        client,
        ns,
        name,
        args.mutating_webhook_configs.clone(),
        args.validating_webhook_configs.clone(),
    );
    let cfg = ManagedConfig::new(ServingSpec::new(args.service_dns.clone(), []));
    let install = move |e: &asya_certs::manage::Ensured| -> anyhow::Result<()> {
        let s = e
            .certs
            .serving
            .as_ref()
            .context("no serving certificate after ensure")?;
        resolver.set_pem(&s.cert_pem, &s.key_pem)?;
        Ok(())
    };
    let first = asya_certs::ensure(&backend, &cfg, SystemTime::now()).await?;
    tracing::info!(plan = ?first.plan, patched = first.patched, "self-managed certificates ready");
    install(&first)?;
    // (A zero period would panic `interval`.)
    let every = args.self_managed_check_interval.max(Duration::from_secs(1));
    tokio::spawn(async move {
        // Every minute by default: renewal margins are days, but a caBundle lost to a
        // re-created webhook configuration (helm upgrade --force, GitOps) or one created
        // after this pod started must be published within a minute, not an hour.
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        loop {
            tick.tick().await;
            match asya_certs::ensure(&backend, &cfg, SystemTime::now()).await {
                Ok(e) => {
                    if e.plan != asya_certs::Plan::Reuse || e.patched > 0 {
                        tracing::info!(plan = ?e.plan, patched = e.patched, "certificates rotated");
                    }
                    if let Err(err) = install(&e) {
                        tracing::error!(error = %err, "cannot load rotated certificate");
                    }
                }
                Err(err) => tracing::error!(error = %err, "certificate check failed"),
            }
        }
    });
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutting down");
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = Arc::new(load_config(args.config.as_ref())?);
    let sources = Allowlist::parse(&args.allowed_source_cidrs)?;
    let client = client(args.kubeconfig.as_ref())
        .await
        .context("connecting to the API server")?;
    let native = match args.native_sidecar.as_str() {
        "always" => true,
        "never" => false,
        _ => match client.apiserver_version().await {
            Ok(v) => config.sidecar.native && supports_native_sidecar(&v.major, &v.minor),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the server version; injecting regular sidecar containers");
                false
            }
        },
    };
    let resolver = Arc::new(ReloadingResolver::new());
    match (&args.tls_cert, &args.tls_key, &args.self_managed_secret) {
        (Some(c), Some(k), _) => {
            let mut watcher = FileWatcher::new(c, k);
            if !watcher.poll(&resolver) {
                // Not fatal: cert-manager may write the files shortly; /readyz says why.
                tracing::warn!(cert = %c.display(), "certificate files not loadable yet");
            }
            watcher.spawn(resolver.clone(), args.cert_poll_interval);
        }
        (_, _, Some(secret)) => {
            self_managed(client.clone(), secret, &args, resolver.clone()).await?
        }
        _ => anyhow::bail!("give --tls-cert and --tls-key, or --self-managed-secret"),
    }

    let actors_store = Arc::new(std::sync::OnceLock::<cache::Caches>::new());
    let sizes_store = actors_store.clone();
    let lookup = Arc::new(LazyActors(actors_store.clone()));
    let shared = Arc::new(Shared {
        config,
        catalog: RwLock::new(Arc::new(FlavorCatalog::new())),
        actors: lookup,
        cache_sizes: Box::new(move || sizes_store.get().map(|c| c.sizes()).unwrap_or_default()),
        synced: AtomicBool::new(false),
        native_sidecar: native,
        resolver: resolver.clone(),
        metrics: Metrics::new(),
        settings_memo: Default::default(),
        authority: Arc::new(RememberedAccess::new(KubeAuthority::new(client.clone()))),
        traces: crate::spans::Traces::new(&asya_api::trace_context::TraceSettings::from_lookup(
            &|k| std::env::var(k).ok(),
        ))?,
        limits: server::Limits::new(args.max_in_flight, args.max_body_bytes),
    });
    let caches = cache::start(client, shared.clone()).await;
    let _ = actors_store.set(caches);

    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .with_context(|| format!("binding {}", args.addr))?;
    let allowed: Vec<String> = sources.nets().iter().map(ToString::to_string).collect();
    tracing::info!(
        addr = %args.addr,
        metrics = %args.metrics_addr,
        native_sidecar = native,
        max_in_flight = args.max_in_flight,
        max_body_bytes = args.max_body_bytes,
        allowed_sources = if allowed.is_empty() { "any".to_string() } else { allowed.join(",") },
        "asya-webhook serving"
    );
    let metrics = tokio::spawn(server::serve_metrics(args.metrics_addr, shared.clone()));
    let gate = SourceGate::new(sources, shared.metrics.refused_connections.clone());
    let result = server::serve_tls_from(
        listener,
        server::router(shared.clone()),
        resolver,
        Arc::new(gate),
        shutdown_signal(),
        args.drain_timeout,
    )
    .await;
    metrics.abort();
    // The last admissions' spans, before the process goes; the flush blocks, and its posts
    // need this runtime.
    let flush = tokio::task::spawn_blocking(move || {
        shared.traces.shutdown(std::time::Duration::from_secs(5))
    });
    let _ = flush.await;
    result
}

/// The actor lookup, available once the caches have started.
struct LazyActors(Arc<std::sync::OnceLock<cache::Caches>>);

impl crate::admission::ActorLookup for LazyActors {
    fn get(&self, namespace: &str, name: &str) -> Option<serde_json::Value> {
        let c = self.0.get()?;
        c.actor_store().get(namespace, name)
    }

    fn get_versioned(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<(serde_json::Value, Option<String>)> {
        let c = self.0.get()?;
        c.actor_store().get_versioned(namespace, name)
    }

    fn version(&self, namespace: &str, name: &str) -> Option<String> {
        let c = self.0.get()?;
        c.actor_store().version(namespace, name)
    }

    fn holders_in(
        &self,
        namespaces: &std::collections::BTreeSet<String>,
    ) -> Vec<crate::admission::collision::Holder> {
        match self.0.get() {
            Some(c) => c.actor_store().holders_in(namespaces),
            None => Vec::new(),
        }
    }

    fn claims_of(
        &self,
        queues: &std::collections::BTreeSet<String>,
    ) -> Vec<(String, asya_api::queue_claim::QueueClaimSpec)> {
        match self.0.get() {
            Some(c) => c.actor_store().claims_of(queues),
            None => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: super::ServeArgs,
    }

    #[test]
    fn limits_and_sources_have_defaults_and_take_lists() {
        let a = Cli::try_parse_from(["x"]).unwrap().serve;
        assert_eq!(a.max_in_flight, crate::server::DEFAULT_MAX_IN_FLIGHT);
        assert_eq!(a.max_body_bytes, 1024 * 1024);
        assert!(a.allowed_source_cidrs.is_empty());
        assert_eq!(a.drain_timeout, crate::server::DEFAULT_DRAIN);
        let a = Cli::try_parse_from([
            "x",
            "--max-in-flight=8",
            "--max-body-bytes=65536",
            "--allowed-source-cidrs=10.0.0.1/32,10.0.0.2/32",
            "--allowed-source-cidrs=fd00::1/128",
        ])
        .unwrap()
        .serve;
        assert_eq!((a.max_in_flight, a.max_body_bytes), (8, 65536));
        assert_eq!(
            a.allowed_source_cidrs,
            ["10.0.0.1/32", "10.0.0.2/32", "fd00::1/128"]
        );
        assert!(Cli::try_parse_from(["x", "--max-in-flight=0"]).is_err());
        // A bad entry stops the server at start, naming it.
        let err = crate::sources::Allowlist::parse(&["10.0.0.1/32", "nope"]).unwrap_err();
        assert!(err.to_string().contains("\"nope\""), "{err}");
    }

    #[test]
    fn native_sidecar_version_gate() {
        use super::supports_native_sidecar as s;
        assert!(s("1", "29"));
        assert!(s("1", "35+"));
        assert!(!s("1", "28"));
        assert!(!s("1", "x"));
        assert!(s("2", "0"));
    }
}
