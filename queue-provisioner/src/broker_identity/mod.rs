//! Each actor namespace's own broker identity (docs/DESIGN.md §9): a RabbitMQ user
//! `asya-ns-{ns}` with a generated password, kept in the namespace's Secret
//! `asya-broker-{transport}`, with permissions on that namespace's queues and exchange only.
//! [`permissions`] and [`plan`] decide (pure); `reconcile::identity` does it.

pub mod permissions;
pub mod plan;
