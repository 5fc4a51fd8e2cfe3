//! State proxies (docs/DESIGN.md §10): the names the webhook injects under and the rules a
//! `stateProxy` entry must meet, as pure functions the validator and the webhook share.

use crate::error::{FieldError, FieldErrors};
use serde::{Deserialize, Serialize};

use crate::types::StateProxy;

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
pub const WRITE_BUFFERED: &str = "buffered";
pub const WRITE_PASSTHROUGH: &str = "passthrough";
pub const WRITE_MODES: [&str; 2] = [WRITE_BUFFERED, WRITE_PASSTHROUGH];
/// A container name is a DNS label (≤ 63), and the prefix takes 17 of those characters.
pub const MAX_NAME_LEN: usize = 63 - CONTAINER_PREFIX.len();
/// Paths the runtime itself uses: its file, the sockets (its own and the connectors'), and
/// /tmp, where buffered writes and reads spool. A mount on, under or above one of them would
/// route the runtime's own file operations to a connector.
pub const RESERVED_PATHS: [&str; 3] = ["/opt/asya", "/var/run/asya", "/tmp"];

/// The state proxy connector image a flavor gets when it names just `asya-state-proxy`
/// (docs/DESIGN.md §10): the release of this build, like the sidecar's.
pub const DEFAULT_STATE_PROXY_IMAGE: &str = concat!(
    "ghcr.io/asya-rs/asya-state-proxy:",
    env!("CARGO_PKG_VERSION")
);

/// Where our connector image comes from: a `stateProxy` entry whose image is just
/// `asya-state-proxy[:TAG]` takes this reference (its tag unless the entry gives one), so
/// flavors need not name the platform's registry.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StateProxyConfig {
    #[serde(default = "default_state_proxy_image")]
    pub image: String,
}

impl Default for StateProxyConfig {
    fn default() -> Self {
        Self {
            image: default_state_proxy_image(),
        }
    }
}

fn default_state_proxy_image() -> String {
    DEFAULT_STATE_PROXY_IMAGE.into()
}

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
pub fn validate(entries: &[StateProxy]) -> FieldErrors {
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
    }
    e
}

fn validate_name(entries: &[StateProxy], i: usize, sp: &StateProxy, p: &str, e: &mut FieldErrors) {
    let name = sp.name.as_str();
    if !crate::validate::is_dns_label(name) || name.len() > MAX_NAME_LEN {
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
        && !crate::validate::PULL_POLICIES.contains(&pp)
    {
        e.push(FieldError::unsupported(
            format!("{p}.connector.imagePullPolicy"),
            pp,
            &crate::validate::PULL_POLICIES,
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
        }
    }
}

#[cfg(test)]
mod tests;
