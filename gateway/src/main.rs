use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use asya_gateway::http::Limits;
use asya_gateway::serve::{FlowSource, Settings, UidSource, run};
use asya_gateway::store::retention::Policy;
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
    /// the report key and bound to the namespace's uid.
    ReportToken {
        /// The actor namespace.
        #[arg(long)]
        namespace: String,
        /// The namespace's metadata.uid; without it, read from the cluster (in the pod, or
        /// kubectl's kubeconfig).
        #[arg(long)]
        namespace_uid: Option<String>,
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
    /// Requests per second per client token (or address without auth); 0: no limit.
    #[arg(long, env = "ASYA_GATEWAY_RATE_LIMIT", default_value_t = Limits::default().rate)]
    rate_limit: f64,
    #[arg(long, env = "ASYA_GATEWAY_RATE_BURST", default_value_t = Limits::default().burst)]
    rate_burst: f64,
    /// Sidecar reports per second per report namespace (all its sidecars); 0: no limit.
    #[arg(long, env = "ASYA_GATEWAY_REPORT_RATE_LIMIT", default_value_t = Limits::default().report_rate)]
    report_rate_limit: f64,
    #[arg(long, env = "ASYA_GATEWAY_REPORT_RATE_BURST", default_value_t = Limits::default().report_burst)]
    report_rate_burst: f64,
    /// Requests in flight per client token, an open stream counting until it ends; 0: no
    /// bound.
    #[arg(long, env = "ASYA_GATEWAY_MAX_IN_FLIGHT_PER_TOKEN", default_value_t = Limits::default().client_in_flight)]
    max_in_flight_per_token: usize,
    /// Reports in flight per report namespace; 0: no bound.
    #[arg(long, env = "ASYA_GATEWAY_MAX_IN_FLIGHT_PER_REPORT_NAMESPACE", default_value_t = Limits::default().report_in_flight)]
    max_in_flight_per_report_namespace: usize,
    /// Largest request body accepted.
    #[arg(long, env = "ASYA_GATEWAY_MAX_BODY_BYTES", default_value_t = Limits::default().max_body_bytes)]
    max_body_bytes: usize,
    /// Report tokens are bound to their namespace's uid: `kube` watches the namespaces (a
    /// token of a namespace deleted since is refused), `off` checks signatures only (no
    /// cluster; said at start).
    #[arg(
        long,
        env = "ASYA_GATEWAY_NAMESPACE_UIDS",
        value_enum,
        default_value = "kube"
    )]
    namespace_uids: UidSource,
    /// Compiled flows as tools: `kube` watches the flows' entry AsyncActors (labelled
    /// asya.sh/flow-role=entry) in every namespace, each the tool `{namespace}.{flow}`;
    /// `off`: the tools file's only.
    #[arg(long, env = "ASYA_GATEWAY_FLOWS", value_enum, default_value = "off")]
    flows: FlowSource,
    /// Stored envelopes are deleted this long after their final status (e.g. 168h); 0: kept.
    #[arg(long, env = "ASYA_GATEWAY_RETENTION_FINISHED", default_value = "168h", value_parser = duration)]
    retention_finished: Duration,
    /// ... and this long after creation when they never finish; 0: kept.
    #[arg(long, env = "ASYA_GATEWAY_RETENTION_UNFINISHED", default_value = "720h", value_parser = duration)]
    retention_unfinished: Duration,
    /// How often the retention pass runs.
    #[arg(long, env = "ASYA_GATEWAY_RETENTION_INTERVAL", default_value = "5m", value_parser = duration)]
    retention_interval: Duration,
    /// Envelopes of each kind one retention statement deletes at most.
    #[arg(long, env = "ASYA_GATEWAY_RETENTION_BATCH", default_value_t = Policy::default().batch)]
    retention_batch: u32,
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

fn duration(text: &str) -> Result<Duration, String> {
    asya_api::duration::parse_duration(text).map_err(|e| e.to_string())
}

/// The namespace's `metadata.uid` from the cluster (in the pod, or kubectl's kubeconfig).
fn namespace_uid(namespace: &str) -> Result<String, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let client = kube::Client::try_default().await.map_err(|e| {
            format!(
                "no cluster to read namespace {namespace}'s uid from ({e}); pass --namespace-uid"
            )
        })?;
        let api = kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client);
        let meta = api
            .get_metadata_opt(namespace)
            .await
            .map_err(|e| format!("reading namespace {namespace}: {e}"))?
            .ok_or_else(|| format!("namespace {namespace} does not exist"))?;
        meta.metadata
            .uid
            .ok_or_else(|| format!("namespace {namespace} has no uid"))
    })
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
            namespace_uid: uid,
            key_file,
        } => {
            let token = asya_gateway::serve::read_report_key(&key_file)
                .map_err(|e| e.to_string())
                .and_then(|k| {
                    let uid = match uid {
                        Some(u) => u,
                        None => namespace_uid(&namespace)?,
                    };
                    k.token(&namespace, &uid).map_err(|e| e.to_string())
                });
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
                limits: Limits {
                    rate: a.rate_limit,
                    burst: a.rate_burst,
                    report_rate: a.report_rate_limit,
                    report_burst: a.report_rate_burst,
                    client_in_flight: a.max_in_flight_per_token,
                    report_in_flight: a.max_in_flight_per_report_namespace,
                    max_body_bytes: a.max_body_bytes,
                },
                namespace_uids: a.namespace_uids,
                flows: a.flows,
                retention: Policy {
                    finished: Policy::duration(a.retention_finished),
                    unfinished: Policy::duration(a.retention_unfinished),
                    every: a.retention_interval.max(Duration::from_secs(1)),
                    batch: a.retention_batch.max(1),
                },
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
