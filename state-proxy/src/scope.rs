//! Where a mount's keys live in the backend: `{ASYA_NAMESPACE}/{STATE_PREFIX}/{key}`. The
//! namespace comes from the pod (the webhook sets it from `metadata.namespace`) and always
//! comes first; STATE_PREFIX nests inside it. Every backend key the connector names is made
//! here, from a key that passed [`keys::validate_key`], so nothing a client sends can leave
//! `{namespace}/`: a key has no `.`/`..`/empty segment and no leading `/`, and is decoded
//! before it is checked (so `%2e%2e` and `%2F` are checked as `..` and `/`). Pure.

use crate::error::ProxyError;
use crate::keys::{self, MAX_KEY_BYTES};

/// A DNS label, as Kubernetes namespace names are: 1..=63 of `a-z 0-9 -`, starting and
/// ending with a letter or digit. Also what makes `~{ns}/*` a literal Redis key pattern.
pub fn namespace_problem(ns: &str) -> Option<&'static str> {
    let ok = (1..=63).contains(&ns.len())
        && ns
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !ns.starts_with('-')
        && !ns.ends_with('-');
    (!ok).then_some(
        "required: the namespace the connector serves, a DNS label (1..=63 of a-z 0-9 -, \
         starting and ending with a letter or digit)",
    )
}

/// STATE_PREFIX without its trailing `/`s, or why it is refused: it nests inside the
/// namespace, so it must be relative, with no empty, `.` or `..` segment and no control
/// character.
pub fn state_prefix(raw: &str) -> Result<String, &'static str> {
    let p = raw.trim_end_matches('/');
    if p.is_empty() {
        return Ok(String::new());
    }
    if p.starts_with('/') {
        return Err("must be relative (no leading /): it nests inside {ASYA_NAMESPACE}/");
    }
    if p.chars().any(char::is_control) {
        return Err("must not contain control characters");
    }
    if p.split('/').any(|s| matches!(s, "" | "." | "..")) {
        return Err("must not have empty, . or .. segments: it nests inside {ASYA_NAMESPACE}/");
    }
    Ok(p.to_string())
}

/// A mount's place in the backend: `{namespace}/` or `{namespace}/{prefix}/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    namespace: String,
    root: String,
}

