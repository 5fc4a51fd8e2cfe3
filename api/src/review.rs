//! The admission decision for one AsyncActor, as one pure function: parse, normalise aliases,
//! default `actor`/`transport`, check immutability, resolve flavors, apply defaults, validate,
//! enforce policy. The webhook, `asya-webhook validate` and the provisioner all call this.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::Value;

use crate::config::ClusterConfig;
use crate::error::{ErrorKind, FieldError, FieldErrors};
use crate::flavor::{self, FlavorCatalog, Resolution};
use crate::normalize::normalize_spec;
use crate::policy;
use crate::resolved::{ResolvedActor, apply_defaults};
use crate::types::{AsyncActor, AsyncActorSpec};
use crate::validate::{self, Context};

/// One object to review.
pub struct ReviewRequest<'a> {
    /// The AsyncActor as JSON (an AdmissionReview's `object`, or a document from a file).
    pub object: &'a Value,
    /// The stored object on UPDATE.
    pub old_object: Option<&'a Value>,
    /// Namespace when the object does not carry one (AdmissionReview `namespace`).
    pub namespace: Option<&'a str>,
    pub catalog: &'a FlavorCatalog,
    pub config: &'a ClusterConfig,
}

/// The decision. `errors` empty means allowed.
#[derive(Debug, Default)]
pub struct ActorReview {
    /// The object as the mutating webhook stores it: aliases rewritten, `actor` and
    /// `transport` defaulted (nothing else: other defaults depend on flavors).
    pub mutated: Option<Value>,
    pub warnings: Vec<String>,
    pub errors: FieldErrors,
    /// The effective actor, when the object is valid.
    pub resolved: Option<ResolvedActor>,
    /// Flavors listed but not found.
    pub missing_flavors: Vec<String>,
    /// Which flavor set which field of the resolved spec (to name it in a refusal).
    pub origins: crate::flavor::Origins,
}

impl ActorReview {
    pub fn allowed(&self) -> bool {
        self.errors.is_empty()
    }
}

/// Parses the spec from raw JSON: type errors name their path, unknown fields become
/// warnings (the API server prunes them), and a `command` is refused outright.
fn parse_spec(
    object: &Value,
    warnings: &mut Vec<String>,
    errors: &mut FieldErrors,
) -> Option<AsyncActorSpec> {
    let raw = match object.get("spec") {
        None | Some(Value::Null) => {
            errors.push(FieldError::required("spec", "an AsyncActor needs a spec"));
            return None;
        }
        Some(s) => s,
    };
    // Fast path: most specs parse; tracking the path of every field costs an allocation per
    // key, so it is only done again to name the path of an error.
    let mut unknown = Vec::new();
    let fast = AsyncActorSpec::deserialize(serde_ignored::Deserializer::new(
        raw,
        &mut |p: serde_ignored::Path<'_>| unknown.push(p.to_string()),
    ));
    let result: Result<AsyncActorSpec, _> = match fast {
        Ok(spec) => Ok(spec),
        Err(_) => {
            unknown.clear();
            serde_path_to_error::deserialize(serde_ignored::Deserializer::new(
                raw,
                &mut |p: serde_ignored::Path<'_>| unknown.push(p.to_string()),
            ))
        }
    };
    for u in unknown {
        if u == "command" {
            errors.push(FieldError::forbidden("spec.command", "the runtime container's command is managed by Asya; use spec.pythonExecutable to choose the interpreter"));
        } else {
            warnings.push(format!("unknown field spec.{u} ignored"));
        }
    }
    match result {
        Ok(spec) => Some(spec),
        Err(e) => {
            let path = e.path().to_string();
            let at = if path == "." {
                "spec".to_string()
            } else {
                format!("spec.{path}")
            };
            let value = lookup(raw, e.path()).cloned().unwrap_or(Value::Null);
            errors.push(FieldError::invalid(at, value, e.inner().to_string()));
            None
        }
    }
}

