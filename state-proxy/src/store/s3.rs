//! The S3 connectors: `s3-buffered-lww`, `s3-buffered-cas` (the ETag a read saw goes out as
//! `If-Match`) and `s3-passthrough` (bodies streamed, large ones as a multipart upload that
//! is aborted on any failure, so no partial object is ever visible).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sdk_s3::Client;
use aws_sdk_s3::error::{DisplayErrorContext, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart, MetadataDirective};
use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use tokio::sync::Semaphore;
use tokio_util::io::ReaderStream;

use super::{Head, Meta, Object, body_error, meta, read_bounded};
use crate::cas::{self, Condition, Seen, SeenVersions};
use crate::error::{Failure, ProxyError, classify};
use crate::keys::Listing;
use crate::scope::Scope;

/// Attributes S3 itself keeps; `setxattr` on them is 403.
const READ_ONLY_ATTRS: [&str; 2] = ["size", "etag"];
/// A listing stops here rather than hold an unbounded answer in memory.
const MAX_LIST_ENTRIES: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    BufferedLww,
    BufferedCas,
    Passthrough,
}

pub struct S3Store {
    client: Client,
    bucket: String,
    scope: Scope,
    mode: Mode,
    timeout: Duration,
    max_buffer: u64,
    part_bytes: usize,
    uploads: Arc<Semaphore>,
    seen: SeenVersions,
}

pub struct S3Settings {
    pub bucket: String,
    /// Every object is under `{namespace}/{STATE_PREFIX}/`.
    pub scope: Scope,
    pub mode: Mode,
    pub timeout: Duration,
    pub max_buffer: u64,
    pub part_bytes: usize,
    pub max_uploads: usize,
}

fn failure<E, R>(e: &SdkError<E, R>) -> Failure
where
    R: HttpStatus,
{
    match e {
        SdkError::DispatchFailure(d) if d.is_timeout() => Failure::TimedOut,
        SdkError::DispatchFailure(_) => Failure::Unreachable,
        SdkError::TimeoutError(_) => Failure::TimedOut,
        _ => e
            .raw_response()
            .map(|r| Failure::Status(r.status_u16()))
            .unwrap_or(Failure::Other),
    }
}

/// The status of a raw response, whatever the SDK's response type is.
pub trait HttpStatus {
    fn status_u16(&self) -> u16;
}

impl HttpStatus for aws_sdk_s3::config::http::HttpResponse {
    fn status_u16(&self) -> u16 {
        self.status().as_u16()
    }
}

impl S3Store {
    pub fn new(client: Client, s: S3Settings) -> S3Store {
        S3Store {
            client,
            bucket: s.bucket,
            scope: s.scope,
            mode: s.mode,
            timeout: s.timeout,
            max_buffer: s.max_buffer,
            part_bytes: s.part_bytes,
            uploads: Arc::new(Semaphore::new(s.max_uploads)),
            seen: SeenVersions::new(10_000),
        }
    }

    /// The object key: only ever made by the scope, from a checked key.
    fn full(&self, key: &str) -> Result<String, ProxyError> {
        self.scope.key(key)
    }

    /// One backend call, bounded by the connector's timeout (504 past it).
    async fn call<T, E, R>(
        &self,
        key: &str,
        fut: impl Future<Output = Result<T, SdkError<E, R>>>,
    ) -> Result<Result<T, (Failure, String)>, ProxyError>
    where
        E: std::error::Error + 'static,
        R: HttpStatus + std::fmt::Debug,
    {
        match tokio::time::timeout(self.timeout, fut).await {
            Err(_) => Err(ProxyError::Timeout(self.timeout.as_secs())),
            Ok(Ok(v)) => Ok(Ok(v)),
            Ok(Err(e)) => {
                let detail = DisplayErrorContext(&e).to_string();
                tracing::debug!(key, error = %detail, "S3 call failed");
                Ok(Err((failure(&e), detail)))
            }
        }
    }

