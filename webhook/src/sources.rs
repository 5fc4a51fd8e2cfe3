//! Who may open a connection to the admission port (`--allowed-source-cidrs`): the API
//! server's addresses. Anyone else who reaches the port could post AdmissionReviews with any
//! `userInfo` and read the answers — a SubjectAccessReview oracle for forged identities, and
//! load on the webhook's caches — so their connections are closed before the TLS handshake
//! and counted (`asya_webhook_connections_refused_total`). The chart's NetworkPolicy is the
//! first line (docs/DESIGN.md §9); this one holds with a CNI that ignores NetworkPolicies.

use std::net::IpAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use ipnet::IpNet;
use prometheus_client::metrics::counter::Counter;

/// A source that is not an address or a CIDR.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "--allowed-source-cidrs: {0:?} is not an address or a CIDR (e.g. 10.0.0.5/32, 10.0.0.0/24, fd00::/64)"
)]
pub struct BadSource(pub String);

/// Parses `10.0.0.0/24`, `fd00::/64` or a bare address (a host: /32 or /128).
pub fn parse_source(s: &str) -> Result<IpNet, BadSource> {
    let s = s.trim();
    IpNet::from_str(s)
        .or_else(|_| IpAddr::from_str(s).map(IpNet::from))
        .map(|n| n.trunc())
        .map_err(|_| BadSource(s.to_string()))
}

/// The peers allowed to connect; empty allows any (the flag unset).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allowlist {
    nets: Vec<IpNet>,
}

impl Allowlist {
    /// Every entry of every flag value (each may be a comma-separated list); empty entries
    /// are skipped, so `--allowed-source-cidrs=` allows any.
    pub fn parse<S: AsRef<str>>(values: &[S]) -> Result<Self, BadSource> {
        let mut nets = Vec::new();
        for v in values {
            for part in v.as_ref().split(',').filter(|p| !p.trim().is_empty()) {
                nets.push(parse_source(part)?);
            }
        }
        Ok(Self { nets })
    }

    pub fn any(&self) -> bool {
        self.nets.is_empty()
    }

    /// Whether `peer` may connect. An IPv4 peer seen on a dual-stack socket
    /// (`::ffff:10.0.0.5`) is matched as the IPv4 address it is.
    pub fn allows(&self, peer: IpAddr) -> bool {
        let peer = peer.to_canonical();
        self.any() || self.nets.iter().any(|n| n.contains(&peer))
    }

    pub fn nets(&self) -> &[IpNet] {
        &self.nets
    }
}

/// The allowlist as the server applies it: refusals counted, and logged at most once a
/// minute (a peer that keeps trying must not flood the log).
pub struct SourceGate {
    pub allow: Allowlist,
    pub refused: Counter,
    last_log: AtomicU64,
}

/// How often a refusal is logged at most, in seconds.
const LOG_EVERY: u64 = 60;

impl SourceGate {
    pub fn new(allow: Allowlist, refused: Counter) -> Self {
        Self {
            allow,
            refused,
            last_log: AtomicU64::new(0),
        }
    }

    /// Lets everyone in (tests, the benchmark).
    pub fn open() -> Self {
        Self::new(Allowlist::default(), Counter::default())
    }

    /// Whether the connection from `peer` is served; a refusal is counted (and sometimes
    /// logged, naming the peer and the flag, so a wrong list is found from the logs).
    pub fn admit(&self, peer: IpAddr) -> bool {
        if self.allow.allows(peer) {
            return true;
        }
        let total = self.refused.inc() + 1;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let last = self.last_log.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= LOG_EVERY
            && self
                .last_log
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                %peer,
                refused_so_far = total,
                allowed = ?self.allow.nets().iter().map(ToString::to_string).collect::<Vec<_>>(),
                "connection to the admission port refused: the peer is not in --allowed-source-cidrs \
                 (if it is the API server, add its source address; logged at most once a minute)"
            );
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn cidrs_and_hosts_match_their_addresses_only() {
        let a =
            Allowlist::parse(&["10.0.0.5/32,10.1.0.0/16", "fd00::/64", " 192.168.1.1 "]).unwrap();
        for (peer, allowed) in [
            ("10.0.0.5", true),
            ("10.0.0.6", false),
            ("10.1.255.3", true),
            ("10.2.0.1", false),
            ("fd00::1", true),
            ("fd01::1", false),
            ("192.168.1.1", true),
            ("192.168.1.2", false),
            // An IPv4 peer on a dual-stack socket.
            ("::ffff:10.0.0.5", true),
            ("::ffff:10.0.0.6", false),
            ("127.0.0.1", false),
        ] {
            assert_eq!(a.allows(ip(peer)), allowed, "{peer}");
        }
        // A CIDR with host bits set means its network, as the NetworkPolicy reads it.
        assert!(
            Allowlist::parse(&["10.0.0.7/24"])
                .unwrap()
                .allows(ip("10.0.0.200"))
        );
    }

    #[test]
    fn empty_allows_any_and_bad_entries_are_refused_by_name() {
        for empty in [vec![], vec![""], vec!["", " , "]] {
            let a = Allowlist::parse(&empty).unwrap();
            assert!(a.any() && a.allows(ip("203.0.113.9")), "{empty:?}");
        }
        assert_eq!(
            Allowlist::parse(&["10.0.0.0/24,10.0.0.300"]),
            Err(BadSource("10.0.0.300".into()))
        );
        assert!(Allowlist::parse(&["10.0.0.0/33"]).is_err());
        assert!(
            BadSource("x".into())
                .to_string()
                .starts_with("--allowed-source-cidrs: \"x\" is not an address or a CIDR")
        );
    }

    #[test]
    fn refusals_are_counted() {
        let gate = SourceGate::new(
            Allowlist::parse(&["10.0.0.0/8"]).unwrap(),
            Counter::default(),
        );
        assert!(gate.admit(ip("10.9.9.9")));
        assert!(!gate.admit(ip("192.0.2.1")));
        assert!(!gate.admit(ip("192.0.2.2")));
        assert_eq!(gate.refused.get(), 2);
    }
}
