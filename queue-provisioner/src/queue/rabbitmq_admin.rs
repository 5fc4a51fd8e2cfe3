//! The RabbitMQ management API calls that give each actor namespace its own broker user
//! (docs/DESIGN.md §9): `PUT /api/users/{u}` (no tags: no management access),
//! `PUT /api/permissions/{vhost}/{u}`, `DELETE /api/users/{u}`. Made with the platform's
//! identity, which stays in the provisioner's namespace. A password travels only in a request
//! body and is never part of an error or a log line.

use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;

use crate::broker_identity::permissions::Permissions;

use super::QueueError;

type HttpClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
>;

/// How long one management call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

pub struct BrokerAdmin {
    base: String,
    vhost: String,
    authorization: String,
    client: HttpClient,
}

impl BrokerAdmin {
    pub fn new(
        base: &str,
        vhost: &str,
        user: &str,
        password: &str,
    ) -> Result<BrokerAdmin, std::io::Error> {
        use base64::Engine;
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        Ok(BrokerAdmin {
            base: base.trim_end_matches('/').to_string(),
            vhost: vhost.to_string(),
            authorization: format!("Basic {token}"),
            client: asya_transport::http_client::client()?,
        })
    }

    /// Creates the user or sets its password (idempotent), with no tags.
    pub async fn put_user(&self, user: &str, password: &str) -> Result<(), QueueError> {
        let body = serde_json::json!({"password": password, "tags": ""});
        let path = format!("/api/users/{}", asya_api::percent::encode(user));
        self.call(hyper::Method::PUT, &path, Some(body), false)
            .await
    }

    /// Sets the user's permissions on the vhost (replacing any it had).
    pub async fn put_permissions(&self, user: &str, p: &Permissions) -> Result<(), QueueError> {
        let body = serde_json::json!({"configure": p.configure, "write": p.write, "read": p.read});
        let path = format!(
            "/api/permissions/{}/{}",
            asya_api::percent::encode(&self.vhost),
            asya_api::percent::encode(user)
        );
        self.call(hyper::Method::PUT, &path, Some(body), false)
            .await
    }

    /// Deletes the user (its permissions go with it); a missing user is not an error.
    pub async fn delete_user(&self, user: &str) -> Result<(), QueueError> {
        let path = format!("/api/users/{}", asya_api::percent::encode(user));
        self.call(hyper::Method::DELETE, &path, None, true).await
    }

    async fn call(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<serde_json::Value>,
        missing_ok: bool,
    ) -> Result<(), QueueError> {
        let what = format!("{method} {path}");
        let bytes = body.map(|b| b.to_string()).unwrap_or_default();
        let req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header(hyper::header::AUTHORIZATION, &self.authorization)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(bytes)))
            .map_err(|e| QueueError::Rejected(format!("{what}: {e}")))?;
        let resp = tokio::time::timeout(CALL_TIMEOUT, self.client.request(req))
            .await
            .map_err(|_| QueueError::Unavailable(format!("{what}: no answer in {CALL_TIMEOUT:?}")))?
            .map_err(|e| QueueError::Unavailable(format!("{what}: {e}")))?;
        let status = resp.status();
        if status.is_success() || (missing_ok && status == hyper::StatusCode::NOT_FOUND) {
            return Ok(());
        }
        // The answer's reason, never the request (it may hold a password).
        let text: String = resp
            .into_body()
            .collect()
            .await
            .map(|b| {
                String::from_utf8_lossy(&b.to_bytes())
                    .chars()
                    .take(300)
                    .collect()
            })
            .unwrap_or_default();
        let msg = format!("{what}: {status} {text}");
        Err(if status.is_server_error() {
            QueueError::Unavailable(msg)
        } else {
            QueueError::Rejected(msg)
        })
    }
}
