//! Keys: what the runtime sends in the URL path, decoded and checked before any backend
//! sees them, and how listings are grouped. Stricter than the original on purpose: it
//! passes the path through as-is, so `a/../b` or `a//b` would name odd objects.

use crate::error::ProxyError;

/// S3's limit on an object key, in bytes, checked on the whole backend key
/// `{ASYA_NAMESPACE}/{STATE_PREFIX}/{key}` (see `scope`).
pub const MAX_KEY_BYTES: usize = 1024;

/// Decodes `%XX` escapes (a runtime may URL-encode keys; the original's never does, and a
/// raw key without `%` decodes to itself). `+` stays `+`: keys are paths, not forms.
pub fn percent_decode(field: &'static str, raw: &str) -> Result<String, ProxyError> {
    let bad = |rule| ProxyError::BadRequest {
        field,
        value: raw.to_string(),
        rule,
    };
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| bad("a % must start a two-digit hex escape (write % as %25)"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad("must decode to UTF-8"))
}

/// A key names one object: non-empty, relative, `/`-separated segments that are neither
/// empty nor `.`/`..`, and no control characters. Its length with the namespace and prefix
/// is checked where they are added (`scope`).
pub fn validate_key(key: &str) -> Result<(), ProxyError> {
    let bad = |rule| ProxyError::BadKey {
        key: key.to_string(),
        rule,
    };
    if key.is_empty() {
        return Err(bad("must not be empty"));
    }
    if key.starts_with('/') {
        return Err(bad("must be relative (no leading /)"));
    }
    if key.chars().any(char::is_control) {
        return Err(bad("must not contain control characters"));
    }
    for segment in key.split('/') {
        match segment {
            "" => return Err(bad("must not have empty segments (// or a trailing /)")),
            "." | ".." => return Err(bad("must not have . or .. segments")),
            _ => {}
        }
    }
    Ok(())
}

/// A listing prefix: empty (the mount's root) or a key followed by `/`.
pub fn validate_list_prefix(prefix: &str) -> Result<(), ProxyError> {
    if prefix.is_empty() {
        return Ok(());
    }
    match prefix.strip_suffix('/') {
        Some(dir) => validate_key(dir),
        // `listdir` always sends a trailing /; a bare name prefix would match siblings.
        None => Err(ProxyError::BadRequest {
            field: "prefix",
            value: prefix.to_string(),
            rule: "must be empty or end with /",
        }),
    }
}

/// The query of `GET /keys/?prefix=…&delimiter=/`: decoded, unknown parameters refused.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ListQuery {
    pub prefix: String,
    pub delimiter: Option<String>,
}

pub fn parse_list_query(query: Option<&str>) -> Result<ListQuery, ProxyError> {
    let mut q = ListQuery::default();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "prefix" => q.prefix = percent_decode("prefix", value)?,
            "delimiter" => {
                let d = percent_decode("delimiter", value)?;
                if d != "/" && !d.is_empty() {
                    return Err(ProxyError::BadRequest {
                        field: "delimiter",
                        value: d,
                        rule: "only / is supported",
                    });
                }
                q.delimiter = (!d.is_empty()).then_some(d);
            }
            other => {
                return Err(ProxyError::BadRequest {
                    field: "query parameter",
                    value: other.to_string(),
                    rule: "only prefix and delimiter are known",
                });
            }
        }
    }
    Ok(q)
}

/// `?attr=A` of `/meta/{key}`: an attribute name is 1..=128 of `[A-Za-z0-9_.-]`, so it is
/// a valid S3 metadata name and a Redis hash field without escaping.
pub fn parse_attr(query: Option<&str>) -> Result<Option<String>, ProxyError> {
    let Some(query) = query.filter(|q| !q.is_empty()) else {
        return Ok(None);
    };
    let mut attr = None;
    for pair in query.split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name != "attr" {
            return Err(ProxyError::BadRequest {
                field: "query parameter",
                value: name.to_string(),
                rule: "only attr is known",
            });
        }
        let value = percent_decode("attr", value)?;
        let ok = (1..=128).contains(&value.len())
            && value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if !ok {
            return Err(ProxyError::BadRequest {
                field: "attr",
                value,
                rule: "must be 1..=128 characters of A-Z a-z 0-9 _ . -",
            });
        }
        attr = Some(value);
    }
    Ok(attr)
}

/// A listing: full mount-relative keys, and the "directories" one level below `prefix`
/// (ending in `/`), both sorted, as the original answers.
#[derive(Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Listing {
    pub keys: Vec<String>,
    pub prefixes: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_keys_pass() {
        for k in ["a", "checkpoints/run-42.json", "a b/ü.txt", "x/.hidden"] {
            assert_eq!(validate_key(k), Ok(()), "{k}");
        }
    }

    #[test]
    fn bad_keys_name_key_and_rule() {
        for (k, rule) in [
            ("", "empty"),
            ("/a", "relative"),
            ("a//b", "empty segments"),
            ("a/", "empty segments"),
            ("a/../b", ".."),
            ("./a", ".."),
            ("a\nb", "control"),
        ] {
            let err = validate_key(k).expect_err(k).to_string();
            assert!(
                err.contains(rule) && err.contains(&format!("{k:?}")),
                "{err}"
            );
        }
    }

    #[test]
    fn decoding() {
        assert_eq!(percent_decode("key", "a%20b%2Fc").as_deref(), Ok("a b/c"));
        assert_eq!(percent_decode("key", "a+b").as_deref(), Ok("a+b"));
        assert!(percent_decode("key", "100%").is_err());
        assert!(percent_decode("key", "%zz").is_err());
        assert!(percent_decode("key", "%ff").is_err(), "not UTF-8");
    }

    #[test]
    fn list_queries() {
        assert_eq!(
            parse_list_query(Some("prefix=runs/&delimiter=/")),
            Ok(ListQuery {
                prefix: "runs/".into(),
                delimiter: Some("/".into())
            })
        );
        assert_eq!(parse_list_query(None), Ok(ListQuery::default()));
        assert!(parse_list_query(Some("delimiter=,")).is_err());
        assert!(parse_list_query(Some("max=3")).is_err());
        assert!(validate_list_prefix("runs").is_err());
        assert!(validate_list_prefix("runs/../").is_err());
        assert!(validate_list_prefix("runs/").is_ok());
    }

    #[test]
    fn attrs() {
        assert_eq!(parse_attr(None), Ok(None));
        assert_eq!(parse_attr(Some("attr=owner")), Ok(Some("owner".into())));
        assert!(parse_attr(Some("attr=a b")).is_err());
        assert!(parse_attr(Some("attr=")).is_err());
        assert!(parse_attr(Some("x=1")).is_err());
    }
}
