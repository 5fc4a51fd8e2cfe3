//! The client of the gateway's report endpoints (`ASYA_GATEWAY_URL`): progress (received,
//! processing, completed), fan-out children and, on the end actors, the final status, as the
//! shared `asya_transport::report` types. Never in the envelope's way:
//! reports go through bounded queues to background tasks that try each a bounded number of
//! times with a deadline; a report that cannot be delivered (queue full, gateway slow or
//! down) is dropped with a metric and a log line, and the envelope goes on. The reports of
//! one envelope share a lane, so they arrive in order; several lanes keep a busy actor's
//! reports (three per envelope) from queueing behind one round trip at a time.

use std::sync::Arc;
use std::time::Duration;

use asya_api::percent;
use asya_transport::envelope::Route;
use asya_transport::report::{self, ChildReport, FinalReport, Outcome, ProgressReport, Verdict};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde::Serialize;
use serde_json::{Map, Value};
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
    pub body: Body,
    /// The envelope it is about: picks the lane.
    pub envelope: String,
}

/// What a report says; serialised as the inner type alone.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Body {
    Progress(ProgressReport),
    Child(ChildReport),
    Final(FinalReport),
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
        let body = ProgressReport {
            actor: actor.into(),
            phase: phase.into(),
            current,
            total,
            message: None,
            parent_id: parent_id.map(str::to_string),
        };
        Report {
            kind: "progress",
            path: report::progress_path(&percent::encode(id)),
            body: Body::Progress(body),
            envelope: id.into(),
        }
    }

    pub fn child(id: &str, parent_id: &str, actors: &[String], current: usize) -> Report {
        let body = ChildReport {
            id: id.into(),
            parent_id: parent_id.into(),
            route: Some(Route {
                actors: actors.to_vec(),
                current,
                extra: Map::new(),
            }),
        };
        Report {
            kind: "child",
            path: report::CHILD_PATH.into(),
            body: Body::Child(body),
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
        let outcome = if succeeded {
            Outcome::Succeeded
        } else {
            Outcome::Failed
        };
        Report {
            kind: "final",
            path: report::final_path(&percent::encode(id)),
            body: Body::Final(FinalReport::new(outcome, actor, result, error)),
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
        let client: Client = asya_transport::http_client::client()?;
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
        let mut outcome = Ok(());
        for attempt in 1..=cfg.attempts.max(1) {
            outcome = post(&client, &cfg, &format!("{base}{}", r.path), &r.body).await;
            match &outcome {
                Ok(()) => break,
                Err(e) if !e.retryable() => break,
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

/// Why one attempt to deliver a report failed.
#[derive(Debug, thiserror::Error)]
enum Failed {
    #[error("HTTP {0}")]
    Status(u16),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Request(String),
}

impl Failed {
    /// Whether another attempt may succeed: not after a refusal for good.
    fn retryable(&self) -> bool {
        match self {
            Failed::Status(code) => Verdict::of(*code) != Verdict::Refused,
            Failed::Timeout(_) | Failed::Request(_) => true,
        }
    }
}

async fn post(client: &Client, cfg: &GatewayConfig, url: &str, body: &Body) -> Result<(), Failed> {
    let body = serde_json::to_vec(body).map_err(|e| Failed::Request(e.to_string()))?;
    let mut req = hyper::Request::post(url).header("content-type", "application/json");
    if let Some(t) = &cfg.token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| Failed::Request(e.to_string()))?;
    let resp = tokio::time::timeout(cfg.timeout, client.request(req))
        .await
        .map_err(|_| Failed::Timeout(cfg.timeout))?
        .map_err(|e| Failed::Request(e.to_string()))?;
    let status = resp.status().as_u16();
    // Drain the body so the connection is reused.
    let _ = tokio::time::timeout(cfg.timeout, resp.into_body().collect()).await;
    match Verdict::of(status) {
        Verdict::Accepted => Ok(()),
        Verdict::Refused | Verdict::Retry => Err(Failed::Status(status)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn json(r: &Report) -> Value {
        serde_json::to_value(&r.body).unwrap()
    }

    #[test]
    fn report_shapes() {
        let p = Report::progress("e 1", Some("e"), "a", "received", 0, 3);
        assert_eq!(p.path, "/envelopes/e%201/progress");
        assert_eq!(json(&p)["parent_id"], "e");
        let c = Report::child("e-1", "e", &["a".into(), "b".into()], 1);
        assert_eq!(json(&c)["route"]["current"], 1);
        let f = Report::final_status("e", "x-sump", false, None, Some(json!({"reason": "boom"})));
        assert_eq!(json(&f)["status"], "failed");
        assert_eq!(json(&f)["error"]["reason"], "boom");
    }

    #[test]
    fn report_bodies_are_the_wire_shapes() {
        assert_eq!(
            json(&Report::progress("e", None, "a", "processing", 1, 2)),
            json!({"actor": "a", "phase": "processing", "current": 1, "total": 2})
        );
        assert_eq!(
            json(&Report::child("c", "p", &["a".into()], 0)),
            json!({"id": "c", "parent_id": "p", "route": {"actors": ["a"], "current": 0}})
        );
        assert_eq!(
            json(&Report::final_status(
                "e",
                "x-sink",
                true,
                Some(json!(3)),
                None
            )),
            json!({"status": "succeeded", "actor": "x-sink", "result": 3})
        );
    }

    #[test]
    fn only_a_refusal_for_good_ends_the_attempts() {
        assert!(!Failed::Status(400).retryable());
        assert!(!Failed::Status(404).retryable());
        assert!(Failed::Status(429).retryable());
        assert!(Failed::Status(503).retryable());
        assert!(Failed::Timeout(Duration::from_secs(1)).retryable());
        assert!(Failed::Request("connection refused".into()).retryable());
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
