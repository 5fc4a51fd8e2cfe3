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

/// Waits until this replica holds the lease, then keeps renewing it in the background. If
/// renewal fails for longer than the lease lasts, the process exits: another replica may
/// have taken over, and two leaders must never run.
pub async fn acquire(api: Api<Lease>, identity: String) {
    loop {
        match try_acquire(&api, &identity).await {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => warn!(error = %e, "leader election: lease not reachable"),
        }
        tokio::time::sleep(RETRY).await;
    }
    info!(identity = %identity, "leader election: acquired lease {LEASE_NAME}");
    tokio::spawn(async move {
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(RENEW).await;
            match try_acquire(&api, &identity).await {
                Ok(true) => last_ok = tokio::time::Instant::now(),
                Ok(false) => {
                    warn!("leader election: lease taken by another replica; exiting");
                    std::process::exit(1);
                }
                Err(e) => warn!(error = %e, "leader election: renew failed"),
            }
            if last_ok.elapsed() > Duration::from_secs(LEASE_SECONDS as u64) {
                warn!("leader election: could not renew within the lease duration; exiting");
                std::process::exit(1);
            }
        }
    });
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
