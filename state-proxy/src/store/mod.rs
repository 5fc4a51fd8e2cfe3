//! The backends behind the contract. One enum rather than a trait object: two backends,
//! and async methods stay plain.

pub mod meta;
pub mod redis;
pub mod s3;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;

use crate::error::ProxyError;
use crate::keys::Listing;

/// An object being read: its size (for Content-Length) and its bytes, streamed.
pub struct Object {
    pub size: u64,
    pub body: Body,
}

/// What `HEAD /keys/{key}` answers: a key is a file; a key with keys below it a directory.
#[derive(Debug, PartialEq, Eq)]
pub struct Head {
    pub size: u64,
    pub is_file: bool,
    /// When the file was last written (`Last-Modified`: the runtime's `st_mtime`).
    pub modified: Option<std::time::SystemTime>,
}

/// The answer of `GET /meta/{key}`: `{"attrs": [...]}`, or `{"value": ...}` with `?attr=`.
pub type Meta = serde_json::Value;

pub enum Store {
    S3(s3::S3Store),
    // Boxed: it holds its connection pool and is much larger than the S3 store.
    Redis(Box<redis::RedisStore>),
}

impl Store {
    pub async fn get(&self, key: &str) -> Result<Object, ProxyError> {
        match self {
            Store::S3(s) => s.get(key).await,
            Store::Redis(r) => r.get(key).await,
        }
    }

    pub async fn put(
        &self,
        key: &str,
        body: Body,
        exclusive: bool,
        content_length: Option<u64>,
    ) -> Result<(), ProxyError> {
        match self {
            Store::S3(s) => s.put(key, body, exclusive, content_length).await,
            Store::Redis(r) => r.put(key, body, exclusive, content_length).await,
        }
    }

    pub async fn head(&self, key: &str) -> Result<Head, ProxyError> {
        match self {
            Store::S3(s) => s.head(key).await,
            Store::Redis(r) => r.head(key).await,
        }
    }

    pub async fn delete(&self, key: &str) -> Result<(), ProxyError> {
        match self {
            Store::S3(s) => s.delete(key).await,
            Store::Redis(r) => r.delete(key).await,
        }
    }

    pub async fn list(&self, prefix: &str, delimiter: Option<&str>) -> Result<Listing, ProxyError> {
        match self {
            Store::S3(s) => s.list(prefix, delimiter).await,
            Store::Redis(r) => r.list(prefix, delimiter).await,
        }
    }

    pub async fn meta_get(&self, key: &str, attr: Option<&str>) -> Result<Meta, ProxyError> {
        match self {
            Store::S3(s) => s.meta_get(key, attr).await,
            Store::Redis(r) => r.meta_get(key, attr).await,
        }
    }

    pub async fn meta_put(&self, key: &str, attr: &str, value: &str) -> Result<(), ProxyError> {
        match self {
            Store::S3(s) => s.meta_put(key, attr, value).await,
            Store::Redis(r) => r.meta_put(key, attr, value).await,
        }
    }
}

/// Reads a whole body into memory, refusing one over `limit` bytes as soon as it is
/// (413), so a buffered connector's memory is bounded by `limit` per write.
pub async fn read_bounded(body: Body, limit: u64, key: &str) -> Result<Bytes, ProxyError> {
    let too_large = || ProxyError::TooLarge {
        key: key.to_string(),
        limit,
    };
    let mut stream = body.into_data_stream();
    let mut buf = BytesMut::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| body_error(key, e))?;
        if (buf.len() + chunk.len()) as u64 > limit {
            return Err(too_large());
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

/// The client's body broke off (it disconnected or sent less than it announced).
pub fn body_error(key: &str, e: impl std::fmt::Display) -> ProxyError {
    ProxyError::BodyBroken {
        key: key.to_string(),
        detail: e.to_string(),
    }
}
