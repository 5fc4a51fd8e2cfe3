//! Queue operations on the actor's transport, behind one small trait with a RabbitMQ and an
//! SQS implementation. The controller only ever talks to [`Backend`].

use std::time::Duration;

pub mod claim;
mod counts_cache;
pub mod owner;
pub mod rabbitmq;
pub mod rabbitmq_admin;
pub mod sqs;

use owner::{Claimant, OwnershipError, QueueRecord};

/// What the provisioner needs to create one queue.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueSpec {
    pub name: String,
    pub namespace: String,
    /// The actor (or end pseudo-actor) the queue serves; becomes a tag on SQS.
    pub actor: String,
    /// SQS visibility timeout: a message stays hidden this long while one handler call runs.
    pub visibility_timeout: Duration,
    /// An existing SQS queue without owner tags may be adopted ([`owner::ADOPT_QUEUE`]).
    pub adopt_untagged: bool,
    /// Declare the actor's wake queue beside it (docs/DESIGN.md §6.1), its messages living
    /// this long (RabbitMQ; SQS keeps them its minimum retention). Its name is derived from
    /// the queue's (`asya_api::wake::wake_queue_of`), never another actor's, so the queue's
    /// claim and owner check cover it.
    pub wake_ttl: Option<Duration>,
}

impl QueueSpec {
    /// Who claims the queue.
    pub fn claimant(&self) -> Claimant {
        Claimant::new(&self.namespace, &self.actor, self.adopt_untagged)
    }

    /// The wake queue to declare with this queue, if any.
    pub fn wake_queue(&self) -> Option<String> {
        self.wake_ttl
            .and_then(|_| asya_api::wake::wake_queue_of(&self.name))
    }
}

/// Where a created queue lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueInfo {
    /// SQS queue URL, or `amqp://host:port/vhost/queue` for RabbitMQ.
    pub url: String,
    /// SQS ARN, or the RabbitMQ queue name.
    pub identifier: String,
    /// True when this call created the queue (it did not exist before).
    pub created: bool,
}

/// Message counts, where the transport tells them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueDepth {
    pub queued: Option<i64>,
    pub processing: Option<i64>,
}

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// Broker unreachable or a call failed in a way a retry may fix.
    #[error("transport unavailable: {0}")]
    Unavailable(String),
    /// SQS refuses to recreate a queue within 60 s of deleting it.
    #[error("SQS refuses to recreate {0} within 60s of its deletion; retrying after the cooldown")]
    RecreateCooldown(String),
    /// The broker refused the request (bad name, conflicting arguments, access denied).
    #[error("transport rejected the request: {0}")]
    Rejected(String),
    /// The queue exists and its owner record says it is not the actor's (docs/DESIGN.md §9).
    #[error("{0}")]
    NotOurs(#[from] OwnershipError),
}

impl QueueError {
    /// How long to wait before the next attempt.
    pub fn retry_after(&self) -> Duration {
        match self {
            QueueError::RecreateCooldown(_) => Duration::from_secs(65),
            QueueError::Unavailable(_) => Duration::from_secs(5),
            QueueError::Rejected(_) | QueueError::NotOurs(_) => Duration::from_secs(60),
        }
    }
}

/// The queue operations of one transport.
pub trait QueueOps: Send + Sync {
    /// Creates the queue (and its binding / attributes) if missing; idempotent.
    fn ensure(
        &self,
        spec: &QueueSpec,
    ) -> impl Future<Output = Result<QueueInfo, QueueError>> + Send;
    /// Whether the queue exists now.
    fn exists(&self, name: &str) -> impl Future<Output = Result<bool, QueueError>> + Send;
    /// Deletes the queue; a missing queue is not an error.
    fn delete(&self, name: &str) -> impl Future<Output = Result<(), QueueError>> + Send;
    /// Message counts of the queue; `None` when it does not exist.
    fn depth(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<QueueDepth>, QueueError>> + Send;
}

/// One configured transport's client.
pub enum Backend {
    Rabbit(Box<rabbitmq::RabbitQueues>),
    Sqs(sqs::SqsQueues),
}

impl Backend {
    pub fn kind(&self) -> &'static str {
        match self {
            Backend::Rabbit(_) => "rabbitmq",
            Backend::Sqs(_) => "sqs",
        }
    }

