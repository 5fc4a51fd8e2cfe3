//! `asya-state-proxy [CONNECTOR]`: serves one state mount's connector on CONNECTOR_SOCKET.

use std::sync::Arc;
use std::time::Duration;

use asya_state_proxy::config::{Config, Connector};
use asya_state_proxy::metrics::{self, Metrics};
use asya_state_proxy::server::{App, router};
use asya_state_proxy::store::Store;
use asya_state_proxy::store::redis::RedisStore;
use asya_state_proxy::store::s3::{Mode, S3Settings, S3Store};
use tokio::signal::unix::{SignalKind, signal};

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ASYA_LOG_LEVEL")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,aws=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if std::env::var("ASYA_LOG_FORMAT").as_deref() == Ok("text") {
        builder.init();
    } else {
        builder.json().init();
    }
}

async fn s3_client(c: &Config) -> aws_sdk_s3::Client {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
            aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https();
    // AWS_REGION, AWS_ENDPOINT_URL and the credentials come from the usual chain.
    let shared = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(http)
        .load()
        .await;
    let mut b = aws_sdk_s3::config::Builder::from(&shared);
    if let Some(ep) = &c.s3_endpoint {
        // S3-compatible servers (MinIO, moto, Ceph) serve path-style URLs.
        b = b.endpoint_url(ep).force_path_style(true);
    }
    aws_sdk_s3::Client::from_conf(b.build())
}

async fn store(c: &Config) -> Result<Store, String> {
    let mode = match c.connector {
        Connector::S3BufferedLww => Mode::BufferedLww,
        Connector::S3BufferedCas => Mode::BufferedCas,
        Connector::S3Passthrough => Mode::Passthrough,
        Connector::RedisBufferedCas => {
            let r = RedisStore::new(
                &c.redis_url,
                c.redis_auth.as_ref(),
                c.scope.clone(),
                c.backend_timeout,
                c.max_buffer_bytes,
            )
            .map_err(|e| e.to_string())?;
            return Ok(Store::Redis(Box::new(r)));
        }
    };
    let client = s3_client(c).await;
    Ok(Store::S3(S3Store::new(
        client,
        S3Settings {
            bucket: c.bucket.clone(),
            scope: c.scope.clone(),
            mode,
            timeout: c.backend_timeout,
            max_buffer: c.max_buffer_bytes,
            part_bytes: c.part_bytes,
            max_uploads: c.max_uploads,
        },
    )))
}

const USAGE: &str = "Usage: asya-state-proxy [CONNECTOR]

Serves one state mount's connector on the Unix socket CONNECTOR_SOCKET (HTTP/1.1, the
original Asya's contract). CONNECTOR (or ASYA_CONNECTOR): s3-buffered-lww, s3-buffered-cas,
s3-passthrough, redis-buffered-cas.

Environment: CONNECTOR_SOCKET, ASYA_NAMESPACE (required: keys are NAMESPACE/PREFIX/KEY),
STATE_PREFIX, STATE_BUCKET, AWS_REGION, AWS_ENDPOINT_URL (S3), REDIS_URL, REDIS_USERNAME,
REDIS_PASSWORD (Redis), ASYA_METRICS_ADDR (host:port of /metrics),
ASYA_STATE_MAX_BUFFER_BYTES, ASYA_STATE_PART_BYTES, ASYA_STATE_MAX_UPLOADS,
ASYA_STATE_BACKEND_TIMEOUT_SECONDS, ASYA_STATE_SHUTDOWN_TIMEOUT_SECONDS,
ASYA_STATE_SOCKET_MODE (see README.md).

asya-state-proxy --probe: GET /healthz on CONNECTOR_SOCKET; exit 0 if it answers 200 (an
exec probe: the image has no shell).";

#[tokio::main]
async fn main() {
    let arg = std::env::args().nth(1);
    match arg.as_deref() {
        Some("--version" | "-V") => {
            println!("asya-state-proxy {}", env!("CARGO_PKG_VERSION"));
            return;
        }
        Some("--help" | "-h") => {
            println!("{USAGE}");
            return;
        }
        Some("--probe") => {
            let socket = std::env::var_os("CONNECTOR_SOCKET").unwrap_or_default();
            let r = asya_state_proxy::probe::probe(socket.as_ref(), Duration::from_secs(2)).await;
            if let Err(e) = r {
                eprintln!("asya-state-proxy --probe: {e}");
                std::process::exit(1);
            }
            return;
        }
        _ => {}
    }
    init_logging();
    let config = match Config::from_lookup(arg.as_deref(), |k| std::env::var(k).ok()) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "configuration refused");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(config).await {
        tracing::error!(error = %e, "state proxy stopped");
        std::process::exit(1);
    }
}

async fn run(config: Config) -> Result<(), String> {
    let metrics = Arc::new(Metrics::new(config.connector.name()));
    if let Some(addr) = config.metrics_addr {
        let m = metrics.clone();
        tokio::spawn(async move {
            if let Err(e) = metrics::serve(addr, m).await {
                tracing::error!(%addr, error = %e, "metrics listener failed");
            }
        });
    }
    let app = Arc::new(App {
        store: store(&config).await?,
        scope: config.scope.clone(),
        metrics,
    });
    // A socket left by a previous run of this container would make bind fail.
    let _ = std::fs::remove_file(&config.socket);
    let listener = tokio::net::UnixListener::bind(&config.socket)
        .map_err(|e| format!("binding {}: {e}", config.socket.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            &config.socket,
            std::fs::Permissions::from_mode(config.socket_mode),
        )
        .map_err(|e| {
            format!(
                "chmod {:o} {}: {e}",
                config.socket_mode,
                config.socket.display()
            )
        })?;
    }
    tracing::info!(
        connector = config.connector.name(),
        socket = %config.socket.display(),
        keys_under = config.scope.root(),
        "serving"
    );

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        let _ = stop_tx.send(true);
    });
    let mut stopping = stop_rx.clone();
    let serve = axum::serve(listener, router(app)).with_graceful_shutdown(async move {
        let _ = stopping.wait_for(|s| *s).await;
    });
    // On SIGTERM the listener closes and requests in flight (an upload) finish, for at
    // most the shutdown timeout; past it the process exits and an unfinished multipart
    // upload is never completed, so no partial object appears.
    let mut deadline = stop_rx;
    let bound = config.shutdown_timeout;
    let result = tokio::select! {
        r = serve => r.map_err(|e| e.to_string()),
        _ = async {
            let _ = deadline.wait_for(|s| *s).await;
            tokio::time::sleep(bound).await;
        } => {
            tracing::warn!(seconds = bound.as_secs(), "requests still in flight at the shutdown bound");
            Ok(())
        }
    };
    let _ = std::fs::remove_file(&config.socket);
    tracing::info!("stopped");
    result
}
