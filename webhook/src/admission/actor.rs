//! AsyncActor admission: validation (through the cheaper parse when it can vouch for the
//! answer) and the mutating endpoint's rewrite of aliases and defaults.

use asya_api::review::{
    ActorReview, ParsedActor, ParsedOld, ParsedReview, ReviewRequest, review_actor,
    review_actor_decision, review_parsed,
};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use serde_json::Value;
use serde_json::value::RawValue;

use super::privilege::PendingPrivilege;
use super::response::{
    allowing, cannot_encode_patch, deny, deny_fields, handled, kind_mismatch, patched,
    with_warnings,
};
use super::{
    ACTOR_GROUP, ACTOR_KIND, Ctx, Endpoint, Handled, RawObject, collision, limits, op_name, wire,
};

/// The common AsyncActor admission (a CREATE or UPDATE whose spec has no unknown field), on
/// either actor endpoint, through the cheaper parse of [`super::wire`]: the spec is parsed
/// from the request's text, and the rest of the object (a `kubectl apply`'s
/// last-applied annotation, managed fields) is never built as a JSON `Value`. `None`
/// whenever that parse cannot vouch for the same answer as [`super::handle_general`], which
/// then answers. Public for the equivalence tests.
#[doc(hidden)]
pub fn handle_actor_fast(endpoint: Endpoint, body: &[u8], ctx: &Ctx<'_>) -> Option<Handled> {
    let (types, req) = wire::request(body)?;
    if req.kind.group != ACTOR_GROUP || req.kind.kind != ACTOR_KIND {
        return None;
    }
    // The old parse checks an `oldObject` whatever the operation; only an UPDATE reads it.
    let old = req.old_object.map(wire::actor);
    let old = match (&req.operation, old) {
        (Operation::Create, None) => None,
        // An absent or `null` stored spec reads as none (`Option<&RawValue>` takes `null`
        // as `None`).
        (Operation::Update, Some(Some(old))) => Some(ParsedOld::from_text(
            old.metadata.name,
            old.spec.map(|s| s.get()),
        )?),
        _ => return None,
    };
    let object = wire::actor(req.object?)?;
    let operation = op_name(&req.operation);
    if let Some(old) = req.old_object.and_then(wire::actor) {
        // The specs as `Value`s, as [`update_kind`] compares them (key order aside).
        let spec = |s: Option<&RawValue>| s.map(|s| serde_json::from_str::<Value>(s.get()).ok());
        match (spec(object.spec), spec(old.spec)) {
            (Some(None), _) | (_, Some(None)) => return None,
            (Some(Some(a)), Some(Some(b))) if a == b => {
                return Some(handled(allowing(types, req.uid), operation));
            }
            (Some(Some(_)), Some(Some(_))) if object.metadata.deletion_timestamp.is_some() => {
                let resp = terminating(allowing(types, req.uid), &req.name);
                return Some(handled(resp, operation));
            }
            // Being deleted with no spec (absent or `null`) on a side: the general parse
            // tells those apart.
            _ if object.metadata.deletion_timestamp.is_some() => return None,
            _ => {}
        }
    }
    let spec_text = object.spec?.get();
    // Near the size limit the general parse decides, which measures the spec as a `Value`
    // (the text may differ from it by a few bytes of escapes and number forms).
    if spec_text.len() > ctx.config.policy.max_spec_bytes / 2 {
        return None;
    }
    let actor = ParsedActor::from_text(&object.metadata, spec_text)?;
    let mutating = endpoint == Endpoint::MutateActors;
    // What the mutation's patch is taken against: the spec alone, as the review's
    // `mutated` holds it (the patch paths are the same as against the whole object).
    let before = if mutating {
        Some(serde_json::json!({ "spec": serde_json::from_str::<Value>(spec_text).ok()? }))
    } else {
        None
    };
    let resp = allowing(types, req.uid);
    let span = tracing::debug_span!("admit", endpoint = endpoint.as_str(), uid = %resp.uid, operation, dry_run = req.dry_run);
    let _g = span.enter();
    let creating = old.is_none();
    let ns = req.namespace.as_deref();
    let wanted = if mutating {
        ParsedReview::Mutation
    } else {
        ParsedReview::Decision
    };
    let mut review = review_parsed(actor, old, ns, ctx.catalog, ctx.config, wanted);
    if creating {
        collision::check_create(&mut review, ctx.actors);
        limits::check_create(&mut review, ctx.actors, &ctx.config.policy);
    }
    let pending = PendingPrivilege::of(
        &review,
        &req.user_info,
        ctx.config.policy.default_pod_security_level,
    );
    let resp = match &before {
        Some(before) => mutate(resp, review, &req.name, before),
        None => validated(resp, review, &req.name),
    };
    let mut h = handled(resp, operation);
    h.privilege = pending;
    Some(h)
}

