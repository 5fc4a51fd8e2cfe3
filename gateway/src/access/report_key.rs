//! Report tokens: `asya-report.{namespace}.{uid}.{signature}`. The derivation lives in
//! [`asya_api::report_token`], shared with the queue provisioner, which issues each actor
//! namespace's token into a Secret there; the gateway only verifies (and asks
//! [`super::namespaces`] whether the uid is current).

pub use asya_api::report_token::{Claim, KeyError, MIN_KEY_BYTES, PREFIX, Refused, ReportKey};

#[cfg(test)]
mod tests {
    use super::*;

    /// The form is a contract with the provisioner (which issues tokens with the same
    /// function) and with scripts (gateway/tests/e2e/conftest.py computes it as
    /// `hmac.new(key, b"asya-report/v2\0" + ns + b"\0" + uid, sha256).hexdigest()`).
    #[test]
    fn the_token_form_is_pinned() {
        let k = ReportKey::new(b"0123456789abcdef0123456789abcdef").unwrap();
        let uid = "6f1c2d3e-0000-4000-8000-00000000000a";
        let t = k.token("team", uid).unwrap();
        assert_eq!(
            t,
            "asya-report.team.6f1c2d3e-0000-4000-8000-00000000000a.\
             6b1787da0ae60378cb4eeede15fde29952a44f86caf5282e4f466e228efeac11"
        );
        assert_eq!(
            k.verify(&t),
            Ok(Claim {
                namespace: "team".into(),
                uid: uid.into()
            })
        );
    }
}
