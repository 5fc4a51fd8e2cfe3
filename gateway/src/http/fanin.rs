//! For the sidecars of a flow's fan-out branches (docs/DESIGN.md §12 "Fan-out and fan-in"):
//! `POST /fanin/{join}/{index}` stores a branch's result or error under the join of the
//! caller's namespace (`crate::store::Store::branch`, the rule in `store/model.rs`) and answers
//! waiting, complete with every result in order, failed, or already joined. The gateway sends
//! nothing: the sidecar that completed the join sends the flow on with its own namespace's
//! broker identity.
//!
//! A report token writes only its own namespace's joins: the join is keyed by the token's
//! namespace, and a body naming another is refused. The guard has refused client tokens.

use std::sync::Arc;

use asya_transport::fanin::BranchReport;
use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};

use super::Server;
use super::reply::{error, json_body, store_error};
use crate::access::Principal;
use crate::store::JoinRefused;

pub fn router(server: Arc<Server>) -> Router {
    Router::new()
        .route("/fanin/{join}/{index}", post(report_branch))
        .with_state(server)
}

/// The namespace whose join a branch report writes: a report token's own; without
/// authentication, the one the body names.
fn join_namespace<'a>(who: &'a Principal, claimed: &'a str) -> Result<&'a str, String> {
    match who {
        Principal::Reporter { namespace } if namespace == claimed => Ok(namespace),
        Principal::Reporter { namespace } => Err(format!(
            "namespace: {claimed:?}: the report token of namespace {namespace:?} writes only \
             its own namespace's fan-ins"
        )),
        Principal::Open => Ok(claimed),
        Principal::Client(_) => Err("fan-in reports need a report token".into()),
    }
}

async fn report_branch(
    State(s): State<Arc<Server>>,
    Extension(who): Extension<Principal>,
    Path((join, index)): Path<(String, String)>,
    body: Body,
) -> Response {
    let Ok(index) = index.parse::<u32>() else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_path",
            format!("index: {index:?}: must be a branch number (0, 1, ...)"),
            None,
        );
    };
    let b: BranchReport = match json_body(body, s.guard.max_body_bytes).await {
        Ok(b) => b,
        Err(r) => return *r,
    };
    if join.is_empty() || b.namespace.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            "the join id and namespace must not be empty",
            None,
        );
    }
    let namespace = match join_namespace(&who, &b.namespace) {
        Ok(ns) => ns.to_string(),
        Err(why) => {
            s.app.metrics.refused("access");
            return error(
                StatusCode::FORBIDDEN,
                "namespace_of_another_token",
                why,
                None,
            );
        }
    };
    s.app.metrics.report("fanin");
    match s.app.store.branch(&namespace, &join, index, &b).await {
        Ok(Ok(answer)) => Json(answer).into_response(),
        Ok(Err(r)) => {
            let status = match r {
                JoinRefused::Mismatch { .. } => StatusCode::CONFLICT,
                _ => StatusCode::BAD_REQUEST,
            };
            error(status, "invalid_branch", r.to_string(), None)
        }
        Err(e) => store_error(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_token_writes_only_its_namespaces_fan_ins() {
        let team = Principal::Reporter {
            namespace: "team".into(),
        };
        assert_eq!(join_namespace(&team, "team"), Ok("team"));
        let e = join_namespace(&team, "other").unwrap_err();
        assert!(e.contains("\"other\"") && e.contains("\"team\""), "{e}");
        assert_eq!(join_namespace(&Principal::Open, "other"), Ok("other"));
        assert!(join_namespace(&Principal::Client(Default::default()), "team").is_err());
    }
}