    fn fail(&self, key: &str, (f, detail): (Failure, String)) -> ProxyError {
        classify(f, key, self.timeout.as_secs(), &detail)
    }

    pub async fn get(&self, key: &str) -> Result<Object, ProxyError> {
        let full = self.full(key)?;
        let req = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(&full)
            .send();
        match self.call(key, req).await? {
            Ok(out) => {
                if let Some(etag) = out.e_tag() {
                    self.seen.remember(key, Seen::Version(etag.to_string()));
                }
                let size = out.content_length().unwrap_or(0).max(0) as u64;
                let reader = out.body.into_async_read();
                Ok(Object {
                    size,
                    // 256 KiB reads: ReaderStream's 4 KiB default costs a frame per 4 KiB.
                    body: Body::from_stream(ReaderStream::with_capacity(reader, 256 * 1024)),
                })
            }
            Err((Failure::Status(404), _)) => {
                self.seen.remember(key, Seen::Absent);
                Err(ProxyError::NotFound(key.to_string()))
            }
            Err(f) => Err(self.fail(key, f)),
        }
    }

    pub async fn put(
        &self,
        key: &str,
        body: Body,
        exclusive: bool,
        content_length: Option<u64>,
    ) -> Result<(), ProxyError> {
        let seen = self.seen.get(key);
        let condition =
            cas::write_condition(self.mode == Mode::BufferedCas, exclusive, seen.as_ref());
        if self.mode == Mode::Passthrough {
            return self.put_streamed(key, body, &condition, exclusive).await;
        }
        if let Some(n) = content_length.filter(|n| *n > self.max_buffer) {
            tracing::debug!(key, n, "refused before reading");
            return Err(ProxyError::TooLarge {
                key: key.to_string(),
                limit: self.max_buffer,
            });
        }
        let bytes = read_bounded(body, self.max_buffer, key).await?;
        self.put_one(key, bytes, &condition, exclusive).await
    }

    /// One PutObject with the write's condition; remembers the new ETag on success.
    async fn put_one(
        &self,
        key: &str,
        bytes: Bytes,
        condition: &Condition,
        exclusive: bool,
    ) -> Result<(), ProxyError> {
        let mut req = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(self.full(key)?)
            .body(ByteStream::from(bytes));
        req = match condition {
            Condition::None => req,
            Condition::IfAbsent => req.if_none_match("*"),
            Condition::IfMatch(etag) => req.if_match(etag),
        };
        match self.call(key, req.send()).await? {
            Ok(out) => {
                self.after_write(key, out.e_tag());
                Ok(())
            }
            Err(f) => Err(self.write_refusal(key, f, condition, exclusive)),
        }
    }

    fn after_write(&self, key: &str, etag: Option<&str>) {
        match etag {
            Some(e) => self.seen.remember(key, Seen::Version(e.to_string())),
            None => self.seen.forget(key),
        }
    }

    /// 412 from a conditional write is the condition failing; which refusal that is
    /// depends on the condition. A lost race must be read again, so its version is forgotten.
    fn write_refusal(
        &self,
        key: &str,
        f: (Failure, String),
        condition: &Condition,
        exclusive: bool,
    ) -> ProxyError {
        let err = match (&f.0, condition) {
            (Failure::Status(412 | 409), Condition::IfAbsent | Condition::IfMatch(_)) => {
                cas::refusal(condition, exclusive, key)
            }
            // S3 answers 404 to If-Match on a key deleted since the read.
            (Failure::Status(404), Condition::IfMatch(_)) => {
                cas::refusal(condition, exclusive, key)
            }
            _ => self.fail(key, f),
        };
        if matches!(err, ProxyError::Conflict(_)) {
            self.seen.forget(key);
        }
        err
    }

