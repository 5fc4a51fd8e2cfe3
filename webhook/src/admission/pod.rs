//! Pod admission: the actor settings for a pod (from its AsyncActor, else its annotations),
//! injection, and the JSON patch of what injection changed.

use asya_api::labels;
use k8s_openapi::api::core::v1::Pod;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use serde_json::{Value, json};

use super::response::{allowing, deny, handled, kind_mismatch, patched};
use super::{Ctx, Endpoint, Handled, PodSettings, RawObject, op_name, wire};
use crate::inject::{ActorSettings, InjectedPod, inject, is_injected, wants_injection};
use crate::patch::injection_patch;

/// The common pod request (a CREATE of a plain pod) through the cheaper parse of
/// [`super::wire`]; `None` whenever that parse cannot vouch for the same answer as
/// [`super::handle_general`], which then answers. Public for the equivalence tests.
#[doc(hidden)]
pub fn handle_pod_create(body: &[u8], ctx: &Ctx<'_>) -> Option<Handled> {
    let (types, req) = wire::request(body)?;
    // What `pod` answers without looking at the object goes the reference way; so does an
    // `oldObject`, which the reference parse checks.
    if !req.kind.group.is_empty()
        || req.kind.kind != "Pod"
        || req.operation != Operation::Create
        || req.old_object.is_some()
    {
        return None;
    }
    let pod = wire::pod(req.object?)?;
    let operation = op_name(&req.operation);
    let resp = allowing(types, req.uid);
    let span = tracing::debug_span!("admit", endpoint = Endpoint::MutatePods.as_str(), uid = %resp.uid, operation, dry_run = req.dry_run);
    let _g = span.enter();
    let resp = admit_pod(pod, req.namespace, resp, ctx);
    Some(handled(resp, operation))
}

/// What to add to a pod that asks for injection without saying for what.
fn how_to_configure(actor: &str, ns: &str) -> String {
    format!(
        "pod is labelled {}=true for actor {actor:?} but there is no AsyncActor {actor:?} in namespace {ns:?} and no {} annotation: create the AsyncActor, or annotate the pod with {}: module.function (optionally {}, {}, {})",
        labels::INJECT,
        labels::ANNOTATION_HANDLER,
        labels::ANNOTATION_HANDLER,
        labels::ANNOTATION_TRANSPORT,
        labels::ANNOTATION_HANDLER_MODE,
        labels::ANNOTATION_PYTHON
    )
}

/// The actor settings for a pod: from its AsyncActor, else from its annotations.
pub fn settings_for_pod(pod: &Pod, ns: &str, ctx: &Ctx<'_>) -> PodSettings {
    let meta = &pod.metadata;
    let Some(actor) = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::ACTOR))
        .cloned()
    else {
        return Err((
            400,
            format!(
                "pod is labelled {}=true but has no {} label: add {}: <actor name>",
                labels::INJECT,
                labels::ACTOR,
                labels::ACTOR
            ),
        ));
    };
    let memo = ctx
        .memo
        .and_then(|m| ctx.actors.version(ns, &actor).map(|v| (m, v)));
    if let Some((m, version)) = &memo
        && let Some(hit) = m.get(ns, &actor, version, ctx.catalog.id())
    {
        return hit;
    }
    let ann = meta.annotations.clone().unwrap_or_default();
    let cached = ctx.actors.get_versioned(ns, &actor);
    let from_cache = cached.is_some();
    let (obj, version) = match cached {
        Some((obj, version)) => (obj, version),
        None => {
            let Some(handler) = ann.get(labels::ANNOTATION_HANDLER) else {
                return Err((400, how_to_configure(&actor, ns)));
            };
            // The annotations form a flat-shape actor, reviewed by the same rules.
            let image = pod
                .spec
                .as_ref()
                .and_then(|s| {
                    s.containers
                        .iter()
                        .find(|c| c.name == labels::RUNTIME_CONTAINER)
                        .or(s.containers.first())
                })
                .and_then(|c| c.image.clone())
                .unwrap_or_default();
            let mut spec = json!({"actor": actor, "handler": handler, "image": image});
            for (key, field) in [
                (labels::ANNOTATION_TRANSPORT, "transport"),
                (labels::ANNOTATION_HANDLER_MODE, "handlerMode"),
                (labels::ANNOTATION_PYTHON, "pythonExecutable"),
            ] {
                if let Some(v) = ann.get(key) {
                    spec[field] = json!(v);
                }
            }
            let obj = json!({"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
                   "metadata": {"name": actor, "namespace": ns}, "spec": spec});
            (obj, None)
        }
    };
    let settings = settings_of_actor(&obj, ns, &actor, from_cache, ctx);
    // Only answers from the AsyncActor: the annotations' answer depends on the pod.
    if let (Some(m), Some(v)) = (ctx.memo, version) {
        m.put(ns, &actor, v, ctx.catalog.id(), &settings);
    }
    settings
}

