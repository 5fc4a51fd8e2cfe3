//! What `/readyz` and `/healthz` answer. The phase is set by `main` and the controller; the
//! answer is a pure function of it.
//!
//! Liveness stays "the process answers": a leader that cannot renew its lease exits on its
//! own (`leader`), and a wedged runtime cannot answer at all. Readiness says whether this
//! replica does its job: a standby waiting for the lease is ready (otherwise a two-replica
//! Deployment would never finish a rollout), a leader is ready once its caches have listed
//! everything, so a restarted provisioner does not count as available while it still
//! knows no AsyncActor.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

/// Where the replica is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Configuration loaded, the Kubernetes client not yet used.
    Starting = 0,
    /// Waiting for the leader Lease, which another replica holds.
    Standby = 1,
    /// Leader; the watches have not all listed yet.
    Syncing = 2,
    /// Leader with synced caches: reconciling.
    Running = 3,
}

impl Phase {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => Phase::Standby,
            2 => Phase::Syncing,
            3 => Phase::Running,
            _ => Phase::Starting,
        }
    }
}

/// The replica's phase, shared between the HTTP handlers and the tasks that move it.
#[derive(Clone, Debug)]
pub struct Health(Arc<AtomicU8>);

impl Default for Health {
    fn default() -> Self {
        Self(Arc::new(AtomicU8::new(Phase::Starting as u8)))
    }
}

impl Health {
    pub fn set(&self, phase: Phase) {
        self.0.store(phase as u8, Ordering::Release);
    }

    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.0.load(Ordering::Acquire))
    }
}

/// `/readyz`: ready or not, and the text saying why.
pub fn readiness(phase: Phase) -> (bool, &'static str) {
    match phase {
        Phase::Starting => (false, "starting: not connected to the API server yet\n"),
        Phase::Standby => (
            true,
            "ok: standby, another replica holds the leader lease\n",
        ),
        Phase::Syncing => (false, "leader, caches not synced yet\n"),
        Phase::Running => (true, "ok\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_on_standby_or_running() {
        let ready: Vec<Phase> = [
            Phase::Starting,
            Phase::Standby,
            Phase::Syncing,
            Phase::Running,
        ]
        .into_iter()
        .filter(|p| readiness(*p).0)
        .collect();
        assert_eq!(ready, [Phase::Standby, Phase::Running]);
        assert!(readiness(Phase::Syncing).1.contains("not synced"));
    }

    #[test]
    fn phase_round_trips_and_is_shared() {
        let h = Health::default();
        assert_eq!(h.phase(), Phase::Starting);
        let other = h.clone();
        for p in [
            Phase::Standby,
            Phase::Syncing,
            Phase::Running,
            Phase::Starting,
        ] {
            other.set(p);
            assert_eq!(h.phase(), p);
        }
    }
}
