//! SQS queues through aws-sdk-sqs, with these attributes and tags: visibility
//! timeout from `actorTimeout`, retention 4 days, long polling 20 s, tags
//! `asya.sh/namespace` and `asya.sh/actor`.

use std::collections::HashMap;
use std::time::Duration;

use asya_transport::sqs_batch::is_no_such_queue;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::QueueAttributeName;

use super::owner::{self, QueueRecord};
use super::{QueueDepth, QueueError, QueueInfo, QueueOps, QueueSpec};

pub const RETENTION_SECONDS: u32 = 345_600;
pub const RECEIVE_WAIT_SECONDS: u32 = 20;
/// A wake queue's retention (docs/DESIGN.md §6.1): SQS's minimum, so a wake that no
/// envelope follows keeps the actor up at most a minute plus its cooldown.
pub const WAKE_RETENTION_SECONDS: u32 = 60;
/// SQS's bounds on the visibility timeout.
const MAX_VISIBILITY: u64 = 43_200;

pub struct SqsQueues {
    client: Client,
}

/// Static credentials (local emulators, a configured secret); `None` uses the default chain
/// (IRSA in EKS).
#[derive(Clone)]
pub struct StaticCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
}

fn unavailable(e: impl std::fmt::Debug) -> QueueError {
    QueueError::Unavailable(format!("{e:?}"))
}

/// The attributes the provisioner sets on every queue.
pub fn attributes(spec: &QueueSpec) -> HashMap<QueueAttributeName, String> {
    let vis = spec.visibility_timeout.as_secs().clamp(1, MAX_VISIBILITY);
    HashMap::from([
        (QueueAttributeName::VisibilityTimeout, vis.to_string()),
        (
            QueueAttributeName::MessageRetentionPeriod,
            RETENTION_SECONDS.to_string(),
        ),
        (
            QueueAttributeName::ReceiveMessageWaitTimeSeconds,
            RECEIVE_WAIT_SECONDS.to_string(),
        ),
    ])
}

/// The owner tags (seed 003), read back before a queue is adopted or deleted ([`owner`]).
pub fn tags(spec: &QueueSpec) -> HashMap<String, String> {
    HashMap::from([
        (owner::TAG_NAMESPACE.to_string(), spec.namespace.clone()),
        (owner::TAG_ACTOR.to_string(), spec.actor.clone()),
    ])
}

impl SqsQueues {
    pub async fn new(
        region: &str,
        endpoint: Option<&str>,
        credentials: Option<StaticCredentials>,
    ) -> Self {
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new(region.to_string()))
            .http_client(http)
            // An endpoint that stops answering fails the reconcile (retried with backoff)
            // instead of hanging it.
            .timeout_config(
                aws_config::timeout::TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .operation_attempt_timeout(Duration::from_secs(10))
                    .operation_timeout(Duration::from_secs(20))
                    .build(),
            );
        if let Some(c) = credentials {
            loader = loader.credentials_provider(aws_sdk_sqs::config::Credentials::new(
                c.access_key_id,
                c.secret_access_key,
                None,
                None,
                "asya-transport-secret",
            ));
        }
        let shared = loader.load().await;
        let mut b = aws_sdk_sqs::config::Builder::from(&shared);
        if let Some(ep) = endpoint {
            b = b.endpoint_url(ep);
        }
        SqsQueues {
            client: Client::from_conf(b.build()),
        }
    }

    /// The underlying client, for tests that read queues back.
    pub fn client(&self) -> &Client {
        &self.client
    }

    async fn url(&self, name: &str) -> Result<Option<String>, QueueError> {
        match self.client.get_queue_url().queue_name(name).send().await {
            Ok(out) => Ok(out.queue_url().map(str::to_string)),
            Err(e)
                if e.as_service_error().is_some_and(|se| {
                    se.is_queue_does_not_exist() || is_no_such_queue(se.meta().code())
                }) =>
            {
                Ok(None)
            }
            Err(e) => Err(unavailable(e)),
        }
    }

    /// The queue's tags, the record of its owner; `None`: no such queue.
    pub async fn owner_record(&self, name: &str) -> Result<Option<QueueRecord>, QueueError> {
        let Some(url) = self.url(name).await? else {
            return Ok(None);
        };
        let out = self
            .client
            .list_queue_tags()
            .queue_url(url)
            .send()
            .await
            .map_err(unavailable)?;
        let tags = out
            .tags()
            .map(|t| t.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        Ok(Some(QueueRecord::Tags(tags)))
    }

    async fn arn(&self, url: &str) -> Result<String, QueueError> {
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .map_err(unavailable)?;
        Ok(out
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::QueueArn))
            .cloned()
            .unwrap_or_default())
    }
}

