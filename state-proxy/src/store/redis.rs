//! `redis-buffered-cas`: one Redis hash per key (`d` the bytes, `v` the version, `m:{attr}`
//! the attributes). Every write is a Lua script that compares the version this connector
//! read and writes only if it still holds: a real compare-and-set, atomic in Redis.
//! Versions come from one counter per STATE_PREFIX, so a key deleted and created again
//! never repeats a version a reader may hold (no ABA).

use std::time::{Duration, UNIX_EPOCH};

use axum::body::Body;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::OnceCell;

use super::{Head, Meta, Object, meta, read_bounded};
use crate::cas::{self, Condition, Seen, SeenVersions};
use crate::error::ProxyError;
use crate::keys::{self, Listing};

const READ_ONLY_ATTRS: [&str; 2] = ["size", "version"];
const MAX_LIST_ENTRIES: usize = 100_000;

/// KEYS[1] the key, KEYS[2] the version counter; ARGV[1] the condition (none, absent,
/// match), ARGV[2] the version expected, ARGV[3] the bytes. Answers the new version, -1
/// when the key exists (absent), -2 when its version is not the one expected (match).
/// Field `t` is the server's time of the write (Unix seconds): the file's mtime.
const PUT_SCRIPT: &str = r#"
local cur = redis.call('HGET', KEYS[1], 'v')
if ARGV[1] == 'absent' and cur then return -1 end
if ARGV[1] == 'match' and cur ~= ARGV[2] then return -2 end
local v = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'd', ARGV[3], 'v', tostring(v), 't', redis.call('TIME')[1])
return v
"#;

/// Sets an attribute of an existing key only: 1, or 0 when the key is gone.
const META_SCRIPT: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"#;

pub struct RedisStore {
    client: redis::Client,
    conn: OnceCell<ConnectionManager>,
    prefix: String,
    timeout: Duration,
    max_buffer: u64,
    seen: SeenVersions,
}

/// A Redis failure as the contract's error: no connection is 503, a timeout 504.
fn redis_error(e: redis::RedisError, timeout: Duration) -> ProxyError {
    if e.is_timeout() {
        ProxyError::Timeout(timeout.as_secs())
    } else if e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped() {
        ProxyError::Unavailable(e.to_string())
    } else {
        ProxyError::Backend(e.to_string())
    }
}

/// SCAN's MATCH is a glob: a prefix is matched literally.
pub fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 1);
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The version counter's name: it has a control character, which no valid key has, so it
/// can neither collide with a key nor show in a listing.
fn counter_key(prefix: &str) -> String {
    format!("\u{1}asya-state-proxy-version\u{1}{prefix}")
}

impl RedisStore {
    /// Connects lazily: a connector whose Redis is down still starts and answers 503.
    pub fn new(
        url: &str,
        prefix: String,
        timeout: Duration,
        max_buffer: u64,
    ) -> Result<RedisStore, ProxyError> {
        let client = redis::Client::open(url).map_err(|e| ProxyError::BadRequest {
            field: "REDIS_URL",
            value: url.to_string(),
            rule: if e.is_io_error() {
                "unreachable"
            } else {
                "not a Redis URL"
            },
        })?;
        Ok(RedisStore {
            client,
            conn: OnceCell::new(),
            prefix,
            timeout,
            max_buffer,
            seen: SeenVersions::new(10_000),
        })
    }

    async fn conn(&self) -> Result<ConnectionManager, ProxyError> {
        // Few retries: an unreachable Redis must answer 503 now, not a 504 after backoff.
        let config = ConnectionManagerConfig::new()
            .set_number_of_retries(1)
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let connect = self
            .conn
            .get_or_try_init(|| ConnectionManager::new_with_config(self.client.clone(), config));
        match tokio::time::timeout(self.timeout, connect).await {
            Err(_) => Err(ProxyError::Timeout(self.timeout.as_secs())),
            Ok(r) => r.cloned().map_err(|e| redis_error(e, self.timeout)),
        }
    }

