//! The HTTP surface, one router per audience, each behind its own layers:
//!
//! - `ops.rs`: `/health` and `/metrics`, for probes and Prometheus; open.
//! - `clients.rs` and the MCP router (`/mcp`): REST and MCP callers; bearer token, a
//!   per-client rate limit and bound on requests in flight (shared by both), a body size
//!   limit.
//! - `reports.rs` and `fanin.rs`: the sidecars' reports and flow branch results; bearer token, a rate limit and a bound in flight
//!   per report namespace (`limits.rs`), a body size limit.
//!
//! Client routes take client tokens only, report routes report tokens only; what each token
//! may touch beyond that is decided in `crate::access`.
//!
//! Every refusal is JSON naming what was wrong (`reply.rs`).

use std::sync::Arc;

use axum::Router;

use crate::app::App;

mod clients;
mod fanin;
mod guard;
mod limits;
mod ops;
mod reply;
mod reports;
mod sse;

pub use guard::{Guard, Limits};

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
            reports::router(server.clone()).merge(fanin::router(server.clone())),
        ))
        // Merged last, so its guarded fallback answers unknown paths: without a token they
        // are refused (401) rather than told apart (404).
        .merge(guard::for_callers(&server, callers))
}

/// The W3C trace context of a request (`traceparent`, `tracestate`): the call continues the
/// caller's trace; a missing or malformed one starts a new trace.
pub fn incoming_trace(headers: &axum::http::HeaderMap) -> asya_transport::trace_context::Incoming {
    use asya_transport::trace_context::{TRACEPARENT_HEADER, TRACESTATE_HEADER, incoming_from};
    let get = |k| headers.get(k).and_then(|v| v.to_str().ok());
    incoming_from(get(TRACEPARENT_HEADER), get(TRACESTATE_HEADER))
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_bounds;
#[cfg(test)]
mod tests_flows;
#[cfg(test)]
mod tests_tenancy;

#[cfg(test)]
mod trace_tests {
    use axum::http::{HeaderMap, HeaderValue};

    #[test]
    fn a_request_continues_the_callers_trace_or_starts_one() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut h = HeaderMap::new();
        h.insert("traceparent", HeaderValue::from_static(tp));
        h.insert("tracestate", HeaderValue::from_static("k=v"));
        let t = super::incoming_trace(&h);
        assert_eq!(t.parent.map(|p| p.format()).as_deref(), Some(tp));
        assert_eq!(t.tracestate.as_deref(), Some("k=v"));
        // Not visible ASCII, or malformed: a new trace, with the reason kept.
        h.insert("traceparent", HeaderValue::from_bytes(b"00-\xff").unwrap());
        let t = super::incoming_trace(&h);
        assert!(t.parent.is_none() && t.refused.is_none());
        h.insert("traceparent", HeaderValue::from_static("00-1-2-3"));
        assert!(super::incoming_trace(&h).refused.is_some());
    }
}
