//! Settings from the environment (and the first argument), checked once at start. Every
//! refusal names the variable, the value and the rule.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::scope::{Scope, ScopeError};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{var}={value:?} is refused: {rule}")]
pub struct ConfigError {
    pub var: &'static str,
    pub value: String,
    pub rule: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connector {
    S3BufferedLww,
    S3BufferedCas,
    S3Passthrough,
    RedisBufferedCas,
}

impl Connector {
    pub const ALL: [(&'static str, Connector); 4] = [
        ("s3-buffered-lww", Connector::S3BufferedLww),
        ("s3-buffered-cas", Connector::S3BufferedCas),
        ("s3-passthrough", Connector::S3Passthrough),
        ("redis-buffered-cas", Connector::RedisBufferedCas),
    ];

    pub fn name(self) -> &'static str {
        Connector::ALL
            .iter()
            .find(|(_, c)| *c == self)
            .map(|(n, _)| *n)
            .unwrap_or("unknown")
    }

    pub fn is_s3(self) -> bool {
        !matches!(self, Connector::RedisBufferedCas)
    }
}

/// A password: never in a log line, an error or a `{:?}`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The Redis user and password of REDIS_USERNAME and REDIS_PASSWORD (the namespace's ACL
/// user, from its Secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisAuth {
    pub username: String,
    pub password: Secret,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub connector: Connector,
    pub socket: PathBuf,
    pub bucket: String,
    /// `{ASYA_NAMESPACE}/{STATE_PREFIX}/`: where every key of the mount is.
    pub scope: Scope,
    /// Shown only through [`redact_url`]: it may carry a password.
    pub redis_url: String,
    pub redis_auth: Option<RedisAuth>,
    /// Set when AWS_ENDPOINT_URL is (MinIO, moto, ...): those want path-style URLs.
    pub s3_endpoint: Option<String>,
    pub metrics_addr: Option<SocketAddr>,
    /// Buffered modes hold a whole body in memory up to this; larger is 413.
    pub max_buffer_bytes: u64,
    /// Passthrough: the multipart part size, and so the memory per upload.
    pub part_bytes: usize,
    /// Uploads in flight at once (passthrough); bounds memory to this × part_bytes.
    pub max_uploads: usize,
    pub backend_timeout: Duration,
    pub shutdown_timeout: Duration,
    /// The socket file's mode: the runtime may run as another user than the connector.
    pub socket_mode: u32,
}

pub mod env {
    pub const CONNECTOR: &str = "ASYA_CONNECTOR";
    pub const SOCKET: &str = "CONNECTOR_SOCKET";
    pub const BUCKET: &str = "STATE_BUCKET";
    pub const PREFIX: &str = "STATE_PREFIX";
    pub const NAMESPACE: &str = "ASYA_NAMESPACE";
    pub const REDIS_URL: &str = "REDIS_URL";
    pub const REDIS_USERNAME: &str = "REDIS_USERNAME";
    pub const REDIS_PASSWORD: &str = "REDIS_PASSWORD";
    pub const ENDPOINT: &str = "AWS_ENDPOINT_URL";
    pub const METRICS_ADDR: &str = "ASYA_METRICS_ADDR";
    pub const MAX_BUFFER: &str = "ASYA_STATE_MAX_BUFFER_BYTES";
    pub const PART: &str = "ASYA_STATE_PART_BYTES";
    pub const MAX_UPLOADS: &str = "ASYA_STATE_MAX_UPLOADS";
    pub const TIMEOUT: &str = "ASYA_STATE_BACKEND_TIMEOUT_SECONDS";
    pub const SHUTDOWN: &str = "ASYA_STATE_SHUTDOWN_TIMEOUT_SECONDS";
    pub const SOCKET_MODE: &str = "ASYA_STATE_SOCKET_MODE";
}

const MIB: u64 = 1024 * 1024;

