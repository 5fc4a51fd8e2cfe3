//! Confirmed publishing of one envelope on a channel the caller holds: the sidecar's rule
//! (persistent JSON, mandatory, wait for the broker's confirm) for tools with their own
//! channel, such as the `asya` command's redrive, which must ack its x-sump copy on the
//! same connection only after this returns.

use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Channel, Confirmation};

use crate::TransportError;

fn unavailable(e: impl std::fmt::Display) -> TransportError {
    TransportError::Unavailable(e.to_string())
}

/// The properties of every envelope published: persistent JSON.
pub fn envelope_properties() -> BasicProperties {
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into())
}

/// Publishes one envelope to `exchange` with `queue` as routing key, as the sidecar does
/// (persistent, mandatory), and returns once the broker confirmed it: an unroutable message
/// (no such queue) or a nack is an error. `ch` must be in confirm mode
/// (`confirm_select`). For tools that hold their own channel (the `asya` command).
pub async fn publish_confirmed(
    ch: &Channel,
    exchange: &str,
    queue: &str,
    body: &[u8],
) -> Result<(), TransportError> {
    let confirm = ch
        .basic_publish(
            exchange.into(),
            queue.into(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            body,
            envelope_properties(),
        )
        .await
        .map_err(unavailable)?;
    check_confirm(queue, confirm.await.map_err(unavailable)?)
}

pub(crate) fn check_confirm(queue: &str, c: Confirmation) -> Result<(), TransportError> {
    match c {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(_)) => Err(TransportError::NoSuchQueue(queue.to_string())),
        Confirmation::Nack(_) => Err(TransportError::Rejected(format!(
            "broker nacked the publish to {queue}"
        ))),
        // confirm_select is always on; treat the impossible as a failure, not a success.
        Confirmation::NotRequested => Err(TransportError::Rejected(
            "publisher confirms are off".into(),
        )),
    }
}
