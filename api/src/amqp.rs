//! The AMQP URL rule every part that connects to RabbitMQ shares.

use std::borrow::Cow;

/// `amqp://guest:guest@host:5672/` means the default vhost `/`, as the original Asya, pika and
/// the RabbitMQ docs' examples read it. The AMQP URI spec reads that bare `/` as the *empty*
/// vhost, which no broker has, so a client following the spec retries forever with "vhost not
/// found". Any other path (`/%2f`, `/prod`, none at all) is left as written.
pub fn normalize_url(url: &str) -> Cow<'_, str> {
    let Some(scheme_end) = url.find("://") else {
        return Cow::Borrowed(url);
    };
    let rest_start = scheme_end + 3;
    let rest = &url[rest_start..];
    let path_start = match rest.find(['/', '?', '#']) {
        Some(i) if rest.as_bytes()[i] == b'/' => rest_start + i,
        _ => return Cow::Borrowed(url),
    };
    let after = &url[path_start + 1..];
    if after.is_empty() || after.starts_with(['?', '#']) {
        Cow::Owned(format!("{}/%2f{}", &url[..path_start], after))
    } else {
        Cow::Borrowed(url)
    }
}

/// The vhost a (normalized) URL names, decoded, for messages: `/` for `/%2f`.
pub fn vhost_of(url: &str) -> String {
    let url = normalize_url(url);
    let Some(rest) = url.split_once("://").map(|(_, r)| r) else {
        return "/".into();
    };
    let path = match rest.find('/') {
        Some(i) => &rest[i + 1..],
        None => return "/".into(),
    };
    let path = path.split(['?', '#']).next().unwrap_or("");
    percent_decode(path)
}

fn percent_decode(s: &str) -> String {
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
    fn a_bare_slash_is_the_default_vhost() {
        assert_eq!(
            normalize_url("amqp://guest:guest@host:5672/"),
            "amqp://guest:guest@host:5672/%2f"
        );
        assert_eq!(
            normalize_url("amqps://u:p@h/?heartbeat=10"),
            "amqps://u:p@h/%2f?heartbeat=10"
        );
        assert_eq!(vhost_of("amqp://guest:guest@host:5672/"), "/");
    }

    #[test]
    fn other_paths_stay_as_written() {
        for url in [
            "amqp://guest:guest@host:5672/%2f",
            "amqp://guest:guest@host:5672/%2F",
            "amqp://guest:guest@host:5672/prod",
            "amqp://guest:guest@host:5672",
            "amqp://h?x=1",
            "not a url",
        ] {
            assert_eq!(normalize_url(url), url);
        }
        assert_eq!(vhost_of("amqp://h:5672/prod"), "prod");
        assert_eq!(vhost_of("amqp://h:5672/a%2fb"), "a/b");
        assert_eq!(vhost_of("amqp://h:5672"), "/");
        // Not hex, or not ASCII, after '%': kept as written, never a panic.
        assert_eq!(vhost_of("amqp://h/%zz%é%"), "%zz%é%");
    }

    #[test]
    fn a_slash_in_the_password_is_not_a_path() {
        // Userinfo must percent-encode '/', so the first '/' after the authority starts the
        // path; an unencoded one is the user's error and stays as written.
        assert_eq!(
            normalize_url("amqp://u:p%2fq@h:5672/"),
            "amqp://u:p%2fq@h:5672/%2f"
        );
    }
}
