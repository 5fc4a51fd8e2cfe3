//! State proxies (docs/DESIGN.md §10): the names the webhook injects under and the rules a
//! `stateProxy` entry must meet, as pure functions the validator and the webhook share.

use crate::error::{FieldError, FieldErrors};

use crate::types::StateProxy;

pub mod redis_acl;

/// The pod volume that holds the connectors' sockets.
pub const SOCKET_VOLUME: &str = "state-sockets";
/// Where that volume is mounted, in the connectors and in the runtime.
pub const SOCKET_DIR: &str = "/var/run/asya/state";
/// A connector container is this prefix and the entry's name.
pub const CONTAINER_PREFIX: &str = "asya-state-proxy-";
/// The runtime's list of mounts: `{name}:{path}:write={mode}` joined by `;`.
pub const ENV_MOUNTS: &str = "ASYA_STATE_PROXY_MOUNTS";
/// The connector's socket path, set in its container.
pub const ENV_CONNECTOR_SOCKET: &str = "CONNECTOR_SOCKET";
/// The namespace the connector serves (the pod's, from a fieldRef): every key it stores is
/// under `{namespace}/`, whatever else its env says.
pub const ENV_NAMESPACE: &str = "ASYA_NAMESPACE";
/// Which connector the image runs (`s3-buffered-lww`, `redis-buffered-cas`, ...).
pub const ENV_CONNECTOR: &str = "ASYA_CONNECTOR";
pub const ENV_REDIS_URL: &str = "REDIS_URL";
/// The namespace's Redis user and password, from its Secret [`TENANT_REDIS_SECRET`].
pub const ENV_REDIS_USERNAME: &str = "REDIS_USERNAME";
pub const ENV_REDIS_PASSWORD: &str = "REDIS_PASSWORD";
/// Variables injection sets in a connector: an entry may not set them.
pub const INJECTED_ENV: [&str; 4] = [
    ENV_CONNECTOR_SOCKET,
    ENV_NAMESPACE,
    ENV_REDIS_USERNAME,
    ENV_REDIS_PASSWORD,
];
/// Static AWS credentials in a connector's env (`stateProxy.allowStaticCredentials`).
pub const STATIC_AWS_ENV: [&str; 3] = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
];
/// The Secret in each namespace holding its Redis user (keys `username`, `password`), kept
/// by the provisioner like the broker identity's.
pub const TENANT_REDIS_SECRET: &str = "asya-state-redis";
pub const WRITE_BUFFERED: &str = "buffered";
pub const WRITE_PASSTHROUGH: &str = "passthrough";
pub const WRITE_MODES: [&str; 2] = [WRITE_BUFFERED, WRITE_PASSTHROUGH];
/// A container name is a DNS label (≤ 63), and the prefix takes 17 of those characters.
pub const MAX_NAME_LEN: usize = 63 - CONTAINER_PREFIX.len();
/// Paths the runtime itself uses: its file, the sockets (its own and the connectors'), and
/// /tmp, where buffered writes and reads spool. A mount on, under or above one of them would
/// route the runtime's own file operations to a connector.
pub const RESERVED_PATHS: [&str; 3] = ["/opt/asya", "/var/run/asya", "/tmp"];

pub use crate::config::{DEFAULT_STATE_PROXY_IMAGE, PlatformRedis, StateProxyConfig};
// A Redis URL's endpoint is a leaf rule (`basics`): the cluster configuration checks it too.
pub use crate::basics::{RedisEndpoint, redis_endpoint};

/// The repository name of our connector image (any registry, tag or digest).
pub const OUR_IMAGE: &str = "asya-state-proxy";

/// Whether an image reference names our connector image: only there is the probe's binary
/// known to exist.
pub fn is_our_image(image: &str) -> bool {
    let no_digest = image.split('@').next().unwrap_or(image);
    let last = no_digest.rsplit('/').next().unwrap_or(no_digest);
    last.split(':').next() == Some(OUR_IMAGE)
}

/// The reference without its tag or digest (a `:` in the registry's port is kept).
fn repository(image: &str) -> &str {
    let no_digest = image.split('@').next().unwrap_or(image);
    match no_digest.rfind(':') {
        Some(i) if !no_digest[i..].contains('/') => &no_digest[..i],
        _ => no_digest,
    }
}

