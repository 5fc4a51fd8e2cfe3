//! Leaf rules: what a DNS label is, the image pull policies, the Pod Security levels and a
//! Redis URL's endpoint. Every module of the crate may use them and they use none, so the
//! configuration, validation, privilege and state-proxy rules can share them without
//! importing each other (issue 37: `api` had an import circle through them).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::LazyLock;

use regex::Regex;

static DNS_LABEL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$").expect("static regex"));

/// An RFC 1123 label, as Kubernetes names namespaces, containers and actors: 1..=63 of
/// `a-z 0-9 -`, starting and ending with a letter or digit.
pub fn is_dns_label(s: &str) -> bool {
    s.len() <= 63 && DNS_LABEL.is_match(s)
}

/// Kubernetes' image pull policies.
pub const PULL_POLICIES: [&str; 3] = ["Always", "IfNotPresent", "Never"];

/// The namespace label whose value is the Pod Security level the API server enforces.
pub const ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";

/// A Pod Security Standards level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Privileged,
    #[default]
    Baseline,
    Restricted,
}

impl Level {
    /// The level for a namespace: its `enforce` label when set, else `default` (the policy's
    /// `defaultPodSecurityLevel`, `baseline` unless set).
    pub fn of_namespace(labels: Option<&BTreeMap<String, String>>, default: Level) -> Level {
        Level::labelled(labels).unwrap_or(default)
    }

    /// The level a namespace's `enforce` label sets, `None` without the label. A value that is
    /// not a level reads as `restricted`, as the API server's PodSecurity admission reads it.
    pub fn labelled(labels: Option<&BTreeMap<String, String>>) -> Option<Level> {
        let value = labels.and_then(|l| l.get(ENFORCE_LABEL))?;
        Some(match value.as_str() {
            "privileged" => Level::Privileged,
            "baseline" => Level::Baseline,
            _ => Level::Restricted,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a Redis URL points: scheme (TLS or not), host, port. Credentials are refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisEndpoint {
    pub tls: bool,
    pub host: String,
    pub port: u16,
}

/// Parses `redis://host[:port][/db]` or `rediss://…`. The error is the rule broken.
pub fn redis_endpoint(url: &str) -> Result<RedisEndpoint, &'static str> {
    let (tls, rest) = if let Some(r) = url.strip_prefix("rediss://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("redis://") {
        (false, r)
    } else {
        return Err("must be redis://HOST[:PORT][/DB] or rediss://… (TLS)");
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return Err(
            "must carry no user or password: a password in a URL is readable by everyone who \
             can read the object that holds it; connectors on the platform's Redis get their \
             namespace's own user by injection",
        );
    }
    let (host, port) = match authority.rsplit_once(':') {
        // An IPv6 literal: `[::1]:6379` or `[::1]`.
        Some((h, p)) if !p.contains(']') => {
            (h, p.parse().map_err(|_| "has a port that is not a number")?)
        }
        _ => (authority, 6379),
    };
    if host.is_empty() {
        return Err("must name a host");
    }
    Ok(RedisEndpoint {
        tls,
        host: host.to_ascii_lowercase(),
        port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        for ok in ["a", "team-a", "0", &"a".repeat(63)] {
            assert!(is_dns_label(ok), "{ok:?}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", "a/b", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_namespace_level_is_its_enforce_label_else_the_default() {
        let labels = |v: &str| BTreeMap::from([(ENFORCE_LABEL.to_string(), v.to_string())]);
        assert_eq!(Level::of_namespace(None, Level::Baseline), Level::Baseline);
        assert_eq!(
            Level::of_namespace(Some(&labels("privileged")), Level::Restricted),
            Level::Privileged
        );
        // Not a level: restricted, as the API server's PodSecurity admission reads it.
        assert_eq!(
            Level::labelled(Some(&labels("bogus"))),
            Some(Level::Restricted)
        );
        assert_eq!(Level::Baseline.to_string(), "baseline");
    }
}
