//! Wiring: metrics server, runtime readiness, the transport, the consume loop, signals.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;

use crate::config::{Config, TransportConfig};
use crate::gateway_client::Reporter;
use crate::http::{self, Health};
use crate::metrics::Metrics;
use crate::processor::Processor;
use crate::routing::Queues;
use crate::runtime_client::RuntimeClient;
use crate::spans::Spans;
use asya_transport::Transport;
use asya_transport::rabbitmq::{RabbitSettings, RabbitTransport};
use asya_transport::sqs::{SqsSettings, SqsTransport};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("configuration error: {0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("line {line}: not JSON: {message}")]
    BadLine { line: usize, message: String },
    #[error("sending to {queue} failed: {source}")]
    Send {
        queue: String,
        source: asya_transport::TransportError,
    },
    #[error("reading stdin: {0}")]
    Stdin(#[from] std::io::Error),
    #[error("ASYA_GATEWAY_URL {url}: cannot set up the HTTP client: {source}")]
    Gateway { url: String, source: std::io::Error },
    #[error(
        "cannot reach the broker: not connected within {waited:?} of the runtime answering \
         (ASYA_TRANSPORT_STARTUP_TIMEOUT); check the transport's host, port or endpoint"
    )]
    TransportUnreachable { waited: Duration },
    #[error("ASYA_METRICS_ADDR: cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Tracing(crate::spans::ExportError),
}

/// Runs until SIGTERM/SIGINT and a graceful drain (or the grace period ends).
pub async fn run(cfg: Config) -> Result<(), ServiceError> {
    let cfg = Arc::new(cfg);
    let queue = Queues {
        namespace: cfg.namespace.clone(),
    }
    .actor(&cfg.actor);
    let metrics = Arc::new(Metrics::new(&queue));
    let (stop_tx, stop_rx) = watch::channel(false);
    spawn_signal_listener(stop_tx);
    match &cfg.transport {
        TransportConfig::RabbitMq {
            url,
            exchange,
            prefetch,
        } => {
            let m = metrics.clone();
            let t = Arc::new(RabbitTransport::new(
                RabbitSettings {
                    url: url.clone(),
                    url_source: "ASYA_RABBITMQ_URL",
                    exchange: exchange.clone(),
                    queue: queue.clone(),
                    prefetch: *prefetch,
                    auto_create: cfg.queue_auto_create,
                    max_redeliveries: cfg.max_redeliveries,
                    publish_only: false,
                },
                Box::new(move || m.reconnected()),
            ));
            let max_in_flight = usize::from(*prefetch);
            run_with(cfg.clone(), t.clone(), metrics, stop_rx, max_in_flight).await?;
            t.close().await;
        }
        TransportConfig::Sqs {
            region,
            endpoint,
            wait_seconds,
            visibility_timeout,
            max_message_bytes,
            pollers,
        } => {
            let t = Arc::new(
                SqsTransport::new(SqsSettings {
                    region: region.clone(),
                    endpoint: endpoint.clone(),
                    queue: queue.clone(),
                    wait_seconds: *wait_seconds,
                    visibility_timeout: *visibility_timeout,
                    auto_create: cfg.queue_auto_create,
                    max_message_bytes: *max_message_bytes,
                    pollers: *pollers,
                })
                .await,
            );
            t.spawn_extender();
            // As many envelopes in flight as the polls bring at once: their sends and
            // deletes then fill SQS's batches of 10.
            let max_in_flight = asya_transport::sqs_batch::MAX_ENTRIES * *pollers;
            run_with(cfg.clone(), t, metrics, stop_rx, max_in_flight).await?;
        }
    }
    Ok(())
}

fn spawn_signal_listener(stop: watch::Sender<bool>) {
    tokio::spawn(async move {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen for SIGTERM");
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            _ = term => tracing::info!("SIGTERM: stop taking messages, finish in-flight ones"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stop taking messages, finish in-flight ones"),
        }
        let _ = stop.send(true);
    });
}

