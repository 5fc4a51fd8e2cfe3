//! `redis-buffered-cas`: one Redis hash per key at `{namespace}/{STATE_PREFIX}/{key}` (`d` the
//! bytes, `v` the version, `t` the write's time, `m:{attr}` the attributes), and per namespace
//! a sorted set of its keys (the index, for listings) and a version counter, both under
//! `{namespace}/` with a control character in their names (`Scope::internal_key`).
//!
//! It runs under the namespace's ACL user (`asya_api::state_proxy::redis_acl`): keys `~{ns}/*`
//! and only [`COMMANDS`]. So no SCAN (it lists every key of the server, whatever the user's
//! key patterns) and no Lua (a script that never ends stalls the whole server): listings read
//! the index with ZRANGEBYLEX, and a write is an optimistic transaction, WATCH the key, check
//! its version, MULTI, write the hash and the index, EXEC, which Redis aborts if the key
//! changed in between: a real compare-and-set, and the hash and its index entry change
//! together. Versions come from the namespace's counter, so a key deleted and created again
//! never repeats a version a reader may hold (no ABA).

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, IntoConnectionInfo};
use tokio::sync::{OnceCell, Semaphore};

use super::{Head, Meta, Object, meta, read_bounded};
use crate::cas::{self, Condition, Seen, SeenVersions};
use crate::config::{RedisAuth, redact_url};
use crate::error::ProxyError;
use crate::keys::Listing;
use crate::listing::IndexWalk;
use crate::scope::Scope;

/// Every command this module sends (the namespace's ACL user allows these and no other;
/// a test checks this list against `asya_api::state_proxy::redis_acl::COMMANDS`).
pub const COMMANDS: [&str; 15] = [
    "exists",
    "hget",
    "hmget",
    "hkeys",
    "hstrlen",
    "zrangebylex",
    "hset",
    "del",
    "incr",
    "zadd",
    "zrem",
    "watch",
    "unwatch",
    "multi",
    "exec",
];

const READ_ONLY_ATTRS: [&str; 2] = ["size", "version"];
const MAX_LIST_ENTRIES: usize = 100_000;
/// Index members per ZRANGEBYLEX: a flat listing reads many at once; one grouped by the
/// delimiter jumps past each directory, so it reads fewer to waste fewer.
const LIST_BATCH: usize = 1000;
const GROUPED_BATCH: usize = 128;
/// Connections of their own for transactions (WATCH is per connection), so at most this many
/// conditional writes at once; the others wait for one.
const TX_CONNECTIONS: usize = 8;
/// A transaction whose EXEC was aborted (the key changed after the check: another write, an
/// attribute) is checked and tried again, at most this many times, then 409.
const TX_ATTEMPTS: usize = 10;
/// The index's and the counter's names, after `{namespace}/\u{1}`.
pub const INDEX_NAME: &str = "asya-state-proxy-index";
pub const COUNTER_NAME: &str = "asya-state-proxy-version";

/// What a Redis Cluster node answers for a key it does not serve. This connector speaks to
/// one Redis (a primary): a write's transaction WATCHes the file's hash and writes it with the
/// namespace's index and version counter, keys a cluster would put in different slots, and
/// the client follows no redirection. So a cluster is named as the cause, not passed on as an
/// unexplained MOVED (state-proxy/README.md, "Redis").
fn is_cluster_answer(e: &redis::RedisError) -> bool {
    e.is_cluster_error() || e.code() == Some("CROSSSLOT")
}

/// A Redis failure as the contract's error: no connection is 503, a timeout 504.
fn redis_error(e: redis::RedisError, timeout: Duration) -> ProxyError {
    if is_cluster_answer(&e) {
        ProxyError::Backend(format!(
            "REDIS_URL is a Redis Cluster node, which redis-buffered-cas does not support \
             (it needs one Redis primary: a write's transaction spans the file's key and its \
             namespace's index and counter): {e}"
        ))
    } else if e.is_timeout() {
        ProxyError::Timeout(timeout.as_secs())
    } else if e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped() {
        ProxyError::Unavailable(e.to_string())
    } else {
        ProxyError::Backend(e.to_string())
    }
}

/// What one run of a transaction decided: done (a value or a refusal), or aborted by EXEC
/// because the watched key changed, so run again.
enum Tx<T> {
    Done(T),
    Again,
}