/// A spec parsed from its JSON text, and whether the text had fields the type does not
/// know (which [`review_actor`] would warn of, or refuse, as `command`). `None` when it does
/// not parse. For text a JSON `Value` holds exactly (numbers within `f64`, no lone
/// surrogates, nesting within serde_json's limit), the spec is the one [`review_actor`]
/// parses from that text's `Value`. A key given twice, where the `Value` keeps the last,
/// either fails here (a field of a derived struct) or is taken last here too (maps and
/// Kubernetes types), or is an unknown field, reported either way.
pub fn spec_from_text(text: &str) -> Option<(AsyncActorSpec, bool)> {
    let mut unknown = false;
    let mut de = serde_json::Deserializer::from_str(text);
    let spec = AsyncActorSpec::deserialize(serde_ignored::Deserializer::new(
        &mut de,
        &mut |_: serde_ignored::Path<'_>| unknown = true,
    ))
    .ok()?;
    de.end().ok()?;
    Some((spec, unknown))
}

/// The value at a serde path, to quote it back to the user.
fn lookup<'v>(root: &'v Value, path: &serde_path_to_error::Path) -> Option<&'v Value> {
    let mut v = root;
    for seg in path.iter() {
        v = match seg {
            serde_path_to_error::Segment::Seq { index } => v.get(index)?,
            serde_path_to_error::Segment::Map { key } => v.get(key)?,
            _ => return None,
        };
    }
    Some(v)
}

/// Normalises and defaults the identity fields; shared by the new and the old object.
fn prepare(
    spec: &mut AsyncActorSpec,
    name: &str,
    config: &ClusterConfig,
) -> crate::normalize::Normalized {
    let n = normalize_spec(spec, "spec.");
    if spec.actor.is_none() {
        spec.actor = Some(name.to_string());
    }
    if spec.transport.is_none() {
        spec.transport = Some(config.default_transport.clone());
    }
    n
}

/// What a review is for: the rules of admission (the object as its author writes it), or
/// the review of a stored object (the provisioner's, on every reconcile).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// A CREATE (no `old_object`) or an UPDATE that changes the spec: also the rules that
    /// only a write can break ([`admission_errors`]).
    Admission,
    /// An object already stored: what admitted it then is not asked again, so an actor
    /// admitted before a limit was lowered (or before generateName was refused) keeps running.
    Stored,
}

/// Reviews one AsyncActor, as admission does.
pub fn review_actor(req: &ReviewRequest<'_>) -> ActorReview {
    review(req, true, Purpose::Admission)
}

/// [`review_actor`] without [`ActorReview::mutated`] (left `None`), for callers that need
/// only the decision and the resolved actor (validation, injection): it saves copying the
/// object. Everything else is the same.
pub fn review_actor_decision(req: &ReviewRequest<'_>) -> ActorReview {
    review(req, false, Purpose::Admission)
}

/// [`review_actor_decision`] of a stored actor: without the rules only a write can break
/// ([`admission_errors`]). For readers of what is already stored (the webhook's injection of
/// an actor's pods, the provisioner), so an actor admitted before a limit was lowered keeps
/// working.
pub fn review_stored_decision(req: &ReviewRequest<'_>) -> ActorReview {
    review(req, false, Purpose::Stored)
}

fn review(req: &ReviewRequest<'_>, with_mutated: bool, purpose: Purpose) -> ActorReview {
    let mut out = ActorReview::default();
    let meta = meta_of(req.object);
    let spec_bytes = match (purpose, req.object.get("spec")) {
        (Purpose::Admission, Some(raw)) => Some(json_len(raw)),
        _ => None,
    };
    let Some(spec) = parse_spec(req.object, &mut out.warnings, &mut out.errors) else {
        return out;
    };
    let old = req.old_object.map(|old| {
        let mut ignore_w = Vec::new();
        let mut ignore_e = FieldErrors::default();
        let name = old
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .map(str::to_string);
        ParsedOld {
            name,
            spec: parse_spec(old, &mut ignore_w, &mut ignore_e),
        }
    });
    decide(
        out,
        &meta,
        Parsed { spec, spec_bytes },
        old,
        with_mutated.then_some(req.object),
        req.namespace,
        req.catalog,
        req.config,
    )
}