impl SqsQueues {
    /// Creates queue `name` with `attrs` and `tags`, or brings an existing one's in step
    /// (actorTimeout may have changed). Returns its URL and whether it was created.
    async fn upsert(
        &self,
        name: &str,
        attrs: HashMap<QueueAttributeName, String>,
        tags: HashMap<String, String>,
    ) -> Result<(String, bool), QueueError> {
        Ok(match self.url(name).await? {
            Some(url) => {
                self.client
                    .set_queue_attributes()
                    .queue_url(&url)
                    .set_attributes(Some(attrs))
                    .send()
                    .await
                    .map_err(unavailable)?;
                self.client
                    .tag_queue()
                    .queue_url(&url)
                    .set_tags(Some(tags))
                    .send()
                    .await
                    .map_err(unavailable)?;
                (url, false)
            }
            None => {
                let out = self
                    .client
                    .create_queue()
                    .queue_name(name)
                    .set_attributes(Some(attrs))
                    .set_tags(Some(tags))
                    .send()
                    .await
                    .map_err(|e| match e.as_service_error() {
                        Some(se) if se.is_queue_deleted_recently() => {
                            QueueError::RecreateCooldown(name.to_string())
                        }
                        Some(se) => QueueError::Rejected(format!("{name}: {se}")),
                        None => unavailable(e),
                    })?;
                (out.queue_url().unwrap_or_default().to_string(), true)
            }
        })
    }
}

/// A wake queue's attributes (docs/DESIGN.md §6.1): kept a minute, nobody receives.
pub fn wake_attributes() -> HashMap<QueueAttributeName, String> {
    HashMap::from([(
        QueueAttributeName::MessageRetentionPeriod,
        WAKE_RETENTION_SECONDS.to_string(),
    )])
}

impl QueueOps for SqsQueues {
    async fn ensure(&self, spec: &QueueSpec) -> Result<QueueInfo, QueueError> {
        let (url, created) = self
            .upsert(&spec.name, attributes(spec), tags(spec))
            .await?;
        if let Some(wake) = spec.wake_queue() {
            self.upsert(&wake, wake_attributes(), tags(spec)).await?;
        }
        let identifier = self.arn(&url).await?;
        Ok(QueueInfo {
            url,
            identifier,
            created,
        })
    }

    async fn exists(&self, name: &str) -> Result<bool, QueueError> {
        Ok(self.url(name).await?.is_some())
    }

    async fn delete(&self, name: &str) -> Result<(), QueueError> {
        let Some(url) = self.url(name).await? else {
            return Ok(());
        };
        match self.client.delete_queue().queue_url(url).send().await {
            Ok(_) => Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|se| is_no_such_queue(se.meta().code())) =>
            {
                Ok(())
            }
            Err(e) => Err(unavailable(e)),
        }
    }

    async fn depth(&self, name: &str) -> Result<Option<QueueDepth>, QueueError> {
        let Some(url) = self.url(name).await? else {
            return Ok(None);
        };
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .map_err(unavailable)?;
        let get = |k: QueueAttributeName| {
            out.attributes()
                .and_then(|a| a.get(&k))
                .and_then(|v| v.parse::<i64>().ok())
        };
        Ok(Some(QueueDepth {
            queued: get(QueueAttributeName::ApproximateNumberOfMessages),
            processing: get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_follow_seed_003() {
        let spec = QueueSpec {
            name: "asya-ns-a".into(),
            namespace: "ns".into(),
            actor: "a".into(),
            visibility_timeout: Duration::from_secs(90),
            adopt_untagged: false,
            wake_ttl: None,
        };
        let a = attributes(&spec);
        assert_eq!(a[&QueueAttributeName::VisibilityTimeout], "90");
        assert_eq!(a[&QueueAttributeName::MessageRetentionPeriod], "345600");
        assert_eq!(a[&QueueAttributeName::ReceiveMessageWaitTimeSeconds], "20");
        let t = tags(&spec);
        assert_eq!(t["asya.sh/namespace"], "ns");
        assert_eq!(t["asya.sh/actor"], "a");
        // SQS caps the visibility timeout at 12 hours.
        let long = QueueSpec {
            visibility_timeout: Duration::from_secs(100_000),
            ..spec
        };
        assert_eq!(
            attributes(&long)[&QueueAttributeName::VisibilityTimeout],
            "43200"
        );
    }
}