/// The image an entry's connector runs: a bare `asya-state-proxy`, `asya-state-proxy:TAG` or
/// `asya-state-proxy@DIGEST` (no registry) becomes `configured` (the platform's registry and
/// tag), keeping the entry's own tag or digest; any other reference is the user's choice and
/// stays as written. `None`: unchanged.
pub fn resolve_image(image: &str, configured: &str) -> Option<String> {
    let rest = image.strip_prefix(OUR_IMAGE)?;
    if rest.is_empty() {
        return (image != configured).then(|| configured.to_string());
    }
    if !(rest.starts_with(':') || rest.starts_with('@')) || rest.contains('/') {
        return None;
    }
    Some(format!("{}{rest}", repository(configured)))
}

/// Resolves every entry's connector image (see `resolve_image`), before policy checks it.
pub fn resolve_images(entries: &mut [StateProxy], configured: &str) {
    for c in entries.iter_mut().filter_map(|e| e.connector.as_mut()) {
        if let Some(image) = resolve_image(&c.image, configured) {
            c.image = image;
        }
    }
}

/// The connector container's name.
pub fn container_name(name: &str) -> String {
    format!("{CONTAINER_PREFIX}{name}")
}

/// The connector's socket path.
pub fn socket_path(name: &str) -> String {
    format!("{SOCKET_DIR}/{name}.sock")
}

/// The entry's write mode, defaulted.
pub fn write_mode(sp: &StateProxy) -> &str {
    sp.write_mode.as_deref().unwrap_or(WRITE_BUFFERED)
}

