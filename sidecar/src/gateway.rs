//! Reports to the gateway (`ASYA_GATEWAY_URL`): progress (received, processing, completed),
//! fan-out children and, on the end actors, the final status. Never in the envelope's way:
//! reports go through bounded queues to background tasks that try each a bounded number of
//! times with a deadline; a report that cannot be delivered (queue full, gateway slow or
//! down) is dropped with a metric and a log line, and the envelope goes on. The reports of
//! one envelope share a lane, so they arrive in order; several lanes keep a busy actor's
//! reports (three per envelope) from queueing behind one round trip at a time.

use std::sync::Arc;
use std::time::Duration;

use asya_api::percent;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::metrics::Metrics;

#[derive(Debug, Clone, PartialEq)]
pub struct GatewayConfig {
    /// Base URL, e.g. `http://asya-gateway.asya-system:8080`.
    pub url: String,
    /// Bearer token (`ASYA_GATEWAY_TOKEN`), if the gateway requires one.
    pub token: Option<String>,
    /// Deadline of one attempt.
    pub timeout: Duration,
    /// Attempts per report.
    pub attempts: u32,
    /// Reports waiting at most; more are dropped.
    pub queue: usize,
}

/// One report: a path under the gateway's URL and a JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub kind: &'static str,
    pub path: String,
    pub body: Value,
    /// The envelope it is about: picks the lane.
    pub envelope: String,
}

impl Report {
    pub fn progress(
        id: &str,
        parent_id: Option<&str>,
        actor: &str,
        phase: &str,
        current: usize,
        total: usize,
    ) -> Report {
        let mut body = json!({"actor": actor, "phase": phase, "current": current, "total": total});
        if let (Some(p), Some(o)) = (parent_id, body.as_object_mut()) {
            o.insert("parent_id".into(), json!(p));
        }
        Report {
            kind: "progress",
            path: format!("/envelopes/{}/progress", percent::encode(id)),
            body,
            envelope: id.into(),
        }
    }

    pub fn child(id: &str, parent_id: &str, actors: &[String], current: usize) -> Report {
        Report {
            kind: "child",
            path: "/envelopes".into(),
            body: json!({"id": id, "parent_id": parent_id, "route": {"actors": actors, "current": current}}),
            envelope: id.into(),
        }
    }

    pub fn final_status(
        id: &str,
        actor: &str,
        succeeded: bool,
        result: Option<Value>,
        error: Option<Value>,
    ) -> Report {
        let mut body =
            json!({"status": if succeeded { "succeeded" } else { "failed" }, "actor": actor});
        if let Some(o) = body.as_object_mut() {
            if let Some(r) = result {
                o.insert("result".into(), r);
            }
            if let Some(e) = error {
                o.insert("error".into(), e);
            }
        }
        Report {
            kind: "final",
            path: format!("/envelopes/{}/final", percent::encode(id)),
            body,
            envelope: id.into(),
        }
    }
}

type Client = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
>;

/// Lanes: reports delivered at once, at most.
const LANES: usize = 4;

/// The sending side; cheap to clone. A disabled reporter (no URL) does nothing.
#[derive(Clone)]
pub struct Reporter {
    /// One queue per lane.
    tx: Option<Arc<[mpsc::Sender<Report>]>>,
    metrics: Arc<Metrics>,
}

/// The lane of an envelope's reports: the same for all of them.
fn lane(envelope: &str, lanes: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    envelope.hash(&mut h);
    (h.finish() % lanes.max(1) as u64) as usize
}

impl Reporter {
    pub fn disabled(metrics: Arc<Metrics>) -> Reporter {
        Reporter { tx: None, metrics }
    }

    /// Starts the background task. Fails only when the TLS roots cannot be loaded.
    pub fn start(cfg: GatewayConfig, metrics: Arc<Metrics>) -> Result<Reporter, std::io::Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(provider)?
            .https_or_http()
            .enable_http1()
            .build();
        let client: Client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build(https);
        // The queue bound is the whole reporter's, shared out among the lanes.
        let per_lane = cfg.queue.div_ceil(LANES).max(1);
        let tx: Vec<_> = (0..LANES)
            .map(|_| {
                let (tx, rx) = mpsc::channel(per_lane);
                tokio::spawn(deliver(cfg.clone(), client.clone(), rx, metrics.clone()));
                tx
            })
            .collect();
        Ok(Reporter {
            tx: Some(tx.into()),
            metrics,
        })
    }

    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Queues a report without waiting; drops it (metric, log) when the queue is full.
    pub fn send(&self, r: Report) {
        let Some(lanes) = &self.tx else { return };
        let tx = &lanes[lane(&r.envelope, lanes.len())];
        if let Err(e) = tx.try_send(r) {
            let r = match e {
                mpsc::error::TrySendError::Full(r) | mpsc::error::TrySendError::Closed(r) => r,
            };
            self.metrics.gateway_report(r.kind, "dropped_queue_full");
            tracing::warn!(kind = r.kind, path = %r.path, "gateway report dropped: too many waiting (gateway slow or down)");
        }
    }
}

