//! One module per command: the I/O around the pure decisions, and the printing.

pub mod flow;
pub mod queues;
pub mod send;
pub mod status;
pub mod sump;
pub mod trace;

use clap::CommandFactory;

use crate::args::{Cli, Command};
use crate::error::{Exit, Result};

/// Runs the command; the text for stdout and the exit code.
pub async fn dispatch(cli: &Cli) -> Result<(String, Exit)> {
    let g = &cli.global;
    match &cli.command {
        Command::Send(a) => send::run(g, a).await,
        Command::Queues { all_namespaces } => queues::run(g, *all_namespaces).await,
        Command::Sump(c) => sump::run(g, c).await,
        Command::Trace {
            id,
            gateway_url,
            gateway_token,
            trace_backend,
        } => {
            trace::run(
                g,
                id,
                gateway_url.as_deref(),
                gateway_token.as_deref(),
                trace_backend.as_deref(),
            )
            .await
        }
        Command::Status { actor } => status::run(g, actor.as_deref()).await,
        Command::Flow(c) => flow::run(c),
        Command::Completion { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(*shell, &mut Cli::command(), bin_name(), &mut out);
            Ok((String::from_utf8_lossy(&out).into_owned(), Exit::Ok))
        }
    }
}

/// `kubectl-asya` when run as the kubectl plugin, else `asya`: completion completes the name
/// the user typed.
fn bin_name() -> &'static str {
    let argv0 = std::env::args().next().unwrap_or_default();
    if argv0.ends_with("kubectl-asya") {
        "kubectl-asya"
    } else {
        "asya"
    }
}