async fn run_with<T: Transport>(
    cfg: Arc<Config>,
    transport: Arc<T>,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
    max_in_flight: usize,
) -> Result<(), ServiceError> {
    let t = transport.clone();
    let health = Arc::new(Health {
        metrics: metrics.clone(),
        runtime_up: false.into(),
        stopping: false.into(),
        transport_up: Box::new(move || t.healthy()),
    });
    let addr = http::serve(cfg.metrics_addr, health.clone())
        .await
        .map_err(|source| ServiceError::Listen {
            addr: cfg.metrics_addr,
            source,
        })?;
    tracing::info!(%addr, actor = %cfg.actor, "metrics, /healthz and /readyz listening");
    spawn_probes(cfg.clone(), transport.clone(), health.clone());

    // Readiness stays false until the runtime answers; nothing is consumed before that.
    let runtime = RuntimeClient::new(cfg.socket_path.clone());
    let mut waited = Duration::ZERO;
    while !runtime.reachable().await {
        if *stop.borrow() {
            return Ok(());
        }
        if waited.as_secs().is_multiple_of(10) && waited.subsec_millis() == 0 {
            tracing::info!(socket = %cfg.socket_path.display(), "waiting for the runtime");
        }
        tokio::select! {
            _ = stop.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        waited += Duration::from_millis(100);
    }
    health.runtime_up.store(true, Ordering::SeqCst);
    metrics.set_runtime_up(true);

    let reporter = match &cfg.gateway {
        Some(g) => {
            let r = Reporter::start(g.clone(), metrics.clone()).map_err(|source| {
                ServiceError::Gateway {
                    url: g.url.clone(),
                    source,
                }
            })?;
            tracing::info!(url = %g.url, "reporting progress to the gateway");
            r
        }
        None => Reporter::disabled(metrics.clone()),
    };
    let connected = {
        let t = transport.clone();
        move || t.healthy()
    };
    let system = match cfg.transport {
        TransportConfig::RabbitMq { .. } => "rabbitmq",
        TransportConfig::Sqs { .. } => "aws_sqs",
    };
    let own_queue = asya_api::naming::actor_queue(&cfg.namespace, &cfg.actor);
    let spans = Arc::new(Spans::new(&cfg.trace, system, own_queue).map_err(ServiceError::Tracing)?);
    if spans.enabled() {
        tracing::info!(endpoint = ?cfg.trace.endpoint, ratio = cfg.trace.ratio, "exporting spans");
    }
    let processor = Arc::new(
        Processor::new(cfg.clone(), transport, metrics, max_in_flight)
            .with_reporter(reporter)
            .with_spans(spans.clone()),
    );
    tracing::info!(queue = processor.own_queue(), "consuming");
    let mut loop_task = tokio::spawn(processor.run(stop.clone()));
    tokio::select! {
        _ = &mut loop_task => return Ok(()),
        _ = stop.wait_for(|s| *s) => {}
        Err(waited) = first_connection(connected, cfg.transport_startup_timeout) => {
            // Nothing was received without a connection: there is nothing to drain.
            loop_task.abort();
            tracing::error!(?waited, "never reached the broker; exiting so that the kubelet restarts the sidecar");
            return Err(ServiceError::TransportUnreachable { waited });
        }
    }
    health.stopping.store(true, Ordering::SeqCst);
    match tokio::time::timeout(cfg.shutdown_timeout, &mut loop_task).await {
        Ok(_) => tracing::info!("drained; exiting"),
        Err(_) => {
            // Unacknowledged messages return to the queue when the connection closes.
            tracing::warn!(grace = ?cfg.shutdown_timeout, "grace period over; in-flight messages return to the queue");
            loop_task.abort();
        }
    }
    // The batch exporter's thread blocks while it flushes: off the runtime's workers.
    let _ = tokio::task::spawn_blocking(move || spans.shutdown(Duration::from_secs(5))).await;
    Ok(())
}

/// Waits until `connected()` holds for the first time: `Err(within)` when it did not within
/// `within` (`None`: no limit, wait forever). Once connected it never fails, so a broker lost
/// later is waited for by the transport's own reconnects.
async fn first_connection(
    connected: impl Fn() -> bool,
    within: Option<Duration>,
) -> Result<(), Duration> {
    let start = tokio::time::Instant::now();
    loop {
        if connected() {
            return Ok(());
        }
        if let Some(limit) = within
            && start.elapsed() >= limit
        {
            return Err(limit);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Background probes: runtime reachability and queue depth, for readiness and metrics.
fn spawn_probes<T: Transport>(cfg: Arc<Config>, transport: Arc<T>, health: Arc<Health>) {
    let h = health.clone();
    let path = cfg.socket_path.clone();
    tokio::spawn(async move {
        let runtime = RuntimeClient::new(path);
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let up = runtime.reachable().await;
            h.runtime_up.store(up, Ordering::SeqCst);
            h.metrics.set_runtime_up(up);
        }
    });
    tokio::spawn(async move {
        loop {
            health.metrics.set_transport_up(transport.healthy());
            if let Some(n) = transport.queue_depth().await {
                health.metrics.set_queue_depth(n);
            }
            tokio::time::sleep(Duration::from_secs(15)).await;
        }
    });
}

/// `asya-sidecar send QUEUE`: publishes each JSON line of stdin to QUEUE through the
/// configured transport, confirmed, like the sidecar itself does. For demos, and for
/// replaying envelopes from x-sump.
pub async fn send_lines(queue: &str, input: impl std::io::BufRead) -> Result<usize, ServiceError> {
    let lookup = |k: &str| {
        std::env::var(k)
            .ok()
            .or_else(|| (k == "ASYA_ACTOR_NAME").then(|| "cli".to_string()))
    };
    let cfg = Config::from_vars(&crate::config::Vars(&lookup))?;
    let mut bodies = Vec::new();
    for (i, line) in input.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        serde_json::from_str::<serde_json::Value>(&line).map_err(|e| ServiceError::BadLine {
            line: i + 1,
            message: e.to_string(),
        })?;
        bodies.push(asya_transport::Outgoing {
            queue: queue.to_string(),
            body: line.into_bytes(),
            delay: None,
        });
    }
    let sent = bodies.len();
    // The routes' actors are woken first (docs/DESIGN.md §6.1), best effort.
    let wake =
        crate::wake::route_wake_queues(&cfg.namespace, bodies.iter().map(|o| o.body.as_slice()));
    let wake_body = asya_api::wake::wake_body("asya-sidecar send").into_bytes();
    let err = |source| ServiceError::Send {
        queue: queue.to_string(),
        source,
    };
    match &cfg.transport {
        TransportConfig::RabbitMq { url, exchange, .. } => {
            let t = RabbitTransport::new(
                RabbitSettings {
                    url: url.clone(),
                    url_source: "ASYA_RABBITMQ_URL",
                    exchange: exchange.clone(),
                    queue: queue.to_string(),
                    prefetch: 1,
                    auto_create: cfg.queue_auto_create,
                    max_redeliveries: cfg.max_redeliveries,
                    publish_only: true,
                },
                Box::new(|| {}),
            );
            t.ensure_connected().await;
            t.wake(&wake, &wake_body).await;
            t.send(&bodies).await.map_err(err)?;
            t.close().await;
        }
        TransportConfig::Sqs {
            region,
            endpoint,
            visibility_timeout,
            max_message_bytes,
            ..
        } => {
            let t = SqsTransport::new(SqsSettings {
                region: region.clone(),
                endpoint: endpoint.clone(),
                queue: queue.to_string(),
                wait_seconds: 0,
                visibility_timeout: *visibility_timeout,
                auto_create: cfg.queue_auto_create,
                max_message_bytes: *max_message_bytes,
                pollers: 1,
            })
            .await;
            t.wake(&wake, &wake_body).await;
            t.send(&bodies).await.map_err(err)?;
        }
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[tokio::test]
    async fn first_connection_gives_up_only_when_never_connected() {
        let never = first_connection(|| false, Some(Duration::from_millis(250))).await;
        assert_eq!(never, Err(Duration::from_millis(250)));

        let up = Arc::new(AtomicBool::new(false));
        let flag = up.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            flag.store(true, Ordering::SeqCst);
        });
        let u = up.clone();
        let late = first_connection(
            move || u.load(Ordering::SeqCst),
            Some(Duration::from_secs(5)),
        );
        assert_eq!(late.await, Ok(()));
    }

    #[tokio::test]
    async fn first_connection_without_a_limit_keeps_waiting() {
        let waited =
            tokio::time::timeout(Duration::from_millis(300), first_connection(|| false, None))
                .await;
        assert!(waited.is_err(), "no limit: it must still be waiting");
    }
}