/// Reviews the AsyncActor (from the cache, or made of the pod's annotations) for injection.
fn settings_of_actor(
    obj: &Value,
    ns: &str,
    actor: &str,
    from_cache: bool,
    ctx: &Ctx<'_>,
) -> PodSettings {
    // The actor as stored: what admitted it is not asked again (a spec admitted before
    // policy.maxSpecBytes was lowered still gets its pods injected).
    let review = asya_api::review::review_stored_decision(&asya_api::review::ReviewRequest {
        object: obj,
        old_object: None,
        namespace: Some(ns),
        catalog: ctx.catalog,
        config: ctx.config,
    });
    let source = if from_cache {
        format!("AsyncActor {ns}/{actor}")
    } else {
        format!("the {} annotations of the pod", "asya.sh/*")
    };
    if !review.allowed() {
        return Err((
            422,
            format!("cannot inject: {source} is invalid: {}", review.errors),
        ));
    }
    match review.resolved {
        Some(r) => Ok((ActorSettings::from_resolved(&r), review.warnings)),
        None => Err((
            422,
            format!(
                "cannot inject: {source} has no effective handler yet{}",
                if review.missing_flavors.is_empty() {
                    String::new()
                } else {
                    format!(" (waiting for flavors {:?})", review.missing_flavors)
                }
            ),
        )),
    }
}

pub(super) fn pod(
    req: &mut AdmissionRequest<RawObject>,
    resp: AdmissionResponse,
    ctx: &Ctx<'_>,
) -> AdmissionResponse {
    if !req.kind.group.is_empty() || req.kind.kind != "Pod" {
        return kind_mismatch(resp, "core/v1 Pod", req);
    }
    // Injection happens once, at creation; updates of a running pod's spec are not allowed anyway.
    if req.operation != Operation::Create {
        return resp;
    }
    let Some(obj) = req.object.take().map(|o| o.value) else {
        return deny(
            resp,
            400,
            "BadRequest",
            "CREATE request without an object".into(),
            vec![],
        );
    };
    let pod: Pod = match serde_json::from_value(obj) {
        Ok(p) => p,
        Err(e) => {
            return deny(
                resp,
                400,
                "BadRequest",
                format!("object is not a Pod: {e}"),
                vec![],
            );
        }
    };
    admit_pod(pod, req.namespace.clone(), resp, ctx)
}

/// Injection into a pod being created, however it was parsed. `req_ns`: the request's
/// namespace.
fn admit_pod(
    mut pod: Pod,
    req_ns: Option<String>,
    resp: AdmissionResponse,
    ctx: &Ctx<'_>,
) -> AdmissionResponse {
    if !wants_injection(&pod.metadata) || is_injected(&pod.metadata) {
        return resp;
    }
    let ns = req_ns
        .or_else(|| pod.metadata.namespace.clone())
        .unwrap_or_else(|| "default".into());
    let (settings, warnings) = match settings_for_pod(&pod, &ns, ctx) {
        Ok(s) => s,
        Err((code, msg)) => {
            return deny(
                resp,
                code,
                if code == 422 { "Invalid" } else { "BadRequest" },
                msg,
                vec![],
            );
        }
    };
    // What injection may change, copied before and taken out to inject into: the rest of
    // the pod cannot change, so the patch compares these alone.
    let (Some(before), Some(mut injected)) =
        (InjectedPod::cloned(&pod), InjectedPod::take(&mut pod))
    else {
        return deny(resp, 400, "BadRequest", "pod has no spec".into(), vec![]);
    };
    if let Err(e) = inject(&mut injected, &settings, ctx.config, ctx.native_sidecar) {
        return deny(
            resp,
            422,
            "Invalid",
            format!("cannot inject the Asya sidecar: {e}"),
            vec![],
        );
    }
    let patch = match injection_patch(&before, &injected, ctx.memo.map(|m| &m.rendered)) {
        Ok(p) => p,
        Err(e) => return deny(resp, 500, "InternalError", e.to_string(), vec![]),
    };
    patched(resp, patch, warnings)
}
