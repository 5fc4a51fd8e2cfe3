//! Report tokens: `asya-report.{namespace}.{uid}.{signature}`, where `uid` is the namespace's
//! `metadata.uid` and the signature is HMAC-SHA256 of both under the platform's report key.
//! The gateway verifies one with the key alone, then asks whether `uid` is the namespace's
//! current one, so a namespace deleted and re-created (perhaps by another team) does not
//! inherit the old namespace's token. A tenant who holds its own token cannot make another's
//! without the key, which stays in the release namespace. One implementation for the gateway
//! (which verifies) and the queue provisioner (which issues each actor namespace's token into a
//! Secret there, docs/DESIGN.md §9); `asya-gateway report-token --namespace N` prints N's.
//!
//! The first format, `asya-report.{namespace}.{signature}` (label `asya-report/v1`, bound to
//! the name only), is recognised only to be refused with a message that says so.

use crate::basics::is_dns_label;
use ring::{digest, hmac};

/// What every report token starts with; the gateway's client tokens may not.
pub const PREFIX: &str = "asya-report.";

/// Bytes a report key has at least (HMAC-SHA256's block of security).
pub const MIN_KEY_BYTES: usize = 32;

/// Domain separation: the key signs nothing else, and each format has its own label.
const LABEL: &[u8] = b"asya-report/v2\0";

/// Characters a namespace uid has at most (the API server's are 36-character UUIDs).
const MAX_UID_CHARS: usize = 64;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KeyError {
    #[error("the report key has {0} bytes; at least {MIN_KEY_BYTES} are required")]
    TooShort(usize),
    #[error("namespace {0:?}: must be a DNS label (a Kubernetes namespace name)")]
    Namespace(String),
    #[error(
        "namespace uid {0:?}: must be the namespace's metadata.uid (1 to {MAX_UID_CHARS} \
         lowercase letters, digits and '-')"
    )]
    Uid(String),
}

/// Why a token is not accepted. Never names the token.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refused {
    #[error(
        "a report token of the first format (asya-report.<namespace>.<signature>, not bound to \
         the namespace's uid) is no longer accepted; the provisioner re-issues the namespace's \
         token, and its pods roll onto it"
    )]
    FirstFormat,
    /// Malformed, or not made by this key: told apart from nothing else.
    #[error("not a report token made by this gateway's report key")]
    NotAccepted,
}

/// What a verified token says: the namespace and the uid it was issued for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub namespace: String,
    pub uid: String,
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

