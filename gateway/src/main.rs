use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use asya_gateway::serve::{Settings, run};
use asya_gateway::tools::Tools;
use clap::{Parser, Subcommand};

/// Asya gateway: actor pipelines as MCP tools and REST, envelope status in PostgreSQL.
#[derive(Parser)]
#[command(name = "asya-gateway", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve MCP (/mcp), REST and the sidecar report endpoints.
    Serve(Box<ServeArgs>),
    /// Check a tools file offline; prints every rejection, exit 1 if any.
    Validate {
        #[arg(long)]
        tools: PathBuf,
    },
    /// Print the report token of an actor namespace (for its sidecars' Secret), derived from
    /// the report key.
    ReportToken {
        /// The actor namespace.
        #[arg(long)]
        namespace: String,
        /// The report key the gateway serves with.
        #[arg(long, env = "ASYA_GATEWAY_REPORT_KEY_FILE")]
        key_file: PathBuf,
    },
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Listen address; ASYA_GATEWAY_PORT alone gives 0.0.0.0:PORT.
    #[arg(long, env = "ASYA_GATEWAY_ADDR")]
    addr: Option<SocketAddr>,
    #[arg(long, env = "ASYA_GATEWAY_PORT", hide = true)]
    port: Option<u16>,
    /// The tools (routes.tools of the Helm values), reloaded when the file changes.
    #[arg(long, env = "ASYA_TOOLS_PATH")]
    tools: PathBuf,
    /// The cluster configuration (config.yaml of asya-config): default transport, SQS region.
    #[arg(long, env = "ASYA_CONFIG_PATH")]
    config: Option<PathBuf>,
    /// PostgreSQL URL; without it status is kept in memory (said loudly at start).
    #[arg(long, env = "ASYA_DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// Client tokens, one per line, each optionally limited: `TOKEN tools=a,b
    /// namespaces=x,y` (a mounted Secret).
    #[arg(long, env = "ASYA_AUTH_TOKENS_FILE")]
    auth_tokens: Option<PathBuf>,
    /// Key the sidecars' report tokens are derived from (`report-token`); without it no
    /// report is accepted.
    #[arg(long, env = "ASYA_GATEWAY_REPORT_KEY_FILE", conflicts_with = "no_auth")]
    report_key_file: Option<PathBuf>,
    /// Run without authentication (must be said explicitly).
    #[arg(long, conflicts_with = "auth_tokens")]
    no_auth: bool,
    /// Namespace of the tools' actors unless a tool names one.
    #[arg(long, env = "ASYA_NAMESPACE", default_value = "default")]
    namespace: String,
    #[arg(long, env = "ASYA_RABBITMQ_URL", hide_env_values = true)]
    rabbitmq_url: Option<String>,
    #[arg(long, env = "ASYA_SQS_REGION")]
    sqs_region: Option<String>,
    #[arg(long, env = "ASYA_SQS_ENDPOINT")]
    sqs_endpoint: Option<String>,
    /// Requests per second per client (0: no limit); sidecar reports are not limited.
    #[arg(long, env = "ASYA_GATEWAY_RATE_LIMIT", default_value_t = 50.0)]
    rate_limit: f64,
    #[arg(long, env = "ASYA_GATEWAY_RATE_BURST", default_value_t = 100.0)]
    rate_burst: f64,
    /// Largest request body accepted.
    #[arg(long, env = "ASYA_GATEWAY_MAX_BODY_BYTES", default_value_t = 1_048_576)]
    max_body_bytes: usize,
    /// Host names MCP clients may use (DNS-rebinding protection); empty allows any.
    #[arg(
        long,
        env = "ASYA_GATEWAY_ALLOWED_HOSTS",
        value_delimiter = ',',
        default_value = ""
    )]
    allowed_hosts: Vec<String>,
    /// Seconds to wait for the broker to confirm a new envelope.
    #[arg(long, default_value_t = 10)]
    send_timeout: u64,
    /// How often the tools file is checked for changes, in seconds.
    #[arg(long, default_value_t = 2)]
    reload_interval: u64,
}

fn init_logs() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("ASYA_LOG_LEVEL").unwrap_or_else(|_| {
            // rmcp's HTTP server logs session ids at info.
            tracing_subscriber::EnvFilter::new("info,lapin=warn,aws=warn,rmcp=warn")
        });
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if std::env::var("ASYA_LOG_FORMAT").as_deref() == Ok("text") {
        b.init();
    } else {
        b.json()
            .with_current_span(true)
            .with_span_list(false)
            .init();
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Validate { tools } => match Tools::load(&tools) {
            Ok(t) => {
                println!("{}: {} tool(s) valid", tools.display(), t.tools.len());
                for tool in t.tools.values() {
                    println!("  {} -> {}", tool.name, tool.route.join(" -> "));
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::ReportToken {
            namespace,
            key_file,
        } => {
            let token = asya_gateway::serve::read_report_key(&key_file)
                .map_err(|e| e.to_string())
                .and_then(|k| k.token(&namespace).map_err(|e| e.to_string()));
            match token {
                Ok(t) => {
                    println!("{t}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("asya-gateway report-token: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Serve(a) => {
            init_logs();
            let addr = a
                .addr
                .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], a.port.unwrap_or(8080))));
            let settings = Settings {
                addr,
                tools: a.tools,
                config: a.config,
                database_url: a.database_url,
                auth_tokens: a.auth_tokens,
                report_key: a.report_key_file,
                no_auth: a.no_auth,
                namespace: a.namespace,
                rabbitmq_url: a.rabbitmq_url,
                sqs_region: a.sqs_region,
                sqs_endpoint: a.sqs_endpoint,
                rate_limit: a.rate_limit,
                rate_burst: a.rate_burst,
                max_body_bytes: a.max_body_bytes,
                allowed_hosts: a
                    .allowed_hosts
                    .into_iter()
                    .filter(|h| !h.is_empty())
                    .collect(),
                send_timeout: Duration::from_secs(a.send_timeout.max(1)),
                reload_interval: Duration::from_secs(a.reload_interval.max(1)),
            };
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("asya-gateway: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match rt.block_on(run(settings)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "gateway failed");
                    eprintln!("asya-gateway: {e}");
                    ExitCode::from(2)
                }
            }
        }
    }
}
