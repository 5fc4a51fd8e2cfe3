//! The exact, anchored permission regexes of a namespace's broker user (docs/DESIGN.md §9),
//! generated from the namespace's own queue names. Never a prefix such as `^asya-N-.*`: that
//! would also match the queues of namespace `N-x` (`asya-N-x-…`).
//!
//! What the sidecar does and what each needs (RabbitMQ's access-control table):
//! - consume its queue, passive declares: read on the queue (passive declares need none);
//! - publish to `asya.N`: write on the exchange;
//! - declare a delay queue with DLX `asya.N`: configure on it, read on it, write on `asya.N`;
//! - bind a delay queue to `asya.N`: write on the queue, read on the exchange.

use std::collections::BTreeSet;

use asya_api::naming;

/// A user's configure, write and read regexes on the vhost.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Permissions {
    pub configure: String,
    pub write: String,
    pub read: String,
}

/// Matches nothing: RabbitMQ's documented "no access" regex.
pub const NOTHING: &str = "^$";

/// `^(?:a|b)$`, each alternative already a regex.
fn anchored_any(alternatives: &[String]) -> String {
    if alternatives.is_empty() {
        return NOTHING.to_string();
    }
    format!("^(?:{})$", alternatives.join("|"))
}

/// A name as a regex literal. Namespaces and actors are DNS labels (`[a-z0-9-]`), where only
/// the dot of `asya.N` and of `.delay-` is special; escaped in general all the same.
pub fn literal(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
            out.push(c);
        } else {
            out.push('\\');
            out.push(c);
        }
    }
    out
}

/// The delay queue suffix of the sidecar's naming rule: `asya-N-a.delay-1000ms`.
const DELAY: &str = r"\.delay-[0-9]+ms";

/// Which names of a namespace's actors a regex matches.
#[derive(Clone, Copy)]
enum Names {
    /// Their delay queues only.
    Delays,
    /// Their queues and their delay queues.
    QueuesAndDelays,
}

/// The queues (or delay queues) of `actors` in namespace `ns`, with the namespace's prefix
/// written once: `asya-N-(?:a|b)\.delay-[0-9]+ms`. One exact alternative per actor keeps the
/// regex small enough for RabbitMQ (a namespace of 1,000 actors listed as whole queue names,
/// twice, was about 48 KB and refused as `invalid_regexp`); its size grows with the actor
/// names' total length only.
fn actor_names(ns: &str, actors: &BTreeSet<String>, names: Names) -> Option<String> {
    if actors.is_empty() {
        return None;
    }
    let alternatives: Vec<String> = actors.iter().map(|a| literal(a)).collect();
    let suffix = match names {
        Names::Delays => DELAY.to_string(),
        Names::QueuesAndDelays => format!("(?:{DELAY})?"),
    };
    Some(format!(
        "{}(?:{}){suffix}",
        literal(&naming::actor_queue(ns, "")),
        alternatives.join("|")
    ))
}

/// The longest permission regex sent to RabbitMQ. Measured against RabbitMQ 3.x here
/// (`PUT /api/permissions` with one alternative per actor, docs/benchmarks.md § Provisioner):
/// 31,331 to 32,495 characters were the longest accepted, depending on the names; longer is
/// refused as `invalid_regexp`. About 2,800 actors of 10-character names, 500 of 63.
pub const MAX_REGEX_CHARS: usize = 30_000;

/// Refuses permissions RabbitMQ would refuse, saying why and what to do, instead of sending
/// them and reporting the broker's bare `invalid_regexp`.
pub fn check_size(ns: &str, actors: usize, p: &Permissions) -> Result<(), String> {
    let longest = [&p.configure, &p.write, &p.read]
        .iter()
        .map(|r| r.len())
        .max()
        .unwrap_or(0);
    if longest <= MAX_REGEX_CHARS {
        return Ok(());
    }
    Err(format!(
        "namespace {ns:?} has {actors} actors: its broker user's permission regex would be \
         {longest} characters, over the {MAX_REGEX_CHARS} RabbitMQ accepts (one alternative \
         per actor name); move actors to another namespace or shorten their names"
    ))
}

