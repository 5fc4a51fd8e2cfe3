//! Building the AdmissionResponse (allow, deny with an API-server-like status, patch,
//! warnings) and encoding the review the API server reads.

use asya_api::error::FieldErrors;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::core::response::{StatusCause, StatusDetails, StatusSummary};

use super::{Handled, RawObject};

/// As `AdmissionResponse::from(&request)` for the fast paths (kube keeps that the only
/// public constructor from a request): the types and uid, allowed, nothing else.
pub(super) fn allowing(types: kube::core::TypeMeta, uid: String) -> AdmissionResponse {
    let mut resp = AdmissionResponse::invalid("");
    resp.types = types;
    resp.uid = uid;
    resp.allowed = true;
    resp.result = Default::default();
    resp
}

pub(super) fn handled(resp: AdmissionResponse, operation: &'static str) -> Handled {
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
        privilege: None,
    }
}

/// Deny with an API-server-like status: every reason in the message and as a cause.
pub(super) fn deny(
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

pub(super) fn deny_fields(
    resp: AdmissionResponse,
    what: &str,
    errors: &FieldErrors,
) -> AdmissionResponse {
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

pub(super) fn with_warnings(
    mut resp: AdmissionResponse,
    warnings: Vec<String>,
) -> AdmissionResponse {
    if !warnings.is_empty() {
        resp.warnings = Some(warnings);
    }
    resp
}

pub(super) fn kind_mismatch(
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

/// `resp` allowing with the encoded JSON patch `bytes` and `warnings`.
pub(super) fn patched(
    resp: AdmissionResponse,
    bytes: Vec<u8>,
    warnings: Vec<String>,
) -> AdmissionResponse {
    // `with_patch` is the only way to set the patch type; the bytes are already encoded.
    match resp.clone().with_patch(json_patch::Patch(Vec::new())) {
        Ok(mut r) => {
            r.patch = Some(bytes);
            with_warnings(r, warnings)
        }
        Err(e) => cannot_encode_patch(resp, e),
    }
}

pub(super) fn cannot_encode_patch(
    resp: AdmissionResponse,
    e: impl std::fmt::Display,
) -> AdmissionResponse {
    deny(
        resp,
        500,
        "InternalError",
        format!("cannot encode the patch: {e}"),
        vec![],
    )
}

/// The response body as the API server expects it. `patch` is base64 (Go's encoding of
/// `[]byte`) rather than kube-core's array of numbers: a quarter of the size, and the form
/// every Kubernetes client documents. Written piece by piece, the patch encoded straight
/// into the body (the tests check it against a serde encoding of the same fields).
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