impl Config {
    /// `arg` is the first command-line argument; `get` reads a variable (empty = unset).
    pub fn from_lookup(
        arg: Option<&str>,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let get = |k: &str| get(k).filter(|v| !v.is_empty());
        let err = |var, value: &str, rule: &str| ConfigError {
            var,
            value: value.to_string(),
            rule: rule.to_string(),
        };
        let name = arg
            .map(str::to_string)
            .or_else(|| get(env::CONNECTOR))
            .ok_or_else(|| {
                err(
                    env::CONNECTOR,
                    "",
                    "set it or pass the connector as the first argument",
                )
            })?;
        let connector = Connector::ALL
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, c)| *c)
            .ok_or_else(|| {
                let known: Vec<&str> = Connector::ALL.iter().map(|(n, _)| *n).collect();
                err(
                    env::CONNECTOR,
                    &name,
                    &format!("not one of {}", known.join(", ")),
                )
            })?;
        let socket = get(env::SOCKET).ok_or_else(|| err(env::SOCKET, "", "required"))?;
        let bucket = get(env::BUCKET).unwrap_or_default();
        if connector.is_s3() && bucket.is_empty() {
            return Err(err(env::BUCKET, "", "required by the S3 connectors"));
        }
        let namespace = get(env::NAMESPACE).unwrap_or_default();
        let prefix = get(env::PREFIX).unwrap_or_default();
        let scope = Scope::new(&namespace, &prefix).map_err(|e| match e {
            ScopeError::Namespace(rule) => err(env::NAMESPACE, &namespace, rule),
            ScopeError::Prefix(rule) => err(env::PREFIX, &prefix, rule),
        })?;
        let redis_url = get(env::REDIS_URL).unwrap_or_default();
        let redis_auth = match (get(env::REDIS_USERNAME), get(env::REDIS_PASSWORD)) {
            (None, None) => None,
            (Some(username), Some(password)) => Some(RedisAuth {
                username,
                password: Secret(password),
            }),
            (Some(_), None) => {
                return Err(err(
                    env::REDIS_PASSWORD,
                    "",
                    "required with REDIS_USERNAME (both come from the namespace's Secret)",
                ));
            }
            (None, Some(_)) => {
                return Err(err(
                    env::REDIS_USERNAME,
                    "",
                    "required with REDIS_PASSWORD: a password alone would authenticate as \
                     Redis' default user, not the namespace's",
                ));
            }
        };
        if !connector.is_s3() {
            if !redis_url.starts_with("redis://") && !redis_url.starts_with("rediss://") {
                return Err(err(
                    env::REDIS_URL,
                    &redact_url(&redis_url),
                    "required by redis-buffered-cas: redis:// or rediss://",
                ));
            }
            if redis_auth.is_some() && url_has_credentials(&redis_url) {
                return Err(err(
                    env::REDIS_URL,
                    &redact_url(&redis_url),
                    "carries a user or password while REDIS_USERNAME and REDIS_PASSWORD are \
                     set: credentials come from one place only, the namespace's Secret (a \
                     shared URL's password would reach every namespace's keys)",
                ));
            }
        }
        let metrics_addr = match get(env::METRICS_ADDR) {
            None => None,
            Some(a) => Some(
                a.parse()
                    .map_err(|_| err(env::METRICS_ADDR, &a, "not host:port"))?,
            ),
        };
        let number =
            |var: &'static str, default: u64, min: u64, max: u64| -> Result<u64, ConfigError> {
                match get(var) {
                    None => Ok(default),
                    Some(v) => match v.parse::<u64>() {
                        Ok(n) if (min..=max).contains(&n) => Ok(n),
                        _ => Err(err(var, &v, &format!("an integer in {min}..={max}"))),
                    },
                }
            };
        // 0666 by default: the socket sits in the pod's own emptyDir, and the runtime's user
        // (the user's image) is unknown; with a shared fsGroup, 0660 is tighter.
        let socket_mode = match get(env::SOCKET_MODE) {
            None => 0o666,
            Some(m) => match u32::from_str_radix(&m, 8) {
                Ok(n) if n <= 0o777 && n & 0o600 == 0o600 => n,
                _ => {
                    return Err(err(
                        env::SOCKET_MODE,
                        &m,
                        "octal, at most 777, owner rw (e.g. 660)",
                    ));
                }
            },
        };
        Ok(Config {
            socket_mode,
            connector,
            socket: PathBuf::from(socket),
            bucket,
            scope,
            redis_url,
            redis_auth,
            s3_endpoint: get(env::ENDPOINT),
            metrics_addr,
            max_buffer_bytes: number(env::MAX_BUFFER, 64 * MIB, 1, 4096 * MIB)?,
            // S3 refuses parts under 5 MiB (but the last).
            part_bytes: number(env::PART, 8 * MIB, 5 * MIB, 512 * MIB)? as usize,
            max_uploads: number(env::MAX_UPLOADS, 4, 1, 256)? as usize,
            backend_timeout: Duration::from_secs(number(env::TIMEOUT, 30, 1, 3600)?),
            shutdown_timeout: Duration::from_secs(number(env::SHUTDOWN, 25, 1, 3600)?),
        })
    }
}

