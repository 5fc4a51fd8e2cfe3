//! Whether an apply is worth sending: only when what the controller would send differs from
//! what it sent last, the record is not too old, and nobody changed or deleted the object
//! since ([`decide_apply`]). The hash of what was applied rides on the object
//! ([`APPLIED_HASH`]), so a restarted controller need not apply everything again. Pure.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::watch::{hash_of, label};

/// Hash of the object we would send: equal hashes, equal requests.
pub fn desired_hash(obj: &impl Serialize) -> u64 {
    hash_of(&serde_json::to_vec(obj).unwrap_or_default())
}

/// What the controller sent last for one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    pub hash: u64,
    /// `metadata.generation` the apply answered with (objects the controller watches).
    pub generation: Option<i64>,
    pub at: Instant,
}

/// The annotation that carries [`desired_hash`] of what was applied, so a restarted
/// controller knows which objects are already as it would render them.
pub const APPLIED_HASH: &str = "asya.sh/applied-hash";

/// The live object as the controller's cache sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Live {
    /// A kind without a cache: only the record and its age decide.
    NotCached,
    Missing,
    Present {
        generation: Option<i64>,
        /// Its [`APPLIED_HASH`] annotation.
        applied: Option<u64>,
    },
}

/// The hash an [`APPLIED_HASH`] annotation carries.
pub fn applied_hash(annotations: &Option<BTreeMap<String, String>>) -> Option<u64> {
    u64::from_str_radix(label(annotations, APPLIED_HASH)?, 16).ok()
}

/// How long an apply is trusted without a cache to check it against: after this the object
/// is applied again (a no-op for the API server unless someone changed it).
pub const REASSERT: Duration = Duration::from_secs(600);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyDecision {
    Apply,
    Skip,
    /// No record (a restarted controller) but the live object carries this very hash: skip,
    /// and remember it as applied with this generation.
    Adopt {
        generation: Option<i64>,
    },
}

/// The replicas to create a KEDA-scaled workload with: its `minReplicaCount`, so an actor
/// that scales from zero starts with no pod rather than the Deployment default of one that
/// KEDA then takes away (with images to pull, and at a thousand actors a thousand pods).
/// Only for a creation: the object is absent from the cache and never applied by this
/// process (a stale cache after our own create must not reset what the HPA set since).
pub fn initial_replicas(
    scaling_enabled: bool,
    min_replicas: Option<i32>,
    live: &Live,
    applied_before: bool,
) -> Option<i32> {
    (scaling_enabled && matches!(live, Live::Missing) && !applied_before)
        .then(|| min_replicas.unwrap_or(0))
}

/// Whether to apply: never applied (and the live object does not carry the hash), something
/// else to send, the record too old, or the live object gone or changed by someone else
/// (another generation).
pub fn decide_apply(last: Option<&Applied>, hash: u64, live: Live, now: Instant) -> ApplyDecision {
    let Some(l) = last else {
        return match live {
            Live::Present {
                generation,
                applied: Some(h),
            } if h == hash => ApplyDecision::Adopt { generation },
            _ => ApplyDecision::Apply,
        };
    };
    if l.hash != hash || now.saturating_duration_since(l.at) >= REASSERT {
        return ApplyDecision::Apply;
    }
    let changed = match live {
        Live::NotCached => false,
        Live::Missing => true,
        Live::Present { generation, .. } => generation != l.generation,
    };
    if changed {
        ApplyDecision::Apply
    } else {
        ApplyDecision::Skip
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scaled_workload_is_created_at_its_minimum_and_only_created() {
        let present = Live::Present {
            generation: Some(1),
            applied: None,
        };
        assert_eq!(initial_replicas(true, None, &Live::Missing, false), Some(0));
        assert_eq!(
            initial_replicas(true, Some(2), &Live::Missing, false),
            Some(2)
        );
        // Fixed replicas are rendered anyway; an existing object keeps what the HPA set; a
        // cache behind our own create is no creation.
        assert_eq!(
            initial_replicas(false, Some(2), &Live::Missing, false),
            None
        );
        assert_eq!(initial_replicas(true, Some(0), &present, false), None);
        assert_eq!(initial_replicas(true, Some(0), &Live::Missing, true), None);
    }

    #[test]
    fn apply_only_what_changed_or_was_changed() {
        use ApplyDecision::*;
        let t0 = Instant::now();
        let rec = Applied {
            hash: 7,
            generation: Some(3),
            at: t0,
        };
        let live = |g| Live::Present {
            generation: Some(g),
            applied: Some(7),
        };
        // Nothing sent before, or something else to send.
        assert_eq!(decide_apply(None, 7, Live::NotCached, t0), Apply);
        assert_eq!(decide_apply(None, 7, Live::Missing, t0), Apply);
        assert_eq!(decide_apply(Some(&rec), 8, live(3), t0), Apply);
        // Same request, same live object: skip.
        assert_eq!(decide_apply(Some(&rec), 7, live(3), t0), Skip);
        assert_eq!(decide_apply(Some(&rec), 7, Live::NotCached, t0), Skip);
        // Someone else changed it, or deleted it.
        assert_eq!(decide_apply(Some(&rec), 7, live(4), t0), Apply);
        assert_eq!(decide_apply(Some(&rec), 7, Live::Missing, t0), Apply);
        // Re-asserted now and then even without a cache to check.
        assert_eq!(
            decide_apply(Some(&rec), 7, Live::NotCached, t0 + REASSERT),
            Apply
        );
        // A restarted controller adopts what carries its hash, applies what does not.
        assert_eq!(
            decide_apply(None, 7, live(5), t0),
            Adopt {
                generation: Some(5)
            }
        );
        assert_eq!(decide_apply(None, 8, live(5), t0), Apply);
    }

    #[test]
    fn the_applied_hash_annotation_round_trips() {
        let h = desired_hash(&serde_json::json!({"a": 1}));
        let ann = Some([(APPLIED_HASH.to_string(), format!("{h:016x}"))].into());
        assert_eq!(applied_hash(&ann), Some(h));
        assert_eq!(applied_hash(&None), None);
        let bad = Some([(APPLIED_HASH.to_string(), "zz".to_string())].into());
        assert_eq!(applied_hash(&bad), None);
    }
}
