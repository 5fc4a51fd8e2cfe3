//! asya-sidecar: pulls envelopes from an actor's queue, hands them to the Python runtime
//! over a Unix socket, and routes the results (docs/DESIGN.md §4). Envelopes, transports and
//! retry rules are `asya_transport`'s, shared with the provisioner and the gateway.

pub mod config;
pub mod disposition;
pub mod fanin_client;
pub mod flow_routing;
pub mod flow_trace;
pub mod gateway_client;
pub mod http;
pub mod metrics;
pub mod processor;
pub mod routing;
pub mod runtime_client;
pub mod service;
pub mod spans;
pub mod wake;

/// The runtime the injected init container copies next to the user's code.
pub const RUNTIME_PY: &str = include_str!("../runtime/asya_runtime.py");

/// Writes `DIR/asya_runtime.py` (`asya-sidecar install-runtime DIR`).
pub fn install_runtime(dir: &std::path::Path) -> std::io::Result<std::path::PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("asya_runtime.py");
    std::fs::write(&path, RUNTIME_PY)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(path)
}
