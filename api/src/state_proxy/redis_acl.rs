//! The Redis identity of a namespace's state connectors (docs/DESIGN.md §10.1): one ACL user
//! per namespace, `asya-ns-{ns}`, that reaches only the keys under `{ns}/` and may run only the
//! commands the `redis-buffered-cas` connector sends. The provisioner creates and rotates it
//! with [`setuser_args`]; the connector's tests run under exactly these rules.
//!
//! What is left out, and why: SCAN and KEYS list every key of the server whatever the key
//! patterns (Redis 7 does not filter them), FLUSHDB/FLUSHALL empty every namespace, and
//! EVAL/EVALSHA/FCALL would let a handler holding its namespace's Secret run a script that
//! never ends: Redis then answers BUSY to every client, and once the script has written it
//! cannot be killed (only SHUTDOWN NOSAVE). So the connector lists from an index kept inside
//! the namespace and makes its writes atomic with WATCH/MULTI/EXEC, whose commands are here.

use std::fmt;

/// Every command the connector sends, and nothing else: reads of its hashes and its index,
/// writes of them, and the optimistic transaction that makes a compare-and-set atomic. Each
/// touches only the keys named in its arguments, and each costs at most the size of the
/// namespace's own data.
pub const COMMANDS: [&str; 15] = [
    // reads
    "exists",
    "hget",
    "hmget",
    "hkeys",
    "hstrlen",
    "zrangebylex",
    // writes
    "hset",
    "del",
    "incr",
    "zadd",
    "zrem",
    // compare-and-set: WATCH the key, check, MULTI ... EXEC (aborted if the key changed)
    "watch",
    "unwatch",
    "multi",
    "exec",
];

/// A namespace whose Redis identity cannot be written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AclError {
    /// A key pattern is a glob: a name with `*`, `?` or `[` would reach other namespaces.
    #[error(
        "namespace {0:?}: must be a DNS label (a Kubernetes namespace name), so its key pattern ~{0}/* names only its own keys"
    )]
    Namespace(String),
    #[error("the Redis password of namespace {0:?} is refused: must not be empty")]
    EmptyPassword(String),
}

/// The ACL user of namespace `ns`'s state connectors: `asya-ns-{ns}` (as its broker user).
pub fn username(ns: &str) -> String {
    format!("asya-ns-{ns}")
}

/// The one key pattern of namespace `ns`: every key the connector writes starts with `{ns}/`
/// (its data, index and version counter).
pub fn key_pattern(ns: &str) -> String {
    format!("~{ns}/*")
}

/// The user's permissions: the keys under `{ns}/`, no Pub/Sub channel, no command but
/// [`COMMANDS`]. Each rule is one argument of `ACL SETUSER`.
pub fn rules(ns: &str) -> Result<Vec<String>, AclError> {
    if !crate::basics::is_dns_label(ns) {
        return Err(AclError::Namespace(ns.to_string()));
    }
    let mut r: Vec<String> = vec![
        "resetkeys".into(),
        key_pattern(ns),
        "resetchannels".into(),
        "-@all".into(),
    ];
    r.extend(COMMANDS.iter().map(|c| format!("+{c}")));
    Ok(r)
}

/// The arguments of `ACL SETUSER` that create or rotate namespace `ns`'s user: everything it
/// had before is reset (old passwords, patterns, selectors), so the same call creates, repairs
/// and rotates. Connections already authenticated keep running with the new rules.
pub fn setuser_args(ns: &str, password: &str) -> Result<Vec<String>, AclError> {
    let rules = rules(ns)?;
    if password.is_empty() {
        return Err(AclError::EmptyPassword(ns.to_string()));
    }
    let mut args = vec![
        username(ns),
        "reset".into(),
        "on".into(),
        format!(">{password}"),
    ];
    args.extend(rules);
    Ok(args)
}

/// `ACL SETUSER` arguments shown without the password (for logs and events).
pub struct Redacted<'a>(pub &'a [String]);

impl fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: Vec<&str> = self
            .0
            .iter()
            .map(|a| {
                if a.starts_with('>') || a.starts_with('#') {
                    "<password>"
                } else {
                    a.as_str()
                }
            })
            .collect();
        write!(f, "{}", shown.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_of_a_namespace_are_its_keys_and_the_connectors_commands() {
        assert_eq!(
            rules("team-a").unwrap().join(" "),
            "resetkeys ~team-a/* resetchannels -@all +exists +hget +hmget +hkeys +hstrlen \
             +zrangebylex +hset +del +incr +zadd +zrem +watch +unwatch +multi +exec"
        );
        assert_eq!(username("team-a"), "asya-ns-team-a");
    }

    #[test]
    fn no_command_that_reaches_beyond_the_namespace_or_stalls_the_server() {
        // Commands whose reach ACL key patterns do not limit (listing or wiping every key,
        // server state, other users) or that run code (a script that never ends stalls Redis).
        let dangerous = [
            "keys",
            "scan",
            "flushall",
            "flushdb",
            "config",
            "acl",
            "debug",
            "module",
            "shutdown",
            "migrate",
            "eval",
            "evalsha",
            "eval_ro",
            "evalsha_ro",
            "fcall",
            "fcall_ro",
            "function",
            "script",
            "client",
            "monitor",
            "sync",
            "psync",
            "replicaof",
            "slaveof",
            "save",
            "bgsave",
            "bgrewriteaof",
            "swapdb",
            "move",
            "select",
            "randomkey",
            "dbsize",
            "info",
            "publish",
            "subscribe",
            "psubscribe",
            "failover",
            "cluster",
            "restore",
            "dump",
            "object",
            "sort",
            "wait",
            "blpop",
        ];
        for c in COMMANDS {
            assert!(!dangerous.contains(&c), "{c}");
            assert_eq!(
                c,
                c.to_lowercase(),
                "ACL command names are matched as written"
            );
        }
        let r = rules("team-a").unwrap();
        assert!(r.iter().all(|a| !a.starts_with("+@")), "no category: {r:?}");
        assert!(r.iter().all(|a| !a.contains('|')), "no subcommand: {r:?}");
        // -@all comes before the commands, so it cannot undo them.
        let all = r.iter().position(|a| a == "-@all").unwrap();
        assert!(r.iter().skip(all + 1).all(|a| a.starts_with('+')));
    }

    #[test]
    fn a_namespace_that_is_not_a_dns_label_cannot_widen_its_pattern() {
        for ns in [
            "", "*", "team*", "a?", "a[b]", "Team", "a/b", "a\\b", "-a", "a.",
        ] {
            let e = rules(ns).unwrap_err();
            assert_eq!(e, AclError::Namespace(ns.to_string()));
            assert!(e.to_string().contains("DNS label"), "{e}");
        }
        // The pattern ends at the `/`: `team/*` does not reach `team-b/...`.
        assert_eq!(key_pattern("team"), "~team/*");
    }

    #[test]
    fn setuser_resets_then_grants_and_never_shows_the_password() {
        let args = setuser_args("ns1", "s3cret pw").unwrap();
        assert_eq!(
            &args[..4],
            &["asya-ns-ns1", "reset", "on", ">s3cret pw"].map(String::from)
        );
        assert_eq!(&args[4..], &rules("ns1").unwrap()[..]);
        let shown = Redacted(&args).to_string();
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.starts_with("asya-ns-ns1 reset on <password> resetkeys ~ns1/*"));
        assert_eq!(
            setuser_args("ns1", ""),
            Err(AclError::EmptyPassword("ns1".into()))
        );
        assert!(setuser_args("n*", "pw").is_err());
    }
}