/// Why a namespace or prefix cannot make a scope (the caller names the variable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopeError {
    Namespace(&'static str),
    Prefix(&'static str),
}

impl Scope {
    pub fn new(namespace: &str, prefix: &str) -> Result<Scope, ScopeError> {
        if let Some(rule) = namespace_problem(namespace) {
            return Err(ScopeError::Namespace(rule));
        }
        let prefix = state_prefix(prefix).map_err(ScopeError::Prefix)?;
        let root = if prefix.is_empty() {
            format!("{namespace}/")
        } else {
            format!("{namespace}/{prefix}/")
        };
        // Room for at least a one-byte key within S3's limit.
        if root.len() >= MAX_KEY_BYTES {
            return Err(ScopeError::Prefix(
                "with the namespace must leave room for a key within 1024 bytes",
            ));
        }
        Ok(Scope {
            namespace: namespace.to_string(),
            root,
        })
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// `{namespace}/` or `{namespace}/{prefix}/`: every key of the mount starts with it.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// The backend key of a client's (decoded) key: checked, then put under the root; the
    /// whole backend key counts toward the 1024-byte limit.
    pub fn key(&self, key: &str) -> Result<String, ProxyError> {
        keys::validate_key(key)?;
        let full = format!("{}{key}", self.root);
        if full.len() > MAX_KEY_BYTES {
            return Err(ProxyError::BadKey {
                key: key.to_string(),
                rule: "with the namespace and STATE_PREFIX must be at most 1024 bytes",
            });
        }
        Ok(full)
    }

    /// The backend prefix of a listing's (decoded) prefix: the root for the mount's root,
    /// else a checked key under it followed by `/`.
    pub fn list_prefix(&self, prefix: &str) -> Result<String, ProxyError> {
        keys::validate_list_prefix(prefix)?;
        match prefix.strip_suffix('/') {
            None => Ok(self.root.clone()),
            Some(dir) => Ok(format!("{}/", self.key(dir)?)),
        }
    }

    /// The mount-relative key of a backend key, or None for one outside the mount.
    pub fn relative<'a>(&self, backend: &'a str) -> Option<&'a str> {
        backend.strip_prefix(self.root.as_str())
    }

    /// A key of the connector's own under `{namespace}/` (Redis' index and version
    /// counter): its name starts with a control character, which no client key and no
    /// STATE_PREFIX has, so it neither collides with a key nor shows in a listing, and the
    /// namespace's ACL key pattern `~{namespace}/*` covers it.
    pub fn internal_key(&self, name: &str) -> String {
        format!("{}/\u{1}{name}", self.namespace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::percent_decode;

    fn scope(ns: &str, prefix: &str) -> Scope {
        Scope::new(ns, prefix).expect("a valid scope")
    }

    #[test]
    fn keys_are_namespace_then_prefix_then_key() {
        assert_eq!(scope("team-a", "").key("a/b").unwrap(), "team-a/a/b");
        assert_eq!(scope("team-a", "ckpt/").key("a").unwrap(), "team-a/ckpt/a");
        assert_eq!(scope("b", "team-a").key("x").unwrap(), "b/team-a/x");
        assert_eq!(scope("b", "team-a").root(), "b/team-a/");
        assert_eq!(scope("b", "").list_prefix("").unwrap(), "b/");
        assert_eq!(scope("b", "p").list_prefix("runs/").unwrap(), "b/p/runs/");
        assert_eq!(scope("b", "p").relative("b/p/runs/x"), Some("runs/x"));
        assert_eq!(scope("b", "p").relative("b/px/runs/x"), None);
        assert_eq!(scope("b", "").relative("a/x"), None);
    }

    #[test]
    fn the_namespace_must_be_a_dns_label() {
        for ns in [
            "",
            "-a",
            "a-",
            "A",
            "a_b",
            "a.b",
            "a/b",
            "..",
            "*",
            &"a".repeat(64),
        ] {
            assert!(
                matches!(Scope::new(ns, ""), Err(ScopeError::Namespace(_))),
                "{ns:?}"
            );
        }
        for ns in ["a", "team-a", "0", &"a".repeat(63)] {
            assert!(Scope::new(ns, "").is_ok(), "{ns:?}");
        }
    }

    #[test]
    fn a_prefix_cannot_leave_its_namespace() {
        for p in [
            "../team-b",
            "/team-b",
            "a/../../b",
            "..",
            ".",
            "a//b",
            "./a",
            "a\u{0}b",
            "a\nb",
        ] {
            assert!(
                matches!(Scope::new("ns", p), Err(ScopeError::Prefix(_))),
                "{p:?}"
            );
        }
        assert_eq!(scope("ns", "team/a//").root(), "ns/team/a/");
        assert!(matches!(
            Scope::new("ns", &"p".repeat(1020)),
            Err(ScopeError::Prefix(_))
        ));
    }

    /// What a client can send, decoded as the server decodes it: every key either is refused
    /// or stays under the root, and reads back as itself.
    #[test]
    fn no_client_key_escapes_the_namespace() {
        let s = scope("team-b", "p");
        let hostile = [
            "..",
            "../team-a/x",
            "%2e%2e/team-a/x",
            "%2E%2E%2Fteam-a%2Fx",
            "a/%2e%2e/%2e%2e/team-a",
            "/team-a/x",
            "%2Fteam-a/x",
            "%2F%2Fx",
            "a%2F..%2F..%2Fx",
            ".%2F..",
            "a/./b",
            "a//b",
            "x/",
            "\u{1}asya-state-proxy-index",
            "%01asya-state-proxy-index",
            "a%00b",
            "%0a",
            "",
        ];
        for raw in hostile {
            let Ok(decoded) = percent_decode("key", raw) else {
                continue;
            };
            assert!(s.key(&decoded).is_err(), "{raw:?} must be refused");
            assert!(
                s.list_prefix(&format!("{decoded}/")).is_err() || decoded.is_empty(),
                "{raw:?} as a listing prefix must be refused"
            );
        }
        // Whatever is accepted is under the root, has no dot segment, and reads back as itself.
        let alphabet = [
            'a', '.', '/', '%', '2', 'e', 'E', 'F', 'f', '\\', ' ', '\u{1}',
        ];
        let mut accepted = 0;
        for n in 0..alphabet.len().pow(5) {
            let mut raw = String::new();
            let mut i = n;
            for _ in 0..5 {
                raw.push(alphabet[i % alphabet.len()]);
                i /= alphabet.len();
            }
            let Ok(decoded) = percent_decode("key", &raw) else {
                continue;
            };
            if let Ok(full) = s.key(&decoded) {
                accepted += 1;
                assert!(full.starts_with("team-b/p/"), "{raw:?} -> {full:?}");
                let rest = &full["team-b/p/".len()..];
                assert!(
                    rest.split('/').all(|seg| !matches!(seg, "" | "." | "..")),
                    "{raw:?} -> {full:?}"
                );
                assert_eq!(s.relative(&full), Some(decoded.as_str()));
                assert!(!full.chars().any(char::is_control));
            }
        }
        assert!(accepted > 1000, "the alphabet must also make valid keys");
    }

    #[test]
    fn the_whole_backend_key_counts_toward_1024_bytes() {
        let s = scope("team-a", "p");
        let room = 1024 - "team-a/p/".len();
        assert!(s.key(&"k".repeat(room)).is_ok());
        let e = s.key(&"k".repeat(room + 1)).unwrap_err().to_string();
        assert!(e.contains("1024") && e.contains("namespace"), "{e}");
    }

    #[test]
    fn internal_keys_are_in_the_namespace_and_no_client_key() {
        let s = scope("team-a", "");
        let k = s.internal_key("asya-state-proxy-index");
        assert!(k.starts_with("team-a/"));
        assert!(s.key(&k["team-a/".len()..]).is_err());
        assert!(s.key(&k).is_err());
    }
}