/// `ASYA_STATE_PROXY_MOUNTS` for a list of (valid) entries.
pub fn mounts_env(entries: &[StateProxy]) -> String {
    entries
        .iter()
        .map(|sp| {
            let path = sp.mount.as_ref().map(|m| m.path.as_str()).unwrap_or("");
            format!("{}:{}:write={}", sp.name, path, write_mode(sp))
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// Why a mount path is not usable, if it is not: absolute, normalised (no `.`, `..`, empty
/// segments or trailing `/`), not `/`, and free of `:` and `;` (the env list's separators).
pub fn path_problem(path: &str) -> Option<&'static str> {
    if !path.starts_with('/') {
        return Some("must be an absolute path");
    }
    if path == "/" {
        return Some("must not be / (every file of the runtime would go to the connector)");
    }
    if path.contains([':', ';']) {
        return Some("must not contain ':' or ';' (they separate ASYA_STATE_PROXY_MOUNTS)");
    }
    if path[1..]
        .split('/')
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return Some("must be normalised: no empty, '.' or '..' segments and no trailing '/'");
    }
    None
}

/// Whether one of two normalised absolute paths is the other or lies under it.
pub fn overlaps(a: &str, b: &str) -> bool {
    let under = |x: &str, y: &str| x == y || x.strip_prefix(y).is_some_and(|r| r.starts_with('/'));
    under(a, b) || under(b, a)
}

/// Every refusal of a list of entries (each naming field, value and rule).
pub fn validate(entries: &[StateProxy], config: &StateProxyConfig) -> FieldErrors {
    let mut e = FieldErrors::default();
    let mut paths: Vec<(usize, &str)> = Vec::new();
    for (i, sp) in entries.iter().enumerate() {
        let p = format!("spec.stateProxy[{i}]");
        validate_name(entries, i, sp, &p, &mut e);
        match sp.mount.as_ref().map(|m| m.path.as_str()) {
            None => e.push(FieldError::required(
                format!("{p}.mount.path"),
                "an absolute path, where the handler sees the state",
            )),
            Some(path) => {
                if let Some(rule) = path_problem(path) {
                    e.push(FieldError::invalid(format!("{p}.mount.path"), path, rule));
                } else if let Some(r) = RESERVED_PATHS.iter().find(|r| overlaps(path, r)) {
                    e.push(FieldError::invalid(
                        format!("{p}.mount.path"),
                        path,
                        format!(
                            "must not be on, under or above {r}, which the Asya runtime uses itself"
                        ),
                    ));
                } else if let Some((j, other)) = paths.iter().find(|(_, o)| overlaps(path, o)) {
                    e.push(FieldError::invalid(
                        format!("{p}.mount.path"),
                        path,
                        format!("must not be nested with spec.stateProxy[{j}].mount.path {other:?}: a file would belong to two connectors"),
                    ));
                } else {
                    paths.push((i, path));
                }
            }
        }
        if let Some(m) = sp.write_mode.as_deref()
            && !WRITE_MODES.contains(&m)
        {
            e.push(FieldError::unsupported(
                format!("{p}.writeMode"),
                m,
                &WRITE_MODES,
            ));
        }
        validate_connector(sp, &p, &mut e);
        validate_credentials(sp, &p, config, &mut e);
    }
    e
}

fn validate_name(entries: &[StateProxy], i: usize, sp: &StateProxy, p: &str, e: &mut FieldErrors) {
    let name = sp.name.as_str();
    if !crate::basics::is_dns_label(name) || name.len() > MAX_NAME_LEN {
        e.push(FieldError::invalid(
            format!("{p}.name"),
            name,
            format!(
                "must be a DNS label of at most {MAX_NAME_LEN} characters (lowercase letters, digits and '-', starting and ending with a letter or digit): the connector container is named {CONTAINER_PREFIX}{{name}}, at most 63"
            ),
        ));
    }
    if entries[..i].iter().any(|o| o.name == sp.name) {
        e.push(FieldError::duplicate(format!("{p}.name"), name));
    }
}

fn validate_connector(sp: &StateProxy, p: &str, e: &mut FieldErrors) {
    let Some(c) = sp.connector.as_ref().filter(|c| !c.image.is_empty()) else {
        e.push(FieldError::required(
            format!("{p}.connector.image"),
            "the connector image (e.g. asya-state-proxy with ASYA_CONNECTOR in connector.env)",
        ));
        return;
    };
    if let Some(pp) = c.image_pull_policy.as_deref()
        && !crate::basics::PULL_POLICIES.contains(&pp)
    {
        e.push(FieldError::unsupported(
            format!("{p}.connector.imagePullPolicy"),
            pp,
            &crate::basics::PULL_POLICIES,
        ));
    }
    for (k, env) in c.env.iter().enumerate() {
        if env.name.is_empty() {
            e.push(FieldError::required(
                format!("{p}.connector.env[{k}].name"),
                "the variable's name",
            ));
        } else if env.name == ENV_CONNECTOR_SOCKET {
            e.push(FieldError::forbidden(
                format!("{p}.connector.env[{k}].name"),
                format!(
                    "{ENV_CONNECTOR_SOCKET} is set by injection to {}",
                    socket_path(&sp.name)
                ),
            ));
        } else if env.name == ENV_NAMESPACE {
            e.push(FieldError::forbidden(
                format!("{p}.connector.env[{k}].name"),
                format!(
                    "{ENV_NAMESPACE} is set by injection to the pod's namespace: a connector \
                     stores only under {{namespace}}/"
                ),
            ));
        } else if env.name == ENV_REDIS_USERNAME || env.name == ENV_REDIS_PASSWORD {
            e.push(FieldError::forbidden(
                format!("{p}.connector.env[{k}].name"),
                format!(
                    "{} is set by injection from the namespace's own Redis user (Secret \
                     {TENANT_REDIS_SECRET}) when the connector uses the platform's Redis; \
                     for another Redis, put its address in REDIS_URL without credentials",
                    env.name
                ),
            ));
        }
    }
}

/// The literal value of a variable of the entry's connector env (not one from a source).
fn env_value<'a>(sp: &'a StateProxy, name: &str) -> Option<&'a str> {
    sp.connector
        .as_ref()?
        .env
        .iter()
        .rev()
        .find(|e| e.name == name)
        .and_then(|e| e.value.as_deref())
}

fn env_set(sp: &StateProxy, name: &str) -> bool {
    sp.connector
        .as_ref()
        .is_some_and(|c| c.env.iter().any(|e| e.name == name))
}

/// Whether the entry runs one of the Redis connectors (`ASYA_CONNECTOR=redis-…`).
pub fn is_redis(sp: &StateProxy) -> bool {
    env_value(sp, ENV_CONNECTOR).is_some_and(|c| c.starts_with("redis-"))
}

