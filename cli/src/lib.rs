//! The `asya` command (also `kubectl asya`): send envelopes, follow them, inspect queues and
//! actors, browse x-sump without consuming it and redrive chosen envelopes to the actor where
//! they failed (docs/DESIGN.md §4, §9; cli/README.md).
//!
//! Pure decisions — [`select`] (which x-sump envelopes), [`failed`] (what the headers say),
//! [`redrive`] (the resend), [`compose`] (a new envelope), [`trace`] (sources and hops),
//! [`views`] and [`render`] (output), [`access`] (which identity), [`error`] (exit codes) —
//! are unit-tested; the edges are [`cluster`] (API server) and [`broker`] (RabbitMQ, SQS).

pub mod access;
pub mod args;
pub mod broker;
pub mod clock;
pub mod cluster;
pub mod cmd;
pub mod compose;
pub mod crew;
pub mod error;
pub mod failed;
pub mod flow;
pub mod redrive;
pub mod render;
pub mod select;
pub mod session;
pub mod sump;
pub mod sump_source;
pub mod trace;
pub mod trace_backend;
pub mod views;

/// The whole program behind both binary names: parses the command line, runs the command,
/// prints its result on stdout or its error on stderr, and returns the exit code of its kind.
pub async fn main_with_args() -> std::process::ExitCode {
    use clap::Parser;
    use std::io::Write;

    use crate::args::Cli;
    use crate::error::Exit;

    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    // rustls needs one crypto provider for the process; ring, as every part of Asya.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = match Cli::try_parse_from(crate::args::flow_output_dir(std::env::args_os())) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                Exit::Usage.into()
            } else {
                Exit::Ok.into()
            };
        }
    };
    match cmd::dispatch(&cli).await {
        Ok((out, exit)) => {
            let _ = std::io::stdout().write_all(out.as_bytes());
            exit.into()
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: {e}");
            e.exit().into()
        }
    }
}