/// The permissions of namespace `ns`'s user, whose actors are `actors` (actor names, not
/// object names; end pseudo-actors among them are fine).
pub fn for_namespace(ns: &str, actors: &BTreeSet<String>) -> Permissions {
    let exchange = literal(&naming::tenant_exchange(ns));
    let mut with_ends = actors.clone();
    with_ends.extend([
        naming::SINK_ACTOR.to_string(),
        naming::SUMP_ACTOR.to_string(),
    ]);
    let actor_delays = actor_names(ns, actors, Names::Delays);
    let configure: Vec<String> = actor_delays.iter().cloned().collect();
    let mut write = vec![exchange.clone()];
    write.extend(actor_delays);
    let mut read = vec![exchange];
    read.extend(actor_names(ns, &with_ends, Names::QueuesAndDelays));
    Permissions {
        configure: anchored_any(&configure),
        write: anchored_any(&write),
        read: anchored_any(&read),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use regex::Regex;

    fn actors(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn m(re: &str, name: &str) -> bool {
        Regex::new(re).unwrap().is_match(name)
    }

    #[test]
    fn the_tenant_reads_its_queues_writes_its_exchange_and_configures_its_delay_queues() {
        let p = for_namespace("team", &actors(&["a", "b"]));
        assert_eq!(p.configure, r"^(?:asya-team-(?:a|b)\.delay-[0-9]+ms)$");
        assert_eq!(
            p.write,
            r"^(?:asya\.team|asya-team-(?:a|b)\.delay-[0-9]+ms)$"
        );
        for q in [
            "asya-team-a",
            "asya-team-b",
            "asya-team-x-sink",
            "asya-team-x-sump",
        ] {
            assert!(m(&p.read, q), "{q}");
            assert!(m(&p.read, &format!("{q}.delay-1000ms")), "{q}");
            assert!(!m(&p.write, q), "publishing straight into {q}");
            assert!(!m(&p.configure, q), "declaring or deleting {q}");
        }
        assert!(m(&p.configure, "asya-team-a.delay-500ms"));
        assert!(m(&p.write, "asya.team") && m(&p.read, "asya.team"));
        // Nothing of the platform's: its exchange, the default exchange, other queues.
        for other in [
            "asya",
            "amq.default",
            "",
            "asya-team-c",
            "asya.team-a",
            "asya-team-a.x",
        ] {
            assert!(!m(&p.write, other) && !m(&p.configure, other), "{other:?}");
            assert!(!m(&p.read, other), "{other:?}");
        }
    }

    #[test]
    fn team_never_matches_the_queues_of_team_a() {
        let p = for_namespace("team", &actors(&["a", "p"]));
        for q in [
            "asya-team-a-x-sink",
            "asya-team-a-x-sump",
            "asya-team-a-p",
            "asya-team-a-p.delay-1000ms",
            "asya.team-a",
        ] {
            assert!(
                !m(&p.read, q) && !m(&p.write, q) && !m(&p.configure, q),
                "{q}"
            );
        }
    }

    #[test]
    fn a_namespace_without_actors_still_reads_only_its_end_queues() {
        let p = for_namespace("n", &BTreeSet::new());
        assert_eq!(p.configure, NOTHING);
        assert_eq!(p.write, r"^(?:asya\.n)$");
        assert!(m(&p.read, "asya-n-x-sink") && !m(&p.read, "asya-n-a"));
    }

    #[test]
    fn end_actors_with_sidecars_configure_their_delay_queues_once() {
        let p = for_namespace("n", &actors(&["x-sink"]));
        assert!(m(&p.configure, "asya-n-x-sink.delay-100ms"));
        assert_eq!(
            p.read,
            r"^(?:asya\.n|asya-n-(?:x-sink|x-sump)(?:\.delay-[0-9]+ms)?)$"
        );
    }

    #[test]
    fn a_thousand_actors_fit_and_too_many_long_names_are_refused_by_size() {
        // The provisioner benchmark's namespace: 1,000 actors, the listed form of which
        // RabbitMQ refused (each queue whole, twice: about 48 KB).
        let bench: BTreeSet<String> = (0..1000).map(|i| format!("bench-actor-{i:04}")).collect();
        let p = for_namespace("asya-bench-1234", &bench);
        assert!(
            check_size("asya-bench-1234", bench.len(), &p).is_ok(),
            "{}",
            p.read.len()
        );
        assert!(m(
            &p.read,
            "asya-asya-bench-1234-bench-actor-0999.delay-5ms"
        ));
        // 600 actors of 63-character names: past what RabbitMQ compiles.
        let long: BTreeSet<String> = (0..600)
            .map(|i| format!("{i:04}-{}", "n".repeat(58)))
            .collect();
        let p = for_namespace("team", &long);
        let e = check_size("team", long.len(), &p).unwrap_err();
        assert!(
            e.contains("\"team\" has 600 actors") && e.contains("30000"),
            "{e}"
        );
    }

    proptest::proptest! {
        /// For any two distinct namespaces, one's permissions match none of the other's
        /// names: its queues, its delay queues, its exchange.
        #[test]
        fn namespaces_never_reach_each_other(
            a in "[a-z][a-z0-9-]{0,8}[a-z0-9]",
            b in "[a-z][a-z0-9-]{0,8}[a-z0-9]",
            actors_a in proptest::collection::btree_set("[a-z][a-z0-9-]{0,6}", 1..4),
            actors_b in proptest::collection::btree_set("[a-z][a-z0-9-]{0,6}", 1..4),
        ) {
            proptest::prop_assume!(a != b);
            let p = for_namespace(&a, &actors_a);
            let mut theirs = vec![naming::tenant_exchange(&b)];
            for x in actors_b.iter().map(String::as_str).chain([naming::SINK_ACTOR, naming::SUMP_ACTOR]) {
                let q = naming::actor_queue(&b, x);
                // Finding 2 (a name shared by two (namespace, actor) pairs) is refused at
                // admission; such a pair is not a permission question.
                let shared = actors_a.iter().map(String::as_str)
                    .chain([naming::SINK_ACTOR, naming::SUMP_ACTOR])
                    .any(|y| naming::actor_queue(&a, y) == q);
                if !shared {
                    theirs.push(format!("{q}.delay-1000ms"));
                    theirs.push(q);
                }
            }
            for name in theirs {
                proptest::prop_assert!(!m(&p.read, &name), "read {} {}", p.read, name);
                proptest::prop_assert!(!m(&p.write, &name), "write {} {}", p.write, name);
                proptest::prop_assert!(!m(&p.configure, &name), "configure {}", name);
            }
        }
    }
}
