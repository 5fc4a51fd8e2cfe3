//! The one HTTP(S) client set-up of the parts that call HTTP APIs beside their broker (the
//! provisioner's RabbitMQ management API, the sidecar's reports to the gateway): rustls on
//! ring with the system's roots, plain HTTP allowed, HTTP/1.1.

use std::sync::Arc;

use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// A pooled client for request bodies of type `B`. Fails only when the system's TLS roots
/// cannot be loaded.
pub fn client<B>() -> Result<Client<HttpsConnector<HttpConnector>, B>, std::io::Error>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
{
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_native_roots(provider)?
        .https_or_http()
        .enable_http1()
        .build();
    Ok(Client::builder(TokioExecutor::new()).build(https))
}
