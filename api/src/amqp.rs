//! The AMQP URL rules every part that connects to RabbitMQ shares: how a URL is built from
//! the cluster configuration (the webhook for the sidecar, the provisioner for itself and
//! KEDA) and how a URL given by hand is read.

use std::borrow::Cow;

use crate::config::{AMQPS_PORT, TransportSettings};
use crate::percent;

/// The broker host when the configuration names none: the chart's RabbitMQ Service, as in
/// `ClusterConfig::default()` and the chart's gateway template. (Validation requires a host
/// for an enabled RabbitMQ transport, so this is the fallback of last resort.)
pub const DEFAULT_HOST: &str = "rabbitmq";
/// RabbitMQ's plain AMQP port.
pub const AMQP_PORT: u16 = 5672;
const DEFAULT_USER: &str = "guest";
const DEFAULT_VHOST: &str = "/";

/// The password part of a URL's userinfo.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Password<'a> {
    /// None: the URL names the user only.
    None,
    /// The password itself, percent-encoded into the URL.
    Clear(&'a str),
    /// `$(VAR)`, written as is: Kubernetes expands it from an earlier env entry of the same
    /// container, so the password stays in its Secret and out of the pod spec.
    EnvRef(&'a str),
}

impl<'a> From<Option<&'a str>> for Password<'a> {
    fn from(p: Option<&'a str>) -> Self {
        p.map_or(Password::None, Password::Clear)
    }
}

/// The broker host a RabbitMQ transport names, [`DEFAULT_HOST`] when none.
pub fn host(c: &TransportSettings) -> &str {
    c.host.as_deref().unwrap_or(DEFAULT_HOST)
}

/// The AMQP URL of a RabbitMQ transport: `amqps` by `TransportSettings::rabbitmq_tls`, the
/// configured port or that scheme's own.
pub fn url(c: &TransportSettings, password: Password<'_>) -> String {
    let tls = c.rabbitmq_tls();
    let scheme = if tls { "amqps" } else { "amqp" };
    let port = c.port.unwrap_or(if tls { AMQPS_PORT } else { AMQP_PORT });
    url_at(scheme, port, c, password)
}

/// The AMQP URL with user and password both `$(VAR)` references, expanded by Kubernetes from
/// earlier env entries: the namespace's broker identity stays in its Secret (§9).
pub fn url_with_identity_refs(c: &TransportSettings, user_var: &str, password_var: &str) -> String {
    let tls = c.rabbitmq_tls();
    let scheme = if tls { "amqps" } else { "amqp" };
    let port = c.port.unwrap_or(if tls { AMQPS_PORT } else { AMQP_PORT });
    let vhost = percent::encode(c.vhost.as_deref().unwrap_or(DEFAULT_VHOST));
    format!(
        "{scheme}://$({user_var}):$({password_var})@{}:{port}/{vhost}",
        host(c)
    )
}

/// `scheme://user[:password]@host:port/vhost` for the transport's broker: user, a clear
/// password and the vhost percent-encoded (the vhost as the last path segment, `/` as `%2F`,
/// as AMQP clients and KEDA read it). Other schemes and ports reach the management API.
pub fn url_at(scheme: &str, port: u16, c: &TransportSettings, password: Password<'_>) -> String {
    let user = percent::encode(c.username.as_deref().unwrap_or(DEFAULT_USER));
    let userinfo = match password {
        Password::None => user,
        Password::Clear(p) => format!("{user}:{}", percent::encode(p)),
        Password::EnvRef(var) => format!("{user}:$({var})"),
    };
    let vhost = percent::encode(c.vhost.as_deref().unwrap_or(DEFAULT_VHOST));
    format!("{scheme}://{userinfo}@{}:{port}/{vhost}", host(c))
}

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
    percent::decode(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(yaml: &str) -> TransportSettings {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn identity_refs_leave_user_and_password_to_the_pod() {
        let c = settings("{host: rabbitmq, port: 5672, vhost: team/a, username: guest}");
        assert_eq!(
            url_with_identity_refs(&c, "U", "P"),
            "amqp://$(U):$(P)@rabbitmq:5672/team%2Fa"
        );
    }

    #[test]
    fn urls_follow_the_configuration() {
        let c = settings("{host: rabbitmq, port: 5672, vhost: /, username: guest}");
        assert_eq!(
            url(&c, Password::Clear("p@ss")),
            "amqp://guest:p%40ss@rabbitmq:5672/%2F"
        );
        assert_eq!(
            url(&c, Password::EnvRef("ASYA_RABBITMQ_PASSWORD")),
            "amqp://guest:$(ASYA_RABBITMQ_PASSWORD)@rabbitmq:5672/%2F"
        );
        let c = settings("{host: 10.0.0.5, vhost: team/a, username: a b}");
        assert_eq!(
            url(&c, Password::None),
            "amqp://a%20b@10.0.0.5:5672/team%2Fa"
        );
        assert_eq!(
            url_at("http", 15672, &c, None.into()),
            "http://a%20b@10.0.0.5:15672/team%2Fa"
        );
        // TLS by the shared rule, on its own port unless one is configured.
        assert_eq!(
            url(&settings("{host: h, tls: true}"), Password::None),
            "amqps://guest@h:5671/%2F"
        );
        assert_eq!(
            url(&settings("{host: h, port: 5671}"), Password::None),
            "amqps://guest@h:5671/%2F"
        );
        assert_eq!(
            url(
                &settings("{host: h, port: 5999, tls: true}"),
                Password::None
            ),
            "amqps://guest@h:5999/%2F"
        );
    }

    #[test]
    fn one_default_host() {
        let c = TransportSettings::default();
        assert_eq!(host(&c), DEFAULT_HOST);
        assert_eq!(url(&c, Password::None), "amqp://guest@rabbitmq:5672/%2F");
        // The default configuration names the same host.
        let cfg = crate::ClusterConfig::default();
        assert_eq!(host(&cfg.transports["rabbitmq"].config), DEFAULT_HOST);
    }

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
