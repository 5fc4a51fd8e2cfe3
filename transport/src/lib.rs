//! asya-transport: what the sidecar, the queue provisioner and the gateway share on the
//! wire (docs/DESIGN.md §4), so no part imports another part's crate: the envelope, the brokers
//! behind one interface ([`Transport`]: [`rabbitmq`] with publisher confirms, [`sqs`]), the
//! RabbitMQ topology rule ([`rabbitmq::declare_bound_queue`]), the delay-queue naming
//! ([`rabbitmq::RabbitTransport::delay_queue`]) and the retry/backoff rules ([`resiliency`]).
//! Queue names of actors and end queues are `asya_api::naming`'s.

use std::future::Future;
use std::time::Duration;

pub mod ack_runs;
pub mod envelope;
pub mod fanin;
pub mod http_client;
pub mod rabbitmq;
mod rabbitmq_ack;
pub mod rabbitmq_publish;
pub mod report;
pub mod resiliency;
pub mod sqs;
pub mod sqs_batch;
mod sqs_batcher;
mod sqs_poll;
// The W3C rules moved to api (the webhook needs them too); the old path stays.
pub use asya_api::trace_context;

/// A message taken from the actor's queue, not yet acknowledged.
#[derive(Debug)]
pub struct Received<H> {
    pub body: Vec<u8>,
    /// How many times this message was delivered before and not finished (0 on the first
    /// delivery). Past `ASYA_MAX_REDELIVERIES` it goes to x-sump as poison.
    pub redeliveries: u32,
    pub handle: H,
}

/// A message to send; `delay` postpones delivery without holding the consumer.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub queue: String,
    pub body: Vec<u8>,
    pub delay: Option<Duration>,
}

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The destination queue does not exist (and auto-create is off): retrying will not help.
    #[error("queue {0} does not exist")]
    NoSuchQueue(String),
    /// The message is larger than the broker accepts: retrying will not help.
    #[error("message of {size} bytes for {queue} exceeds the broker's limit of {limit} bytes")]
    TooLarge {
        queue: String,
        size: usize,
        limit: usize,
    },
    /// Connection-level trouble: the transport reconnects; unacknowledged input is redelivered.
    #[error("broker unavailable: {0}")]
    Unavailable(String),
    #[error("broker rejected the operation: {0}")]
    Rejected(String),
}

impl TransportError {
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            TransportError::NoSuchQueue(_) | TransportError::TooLarge { .. }
        )
    }
}

/// A broker as the processor sees it. `send` returns only once the broker has confirmed
/// every message; `ack` is called only after that.
pub trait Transport: Send + Sync + 'static {
    type Handle: Send + Sync + 'static;

    /// Waits for the next message(s) from the actor's queue; reconnects as needed.
    fn receive(
        &self,
    ) -> impl Future<Output = Result<Vec<Received<Self::Handle>>, TransportError>> + Send;

    /// Sends all messages and waits until each is confirmed by the broker.
    fn send(
        &self,
        messages: &[Outgoing],
    ) -> impl Future<Output = Result<(), TransportError>> + Send;

    /// Removes a finished message from the queue.
    fn ack(&self, handle: &Self::Handle)
    -> impl Future<Output = Result<(), TransportError>> + Send;

    /// Gives a message back for redelivery (shutdown, transient send failure).
    fn release(
        &self,
        handle: &Self::Handle,
    ) -> impl Future<Output = Result<(), TransportError>> + Send;

    /// Gives back a message received but never started (shutdown). Unlike `release` it is
    /// not a failed delivery: where the broker lets us, it does not count towards
    /// `ASYA_MAX_REDELIVERIES`, so a message that only waited in pods that were scaled in
    /// is never taken for poison. (SQS counts every receive; there it is `release`.)
    fn give_back(
        &self,
        msg: &Received<Self::Handle>,
    ) -> impl Future<Output = Result<(), TransportError>> + Send {
        self.release(&msg.handle)
    }

    /// Marks a message as being processed (SQS keeps it invisible while its handler runs).
    fn hold(&self, _handle: &Self::Handle) {}

    /// Ends `hold`.
    fn unhold(&self, _handle: &Self::Handle) {}

    /// Stops taking new messages (graceful shutdown).
    fn stop_consuming(&self) -> impl Future<Output = ()> + Send;

    /// Connected to the broker right now (readiness, metrics).
    fn healthy(&self) -> bool;

    /// Largest message body the broker accepts, if it has a limit worth checking first.
    fn max_message_bytes(&self) -> Option<usize> {
        None
    }

    /// Messages waiting in the actor's queue, where the broker can tell.
    fn queue_depth(&self) -> impl Future<Output = Option<u64>> + Send;

    /// Puts `body` into each of the wake queues `queues` (docs/DESIGN.md §6.1), best effort:
    /// never confirmed, never retried, a missing queue dropped where the broker can (RabbitMQ
    /// routes it nowhere). Returns how many could not be handed to the broker; the caller
    /// counts them and goes on.
    fn wake(&self, queues: &[String], body: &[u8]) -> impl Future<Output = usize> + Send;
}
