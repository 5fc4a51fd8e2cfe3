//! Leader election with a coordination.k8s.io Lease, so two replicas never reconcile at once.
//! Optimistic concurrency (resourceVersion on replace) decides races between candidates.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use tracing::{info, warn};

pub const LEASE_NAME: &str = "asya-queue-provisioner";
pub const LEASE_SECONDS: i32 = 15;
const RETRY: Duration = Duration::from_secs(2);
const RENEW: Duration = Duration::from_secs(5);

/// Whether a lease held by someone else has expired (pure).
pub fn expired(spec: &LeaseSpec, now: Timestamp) -> bool {
    let Some(renew) = spec.renew_time.as_ref() else {
        return true;
    };
    let secs = spec.lease_duration_seconds.unwrap_or(LEASE_SECONDS);
    renew.0 + SignedDuration::from_secs(i64::from(secs)) < now
}

fn spec_for(identity: &str, prev: Option<&LeaseSpec>, now: Timestamp) -> LeaseSpec {
    let same = prev.and_then(|p| p.holder_identity.as_deref()) == Some(identity);
    let transitions = prev.and_then(|p| p.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(identity.to_string()),
        lease_duration_seconds: Some(LEASE_SECONDS),
        acquire_time: if same {
            prev.and_then(|p| p.acquire_time.clone())
        } else {
            Some(MicroTime(now))
        },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(if same || prev.is_none() {
            transitions
        } else {
            transitions + 1
        }),
        ..Default::default()
    }
}

/// One attempt to take or renew the lease. Ok(true) when we hold it.
async fn try_acquire(api: &Api<Lease>, identity: &str) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    match api.get_opt(LEASE_NAME).await? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(LEASE_NAME.into()),
                    ..Default::default()
                },
                spec: Some(spec_for(identity, None, now)),
            };
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
        Some(mut lease) => {
            let spec = lease.spec.clone().unwrap_or_default();
            let ours = spec.holder_identity.as_deref() == Some(identity);
            if !ours && !expired(&spec, now) {
                return Ok(false);
            }
            lease.spec = Some(spec_for(identity, Some(&spec), now));
            // resourceVersion stays set: a concurrent winner makes this a 409.
            match api
                .replace(LEASE_NAME, &PostParams::default(), &lease)
                .await
            {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
    }
}

/// How long a leader keeps leading without a successful renewal. Less than the lease
/// (LEASE_SECONDS, measured from the renewal it wrote), so it has stood down before another
/// replica can take the lease: client-go's renewDeadline (10 s of a 15 s lease).
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);

/// What one attempt to take or renew the lease found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// This replica holds it (taken or renewed).
    Held,
    /// Another replica holds it, unexpired, or won the race for it.
    HeldByOther,
    /// No answer (the API server is away), or one within no time left.
    Unreachable,
}

/// This replica's role in the election. A leader remembers when it last renewed: when the
/// attempt that renewed was sent, since that is the time the lease records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role<T> {
    Candidate,
    Leader { renewed_at: T },
}

/// Why a leader stood down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StandDown {
    /// Another replica holds the lease.
    Taken,
    /// No renewal for [`RENEW_DEADLINE`].
    Unrenewed,
}

/// The role after `attempt` (sent at `sent`, answered by `now`), the change to announce if
/// any, and how long until the next attempt. Pure: the whole election's decisions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step<T> {
    pub role: Role<T>,
    /// `Some(None)`: elected; `Some(Some(why))`: stood down.
    pub change: Option<Option<StandDown>>,
    pub next_in: Duration,
}

