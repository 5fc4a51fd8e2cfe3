//! Report tokens: `asya-report.{namespace}.{signature}`. The derivation lives in
//! [`asya_api::report_token`], shared with the queue provisioner, which issues each actor
//! namespace's token into a Secret there; the gateway only verifies.

pub use asya_api::report_token::{KeyError, MIN_KEY_BYTES, PREFIX, ReportKey};

#[cfg(test)]
mod tests {
    use super::*;

    /// The form is a contract with the provisioner (which issues tokens with the same
    /// function) and with scripts (gateway/tests/e2e/conftest.py computes it as
    /// `hmac.new(key, b"asya-report/v1\0" + ns, sha256).hexdigest()`).
    #[test]
    fn the_token_form_is_pinned() {
        let k = ReportKey::new(b"0123456789abcdef0123456789abcdef").unwrap();
        let t = k.token("team").unwrap();
        assert_eq!(
            t,
            "asya-report.team.a47a24a2342dd4329b1647e65982c7465759344300009e979ae61997e9fc0085"
        );
        assert_eq!(k.verify(&t).as_deref(), Some("team"));
    }
}
