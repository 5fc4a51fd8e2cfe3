//! The HTTP surface, one router per audience, each behind its own layers:
//!
//! - `ops.rs`: `/health` and `/metrics`, for probes and Prometheus; open.
//! - `clients.rs` and the MCP router (`/mcp`): REST and MCP callers; bearer token, a
//!   per-client rate limit (shared by both) and a body size limit.
//! - `reports.rs`: the sidecars' reports; bearer token and body size limit, no rate limit
//!   (dropping a report would lose status).
//!
//! Client routes take client tokens only, report routes report tokens only; what each token
//! may touch beyond that is decided in `crate::access`.
//!
//! Every refusal is JSON naming what was wrong (`reply.rs`).

use std::sync::Arc;

use axum::Router;

use crate::app::App;

mod clients;
mod guard;
mod ops;
mod reply;
mod reports;
mod sse;

pub use guard::Guard;

/// What every handler and layer reads.
pub struct Server {
    pub app: Arc<App>,
    pub guard: Arc<Guard>,
}

/// The whole surface; `mcp` is the MCP router (`crate::mcp::router`).
pub fn router(server: Arc<Server>, mcp: Router) -> Router {
    let callers = clients::router(server.clone()).merge(mcp);
    ops::router(server.clone())
        .merge(guard::for_reporters(
            &server,
            reports::router(server.clone()),
        ))
        // Merged last, so its guarded fallback answers unknown paths: without a token they
        // are refused (401) rather than told apart (404).
        .merge(guard::for_callers(&server, callers))
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_tenancy;
