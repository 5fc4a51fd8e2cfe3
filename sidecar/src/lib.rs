//! asya-sidecar