/// The length of `v` as compact JSON, without writing it out.
fn json_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    // Writing a `Value` to a writer that never fails cannot fail.
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// The object's metadata as the review reads it: absent or malformed, empty.
fn meta_of(object: &Value) -> ObjectMeta {
    object
        .get("metadata")
        .and_then(|m| ObjectMeta::deserialize(m).ok())
        .unwrap_or_default()
}

/// An AsyncActor parsed from its text, more cheaply than through a JSON `Value` (the
/// webhook's requests).
pub struct ParsedActor<'a> {
    metadata: &'a ObjectMeta,
    spec: AsyncActorSpec,
    /// The length of the spec's text, which the size limit is checked against.
    spec_bytes: usize,
}

impl<'a> ParsedActor<'a> {
    /// `None` when the spec does not parse or has a field its type does not know: only
    /// [`review_actor`] warns of those (or refuses them, as `command`), so such an object
    /// must go that way. See [`spec_from_text`] for the text this is exact for.
    ///
    /// The size limit (`policy.maxSpecBytes`) is checked against the text's length, which
    /// for the API server's compact JSON is within a few bytes of what [`review_actor`]
    /// measures (the `Value` written back compactly: escapes and number forms may differ).
    /// A caller that must answer exactly as [`review_actor`] does leaves a spec near the limit
    /// to it (the webhook sends one over half the limit that way).
    pub fn from_text(metadata: &'a ObjectMeta, spec: &str) -> Option<Self> {
        match spec_from_text(spec)? {
            (parsed, false) => Some(Self {
                metadata,
                spec: parsed,
                spec_bytes: spec.len(),
            }),
            (_, true) => None,
        }
    }
}

/// The stored object of an UPDATE, parsed from its text: its `metadata.name`, and its spec.
pub struct ParsedOld {
    name: Option<String>,
    spec: Option<AsyncActorSpec>,
}

impl ParsedOld {
    /// `spec`: the stored spec's text, `None` when it has none (or `null`), which the review
    /// reads as no spec. `None` when the spec does not parse: [`review_actor`] might still
    /// parse it from a `Value`. Its unknown fields do not matter: only its identity is read.
    pub fn from_text(name: Option<String>, spec: Option<&str>) -> Option<Self> {
        let spec = match spec {
            None => None,
            Some(text) => Some(spec_from_text(text)?.0),
        };
        Some(Self { name, spec })
    }
}

/// What a review of a parsed object returns besides the decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParsedReview {
    /// The decision alone, as [`review_actor_decision`] (the validating endpoint).
    Decision,
    /// The decision and [`ActorReview::mutated`] holding only `{"spec": <the rewritten
    /// spec>}` (the rewrite never touches anything else), so the mutating endpoint diffs it
    /// against `{"spec": <the spec>}` without building the whole object.
    Mutation,
}

/// [`review_actor`] of an object given parsed: the same review as for the object it was
/// parsed from.
pub fn review_parsed(
    actor: ParsedActor<'_>,
    old: Option<ParsedOld>,
    namespace: Option<&str>,
    catalog: &FlavorCatalog,
    config: &ClusterConfig,
    wanted: ParsedReview,
) -> ActorReview {
    let spec_only = Value::Object(serde_json::Map::new());
    let mutated_from = match wanted {
        ParsedReview::Decision => None,
        ParsedReview::Mutation => Some(&spec_only),
    };
    decide(
        ActorReview::default(),
        actor.metadata,
        Parsed {
            spec: actor.spec,
            spec_bytes: Some(actor.spec_bytes),
        },
        old,
        mutated_from,
        namespace,
        catalog,
        config,
    )
}

