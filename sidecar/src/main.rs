use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Asya sidecar: bridges an actor's queue and its Python runtime. Configured by ASYA_*
/// environment variables (see the crate README).
#[derive(Parser)]
#[command(name = "asya-sidecar", version)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the sidecar (the default).
    Run,
    /// Write DIR/asya_runtime.py (used by the injected init container).
    InstallRuntime { dir: PathBuf },
    /// Publish each JSON line of stdin to QUEUE (confirmed), using the same ASYA_* transport
    /// settings as the sidecar; e.g. to replay envelopes from x-sump.
    Send { queue: String },
}

fn init_logs(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ASYA_LOG_LEVEL")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,lapin=warn,aws=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .init();
    } else {
        builder.init();
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Run) {
        Command::InstallRuntime { dir } => match asya_sidecar::install_runtime(&dir) {
            Ok(path) => {
                println!("{}", path.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!(
                    "asya-sidecar: cannot write the runtime into {}: {e}",
                    dir.display()
                );
                ExitCode::FAILURE
            }
        },
        Command::Send { queue } => {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("asya-sidecar: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let stdin = std::io::stdin();
            match rt.block_on(asya_sidecar::service::send_lines(&queue, stdin.lock())) {
                Ok(n) => {
                    eprintln!("sent {n} message(s) to {queue}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("asya-sidecar send: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Run => {
            let cfg = match asya_sidecar::config::Config::from_env() {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("asya-sidecar: configuration error: {e}");
                    return ExitCode::from(2);
                }
            };
            init_logs(cfg.log_json);
            // One thread by default: the sidecar's work is I/O-bound and it shares a small CPU
            // budget with the runtime and the broker; more threads cost memory, not speed.
            let threads = match std::env::var("ASYA_WORKER_THREADS").ok().as_deref() {
                None | Some("") => 1,
                Some(v) => match v.trim().parse::<usize>() {
                    Ok(n) if (1..=64).contains(&n) => n,
                    _ => {
                        eprintln!(
                            "asya-sidecar: configuration error: ASYA_WORKER_THREADS: {v:?} is not a number in 1..=64"
                        );
                        return ExitCode::from(2);
                    }
                },
            };
            let built = if threads == 1 {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
            } else {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(threads)
                    .enable_all()
                    .build()
            };
            let rt = match built {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("asya-sidecar: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match rt.block_on(asya_sidecar::service::run(cfg)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "sidecar failed");
                    eprintln!("asya-sidecar: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