pub struct RedisStore {
    client: redis::Client,
    /// Reads, listings, deletes and unconditional writes: one multiplexed connection.
    conn: OnceCell<ConnectionManager>,
    /// Idle connections for transactions, and the bound on them.
    idle: Mutex<Vec<MultiplexedConnection>>,
    tx_slots: Semaphore,
    scope: Scope,
    index: String,
    counter: String,
    timeout: Duration,
    max_buffer: u64,
    seen: SeenVersions,
}

impl RedisStore {
    /// Connects lazily: a connector whose Redis is down still starts and answers 503. With
    /// `auth`, it authenticates as that user (the URL then carries none, see `config`).
    pub fn new(
        url: &str,
        auth: Option<&RedisAuth>,
        scope: Scope,
        timeout: Duration,
        max_buffer: u64,
    ) -> Result<RedisStore, ProxyError> {
        let bad_url = || ProxyError::BadRequest {
            field: "REDIS_URL",
            value: redact_url(url),
            rule: "not a Redis URL",
        };
        let info = url.into_connection_info().map_err(|_| bad_url())?;
        // No CLIENT SETINFO after connecting: the namespace's user may not run CLIENT.
        let mut settings = info.redis_settings().clone().set_skip_set_lib_name();
        if let Some(a) = auth {
            settings = settings
                .set_username(&a.username)
                .set_password(&a.password.0);
        }
        let client =
            redis::Client::open(info.set_redis_settings(settings)).map_err(|_| bad_url())?;
        Ok(RedisStore {
            client,
            conn: OnceCell::new(),
            idle: Mutex::new(Vec::new()),
            tx_slots: Semaphore::new(TX_CONNECTIONS),
            index: scope.internal_key(INDEX_NAME),
            counter: scope.internal_key(COUNTER_NAME),
            scope,
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

    /// A future bounded by the connector's timeout, its error as the contract's.
    async fn bounded<T>(
        &self,
        f: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, ProxyError> {
        match tokio::time::timeout(self.timeout, f).await {
            Err(_) => Err(ProxyError::Timeout(self.timeout.as_secs())),
            Ok(r) => r.map_err(|e| redis_error(e, self.timeout)),
        }
    }

    /// One command or pipeline on the shared connection, bounded by the connector's timeout.
    async fn run<T: redis::FromRedisValue>(
        &self,
        f: impl AsyncFnOnce(&mut ConnectionManager) -> redis::RedisResult<T>,
    ) -> Result<T, ProxyError> {
        let mut conn = self.conn().await?;
        self.bounded(f(&mut conn)).await
    }

    /// Runs `step` on a connection of its own until it is done, at most [`TX_ATTEMPTS`]
    /// times (then 409 on `key`). Each run is bounded by the timeout. A connection is
    /// reused only after a run that ended cleanly (EXEC or UNWATCH, so nothing is watched);
    /// one that failed is dropped, and a pooled one that had gone stale is replaced once.
    /// `step` gets a handle of the connection (a clone: the same connection).
    async fn watched<T, F, Fut>(&self, key: &str, mut step: F) -> Result<T, ProxyError>
    where
        F: FnMut(MultiplexedConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<Tx<T>>>,
    {
        let _slot = self
            .tx_slots
            .acquire()
            .await
            .map_err(|_| ProxyError::Unavailable("the connector is shutting down".into()))?;
        let mut replaced_stale = false;
        let mut attempt = 0;
        while attempt < TX_ATTEMPTS {
            let pooled = self.idle.lock().ok().and_then(|mut idle| idle.pop());
            let reused = pooled.is_some();
            let conn = match pooled {
                Some(c) => c,
                None => {
                    let config = AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(self.timeout))
                        .set_response_timeout(Some(self.timeout));
                    self.bounded(
                        self.client
                            .get_multiplexed_async_connection_with_config(&config),
                    )
                    .await?
                }
            };
            match self.bounded(step(conn.clone())).await {
                Ok(outcome) => {
                    if let Ok(mut idle) = self.idle.lock() {
                        idle.push(conn);
                    }
                    match outcome {
                        Tx::Done(v) => return Ok(v),
                        Tx::Again => attempt += 1,
                    }
                }
                Err(ProxyError::Unavailable(_)) if reused && !replaced_stale => {
                    // The server closed an idle connection (a restart, a timeout), and so
                    // likely every idle one: once more, on a new connection.
                    if let Ok(mut idle) = self.idle.lock() {
                        idle.clear();
                    }
                    replaced_stale = true;
                }
                Err(e) => return Err(e),
            }
        }
        self.seen.forget(key);
        Err(ProxyError::Conflict(key.to_string()))
    }

    pub async fn get(&self, key: &str) -> Result<Object, ProxyError> {
        let full = self.scope.key(key)?;
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

    /// The hash of a write and its index entry, in one MULTI/EXEC: `None` when EXEC was
    /// aborted by a WATCH.
    fn write_pipe(&self, full: &str, version: i64, bytes: &[u8]) -> redis::Pipeline {
        // The file's mtime (Last-Modified), in Unix seconds: this connector's clock (TIME
        // would need a script).
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut p = redis::pipe();
        p.atomic()
            .cmd("HSET")
            .arg(full)
            .arg("d")
            .arg(bytes)
            .arg("v")
            .arg(version)
            .arg("t")
            .arg(now)
            .cmd("ZADD")
            .arg(&self.index)
            .arg(0)
            .arg(full);
        p
    }

    pub async fn put(
        &self,
        key: &str,
        body: Body,
        exclusive: bool,
        content_length: Option<u64>,
    ) -> Result<(), ProxyError> {
        let full = self.scope.key(key)?;
        if content_length.is_some_and(|n| n > self.max_buffer) {
            return Err(ProxyError::TooLarge {
                key: key.to_string(),
                limit: self.max_buffer,
            });
        }
        let bytes = read_bounded(body, self.max_buffer, key).await?;
        let condition = cas::write_condition(true, exclusive, self.seen.get(key).as_ref());
        let written: Option<i64> = match &condition {
            // Last writer wins: no check, so no transaction of its own.
            Condition::None => {
                let version: i64 = self
                    .run(async |c| redis::cmd("INCR").arg(&self.counter).query_async(c).await)
                    .await?;
                let pipe = self.write_pipe(&full, version, &bytes);
                let _: Option<(i64, i64)> = self.run(async |c| pipe.query_async(c).await).await?;
                Some(version)
            }
            Condition::IfAbsent | Condition::IfMatch(_) => {
                let (full, condition, bytes) = (&full, &condition, &bytes);
                self.watched(key, |c| self.put_step(c, full, condition, bytes))
                    .await?
            }
        };
        match written {
            Some(version) => {
                self.seen.remember(key, Seen::Version(version.to_string()));
                Ok(())
            }
            None => {
                self.seen.forget(key);
                Err(cas::refusal(&condition, exclusive, key))
            }
        }
    }

    /// One run of a conditional write: WATCH the key, check its version, then the write in
    /// MULTI/EXEC. `Done(None)` when the condition does not hold (the refusal), `Again` when
    /// EXEC was aborted (the key changed after the check).
    async fn put_step(
        &self,
        mut c: MultiplexedConnection,
        full: &str,
        condition: &Condition,
        bytes: &[u8],
    ) -> redis::RedisResult<Tx<Option<i64>>> {
        // The version is taken before the check: one a refused write burns is never used,
        // which is all a version needs.
        let (current, version): (Option<String>, i64) = redis::pipe()
            .cmd("WATCH")
            .arg(full)
            .ignore()
            .cmd("HGET")
            .arg(full)
            .arg("v")
            .cmd("INCR")
            .arg(&self.counter)
            .query_async(&mut c)
            .await?;
        let holds = match condition {
            Condition::IfAbsent => current.is_none(),
            Condition::IfMatch(v) => current.as_deref() == Some(v.as_str()),
            Condition::None => true,
        };
        if !holds {
            let _: () = redis::cmd("UNWATCH").query_async(&mut c).await?;
            return Ok(Tx::Done(None));
        }
        let done: Option<(i64, i64)> = self
            .write_pipe(full, version, bytes)
            .query_async(&mut c)
            .await?;
        Ok(match done {
            Some(_) => Tx::Done(Some(version)),
            None => Tx::Again,
        })
    }

    /// One run of an attribute write: WATCH the key, check that it exists, HSET in MULTI/EXEC.
    async fn meta_step(
        mut c: MultiplexedConnection,
        full: &str,
        field: &str,
        value: &str,
    ) -> redis::RedisResult<Tx<bool>> {
        let (exists,): (bool,) = redis::pipe()
            .cmd("WATCH")
            .arg(full)
            .ignore()
            .cmd("EXISTS")
            .arg(full)
            .query_async(&mut c)
            .await?;
        if !exists {
            let _: () = redis::cmd("UNWATCH").query_async(&mut c).await?;
            return Ok(Tx::Done(false));
        }
        let done: Option<(i64,)> = redis::pipe()
            .atomic()
            .cmd("HSET")
            .arg(full)
            .arg(field)
            .arg(value)
            .query_async(&mut c)
            .await?;
        Ok(match done {
            Some(_) => Tx::Done(true),
            None => Tx::Again,
        })
    }

    /// Whether any key of the namespace starts with `below` (which ends in `/`).
    async fn any_below(&self, below: &str) -> Result<bool, ProxyError> {
        let walk = IndexWalk::new(self.scope.root(), below, false, 1);
        let Some((min, max)) = walk.next_range() else {
            return Ok(false);
        };
        let found: Vec<Vec<u8>> = self
            .run(async |c| {
                redis::cmd("ZRANGEBYLEX")
                    .arg(&self.index)
                    .arg(min)
                    .arg(max)
                    .arg("LIMIT")
                    .arg(0)
                    .arg(1)
                    .query_async(c)
                    .await
            })
            .await?;
        Ok(!found.is_empty())
    }

    pub async fn head(&self, key: &str) -> Result<Head, ProxyError> {
        let full = self.scope.key(key)?;
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
        if self.any_below(&format!("{full}/")).await? {
            Ok(Head {
                size: 0,
                is_file: false,
                modified: None,
            })
        } else {
            Err(ProxyError::NotFound(key.to_string()))
        }
    }

    pub async fn delete(&self, key: &str) -> Result<(), ProxyError> {
        let full = self.scope.key(key)?;
        let (n, _): (u64, u64) = self
            .run(async |c| {
                redis::pipe()
                    .atomic()
                    .cmd("DEL")
                    .arg(&full)
                    .cmd("ZREM")
                    .arg(&self.index)
                    .arg(&full)
                    .query_async(c)
                    .await
            })
            .await?;
        self.seen.forget(key);
        if n == 0 {
            return Err(ProxyError::NotFound(key.to_string()));
        }
        Ok(())
    }

    pub async fn list(&self, prefix: &str, delimiter: Option<&str>) -> Result<Listing, ProxyError> {
        let base = self.scope.list_prefix(prefix)?;
        let grouped = delimiter.is_some();
        let batch = if grouped { GROUPED_BATCH } else { LIST_BATCH };
        let mut walk = IndexWalk::new(self.scope.root(), &base, grouped, MAX_LIST_ENTRIES);
        while let Some((min, max)) = walk.next_range() {
            let members: Vec<Vec<u8>> = self
                .run(async |c| {
                    redis::cmd("ZRANGEBYLEX")
                        .arg(&self.index)
                        .arg(min)
                        .arg(max)
                        .arg("LIMIT")
                        .arg(0)
                        .arg(batch)
                        .query_async(c)
                        .await
                })
                .await?;
            walk.feed(&members, batch);
        }
        Ok(walk.finish())
    }

    pub async fn meta_get(&self, key: &str, attr: Option<&str>) -> Result<Meta, ProxyError> {
        let full = self.scope.key(key)?;
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

    /// Sets an attribute of an existing key only: WATCHed, so a key deleted between the check
    /// and the write is not brought back as a hash of attributes alone.
    pub async fn meta_put(&self, key: &str, attr: &str, value: &str) -> Result<(), ProxyError> {
        meta::writable(&READ_ONLY_ATTRS, key, attr)?;
        let full = self.scope.key(key)?;
        let field = format!("m:{attr}");
        let (full, field) = (&full, &field);
        let set = self
            .watched(key, |c| Self::meta_step(c, full, field, value))
            .await?;
        if !set {
            return Err(ProxyError::NotFound(key.to_string()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_and_counter_are_in_the_namespace_and_no_valid_key() {
        let s = Scope::new("team-a", "p").unwrap();
        for name in [INDEX_NAME, COUNTER_NAME] {
            let k = s.internal_key(name);
            assert!(k.starts_with("team-a/"), "{k:?}");
            assert!(crate::keys::validate_key(&k).is_err());
            assert!(s.relative(&k).is_none(), "not under the mount's root");
        }
    }

    #[test]
    fn the_commands_are_the_namespace_users_allowlist() {
        let mut ours = COMMANDS.to_vec();
        let mut allowed = asya_api::state_proxy::redis_acl::COMMANDS.to_vec();
        ours.sort();
        allowed.sort();
        assert_eq!(ours, allowed);
    }

    #[test]
    fn a_bad_url_never_shows_its_password() {
        let s = Scope::new("n", "").unwrap();
        let e = RedisStore::new("redis://u:hunter2@[bad", None, s, Duration::from_secs(1), 1)
            .err()
            .expect("refused")
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
    }
}
