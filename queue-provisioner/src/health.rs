//! What `/readyz` and `/healthz` answer. The phase is set by `main` and the controller; the
//! answer is a pure function of it.
//!
//! Liveness stays "the process answers" (a wedged runtime cannot answer at all); its text
//! names the phase. A leader that loses its lease does not exit: it stands down (`leader`,
//! `main`) and is a standby again. Readiness says whether this replica does its job: a
//! standby campaigning for the lease is ready (otherwise a two-replica Deployment would never
//! finish a rollout), a leader is ready once its caches have listed everything, so a
//! provisioner that has just started or been elected again does not count as available
//! while it still knows no AsyncActor.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// Where the replica is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Configuration loaded; leader election not begun.
    Starting = 0,
    /// Campaigning for the leader Lease: another replica holds it, or this one lost it
    /// (stood down) and waits to take it again.
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
        Phase::Starting => (false, "starting\n"),
        Phase::Standby => (true, "ok: standby, campaigning for the leader lease\n"),
        Phase::Syncing => (false, "leader, caches not synced yet\n"),
        Phase::Running => (true, "ok\n"),
    }
}

/// `/healthz`: always "ok" (the process answers), and the phase.
pub fn liveness(phase: Phase) -> &'static str {
    match phase {
        Phase::Starting => "ok: starting\n",
        Phase::Standby => "ok: standby, campaigning for the leader lease\n",
        Phase::Syncing => "ok: leader, caches syncing\n",
        Phase::Running => "ok: leader, reconciling\n",
    }
}

/// The caches still to list their first time; the last to list moves the replica to
/// [`Phase::Running`]. Counted from the watch events rather than with
/// `Store::wait_until_ready`: that wait wakes only the last task to poll it, so a second
/// waiter (the controller waits on its own store) could take the other's wake-up.
#[derive(Clone, Debug)]
pub struct Unsynced {
    left: Arc<AtomicUsize>,
    health: Health,
}

impl Unsynced {
    pub fn new(caches: usize, health: Health) -> Self {
        Self {
            left: Arc::new(AtomicUsize::new(caches)),
            health,
        }
    }

    /// One cache has listed; call once per cache.
    pub fn listed(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            tracing::info!("caches synced");
            self.health.set(Phase::Running);
        }
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
    fn liveness_is_always_ok_and_names_the_phase() {
        for (p, says) in [
            (Phase::Starting, "starting"),
            (Phase::Standby, "standby"),
            (Phase::Syncing, "syncing"),
            (Phase::Running, "reconciling"),
        ] {
            assert!(liveness(p).starts_with("ok"), "{p:?}");
            assert!(liveness(p).contains(says), "{p:?}");
        }
    }

    #[test]
    fn running_only_when_the_last_cache_has_listed() {
        let h = Health::default();
        h.set(Phase::Syncing);
        let u = Unsynced::new(3, h.clone());
        u.listed();
        u.clone().listed();
        assert_eq!(h.phase(), Phase::Syncing);
        u.listed();
        assert_eq!(h.phase(), Phase::Running);
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
