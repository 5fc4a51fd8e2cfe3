//! The rules of `/meta/{key}` both backends share: what a listing holds, what an unset
//! attribute answers, and which attributes a handler may not write. Pure.

use serde_json::json;

use super::Meta;
use crate::error::ProxyError;

/// `{"attrs": [...]}`: the backend's read-only attributes first, then the user's, sorted.
pub fn listing(read_only: &[&str], user: impl IntoIterator<Item = String>) -> Meta {
    let mut names: Vec<String> = user.into_iter().collect();
    names.sort();
    let attrs: Vec<String> = read_only
        .iter()
        .map(|a| a.to_string())
        .chain(names)
        .collect();
    json!({ "attrs": attrs })
}

/// `{"value": ...}` of a user attribute, or the refusal naming the key and the attribute.
pub fn user_value(key: &str, attr: &str, value: Option<String>) -> Result<Meta, ProxyError> {
    match value {
        Some(v) => Ok(json!({ "value": v })),
        None => Err(ProxyError::NoAttr {
            key: key.to_string(),
            attr: attr.to_string(),
        }),
    }
}

/// Refuses a write to an attribute the backend keeps itself (size, version, etag).
pub fn writable(read_only: &[&str], key: &str, attr: &str) -> Result<(), ProxyError> {
    if read_only.contains(&attr) {
        return Err(ProxyError::ReadOnly {
            key: key.to_string(),
            attr: attr.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_puts_the_backends_attributes_first_then_the_users_sorted() {
        let l = listing(&["size", "etag"], ["b".to_string(), "a".to_string()]);
        assert_eq!(l, json!({"attrs": ["size", "etag", "a", "b"]}));
    }

    #[test]
    fn an_unset_attribute_names_key_and_attribute() {
        assert_eq!(
            user_value("k", "a", Some("v".into())).unwrap(),
            json!({"value": "v"})
        );
        let e = user_value("k", "a", None).unwrap_err().to_string();
        assert!(e.contains("\"a\"") && e.contains("\"k\""), "{e}");
    }

    #[test]
    fn the_backends_own_attributes_are_read_only() {
        assert!(writable(&["size", "version"], "k", "owner").is_ok());
        let e = writable(&["size", "version"], "k", "size").unwrap_err();
        assert!(matches!(e, ProxyError::ReadOnly { .. }), "{e}");
    }
}
