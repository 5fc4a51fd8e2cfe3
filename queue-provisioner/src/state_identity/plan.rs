//! Pure decisions about a namespace's state identity: whose the state under `{ns}/` is, and
//! the ACL rules of the namespace's Redis user. The password and its Secret follow the broker
//! identity's rules ([`crate::broker_identity::plan`]), with their own Secret and version.

use asya_api::state_proxy::redis_acl;

/// On the state Secret, and on the pod template of every workload that uses it, so that a
/// new password rolls the pods holding the old one.
pub const VERSION_ANNOTATION: &str = "asya.sh/state-credential-version";

/// Where the owner mark of namespace `ns`'s state lives. It contains `:`, which no namespace
/// name has, so it lies outside every namespace's keys (`{ns}/*`): no tenant can read,
/// forge or delete it.
pub fn owner_key(ns: &str) -> String {
    format!("asya:owner:{ns}")
}

/// The Redis user of namespace `ns` (the same name as its broker user, so the Secret's
/// `username` is checked by the broker identity's rule).
pub fn user(ns: &str) -> String {
    redis_acl::username(ns)
}

/// What the owner mark says, against the namespace as it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// The mark names this namespace (or was just set to it).
    Ours,
    /// The mark names an earlier namespace of the same name: its uid.
    Earlier(String),
}

/// `previous`: the mark before this claim (`None`: there was none and it now names `uid`).
pub fn owner(previous: Option<&str>, uid: &str) -> Owner {
    match previous {
        None => Owner::Ours,
        Some(p) if p == uid => Owner::Ours,
        Some(p) => Owner::Earlier(p.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_decides_whose_the_state_is() {
        assert_eq!(owner(None, "u1"), Owner::Ours);
        assert_eq!(owner(Some("u1"), "u1"), Owner::Ours);
        assert_eq!(owner(Some("u0"), "u1"), Owner::Earlier("u0".into()));
    }

    #[test]
    fn the_mark_is_outside_every_namespace_key_space() {
        let k = owner_key("team");
        // A namespace's keys are `{ns}/...`, and no namespace name contains ':'.
        assert!(!k.contains('/'));
        assert!(k.starts_with("asya:owner:"));
        assert!(!asya_api::validate::is_dns_label(
            k.split('/').next().unwrap()
        ));
    }

    #[test]
    fn the_user_is_the_broker_users_name() {
        assert_eq!(user("team"), asya_api::naming::tenant_broker_user("team"));
    }
}
