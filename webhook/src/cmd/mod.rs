//! The `asya-webhook` subcommands: `serve` (the admission server), and the offline
//! `inject` and `validate`.

pub mod inject;
pub mod serve;
pub mod validate;
