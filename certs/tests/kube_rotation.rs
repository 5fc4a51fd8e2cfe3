//! Self-managed certificates against the real API server of tests/cluster: the Secret, its
//! conditional updates and the `caBundle` patches, with the clock moved forward to each
//! renewal margin (the cycle takes `now`, so no test waits for a year).
//!
//! Needs `ASYA_TEST_KUBECONFIG`: `tests/cluster/up`, then `source tests/cluster/env` (`make
//! services unit` does both). Without it the tests skip and say so; `make unit` makes them fail.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use asya_certs::generate::signed_by;
use asya_certs::kube_backend::KubeBackend;
use asya_certs::manage::ca_bundle;
use asya_certs::{ManagedConfig, Plan, ServingSpec, ensure};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

#[path = "../../tests/services/require.rs"]
mod require;

const DAY: Duration = Duration::from_secs(86_400);

async fn client() -> kube::Client {
    let path = std::env::var("ASYA_TEST_KUBECONFIG").unwrap_or_else(|_| {
        panic!(
            "ASYA_TEST_KUBECONFIG is not set: this test needs the test cluster. Run \
             tests/cluster/up, then `source tests/cluster/env` (make services unit does both)"
        )
    });
    let kubeconfig = kube::config::Kubeconfig::read_from(&path)
        .unwrap_or_else(|e| panic!("reading {path}: {e}"));
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("kubeconfig usable");
    kube::Client::try_from(config).expect("client")
}

/// Names unique to one test run, so runs and tests never share objects.
fn unique(prefix: &str) -> String {
    // The tests of this binary run at once, in one process, and this VM's clock may be
    // coarse: the counter keeps two names apart where the time alone did not.
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("clock after 1970")
        .subsec_nanos();
    format!("{prefix}-{}-{n}-{nanos}", std::process::id())
}

/// A webhook entry that matches nothing, so the configurations affect no other test.
fn webhook(name: &str) -> serde_json::Value {
    json!({
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Ignore",
        "clientConfig": {"url": "https://127.0.0.1:1/never"},
        "rules": [{"apiGroups": ["example.invalid"], "apiVersions": ["v1"],
                   "resources": ["nothings"], "operations": ["CREATE"]}],
    })
}

struct Fixture {
    client: kube::Client,
    ns: String,
    mutating: String,
    validating: String,
}

impl Fixture {
    async fn new() -> Self {
        let client = client().await;
        let ns = unique("certs-rotation");
        let (mutating, validating) = (format!("{ns}-m"), format!("{ns}-v"));
        let pp = PostParams::default();
        Api::<Namespace>::all(client.clone())
            .create(
                &pp,
                &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
            )
            .await
            .expect("namespace created");
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .create(
                &pp,
                &serde_json::from_value(json!({
                    "metadata": {"name": mutating},
                    "webhooks": [webhook("pods.rotation.asya.sh"), webhook("actors.rotation.asya.sh")],
                }))
                .unwrap(),
            )
            .await
            .expect("mutating configuration created");
        Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .create(
                &pp,
                &serde_json::from_value(json!({
                    "metadata": {"name": validating},
                    "webhooks": [webhook("validate.rotation.asya.sh")],
                }))
                .unwrap(),
            )
            .await
            .expect("validating configuration created");
        Self {
            client,
            ns,
            mutating,
            validating,
        }
    }

