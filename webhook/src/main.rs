//! `asya-webhook`: the admission webhook server and its offline forms.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use asya_webhook::cmd;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "asya-webhook",
    version,
    about = "Asya admission webhook: validation, defaulting, policy and sidecar injection"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the admission webhook server.
    // Boxed: the server's flags dwarf the other subcommands' (clippy::large_enum_variant).
    Serve(Box<asya_webhook::cmd::serve::ServeArgs>),
    /// Print workloads with the sidecar injected (Pod, Deployment, StatefulSet, ReplicaSet, Job, CronJob).
    Inject(asya_webhook::cmd::inject::InjectArgs),
    /// Check AsyncActor files: every rejection and warning, exit 1 if anything is rejected.
    Validate(cmd::validate::ValidateArgs),
    /// Certificate tools.
    #[command(subcommand)]
    Certs(CertsCommand),
}

#[derive(Subcommand)]
enum CertsCommand {
    /// Write ca.crt, tls.crt and tls.key: a CA and a serving certificate signed by it.
    Generate {
        #[arg(long)]
        out: PathBuf,
        /// DNS names of the serving certificate (repeatable).
        #[arg(long = "dns")]
        dns: Vec<String>,
        /// IP addresses of the serving certificate (repeatable).
        #[arg(long = "ip")]
        ip: Vec<IpAddr>,
        /// Validity of the serving certificate, days.
        #[arg(long, default_value_t = 365)]
        days: u64,
        /// Validity of the CA, days.
        #[arg(long, default_value_t = 3650)]
        ca_days: u64,
    },
}

fn certs_generate(
    out: PathBuf,
    dns: Vec<String>,
    ip: Vec<IpAddr>,
    days: u64,
    ca_days: u64,
) -> ExitCode {
    let day = Duration::from_secs(86_400);
    let now = SystemTime::now();
    let spec = asya_certs::ServingSpec::new(dns, ip);
    let result =
        asya_certs::generate_ca("asya-webhook-ca", now, day * ca_days as u32).and_then(|ca| {
            let srv = asya_certs::issue_serving(&ca, &spec, now, day * days as u32)?;
            asya_certs::write_dir(&out, &ca, &srv)
        });
    match result {
        Ok(()) => {
            for f in ["ca.crt", "tls.crt", "tls.key"] {
                println!("{}", out.join(f).display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("asya-webhook certs generate: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    // One crypto provider for the whole process (rustls, kube's client): ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            asya_webhook::telemetry::init_logs();
            let rt = match tokio::runtime::Runtime::new() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("asya-webhook: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match rt.block_on(asya_webhook::cmd::serve::run(*args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = format!("{e:#}"), "webhook stopped");
                    eprintln!("asya-webhook serve: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Inject(args) => asya_webhook::cmd::inject::run(args),
        Command::Validate(args) => cmd::validate::run(args),
        Command::Certs(CertsCommand::Generate {
            out,
            dns,
            ip,
            days,
            ca_days,
        }) => certs_generate(out, dns, ip, days, ca_days),
    }
}
