//! [`CertBackend`] on a real cluster: the certificates live in one Secret
//! (`ca.crt`, `ca.key`, `tls.crt`, `tls.key`, `ca-previous.crt`), and `caBundle` is patched in
//! the named Mutating/ValidatingWebhookConfigurations.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use std::sync::Mutex;

use crate::CertError;
use crate::generate::PemPair;
use crate::manage::{CertBackend, StoredCerts, WebhookEntry, WebhookKind};

pub struct KubeBackend {
    secrets: Api<Secret>,
    secret_name: String,
    mutating: Api<MutatingWebhookConfiguration>,
    validating: Api<ValidatingWebhookConfiguration>,
    mutating_names: Vec<String>,
    validating_names: Vec<String>,
    /// The Secret's metadata as last read. Updates carry its resourceVersion (so they are
    /// conditional) and keep its labels, annotations and owners (the chart may set them).
    seen: Mutex<Option<ObjectMeta>>,
}

impl KubeBackend {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        secret_name: &str,
        mutating_names: Vec<String>,
        validating_names: Vec<String>,
    ) -> Self {
        Self {
            secrets: Api::namespaced(client.clone(), namespace),
            secret_name: secret_name.to_string(),
            mutating: Api::all(client.clone()),
            validating: Api::all(client),
            mutating_names,
            validating_names,
            seen: Mutex::new(None),
        }
    }
}

fn text(data: &BTreeMap<String, ByteString>, key: &str) -> Option<String> {
    data.get(key)
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl CertBackend for KubeBackend {
    async fn load(&self) -> Result<Option<StoredCerts>, CertError> {
        let Some(secret) = self.secrets.get_opt(&self.secret_name).await? else {
            *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = None;
            return Ok(None);
        };
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(secret.metadata.clone());
        let data = secret.data.unwrap_or_default();
        let (Some(ca_cert), Some(ca_key)) = (text(&data, "ca.crt"), text(&data, "ca.key")) else {
            // An empty Secret (e.g. pre-created by the chart) means "generate".
            return Ok(None);
        };
        let serving = match (text(&data, "tls.crt"), text(&data, "tls.key")) {
            (Some(c), Some(k)) => Some(PemPair {
                cert_pem: c,
                key_pem: k,
            }),
            _ => None,
        };
        Ok(Some(StoredCerts {
            ca: PemPair {
                cert_pem: ca_cert,
                key_pem: ca_key,
            },
            serving,
            previous_ca_pem: text(&data, "ca-previous.crt"),
        }))
    }

    async fn store(&self, certs: &StoredCerts) -> Result<(), CertError> {
        let mut data = BTreeMap::new();
        let mut put = |k: &str, v: &str| {
            data.insert(k.to_string(), ByteString(v.as_bytes().to_vec()));
        };
        put("ca.crt", &certs.ca.cert_pem);
        put("ca.key", &certs.ca.key_pem);
        if let Some(s) = &certs.serving {
            put("tls.crt", &s.cert_pem);
            put("tls.key", &s.key_pem);
        }
        if let Some(p) = &certs.previous_ca_pem {
            put("ca-previous.crt", p);
        }
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let exists = seen.is_some();
        let mut metadata = seen.unwrap_or_else(|| ObjectMeta {
            name: Some(self.secret_name.clone()),
            ..Default::default()
        });
        metadata.managed_fields = None;
        if !exists {
            // Only on a Secret of our own: one the chart made says Helm manages it.
            metadata.labels.get_or_insert_with(BTreeMap::new).insert(
                "app.kubernetes.io/managed-by".to_string(),
                "asya-webhook".to_string(),
            );
        }
        let secret = Secret {
            metadata,
            data: Some(data),
            type_: Some("Opaque".into()),
            ..Default::default()
        };
        let res = if exists {
            self.secrets
                .replace(&self.secret_name, &PostParams::default(), &secret)
                .await
        } else {
            self.secrets.create(&PostParams::default(), &secret).await
        };
        match res {
            Ok(_) => Ok(()),
            Err(e) if is_conflict(&e) => Err(CertError::Conflict(e.to_string())),
            Err(e) => Err(e.into()),
        }
    }

    async fn webhook_entries(&self) -> Result<Vec<WebhookEntry>, CertError> {
        let mut out = Vec::new();
        for name in &self.mutating_names {
            match self.mutating.get_opt(name).await? {
                Some(cfg) => {
                    for (i, w) in cfg.webhooks.unwrap_or_default().into_iter().enumerate() {
                        out.push(WebhookEntry {
                            kind: WebhookKind::Mutating,
                            config: name.clone(),
                            index: i,
                            webhook: w.name,
                            ca_bundle: w.client_config.ca_bundle.map(|b| b.0),
                        });
                    }
                }
                None => {
                    tracing::warn!(%name, "MutatingWebhookConfiguration not found; caBundle not published")
                }
            }
        }
        for name in &self.validating_names {
            match self.validating.get_opt(name).await? {
                Some(cfg) => {
                    for (i, w) in cfg.webhooks.unwrap_or_default().into_iter().enumerate() {
                        out.push(WebhookEntry {
                            kind: WebhookKind::Validating,
                            config: name.clone(),
                            index: i,
                            webhook: w.name,
                            ca_bundle: w.client_config.ca_bundle.map(|b| b.0),
                        });
                    }
                }
                None => {
                    tracing::warn!(%name, "ValidatingWebhookConfiguration not found; caBundle not published")
                }
            }
        }
        Ok(out)
    }

    async fn patch_ca_bundle(&self, entry: &WebhookEntry, bundle: &[u8]) -> Result<(), CertError> {
        use base64::Engine;
        // The `test` op makes the patch fail rather than hit a different webhook if the list
        // was reordered since we read it.
        let patch = json!([
            {"op": "test", "path": format!("/webhooks/{}/name", entry.index), "value": entry.webhook},
            {"op": "add", "path": format!("/webhooks/{}/clientConfig/caBundle", entry.index),
             "value": base64::engine::general_purpose::STANDARD.encode(bundle)},
        ]);
        let pp = PatchParams::default();
        let ops: json_patch::Patch =
            serde_json::from_value(patch).map_err(|e| CertError::Parse(e.to_string()))?;
        let p = Patch::Json::<()>(ops);
        match entry.kind {
            WebhookKind::Mutating => {
                self.mutating.patch(&entry.config, &pp, &p).await?;
            }
            WebhookKind::Validating => {
                self.validating.patch(&entry.config, &pp, &p).await?;
            }
        }
        tracing::info!(config = %entry.config, webhook = %entry.webhook, "caBundle published");
        Ok(())
    }
}