/// The spec as parsed, and its size in bytes when the review is an admission's.
struct Parsed {
    spec: AsyncActorSpec,
    spec_bytes: Option<usize>,
}

/// The rules only a write can break, checked at admission and not again on a stored
/// object: a CREATE names its actor (`metadata.name`, never `generateName`), and the spec
/// is within `policy.maxSpecBytes`.
pub fn admission_errors(
    meta: &ObjectMeta,
    creating: bool,
    spec_bytes: usize,
    config: &ClusterConfig,
) -> FieldErrors {
    let mut errs = FieldErrors::default();
    if creating {
        match (meta.name.as_deref(), meta.generate_name.as_deref()) {
            // The validating webhook sees the generated name beside generateName: refused
            // all the same, so both endpoints answer alike.
            (_, Some(generate)) => errs.push(FieldError::invalid(
                "metadata.generateName",
                generate,
                "an AsyncActor is created with metadata.name: its queue, ServiceAccount and \
                 workload are named after it, and admission checks them (identity, privilege, \
                 queue collisions) under that name, which a generated name is not known as \
                 before the object is stored; set metadata.name instead",
            )),
            (None | Some(""), None) => errs.push(FieldError::required(
                "metadata.name",
                "an AsyncActor needs a name: its queue, ServiceAccount and workload are named \
                 after it",
            )),
            _ => {}
        }
    }
    let max = config.policy.max_spec_bytes;
    if spec_bytes > max {
        errs.push(FieldError::too_long(
            "spec",
            format!(
                "{spec_bytes} bytes, over the limit of {max} (policy.maxSpecBytes in the cluster configuration)"
            ),
        ));
    }
    errs
}

/// Everything after parsing. `old`: the stored object's name and spec, on UPDATE;
/// `mutated_from`: the object, when the caller wants [`ActorReview::mutated`].
#[allow(clippy::too_many_arguments)]
fn decide(
    mut out: ActorReview,
    meta: &ObjectMeta,
    parsed: Parsed,
    old: Option<ParsedOld>,
    mutated_from: Option<&Value>,
    namespace: Option<&str>,
    catalog: &FlavorCatalog,
    config: &ClusterConfig,
) -> ActorReview {
    let Parsed {
        mut spec,
        spec_bytes,
    } = parsed;
    if let Some(bytes) = spec_bytes {
        out.errors
            .extend(admission_errors(meta, old.is_none(), bytes, config));
    }
    // The name only: with generateName the name is not known yet on the mutating endpoint,
    // and the generated prefix is nobody's identity (refused above at admission).
    let name = meta.name.clone().unwrap_or_default();
    let namespace = meta
        .namespace
        .clone()
        .or_else(|| namespace.map(str::to_string))
        .unwrap_or_else(|| "default".into());

    let n = prepare(&mut spec, &name, config);
    out.warnings.extend(n.warnings);
    out.errors.extend(n.errors);

    if let Some(ParsedOld {
        name: old_name,
        spec: Some(mut old_spec),
    }) = old
    {
        let old_name = old_name.unwrap_or_else(|| name.clone());
        prepare(&mut old_spec, &old_name, config);
        let queue =
            crate::naming::actor_queue(&namespace, old_spec.actor.as_deref().unwrap_or_default());
        for (field, new, old) in [
            ("actor", &spec.actor, &old_spec.actor),
            ("transport", &spec.transport, &old_spec.transport),
        ] {
            if new != old {
                out.errors.push(FieldError::invalid(
                    format!("spec.{field}"),
                    new.clone().unwrap_or_default(),
                    format!(
                        "field is immutable (was {:?}): the actor's queue {queue} lives on it; create a new AsyncActor instead",
                        old.clone().unwrap_or_default()
                    ),
                ));
            }
        }
    }

    if let Some(object) = mutated_from {
        let mut mutated = object.clone();
        if let (Some(obj), Ok(v)) = (mutated.as_object_mut(), serde_json::to_value(&spec)) {
            obj.insert("spec".into(), v);
        }
        out.mutated = Some(mutated);
    }

    let resolution = match flavor::resolve(&spec, &namespace, catalog, &config.policy) {
        Ok(r) => r,
        Err(errs) => {
            // The list itself (count, names, duplicates) is wrong or right whatever the
            // flavors hold: report it with the merge errors, as "every error at once" asks.
            out.errors
                .extend(crate::validate::flavor_list_errors(&spec.flavors));
            out.errors.extend(errs);
            return out;
        }
    };
    let Resolution {
        spec: merged,
        flavors,
        missing,
        warnings,
        origins,
    } = resolution;
    out.warnings.extend(warnings);
    out.missing_flavors = missing.clone();
    let (effective, errors) = check_effective(merged, &missing, &origins, &namespace, config);
    out.errors.extend(errors);
    out.warnings.extend(crate::state_proxy::warnings(
        &effective.state_proxy,
        &config.state_proxy,
    ));
    let namespaced: Vec<&str> = flavors
        .iter()
        .filter(|f| matches!(f.source, flavor::FlavorSource::ConfigMap { .. }))
        .map(|f| f.name.as_str())
        .collect();
    out.errors
        .extend(crate::privilege::namespaced_flavor_errors(
            &name,
            &effective,
            &origins,
            &namespaced,
        ));
    out.origins = origins;
    if out.errors.is_empty() {
        if effective.workload.is_some() && crate::resolved::handler_of(&effective).is_none() {
            out.warnings.push("no handler set (spec.handler or ASYA_HANDLER in the asya-runtime container): the image must set ASYA_HANDLER itself".into());
        }
        out.resolved = ResolvedActor::build(
            &name,
            &namespace,
            effective,
            config,
            flavors.into_iter().map(|f| f.name).collect(),
            missing,
        );
    }
    out
}

