//! Self-managed mode: the webhook keeps its own CA and serving certificate in a Secret,
//! publishes the CA as `caBundle` of its webhook configurations, and rotates before expiry.
//!
//! The decisions ("rotate now?", "which caBundle?", "which entries need patching?") are pure
//! functions of the stored state and the clock; the Kubernetes I/O sits behind
//! [`CertBackend`] so the whole cycle is testable without a cluster.

use std::time::{Duration, SystemTime};

use crate::CertError;
use crate::generate::{PemPair, ServingSpec, cert_info, generate_ca, issue_serving, signed_by};

/// What is kept in the Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCerts {
    pub ca: PemPair,
    pub serving: Option<PemPair>,
    /// The CA this one replaced, still trusted (in `caBundle`) until it expires, so servers
    /// that still present a certificate from it keep working during a CA rotation.
    pub previous_ca_pem: Option<String>,
}

/// Lifetimes and renewal margins.
#[derive(Debug, Clone)]
pub struct ManagedConfig {
    pub spec: ServingSpec,
    pub ca_common_name: String,
    pub ca_validity: Duration,
    pub serving_validity: Duration,
    /// Renew the serving certificate when less than this remains.
    pub serving_renew_before: Duration,
    /// Renew the CA when less than this remains (must exceed `serving_validity` so no
    /// serving certificate outlives its CA).
    pub ca_renew_before: Duration,
}

const DAY: Duration = Duration::from_secs(86_400);

impl ManagedConfig {
    pub fn new(spec: ServingSpec) -> Self {
        Self {
            spec,
            ca_common_name: "asya-webhook-ca".into(),
            ca_validity: 3650 * DAY,
            serving_validity: 365 * DAY,
            serving_renew_before: 30 * DAY,
            ca_renew_before: 400 * DAY,
        }
    }
}

/// What to do with the stored certificates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    Reuse,
    NewServing(String),
    NewCa(String),
}

fn remaining(not_after: SystemTime, now: SystemTime) -> Duration {
    not_after.duration_since(now).unwrap_or(Duration::ZERO)
}

/// Decide whether the stored certificates can be used as they are at `now`.
pub fn plan(now: SystemTime, stored: Option<&StoredCerts>, cfg: &ManagedConfig) -> Plan {
    let Some(stored) = stored else {
        return Plan::NewCa("no certificates stored yet".into());
    };
    let ca = match cert_info(&stored.ca.cert_pem) {
        Ok(i) => i,
        Err(e) => return Plan::NewCa(format!("stored CA unreadable: {e}")),
    };
    if rcgen::KeyPair::from_pem(&stored.ca.key_pem).is_err() {
        return Plan::NewCa("stored CA key unreadable".into());
    }
    if remaining(ca.not_after, now) < cfg.ca_renew_before {
        return Plan::NewCa(format!(
            "CA expires in {} days (renewal margin {} days)",
            remaining(ca.not_after, now).as_secs() / 86_400,
            cfg.ca_renew_before.as_secs() / 86_400
        ));
    }
    let Some(serving) = &stored.serving else {
        return Plan::NewServing("no serving certificate stored".into());
    };
    let info = match cert_info(&serving.cert_pem) {
        Ok(i) => i,
        Err(e) => return Plan::NewServing(format!("stored serving certificate unreadable: {e}")),
    };
    if !signed_by(&serving.cert_pem, &stored.ca.cert_pem) {
        return Plan::NewServing("serving certificate not signed by the stored CA".into());
    }
    if !info.covers(&cfg.spec) {
        return Plan::NewServing(format!(
            "serving certificate names {:?} {:?} do not cover {:?} {:?}",
            info.dns, info.ips, cfg.spec.dns, cfg.spec.ips
        ));
    }
    if remaining(info.not_after, now) < cfg.serving_renew_before {
        return Plan::NewServing(format!(
            "serving certificate expires in {} days",
            remaining(info.not_after, now).as_secs() / 86_400
        ));
    }
    Plan::Reuse
}

