//! Logging setup for the server.

/// JSON logs to stderr, level from `ASYA_LOG_LEVEL` (default info).
pub fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ASYA_LOG_LEVEL")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn,hyper=warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .json()
        .try_init();
}
