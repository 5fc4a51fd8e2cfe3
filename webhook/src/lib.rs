//! asya-webhook: AdmissionReview handling for AsyncActors and Pods, sidecar injection, and
//! the TLS server around them.

pub mod admission;
pub mod cache;
pub mod client;
pub mod inject;
pub mod inject_cmd;
pub mod patch;
pub mod serve;
pub mod server;
pub mod telemetry;
pub mod validate_cmd;
mod wire;