/// Validation and policy on the merged spec, with each error attributed to the flavor that
/// set the value. While flavors are missing, a required field may still arrive with them, so
/// "Required" errors wait rather than reject.
/// Returns the defaulted spec it checked too, so the caller does not default it again.
fn check_effective(
    mut effective: AsyncActorSpec,
    missing: &[String],
    origins: &crate::flavor::Origins,
    namespace: &str,
    config: &ClusterConfig,
) -> (AsyncActorSpec, FieldErrors) {
    apply_defaults(&mut effective);
    // A bare `asya-state-proxy` connector is the platform's image: policy checks that one.
    crate::state_proxy::resolve_images(&mut effective.state_proxy, &config.state_proxy.image);
    let ctx = Context { namespace, config };
    let mut errs = validate::validate_spec(&effective, &ctx);
    errs.extend(policy::check(&effective, namespace, &config.policy));
    let errs = errs
        .into_iter()
        .filter(|e| missing.is_empty() || !matches!(e.kind, ErrorKind::Required { .. }))
        .map(|e| {
            let origin = origins.flavor_of(&e.path).map(str::to_string);
            e.from_flavor(origin.as_deref())
        })
        .collect::<Vec<_>>()
        .into();
    (effective, errs)
}

impl From<Vec<FieldError>> for FieldErrors {
    fn from(v: Vec<FieldError>) -> Self {
        FieldErrors(v)
    }
}

/// The review of a stored actor (the provisioner's): the same decision without the rules
/// only a write can break ([`admission_errors`]).
pub fn review_typed(
    actor: &AsyncActor,
    catalog: &FlavorCatalog,
    config: &ClusterConfig,
) -> ActorReview {
    let object = serde_json::to_value(actor).unwrap_or(Value::Null);
    review(
        &ReviewRequest {
            object: &object,
            old_object: None,
            namespace: None,
            catalog,
            config,
        },
        true,
        Purpose::Stored,
    )
}
