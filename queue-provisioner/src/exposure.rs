//! Platform credentials that tenants could read, until they are rotated (docs/DESIGN.md §9,
//! upgrading). Before per-namespace broker identities, the platform's broker password was
//! copied into every actor namespace; after the upgrade the copies go, but whoever read one
//! can still use the password until the platform team changes it. The provisioner records
//! the fingerprint of each platform password it finds copied (a labelled copy in an actor
//! namespace), in the ConfigMap [`LEDGER_CONFIGMAP`] of its own namespace so that a restart
//! keeps it, and warns on every actor of the transport while the configured password still
//! has a recorded fingerprint. The decisions are pure; [`Ledger`] reads and writes the record.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams};
use ring::digest;
use tokio::sync::Mutex;

/// The record, in the provisioner's namespace: key = transport, value = fingerprints, one per
/// line.
pub const LEDGER_CONFIGMAP: &str = "asya-exposed-credentials";
/// Domain separation: the fingerprint is of nothing else, and it is not a bare SHA-256 of the
/// password (which a table of common passwords would reverse at a glance).
const LABEL: &[u8] = b"asya-exposed-credential/v1\0";

/// The fingerprint of a password: hex SHA-256 under [`LABEL`]. Never the password itself.
pub fn fingerprint(password: &str) -> String {
    let d = digest::digest(&digest::SHA256, &[LABEL, password.as_bytes()].concat());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Fingerprints by transport, as the ConfigMap's data holds them.
pub type Record = BTreeMap<String, BTreeSet<String>>;

pub fn parse(data: Option<&BTreeMap<String, String>>) -> Record {
    data.into_iter()
        .flatten()
        .map(|(t, v)| {
            let set = v
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect();
            (t.clone(), set)
        })
        .collect()
}

pub fn render(record: &Record) -> BTreeMap<String, String> {
    record
        .iter()
        .map(|(t, set)| {
            let lines: Vec<&str> = set.iter().map(String::as_str).collect();
            (t.clone(), lines.join("\n"))
        })
        .collect()
}

/// Whether `password`, the transport's password now, is one that was exposed.
pub fn unrotated(record: &Record, transport: &str, password: &str) -> bool {
    record
        .get(transport)
        .is_some_and(|set| set.contains(&fingerprint(password)))
}

/// What the actor is told while the password is unrotated.
pub fn warning(transport: &str, secret: &str) -> String {
    format!(
        "the platform's broker password of transport {transport} (Secret {secret} in the \
         provisioner's namespace) was copied into actor namespaces before each namespace had its \
         own broker identity, and has not been changed since: whoever read a copy can still use \
         it. Change it on the broker and in that Secret (README, Upgrading)"
    )
}

/// The record in the API server, read once and kept; written when a fingerprint is new.
pub struct Ledger {
    api: Api<ConfigMap>,
    record: Mutex<Option<Record>>,
}

impl Ledger {
    pub fn new(api: Api<ConfigMap>) -> Self {
        Ledger {
            api,
            record: Mutex::new(None),
        }
    }

    async fn loaded<'a>(
        &self,
        slot: &'a mut Option<Record>,
    ) -> Result<&'a mut Record, kube::Error> {
        if slot.is_none() {
            let cm = self.api.get_opt(LEDGER_CONFIGMAP).await?;
            *slot = Some(parse(cm.as_ref().and_then(|c| c.data.as_ref())));
        }
        Ok(slot.get_or_insert_with(Record::new))
    }

    /// Records that `password` of `transport` was exposed (a no-op when already recorded).
    pub async fn record(&self, transport: &str, password: &str) -> Result<(), kube::Error> {
        let mut slot = self.record.lock().await;
        let record = self.loaded(&mut slot).await?;
        if !record
            .entry(transport.to_string())
            .or_default()
            .insert(fingerprint(password))
        {
            return Ok(());
        }
        let body = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": LEDGER_CONFIGMAP,
                         "labels": {crate::render::workload::MANAGED_BY.0: crate::render::workload::MANAGED_BY.1}},
            "data": render(record),
        });
        let pp = PatchParams::apply(crate::reconcile::MANAGER).force();
        self.api
            .patch(LEDGER_CONFIGMAP, &pp, &Patch::Apply(body))
            .await?;
        Ok(())
    }

    /// Whether the transport's current password is one recorded as exposed.
    pub async fn unrotated(&self, transport: &str, password: &str) -> Result<bool, kube::Error> {
        let mut slot = self.record.lock().await;
        let record = self.loaded(&mut slot).await?;
        Ok(unrotated(record, transport, password))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_password_is_unrotated_until_it_changes() {
        let mut r = Record::new();
        r.entry("rabbitmq".into())
            .or_default()
            .insert(fingerprint("guest"));
        assert!(unrotated(&r, "rabbitmq", "guest"));
        assert!(!unrotated(&r, "rabbitmq", "a-new-password"));
        assert!(!unrotated(&r, "other", "guest"));
    }

    #[test]
    fn the_record_round_trips_and_never_holds_the_password() {
        let mut r = Record::new();
        r.entry("rabbitmq".into())
            .or_default()
            .extend([fingerprint("a"), fingerprint("b")]);
        let data = render(&r);
        assert_eq!(parse(Some(&data)), r);
        let text = format!("{data:?}");
        assert!(!text.contains("\"a\"") && text.len() > 128, "{text}");
        assert_eq!(fingerprint("a").len(), 64);
        assert_ne!(fingerprint("a"), fingerprint("b"));
    }
}
