//! `asya-webhook serve`.

use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub addr: SocketAddr,
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    #[arg(long, default_value = "0.0.0.0:9090")]
    pub metrics_addr: SocketAddr,
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

pub async fn run(_args: ServeArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet implemented")
}
