//! Asya state proxy: the connector a runtime reaches through a Unix socket to read and write
//! durable state as files (the original Asya's contract; see README.md).

pub mod cas;
pub mod config;
pub mod error;
pub mod keys;
pub mod listing;
pub mod metrics;
pub mod probe;
pub mod scope;
pub mod server;
pub mod store;
