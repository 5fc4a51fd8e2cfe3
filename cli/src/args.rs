//! The command line (clap derive). kubectl's connection flags are global, so
//! `kubectl asya -n team sump list` and `asya sump list -n team` both work.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::render::Format;

#[derive(Parser, Debug)]
#[command(
    name = "asya",
    version,
    about = "Send, follow, inspect and redrive Asya envelopes",
    long_about = "Send, follow, inspect and redrive Asya envelopes. Acts with the namespace's own \
                  broker identity (the Secret asya-broker-TRANSPORT the provisioner keeps there), \
                  never the platform's. Also installed as kubectl-asya: `kubectl asya ...`.\n\n\
                  Exit codes: 0 done; 1 some of it failed (refused or failed redrives, --wait \
                  ended in x-sump); 2 usage or configuration; 3 not found (envelope, queue, \
                  Secret); 4 refused (RBAC or the broker); 5 unreachable (API server, broker); \
                  6 timed out."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Args, Debug, Clone)]
pub struct Global {
    /// Path to the kubeconfig file (default: KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The namespace (default: the context's).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Format::Table)]
    pub output: Format,
    /// Namespace of the Asya release (its ConfigMap asya-config).
    #[arg(
        long,
        global = true,
        env = "ASYA_RELEASE_NAMESPACE",
        default_value = "asya-system"
    )]
    pub release_namespace: String,
    /// The cluster configuration from a file instead of the release's ConfigMap (for callers
    /// who may not read the release namespace).
    #[arg(long, global = true, env = "ASYA_CONFIG")]
    pub config: Option<PathBuf>,
    /// The transport (default: the configuration's defaultTransport).
    #[arg(long, global = true)]
    pub transport: Option<String>,
    /// RabbitMQ host to connect to instead of the configured one (a port-forward).
    #[arg(long, global = true, env = "ASYA_BROKER_HOST")]
    pub broker_host: Option<String>,
    /// RabbitMQ port to connect to instead of the configured one.
    #[arg(long, global = true, env = "ASYA_BROKER_PORT")]
    pub broker_port: Option<u16>,
    /// SQS endpoint to use instead of the configured one.
    #[arg(long, global = true, env = "ASYA_SQS_ENDPOINT")]
    pub sqs_endpoint: Option<String>,
    /// Read at most this many x-sump messages.
    #[arg(long, global = true, default_value_t = 10_000)]
    pub max: usize,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Send an envelope to ACTOR; prints its id.
    Send(SendArgs),
    /// Per actor: queued, in flight, x-sump count.
    Queues {
        /// Every namespace with actors (needs each namespace's broker Secret).
        #[arg(short = 'A', long)]
        all_namespaces: bool,
    },
    /// Failed envelopes in x-sump.
    #[command(subcommand)]
    Sump(SumpCommand),
    /// Where an envelope went: its hops.
    Trace {
        id: String,
        /// The gateway to ask instead of the configured one (a port-forward).
        #[arg(long, env = "ASYA_GATEWAY_URL")]
        gateway_url: Option<String>,
        /// A client token of the gateway, limited to this namespace.
        #[arg(long, env = "ASYA_GATEWAY_TOKEN", hide_env_values = true)]
        gateway_token: Option<String>,
        /// The trace backend's query API (Jaeger's) to ask instead of the release's
        /// `tracing.queryUrl` (a port-forward).
        #[arg(long, env = "ASYA_TRACE_BACKEND_URL")]
        trace_backend: Option<String>,
    },
    /// The actors' status (`kubectl get asyas -o wide`) and the conditions behind a
    /// non-Running phase.
    Status { actor: Option<String> },
    /// Flows: one Python function whose `await`s are actor calls, compiled into the routing
    /// the sidecars run (docs/flows.md).
    #[command(subcommand)]
    Flow(FlowCommand),
    /// Shell completion script.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Args, Debug)]
pub struct SendArgs {
    pub actor: String,
    /// The actors after ACTOR, comma-separated: `--route split,shout`.
    #[arg(long, value_delimiter = ',')]
    pub route: Vec<String>,
    /// The payload as JSON.
    #[arg(long, conflicts_with = "file")]
    pub payload: Option<String>,
    /// The payload from a JSON file (`-` for standard input).
    #[arg(short = 'f', long)]
    pub file: Option<PathBuf>,
    /// Wait until the envelope reaches x-sink or x-sump and print the outcome.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "5m")]
    pub timeout: String,
}

#[derive(Args, Debug, Clone)]
pub struct FlowSource {
    /// The flow's Python file.
    pub file: PathBuf,
    /// The flow function, when the file has several and none is marked `@flow`.
    #[arg(long)]
    pub flow: Option<String>,
    /// The module the handlers live in: `classify` is the handler `MODULE.classify`.
    #[arg(long, default_value = "handlers")]
    pub module: String,
    /// Iterations a `while` may run before the envelope goes to x-sump.
    #[arg(long, default_value_t = asya_flow::ir::DEFAULT_MAX_ITERATIONS)]
    pub max_iterations: u32,
}

#[derive(Subcommand, Debug)]
pub enum FlowCommand {
    /// Compile FILE into DIR: an AsyncActor per actor, the program's ConfigMap, flow.mmd
    /// and flow.dot (`kubectl apply -f DIR`). `-o` here is the
    /// directory, as in the original's `asya flow compile FILE -o DIR`.
    Compile {
        #[command(flatten)]
        source: FlowSource,
        /// Where to write the files.
        #[arg(long = "output-dir")]
        output_dir: PathBuf,
        /// The handlers' image.
        #[arg(long, default_value = "handlers:latest")]
        image: String,
        /// Replace files already in DIR.
        #[arg(long)]
        overwrite: bool,
    },
    /// Check FILE: what compiles, or every refusal with its line and what to write instead.
    Validate {
        #[command(flatten)]
        source: FlowSource,
    },
}

/// `asya flow compile FILE -o DIR`: the original's spelling. `-o` is the global output
/// format everywhere else, so after `flow compile` it is rewritten to `--output-dir`.
pub fn flow_output_dir<I: IntoIterator<Item = std::ffi::OsString>>(
    argv: I,
) -> Vec<std::ffi::OsString> {
    let mut seen_flow = false;
    let mut compile = false;
    argv.into_iter()
        .map(|a| {
            if compile && a == "-o" {
                return "--output-dir".into();
            }
            if seen_flow && a == "compile" {
                compile = true;
            }
            seen_flow |= a == "flow";
            a
        })
        .collect()
}

#[derive(Subcommand, Debug)]
pub enum SumpCommand {
    /// List failed envelopes without consuming them.
    List {
        actor: Option<String>,
        /// Only those failed within this long (`1h`, `30m`).
        #[arg(long)]
        since: Option<String>,
        /// Only those whose error (reason, code, type or message) matches.
        #[arg(long)]
        error: Option<String>,
    },
    /// One failed envelope in full: error, traceback, attempts, route, payload.
    Show { id: String },
    /// Send failed envelopes back to the actor where they failed.
    Redrive {
        ids: Vec<String>,
        #[arg(long)]
        actor: Option<String>,
        #[arg(long)]
        error: Option<String>,
        #[arg(long)]
        since: Option<String>,
        /// Every envelope in x-sump.
        #[arg(long)]
        all: bool,
        /// Say what would be sent, change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}
