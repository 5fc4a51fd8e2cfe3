//! The span exporter: each batch the SDK's batch processor hands over is encoded as OTLP
//! JSON (otlp_json) and posted to `{endpoint}/v1/traces` by hyper with rustls on ring, the
//! TLS stack the workspace already has, so an `https://` collector needs nothing else.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

use crate::otlp_json;

/// One export request's limit (OTel's default for OTLP).
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Of a refusing collector's answer, this much goes into the error.
const MAX_ERROR_BODY: usize = 300;

#[derive(Debug, thiserror::Error)]
#[error("OTEL_EXPORTER_OTLP_ENDPOINT {endpoint:?}: cannot export spans there: {message}")]
pub struct ExportError {
    pub endpoint: String,
    pub message: String,
}

type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Posts spans as OTLP JSON. The SDK's batch processor runs exports on its own thread,
/// while hyper needs the tokio runtime: each post is spawned on `runtime` and awaited.
#[derive(Debug)]
pub struct JsonExporter {
    client: HttpClient,
    url: hyper::Uri,
    resource: Resource,
    runtime: tokio::runtime::Handle,
}

impl JsonExporter {
    /// An exporter to the collector at `endpoint` (its base URL; `/v1/traces` is added).
    /// Must be called inside the tokio runtime that will carry the posts.
    pub fn new(endpoint: &str) -> Result<JsonExporter, ExportError> {
        let err = |message: String| ExportError {
            endpoint: endpoint.to_string(),
            message,
        };
        let url: hyper::Uri = traces_url(endpoint)
            .parse()
            .map_err(|e| err(format!("not a URL: {e}")))?;
        if !matches!(url.scheme_str(), Some("http" | "https")) {
            return Err(err("the scheme must be http or https".into()));
        }
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| err(format!("no tokio runtime to post from: {e}")))?;
        Ok(JsonExporter {
            client: client().map_err(|e| err(format!("system TLS roots: {e}")))?,
            url,
            resource: Resource::builder_empty().build(),
            runtime,
        })
    }
}

/// `{endpoint}/v1/traces`, as OTEL_EXPORTER_OTLP_ENDPOINT's specification asks.
pub fn traces_url(endpoint: &str) -> String {
    format!("{}/v1/traces", endpoint.trim_end_matches('/'))
}

/// The client set-up of asya_transport::http_client (rustls on ring, system roots, plain
/// HTTP allowed), repeated here so that the webhook, which has no broker, need not build
/// the transports to export spans.
fn client() -> Result<HttpClient, std::io::Error> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_native_roots(provider)?
        .https_or_http()
        .enable_http1()
        .build();
    Ok(Client::builder(TokioExecutor::new()).build(https))
}

impl SpanExporter for JsonExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let body = otlp_json::encode(&self.resource, &batch).to_string();
        let request = hyper::Request::post(self.url.clone())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| OTelSdkError::InternalFailure(e.to_string()))?;
        let client = self.client.clone();
        // The timer too is the runtime's: this future is polled on the SDK's own thread.
        let post = async move {
            tokio::time::timeout(EXPORT_TIMEOUT, post(&client, request))
                .await
                .unwrap_or(Err(OTelSdkError::Timeout(EXPORT_TIMEOUT)))
        };
        match self.runtime.spawn(post).await {
            Ok(result) => result,
            Err(join) => Err(OTelSdkError::InternalFailure(join.to_string())),
        }
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.resource = resource.clone();
    }
}

async fn post(client: &HttpClient, request: hyper::Request<Full<Bytes>>) -> OTelSdkResult {
    let url = request.uri().to_string();
    let fail = |what: String| OTelSdkError::InternalFailure(format!("POST {url}: {what}"));
    let response = client
        .request(request)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| fail(e.to_string()))?
        .to_bytes();
    if status.is_success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&body);
    let cut = text
        .char_indices()
        .nth(MAX_ERROR_BODY)
        .map_or(text.len(), |(i, _)| i);
    Err(fail(format!(
        "the collector answered {status}: {}",
        &text[..cut]
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_path_is_appended_once() {
        assert_eq!(traces_url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(traces_url("http://c:4318/"), "http://c:4318/v1/traces");
    }

    #[tokio::test]
    async fn a_bad_endpoint_is_refused_with_its_value_and_rule() {
        let e = JsonExporter::new("ftp://c:4318").unwrap_err().to_string();
        assert!(
            e.contains("ftp://c:4318") && e.contains("http or https"),
            "{e}"
        );
        let e = JsonExporter::new("http://bad host")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a URL"), "{e}");
    }

    #[test]
    fn outside_a_runtime_the_exporter_says_why() {
        let e = JsonExporter::new("http://c:4318").unwrap_err().to_string();
        assert!(e.contains("tokio runtime"), "{e}");
    }
}
