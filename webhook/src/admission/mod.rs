//! AdmissionReview v1 handling, as pure functions of the request body and a snapshot of the
//! caches: the server, the tests and the benchmark call [`handle`] directly.

use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};

mod actor;
pub mod collision;
mod context;
pub mod limits;
mod pod;
pub mod privilege;
mod raw_object;
mod response;
mod wire;

pub use actor::handle_actor_fast;
pub use context::{ActorLookup, Ctx, PodSettings, SettingsMemo};
pub use pod::{handle_pod_create, settings_for_pod};
pub use raw_object::RawObject;
pub use response::encode_review;

pub const ACTOR_GROUP: &str = "asya.sh";
pub const ACTOR_KIND: &str = "AsyncActor";

/// The three admission endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    ValidateActors,
    MutateActors,
    MutatePods,
}

impl Endpoint {
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::ValidateActors => "validate_asyncactors",
            Endpoint::MutateActors => "mutate_asyncactors",
            Endpoint::MutatePods => "mutate_pods",
        }
    }
}

/// A body that is not an AdmissionReview: answered with HTTP 400 and this text.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct BadRequest(pub String);

/// The outcome, for the response and the metrics.
#[derive(Debug)]
pub struct Handled {
    pub review: AdmissionReview<DynamicObject>,
    pub operation: &'static str,
    /// `allowed`, `patched` or `denied`.
    pub result: &'static str,
    /// An admitted AsyncActor whose pod the API server must still vouch for
    /// ([`privilege::settle`]); the server answers only after settling it.
    pub privilege: Option<Box<privilege::PendingPrivilege>>,
}

pub(crate) fn op_name(op: &Operation) -> &'static str {
    match op {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

/// Parse and answer one AdmissionReview body. The common requests (a pod to inject, an
/// AsyncActor to validate) are parsed from borrowed text ([`wire`], measured in
/// docs/benchmarks.md); every other body, and any the text parse cannot vouch for, goes
/// through [`handle_general`]. Both end in the same decisions ([`asya_api::review`], the
/// pod's injection and patch) and the same response; only the parse differs.
pub fn handle(endpoint: Endpoint, body: &[u8], ctx: &Ctx<'_>) -> Result<Handled, BadRequest> {
    let fast = match endpoint {
        Endpoint::MutatePods => handle_pod_create(body, ctx),
        Endpoint::ValidateActors | Endpoint::MutateActors => handle_actor_fast(endpoint, body, ctx),
    };
    match fast {
        Some(h) => Ok(h),
        None => handle_general(endpoint, body, ctx),
    }
}

/// [`handle`] with the body parsed as kube's `AdmissionReview`, the object as a JSON
/// `Value`: the answer for every body the text parse does not take (the mutating actor
/// endpoint, other operations and kinds, malformed bodies with kube's error messages).
/// The equivalence tests check that it answers the common requests as [`handle`] does.
#[doc(hidden)]
pub fn handle_general(
    endpoint: Endpoint,
    body: &[u8],
    ctx: &Ctx<'_>,
) -> Result<Handled, BadRequest> {
    let review: AdmissionReview<RawObject> = serde_json::from_slice(body)
        .map_err(|e| BadRequest(format!("body is not an AdmissionReview: {e}")))?;
    if review.types.kind != "AdmissionReview" || review.types.api_version != "admission.k8s.io/v1" {
        return Err(BadRequest(format!(
            "expected apiVersion admission.k8s.io/v1 kind AdmissionReview, got {} {}",
            review.types.api_version, review.types.kind
        )));
    }
    let mut req: AdmissionRequest<RawObject> = review
        .try_into()
        .map_err(|_| BadRequest("AdmissionReview has no request".into()))?;
    let operation = op_name(&req.operation);
    let resp = AdmissionResponse::from(&req);
    let span = tracing::debug_span!("admit", endpoint = endpoint.as_str(), uid = %req.uid, operation, dry_run = req.dry_run);
    let _g = span.enter();

    let (resp, pending) = match endpoint {
        Endpoint::ValidateActors | Endpoint::MutateActors => {
            actor::actor(endpoint, &req, resp, ctx)
        }
        Endpoint::MutatePods => (pod::pod(&mut req, resp, ctx), None),
    };
    let mut h = response::handled(resp, operation);
    h.privilege = pending;
    Ok(h)
}