pub fn step<T>(role: Role<T>, attempt: Attempt, sent: T, now: T) -> Step<T>
where
    T: Copy + std::ops::Sub<T, Output = Duration>,
{
    let leading = |renewed_at| Role::Leader { renewed_at };
    match (role, attempt) {
        (Role::Candidate, Attempt::Held) => Step {
            role: leading(sent),
            change: Some(None),
            next_in: RENEW,
        },
        (Role::Candidate, _) => Step {
            role,
            change: None,
            next_in: RETRY,
        },
        (Role::Leader { .. }, Attempt::Held) => Step {
            role: leading(sent),
            change: None,
            next_in: RENEW,
        },
        (Role::Leader { .. }, Attempt::HeldByOther) => Step {
            role: Role::Candidate,
            change: Some(Some(StandDown::Taken)),
            next_in: RETRY,
        },
        (Role::Leader { renewed_at }, Attempt::Unreachable) => {
            if now - renewed_at >= RENEW_DEADLINE {
                Step {
                    role: Role::Candidate,
                    change: Some(Some(StandDown::Unrenewed)),
                    next_in: RETRY,
                }
            } else {
                Step {
                    role,
                    change: None,
                    next_in: RETRY,
                }
            }
        }
    }
}

/// How long an attempt may take: a leader's, no later than its deadline (so a request that
/// hangs cannot keep it leading past it); a candidate's, a renewal period.
pub fn attempt_budget<T>(role: Role<T>, now: T) -> Duration
where
    T: Copy + std::ops::Sub<T, Output = Duration>,
{
    match role {
        Role::Candidate => RENEW,
        Role::Leader { renewed_at } => RENEW_DEADLINE.saturating_sub(now - renewed_at),
    }
}

/// Campaigns for the lease and keeps renewing it, for as long as the returned task runs
/// (abort it to stop, then [`release`]). `term` says at every moment whether this replica
/// leads: `Some(n)` during its n-th term (numbered so that a stand-down followed at once by
/// a new election cannot go unseen), `None` as soon as the lease is lost (taken, or not
/// renewed within [`RENEW_DEADLINE`]); the replica then campaigns again, it never exits.
pub fn campaign(
    api: Api<Lease>,
    identity: String,
    term: tokio::sync::watch::Sender<Option<u64>>,
) -> tokio::task::JoinHandle<()> {
    use tokio::time::{Instant, sleep, timeout};
    tokio::spawn(async move {
        let mut role = Role::Candidate;
        let mut terms = 0;
        loop {
            let sent = Instant::now();
            let attempt =
                match timeout(attempt_budget(role, sent), try_acquire(&api, &identity)).await {
                    Ok(Ok(true)) => Attempt::Held,
                    Ok(Ok(false)) => Attempt::HeldByOther,
                    Ok(Err(e)) => {
                        warn!(error = %e, "leader election: lease not reachable");
                        Attempt::Unreachable
                    }
                    Err(_) => {
                        warn!("leader election: no answer in time");
                        Attempt::Unreachable
                    }
                };
            let next = step(role, attempt, sent, Instant::now());
            match next.change {
                Some(None) => {
                    info!(identity = %identity, "leader election: acquired lease {LEASE_NAME}")
                }
                Some(Some(StandDown::Taken)) => {
                    warn!("leader election: lease taken by another replica; standing down")
                }
                Some(Some(StandDown::Unrenewed)) => warn!(
                    "leader election: lease not renewed within {RENEW_DEADLINE:?}; standing down"
                ),
                None => {}
            }
            role = next.role;
            if next.change == Some(None) {
                terms += 1;
            }
            term.send_replace(matches!(role, Role::Leader { .. }).then_some(terms));
            sleep(next.next_in).await;
        }
    })
}

