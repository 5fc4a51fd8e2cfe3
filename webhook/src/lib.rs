//! asya-webhook: AdmissionReview handling for AsyncActors and Pods, sidecar injection, and
//! the TLS server around them.

pub mod admission;
pub mod authority;
pub mod cache;
pub mod client;
pub mod cmd;
pub mod holders;
pub mod inject;
pub mod patch;
pub mod server;
pub mod sources;
pub mod spans;
pub mod telemetry;