/// Carry out `plan`, producing the new stored state (generation only, no I/O).
pub fn apply(
    plan: &Plan,
    stored: Option<&StoredCerts>,
    cfg: &ManagedConfig,
    now: SystemTime,
) -> Result<StoredCerts, CertError> {
    match plan {
        Plan::Reuse => stored
            .cloned()
            .ok_or_else(|| CertError::Parse("nothing stored to reuse".into())),
        Plan::NewServing(_) => {
            let mut s = stored
                .cloned()
                .ok_or_else(|| CertError::Parse("no CA to sign with".into()))?;
            s.serving = Some(issue_serving(&s.ca, &cfg.spec, now, cfg.serving_validity)?);
            Ok(s)
        }
        Plan::NewCa(_) => {
            let ca = generate_ca(&cfg.ca_common_name, now, cfg.ca_validity)?;
            let serving = issue_serving(&ca, &cfg.spec, now, cfg.serving_validity)?;
            // Keep the old CA trusted only if it is still valid and readable.
            let previous_ca_pem = stored
                .and_then(|s| cert_info(&s.ca.cert_pem).ok().map(|i| (s, i)))
                .filter(|(_, i)| i.not_after > now)
                .map(|(s, _)| s.ca.cert_pem.clone());
            Ok(StoredCerts {
                ca,
                serving: Some(serving),
                previous_ca_pem,
            })
        }
    }
}

/// The `caBundle` to publish: the current CA, plus the previous one while it is still valid.
pub fn ca_bundle(stored: &StoredCerts, now: SystemTime) -> String {
    let mut out = stored.ca.cert_pem.trim_end().to_string();
    out.push('\n');
    if let Some(prev) = &stored.previous_ca_pem
        && cert_info(prev).map(|i| i.not_after > now).unwrap_or(false)
        && prev.trim_end() != stored.ca.cert_pem.trim_end()
    {
        out.push_str(prev.trim_end());
        out.push('\n');
    }
    out
}

/// Which kind of webhook configuration an entry belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WebhookKind {
    Mutating,
    Validating,
}

/// One `webhooks[i]` entry of a webhook configuration, with the `caBundle` it has now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookEntry {
    pub kind: WebhookKind,
    pub config: String,
    pub index: usize,
    pub webhook: String,
    pub ca_bundle: Option<Vec<u8>>,
}

/// The entries whose `caBundle` differs from `desired`.
pub fn entries_to_patch<'a>(entries: &'a [WebhookEntry], desired: &[u8]) -> Vec<&'a WebhookEntry> {
    entries
        .iter()
        .filter(|e| e.ca_bundle.as_deref() != Some(desired))
        .collect()
}

/// Storage and publication of the certificates (a Secret and the webhook configurations).
#[allow(async_fn_in_trait)]
pub trait CertBackend {
    async fn load(&self) -> Result<Option<StoredCerts>, CertError>;
    /// Create or update. `CertError::Conflict` when another writer got there first.
    async fn store(&self, certs: &StoredCerts) -> Result<(), CertError>;
    async fn webhook_entries(&self) -> Result<Vec<WebhookEntry>, CertError>;
    async fn patch_ca_bundle(&self, entry: &WebhookEntry, bundle: &[u8]) -> Result<(), CertError>;
}

/// Outcome of one management cycle.
#[derive(Debug, Clone)]
pub struct Ensured {
    pub certs: StoredCerts,
    pub plan: Plan,
    pub patched: usize,
}