/// What admission does with an UPDATE (`old` is its stored object).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateKind {
    /// The spec of a live actor changed: reviewed as a CREATE is.
    Review,
    /// The spec is unchanged (finalizers, labels, annotations), whether or not the actor is
    /// being deleted: admitted as it is, with no review, warning or patch, so the
    /// provisioner's finalizer removal passes whatever the policy and the flavors say now.
    Settled,
    /// The spec changed while the actor is being deleted: refused ([`terminating`]). The
    /// provisioner is removing what the actor made; a new spec would apply to nothing, and
    /// reviewing it would only let the edit through unchecked.
    Terminating,
}

/// How admission treats an UPDATE; `None` for a CREATE (no `old`). The chart's
/// `matchConditions` keep the API server from calling us for a [`UpdateKind::Settled`] one
/// at all, so a finalizer removal passes with the webhook down; this is the same rule for
/// API servers and configurations without them (docs/DESIGN.md §9).
pub fn update_kind(obj: &Value, old: Option<&Value>) -> Option<UpdateKind> {
    let old = old?;
    let deleting = obj
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null());
    let same_spec = match (obj.get("spec"), old.get("spec")) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    };
    Some(if same_spec {
        UpdateKind::Settled
    } else if deleting {
        // No spec on either side (absent or `null`) is no change either.
        let spec = |v: &Value| v.get("spec").filter(|s| !s.is_null()).cloned();
        if spec(obj).is_none() && spec(old).is_none() {
            UpdateKind::Settled
        } else {
            UpdateKind::Terminating
        }
    } else {
        UpdateKind::Review
    })
}

/// The refusal of a spec change on an actor being deleted.
fn terminating(resp: AdmissionResponse, name: &str) -> AdmissionResponse {
    let mut errors = asya_api::error::FieldErrors::default();
    errors.push(asya_api::error::FieldError::forbidden(
        "spec",
        "the AsyncActor is being deleted (metadata.deletionTimestamp is set): its spec cannot \
         change any more, only its metadata (the provisioner's finalizer removal); create a new \
         AsyncActor once this one is gone",
    ));
    deny_fields(resp, &format!("AsyncActor {name:?}"), &errors)
}

/// `mutated`: whether the caller needs [`ActorReview::mutated`] (only the mutating endpoint).
pub(super) fn actor_review(
    obj: &Value,
    old: Option<&Value>,
    ns: Option<&str>,
    ctx: &Ctx<'_>,
    mutated: bool,
) -> ActorReview {
    let req = ReviewRequest {
        object: obj,
        old_object: old,
        namespace: ns,
        catalog: ctx.catalog,
        config: ctx.config,
    };
    if mutated {
        review_actor(&req)
    } else {
        review_actor_decision(&req)
    }
}

/// The answer, and on the validating endpoint the question an admitted actor leaves for
/// [`super::privilege::settle`].
pub(super) fn actor(
    endpoint: Endpoint,
    req: &AdmissionRequest<RawObject>,
    resp: AdmissionResponse,
    ctx: &Ctx<'_>,
) -> (AdmissionResponse, Option<Box<PendingPrivilege>>) {
    if req.kind.group != ACTOR_GROUP || req.kind.kind != ACTOR_KIND {
        return (kind_mismatch(resp, "asya.sh AsyncActor", req), None);
    }
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return (resp, None);
    }
    let Some(obj) = req.object.as_ref().map(|o| &o.value) else {
        let resp = deny(
            resp,
            400,
            "BadRequest",
            format!("{} request without an object", op_name(&req.operation)),
            vec![],
        );
        return (resp, None);
    };
    let old = match req.operation {
        Operation::Update => req.old_object.as_ref().map(|o| &o.value),
        _ => None,
    };
    match update_kind(obj, old) {
        Some(UpdateKind::Settled) => return (resp, None),
        Some(UpdateKind::Terminating) => return (terminating(resp, &req.name), None),
        Some(UpdateKind::Review) | None => {}
    }
    let ns = req.namespace.as_deref();
    let mutating = endpoint == Endpoint::MutateActors;
    let mut review = actor_review(obj, old, ns, ctx, mutating);
    // Both endpoints decide alike: the chart registers only the mutating one, so an
    // AsyncActor costs one webhook call (docs/DESIGN.md §6); the validating one serves
    // installs that also register it (`webhook.validateActorsSeparately`). The privilege
    // question is asked of the resolved spec, which the mutation (alias rewrites) leaves
    // as it is.
    if req.operation == Operation::Create {
        collision::check_create(&mut review, ctx.actors);
        limits::check_create(&mut review, ctx.actors, &ctx.config.policy);
    }
    let pending = PendingPrivilege::of(
        &review,
        &req.user_info,
        ctx.config.policy.default_pod_security_level,
    );
    if !mutating {
        return (validated(resp, review, &req.name), pending);
    }
    (mutate(resp, review, &req.name, obj), pending)
}

