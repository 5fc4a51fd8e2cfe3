//! `asya-gateway serve`: settings, start-up (storage, migrations, tools, transports), the
//! HTTP server, tool reload on change, graceful stop.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::access::namespaces::Watched;
use crate::access::{ClientTokens, Credentials, NamespaceUids, ReportKey};
use crate::app::App;
use crate::http::{Guard, Limits, Server};
use crate::send::{SendConfig, Senders};
use crate::store::postgres::Postgres;
use crate::store::retention::{self, Policy};
use crate::store::{Store, StoreError};
use crate::tools::{LoadError, Tools};

#[derive(Debug, Clone)]
pub struct Settings {
    pub addr: SocketAddr,
    pub tools: PathBuf,
    pub config: Option<PathBuf>,
    pub database_url: Option<String>,
    /// `None` with `no_auth`; else the client tokens file (`crate::access::tokens`).
    pub auth_tokens: Option<PathBuf>,
    /// The key report tokens are derived from (`crate::access::report_key`); without it no
    /// report token is accepted.
    pub report_key: Option<PathBuf>,
    pub no_auth: bool,
    pub namespace: String,
    pub rabbitmq_url: Option<String>,
    pub sqs_region: Option<String>,
    pub sqs_endpoint: Option<String>,
    /// Rate limits, bounds in flight and the body size limit (`crate::http::Limits`).
    pub limits: Limits,
    /// How report tokens' namespace uids are checked.
    pub namespace_uids: UidSource,
    /// Whether compiled flows are offered as tools (`crate::flows`).
    pub flows: FlowSource,
    /// When stored envelopes are deleted (`crate::store::retention`).
    pub retention: Policy,
    pub allowed_hosts: Vec<String>,
    pub send_timeout: Duration,
    pub reload_interval: Duration,
}

/// Where the namespaces' uids come from (`--namespace-uids`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum UidSource {
    /// A metadata-only watch of Namespaces through the cluster's API (in the pod, or the
    /// kubeconfig): a report token of a namespace deleted since is refused.
    Kube,
    /// Signatures only, for runs without a cluster; said at start.
    Off,
}

