//! AdmissionReview v1 handling, as pure functions of the request body and a snapshot of the
//! caches: the server, the tests and the benchmark call [`handle`] directly.

use std::collections::HashMap;

use asya_api::config::ClusterConfig;
use asya_api::error::FieldErrors;
use asya_api::flavor::FlavorCatalog;
use asya_api::labels;
use asya_api::review::{
    ActorReview, ParsedActor, ParsedOld, ReviewRequest, review_actor, review_actor_decision,
    review_parsed_decision,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::response::{StatusCause, StatusDetails, StatusSummary};
use serde_json::{Value, json};

use crate::inject::{ActorSettings, inject_pod, is_injected, wants_injection};
use crate::patch::{Touched, injected_patch, pod_patch};

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

/// AsyncActors by namespace and name, as the injection path needs them.
pub trait ActorLookup: Send + Sync {
    fn get(&self, namespace: &str, name: &str) -> Option<Value>;

    /// The object and its resourceVersion, read together; lookups that know versions
    /// enable [`SettingsMemo`].
    fn get_versioned(&self, namespace: &str, name: &str) -> Option<(Value, Option<String>)> {
        self.get(namespace, name).map(|v| (v, None))
    }

    /// The resourceVersion alone (cheap: nothing parsed), when known.
    fn version(&self, _namespace: &str, _name: &str) -> Option<String> {
        None
    }
}

impl ActorLookup for HashMap<(String, String), Value> {
    fn get(&self, namespace: &str, name: &str) -> Option<Value> {
        HashMap::get(self, &(namespace.to_string(), name.to_string())).cloned()
    }
}

/// What admission reads: configuration and cache snapshots. No API calls.
pub struct Ctx<'a> {
    pub config: &'a ClusterConfig,
    pub catalog: &'a FlavorCatalog,
    pub actors: &'a dyn ActorLookup,
    /// Inject a native sidecar (init container with `restartPolicy: Always`).
    pub native_sidecar: bool,
    /// Injection settings already worked out, when the caller keeps them across requests.
    /// Only valid for one `config` (the server's never changes).
    pub memo: Option<&'a SettingsMemo>,
}

/// What [`settings_for_pod`] answers.
pub type PodSettings = Result<(ActorSettings, Vec<String>), (u16, String)>;

/// The answer of [`settings_for_pod`] for pods of an AsyncActor, kept per actor version and
/// flavor catalog: every replica and rollout of an actor asks the same question, and the
/// answer changes only with the AsyncActor (its resourceVersion) or the catalog (its id).
#[derive(Default)]
pub struct SettingsMemo {
    settings: std::sync::Mutex<HashMap<(String, String), MemoEntry>>,
    /// The containers injection adds, rendered once (they depend on the settings only).
    rendered: crate::patch::RenderCache,
}

struct MemoEntry {
    version: String,
    catalog: u64,
    settings: PodSettings,
}

/// Bound on remembered actors; past it the memo starts over (each entry is ~1 KiB).
const MEMO_MAX: usize = 4096;

impl SettingsMemo {
    fn get(&self, ns: &str, name: &str, version: &str, catalog: u64) -> Option<PodSettings> {
        let m = self.settings.lock().unwrap_or_else(|e| e.into_inner());
        m.get(&(ns.to_string(), name.to_string()))
            .filter(|e| e.version == version && e.catalog == catalog)
            .map(|e| e.settings.clone())
    }

    fn put(&self, ns: &str, name: &str, version: String, catalog: u64, settings: &PodSettings) {
        let mut m = self.settings.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() >= MEMO_MAX {
            m.clear();
        }
        m.insert(
            (ns.to_string(), name.to_string()),
            MemoEntry {
                version,
                catalog,
                settings: settings.clone(),
            },
        );
    }

