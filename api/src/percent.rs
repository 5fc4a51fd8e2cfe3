//! Percent-encoding of one URL component (RFC 3986): the single encoder the webhook, the
//! provisioner and the sidecar use for userinfo, vhosts and path segments.

/// Encodes everything but the unreserved characters (`A-Z a-z 0-9 - . _ ~`), with uppercase
/// hex: safe in userinfo, a path segment and a query value alike (`/` becomes `%2F`).
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Decodes `%XX` sequences (either case). A `%` not followed by two hex digits is kept as
/// written, never an error: the result is for messages and names, and bytes that are not
/// UTF-8 come out as U+FFFD.
pub fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_components_are_escaped() {
        assert_eq!(encode("/"), "%2F");
        assert_eq!(encode("a b@c"), "a%20b%40c");
        assert_eq!(encode("prod-1"), "prod-1");
        assert_eq!(encode("A.z_~9"), "A.z_~9");
        assert_eq!(encode("é"), "%C3%A9");
    }

    #[test]
    fn decoding_undoes_encoding_and_keeps_junk() {
        for s in ["/", "a b@c", "team/a", "é", "%", ""] {
            assert_eq!(decode(&encode(s)), s);
        }
        assert_eq!(decode("a%2fb"), "a/b");
        assert_eq!(decode("%zz%é%"), "%zz%é%");
    }
}