/// The mutating endpoint's answer for a reviewed, unsettled object: refused with every
/// error, or the rewrite (if any) with every warning. `obj`: what `review.mutated` is a
/// rewrite of (the object, or `{"spec": …}` alone on the fast path).
fn mutate(
    resp: AdmissionResponse,
    review: ActorReview,
    name: &str,
    obj: &Value,
) -> AdmissionResponse {
    if !review.allowed() {
        return validated(resp, review, name);
    }
    match review.mutated.as_ref() {
        None => with_warnings(resp, review.warnings),
        Some(mutated) => {
            let patch = json_patch::diff(obj, mutated);
            if patch.0.is_empty() {
                return with_warnings(resp, review.warnings);
            }
            match serde_json::to_vec(&patch) {
                Ok(bytes) => patched(resp, bytes, review.warnings),
                Err(e) => cannot_encode_patch(resp, e),
            }
        }
    }
}

/// The validating answer: denied with every error, or allowed; with the warnings either way.
fn validated(resp: AdmissionResponse, review: ActorReview, name: &str) -> AdmissionResponse {
    if review.allowed() {
        return with_warnings(resp, review.warnings);
    }
    let what = format!("AsyncActor {name:?}");
    with_warnings(deny_fields(resp, &what, &review.errors), review.warnings)
}

#[cfg(test)]
mod tests {
    use super::{UpdateKind, update_kind};
    use serde_json::json;

    #[test]
    fn unchanged_specs_settle_and_a_deleted_actors_spec_cannot_change() {
        use UpdateKind::{Review, Settled, Terminating};
        let spec = json!({"image": "i", "handler": "m.f"});
        let ts = json!("2026-01-01T00:00:00Z");
        let deleting =
            |spec: serde_json::Value| json!({"metadata": {"deletionTimestamp": ts}, "spec": spec});
        let table = [
            // (new, old) → kind
            (json!({"spec": spec}), None, None), // CREATE
            (
                json!({"spec": spec}),
                Some(json!({"spec": spec})),
                Some(Settled),
            ),
            // Key order does not matter: the specs are compared as values.
            (
                json!({"spec": {"handler": "m.f", "image": "i"}}),
                Some(json!({"spec": spec})),
                Some(Settled),
            ),
            (
                json!({"spec": {"image": "j"}}),
                Some(json!({"spec": spec})),
                Some(Review),
            ),
            // Being deleted: the finalizer removal (spec unchanged) passes; an edit does not.
            (
                deleting(spec.clone()),
                Some(json!({"spec": spec})),
                Some(Settled),
            ),
            (
                deleting(json!({"image": "j"})),
                Some(json!({"spec": spec})),
                Some(Terminating),
            ),
            (
                deleting(json!(null)),
                Some(json!({"spec": spec})),
                Some(Terminating),
            ),
            (
                json!({"metadata": {"deletionTimestamp": ts}}),
                Some(json!({})),
                Some(Settled),
            ),
            (deleting(json!({"image": "j"})), None, None),
            (
                json!({"metadata": {"deletionTimestamp": null}, "spec": {"image": "j"}}),
                Some(json!({"spec": spec})),
                Some(Review),
            ),
            // No spec on either side of a live actor: reviewed (the chart's CEL calls the
            // webhook too).
            (json!({}), Some(json!({})), Some(Review)),
            (json!({"spec": spec}), Some(json!({})), Some(Review)),
        ];
        for (new, old, want) in table {
            assert_eq!(update_kind(&new, old.as_ref()), want, "{new} {old:?}");
        }
    }
}