    pub fn len(&self) -> usize {
        self.settings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A body that is not an AdmissionReview: answered with HTTP 400 and this text.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct BadRequest(pub String);

/// An admitted object as the request carries it, kept as JSON: review and injection read
/// JSON, so parsing it into a `DynamicObject` and serializing it back is saved. Like a
/// `DynamicObject`, it must be a JSON object whose `metadata`, when present, parses as
/// `ObjectMeta`.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(transparent)]
pub struct RawObject {
    pub value: Value,
    #[serde(skip)]
    metadata: ObjectMeta,
}

impl<'de> serde::Deserialize<'de> for RawObject {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let value = Value::deserialize(d)?;
        let Value::Object(map) = &value else {
            return Err(D::Error::invalid_type(
                serde::de::Unexpected::Other("a non-object"),
                &"an object",
            ));
        };
        let metadata = match map.get("metadata") {
            Some(m) => ObjectMeta::deserialize(m).map_err(D::Error::custom)?,
            None => ObjectMeta::default(),
        };
        Ok(RawObject { value, metadata })
    }
}

impl kube::Resource for RawObject {
    type DynamicType = ();
    type Scope = kube::core::DynamicResourceScope;
    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The outcome, for the response and the metrics.
#[derive(Debug)]
pub struct Handled {
    pub review: AdmissionReview<DynamicObject>,
    pub operation: &'static str,
    /// `allowed`, `patched` or `denied`.
    pub result: &'static str,
}

fn op_name(op: &Operation) -> &'static str {
    match op {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

/// Parse and answer one AdmissionReview body.
pub fn handle(endpoint: Endpoint, body: &[u8], ctx: &Ctx<'_>) -> Result<Handled, BadRequest> {
    let fast = match endpoint {
        Endpoint::MutatePods => handle_pod_create(body, ctx),
        Endpoint::ValidateActors => handle_actor_validation(body, ctx),
        Endpoint::MutateActors => None,
    };
    match fast {
        Some(h) => Ok(h),
        None => handle_reference(endpoint, body, ctx),
    }
}

/// The common validation (an AsyncActor CREATE or UPDATE whose spec has no unknown field)
/// through the cheaper parse of [`crate::wire`]: the spec is parsed from the request's
/// text, not through a JSON `Value`. `None` whenever that parse cannot vouch for the same
/// answer as [`handle_reference`], which then answers. Public for the equivalence tests.
#[doc(hidden)]
pub fn handle_actor_validation(body: &[u8], ctx: &Ctx<'_>) -> Option<Handled> {
    let (types, req) = crate::wire::request(body)?;
    if req.kind.group != ACTOR_GROUP || req.kind.kind != ACTOR_KIND {
        return None;
    }
    // The old parse checks an `oldObject` whatever the operation; only an UPDATE reads it.
    let old = req.old_object.map(crate::wire::actor);
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
    let object = crate::wire::actor(req.object?)?;
    let actor = ParsedActor::from_text(&object.metadata, object.spec?.get())?;
    let operation = op_name(&req.operation);
    let resp = allowing(types, req.uid);
    let span = tracing::debug_span!("admit", endpoint = Endpoint::ValidateActors.as_str(), uid = %resp.uid, operation, dry_run = req.dry_run);
    let _g = span.enter();
    let review = review_parsed_decision(
        actor,
        old,
        req.namespace.as_deref(),
        ctx.catalog,
        ctx.config,
    );
    Some(handled(validated(resp, review, &req.name), operation))
}

/// The common pod request (a CREATE of a plain pod) through the cheaper parse of
/// [`crate::wire`]; `None` whenever that parse cannot vouch for the same answer as
/// [`handle_reference`], which then answers. Public for the equivalence tests.
#[doc(hidden)]
pub fn handle_pod_create(body: &[u8], ctx: &Ctx<'_>) -> Option<Handled> {
    let (types, req) = crate::wire::request(body)?;
    // What `pod` answers without looking at the object goes the reference way; so does an
    // `oldObject`, which the reference parse checks.
    if !req.kind.group.is_empty()
        || req.kind.kind != "Pod"
        || req.operation != Operation::Create
        || req.old_object.is_some()
    {
        return None;
    }
    let pod = crate::wire::pod(req.object?)?;
    let operation = op_name(&req.operation);
    let resp = allowing(types, req.uid);
    let span = tracing::debug_span!("admit", endpoint = Endpoint::MutatePods.as_str(), uid = %resp.uid, operation, dry_run = req.dry_run);
    let _g = span.enter();
    let resp = admit_pod(pod, req.namespace, resp, ctx, PatchBy::Parts);
    Some(handled(resp, operation))
}

/// As `AdmissionResponse::from(&request)` for the fast paths (kube keeps that the only
/// public constructor from a request): the types and uid, allowed, nothing else.
fn allowing(types: kube::core::TypeMeta, uid: String) -> AdmissionResponse {
    let mut resp = AdmissionResponse::invalid("");
    resp.types = types;
    resp.uid = uid;
    resp.allowed = true;
    resp.result = Default::default();
    resp
}

fn handled(resp: AdmissionResponse, operation: &'static str) -> Handled {
    let result = if !resp.allowed {
        "denied"
    } else if resp.patch.is_some() {
        "patched"
    } else {
        "allowed"
    };
    Handled {
        review: resp.into_review(),
        operation,
        result,
    }
}

/// [`handle`] with every body parsed as kube's `AdmissionReview`: the answer for whatever
/// [`handle_pod_create`] does not take, and the reference it is tested against.
#[doc(hidden)]
pub fn handle_reference(
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

    let resp = match endpoint {
        Endpoint::ValidateActors | Endpoint::MutateActors => actor(endpoint, &req, resp, ctx),
        Endpoint::MutatePods => pod(&mut req, resp, ctx),
    };
    Ok(handled(resp, operation))
}

/// Deny with an API-server-like status: every reason in the message and as a cause.
fn deny(
    resp: AdmissionResponse,
    code: u16,
    reason: &str,
    message: String,
    causes: Vec<StatusCause>,
) -> AdmissionResponse {
    let mut r = resp.deny(message);
    r.result.code = code;
    r.result.reason = reason.into();
    r.result.status = Some(StatusSummary::Failure);
    if !causes.is_empty() {
        r.result.details = Some(StatusDetails {
            name: String::new(),
            group: String::new(),
            kind: String::new(),
            uid: String::new(),
            causes,
            retry_after_seconds: 0,
        });
    }
    r
}

fn deny_fields(resp: AdmissionResponse, what: &str, errors: &FieldErrors) -> AdmissionResponse {
    let causes = errors
        .iter()
        .map(|e| StatusCause {
            reason: "FieldValueInvalid".into(),
            message: e.detail(),
            field: e.path.clone(),
        })
        .collect();
    let n = errors.len();
    let msg = format!(
        "{what} is invalid ({n} {}): {errors}",
        if n == 1 { "error" } else { "errors" }
    );
    deny(resp, 422, "Invalid", msg, causes)
}

fn with_warnings(mut resp: AdmissionResponse, warnings: Vec<String>) -> AdmissionResponse {
    if !warnings.is_empty() {
        resp.warnings = Some(warnings);
    }
    resp
}

fn kind_mismatch(
    resp: AdmissionResponse,
    want: &str,
    req: &AdmissionRequest<RawObject>,
) -> AdmissionResponse {
    let k = &req.kind;
    deny(
        resp,
        400,
        "BadRequest",
        format!(
            "this endpoint admits {want}, not {}/{} {}: check the webhook configuration's rules",
            k.group, k.version, k.kind
        ),
        vec![],
    )
}

/// `mutated`: whether the caller needs [`ActorReview::mutated`] (only the mutating endpoint).
fn actor_review(
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

fn actor(
    endpoint: Endpoint,
    req: &AdmissionRequest<RawObject>,
    resp: AdmissionResponse,
    ctx: &Ctx<'_>,
) -> AdmissionResponse {
    if req.kind.group != ACTOR_GROUP || req.kind.kind != ACTOR_KIND {
        return kind_mismatch(resp, "asya.sh AsyncActor", req);
    }
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return resp;
    }
    let Some(obj) = req.object.as_ref().map(|o| &o.value) else {
        return deny(
            resp,
            400,
            "BadRequest",
            format!("{} request without an object", op_name(&req.operation)),
            vec![],
        );
    };
    let old = match req.operation {
        Operation::Update => req.old_object.as_ref().map(|o| &o.value),
        _ => None,
    };
    let ns = req.namespace.as_deref();
    let mutating = endpoint == Endpoint::MutateActors;
    let review = actor_review(obj, old, ns, ctx, mutating);
    if !mutating || !review.allowed() {
        return validated(resp, review, &req.name);
    }
    match review.mutated.as_ref() {
        None => with_warnings(resp, review.warnings),
        Some(mutated) => {
            let patch = json_patch::diff(obj, mutated);
            if patch.0.is_empty() {
                // Nothing rewritten: the validating webhook reports the warnings.
                return resp;
            }
            // Only the warnings the rewrite resolves (aliases); the validating webhook sees
            // the rewritten object and reports the rest, so none is shown twice.
            let after = actor_review(mutated, old, ns, ctx, false);
            let warnings = review
                .warnings
                .into_iter()
                .filter(|w| !after.warnings.contains(w))
                .collect();
            match serde_json::to_vec(&patch) {
                Ok(bytes) => patched(resp, bytes, warnings),
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

/// `resp` allowing with the encoded JSON patch `bytes` and `warnings`.
fn patched(resp: AdmissionResponse, bytes: Vec<u8>, warnings: Vec<String>) -> AdmissionResponse {
    // `with_patch` is the only way to set the patch type; the bytes are already encoded.
    match resp.clone().with_patch(json_patch::Patch(Vec::new())) {
        Ok(mut r) => {
            r.patch = Some(bytes);
            with_warnings(r, warnings)
        }
        Err(e) => cannot_encode_patch(resp, e),
    }
}

fn cannot_encode_patch(resp: AdmissionResponse, e: impl std::fmt::Display) -> AdmissionResponse {
    deny(
        resp,
        500,
        "InternalError",
        format!("cannot encode the patch: {e}"),
        vec![],
    )
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
    let review = actor_review(obj, None, Some(ns), ctx, false);
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

fn pod(
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
    admit_pod(pod, req.namespace.clone(), resp, ctx, PatchBy::WholePod)
}

/// How [`admit_pod`] works out the patch.
#[derive(Clone, Copy)]
enum PatchBy {
    /// The whole pod copied before injection and [`pod_patch`]: the reference.
    WholePod,
    /// Only the parts injection changes copied, and [`injected_patch`]: the same bytes.
    Parts,
}

/// The copy [`PatchBy`] takes before injecting.
enum Before {
    Pod(Box<Pod>),
    Parts(Touched),
}

/// Injection into a pod being created, however it was parsed. `req_ns`: the request's
/// namespace.
fn admit_pod(
    mut pod: Pod,
    req_ns: Option<String>,
    resp: AdmissionResponse,
    ctx: &Ctx<'_>,
    by: PatchBy,
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
    if pod.spec.is_none() {
        return deny(resp, 400, "BadRequest", "pod has no spec".into(), vec![]);
    }
    // The patch compares typed-before with typed-after (see `patch`).
    let before = match by {
        PatchBy::WholePod => Before::Pod(Box::new(pod.clone())),
        PatchBy::Parts => Before::Parts(Touched::cloned(&pod)),
    };
    // Present: checked above.
    let spec = pod.spec.get_or_insert_default();
    if let Err(e) = inject_pod(
        &mut pod.metadata,
        spec,
        &settings,
        ctx.config,
        ctx.native_sidecar,
    ) {
        return deny(
            resp,
            422,
            "Invalid",
            format!("cannot inject the Asya sidecar: {e}"),
            vec![],
        );
    }
    let patch = match before {
        Before::Pod(before) => pod_patch(*before, pod),
        Before::Parts(before) => injected_patch(&before, &pod, ctx.memo.map(|m| &m.rendered)),
    };
    let patch = match patch {
        Ok(p) => p,
        Err(e) => return deny(resp, 500, "InternalError", e.to_string(), vec![]),
    };
    patched(resp, patch, warnings)
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct WireResponse<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<&'a kube::core::Status>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    warnings: Option<&'a Vec<String>>,
    #[serde(skip_serializing_if = "std::collections::HashMap::is_empty")]
    audit_annotations: &'a HashMap<String, String>,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct WireReview<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: WireResponse<'a>,
}

/// The response body as the API server expects it. `patch` is base64 (Go's encoding of
/// `[]byte`) rather than kube-core's array of numbers: a quarter of the size, and the form
/// every Kubernetes client documents. Written piece by piece, the patch encoded straight
/// into the body: the same bytes as [`encode_review_reference`] (serde of `WireReview`).
pub fn encode_review(
    review: &AdmissionReview<DynamicObject>,
) -> Result<Vec<u8>, serde_json::Error> {
    use base64::Engine;
    let Some(r) = review.response.as_ref() else {
        return serde_json::to_vec(review);
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    let patch_len = r.patch.as_ref().map_or(0, |p| p.len() * 4 / 3 + 4);
    let mut out = Vec::with_capacity(256 + patch_len);
    out.extend_from_slice(
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"#,
    );
    serde_json::to_writer(&mut out, &r.uid)?;
    out.extend_from_slice(if r.allowed {
        br#","allowed":true"#
    } else {
        br#","allowed":false"#
    });
    if !r.allowed {
        out.extend_from_slice(br#","status":"#);
        serde_json::to_writer(&mut out, &r.result)?;
    }
    if let Some(p) = &r.patch {
        out.extend_from_slice(br#","patch":""#);
        // Base64 needs no JSON escaping.
        let start = out.len();
        out.resize(start + base64::encoded_len(p.len(), true).unwrap_or(0), 0);
        let n = b64
            .encode_slice(p, &mut out[start..])
            .map_err(serde::ser::Error::custom)?;
        out.truncate(start + n);
        out.extend_from_slice(br#"","patchType":"JSONPatch""#);
    }
    if let Some(w) = &r.warnings {
        out.extend_from_slice(br#","warnings":"#);
        serde_json::to_writer(&mut out, w)?;
    }
    if !r.audit_annotations.is_empty() {
        out.extend_from_slice(br#","auditAnnotations":"#);
        serde_json::to_writer(&mut out, &r.audit_annotations)?;
    }
    out.extend_from_slice(b"}}");
    Ok(out)
}

/// [`encode_review`] through serde, the reference it is tested against.
#[doc(hidden)]
pub fn encode_review_reference(
    review: &AdmissionReview<DynamicObject>,
) -> Result<Vec<u8>, serde_json::Error> {
    use base64::Engine;
    let Some(r) = review.response.as_ref() else {
        return serde_json::to_vec(review);
    };
    let patch = r
        .patch
        .as_ref()
        .map(|p| base64::engine::general_purpose::STANDARD.encode(p));
    let wire = WireReview {
        api_version: "admission.k8s.io/v1",
        kind: "AdmissionReview",
        response: WireResponse {
            uid: &r.uid,
            allowed: r.allowed,
            status: (!r.allowed).then_some(&r.result),
            patch_type: patch.as_ref().map(|_| "JSONPatch"),
            patch,
            warnings: r.warnings.as_ref(),
            audit_annotations: &r.audit_annotations,
        },
    };
    serde_json::to_vec(&wire)
}