/// One cycle: load, decide, rotate if needed, store, publish `caBundle`. Retries a lost race
/// with another replica by re-reading what it stored.
pub async fn ensure<B: CertBackend>(
    backend: &B,
    cfg: &ManagedConfig,
    now: SystemTime,
) -> Result<Ensured, CertError> {
    let mut attempt = 0;
    let (certs, decided) = loop {
        attempt += 1;
        let stored = backend.load().await?;
        let p = plan(now, stored.as_ref(), cfg);
        if p == Plan::Reuse {
            break (
                stored.ok_or_else(|| CertError::Parse("reuse without certificates".into()))?,
                p,
            );
        }
        tracing::info!(reason = ?p, "rotating webhook certificates");
        let next = apply(&p, stored.as_ref(), cfg, now)?;
        match backend.store(&next).await {
            Ok(()) => break (next, p),
            Err(CertError::Conflict(msg)) if attempt < 3 => {
                tracing::info!(%msg, "certificate Secret changed underneath; re-reading");
                continue;
            }
            Err(e) => return Err(e),
        }
    };
    let bundle = ca_bundle(&certs, now);
    let entries = backend.webhook_entries().await?;
    let targets = entries_to_patch(&entries, bundle.as_bytes());
    for e in &targets {
        backend.patch_ca_bundle(e, bundle.as_bytes()).await?;
    }
    Ok(Ensured {
        certs,
        plan: decided,
        patched: targets.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn cfg() -> ManagedConfig {
        ManagedConfig::new(ServingSpec::new(["asya-webhook.asya.svc".to_string()], []))
    }

    #[test]
    fn nothing_stored_makes_a_ca() {
        assert!(matches!(
            plan(SystemTime::now(), None, &cfg()),
            Plan::NewCa(_)
        ));
    }

    #[test]
    fn fresh_certs_are_reused_then_serving_renewed_then_ca() {
        let c = cfg();
        let t0 = SystemTime::now();
        let s = apply(&Plan::NewCa("x".into()), None, &c, t0).unwrap();
        assert_eq!(plan(t0, Some(&s), &c), Plan::Reuse);
        // 340 days in: 25 days of the serving cert remain (< 30) → new serving cert, same CA.
        let t1 = t0 + 340 * DAY;
        let p1 = plan(t1, Some(&s), &c);
        assert!(
            matches!(p1, Plan::NewServing(ref r) if r.contains("expires")),
            "{p1:?}"
        );
        let s1 = apply(&p1, Some(&s), &c, t1).unwrap();
        assert_eq!(s1.ca, s.ca);
        assert_ne!(s1.serving, s.serving);
        assert_eq!(plan(t1, Some(&s1), &c), Plan::Reuse);
        // Near the CA's end → new CA; the old one stays in the bundle while valid.
        let t2 = t0 + 3300 * DAY;
        let p2 = plan(t2, Some(&s1), &c);
        assert!(matches!(p2, Plan::NewCa(_)), "{p2:?}");
        let s2 = apply(&p2, Some(&s1), &c, t2).unwrap();
        assert_ne!(s2.ca, s1.ca);
        assert_eq!(s2.previous_ca_pem.as_deref(), Some(s1.ca.cert_pem.as_str()));
        let bundle = ca_bundle(&s2, t2);
        assert!(bundle.contains(s2.ca.cert_pem.trim_end()));
        assert!(bundle.contains(s1.ca.cert_pem.trim_end()));
        // After the old CA expired it drops out of the bundle.
        let t3 = t0 + 3700 * DAY;
        let bundle3 = ca_bundle(&s2, t3);
        assert!(!bundle3.contains(s1.ca.cert_pem.trim_end()));
    }

    #[test]
    fn changed_names_or_foreign_signature_renew_serving() {
        let c = cfg();
        let now = SystemTime::now();
        let s = apply(&Plan::NewCa("x".into()), None, &c, now).unwrap();
        let mut c2 = c.clone();
        c2.spec.dns.push("extra.asya.svc".into());
        assert!(matches!(plan(now, Some(&s), &c2), Plan::NewServing(r) if r.contains("cover")));
        let other = apply(&Plan::NewCa("x".into()), None, &c, now).unwrap();
        let mixed = StoredCerts {
            ca: s.ca.clone(),
            serving: other.serving.clone(),
            previous_ca_pem: None,
        };
        assert!(matches!(plan(now, Some(&mixed), &c), Plan::NewServing(r) if r.contains("signed")));
        let broken = StoredCerts {
            ca: PemPair {
                cert_pem: "junk".into(),
                key_pem: "junk".into(),
            },
            serving: None,
            previous_ca_pem: None,
        };
        assert!(matches!(plan(now, Some(&broken), &c), Plan::NewCa(_)));
    }

    #[test]
    fn only_differing_entries_are_patched() {
        let e = |i: usize, b: Option<&[u8]>| WebhookEntry {
            kind: WebhookKind::Mutating,
            config: "asya".into(),
            index: i,
            webhook: format!("w{i}"),
            ca_bundle: b.map(|b| b.to_vec()),
        };
        let entries = vec![e(0, Some(b"A")), e(1, None), e(2, Some(b"B"))];
        let p: Vec<usize> = entries_to_patch(&entries, b"A")
            .iter()
            .map(|e| e.index)
            .collect();
        assert_eq!(p, vec![1, 2]);
    }

    /// An in-memory backend for the cycle's own logic (the Kubernetes backend is exercised by
    /// the end-to-end tests against a real API server).
    #[derive(Default)]
    struct MemBackend {
        secret: Mutex<Option<StoredCerts>>,
        entries: Mutex<Vec<WebhookEntry>>,
        conflicts_left: Mutex<usize>,
    }

    impl CertBackend for MemBackend {
        async fn load(&self) -> Result<Option<StoredCerts>, CertError> {
            Ok(self.secret.lock().unwrap().clone())
        }
        async fn store(&self, certs: &StoredCerts) -> Result<(), CertError> {
            let mut left = self.conflicts_left.lock().unwrap();
            if *left > 0 {
                *left -= 1;
                // Simulate another replica winning the race with its own certificates.
                let other = apply(
                    &Plan::NewCa("other".into()),
                    None,
                    &cfg(),
                    SystemTime::now(),
                )?;
                *self.secret.lock().unwrap() = Some(other);
                return Err(CertError::Conflict("resourceVersion changed".into()));
            }
            *self.secret.lock().unwrap() = Some(certs.clone());
            Ok(())
        }
        async fn webhook_entries(&self) -> Result<Vec<WebhookEntry>, CertError> {
            Ok(self.entries.lock().unwrap().clone())
        }
        async fn patch_ca_bundle(
            &self,
            entry: &WebhookEntry,
            bundle: &[u8],
        ) -> Result<(), CertError> {
            let mut es = self.entries.lock().unwrap();
            let e = es
                .iter_mut()
                .find(|e| {
                    e.kind == entry.kind && e.config == entry.config && e.index == entry.index
                })
                .unwrap();
            e.ca_bundle = Some(bundle.to_vec());
            Ok(())
        }
    }

    fn entry(kind: WebhookKind, index: usize) -> WebhookEntry {
        WebhookEntry {
            kind,
            config: "asya-webhook".into(),
            index,
            webhook: format!("w{index}.asya.sh"),
            ca_bundle: None,
        }
    }

    #[tokio::test]
    async fn ensure_creates_publishes_and_is_then_a_no_op() {
        let b = MemBackend::default();
        *b.entries.lock().unwrap() = vec![
            entry(WebhookKind::Mutating, 0),
            entry(WebhookKind::Mutating, 1),
            entry(WebhookKind::Validating, 0),
        ];
        let now = SystemTime::now();
        let r1 = ensure(&b, &cfg(), now).await.unwrap();
        assert!(matches!(r1.plan, Plan::NewCa(_)));
        assert_eq!(r1.patched, 3);
        let ca = r1.certs.ca.cert_pem.clone();
        for e in b.entries.lock().unwrap().iter() {
            assert_eq!(
                e.ca_bundle.as_deref(),
                Some(format!("{}\n", ca.trim_end()).as_bytes())
            );
        }
        let r2 = ensure(&b, &cfg(), now).await.unwrap();
        assert_eq!(r2.plan, Plan::Reuse);
        assert_eq!(r2.patched, 0);
        assert_eq!(r2.certs, r1.certs);
    }

    #[tokio::test]
    async fn ensure_adopts_the_winner_after_a_conflict() {
        let b = MemBackend::default();
        *b.conflicts_left.lock().unwrap() = 1;
        *b.entries.lock().unwrap() = vec![entry(WebhookKind::Validating, 0)];
        let r = ensure(&b, &cfg(), SystemTime::now()).await.unwrap();
        // The other replica's certificates were valid, so they are reused, not overwritten.
        assert_eq!(r.plan, Plan::Reuse);
        assert_eq!(Some(&r.certs), b.secret.lock().unwrap().as_ref());
        assert_eq!(r.patched, 1);
    }
}
