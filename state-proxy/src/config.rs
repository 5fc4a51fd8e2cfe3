//! Settings from the environment (and the first argument), checked once at start. Every
//! refusal names the variable, the value and the rule.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub connector: Connector,
    pub socket: PathBuf,
    pub bucket: String,
    pub prefix: String,
    pub redis_url: String,
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
    pub const REDIS_URL: &str = "REDIS_URL";
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
        let redis_url = get(env::REDIS_URL).unwrap_or_default();
        if !connector.is_s3()
            && !redis_url.starts_with("redis://")
            && !redis_url.starts_with("rediss://")
        {
            return Err(err(
                env::REDIS_URL,
                &redis_url,
                "required by redis-buffered-cas: redis:// or rediss://",
            ));
        }
        let prefix = get(env::PREFIX).unwrap_or_default();
        if prefix.starts_with('/') || prefix.split('/').any(|s| s == "..") {
            return Err(err(
                env::PREFIX,
                &prefix,
                "must be relative and without .. segments",
            ));
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
            prefix: prefix.trim_end_matches('/').to_string(),
            redis_url,
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(arg: Option<&str>, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(arg, |k| m.get(k).cloned())
    }

    #[test]
    fn argument_or_env_picks_the_connector() {
        let base = [("CONNECTOR_SOCKET", "/s.sock"), ("STATE_BUCKET", "b")];
        assert_eq!(
            cfg(Some("s3-passthrough"), &base).unwrap().connector,
            Connector::S3Passthrough
        );
        let mut v = base.to_vec();
        v.push(("ASYA_CONNECTOR", "s3-buffered-cas"));
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
        let r = cfg(
            Some("redis-buffered-cas"),
            &[
                ("CONNECTOR_SOCKET", "/s"),
                ("REDIS_URL", "redis://127.0.0.1:6379"),
            ],
        )
        .unwrap();
        assert_eq!(r.max_buffer_bytes, 64 * MIB);
        assert_eq!(r.metrics_addr, None);
    }

    #[test]
    fn numbers_and_prefix_are_checked() {
        let base = [("CONNECTOR_SOCKET", "/s"), ("STATE_BUCKET", "b")];
        let mut v = base.to_vec();
        v.push(("ASYA_STATE_PART_BYTES", "1024"));
        assert_eq!(
            cfg(Some("s3-passthrough"), &v).unwrap_err().var,
            "ASYA_STATE_PART_BYTES"
        );
        let mut v = base.to_vec();
        v.push(("STATE_PREFIX", "../x"));
        assert_eq!(
            cfg(Some("s3-passthrough"), &v).unwrap_err().var,
            "STATE_PREFIX"
        );
        let mut v = base.to_vec();
        v.push(("STATE_PREFIX", "team/a/"));
        assert_eq!(cfg(Some("s3-passthrough"), &v).unwrap().prefix, "team/a");
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
            let mut v = base.to_vec();
            v.push(("ASYA_STATE_SOCKET_MODE", mode));
            assert_eq!(
                cfg(Some("s3-passthrough"), &v).ok().map(|c| c.socket_mode),
                ok,
                "{mode}"
            );
        }
    }
}
