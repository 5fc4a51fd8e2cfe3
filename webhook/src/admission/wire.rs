//! A cheaper parse of the common admission requests: a pod to inject, an AsyncActor to
//! validate.
//!
//! [`crate::admission::handle`] used to parse every body as kube's
//! `AdmissionReview<RawObject>`: the object became a `serde_json::Value` tree, its metadata
//! was parsed again into `ObjectMeta`, and a pod was then converted from the tree into a
//! typed `Pod`. Here the envelope is parsed with the same types as kube's, except that the
//! objects are borrowed as raw JSON text, and a pod (or an AsyncActor's metadata and spec)
//! is parsed from that text straight into its typed form.
//!
//! The answer must not change, so this parse is only trusted where it provably accepts no
//! more than the old one did, and yields the same object: on any doubt (a parse error, an
//! unusual number or escape, deep nesting, a request of another kind) the caller falls back
//! to the old parse, which also keeps every error message as it was.

use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::core::admission::{AdmissionResponse, Operation};
use kube::core::{GroupVersionKind, GroupVersionResource, TypeMeta};
use serde::Deserialize;
use serde_json::value::RawValue;

/// kube's `AdmissionReview`, field for field (same types and serde attributes, so it
/// accepts exactly the same envelopes), with the objects left as text.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WireReview<'a> {
    #[serde(flatten)]
    pub types: TypeMeta,
    #[serde(borrow)]
    pub request: Option<WireRequest<'a>>,
    // Never used, but parsed as before: a malformed one must still be refused.
    #[serde(default)]
    #[allow(dead_code)]
    pub response: Option<AdmissionResponse>,
}

/// kube's `AdmissionRequest`, field for field, with the objects left as text.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // Fields parsed only so that the same bodies are accepted.
pub(crate) struct WireRequest<'a> {
    pub uid: String,
    pub kind: GroupVersionKind,
    pub resource: GroupVersionResource,
    #[serde(default)]
    pub sub_resource: Option<String>,
    #[serde(default)]
    pub request_kind: Option<GroupVersionKind>,
    #[serde(default)]
    pub request_resource: Option<GroupVersionResource>,
    #[serde(default)]
    pub request_sub_resource: Option<String>,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    pub operation: Operation,
    pub user_info: UserInfo,
    #[serde(borrow)]
    pub object: Option<&'a RawValue>,
    #[serde(borrow)]
    pub old_object: Option<&'a RawValue>,
    #[serde(default)]
    pub dry_run: bool,
    #[serde(default)]
    pub options: Option<RawExtension>,
}

/// The request of a v1 AdmissionReview, and the review's types; `None` for anything else
/// (the old parse then answers, with its error).
pub(crate) fn request(body: &[u8]) -> Option<(TypeMeta, WireRequest<'_>)> {
    let review: WireReview<'_> = serde_json::from_slice(body).ok()?;
    if review.types.kind != "AdmissionReview" || review.types.api_version != "admission.k8s.io/v1" {
        return None;
    }
    Some((review.types, review.request?))
}

/// A pod as k8s-openapi's `Pod` parses it, but as strict as the old parse about
/// `metadata`: present, it must be an `ObjectMeta` (`null` is refused, where `Pod` would
/// take it as absent). Repeated keys are refused (the old parse kept the last): only a
/// fallback, never a different answer.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodWire {
    // Present, a string (`Pod` refuses `null`); absent, not checked.
    #[serde(default, deserialize_with = "some_string")]
    api_version: Option<String>,
    #[serde(default, deserialize_with = "some_string")]
    kind: Option<String>,
    #[serde(default)]
    metadata: ObjectMeta,
    spec: Option<PodSpec>,
    status: Option<PodStatus>,
}

fn some_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    String::deserialize(d).map(Some)
}

/// The pod in `raw`, when the old parse surely accepted `raw` (as the `object` of a
/// request) and made the same `Pod` of it; `None` when in doubt.
pub(crate) fn pod(raw: &RawValue) -> Option<Pod> {
    let p: PodWire = serde_json::from_str(object_text(raw)?).ok()?;
    // What `Pod`'s own deserializer checks.
    if p.api_version.as_deref().is_some_and(|v| v != "v1")
        || p.kind.as_deref().is_some_and(|k| k != "Pod")
    {
        return None;
    }
    Some(Pod {
        metadata: p.metadata,
        spec: p.spec,
        status: p.status,
    })
}

/// An AsyncActor as the old parse read it, with its spec left as text.
#[derive(Deserialize)]
pub(crate) struct ActorWire<'a> {
    // Present, it must be an `ObjectMeta` (`null` is refused), as `RawObject` wants.
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(borrow, default)]
    pub spec: Option<&'a RawValue>,
}

/// The AsyncActor in `raw` (an AdmissionReview's object), when the old parse surely
/// accepted `raw` and reads the same metadata and spec from it; `None` when in doubt.
/// A repeated `metadata` or `spec` is refused (the old parse kept the last).
pub(crate) fn actor(raw: &RawValue) -> Option<ActorWire<'_>> {
    serde_json::from_str(object_text(raw)?).ok()
}

/// The text of an object the old parse took as it is: a JSON object (the structs here
/// would also take an array), and [`plain`].
fn object_text(raw: &RawValue) -> Option<&str> {
    let text = raw.get();
    (text.starts_with('{') && plain(text)).then_some(text)
}

/// Deepest nesting taken here. The old parse refused an object nested past 125 levels
/// (serde_json's limit of 127, less the envelope and the request): far below that.
const MAX_DEPTH: usize = 100;

/// Whether the (syntactically valid) JSON text has nothing the raw capture lets through
/// but the old parse into a `Value` refused: numbers out of `f64` range (so no exponent
/// and no long literal is taken), lone surrogates in `\u` escapes (so no `\uD…` escape is
/// taken), nesting past the old depth limit. Conservative: `false` only costs a fallback.
fn plain(text: &str) -> bool {
    let b = text.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                i += 1;
                loop {
                    match b.get(i) {
                        Some(b'"') => break,
                        Some(b'\\') => {
                            if b.get(i + 1) == Some(&b'u')
                                && matches!(b.get(i + 2), Some(b'd' | b'D'))
                            {
                                return false;
                            }
                            i += 2;
                        }
                        Some(_) => i += 1,
                        None => return false,
                    }
                }
                i += 1;
            }
            b'{' | b'[' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return false;
                }
                i += 1;
            }
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while let Some(&c) = b.get(i) {
                    match c {
                        b'0'..=b'9' | b'-' | b'+' | b'.' => i += 1,
                        b'e' | b'E' => return false,
                        _ => break,
                    }
                }
                // 20 characters stay far inside `f64` range.
                if i - start > 20 {
                    return false;
                }
            }
            _ => i += 1,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_refuses_what_the_value_parse_might() {
        assert!(plain(r#"{"a": [1, -2.5, "x\"y\\", true, null, "\u00e9"]}"#));
        assert!(!plain(r#"{"a": 1e400}"#));
        assert!(!plain(r#"{"a": 1E4}"#));
        assert!(!plain(r#"{"a": 123456789012345678901234567890}"#));
        assert!(!plain(r#"{"a": "\ud800"}"#));
        assert!(!plain(r#"{"a": "\uDC00"}"#));
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert!(!plain(&deep));
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(plain(&ok));
        // Brackets and `e` inside strings are text.
        assert!(plain(r#"{"e": "[[[[1e9]]]]"}"#));
    }
}