    fn backend(&self, secret: &str) -> KubeBackend {
        KubeBackend::new(
            self.client.clone(),
            &self.ns,
            secret,
            vec![self.mutating.clone()],
            vec![self.validating.clone()],
        )
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn secret(&self, name: &str) -> Secret {
        self.secrets().get(name).await.expect("secret exists")
    }

    /// Every `caBundle` of both configurations, decoded.
    async fn bundles(&self) -> Vec<String> {
        let m = Api::<MutatingWebhookConfiguration>::all(self.client.clone())
            .get(&self.mutating)
            .await
            .unwrap();
        let v = Api::<ValidatingWebhookConfiguration>::all(self.client.clone())
            .get(&self.validating)
            .await
            .unwrap();
        let mut out: Vec<String> = m
            .webhooks
            .unwrap_or_default()
            .into_iter()
            .map(|w| w.client_config.ca_bundle)
            .chain(
                v.webhooks
                    .unwrap_or_default()
                    .into_iter()
                    .map(|w| w.client_config.ca_bundle),
            )
            .map(|b| String::from_utf8(b.map(|b| b.0).unwrap_or_default()).unwrap())
            .collect();
        out.sort();
        out
    }

    async fn cleanup(self) {
        let dp = DeleteParams::default();
        let _ = Api::<MutatingWebhookConfiguration>::all(self.client.clone())
            .delete(&self.mutating, &dp)
            .await;
        let _ = Api::<ValidatingWebhookConfiguration>::all(self.client.clone())
            .delete(&self.validating, &dp)
            .await;
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.ns, &dp)
            .await;
    }
}

fn data(secret: &Secret, key: &str) -> String {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .unwrap_or_else(|| panic!("Secret has no {key}"));
    String::from_utf8(bytes.0.clone()).unwrap()
}

fn cfg(ns: &str) -> ManagedConfig {
    ManagedConfig::new(ServingSpec::new([format!("asya-webhook.{ns}.svc")], []))
}

