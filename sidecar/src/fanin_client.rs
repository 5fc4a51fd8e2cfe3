//! The gateway's fan-in endpoint (`asya_transport::fanin`), asked in the envelope's way: a
//! branch's input is acknowledged only after the gateway stored its result and the sends its
//! answer calls for are confirmed. Bounded attempts, each with a deadline; when the gateway
//! cannot be reached the branch goes back to the broker (redelivered, its result stored once).

use asya_api::percent;
use asya_transport::fanin::{self, BranchReport, JoinAnswer};
use asya_transport::report::Verdict;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;

use crate::gateway_client::GatewayConfig;

type Client = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
>;

#[derive(Debug, thiserror::Error)]
pub enum FanInError {
    /// The gateway refused the report for good (4xx): the branch goes to x-sump with this.
    #[error("the gateway refused the branch result: HTTP {status}: {body}")]
    Refused { status: u16, body: String },
    /// Not reached, or it answered 5xx/429 each time: try the branch again later.
    #[error("the gateway could not take the branch result: {0}")]
    Unavailable(String),
}

#[derive(Clone)]
pub struct FanInClient {
    cfg: GatewayConfig,
    client: Client,
}

impl FanInClient {
    /// Fails only when the TLS roots cannot be loaded.
    pub fn new(cfg: GatewayConfig) -> Result<FanInClient, std::io::Error> {
        Ok(FanInClient {
            client: asya_transport::http_client::client()?,
            cfg,
        })
    }

    /// Stores branch `index` of `join` and returns the gateway's answer.
    pub async fn report(
        &self,
        join: &str,
        index: u32,
        report: &BranchReport,
    ) -> Result<JoinAnswer, FanInError> {
        let url = format!(
            "{}{}",
            self.cfg.url.trim_end_matches('/'),
            fanin::branch_path(&percent::encode(join), index)
        );
        let body =
            serde_json::to_vec(report).map_err(|e| FanInError::Unavailable(e.to_string()))?;
        let mut pause = std::time::Duration::from_millis(100);
        let mut last = FanInError::Unavailable("no attempt".into());
        for attempt in 1..=self.cfg.attempts.max(1) {
            match self.once(&url, body.clone()).await {
                Ok(a) => return Ok(a),
                Err(e @ FanInError::Refused { .. }) => return Err(e),
                Err(e) => {
                    tracing::debug!(attempt, error = %e, "fan-in report failed; retrying");
                    last = e;
                }
            }
            if attempt < self.cfg.attempts {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
        }
        Err(last)
    }

    async fn once(&self, url: &str, body: Vec<u8>) -> Result<JoinAnswer, FanInError> {
        let down = |e: String| FanInError::Unavailable(e);
        let mut req = hyper::Request::post(url).header("content-type", "application/json");
        if let Some(t) = &self.cfg.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| down(e.to_string()))?;
        let t = self.cfg.timeout;
        let resp = tokio::time::timeout(t, self.client.request(req))
            .await
            .map_err(|_| down(format!("no answer within {t:?}")))?
            .map_err(|e| down(e.to_string()))?;
        let status = resp.status().as_u16();
        let bytes = tokio::time::timeout(t, resp.into_body().collect())
            .await
            .map_err(|_| down(format!("no answer within {t:?}")))?
            .map_err(|e| down(e.to_string()))?
            .to_bytes();
        match Verdict::of(status) {
            Verdict::Accepted => serde_json::from_slice(&bytes)
                .map_err(|e| down(format!("the gateway's answer is not a join answer: {e}"))),
            Verdict::Refused => Err(FanInError::Refused {
                status,
                body: String::from_utf8_lossy(&bytes).chars().take(512).collect(),
            }),
            Verdict::Retry => Err(down(format!("HTTP {status}"))),
        }
    }
}