/// Where flow tools come from (`--flows`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FlowSource {
    /// A watch of the flows' entry AsyncActors in every namespace: each is a tool.
    Kube,
    /// None: only the tools file's (runs without a cluster).
    Off,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Tools(#[from] LoadError),
    #[error("--config {path}: {message}")]
    Config { path: String, message: String },
    #[error(
        "authentication: pass --auth-tokens FILE (one bearer token per line) or --no-auth to run without"
    )]
    AuthUnset,
    #[error("--auth-tokens {path}: {message}")]
    AuthTokens { path: String, message: String },
    #[error("--report-key-file {path}: {message}")]
    ReportKey { path: String, message: String },
    #[error(
        "--namespace-uids=kube: no Kubernetes API to watch namespaces in ({0}); run in the \
         cluster or with a kubeconfig, or pass --namespace-uids=off to check report tokens' \
         signatures only"
    )]
    NamespaceUids(String),
    #[error(
        "--flows=kube: no Kubernetes API to watch the flows' entry actors in ({0}); run in the \
         cluster or with a kubeconfig, or pass --flows=off"
    )]
    Flows(String),
    #[error("{0}")]
    Transport(String),
    #[error("{0}")]
    Tracing(String),
    #[error("--database-url: {0}")]
    Database(StoreError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Client tokens from a file (a mounted Secret): one per line, blank lines and `#` comments
/// skipped, each optionally limited (`tools=…`, `namespaces=…`).
pub fn read_tokens(path: &Path) -> Result<ClientTokens, ServeError> {
    let err = |message: String| ServeError::AuthTokens {
        path: path.display().to_string(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let tokens = ClientTokens::parse(&text).map_err(|errors| {
        err(errors
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("; "))
    })?;
    if tokens.is_empty() {
        return Err(err("holds no token".into()));
    }
    Ok(tokens)
}

/// The report key from a file (a mounted Secret).
pub fn read_report_key(path: &Path) -> Result<ReportKey, ServeError> {
    let err = |message: String| ServeError::ReportKey {
        path: path.display().to_string(),
        message,
    };
    let bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
    ReportKey::new(&bytes).map_err(|e| err(e.to_string()))
}

/// The credentials of `s`: `None` when authentication is off. With a report key and
/// `--namespace-uids=kube`, the namespace watch starts here (its first list completes in the
/// background; until then reports are answered 503).
pub async fn credentials(s: &Settings) -> Result<Option<Credentials>, ServeError> {
    let clients = match (&s.auth_tokens, s.no_auth) {
        (Some(p), _) => read_tokens(p)?,
        (None, true) => {
            tracing::warn!(
                "authentication is DISABLED (--no-auth): anyone who reaches this port can call tools and report"
            );
            return Ok(None);
        }
        (None, false) => return Err(ServeError::AuthUnset),
    };
    let report_key = match &s.report_key {
        Some(p) => Some(read_report_key(p)?),
        None => {
            tracing::warn!(
                "no report key (--report-key-file): sidecar reports are refused, so envelope status stops at pending"
            );
            None
        }
    };
    let namespaces = match (report_key.is_some(), s.namespace_uids) {
        (false, _) => NamespaceUids::Off,
        (true, UidSource::Off) => {
            tracing::warn!(
                "--namespace-uids=off: report tokens are checked by signature only, so the token of a namespace deleted and made again (perhaps by another team) is still accepted; use --namespace-uids=kube in a cluster"
            );
            NamespaceUids::Off
        }
        (true, UidSource::Kube) => {
            let client = kube::Client::try_default()
                .await
                .map_err(|e| ServeError::NamespaceUids(e.to_string()))?;
            NamespaceUids::Watched(Watched::start(client))
        }
    };
    tracing::info!(
        client_tokens = clients.len(),
        report_tokens = report_key.is_some(),
        namespace_uids = ?s.namespace_uids,
        "authentication on"
    );
    Ok(Some(Credentials {
        clients,
        report_key,
        namespaces,
    }))
}

/// Transport settings from the cluster configuration (default transport, SQS region and
/// endpoint) and the environment (`ASYA_RABBITMQ_URL`, which carries the password).
pub fn send_config(s: &Settings) -> Result<SendConfig, ServeError> {
    let cluster = match &s.config {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| ServeError::Config {
                path: p.display().to_string(),
                message: e.to_string(),
            })?;
            Some(
                asya_api::config::ClusterConfig::from_yaml(&text).map_err(|e| {
                    ServeError::Config {
                        path: p.display().to_string(),
                        message: e.to_string(),
                    }
                })?,
            )
        }
        None => None,
    };
    let sqs = cluster.as_ref().and_then(|c| {
        c.transports
            .values()
            .find(|t| t.enabled && t.is_sqs())
            .map(|t| t.config.clone())
    });
    let sqs_region = s
        .sqs_region
        .clone()
        .or_else(|| sqs.as_ref().and_then(|c| c.region.clone()));
    let sqs_endpoint = s
        .sqs_endpoint
        .clone()
        .or_else(|| sqs.as_ref().and_then(|c| c.endpoint.clone()));
    let default_transport = match &cluster {
        Some(c) => c
            .transport(&c.default_transport)
            .map(|t| t.kind.clone())
            .unwrap_or_else(|| c.default_transport.clone()),
        None if s.rabbitmq_url.is_some() => "rabbitmq".into(),
        None if sqs_region.is_some() => "sqs".into(),
        None => {
            return Err(ServeError::Transport(
                "no transport: set ASYA_RABBITMQ_URL (--rabbitmq-url) or ASYA_SQS_REGION (--sqs-region), or pass --config".into(),
            ));
        }
    };
    if default_transport == "rabbitmq" && s.rabbitmq_url.is_none() {
        return Err(ServeError::Transport(
            "the default transport is rabbitmq but ASYA_RABBITMQ_URL (--rabbitmq-url) is not set"
                .into(),
        ));
    }
    if default_transport == "sqs" && sqs_region.is_none() {
        return Err(ServeError::Transport(
            "the default transport is sqs but no region is set (ASYA_SQS_REGION, --sqs-region or the configuration's transports.sqs.config.region)".into(),
        ));
    }
    Ok(SendConfig {
        default_transport,
        rabbitmq_url: s.rabbitmq_url.clone(),
        exchange: asya_api::naming::RABBITMQ_EXCHANGE.into(),
        sqs_region,
        sqs_endpoint,
        deadline: s.send_timeout,
    })
}

/// A started gateway: where it listens, its state, and its server task.
pub struct Running {
    pub addr: SocketAddr,
    pub app: Arc<App>,
    pub task: tokio::task::JoinHandle<Result<(), ServeError>>,
}

/// Runs until SIGTERM/SIGINT.
pub async fn run(s: Settings) -> Result<(), ServeError> {
    let running = start(s, shutdown()).await?;
    match running.task.await {
        Ok(r) => r,
        Err(e) => Err(ServeError::Transport(format!("server task failed: {e}"))),
    }
}

/// Starts everything and serves until `stop` completes. Errors at start (tools, auth,
/// transports, database, address) come back before anything listens.
pub async fn start(
    s: Settings,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<Running, ServeError> {
    let tools = Tools::load(&s.tools)?;
    let tokens = credentials(&s).await?;
    let send = send_config(&s)?;
    let store = match &s.database_url {
        Some(url) => Store::postgres(Postgres::connect(url).await.map_err(ServeError::Database)?),
        None => {
            tracing::warn!(
                "NO DATABASE URL: envelope status is kept IN MEMORY and lost on restart; set ASYA_DATABASE_URL (--database-url) for PostgreSQL"
            );
            Store::memory()
        }
    };
    let senders = Senders::new(&send).await;
    tracing::info!(
        tools = tools.tools.len(),
        storage = store.kind(),
        transport = %send.default_transport,
        namespace = %s.namespace,
        "gateway starting"
    );
    let trace =
        asya_transport::trace_context::TraceSettings::from_lookup(&|k| std::env::var(k).ok());
    let recorder = asya_telemetry::Recorder::new(&trace, "asya-gateway")
        .map_err(|e| ServeError::Tracing(e.to_string()))?;
    let app = Arc::new(
        App::new(tools, store, senders, s.namespace.clone())
            .with_trace(trace)
            .with_recorder(recorder),
    );
    let guard = Arc::new(Guard::new(tokens, s.limits.clone()));
    let server = Arc::new(Server {
        app: app.clone(),
        guard,
    });
    let mcp = crate::mcp::router(
        app.clone(),
        s.allowed_hosts.clone(),
        s.limits.max_body_bytes,
    );
    let router = crate::http::router(server, mcp);
    let listener = tokio::net::TcpListener::bind(s.addr)
        .await
        .map_err(|source| ServeError::Listen {
            addr: s.addr,
            source,
        })?;
    let addr = listener.local_addr().unwrap_or(s.addr);
    let reload = spawn_reload(app.clone(), s.tools.clone(), s.reload_interval);
    let flows = match s.flows {
        FlowSource::Off => None,
        FlowSource::Kube => {
            let client = kube::Client::try_default()
                .await
                .map_err(|e| ServeError::Flows(e.to_string()))?;
            Some(tokio::spawn(crate::flows::watch(client, app.clone())))
        }
    };
    let retention = retention::spawn(app.clone(), s.retention.clone());
    tracing::info!(%addr, "listening: /mcp, /tools/call, /envelopes, /health, /metrics");
    let traces_app = app.clone();
    let task = tokio::spawn(async move {
        let served = axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(stop)
        .await
        .map_err(|source| ServeError::Listen { addr, source });
        reload.abort();
        if let Some(f) = flows {
            f.abort();
        }
        if let Some(r) = retention {
            r.abort();
        }
        // The last calls' spans, before the process goes; the flush blocks, and its posts
        // need this runtime.
        let flush =
            tokio::task::spawn_blocking(move || traces_app.shutdown_traces(Duration::from_secs(5)));
        let _ = flush.await;
        served
    });
    Ok(Running { addr, app, task })
}

async fn shutdown() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("stopping");
}

/// Re-reads the tools file when its content changes (a ConfigMap update swaps a symlink,
/// so the content is compared, not the modification time). A broken file keeps the last
/// good tools and says why.
fn spawn_reload(app: Arc<App>, path: PathBuf, every: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last = std::fs::read(&path).ok();
        loop {
            tokio::time::sleep(every).await;
            let now = std::fs::read(&path).ok();
            if now.is_none() || now == last {
                continue;
            }
            last = now;
            match Tools::load(&path) {
                Ok(t) => {
                    tracing::info!(tools = t.tools.len(), "tools reloaded");
                    app.set_tools(t);
                }
                Err(e) => {
                    tracing::error!(error = %e, "tools file changed but is invalid; keeping the previous tools")
                }
            }
        }
    })
}
