//! The platform's Redis as the provisioner uses it: with the admin identity of the cluster
//! configuration (`stateProxy.redis`), it sets and deletes the namespaces' ACL users and their
//! owner marks. Connected on first use; every call bounded. Passwords are arguments of
//! `ACL SETUSER` only, never logged.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::OnceCell;

use asya_api::state_proxy::redis_acl;

use super::StateError;
use super::plan::owner_key;

const TIMEOUT: Duration = Duration::from_secs(5);

pub struct RedisAdmin {
    client: redis::Client,
    conn: OnceCell<ConnectionManager>,
}

fn unavailable(e: redis::RedisError) -> StateError {
    if e.is_io_error() || e.is_timeout() || e.is_connection_refusal() || e.is_connection_dropped() {
        StateError::Unavailable(e.to_string())
    } else {
        StateError::Rejected(format!("the platform's Redis refused: {e}"))
    }
}

impl RedisAdmin {
    /// `url` without credentials (checked by the configuration); the admin's user and
    /// password are set apart.
    pub fn new(url: &str, username: &str, password: &str) -> Result<RedisAdmin, StateError> {
        use redis::IntoConnectionInfo;
        let info = url
            .into_connection_info()
            .map_err(|e| StateError::Rejected(format!("stateProxy.redis.url: {e}")))?;
        let settings = info
            .redis_settings()
            .clone()
            .set_username(username)
            .set_password(password);
        let info = info.set_redis_settings(settings);
        let client = redis::Client::open(info)
            .map_err(|e| StateError::Rejected(format!("stateProxy.redis.url: {e}")))?;
        Ok(RedisAdmin {
            client,
            conn: OnceCell::new(),
        })
    }

    async fn conn(&self) -> Result<ConnectionManager, StateError> {
        let config = ConnectionManagerConfig::new()
            .set_number_of_retries(1)
            .set_connection_timeout(Some(TIMEOUT))
            .set_response_timeout(Some(TIMEOUT));
        let connect = self
            .conn
            .get_or_try_init(|| ConnectionManager::new_with_config(self.client.clone(), config));
        match tokio::time::timeout(TIMEOUT, connect).await {
            Err(_) => Err(StateError::Unavailable(format!(
                "no connection within {}s",
                TIMEOUT.as_secs()
            ))),
            Ok(r) => r.cloned().map_err(unavailable),
        }
    }

    async fn run<T: redis::FromRedisValue>(&self, cmd: redis::Cmd) -> Result<T, StateError> {
        let mut c = self.conn().await?;
        match tokio::time::timeout(TIMEOUT, cmd.query_async::<T>(&mut c)).await {
            Err(_) => Err(StateError::Unavailable(format!(
                "no answer within {}s",
                TIMEOUT.as_secs()
            ))),
            Ok(r) => r.map_err(unavailable),
        }
    }

    /// Creates or resets namespace `ns`'s user with `password` and exactly the connector's
    /// rules (`asya_api::state_proxy::redis_acl::setuser_args`: `reset` first, so a rotated
    /// password replaces the old; connections already authenticated stay, as on the broker).
    pub async fn put_user(&self, ns: &str, password: &str) -> Result<(), StateError> {
        let args = redis_acl::setuser_args(ns, password)
            .map_err(|e| StateError::Rejected(e.to_string()))?;
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER");
        for a in &args {
            cmd.arg(a);
        }
        self.run::<()>(cmd).await
    }