    /// What the broker records of the queue's owner; `None`: no such queue.
    pub async fn owner_record(&self, name: &str) -> Result<Option<QueueRecord>, QueueError> {
        match self {
            Backend::Rabbit(b) => b.owner_record(name).await,
            Backend::Sqs(b) => b.owner_record(name).await,
        }
    }

    /// Fails with [`QueueError::NotOurs`] when the queue exists and is not `who`'s.
    pub async fn check_owner(&self, name: &str, who: &Claimant) -> Result<(), QueueError> {
        match self.owner_record(name).await? {
            Some(record) => Ok(owner::owns(name, &record, who)?),
            None => Ok(()),
        }
    }

    /// [`QueueOps::ensure`] of a queue that is missing or proven the spec's actor's: an
    /// existing queue is adopted only then.
    pub async fn ensure_owned(&self, spec: &QueueSpec) -> Result<QueueInfo, QueueError> {
        self.check_owner(&spec.name, &spec.claimant()).await?;
        self.ensure(spec).await
    }

    /// [`QueueOps::delete`] of a queue proven `who`'s (a missing one is no error).
    pub async fn delete_owned(&self, name: &str, who: &Claimant) -> Result<(), QueueError> {
        self.check_owner(name, who).await?;
        self.delete(name).await
    }

    /// Deletes a deleted actor's queue, its wake queue and what the transport keeps beside it
    /// for retries (RabbitMQ's delay queues; SQS delays in the queue itself), once the queue
    /// is proven `who`'s. Returns the delay queues.
    pub async fn delete_actor_queue(
        &self,
        name: &str,
        resiliency: Option<&asya_api::types::Resiliency>,
        who: &Claimant,
    ) -> Result<Vec<String>, QueueError> {
        self.check_owner(name, who).await?;
        self.delete_with_retry_queues(name, resiliency).await
    }

    /// [`Self::delete_actor_queue`] of a queue whose owner was settled before (its claim).
    pub async fn delete_with_retry_queues(
        &self,
        name: &str,
        resiliency: Option<&asya_api::types::Resiliency>,
    ) -> Result<Vec<String>, QueueError> {
        let delay_queues = match self {
            Backend::Rabbit(b) => b.delete_with_delay_queues(name, resiliency).await?,
            Backend::Sqs(b) => b.delete(name).await.map(|()| Vec::new())?,
        };
        // Its wake queue goes with it (docs/DESIGN.md §6.1; a missing one is no error: never
        // declared, or wake-up off).
        if let Some(wake) = asya_api::wake::wake_queue_of(name) {
            self.delete(&wake).await?;
        }
        Ok(delay_queues)
    }

    /// [`QueueOps::depth`] (`None`: the queue does not exist), counted in the
    /// queue-operation metrics.
    pub async fn counted_depth(
        &self,
        metrics: &crate::metrics::Metrics,
        name: &str,
    ) -> Result<Option<QueueDepth>, QueueError> {
        let d = self.depth(name).await;
        metrics.queue_op(self.kind(), "depth", d.is_ok());
        d
    }
}

impl QueueOps for Backend {
    async fn ensure(&self, spec: &QueueSpec) -> Result<QueueInfo, QueueError> {
        match self {
            Backend::Rabbit(b) => b.ensure(spec).await,
            Backend::Sqs(b) => b.ensure(spec).await,
        }
    }
    async fn exists(&self, name: &str) -> Result<bool, QueueError> {
        match self {
            Backend::Rabbit(b) => b.exists(name).await,
            Backend::Sqs(b) => b.exists(name).await,
        }
    }
    async fn delete(&self, name: &str) -> Result<(), QueueError> {
        match self {
            Backend::Rabbit(b) => b.delete(name).await,
            Backend::Sqs(b) => b.delete(name).await,
        }
    }
    async fn depth(&self, name: &str) -> Result<Option<QueueDepth>, QueueError> {
        match self {
            Backend::Rabbit(b) => b.depth(name).await,
            Backend::Sqs(b) => b.depth(name).await,
        }
    }
}
