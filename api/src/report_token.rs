//! Report tokens: `asya-report.{namespace}.{signature}`, where the signature is
//! HMAC-SHA256 of the namespace under the platform's report key. The gateway verifies one
//! with the key alone (no list of namespaces to keep in step with the cluster), and a tenant
//! who holds its own namespace's token cannot make another's without the key, which stays in
//! the release namespace. One implementation for the gateway (which verifies) and the queue
//! provisioner (which issues each actor namespace's token into a Secret there, docs/DESIGN.md
//! §9); `asya-gateway report-token --namespace N` prints N's token.

use crate::validate::is_dns_label;
use ring::hmac;

/// What every report token starts with; the gateway's client tokens may not.
pub const PREFIX: &str = "asya-report.";

/// Bytes a report key has at least (HMAC-SHA256's block of security).
pub const MIN_KEY_BYTES: usize = 32;

/// Domain separation: the key signs nothing else, and a later format gets its own label.
const LABEL: &[u8] = b"asya-report/v1\0";

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KeyError {
    #[error("the report key has {0} bytes; at least {MIN_KEY_BYTES} are required")]
    TooShort(usize),
    #[error("namespace {0:?}: must be a DNS label (a Kubernetes namespace name)")]
    Namespace(String),
}

/// The platform's key for report tokens.
pub struct ReportKey(hmac::Key);

impl std::fmt::Debug for ReportKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReportKey(..)")
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect()
}

fn message(namespace: &str) -> Vec<u8> {
    [LABEL, namespace.as_bytes()].concat()
}

impl ReportKey {
    /// A key from the bytes of its file (a mounted Secret); surrounding whitespace, such as
    /// the newline an editor adds, is not part of it.
    pub fn new(bytes: &[u8]) -> Result<ReportKey, KeyError> {
        let key = bytes.trim_ascii();
        if key.len() < MIN_KEY_BYTES {
            return Err(KeyError::TooShort(key.len()));
        }
        Ok(ReportKey(hmac::Key::new(hmac::HMAC_SHA256, key)))
    }

    /// The report token of `namespace`.
    pub fn token(&self, namespace: &str) -> Result<String, KeyError> {
        if !is_dns_label(namespace) {
            return Err(KeyError::Namespace(namespace.to_string()));
        }
        let tag = hmac::sign(&self.0, &message(namespace));
        Ok(format!("{PREFIX}{namespace}.{}", hex(tag.as_ref())))
    }

    /// The namespace `token` was made for, when this key made it (compared in constant
    /// time); `None` for anything else.
    pub fn verify(&self, token: &str) -> Option<String> {
        let (namespace, signature) = token.strip_prefix(PREFIX)?.split_once('.')?;
        if !is_dns_label(namespace) {
            return None;
        }
        let tag = unhex(signature)?;
        hmac::verify(&self.0, &message(namespace), &tag).ok()?;
        Some(namespace.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef\n";

    #[test]
    fn a_token_verifies_for_its_namespace_only() {
        let k = ReportKey::new(KEY).unwrap();
        let t = k.token("team").unwrap();
        assert!(t.starts_with("asya-report.team."), "{t}");
        assert_eq!(t.len(), "asya-report.team.".len() + 64);
        assert_eq!(k.verify(&t).as_deref(), Some("team"));
        // Another namespace with the same signature, a changed signature, another key.
        let sig = t.rsplit_once('.').unwrap().1;
        assert_eq!(k.verify(&format!("asya-report.team-a.{sig}")), None);
        let mut flipped = t.clone();
        flipped.pop();
        flipped.push(if t.ends_with('0') { '1' } else { '0' });
        assert_eq!(k.verify(&flipped), None);
        let other = ReportKey::new(b"another key of at least 32 bytes!!").unwrap();
        assert_eq!(other.verify(&t), None);
        assert_ne!(other.token("team").unwrap(), t);
    }

    /// The form is a contract: scripts (and gateway/tests/e2e/conftest.py) compute it as
    /// `hmac.new(key, b"asya-report/v1\0" + ns, sha256).hexdigest()`.
    #[test]
    fn the_token_form_is_pinned() {
        let k = ReportKey::new(b"0123456789abcdef0123456789abcdef").unwrap();
        assert_eq!(
            k.token("team").unwrap(),
            "asya-report.team.a47a24a2342dd4329b1647e65982c7465759344300009e979ae61997e9fc0085"
        );
    }

    #[test]
    fn malformed_tokens_and_keys_are_refused() {
        let k = ReportKey::new(KEY).unwrap();
        for bad in [
            "",
            "asya-report.",
            "asya-report.team",
            "asya-report.team.",
            "asya-report.team.zz",
            "asya-report.Team.00",
            "asya-report.a.b.00",
            "team.00",
        ] {
            assert_eq!(k.verify(bad), None, "{bad:?}");
        }
        assert_eq!(
            ReportKey::new(b"  short  \n").unwrap_err(),
            KeyError::TooShort(5)
        );
        assert_eq!(
            k.token("Team_A").unwrap_err().to_string(),
            "namespace \"Team_A\": must be a DNS label (a Kubernetes namespace name)"
        );
        assert_eq!(
            format!("{k:?}"),
            "ReportKey(..)",
            "the key is never printed"
        );
    }
}