    /// Passthrough: at most `part_bytes` (plus one chunk) of the body in memory per upload,
    /// and at most `max_uploads` uploads at once. A body that fits one part is one PutObject.
    async fn put_streamed(
        &self,
        key: &str,
        body: Body,
        condition: &Condition,
        exclusive: bool,
    ) -> Result<(), ProxyError> {
        let _permit = self
            .uploads
            .acquire()
            .await
            .map_err(|_| ProxyError::Unavailable("the connector is shutting down".into()))?;
        let mut stream = body.into_data_stream();
        let mut buf = BytesMut::new();
        let mut eof = false;
        while buf.len() < self.part_bytes {
            match stream.next().await {
                Some(chunk) => buf.extend_from_slice(&chunk.map_err(|e| body_error(key, e))?),
                None => {
                    eof = true;
                    break;
                }
            }
        }
        if eof {
            return self.put_one(key, buf.freeze(), condition, exclusive).await;
        }
        if exclusive {
            // Checked before sending gigabytes; CompleteMultipartUpload's If-None-Match
            // closes the race where the server supports it.
            match self.head(key).await {
                Ok(_) => return Err(ProxyError::Exists(key.to_string())),
                Err(ProxyError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let full = self.full(key)?;
        let create = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(&full)
            .send();
        let upload_id = match self.call(key, create).await? {
            Ok(out) => out.upload_id().unwrap_or_default().to_string(),
            Err(f) => return Err(self.fail(key, f)),
        };
        let mut guard = AbortOnDrop {
            client: self.client.clone(),
            bucket: self.bucket.clone(),
            key: full.clone(),
            upload_id: Some(upload_id.clone()),
        };
        let mut parts = Vec::new();
        let mut total: u64 = 0;
        loop {
            let number = parts.len() as i32 + 1;
            let part = buf.split().freeze();
            total += part.len() as u64;
            let req = self
                .client
                .upload_part()
                .bucket(&self.bucket)
                .key(&full)
                .upload_id(&upload_id)
                .part_number(number)
                .body(ByteStream::from(part))
                .send();
            let out = match self.call(key, req).await? {
                Ok(out) => out,
                Err(f) => return Err(self.fail(key, f)),
            };
            parts.push(
                CompletedPart::builder()
                    .part_number(number)
                    .set_e_tag(out.e_tag().map(str::to_string))
                    .build(),
            );
            if eof {
                break;
            }
            while buf.len() < self.part_bytes {
                match stream.next().await {
                    Some(chunk) => buf.extend_from_slice(&chunk.map_err(|e| body_error(key, e))?),
                    None => {
                        eof = true;
                        break;
                    }
                }
            }
            if eof && buf.is_empty() {
                break;
            }
        }
        let expected = multipart_etag(parts.iter().map(|p| p.e_tag().unwrap_or_default()));
        let complete = self
            .client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(&full)
            .upload_id(&upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            );
        let complete = match exclusive {
            true => complete.if_none_match("*"),
            false => complete,
        };
        match self.call(key, complete.send()).await? {
            Ok(out) => {
                guard.upload_id = None;
                self.after_write(key, out.e_tag());
                Ok(())
            }
            // A 2xx whose body the SDK could not parse: done if the object is exactly the
            // one these parts make (its multipart ETag and size), not merely "some object".
            Err((Failure::Status(200..=299), detail)) => {
                let out = self.head_object(key).await?;
                let etag = out.e_tag().map(|e| e.trim_matches('"').to_string());
                if expected.is_some()
                    && etag == expected
                    && out.content_length() == Some(total as i64)
                {
                    guard.upload_id = None;
                    self.after_write(key, out.e_tag());
                    Ok(())
                } else {
                    Err(ProxyError::Backend(detail))
                }
            }
            Err(f) => Err(self.write_refusal(key, f, condition, exclusive)),
        }
    }

    pub async fn head(&self, key: &str) -> Result<Head, ProxyError> {
        let req = self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(self.full(key)?)
            .send();
        match self.call(key, req).await? {
            Ok(out) => Ok(Head {
                size: out.content_length().unwrap_or(0).max(0) as u64,
                is_file: true,
                modified: out
                    .last_modified()
                    .and_then(|t| SystemTime::try_from(*t).ok()),
            }),
            Err((Failure::Status(404), _)) => {
                // A "directory": some key below it exists.
                let below = format!("{}/", self.full(key)?);
                let req = self
                    .client
                    .list_objects_v2()
                    .bucket(&self.bucket)
                    .prefix(below)
                    .max_keys(1)
                    .send();
                match self.call(key, req).await? {
                    Ok(out) if out.key_count().unwrap_or(0) > 0 => Ok(Head {
                        size: 0,
                        is_file: false,
                        modified: None,
                    }),
                    Ok(_) => Err(ProxyError::NotFound(key.to_string())),
                    Err(f) => Err(self.fail(key, f)),
                }
            }
            Err(f) => Err(self.fail(key, f)),
        }
    }

    /// `os.remove` of a missing file is FileNotFoundError, so a missing key is 404 (S3's
    /// DeleteObject alone would answer 204).
    pub async fn delete(&self, key: &str) -> Result<(), ProxyError> {
        let head = self.head(key).await?;
        if !head.is_file {
            return Err(ProxyError::BadKey {
                key: key.to_string(),
                rule: "names a directory; delete the keys below it",
            });
        }
        let req = self
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(self.full(key)?)
            .send();
        match self.call(key, req).await? {
            Ok(_) => {
                self.seen.forget(key);
                Ok(())
            }
            Err(f) => Err(self.fail(key, f)),
        }
    }

    pub async fn list(&self, prefix: &str, delimiter: Option<&str>) -> Result<Listing, ProxyError> {
        // The mount's root is `{namespace}/` or `{namespace}/{STATE_PREFIX}/`, never the bucket.
        let full_prefix = self.scope.list_prefix(prefix)?;
        let mut listing = Listing::default();
        let mut token: Option<String> = None;
        loop {
            let mut req = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(&full_prefix)
                .set_continuation_token(token.take());
            if let Some(d) = delimiter {
                req = req.delimiter(d);
            }
            let out = match self.call(prefix, req.send()).await? {
                Ok(out) => out,
                Err(f) => return Err(self.fail(prefix, f)),
            };
            for o in out.contents() {
                if let Some(k) = o.key().and_then(|k| self.scope.relative(k)) {
                    listing.keys.push(k.to_string());
                }
            }
            for p in out.common_prefixes() {
                if let Some(k) = p.prefix().and_then(|k| self.scope.relative(k)) {
                    listing.prefixes.push(k.to_string());
                }
            }
            token = out.next_continuation_token().map(str::to_string);
            if token.is_none() || listing.keys.len() + listing.prefixes.len() >= MAX_LIST_ENTRIES {
                break;
            }
        }
        listing.keys.sort();
        listing.prefixes.sort();
        Ok(listing)
    }

    async fn head_object(
        &self,
        key: &str,
    ) -> Result<aws_sdk_s3::operation::head_object::HeadObjectOutput, ProxyError> {
        let req = self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(self.full(key)?)
            .send();
        self.call(key, req).await?.map_err(|f| self.fail(key, f))
    }

    pub async fn meta_get(&self, key: &str, attr: Option<&str>) -> Result<Meta, ProxyError> {
        let out = self.head_object(key).await?;
        let user: HashMap<String, String> = out.metadata().cloned().unwrap_or_default();
        let size = out.content_length().unwrap_or(0).to_string();
        let etag = out.e_tag().unwrap_or_default().to_string();
        match attr {
            None => Ok(meta::listing(&READ_ONLY_ATTRS, user.into_keys())),
            Some("size") => Ok(serde_json::json!({ "value": size })),
            Some("etag") => Ok(serde_json::json!({ "value": etag })),
            Some(a) => meta::user_value(key, a, user.get(a).cloned()),
        }
    }

    /// S3 metadata is set only with the object: a copy onto itself with the new metadata
    /// (server-side, no bytes through the connector).
    pub async fn meta_put(&self, key: &str, attr: &str, value: &str) -> Result<(), ProxyError> {
        meta::writable(&READ_ONLY_ATTRS, key, attr)?;
        let out = self.head_object(key).await?;
        let mut user: HashMap<String, String> = out.metadata().cloned().unwrap_or_default();
        user.insert(attr.to_string(), value.to_string());
        let full = self.full(key)?;
        let source = format!("{}/{}", self.bucket, encode_copy_source(&full));
        let mut req = self
            .client
            .copy_object()
            .bucket(&self.bucket)
            .key(&full)
            .copy_source(source)
            .metadata_directive(MetadataDirective::Replace)
            .set_metadata(Some(user));
        if let Some(etag) = out.e_tag() {
            // Not over a newer write that came in between.
            req = req.copy_source_if_match(etag);
        }
        match self.call(key, req.send()).await? {
            Ok(_) => Ok(()),
            Err((Failure::Status(412), _)) => Err(ProxyError::Conflict(key.to_string())),
            Err(f) => Err(self.fail(key, f)),
        }
    }
}

/// The ETag S3 gives an object made of parts: the MD5 of the parts' binary MD5s, then
/// `-{parts}`. None if a part's ETag is not a hex MD5 (then no check can succeed).
pub fn multipart_etag<'a>(part_etags: impl Iterator<Item = &'a str>) -> Option<String> {
    use md5::{Digest, Md5};
    let mut outer = Md5::new();
    let mut n = 0;
    for etag in part_etags {
        let hex = etag.trim_matches('"');
        if hex.len() != 32 {
            return None;
        }
        for i in (0..32).step_by(2) {
            outer.update([u8::from_str_radix(hex.get(i..i + 2)?, 16).ok()?]);
        }
        n += 1;
    }
    let digest = outer.finalize();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    Some(format!("{hex}-{n}"))
}

/// CopyObject's source is URL-encoded; `/` separates segments and stays.
pub fn encode_copy_source(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Aborts a multipart upload unless it completed: on an error, and when the request is
/// dropped (the client went away, the connector is stopping), so its parts do not linger.
struct AbortOnDrop {
    client: Client,
    bucket: String,
    key: String,
    upload_id: Option<String>,
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        let Some(upload_id) = self.upload_id.take() else {
            return;
        };
        let req = self
            .client
            .abort_multipart_upload()
            .bucket(&self.bucket)
            .key(&self.key)
            .upload_id(upload_id)
            .send();
        let key = self.key.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = req.await {
                    tracing::warn!(key, error = %DisplayErrorContext(&e), "aborting a multipart upload failed");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipart_etags_are_md5_of_md5s() {
        // Two parts whose MD5s are those of "a" and "b"; md5(md5("a") ++ md5("b")).
        let a = "0cc175b9c0f1b6a831c399e269772661";
        let b = "92eb5ffee6ae2fec3ad71c777531578f";
        let got = multipart_etag(
            [format!("\"{a}\""), b.to_string()]
                .iter()
                .map(String::as_str),
        );
        let mut raw = Vec::new();
        for h in [a, b] {
            for i in (0..32).step_by(2) {
                raw.push(u8::from_str_radix(&h[i..i + 2], 16).unwrap());
            }
        }
        use md5::{Digest, Md5};
        let want: String = Md5::digest(&raw)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(got, Some(format!("{want}-2")));
        assert_eq!(multipart_etag(["nothex"].into_iter()), None);
    }

    #[test]
    fn copy_source_is_encoded() {
        assert_eq!(encode_copy_source("p/a b/ü.json"), "p/a%20b/%C3%BC.json");
        assert_eq!(encode_copy_source("a+b"), "a%2Bb");
    }
}