    /// One command or script, bounded by the connector's timeout.
    async fn run<T: redis::FromRedisValue>(
        &self,
        f: impl AsyncFnOnce(&mut ConnectionManager) -> redis::RedisResult<T>,
    ) -> Result<T, ProxyError> {
        let mut conn = self.conn().await?;
        match tokio::time::timeout(self.timeout, f(&mut conn)).await {
            Err(_) => Err(ProxyError::Timeout(self.timeout.as_secs())),
            Ok(r) => r.map_err(|e| redis_error(e, self.timeout)),
        }
    }

    fn full(&self, key: &str) -> String {
        keys::full_key(&self.prefix, key)
    }

    pub async fn get(&self, key: &str) -> Result<Object, ProxyError> {
        let full = self.full(key);
        let (data, version): (Option<Vec<u8>>, Option<String>) = self
            .run(async |c| {
                redis::cmd("HMGET")
                    .arg(&full)
                    .arg("d")
                    .arg("v")
                    .query_async(c)
                    .await
            })
            .await?;
        match (data, version) {
            (Some(data), Some(v)) => {
                self.seen.remember(key, Seen::Version(v));
                Ok(Object {
                    size: data.len() as u64,
                    body: Body::from(data),
                })
            }
            _ => {
                self.seen.remember(key, Seen::Absent);
                Err(ProxyError::NotFound(key.to_string()))
            }
        }
    }

    pub async fn put(
        &self,
        key: &str,
        body: Body,
        exclusive: bool,
        content_length: Option<u64>,
    ) -> Result<(), ProxyError> {
        if content_length.is_some_and(|n| n > self.max_buffer) {
            return Err(ProxyError::TooLarge {
                key: key.to_string(),
                limit: self.max_buffer,
            });
        }
        let bytes = read_bounded(body, self.max_buffer, key).await?;
        let condition = cas::write_condition(true, exclusive, self.seen.get(key).as_ref());
        let (kind, expected) = match &condition {
            Condition::None => ("none", ""),
            Condition::IfAbsent => ("absent", ""),
            Condition::IfMatch(v) => ("match", v.as_str()),
        };
        let (full, counter) = (self.full(key), counter_key(&self.prefix));
        let script = redis::Script::new(PUT_SCRIPT);
        let answer: i64 = self
            .run(async |c| {
                script
                    .key(&full)
                    .key(&counter)
                    .arg(kind)
                    .arg(expected)
                    .arg(bytes.as_ref())
                    .invoke_async(c)
                    .await
            })
            .await?;
        if answer > 0 {
            self.seen.remember(key, Seen::Version(answer.to_string()));
            Ok(())
        } else {
            self.seen.forget(key);
            Err(cas::refusal(&condition, exclusive, key))
        }
    }

    /// Scans keys matching `{full prefix}*`, mount-relative, at most `limit`.
    async fn scan(&self, full_prefix: &str, limit: usize) -> Result<Vec<String>, ProxyError> {
        let pattern = format!("{}*", glob_escape(full_prefix));
        let mut cursor: u64 = 0;
        let mut found = Vec::new();
        loop {
            let (next, batch): (u64, Vec<Vec<u8>>) = self
                .run(async |c| {
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(1000)
                        .query_async(c)
                        .await
                })
                .await?;
            for raw in batch {
                let Ok(k) = String::from_utf8(raw) else {
                    continue;
                };
                if let Some(rel) = keys::strip_state_prefix(&self.prefix, &k)
                    && !rel.chars().any(char::is_control)
                {
                    found.push(rel.to_string());
                }
            }
            cursor = next;
            if cursor == 0 || found.len() >= limit {
                return Ok(found);
            }
        }
    }