/// Gives the lease up on a clean shutdown, so a restarted or standby replica takes over at
/// once instead of waiting for it to expire.
pub async fn release(api: &Api<Lease>, identity: &str) {
    let Ok(Some(mut lease)) = api.get_opt(LEASE_NAME).await else {
        return;
    };
    let Some(spec) = lease.spec.as_mut() else {
        return;
    };
    if spec.holder_identity.as_deref() != Some(identity) {
        return;
    }
    spec.holder_identity = None;
    spec.renew_time = None;
    match api
        .replace(LEASE_NAME, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => info!("leader election: lease released"),
        Err(e) => warn!(error = %e, "leader election: releasing the lease failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seconds since an origin stand for instants.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct At(u64);
    impl std::ops::Sub for At {
        type Output = Duration;
        fn sub(self, o: At) -> Duration {
            Duration::from_secs(self.0.saturating_sub(o.0))
        }
    }

    /// Runs attempts (result, sent at, answered at) from `role`; the roles and changes seen.
    fn run(
        mut role: Role<At>,
        attempts: &[(Attempt, u64, u64)],
    ) -> Vec<(Role<At>, Option<Option<StandDown>>)> {
        attempts
            .iter()
            .map(|&(a, sent, now)| {
                let s = step(role, a, At(sent), At(now));
                role = s.role;
                (s.role, s.change)
            })
            .collect()
    }

    #[test]
    fn a_candidate_is_elected_only_when_it_holds_the_lease() {
        use Attempt::*;
        let seen = run(
            Role::Candidate,
            &[(Unreachable, 0, 1), (HeldByOther, 2, 2), (Held, 4, 5)],
        );
        assert_eq!(
            seen,
            [
                (Role::Candidate, None),
                (Role::Candidate, None),
                (Role::Leader { renewed_at: At(4) }, Some(None)),
            ],
            "renewed_at is when the winning attempt was sent: what the lease records"
        );
        assert_eq!(step(Role::Candidate, Held, At(0), At(0)).next_in, RENEW);
        assert_eq!(
            step(Role::Candidate, Unreachable, At(0), At(0)).next_in,
            RETRY
        );
    }

    #[test]
    fn a_leader_stands_down_when_taken_or_unrenewed_before_the_lease_runs_out() {
        use Attempt::*;
        let leader = Role::Leader { renewed_at: At(0) };
        // Taken: at once.
        assert_eq!(
            run(leader, &[(HeldByOther, 5, 5)]),
            [(Role::Candidate, Some(Some(StandDown::Taken)))]
        );
        // The API server away: it keeps leading until RENEW_DEADLINE after its last renewal,
        // then stands down, campaigns, and leads again once it holds the lease.
        let seen = run(
            leader,
            &[
                (Unreachable, 5, 7),
                (Unreachable, 9, 9),
                (Unreachable, 9, 10),
                (Unreachable, 12, 12),
                (Held, 25, 25),
            ],
        );
        assert_eq!(
            seen,
            [
                (leader, None),
                (leader, None),
                (Role::Candidate, Some(Some(StandDown::Unrenewed))),
                (Role::Candidate, None),
                (Role::Leader { renewed_at: At(25) }, Some(None)),
            ]
        );
        assert!(RENEW_DEADLINE < Duration::from_secs(LEASE_SECONDS as u64));
        // A renewal moves the deadline.
        let renewed = run(leader, &[(Held, 8, 9), (Unreachable, 13, 17)]);
        assert_eq!(renewed[1], (Role::Leader { renewed_at: At(8) }, None));
    }

    #[test]
    fn a_leaders_attempt_may_not_outlast_its_deadline() {
        let leader = Role::Leader { renewed_at: At(0) };
        assert_eq!(attempt_budget(leader, At(7)), Duration::from_secs(3));
        assert_eq!(attempt_budget(leader, At(12)), Duration::ZERO);
        assert_eq!(attempt_budget(Role::<At>::Candidate, At(12)), RENEW);
    }

    #[test]
    fn expiry_and_transitions() {
        let t0 = Timestamp::from_second(1_800_000_000).unwrap();
        let s = spec_for("a", None, t0);
        assert!(!expired(&s, t0 + SignedDuration::from_secs(10)));
        assert!(expired(&s, t0 + SignedDuration::from_secs(16)));
        assert!(
            expired(&LeaseSpec::default(), t0),
            "a lease never renewed is free"
        );
        let renewed = spec_for("a", Some(&s), t0 + SignedDuration::from_secs(5));
        assert_eq!(renewed.lease_transitions, Some(0));
        assert_eq!(renewed.acquire_time, s.acquire_time);
        let taken = spec_for("b", Some(&s), t0 + SignedDuration::from_secs(20));
        assert_eq!(taken.lease_transitions, Some(1));
        assert_eq!(taken.holder_identity.as_deref(), Some("b"));
    }
}