/// A URL split at its user-info: (scheme, user-info, everything after the `@`), or None
/// without one. The authority ends at the first `/`, `?` or `#` after the scheme.
fn userinfo(url: &str) -> Option<(&str, &str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let at = rest[..end].rfind('@')?;
    Some((scheme, &rest[..at], &rest[at + 1..]))
}

/// Whether a Redis URL carries a user or a password.
pub fn url_has_credentials(url: &str) -> bool {
    userinfo(url).is_some_and(|(_, info, _)| !info.is_empty())
}

/// The URL with its user-info replaced, for errors and logs: `redis://***@host:6379/0`.
pub fn redact_url(url: &str) -> String {
    match userinfo(url) {
        Some((scheme, _, rest)) => format!("{scheme}://***@{rest}"),
        // Not a URL at all (`user:pw@host`): whatever comes before an `@` may be a password.
        None if !url.contains("://") => match url.rsplit_once('@') {
            Some((_, host)) => format!("***@{host}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(arg: Option<&str>, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let mut m: HashMap<String, String> = [("ASYA_NAMESPACE", "team-a")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        m.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Config::from_lookup(arg, |k| m.get(k).cloned())
    }

    const REDIS: [(&str, &str); 2] = [
        ("CONNECTOR_SOCKET", "/s"),
        ("REDIS_URL", "redis://127.0.0.1:6379"),
    ];

    fn with<'a>(
        base: &[(&'a str, &'a str)],
        more: &[(&'a str, &'a str)],
    ) -> Vec<(&'a str, &'a str)> {
        base.iter().chain(more).copied().collect()
    }

    #[test]
    fn argument_or_env_picks_the_connector() {
        let base = [("CONNECTOR_SOCKET", "/s.sock"), ("STATE_BUCKET", "b")];
        assert_eq!(
            cfg(Some("s3-passthrough"), &base).unwrap().connector,
            Connector::S3Passthrough
        );
        let v = with(&base, &[("ASYA_CONNECTOR", "s3-buffered-cas")]);
        assert_eq!(cfg(None, &v).unwrap().connector, Connector::S3BufferedCas);
        let e = cfg(Some("gcs-lww"), &base).unwrap_err();
        assert!(e.to_string().contains("gcs-lww") && e.to_string().contains("s3-buffered-lww"));
    }

    #[test]
    fn each_backend_needs_its_settings() {
        assert_eq!(
            cfg(Some("s3-buffered-lww"), &[("CONNECTOR_SOCKET", "/s")])
                .unwrap_err()
                .var,
            "STATE_BUCKET"
        );
        assert_eq!(
            cfg(Some("redis-buffered-cas"), &[("CONNECTOR_SOCKET", "/s")])
                .unwrap_err()
                .var,
            "REDIS_URL"
        );
        let r = cfg(Some("redis-buffered-cas"), &REDIS).unwrap();
        assert_eq!(r.max_buffer_bytes, 64 * MIB);
        assert_eq!(r.metrics_addr, None);
        assert_eq!(r.redis_auth, None);
    }

    #[test]
    fn every_connector_needs_its_namespace() {
        let base = [("CONNECTOR_SOCKET", "/s"), ("STATE_BUCKET", "b")];
        for (ns, ok) in [
            ("", false),
            ("Team", false),
            ("../b", false),
            ("team_a", false),
            ("a*", false),
            ("team-a", true),
        ] {
            for (arg, vars) in [
                ("s3-buffered-lww", with(&base, &[("ASYA_NAMESPACE", ns)])),
                (
                    "redis-buffered-cas",
                    with(&REDIS, &[("ASYA_NAMESPACE", ns)]),
                ),
            ] {
                match cfg(Some(arg), &vars) {
                    Ok(c) => {
                        assert!(ok, "{arg} {ns:?}");
                        assert_eq!(c.scope.root(), "team-a/");
                    }
                    Err(e) => {
                        assert!(!ok, "{arg} {ns:?}: {e}");
                        assert_eq!(e.var, "ASYA_NAMESPACE");
                        assert_eq!(e.value, ns);
                        assert!(e.to_string().contains("DNS label"), "{e}");
                    }
                }
            }
        }
    }

    #[test]
    fn numbers_and_prefix_are_checked() {
        let base = [("CONNECTOR_SOCKET", "/s"), ("STATE_BUCKET", "b")];
        let v = with(&base, &[("ASYA_STATE_PART_BYTES", "1024")]);
        assert_eq!(
            cfg(Some("s3-passthrough"), &v).unwrap_err().var,
            "ASYA_STATE_PART_BYTES"
        );
        for bad in ["../x", "/team-b", "a/../../b", "a//b", ".", "a\tb"] {
            let e = cfg(
                Some("s3-passthrough"),
                &with(&base, &[("STATE_PREFIX", bad)]),
            )
            .unwrap_err();
            assert_eq!((e.var, e.value.as_str()), ("STATE_PREFIX", bad));
        }
        let e = cfg(
            Some("s3-passthrough"),
            &with(&base, &[("STATE_PREFIX", "../team-b")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("STATE_PREFIX") && e.contains("../team-b") && e.contains(".."),
            "{e}"
        );
        let v = with(&base, &[("STATE_PREFIX", "team/a/")]);
        assert_eq!(
            cfg(Some("s3-passthrough"), &v).unwrap().scope.root(),
            "team-a/team/a/",
            "the prefix nests inside the namespace"
        );
        assert_eq!(
            cfg(Some("s3-passthrough"), &base).unwrap().socket_mode,
            0o666
        );
        for (mode, ok) in [
            ("660", Some(0o660)),
            ("9", None),
            ("1777", None),
            ("066", None),
        ] {
            let v = with(&base, &[("ASYA_STATE_SOCKET_MODE", mode)]);
            assert_eq!(
                cfg(Some("s3-passthrough"), &v).ok().map(|c| c.socket_mode),
                ok,
                "{mode}"
            );
        }
    }

    #[test]
    fn redis_credentials_come_from_one_place_and_never_show() {
        let auth = [
            ("REDIS_USERNAME", "asya-ns-team-a"),
            ("REDIS_PASSWORD", "pw-123"),
        ];
        let c = cfg(Some("redis-buffered-cas"), &with(&REDIS, &auth)).unwrap();
        let a = c.redis_auth.clone().unwrap();
        assert_eq!(
            (a.username.as_str(), a.password.0.as_str()),
            ("asya-ns-team-a", "pw-123")
        );
        assert!(!format!("{c:?}").contains("pw-123"), "{c:?}");

        for url in [
            "redis://:url-secret@127.0.0.1:6379",
            "redis://admin:url-secret@127.0.0.1:6379/0",
            "rediss://admin@redis.example:6380",
        ] {
            let v = with(&[("CONNECTOR_SOCKET", "/s"), ("REDIS_URL", url)], &auth);
            let e = cfg(Some("redis-buffered-cas"), &v).unwrap_err();
            assert_eq!(e.var, "REDIS_URL");
            let msg = e.to_string();
            assert!(
                msg.contains("REDIS_USERNAME") && msg.contains("one place"),
                "{msg}"
            );
            assert!(
                !msg.contains("url-secret") && !msg.contains("pw-123"),
                "{msg}"
            );
        }
        // Without REDIS_USERNAME/PASSWORD a URL's credentials are used as given.
        let v = [
            ("CONNECTOR_SOCKET", "/s"),
            ("REDIS_URL", "redis://:url-secret@127.0.0.1:6379"),
        ];
        assert!(cfg(Some("redis-buffered-cas"), &v).is_ok());
        // One without the other is refused, naming the missing one.
        let e = cfg(
            Some("redis-buffered-cas"),
            &with(&REDIS, &[("REDIS_PASSWORD", "pw-123")]),
        )
        .unwrap_err();
        assert_eq!(e.var, "REDIS_USERNAME");
        assert!(!e.to_string().contains("pw-123"));
        let e = cfg(
            Some("redis-buffered-cas"),
            &with(&REDIS, &[("REDIS_USERNAME", "u")]),
        )
        .unwrap_err();
        assert_eq!(e.var, "REDIS_PASSWORD");
        // A malformed URL's refusal does not show its password either.
        let e = cfg(
            Some("redis-buffered-cas"),
            &[
                ("CONNECTOR_SOCKET", "/s"),
                ("REDIS_URL", "http://u:url-secret@h"),
            ],
        )
        .unwrap_err();
        assert!(!e.to_string().contains("url-secret"), "{e}");
    }

    #[test]
    fn urls_are_redacted() {
        assert_eq!(redact_url("redis://u:p@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact_url("redis://:p@ss@h"), "redis://***@h");
        assert_eq!(redact_url("redis://h:1/0?x=a@b"), "redis://h:1/0?x=a@b");
        assert_eq!(redact_url("redis://h"), "redis://h");
        assert_eq!(redact_url("u:p@h"), "***@h");
        assert!(url_has_credentials("redis://u@h"));
        assert!(!url_has_credentials("redis://h/0"));
    }
}