    /// Deletes user `user` and closes its connections (a namespace gone keeps no access).
    pub async fn delete_user(&self, user: &str) -> Result<(), StateError> {
        let mut del = redis::cmd("ACL");
        del.arg("DELUSER").arg(user);
        self.run::<i64>(del).await?;
        let mut kill = redis::cmd("CLIENT");
        kill.arg("KILL").arg("USER").arg(user);
        // No connection of that user is not an error.
        match self.run::<i64>(kill).await {
            Ok(_) | Err(StateError::Rejected(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Marks namespace `ns`'s state as `uid`'s unless a mark is there: the mark before (`None`
    /// when this call set it). One atomic `SET … NX GET`.
    pub async fn claim_owner(&self, ns: &str, uid: &str) -> Result<Option<String>, StateError> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(owner_key(ns)).arg(uid).arg("NX").arg("GET");
        self.run::<Option<String>>(cmd).await
    }

    /// Whether the `default` user still lets anyone in without a password: the shared access
    /// every namespace had before namespace users (docs/DESIGN.md §9, upgrading).
    pub async fn default_user_open(&self) -> Result<bool, StateError> {
        let mut cmd = redis::cmd("ACL");
        cmd.arg("GETUSER").arg("default");
        let v: redis::Value = self.run(cmd).await?;
        Ok(default_open(&v))
    }
}

/// From `ACL GETUSER default`'s answer: enabled (`on`) with `nopass`.
fn default_open(v: &redis::Value) -> bool {
    use redis::Value;
    let items: Vec<&Value> = match v {
        Value::Array(a) => a.iter().collect(),
        Value::Map(m) => m.iter().flat_map(|(k, v)| [k, v]).collect(),
        _ => return false,
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        _ => String::new(),
    };
    let mut it = items.into_iter();
    while let Some(k) = it.next() {
        let Some(val) = it.next() else { break };
        if text(k) == "flags" {
            let flags: Vec<String> = match val {
                Value::Array(a) | Value::Set(a) => a.iter().map(text).collect(),
                _ => Vec::new(),
            };
            return flags.iter().any(|f| f == "on") && flags.iter().any(|f| f == "nopass");
        }
    }
    false
}

/// The platform's Redis admin client, built on first use with the password from the Secret
/// the configuration names (in the provisioner's namespace), and built again after a
/// failure to read it.
pub struct PlatformRedisAdmin {
    config: asya_api::config::PlatformRedis,
    secrets: kube::Api<k8s_openapi::api::core::v1::Secret>,
    built: tokio::sync::Mutex<Option<std::sync::Arc<RedisAdmin>>>,
}

impl PlatformRedisAdmin {
    pub fn new(
        config: asya_api::config::PlatformRedis,
        secrets: kube::Api<k8s_openapi::api::core::v1::Secret>,
    ) -> Self {
        PlatformRedisAdmin {
            config,
            secrets,
            built: tokio::sync::Mutex::new(None),
        }
    }

    pub async fn get(&self) -> Result<std::sync::Arc<RedisAdmin>, StateError> {
        let mut built = self.built.lock().await;
        if let Some(a) = built.as_ref() {
            return Ok(a.clone());
        }
        let r = &self.config.admin_password_secret_ref;
        let secret = self
            .secrets
            .get_opt(&r.name)
            .await
            .map_err(|e| StateError::Unavailable(format!("reading Secret {}: {e}", r.name)))?
            .ok_or_else(|| {
                StateError::Rejected(format!(
                    "Secret {} (stateProxy.redis.adminPasswordSecretRef) does not exist in the \
                     provisioner's namespace",
                    r.name
                ))
            })?;
        let password = secret
            .data
            .as_ref()
            .and_then(|d| d.get(&r.key))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .ok_or_else(|| {
                StateError::Rejected(format!("Secret {} has no key {}", r.name, r.key))
            })?;
        let admin = std::sync::Arc::new(RedisAdmin::new(
            &self.config.url,
            &self.config.admin_username,
            &password,
        )?);
        *built = Some(admin.clone());
        Ok(admin)
    }
}

#[cfg(test)]
mod tests {
    use super::default_open;
    use redis::Value;

    fn getuser(flags: &[&str]) -> Value {
        Value::Array(vec![
            Value::BulkString(b"flags".to_vec()),
            Value::Array(
                flags
                    .iter()
                    .map(|f| Value::BulkString(f.as_bytes().to_vec()))
                    .collect(),
            ),
            Value::BulkString(b"passwords".to_vec()),
            Value::Array(vec![]),
        ])
    }

    #[test]
    fn an_enabled_default_user_without_password_is_open() {
        assert!(default_open(&getuser(&[
            "on",
            "nopass",
            "sanitize-payload"
        ])));
        assert!(!default_open(&getuser(&["on", "sanitize-payload"])));
        assert!(!default_open(&getuser(&["off", "nopass"])));
        assert!(!default_open(&Value::Nil));
    }
}