    pub async fn head(&self, key: &str) -> Result<Head, ProxyError> {
        let full = self.full(key);
        let (exists, size, modified): (bool, u64, Option<u64>) = self
            .run(async |c| {
                redis::pipe()
                    .cmd("EXISTS")
                    .arg(&full)
                    .cmd("HSTRLEN")
                    .arg(&full)
                    .arg("d")
                    .cmd("HGET")
                    .arg(&full)
                    .arg("t")
                    .query_async(c)
                    .await
            })
            .await?;
        if exists {
            return Ok(Head {
                size,
                is_file: true,
                modified: modified.map(|t| UNIX_EPOCH + Duration::from_secs(t)),
            });
        }
        if self.scan(&format!("{full}/"), 1).await?.is_empty() {
            Err(ProxyError::NotFound(key.to_string()))
        } else {
            Ok(Head {
                size: 0,
                is_file: false,
                modified: None,
            })
        }
    }

    pub async fn delete(&self, key: &str) -> Result<(), ProxyError> {
        let full = self.full(key);
        let n: u64 = self
            .run(async |c| redis::cmd("DEL").arg(&full).query_async(c).await)
            .await?;
        self.seen.forget(key);
        if n == 0 {
            return Err(ProxyError::NotFound(key.to_string()));
        }
        Ok(())
    }

    pub async fn list(&self, prefix: &str, delimiter: Option<&str>) -> Result<Listing, ProxyError> {
        let full_prefix = match (prefix.is_empty(), self.prefix.is_empty()) {
            (true, true) => String::new(),
            (true, false) => format!("{}/", self.prefix),
            (false, _) => self.full(prefix),
        };
        let found = self.scan(&full_prefix, MAX_LIST_ENTRIES).await?;
        Ok(keys::group_listing(prefix, delimiter, found))
    }

    pub async fn meta_get(&self, key: &str, attr: Option<&str>) -> Result<Meta, ProxyError> {
        let full = self.full(key);
        let fields: Vec<String> = self
            .run(async |c| redis::cmd("HKEYS").arg(&full).query_async(c).await)
            .await?;
        if fields.is_empty() {
            return Err(ProxyError::NotFound(key.to_string()));
        }
        let full_ref = &full;
        let value = |field: String| async move {
            let v: Option<String> = self
                .run(async |c| {
                    redis::cmd("HGET")
                        .arg(full_ref)
                        .arg(&field)
                        .query_async(c)
                        .await
                })
                .await?;
            Ok::<_, ProxyError>(v)
        };
        match attr {
            None => Ok(meta::listing(
                &READ_ONLY_ATTRS,
                fields
                    .iter()
                    .filter_map(|f| f.strip_prefix("m:").map(str::to_string)),
            )),
            Some("size") => {
                let n: u64 = self
                    .run(async |c| {
                        redis::cmd("HSTRLEN")
                            .arg(&full)
                            .arg("d")
                            .query_async(c)
                            .await
                    })
                    .await?;
                Ok(serde_json::json!({ "value": n.to_string() }))
            }
            Some("version") => Ok(serde_json::json!({ "value": value("v".into()).await? })),
            Some(a) => meta::user_value(key, a, value(format!("m:{a}")).await?),
        }
    }

    pub async fn meta_put(&self, key: &str, attr: &str, value: &str) -> Result<(), ProxyError> {
        meta::writable(&READ_ONLY_ATTRS, key, attr)?;
        let full = self.full(key);
        let field = format!("m:{attr}");
        let script = redis::Script::new(META_SCRIPT);
        let set: i64 = self
            .run(async |c| {
                script
                    .key(&full)
                    .arg(&field)
                    .arg(value)
                    .invoke_async(c)
                    .await
            })
            .await?;
        if set == 0 {
            return Err(ProxyError::NotFound(key.to_string()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_are_escaped() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
        assert_eq!(glob_escape("runs/"), "runs/");
    }

    #[test]
    fn the_counter_is_no_valid_key() {
        let c = counter_key("p");
        assert!(keys::validate_key(&c, "").is_err());
    }
}