async fn deliver(
    cfg: GatewayConfig,
    client: Client,
    mut rx: mpsc::Receiver<Report>,
    metrics: Arc<Metrics>,
) {
    let base = cfg.url.trim_end_matches('/').to_string();
    while let Some(r) = rx.recv().await {
        let mut pause = Duration::from_millis(100);
        let mut outcome = Err(String::new());
        for attempt in 1..=cfg.attempts.max(1) {
            outcome = post(&client, &cfg, &format!("{base}{}", r.path), &r.body).await;
            match &outcome {
                Ok(()) => break,
                // A refusal that a retry cannot change.
                Err(e) if e.starts_with("HTTP 4") && !e.starts_with("HTTP 429") => break,
                Err(e) => {
                    tracing::debug!(kind = r.kind, attempt, error = %e, "gateway report failed; retrying");
                    if attempt < cfg.attempts {
                        tokio::time::sleep(pause).await;
                        pause *= 2;
                    }
                }
            }
        }
        match outcome {
            Ok(()) => metrics.gateway_report(r.kind, "sent"),
            Err(e) => {
                metrics.gateway_report(r.kind, "dropped_failed");
                tracing::warn!(kind = r.kind, path = %r.path, error = %e, attempts = cfg.attempts, "gateway report dropped");
            }
        }
    }
}

async fn post(client: &Client, cfg: &GatewayConfig, url: &str, body: &Value) -> Result<(), String> {
    let mut req = hyper::Request::post(url).header("content-type", "application/json");
    if let Some(t) = &cfg.token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(cfg.timeout, client.request(req))
        .await
        .map_err(|_| format!("no answer within {:?}", cfg.timeout))?
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    // Drain the body so the connection is reused.
    let _ = tokio::time::timeout(cfg.timeout, resp.into_body().collect()).await;
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("HTTP {}", status.as_u16()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_shapes() {
        let p = Report::progress("e 1", Some("e"), "a", "received", 0, 3);
        assert_eq!(p.path, "/envelopes/e%201/progress");
        assert_eq!(p.body["parent_id"], "e");
        let c = Report::child("e-1", "e", &["a".into(), "b".into()], 1);
        assert_eq!(c.body["route"]["current"], 1);
        let f = Report::final_status("e", "x-sump", false, None, Some(json!({"reason": "boom"})));
        assert_eq!(f.body["status"], "failed");
        assert_eq!(f.body["error"]["reason"], "boom");
    }

    #[test]
    fn an_envelopes_reports_share_a_lane_and_envelopes_spread_over_all() {
        let p = Report::progress("env-7", None, "a", "received", 0, 2);
        let f = Report::final_status("env-7", "x-sink", true, None, None);
        assert_eq!(lane(&p.envelope, LANES), lane(&f.envelope, LANES));
        let used: std::collections::HashSet<usize> =
            (0..200).map(|i| lane(&format!("e{i}"), LANES)).collect();
        assert_eq!(used.len(), LANES, "{used:?}");
    }

    #[tokio::test]
    async fn a_full_queue_drops_instead_of_blocking() {
        let metrics = Arc::new(Metrics::new("asya-default-a"));
        // Nothing listens on port 9 of loopback: every attempt fails fast.
        let r = Reporter::start(
            GatewayConfig {
                url: "http://127.0.0.1:9".into(),
                token: None,
                timeout: Duration::from_millis(200),
                attempts: 2,
                queue: 1,
            },
            metrics.clone(),
        )
        .unwrap();
        let started = std::time::Instant::now();
        for i in 0..50 {
            r.send(Report::progress(
                &format!("e{i}"),
                None,
                "a",
                "received",
                0,
                1,
            ));
        }
        assert!(
            started.elapsed() < Duration::from_millis(100),
            "send never waits"
        );
        let text = metrics.encode();
        assert!(text.contains("outcome=\"dropped_queue_full\""), "{text}");
    }
}
