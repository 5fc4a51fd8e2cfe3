//! asya-queue-provisioner: see the crate docs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use asya_api::ClusterConfig;
use asya_queue_provisioner::health::{Health, Phase, liveness, readiness};
use asya_queue_provisioner::{controller, leader, metrics::Metrics};
use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use clap::Parser;
use futures::FutureExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use tracing::{info, warn};

#[derive(Parser, Debug)]
#[command(
    name = "asya-queue-provisioner",
    version,
    about = "Creates each AsyncActor's queue, workload and KEDA scaling, and keeps its status true"
)]
struct Args {
    /// Cluster configuration (the chart's config.yaml); the documented defaults when absent.
    #[arg(long, env = "ASYA_CONFIG")]
    config: Option<PathBuf>,
    /// Kubeconfig file; in-cluster or $KUBECONFIG when absent.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Namespace of the leader Lease and of the transport secrets the configuration names.
    #[arg(long, env = "POD_NAMESPACE", default_value = "asya-system")]
    namespace: String,
    /// KEDA's namespace (its cluster object namespace): where the Secret behind each RabbitMQ
    /// transport's ClusterTriggerAuthentication is written (chart value `keda.namespace`).
    #[arg(long, env = "ASYA_KEDA_NAMESPACE", default_value = "keda")]
    keda_namespace: String,
    /// Elect a leader through a Lease (turn off only for a single replica in development).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Log as JSON lines.
    #[arg(long, env = "ASYA_LOG_JSON")]
    log_json: bool,
}

/// The Kubernetes client; every request it sends counts in `api_requests` (the work per
/// actor docs/benchmarks.md reports, and tests/e2e bounds).
async fn client(path: Option<&PathBuf>, metrics: &Metrics) -> anyhow::Result<Client> {
    let cfg = match path {
        None => kube::Config::infer()
            .await
            .context("no Kubernetes configuration found")?,
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .context("kubeconfig")?
        }
    };
    let requests = metrics.api_requests.clone();
    let counting =
        tower::util::MapRequestLayer::new(move |req: hyper::http::Request<kube::client::Body>| {
            requests.inc();
            req
        });
    Ok(kube::client::ClientBuilder::try_from(cfg)
        .context("building the Kubernetes client")?
        .with_layer(&counting)
        .build())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // lapin logs every passive declare of a missing queue (our existence check) as an
    // ERROR; transport failures are reported by the provisioner itself.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,kube=warn,lapin=off".into());
    if args.log_json {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    let config = match &args.config {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            ClusterConfig::from_yaml(&text)?
        }
        None => ClusterConfig::default(),
    };
    let metrics = Metrics::default();
    let client = client(args.kubeconfig.as_ref(), &metrics).await?;
    let health = Health::default();

    let m = metrics.clone();
    let listener = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .with_context(|| format!("binding {}", args.metrics_addr))?;
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = m.clone();
                async move { m.encode() }
            }),
        )
        // Liveness: the process answers (see `health`), saying in what phase.
        .route("/healthz", {
            let health = health.clone();
            get(move || {
                let why = liveness(health.phase());
                async move { why }
            })
        })
        .route("/readyz", {
            let health = health.clone();
            get(move || {
                let (ready, why) = readiness(health.phase());
                let code = if ready {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                async move { (code, why) }
            })
        });
    tokio::spawn(async move { axum::serve(listener, app).await });
    info!(addr = %args.metrics_addr, "metrics listening");

    let identity = format!(
        "{}-{}",
        std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| "provisioner".into()),
        std::process::id()
    );
    let leases = Api::<Lease>::namespaced(client.clone(), &args.namespace);
    let spans = Arc::new(
        asya_telemetry::Recorder::new(
            &asya_api::trace_context::TraceSettings::from_lookup(&|k| std::env::var(k).ok()),
            "asya-queue-provisioner",
        )
        .context("tracing")?,
    );
    let shutdown = shutdown_signal()?;
    let config = Arc::new(config);
    // `Some(n)` while this replica leads (its n-th term), `None` while it campaigns.
    let (term_tx, mut term) = tokio::sync::watch::channel(None);
    let campaign = if args.leader_elect {
        Some(leader::campaign(
            leases.clone(),
            identity.clone(),
            term_tx.clone(),
        ))
    } else {
        term_tx.send_replace(Some(1)); // one term, for the life of the process
        None
    };
    // Campaign, lead until the lease is lost, stand down, campaign again: never an exit for
    // a lost lease, so the API server away past the lease costs no container restart.
    loop {
        health.set(Phase::Standby);
        metrics.leader.set(0);
        let elected = tokio::select! {
            t = term.wait_for(Option::is_some) => t.ok().and_then(|t| *t),
            _ = shutdown.clone() => None,
        };
        let Some(n) = elected else { break };
        metrics.leader.set(1);
        health.set(Phase::Syncing);
        let run = controller::run(
            client.clone(),
            config.clone(),
            args.namespace.clone(),
            args.keda_namespace.clone(),
            metrics.clone(),
            health.clone(),
            spans.clone(),
            shutdown.clone(),
        );
        // Returns on SIGTERM/SIGINT once in-flight reconciles finish.
        tokio::select! {
            _ = run => break,
            _ = term.wait_for(|t| *t != Some(n)) => {
                // Dropping `run` stopped the reconciles in flight, the watches and every
                // leader-only task: another replica may lead from the lease's end on.
                warn!(term = n, "stood down: not leading any more; campaigning again");
                metrics.leader_stand_downs.inc();
            }
        }
    }
    // The last reconciles' spans; the flush blocks, and its posts need this runtime.
    let _ = tokio::task::spawn_blocking(move || spans.shutdown(std::time::Duration::from_secs(5)))
        .await;
    if let Some(campaign) = campaign {
        // No renewal may land after the release.
        campaign.abort();
        let _ = campaign.await;
        leader::release(&leases, &identity).await;
    }
    Ok(())
}

/// Resolves at SIGTERM or SIGINT; every clone at once. SIGTERM's handler is installed now,
/// so no moment of the process's life takes the default action (an exit without release).
fn shutdown_signal() -> anyhow::Result<controller::Shutdown> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        info!("shutting down");
    }
    .boxed()
    .shared())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_keda_namespace_is_kept_empty_not_defaulted() {
        // The chart renders `--keda-namespace=` when keda.namespace is empty (no KEDA).
        let a = Args::try_parse_from(["p", "--keda-namespace="]).expect("parses");
        assert_eq!(a.keda_namespace, "");
        let a = Args::try_parse_from(["p"]).expect("parses");
        assert_eq!(a.keda_namespace, "keda");
    }
}