#[tokio::test]
async fn create_reuse_renew_serving_then_rotate_ca_on_the_real_api_server() {
    if !require::cluster() {
        return;
    }
    let fx = Fixture::new().await;
    let secret = "webhook-certs";
    let cfg = cfg(&fx.ns);
    let t0 = SystemTime::now();

    // The chart pre-creates the Secret empty, with Helm's ownership metadata, which must
    // survive every update (or `helm upgrade` refuses the Secret).
    let helm_meta = json!({
        "metadata": {"name": secret,
                     "labels": {"app.kubernetes.io/managed-by": "Helm"},
                     "annotations": {"meta.helm.sh/release-name": "asya"}},
        "type": "Opaque",
    });
    fx.secrets()
        .create(
            &PostParams::default(),
            &serde_json::from_value(helm_meta).unwrap(),
        )
        .await
        .unwrap();

    // 1. Nothing stored: a CA and a serving certificate; every entry gets the CA.
    let first = ensure(&fx.backend(secret), &cfg, t0).await.unwrap();
    assert!(matches!(first.plan, Plan::NewCa(_)), "{:?}", first.plan);
    assert_eq!(first.patched, 3);
    let stored = fx.secret(secret).await;
    assert_eq!(data(&stored, "ca.crt"), first.certs.ca.cert_pem);
    let serving = first.certs.serving.clone().unwrap();
    assert_eq!(data(&stored, "tls.crt"), serving.cert_pem);
    assert!(signed_by(&serving.cert_pem, &first.certs.ca.cert_pem));
    let bundle = ca_bundle(&first.certs, t0);
    assert_eq!(fx.bundles().await, vec![bundle.clone(); 3]);
    assert_eq!(
        stored.metadata.annotations.as_ref().unwrap()["meta.helm.sh/release-name"],
        "asya"
    );
    let rv = stored.metadata.resource_version.clone();

    // 2. A restart (a new backend) the same day reuses everything and writes nothing.
    let again = ensure(&fx.backend(secret), &cfg, t0).await.unwrap();
    assert_eq!(again.plan, Plan::Reuse);
    assert_eq!(again.patched, 0);
    assert_eq!(fx.secret(secret).await.metadata.resource_version, rv);

    // Someone overwrites one caBundle: the next cycle puts it back, and only it.
    Api::<ValidatingWebhookConfiguration>::all(fx.client.clone())
        .patch(
            &fx.validating,
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([{"op": "replace",
                    "path": "/webhooks/0/clientConfig/caBundle", "value": "Ym9ndXM="}]))
                .unwrap(),
            ),
        )
        .await
        .unwrap();
    let repaired = ensure(&fx.backend(secret), &cfg, t0).await.unwrap();
    assert_eq!(repaired.plan, Plan::Reuse);
    assert_eq!(repaired.patched, 1);
    assert_eq!(fx.bundles().await, vec![bundle.clone(); 3]);

    // 3. Inside the serving certificate's renewal margin: a new serving certificate from
    //    the same CA; the bundle does not change, so nothing is patched.
    let t1 = t0 + cfg.serving_validity - cfg.serving_renew_before + DAY;
    let renewed = ensure(&fx.backend(secret), &cfg, t1).await.unwrap();
    assert!(
        matches!(renewed.plan, Plan::NewServing(_)),
        "{:?}",
        renewed.plan
    );
    assert_eq!(renewed.patched, 0);
    let new_serving = renewed.certs.serving.clone().unwrap();
    assert_ne!(new_serving.cert_pem, serving.cert_pem);
    assert!(signed_by(&new_serving.cert_pem, &first.certs.ca.cert_pem));
    let stored = fx.secret(secret).await;
    assert_eq!(data(&stored, "tls.crt"), new_serving.cert_pem);
    assert_eq!(data(&stored, "ca.crt"), first.certs.ca.cert_pem);
    assert_eq!(fx.bundles().await, vec![bundle.clone(); 3]);

    // 4. Inside the CA's renewal margin: a new CA; the old one stays trusted in the bundle
    //    (servers still presenting its certificates keep working) and in the Secret.
    let t2 = t0 + cfg.ca_validity - cfg.ca_renew_before + DAY;
    let rotated = ensure(&fx.backend(secret), &cfg, t2).await.unwrap();
    assert!(matches!(rotated.plan, Plan::NewCa(_)), "{:?}", rotated.plan);
    assert_eq!(rotated.patched, 3);
    assert_ne!(rotated.certs.ca.cert_pem, first.certs.ca.cert_pem);
    let stored = fx.secret(secret).await;
    assert_eq!(data(&stored, "ca-previous.crt"), first.certs.ca.cert_pem);
    let rotated_bundle = ca_bundle(&rotated.certs, t2);
    assert!(rotated_bundle.contains(rotated.certs.ca.cert_pem.trim_end()));
    assert!(rotated_bundle.contains(first.certs.ca.cert_pem.trim_end()));
    assert_eq!(fx.bundles().await, vec![rotated_bundle; 3]);
    let labels: BTreeMap<String, String> = stored.metadata.labels.unwrap();
    assert_eq!(labels["app.kubernetes.io/managed-by"], "Helm");
    assert_eq!(
        stored.metadata.annotations.unwrap()["meta.helm.sh/release-name"],
        "asya"
    );

    fx.cleanup().await;
}

#[tokio::test]
async fn two_replicas_starting_together_end_with_the_same_certificates() {
    if !require::cluster() {
        return;
    }
    let fx = Fixture::new().await;
    let cfg = cfg(&fx.ns);
    let now = SystemTime::now();
    let (a, b) = (fx.backend("shared-certs"), fx.backend("shared-certs"));
    let (ra, rb) = tokio::join!(ensure(&a, &cfg, now), ensure(&b, &cfg, now));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    // One created the Secret; the other lost the race, re-read it and reuses it.
    assert_eq!(ra.certs, rb.certs);
    let stored = fx.secret("shared-certs").await;
    assert_eq!(data(&stored, "ca.crt"), ra.certs.ca.cert_pem);
    // A Secret the webhook created itself says so.
    assert_eq!(
        stored.metadata.labels.unwrap()["app.kubernetes.io/managed-by"],
        "asya-webhook"
    );
    assert_eq!(fx.bundles().await, vec![ca_bundle(&ra.certs, now); 3]);
    fx.cleanup().await;
}