/// Whether the entry's connector runs on the platform's Redis under the namespace's own
/// user: a Redis connector whose `REDIS_URL` is unset (the platform's URL is injected) or
/// names the platform's server. The webhook injects the user and the provisioner keeps it
/// for exactly these entries.
pub fn uses_platform_redis(sp: &StateProxy, config: &StateProxyConfig) -> bool {
    let Some(platform) = config.redis.as_ref() else {
        return false;
    };
    if !is_redis(sp) {
        return false;
    }
    if !env_set(sp, ENV_REDIS_URL) {
        return true;
    }
    match (
        env_value(sp, ENV_REDIS_URL).map(redis_endpoint),
        redis_endpoint(&platform.url),
    ) {
        (Some(Ok(a)), Ok(b)) => a == b,
        _ => false,
    }
}

/// Whether any of the entries needs the namespace's Redis user.
pub fn needs_platform_redis(entries: &[StateProxy], config: &StateProxyConfig) -> bool {
    entries.iter().any(|sp| uses_platform_redis(sp, config))
}

/// Credentials in a connector's env: no password in a Redis URL, no Redis connector without
/// a Redis to go to, and static AWS keys only where the platform allows them.
fn validate_credentials(sp: &StateProxy, p: &str, config: &StateProxyConfig, e: &mut FieldErrors) {
    let Some(c) = sp.connector.as_ref() else {
        return;
    };
    for (k, env) in c.env.iter().enumerate() {
        if env.name == ENV_REDIS_URL {
            match env.value.as_deref() {
                Some(url) => {
                    if let Err(rule) = redis_endpoint(url) {
                        // The value is quoted without what could be a password.
                        let shown = match url.split_once('@') {
                            Some((_, after)) => format!("***@{after}"),
                            None => url.to_string(),
                        };
                        e.push(FieldError::invalid(
                            format!("{p}.connector.env[{k}].value"),
                            shown,
                            format!("{ENV_REDIS_URL} {rule}"),
                        ));
                    }
                }
                None if env.value_from.is_some() && config.redis.is_some() && is_redis(sp) => {
                    e.push(FieldError::forbidden(
                        format!("{p}.connector.env[{k}].valueFrom"),
                        format!(
                            "{ENV_REDIS_URL} must be a literal value (or unset, for the platform's \
                             Redis at {}): a URL from a Secret may carry a shared password",
                            config.redis.as_ref().map_or("", |r| r.url.as_str())
                        ),
                    ));
                }
                None => {}
            }
        }
        if STATIC_AWS_ENV.contains(&env.name.as_str()) && !config.allow_static_credentials {
            e.push(FieldError::forbidden(
                format!("{p}.connector.env[{k}].name"),
                format!(
                    "{} is a static AWS credential: keys given to several namespaces are one S3 \
                     identity, so S3 would not keep their state apart; use a role per namespace \
                     (serviceAccount.actorRoleArn with {{namespace}}), or allow static keys \
                     with stateProxy.allowStaticCredentials: true in the cluster configuration",
                    env.name
                ),
            ));
        }
    }
    if is_redis(sp) && !env_set(sp, ENV_REDIS_URL) && config.redis.is_none() {
        e.push(FieldError::required(
            format!("{p}.connector.env"),
            format!(
                "{ENV_REDIS_URL}: a Redis connector needs its Redis, and the cluster \
                 configuration names no platform Redis (stateProxy.redis)"
            ),
        ));
    }
}

/// The warnings an admitted list of entries gets: static AWS keys where they are allowed.
pub fn warnings(entries: &[StateProxy], config: &StateProxyConfig) -> Vec<String> {
    if !config.allow_static_credentials {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (i, sp) in entries.iter().enumerate() {
        let keys: Vec<&str> = sp
            .connector
            .iter()
            .flat_map(|c| c.env.iter())
            .map(|e| e.name.as_str())
            .filter(|n| STATIC_AWS_ENV.contains(n))
            .collect();
        if !keys.is_empty() {
            out.push(format!(
                "spec.stateProxy[{i}] ({}): the connector holds static AWS keys ({}), allowed by \
                 stateProxy.allowStaticCredentials: every namespace given these keys shares one S3 \
                 identity and only the connector's {{namespace}}/ prefix keeps their state apart; \
                 prefer a role per namespace (serviceAccount.actorRoleArn with {{namespace}})",
                sp.name,
                keys.join(", ")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests;