/// A namespace uid as the API server gives it: no '.', which separates the token's parts.
pub fn is_uid(uid: &str) -> bool {
    (1..=MAX_UID_CHARS).contains(&uid.len())
        && uid
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The signed message: label, namespace, a NUL (neither part contains one), uid.
fn message(namespace: &str, uid: &str) -> Vec<u8> {
    [LABEL, namespace.as_bytes(), b"\0", uid.as_bytes()].concat()
}

/// A short digest of `token` for the actor workloads' pod template annotation: a new token
/// (new key, or the namespace re-created) changes it and rolls the pods, whose sidecars read
/// the token only at start. The token cannot be recovered from it.
pub fn fingerprint(token: &str) -> String {
    let d = digest::digest(
        &digest::SHA256,
        &[b"asya-report/fingerprint\0", token.as_bytes()].concat(),
    );
    hex(&d.as_ref()[..8])
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

    /// The report token of `namespace` whose `metadata.uid` is `uid`.
    pub fn token(&self, namespace: &str, uid: &str) -> Result<String, KeyError> {
        if !is_dns_label(namespace) {
            return Err(KeyError::Namespace(namespace.to_string()));
        }
        if !is_uid(uid) {
            return Err(KeyError::Uid(uid.to_string()));
        }
        let tag = hmac::sign(&self.0, &message(namespace, uid));
        Ok(format!("{PREFIX}{namespace}.{uid}.{}", hex(tag.as_ref())))
    }

    /// The namespace and uid `token` was made for, when this key made it (compared in
    /// constant time). Whether the uid is still the namespace's is the caller's question.
    pub fn verify(&self, token: &str) -> Result<Claim, Refused> {
        let rest = token.strip_prefix(PREFIX).ok_or(Refused::NotAccepted)?;
        let parts: Vec<&str> = rest.split('.').collect();
        let [namespace, uid, signature] = parts[..] else {
            // Two parts is the first format's shape (namespace, signature): refused as such
            // without looking at its signature, which tells nothing either way.
            return Err(match parts[..] {
                [ns, sig] if is_dns_label(ns) && !sig.is_empty() && unhex(sig).is_some() => {
                    Refused::FirstFormat
                }
                _ => Refused::NotAccepted,
            });
        };
        if !is_dns_label(namespace) || !is_uid(uid) {
            return Err(Refused::NotAccepted);
        }
        let tag = unhex(signature).ok_or(Refused::NotAccepted)?;
        hmac::verify(&self.0, &message(namespace, uid), &tag).map_err(|_| Refused::NotAccepted)?;
        Ok(Claim {
            namespace: namespace.to_string(),
            uid: uid.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef\n";
    const UID: &str = "6f1c2d3e-0000-4000-8000-00000000000a";
    const UID2: &str = "6f1c2d3e-0000-4000-8000-00000000000b";

    fn claim(ns: &str, uid: &str) -> Claim {
        Claim {
            namespace: ns.into(),
            uid: uid.into(),
        }
    }

    #[test]
    fn a_token_verifies_for_its_namespace_and_uid_only() {
        let k = ReportKey::new(KEY).unwrap();
        let t = k.token("team", UID).unwrap();
        assert!(t.starts_with(&format!("asya-report.team.{UID}.")), "{t}");
        assert_eq!(t.len(), format!("asya-report.team.{UID}.").len() + 64);
        assert_eq!(k.verify(&t), Ok(claim("team", UID)));
        // The same signature under another namespace or another uid (the namespace deleted
        // and re-created), a changed signature, another key.
        let sig = t.rsplit_once('.').unwrap().1;
        let refused = Err(Refused::NotAccepted);
        assert_eq!(
            k.verify(&format!("asya-report.team-a.{UID}.{sig}")),
            refused
        );
        assert_eq!(k.verify(&format!("asya-report.team.{UID2}.{sig}")), refused);
        let mut flipped = t.clone();
        flipped.pop();
        flipped.push(if t.ends_with('0') { '1' } else { '0' });
        assert_eq!(k.verify(&flipped), refused);
        let other = ReportKey::new(b"another key of at least 32 bytes!!").unwrap();
        assert_eq!(other.verify(&t), refused);
        assert_ne!(other.token("team", UID).unwrap(), t);
        assert_ne!(k.token("team", UID2).unwrap(), t, "a new uid, a new token");
    }

    /// The form is a contract: scripts (and gateway/tests/e2e/conftest.py) compute it as
    /// `hmac.new(key, b"asya-report/v2\0" + ns + b"\0" + uid, sha256).hexdigest()`.
    #[test]
    fn the_token_form_is_pinned() {
        let k = ReportKey::new(b"0123456789abcdef0123456789abcdef").unwrap();
        assert_eq!(
            k.token("team", UID).unwrap(),
            "asya-report.team.6f1c2d3e-0000-4000-8000-00000000000a.\
             6b1787da0ae60378cb4eeede15fde29952a44f86caf5282e4f466e228efeac11"
        );
    }

    /// The first format (`asya-report/v1`, bound to the name only) is told apart, so the
    /// refusal can say why, and is never accepted, even when the key made it.
    #[test]
    fn the_first_format_is_refused_as_such() {
        let k = ReportKey::new(b"0123456789abcdef0123456789abcdef").unwrap();
        let v1 =
            "asya-report.team.a47a24a2342dd4329b1647e65982c7465759344300009e979ae61997e9fc0085";
        assert_eq!(k.verify(v1), Err(Refused::FirstFormat));
        assert!(
            Refused::FirstFormat
                .to_string()
                .contains("no longer accepted")
        );
    }

    #[test]
    fn malformed_tokens_keys_and_uids_are_refused() {
        let k = ReportKey::new(KEY).unwrap();
        for bad in [
            "",
            "asya-report.",
            "asya-report.team",
            "asya-report.team.",
            "asya-report.team.zz",
            "asya-report.Team.00",
            "asya-report.team.UID.00",
            "asya-report.team..00",
            "asya-report.team.u.00.00",
            "team.u.00",
        ] {
            assert_eq!(k.verify(bad), Err(Refused::NotAccepted), "{bad:?}");
        }
        assert_eq!(
            ReportKey::new(b"  short  \n").unwrap_err(),
            KeyError::TooShort(5)
        );
        assert_eq!(
            k.token("Team_A", UID).unwrap_err().to_string(),
            "namespace \"Team_A\": must be a DNS label (a Kubernetes namespace name)"
        );
        for uid in ["", "a.b", "ABC", &"a".repeat(65)] {
            assert_eq!(
                k.token("team", uid).unwrap_err(),
                KeyError::Uid(uid.to_string())
            );
        }
        assert_eq!(
            format!("{k:?}"),
            "ReportKey(..)",
            "the key is never printed"
        );
    }

    #[test]
    fn the_fingerprint_follows_the_token_and_hides_it() {
        let k = ReportKey::new(KEY).unwrap();
        let (a, b) = (
            k.token("team", UID).unwrap(),
            k.token("team", UID2).unwrap(),
        );
        assert_eq!(fingerprint(&a), fingerprint(&a));
        assert_ne!(fingerprint(&a), fingerprint(&b));
        assert_eq!(fingerprint(&a).len(), 16);
        assert!(!a.contains(&fingerprint(&a)));
    }
}
