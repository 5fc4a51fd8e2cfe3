//! The crew's S3 store of failed envelopes (`crate::crew`): read every stored envelope under
//! the errors prefix, and mark one redriven by moving its object to `redriven/{key}` (copy,
//! then delete: interrupted between the two, the envelope is in both places and a rerun
//! sends it again — at least once, never lost).

use aws_sdk_s3::Client;

use crate::crew::{self, Store};
use crate::error::{CliError, Result};

pub struct CrewStore {
    client: Client,
    pub bucket: String,
    pub prefix: String,
}

/// One stored envelope.
pub struct Stored {
    pub key: String,
    pub body: Vec<u8>,
    pub modified_ms: Option<u64>,
}

fn err(action: &'static str, target: &str, e: impl std::fmt::Debug) -> CliError {
    let why = format!("{e:?}");
    if why.contains("AccessDenied") || why.contains("403") {
        CliError::BrokerRefused {
            action,
            target: target.to_string(),
            user: "the crew store's identity".into(),
            why,
        }
    } else if why.contains("NoSuchBucket") {
        CliError::NotFound {
            what: format!("S3 bucket {target:?}"),
            why,
        }
    } else {
        CliError::Unavailable {
            what: "the crew's S3 store".into(),
            why: format!("{action} {target:?}: {why}"),
        }
    }
}

impl CrewStore {
    /// Connects with the crew actor's keys (read from its Secret by the caller), else the
    /// caller's own AWS identity.
    pub async fn connect(s: &Store, keys: Option<(String, String)>) -> CrewStore {
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let region = s.region.clone().unwrap_or_else(|| "us-east-1".into());
        let shared = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new(region))
            .http_client(http)
            .load()
            .await;
        let mut b = aws_sdk_s3::config::Builder::from(&shared);
        if let Some(ep) = &s.endpoint {
            // Local S3 servers (MinIO, moto) want path-style URLs, as the crew's handler uses.
            b = b.endpoint_url(ep).force_path_style(true);
        }
        if let Some((id, secret)) = keys {
            b = b.credentials_provider(aws_sdk_s3::config::Credentials::new(
                id,
                secret,
                None,
                None,
                "asya-crew-secret",
            ));
        }
        CrewStore {
            client: Client::from_conf(b.build()),
            bucket: s.bucket.clone(),
            prefix: s.prefix.clone(),
        }
    }

    /// Every stored envelope under the errors prefix, up to `max`; `true` when more were left.
    pub async fn list(&self, max: usize) -> Result<(Vec<Stored>, bool)> {
        let mut out = Vec::new();
        let mut token = None;
        loop {
            let page = self.page(token).await?;
            for o in page.contents() {
                let Some(key) = o.key() else { continue };
                if out.len() >= max {
                    return Ok((out, true));
                }
                out.push(self.read(key, o.last_modified()).await?);
            }
            match page.next_continuation_token() {
                Some(t) => token = Some(t.to_string()),
                None => return Ok((out, false)),
            }
        }
    }

    /// One page of the keys under the prefix.
    async fn page(
        &self,
        token: Option<String>,
    ) -> Result<aws_sdk_s3::operation::list_objects_v2::ListObjectsV2Output> {
        self.client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(&self.prefix)
            .set_continuation_token(token)
            .send()
            .await
            .map_err(|e| err("list", &self.bucket, e))
    }

    async fn read(
        &self,
        key: &str,
        modified: Option<&aws_sdk_s3::primitives::DateTime>,
    ) -> Result<Stored> {
        let got = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| err("read", key, e))?;
        let body = got
            .body
            .collect()
            .await
            .map_err(|e| err("read", key, e))?
            .into_bytes()
            .to_vec();
        Ok(Stored {
            key: key.to_string(),
            body,
            modified_ms: modified
                .and_then(|t| t.to_millis().ok())
                .and_then(|ms| u64::try_from(ms).ok()),
        })
    }

    /// The envelope `id`'s object under the prefix (any date, any actor), if it is there.
    pub async fn find(&self, id: &str) -> Result<Option<Stored>> {
        let name = crew::object_name(id);
        let mut token = None;
        loop {
            let page = self.page(token).await?;
            let hit = page.contents().iter().find(|o| {
                o.key()
                    .is_some_and(|k| k.rsplit('/').next() == Some(name.as_str()))
            });
            if let Some(o) = hit {
                let key = o.key().unwrap_or_default();
                return self.read(key, o.last_modified()).await.map(Some);
            }
            match page.next_continuation_token() {
                Some(t) => token = Some(t.to_string()),
                None => return Ok(None),
            }
        }
    }

    /// Moves the object to `redriven/{key}`: copy first, then delete.
    pub async fn mark_redriven(&self, key: &str) -> Result<()> {
        let to = crew::redriven_key(key);
        self.client
            .copy_object()
            .bucket(&self.bucket)
            .copy_source(format!("{}/{key}", self.bucket))
            .key(&to)
            .send()
            .await
            .map_err(|e| err("copy", key, e))?;
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| err("delete", key, e))
    }

    /// The SDK client, for what the commands do not wrap (tests make their bucket with it).
    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn describe(&self) -> String {
        format!("the crew's S3 store s3://{}/{}", self.bucket, self.prefix)
    }
}
